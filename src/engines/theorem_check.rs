//! The theorems as oracles of random exploration (`kvaudit fuzz --oracles T1,T2,T3`).
//!
//! A fuzz case is one trace. T1 judges it as it is ([`crate::oracles::theorems::t1::check_placement`]: every row
//! and every decode's logits against the reference replay). T2 and T3 need a partner: each of
//! the theorem's [`Derivation`]s is offered the trace, and where one gives a [`Pair`], both
//! sides run on the target and the pair's [`Verdict`](crate::oracles::theorems::Verdict) is judged against the target's
//! [`Tolerance`]. A trace no derivation accepts is *no pair*: neither a pass nor a failure, and
//! counted apart, so a run that checked nothing cannot pass for a clean one. A target that cannot
//! show rows or logits gives `Unsupported`, a third outcome.
//!
//! [`StillViolated`] is the shrink predicate of a violated check: the same theorem and
//! derivation still derive a pair from the candidate, and its verdict still fails.

use std::sync::Arc;

use crate::base::cache::{CacheUnderTest, HarnessError, TargetInfo};
use crate::base::op::Trace;
use crate::engines::shrink::Predicate;
use crate::model::forward::Model;

use crate::oracles::theorems::pair::check_pair;
use crate::oracles::theorems::t1::check_placement;
use crate::oracles::theorems::{Derivation, Pair, Theorem, TheoremJudgement, Tolerance};

/// One judged (or unsupported) theorem check of one trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// The theorem.
    pub theorem: Theorem,
    /// How the pair was derived (`None`: T1, which judges the trace alone).
    pub derivation: Option<Derivation>,
    /// The pair that ran (T2, T3).
    pub pair: Option<Pair>,
    /// The verdict, or why the target cannot be judged.
    pub judgement: TheoremJudgement,
}

impl Check {
    /// True if the theorem was judged and violated.
    pub fn violated(&self) -> bool {
        matches!(&self.judgement, TheoremJudgement::Judged(v) if !v.holds)
    }
}

/// A target the theorems run on, with the reference model T1 compares against.
pub struct TheoremChecker {
    target: Box<dyn CacheUnderTest + Send>,
    reference: Arc<Model>,
    window: Option<u32>,
    tolerance: Tolerance,
    executions: u64,
}

impl TheoremChecker {
    /// Checks on `target`, whose model has sliding window `window` (the derivations need to
    /// know it); `reference` is T1's reference model (loaded apart from the target's, with the
    /// same window), `tolerance` what the target is held to ([`Tolerance::EXACT`] for the
    /// native target).
    pub fn new(
        target: Box<dyn CacheUnderTest + Send>,
        reference: Arc<Model>,
        window: Option<u32>,
        tolerance: Tolerance,
    ) -> Self {
        TheoremChecker {
            target,
            reference,
            window,
            tolerance,
            executions: 0,
        }
    }

    /// The target.
    pub fn info(&self) -> TargetInfo {
        self.target.info()
    }

    /// The window the derivations assume.
    pub fn window(&self) -> Option<u32> {
        self.window
    }

    /// The tolerance verdicts are judged against.
    pub fn tolerance(&self) -> Tolerance {
        self.tolerance
    }

    /// Target executions so far (a trace run from its setup counts one; a pair two).
    pub fn executions(&self) -> u64 {
        self.executions
    }

    /// Checks `trace` with one derivation of `theorem` (`None` for T1). `Ok(None)`: no pair
    /// derives from the trace.
    pub fn check_one(
        &mut self,
        theorem: Theorem,
        derivation: Option<Derivation>,
        trace: &Trace,
    ) -> Result<Option<Check>, HarnessError> {
        let (pair, judgement) = match derivation {
            None => {
                self.executions += 1;
                let j =
                    check_placement(self.target.as_mut(), trace, &self.reference, self.tolerance)?;
                (None, j)
            }
            Some(d) => {
                let Some(pair) = d.derive(trace, self.window) else {
                    return Ok(None);
                };
                self.executions += 2;
                let hd = self.reference.hparams().head_dim;
                let j = check_pair(self.target.as_mut(), &pair, self.tolerance, hd)?;
                (Some(pair), j)
            }
        };
        Ok(Some(Check {
            theorem,
            derivation,
            pair,
            judgement,
        }))
    }

    /// Every check `theorem` makes of `trace`: T1 one; T2 and T3 one per derivation that gives a
    /// pair (empty: no pair).
    pub fn check(&mut self, theorem: Theorem, trace: &Trace) -> Result<Vec<Check>, HarnessError> {
        let derivations: Vec<Option<Derivation>> = match Derivation::of(theorem) {
            [] => vec![None],
            ds => ds.iter().copied().map(Some).collect(),
        };
        let mut out = Vec::new();
        for d in derivations {
            if let Some(c) = self.check_one(theorem, d, trace)? {
                out.push(c);
            }
        }
        Ok(out)
    }
}

/// The shrink predicate of a violated check: the candidate still derives a pair by the same
/// derivation (T1: none needed) and the verdict still fails. A pair's verdict is about the whole
/// trace, so candidates are never cut.
pub struct StillViolated<'c> {
    /// The checker.
    pub checker: &'c mut TheoremChecker,
    /// The theorem.
    pub theorem: Theorem,
    /// The derivation (`None`: T1).
    pub derivation: Option<Derivation>,
}

impl Predicate for StillViolated<'_> {
    type Failure = Check;

    fn test(&mut self, trace: &Trace) -> Result<Option<(usize, Check)>, HarnessError> {
        let c = self
            .checker
            .check_one(self.theorem, self.derivation, trace)?;
        Ok(c.filter(Check::violated).map(|c| (trace.ops.len(), c)))
    }

    fn executions(&self) -> u64 {
        self.checker.executions()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::{Decode, Op, Setup};

    fn checker(faults: &[&str], window: Option<u32>) -> TheoremChecker {
        let faults: Vec<String> = faults.iter().map(|s| s.to_string()).collect();
        let (target, reference) =
            crate::targets::registry::TargetSpec::new("native+tensors", &faults)
                .theorem_target(window)
                .unwrap();
        TheoremChecker::new(target, reference, window, Tolerance::EXACT)
    }

    /// Shift the survivors up, bring a span in from a sibling, evict it, shift back.
    fn never_saw_trace() -> Trace {
        crate::oracles::theorems::t2::never_saw_witness(
            Setup {
                n_seq_max: 2,
                ..Setup::default()
            },
            vec![Op::Decode(Decode::next(0, 7))],
            Op::Decode(Decode::next(1, 3)),
        )
    }

    #[test]
    fn t2_holds_clean_and_fails_with_the_delta_rotation_and_no_pair_is_no_check() {
        let trace = never_saw_trace();
        let checks = checker(&[], None).check(Theorem::T2, &trace).unwrap();
        assert_eq!(checks.len(), 1);
        assert!(!checks[0].violated(), "{}", checks[0].judgement);
        assert!(matches!(checks[0].judgement, TheoremJudgement::Judged(_)));
        let mut bad = checker(&["seq_add_delta_rotation"], None);
        let checks = bad.check(Theorem::T2, &trace).unwrap();
        assert!(checks[0].violated());
        assert_eq!(bad.executions(), 2);
        // No eviction: no T2 pair, and nothing ran.
        let mut none = trace.clone();
        none.ops.truncate(2);
        assert!(bad.check(Theorem::T2, &none).unwrap().is_empty());
        assert_eq!(bad.executions(), 2);
    }
}
