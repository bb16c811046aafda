//! The K/V rows of a per-sequence dump decoded to f32 ([`parse_seq_rows`]): F32 and F16 rows,
//! transposed V undone. The cells and the layout are read by the parent module's parser; this
//! module only turns the row bytes it found into numbers.

use thiserror::Error;

use super::{parse_seq_state, LayerRows, ParseError, StateFormat};
use crate::base::op::Pos;

/// IEEE half to single (exact): rows of F16 caches (llama.cpp's default K/V type) and F16 GGUF
/// tensors decode through this one function.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match exp {
        0 if frac == 0 => sign,
        0 => {
            let (mut e, mut f) = (127 - 15 + 1, frac);
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((f & 0x3ff) << 13)
        }
        0x1f => sign | 0x7f80_0000 | (frac << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

/// Why the rows of a state did not decode to f32.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RowError {
    /// The bytes did not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// Rows of a ggml type this decoder does not read.
    #[error("ggml type {0} rows are not read (F32 and F16 are)")]
    UnreadType(i32),
    /// Transposed V whose element size is not its type's.
    #[error("transposed V with {0}-byte elements")]
    TransposedElementBytes(u64),
    /// Rows that do not hold a whole number of elements.
    #[error("rows of {row_bytes} bytes are not whole elements of {element_bytes}")]
    PartialElements {
        /// Bytes per row.
        row_bytes: u64,
        /// Bytes per element of the row's type.
        element_bytes: usize,
    },
}

/// Bytes of one element of `ggml_type`, for the types whose rows are decoded (0 = F32, 1 = F16).
fn element_bytes(ggml_type: i32) -> Result<usize, RowError> {
    match ggml_type {
        0 => Ok(4),
        1 => Ok(2),
        t => Err(RowError::UnreadType(t)),
    }
}

/// Element `i` of `data`, of a type [`element_bytes`] accepts.
fn element(data: &[u8], ggml_type: i32, i: usize) -> f32 {
    if ggml_type == 0 {
        f32::from_le_bytes(data[4 * i..4 * i + 4].try_into().expect("4 bytes"))
    } else {
        f16_to_f32(u16::from_le_bytes(
            data[2 * i..2 * i + 2].try_into().expect("2 bytes"),
        ))
    }
}

impl LayerRows<'_> {
    /// The rows of this layer's `n_cells` cells (the stream's cell count), one `Vec` per cell.
    /// `transposed`: V as llama.cpp writes it without flash attention, element `j` of cell `i`
    /// at `j * n_cells + i`.
    pub fn decode(&self, n_cells: usize, transposed: bool) -> Result<Vec<Vec<f32>>, RowError> {
        let el = element_bytes(self.ggml_type)?;
        let t = self.ggml_type;
        if transposed {
            if self.row_bytes as usize != el {
                return Err(RowError::TransposedElementBytes(self.row_bytes));
            }
            let w = self.n_embd_v_gqa as usize;
            Ok((0..n_cells)
                .map(|i| {
                    (0..w)
                        .map(|j| element(self.data, t, j * n_cells + i))
                        .collect()
                })
                .collect())
        } else {
            let rb = self.row_bytes as usize;
            if rb % el != 0 {
                return Err(RowError::PartialElements {
                    row_bytes: self.row_bytes,
                    element_bytes: el,
                });
            }
            Ok((0..n_cells)
                .map(|i| {
                    let row = &self.data[i * rb..(i + 1) * rb];
                    (0..rb / el).map(|j| element(row, t, j)).collect()
                })
                .collect())
        }
    }
}

/// One resident cell with its rows decoded to f32, per layer.
#[derive(Clone, Debug, PartialEq)]
pub struct CellRows {
    /// The cell's position.
    pub pos: Pos,
    /// K row per layer.
    pub k: Vec<Vec<f32>>,
    /// V row per layer.
    pub v: Vec<Vec<f32>>,
}

/// The resident cells of a state with their rows, in state order.
#[derive(Clone, Debug, PartialEq)]
pub struct ResidentRows {
    /// Layers in the state (0: no stream has a tensor section).
    pub n_layer: usize,
    /// The cells of every stream that has a tensor section.
    pub cells: Vec<CellRows>,
}

/// Parses `llama_state_seq_get_data` bytes and decodes the rows of the first (base) cache's
/// cells, every stream: the one place K/V rows are read from state bytes.
pub fn parse_seq_rows(bytes: &[u8], format: StateFormat) -> Result<ResidentRows, RowError> {
    let state = parse_seq_state(bytes, format)?;
    let mut cells = Vec::new();
    let mut n_layer = 0;
    for stream in state.caches.first().into_iter().flatten() {
        let Some(kv) = &stream.kv else { continue };
        let n = stream.cells.len();
        n_layer = kv.n_layer as usize;
        let decode = |rows: &[LayerRows<'_>], transposed: bool| {
            rows.iter()
                .map(|r| r.decode(n, transposed))
                .collect::<Result<Vec<_>, _>>()
        };
        let k = decode(&kv.k, false)?;
        let v = decode(&kv.v, kv.v_trans)?;
        for (i, c) in stream.cells.iter().enumerate() {
            cells.push(CellRows {
                pos: c.pos,
                k: k.iter().map(|l| l[i].clone()).collect(),
                v: v.iter().map(|l| l[i].clone()).collect(),
            });
        }
    }
    Ok(ResidentRows { n_layer, cells })
}
