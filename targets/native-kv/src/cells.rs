//! The cell metadata of one stream (`llama_kv_cells`, src/llama-kv-cells.h): positions,
//! pending shifts, sequence bitsets and the per-sequence position index; and the half-open
//! position ranges the ops take.

use crate::{Pos, SeqId};

/// Per-sequence position index: sorted (position, number of cells) pairs, the model of
/// `std::map<llama_pos, int> seq_pos[LLAMA_MAX_SEQ]` in llama-kv-cells.h.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PosIndex(Vec<(Pos, u32)>);

impl PosIndex {
    pub(crate) fn inc(&mut self, p: Pos) {
        match self.0.binary_search_by_key(&p, |e| e.0) {
            Ok(i) => self.0[i].1 += 1,
            Err(i) => self.0.insert(i, (p, 1)),
        }
    }

    /// Decrements the count of `p`. llama.cpp asserts that `p` is present; in release builds a
    /// missing entry is a no-op there too (`find` returns end and the decrement is skipped only
    /// by luck), so this model ignores it rather than corrupting memory.
    pub(crate) fn dec(&mut self, p: Pos) {
        if let Ok(i) = self.0.binary_search_by_key(&p, |e| e.0) {
            self.0[i].1 -= 1;
            if self.0[i].1 == 0 {
                self.0.remove(i);
            }
        }
    }

    pub(crate) fn min(&self) -> Pos {
        self.0.first().map_or(-1, |e| e.0)
    }

    pub(crate) fn max(&self) -> Pos {
        self.0.last().map_or(-1, |e| e.0)
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// Appends the index to a state key ([`crate::key`]): its length, then each entry.
    pub(crate) fn write_key(&self, out: &mut Vec<u8>) {
        crate::key::put_u32(out, self.0.len() as u32);
        for &(p, n) in &self.0 {
            crate::key::put_i32(out, p);
            crate::key::put_u32(out, n);
        }
    }
}

/// The cell metadata of one stream, as `llama_kv_cells`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cells {
    pub(crate) pos: Vec<Pos>,
    pub(crate) shift: Vec<Pos>,
    pub(crate) seq: Vec<u64>,
    /// Number of non-empty cells (`used.size()`).
    pub(crate) used: u32,
    /// One past the highest non-empty cell, so loops can stop early; cells beyond are empty, so
    /// this changes no result of a loop that skips empty cells.
    pub(crate) used_max_p1: u32,
    pub(crate) seq_pos: Vec<PosIndex>,
}

impl Cells {
    pub(crate) fn new(n: u32, n_seq: u32) -> Self {
        let n = n as usize;
        Cells {
            pos: vec![-1; n],
            shift: vec![0; n],
            seq: vec![0; n],
            used: 0,
            used_max_p1: 0,
            seq_pos: vec![PosIndex::default(); n_seq as usize],
        }
    }

    pub(crate) fn reset(&mut self) {
        let end = self.used_max_p1 as usize;
        self.pos[..end].fill(-1);
        self.shift[..end].fill(0);
        self.seq[..end].fill(0);
        self.used = 0;
        self.used_max_p1 = 0;
        self.seq_pos.iter_mut().for_each(PosIndex::clear);
    }

    pub(crate) fn is_empty(&self, i: usize) -> bool {
        self.pos[i] == -1
    }

    pub(crate) fn seq_has(&self, i: usize, s: SeqId) -> bool {
        self.seq[i] & (1u64 << s) != 0
    }

    pub(crate) fn for_each_seq(bits: u64, mut f: impl FnMut(SeqId)) {
        let mut b = bits;
        while b != 0 {
            let s = b.trailing_zeros() as SeqId;
            f(s);
            b &= b - 1;
        }
    }

    /// `seq_pos_rm`: drops cell `i` from the index of every sequence it holds.
    pub(crate) fn index_remove(&mut self, i: usize) {
        let p = self.pos[i];
        let seq_pos = &mut self.seq_pos;
        Self::for_each_seq(self.seq[i], |s| seq_pos[s as usize].dec(p));
    }

    /// `seq_pos_add`: adds cell `i` to the index of every sequence it holds.
    pub(crate) fn index_add(&mut self, i: usize) {
        let p = self.pos[i];
        let seq_pos = &mut self.seq_pos;
        Self::for_each_seq(self.seq[i], |s| seq_pos[s as usize].inc(p));
    }

    pub(crate) fn mark_empty(&mut self, i: usize) {
        self.pos[i] = -1;
        self.shift[i] = 0;
        self.seq[i] = 0;
        self.used -= 1;
        if i + 1 == self.used_max_p1 as usize {
            let mut end = i;
            while end > 0 && self.pos[end - 1] == -1 {
                end -= 1;
            }
            self.used_max_p1 = end as u32;
        }
    }

    /// `rm`: clears a non-empty cell.
    pub(crate) fn rm(&mut self, i: usize) {
        self.index_remove(i);
        self.mark_empty(i);
    }

    /// `seq_rm` of one cell holding `s`; true if the cell became empty.
    /// With `orphan` ([`Faults::orphan_cell`]) a cell that loses its last sequence stays used.
    pub(crate) fn seq_rm(&mut self, i: usize, s: SeqId, orphan: bool) -> bool {
        self.seq[i] &= !(1u64 << s);
        self.seq_pos[s as usize].dec(self.pos[i]);
        if self.seq[i] == 0 && !orphan {
            self.mark_empty(i);
            return true;
        }
        false
    }

    /// `seq_keep` of one cell; true if the cell became empty.
    pub(crate) fn seq_keep(&mut self, i: usize, s: SeqId) -> bool {
        if self.seq_has(i, s) {
            self.index_remove(i);
            self.seq[i] = 1u64 << s;
            self.seq_pos[s as usize].inc(self.pos[i]);
            return false;
        }
        if self.seq[i] != 0 {
            self.index_remove(i);
            self.mark_empty(i);
            return true;
        }
        false
    }

    /// `seq_add` of one cell (adds sequence `s` to it).
    pub(crate) fn seq_add(&mut self, i: usize, s: SeqId) {
        self.seq[i] |= 1u64 << s;
        self.seq_pos[s as usize].inc(self.pos[i]);
    }

    pub(crate) fn pos_set(&mut self, i: usize, p: Pos) {
        self.pos[i] = p;
        self.used += 1;
        self.used_max_p1 = self.used_max_p1.max(i as u32 + 1);
    }

    /// `pos_add`; true if the cell was pushed below 0 and removed (for every sequence in it).
    pub(crate) fn pos_add(&mut self, i: usize, d: Pos, reindex: bool) -> bool {
        if reindex {
            self.index_remove(i);
        }
        self.pos[i] += d;
        self.shift[i] += d;
        if self.pos[i] < 0 {
            // Removed for every sequence sharing the cell. Under the stale-index fault the
            // index keeps the old position.
            self.mark_empty(i);
            return true;
        }
        if reindex {
            self.index_add(i);
        }
        false
    }

    pub(crate) fn pos_div(&mut self, i: usize, d: i32) {
        let old = self.pos[i];
        self.index_remove(i);
        self.pos[i] /= d;
        self.shift[i] += old - self.pos[i];
        self.index_add(i);
    }
}

/// A position range with llama.h's open ends already resolved (`p0 < 0` means 0, `p1 < 0`
/// means unbounded), half-open `[p0, p1)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub(crate) p0: Pos,
    pub(crate) p1: Pos,
}

impl Span {
    pub(crate) fn new(p0: Pos, p1: Pos) -> Self {
        Span {
            p0: p0.max(0),
            p1: if p1 < 0 { Pos::MAX } else { p1 },
        }
    }

    pub(crate) fn contains(&self, p: Pos) -> bool {
        p >= self.p0 && p < self.p1
    }

    /// The off-by-one fault's inclusive end.
    pub(crate) fn contains_inclusive(&self, p: Pos) -> bool {
        p >= self.p0 && (p < self.p1 || (self.p1 != Pos::MAX && p == self.p1))
    }
}
