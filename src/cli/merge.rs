//! `kvaudit merge`: combines shard reports into the report of the whole run.

use std::path::PathBuf;

use clap::Args;

use super::args::OutputArgs;
use super::CliError;
use kvaudit::base::exit;
use kvaudit::records::report::{merge, Report};

/// Arguments of `kvaudit merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Shard reports (JSON), one per shard.
    #[arg(required = true)]
    reports: Vec<PathBuf>,
    #[command(flatten)]
    out: OutputArgs,
}

/// Reads, checks and merges.
pub fn run(m: MergeArgs) -> Result<i32, CliError> {
    let mut reports = Vec::new();
    for p in &m.reports {
        let text = std::fs::read_to_string(p)
            .map_err(|e| CliError::usage(format!("{}: cannot read: {e}", p.display())))?;
        let r: Report = serde_json::from_str(&text).map_err(|e| {
            CliError::usage(format!(
                "{}: line {}, column {}: not a kvaudit JSON report: {e}",
                p.display(),
                e.line(),
                e.column()
            ))
        })?;
        reports.push(r);
    }
    let merged = merge(reports).map_err(CliError::usage)?;
    m.out.emit(&merged)?;
    Ok(if merged.has_findings() {
        exit::FINDINGS
    } else {
        exit::CLEAN
    })
}
