//! `kvaudit oracles`: the oracle registry as a table (or JSON): what each oracle checks, what it
//! reads, the kinds of violation it reports and the positive controls that show it fires.

use clap::Args;
use serde_json::json;
use tabled::{settings::Style, Table, Tabled};

use super::CliError;
use kvaudit::base::exit;
use kvaudit::oracles::Registry;

/// Arguments of `kvaudit oracles`.
#[derive(Debug, Args)]
pub struct OraclesArgs {
    /// Print the registry as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Prints the registry.
pub fn run(a: OraclesArgs) -> Result<i32, CliError> {
    let registry = Registry::builtin();
    if a.json {
        let rows: Vec<_> = registry
            .iter()
            .map(|o| {
                json!({
                    "oracle": o.id(),
                    "summary": o.summary(),
                    "reads": o.reads(),
                    "kinds": o.kinds(),
                    "positive_controls": o.positive_controls(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("the registry serializes")
        );
        return Ok(exit::CLEAN);
    }
    #[derive(Tabled)]
    struct Row {
        oracle: String,
        checks: String,
        reads: String,
        #[tabled(rename = "positive controls")]
        controls: String,
    }
    let rows = registry.iter().map(|o| Row {
        oracle: o.id().to_string(),
        checks: o.summary().to_string(),
        reads: o.reads().describe().to_string(),
        controls: o
            .positive_controls()
            .iter()
            .map(|c| match c.seed_depth {
                Some(d) => format!("{} (seed depth {d})", c.target),
                None => c.target.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    });
    println!("{}", Table::new(rows).with(Style::rounded()));
    Ok(exit::CLEAN)
}
