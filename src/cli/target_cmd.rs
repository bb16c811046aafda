//! `kvaudit target`: build llama.cpp pins and list what is known.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::CliError;
use kvaudit::base::exit;

/// Arguments of `kvaudit target`.
#[derive(Debug, Args)]
pub struct TargetCmd {
    #[command(subcommand)]
    what: TargetWhat,
}

#[derive(Debug, Subcommand)]
enum TargetWhat {
    /// Build (or find in the cache) the shim for a pin: `llama.cpp@0.1.156[+assert]`.
    Build {
        /// Pin labels.
        #[arg(required = true)]
        labels: Vec<String>,
        /// Build over this llama.cpp source tree instead of the pin's crate.
        #[arg(long)]
        llama_src: Option<PathBuf>,
        /// Rebuild even if cached.
        #[arg(long)]
        force: bool,
    },
    /// List the targets and pins kvaudit knows.
    List,
    /// Reclaim cache space: keep the newest build of each pin and source tree, remove older
    /// builds, builds of trees that are gone, and the cached objects only they used.
    Gc {
        /// Say what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Runs `kvaudit target ...`.
pub fn run(t: TargetCmd) -> Result<i32, CliError> {
    match t.what {
        TargetWhat::Build {
            labels,
            llama_src,
            force,
        } => {
            for label in labels {
                kvaudit::targets::llama::pins::Pin::parse(&label)
                    .map_err(|e| CliError::usage(format!("{e:#}")))?;
                let built = kvaudit::targets::llama::build::build_command(
                    &label,
                    llama_src.as_deref(),
                    force,
                )
                .map_err(|e| CliError::harness(format!("{e:#}")))?;
                println!("{}", built.so_path.display());
            }
            Ok(exit::CLEAN)
        }
        TargetWhat::Gc { dry_run } => {
            let r = kvaudit::targets::llama::build::collect_garbage(None, dry_run)
                .map_err(|e| CliError::harness(format!("{e:#}")))?;
            let verb = if dry_run { "would remove" } else { "removed" };
            for e in &r.entries {
                println!("{verb} {}", e.display());
            }
            println!(
                "{verb} {} build(s) (older, or of a tree that is gone) and {} cached object(s): {:.1} MiB",
                r.entries.len(),
                r.objects,
                r.bytes as f64 / (1024.0 * 1024.0)
            );
            Ok(exit::CLEAN)
        }
        TargetWhat::List => {
            println!("native  (faults: {})", native_kv::Faults::NAMES.join(", "));
            println!("native+tensors  (the same, with K/V rows and a forward pass; same faults)");
            for label in kvaudit::targets::llama::pins::known_labels()
                .map_err(|e| CliError::harness(format!("{e:#}")))?
            {
                println!("{label}");
            }
            Ok(exit::CLEAN)
        }
    }
}
