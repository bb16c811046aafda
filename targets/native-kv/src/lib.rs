//! A Rust model of llama.cpp's unified KV cell cache.
//!
//! This crate is a KV cache that could be used on its own: it knows nothing of kvaudit. It models
//! the bookkeeping of `llama_kv_cells` (src/llama-kv-cells.h) and the sequence operations of
//! `llama_kv_cache` (src/llama-kv-cache.cpp) in llama.cpp, for one stream (`kv_unified = true`):
//!
//! - cells with a position, an accumulated shift and a sequence bitset;
//! - a per-sequence position index (position -> number of cells) that answers
//!   `seq_pos_min`/`seq_pos_max`, maintained one cell at a time as llama.cpp does;
//! - the six memory operations (`seq_rm`, `seq_cp`, `seq_keep`, `seq_add`, `seq_div`, `clear`);
//! - decode: batch validation as `llama_batch_allocr::init` does it, slot search as `find_slot`
//!   (non-contiguous) and placement as `apply_ubatch`;
//! - serialization in the byte format of `llama_state_seq_get_data`, and restore of one
//!   sequence from it (`llama_state_seq_set_data`);
//! - optionally ([`CellCache::with_tensors`]), a tensor payload ([`tensors`]): per layer K, pre-RoPE
//!   K and V rows per cell, re-positioned on `seq_add`/`seq_div` by one rotation ([`rope`]) and
//!   attended under a per-layer sliding window keyed off absolute positions. Without it the cache
//!   is metadata only and pays nothing for it.
//!
//! With [`Faults::default()`] the cache is correct: the position index always equals the
//! multiset of resident positions. Each field of [`Faults`] re-creates a known bug class so that
//! a checker pointed at this cache has positive controls.

use std::fmt;

pub mod rope;
pub mod tensors;

use tensors::{narrower_window, window_lo, window_lo_index_keyed, TensorShape, TensorStore};

/// A token position, as `llama_pos`.
pub type Pos = i32;
/// A sequence id, as `llama_seq_id`.
pub type SeqId = i32;

/// The largest number of sequences this model tracks (llama.cpp allows 256; one `u64` bitset
/// per cell keeps this model small and fast).
pub const MAX_SEQ: usize = 64;

/// `LLAMA_STATE_SEQ_MAGIC`-adjacent header word that `llama_context::state_seq_get_data` writes
/// first (`io_magic` in src/llama-context.cpp).
pub const STATE_SEQ_MAGIC: u32 = 0xaf14_3cd8;

/// Known bug classes, re-created on purpose. All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// `seq_cp` adds the destination to a cell and increments its position count without
    /// checking that the cell already holds the destination: llama.cpp's behaviour from PR 14339
    /// (reference counts, 2025-06) to PR 28040 (2026-08) in release builds, where the
    /// `assert(!seq[i].test(seq_id))` of `llama_kv_cells::seq_add` is compiled out.
    pub refcount: bool,
    /// `seq_rm` treats a closed range end as inclusive (`[p0, p1]` instead of `[p0, p1)`).
    pub seq_rm_off_by_one: bool,
    /// `seq_add` moves cells without re-indexing them: the position index keeps the old
    /// positions (a stale derived index).
    pub seq_add_stale_index: bool,
    /// Tensor payload: `seq_add`/`seq_div` re-rotate a moved key by the position delta (a rotation
    /// composed onto the already rotated key, as llama.cpp's K-shift does) instead of once from its
    /// pre-RoPE row. Caught by T2.
    pub seq_add_delta_rotation: bool,
    /// Tensor payload: the sliding-window bound is read as an index into the sequence's keys
    /// instead of from the positions the cells hold ([`tensors::window_lo_index_keyed`]). Right
    /// until an eviction leaves a gap in the positions. Caught by T3.
    pub window_index_keyed: bool,
    /// Tensor payload: K/V rows land with KV heads 0 and 1 exchanged. Caught by T1.
    pub kv_head_swap: bool,
    /// Tensor payload: the rows of layer `l` land in the slot of layer `n_layer - 1 - l`. Caught
    /// by T1.
    pub kv_layer_swap: bool,
}

impl Faults {
    /// Every fault by name, for command lines and reports.
    pub const NAMES: [&'static str; 7] = [
        "refcount",
        "seq_rm_off_by_one",
        "seq_add_stale_index",
        "seq_add_delta_rotation",
        "window_index_keyed",
        "kv_head_swap",
        "kv_layer_swap",
    ];

    /// Turns on the fault called `name`; `false` if there is no such fault.
    pub fn enable(&mut self, name: &str) -> bool {
        match name {
            "refcount" => self.refcount = true,
            "seq_rm_off_by_one" => self.seq_rm_off_by_one = true,
            "seq_add_stale_index" => self.seq_add_stale_index = true,
            "seq_add_delta_rotation" => self.seq_add_delta_rotation = true,
            "window_index_keyed" => self.window_index_keyed = true,
            "kv_head_swap" => self.kv_head_swap = true,
            "kv_layer_swap" => self.kv_layer_swap = true,
            _ => return false,
        }
        true
    }

    /// The names of the faults that are on.
    pub fn enabled(&self) -> Vec<&'static str> {
        let flags = [
            self.refcount,
            self.seq_rm_off_by_one,
            self.seq_add_stale_index,
            self.seq_add_delta_rotation,
            self.window_index_keyed,
            self.kv_head_swap,
            self.kv_layer_swap,
        ];
        Self::NAMES
            .iter()
            .zip(flags)
            .filter(|(_, on)| *on)
            .map(|(name, _)| *name)
            .collect()
    }
}

/// The shape of a cache: how many cells and how many sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Number of cells (llama.cpp pads `n_ctx` to a multiple of 256).
    pub n_ctx: u32,
    /// Sequences `0..n_seq_max` are valid.
    pub n_seq_max: u32,
    /// Deliberate bugs, for positive controls.
    pub faults: Faults,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            n_ctx: 256,
            n_seq_max: 4,
            faults: Faults::default(),
        }
    }
}

/// Why a call was refused. llama.cpp aborts (`GGML_ASSERT`) on these; this model refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheError {
    /// A sequence id outside `0..n_seq_max` (or outside `-1..n_seq_max` where -1 means all).
    InvalidSeq(SeqId),
    /// `seq_div` with a divisor of 0 (llama.cpp divides by zero).
    ZeroDivisor,
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::InvalidSeq(s) => write!(f, "invalid sequence id {s}"),
            CacheError::ZeroDivisor => write!(f, "seq_div with divisor 0"),
        }
    }
}

impl std::error::Error for CacheError {}

/// Why serialized state could not be restored: `llama_state_seq_set_data` returns 0 in these
/// cases (and empties the destination sequence once it has started to fill it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreError {
    /// Byte offset at which the problem was found.
    pub offset: usize,
    /// What was wrong there.
    pub message: String,
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "state byte {}: {}", self.offset, self.message)
    }
}

impl std::error::Error for RestoreError {}

/// The layer count and K/V rows of `cells` (`state_write_data` with `v_trans` 0): per layer K
/// (type F32, row bytes, rows), then per layer V. Out of line, so that the metadata-only
/// serializer of the exhaustive audits' hot path stays as it was.
#[inline(never)]
fn write_rows_section(t: &TensorStore, cells: &[usize], out: &mut Vec<u8>) {
    let n_layer = t.shape().n_layer;
    let row_bytes = (t.width() * 4) as u64;
    out.reserve(4 + 2 * n_layer * (12 + cells.len() * row_bytes as usize));
    out.extend_from_slice(&(n_layer as u32).to_le_bytes());
    for rows_of in [TensorStore::k, TensorStore::v] {
        for l in 0..n_layer {
            out.extend_from_slice(&0i32.to_le_bytes()); // GGML_TYPE_F32
            out.extend_from_slice(&row_bytes.to_le_bytes());
            for &i in cells {
                for x in rows_of(t, i, l) {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
}

/// A little-endian reader over state bytes.
struct StateReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl StateReader<'_> {
    fn fail<T>(&self, message: String) -> Result<T, RestoreError> {
        Err(RestoreError {
            offset: self.at,
            message,
        })
    }

    fn take<const N: usize>(&mut self, what: &str) -> Result<[u8; N], RestoreError> {
        match self.bytes.get(self.at..self.at + N) {
            Some(b) => {
                self.at += N;
                Ok(b.try_into().expect("N bytes"))
            }
            None => self.fail(format!(
                "{what}: {N} bytes, found {}",
                self.bytes.len() - self.at
            )),
        }
    }

    fn u32(&mut self, what: &str) -> Result<u32, RestoreError> {
        self.take::<4>(what).map(u32::from_le_bytes)
    }

    fn i32(&mut self, what: &str) -> Result<i32, RestoreError> {
        self.take::<4>(what).map(i32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, RestoreError> {
        self.take::<8>(what).map(u64::from_le_bytes)
    }

    fn f32_rows(&mut self, n: usize, what: &str) -> Result<Vec<f32>, RestoreError> {
        let Some(b) = self.bytes.get(self.at..self.at + n * 4) else {
            return self.fail(format!("{what}: {n} f32 values"));
        };
        self.at += n * 4;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
}

/// Why a decode was refused, with the return code `llama_decode` gives for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The batch failed validation (`llama_batch_allocr::init` returned false): rc -1.
    InvalidBatch(String),
    /// No free cells for the batch (`find_slot` failed): rc 1.
    NoSlot,
}

impl DecodeError {
    /// The value `llama_decode` returns in this case.
    pub fn return_code(&self) -> i32 {
        match self {
            DecodeError::InvalidBatch(_) => -1,
            DecodeError::NoSlot => 1,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::InvalidBatch(why) => write!(f, "invalid batch: {why}"),
            DecodeError::NoSlot => write!(f, "no free KV cells for the batch"),
        }
    }
}

impl std::error::Error for DecodeError {}

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

/// Per-sequence position index: sorted (position, number of cells) pairs, the model of
/// `std::map<llama_pos, int> seq_pos[LLAMA_MAX_SEQ]` in llama-kv-cells.h.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PosIndex(Vec<(Pos, u32)>);

impl PosIndex {
    fn inc(&mut self, p: Pos) {
        match self.0.binary_search_by_key(&p, |e| e.0) {
            Ok(i) => self.0[i].1 += 1,
            Err(i) => self.0.insert(i, (p, 1)),
        }
    }

    /// Decrements the count of `p`. llama.cpp asserts that `p` is present; in release builds a
    /// missing entry is a no-op there too (`find` returns end and the decrement is skipped only
    /// by luck), so this model ignores it rather than corrupting memory.
    fn dec(&mut self, p: Pos) {
        if let Ok(i) = self.0.binary_search_by_key(&p, |e| e.0) {
            self.0[i].1 -= 1;
            if self.0[i].1 == 0 {
                self.0.remove(i);
            }
        }
    }

    fn min(&self) -> Pos {
        self.0.first().map_or(-1, |e| e.0)
    }

    fn max(&self) -> Pos {
        self.0.last().map_or(-1, |e| e.0)
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// The cell metadata of one stream, as `llama_kv_cells`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cells {
    pos: Vec<Pos>,
    shift: Vec<Pos>,
    seq: Vec<u64>,
    /// Number of non-empty cells (`used.size()`).
    used: u32,
    /// One past the highest non-empty cell, so loops can stop early; cells beyond are empty, so
    /// this changes no result of a loop that skips empty cells.
    used_max_p1: u32,
    seq_pos: Vec<PosIndex>,
}

impl Cells {
    fn new(n: u32, n_seq: u32) -> Self {
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

    fn reset(&mut self) {
        let end = self.used_max_p1 as usize;
        self.pos[..end].fill(-1);
        self.shift[..end].fill(0);
        self.seq[..end].fill(0);
        self.used = 0;
        self.used_max_p1 = 0;
        self.seq_pos.iter_mut().for_each(PosIndex::clear);
    }

    fn is_empty(&self, i: usize) -> bool {
        self.pos[i] == -1
    }

    fn seq_has(&self, i: usize, s: SeqId) -> bool {
        self.seq[i] & (1u64 << s) != 0
    }

    fn for_each_seq(bits: u64, mut f: impl FnMut(SeqId)) {
        let mut b = bits;
        while b != 0 {
            let s = b.trailing_zeros() as SeqId;
            f(s);
            b &= b - 1;
        }
    }

    /// `seq_pos_rm`: drops cell `i` from the index of every sequence it holds.
    fn index_remove(&mut self, i: usize) {
        let p = self.pos[i];
        let seq_pos = &mut self.seq_pos;
        Self::for_each_seq(self.seq[i], |s| seq_pos[s as usize].dec(p));
    }

    /// `seq_pos_add`: adds cell `i` to the index of every sequence it holds.
    fn index_add(&mut self, i: usize) {
        let p = self.pos[i];
        let seq_pos = &mut self.seq_pos;
        Self::for_each_seq(self.seq[i], |s| seq_pos[s as usize].inc(p));
    }

    fn mark_empty(&mut self, i: usize) {
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
    fn rm(&mut self, i: usize) {
        self.index_remove(i);
        self.mark_empty(i);
    }

    /// `seq_rm` of one cell holding `s`; true if the cell became empty.
    fn seq_rm(&mut self, i: usize, s: SeqId) -> bool {
        self.seq[i] &= !(1u64 << s);
        self.seq_pos[s as usize].dec(self.pos[i]);
        if self.seq[i] == 0 {
            self.mark_empty(i);
            return true;
        }
        false
    }

    /// `seq_keep` of one cell; true if the cell became empty.
    fn seq_keep(&mut self, i: usize, s: SeqId) -> bool {
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
    fn seq_add(&mut self, i: usize, s: SeqId) {
        self.seq[i] |= 1u64 << s;
        self.seq_pos[s as usize].inc(self.pos[i]);
    }

    fn pos_set(&mut self, i: usize, p: Pos) {
        self.pos[i] = p;
        self.used += 1;
        self.used_max_p1 = self.used_max_p1.max(i as u32 + 1);
    }

    /// `pos_add`; true if the cell was pushed below 0 and removed (for every sequence in it).
    fn pos_add(&mut self, i: usize, d: Pos, reindex: bool) -> bool {
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

    fn pos_div(&mut self, i: usize, d: i32) {
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
struct Span {
    p0: Pos,
    p1: Pos,
}

impl Span {
    fn new(p0: Pos, p1: Pos) -> Self {
        Span {
            p0: p0.max(0),
            p1: if p1 < 0 { Pos::MAX } else { p1 },
        }
    }

    fn contains(&self, p: Pos) -> bool {
        p >= self.p0 && p < self.p1
    }

    /// The off-by-one fault's inclusive end.
    fn contains_inclusive(&self, p: Pos) -> bool {
        p >= self.p0 && (p < self.p1 || (self.p1 != Pos::MAX && p == self.p1))
    }
}

/// A KV cell cache with one stream, modelled on llama.cpp's.
#[derive(Clone, Debug)]
pub struct CellCache {
    config: CacheConfig,
    cells: Cells,
    head: u32,
    /// The tensor payload, when the cache carries one (boxed: a metadata-only cache, cloned on
    /// every fork by the explorer, grows by one pointer).
    tensors: Option<Box<TensorStore>>,
}

impl CellCache {
    /// An empty cache.
    pub fn new(config: CacheConfig) -> Self {
        assert!(
            config.n_seq_max as usize <= MAX_SEQ,
            "n_seq_max above {MAX_SEQ}"
        );
        CellCache {
            config,
            cells: Cells::new(config.n_ctx, config.n_seq_max),
            head: 0,
            tensors: None,
        }
    }

    /// An empty cache with a tensor payload of `shape` (the tensor faults of `config` apply to it).
    ///
    /// # Panics
    /// As [`CellCache::new`] and [`TensorStore::new`].
    pub fn with_tensors(config: CacheConfig, shape: TensorShape) -> Self {
        let mut c = Self::new(config);
        c.tensors = Some(Box::new(TensorStore::new(shape, config.faults)));
        c
    }

    /// The tensor payload, if the cache carries one.
    pub fn tensors(&self) -> Option<&TensorStore> {
        self.tensors.as_deref()
    }

    /// The position of `cell`, or `None` when it is empty or out of range.
    pub fn cell_pos(&self, cell: usize) -> Option<Pos> {
        match self.cells.pos.get(cell) {
            Some(&p) if p != -1 => Some(p),
            _ => None,
        }
    }

    /// Stores the rows the model computed for the token in `cell` at `layer` (see
    /// [`TensorStore`] for the faults that apply).
    ///
    /// # Panics
    /// When the cache has no tensor payload, the cell is empty, or a row has the wrong width.
    pub fn write_rows(&mut self, cell: usize, layer: usize, k_raw: &[f32], k: &[f32], v: &[f32]) {
        assert!(
            self.cell_pos(cell).is_some(),
            "write_rows: cell {cell} is empty"
        );
        self.tensors
            .as_mut()
            .expect("write_rows: the cache has no tensor payload")
            .write(cell, layer, k_raw, k, v);
    }

    /// The cells a query of sequence `seq` at `query_pos` attends in `layer`, oldest first: the
    /// cells holding `seq` at a position `<= query_pos` whose rows for `layer` are written (a
    /// token placed by the same decode but not yet computed is not), cut by the narrower of
    /// `window` and the layer's own window at the first key whose *position* is in the window
    /// ([`window_lo`]). Ordered by (position, cell), so attention does not depend on where
    /// cells happen to lie, as the masked attention over a batch does not.
    ///
    /// # Panics
    /// When the cache has no tensor payload or `layer` is out of range.
    pub fn attention_cells(
        &self,
        seq: SeqId,
        query_pos: Pos,
        layer: usize,
        window: Option<u32>,
    ) -> Result<Vec<usize>, CacheError> {
        self.check_seq(seq)?;
        let t = self
            .tensors
            .as_ref()
            .expect("attention_cells: the cache has no tensor payload");
        let mut keys: Vec<(Pos, usize)> = (0..self.end())
            .filter(|&i| {
                !self.cells.is_empty(i)
                    && self.cells.seq_has(i, seq)
                    && self.cells.pos[i] <= query_pos
                    && t.written(i, layer)
            })
            .map(|i| (self.cells.pos[i], i))
            .collect();
        keys.sort_unstable();
        let window = narrower_window(window, t.shape().windows[layer]);
        let lo = if self.config.faults.window_index_keyed {
            window_lo_index_keyed(keys.len(), query_pos, window)
        } else {
            let positions: Vec<Pos> = keys.iter().map(|k| k.0).collect();
            window_lo(&positions, query_pos, window)
        };
        Ok(keys[lo..].iter().map(|k| k.1).collect())
    }

    /// The configuration this cache was made with.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    fn check_seq(&self, s: SeqId) -> Result<(), CacheError> {
        if s < 0 || s as u32 >= self.config.n_seq_max {
            return Err(CacheError::InvalidSeq(s));
        }
        Ok(())
    }

    fn end(&self) -> usize {
        self.cells.used_max_p1 as usize
    }

    /// `llama_memory_clear`: empties every cell.
    pub fn clear(&mut self) {
        self.cells.reset();
        self.head = 0;
        if let Some(t) = &mut self.tensors {
            t.clear();
        }
    }

    /// `llama_memory_seq_rm`: removes `seq` (every sequence when -1) from the cells whose position
    /// is in `[p0, p1)`. Always true for this cache type, as in llama.cpp. The rows of a cell it
    /// empties are dead: nothing reads an empty cell, and placement zeroes the rows again.
    pub fn seq_rm(&mut self, seq: SeqId, p0: Pos, p1: Pos) -> Result<bool, CacheError> {
        if seq != -1 {
            self.check_seq(seq)?;
        }
        let span = Span::new(p0, p1);
        let off_by_one = self.config.faults.seq_rm_off_by_one;
        let mut new_head: Option<usize> = None;
        for i in 0..self.end() {
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
            let freed = if seq == -1 {
                self.cells.rm(i);
                true
            } else {
                self.cells.seq_has(i, seq) && self.cells.seq_rm(i, seq)
            };
            if freed && new_head.is_none() {
                new_head = Some(i);
            }
        }
        if let Some(h) = new_head {
            if (h as u32) < self.head {
                self.head = h as u32;
            }
        }
        Ok(true)
    }

    /// `llama_memory_seq_cp` within one stream: adds `dst` to every cell of `src` in `[p0, p1)`.
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) -> Result<(), CacheError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        if src == dst {
            return Ok(());
        }
        let span = Span::new(p0, p1);
        for i in 0..self.end() {
            if self.cells.is_empty(i) || !span.contains(self.cells.pos[i]) {
                continue;
            }
            if !self.cells.seq_has(i, src) {
                continue;
            }
            // The check llama.cpp's seq_cp leaves out (see Faults::refcount).
            if self.cells.seq_has(i, dst) && !self.config.faults.refcount {
                continue;
            }
            self.cells.seq_add(i, dst);
        }
        Ok(())
    }

    /// `llama_memory_seq_keep`: removes every sequence but `seq` from every cell.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), CacheError> {
        self.check_seq(seq)?;
        let mut new_head: Option<usize> = None;
        for i in 0..self.end() {
            if self.cells.is_empty(i) {
                continue;
            }
            if self.cells.seq_keep(i, seq) && new_head.is_none() {
                new_head = Some(i);
            }
        }
        if let Some(h) = new_head {
            if (h as u32) < self.head {
                self.head = h as u32;
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
        let mut new_head: Option<usize> = None;
        for i in 0..self.end() {
            if self.cells.is_empty(i) || !span.contains(self.cells.pos[i]) {
                continue;
            }
            if self.cells.seq_has(i, seq) {
                let old = self.cells.pos[i];
                if self.cells.pos_add(i, delta, reindex) {
                    if new_head.is_none() {
                        new_head = Some(i);
                    }
                } else if let Some(t) = &mut self.tensors {
                    t.reposition(i, old, self.cells.pos[i]);
                }
            }
        }
        self.head = new_head.map_or(0, |h| h as u32);
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
        for i in 0..self.end() {
            if self.cells.is_empty(i) || !span.contains(self.cells.pos[i]) {
                continue;
            }
            if self.cells.seq_has(i, seq) {
                let old = self.cells.pos[i];
                self.cells.pos_div(i, d);
                if let Some(t) = &mut self.tensors {
                    t.reposition(i, old, self.cells.pos[i]);
                }
            }
        }
        Ok(())
    }

    /// `llama_memory_seq_pos_min`: the smallest position of `seq` according to the position
    /// index, -1 when empty.
    pub fn seq_pos_min(&self, seq: SeqId) -> Result<Pos, CacheError> {
        self.check_seq(seq)?;
        Ok(self.cells.seq_pos[seq as usize].min())
    }

    /// `llama_memory_seq_pos_max`: the largest position of `seq` according to the position
    /// index, -1 when empty.
    pub fn seq_pos_max(&self, seq: SeqId) -> Result<Pos, CacheError> {
        self.check_seq(seq)?;
        Ok(self.cells.seq_pos[seq as usize].max())
    }

    /// Number of non-empty cells.
    pub fn used_cells(&self) -> u32 {
        self.cells.used
    }

    /// The resident cells, in cell order: (cell index, position, sequence bitset).
    pub fn resident_cells(&self) -> impl Iterator<Item = (usize, Pos, u64)> + '_ {
        (0..self.end())
            .filter(|&i| !self.cells.is_empty(i))
            .map(|i| (i, self.cells.pos[i], self.cells.seq[i]))
    }

    /// Resolves the positions of a batch: explicit ones as given, "next" ones from the position
    /// index of the token's first sequence, as `llama_batch_allocr::init` does when
    /// `batch.pos == NULL`.
    pub fn resolve_positions(&self, batch: &[BatchToken]) -> Result<Vec<Pos>, DecodeError> {
        let n_seq = self.config.n_seq_max as usize;
        let mut next: Vec<Pos> = (0..n_seq)
            .map(|s| self.cells.seq_pos[s].max() + 1)
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
            let p0 = self.cells.seq_pos[s].max();
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
                let (a, b) = (&self.cells.seq_pos[s0], &self.cells.seq_pos[s1 as usize]);
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

    /// `find_slot(ubatch, cont = false)` for one stream without a sliding window: the cells the
    /// batch will occupy, searched from `head` with wrap-around.
    fn find_slot(&self, n_tokens: usize) -> Option<Vec<usize>> {
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

    /// `llama_decode` of a batch, metadata side: validate, find a slot, place the tokens.
    /// Returns the cells used, in batch order. On error the cache is unchanged. With a tensor
    /// payload the placed cells' rows are zeroed, to be written by the model
    /// ([`CellCache::write_rows`]) token by token in batch order.
    pub fn decode(&mut self, batch: &[BatchToken]) -> Result<Vec<usize>, DecodeError> {
        if batch.is_empty() {
            return Err(DecodeError::InvalidBatch("n_tokens == 0".into()));
        }
        let pos = self.resolve_positions(batch)?;
        self.validate(batch, &pos)?;
        let idxs = self.find_slot(batch.len()).ok_or(DecodeError::NoSlot)?;
        for ((t, &p), &idx) in batch.iter().zip(&pos).zip(&idxs) {
            self.cells.pos_set(idx, p);
            for &s in &t.seqs {
                self.cells.seq_add(idx, s);
            }
            if let Some(ts) = &mut self.tensors {
                ts.place(idx, p);
            }
        }
        self.head = *idxs.last().expect("non-empty batch") as u32 + 1;
        // Shifts are applied at the next decode (llama_kv_cache::update); the metadata forgets them.
        self.cells.shift.iter_mut().for_each(|s| *s = 0);
        Ok(idxs)
    }

    /// The bytes `llama_state_seq_get_data(ctx, seq)` would produce for this cache: the header
    /// (magic, seq id), one stream, the cells of `seq` in cell order (each listing only `seq`,
    /// as `state_write_meta` does for a specific sequence), then the K/V section
    /// (`state_write_data`: `v_trans` 0, `n_layer`, then per layer the K rows of those cells, type
    /// F32 (0) and `n_kv_heads * head_dim * 4` bytes a row, then the V rows likewise; without a
    /// tensor payload, `n_layer` 0). `seq == -1` gives the whole cache, every cell with all its
    /// sequences.
    pub fn state_seq_bytes(&self, seq: SeqId) -> Result<Vec<u8>, CacheError> {
        if seq != -1 {
            self.check_seq(seq)?;
        }
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&STATE_SEQ_MAGIC.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes()); // n_stream
        let cells: Vec<usize> = (0..self.end())
            .filter(|&i| !self.cells.is_empty(i) && (seq == -1 || self.cells.seq_has(i, seq)))
            .collect();
        out.extend_from_slice(&(cells.len() as u32).to_le_bytes());
        if cells.is_empty() {
            return Ok(out);
        }
        for &i in &cells {
            out.extend_from_slice(&self.cells.pos[i].to_le_bytes());
            let seqs: Vec<SeqId> = if seq == -1 {
                let mut v = Vec::new();
                Cells::for_each_seq(self.cells.seq[i], |s| v.push(s));
                v
            } else {
                vec![seq]
            };
            out.extend_from_slice(&(seqs.len() as u32).to_le_bytes());
            for s in seqs {
                out.extend_from_slice(&s.to_le_bytes());
            }
        }
        out.extend_from_slice(&0u32.to_le_bytes()); // v_trans
        match &self.tensors {
            None => out.extend_from_slice(&0u32.to_le_bytes()), // n_layer: no tensor payload
            Some(t) => write_rows_section(t, &cells, &mut out),
        }
        Ok(out)
    }

    /// `llama_state_seq_set_data(ctx, bytes, seq)`: restores the cells and rows serialized by
    /// [`CellCache::state_seq_bytes`] (of any sequence) into `seq`, as
    /// `llama_kv_cache::state_read` does for one sequence: every cell must list exactly one
    /// sequence; `seq` is emptied, the cells are placed by the decode slot search and take `seq`,
    /// then the K/V section must match this cache's (same `v_trans`, layer count, type and row
    /// size) and its rows are copied in. A state with no cells leaves `seq` as it is. Restored keys
    /// have no pre-RoPE row, so a later `seq_add` can only compose a rotation onto them
    /// ([`TensorStore::reposition`]). Returns the number of bytes read.
    pub fn state_seq_set_bytes(&mut self, seq: SeqId, bytes: &[u8]) -> Result<usize, RestoreError> {
        let refuse = |message: String| RestoreError { offset: 0, message };
        if seq < 0 {
            return Err(refuse(format!(
                "restoring the whole cache (seq {seq}) is not modelled"
            )));
        }
        self.check_seq(seq).map_err(|e| refuse(e.to_string()))?;
        let mut r = StateReader { bytes, at: 0 };
        let magic = r.u32("magic")?;
        if magic != STATE_SEQ_MAGIC {
            r.at = 0;
            return r.fail(format!(
                "magic 0x{STATE_SEQ_MAGIC:08x}, found 0x{magic:08x}"
            ));
        }
        r.i32("seq id")?; // read and ignored, as llama.cpp does
        let n_stream = r.u32("n_stream")?;
        if n_stream != 1 {
            return r.fail(format!("n_stream 1, found {n_stream}"));
        }
        let cell_count = r.u32("cell_count")?;
        if cell_count == 0 {
            return Ok(r.at);
        }
        self.seq_rm(seq, -1, -1).expect("seq checked");
        let res = self.restore_cells(seq, cell_count, &mut r);
        if res.is_err() {
            self.seq_rm(seq, -1, -1).expect("seq checked");
        }
        res.map(|()| r.at)
    }

    fn restore_cells(
        &mut self,
        seq: SeqId,
        cell_count: u32,
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        if cell_count as usize > self.cells.pos.len() {
            return r.fail(format!(
                "{cell_count} cells do not fit the {} of this cache",
                self.cells.pos.len()
            ));
        }
        let mut pos = Vec::with_capacity(cell_count as usize);
        for _ in 0..cell_count {
            let p = r.i32("cell pos")?;
            if p < 0 {
                return r.fail(format!("a cell position >= 0, found {p}"));
            }
            let n_seq = r.u32("cell n_seq_id")?;
            if n_seq != 1 {
                return r.fail(format!(
                    "a cell with exactly one sequence id, found {n_seq} (invalid seq_id-agnostic kv cell)"
                ));
            }
            r.i32("cell seq id")?;
            pos.push(p);
        }
        let at = r.at;
        let idxs = self.find_slot(pos.len()).ok_or_else(|| RestoreError {
            offset: at,
            message: format!("failed to find {cell_count} available cells"),
        })?;
        for (&idx, &p) in idxs.iter().zip(&pos) {
            self.cells.pos_set(idx, p);
            self.cells.seq_add(idx, seq);
            if let Some(t) = &mut self.tensors {
                t.place(idx, p);
            }
        }
        self.head = *idxs.last().expect("cell_count > 0") as u32 + 1;

        let v_trans = r.u32("v_trans")?;
        if v_trans != 0 {
            return r.fail(format!("v_trans 0 (this cache), found {v_trans}"));
        }
        let n_layer = r.u32("n_layer")? as usize;
        let (want_layers, width) = self
            .tensors
            .as_ref()
            .map_or((0, 0), |t| (t.shape().n_layer, t.width()));
        if n_layer != want_layers {
            return r.fail(format!(
                "{want_layers} layers (this cache), found {n_layer}"
            ));
        }
        for is_k in [true, false] {
            let what = if is_k { "K" } else { "V" };
            for l in 0..n_layer {
                let ty = r.i32(&format!("{what} type"))?;
                if ty != 0 {
                    return r.fail(format!("{what} type 0 (F32) in layer {l}, found {ty}"));
                }
                let row_bytes = r.u64(&format!("{what} row bytes"))?;
                if row_bytes != (width * 4) as u64 {
                    return r.fail(format!(
                        "{what} rows of {} bytes in layer {l}, found {row_bytes}",
                        width * 4
                    ));
                }
                for &idx in &idxs {
                    let row = r.f32_rows(width, &format!("{what} row"))?;
                    let t = self.tensors.as_mut().expect("n_layer > 0 means tensors");
                    if is_k {
                        t.restore(idx, l, Some(&row), None);
                    } else {
                        t.restore(idx, l, None, Some(&row));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
