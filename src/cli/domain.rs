//! `kvaudit domain`: prints a domain's ops in enumeration order, and the count.

use clap::Args;

use super::args::DomainArgs;
use super::CliError;
use kvaudit::base::domain::{total_trials, PRESET_SUMMARIES};
use kvaudit::base::exit;

/// Arguments of `kvaudit domain`.
#[derive(Debug, Args)]
pub struct DomainCmd {
    /// Same as --domain (kept for `kvaudit domain --preset seed`).
    #[arg(long)]
    preset: Option<String>,
    #[command(flatten)]
    domain: DomainArgs,
    /// Print the ops as JSON lines instead of llama.h calls.
    #[arg(long)]
    json: bool,
}

/// Prints the domain.
pub fn run(mut d: DomainCmd) -> Result<i32, CliError> {
    if let Some(p) = d.preset.take() {
        d.domain.domain = p;
    }
    let domain = d.domain.resolve()?;
    let ops = domain.ops();
    println!(
        "domain {}: setup {}",
        domain.name,
        domain.setup.config_label()
    );
    for op in &domain.setup.ops {
        println!(
            "  setup: {}",
            if d.json { op.to_json() } else { op.to_string() }
        );
    }
    for (i, op) in ops.iter().enumerate() {
        println!(
            "{:>4}  {}",
            i,
            if d.json { op.to_json() } else { op.to_string() }
        );
    }
    let n = ops.len() as u64;
    println!(
        "{n} ops; trials at depth 1..=3: {}, 1..=4: {}",
        total_trials(n, 3),
        total_trials(n, 4)
    );
    println!("presets (--preset NAME):");
    for (name, what) in PRESET_SUMMARIES {
        println!("  {name:<8} {what}");
    }
    Ok(exit::CLEAN)
}
