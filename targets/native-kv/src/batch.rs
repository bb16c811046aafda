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

/// What batch validation reads of a memory: how many sequences it takes and each one's
/// `(seq_pos_min, seq_pos_max)` as the memory answers them (`llama_batch_allocr::init` is given
/// the memory and asks it, src/llama-batch.cpp).
pub trait SeqRanges {
    /// Sequences `0..n_seq()` are valid.
    fn n_seq(&self) -> usize;
    /// `(seq_pos_min, seq_pos_max)` of sequence `s` (in range), -1 each when empty.
    fn seq_range(&self, s: SeqId) -> (Pos, Pos);
    /// Whether a batch's positions may jump forward past `seq_pos_max + 1`: a memory of an
    /// M-RoPE model, for which `llama_batch_allocr::init` asks only X < Y and no continuity
    /// (src/llama-batch.cpp:347-378 in 0.1.161; the `Y = X + 1` and continuity checks are the
    /// other branch, :379-411).
    fn positions_may_jump(&self) -> bool {
        false
    }
}

impl SeqRanges for CellCache {
    fn n_seq(&self) -> usize {
        self.config.n_seq_max as usize
    }

    fn seq_range(&self, s: SeqId) -> (Pos, Pos) {
        let i = self.index_of(s);
        (i.min(), i.max())
    }
}

/// The positions of a valid batch (`llama_batch_allocr::init`) for memory `m`.
pub fn check_batch<M: SeqRanges + ?Sized>(
    m: &M,
    batch: &[BatchToken],
) -> Result<Vec<Pos>, DecodeError> {
    if batch.is_empty() {
        return Err(DecodeError::InvalidBatch("n_tokens == 0".into()));
    }
    let pos = resolve_positions(m, batch)?;
    validate(m, batch, &pos)?;
    Ok(pos)
}

/// Resolves the positions of a batch: explicit ones as given, "next" ones from the position
/// index of the token's first sequence, as `llama_batch_allocr::init` does when
/// `batch.pos == NULL`.
pub fn resolve_positions<M: SeqRanges + ?Sized>(
    m: &M,
    batch: &[BatchToken],
) -> Result<Vec<Pos>, DecodeError> {
    let n_seq = m.n_seq();
    let mut next: Vec<Pos> = (0..n_seq).map(|s| m.seq_range(s as SeqId).1 + 1).collect();
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
pub(crate) fn validate<M: SeqRanges + ?Sized>(
    m: &M,
    batch: &[BatchToken],
    pos: &[Pos],
) -> Result<(), DecodeError> {
    let n_seq = m.n_seq();
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
    for (s, ps) in batch_pos.iter().enumerate() {
        if ps.is_empty() {
            continue;
        }
        let mut distinct = ps.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let (bmin, bmax) = (distinct[0], *distinct.last().unwrap());
        let p0 = m.seq_range(s as SeqId).1;
        if m.positions_may_jump() {
            if p0 >= 0 && p0 >= bmin {
                return Err(DecodeError::InvalidBatch(format!(
                    "inconsistent sequence positions for sequence {s}: last position in the \
                     cache X = {p0}, batch starts at Y = {bmin}, required X < Y (M-RoPE)"
                )));
            }
            continue;
        }
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
    for (s0, &with) in coupled.iter().enumerate() {
        let mut bad = None;
        Cells::for_each_seq(with, |s1| {
            if m.seq_range(s0 as SeqId) != m.seq_range(s1) {
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

impl CellCache {
    /// `llama_decode` of a batch, metadata side: validate, find a slot in each stream the batch
    /// touches, place the tokens. Returns the cells used (numbered across streams), in batch
    /// order. On error the cache is unchanged. With a tensor payload the placed cells' rows are
    /// zeroed, to be written by the model ([`CellCache::write_rows`]) token by token in batch
    /// order.
    ///
    /// With one stream per sequence a token of several sequences cannot be placed
    /// (`split_equal(.., sequential = true)` refuses coupled sequences, `init_batch` fails to
    /// prepare): rc 1, as llama.cpp returns.
    ///
    /// The whole batch is one ubatch here: llama.cpp splits a batch longer than `n_ubatch` and
    /// searches slots ubatch by ubatch, which places the same tokens, but in a windowed cache may
    /// reuse different cells.
    pub fn decode(&mut self, batch: &[BatchToken]) -> Result<Vec<usize>, DecodeError> {
        let pos = check_batch(self, batch)?;
        let idxs = self.find_slots(batch)?;
        self.place(batch, &pos, &idxs);
        self.forget_shifts();
        Ok(idxs)
    }

    /// Shifts are applied at the next decode (`llama_kv_cache::update`); the metadata forgets
    /// them.
    pub(crate) fn forget_shifts(&mut self) {
        for st in &mut self.streams {
            st.cells.shift.iter_mut().for_each(|s| *s = 0);
        }
    }

    /// The cells a batch goes to (`find_slot`), numbered across streams.
    pub(crate) fn find_slots(&self, batch: &[BatchToken]) -> Result<Vec<usize>, DecodeError> {
        if self.streams.len() == 1 {
            self.streams[0]
                .find_slot(batch.len(), self.slot_window())
                .ok_or(DecodeError::NoSlot)
        } else {
            self.find_slots_per_stream(batch)
        }
    }

    /// `apply_ubatch` (src/llama-kv-cache.cpp:1115-1205 in 0.1.161): the tokens take the cells
    /// `idxs` at `pos`. A windowed cache may overwrite a cell: then every position of that cell's
    /// sequence up to the largest one overwritten is purged (`seq_rm(s, seq_pos_min,
    /// max + 1)`, :1183-1197), so each sequence keeps an unbroken range of positions.
    pub(crate) fn place(&mut self, batch: &[BatchToken], pos: &[Pos], idxs: &[usize]) {
        let mut overwritten: Vec<(SeqId, Pos)> = Vec::new();
        for ((t, &p), &g) in batch.iter().zip(pos).zip(idxs) {
            let (s, i) = (g / self.size(), g % self.size());
            let cells = &mut self.streams[s].cells;
            if !cells.is_empty(i) {
                let q = cells.seq[i].trailing_zeros() as SeqId;
                match overwritten.iter_mut().find(|(s, _)| *s == q) {
                    Some(e) => e.1 = e.1.max(cells.pos[i]),
                    None => overwritten.push((q, cells.pos[i])),
                }
                cells.rm(i);
            }
            cells.pos_set(i, p);
            for &q in &t.seqs {
                cells.seq_add(i, q);
            }
            if let Some(ts) = &mut self.tensors {
                ts.place(g, p);
            }
        }
        overwritten.sort_unstable();
        for (q, max_rm) in overwritten {
            let min = self.index_of(q).min();
            if min >= 0 && min <= max_rm {
                self.seq_rm(q, min, max_rm + 1)
                    .expect("a sequence of this cache");
            }
        }
        let n = self.size();
        for &g in idxs {
            self.streams[g / n].head = (g % n) as u32 + 1;
        }
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
                .find_slot(mine.len(), self.slot_window())
                .ok_or(DecodeError::NoSlot)?;
            for (k, i) in mine.into_iter().zip(idxs) {
                out[k] = self.global(s, i);
            }
        }
        Ok(out)
    }
}
