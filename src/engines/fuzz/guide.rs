//! The guided generator's queue and mutations, after AFL++ and libFuzzer.
//!
//! The queue ([`Queue`]) keeps the traces that reached new coverage ([`super::coverage`]: the
//! edges of a `+cov` build's memory code, abstract transitions and shapes elsewhere) and the
//! shrunk trace of each new finding (its feature is the finding's signature: the first finding of
//! a kind is where the next ones are, as AFL++'s crash exploration and Hypothesis's kept failures
//! have it). Per feature the smallest entry that reaches it is *favoured* (AFL's `top_rated`),
//! and a favoured entry's *energy* is the rarity of its rarest feature (one over the cases that
//! reached it; AFL++'s `fast` schedule), lowered as it is picked, so mutations go where few cases
//! have been.
//!
//! Most cases are a picked entry put through a stack of structure-aware mutations of its op
//! list ([`Mutation`]): splice two entries, insert an op or a fork chunk drawn from the
//! generator, drop a run of ops, cut the tail, change an op's arguments (a fresh draw of the same
//! kind), replace an op by one of another kind on the same sequence, move an argument to a
//! boundary (an open range, a position the trace itself names or one off it, the last sequence
//! id, the largest delta or divisor), or repeat an op at once or later (a second `seq_cp` of the
//! same pair, onto cells the two sequences already share, is how the seed's I1 bug starts).
//!
//! Every new op comes from the random generator's strategies ([`super::generate`]) or keeps to
//! their bounds, so a mutated trace stays in the generator's domain. Every choice is drawn from
//! the case's own guide stream ([`guide_runner`]), and the queue grows only with what the
//! (deterministic) targets showed, so a guided run is a function of the seed, the case count and
//! the starting queue.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::base::op::{Op, OpKind, Pos, SeqId, Trace};
use crate::records::fuzz::GenConfig;

use super::generate::{chunk_strategy, kind_strategy, op_strategy, stream_runner};

/// The proptest runner the guided generator's choices for case `case` of seed `seed` come from:
/// a stream apart from [`super::case_runner`]'s, so that a case drawn afresh in a guided run is
/// the random generator's case of the same number.
pub fn guide_runner(seed: u64, case: u64) -> TestRunner {
    stream_runner(b"kvaudit-guide-v1", seed, case)
}

/// One case in `FRESH_ONE_IN` is drawn afresh rather than mutated: the queue's entries all
/// descend from draws, and fresh ones bring in new material (and keep the guided generator's
/// first cases the random generator's). One in four fell further behind the random generator
/// over the first thousands of cases with the queue before favoured entries (`cargo bench
/// --bench fuzz`).
pub const FRESH_ONE_IN: u64 = 2;

/// The first `WARMUP_CASES` cases of a run are drawn afresh, whatever the queue holds (AFL++ runs
/// its seeds before it mutates them; here the random generator's first cases are the seeds):
/// a guided run's first findings are the random generator's wherever those come that early.
pub const WARMUP_CASES: u64 = 8;

/// One pick in `ANY_ENTRY_ONE_IN` is any entry, favoured or not (AFL++ still fuzzes the
/// unfavoured ones, at a low rate).
const ANY_ENTRY_ONE_IN: usize = 8;

/// One pick in `FINDING_ONE_IN`, once the run has findings, is among the findings' entries
/// (AFL++'s crash exploration: the failures next to a known one, another op or range on the
/// state it needs, are what a run that already has the easy one is after). Their features are
/// reached by few cases, but there are few of them among hundreds of coverage entries.
const FINDING_ONE_IN: usize = 4;

/// Three in four children of a finding's entry are its neighbours ([`Mutator::neighbour`]), the
/// rest havoc like any entry's: the failures next to a known one are most often the same defect
/// reached by another op over the same cells, which stacked havoc anywhere in the trace (then a
/// fresh tail) seldom leaves in place.
const NEIGHBOUR_ONE_IN: usize = 4;

/// The kinds of op over a range of cells of a sequence, what a neighbour's last op is.
const RANGED: [OpKind; 4] = [OpKind::SeqRm, OpKind::SeqCp, OpKind::SeqAdd, OpKind::SeqDiv];

/// One neighbour in `SIBLING_ONE_IN`, where the failing op has a sibling ([`sibling`]), ends in
/// the sibling rather than in any of the [`RANGED`] kinds: the same effect on the same cells
/// through another function of llama.h, the likeliest other way to the same defect.
const SIBLING_ONE_IN: usize = 2;

/// A finding's entry is *new* until it has been picked `NEW_FINDING_PICKS` times; while one is,
/// one pick in `NEW_FINDING_ONE_IN` goes to the new ones (a finding's feature is rare when it is
/// new, the rare-edge energy of AFL++'s `fast` schedule and FairFuzz taken to the finding's
/// neighbours). Afterwards the findings' entries get the picks [`FINDING_ONE_IN`] gives them.
const NEW_FINDING_PICKS: u32 = 16;
const NEW_FINDING_ONE_IN: usize = 2;

/// The ranged kind with the same effect on cells as `kind`, another llama.h function for it:
/// `seq_add` and `seq_div` both move the positions of a range (llama.h: "adds relative position
/// delta", "integer division of the positions"; both leave a pending shift,
/// llama-kv-cells.h `pos_add`/`pos_div`), `seq_keep` and `seq_rm` both take a sequence off cells
/// (all but one sequence's, or one sequence's over a range). None for a copy and for ops without
/// cells to act on.
fn sibling(kind: OpKind) -> Option<OpKind> {
    match kind {
        OpKind::SeqAdd => Some(OpKind::SeqDiv),
        OpKind::SeqDiv => Some(OpKind::SeqAdd),
        OpKind::SeqKeep => Some(OpKind::SeqRm),
        OpKind::SeqRm
        | OpKind::SeqCp
        | OpKind::Clear
        | OpKind::Decode
        | OpKind::StateSeqSave
        | OpKind::StateSeqLoad
        | OpKind::StateSave
        | OpKind::StateLoad => None,
    }
}

/// Where a finding's entry failed: the step (1-based, into the finding's trace) of its failing op
/// and the sequence its violation names. A finding's entries keep it ([`Queue::push_finding`]) for
/// [`Mutator::neighbour`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FindingSite {
    /// The failing step.
    pub step: usize,
    /// The sequence the violation is about, where it names one.
    pub seq: Option<SeqId>,
    /// The failing op's kind (a finding's prefix entry ends before it).
    pub op: OpKind,
}

/// A uniform draw from `0..n` (`n > 0`).
fn below(runner: &mut TestRunner, n: usize) -> usize {
    (runner.rng().next_u64() % n as u64) as usize
}

/// A feature of a run: what the coverage signal says it reached, one `u64` per edge, transition
/// or shape ([`super::Coverage::add`]), or a finding's signature ([`finding_feature`]).
pub type Feature = u64;

/// The feature of a finding's signature (oracle, target, kind, op at the failing step).
pub fn finding_feature(signature: &impl std::hash::Hash) -> Feature {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    "finding".hash(&mut h);
    signature.hash(&mut h);
    h.finish()
}

/// The guided generator's queue: its entries, which of them is the smallest for each feature,
/// and how many cases reached each feature.
#[derive(Clone, Debug, Default)]
pub struct Queue {
    entries: Vec<Trace>,
    /// Times each entry was picked as a parent.
    picked: Vec<u32>,
    /// Per entry, where its finding failed if it came from one ([`Queue::push_finding`]): not
    /// persisted.
    of_finding: Vec<Option<FindingSite>>,
    /// Per feature, the smallest entry (fewest ops; the first of those) that reaches it.
    top: BTreeMap<Feature, usize>,
    /// Per feature, the cases that reached it.
    hits: HashMap<Feature, u64>,
}

impl Queue {
    /// A queue of `corpus` (`--corpus`), whose features are not known until each has run
    /// ([`Queue::rate`]).
    pub fn new(corpus: Vec<Trace>) -> Self {
        Queue {
            picked: vec![0; corpus.len()],
            of_finding: vec![None; corpus.len()],
            entries: corpus,
            ..Queue::default()
        }
    }

    /// The entries, in the order they joined.
    pub fn entries(&self) -> &[Trace] {
        &self.entries
    }

    /// The entries that joined for their coverage (the loaded ones first), for `--corpus` to
    /// persist: replaying them reaches the run's coverage exactly, as no finding's entry was run.
    pub fn into_kept(self) -> Vec<Trace> {
        self.entries
            .into_iter()
            .zip(self.of_finding)
            .filter(|(_, f)| f.is_none())
            .map(|(t, _)| t)
            .collect()
    }

    /// How many entries [`Queue::into_kept`] gives.
    pub fn kept(&self) -> usize {
        self.of_finding.iter().filter(|f| f.is_none()).count()
    }

    /// Counts a case that reached `features` (every case of a guided run: the rarity the
    /// energies are made of).
    pub fn observe(&mut self, features: &[Feature]) {
        for &f in features {
            *self.hits.entry(f).or_default() += 1;
        }
    }

    /// Adds `trace`, which reaches `features`.
    pub fn push(&mut self, trace: Trace, features: &[Feature]) {
        self.entries.push(trace);
        self.picked.push(0);
        self.of_finding.push(None);
        self.rate(self.entries.len() - 1, features);
    }

    /// Adds a finding's trace (or the prefix of it before its failing op), with the finding's
    /// feature and where it failed: mutated like the others and into its neighbours, not
    /// persisted (AFL keeps crashes apart from its queue).
    pub fn push_finding(&mut self, trace: Trace, feature: Feature, site: FindingSite) {
        self.push(trace, &[feature]);
        *self.of_finding.last_mut().expect("just pushed") = Some(site);
    }

    /// Where entry `i`'s finding failed, if it came from one.
    pub fn site(&self, i: usize) -> Option<FindingSite> {
        self.of_finding[i]
    }

    /// Records that entry `i` reaches `features`: it becomes the favoured entry of each one it is
    /// smaller for.
    pub fn rate(&mut self, i: usize, features: &[Feature]) {
        let len = self.entries[i].ops.len();
        for &f in features {
            let top = self.top.entry(f).or_insert(i);
            if self.entries[*top].ops.len() > len {
                *top = i;
            }
        }
    }

    /// The favoured entries (the smallest for at least one feature), each with its energy: the
    /// rarity of its rarest feature, over the square root of one more than the times it was
    /// picked. In entry order.
    pub fn favoured(&self) -> Vec<(usize, f64)> {
        let mut rarity: BTreeMap<usize, f64> = BTreeMap::new();
        for (f, &i) in &self.top {
            let r = 1.0 / self.hits.get(f).copied().unwrap_or(1).max(1) as f64;
            let e = rarity.entry(i).or_insert(0.0);
            *e = e.max(r);
        }
        rarity
            .into_iter()
            .map(|(i, r)| (i, r / f64::from(1 + self.picked[i]).sqrt()))
            .collect()
    }

    /// A parent for the next child (the queue is not empty): one time in
    /// [`NEW_FINDING_ONE_IN`], while a finding's entry is new, one of the new ones; else one
    /// time in [`ANY_ENTRY_ONE_IN`] any entry, else a favoured one (one time in
    /// [`FINDING_ONE_IN`] a finding's) drawn in proportion to its energy.
    pub fn pick(&mut self, runner: &mut TestRunner) -> usize {
        let n = self.entries.len();
        // Counted, then the k-th taken: no list built per pick (the draws are those of a list).
        let is_new =
            |i: &usize| self.of_finding[*i].is_some() && self.picked[*i] < NEW_FINDING_PICKS;
        let n_new = (0..n).filter(is_new).count();
        if n_new > 0 && below(runner, NEW_FINDING_ONE_IN) == 0 {
            let k = below(runner, n_new);
            let i = (0..n).filter(is_new).nth(k).expect("k < n_new");
            self.picked[i] += 1;
            return i;
        }
        let mut favoured = self.favoured();
        if self.of_finding.iter().any(Option::is_some) && below(runner, FINDING_ONE_IN) == 0 {
            favoured.retain(|&(i, _)| self.of_finding[i].is_some());
        }
        let i = if favoured.is_empty() || below(runner, ANY_ENTRY_ONE_IN) == 0 {
            below(runner, n)
        } else {
            let total: f64 = favoured.iter().map(|(_, e)| e).sum();
            let mut at = total * (runner.rng().next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            favoured
                .iter()
                .find(|(_, e)| {
                    at -= e;
                    at < 0.0
                })
                .unwrap_or(&favoured[favoured.len() - 1])
                .0
        };
        self.picked[i] += 1;
        i
    }
}

/// The havoc mutations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The head of the entry, then the tail of another one.
    Splice,
    /// An op or a fork chunk drawn from the generator, at any place.
    Insert,
    /// One to four consecutive ops removed.
    Drop,
    /// The ops after a place removed (what the state at the end is matters to the oracles that
    /// judge a trace's last state: a pending shift, a save after the last op).
    Truncate,
    /// An op replaced by a fresh draw of the same kind (other arguments).
    Change,
    /// An op replaced by a fresh draw of any kind, on the sequence the old one named first and
    /// over its range where both have one (`seq_add` of a range that breaks an invariant, then
    /// `seq_rm` of the same range).
    Retype,
    /// An argument of an op moved to a boundary: an open range end, a position the trace names
    /// (or one off it), the last sequence id, the largest delta or divisor, one token or the most.
    Boundary,
    /// A copy of an op inserted at once after it (one time in two) or later in the trace.
    Repeat,
}

/// Every mutation, in the order [`Mutator::child`] draws from.
pub const MUTATIONS: [Mutation; 8] = [
    Mutation::Splice,
    Mutation::Insert,
    Mutation::Drop,
    Mutation::Truncate,
    Mutation::Change,
    Mutation::Retype,
    Mutation::Boundary,
    Mutation::Repeat,
];

/// The first sequence `op` names, if any.
fn first_seq(op: &Op) -> Option<SeqId> {
    let mut first = None;
    op.for_each_seq(|s| {
        first.get_or_insert(s);
    });
    first
}

/// The range an op names, if any.
fn range_of(op: &Op) -> Option<(Pos, Pos)> {
    let mut op = op.clone();
    range_mut(&mut op).map(|(p0, p1)| (*p0, *p1))
}

/// The ends of the range an op names, if any.
fn range_mut(op: &mut Op) -> Option<(&mut Pos, &mut Pos)> {
    match op {
        Op::SeqRm { p0, p1, .. }
        | Op::SeqCp { p0, p1, .. }
        | Op::SeqAdd { p0, p1, .. }
        | Op::SeqDiv { p0, p1, .. } => Some((p0, p1)),
        Op::SeqKeep { .. }
        | Op::Clear
        | Op::Decode(_)
        | Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => None,
    }
}

/// `op` moved onto sequence `seq` (its first named one; a copy keeps distinct ends).
fn retarget(op: &mut Op, seq: SeqId, n_seqs: SeqId) {
    match op {
        Op::SeqRm { seq: s, .. }
        | Op::SeqKeep { seq: s }
        | Op::SeqAdd { seq: s, .. }
        | Op::SeqDiv { seq: s, .. }
        | Op::StateSeqSave { seq: s, .. }
        | Op::StateSeqLoad { seq: s, .. } => *s = seq,
        Op::SeqCp { src, dst, .. } => {
            *src = seq;
            if *dst == seq {
                *dst = (seq + 1) % n_seqs;
            }
        }
        Op::Decode(d) => {
            if !d.seqs.contains(&seq) {
                d.seqs[0] = seq;
            }
        }
        Op::Clear | Op::StateSave { .. } | Op::StateLoad { .. } => {}
    }
}

/// The positions a trace names: its ranges' ends and explicit decode positions, the setup's
/// next position, each of them and one off it, and 0 and 1: a trace-local dictionary of the
/// places where cells begin and end.
fn position_dictionary(trace_setup_len: Pos, ops: &[Op], cap: Pos) -> Vec<Pos> {
    let mut named: BTreeSet<Pos> = [0, 1, trace_setup_len].into_iter().collect();
    for op in ops {
        match op {
            Op::SeqRm { p0, p1, .. }
            | Op::SeqCp { p0, p1, .. }
            | Op::SeqAdd { p0, p1, .. }
            | Op::SeqDiv { p0, p1, .. } => {
                named.extend([*p0, *p1]);
            }
            Op::Decode(d) => named.extend(d.pos),
            Op::SeqKeep { .. }
            | Op::Clear
            | Op::StateSeqSave { .. }
            | Op::StateSeqLoad { .. }
            | Op::StateSave { .. }
            | Op::StateLoad { .. } => {}
        }
    }
    let mut dict: BTreeSet<Pos> = BTreeSet::new();
    for p in named.into_iter().filter(|&p| p >= 0) {
        dict.extend(
            [p - 1, p, p + 1]
                .into_iter()
                .filter(|q| (0..=cap).contains(q)),
        );
    }
    dict.into_iter().collect()
}

/// Mutates queue entries within a generator's domain.
pub struct Mutator {
    gen: GenConfig,
    op: BoxedStrategy<Op>,
    chunk: BoxedStrategy<Vec<Op>>,
    /// A fresh trace's ops (at least `min_len` of them), what a short child is continued with.
    tail: BoxedStrategy<Vec<Op>>,
    /// The generator's ops of each of the [`RANGED`] kinds, what a neighbour ends with.
    ranged: Vec<BoxedStrategy<Op>>,
}

impl Mutator {
    /// A mutator drawing its new ops as `g`'s generator does.
    pub fn new(g: &GenConfig) -> Self {
        Mutator {
            gen: g.clone(),
            op: op_strategy(g),
            chunk: chunk_strategy(g),
            tail: proptest::collection::vec(chunk_strategy(g), g.min_len..=g.max_len)
                .prop_map(|chunks| chunks.into_iter().flatten().collect())
                .boxed(),
            ranged: RANGED.iter().map(|&k| kind_strategy(k, g)).collect(),
        }
    }

    /// Whether `op`'s range may be made partial: not a `seq_cp` with one stream per sequence,
    /// where llama.cpp copies whole sequences only (a partial copy is a known abort, as
    /// `generate::copy_range` has it), nor any `seq_cp` under `whole_copies`.
    fn partial_range_allowed(&self, op: &Op) -> bool {
        op.kind() != OpKind::SeqCp || (self.gen.setup.kv_unified && !self.gen.whole_copies)
    }

    /// The next position of the setup's sequence (the tokens its decodes put there).
    fn setup_len(&self) -> Pos {
        self.gen
            .setup
            .ops
            .iter()
            .filter_map(Op::as_decode)
            .map(|d| d.n as Pos)
            .sum()
    }

    fn draw_op(&self, runner: &mut TestRunner) -> Op {
        self.op
            .new_tree(runner)
            .expect("the generator rejects nothing")
            .current()
    }

    /// Case `case` of a guided run of seed `seed`: a child of a queue entry, or `None` (the
    /// first [`WARMUP_CASES`], an empty queue, and one case in [`FRESH_ONE_IN`]): the random
    /// generator's case.
    pub fn next_case(&self, queue: &mut Queue, seed: u64, case: u64) -> Option<Trace> {
        let mut runner = guide_runner(seed, case);
        if case < WARMUP_CASES
            || queue.entries().is_empty()
            || below(&mut runner, FRESH_ONE_IN as usize) == 0
        {
            return None;
        }
        let parent = queue.pick(&mut runner);
        if let Some(site) = queue.site(parent) {
            if below(&mut runner, NEIGHBOUR_ONE_IN) != 0 {
                return Some(self.neighbour(&queue.entries()[parent], site, &mut runner));
            }
        }
        Some(self.child(queue.entries(), parent, &mut runner))
    }

    /// A child of entry `parent` of `queue`: 1, 2, 4, 8 or 16 stacked mutations (AFL's havoc
    /// stacks; fewer gave less coverage per case in the benchmark), up to about half the
    /// entry's length (16 mutations of a three-op finding leave nothing of it); then a child shorter than
    /// the generator's shortest trace is, three times in four, continued by a fresh trace's ops.
    /// An entry is a prefix that reaches some state (the one before a finding's failing op, a
    /// new edge); the ops after it explore from there, where a trace of a few ops would judge
    /// little (the seed's I1 bug needs a doubly copied cell, then one of several removals).
    pub fn child(&self, queue: &[Trace], parent: usize, runner: &mut TestRunner) -> Trace {
        let mut ops = queue[parent].ops.clone();
        let most = (usize::BITS - ops.len().leading_zeros()).clamp(1, 5) as usize;
        for _ in 0..1u32 << below(runner, most) {
            let m = MUTATIONS[below(runner, MUTATIONS.len())];
            self.apply(m, &mut ops, queue, runner);
        }
        self.continue_short(&mut ops, runner);
        if ops.is_empty() {
            ops.push(self.draw_op(runner));
        }
        Trace {
            setup: queue[parent].setup.clone(),
            ops,
        }
    }

    /// `ops`, if shorter than the generator's shortest trace, continued three times in four by a
    /// fresh trace's ops (then cut to the longest): the ops after an entry explore from the
    /// state it reaches. The tail's ranges, one in four, start or end where the entry's cells
    /// do (the entry's own positions): a removal of part of what the entry built.
    fn continue_short(&self, ops: &mut Vec<Op>, runner: &mut TestRunner) {
        if ops.len() < self.gen.min_len && below(runner, 4) != 0 {
            let dict = position_dictionary(self.setup_len(), ops, self.gen.pos_cap);
            let mut tail = self
                .tail
                .new_tree(runner)
                .expect("the generator rejects nothing")
                .current();
            for op in &mut tail {
                if below(runner, 4) == 0 && self.partial_range_allowed(op) {
                    if let Some((p0, p1)) = range_mut(op) {
                        let end = if below(runner, 2) == 0 { p0 } else { p1 };
                        *end = dict[below(runner, dict.len())];
                    }
                }
            }
            ops.extend(tail);
        }
        ops.truncate(self.gen.max_len);
    }

    /// A neighbour of a finding's entry (AFL++'s crash exploration, in the terms of the memory
    /// API): the ops before the failing step, three times in four with one of their ranges
    /// widened ([`Mutator::widen`]), then in place of the failing op an op over a range of cells:
    /// one time in [`SIBLING_ONE_IN`] the failing op's [`sibling`] where it has one, else a
    /// `seq_rm`, `seq_cp`, `seq_add` or `seq_div`, drawn as the generator draws its arguments,
    /// on the violation's sequence three times in four (else on the failing op's), its range
    /// ends from the trace's own positions. The same defect is often reached by another op on
    /// the same state (a pending shift left by `seq_div` as by `seq_add`; a count that a partial
    /// removal exposes as a whole one does), and the shrunk trace's ranges are the narrowest
    /// that fail, where the next failure may need wider ones (a partial removal of a one-cell
    /// copy removes all of it). Then, as any short child, a fresh tail ([`Mutator::continue_short`]):
    /// it is judged after the new op, and explores from the state next to the failure.
    pub fn neighbour(&self, entry: &Trace, site: FindingSite, runner: &mut TestRunner) -> Trace {
        let before = site.step.saturating_sub(1).min(entry.ops.len());
        let mut ops = entry.ops[..before].to_vec();
        if below(runner, 4) != 0 {
            self.widen(&mut ops, runner);
        }
        let failing = entry.ops.get(before);
        let kind = match sibling(site.op) {
            Some(k) if below(runner, SIBLING_ONE_IN) == 0 => k,
            _ => RANGED[below(runner, RANGED.len())],
        };
        // No shift where the memory cannot shift (`GenConfig::draws`): a removal instead.
        let kind = if self.gen.draws(kind) {
            kind
        } else {
            OpKind::SeqRm
        };
        let at = RANGED
            .iter()
            .position(|&k| k == kind)
            .expect("a ranged kind");
        let mut op = self.ranged[at]
            .new_tree(runner)
            .expect("the generator rejects nothing")
            .current();
        let seq = match site.seq.filter(|&s| s >= 0) {
            Some(s) if below(runner, 4) != 0 => Some(s),
            _ => failing.and_then(first_seq),
        };
        if let Some(seq) = seq {
            retarget(&mut op, seq, self.gen.n_seqs());
        }
        if self.partial_range_allowed(&op) {
            let mut dict = position_dictionary(self.setup_len(), &ops, self.gen.pos_cap);
            if let Some((p0, p1)) = failing.and_then(range_of) {
                dict.extend([p0, p1].into_iter().filter(|p| *p >= 0));
            }
            let (a, b) = (
                dict[below(runner, dict.len())],
                dict[below(runner, dict.len())],
            );
            if let Some((p0, p1)) = range_mut(&mut op) {
                *p0 = a.min(b);
                *p1 = if a == b || below(runner, 4) == 0 {
                    -1
                } else {
                    a.max(b)
                };
            }
        }
        ops.push(op);
        self.continue_short(&mut ops, runner);
        Trace {
            setup: entry.setup.clone(),
            ops,
        }
    }

    /// One range of `ops` (closed, and one the generator may make partial) widened: its end
    /// moved past where it was, or opened (one time in four), and every op over the same range
    /// moved with it (a range a trace names twice, a copy repeated onto the same cells, is one
    /// place).
    fn widen(&self, ops: &mut [Op], runner: &mut TestRunner) {
        let closed: Vec<(Pos, Pos)> = ops
            .iter()
            .filter(|op| self.partial_range_allowed(op))
            .filter_map(range_of)
            .filter(|&(_, p1)| p1 >= 0)
            .collect();
        if closed.is_empty() {
            return;
        }
        let old = closed[below(runner, closed.len())];
        let cap = self.gen.pos_cap;
        let end = if below(runner, 4) == 0 {
            -1
        } else {
            (old.1 + 1 + below(runner, (cap / 4).max(1) as usize) as Pos).min(cap + cap / 4)
        };
        for op in ops.iter_mut() {
            if range_of(op) == Some(old) && self.partial_range_allowed(op) {
                if let Some((_, p1)) = range_mut(op) {
                    *p1 = end;
                }
            }
        }
    }

    /// Applies one mutation to `ops` (another entry of `queue` for a splice).
    pub fn apply(&self, m: Mutation, ops: &mut Vec<Op>, queue: &[Trace], runner: &mut TestRunner) {
        let len = ops.len();
        match m {
            Mutation::Splice => {
                let other = &queue[below(runner, queue.len())].ops;
                let head = below(runner, len + 1);
                let tail = below(runner, other.len() + 1);
                ops.truncate(head);
                ops.extend_from_slice(&other[tail..]);
            }
            Mutation::Insert => {
                let at = below(runner, len + 1);
                let new = if below(runner, 4) == 0 {
                    self.chunk
                        .new_tree(runner)
                        .expect("the generator rejects nothing")
                        .current()
                } else {
                    vec![self.draw_op(runner)]
                };
                ops.splice(at..at, new);
            }
            Mutation::Drop if len > 1 => {
                let at = below(runner, len);
                let k = 1 + below(runner, 4.min(len - at));
                ops.drain(at..at + k);
            }
            Mutation::Truncate if len > 1 => {
                ops.truncate(1 + below(runner, len - 1));
            }
            Mutation::Change if len > 0 => {
                let at = below(runner, len);
                let name = ops[at].name();
                // Same kind when a draw gives one soon (clear has no arguments to change).
                let mut new = self.draw_op(runner);
                for _ in 0..16 {
                    if new.name() == name {
                        break;
                    }
                    new = self.draw_op(runner);
                }
                ops[at] = new;
            }
            Mutation::Retype if len > 0 => {
                let at = below(runner, len);
                let mut new = self.draw_op(runner);
                if let Some(seq) = first_seq(&ops[at]) {
                    retarget(&mut new, seq, self.gen.n_seqs());
                }
                // The old op's range is kept only where the new kind may take any range (a
                // retyped seq_rm's range would make a range copy out of a whole one).
                let keep_range = self.partial_range_allowed(&new);
                if let (Some(old), Some(range), true) =
                    (range_of(&ops[at]), range_mut(&mut new), keep_range)
                {
                    *range.0 = old.0;
                    *range.1 = old.1;
                }
                ops[at] = new;
            }
            Mutation::Boundary if len > 0 => {
                let at = below(runner, len);
                let dict = position_dictionary(self.setup_len(), ops, self.gen.pos_cap);
                self.to_boundary(&mut ops[at], &dict, runner);
            }
            Mutation::Repeat if len > 0 => {
                let at = below(runner, len);
                let to = if below(runner, 2) == 0 {
                    at + 1
                } else {
                    at + 1 + below(runner, len - at)
                };
                let op = ops[at].clone();
                ops.insert(to, op);
            }
            Mutation::Drop
            | Mutation::Truncate
            | Mutation::Change
            | Mutation::Retype
            | Mutation::Boundary
            | Mutation::Repeat => {
                ops.push(self.draw_op(runner));
            }
        }
    }

    /// One argument of `op` moved to a boundary of the generator's domain (`dict`: the
    /// positions to use, [`position_dictionary`]).
    fn to_boundary(&self, op: &mut Op, dict: &[Pos], runner: &mut TestRunner) {
        let g = &self.gen;
        let last = g.n_seqs() - 1;
        let pos = |runner: &mut TestRunner| {
            if below(runner, 4) == 0 {
                -1
            } else {
                dict[below(runner, dict.len())]
            }
        };
        let range = |p0: &mut Pos, p1: &mut Pos, runner: &mut TestRunner| {
            if below(runner, 2) == 0 {
                *p0 = pos(runner);
            } else {
                *p1 = pos(runner);
            }
        };
        match op {
            Op::SeqRm { seq, p0, p1 } => match below(runner, 3) {
                0 => *seq = if *seq == last { -1 } else { last },
                _ => range(p0, p1, runner),
            },
            Op::SeqCp { src, dst, p0, p1 } => match below(runner, 3) {
                0 if *src != last => *dst = last,
                0 => std::mem::swap(src, dst),
                _ if g.setup.kv_unified && !g.whole_copies => range(p0, p1, runner),
                _ => {}
            },
            Op::SeqAdd {
                seq, p0, p1, delta, ..
            } => match below(runner, 4) {
                0 => *seq = last,
                1 => *delta = [1, -1, g.max_delta, -g.max_delta][below(runner, 4)],
                _ => range(p0, p1, runner),
            },
            Op::SeqDiv { seq, p0, p1, d } => match below(runner, 4) {
                0 => *seq = last,
                1 => {
                    *d = if *d == g.max_divisor {
                        2
                    } else {
                        g.max_divisor
                    }
                }
                _ => range(p0, p1, runner),
            },
            Op::SeqKeep { seq } | Op::StateSeqSave { seq, .. } | Op::StateSeqLoad { seq, .. } => {
                *seq = last
            }
            Op::Decode(d) => match below(runner, 2) {
                0 => d.n = if d.n == 1 { g.max_tokens } else { 1 },
                _ if d.seqs.len() == 1 => d.seqs[0] = last,
                _ => d.n = g.max_tokens,
            },
            Op::Clear | Op::StateSave { .. } | Op::StateLoad { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests;
