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

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::base::op::{Op, Pos, SeqId, Setup, Slot};
use crate::base::target::OpOutcome;

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

/// What a state buffer of the trial holds, as far as the model knows.
#[derive(Clone, Debug)]
enum Saved {
    /// A sequence's tokens (`llama_state_seq_get_data`).
    Seq(SeqTokens),
    /// Every sequence's (`llama_state_get_data`).
    Whole(BTreeMap<SeqId, SeqTokens>),
    /// Something the model cannot load back (a failed save, a save with flags).
    Unknown,
}

/// The token model of one trial (see the module docs).
#[derive(Clone, Debug)]
pub struct TokenModel {
    unified: bool,
    /// Sequences not listed hold nothing.
    seqs: BTreeMap<SeqId, SeqTokens>,
    /// Every sequence not listed in `seqs` is unknown too (after a failed whole load).
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
            seqs: BTreeMap::new(),
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

    fn forget_all(&mut self) {
        self.seqs.clear();
        self.all_unknown = true;
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
            Op::Clear => {
                self.seqs.clear();
                self.all_unknown = false;
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
            Op::StateSeqSave { seq, slot, flags } => {
                let saved = if *flags == 0
                    && *outcome
                        == (OpOutcome::Done {
                            returned: Some(true),
                        }) {
                    Saved::Seq(self.get(*seq))
                } else {
                    Saved::Unknown
                };
                self.slots.insert(slot.clone(), saved);
            }
            Op::StateSave { slot } => {
                let saved = if *outcome
                    == (OpOutcome::Done {
                        returned: Some(true),
                    })
                    && !self.all_unknown
                {
                    Saved::Whole(self.seqs.clone())
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
                let loaded = *outcome
                    == (OpOutcome::Done {
                        returned: Some(true),
                    });
                let now = match (clean && loaded, self.slots.get(slot)) {
                    (true, Some(Saved::Seq(Some(v)))) => {
                        let v = v.clone();
                        Some(
                            v.into_iter()
                                .map(|e| Entry {
                                    cell: self.fresh(),
                                    ..e
                                })
                                .collect(),
                        )
                    }
                    // A failed or damaged load: what the cache kept is not modelled.
                    _ => None,
                };
                self.set(*seq, now);
            }
            Op::StateLoad {
                slot,
                truncate,
                flip,
            } => {
                let clean = truncate.is_none() && flip.is_none();
                let loaded = *outcome
                    == (OpOutcome::Done {
                        returned: Some(true),
                    });
                match (clean && loaded, self.slots.get(slot)) {
                    (true, Some(Saved::Whole(all))) => {
                        self.seqs = all.clone();
                        self.all_unknown = false;
                    }
                    _ => self.forget_all(),
                }
            }
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

    /// The tokens of `seq` by position, when a fresh decode of them would give the K/V the cache
    /// holds (see the module docs) and they sit exactly at `cells` (the positions the target's
    /// own dump lists); `None` otherwise: the sequence cannot be judged. The flag says whether
    /// any of them was moved by `seq_add`/`seq_div` (re-rotated keys: a looser tolerance).
    pub fn resident(&self, seq: SeqId, cells: &[Pos]) -> Option<(Vec<(Pos, Token)>, bool)> {
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
        m.resident(0, cells).map(|(v, _)| v)
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
        assert_eq!(m.resident(0, &(3..10).collect::<Vec<_>>()).unwrap().1, true);
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
        assert!(m.resident(1, &moved).is_some());
        let mut m = TokenModel::after_setup(&setup(false));
        m.apply(&cp, &done());
        m.apply(&add, &done());
        assert!(m.resident(1, &(0..7).collect::<Vec<_>>()).is_some());
        assert!(m.resident(0, &moved).is_some());
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
        assert_eq!(m.resident(1, &all).map(|(v, _)| v), seq0(&m, &all));
        m.apply(
            &load(Some(10)),
            &OpOutcome::Done {
                returned: Some(false),
            },
        );
        assert!(m.resident(1, &[]).is_none());
        m.apply(&Op::Clear, &done());
        assert_eq!(m.resident(1, &[]), Some((Vec::new(), false)));
    }
}
