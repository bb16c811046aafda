//! `kvaudit merge`: combines shard reports into the report of the whole run: audit reports
//! (JSON), or a hunt's shard folders (`super::hunt::merge_shards_into`).

use std::path::PathBuf;

use clap::Args;

use super::args::OutputArgs;
use super::CliError;
use kvaudit::base::exit;
use kvaudit::records::report::{merge, Report};

/// Arguments of `kvaudit merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Shard reports (JSON), one per shard; or a hunt's shard folders (`kvaudit hunt --shard
    /// K/M --out DIR`), merged into the folder --out names.
    #[arg(required = true)]
    reports: Vec<PathBuf>,
    #[command(flatten)]
    out: OutputArgs,
    /// Hunt shards: the regression corpus the merged groups are classified against, the repro
    /// files of DIR instead of the corpus built into kvaudit.
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// Hunt shards: the new repro files' `since` date, YYYY-MM-DD (default: today, UTC).
    #[arg(long, env = "KVAUDIT_DATE")]
    date: Option<String>,
    /// Hunt shards: shrink again, with at most this many executions each, every finding whose
    /// shrink the hunt's budget stopped short and every group's representative, before grouping
    /// and classifying (a committed report then holds local minima; it runs the target).
    #[arg(long, value_name = "EXECUTIONS")]
    shrink_again: Option<u64>,
}

/// Reads, checks and merges.
pub fn run(m: MergeArgs) -> Result<i32, CliError> {
    let hunts = m
        .reports
        .iter()
        .filter(|p| super::hunt::is_hunt_summary(p))
        .count();
    if hunts > 0 {
        if hunts < m.reports.len() {
            return Err(CliError::usage(
                "merge: give audit reports (JSON files) or hunt shard folders, not both",
            ));
        }
        let Some(out) = m.out.out.as_deref() else {
            return Err(CliError::usage(
                "merge of hunt shards: --out names the folder of the merged hunt",
            ));
        };
        return super::hunt::merge_shards_into(
            &m.reports,
            out,
            m.corpus.as_deref(),
            m.date.as_deref(),
            m.shrink_again,
        );
    }
    if m.shrink_again.is_some() {
        return Err(CliError::usage(
            "merge: --shrink-again is for a hunt's folders, not audit reports",
        ));
    }
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
