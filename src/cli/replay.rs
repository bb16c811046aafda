//! `kvaudit replay FILE|DIR...`: runs repro files and says, per file and target, whether the
//! recorded expectation still holds; `--junit FILE` for CI.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::cache::Observe;
use kvaudit::base::exit;
use kvaudit::base::files::write_atomically;
use kvaudit::outputs::repro::{
    junit_xml, replay_file, repro_files, FileResult, ReplayFilter, Status,
};
use kvaudit::targets::registry::{TargetKind, TargetSpec};

/// Arguments of `kvaudit replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Repro files, or folders of them (`*.json`).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Replay on this target only (default: every target each file records).
    #[arg(long)]
    target: Option<String>,
    /// Hold --target to the expectations recorded for this target where the file records none
    /// of its own (default for `llama.cpp@src:PATH`: the pin of the tree's version, else the
    /// newest pin).
    #[arg(long, requires = "target")]
    baseline: Option<String>,
    /// Faults of --target (native only).
    #[arg(long = "inject", value_delimiter = ',', requires = "target")]
    inject: Vec<String>,
    /// Second target, for differential repros.
    #[arg(long, requires = "target")]
    vs: Option<String>,
    /// Faults of the second target.
    #[arg(long = "inject-b", value_delimiter = ',', requires = "vs")]
    inject_b: Vec<String>,
    /// Write JUnit XML here: one test case per repro file.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Print only what did not pass.
    #[arg(long, short)]
    quiet: bool,
}

/// Replays the files.
pub fn run(a: ReplayArgs) -> Result<i32, CliError> {
    let baseline = match (&a.baseline, &a.target) {
        (Some(b), _) => Some(b.clone()),
        // A source tree is held to its baseline pin, a sanitizer build to the build without
        // the sanitizer, where a file records nothing for them.
        (None, Some(t)) if TargetKind::is_llama(t) => {
            let pin = kvaudit::targets::llama::pins::Pin::parse(t)
                .map_err(|e| CliError::usage(format!("{e:#}")))?;
            let mut base = pin
                .baseline()
                .map_err(|e| CliError::usage(format!("{e:#}")))?;
            base.variant = base.variant.without_added_checks();
            let base = base.label();
            if base == pin.label() {
                None
            } else {
                let version = pin
                    .version_text()
                    .map_err(|e| CliError::usage(format!("{e:#}")))?;
                println!(
                    "{t}: {version}; held to the expectations of {base} where a file records none (--baseline to change)"
                );
                Some(base)
            }
        }
        _ => None,
    };
    let filter = ReplayFilter {
        target: a.target.as_ref().map(|t| {
            (
                TargetSpec::new(t, &a.inject).with_observe(Observe::ALL_WITH_PROBE),
                a.vs.as_ref()
                    .map(|v| TargetSpec::new(v, &a.inject_b).with_observe(Observe::ALL_WITH_PROBE)),
            )
        }),
        baseline,
    };
    if let Some((x, y)) = &filter.target {
        x.factory().map(drop)?;
        if let Some(y) = y {
            y.factory().map(drop)?;
        }
    }
    let mut files = Vec::new();
    for p in &a.paths {
        files.extend(repro_files(p).map_err(CliError::usage)?);
    }
    let mut results: Vec<FileResult> = Vec::new();
    for path in &files {
        let r = replay_file(path, &filter);
        match &r.entries {
            Err(e) => println!("{}\n  unreadable: {e}", path.display()),
            Ok(entries) => {
                if !a.quiet || !r.passed() {
                    println!("{}", path.display());
                }
                for e in entries {
                    if !a.quiet || !e.status.passed() {
                        println!("  {}: {}: {}", e.label, e.status.word(), e.status.detail());
                    }
                }
            }
        }
        results.push(r);
    }
    let count = |f: &dyn Fn(&Status) -> bool| {
        results
            .iter()
            .filter_map(|r| r.entries.as_ref().ok())
            .flatten()
            .filter(|e| f(&e.status))
            .count()
    };
    let unreadable: Vec<&FileResult> = results.iter().filter(|r| r.entries.is_err()).collect();
    println!(
        "{} repro file(s): {} expectation(s) confirmed, {} fixed, {} regressed, {} changed, {} unrecorded, {} not checkable{}",
        results.len(),
        count(&|s| matches!(s, Status::Confirmed(_))),
        count(&|s| matches!(s, Status::Fixed(_))),
        count(&|s| matches!(s, Status::Regressed(_))),
        count(&|s| matches!(s, Status::Changed(_))),
        count(&|s| matches!(s, Status::Unrecorded(_))),
        count(&|s| matches!(s, Status::Unavailable(_))),
        if unreadable.is_empty() {
            String::new()
        } else {
            format!(", {} unreadable", unreadable.len())
        }
    );
    if let Some(j) = &a.junit {
        write_atomically(j, &junit_xml(&results))
            .map_err(|e| CliError::harness(format!("{}: cannot write: {e}", j.display())))?;
    }
    if let Some(r) = unreadable.first() {
        let e = r.entries.as_ref().expect_err("unreadable");
        return Err(CliError::usage(e.clone()));
    }
    if results.iter().any(FileResult::harness_error) {
        return Ok(exit::HARNESS);
    }
    Ok(if results.iter().all(FileResult::passed) {
        exit::CLEAN
    } else {
        exit::FINDINGS
    })
}
