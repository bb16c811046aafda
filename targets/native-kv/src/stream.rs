//! One stream of the cache (`v_cells[s]`, `v_heads[s]` in `llama_kv_cache`): its cells, its head,
//! the removals that work on one stream and the slot search (`find_slot`).

use crate::cells::{Cells, Span};
use crate::{Faults, SeqId};

/// One stream: its cells and the head where the next slot search starts (`v_cells[s]`,
/// `v_heads[s]` in `llama_kv_cache`).
#[derive(Clone, Debug)]
pub(crate) struct Stream {
    pub(crate) cells: Cells,
    pub(crate) head: u32,
}

impl Stream {
    /// `seq_rm(-1, ..)` on this stream: every cell in the span is removed.
    pub(crate) fn seq_rm_all(&mut self, span: Span, off_by_one: bool) {
        let mut new_head: Option<usize> = None;
        for i in 0..self.cells.used_max_p1 as usize {
            if self.cells.is_empty(i) {
                continue;
            }
            let p = self.cells.pos[i];
            let hit = if off_by_one {
                span.contains_inclusive(p)
            } else {
                span.contains(p)
            };
            if !hit {
                continue;
            }
            self.cells.rm(i);
            if new_head.is_none() {
                new_head = Some(i);
            }
        }
        self.lower_head(new_head);
    }

    /// `seq_rm(seq, ..)` on this stream (the stream of `seq`).
    pub(crate) fn seq_rm_one(&mut self, seq: SeqId, span: Span, faults: Faults) {
        let mut new_head: Option<usize> = None;
        for i in 0..self.cells.used_max_p1 as usize {
            if self.cells.is_empty(i) {
                continue;
            }
            let p = self.cells.pos[i];
            let hit = if faults.seq_rm_off_by_one {
                span.contains_inclusive(p)
            } else {
                span.contains(p)
            };
            if !hit {
                continue;
            }
            let freed = self.cells.seq_has(i, seq) && self.cells.seq_rm(i, seq, faults.orphan_cell);
            if freed && new_head.is_none() {
                new_head = Some(i);
            }
        }
        self.lower_head(new_head);
    }

    pub(crate) fn lower_head(&mut self, new_head: Option<usize>) {
        if let Some(h) = new_head {
            if (h as u32) < self.head {
                self.head = h as u32;
            }
        }
    }

    /// `find_slot(ubatch, cont = false)` for one stream without a sliding window: the cells the
    /// batch will occupy, searched from `head` with wrap-around.
    pub(crate) fn find_slot(&self, n_tokens: usize) -> Option<Vec<usize>> {
        let size = self.cells.pos.len();
        if n_tokens > size {
            return None;
        }
        let mut head = self.head as usize;
        if head > self.cells.used as usize + 2 * n_tokens {
            head = 0;
        }
        let mut idxs = Vec::with_capacity(n_tokens);
        let mut tested = 0usize;
        loop {
            if head + 1 > size {
                tested += size - head;
                head = 0;
                continue;
            }
            let idx = head;
            head += 1;
            tested += 1;
            if self.cells.is_empty(idx) {
                idxs.push(idx);
            }
            if idxs.len() == n_tokens {
                return Some(idxs);
            }
            if tested >= size {
                return None;
            }
        }
    }
}
