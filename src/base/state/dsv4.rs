//! The parts of a `llama_kv_cache_dsv4` dump beyond its raw iSWA pair
//! (`llama_kv_cache_dsv4::state_write`, src/llama-kv-cache-dsv4.cpp:1597-1629 in 0.1.161):
//!
//! ```text
//! u32 magic 0x34565344 ("DSV4"), u32 version 1, u32 mode (0 full, 1 PARTIAL_ONLY)
//! the raw cache: an iSWA pair (base, then windowed), K-only: no V records (:1251-1257,
//!   `dsv4_make_k_only`; llama_kv_cache::state_write_data skips a layer without V)
//! mode 0 only, three compressed K caches in turn, CSA, HCA, LID (`dsv4_state_write_k_cache`,
//!   :335-365): u32 version 2, u32 n_rows, u32 n_stream, u32 n_layer, per layer u32 il and a
//!   tensor record
//! three compressor states in turn, CSA, HCA, LID (`llama_dsv4_comp_state::state_write`,
//!   :1083-1119): u32 version 1, u32 ratio, u32 state_size, u32 n_embd_state, u32 n_stream,
//!   u32 n_layer, per layer u32 il, the kv record, the score record
//! a tensor record (`dsv4_state_write_tensor_streams`, :252-292): i32 type, u64 ne0, u64 rows,
//!   u64 row bytes, then n_stream x rows x row bytes
//! ```
//!
//! A per-sequence dump writes that sequence's stream only, and a compressed cache's rows are the
//! ones its `seq_pos_max` implies (`dsv4_state_n_used_k_rows`: `(pos_max + 1) / ratio`), not its
//! cells: the compressed caches' cells are not in the bytes.

use super::{ParseError, Reader};

/// The names of the three compressed parts, in dump order.
pub const PARTS: [&str; 3] = ["csa", "hca", "lid"];

/// The compressed parts of a dsv4 dump, as slices of its bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dsv4State<'a> {
    /// The dump was written with `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` (mode 1): no K caches.
    pub partial: bool,
    /// The CSA, HCA and LID compressed K caches (empty when `partial`).
    pub k_caches: Vec<CompressedK<'a>>,
    /// The CSA, HCA and LID compressor states.
    pub states: Vec<CompressorState<'a>>,
}

/// One compressed K cache's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressedK<'a> {
    /// Rows written per stream.
    pub n_rows: u32,
    /// Streams written.
    pub n_stream: u32,
    /// Per layer: the layer id and its rows (every stream's, back to back).
    pub layers: Vec<(u32, &'a [u8])>,
}

/// One compressor state's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressorState<'a> {
    /// The compression ratio (4 or 128).
    pub ratio: u32,
    /// Rows of the state per stream.
    pub state_size: u32,
    /// Streams written.
    pub n_stream: u32,
    /// Per layer: the layer id, its kv rows and its score rows.
    pub layers: Vec<(u32, &'a [u8], &'a [u8])>,
}

/// `DSV4_STATE_MAGIC`.
pub const DSV4_MAGIC: u32 = 0x3456_5344;

/// Reads the header before the raw caches; `Ok(partial)`.
pub(super) fn parse_header(r: &mut Reader<'_>) -> Result<bool, ParseError> {
    let at = r.at;
    let magic = r.u32("dsv4 magic")?;
    if magic != DSV4_MAGIC {
        return r.fail(
            at,
            format!("dsv4 magic 0x{DSV4_MAGIC:08x}, found 0x{magic:08x}"),
        );
    }
    let at = r.at;
    match r.u32("dsv4 version")? {
        1 => {}
        v => return r.fail(at, format!("dsv4 state version 1, found {v}")),
    }
    let at = r.at;
    match r.u32("dsv4 mode")? {
        0 => Ok(false),
        1 => Ok(true),
        m => r.fail(at, format!("dsv4 mode 0 or 1, found {m}")),
    }
}

/// Reads the compressed K caches (unless `partial`) and the compressor states after the raw
/// caches.
pub(super) fn parse_tail<'a>(
    r: &mut Reader<'a>,
    partial: bool,
) -> Result<Dsv4State<'a>, ParseError> {
    let mut k_caches = Vec::new();
    if !partial {
        for part in PARTS {
            k_caches.push(parse_k_cache(r, part)?);
        }
    }
    let mut states = Vec::new();
    for part in PARTS {
        states.push(parse_state(r, part)?);
    }
    Ok(Dsv4State {
        partial,
        k_caches,
        states,
    })
}

fn parse_k_cache<'a>(r: &mut Reader<'a>, part: &str) -> Result<CompressedK<'a>, ParseError> {
    let at = r.at;
    match r.u32("dsv4 K cache version")? {
        1 | 2 => {}
        v => return r.fail(at, format!("{part} K cache version 1 or 2, found {v}")),
    }
    let n_rows = r.u32("dsv4 K cache n_rows")?;
    let n_stream = r.u32("dsv4 K cache n_stream")?;
    let n_layer = r.u32("dsv4 K cache n_layer")?;
    let mut layers = Vec::new();
    for _ in 0..n_layer {
        let il = r.u32("dsv4 K cache layer id")?;
        layers.push((il, parse_record(r, n_rows, n_stream, part)?));
    }
    Ok(CompressedK {
        n_rows,
        n_stream,
        layers,
    })
}

fn parse_state<'a>(r: &mut Reader<'a>, part: &str) -> Result<CompressorState<'a>, ParseError> {
    let at = r.at;
    match r.u32("dsv4 compressor state version")? {
        1 => {}
        v => return r.fail(at, format!("{part} compressor state version 1, found {v}")),
    }
    let ratio = r.u32("dsv4 compressor ratio")?;
    let state_size = r.u32("dsv4 compressor state_size")?;
    let _n_embd_state = r.u32("dsv4 compressor n_embd_state")?;
    let n_stream = r.u32("dsv4 compressor n_stream")?;
    let n_layer = r.u32("dsv4 compressor n_layer")?;
    let mut layers = Vec::new();
    for _ in 0..n_layer {
        let il = r.u32("dsv4 compressor layer id")?;
        let kv = parse_record(r, state_size, n_stream, part)?;
        let score = parse_record(r, state_size, n_stream, part)?;
        layers.push((il, kv, score));
    }
    Ok(CompressorState {
        ratio,
        state_size,
        n_stream,
        layers,
    })
}

/// A tensor record whose header must say `rows` rows; its data is `n_stream` streams of them.
fn parse_record<'a>(
    r: &mut Reader<'a>,
    rows: u32,
    n_stream: u32,
    part: &str,
) -> Result<&'a [u8], ParseError> {
    let _ggml_type = r.i32("dsv4 record type")?;
    let _ne0 = r.u64("dsv4 record ne0")?;
    let at = r.at;
    let rows_written = r.u64("dsv4 record rows")?;
    if rows_written != u64::from(rows) {
        return r.fail(
            at,
            format!("{part} record of {rows} rows, found {rows_written}"),
        );
    }
    let row_bytes = r.u64("dsv4 record row bytes")?;
    if rows == 0 {
        return Ok(&[]);
    }
    let n = row_bytes
        .checked_mul(u64::from(rows))
        .and_then(|n| n.checked_mul(u64::from(n_stream)))
        .filter(|&n| n <= r.bytes.len() as u64);
    let Some(n) = n else {
        return r.fail(
            r.at,
            format!("{n_stream} x {rows} {part} rows of {row_bytes} bytes"),
        );
    };
    r.take(n as usize, "dsv4 record rows")
}

impl Dsv4State<'_> {
    /// A digest (FNV-1a, 64 bits) of the compressed parts' bytes: the K caches' rows and the
    /// compressor states, what #26790 says a restore of another sequence zeroed.
    pub fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        for k in &self.k_caches {
            eat(&k.n_rows.to_le_bytes());
            for (il, rows) in &k.layers {
                eat(&il.to_le_bytes());
                eat(rows);
            }
        }
        for s in &self.states {
            for (il, kv, score) in &s.layers {
                eat(&il.to_le_bytes());
                eat(kv);
                eat(score);
            }
        }
        h
    }
}
