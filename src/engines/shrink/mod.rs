//! Shrinking a failing trace to a minimal one that still fails the same way.
//!
//! "The same way" is a [`FailureMode`]: the same oracle with the same kind of violation. Every
//! candidate is run from the trace's (fixed) setup and judged on every step; a candidate that
//! fails that way, at any step, is accepted and cut after that step, so the violation is always
//! at the last step of the shrunk trace.
//!
//! Stages, in order:
//! 1. proptest's own shrinking of the generator's value tree, when the trace came from one
//!    ([`shrink_tree`]);
//! 2. delta debugging over the op list: remove chunks of half, a quarter, ... and finally single
//!    ops;
//! 3. simplification of each op's arguments ([`simplifications`]): smaller sequence ids,
//!    positions, deltas and divisors, open range ends made closed, decodes into fewer sequences
//!    with fewer tokens at "next" positions; and, across ops, two sequence ids swapped
//!    everywhere when that makes the trace smaller.
//!
//! Stages 2 and 3 repeat until neither changes anything. At that fixed point no single op can be
//! dropped, no argument simplified and no pair of sequences swapped without losing the
//! failure: the result is *minimal* with respect to those moves. Every candidate of stage 3 is
//! strictly smaller in [`op_size`] (summed over the trace), and stage 2 only shortens, so the
//! loop ends. A budget of target executions bounds it anyway;
//! a result that ran out of budget says so (`minimal: false`).
//!
//! The moves do not depend on the oracle: [`Predicate`] says whether a candidate still fails and
//! how. The observation oracles' predicate is a [`FailureMode`] judged by a [`Judge`]
//! ([`shrink`], [`shrink_tree`]); the theorem oracles of `kvaudit fuzz --oracles T1,T2,T3` pass
//! theirs ([`crate::engines::theorem_check::StillViolated`]) to [`shrink_by`] and [`shrink_tree_by`].

use std::time::{Duration, Instant};

use proptest::strategy::ValueTree;
use serde::{Deserialize, Serialize};

use crate::base::cache::HarnessError;
use crate::base::op::{Op, SeqId, Setup, Trace};
use crate::oracles::{OracleId, Violation};
use crate::running::judge::{Judge, RunJudgement, StepViolation};

mod simplify;

use simplify::trace_size;
pub use simplify::{op_size, simplifications, swap_seqs};

/// How a trace fails: the oracle, and the kind of violation. Shrinking keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FailureMode {
    /// Which oracle.
    pub oracle: OracleId,
    /// The kind of violation (e.g. `pos_max disagree with the cells`).
    pub kind: String,
}

impl FailureMode {
    /// The mode of a violation.
    pub fn of(v: &Violation) -> Self {
        FailureMode {
            oracle: v.oracle,
            kind: v.kind.clone(),
        }
    }

    /// The first violation of this oracle in `j`, if it is of this kind.
    pub fn find<'j>(&self, j: &'j RunJudgement) -> Option<&'j StepViolation> {
        j.first(self.oracle)
            .filter(|v| v.violation.kind == self.kind && v.step > 0)
    }
}

impl std::fmt::Display for FailureMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.oracle, self.kind)
    }
}

/// Limits of a shrink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShrinkConfig {
    /// Most candidates stage 1 (proptest's value-tree shrinking) may try.
    pub tree_iters: u32,
    /// Most target executions a whole shrink may spend.
    pub max_executions: u64,
}

impl Default for ShrinkConfig {
    fn default() -> Self {
        ShrinkConfig {
            tree_iters: 128,
            max_executions: 100_000,
        }
    }
}

/// A shrunk trace and what it took; `F` is what the predicate reports about the failure
/// ([`StepViolation`] for the observation oracles).
#[derive(Clone, Debug, PartialEq)]
pub struct ShrunkBy<F> {
    /// The shrunk trace; for the observation oracles its last op is where the failure shows.
    pub trace: Trace,
    /// The failure of the shrunk trace.
    pub failure: F,
    /// Target executions spent.
    pub executions: u64,
    /// Wall time spent.
    pub elapsed: Duration,
    /// True if the fixed point was reached: no single op can be dropped and no argument
    /// simplified. False if the budget ran out first.
    pub minimal: bool,
}

/// A trace shrunk while an observation oracle fails the same way.
pub type Shrunk = ShrunkBy<StepViolation>;

/// What a shrink preserves. The shrinker's moves (delta debugging, argument simplification,
/// sequence swaps, value-tree shrinking) are the same for every oracle; only "does this candidate
/// still fail, and how" differs, so the numerical oracles (`kvaudit fuzz --oracles T2`) reuse
/// them through this trait.
pub trait Predicate {
    /// What a failing candidate reports.
    type Failure: Clone;
    /// Runs `trace`; `Some((keep, failure))` if it still fails, where `keep` is how many ops
    /// the failure needs (the candidate is cut after them).
    fn test(&mut self, trace: &Trace) -> Result<Option<(usize, Self::Failure)>, HarnessError>;
    /// Target executions so far (the budget is counted in them).
    fn executions(&self) -> u64;
}

/// The observation oracles' predicate: the same [`FailureMode`] at any step, judged by a
/// [`Judge`]; the candidate is cut after the failing step.
struct ModeOf<'j> {
    judge: &'j mut Judge,
    mode: FailureMode,
}

impl Predicate for ModeOf<'_> {
    type Failure = StepViolation;

    fn test(&mut self, trace: &Trace) -> Result<Option<(usize, StepViolation)>, HarnessError> {
        let j = self.judge.run(trace)?;
        Ok(self.mode.find(&j).map(|v| (v.step, v.clone())))
    }

    fn executions(&self) -> u64 {
        self.judge.executions()
    }
}

/// The shape of a minimal trace, for telling findings apart: the mode and the op names.
pub fn shape(mode: &FailureMode, trace: &Trace) -> String {
    let names: Vec<&str> = trace.ops.iter().map(Op::name).collect();
    format!("{}|{}|{}", mode.oracle, mode.kind, names.join(","))
}

struct Shrinker<P: Predicate> {
    pred: P,
    setup: Setup,
    budget_end: u64,
    exhausted: bool,
    best: Vec<Op>,
    failure: P::Failure,
}

impl<P: Predicate> Shrinker<P> {
    /// Runs `ops`; if they fail the same way, keeps them (cut after the failing step) when they
    /// are no larger than the best so far.
    fn attempt(&mut self, ops: Vec<Op>) -> Result<bool, HarnessError> {
        if self.pred.executions() >= self.budget_end {
            self.exhausted = true;
            return Ok(false);
        }
        let mut trace = Trace {
            setup: self.setup.clone(),
            ops,
        };
        let Some((keep, failure)) = self.pred.test(&trace)? else {
            return Ok(false);
        };
        trace.ops.truncate(keep);
        if trace_size(&trace.ops) > trace_size(&self.best) {
            return Ok(false);
        }
        self.failure = failure;
        self.best = trace.ops;
        Ok(true)
    }

    /// Stage 2: delta debugging, chunks then single ops. True if anything was removed.
    fn remove_chunks(&mut self) -> Result<bool, HarnessError> {
        let mut changed = false;
        let mut n = 2usize;
        while !self.best.is_empty() && !self.exhausted {
            let len = self.best.len();
            n = n.min(len);
            let chunk = len.div_ceil(n);
            let mut removed = false;
            // Last chunk first: a runner that shares trace prefixes then reuses the most.
            for k in (0..n).rev() {
                let start = k * chunk;
                if start >= len {
                    continue;
                }
                let end = (start + chunk).min(len);
                let mut ops = self.best[..start].to_vec();
                ops.extend_from_slice(&self.best[end..]);
                if self.attempt(ops)? {
                    removed = true;
                    break;
                }
            }
            if removed {
                changed = true;
                n = n.saturating_sub(1).max(2);
                continue;
            }
            if n >= len {
                break;
            }
            n = (2 * n).min(len);
        }
        Ok(changed)
    }

    /// Stage 3: simplify each op's arguments, simplest candidate first. True if any changed.
    fn simplify_args(&mut self) -> Result<bool, HarnessError> {
        let n_seqs = self.setup.n_seq_max as SeqId;
        let mut changed = false;
        let mut i = 0;
        while i < self.best.len() && !self.exhausted {
            let mut progress = true;
            while progress && i < self.best.len() {
                progress = false;
                for candidate in simplifications(&self.best[i], n_seqs) {
                    let mut ops = self.best.clone();
                    ops[i] = candidate;
                    if self.attempt(ops)? {
                        changed = true;
                        progress = true;
                        break;
                    }
                }
            }
            i += 1;
        }
        Ok(changed)
    }

    /// Stage 3, across ops: swap two sequence ids everywhere in the ops when that makes the
    /// trace smaller (a decode into seq 2 and copies from 2 to 3 become seq 0 and 1, after which
    /// stage 2 can often drop the decode). True if any swap was kept.
    fn relabel_seqs(&mut self) -> Result<bool, HarnessError> {
        let n_seqs = self.setup.n_seq_max as SeqId;
        let mut changed = false;
        let mut progress = true;
        while progress && !self.exhausted {
            progress = false;
            'pairs: for hi in 1..n_seqs {
                for lo in 0..hi {
                    let ops: Vec<Op> = self.best.iter().map(|op| swap_seqs(op, lo, hi)).collect();
                    if trace_size(&ops) >= trace_size(&self.best) {
                        continue;
                    }
                    if self.attempt(ops)? {
                        changed = true;
                        progress = true;
                        break 'pairs;
                    }
                }
            }
        }
        Ok(changed)
    }

    fn fixed_point(&mut self) -> Result<(), HarnessError> {
        loop {
            let removed = self.remove_chunks()?;
            let simplified = self.simplify_args()?;
            let relabelled = self.relabel_seqs()?;
            if self.exhausted || !(removed || simplified || relabelled) {
                return Ok(());
            }
        }
    }
}

fn start<P: Predicate>(
    trace: &Trace,
    mut pred: P,
    cfg: &ShrinkConfig,
) -> Result<Option<Shrinker<P>>, HarnessError> {
    let budget_end = pred.executions().saturating_add(cfg.max_executions);
    let Some((keep, failure)) = pred.test(trace)? else {
        return Ok(None);
    };
    Ok(Some(Shrinker {
        pred,
        setup: trace.setup.clone(),
        budget_end,
        exhausted: false,
        best: trace.ops[..keep.min(trace.ops.len())].to_vec(),
        failure,
    }))
}

fn finish<P: Predicate>(
    s: Shrinker<P>,
    executions_before: u64,
    started: Instant,
) -> ShrunkBy<P::Failure> {
    ShrunkBy {
        executions: s.pred.executions() - executions_before,
        trace: Trace {
            setup: s.setup,
            ops: s.best,
        },
        failure: s.failure,
        elapsed: started.elapsed(),
        minimal: !s.exhausted,
    }
}

/// Shrinks `trace` while it fails as `mode` says (stages 2 and 3, to a fixed point). `None` if
/// the trace does not fail that way to begin with.
pub fn shrink(
    trace: &Trace,
    mode: &FailureMode,
    judge: &mut Judge,
    cfg: &ShrinkConfig,
) -> Result<Option<Shrunk>, HarnessError> {
    let pred = ModeOf {
        judge,
        mode: mode.clone(),
    };
    shrink_by(trace, pred, cfg)
}

/// Shrinks `trace` while `pred` says it fails (stages 2 and 3, to a fixed point). `None` if it
/// does not fail to begin with.
pub fn shrink_by<P: Predicate>(
    trace: &Trace,
    pred: P,
    cfg: &ShrinkConfig,
) -> Result<Option<ShrunkBy<P::Failure>>, HarnessError> {
    let (started, before) = (Instant::now(), pred.executions());
    let Some(mut s) = start(trace, pred, cfg)? else {
        return Ok(None);
    };
    s.fixed_point()?;
    Ok(Some(finish(s, before, started)))
}

/// Shrinks a generated trace: first through its proptest value tree (stage 1), then as
/// [`shrink`] does. `None` if the tree's current trace does not fail as `mode` says.
pub fn shrink_tree<T: ValueTree<Value = Trace>>(
    tree: &mut T,
    mode: &FailureMode,
    judge: &mut Judge,
    cfg: &ShrinkConfig,
) -> Result<Option<Shrunk>, HarnessError> {
    let pred = ModeOf {
        judge,
        mode: mode.clone(),
    };
    shrink_tree_by(tree, pred, cfg)
}

/// [`shrink_tree`] for any [`Predicate`].
pub fn shrink_tree_by<T: ValueTree<Value = Trace>, P: Predicate>(
    tree: &mut T,
    pred: P,
    cfg: &ShrinkConfig,
) -> Result<Option<ShrunkBy<P::Failure>>, HarnessError> {
    let (started, before) = (Instant::now(), pred.executions());
    let Some(mut s) = start(&tree.current(), pred, cfg)? else {
        return Ok(None);
    };
    // proptest's own loop (TestRunner::shrink): simplify while the case still fails,
    // complicate when it stops failing.
    let mut iters = 0;
    if tree.simplify() {
        while iters < cfg.tree_iters && !s.exhausted {
            iters += 1;
            let ops = tree.current().ops;
            let more = if s.attempt(ops)? {
                tree.simplify()
            } else {
                tree.complicate()
            };
            if !more {
                break;
            }
        }
    }
    s.fixed_point()?;
    Ok(Some(finish(s, before, started)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::Decode;
    use crate::running::judge::native_judge as judge;

    fn fuzz_setup() -> Setup {
        Setup {
            n_ctx: 256,
            n_seq_max: 4,
            ops: vec![Op::Decode(Decode::next(0, 7))],
            ..Setup::default()
        }
    }

    /// The seed's double copy and keep, buried in a longer trace with noise around it.
    fn noisy_refcount_trace() -> Trace {
        let ops = vec![
            Op::Decode(Decode::next(2, 3)),
            Op::SeqAdd {
                seq: 2,
                p0: -1,
                p1: -1,
                delta: 5,
            },
            Op::SeqCp {
                src: 0,
                dst: 3,
                p0: -1,
                p1: -1,
            },
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 1,
                p1: -1,
            },
            Op::Decode(Decode {
                seqs: vec![0, 3],
                n: 2,
                pos: None,
                tokens: None,
            }),
            Op::SeqDiv {
                seq: 2,
                p0: 0,
                p1: 9,
                d: 3,
            },
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: 5,
            },
            Op::SeqRm {
                seq: 3,
                p0: 4,
                p1: -1,
            },
            Op::Decode(Decode::next(2, 1)),
            Op::SeqKeep { seq: 0 },
            Op::Decode(Decode::next(1, 2)),
            Op::Clear,
        ];
        Trace {
            setup: fuzz_setup(),
            ops,
        }
    }

    #[test]
    fn a_known_trace_shrinks_to_the_three_op_core() {
        let mut j = judge(&["refcount"]);
        let trace = noisy_refcount_trace();
        let first = j.run(&trace).unwrap();
        let v = first
            .first(OracleId::I1)
            .expect("the noisy trace breaks I1");
        let mode = FailureMode::of(&v.violation);
        let s = shrink(&trace, &mode, &mut j, &ShrinkConfig::default())
            .unwrap()
            .expect("it fails that way");
        let names: Vec<&str> = s.trace.ops.iter().map(Op::name).collect();
        assert_eq!(names, ["seq_cp", "seq_cp", "seq_keep"], "{}", s.trace);
        assert!(s.minimal);
        assert_eq!(s.failure.step, 3);
        assert!(s.executions > 0);
        // Minimal: no single op can be dropped, no argument simplified.
        for i in 0..s.trace.ops.len() {
            let mut ops = s.trace.ops.clone();
            ops.remove(i);
            let t = Trace {
                ops,
                ..s.trace.clone()
            };
            assert!(
                mode.find(&j.run(&t).unwrap()).is_none(),
                "op {i} is droppable"
            );
            for c in simplifications(&s.trace.ops[i], 4) {
                let mut ops = s.trace.ops.clone();
                ops[i] = c.clone();
                let t = Trace {
                    ops,
                    ..s.trace.clone()
                };
                assert!(
                    mode.find(&j.run(&t).unwrap()).is_none(),
                    "{c} simplifies op {i}"
                );
            }
        }
        for hi in 1..4 {
            for lo in 0..hi {
                let ops: Vec<Op> = s.trace.ops.iter().map(|op| swap_seqs(op, lo, hi)).collect();
                if trace_size(&ops) < trace_size(&s.trace.ops) {
                    let t = Trace {
                        ops,
                        ..s.trace.clone()
                    };
                    assert!(mode.find(&j.run(&t).unwrap()).is_none(), "swap {lo} {hi}");
                }
            }
        }
    }

    #[test]
    fn a_trace_that_does_not_fail_that_way_is_not_shrunk() {
        let mut j = judge(&[]);
        let trace = noisy_refcount_trace();
        let mode = FailureMode {
            oracle: OracleId::I1,
            kind: "pos_min and pos_max stale on an empty sequence".into(),
        };
        assert!(shrink(&trace, &mode, &mut j, &ShrinkConfig::default())
            .unwrap()
            .is_none());
    }

    #[test]
    fn the_budget_is_kept_and_reported() {
        let mut j = judge(&["refcount"]);
        let trace = noisy_refcount_trace();
        let v = j.run(&trace).unwrap();
        let mode = FailureMode::of(&v.first(OracleId::I1).unwrap().violation);
        let cfg = ShrinkConfig {
            max_executions: 5,
            ..ShrinkConfig::default()
        };
        let s = shrink(&trace, &mode, &mut j, &cfg).unwrap().unwrap();
        assert!(!s.minimal);
        assert!(s.executions <= 6, "{}", s.executions);
    }

    #[test]
    fn simplifications_are_strictly_smaller() {
        let ops = [
            Op::SeqRm {
                seq: -1,
                p0: -1,
                p1: -1,
            },
            Op::SeqAdd {
                seq: 3,
                p0: 5,
                p1: 9,
                delta: -7,
            },
            Op::SeqDiv {
                seq: 1,
                p0: 2,
                p1: -1,
                d: 4,
            },
            Op::Decode(Decode {
                seqs: vec![3, 1],
                n: 4,
                pos: Some(9),
                tokens: Some(vec![1, 2, 3, 4]),
            }),
        ];
        for op in ops {
            let cs = simplifications(&op, 4);
            assert!(!cs.is_empty(), "{op}");
            for c in &cs {
                assert!(op_size(c) < op_size(&op), "{c} from {op}");
                assert_eq!(c.name(), op.name());
            }
        }
        assert!(simplifications(&Op::SeqKeep { seq: 0 }, 4).is_empty());
        assert!(simplifications(&Op::Clear, 4).is_empty());
    }
}
