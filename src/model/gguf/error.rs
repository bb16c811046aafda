//! What goes wrong reading a GGUF file, with the byte offset where it was found.

use std::path::PathBuf;

use super::{GgmlType, GgufValueType};

/// What went wrong reading a GGUF file. Offsets are absolute byte offsets into the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or read.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file ends in the middle of something.
    #[error("GGUF truncated at byte {offset}: needed {needed} more bytes for {what}, file has {file_len}")]
    Truncated {
        /// Where the read started.
        offset: u64,
        /// How many bytes it needed.
        needed: u64,
        /// What was being read.
        what: String,
        /// Total file length.
        file_len: u64,
    },
    /// The first four bytes are not `"GGUF"`.
    #[error("not a GGUF file: magic at byte 0 is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A version other than 3.
    #[error("unsupported GGUF version {version} at byte 4 (only version 3 is supported)")]
    UnsupportedVersion {
        /// The version found.
        version: u32,
    },
    /// A structurally invalid field (negative count, unknown value type, bad UTF-8, too many dims,
    /// duplicate names, misaligned offsets, ...).
    #[error("malformed GGUF at byte {offset}: {what}")]
    Malformed {
        /// Where the bad field starts.
        offset: u64,
        /// What is wrong with it.
        what: String,
    },
    /// A tensor's data lies (partly) outside the file.
    #[error("tensor {name:?} (info at byte {info_offset}) needs bytes {start}..{end} of the file, which has {file_len}")]
    TensorOutOfBounds {
        /// The tensor.
        name: String,
        /// Where its info record starts.
        info_offset: u64,
        /// Absolute start of its data.
        start: u64,
        /// Absolute end of its data.
        end: u64,
        /// Total file length.
        file_len: u64,
    },
    /// A tensor whose element type this reader cannot convert to f32.
    #[error(
        "tensor {name:?} has type {ty}, which this reader does not support (only f32, f16, bf16)"
    )]
    UnsupportedTensorType {
        /// The tensor.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A required key is absent.
    #[error("GGUF key {key:?} is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A key has another type than required (llama.cpp checks key types strictly).
    #[error("GGUF key {key:?} has type {found}, expected {expected}")]
    WrongKeyType {
        /// The key.
        key: String,
        /// The type required.
        expected: GgufValueType,
        /// The type found.
        found: GgufValueType,
    },
    /// A required tensor is absent.
    #[error("GGUF tensor {name:?} is missing")]
    MissingTensor {
        /// The tensor.
        name: String,
    },
}
