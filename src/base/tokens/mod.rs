//! The token model: which token the harness decoded at each (sequence, position), carried through
//! every op of a trial, and what each token attended to when it was decoded.
//!
//! The cache-invisible oracle ([`crate::running::probe`]) compares a sequence's next-token logits
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
//!   does too. A decode into several sequences is judged when they held the same state. With a
//!   rollback depth (`n_rs_seq` > 0), a partial `seq_rm` that llama.cpp accepted as a rollback
//!   (its range starts after 0, at most `n_rs_seq` tokens back, and runs past the state's
//!   position) leaves the state of the kept tokens: what llama.h's "true" promises, and what the
//!   rollback oracle judges ([`TokenModel::rolled_back`]).
//! - **hybrid_iswa**: the hybrid rules over the base cells and the states, and a sequence is
//!   judged only when the windowed dump holds every base position its mask keeps: the
//!   accessors, the parts' intersection, no longer show the windowed cache's own minimum.
//! - **hybrid**: both models, attention for the attention cache and recurrent for the states; a
//!   refused `seq_rm` changes neither part (`llama_memory_hybrid::seq_rm` asks the recurrent
//!   memory first); a sequence is judged when both parts hold the same tokens at the same
//!   positions, and a decode into a sequence whose parts differed leaves it unjudged for as long
//!   as those tokens stay (its attention rows and state came from mixed inputs).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::base::cache::{OpOutcome, SeqObservation};
use crate::base::op::{MemoryType, Op, OpKind, Pos, SeqId, Setup, Slot};

mod recurrent;

/// A token id, as `llama_token`.
pub type Token = i32;

/// The token every probe decodes (below 64: inside the generated tiny models' vocabulary); the
/// probes themselves drive targets, in `running/probe.rs`.
pub const PROBE_TOKEN: Token = 5;

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
    /// The window of the windowed layers (`Arch::swa_window`), if any.
    n_swa: Option<u32>,
    n_seq_max: u32,
    /// The recurrent rollback depth (`n_rs_seq`): how many tokens a partial `seq_rm` may take
    /// back from a state.
    n_rs_seq: u32,
    /// The sequences whose recurrent state came back from a rollback (an accepted partial
    /// `seq_rm`) since it was last emptied: the rollback oracle judges their probes.
    rolled_back: BTreeSet<SeqId>,
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
            n_swa: setup.arch.swa_window(),
            n_seq_max: setup.n_seq_max,
            n_rs_seq: setup.n_rs_seq,
            rolled_back: BTreeSet::new(),
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
                Op::SeqRm { .. }
                | Op::StateSeqSave { .. }
                | Op::StateSave { .. }
                | Op::StateSeqLoad { .. }
                | Op::StateLoad { .. } => OpOutcome::Done {
                    returned: Some(true),
                },
                Op::SeqCp { .. }
                | Op::SeqKeep { .. }
                | Op::SeqAdd { .. }
                | Op::SeqDiv { .. }
                | Op::Clear => OpOutcome::Done { returned: None },
            };
            m.apply(op, &outcome);
        }
        m
    }

    fn fresh(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The same tokens (the same K/V content) in new cells of their own: a cross-stream copy or
    /// a load, which share no cell with where the tokens came from.
    fn in_new_cells(&mut self, v: Vec<Entry>) -> Vec<Entry> {
        v.into_iter()
            .map(|e| Entry {
                cell: self.fresh(),
                ..e
            })
            .collect()
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
        self.rolled_back.clear();
        self.seqs.clear();
        self.states.clear();
        self.all_unknown = true;
    }

    fn clear_all(&mut self) {
        self.rolled_back.clear();
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
        self.memory.has_states()
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
        let refused_rm = op.kind() == OpKind::SeqRm
            && *outcome
                == (OpOutcome::Done {
                    returned: Some(false),
                });
        // llama_memory_hybrid::seq_rm asks the recurrent memory first and leaves both parts as
        // they were when it refuses (src/llama-memory-hybrid.cpp:143-150).
        if self.memory.is_hybrid() && refused_rm {
            return;
        }
        match op {
            Op::StateSeqSave { .. }
            | Op::StateSave { .. }
            | Op::StateSeqLoad { .. }
            | Op::StateLoad { .. }
            | Op::Clear => self.apply_state_op(op, outcome),
            Op::SeqRm { .. }
            | Op::SeqCp { .. }
            | Op::SeqKeep { .. }
            | Op::SeqAdd { .. }
            | Op::SeqDiv { .. }
            | Op::Decode(_) => {
                // In a hybrid model each layer's input depends on the layers below it, recurrent
                // and attention alike: a token decoded while a sequence's state and attention
                // cells held different tokens has rows and a state no fresh decode gives.
                let mixed = op.as_decode().is_some_and(|d| {
                    self.memory.is_hybrid() && d.seqs.iter().any(|&s| !self.parts_agree(s))
                });
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
                    let copied = from.map(|v| self.in_new_cells(v));
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
                // A load gives the sequence a state from bytes, and resets its pending rollback
                // (`set_rs_idx(seq_id, 0)` in `state_read`).
                self.rolled_back.remove(seq);
                let clean = *flags == 0 && truncate.is_none() && flip.is_none();
                let (cells, state) = match (clean && done, self.slots.get(slot)) {
                    (true, Some(Saved::Seq(v, state))) => {
                        let (v, state) = (v.clone(), state.clone());
                        let cells = v.map(|v| self.in_new_cells(v));
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
                self.rolled_back.clear();
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
            // The memory ops and decodes: apply_after sends them to the parts.
            Op::SeqRm { .. }
            | Op::SeqCp { .. }
            | Op::SeqKeep { .. }
            | Op::SeqAdd { .. }
            | Op::SeqDiv { .. }
            | Op::Decode(_) => {}
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
            // MSA: both caches take every op alike; the K/V cache's cells are the sequence's
            // (the indexer cache's are judged by msa-sync).
            MemoryType::Kv | MemoryType::Msa => self.attention_resident(obs.seq, &obs.cells),
            // dsv4: the raw pair's base cache holds every cell (its windowed cache drops the old
            // ones, and `seq_pos_min` answers `seq_pos_max`, llama-kv-cache-dsv4.cpp:1555-1564);
            // partial removals are refused (:1462-1513), so the cells are the prefix the
            // compressed state was built from.
            MemoryType::Dsv4 => self.attention_resident(obs.seq, &obs.cells),
            // DSA: the same pair (the MLA cache answers the accessors, llama-kv-cache-dsa.cpp:89-95).
            MemoryType::Dsa => self.attention_resident(obs.seq, &obs.cells),
            MemoryType::Iswa => {
                // The windowed cache (which answers seq_pos_min) must still hold the lowest base
                // position: it loses cells only as a prefix.
                if obs.cells.first().is_some_and(|&p| p != obs.pos_min) {
                    return None;
                }
                self.attention_resident(obs.seq, &obs.cells)
            }
            MemoryType::DsaIswa => {
                // The windowed cache answers the accessors (llama-kv-cache-dsa-iswa.cpp:112-119):
                // the iswa rule; and the indexer key cache (the third part) must hold the MLA
                // cache's cells, or the sequence's top-k selection is not a fresh decode's
                // (contract judges the indexer cache).
                if obs.cells.first().is_some_and(|&p| p != obs.pos_min)
                    || obs.third_cells.as_deref()? != obs.cells.as_slice()
                {
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
            MemoryType::HybridIdx => {
                // The indexer key cache mirrors the attention cache cell for cell (the graph
                // asserts it, src/models/qwen4exp.cpp:421); a sequence whose two caches differ
                // is not vouched for (contract judges the indexer cache).
                if obs.second_cells.as_deref()? != obs.cells.as_slice() {
                    return None;
                }
                let attention = self.attention_resident(obs.seq, &obs.cells)?;
                let state = self.state_resident(obs.seq, obs.third_cells.as_deref()?)?;
                (attention.0 == state.0).then_some(attention)
            }
            MemoryType::HybridIswa => {
                // The accessors are the intersection of the parts' ranges, so they do not show
                // the windowed cache's own minimum (the iswa rule above): the windowed dump must
                // hold every base position its mask keeps (`max - p < n_swa`,
                // src/llama-kv-cache.cpp:2100 in 0.1.161), or the windowed cache lost a cell a
                // token of the window attends.
                let windowed = obs.second_cells.as_deref()?;
                let n_swa = Pos::try_from(self.n_swa?).ok()?;
                let max = *obs.cells.last()?;
                if !obs
                    .cells
                    .iter()
                    .filter(|&&p| max - p < n_swa)
                    .eq(windowed.iter())
                {
                    return None;
                }
                let attention = self.attention_resident(obs.seq, &obs.cells)?;
                let state = self.state_resident(obs.seq, obs.third_cells.as_deref()?)?;
                (attention.0 == state.0).then_some(attention)
            }
        }
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
mod tests;
