//! Hunt groups whose traces are local minima: each case of `tests/data/minimal/*.json` names a
//! hunt summary (a committed one under `reports/hunt/`, or a hunt run now), and every group it
//! lists is shrunk again on the summary's target, judged as the entry that found it
//! (`engines::hunt::again`). A local minimum comes back unchanged; one that shrinks further fails
//! the test, unless the case lists it under `not_minimal` (a committed report older than the
//! shrinker, until it is regenerated), where it must still shrink: a listed group that has become
//! minimal fails too, so the list stays true. A failure prints the list as it should read.

use std::process::Command;

use libtest_mimic::Trial;
use serde::Deserialize;

use kvaudit::engines::hunt::again::{shrink_representatives_again, Again};
use kvaudit::engines::hunt::plan;
use kvaudit::engines::shrink::ShrinkConfig;
use kvaudit::records::hunt::HuntSummary;
use kvaudit::targets::registry::TargetSpec;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MinimalCase {
    /// What the case shows.
    #[allow(dead_code)]
    about: String,
    /// A committed summary, relative to the repository root.
    #[serde(default)]
    summary: Option<String>,
    /// Or the arguments of a hunt to run now (`kvaudit hunt ARGS --out DIR`).
    #[serde(default)]
    hunt: Option<Vec<String>>,
    /// The groups to shrink again (1-based); absent: every group. A committed report's cheap
    /// entries keep the test's cost to CI small.
    #[serde(default)]
    groups: Option<Vec<usize>>,
    /// Groups known to shrink further (the report predates the shrinker's passes).
    #[serde(default)]
    not_minimal: Vec<usize>,
    /// Groups known not to fail as the summary says any more, or not on every run (a heap
    /// corruption that does not come back, a partner model changed since the hunt, an artifact
    /// fixed since), each with why; one that fails again must still come back unchanged.
    #[serde(default)]
    not_reproduced: std::collections::BTreeMap<usize, String>,
    /// Most target executions one group's shrink may spend.
    budget: u64,
}

pub fn trials() -> Vec<Trial> {
    super::data_files(&super::root().join("tests/data/minimal"), "json")
        .into_iter()
        .map(|(stem, path)| {
            Trial::test(format!("minimal::{stem}"), move || {
                let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
                let case: MinimalCase =
                    serde_json::from_str(&text).map_err(|e| format!("{stem}.json: {e}"))?;
                super::outcome(check(&case))
            })
        })
        .collect()
}

/// The case's summary: the committed one, or that of a hunt run now into a temporary folder.
fn summary_of(c: &MinimalCase) -> Result<HuntSummary, String> {
    let text = match (&c.summary, &c.hunt) {
        (Some(path), None) => {
            let path = super::root().join(path);
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?
        }
        (None, Some(args)) => {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let out = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
                .arg("hunt")
                .args(args)
                .arg("--out")
                .arg(dir.path())
                .arg("-q")
                .env("KVAUDIT_DATE", "2026-12-01")
                .output()
                .map_err(|e| e.to_string())?;
            if !matches!(out.status.code(), Some(0 | 1)) {
                return Err(format!(
                    "the hunt exited {:?}: {}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let path = dir.path().join("summary.json");
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?
        }
        _ => return Err("a case names a summary or a hunt, one of them".into()),
    };
    HuntSummary::parse(&text).map_err(|e| e.to_string())
}

fn check(c: &MinimalCase) -> Result<(), String> {
    let summary = summary_of(c)?;
    let target = TargetSpec::new(&summary.target, &summary.faults);
    let groups: Vec<usize> = match &c.groups {
        Some(g) => g.clone(),
        None => (1..=summary.groups.len()).collect(),
    };
    if groups.is_empty() {
        return Err("no group to shrink again: a case that checks nothing".into());
    }
    let cfg = ShrinkConfig {
        max_executions: c.budget,
        ..ShrinkConfig::default()
    };
    let started = std::time::Instant::now();
    let again = shrink_representatives_again(&summary, &target, &plan(&target), &groups, &cfg)
        .map_err(|e| e.message)?;
    let listed = |want: fn(&Again) -> bool| -> Vec<usize> {
        again
            .iter()
            .filter(|(_, a)| want(a))
            .map(|(g, _)| *g)
            .collect()
    };
    let smaller = listed(|a| matches!(a, Again::Smaller { .. }));
    let not_reproduced = listed(|a| matches!(a, Again::NotReproduced));
    let wrong: Vec<String> = again
        .iter()
        .filter(|(g, a)| match a {
            // A group that does not fail every run (a corrupted heap, an over-read) may come
            // back failing, and then must be a local minimum.
            Again::Minimal { .. } => c.not_minimal.contains(g),
            Again::Smaller { .. } => !c.not_minimal.contains(g),
            Again::NotReproduced => !c.not_reproduced.contains_key(g),
            Again::Stopped { .. } | Again::NoEntry { .. } => true,
        })
        .map(|(g, a)| format!("group {g}: {}", a.describe()))
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} of {} group(s) not as the case says ({:.1} s):\n{}\nnot_minimal should read \
         {smaller:?}, not_reproduced {not_reproduced:?}",
        wrong.len(),
        groups.len(),
        started.elapsed().as_secs_f64(),
        wrong.join("\n")
    ))
}
