//! A model of llama.cpp's recurrent memory (`llama_memory_recurrent`, mamba and rwkv layers:
//! src/llama-memory-recurrent.cpp, read against llama-cpp-sys-2 0.1.161; line numbers below are
//! that file's).
//!
//! One cell holds the state of a whole sequence: `max(1, n_seq_max)` cells
//! (`recurrent_rs_size`, src/llama-model.cpp `create_memory`), each with a position (the last
//! token folded into the state), a set of sequences and, per sequence id `s`, `cells[s].tail`:
//! the cell holding `s`'s state. What each op does:
//!
//! - `seq_rm` (:168-259): a range that ends past the state's position and starts after 0 is a
//!   rollback: accepted (true, the position moves back to `p0 - 1`) when it goes back at most
//!   `n_rs_seq` tokens and no rollback is pending, refused (false, nothing changed) otherwise; a
//!   range that covers the position from 0 removes the sequence; any other range changes nothing
//!   and returns true. `seq_id < 0` returns false (:179, `(uint32_t) seq_id >= n_seq_max`).
//! - `seq_cp` (:261-296) ignores the range: the destination leaves its cell and shares the
//!   source's.
//! - `seq_keep` (:298-328), `seq_add` / `seq_div` (:330-388: the state's position moves, nothing
//!   is removed, even below 0), `clear` (:148-166).
//! - decode: `find_slot` (:517-726) per sequence set of the batch, in order of first appearance
//!   (each set as its own ubatch: llama.cpp's `split_equal` may put several sets in one ubatch
//!   and then re-orders their cells to be contiguous; cell numbers, and so the order of cells in
//!   a whole dump, may differ from llama.cpp's when one batch decodes several sequences).
//!
//! Dump layout (`state_write`, :784-863; `state_write_meta` :896-913; `state_write_data`
//! :915-1008), after the context's header: u32 `cell_count`; per cell i32 pos, u32 `n_seq_id` (0
//! in a per-sequence dump, else the count) and the ids; u32 `s_trans` (0), u32 `n_layer`; per layer
//! R (i32 type, u64 row bytes, rows), then per layer S likewise. No `n_stream`.
//!
//! The state payload: each cell holds a *digest* of the tokens its state absorbed, folded in
//! order with their positions ([`fold_digest`]), a stand-in for the conv and ssm states a forward
//! pass would compute (this model computes none): two states that absorbed the same tokens in
//! the same order have the same digest, as a real state would, and anything else almost surely
//! not. A state copied by `seq_cp`, moved by `find_slot` or saved and loaded keeps its digest;
//! the native target answers the logits probe from it. Without a [`RecurrentShape`] a dump
//! carries the digest as one layer of 8-byte R and S rows (`n_layer` 1); with one, the rows of
//! that shape as zeros (the layout llama.cpp writes for such a model; a load then gives the
//! empty digest).
//!
//! Rollback (`n_rs_seq` > 0): each cell remembers the digests of its last states (`back`), and
//! an accepted rollback of `d` tokens gives the state of the kept tokens, as llama.h's "true"
//! promises; llama.cpp instead reads snapshot plane `d`, which only the last decode's last
//! `min(n_tokens, n_rs_seq + 1)` tokens wrote (`planes`, read under the fault
//! `rollback_reads_stale_plane`).
//!
//! 0.1.156 differs: `seq_rm` with `seq_id < 0` over the whole range clears every sequence and
//! returns true (no `n_seq_max` check before it), a second rollback before a decode is accepted
//! (no "pending" check, :209 in 0.1.161), and a failed sequence load empties the sequence with
//! `seq_rm` rather than `state_clear`.

use crate::state::StateReader;
use crate::{CacheError, DecodeError, Faults, Pos, RestoreError, SeqId, MAX_SEQ};

/// The shape of the state rows a dump carries (all layers recurrent, F32 rows, written as zeros).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentShape {
    /// Number of layers with a recurrent state.
    pub n_layer: u32,
    /// Bytes of one R (conv state) row: `(d_conv - 1) * d_inner * 4` for mamba.
    pub r_row_bytes: u64,
    /// Bytes of one S (ssm state) row: `d_state * d_inner * 4` for mamba.
    pub s_row_bytes: u64,
}

/// The configuration of a recurrent memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentConfig {
    /// Sequences `0..n_seq_max` are valid; the memory has `max(1, n_seq_max)` cells.
    pub n_seq_max: u32,
    /// The rollback depth (`llama_context_params::n_rs_seq`): how many tokens a partial `seq_rm`
    /// may take back. 0 (llama.cpp's default): no partial removal succeeds.
    pub n_rs_seq: u32,
    /// The rows a dump carries, if any.
    pub shape: Option<RecurrentShape>,
    /// Deliberate bugs, for positive controls.
    pub faults: Faults,
}

/// One cell (`mem_cell`): a position, the sequences sharing the state, the tail of sequence
/// id = this cell's index, and the state's digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RsCell {
    pos: Pos,
    seq: u64,
    /// Whether the state was produced in place (`src >= 0`); kept for the layout only.
    src: i32,
    tail: i32,
    /// The fold of the tokens the state absorbed ([`fold_digest`]).
    digest: u64,
    /// `back[d]`: the digest `d` tokens back along the state's timeline (`back[0]` is
    /// `digest`; [`UNKNOWN_DIGEST`] past what the cell saw): what a rollback of `d` restores.
    back: [u64; HISTORY],
    /// What llama.cpp's snapshot planes hold (plane `d` of the cell's rows,
    /// `rs_idx * size + cell`): a decode writes the planes of its own last tokens only. Read by
    /// a rollback under [`Faults::rollback_reads_stale_plane`].
    planes: [u64; MAX_PLANES],
}

/// The most snapshot planes a native recurrent memory keeps: `n_rs_seq` up to 7.
pub const MAX_PLANES: usize = 8;

/// How many digests back a cell remembers: enough for any rollback after a rollback (each
/// takes back at most `MAX_PLANES - 1`); a state rolled back further than it remembers gets
/// [`UNKNOWN_DIGEST`], which no decode gives (a limit of this model, not of llama.cpp).
const HISTORY: usize = 2 * MAX_PLANES;

/// The digest of a state this model cannot tell (past a cell's remembered history).
pub const UNKNOWN_DIGEST: u64 = 0xbb67_ae85_84ca_a73b;

const EMPTY: RsCell = RsCell {
    pos: -1,
    seq: 0,
    src: -1,
    tail: -1,
    digest: EMPTY_DIGEST,
    back: [UNKNOWN_DIGEST; HISTORY],
    planes: [UNKNOWN_DIGEST; MAX_PLANES],
};

/// The bytes of one digest row in a dump.
const DIGEST_ROW_BYTES: usize = 8;

/// The digest of a state that absorbed nothing.
pub const EMPTY_DIGEST: u64 = 0x6a09_e667_f3bc_c908;

/// The digest of a state with digest `digest` after it absorbs `token` at `pos` (a splitmix64
/// step over both: order matters, as it does for a recurrent state).
pub fn fold_digest(digest: u64, token: i32, pos: Pos) -> u64 {
    let mut z = digest
        .rotate_left(17)
        .wrapping_add(u64::from(token as u32) << 32 | u64::from(pos as u32))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl RsCell {
    /// A state loaded from a dump: its digest, and nothing back (a dump holds one state; the
    /// load writes llama.cpp's plane 0 only).
    fn set_loaded(&mut self, digest: u64) {
        self.digest = digest;
        self.back = EMPTY.back;
        self.back[0] = digest;
        self.planes = EMPTY.planes;
        self.planes[0] = digest;
    }

    fn has(&self, s: SeqId) -> bool {
        (0..MAX_SEQ as SeqId).contains(&s) && self.seq & (1u64 << s) != 0
    }
}

/// A recurrent memory modelled on `llama_memory_recurrent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecurrentCache {
    config: RecurrentConfig,
    cells: Vec<RsCell>,
    head: u32,
    used: u32,
    /// Per sequence: the pending rollback (`rs_idx`), consumed by the next decode of it.
    rs_idx: Vec<u32>,
}

/// A sequence set as the bits of its ids (a recurrent state's `seq`).
fn seq_bits(seqs: &[SeqId]) -> u64 {
    seqs.iter().fold(0u64, |a, &s| a | (1u64 << s))
}

impl RecurrentCache {
    /// An empty memory.
    ///
    /// # Panics
    /// When `n_seq_max` is above [`MAX_SEQ`].
    pub fn new(config: RecurrentConfig) -> Self {
        assert!(
            config.n_seq_max as usize <= MAX_SEQ,
            "n_seq_max above {MAX_SEQ}"
        );
        let size = config.n_seq_max.max(1) as usize;
        RecurrentCache {
            config,
            cells: vec![EMPTY; size],
            head: 0,
            used: 0,
            rs_idx: vec![0; config.n_seq_max as usize],
        }
    }

    /// Appends this memory's state key ([`crate::key`]) to `out`: every cell, the head, the
    /// used count and the pending rollbacks.
    pub fn write_state_key(&self, out: &mut Vec<u8>) {
        use crate::key::{put_i32, put_u32, put_u64};
        put_u32(out, self.cells.len() as u32);
        for c in &self.cells {
            put_i32(out, c.pos);
            put_u64(out, c.seq);
            put_i32(out, c.src);
            put_i32(out, c.tail);
            put_u64(out, c.digest);
            if self.config.n_rs_seq > 0 {
                // What a later rollback reads.
                for &d in c.back.iter().chain(&c.planes) {
                    put_u64(out, d);
                }
            }
        }
        put_u32(out, self.head);
        put_u32(out, self.used);
        put_u32(out, self.rs_idx.len() as u32);
        for &r in &self.rs_idx {
            put_u32(out, r);
        }
    }

    /// The configuration this memory was made with.
    pub fn config(&self) -> &RecurrentConfig {
        &self.config
    }

    fn size(&self) -> usize {
        self.cells.len()
    }

    /// `Ok` when `s` names a sequence of this memory.
    pub fn check_seq(&self, s: SeqId) -> Result<(), CacheError> {
        if s < 0 || s as u32 >= self.config.n_seq_max {
            return Err(CacheError::InvalidSeq(s));
        }
        Ok(())
    }

    /// `clear` (:148-166).
    pub fn clear(&mut self) {
        self.cells.fill(EMPTY);
        self.head = 0;
        self.used = 0;
        self.rs_idx.fill(0);
    }

    fn free(&mut self, i: usize) {
        if self.cells[i].pos >= 0 {
            self.used -= 1;
        }
        let tail = self.cells[i].tail;
        self.cells[i] = RsCell { tail, ..EMPTY };
    }

    /// `seq_rm` (:168-259): see the module docs. `seq < 0` returns false.
    pub fn seq_rm(&mut self, seq: SeqId, p0: Pos, p1: Pos) -> bool {
        let p0 = p0.max(0);
        let p1 = if p1 < 0 { Pos::MAX } else { p1 };
        if seq < 0 || seq as u32 >= self.config.n_seq_max {
            return false;
        }
        if p0 == 0 && p1 == Pos::MAX {
            self.rs_idx[seq as usize] = 0;
        }
        let tail = self.cells[seq as usize].tail;
        if tail >= 0 {
            let t = tail as usize;
            let pos = self.cells[t].pos;
            if 0 < p0 && p0 <= pos && p1 > pos {
                let rollback = pos - (p0 - 1);
                let pending = self.rs_idx[seq as usize] != 0;
                if !pending && rollback >= 1 && rollback <= self.config.n_rs_seq as Pos {
                    self.rs_idx[seq as usize] = rollback as u32;
                    let c = &mut self.cells[t];
                    c.pos = p0 - 1;
                    // llama.cpp reads plane `rollback` at the next decode (`s_copy`) or dump
                    // (`state_write`): the state of the kept tokens, which this model takes
                    // from the cell's history (or, faulty, from the planes llama.cpp keeps).
                    let d = rollback as usize;
                    c.digest = if self.config.faults.rollback_reads_stale_plane {
                        c.planes[d]
                    } else {
                        c.back[d]
                    };
                    c.back.copy_within(d.., 0);
                    c.back[HISTORY - d..].fill(UNKNOWN_DIGEST);
                    c.back[0] = c.digest;
                    // llama.cpp leaves the planes as they are (the next decode reads plane `d`
                    // and rewrites plane 0 first).
                    c.planes[0] = c.digest;
                    return true;
                }
                if self.config.faults.recurrent_rm_false_changes {
                    self.seq_rm(seq, -1, -1);
                }
                if self.config.faults.refused_rm_resets_state {
                    self.cells[t].digest = EMPTY_DIGEST;
                }
                return false;
            }
            if p0 <= pos && pos < p1 {
                self.cells[seq as usize].tail = -1;
            }
        }
        let mut new_head = None;
        for i in 0..self.size() {
            let c = self.cells[i];
            if c.pos < p0 || c.pos >= p1 || !c.has(seq) {
                continue;
            }
            self.cells[i].seq &= !(1u64 << seq);
            if self.cells[i].seq == 0 {
                self.free(i);
                new_head.get_or_insert(i);
            }
        }
        if let Some(h) = new_head {
            if (h as u32) < self.head {
                self.head = h as u32;
            }
        }
        true
    }

    /// Removes `dst` from its cell (the first half of `seq_cp`, and of `find_slot` for a sequence
    /// that becomes shared).
    fn detach(&mut self, dst: SeqId) {
        let tail = self.cells[dst as usize].tail;
        if tail < 0 {
            return;
        }
        let t = tail as usize;
        self.cells[t].seq &= !(1u64 << dst);
        self.cells[dst as usize].tail = -1;
        if self.cells[t].seq == 0 {
            let keep_tail = self.cells[t].tail;
            self.cells[t] = RsCell {
                tail: keep_tail,
                ..EMPTY
            };
            self.used -= 1;
        }
    }

    /// `seq_cp` (:261-296): the range is ignored; `dst` shares `src`'s state.
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, _p0: Pos, _p1: Pos) -> Result<(), CacheError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        if src == dst {
            return Ok(());
        }
        if self.config.faults.recurrent_seq_cp_keeps_old_state {
            // The destination's old cell keeps it: only the tail pointer moves.
            self.cells[dst as usize].tail = -1;
        } else {
            self.detach(dst);
        }
        let tail = self.cells[src as usize].tail;
        if tail >= 0 {
            self.cells[tail as usize].seq |= 1u64 << dst;
            self.cells[dst as usize].tail = tail;
        }
        Ok(())
    }

    /// `seq_keep` (:298-328): every other sequence's state goes, and every other tail.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), CacheError> {
        self.check_seq(seq)?;
        let mut new_head = None;
        for i in 0..self.size() {
            if i as SeqId != seq {
                self.cells[i].tail = -1;
            }
            if !self.cells[i].has(seq) {
                self.free(i);
                new_head.get_or_insert(i);
            } else {
                self.cells[i].seq = 1u64 << seq;
            }
        }
        if let Some(h) = new_head {
            if (h as u32) < self.head {
                self.head = h as u32;
            }
        }
        Ok(())
    }

    /// The tail cell of `seq` when it holds `seq` at a position in `[p0, p1)`.
    fn tail_in(&self, seq: SeqId, p0: Pos, p1: Pos) -> Option<usize> {
        let p0 = p0.max(0);
        let p1 = if p1 < 0 { Pos::MAX } else { p1 };
        let t = self.cells[seq as usize].tail;
        if p0 == p1 || t < 0 {
            return None;
        }
        let c = &self.cells[t as usize];
        (c.has(seq) && p0 <= c.pos && c.pos < p1).then_some(t as usize)
    }

    /// `seq_add` (:330-358): the state's position moves by `delta` (and stays, even below 0).
    pub fn seq_add(&mut self, seq: SeqId, p0: Pos, p1: Pos, delta: Pos) -> Result<(), CacheError> {
        self.check_seq(seq)?;
        if delta == 0 {
            return Ok(());
        }
        if let Some(t) = self.tail_in(seq, p0, p1) {
            self.cells[t].pos += delta;
        }
        Ok(())
    }

    /// `seq_div` (:360-388). llama.cpp divides by zero for `d == 0`: refused.
    pub fn seq_div(&mut self, seq: SeqId, p0: Pos, p1: Pos, d: i32) -> Result<(), CacheError> {
        self.check_seq(seq)?;
        if d == 1 {
            return Ok(());
        }
        if d == 0 {
            return Err(CacheError::ZeroDivisor);
        }
        if let Some(t) = self.tail_in(seq, p0, p1) {
            self.cells[t].pos /= d;
        }
        Ok(())
    }

    /// `seq_pos_min` (:390-404): the smallest position of the cells holding `seq`, -1 if none.
    pub fn seq_pos_min(&self, seq: SeqId) -> Pos {
        self.cells
            .iter()
            .filter(|c| c.has(seq))
            .map(|c| c.pos)
            .min()
            .unwrap_or(-1)
    }

    /// `seq_pos_max` (:406-416): the largest position of the cells holding `seq`, -1 if none.
    pub fn seq_pos_max(&self, seq: SeqId) -> Pos {
        self.cells
            .iter()
            .filter(|c| c.has(seq))
            .map(|c| c.pos)
            .max()
            .unwrap_or(-1)
    }

    /// The used cells in cell order: (cell, position, sequence bitset).
    pub fn resident_cells(&self) -> impl Iterator<Item = (usize, Pos, u64)> + '_ {
        self.cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.seq != 0)
            .map(|(i, c)| (i, c.pos, c.seq))
    }

    /// Whether a batch (already validated, positions resolved) fits: the sequence sets whose
    /// first sequence does not own a cell alone each take an empty cell ([`Self::place`]). With
    /// one cell per sequence there always is one; a fault that leaves a sequence in two cells
    /// (`recurrent_seq_cp_keeps_old_state`) can use them all, and the decode then fails as
    /// llama.cpp's `find_slot` does when it finds no cell (rc 1) instead of the model panicking.
    /// Counted before the sets' other members leave their cells, so it may refuse a batch that
    /// those departures would have made room for (only under such a fault).
    pub(crate) fn find_slots<'a>(
        &self,
        seqs: impl IntoIterator<Item = &'a [SeqId]>,
    ) -> Result<(), DecodeError> {
        let mut firsts: Vec<SeqId> = Vec::new();
        let mut sets: Vec<u64> = Vec::new();
        for t in seqs {
            let bits = seq_bits(t);
            if !sets.contains(&bits) {
                sets.push(bits);
                firsts.push(t[0]);
            }
        }
        let needed = firsts
            .iter()
            .filter(|&&s0| self.owned_tail(s0).is_none())
            .count();
        let empty = self.cells.iter().filter(|c| c.seq == 0).count();
        if needed > empty {
            return Err(DecodeError::NoSlot);
        }
        Ok(())
    }

    /// Decode, metadata side (`find_slot`, :517-726): per sequence set of the batch in order of
    /// first appearance, the set's state moves to a cell its first sequence owns alone (its
    /// tail, or an empty cell the old tail's position and state are copied to) and takes the
    /// set's last position; the other members leave their old cells first. The state absorbs
    /// the set's tokens in batch order (`tokens[i]` at `pos[i]`). The pending rollbacks of the
    /// decoded sequences are consumed (:1376-1378).
    pub(crate) fn place(&mut self, seqs: &[Vec<SeqId>], pos: &[Pos], tokens: &[i32]) {
        // (bits, first sequence, last position, the set's tokens and positions in order)
        type Set = (u64, SeqId, Pos, Vec<(i32, Pos)>);
        let mut sets: Vec<Set> = Vec::new();
        for ((t, &p), &token) in seqs.iter().zip(pos).zip(tokens) {
            let bits = seq_bits(t);
            match sets.iter_mut().find(|e| e.0 == bits) {
                Some(e) => {
                    e.2 = p;
                    e.3.push((token, p));
                }
                None => sets.push((bits, t[0], p, vec![(token, p)])),
            }
        }
        if self.head as usize > self.used as usize + 2 * sets.len() {
            self.head = 0;
        }
        for (bits, s0, last, absorbed) in sets {
            let mut b = bits & !(1u64 << s0);
            while b != 0 {
                let s = b.trailing_zeros() as SeqId;
                self.detach(s);
                b &= b - 1;
            }
            let tail = self.cells[s0 as usize].tail;
            let cell = if let Some(owned) = self.owned_tail(s0) {
                owned
            } else {
                let e = self.next_empty();
                if tail >= 0 {
                    let t = tail as usize;
                    self.cells[e].pos = self.cells[t].pos;
                    self.cells[e].digest = self.cells[t].digest;
                    self.cells[e].back = self.cells[t].back;
                    self.cells[e].planes = self.cells[t].planes;
                    self.cells[t].seq &= !(1u64 << s0);
                } else {
                    self.cells[e].digest = EMPTY_DIGEST;
                    self.cells[e].back = EMPTY.back;
                    self.cells[e].back[0] = EMPTY_DIGEST;
                    self.cells[e].planes = EMPTY.planes;
                }
                e
            };
            // With batch_mixes_states each token lands in the shared state once per sequence.
            let times = if self.config.faults.batch_mixes_states {
                bits.count_ones()
            } else {
                1
            };
            let planes = (self.config.n_rs_seq as usize + 1).min(MAX_PLANES);
            let c = &mut self.cells[cell];
            let n = absorbed.len();
            for (i, &(token, p)) in absorbed.iter().enumerate() {
                for _ in 0..times {
                    c.digest = fold_digest(c.digest, token, p);
                }
                c.back.copy_within(..HISTORY - 1, 1);
                c.back[0] = c.digest;
                // Plane `n - 1 - i` holds the state after this token when it is one of the
                // decode's last `planes` tokens (`n_written`); the others keep what they held.
                if n - 1 - i < planes {
                    c.planes[n - 1 - i] = c.digest;
                }
            }
            c.pos = last;
            c.seq = bits;
            c.src = cell as i32;
            let mut b = bits;
            while b != 0 {
                let s = b.trailing_zeros() as usize;
                self.cells[s].tail = cell as i32;
                self.rs_idx[s] = 0;
                b &= b - 1;
            }
            self.head = cell as u32;
        }
        self.used = self.cells.iter().filter(|c| c.seq != 0).count() as u32;
    }

    /// The digest of `seq`'s state (see the module docs), `None` when it holds none.
    pub fn state_digest(&self, seq: SeqId) -> Option<u64> {
        let t = *self.cells.get(usize::try_from(seq).ok()?)?;
        let c = self.cells.get(usize::try_from(t.tail).ok()?)?;
        c.has(seq).then_some(c.digest)
    }

    /// The cell `seq` owns alone (its tail, shared with no other sequence), where it has one:
    /// a decode of `seq` goes on there; otherwise it takes an empty cell.
    fn owned_tail(&self, seq: SeqId) -> Option<usize> {
        let tail = usize::try_from(self.cells[seq as usize].tail).ok()?;
        (self.cells[tail].seq == 1u64 << seq).then_some(tail)
    }

    /// The next empty cell from `head`, wrapping (:603-610). There is one: a sequence that owns
    /// no cell alone leaves at least one of the `max(1, n_seq_max)` cells free.
    fn next_empty(&self) -> usize {
        let n = self.size();
        (0..n)
            .map(|k| (self.head as usize + k) % n)
            .find(|&i| self.cells[i].seq == 0)
            .expect("a free cell for a sequence that owns none")
    }

    /// `state_write` (:784-863) of `seq` (-1: every used cell with its sequences) into `out`.
    pub(crate) fn write_memory(&self, seq: SeqId, out: &mut Vec<u8>) {
        let idxs: Vec<usize> = (0..self.size())
            .filter(|&i| {
                let c = &self.cells[i];
                (seq == -1 && c.seq != 0) || c.has(seq)
            })
            .collect();
        out.extend_from_slice(&(idxs.len() as u32).to_le_bytes());
        for &i in &idxs {
            let c = &self.cells[i];
            out.extend_from_slice(&c.pos.to_le_bytes());
            if seq == -1 {
                out.extend_from_slice(&c.seq.count_ones().to_le_bytes());
                let mut b = c.seq;
                while b != 0 {
                    out.extend_from_slice(&(b.trailing_zeros() as i32).to_le_bytes());
                    b &= b - 1;
                }
            } else {
                out.extend_from_slice(&0u32.to_le_bytes());
            }
        }
        out.extend_from_slice(&0u32.to_le_bytes()); // s_trans
        match self.config.shape {
            None => {
                // The digest as one layer of R and S rows.
                out.extend_from_slice(&1u32.to_le_bytes());
                for _ in 0..2 {
                    out.extend_from_slice(&0i32.to_le_bytes()); // GGML_TYPE_F32
                    out.extend_from_slice(&(DIGEST_ROW_BYTES as u64).to_le_bytes());
                    for &i in &idxs {
                        let digest = if self.config.faults.save_drops_state {
                            EMPTY_DIGEST
                        } else {
                            self.cells[i].digest
                        };
                        out.extend_from_slice(&digest.to_le_bytes());
                    }
                }
            }
            Some(shape) => {
                out.extend_from_slice(&shape.n_layer.to_le_bytes());
                for row_bytes in [shape.r_row_bytes, shape.s_row_bytes] {
                    for _ in 0..shape.n_layer {
                        out.extend_from_slice(&0i32.to_le_bytes()); // GGML_TYPE_F32
                        out.extend_from_slice(&row_bytes.to_le_bytes());
                        out.resize(out.len() + row_bytes as usize * idxs.len(), 0);
                    }
                }
            }
        }
    }

    /// The state-row section after the cells (`state_read_data`, :1111-1249): `s_trans` 0, the
    /// layer count, and per layer R then S with this memory's row sizes. Returns the digests of
    /// the `cell_count` cells (the empty digest for a dump of a [`RecurrentShape`]).
    fn read_rows(
        &self,
        cell_count: u32,
        r: &mut StateReader<'_>,
    ) -> Result<Vec<u64>, RestoreError> {
        let s_trans = r.u32("s_trans")?;
        let n_layer = r.u32("n_layer")?;
        let shape = self.config.shape;
        let want = shape.map_or(1, |s| s.n_layer);
        if n_layer != want {
            return r.fail(format!("{want} layers (this memory), found {n_layer}"));
        }
        if s_trans != 0 {
            return r.fail(format!("s_trans 0, found {s_trans}"));
        }
        let (r_bytes, s_bytes) = shape
            .map_or((DIGEST_ROW_BYTES as u64, DIGEST_ROW_BYTES as u64), |s| {
                (s.r_row_bytes, s.s_row_bytes)
            });
        let mut digests = vec![EMPTY_DIGEST; cell_count as usize];
        for (what, row_bytes) in [("R", r_bytes), ("S", s_bytes)] {
            for l in 0..n_layer {
                let ty = r.i32(&format!("{what} type"))?;
                if ty != 0 {
                    return r.fail(format!("{what} type 0 (F32) in layer {l}, found {ty}"));
                }
                let rb = r.u64(&format!("{what} row bytes"))?;
                if rb != row_bytes {
                    return r.fail(format!(
                        "{what} rows of {row_bytes} bytes in layer {l}, found {rb}"
                    ));
                }
                let n = (rb as usize).saturating_mul(cell_count as usize);
                if r.bytes.len() - r.at < n {
                    return r.fail(format!("{what} rows: {n} bytes"));
                }
                if shape.is_none() && what == "R" {
                    for (i, d) in digests.iter_mut().enumerate() {
                        let at = r.at + i * DIGEST_ROW_BYTES;
                        let row: [u8; DIGEST_ROW_BYTES] = r.bytes[at..at + DIGEST_ROW_BYTES]
                            .try_into()
                            .expect("8 bytes");
                        *d = u64::from_le_bytes(row);
                    }
                }
                r.at += n;
            }
        }
        Ok(digests)
    }

    /// `state_read` for `seq` (:865-894, `state_read_meta` :1010-1109): the cells of a sequence
    /// dump go to `seq`. On failure `seq` is emptied (`state_clear`).
    /// The state of `seq`'s tail cell (`None`: the sequence has no state).
    fn seq_digest(&self, seq: SeqId) -> Option<u64> {
        let t = self.cells.get(usize::try_from(seq).ok()?)?.tail;
        Some(self.cells[usize::try_from(t).ok()?].digest)
    }

    /// [`Self::read_seq_memory`] of a `PARTIAL_ONLY` load: the same, except that with the fault
    /// `partial_load_keeps_states` the loaded cell keeps the state the sequence had before
    /// (the cells and positions are the bytes', the state's rows are not).
    pub(crate) fn read_seq_memory_partial(
        &mut self,
        seq: SeqId,
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        let kept = self.seq_digest(seq);
        self.read_seq_memory(seq, r)?;
        if let (true, Some(d)) = (self.config.faults.partial_load_keeps_states, kept) {
            if let Ok(t) = usize::try_from(self.cells[seq as usize].tail) {
                self.cells[t].set_loaded(d);
            }
        }
        Ok(())
    }

    pub(crate) fn read_seq_memory(
        &mut self,
        seq: SeqId,
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        let cell_count = r.u32("cell_count")?;
        let res = self.read_seq_cells(seq, cell_count, r);
        if res.is_err() {
            self.seq_rm(seq, -1, -1);
        } else {
            self.rs_idx[seq as usize] = 0;
        }
        res
    }

    fn read_seq_cells(
        &mut self,
        seq: SeqId,
        cell_count: u32,
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        if cell_count as usize > self.size() {
            return r.fail(format!(
                "{cell_count} cells do not fit the {} of the memory (not enough cells in kv cache)",
                self.size()
            ));
        }
        self.seq_rm(seq, -1, -1);
        let mut last = None;
        for _ in 0..cell_count {
            let p = r.i32("cell pos")?;
            let n_seq = r.u32("cell n_seq_id")?;
            if n_seq != 0 {
                return r.fail(format!(
                    "n_seq_id 0 in a sequence state, found {n_seq} (invalid seq_id-agnostic kv cell)"
                ));
            }
            last = Some(p);
        }
        if cell_count > 1 {
            // find_slot folds the cells into one state and the checks after it
            // (GGML_ASSERT(cells[head + cell_count - 1].pos == ...), :1064-1068) abort.
            return r.fail(format!("one cell per sequence state, found {cell_count}"));
        }
        let digests = self.read_rows(cell_count, r)?;
        if let Some(p) = last {
            // Placed as a decode of one token would be, then given the loaded state.
            self.place(&[vec![seq]], &[p], &[0]);
            let t = self.cells[seq as usize].tail as usize;
            self.cells[t].set_loaded(digests[0]);
        }
        Ok(())
    }

    /// `state_read` of a whole-memory dump (`state_read_meta` with `dest_seq_id == -1`,
    /// :1070-1102). On failure the memory is cleared.
    pub(crate) fn read_whole_memory(
        &mut self,
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        let cell_count = r.u32("cell_count")?;
        let res = self.read_whole_cells(cell_count, r);
        if res.is_err() {
            self.clear();
        }
        self.rs_idx.fill(0);
        res
    }

    fn read_whole_cells(
        &mut self,
        cell_count: u32,
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        if cell_count as usize > self.size() {
            return r.fail(format!(
                "{cell_count} cells do not fit the {} of the memory (not enough cells in kv cache)",
                self.size()
            ));
        }
        self.clear();
        let n_seq_max = self.config.n_seq_max;
        for i in 0..cell_count as usize {
            let p = r.i32("cell pos")?;
            let n_seq = r.u32("cell n_seq_id")?;
            self.cells[i].pos = p;
            self.cells[i].src = i as i32;
            for _ in 0..n_seq {
                let q = r.i32("cell seq id")?;
                if q < 0 || q as u32 >= n_seq_max {
                    return r.fail(format!(
                        "a seq id in [0, {n_seq_max}), found {q} (invalid seq_id)"
                    ));
                }
                self.cells[i].seq |= 1u64 << q;
                if self.cells[q as usize].tail != -1 {
                    return r.fail(format!(
                        "one cell per sequence, found two for {q} (duplicate tail)"
                    ));
                }
                self.cells[q as usize].tail = i as i32;
            }
        }
        self.head = 0;
        self.used = cell_count;
        let digests = self.read_rows(cell_count, r)?;
        for (c, d) in self.cells.iter_mut().zip(digests) {
            c.set_loaded(d);
        }
        Ok(())
    }
}

impl crate::SeqRanges for RecurrentCache {
    fn n_seq(&self) -> usize {
        self.config.n_seq_max as usize
    }

    fn seq_range(&self, s: SeqId) -> (Pos, Pos) {
        (self.seq_pos_min(s), self.seq_pos_max(s))
    }
}
