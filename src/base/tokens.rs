//! The token model: which token the harness decoded at each (sequence, position), carried through
//! every op of a trial, and what each token attended to when it was decoded.
//!
//! The cache-invisible oracle ([`crate::base::probe`]) compares a sequence's next-token logits
//! with those of a fresh context that decodes the sequence's resident tokens at their positions.
//! That comparison only means something when a fresh decode *would* give the same K/V rows: a
//! token's rows in layers above the first depend on what it attended to when it was decoded, so
//! after an interior `seq_rm`, a partial shift or a copy into a non-empty destination the cached
//! rows differ from a fresh decode's by design, not by a bug. The model therefore records, per
//! token, the K/V content it saw (by identity, with the positions they had), and
//! [`TokenModel::resident`] only answers for a sequence whose every token still sees exactly what
//! it saw then, at the same relative positions. Wherever the model cannot know (a failed or
//! damaged load, a decode that failed part way, duplicate positions, a sequence whose cells
//! differ from the model's), it answers `None`: the probe is skipped, never passed.
//!
//! Cells are modelled as llama.cpp shares them: a `seq_cp` within a stream adds the destination
//! to the same cells (so a later `seq_add` on one sequence moves them in both), a cross-stream
//! copy and a state load make new cells with the same K/V content.
//!
//! Per memory type (the setup's architecture, docs/memory-types.md):
//! - **kv**: the cells above.
//! - **iswa**: the same cells (every op goes to the base and the windowed cache alike), and a
//!   sequence is judged only when the windowed cache still holds its lowest base position
//!   (`seq_pos_min`, which the windowed cache answers, equals the base cells' minimum). The
//!   windowed cache loses cells only as a prefix (a purge when it is full,
//!   `llama_kv_cache::apply_ubatch`; a load of a dump that left masked cells out; a copy of a
//!   sequence that lost them), and a token decoded while its window lacked a cell has that cell
//!   below it in the base cache: as long as the cell is there, `seq_pos_min` says so, and once
//!   it is gone the token's history no longer matches.
//! - **recurrent**: a sequence's state is the fold of the tokens it absorbed, in order
//!   ([`Absorbed`]). `seq_cp` gives the destination the source's whole state whatever the range;
//!   `seq_rm` that covers the state's position from 0 empties it, a refused one (false: a
//!   partial removal, no rollback depth) changes nothing, and one that returned true while its
//!   range held absorbed tokens but not the state's position leaves the model unable to say
//!   (llama.cpp kept the tokens the caller removed); a shift that moves the state's position
//!   does too. A decode into several sequences is judged when they held the same state.
//! - **hybrid**: both models, attention for the attention cache and recurrent for the states; a
//!   refused `seq_rm` changes neither part (`llama_memory_hybrid::seq_rm` asks the recurrent
//!   memory first); a sequence is judged when both parts hold the same tokens at the same
//!   positions, and a decode into a sequence whose parts differed leaves it unjudged for as long
//!   as those tokens stay (its attention rows and state came from mixed inputs).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::base::op::{MemoryType, Op, Pos, SeqId, Setup, Slot};
use crate::base::target::{OpOutcome, SeqObservation};

/// A token id, as `llama_token`.
pub type Token = i32;

/// What a token attended to when it was decoded: its own position then, and the K/V content
/// (by identity) and position of every token of its sequence below it, sorted by identity.
#[derive(Clone, Debug, PartialEq, Eq)]
struct History {
    pos: Pos,
    seen: Vec<(u64, Pos)>,
}

/// One resident token of one sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    /// The cell that holds it: sequences that share a cell share this id.
    cell: u64,
    /// Its K/V content: copies and loads keep it.
    kv: u64,
    token: Token,
    pos: Pos,
    /// `seq_add`/`seq_div` moved it since it was decoded: its key was rotated again in place
    /// (llama.cpp's K-shift), which rounds differently from a fresh rotation.
    moved: bool,
    /// `None`: unknown (the model cannot say what it attended to).
    history: Option<Arc<History>>,
}

/// One sequence's tokens, or `None` where the model lost track.
type SeqTokens = Option<Vec<Entry>>;

/// A recurrent state: the (position, token) pairs it absorbed, in order (the state is their
/// fold), or `None` where the model lost track. Shared, as llama.cpp's cells share a state.
type Absorbed = Option<Arc<Vec<(Pos, Token)>>>;

/// What a state buffer of the trial holds, as far as the model knows.
#[derive(Clone, Debug)]
enum Saved {
    /// A sequence's tokens and recurrent state (`llama_state_seq_get_data`).
    Seq(SeqTokens, Absorbed),
    /// Every sequence's (`llama_state_get_data`).
    Whole(BTreeMap<SeqId, SeqTokens>, BTreeMap<SeqId, Absorbed>),
    /// Something the model cannot load back (a failed save, a save with flags).
    Unknown,
}

/// The token model of one trial (see the module docs).
#[derive(Clone, Debug)]
pub struct TokenModel {
    unified: bool,
    memory: MemoryType,
    n_seq_max: u32,
    /// Sequences not listed hold nothing (the attention cells).
    seqs: BTreeMap<SeqId, SeqTokens>,
    /// The recurrent states (recurrent and hybrid memories); sequences not listed hold none.
    states: BTreeMap<SeqId, Absorbed>,
    /// Every sequence not listed in `seqs` or `states` is unknown too (after a failed whole
    /// load).
    all_unknown: bool,
    slots: BTreeMap<Slot, Saved>,
    next_id: u64,
}

/// A range `[p0, p1)` as llama.h reads it: a negative end is open.
fn in_range(pos: Pos, p0: Pos, p1: Pos) -> bool {
    pos >= p0.max(0) && (p1 < 0 || pos < p1)
}

/// `[p0, p1)` holds no position (after llama.h's open ends are read).
fn empty_range(p0: Pos, p1: Pos) -> bool {
    p1 >= 0 && p0.max(0) >= p1
}

impl TokenModel {
    /// An empty model for `setup`'s configuration, before its ops.
    pub fn new(setup: &Setup) -> TokenModel {
        TokenModel {
            unified: setup.kv_unified,
            memory: setup.arch.memory(),
            n_seq_max: setup.n_seq_max,
            seqs: BTreeMap::new(),
            states: BTreeMap::new(),
            all_unknown: false,
            slots: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// The model after `setup`'s ops, each of which took effect (a reset checks that).
    pub fn after_setup(setup: &Setup) -> TokenModel {
        let mut m = TokenModel::new(setup);
        for op in &setup.ops {
            let outcome = match op {
                Op::Decode(_) => OpOutcome::Decoded { rc: 0 },
                Op::SeqRm { .. } | Op::StateSeqSave { .. } | Op::StateSave { .. } => {
                    OpOutcome::Done {
                        returned: Some(true),
                    }
                }
                Op::StateSeqLoad { .. } | Op::StateLoad { .. } => OpOutcome::Done {
                    returned: Some(true),
                },
                _ => OpOutcome::Done { returned: None },
            };
            m.apply(op, &outcome);
        }
        m
    }

    fn fresh(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn get(&self, seq: SeqId) -> SeqTokens {
        match self.seqs.get(&seq) {
            Some(s) => s.clone(),
            None if self.all_unknown => None,
            None => Some(Vec::new()),
        }
    }

    fn set(&mut self, seq: SeqId, tokens: SeqTokens) {
        self.seqs.insert(seq, tokens);
    }

    fn known_seqs(&self) -> Vec<SeqId> {
        self.seqs.keys().copied().collect()
    }

    fn get_state(&self, seq: SeqId) -> Absorbed {
        match self.states.get(&seq) {
            Some(s) => s.clone(),
            None if self.all_unknown => None,
            None => Some(Arc::new(Vec::new())),
        }
    }

    fn forget_all(&mut self) {
        self.seqs.clear();
        self.states.clear();
        self.all_unknown = true;
    }

    fn clear_all(&mut self) {
        self.seqs.clear();
        self.states.clear();
        self.all_unknown = false;
    }

    /// The memory has an attention part (kv, iswa, hybrid).
    fn has_attention(&self) -> bool {
        self.memory != MemoryType::Recurrent
    }

    /// The memory has recurrent states (recurrent, hybrid).
    fn has_states(&self) -> bool {
        matches!(self.memory, MemoryType::Recurrent | MemoryType::Hybrid)
    }

    /// Carries the model through `op`, which the target answered with `outcome`. A decode at
    /// "next" positions starts after the model's own last position of its first sequence: use
    /// [`TokenModel::apply_after`] when the target's accessor may say otherwise.
    pub fn apply(&mut self, op: &Op, outcome: &OpOutcome) {
        self.apply_after(op, outcome, None)
    }

    /// [`TokenModel::apply`], where a decode at "next" positions starts at `next` (the target's
    /// `seq_pos_max + 1` of the decode's first sequence, asked before the op: llama.cpp's batch
    /// allocator reads it, stale or not).
    pub fn apply_after(&mut self, op: &Op, outcome: &OpOutcome, next: Option<Pos>) {
        // An op the target refused or could not run changed nothing (a crash ends the trial).
        if matches!(
            outcome,
            OpOutcome::Refused { .. } | OpOutcome::Unsupported { .. }
        ) {
            return;
        }
        let refused_rm = matches!(op, Op::SeqRm { .. })
            && *outcome
                == (OpOutcome::Done {
                    returned: Some(false),
                });
        // llama_memory_hybrid::seq_rm asks the recurrent memory first and leaves both parts as
        // they were when it refuses (src/llama-memory-hybrid.cpp:143-150).
        if self.memory == MemoryType::Hybrid && refused_rm {
            return;
        }
        match op {
            Op::StateSeqSave { .. }
            | Op::StateSave { .. }
            | Op::StateSeqLoad { .. }
            | Op::StateLoad { .. }
            | Op::Clear => self.apply_state_op(op, outcome),
            _ => {
                // In a hybrid model each layer's input depends on the layers below it, recurrent
                // and attention alike: a token decoded while a sequence's state and attention
                // cells held different tokens has rows and a state no fresh decode gives.
                let mixed = match op {
                    Op::Decode(d) if self.memory == MemoryType::Hybrid => {
                        d.seqs.iter().any(|&s| !self.parts_agree(s))
                    }
                    _ => false,
                };
                let first_new = self.next_id;
                if self.has_states() {
                    self.apply_states(op, outcome, next);
                }
                if self.has_attention() {
                    self.apply_attention(op, outcome, next);
                }
                if let (true, Op::Decode(d)) = (mixed, op) {
                    for &s in &d.seqs {
                        self.states.insert(s, None);
                        if let Some(Some(v)) = self.seqs.get_mut(&s) {
                            for e in v.iter_mut().filter(|e| e.kv > first_new) {
                                e.history = None;
                            }
                        }
                    }
                }
            }
        }
    }

    /// A hybrid sequence's state absorbed exactly the tokens its attention cells hold, at the
    /// same positions (both known).
    fn parts_agree(&self, seq: SeqId) -> bool {
        match (self.get(seq), self.get_state(seq)) {
            (Some(mut cells), Some(state)) => {
                cells.sort_by_key(|e| e.pos);
                cells
                    .iter()
                    .map(|e| (e.pos, e.token))
                    .eq(state.iter().copied())
            }
            _ => false,
        }
    }

    /// The attention part of [`TokenModel::apply_after`] (the cells of the module docs).
    fn apply_attention(&mut self, op: &Op, outcome: &OpOutcome, next: Option<Pos>) {
        match op {
            Op::SeqRm { seq, p0, p1 } => {
                let targets = if *seq < 0 {
                    self.known_seqs()
                } else {
                    vec![*seq]
                };
                let whole = *p0 <= 0 && *p1 < 0;
                if *outcome
                    == (OpOutcome::Done {
                        returned: Some(false),
                    })
                {
                    for s in targets {
                        self.set(s, None);
                    }
                    return;
                }
                if *seq < 0 && whole {
                    self.seqs.clear();
                    self.all_unknown = false;
                    return;
                }
                for s in targets {
                    let now = match self.get(s) {
                        Some(mut v) => {
                            v.retain(|e| !in_range(e.pos, *p0, *p1));
                            Some(v)
                        }
                        None if whole => Some(Vec::new()),
                        None => None,
                    };
                    self.set(s, now);
                }
            }
            Op::SeqCp { src, dst, p0, p1 } => {
                if src == dst {
                    return;
                }
                let from = self.get(*src);
                if !self.unified {
                    // Across streams: the destination's stream becomes a copy of the source's
                    // (new cells, the same K/V content).
                    let copied = from.map(|v| {
                        v.into_iter()
                            .map(|e| Entry {
                                cell: self.fresh(),
                                ..e
                            })
                            .collect()
                    });
                    self.set(*dst, copied);
                    return;
                }
                let now = match (from, self.get(*dst)) {
                    (Some(f), Some(mut d)) => {
                        for e in f.into_iter().filter(|e| in_range(e.pos, *p0, *p1)) {
                            if !d.iter().any(|x| x.cell == e.cell) {
                                d.push(e);
                            }
                        }
                        Some(d)
                    }
                    _ => None,
                };
                self.set(*dst, now);
            }
            Op::SeqKeep { seq } => {
                // With one stream per sequence a keep works in its own stream only.
                if self.unified {
                    let kept = self.get(*seq);
                    self.seqs.clear();
                    self.all_unknown = false;
                    self.set(*seq, kept);
                }
            }
            Op::SeqAdd { seq, p0, p1, delta } => {
                if *delta != 0 && !empty_range(*p0, *p1) {
                    self.move_cells(*seq, *p0, *p1, |p| p + delta);
                }
            }
            Op::SeqDiv { seq, p0, p1, d } => {
                if *d > 1 && !empty_range(*p0, *p1) {
                    self.move_cells(*seq, *p0, *p1, |p| p / d);
                }
            }
            Op::Decode(d) => match outcome {
                OpOutcome::Decoded { rc: 0 } => self.decode(d, next),
                // llama_batch_allocr refuses a bad batch before touching the cache.
                OpOutcome::Decoded { rc: -1 } => {}
                _ => {
                    for &s in &d.seqs {
                        self.set(s, None);
                    }
                }
            },
            // Both parts at once: apply_state_op.
            Op::StateSeqSave { .. }
            | Op::StateSave { .. }
            | Op::StateSeqLoad { .. }
            | Op::StateLoad { .. }
            | Op::Clear => {}
        }
    }

    /// The ops that touch every part of the memory at once: clears, saves and loads.
    fn apply_state_op(&mut self, op: &Op, outcome: &OpOutcome) {
        let done = *outcome
            == (OpOutcome::Done {
                returned: Some(true),
            });
        match op {
            Op::Clear => self.clear_all(),
            Op::StateSeqSave { seq, slot, flags } => {
                let saved = if *flags == 0 && done {
                    Saved::Seq(self.get(*seq), self.get_state(*seq))
                } else {
                    Saved::Unknown
                };
                self.slots.insert(slot.clone(), saved);
            }
            Op::StateSave { slot } => {
                let saved = if done && !self.all_unknown {
                    Saved::Whole(self.seqs.clone(), self.states.clone())
                } else {
                    Saved::Unknown
                };
                self.slots.insert(slot.clone(), saved);
            }
            Op::StateSeqLoad {
                seq,
                slot,
                flags,
                truncate,
                flip,
            } => {
                let clean = *flags == 0 && truncate.is_none() && flip.is_none();
                let (cells, state) = match (clean && done, self.slots.get(slot)) {
                    (true, Some(Saved::Seq(v, state))) => {
                        let (v, state) = (v.clone(), state.clone());
                        let cells = v.map(|v| {
                            v.into_iter()
                                .map(|e| Entry {
                                    cell: self.fresh(),
                                    ..e
                                })
                                .collect()
                        });
                        // A load makes a cell of its own: a state shared with no one.
                        (cells, state.map(|v| Arc::new(Vec::clone(&v))))
                    }
                    // A failed or damaged load: what the cache kept is not modelled.
                    _ => (None, None),
                };
                self.set(*seq, cells);
                self.states.insert(*seq, state);
            }
            Op::StateLoad {
                slot,
                truncate,
                flip,
            } => {
                let clean = truncate.is_none() && flip.is_none();
                match (clean && done, self.slots.get(slot)) {
                    (true, Some(Saved::Whole(all, states))) => {
                        self.seqs = all.clone();
                        self.states = states.clone();
                        self.all_unknown = false;
                    }
                    _ => self.forget_all(),
                }
            }
            _ => {}
        }
    }

    /// The recurrent part of [`TokenModel::apply_after`] (llama-memory-recurrent.cpp, both pins:
    /// `seq_rm` :150/:168, `seq_cp`, `seq_keep`, `seq_add`, `seq_div`, `find_slot`).
    fn apply_states(&mut self, op: &Op, outcome: &OpOutcome, next: Option<Pos>) {
        let valid = |s: SeqId| (0..self.n_seq_max as SeqId).contains(&s);
        match op {
            Op::SeqRm { seq, p0, p1 } => {
                let whole = *p0 <= 0 && *p1 < 0;
                let accepted = OpOutcome::Done {
                    returned: Some(true),
                };
                if *outcome != accepted {
                    // Refused (a partial removal without rollback depth): nothing changed.
                    return;
                }
                if *seq < 0 {
                    // Accepted for the whole range (every state at a position >= 0 goes) or an
                    // empty one (nothing).
                    if !empty_range(*p0, *p1) {
                        for s in 0..self.n_seq_max as SeqId {
                            let now = match self.get_state(s) {
                                Some(_) if whole => Some(Arc::new(Vec::new())),
                                _ => None,
                            };
                            self.states.insert(s, now);
                        }
                    }
                    return;
                }
                let now = match self.get_state(*seq) {
                    // Even a whole removal leaves a state that a shift moved below 0
                    // (`cell.pos >= p0` fails): an unknown state stays unknown.
                    None => None,
                    Some(v) => match v.last() {
                        None => Some(v),
                        // The range covers the state's position from 0: the state goes.
                        Some(&(pos, _)) if in_range(pos, *p0, *p1) && *p0 <= 0 => {
                            Some(Arc::new(Vec::new()))
                        }
                        // A rollback that was accepted (a rollback depth the model does not
                        // follow), or a range that names absorbed tokens and not the state's
                        // position: llama.cpp kept tokens the caller removed.
                        Some(_) if v.iter().any(|&(p, _)| in_range(p, *p0, *p1)) => None,
                        Some(_) => Some(v),
                    },
                };
                self.states.insert(*seq, now);
            }
            Op::SeqCp { src, dst, .. } => {
                if src == dst || !valid(*src) || !valid(*dst) {
                    return;
                }
                // The whole state, whatever the range; an empty source empties the destination.
                let from = self.get_state(*src);
                self.states.insert(*dst, from);
            }
            Op::SeqKeep { seq } => {
                let kept = self.get_state(*seq);
                self.states.clear();
                self.all_unknown_states_known();
                self.states.insert(*seq, kept);
            }
            Op::SeqAdd { seq, p0, p1, delta } if *delta != 0 => {
                self.shift_state(*seq, *p0, *p1);
            }
            Op::SeqDiv { seq, p0, p1, d } if *d > 1 => {
                self.shift_state(*seq, *p0, *p1);
            }
            Op::Decode(d) => match outcome {
                OpOutcome::Decoded { rc: 0 } => self.decode_states(d, next),
                // llama_batch_allocr refuses a bad batch before touching the memory.
                OpOutcome::Decoded { rc: -1 } => {}
                _ => {
                    for &s in &d.seqs {
                        self.states.insert(s, None);
                    }
                }
            },
            _ => {}
        }
    }

    /// After a `seq_keep` the other sequences hold nothing, known or not before.
    fn all_unknown_states_known(&mut self) {
        if self.all_unknown {
            // Attention cells of unlisted sequences stay unknown: list the known-empty states
            // of every valid sequence instead of clearing the flag.
            for s in 0..self.n_seq_max as SeqId {
                self.states.insert(s, Some(Arc::new(Vec::new())));
            }
        }
    }

    /// `seq_add`/`seq_div` of a recurrent state: a state whose position is in `[p0, p1)` moves
    /// (its tokens stay), for every sequence that shares its cell (the same `Arc`: a copy or a
    /// decode into several sequences): the model no longer says where they are.
    fn shift_state(&mut self, seq: SeqId, p0: Pos, p1: Pos) {
        if empty_range(p0, p1) {
            return;
        }
        let Some(v) = self.get_state(seq) else {
            // An unknown state may be shared with any sequence.
            for s in 0..self.n_seq_max as SeqId {
                self.states.insert(s, None);
            }
            return;
        };
        if v.last().is_some_and(|&(pos, _)| in_range(pos, p0, p1)) {
            for st in self.states.values_mut() {
                if st.as_ref().is_some_and(|x| Arc::ptr_eq(x, &v)) {
                    *st = None;
                }
            }
            self.states.insert(seq, None);
        }
    }

    /// A successful decode into recurrent states: each sequence set of the batch folds the
    /// tokens into its first sequence's state, which every member then holds (`find_slot`).
    /// Judged when every member held the same state before.
    fn decode_states(&mut self, d: &crate::base::op::Decode, next: Option<Pos>) {
        let first = self.get_state(d.seqs[0]);
        let same = d.seqs.iter().all(|&s| {
            let st = self.get_state(s);
            match (&st, &first) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                _ => false,
            }
        });
        let base = d
            .pos
            .or(next)
            .or_else(|| first.as_ref().map(|v| v.last().map_or(0, |&(p, _)| p + 1)));
        let now = match (first, base, same) {
            (Some(v), Some(base), true) => {
                let mut v = Vec::clone(&v);
                v.extend(
                    d.token_ids()
                        .into_iter()
                        .enumerate()
                        .map(|(i, t)| (base + i as Pos, t)),
                );
                Some(Arc::new(v))
            }
            _ => None,
        };
        for &s in &d.seqs {
            self.states.insert(s, now.clone());
        }
    }

    /// `seq_add`/`seq_div` of `seq`'s cells in `[p0, p1)`: the cells move in every sequence that
    /// shares them; a cell whose position goes below 0 is freed (llama_kv_cells::pos_add).
    fn move_cells(&mut self, seq: SeqId, p0: Pos, p1: Pos, to: impl Fn(Pos) -> Pos) {
        let Some(mine) = self.get(seq) else {
            if self.unified {
                // Unknown cells may be shared with any sequence.
                self.forget_all();
            }
            return;
        };
        let moved: BTreeMap<u64, Pos> = mine
            .iter()
            .filter(|e| in_range(e.pos, p0, p1))
            .map(|e| (e.cell, to(e.pos)))
            .collect();
        let seqs: Vec<SeqId> = if self.unified {
            self.known_seqs()
        } else {
            vec![seq]
        };
        for s in seqs {
            if let Some(Some(v)) = self.seqs.get_mut(&s) {
                for e in v.iter_mut() {
                    if let Some(&p) = moved.get(&e.cell) {
                        e.moved |= p != e.pos;
                        e.pos = p;
                    }
                }
                v.retain(|e| e.pos >= 0);
            }
        }
        if !self.seqs.contains_key(&seq) {
            let mut v = mine;
            for e in v.iter_mut() {
                if let Some(&p) = moved.get(&e.cell) {
                    e.moved |= p != e.pos;
                    e.pos = p;
                }
            }
            v.retain(|e| e.pos >= 0);
            self.set(seq, Some(v));
        }
    }

    fn decode(&mut self, d: &crate::base::op::Decode, next: Option<Pos>) {
        let tokens = d.token_ids();
        let multi_stream = !self.unified && d.seqs.len() > 1;
        let first = d.seqs[0];
        let base = match (d.pos.or(next), self.get(first)) {
            (Some(p), _) => Some(p),
            // llama_batch_allocr: "next" is the first sequence's seq_pos_max + 1.
            (None, Some(v)) => Some(v.iter().map(|e| e.pos).max().unwrap_or(-1) + 1),
            (None, None) => None,
        };
        let (Some(base), false) = (base, multi_stream) else {
            for &s in &d.seqs {
                self.set(s, None);
            }
            return;
        };
        for (i, &token) in tokens.iter().enumerate() {
            let pos = base + i as Pos;
            // What the token sees: its sequences' tokens below it (the KQ mask of its first
            // sequence; when its sequences differ there, the model does not guess which).
            let mut views = d.seqs.iter().map(|&s| {
                self.get(s).map(|v| {
                    let dup = v.iter().any(|e| e.pos == pos);
                    let mut seen: Vec<(u64, Pos)> = v
                        .iter()
                        .filter(|e| e.pos < pos)
                        .map(|e| (e.kv, e.pos))
                        .collect();
                    seen.sort_unstable();
                    (dup, seen)
                })
            });
            let view = views.next().flatten();
            let same = views.all(|v| v.as_ref() == view.as_ref());
            let history = match view {
                Some((false, seen)) if same => Some(Arc::new(History { pos, seen })),
                _ => None,
            };
            let entry = Entry {
                cell: self.fresh(),
                kv: self.fresh(),
                token,
                pos,
                moved: false,
                history,
            };
            for &s in &d.seqs {
                if let Some(Some(v)) = self.seqs.get_mut(&s) {
                    v.push(entry.clone());
                } else if self.get(s).is_some() {
                    self.set(s, Some(vec![entry.clone()]));
                }
            }
        }
    }

    /// The tokens the model places in `seq` of an attention memory, by position, without asking
    /// whether a fresh decode would reproduce their K/V (what a C reproducer decodes into its
    /// twin; the audit itself judges only what [`Self::resident`] vouches for). `None` where the
    /// model lost track.
    pub fn attention_tokens(&self, seq: SeqId) -> Option<Vec<(Pos, Token)>> {
        let mut v = self.get(seq)?;
        v.sort_by_key(|e| e.pos);
        Some(v.iter().map(|e| (e.pos, e.token)).collect())
    }

    /// The tokens of the observed sequence `obs` by position, when a fresh decode of them alone
    /// would give the memory's content for it (see the module docs); `None` otherwise: the
    /// sequence cannot be judged. The flag says whether any of them was moved by
    /// `seq_add`/`seq_div` (re-rotated keys: a looser tolerance).
    pub fn resident(&self, obs: &SeqObservation) -> Option<(Vec<(Pos, Token)>, bool)> {
        match self.memory {
            MemoryType::Kv => self.attention_resident(obs.seq, &obs.cells),
            MemoryType::Iswa => {
                // The windowed cache (which answers seq_pos_min) must still hold the lowest base
                // position: it loses cells only as a prefix.
                if obs.cells.first().is_some_and(|&p| p != obs.pos_min) {
                    return None;
                }
                self.attention_resident(obs.seq, &obs.cells)
            }
            MemoryType::Recurrent => self.state_resident(obs.seq, &obs.cells),
            MemoryType::Hybrid => {
                let attention = self.attention_resident(obs.seq, &obs.cells)?;
                let state = self.state_resident(obs.seq, obs.second_cells.as_deref()?)?;
                (attention.0 == state.0).then_some(attention)
            }
        }
    }

    /// The tokens a recurrent state absorbed, when the state sits exactly at `cells` (the
    /// target's own dump: one cell at the last absorbed position, or none).
    fn state_resident(&self, seq: SeqId, cells: &[Pos]) -> Option<(Vec<(Pos, Token)>, bool)> {
        let v = self.get_state(seq)?;
        let at: Vec<Pos> = v.last().map(|&(p, _)| p).into_iter().collect();
        (at == cells).then(|| (Vec::clone(&v), false))
    }

    /// The attention cells of `seq` by position, when a fresh decode of them would give the K/V
    /// the cache holds and they sit exactly at `cells` (the positions the target's own dump
    /// lists).
    fn attention_resident(&self, seq: SeqId, cells: &[Pos]) -> Option<(Vec<(Pos, Token)>, bool)> {
        let mut v = self.get(seq)?;
        v.sort_by_key(|e| e.pos);
        let positions: Vec<Pos> = v.iter().map(|e| e.pos).collect();
        if positions != cells || positions.windows(2).any(|w| w[0] == w[1]) {
            return None;
        }
        for (i, e) in v.iter().enumerate() {
            let h = e.history.as_ref()?;
            let mut now: Vec<(u64, Pos)> = v[..i]
                .iter()
                .map(|x| (x.kv, x.pos - e.pos + h.pos))
                .collect();
            now.sort_unstable();
            if now != h.seen {
                return None;
            }
        }
        let moved = v.iter().any(|e| e.moved);
        Some((v.iter().map(|e| (e.pos, e.token)).collect(), moved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::Decode;

    fn setup(unified: bool) -> Setup {
        Setup {
            kv_unified: unified,
            ops: vec![Op::Decode(Decode::next(0, 7))],
            ..Setup::default()
        }
    }

    fn done() -> OpOutcome {
        OpOutcome::Done { returned: None }
    }

    fn seq0(m: &TokenModel, cells: &[Pos]) -> Option<Vec<(Pos, Token)>> {
        m.attention_resident(0, cells).map(|(v, _)| v)
    }

    #[test]
    fn a_fresh_prefix_and_a_tail_removal_are_judged() {
        let mut m = TokenModel::after_setup(&setup(true));
        let all: Vec<Pos> = (0..7).collect();
        let r = seq0(&m, &all).unwrap();
        assert_eq!(r.len(), 7);
        assert_eq!(r[0], (0, crate::base::op::default_token(0)));
        m.apply(
            &Op::SeqRm {
                seq: 0,
                p0: 4,
                p1: -1,
            },
            &OpOutcome::Done {
                returned: Some(true),
            },
        );
        assert!(seq0(&m, &[0, 1, 2, 3]).is_some());
        // The target's cells must agree with the model's.
        assert!(seq0(&m, &[0, 1, 2]).is_none());
    }

    #[test]
    fn stale_histories_are_not_judged() {
        let mut m = TokenModel::after_setup(&setup(true));
        m.apply(
            &Op::SeqRm {
                seq: 0,
                p0: 2,
                p1: 5,
            },
            &OpOutcome::Done {
                returned: Some(true),
            },
        );
        // Cells 5 and 6 attended to 2..5 when they were decoded.
        assert!(seq0(&m, &[0, 1, 5, 6]).is_none());
        let mut m = TokenModel::after_setup(&setup(true));
        m.apply(
            &Op::SeqAdd {
                seq: 0,
                p0: 4,
                p1: -1,
                delta: 2,
            },
            &done(),
        );
        assert!(seq0(&m, &[0, 1, 2, 3, 6, 7, 8]).is_none());
        // Open ends on both sides: every cell moves (position 0 goes below 0 and is freed).
        let mut m = TokenModel::after_setup(&setup(true));
        m.apply(
            &Op::SeqAdd {
                seq: 0,
                p0: -1,
                p1: -1,
                delta: -1,
            },
            &done(),
        );
        assert!(seq0(&m, &(0..6).collect::<Vec<_>>()).is_none());
        // A shift of the whole sequence keeps every relative position.
        let mut m = TokenModel::after_setup(&setup(true));
        m.apply(
            &Op::SeqAdd {
                seq: 0,
                p0: -1,
                p1: -1,
                delta: 3,
            },
            &done(),
        );
        assert!(
            m.attention_resident(0, &(3..10).collect::<Vec<_>>())
                .unwrap()
                .1
        );
    }

    #[test]
    fn copies_share_cells_when_unified_and_not_across_streams() {
        let cp = Op::SeqCp {
            src: 0,
            dst: 1,
            p0: -1,
            p1: -1,
        };
        let add = Op::SeqAdd {
            seq: 0,
            p0: -1,
            p1: -1,
            delta: 2,
        };
        let mut m = TokenModel::after_setup(&setup(true));
        m.apply(&cp, &done());
        m.apply(&add, &done());
        let moved: Vec<Pos> = (2..9).collect();
        assert!(m.attention_resident(1, &moved).is_some());
        let mut m = TokenModel::after_setup(&setup(false));
        m.apply(&cp, &done());
        m.apply(&add, &done());
        assert!(m
            .attention_resident(1, &(0..7).collect::<Vec<_>>())
            .is_some());
        assert!(m.attention_resident(0, &moved).is_some());
    }

    #[test]
    fn loads_follow_the_slots_and_damage_is_unknown() {
        let slot = Slot::new("a").unwrap();
        let yes = OpOutcome::Done {
            returned: Some(true),
        };
        let mut m = TokenModel::after_setup(&setup(true));
        m.apply(
            &Op::StateSeqSave {
                seq: 0,
                slot: slot.clone(),
                flags: 0,
            },
            &yes,
        );
        let load = |truncate| Op::StateSeqLoad {
            seq: 1,
            slot: slot.clone(),
            flags: 0,
            truncate,
            flip: None,
        };
        m.apply(&load(None), &yes);
        let all: Vec<Pos> = (0..7).collect();
        assert_eq!(
            m.attention_resident(1, &all).map(|(v, _)| v),
            seq0(&m, &all)
        );
        m.apply(
            &load(Some(10)),
            &OpOutcome::Done {
                returned: Some(false),
            },
        );
        assert!(m.attention_resident(1, &[]).is_none());
        m.apply(&Op::Clear, &done());
        assert_eq!(m.attention_resident(1, &[]), Some((Vec::new(), false)));
    }

    fn arch_setup(arch: crate::base::op::Arch) -> Setup {
        Setup {
            n_seq_max: 3,
            arch,
            ..setup(true)
        }
    }

    fn obs(seq: SeqId, pos_min: Pos, cells: &[Pos], second: Option<&[Pos]>) -> SeqObservation {
        SeqObservation {
            seq,
            pos_min,
            pos_max: cells.last().copied().unwrap_or(-1),
            cells: cells.to_vec(),
            second_cells: second.map(<[Pos]>::to_vec),
        }
    }

    fn returned(b: bool) -> OpOutcome {
        OpOutcome::Done { returned: Some(b) }
    }

    fn rm(seq: SeqId, p0: Pos, p1: Pos) -> Op {
        Op::SeqRm { seq, p0, p1 }
    }

    fn cp(src: SeqId, dst: SeqId, p0: Pos, p1: Pos) -> Op {
        Op::SeqCp { src, dst, p0, p1 }
    }

    #[test]
    fn a_recurrent_state_is_every_token_it_absorbed() {
        use crate::base::op::Arch;
        let mut m = TokenModel::after_setup(&arch_setup(Arch::Mamba));
        let all = m.resident(&obs(0, 6, &[6], None)).unwrap().0;
        assert_eq!(all.len(), 7);
        // A refused partial removal changed nothing: all seven tokens, the cell still at 6.
        m.apply(&rm(0, 4, -1), &returned(false));
        assert_eq!(m.resident(&obs(0, 6, &[6], None)).unwrap().0, all);
        // The dump must agree: one cell at the last absorbed position.
        assert!(m.resident(&obs(0, 3, &[3], None)).is_none());
        // A copy gives the whole state whatever the range; a decode then folds into the copy.
        m.apply(&cp(0, 1, 5, 6), &done());
        assert_eq!(m.resident(&obs(1, 6, &[6], None)).unwrap().0, all);
        m.apply_after(
            &Op::Decode(Decode::next(1, 1)),
            &OpOutcome::Decoded { rc: 0 },
            Some(7),
        );
        assert_eq!(m.resident(&obs(1, 7, &[7], None)).unwrap().0.len(), 8);
        assert_eq!(m.resident(&obs(0, 6, &[6], None)).unwrap().0, all);
        // A removal that returned true while naming absorbed tokens but not the state's
        // position: llama.cpp kept them, the model cannot say.
        m.apply(&rm(0, 0, 3), &returned(true));
        assert!(m.resident(&obs(0, 6, &[6], None)).is_none());
        // A whole removal empties the state.
        m.apply(&rm(1, -1, -1), &returned(true));
        assert_eq!(
            m.resident(&obs(1, -1, &[], None)),
            Some((Vec::new(), false))
        );
    }

    #[test]
    fn a_shift_of_a_shared_state_is_unknown_in_every_sharer() {
        use crate::base::op::Arch;
        let mut m = TokenModel::after_setup(&arch_setup(Arch::Mamba));
        m.apply(&cp(0, 1, -1, -1), &done());
        let add = Op::SeqAdd {
            seq: 0,
            p0: 6,
            p1: 7,
            delta: 1,
        };
        m.apply(&add, &done());
        assert!(m.resident(&obs(0, 7, &[7], None)).is_none());
        assert!(m.resident(&obs(1, 7, &[7], None)).is_none());
        // An unknown state stays unknown through a whole removal (a state moved below 0
        // survives it), and is known again after a clear.
        m.apply(&rm(0, -1, -1), &returned(true));
        assert!(m.resident(&obs(0, -1, &[], None)).is_none());
        m.apply(&Op::Clear, &done());
        assert!(m.resident(&obs(0, -1, &[], None)).is_some());
    }

    #[test]
    fn a_batch_into_several_sequences_is_judged_when_they_held_one_state() {
        use crate::base::op::Arch;
        let mut m = TokenModel::new(&arch_setup(Arch::Mamba));
        let both = Op::Decode(Decode {
            seqs: vec![0, 1],
            n: 2,
            pos: None,
            tokens: Some(vec![3, 4]),
        });
        m.apply_after(&both, &OpOutcome::Decoded { rc: 0 }, Some(0));
        let want = vec![(0, 3), (1, 4)];
        assert_eq!(m.resident(&obs(0, 1, &[1], None)).unwrap().0, want);
        assert_eq!(m.resident(&obs(1, 1, &[1], None)).unwrap().0, want);
        // Different states coupled in one batch: not judged.
        m.apply_after(
            &Op::Decode(Decode::next(0, 1)),
            &OpOutcome::Decoded { rc: 0 },
            Some(2),
        );
        m.apply_after(&both, &OpOutcome::Decoded { rc: 0 }, Some(3));
        assert!(m.resident(&obs(1, 4, &[4], None)).is_none());
    }

    #[test]
    fn a_hybrid_is_judged_when_both_parts_agree_and_a_refused_removal_keeps_both() {
        use crate::base::op::Arch;
        let mut m = TokenModel::after_setup(&arch_setup(Arch::Jamba));
        let all: Vec<Pos> = (0..7).collect();
        assert_eq!(m.resident(&obs(0, 6, &all, Some(&[6]))).unwrap().0.len(), 7);
        m.apply(&rm(0, 4, -1), &returned(false));
        assert_eq!(m.resident(&obs(0, 6, &all, Some(&[6]))).unwrap().0.len(), 7);
        // A partial copy: the attention part copies the range, the state all of it.
        m.apply(&cp(0, 1, 0, 3), &done());
        assert!(m.resident(&obs(1, 2, &[0, 1, 2], Some(&[6]))).is_none());
    }

    #[test]
    fn a_hybrid_decode_over_parts_that_differ_is_not_judged() {
        use crate::base::op::Arch;
        let mut m = TokenModel::after_setup(&arch_setup(Arch::Jamba));
        let ok = OpOutcome::Decoded { rc: 0 };
        // Seq 1 gets seq 0's state and no attention cell, then decodes 3 tokens at 0..2 (its
        // seq_pos_max is the smaller of the two parts': -1).
        m.apply(&cp(0, 1, 7, 8), &done());
        m.apply_after(&Op::Decode(Decode::next(1, 3)), &ok, Some(0));
        // Seq 2 decodes the same tokens from nothing; its state goes to seq 1, whose parts then
        // hold the same tokens at the same positions: still not judged, the attention rows of
        // seq 1 were computed over seq 0's state.
        let mut seq2 = TokenModel::after_setup(&arch_setup(Arch::Jamba));
        seq2.apply_after(&Op::Decode(Decode::next(2, 3)), &ok, Some(0));
        assert!(seq2.resident(&obs(2, 0, &[0, 1, 2], Some(&[2]))).is_some());
        m.apply_after(&Op::Decode(Decode::next(2, 3)), &ok, Some(0));
        m.apply(&cp(2, 1, 5, 6), &done());
        assert!(m.resident(&obs(1, 0, &[0, 1, 2], Some(&[2]))).is_none());
    }

    #[test]
    fn iswa_is_judged_while_the_windowed_cache_holds_the_lowest_position() {
        use crate::base::op::Arch;
        let m = TokenModel::after_setup(&arch_setup(Arch::Gemma2));
        let all: Vec<Pos> = (0..7).collect();
        assert!(m.resident(&obs(0, 0, &all, Some(&[3, 4, 5, 6]))).is_some());
        assert!(m.resident(&obs(0, 2, &all, Some(&[3, 4, 5, 6]))).is_none());
    }
}
