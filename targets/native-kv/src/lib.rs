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
//! The other memory types of llama.cpp ([`memory`]: `llama_kv_cache_iswa`, `llama_memory_recurrent`
//! in [`recurrent`], `llama_memory_hybrid`) are built from this cache and behind one API,
//! [`Memory`] and [`MemoryOps`]. A [`CellCache::windowed`] cache is the windowed half of an iSWA
//! memory: its slot search overwrites cells masked for their sequence's next token and purges
//! what it overwrote, as `find_slot` / `apply_ubatch` do.
//!
//! Modules: `faults` ([`Faults`]), `error`, `cells` (`llama_kv_cells`: positions, bitsets, the
//! position index), `stream` (one stream: removals, slot search, the window), `ops` (the memory
//! operations), `batch` (batch validation, decode, placement), [`state`] (dumps and loads),
//! [`memory`], [`recurrent`], [`tensors`], [`rope`], [`key`] (the state key a state-space
//! explorer deduplicates by).
//!
//! With [`Faults::default()`] the cache is correct: the position index always equals the
//! multiset of resident positions. Each field of [`Faults`] re-creates a known bug class so that
//! a checker pointed at this cache has positive controls.

mod batch;
mod cells;
mod error;
mod faults;
pub mod key;
pub mod memory;
mod ops;
pub mod recurrent;
pub mod rope;
pub mod state;
mod stream;
pub mod tensors;

pub use batch::{check_batch, resolve_positions, BatchToken, SeqRanges};
pub use error::{CacheError, DecodeError, RestoreError};
pub use faults::Faults;
pub use key::{KeyScope, NoKey};
pub use memory::{iswa_swa_size, Memory, MemoryConfig, MemoryKind, MemoryOps};
pub use recurrent::{RecurrentCache, RecurrentConfig, RecurrentShape};
pub use state::{state_seq_header, STATE_ARCH};

use cells::{Cells, PosIndex};
use stream::Stream;
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
    /// The sliding window of a windowed cache (the SWA half of an iSWA memory), 0 for none:
    /// `n_swa` with `LLAMA_SWA_TYPE_STANDARD` (src/llama-kv-cache-iswa.cpp:96-99).
    n_swa: u32,
    /// Whether the cells of its dumps carry a `llama_kv_cell_ext` ([`CellCache::with_cell_ext`]).
    cell_ext: bool,
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
            n_swa: 0,
            cell_ext: false,
        }
    }

    /// An empty cache whose dumps give every cell a `llama_kv_cell_ext` after its `n_seq_id`
    /// (i32 x, i32 y, i32 token: 12 bytes), as llama.cpp's cache of an M-RoPE model does
    /// (`has_cell_ext`, src/llama-kv-cache.cpp:1846-1849; `state_write_meta` :2238-2241, read
    /// back by `state_read_meta` :2386-2399 and :2487-2491 in 0.1.161): the attention cache of a
    /// hybrid-idx memory (qwen4exp ropes with IMRoPE). A text token's 2D position is its position
    /// in both sections (`llama_batch_allocr` expands `[p]` to `[p, p, p, 0]`,
    /// src/llama-batch.cpp:128-145); this model keeps no token ids, so it writes
    /// `LLAMA_TOKEN_NULL` where llama.cpp writes the decoded token. A load reads the ext and
    /// drops it (nothing here reads a 2D position or a token).
    ///
    /// # Panics
    /// As [`CellCache::new`].
    pub fn with_cell_ext(config: CacheConfig) -> Self {
        let mut c = Self::new(config);
        c.cell_ext = true;
        c
    }

    /// An empty windowed cache: the SWA cache of an iSWA memory, with window `n_swa` (> 0). Its
    /// slot search reuses cells masked for their sequence's next token, and its decode purges
    /// what it overwrote ([`CellCache::decode`]); its per-sequence dump leaves out masked cells
    /// ([`CellCache::state_seq_bytes`]).
    ///
    /// # Panics
    /// As [`CellCache::new`].
    pub fn windowed(config: CacheConfig, n_swa: u32) -> Self {
        let mut c = Self::new(config);
        c.n_swa = n_swa;
        c
    }

    /// The sliding window, 0 for a cache without one.
    pub fn n_swa(&self) -> u32 {
        self.n_swa
    }

    /// The window the slot search applies, for a windowed cache.
    fn slot_window(&self) -> Option<stream::SlotWindow> {
        (self.n_swa > 0).then_some(stream::SlotWindow {
            n_swa: self.n_swa,
            lead: if self.config.faults.swa_window_off_by_one {
                2
            } else {
                1
            },
        })
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

    /// The positions of the cells holding `seq` (its stream's), in cell order; empty for an
    /// invalid `seq`.
    pub fn seq_positions(&self, seq: SeqId) -> Vec<Pos> {
        if self.check_seq(seq).is_err() {
            return Vec::new();
        }
        let cells = &self.streams[self.stream_of(seq)].cells;
        (0..cells.used_max_p1 as usize)
            .filter(|&i| !cells.is_empty(i) && cells.seq_has(i, seq))
            .map(|i| cells.pos[i])
            .collect()
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
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_streams;

#[cfg(test)]
mod tests_memory;
