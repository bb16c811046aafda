//! A hunt's group representatives shrunk again, each on the entry that found it: one the shrinker
//! gives back unchanged is a local minimum under every move of `engines::shrink`, one it makes
//! smaller was not minimal. This is how a committed hunt report is checked to hold minimal
//! traces (`tests/data/minimal/`), and what tells which groups a report regenerated with a newer
//! shrinker would show smaller.

use crate::base::error::Error;
use crate::base::op::Trace;
use crate::engines::shrink::{shrink, FailureMode, ShrinkConfig};
use crate::records::hunt::{HuntSummary, PlanEntry};
use crate::running::judge::Judge;
use crate::targets::registry::TargetSpec;

use super::plan::{factories, registry};

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
        let at = match judges.iter().position(|(id, _)| *id == entry.id) {
            Some(at) => at,
            None => {
                let (a, b) = factories(target, entry)?;
                let judge = Judge::new(a.as_ref(), b.as_deref())
                    .map_err(|e| Error::harness(e.to_string()))?
                    .with_oracles(registry(entry));
                judges.push((entry.id.clone(), judge));
                judges.len() - 1
            }
        };
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
