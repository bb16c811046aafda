//! A finding across llama.cpp versions: what a repro file's trace does on one version
//! ([`Outcome`]: holds, fails, crash, unsupported, or unavailable when the version cannot be
//! built or driven), the table of every finding on every version (`matrix`), and the binary
//! search for the version where a finding appears or disappears (`bisect`, with the exit-code
//! contract of `git bisect run` for a source tree).
//!
//! Each version is run through the replay's own path ([`crate::outputs::repro::judge_on`]: the
//! target registry, a crash-isolated worker, every oracle on every step); this module only
//! classifies the judgement, so a matrix cell and a replay never disagree on what happened.

pub mod bisect;
pub mod matrix;

use serde::{Deserialize, Serialize};

use crate::base::cache::Observe;
use crate::base::error::Error;
use crate::oracles::{OracleId, Registry};
use crate::outputs::repro::{judge_on, Repro};
use crate::running::judge::RunJudgement;
use crate::targets::llama::build::{ensure_built, BuildSpec};
use crate::targets::llama::pins::Pin;
use crate::targets::registry::{TargetKind, TargetSpec};

/// What a finding's trace does on one version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum Outcome {
    /// The file's oracle holds on every step: the finding is absent.
    Holds,
    /// The file's oracle fails first at `step`: the finding is present.
    Fails {
        /// 1-based step of the first violation.
        step: usize,
        /// Its kind.
        kind: String,
    },
    /// The trial crashed (abort, signal, hang) at `step`, before the file's oracle failed:
    /// the finding's trace does not run through, which counts as present.
    Crash {
        /// 1-based step of the crash (0: the setup).
        step: usize,
        /// What ended the trial.
        kind: String,
    },
    /// The version cannot take the trace (an op or configuration it does not have) before the
    /// oracle could say anything: neither present nor absent.
    Unsupported {
        /// Why.
        reason: String,
    },
    /// The version could not be built or driven: the harness's failure, not the version's.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// A word for tables: `holds`, `FAILS`, `CRASH`, `unsupported`, `unavailable`.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Holds => "holds",
            Outcome::Fails { .. } => "FAILS",
            Outcome::Crash { .. } => "CRASH",
            Outcome::Unsupported { .. } => "unsupported",
            Outcome::Unavailable { .. } => "unavailable",
        }
    }

    /// One character for a dense table: `.` holds, `F` fails, `C` crash, `u` unsupported, `?`
    /// unavailable.
    pub fn mark(&self) -> char {
        match self {
            Outcome::Holds => '.',
            Outcome::Fails { .. } => 'F',
            Outcome::Crash { .. } => 'C',
            Outcome::Unsupported { .. } => 'u',
            Outcome::Unavailable { .. } => '?',
        }
    }

    /// Whether the finding is present (fails or crash), absent (holds), or unknown here.
    pub fn present(&self) -> Option<bool> {
        match self {
            Outcome::Holds => Some(false),
            Outcome::Fails { .. } | Outcome::Crash { .. } => Some(true),
            Outcome::Unsupported { .. } | Outcome::Unavailable { .. } => None,
        }
    }

    /// The outcome in a sentence.
    pub fn detail(&self) -> String {
        match self {
            Outcome::Holds => "the oracle holds on every step".into(),
            Outcome::Fails { step, kind } => format!("fails first at step {step} ({kind})"),
            Outcome::Crash { step, kind } => format!("crashes at step {step} ({kind})"),
            Outcome::Unsupported { reason } => format!("unsupported: {reason}"),
            Outcome::Unavailable { reason } => format!("unavailable: {reason}"),
        }
    }
}

/// What `j` says about the finding of `repro`: the earlier of the file's oracle's first
/// violation and a crash, else unsupported if the target stopped first, else holds.
pub fn classify(repro: &Repro, j: &RunJudgement) -> Outcome {
    let first = j.first(repro.oracle);
    let crash = j.first(OracleId::CRASH);
    let earliest = [crash, first].into_iter().flatten().min_by_key(|v| v.step);
    if let Some((step, reason)) = &j.unsupported {
        if !matches!(earliest, Some(v) if v.step < *step) {
            return Outcome::Unsupported {
                reason: format!("step {step}: {reason}"),
            };
        }
    }
    match earliest {
        None => Outcome::Holds,
        Some(v) if v.violation.oracle == OracleId::CRASH => Outcome::Crash {
            step: v.step,
            kind: v.violation.kind.clone(),
        },
        Some(v) => Outcome::Fails {
            step: v.step,
            kind: v.violation.kind.clone(),
        },
    }
}

/// The second target of a pair oracle's repro: the `vs` of the file's first llama.cpp
/// expectation that has one.
fn pair_target(repro: &Repro) -> Option<TargetSpec> {
    repro
        .targets
        .iter()
        .find(|e| TargetKind::is_llama(&e.target) && e.vs.is_some())
        .and_then(|e| e.specs().1)
}

/// What a version is observed for on `repro`'s trace: what the file's oracle reads, no more.
/// An observation the finding does not need (a whole-context dump for an I1 finding) must not
/// decide its verdict: 0.1.109-0.1.112 crash in `llama_state_get_data` after any op
/// (docs/versions.md), which says nothing about whether their `seq_pos` goes stale. A crash
/// finding is observed as a replay observes it: a corrupted heap aborts at whatever allocates
/// next, an observation included (`crash_decode_next_pos_seq_id_out_of_range` on 0.1.161).
fn observe_for(repro: &Repro) -> Observe {
    if repro.oracle == OracleId::CRASH {
        return Observe::ALL_WITH_PROBE;
    }
    Registry::builtin()
        .get(repro.oracle)
        .map(|o| Observe::BASIC.union(o.observes()))
        .unwrap_or(Observe::ALL_WITH_PROBE)
}

/// Runs `repro`'s trace on the target `label` (a pin, or `llama.cpp@src:PATH`), observing what
/// the file's oracle reads, and classifies it. Building is the caller's (see [`build`]); a
/// target that cannot be driven is [`Outcome::Unavailable`].
pub fn outcome_on(repro: &Repro, label: &str) -> Outcome {
    let observe = observe_for(repro);
    let target = TargetSpec::new(label, &[]).with_observe(observe);
    let vs = pair_target(repro).map(|v| v.with_observe(observe));
    match judge_on(repro, &target, vs.as_ref()) {
        Ok(j) => classify(repro, &j),
        Err(e) => Outcome::Unavailable { reason: e.message },
    }
}

/// Builds `pin` if the cache lacks it (with progress on stderr): `Err` is why it cannot be.
pub fn build(pin: &Pin) -> Result<(), Error> {
    ensure_built(&BuildSpec::new(pin.clone()), true)
        .map(drop)
        .map_err(|e| Error::harness(format!("cannot build {pin}: {e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracles::Violation;
    use crate::running::judge::StepViolation;

    fn violation(oracle: OracleId, step: usize, kind: &str) -> StepViolation {
        StepViolation {
            step,
            violation: Violation {
                oracle,
                kind: kind.into(),
                seq: None,
                observed: serde_json::Value::Null,
                expected: serde_json::Value::Null,
            },
            on_vs: false,
        }
    }

    #[test]
    fn a_judgement_is_classified_by_what_happened_first() {
        let repro = Repro::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/corpora/i1_seq_cp_twice_stale_max.json"
        )))
        .unwrap();
        let mut j = RunJudgement::default();
        assert_eq!(classify(&repro, &j), Outcome::Holds);
        j.unsupported = Some((2, "no such op".into()));
        assert!(matches!(classify(&repro, &j), Outcome::Unsupported { .. }));
        j.violations.push(violation(repro.oracle, 1, "stale"));
        assert!(matches!(
            classify(&repro, &j),
            Outcome::Fails { step: 1, .. }
        ));
        j.violations.push(violation(OracleId::CRASH, 1, "SIGABRT"));
        assert!(matches!(
            classify(&repro, &j),
            Outcome::Crash { step: 1, .. }
        ));
        assert_eq!(Outcome::Holds.present(), Some(false));
        assert_eq!(
            Outcome::Unavailable {
                reason: String::new()
            }
            .present(),
            None
        );
    }
}
