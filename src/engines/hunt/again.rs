//! A hunt's group representatives shrunk again, each on the entry that found it: one the shrinker
//! gives back unchanged is a local minimum under every move of `engines::shrink`, one it makes
//! smaller was not minimal. This is how a committed hunt report is checked to hold minimal
//! traces (`tests/data/minimal/`), and what tells which groups a report regenerated with a newer
//! shrinker would show smaller. [`finish_stopped_shrinks`] finishes the shrinks a hunt's budget
//! stopped short (`kvaudit merge DIR --out DIR --shrink-again N`), so that a committed report
//! holds local minima.

use crate::base::error::Error;
use crate::base::op::Trace;
use crate::engines::shrink::{shrink, FailureMode, ShrinkConfig};
use crate::records::hunt::{HuntSummary, PlanEntry};
use crate::running::judge::Judge;
use crate::targets::registry::TargetSpec;

use super::plan::{factories, registry};
use super::run::{regroup, shrink_finding};

/// What shrinking a representative again gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Again {
    /// Itself, at a fixed point: a local minimum.
    Minimal {
        /// Target executions it took to show it.
        executions: u64,
    },
    /// A smaller trace that fails the same way: the representative was not minimal.
    Smaller {
        /// The smaller trace.
        trace: Trace,
        /// Target executions spent.
        executions: u64,
    },
    /// The budget ran out before a fixed point, with nothing smaller found.
    Stopped {
        /// Target executions spent.
        executions: u64,
    },
    /// It does not fail as the summary says on this build (a fix, another pin, or a failure that
    /// does not reproduce).
    NotReproduced,
    /// Its entry is not in the target's plan (the plan changed since the hunt).
    NoEntry {
        /// The entry's id.
        entry: String,
    },
}

impl Again {
    /// One line for a person.
    pub fn describe(&self) -> String {
        match self {
            Again::Minimal { executions } => {
                format!("a local minimum ({executions} executions)")
            }
            Again::Smaller { trace, executions } => format!(
                "not minimal: shrinks to {} ops + {} setup ops in {executions} executions: {}",
                trace.ops.len(),
                trace.setup.ops.len(),
                serde_json::to_string(trace).expect("a trace serializes")
            ),
            Again::Stopped { executions } => {
                format!("unknown: the budget ran out after {executions} executions")
            }
            Again::NotReproduced => "does not fail that way on this build".into(),
            Again::NoEntry { entry } => format!("entry {entry} is not in the plan any more"),
        }
    }
}

/// The index in `judges` of the judge of `entry` (one per entry, made on first use: the entry's
/// runners and oracles, as the hunt judged it).
fn judge_of(
    judges: &mut Vec<(String, Judge)>,
    target: &TargetSpec,
    entry: &PlanEntry,
) -> Result<usize, Error> {
    if let Some(at) = judges.iter().position(|(id, _)| *id == entry.id) {
        return Ok(at);
    }
    let (a, b) = factories(target, entry)?;
    let judge = Judge::new(a.as_ref(), b.as_deref())
        .map_err(|e| Error::harness(e.to_string()))?
        .with_oracles(registry(entry));
    judges.push((entry.id.clone(), judge));
    Ok(judges.len() - 1)
}

/// The representatives of `groups` (1-based numbers of `summary.groups`) shrunk again on
/// `target` (the summary's), each judged as the entry of `plan` that found it judges; one judge
/// per entry, shared by its groups.
pub fn shrink_representatives_again(
    summary: &HuntSummary,
    target: &TargetSpec,
    plan: &[PlanEntry],
    groups: &[usize],
    cfg: &ShrinkConfig,
) -> Result<Vec<(usize, Again)>, Error> {
    let mut judges: Vec<(String, Judge)> = Vec::new();
    let mut out = Vec::new();
    for &g in groups {
        let group = summary
            .groups
            .get(g.wrapping_sub(1))
            .ok_or_else(|| Error::input(format!("no group {g} in the summary")))?;
        let rep = summary
            .findings
            .get(group.group.representative.wrapping_sub(1))
            .ok_or_else(|| Error::input(format!("group {g}: no representative finding")))?;
        let Some(entry) = plan.iter().find(|e| e.id == rep.entry) else {
            out.push((
                g,
                Again::NoEntry {
                    entry: rep.entry.clone(),
                },
            ));
            continue;
        };
        let at = judge_of(&mut judges, target, entry)?;
        let f = &rep.finding;
        let mode = FailureMode {
            oracle: f.oracle,
            kind: f.kind.clone(),
        };
        let shrunk = shrink(&f.trace, &mode, &mut judges[at].1, cfg)
            .map_err(|e| Error::harness(e.to_string()))?;
        let again = match shrunk {
            None => Again::NotReproduced,
            Some(s) if s.trace != f.trace => Again::Smaller {
                trace: s.trace,
                executions: s.executions,
            },
            Some(s) if s.minimal => Again::Minimal {
                executions: s.executions,
            },
            Some(s) => Again::Stopped {
                executions: s.executions,
            },
        };
        out.push((g, again));
    }
    Ok(out)
}

/// What [`finish_stopped_shrinks`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FinishedShrinks {
    /// Findings shrunk again: those whose shrink the hunt's budget had stopped, and the
    /// groups' representatives.
    pub stopped: usize,
    /// Of those, shrunk to a fixed point now.
    pub finished: usize,
    /// Of those, stopped by this budget too.
    pub still_stopped: usize,
    /// Of those, not failing again as recorded (left as they were).
    pub not_reproduced: usize,
    /// Of those, whose entry is not in the plan (left as they were).
    pub no_entry: usize,
}

/// Every finding of `summary` whose shrink stopped short (`shrink_stopped_after`), and every
/// group's representative (a repeat of a known violation is kept as the hunt found it, and the
/// fuzzer's shrink is not the hunt's), shrunk again on its entry of `plan`, judged as the hunt
/// judged it, with `cfg`; replaced by what the shrinker gives (its violation read again), and
/// the findings grouped again (their classes are the caller's to make again).
pub fn finish_stopped_shrinks(
    summary: &mut HuntSummary,
    target: &TargetSpec,
    plan: &[PlanEntry],
    cfg: &ShrinkConfig,
) -> Result<FinishedShrinks, Error> {
    let mut judges: Vec<(String, Judge)> = Vec::new();
    let mut done = FinishedShrinks::default();
    // Grouping again can make another member a group's representative (the fewest ops): each
    // round shrinks the representatives not shrunk yet, until every one has been.
    let mut shrunk_already = vec![false; summary.findings.len()];
    loop {
        let representatives: Vec<usize> = summary
            .groups
            .iter()
            .map(|g| g.group.representative - 1)
            .collect();
        let todo: Vec<usize> = (0..summary.findings.len())
            .filter(|&i| !shrunk_already[i])
            .filter(|&i| {
                summary.findings[i].shrink_stopped_after.is_some() || representatives.contains(&i)
            })
            .collect();
        if todo.is_empty() {
            break;
        }
        let mut changed = false;
        for i in todo {
            shrunk_already[i] = true;
            let hf = &mut summary.findings[i];
            done.stopped += 1;
            let Some(entry) = plan.iter().find(|e| e.id == hf.entry) else {
                done.no_entry += 1;
                continue;
            };
            let at = judge_of(&mut judges, target, entry)?;
            let Some((f, stopped)) = shrink_finding(&hf.finding, &mut judges[at].1, cfg)? else {
                done.not_reproduced += 1;
                continue;
            };
            match stopped {
                None => done.finished += 1,
                Some(_) => done.still_stopped += 1,
            }
            changed |= f.trace != hf.finding.trace;
            hf.finding = f;
            hf.shrink_stopped_after = stopped;
        }
        if !changed {
            break;
        }
        regroup(summary);
    }
    Ok(done)
}
