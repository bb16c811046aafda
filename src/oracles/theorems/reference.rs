//! The reference a trace is judged against: the memory ops replayed on a plain list of entries
//! keyed by absolute position (no cells, no slots, no heads, no indices), with, optionally, the
//! reference model computing each decoded token's rows over that list.
//!
//! Each entry is one decoded token: its id, token, current position, sequence set, the position it
//! was decoded at and the entries it attended then (its *context*, with their positions at that
//! time). With a model, it also holds its pre-RoPE K, K and V per layer: K is computed by
//! [`Model::forward_token`] at decode and re-derived as one rotation of the pre-RoPE K whenever the
//! entry moves (`seq_add`, `seq_div`): the definition T2 holds a cache to. Attention reads the
//! entries of the token's first sequence at positions `<=` its own, in (position, id) order, under
//! the model's window by [`key_visible`] (the `-inf` mask of the cacheless
//! [`Model::forward_sequence`]).
//!
//! The provenance alone (no model) answers "is this sequence what a fresh prefill of its tokens
//! would hold?" ([`fresh_prefill_partner`]): the partner traces of T2 and T3.

use std::collections::BTreeSet;

use thiserror::Error;

use crate::base::op::{Decode, Op, Pos, SeqId, Setup, Trace};
use crate::model::forward::{key_visible, KvEntry, KvStore, Model};
use crate::model::rope::rope_rotated;

use super::{CellRows, SeqRows};

/// Why the reference does not apply or follow an op.
///
/// Never an exit code: a trace the reference cannot follow is a structural mismatch in the
/// measurement, and one it deems invalid derives no partner.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ReferenceError {
    /// A sequence id outside `0..n_seq_max`.
    #[error("invalid sequence id {0}")]
    InvalidSeq(SeqId),
    /// A decode that names no sequence.
    #[error("a decode with no sequence")]
    NoSequence,
    /// A batch that does not continue a sequence at its largest position + 1.
    #[error("sequence {seq} is at {max}, the batch starts at {start}")]
    NotContinuing {
        /// The sequence.
        seq: SeqId,
        /// Its largest position.
        max: Pos,
        /// Where the batch starts.
        start: Pos,
    },
    /// Sequences coupled in one token whose positions differ.
    #[error("sequences {0:?} are coupled but have diverged")]
    Diverged(Vec<SeqId>),
    /// A negative token id.
    #[error("a negative token id")]
    NegativeToken,
    /// More tokens than the context holds.
    #[error("the batch does not fit the context")]
    DoesNotFit,
    /// A state save or load: the theorems' reference model has no serialized form.
    #[error("state save/load ops are outside the theorems' reference model")]
    StateOp,
    /// `seq_div` by 0.
    #[error("seq_div by 0")]
    DivByZero,
    /// A token outside the model's vocabulary.
    #[error("token {0} is outside the vocabulary")]
    OutsideVocabulary(i32),
}

/// One layer's rows of an entry.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryRows {
    /// K before RoPE.
    pub k_raw: Vec<f32>,
    /// K rotated to the entry's current position.
    pub k: Vec<f32>,
    /// V.
    pub v: Vec<f32>,
}

/// One decoded token.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Decode order, from 0.
    pub id: u64,
    /// The token.
    pub token: u32,
    /// Current position.
    pub pos: Pos,
    /// Sequence bitset.
    pub seqs: u64,
    /// The position it was decoded at.
    pub decode_pos: Pos,
    /// The entries it attended at decode (itself included), as (id, position then), sorted.
    pub context: Vec<(u64, Pos)>,
    /// Rows per layer (empty without a model).
    pub rows: Vec<EntryRows>,
}

impl Entry {
    fn has(&self, s: SeqId) -> bool {
        self.seqs & (1u64 << s) != 0
    }
}

/// The reference state: a list of entries, and the logits of the last decoded token.
#[derive(Clone, Debug)]
pub struct Reference<'m> {
    model: Option<&'m Model>,
    n_ctx: u32,
    n_seq_max: u32,
    entries: Vec<Entry>,
    next_id: u64,
    last_logits: Option<Vec<f32>>,
}

fn span(p0: Pos, p1: Pos) -> (Pos, Pos) {
    (p0.max(0), if p1 < 0 { Pos::MAX } else { p1 })
}

fn in_span((p0, p1): (Pos, Pos), p: Pos) -> bool {
    p >= p0 && p < p1
}

/// [`KvStore`] over the reference entries for the token being decoded (`cur`).
struct EntryKv<'e> {
    entries: &'e mut Vec<Entry>,
    cur: usize,
    seq: SeqId,
}

impl KvStore for EntryKv<'_> {
    fn append(&mut self, layer: usize, _pos: i32, k_raw: &[f32], k_rotated: &[f32], v: &[f32]) {
        let rows = &mut self.entries[self.cur].rows;
        assert_eq!(rows.len(), layer, "layers are appended in order");
        rows.push(EntryRows {
            k_raw: k_raw.to_vec(),
            k: k_rotated.to_vec(),
            v: v.to_vec(),
        });
    }

    fn visible<'a>(
        &'a self,
        layer: usize,
        query_pos: i32,
        window: Option<u32>,
    ) -> Box<dyn Iterator<Item = KvEntry<'a>> + 'a> {
        let mut seen: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| {
                e.has(self.seq) && e.rows.len() > layer && key_visible(e.pos, query_pos, window)
            })
            .collect();
        seen.sort_by_key(|e| (e.pos, e.id));
        Box::new(seen.into_iter().map(move |e| KvEntry {
            pos: e.pos,
            k: &e.rows[layer].k,
            v: &e.rows[layer].v,
        }))
    }
}

impl<'m> Reference<'m> {
    /// An empty reference shaped like `setup` (its ops are not applied: see [`Reference::apply`]),
    /// computing rows with `model` when given.
    pub fn new(setup: &Setup, model: Option<&'m Model>) -> Self {
        Reference {
            model,
            n_ctx: setup.n_ctx,
            n_seq_max: setup.n_seq_max.min(64),
            entries: Vec::new(),
            next_id: 0,
            last_logits: None,
        }
    }

    /// The entries.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The logits of the last decoded token.
    pub fn last_logits(&self) -> Option<&[f32]> {
        self.last_logits.as_deref()
    }

    /// The entries of `seq`, in position order.
    pub fn seq_entries(&self, seq: SeqId) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self.entries.iter().filter(|e| e.has(seq)).collect();
        v.sort_by_key(|e| (e.pos, e.id));
        v
    }

    /// The rows of `seq`, as a target's serialized state shows them.
    pub fn seq_rows(&self, seq: SeqId) -> SeqRows {
        let n_layer = self.model.map_or(0, |m| m.hparams().n_layer);
        let cells = self
            .seq_entries(seq)
            .into_iter()
            .map(|e| CellRows {
                pos: e.pos,
                k: e.rows.iter().map(|r| r.k.clone()).collect(),
                v: e.rows.iter().map(|r| r.v.clone()).collect(),
            })
            .collect();
        SeqRows::new(seq, n_layer, cells)
    }

    fn seq_ok(&self, s: SeqId) -> Result<(), ReferenceError> {
        if s < 0 || s as u32 >= self.n_seq_max {
            return Err(ReferenceError::InvalidSeq(s));
        }
        Ok(())
    }

    fn max_pos(&self, s: SeqId) -> Pos {
        self.entries
            .iter()
            .filter(|e| e.has(s))
            .map(|e| e.pos)
            .max()
            .unwrap_or(-1)
    }

    /// The positions a decode's tokens take: explicit ones as given, "next" ones from the largest
    /// position of the token's first sequence (as llama.cpp's batch allocator).
    pub fn resolve(&self, d: &Decode) -> Result<Vec<Pos>, ReferenceError> {
        let first = *d.seqs.first().ok_or(ReferenceError::NoSequence)?;
        for &s in &d.seqs {
            self.seq_ok(s)?;
        }
        let start = d.pos.unwrap_or(self.max_pos(first) + 1);
        Ok((0..d.n as Pos).map(|i| start + i).collect())
    }

    /// Applies `op` if the reference deems it valid; `Err` says why not (then nothing changed).
    /// Decodes are checked as llama.cpp's batch allocator does for the batches a [`Decode`] can
    /// express: every sequence of the batch continues at its largest position + 1, sequences
    /// coupled in one token have not diverged, token ids are not negative, and the batch fits the
    /// context. (Judging a target, use [`Reference::follow`], which trusts its outcome.)
    pub fn apply(&mut self, op: &Op) -> Result<(), ReferenceError> {
        if let Op::Decode(d) = op {
            let pos = self.resolve(d)?;
            for &s in &d.seqs {
                let max = self.max_pos(s);
                if max >= 0 && pos[0] != max + 1 {
                    return Err(ReferenceError::NotContinuing {
                        seq: s,
                        max,
                        start: pos[0],
                    });
                }
            }
            // llama_batch_allocr::init: sequences coupled in one token must not have diverged.
            let extent = |s: SeqId| {
                let ps = self.entries.iter().filter(|e| e.has(s)).map(|e| e.pos);
                (ps.clone().min(), ps.max())
            };
            if d.seqs.iter().any(|&s| extent(s) != extent(d.seqs[0])) {
                return Err(ReferenceError::Diverged(d.seqs.clone()));
            }
            if d.token_ids().iter().any(|&t| t < 0) {
                return Err(ReferenceError::NegativeToken);
            }
            if self.entries.len() + pos.len() > self.n_ctx as usize {
                return Err(ReferenceError::DoesNotFit);
            }
        }
        self.follow(op)
    }

    /// Applies `op` as a target reported it took effect; `Err` when it cannot be followed (an
    /// invalid sequence id, a token outside the model's vocabulary).
    pub fn follow(&mut self, op: &Op) -> Result<(), ReferenceError> {
        match *op {
            Op::SeqRm { seq, p0, p1 } => {
                if seq != -1 {
                    self.seq_ok(seq)?;
                }
                let r = span(p0, p1);
                self.entries.retain_mut(|e| {
                    if !in_span(r, e.pos) {
                        return true;
                    }
                    if seq == -1 {
                        return false;
                    }
                    e.seqs &= !(1u64 << seq);
                    e.seqs != 0
                });
            }
            Op::SeqCp { src, dst, p0, p1 } => {
                self.seq_ok(src)?;
                self.seq_ok(dst)?;
                let r = span(p0, p1);
                for e in &mut self.entries {
                    if e.has(src) && in_span(r, e.pos) {
                        e.seqs |= 1u64 << dst;
                    }
                }
            }
            Op::SeqKeep { seq } => {
                self.seq_ok(seq)?;
                self.entries.retain_mut(|e| {
                    let keep = e.has(seq);
                    e.seqs = 1u64 << seq;
                    keep
                });
            }
            Op::SeqAdd { seq, p0, p1, delta } => {
                self.seq_ok(seq)?;
                self.move_entries(seq, span(p0, p1), |p| p + delta);
            }
            Op::SeqDiv { seq, p0, p1, d } => {
                self.seq_ok(seq)?;
                if d == 0 {
                    return Err(ReferenceError::DivByZero);
                }
                self.move_entries(seq, span(p0, p1), |p| p / d);
            }
            Op::Clear => self.entries.clear(),
            Op::Decode(ref d) => self.decode(d)?,
            Op::StateSeqSave { .. }
            | Op::StateSeqLoad { .. }
            | Op::StateSave { .. }
            | Op::StateLoad { .. } => return Err(ReferenceError::StateOp),
        }
        Ok(())
    }

    /// Moves the entries of `seq` in `r` to `to(pos)`; one pushed below 0 is removed for every
    /// sequence (as llama.cpp's `pos_add`), the others get K re-rotated once from their raw K.
    fn move_entries(&mut self, seq: SeqId, r: (Pos, Pos), to: impl Fn(Pos) -> Pos) {
        let hp = self.model.map(|m| m.hparams().clone());
        self.entries.retain_mut(|e| {
            if !e.has(seq) || !in_span(r, e.pos) {
                return true;
            }
            e.pos = to(e.pos);
            if e.pos < 0 {
                return false;
            }
            if let Some(hp) = &hp {
                for rows in &mut e.rows {
                    rows.k = rope_rotated(
                        &rows.k_raw,
                        hp.n_head_kv,
                        hp.head_dim,
                        e.pos,
                        hp.rope_freq_base,
                    );
                }
            }
            true
        });
    }

    fn decode(&mut self, d: &Decode) -> Result<(), ReferenceError> {
        let pos = self.resolve(d)?;
        let tokens = d.token_ids();
        let first = d.seqs[0];
        let seqs = d.seqs.iter().fold(0u64, |acc, &s| acc | (1u64 << s));
        if let Some(m) = self.model {
            if let Some(t) = tokens
                .iter()
                .find(|&&t| t < 0 || t as usize >= m.hparams().n_vocab)
            {
                return Err(ReferenceError::OutsideVocabulary(*t));
            }
        }
        for (&token, &p) in tokens.iter().zip(&pos) {
            let id = self.next_id;
            self.next_id += 1;
            let mut context: Vec<(u64, Pos)> = self
                .entries
                .iter()
                .filter(|e| e.has(first) && e.pos <= p)
                .map(|e| (e.id, e.pos))
                .collect();
            context.push((id, p));
            context.sort_unstable();
            self.entries.push(Entry {
                id,
                token: token as u32,
                pos: p,
                seqs,
                decode_pos: p,
                context,
                rows: Vec::new(),
            });
            if let Some(m) = self.model {
                let cur = self.entries.len() - 1;
                let mut kv = EntryKv {
                    entries: &mut self.entries,
                    cur,
                    seq: first,
                };
                self.last_logits = Some(m.forward_token(token as u32, p, &mut kv));
            }
        }
        Ok(())
    }
}

/// A fresh-prefill partner of `trace` for `seq`: a trace that, from an empty cache, decodes the
/// tokens `seq` holds at the end of `trace` at the same positions, in one batch. `Some` only when
/// equality must hold: the trace replays validly, `seq`'s positions are contiguous and distinct,
/// every entry sits where it was decoded, and every entry attended, when it was decoded, exactly
/// the entries of `seq` at or before its position, at the positions they hold now. (By induction
/// over positions, each entry then has the same rows as in the fresh prefill, under any window.)
/// T2's never-saw partner and T3's recompute partner are both this.
pub fn fresh_prefill_partner(trace: &Trace, seq: SeqId) -> Option<Trace> {
    let mut r = Reference::new(&trace.setup, None);
    for op in trace.setup.ops.iter().chain(&trace.ops) {
        r.apply(op).ok()?;
    }
    let entries = r.seq_entries(seq);
    let first = entries.first()?.pos;
    let mut seen: BTreeSet<(u64, Pos)> = BTreeSet::new();
    for (i, e) in entries.iter().enumerate() {
        if e.pos != first + i as Pos || e.pos != e.decode_pos {
            return None;
        }
        seen.insert((e.id, e.pos));
        if !e.context.iter().copied().eq(seen.iter().copied()) {
            return None;
        }
    }
    let tokens: Vec<i32> = entries.iter().map(|e| e.token as i32).collect();
    Some(Trace {
        setup: Setup {
            ops: Vec::new(),
            ..trace.setup.clone()
        },
        ops: vec![Op::Decode(Decode {
            pos: (first != 0).then_some(first),
            ..Decode::tokens(seq, &tokens)
        })],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::GgufFile;
    use crate::model::tiny::{tiny_model_bytes, TinyModelSpec};

    fn model() -> Model {
        let bytes = tiny_model_bytes(&TinyModelSpec::default()).unwrap();
        Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
    }

    fn decode(seq: SeqId, tokens: &[i32]) -> Op {
        Op::Decode(Decode::tokens(seq, tokens))
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn reference_rows_equal_the_cacheless_forward() {
        let m = model();
        for w in [None, Some(3)] {
            let m = m.with_sliding_window(w);
            let mut r = Reference::new(&Setup::default(), Some(&m));
            r.apply(&decode(0, &[1, 17, 42])).unwrap();
            r.apply(&decode(0, &[5, 63, 8, 30])).unwrap();
            let tokens = [1, 17, 42, 5, 63, 8, 30];
            let logits = m.forward_sequence(&tokens, &(0..7).collect::<Vec<_>>());
            assert_eq!(
                bits(r.last_logits().unwrap()),
                bits(&logits[6]),
                "window {w:?}"
            );
        }
    }

    #[test]
    fn moved_entries_are_one_rotation_of_their_raw_key() {
        let m = model();
        let mut r = Reference::new(&Setup::default(), Some(&m));
        r.apply(&decode(0, &[1, 17, 42, 5, 63, 8, 30])).unwrap();
        r.apply(&Op::SeqRm {
            seq: 0,
            p0: 2,
            p1: 5,
        })
        .unwrap();
        r.apply(&Op::SeqAdd {
            seq: 0,
            p0: 5,
            p1: -1,
            delta: -3,
        })
        .unwrap();
        let hp = m.hparams();
        for e in r.seq_entries(0) {
            for rows in &e.rows {
                let k = rope_rotated(
                    &rows.k_raw,
                    hp.n_head_kv,
                    hp.head_dim,
                    e.pos,
                    hp.rope_freq_base,
                );
                assert_eq!(bits(&k), bits(&rows.k));
            }
        }
        assert_eq!(r.seq_rows(0).positions(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn fresh_prefill_partner_only_when_nothing_saw_the_span() {
        let trace = |ops: Vec<Op>| Trace {
            setup: Setup::default(),
            ops,
        };
        // Write-time eviction: the span is the tail, the survivors never saw it.
        let t = trace(vec![
            decode(0, &[1, 2, 3]),
            decode(0, &[4, 5]),
            Op::SeqRm {
                seq: 0,
                p0: 3,
                p1: 5,
            },
            decode(0, &[6]),
        ]);
        let p = fresh_prefill_partner(&t, 0).unwrap();
        assert_eq!(p.ops, vec![decode(0, &[1, 2, 3, 6])]);
        // Too late: token 6 attended the span before it went.
        let t = trace(vec![
            decode(0, &[1, 2, 3, 4, 5, 6]),
            Op::SeqRm {
                seq: 0,
                p0: 3,
                p1: 5,
            },
            Op::SeqAdd {
                seq: 0,
                p0: 5,
                p1: -1,
                delta: -2,
            },
        ]);
        assert_eq!(fresh_prefill_partner(&t, 0), None);
        // A prefix copied to another sequence, then a suffix there.
        let t = trace(vec![
            decode(0, &[1, 2, 3]),
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: -1,
            },
            decode(1, &[7, 8]),
        ]);
        assert_eq!(
            fresh_prefill_partner(&t, 1).unwrap().ops,
            vec![decode(1, &[1, 2, 3, 7, 8])]
        );
        // A decode the target would refuse (coupled sequences that diverged) derives nothing.
        let t = trace(vec![
            decode(0, &[1, 2]),
            decode(1, &[3]),
            Op::Decode(Decode {
                seqs: vec![0, 1],
                n: 1,
                pos: None,
                tokens: Some(vec![4]),
            }),
        ]);
        assert_eq!(fresh_prefill_partner(&t, 0), None);
        // A gap cannot be prefilled.
        let t = trace(vec![
            decode(0, &[1, 2, 3, 4]),
            Op::SeqRm {
                seq: 0,
                p0: 1,
                p1: 2,
            },
        ]);
        assert_eq!(fresh_prefill_partner(&t, 0), None);
    }
}
