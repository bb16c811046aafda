//! Decode, metadata side: a batch's tokens, position resolution and the consistency checks of
//! `llama_batch_allocr::init` (src/llama-batch.cpp), slot search per stream and placement
//! (`apply_ubatch`).

use crate::cells::Cells;
use crate::{CellCache, DecodeError, Pos, SeqId};

/// One token of a decode batch: its position (or `None`: chosen like llama.cpp's batch allocator,
/// from `seq_pos_max + 1` of the token's first sequence) and the sequences it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchToken {
    /// The token id (only the tensor payload uses it).
    pub token: i32,
    /// Explicit position, or `None` for "next".
    pub pos: Option<Pos>,
    /// The sequences this token belongs to; the first one decides a "next" position.
    pub seqs: Vec<SeqId>,
}

impl CellCache {
    /// Resolves the positions of a batch: explicit ones as given, "next" ones from the position
    /// index of the token's first sequence, as `llama_batch_allocr::init` does when
    /// `batch.pos == NULL`.
    pub fn resolve_positions(&self, batch: &[BatchToken]) -> Result<Vec<Pos>, DecodeError> {
        let n_seq = self.config.n_seq_max as usize;
        let mut next: Vec<Pos> = (0..n_seq)
            .map(|s| self.index_of(s as SeqId).max() + 1)
            .collect();
        let mut out = Vec::with_capacity(batch.len());
        for (i, t) in batch.iter().enumerate() {
            let Some(&first) = t.seqs.first() else {
                return Err(DecodeError::InvalidBatch(format!(
                    "token {i} has no sequence"
                )));
            };
            for &s in &t.seqs {
                if s < 0 || s as usize >= n_seq {
                    return Err(DecodeError::InvalidBatch(format!(
                        "invalid seq_id[{i}] = {s} >= {n_seq}"
                    )));
                }
            }
            let p = t.pos.unwrap_or(next[first as usize]);
            for &s in &t.seqs {
                next[s as usize] = p + 1;
            }
            out.push(p);
        }
        Ok(out)
    }

    /// The consistency checks of `llama_batch_allocr::init` (src/llama-batch.cpp) for a batch
    /// whose positions are resolved.
    fn validate(&self, batch: &[BatchToken], pos: &[Pos]) -> Result<(), DecodeError> {
        let n_seq = self.config.n_seq_max as usize;
        let mut batch_pos: Vec<Vec<Pos>> = vec![Vec::new(); n_seq];
        let mut coupled = vec![0u64; n_seq];
        for (t, &p) in batch.iter().zip(pos) {
            let s0 = t.seqs[0];
            for (k, &s) in t.seqs.iter().enumerate() {
                batch_pos[s as usize].push(p);
                if k > 0 {
                    coupled[s as usize] |= 1u64 << s0;
                }
            }
        }
        for s in 0..n_seq {
            let ps = &mut batch_pos[s];
            if ps.is_empty() {
                continue;
            }
            let mut distinct = ps.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let (bmin, bmax) = (distinct[0], *distinct.last().unwrap());
            let p0 = self.index_of(s as SeqId).max();
            if p0 >= 0 && bmin != p0 + 1 {
                return Err(DecodeError::InvalidBatch(format!(
                    "inconsistent sequence positions for sequence {s}: last position in the cache \
                     X = {p0}, batch starts at Y = {bmin}, required Y = X + 1"
                )));
            }
            if (bmax - bmin + 1) as usize > distinct.len() {
                return Err(DecodeError::InvalidBatch(format!(
                    "sequence {s} positions are not continuous"
                )));
            }
        }
        for s0 in 0..n_seq {
            let mut bad = None;
            Cells::for_each_seq(coupled[s0], |s1| {
                let (a, b) = (self.index_of(s0 as SeqId), self.index_of(s1));
                if a.min() != b.min() || a.max() != b.max() {
                    bad = Some(s1);
                }
            });
            if let Some(s1) = bad {
                return Err(DecodeError::InvalidBatch(format!(
                    "sequence {s0} is coupled to {s1} in the input batch, but they have diverged"
                )));
            }
        }
        let mut cur_set = vec![u64::MAX; n_seq];
        let mut cur_pos = vec![-1; n_seq];
        for (t, &p) in batch.iter().zip(pos) {
            let set = t.seqs.iter().fold(0u64, |acc, &s| acc | (1u64 << s));
            for &s in &t.seqs {
                let s = s as usize;
                cur_set[s] &= set;
                if cur_set[s] == 0 {
                    return Err(DecodeError::InvalidBatch(format!(
                        "sequence {s} belongs to incompatible sequence sets"
                    )));
                }
                if p < cur_pos[s] {
                    return Err(DecodeError::InvalidBatch(format!(
                        "sequence {s} positions are decreasing"
                    )));
                }
                cur_pos[s] = p;
            }
        }
        Ok(())
    }

    /// `llama_decode` of a batch, metadata side: validate, find a slot in each stream the batch
    /// touches, place the tokens. Returns the cells used (numbered across streams), in batch
    /// order. On error the cache is unchanged. With a tensor payload the placed cells' rows are
    /// zeroed, to be written by the model ([`CellCache::write_rows`]) token by token in batch
    /// order.
    ///
    /// With one stream per sequence a token of several sequences cannot be placed
    /// (`split_equal(.., sequential = true)` refuses coupled sequences, `init_batch` fails to
    /// prepare): rc 1, as llama.cpp returns.
    pub fn decode(&mut self, batch: &[BatchToken]) -> Result<Vec<usize>, DecodeError> {
        if batch.is_empty() {
            return Err(DecodeError::InvalidBatch("n_tokens == 0".into()));
        }
        let pos = self.resolve_positions(batch)?;
        self.validate(batch, &pos)?;
        let idxs = if self.streams.len() == 1 {
            self.streams[0]
                .find_slot(batch.len())
                .ok_or(DecodeError::NoSlot)?
        } else {
            self.find_slots_per_stream(batch)?
        };
        for ((t, &p), &g) in batch.iter().zip(&pos).zip(&idxs) {
            let (s, i) = (g / self.size(), g % self.size());
            let cells = &mut self.streams[s].cells;
            cells.pos_set(i, p);
            for &q in &t.seqs {
                cells.seq_add(i, q);
            }
            if let Some(ts) = &mut self.tensors {
                ts.place(g, p);
            }
        }
        let n = self.size();
        for &g in &idxs {
            self.streams[g / n].head = (g % n) as u32 + 1;
        }
        // Shifts are applied at the next decode (llama_kv_cache::update); the metadata forgets them.
        for st in &mut self.streams {
            st.cells.shift.iter_mut().for_each(|s| *s = 0);
        }
        Ok(idxs)
    }

    /// The slots of a batch with one stream per sequence: each stream searches for its own
    /// tokens; all or nothing.
    #[inline(never)]
    fn find_slots_per_stream(&self, batch: &[BatchToken]) -> Result<Vec<usize>, DecodeError> {
        if batch.iter().any(|t| t.seqs.len() > 1) {
            return Err(DecodeError::NoSlot);
        }
        let mut out = vec![0usize; batch.len()];
        for s in 0..self.streams.len() {
            let mine: Vec<usize> = (0..batch.len())
                .filter(|&k| self.stream_of(batch[k].seqs[0]) == s)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let idxs = self.streams[s]
                .find_slot(mine.len())
                .ok_or(DecodeError::NoSlot)?;
            for (k, i) in mine.into_iter().zip(idxs) {
                out[k] = self.global(s, i);
            }
        }
        Ok(out)
    }
}
