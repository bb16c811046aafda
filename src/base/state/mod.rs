//! The one parser of llama.cpp's per-sequence state format (`llama_state_seq_get_data`).
//!
//! Every target, native or real, reports its resident cells through these bytes, so the ground
//! truth of the oracles is the cache's *own serialized state*, never a re-implementation of it
//! (shared/seeds/004: "confound-immune ground truth").
//!
//! Layout (little-endian; src/llama-context.cpp `state_seq_get_data`, src/llama-kv-cache.cpp
//! `state_write`, `state_write_meta`, `state_write_data`):
//!
//! ```text
//! u32 magic 0xaf143cd8, i32 seq_id (not before crate 0.1.147: StateFormat::no_seq_header)
//! then the memory, by type (StateFormat::memory; docs/memory-types.md cites each writer):
//!   kv:        one cache
//!   iswa:      two caches: the base (full) cache, then the windowed one
//!   recurrent: one recurrent section
//!   hybrid:    one cache (the attention layers), then one recurrent section
//!   hybrid_iswa: two caches (base, windowed; llama_kv_cache_iswa::state_write), then one
//!              recurrent section (src/llama-memory-hybrid-iswa.cpp `state_write`)
//!   msa:       two caches: the K/V cache of every layer, then the indexer key cache of the
//!              sparse layers (`llama_kv_cache_msa::state_write`, llama-kv-cache-msa.cpp:160)
//!   hybrid_idx: one cache (the attention layers), one recurrent section, then the indexer key
//!              cache of the attention layers (`llama_memory_hybrid_idx::state_write`,
//!              src/llama-memory-hybrid-idx.cpp:259; read in `hybrid_idx.rs`, which finds
//!              where the recurrent section ends)
//!   dsv4:      a header, two K-only caches (the raw iSWA pair, no V records), then the
//!              compressed K caches and compressor states (`dsv4.rs`)
//!   dsa:       two K-only caches: the MLA cache of every layer, then the lightning-indexer key
//!              cache of the indexer layers (`llama_kv_cache_dsa::state_write`,
//!              llama-kv-cache-dsa.cpp:163-166); an MLA model's caches hold no V tensor
//!              (llama-kv-cache.cpp:231, `has_v = !is_mla`), so they write no V record
//!              (`state_write_data` skips a layer without V): StateFormat::k_only
//!   dsa_iswa:  three K-only caches: the DSA memory's (MLA cache of the full-attention layers,
//!              then their lightning-indexer key cache), then the windowed cache of the
//!              sliding-window layers (`llama_kv_cache_dsa_iswa::state_write`,
//!              llama-kv-cache-dsa-iswa.cpp:236-242, the same in 0.1.157; `PARTIAL_ONLY`
//!              writes the windowed cache alone). [`SeqState::caches`] holds them as an iSWA
//!              pair then the indexer cache: MLA, windowed, indexer
//! a cache:
//!   u32 n_stream (absent before crate 0.1.113: one stream, StateFormat::no_stream_count)
//!   per stream: u32 cell_count (0: nothing more for this stream; before 0.1.113 the K/V
//!               headers below follow anyway, with no rows)
//!     per cell: i32 pos, u32 n_seq_id, n_seq_id x i32 seq id
//!     u32 v_trans, u32 n_layer, [u32 n_rot_k, u32 n_rot_v: state-seq version >= 4]
//!     per layer K: i32 type, u64 row bytes, cell_count rows
//!     per layer V: same when !v_trans; else i32 type, u32 element bytes, u32 n_embd_v_gqa,
//!                  then n_embd_v_gqa x cell_count elements
//! a recurrent section (src/llama-memory-recurrent.cpp `state_write`, `state_write_meta`,
//! `state_write_data`; no streams, no n_rot fields, written even with no cells):
//!   u32 cell_count
//!   per cell: i32 pos, u32 n_seq_id, n_seq_id x i32 seq id (a per-sequence dump writes 0 ids)
//!   u32 s_trans (always 0), u32 n_layer (every layer of the model)
//!   per recurrent layer R (conv state): i32 type, u64 row bytes, cell_count rows
//!   per recurrent layer S (ssm state):  i32 type, u64 row bytes, cell_count rows
//! ```
//!
//! Which layers are recurrent is not in the bytes (a hybrid model's attention layers write no R
//! or S record, though `n_layer` counts them): the section is the last thing in every dump, so
//! its records are read to the end and split in half, R then S.
//!
//! [`parse_seq_rows`] decodes the K/V rows of the same bytes to f32 (F32 and F16 rows, transposed
//! V undone): rows, like cells, are read from a target's state only here.
//!
//! The bytes come from a target (a llama.cpp build, through the worker), so they are input: no
//! count allocates or loops beyond what the bytes can hold (cells: the input's length / 8; seq
//! ids per cell: 256; streams: 256; a layer reads 12 bytes or fails), sizes are multiplied with
//! overflow checks, and every failure is a [`ParseError`] naming the byte offset.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::base::op::{MemoryType, Pos, SeqId};

pub mod dsv4;
mod hybrid_idx;
mod rows;

pub use dsv4::Dsv4State;
pub use rows::{f16_to_f32, parse_seq_rows, CellRows, ResidentRows, RowError};

/// The word `state_seq_get_data` writes first.
pub const STATE_SEQ_MAGIC: u32 = 0xaf14_3cd8;

/// Which variant of the format a target writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StateFormat {
    /// `LLAMA_STATE_SEQ_VERSION >= 4` writes `n_rot_k` and `n_rot_v` after `n_layer`.
    pub rot_fields: bool,
    /// Crate versions before 0.1.113 (llama-kv-cache-unified.cpp): no `u32 n_stream`, one
    /// stream, whose `v_trans, n_layer` and per-layer K/V headers follow even with no cells.
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_stream_count: bool,
    /// Crate versions before 0.1.147: a per-sequence dump starts with the memory itself, with no
    /// `u32 magic, i32 seq_id` (src/llama-context.cpp `state_seq_get_data`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_seq_header: bool,
    /// Crate versions before 0.1.137: a whole dump has the last batch's outputs between the
    /// architecture name and the memory (`u32 n_outputs`, n_outputs x i32 output positions,
    /// `u64` logits count and f32 logits, `u64` embeddings count and f32 embeddings).
    #[serde(default, skip_serializing_if = "is_false")]
    pub whole_has_outputs: bool,
    /// The memory type whose dump this is (from the setup's architecture): which parts follow
    /// the header.
    #[serde(default, skip_serializing_if = "MemoryType::is_kv")]
    pub memory: MemoryType,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl StateFormat {
    /// Whether the memory's caches write K records only (no V record per layer): a DSA
    /// memory's, whose MLA model keeps no V tensor (see the module docs).
    pub fn k_only(&self) -> bool {
        match self.memory {
            MemoryType::Dsa | MemoryType::Dsv4 | MemoryType::DsaIswa => true,
            MemoryType::Kv
            | MemoryType::Iswa
            | MemoryType::Recurrent
            | MemoryType::Hybrid
            | MemoryType::HybridIswa
            | MemoryType::HybridIdx
            | MemoryType::Msa => false,
        }
    }
}

/// Where and why the bytes did not parse.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("seq state byte {offset}: expected {expected}")]
pub struct ParseError {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What the parser expected there.
    pub expected: String,
}

/// One cell of the state: its position and where its sequence ids are in
/// [`StreamState::seq_ids`] (one allocation per stream, not per cell).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCell {
    /// The cell's position.
    pub pos: Pos,
    /// Index of the cell's first sequence id in the stream's `seq_ids`.
    pub seqs_at: u32,
    /// Number of sequence ids written for it (only the requested one, for a per-sequence dump).
    pub n_seq: u32,
}

/// The rows of one layer's K or V tensor, borrowed from the state bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerRows<'a> {
    /// ggml type id (0 = F32, 1 = F16).
    pub ggml_type: i32,
    /// Bytes per row (per cell); for transposed V, bytes per element.
    pub row_bytes: u64,
    /// For transposed V: number of elements per cell (`n_embd_v_gqa`); else 0.
    pub n_embd_v_gqa: u32,
    /// The raw data: cell_count rows (or, transposed, n_embd_v_gqa x cell_count elements).
    pub data: &'a [u8],
}

/// The tensor section of one stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSection<'a> {
    /// V stored transposed (no flash attention).
    pub v_trans: bool,
    /// Number of layers.
    pub n_layer: u32,
    /// `(n_rot_k, n_rot_v)` where the format has them.
    pub n_rot: Option<(u32, u32)>,
    /// K per layer.
    pub k: Vec<LayerRows<'a>>,
    /// V per layer.
    pub v: Vec<LayerRows<'a>>,
}

/// One stream's cells and tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamState<'a> {
    /// The cells, in cell order.
    pub cells: Vec<StateCell>,
    /// The sequence ids of all cells, back to back.
    pub seq_ids: Vec<SeqId>,
    /// The tensor section (absent when the stream has no cells).
    pub kv: Option<KvSection<'a>>,
}

/// The recurrent section of a recurrent or hybrid memory's dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecurrentState<'a> {
    /// The state cells (one per sequence in llama.cpp's recurrent memory), in cell order.
    pub cells: Vec<StateCell>,
    /// The sequence ids of all cells, back to back (none in a per-sequence dump).
    pub seq_ids: Vec<SeqId>,
    /// `n_layer` as written: every layer of the model, recurrent or not.
    pub n_layer: u32,
    /// The conv states (`r_l`), one record per recurrent layer.
    pub r: Vec<LayerRows<'a>>,
    /// The ssm states (`s_l`), one record per recurrent layer.
    pub s: Vec<LayerRows<'a>>,
}

/// A whole parsed per-sequence state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqState<'a> {
    /// The sequence id in the header (-1: the whole cache).
    pub seq_id: SeqId,
    /// Per attention cache (none for a recurrent memory, two for an iSWA one: base, then
    /// windowed), per stream.
    pub caches: Vec<Vec<StreamState<'a>>>,
    /// The recurrent section (recurrent and hybrid memories).
    pub recurrent: Option<RecurrentState<'a>>,
    /// The compressed parts of a dsv4 memory's dump.
    pub dsv4: Option<Dsv4State<'a>>,
}

impl StreamState<'_> {
    /// The sequence ids written for `cell`.
    pub fn seqs_of(&self, cell: &StateCell) -> &[SeqId] {
        &self.seq_ids[cell.seqs_at as usize..(cell.seqs_at + cell.n_seq) as usize]
    }
}

impl SeqState<'_> {
    /// Positions of the cells of the memory's first part, sorted (a multiset): the first (base)
    /// cache's cells, every stream; a recurrent memory's state cells.
    pub fn resident_positions(&self) -> Vec<Pos> {
        match self.caches.first() {
            Some(cache) => sorted(cache.iter().flat_map(|s| s.cells.iter().map(|c| c.pos))),
            None => self.recurrent_positions().unwrap_or_default(),
        }
    }

    /// Positions of the cells of the memory's second part, sorted, when it has one: an iSWA
    /// memory's windowed cache, a hybrid memory's recurrent states.
    pub fn second_positions(&self) -> Option<Vec<Pos>> {
        if self.caches.is_empty() {
            return None;
        }
        match self.caches.get(1) {
            Some(windowed) => Some(sorted(
                windowed.iter().flat_map(|s| s.cells.iter().map(|c| c.pos)),
            )),
            None => self.recurrent_positions(),
        }
    }

    /// Positions of the cells of the memory's third part, sorted, when it has one: a
    /// hybrid-iSWA memory's recurrent states (after its two attention caches), a DSA-iSWA
    /// memory's indexer key cache (its third cache).
    pub fn third_positions(&self) -> Option<Vec<Pos>> {
        if let Some(lid) = self.caches.get(2) {
            return Some(sorted(
                lid.iter().flat_map(|s| s.cells.iter().map(|c| c.pos)),
            ));
        }
        if self.caches.len() < 2 {
            return None;
        }
        self.recurrent_positions()
    }

    fn recurrent_positions(&self) -> Option<Vec<Pos>> {
        let rec = self.recurrent.as_ref()?;
        Some(sorted(rec.cells.iter().map(|c| c.pos)))
    }
}

fn sorted(positions: impl Iterator<Item = Pos>) -> Vec<Pos> {
    let mut v: Vec<Pos> = positions.collect();
    v.sort_unstable();
    v
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    // `what` names the field for the error only: a `format_args!` is formatted on failure
    // alone (formatting every record's labels cost a worker more than reading its fields).
    fn take(&mut self, n: usize, what: impl std::fmt::Display) -> Result<&'a [u8], ParseError> {
        if self.bytes.len() - self.at < n {
            return Err(ParseError {
                offset: self.at,
                expected: format!(
                    "{what} ({n} bytes), found {} bytes left",
                    self.bytes.len() - self.at
                ),
            });
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u32(&mut self, what: impl std::fmt::Display) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn i32(&mut self, what: impl std::fmt::Display) -> Result<i32, ParseError> {
        Ok(i32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self, what: impl std::fmt::Display) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    fn fail<T>(&self, offset: usize, expected: String) -> Result<T, ParseError> {
        Err(ParseError { offset, expected })
    }

    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// Parses the bytes of `llama_state_seq_get_data`.
pub fn parse_seq_state(bytes: &[u8], format: StateFormat) -> Result<SeqState<'_>, ParseError> {
    let mut r = Reader { bytes, at: 0 };
    let seq_id = if format.no_seq_header {
        // Older dumps do not say whose they are; -1 ("no sequence named") stands in.
        -1
    } else {
        let magic = r.u32("magic")?;
        if magic != STATE_SEQ_MAGIC {
            return r.fail(
                0,
                format!("magic 0x{STATE_SEQ_MAGIC:08x}, found 0x{magic:08x}"),
            );
        }
        r.i32("seq_id")?
    };
    let (caches, recurrent, dsv4) = parse_memory(&mut r, format)?;
    Ok(SeqState {
        seq_id,
        caches,
        recurrent,
        dsv4,
    })
}

/// The attention caches and the recurrent section of `format.memory`, to the end of the bytes.
type Memory<'a> = (
    Vec<Vec<StreamState<'a>>>,
    Option<RecurrentState<'a>>,
    Option<Dsv4State<'a>>,
);

/// Reads the memory part of a dump, as `format.memory` lays it out, and checks that the bytes
/// end there: an unknown layout (another memory type's dump, or trailing bytes) is an error.
fn parse_memory<'a>(r: &mut Reader<'a>, format: StateFormat) -> Result<Memory<'a>, ParseError> {
    let n_caches = match format.memory {
        MemoryType::Kv | MemoryType::Hybrid => 1,
        MemoryType::Iswa | MemoryType::HybridIswa | MemoryType::Msa | MemoryType::Dsv4 => 2,
        MemoryType::Dsa => 2,
        MemoryType::DsaIswa => 3,
        MemoryType::Recurrent => 0,
        // The recurrent section sits between the two caches.
        MemoryType::HybridIdx => return hybrid_idx::parse(r, format),
    };
    let dsv4_partial = match format.memory {
        MemoryType::Dsv4 => Some(dsv4::parse_header(r)?),
        _ => None,
    };
    let mut caches = Vec::with_capacity(n_caches);
    for _ in 0..n_caches {
        caches.push(parse_cache(r, format)?);
    }
    let recurrent = match format.memory {
        MemoryType::Recurrent | MemoryType::Hybrid | MemoryType::HybridIswa => {
            Some(parse_recurrent(r)?)
        }
        MemoryType::Kv | MemoryType::Iswa | MemoryType::Msa | MemoryType::Dsv4 => None,
        MemoryType::HybridIdx => unreachable!("read by hybrid_idx::parse"),
        MemoryType::Dsa | MemoryType::DsaIswa => None,
    };
    if format.memory == MemoryType::DsaIswa {
        // Dump order MLA, indexer, windowed; held as the iSWA pair first (see the module docs).
        caches.swap(1, 2);
    }
    let dsv4 = match dsv4_partial {
        Some(partial) => Some(dsv4::parse_tail(r, partial)?),
        None => None,
    };
    if !r.done() {
        return r.fail(
            r.at,
            format!(
                "the end of a {} memory's dump, found {} more bytes (another memory type's layout?)",
                format.memory.name(),
                r.bytes.len() - r.at
            ),
        );
    }
    Ok((caches, recurrent, dsv4))
}

/// The cells of a stream or a recurrent section: `cell_count` (bounded by the input: a cell is
/// at least i32 pos + u32 n_seq_id) and each cell's position and sequence ids.
fn parse_cells(r: &mut Reader<'_>) -> Result<(Vec<StateCell>, Vec<SeqId>), ParseError> {
    parse_cells_ext(r, false)
}

/// [`parse_cells`]; with `ext`, each cell's `n_seq_id` is followed by its `llama_kv_cell_ext`
/// (i32 x, i32 y, i32 token: 12 bytes), which a cache of an M-RoPE model writes
/// (`has_cell_ext`, src/llama-kv-cache.cpp:1846-1849 and `state_write_meta` :2238-2241 in
/// 0.1.161; read for hybrid_idx's qwen4exp, `hybrid_idx.rs`).
fn parse_cells_ext(
    r: &mut Reader<'_>,
    ext: bool,
) -> Result<(Vec<StateCell>, Vec<SeqId>), ParseError> {
    let at = r.at;
    let cell_count = r.u32("cell_count")?;
    if cell_count as usize > r.bytes.len() / 8 {
        return r.fail(
            at,
            format!(
                "a cell_count that fits the {} bytes, found {cell_count}",
                r.bytes.len()
            ),
        );
    }
    let mut cells = Vec::with_capacity(cell_count as usize);
    let mut seq_ids = Vec::with_capacity(cell_count as usize);
    for _ in 0..cell_count {
        let pos = r.i32("cell pos")?;
        let at = r.at;
        let n_seq = r.u32("cell n_seq_id")?;
        if n_seq > 256 {
            return r.fail(at, format!("n_seq_id <= 256, found {n_seq}"));
        }
        if ext {
            r.take(12, "cell ext (x, y, token)")?;
        }
        let seqs_at = seq_ids.len() as u32;
        for _ in 0..n_seq {
            seq_ids.push(r.i32("cell seq id")?);
        }
        cells.push(StateCell {
            pos,
            seqs_at,
            n_seq,
        });
    }
    Ok((cells, seq_ids))
}

/// `cell_count` rows of `row_bytes` each, after the record's type and row size.
fn parse_rows<'a>(
    r: &mut Reader<'a>,
    cell_count: usize,
    what: &str,
) -> Result<LayerRows<'a>, ParseError> {
    let ggml_type = r.i32(format_args!("{what} type"))?;
    let row_bytes = r.u64(format_args!("{what} row bytes"))?;
    let n = row_bytes
        .checked_mul(cell_count as u64)
        .filter(|&n| n <= r.bytes.len() as u64);
    let Some(n) = n else {
        return r.fail(
            r.at,
            format!("{cell_count} {what} rows of {row_bytes} bytes"),
        );
    };
    let data = r.take(n as usize, format_args!("{what} rows"))?;
    Ok(LayerRows {
        ggml_type,
        row_bytes,
        n_embd_v_gqa: 0,
        data,
    })
}

/// A recurrent section, read to the end of the bytes (see the module docs).
fn parse_recurrent<'a>(r: &mut Reader<'a>) -> Result<RecurrentState<'a>, ParseError> {
    let (cells, seq_ids) = parse_cells(r)?;
    let at = r.at;
    match r.u32("s_trans")? {
        0 => {}
        // llama.cpp always writes 0 (`const uint32_t s_trans = 0`); a transposed S has another
        // record shape, not read here.
        x => return r.fail(at, format!("s_trans 0, found {x}")),
    }
    let n_layer = r.u32("n_layer")?;
    let mut records = Vec::new();
    while !r.done() {
        if records.len() as u64 >= 2 * u64::from(n_layer) {
            return r.fail(r.at, format!("at most {n_layer} R and {n_layer} S records"));
        }
        records.push(parse_rows(r, cells.len(), "R or S")?);
    }
    if records.len() % 2 != 0 {
        return r.fail(
            r.at,
            format!(
                "as many S records as R records, found {} records in all",
                records.len()
            ),
        );
    }
    let s = records.split_off(records.len() / 2);
    Ok(RecurrentState {
        cells,
        seq_ids,
        n_layer,
        r: records,
        s,
    })
}

/// One used cell of a whole-context dump: its position and the sequences it belongs to
/// (every stream's cells, in dump order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WholeCell {
    /// The cell's position.
    pub pos: Pos,
    /// The sequences the dump lists for it (may be empty: a used cell of no sequence).
    pub seqs: Vec<SeqId>,
}

/// The longest architecture name [`parse_whole_state`] accepts.
const MAX_ARCH_NAME: u32 = 64;

/// Parses the bytes of `llama_state_get_data` (u32 length and the model's architecture name,
/// then the memory as in a per-sequence dump, listing every used cell with all its sequences)
/// into the used cells of the base cache, every stream, in dump order.
pub fn parse_whole_state(bytes: &[u8], format: StateFormat) -> Result<Vec<WholeCell>, ParseError> {
    let mut r = Reader { bytes, at: 0 };
    let len = r.u32("architecture name length")?;
    if len > MAX_ARCH_NAME {
        return r.fail(
            0,
            format!("an architecture name of at most {MAX_ARCH_NAME} bytes, found {len}"),
        );
    }
    r.take(len as usize, "architecture name")?;
    if format.whole_has_outputs {
        let n_outputs = r.u32("n_outputs")? as usize;
        let bytes = n_outputs.saturating_mul(4);
        r.take(bytes, "output positions")?;
        for what in ["logits", "embeddings"] {
            let n = r.u64(what)?;
            let bytes = usize::try_from(n).ok().and_then(|n| n.checked_mul(4));
            r.take(bytes.unwrap_or(usize::MAX), what)?;
        }
    }
    let (caches, recurrent, _) = parse_memory(&mut r, format)?;
    if let Some(base) = caches.first() {
        return Ok(base
            .iter()
            .flat_map(|stream| {
                stream.cells.iter().map(|c| WholeCell {
                    pos: c.pos,
                    seqs: stream.seqs_of(c).to_vec(),
                })
            })
            .collect());
    }
    let rec = recurrent.expect("a memory without caches has a recurrent section");
    Ok(rec
        .cells
        .iter()
        .map(|c| WholeCell {
            pos: c.pos,
            seqs: rec.seq_ids[c.seqs_at as usize..(c.seqs_at + c.n_seq) as usize].to_vec(),
        })
        .collect())
}

fn parse_cache<'a>(
    r: &mut Reader<'a>,
    format: StateFormat,
) -> Result<Vec<StreamState<'a>>, ParseError> {
    parse_cache_ext(r, format, false)
}

/// [`parse_cache`], with cell exts as [`parse_cells_ext`] reads them.
fn parse_cache_ext<'a>(
    r: &mut Reader<'a>,
    format: StateFormat,
    ext: bool,
) -> Result<Vec<StreamState<'a>>, ParseError> {
    if format.no_stream_count {
        return Ok(vec![parse_stream(r, format, ext)?]);
    }
    let at = r.at;
    let n_stream = r.u32("n_stream")?;
    if n_stream == 0 || n_stream > 256 {
        return r.fail(at, format!("n_stream in 1..=256, found {n_stream}"));
    }
    (0..n_stream)
        .map(|_| parse_stream(r, format, ext))
        .collect()
}

fn parse_stream<'a>(
    r: &mut Reader<'a>,
    format: StateFormat,
    ext: bool,
) -> Result<StreamState<'a>, ParseError> {
    let (cells, seq_ids) = parse_cells_ext(r, ext)?;
    if cells.is_empty() && !format.no_stream_count {
        return Ok(StreamState {
            cells,
            seq_ids,
            kv: None,
        });
    }
    let cell_count = cells.len() as u32;
    let at = r.at;
    let v_trans = match r.u32("v_trans")? {
        0 => false,
        1 => true,
        x => return r.fail(at, format!("v_trans 0 or 1, found {x}")),
    };
    // Each layer reads at least 12 bytes before it can fail, and nothing is allocated ahead for
    // `n_layer`: a huge count ends where the bytes do.
    let n_layer = r.u32("n_layer")?;
    let n_rot = if format.rot_fields {
        Some((r.u32("n_rot_k")?, r.u32("n_rot_v")?))
    } else {
        None
    };
    let rows = |r: &mut Reader<'a>, what: &str| parse_rows(r, cells.len(), what);
    let k = (0..n_layer)
        .map(|_| rows(r, "K"))
        .collect::<Result<Vec<_>, _>>()?;
    // dsv4's and DSA's caches are K-only: llama_kv_cache::state_write_data skips a layer
    // without V.
    let v = if format.k_only() {
        Vec::new()
    } else if !v_trans {
        (0..n_layer)
            .map(|_| rows(r, "V"))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        let mut v = Vec::new();
        for _ in 0..n_layer {
            let ggml_type = r.i32("V type")?;
            let el = r.u32("V element bytes")? as u64;
            let n_embd = r.u32("V n_embd_v_gqa")?;
            let n = el
                .checked_mul(n_embd as u64)
                .and_then(|n| n.checked_mul(cell_count as u64))
                .filter(|&n| n <= r.bytes.len() as u64);
            let Some(n) = n else {
                return r.fail(
                    r.at,
                    format!("{cell_count} x {n_embd} transposed V elements of {el} bytes"),
                );
            };
            let data = r.take(n as usize, "transposed V")?;
            v.push(LayerRows {
                ggml_type,
                row_bytes: el,
                n_embd_v_gqa: n_embd,
                data,
            });
        }
        v
    };
    Ok(StreamState {
        cells,
        seq_ids,
        kv: Some(KvSection {
            v_trans,
            n_layer,
            n_rot,
            k,
            v,
        }),
    })
}

/// Fuzz target `seq_state` (`fuzz/fuzz_targets/seq_state.rs`, and `tests/it/fuzz_seeds.rs` over
/// its seeds): any bytes, in both formats, parse or fail with an offset inside the input; a
/// parsed state's cells and rows lie inside it. Panics otherwise.
#[doc(hidden)]
pub fn fuzz_seq_state(data: &[u8]) {
    let formats = [false, true].into_iter().flat_map(|rot_fields| {
        [
            MemoryType::Kv,
            MemoryType::Iswa,
            MemoryType::Recurrent,
            MemoryType::Hybrid,
            MemoryType::HybridIdx,
            MemoryType::Dsv4,
            MemoryType::Dsa,
        ]
        .map(|memory| StateFormat {
            rot_fields,
            memory,
            ..StateFormat::default()
        })
    });
    for format in formats {
        let _ = parse_whole_state(data, format);
        match parse_seq_state(data, format) {
            Err(e) => assert!(e.offset <= data.len(), "{e}"),
            Ok(state) => {
                for stream in state.caches.iter().flatten() {
                    for cell in &stream.cells {
                        assert_eq!(stream.seqs_of(cell).len(), cell.n_seq as usize);
                    }
                    let rows = stream.kv.iter().flat_map(|kv| kv.k.iter().chain(&kv.v));
                    assert!(rows.map(|l| l.data.len()).sum::<usize>() <= data.len());
                }
                if let Some(rec) = &state.recurrent {
                    assert_eq!(rec.r.len(), rec.s.len());
                    for cell in &rec.cells {
                        assert!((cell.seqs_at + cell.n_seq) as usize <= rec.seq_ids.len());
                    }
                }
                let _ = (state.resident_positions(), state.second_positions());
            }
        }
    }
}

#[cfg(test)]
mod tests;
