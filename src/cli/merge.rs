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
        let r = Report::load(p).map_err(CliError::usage)?;
        reports.push(r);
    }
    let mut merged = merge(reports).map_err(CliError::usage)?;
    kvaudit::engines::root_cause::group_report(&mut merged);
    m.out.emit(&merged)?;
    Ok(if merged.has_findings() {
        exit::FINDINGS
    } else {
        exit::CLEAN
    })
}
