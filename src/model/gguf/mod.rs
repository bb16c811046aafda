//! GGUF v3 files: a writer for the tiny test model and a reader for it (and for a user's own
//! llama-architecture GGUF with F32, F16 or BF16 tensors).
//!
//! Layout, as documented at the top of llama.cpp's `ggml/include/gguf.h` and parsed by
//! `ggml/src/gguf.cpp`: magic `"GGUF"`, `u32` version, `i64` tensor count, `i64` key/value count,
//! the key/value pairs, the tensor infos (name, `u32` n_dims, `i64` dims in ggml order (`ne0`
//! first), `u32` ggml type, `u64` offset into the data section), padding to the alignment, then the
//! data section. Every tensor's offset is a multiple of the alignment (`general.alignment`, default
//! 32). Everything is little-endian.
//!
//! The reader never panics on malformed input: every problem is a [`GgufError`] that names the byte
//! offset at which it was found. Tensor data is read on demand, so opening a multi-gigabyte file
//! only reads its header.
//!
//! A GGUF file may come from anywhere, so the header is bounded before anything is allocated for
//! it: every count must fit in the bytes left, and the header as a whole, each string, each array
//! and the key and tensor counts stay under the `MAX_GGUF_*` limits below (far above any real
//! model: a 256k-token vocabulary is one array of 256k strings of a few bytes each).
//!
//! The reader is [`read`] ([`GgufFile`]), the writer [`write`] ([`GgufWriter`]); [`types`] holds
//! the value and tensor types both share, [`error`] the reader's errors.

mod error;
mod read;
mod types;
mod write;

pub use error::GgufError;
pub use read::{fuzz_gguf, GgufFile};
pub use types::{GgmlType, GgufValue, GgufValueType, TensorInfo};
pub use write::GgufWriter;

/// The four magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The only version this module reads and writes.
pub const GGUF_VERSION: u32 = 3;
/// Alignment of the data section and of every tensor unless `general.alignment` says otherwise.
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// The key that overrides [`GGUF_DEFAULT_ALIGNMENT`].
pub const GGUF_KEY_ALIGNMENT: &str = "general.alignment";

/// The header (key/value pairs and tensor infos) must end before this byte (128 MiB; the largest
/// vocabularies take tens of MiB).
pub const MAX_GGUF_HEADER_BYTES: u64 = 128 << 20;
/// Longest string (key, string value, tensor name): 16 MiB, room for any chat template.
pub const MAX_GGUF_STRING_BYTES: u64 = 16 << 20;
/// Most elements in one array value (vocabularies and merge lists are a few 100k).
pub const MAX_GGUF_ARRAY_LEN: u64 = 1 << 22;
/// Most key/value pairs.
pub const MAX_GGUF_KV: u64 = 1 << 16;
/// Most tensors (a large model has a few thousand).
pub const MAX_GGUF_TENSORS: u64 = 1 << 16;

/// ggml's limit on tensor dimensions (`GGML_MAX_DIMS` in `ggml/include/ggml.h`).
const GGML_MAX_DIMS: u32 = 4;

/// IEEE half to single precision, exact: the crate's one decoder, shared with the state parser.
pub use crate::base::state::f16_to_f32;

/// `x` rounded up to a multiple of `alignment`.
fn align_up(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment) * alignment
}

#[cfg(test)]
mod tests;
