//! One stream of the cache (`v_cells[s]`, `v_heads[s]` in `llama_kv_cache`): its cells, its head,
//! the removals that work on one stream and the slot search (`find_slot`).

use crate::cells::{Cells, Span};
use crate::{Faults, Pos, SeqId};

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

    /// `find_slot(ubatch, cont = false)` for one stream: the cells the batch will occupy,
    /// searched from `head` with wrap-around (src/llama-kv-cache.cpp:1020-1105 in 0.1.161). A cell
    /// is usable when it is empty or, in a windowed cache (`reuse`), when it holds one sequence
    /// and is masked for that sequence's next token (`is_masked_swa(n_swa, pos_cell,
    /// seq_pos_max + 1)`, :1075).
    pub(crate) fn find_slot(
        &self,
        n_tokens: usize,
        reuse: Option<SlotWindow>,
    ) -> Option<Vec<usize>> {
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
            let usable =
                self.cells.is_empty(idx) || reuse.is_some_and(|w| w.masked(&self.cells, idx));
            if usable {
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

/// The sliding window of a windowed cache (`LLAMA_SWA_TYPE_STANDARD`: a query at `p1` does not
/// attend a key at `p0` when `p1 - p0 >= n_swa`, src/llama-hparams.h:480-492), as the slot search
/// applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotWindow {
    /// The window, in positions (> 0).
    pub(crate) n_swa: u32,
    /// How far past its sequence's largest position the query is taken to be: 1, as llama.cpp
    /// (the next token); 2 under [`crate::Faults::swa_window_off_by_one`].
    pub(crate) lead: Pos,
}

impl SlotWindow {
    /// Whether non-empty cell `i` may be overwritten: it holds exactly one sequence and is
    /// masked for that sequence's next token.
    fn masked(&self, cells: &Cells, i: usize) -> bool {
        let bits = cells.seq[i];
        if bits == 0 || bits & (bits - 1) != 0 {
            return false;
        }
        let s = bits.trailing_zeros() as usize;
        let p1 = cells.seq_pos[s].max() + self.lead;
        p1 - cells.pos[i] >= self.n_swa as Pos
    }
}
