//! A Rust model of llama.cpp's KV cell cache (`llama_kv_cache`, attention layers).
//!
//! This crate is a KV cache that could be used on its own: it knows nothing of kvaudit. It models
//! the bookkeeping of `llama_kv_cells` (src/llama-kv-cells.h) and the sequence operations of
//! `llama_kv_cache` (src/llama-kv-cache.cpp) in llama.cpp (read against llama-cpp-sys-2 0.1.161):
//!
//! - streams: one shared by every sequence ([`CacheConfig::unified`]), or one per sequence
//!   (`seq_to_stream[s] = s`), each of [`CacheConfig::n_ctx`] cells with its own head. An op on a
//!   sequence works in that sequence's stream only (`seq_keep` leaves other streams alone);
//!   `seq_rm(-1, ..)` and `clear` go over all of them; a `seq_cp` across streams copies the whole
//!   stream or, for part of a sequence, is refused where llama.cpp aborts;
//! - cells with a position, an accumulated shift and a sequence bitset;
//! - a per-sequence position index (position -> number of cells) that answers
//!   `seq_pos_min`/`seq_pos_max`, maintained one cell at a time as llama.cpp does;
//! - the six memory operations (`seq_rm`, `seq_cp`, `seq_keep`, `seq_add`, `seq_div`, `clear`);
//! - decode: batch validation as `llama_batch_allocr::init` does it, slot search as `find_slot`
//!   (non-contiguous, per stream) and placement as `apply_ubatch`; a batch that does not fit its
//!   stream fails with rc 1;
//! - serialization ([`state`]) in the byte formats of `llama_state_seq_get_data` and
//!   `llama_state_get_data`, and restore from them along llama.cpp's own failure paths;
//! - optionally ([`CellCache::with_tensors`]), a tensor payload ([`tensors`]): per layer K, pre-RoPE
//!   K and V rows per cell, re-positioned on `seq_add`/`seq_div` by one rotation ([`rope`]) and
//!   attended under a per-layer sliding window keyed off absolute positions. Without it the cache
//!   is metadata only and pays nothing for it.
//!
//! Flash attention and the K/V cache types are not part of the model: they change how llama.cpp
//! lays rows out (transposed V, quantized blocks), not which cells hold what.
//!
//! Sequence ids: `0..n_seq_max` are accepted. llama.cpp aborts on larger ids with one stream per
//! sequence (`GGML_ASSERT(seq_id < seq_to_stream.size())`) and, unified, accepts ids up to
//! `LLAMA_MAX_SEQ` (256) in memory ops while its decode refuses them; this model refuses them
//! ([`CacheError::InvalidSeq`]) in memory ops too.
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
    /// Whole-context and per-sequence loads ([`CellCache::state_set_bytes`],
    /// [`CellCache::state_seq_set_bytes`]) lose the last cell they read, and still report
    /// success. Positive control for the round-trip oracle: a dump loaded into an empty twin no
    /// longer equals the original. Invisible to I1/I2 on one target (the index follows the
    /// removal, no trace op loads state unless it asks to).
    pub restore_drops_last_cell: bool,
    /// When `seq_rm` removes a cell's last sequence, the cell stays used with no sequence (the
    /// model of a `seq_rm` that forgets `used.erase`). Per-sequence dumps and accessors are
    /// unaffected (I1, I2 see nothing); the whole-context dump lists a cell with no sequence.
    /// Positive control for the conservation oracle.
    pub orphan_cell: bool,
    /// `seq_keep` does nothing. Positive control for the contract oracle: llama.h says
    /// `llama_memory_seq_keep` "removes all tokens that do not belong to the specified sequence";
    /// the index stays consistent with the cells, so I1/I2 see nothing.
    pub keep_noop: bool,
    /// Only with one stream per sequence (`kv_unified = false`): a partial `seq_rm` of one
    /// sequence removes the whole sequence. Positive control for the configuration-differential
    /// oracle: the same trace unified and per-sequence differs, while each configuration on its
    /// own stays consistent (I1/I2).
    pub streams_rm_whole: bool,
    /// Tensor payload: a cross-stream `seq_cp` copies the K/V rows of the wrong cells
    /// ([`tensors::TensorStore`]); cells and accessors are right. Caught by cache-invisible.
    pub stream_copy_wrong_rows: bool,
}

impl Faults {
    /// Every fault by name, for command lines and reports.
    pub const NAMES: [&'static str; 12] = [
        "refcount",
        "seq_rm_off_by_one",
        "seq_add_stale_index",
        "seq_add_delta_rotation",
        "window_index_keyed",
        "kv_head_swap",
        "kv_layer_swap",
        "restore_drops_last_cell",
        "orphan_cell",
        "keep_noop",
        "streams_rm_whole",
        "stream_copy_wrong_rows",
    ];

    fn flag_mut(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "refcount" => &mut self.refcount,
            "seq_rm_off_by_one" => &mut self.seq_rm_off_by_one,
            "seq_add_stale_index" => &mut self.seq_add_stale_index,
            "seq_add_delta_rotation" => &mut self.seq_add_delta_rotation,
            "window_index_keyed" => &mut self.window_index_keyed,
            "kv_head_swap" => &mut self.kv_head_swap,
            "kv_layer_swap" => &mut self.kv_layer_swap,
            "restore_drops_last_cell" => &mut self.restore_drops_last_cell,
            "orphan_cell" => &mut self.orphan_cell,
            "keep_noop" => &mut self.keep_noop,
            "streams_rm_whole" => &mut self.streams_rm_whole,
            "stream_copy_wrong_rows" => &mut self.stream_copy_wrong_rows,
            _ => return None,
        })
    }

    /// Turns on the fault called `name`; `false` if there is no such fault.
    pub fn enable(&mut self, name: &str) -> bool {
        match self.flag_mut(name) {
            Some(f) => {
                *f = true;
                true
            }
            None => false,
        }
    }

    /// The names of the faults that are on.
    pub fn enabled(&self) -> Vec<&'static str> {
        let mut probe = *self;
        Self::NAMES
            .iter()
            .filter(|name| probe.flag_mut(name).is_some_and(|f| *f))
            .copied()
            .collect()
    }
}

/// The shape of a cache: how many cells per stream, how many sequences, how many streams.
///
/// Only the cell bookkeeping is modelled: flash attention and the K/V cache types change how
/// llama.cpp stores rows (transposed V, quantized blocks) but not which cells are used, where a
/// token goes, or what the positions are, so they have no field here. Capacity does: a decode
/// that does not fit its stream fails with rc 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Number of cells *per stream* (llama.cpp's `kv_size`: `n_ctx` padded to a multiple of 256
    /// when unified, `n_ctx_seq` = `pad(n_ctx / n_seq_max, 256)` per stream otherwise; the caller
    /// pads, see `llama_context::llama_context` in src/llama-context.cpp).
    pub n_ctx: u32,
    /// Sequences `0..n_seq_max` are valid.
    pub n_seq_max: u32,
    /// One stream shared by every sequence (`kv_unified`). False: one stream per sequence, as
    /// `llama_kv_cache` makes when `n_stream = n_seq_max` (`seq_to_stream[s] = s`).
    pub unified: bool,
    /// Deliberate bugs, for positive controls.
    pub faults: Faults,
}

impl CacheConfig {
    /// The number of streams: 1 when unified, else one per sequence.
    pub fn n_stream(&self) -> u32 {
        if self.unified {
            1
        } else {
            self.n_seq_max.max(1)
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            n_ctx: 256,
            n_seq_max: 4,
            unified: true,
            faults: Faults::default(),
        }
    }
}

/// Why a call was refused. llama.cpp aborts (`GGML_ASSERT`) on these; this model refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheError {
    /// A sequence id outside `0..n_seq_max` (or outside `-1..n_seq_max` where -1 means all).
    /// llama.cpp: with one stream per sequence, `GGML_ASSERT(seq_id < seq_to_stream.size())`
    /// aborts; unified, it accepts ids up to `LLAMA_MAX_SEQ` (256), which this model does not
    /// track (one `u64` per cell).
    InvalidSeq(SeqId),
    /// `seq_div` with a divisor of 0 (llama.cpp divides by zero).
    ZeroDivisor,
    /// A `seq_cp` between two streams of part of a sequence: llama.cpp aborts with
    /// `GGML_ASSERT(is_full && "seq_cp() is only supported for full KV buffers")`.
    PartialCrossStreamCopy {
        /// Source sequence.
        src: SeqId,
        /// Destination sequence.
        dst: SeqId,
        /// Range start as given.
        p0: Pos,
        /// Range end as given.
        p1: Pos,
    },
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::InvalidSeq(s) => write!(f, "invalid sequence id {s}"),
            CacheError::ZeroDivisor => write!(f, "seq_div with divisor 0"),
            CacheError::PartialCrossStreamCopy { src, dst, p0, p1 } => write!(
                f,
                "seq_cp({src}, {dst}, {p0}, {p1}) copies part of a sequence across streams: \
                 llama.cpp aborts (GGML_ASSERT: seq_cp() is only supported for full KV buffers)"
            ),
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
    /// With `orphan` ([`Faults::orphan_cell`]) a cell that loses its last sequence stays used.
    fn seq_rm(&mut self, i: usize, s: SeqId, orphan: bool) -> bool {
        self.seq[i] &= !(1u64 << s);
        self.seq_pos[s as usize].dec(self.pos[i]);
        if self.seq[i] == 0 && !orphan {
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

/// One stream: its cells and the head where the next slot search starts (`v_cells[s]`,
/// `v_heads[s]` in `llama_kv_cache`).
#[derive(Clone, Debug)]
struct Stream {
    cells: Cells,
    head: u32,
}

/// A KV cell cache modelled on llama.cpp's `llama_kv_cache`: one stream shared by every sequence
/// (unified), or one stream per sequence ([`CacheConfig::unified`] false).
///
/// Cells are numbered across streams: cell `i` of stream `s` is `s * n_ctx + i`
/// ([`CellCache::decode`], [`CellCache::resident_cells`], [`CellCache::cell_pos`]); unified, that is
/// the cell index itself.
#[derive(Clone, Debug)]
pub struct CellCache {
    config: CacheConfig,
    /// One stream when unified, `n_seq_max` otherwise.
    streams: Vec<Stream>,
    /// The tensor payload, when the cache carries one (boxed: a metadata-only cache, cloned on
    /// every fork by the explorer, grows by one pointer). Indexed by cell number across streams.
    tensors: Option<Box<TensorStore>>,
}

impl CellCache {
    /// An empty cache.
    ///
    /// # Panics
    /// When `n_seq_max` is above [`MAX_SEQ`].
    pub fn new(config: CacheConfig) -> Self {
        assert!(
            config.n_seq_max as usize <= MAX_SEQ,
            "n_seq_max above {MAX_SEQ}"
        );
        let stream = Stream {
            cells: Cells::new(config.n_ctx, config.n_seq_max),
            head: 0,
        };
        CellCache {
            config,
            streams: vec![stream; config.n_stream() as usize],
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

    /// Cells per stream.
    fn size(&self) -> usize {
        self.config.n_ctx as usize
    }

    /// The stream of sequence `seq` (`seq_to_stream`): 0 when unified, else `seq` itself.
    #[inline]
    fn stream_of(&self, seq: SeqId) -> usize {
        if self.streams.len() == 1 {
            0
        } else {
            seq as usize
        }
    }

    /// The cell number of cell `i` of stream `s`.
    #[inline]
    fn global(&self, s: usize, i: usize) -> usize {
        s * self.size() + i
    }

    /// The position of `cell` (numbered across streams), or `None` when it is empty or out of
    /// range.
    pub fn cell_pos(&self, cell: usize) -> Option<Pos> {
        let n = self.size().max(1);
        let st = self.streams.get(cell / n)?;
        match st.cells.pos.get(cell % n) {
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
    /// cells of the sequence's stream holding `seq` at a position `<= query_pos` whose rows for
    /// `layer` are written (a token placed by the same decode but not yet computed is not), cut by
    /// the narrower of `window` and the layer's own window at the first key whose *position* is
    /// in the window ([`window_lo`]). Ordered by (position, cell), so attention does not depend on
    /// where cells happen to lie, as the masked attention over a batch does not.
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
        let s = self.stream_of(seq);
        let cells = &self.streams[s].cells;
        let mut keys: Vec<(Pos, usize)> = (0..cells.used_max_p1 as usize)
            .map(|i| (i, self.global(s, i)))
            .filter(|&(i, g)| {
                !cells.is_empty(i)
                    && cells.seq_has(i, seq)
                    && cells.pos[i] <= query_pos
                    && t.written(g, layer)
            })
            .map(|(i, g)| (cells.pos[i], g))
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

    /// `Ok` when `s` names a sequence of this cache (`0..n_seq_max`).
    pub fn check_seq(&self, s: SeqId) -> Result<(), CacheError> {
        if s < 0 || s as u32 >= self.config.n_seq_max {
            return Err(CacheError::InvalidSeq(s));
        }
        Ok(())
    }

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

    /// The position index of `seq` (in its stream).
    #[inline]
    fn index_of(&self, seq: SeqId) -> &PosIndex {
        &self.streams[self.stream_of(seq)].cells.seq_pos[seq as usize]
    }

    /// `llama_memory_seq_pos_min`: the smallest position of `seq` according to the position
    /// index, -1 when empty.
    pub fn seq_pos_min(&self, seq: SeqId) -> Result<Pos, CacheError> {
        self.check_seq(seq)?;
        Ok(self.index_of(seq).min())
    }

    /// `llama_memory_seq_pos_max`: the largest position of `seq` according to the position
    /// index, -1 when empty.
    pub fn seq_pos_max(&self, seq: SeqId) -> Result<Pos, CacheError> {
        self.check_seq(seq)?;
        Ok(self.index_of(seq).max())
    }

    /// Number of non-empty cells, over every stream.
    pub fn used_cells(&self) -> u32 {
        self.streams.iter().map(|st| st.cells.used).sum()
    }

    /// The resident cells, stream by stream in cell order: (cell number, position, sequence
    /// bitset). A cell with no sequence (only under [`Faults::orphan_cell`], or loaded from a
    /// whole-context state that lists one) has an empty bitset.
    pub fn resident_cells(&self) -> impl Iterator<Item = (usize, Pos, u64)> + '_ {
        self.streams.iter().enumerate().flat_map(move |(s, st)| {
            (0..st.cells.used_max_p1 as usize)
                .filter(|&i| !st.cells.is_empty(i))
                .map(move |i| (self.global(s, i), st.cells.pos[i], st.cells.seq[i]))
        })
    }

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

impl Stream {
    /// `seq_rm(-1, ..)` on this stream: every cell in the span is removed.
    fn seq_rm_all(&mut self, span: Span, off_by_one: bool) {
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
    fn seq_rm_one(&mut self, seq: SeqId, span: Span, faults: Faults) {
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

    fn lower_head(&mut self, new_head: Option<usize>) {
        if let Some(h) = new_head {
            if (h as u32) < self.head {
                self.head = h as u32;
            }
        }
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
}

pub mod state;
pub use state::{state_seq_header, STATE_ARCH};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_streams;
