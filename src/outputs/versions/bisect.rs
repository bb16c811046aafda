//! Bisecting a finding over the published versions, and the exit-code contract of
//! `git bisect run` for a source tree.
//!
//! Over versions: `good` is a version where the finding is absent, `bad` one where it is
//! present. Whichever is older, the search looks for the oldest version after it whose state
//! (present or absent) is the newer endpoint's: with `good` older, the version that introduced
//! the finding; with `bad` older, the version that fixed it. A version whose outcome is
//! neither (unsupported, unavailable) is skipped, as `git bisect skip` would, and the nearest
//! untried version is probed instead; when only skipped versions are left between the two
//! sides, the answer is the range.
//!
//! For a git checkout, one probe of the tree is one step of `git bisect run` ([`GitVerdict`]):
//! exit 0 when the finding is absent ("good", or "old" under other terms), 1 when present, 125
//! when the tree cannot be built or cannot take the trace (skip), 128 when the harness broke
//! (any code above 127 aborts the bisection). With `--fix` present and absent swap, so that a
//! bisection over a range where the bug was fixed finds the fixing commit.

use serde::{Deserialize, Serialize};

use super::Outcome;
use crate::base::error::Error;
use crate::targets::llama::pins::version_key;

/// One probe of a bisection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BisectStep {
    /// The version probed.
    pub version: String,
    /// What the finding did there.
    pub outcome: Outcome,
}

/// Where the finding changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "lowercase")]
pub enum BisectAnswer {
    /// `first` is the oldest version after `last_before` with the newer endpoint's state.
    Changed {
        /// The newest version with the older endpoint's state.
        last_before: String,
        /// The oldest version with the newer endpoint's state.
        first: String,
        /// True if the finding appears at `first` (introduced), false if it disappears (fixed).
        appears: bool,
    },
    /// Only versions that could not be judged lie between the two sides.
    Ambiguous {
        /// The newest version with the older endpoint's state.
        last_before: String,
        /// The oldest version known to have the newer endpoint's state.
        first_known: String,
        /// The versions between them that were skipped.
        skipped: Vec<String>,
    },
}

impl BisectAnswer {
    /// The answer in a sentence.
    pub fn sentence(&self) -> String {
        match self {
            BisectAnswer::Changed {
                last_before,
                first,
                appears,
            } => format!(
                "{}: first {} in {first} (and {} in {last_before})",
                if *appears { "introduced" } else { "fixed" },
                if *appears { "fails" } else { "holds" },
                if *appears { "holds" } else { "fails" },
            ),
            BisectAnswer::Ambiguous {
                last_before,
                first_known,
                skipped,
            } => format!(
                "changes after {last_before} and by {first_known}; the versions between could not be judged: {}",
                skipped.join(", ")
            ),
        }
    }
}

/// A whole bisection: the probes in the order made, and the answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bisection {
    /// Every probe, endpoints first.
    pub steps: Vec<BisectStep>,
    /// Where the finding changes.
    pub answer: BisectAnswer,
}

/// Bisects over `versions` (every candidate, any order: sorted here) between `good` and `bad`,
/// probing with `probe` and reporting each step to `on_step` as it is made. `Err` (bad input)
/// when an endpoint is not among the versions, or does not show what it is said to.
pub fn bisect(
    versions: &[String],
    good: &str,
    bad: &str,
    probe: &mut dyn FnMut(&str) -> Outcome,
    on_step: &mut dyn FnMut(&BisectStep),
) -> Result<Bisection, Error> {
    let mut versions = versions.to_vec();
    versions.sort_by_key(|v| version_key(v));
    versions.dedup();
    let index = |v: &str| {
        versions.iter().position(|x| x == v).ok_or_else(|| {
            Error::input(format!(
                "bisect: `{v}` is not a known version (`kvaudit target list` lists them)"
            ))
        })
    };
    let (g, b) = (index(good)?, index(bad)?);
    if g == b {
        return Err(Error::input(
            "bisect: --good and --bad name the same version",
        ));
    }
    let mut steps = Vec::new();
    let mut run = |i: usize, steps: &mut Vec<BisectStep>| {
        let step = BisectStep {
            version: versions[i].clone(),
            outcome: probe(&versions[i]),
        };
        on_step(&step);
        let present = step.outcome.present();
        steps.push(step);
        present
    };
    for (i, flag, want) in [(g, "--good", false), (b, "--bad", true)] {
        match run(i, &mut steps) {
            Some(p) if p == want => {}
            Some(_) => {
                return Err(Error::input(format!(
                    "bisect: {flag} {}: the finding is {} there, not {}",
                    versions[i],
                    if want { "absent" } else { "present" },
                    if want { "present" } else { "absent" },
                )))
            }
            None => {
                return Err(Error::input(format!(
                    "bisect: {flag} {}: {}",
                    versions[i],
                    steps.last().map(|s| s.outcome.detail()).unwrap_or_default()
                )))
            }
        }
    }
    // lo has the older endpoint's state, hi the newer's; find the oldest index with hi's state.
    let (mut lo, mut hi) = (g.min(b), g.max(b));
    let newer_present = b > g;
    let mut skipped: Vec<usize> = Vec::new();
    loop {
        let untried: Vec<usize> = (lo + 1..hi).filter(|i| !skipped.contains(i)).collect();
        // The untried version nearest the middle (the middle itself while nothing is skipped).
        let middle = (lo + hi) / 2;
        let Some(&m) = untried.iter().min_by_key(|&&i| i.abs_diff(middle)) else {
            break;
        };
        match run(m, &mut steps) {
            None => skipped.push(m),
            Some(p) if p == newer_present => hi = m,
            Some(_) => lo = m,
        }
    }
    let mut between: Vec<usize> = skipped.into_iter().filter(|&i| lo < i && i < hi).collect();
    between.sort();
    let answer = if between.is_empty() {
        BisectAnswer::Changed {
            last_before: versions[lo].clone(),
            first: versions[hi].clone(),
            appears: newer_present,
        }
    } else {
        BisectAnswer::Ambiguous {
            last_before: versions[lo].clone(),
            first_known: versions[hi].clone(),
            skipped: between.into_iter().map(|i| versions[i].clone()).collect(),
        }
    };
    Ok(Bisection { steps, answer })
}

/// What one step of `git bisect run` says about a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GitVerdict {
    /// Exit 0: the finding is absent (with `--fix`: present).
    Good,
    /// Exit 1: the finding is present (with `--fix`: absent).
    Bad,
    /// Exit 125: the tree cannot be built or cannot take the trace.
    Skip,
    /// Exit 128: the harness broke; `git bisect run` stops.
    Abort,
}

impl GitVerdict {
    /// The verdict on an outcome: `fix` swaps good and bad (bisecting for the fixing commit).
    /// A tree that cannot be built is a skip, as a commit that does not compile is in any
    /// bisection; only a failure of kvaudit itself aborts, and the caller decides that.
    pub fn of(outcome: &Outcome, fix: bool) -> GitVerdict {
        match outcome.present() {
            Some(present) if present != fix => GitVerdict::Bad,
            Some(_) => GitVerdict::Good,
            None => GitVerdict::Skip,
        }
    }

    /// The exit code `git bisect run` reads.
    pub fn exit_code(self) -> i32 {
        match self {
            GitVerdict::Good => 0,
            GitVerdict::Bad => 1,
            GitVerdict::Skip => 125,
            GitVerdict::Abort => 128,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions() -> Vec<String> {
        (100..=120).map(|i| format!("0.1.{i}")).collect()
    }

    /// A finding present from 0.1.105 to 0.1.114; 0.1.110-0.1.112 cannot be built.
    fn probe(v: &str) -> Outcome {
        let n: u32 = v.rsplit('.').next().unwrap().parse().unwrap();
        match n {
            110..=112 => Outcome::Unavailable {
                reason: "no build".into(),
            },
            105..=114 => Outcome::Fails {
                step: 3,
                kind: "stale".into(),
            },
            _ => Outcome::Holds,
        }
    }

    #[test]
    fn bisect_finds_the_introducing_and_the_fixing_version() {
        let mut seen = Vec::new();
        let found = bisect(&versions(), "0.1.100", "0.1.113", &mut probe, &mut |s| {
            seen.push(s.version.clone())
        })
        .unwrap();
        assert_eq!(
            found.answer,
            BisectAnswer::Changed {
                last_before: "0.1.104".into(),
                first: "0.1.105".into(),
                appears: true
            }
        );
        assert_eq!(&seen[..2], ["0.1.100", "0.1.113"]);
        assert!(seen.len() <= 2 + 4, "{seen:?}");
        let fixed = bisect(&versions(), "0.1.120", "0.1.106", &mut probe, &mut |_| {}).unwrap();
        assert_eq!(
            fixed.answer,
            BisectAnswer::Changed {
                last_before: "0.1.114".into(),
                first: "0.1.115".into(),
                appears: false
            }
        );
        assert!(fixed
            .answer
            .sentence()
            .starts_with("fixed: first holds in 0.1.115"));
    }

    #[test]
    fn skipped_versions_are_stepped_around_or_reported() {
        let only_skips = |v: &str| match v {
            "0.1.109" => Outcome::Fails {
                step: 1,
                kind: "k".into(),
            },
            "0.1.113" => Outcome::Holds,
            _ => probe(v),
        };
        let mut p = only_skips;
        let found = bisect(&versions(), "0.1.113", "0.1.109", &mut p, &mut |_| {}).unwrap();
        assert_eq!(
            found.answer,
            BisectAnswer::Ambiguous {
                last_before: "0.1.109".into(),
                first_known: "0.1.113".into(),
                skipped: vec!["0.1.110".into(), "0.1.111".into(), "0.1.112".into()],
            }
        );
    }

    #[test]
    fn endpoints_that_contradict_their_flag_are_bad_input() {
        let err = |g: &str, b: &str| {
            bisect(&versions(), g, b, &mut probe, &mut |_| {})
                .unwrap_err()
                .to_string()
        };
        assert!(err("0.1.106", "0.1.113").contains("--good 0.1.106: the finding is present"));
        assert!(err("0.1.100", "0.1.101").contains("--bad 0.1.101: the finding is absent"));
        assert!(err("0.1.100", "0.1.111").contains("unavailable: no build"));
        assert!(err("0.1.100", "0.1.999").contains("not a known version"));
        assert!(err("0.1.100", "0.1.100").contains("same version"));
    }

    #[test]
    fn git_verdicts_follow_the_bisect_run_contract() {
        let fails = Outcome::Crash {
            step: 2,
            kind: "SIGABRT".into(),
        };
        assert_eq!(GitVerdict::of(&Outcome::Holds, false).exit_code(), 0);
        assert_eq!(GitVerdict::of(&fails, false).exit_code(), 1);
        assert_eq!(GitVerdict::of(&Outcome::Holds, true).exit_code(), 1);
        assert_eq!(GitVerdict::of(&fails, true).exit_code(), 0);
        let skip = Outcome::Unsupported { reason: "x".into() };
        assert_eq!(GitVerdict::of(&skip, false).exit_code(), 125);
        assert_eq!(GitVerdict::Abort.exit_code(), 128);
    }
}
