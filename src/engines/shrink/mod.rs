//! Shrinking a failing trace to a minimal one that still fails the same way.
//!
//! "The same way" is a [`FailureMode`]: the same oracle with the same kind of violation. Every
//! candidate is run from a reset and judged on every step; a candidate that fails that way, at
//! any step, is accepted and cut after that step, so the violation is always at the last step of
//! the shrunk trace. The setup's settings (context size, memory type, layout) are never changed:
//! they are the cache the failure is in. The setup's ops are shrunk with the rest.
//!
//! Stages, in order:
//! 1. proptest's own shrinking of the generator's value tree, when the trace came from one
//!    ([`shrink_tree`]);
//! 2. delta debugging over the op list: remove chunks of half, a quarter, ... and finally single
//!    ops; then each of the setup's ops alone;
//! 3. simplification of arguments, the setup's ops included: each integer argument bisected down
//!    (a decode's tokens and position, range ends, damaged-load offsets), then each op's
//!    arguments one move at a time ([`simplifications`]: smaller sequence ids, positions,
//!    deltas, divisors and offsets, one less than each, open range ends made closed, decodes
//!    into fewer sequences at "next" positions); and, across ops, every explicit position moved
//!    down together ([`shift_positions`]) and the sequence ids renumbered in order of first use
//!    (else two swapped everywhere where that is smaller).
//!
//! Stages 2 and 3 repeat, pass after pass, until a whole round changes nothing (the fixed-point
//! loop of proptest, Hypothesis and C-Reduce). At that fixed point no op (the setup's included)
//! can be dropped, no decode shortened by a token, no argument simplified, no position shift or
//! renumbering kept without losing the failure: the result is *minimal* with respect to those
//! moves, and shrinking it again gives it back. Every move is strictly smaller in one order
//! (fewer ops, then smaller arguments, then sequence ids in order of appearance: `trace_rank`),
//! so the loop ends. A budget of target executions bounds it anyway; a result that ran out of
//! budget says so (`minimal: false`).
//!
//! The moves do not depend on the oracle: [`Predicate`] says whether a candidate still fails and
//! how. The observation oracles' predicate is a [`FailureMode`] judged by a [`Judge`]
//! ([`shrink`], [`shrink_tree`]); the theorem oracles of `kvaudit fuzz --oracles T1,T2,T3` pass
//! theirs ([`crate::engines::theorem_check::StillViolated`]) to [`shrink_by`] and [`shrink_tree_by`].

use std::collections::HashSet;
use std::time::{Duration, Instant};

use proptest::strategy::ValueTree;
use serde::{Deserialize, Serialize};

use crate::base::cache::HarnessError;
use crate::base::op::{Op, SeqId, Trace};
use crate::oracles::{OracleId, Violation};
use crate::running::judge::{Judge, RunJudgement, StepViolation};

mod simplify;

use simplify::{lowest_position, numbers, trace_rank, with_number, Number};
pub use simplify::{map_seqs, op_size, shift_positions, simplifications, swap_seqs};

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

/// Where an op of a candidate is: among its setup's ops, or among its ops under test.
#[derive(Clone, Copy, Debug)]
enum Place {
    Setup(usize),
    Ops(usize),
}

/// Every place of `trace`, the setup's ops first.
fn places(trace: &Trace) -> Vec<Place> {
    (0..trace.setup.ops.len())
        .map(Place::Setup)
        .chain((0..trace.ops.len()).map(Place::Ops))
        .collect()
}

fn op_at(trace: &Trace, place: Place) -> Option<&Op> {
    match place {
        Place::Setup(i) => trace.setup.ops.get(i),
        Place::Ops(i) => trace.ops.get(i),
    }
}

/// `trace` with the op at `place` replaced by `op`.
fn with_op(trace: &Trace, place: Place, op: Op) -> Trace {
    let mut t = trace.clone();
    match place {
        Place::Setup(i) => t.setup.ops[i] = op,
        Place::Ops(i) => t.ops[i] = op,
    }
    t
}

/// `trace` with `f` applied to each of its ops: the setup's, a foreign dump's and the ops under
/// test. `None` if `f` refuses one.
fn map_ops(trace: &Trace, mut f: impl FnMut(&Op) -> Option<Op>) -> Option<Trace> {
    let mut t = trace.clone();
    let ops = t.setup.ops.iter_mut().chain(
        t.setup
            .foreign
            .iter_mut()
            .flat_map(|d| d.ops.iter_mut())
            .chain(t.ops.iter_mut()),
    );
    for op in ops {
        *op = f(op)?;
    }
    Some(t)
}

/// `trace` with its sequence ids mapped by `f` everywhere: ops, and the sequence a foreign dump
/// saves.
fn map_trace_seqs(trace: &Trace, f: impl Fn(SeqId) -> SeqId) -> Trace {
    let mut t = map_ops(trace, |op| Some(map_seqs(op, &f))).expect("a renaming refuses no op");
    for d in &mut t.setup.foreign {
        d.seq = d.seq.map(&f);
    }
    t
}

/// The ids of the context's sequences (0 to `n_seqs - 1`) that `trace` names, in order of first
/// use (the setup's ops first); -1 and ids past the context's are left out, since renaming them
/// would change what they mean.
fn first_use(trace: &Trace, n_seqs: SeqId) -> Vec<SeqId> {
    let mut order = Vec::new();
    for op in trace.setup.ops.iter().chain(&trace.ops) {
        op.for_each_seq(|s| {
            if s < n_seqs && !order.contains(&s) {
                order.push(s);
            }
        });
    }
    order
}

struct Shrinker<P: Predicate> {
    pred: P,
    budget_end: u64,
    exhausted: bool,
    best: Trace,
    failure: P::Failure,
    /// Arguments of ops that a bisection has already brought to where it stops: searched again,
    /// each would only spend its steps to find the same value.
    searched: HashSet<(Op, Number)>,
}

impl<P: Predicate> Shrinker<P> {
    fn n_seqs(&self) -> SeqId {
        self.best.setup.n_seq_max as SeqId
    }

    /// Runs `candidate`; if it fails the same way, keeps it (cut after the failing step) when it
    /// is no larger than the best so far.
    fn attempt(&mut self, mut candidate: Trace) -> Result<bool, HarnessError> {
        if self.pred.executions() >= self.budget_end {
            self.exhausted = true;
            return Ok(false);
        }
        let Some((keep, failure)) = self.pred.test(&candidate)? else {
            return Ok(false);
        };
        candidate.ops.truncate(keep);
        if trace_rank(&candidate) > trace_rank(&self.best) {
            return Ok(false);
        }
        self.failure = failure;
        self.best = candidate;
        Ok(true)
    }

    /// [`Self::attempt`] for a move of stages 2 and 3: a candidate no smaller than the best is
    /// not run, so every kept move makes progress and the fixed-point loop ends.
    fn attempt_smaller(&mut self, candidate: Trace) -> Result<bool, HarnessError> {
        if self.exhausted || trace_rank(&candidate) >= trace_rank(&self.best) {
            return Ok(false);
        }
        self.attempt(candidate)
    }

    fn with_ops(&self, ops: Vec<Op>) -> Trace {
        Trace {
            setup: self.best.setup.clone(),
            ops,
        }
    }

    /// Stage 2: delta debugging, chunks then single ops. True if anything was removed.
    fn remove_chunks(&mut self) -> Result<bool, HarnessError> {
        let mut changed = false;
        let mut n = 2usize;
        while !self.best.ops.is_empty() && !self.exhausted {
            let len = self.best.ops.len();
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
                let mut ops = self.best.ops[..start].to_vec();
                ops.extend_from_slice(&self.best.ops[end..]);
                if self.attempt_smaller(self.with_ops(ops))? {
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

    /// Stage 2 on the setup: each of its ops removed alone, the last first (a setup holds a
    /// few ops, each a decode that may cost more than the whole trace after it). True if any was.
    fn remove_setup_ops(&mut self) -> Result<bool, HarnessError> {
        let mut changed = false;
        for i in (0..self.best.setup.ops.len()).rev() {
            let mut candidate = self.best.clone();
            candidate.setup.ops.remove(i);
            changed |= self.attempt_smaller(candidate)?;
        }
        Ok(changed)
    }

    /// Stage 3 for integer arguments (a decode's tokens and position, a range's ends, a damaged
    /// load's offsets), the setup's included: the least value that still fails, by bisection
    /// between the argument's floor and its value (as if failing were monotone in it; the
    /// one-less candidate of [`simplifications`] then checks the end point). A setup's
    /// 250-token decode costs 8 runs here, not 250, and a range end at 264 not a crawl down
    /// from it. True if any argument went down.
    fn bisect_numbers(&mut self) -> Result<bool, HarnessError> {
        let mut changed = false;
        for place in places(&self.best) {
            let Some(op) = op_at(&self.best, place).cloned() else {
                continue;
            };
            for (which, value, least) in numbers(&op) {
                let Some(op) = op_at(&self.best, place).cloned() else {
                    break;
                };
                if value - least < 3 || self.searched.contains(&(op.clone(), which)) {
                    continue;
                }
                let (mut holds, mut fails) = (least - 1, value);
                while fails - holds > 1 && !self.exhausted {
                    let v = holds + (fails - holds) / 2;
                    if self.attempt_smaller(with_op(
                        &self.best,
                        place,
                        with_number(&op, which, v),
                    ))? {
                        (fails, changed) = (v, true);
                    } else {
                        holds = v;
                    }
                    if op_at(&self.best, place).is_none() {
                        break;
                    }
                }
                if let Some(op) = op_at(&self.best, place) {
                    self.searched.insert((op.clone(), which));
                }
            }
        }
        Ok(changed)
    }

    /// Stage 3: simplify each op's arguments, the setup's included, simplest candidate first.
    /// True if any changed.
    fn simplify_args(&mut self) -> Result<bool, HarnessError> {
        let n_seqs = self.n_seqs();
        let mut changed = false;
        let mut k = 0;
        while let Some(&place) = places(&self.best).get(k) {
            let mut progress = true;
            while progress && !self.exhausted {
                progress = false;
                let Some(op) = op_at(&self.best, place).cloned() else {
                    break;
                };
                for candidate in simplifications(&op, n_seqs) {
                    if self.attempt_smaller(with_op(&self.best, place, candidate))? {
                        changed = true;
                        progress = true;
                        break;
                    }
                }
            }
            k += 1;
        }
        Ok(changed)
    }

    /// Stage 3, across ops: every explicit position moved down together (by the lowest one,
    /// half of it, or one), the lowest first; what a trace does at positions 40 to 48 it often
    /// does at 0 to 8, where a reader follows it more easily. True if any shift was kept.
    fn shift_positions(&mut self) -> Result<bool, HarnessError> {
        let mut changed = false;
        loop {
            let all = self.best.setup.ops.iter().chain(&self.best.ops);
            let Some(lowest) = all.filter_map(lowest_position).min().filter(|p| *p > 0) else {
                break;
            };
            let mut shifts = vec![lowest, lowest / 2, 1];
            shifts.dedup();
            let mut progress = false;
            for by in shifts.into_iter().filter(|by| *by > 0) {
                let Some(shifted) = map_ops(&self.best, |op| shift_positions(op, by)) else {
                    continue;
                };
                if self.attempt_smaller(shifted)? {
                    progress = true;
                    break;
                }
            }
            changed |= progress;
            if !progress || self.exhausted {
                break;
            }
        }
        Ok(changed)
    }

    /// Stage 3, across ops: the sequence ids renumbered in order of first use (the setup's ops
    /// first), else two ids swapped everywhere when that makes the trace smaller (a decode into
    /// seq 2 and copies from 2 to 3 become seq 0 and 1, after which stage 2 can often drop the
    /// decode). True if any renaming was kept.
    fn relabel_seqs(&mut self) -> Result<bool, HarnessError> {
        let n_seqs = self.n_seqs();
        let order = first_use(&self.best, n_seqs);
        let renumbered = map_trace_seqs(&self.best, |s| {
            order.iter().position(|&x| x == s).map_or(s, |i| i as SeqId)
        });
        let mut changed = self.attempt_smaller(renumbered)?;
        let mut progress = true;
        while progress && !self.exhausted {
            progress = false;
            'pairs: for hi in 1..n_seqs {
                for lo in 0..hi {
                    let swapped = map_trace_seqs(&self.best, |s| match s {
                        s if s == lo => hi,
                        s if s == hi => lo,
                        s => s,
                    });
                    if self.attempt_smaller(swapped)? {
                        changed = true;
                        progress = true;
                        break 'pairs;
                    }
                }
            }
        }
        Ok(changed)
    }

    /// Every pass in turn, again and again until a whole round changes nothing (or the budget
    /// runs out): the fixed point is a local minimum under every move at once.
    fn fixed_point(&mut self) -> Result<(), HarnessError> {
        loop {
            let removed = self.remove_chunks()?;
            let setup_removed = self.remove_setup_ops()?;
            let bisected = self.bisect_numbers()?;
            let simplified = self.simplify_args()?;
            let shifted = self.shift_positions()?;
            let relabelled = self.relabel_seqs()?;
            let progress =
                removed || setup_removed || bisected || simplified || shifted || relabelled;
            if self.exhausted || !progress {
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
    let mut best = trace.clone();
    best.ops.truncate(keep);
    Ok(Some(Shrinker {
        pred,
        budget_end,
        exhausted: false,
        best,
        failure,
        searched: HashSet::new(),
    }))
}

fn finish<P: Predicate>(
    s: Shrinker<P>,
    executions_before: u64,
    started: Instant,
) -> ShrunkBy<P::Failure> {
    ShrunkBy {
        executions: s.pred.executions() - executions_before,
        trace: s.best,
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
            let more = if s.attempt(tree.current())? {
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
mod tests;
