//! The recurrent half of the token model: a recurrent state (a mamba memory, a hybrid memory's
//! recurrent part) is the ordered list of tokens it absorbed, and the ops move, copy, empty or
//! forget it as `llama_memory_recurrent` does (src/llama-memory-recurrent.cpp).

use std::sync::Arc;

use super::{empty_range, in_range, Token, TokenModel};
use crate::base::cache::OpOutcome;
use crate::base::op::{Op, Pos, SeqId};

impl TokenModel {
    /// The recurrent part of [`TokenModel::apply_after`] (llama-memory-recurrent.cpp, both pins:
    /// `seq_rm` :150/:168, `seq_cp`, `seq_keep`, `seq_add`, `seq_div`, `find_slot`).
    pub(super) fn apply_states(&mut self, op: &Op, outcome: &OpOutcome, next: Option<Pos>) {
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
            // A shift by 0 or a division by 1 moves nothing; clears, saves and loads go to
            // apply_state_op.
            Op::SeqAdd { .. }
            | Op::SeqDiv { .. }
            | Op::Clear
            | Op::StateSeqSave { .. }
            | Op::StateSeqLoad { .. }
            | Op::StateSave { .. }
            | Op::StateLoad { .. } => {}
        }
    }

    /// After a `seq_keep` the other sequences hold nothing, known or not before.
    pub(super) fn all_unknown_states_known(&mut self) {
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
    pub(super) fn shift_state(&mut self, seq: SeqId, p0: Pos, p1: Pos) {
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
    pub(super) fn decode_states(&mut self, d: &crate::base::op::Decode, next: Option<Pos>) {
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

    /// The tokens a recurrent state absorbed, when the state sits exactly at `cells` (the
    /// target's own dump: one cell at the last absorbed position, or none).
    pub(super) fn state_resident(
        &self,
        seq: SeqId,
        cells: &[Pos],
    ) -> Option<(Vec<(Pos, Token)>, bool)> {
        let v = self.get_state(seq)?;
        let at: Vec<Pos> = v.last().map(|&(p, _)| p).into_iter().collect();
        (at == cells).then(|| (Vec::clone(&v), false))
    }
}
