//! The memory operations of `llama_kv_cache` (src/llama-kv-cache.cpp): `clear`, `seq_rm`,
//! `seq_cp` (within and across streams), `seq_keep`, `seq_add`, `seq_div`.

use crate::cells::Span;
use crate::{CacheError, CellCache, Pos, SeqId};

impl CellCache {
    /// `llama_memory_clear`: empties every cell of every stream.
    pub fn clear(&mut self) {
        for st in &mut self.streams {
            st.cells.reset();
            st.head = 0;
        }
        if let Some(t) = &mut self.tensors {
            t.clear();
        }
    }

    /// `llama_memory_seq_rm`: removes `seq` (every sequence when -1, in every stream) from the
    /// cells of its stream whose position is in `[p0, p1)`. Always true for this cache type, as in
    /// llama.cpp. The rows of a cell it empties are dead: nothing reads an empty cell, and
    /// placement zeroes the rows again.
    pub fn seq_rm(&mut self, seq: SeqId, p0: Pos, p1: Pos) -> Result<bool, CacheError> {
        let faults = self.config.faults;
        let mut span = Span::new(p0, p1);
        if seq == -1 {
            for st in &mut self.streams {
                st.seq_rm_all(span, faults.seq_rm_off_by_one);
            }
            return Ok(true);
        }
        self.check_seq(seq)?;
        if faults.streams_rm_whole && self.streams.len() > 1 {
            span = Span::new(-1, -1);
        }
        let s = self.stream_of(seq);
        self.streams[s].seq_rm_one(seq, span, faults);
        Ok(true)
    }

    /// `llama_memory_seq_cp`: within one stream, adds `dst` to every cell of `src` in `[p0, p1)`.
    /// Across streams (one stream per sequence) only a whole sequence can be copied (a range
    /// llama.cpp deems full: each end `<= 0` or `>= n_ctx - 1`), and it copies the stream: the
    /// destination stream is emptied, then every cell of `src` lands at the same index with the
    /// same position (and pending shift) holding `dst` only, and the destination head becomes the
    /// source's. A partial cross-stream copy is refused ([`CacheError::PartialCrossStreamCopy`]).
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) -> Result<(), CacheError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        let (s0, s1) = (self.stream_of(src), self.stream_of(dst));
        if s0 != s1 {
            return self.seq_cp_streams(src, dst, p0, p1);
        }
        if src == dst {
            return Ok(());
        }
        let span = Span::new(p0, p1);
        let refcount = self.config.faults.refcount;
        let cells = &mut self.streams[s0].cells;
        for i in 0..cells.used_max_p1 as usize {
            if cells.is_empty(i) || !span.contains(cells.pos[i]) {
                continue;
            }
            if !cells.seq_has(i, src) {
                continue;
            }
            // The check llama.cpp's seq_cp leaves out (see Faults::refcount).
            if cells.seq_has(i, dst) && !refcount {
                continue;
            }
            cells.seq_add(i, dst);
        }
        Ok(())
    }

    /// The cross-stream branch of `llama_kv_cache::seq_cp`.
    #[inline(never)]
    fn seq_cp_streams(
        &mut self,
        src: SeqId,
        dst: SeqId,
        p0: Pos,
        p1: Pos,
    ) -> Result<(), CacheError> {
        let size = self.size() as i64;
        let partial = |p: Pos| p > 0 && (p as i64) + 1 < size;
        if partial(p0) || partial(p1) {
            return Err(CacheError::PartialCrossStreamCopy { src, dst, p0, p1 });
        }
        let (s0, s1) = (self.stream_of(src), self.stream_of(dst));
        let from = self.streams[s0].clone();
        let to = &mut self.streams[s1];
        to.cells.reset();
        for i in 0..from.cells.used_max_p1 as usize {
            if from.cells.is_empty(i) || !from.cells.seq_has(i, src) {
                continue;
            }
            to.cells.pos_set(i, from.cells.pos[i]);
            to.cells.shift[i] = from.cells.shift[i];
            to.cells.seq_add(i, dst);
        }
        to.head = from.head;
        if let Some(t) = &mut self.tensors {
            let n = self.config.n_ctx as usize;
            for i in 0..from.cells.used_max_p1 as usize {
                if !from.cells.is_empty(i) && from.cells.seq_has(i, src) {
                    t.copy_cell(s0 * n + i, s1 * n + i);
                }
            }
        }
        Ok(())
    }

    /// `llama_memory_seq_keep`: removes every sequence but `seq` from every cell of its stream
    /// (other streams are untouched, as in llama.cpp).
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), CacheError> {
        self.check_seq(seq)?;
        if self.config.faults.keep_noop {
            return Ok(());
        }
        let s = self.stream_of(seq);
        let st = &mut self.streams[s];
        let mut new_head: Option<usize> = None;
        for i in 0..st.cells.used_max_p1 as usize {
            if st.cells.is_empty(i) {
                continue;
            }
            if st.cells.seq_keep(i, seq) && new_head.is_none() {
                new_head = Some(i);
            }
        }
        if let Some(h) = new_head {
            if (h as u32) < st.head {
                st.head = h as u32;
            }
        }
        Ok(())
    }

    /// `llama_memory_seq_add`: adds `delta` to the position of every cell of `seq` in `[p0, p1)`.
    /// The cell moves for every sequence sharing it; a cell pushed below 0 is removed.
    pub fn seq_add(&mut self, seq: SeqId, p0: Pos, p1: Pos, delta: Pos) -> Result<(), CacheError> {
        self.check_seq(seq)?;
        if delta == 0 {
            return Ok(());
        }
        let span = Span::new(p0, p1);
        if span.p0 == span.p1 {
            return Ok(());
        }
        let reindex = !self.config.faults.seq_add_stale_index;
        let s = self.stream_of(seq);
        let base = self.global(s, 0);
        let st = &mut self.streams[s];
        let mut new_head: Option<usize> = None;
        for i in 0..st.cells.used_max_p1 as usize {
            if st.cells.is_empty(i) || !span.contains(st.cells.pos[i]) {
                continue;
            }
            if st.cells.seq_has(i, seq) {
                let old = st.cells.pos[i];
                if st.cells.pos_add(i, delta, reindex) {
                    if new_head.is_none() {
                        new_head = Some(i);
                    }
                } else if let Some(t) = &mut self.tensors {
                    t.reposition(base + i, old, st.cells.pos[i]);
                }
            }
        }
        st.head = new_head.map_or(0, |h| h as u32);
        Ok(())
    }

    /// `llama_memory_seq_div`: divides (rounding toward zero) the position of every cell of
    /// `seq` in `[p0, p1)` by `d`.
    pub fn seq_div(&mut self, seq: SeqId, p0: Pos, p1: Pos, d: i32) -> Result<(), CacheError> {
        self.check_seq(seq)?;
        if d == 0 {
            return Err(CacheError::ZeroDivisor);
        }
        if d == 1 {
            return Ok(());
        }
        let span = Span::new(p0, p1);
        if span.p0 == span.p1 {
            return Ok(());
        }
        let s = self.stream_of(seq);
        let base = self.global(s, 0);
        let cells = &mut self.streams[s].cells;
        for i in 0..cells.used_max_p1 as usize {
            if cells.is_empty(i) || !span.contains(cells.pos[i]) {
                continue;
            }
            if cells.seq_has(i, seq) {
                let old = cells.pos[i];
                cells.pos_div(i, d);
                if let Some(t) = &mut self.tensors {
                    t.reposition(base + i, old, cells.pos[i]);
                }
            }
        }
        Ok(())
    }
}
