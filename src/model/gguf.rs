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

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// The value type tag of a key/value pair (`enum gguf_type` in `ggml/include/gguf.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    /// `GGUF_TYPE_UINT8`
    U8,
    /// `GGUF_TYPE_INT8`
    I8,
    /// `GGUF_TYPE_UINT16`
    U16,
    /// `GGUF_TYPE_INT16`
    I16,
    /// `GGUF_TYPE_UINT32`
    U32,
    /// `GGUF_TYPE_INT32`
    I32,
    /// `GGUF_TYPE_FLOAT32`
    F32,
    /// `GGUF_TYPE_BOOL` (stored as one byte)
    Bool,
    /// `GGUF_TYPE_STRING` (`u64` length, then UTF-8 bytes without a terminator)
    String,
    /// `GGUF_TYPE_ARRAY` (`u32` element type, `u64` count, elements)
    Array,
    /// `GGUF_TYPE_UINT64`
    U64,
    /// `GGUF_TYPE_INT64`
    I64,
    /// `GGUF_TYPE_FLOAT64`
    F64,
}

impl GgufValueType {
    /// The on-disk tag.
    pub fn id(self) -> u32 {
        match self {
            GgufValueType::U8 => 0,
            GgufValueType::I8 => 1,
            GgufValueType::U16 => 2,
            GgufValueType::I16 => 3,
            GgufValueType::U32 => 4,
            GgufValueType::I32 => 5,
            GgufValueType::F32 => 6,
            GgufValueType::Bool => 7,
            GgufValueType::String => 8,
            GgufValueType::Array => 9,
            GgufValueType::U64 => 10,
            GgufValueType::I64 => 11,
            GgufValueType::F64 => 12,
        }
    }

    /// The type for an on-disk tag, if it is one.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgufValueType::U8,
            1 => GgufValueType::I8,
            2 => GgufValueType::U16,
            3 => GgufValueType::I16,
            4 => GgufValueType::U32,
            5 => GgufValueType::I32,
            6 => GgufValueType::F32,
            7 => GgufValueType::Bool,
            8 => GgufValueType::String,
            9 => GgufValueType::Array,
            10 => GgufValueType::U64,
            11 => GgufValueType::I64,
            12 => GgufValueType::F64,
            _ => return None,
        })
    }

    /// The smallest number of bytes one value of this type occupies (used to reject absurd
    /// element counts before allocating).
    fn min_size(self) -> u64 {
        match self {
            GgufValueType::U8 | GgufValueType::I8 | GgufValueType::Bool => 1,
            GgufValueType::U16 | GgufValueType::I16 => 2,
            GgufValueType::U32 | GgufValueType::I32 | GgufValueType::F32 => 4,
            GgufValueType::U64 | GgufValueType::I64 | GgufValueType::F64 => 8,
            GgufValueType::String => 8,
            GgufValueType::Array => 12,
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            GgufValueType::U8 => "uint8",
            GgufValueType::I8 => "int8",
            GgufValueType::U16 => "uint16",
            GgufValueType::I16 => "int16",
            GgufValueType::U32 => "uint32",
            GgufValueType::I32 => "int32",
            GgufValueType::F32 => "float32",
            GgufValueType::Bool => "bool",
            GgufValueType::String => "string",
            GgufValueType::Array => "array",
            GgufValueType::U64 => "uint64",
            GgufValueType::I64 => "int64",
            GgufValueType::F64 => "float64",
        };
        f.write_str(name)
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `uint8`
    U8(u8),
    /// `int8`
    I8(i8),
    /// `uint16`
    U16(u16),
    /// `int16`
    I16(i16),
    /// `uint32`
    U32(u32),
    /// `int32`
    I32(i32),
    /// `float32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// `string`
    String(String),
    /// `array`: the element type, then the elements (all of that type).
    Array(GgufValueType, Vec<GgufValue>),
    /// `uint64`
    U64(u64),
    /// `int64`
    I64(i64),
    /// `float64`
    F64(f64),
}

impl GgufValue {
    /// The type tag this value is written with.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(..) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// Whether this value has `ty` (for arrays, compares only the outer tag).
    pub fn is(&self, ty: GgufValueType) -> bool {
        self.value_type() == ty
    }
}

/// A ggml tensor element type as stored in a tensor info (`enum ggml_type` in
/// `ggml/include/ggml.h`). Only the float types can be read as data; every other id is kept as a
/// number so that a file holding quantized tensors still opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// `GGML_TYPE_F32` (0)
    F32,
    /// `GGML_TYPE_F16` (1)
    F16,
    /// `GGML_TYPE_BF16` (30)
    Bf16,
    /// Any other type id (quantized types and future additions): not readable here.
    Other(u32),
}

impl GgmlType {
    /// The on-disk id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Bf16 => 30,
            GgmlType::Other(id) => id,
        }
    }

    /// The type for an on-disk id.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            30 => GgmlType::Bf16,
            other => GgmlType::Other(other),
        }
    }

    /// Bytes per element, for the types this module can read.
    pub fn element_size(self) -> Option<u64> {
        match self {
            GgmlType::F32 => Some(4),
            GgmlType::F16 | GgmlType::Bf16 => Some(2),
            GgmlType::Other(_) => None,
        }
    }

    /// ggml's name for the type (`type_traits[].type_name` in `ggml/src/ggml.c`).
    pub fn name(self) -> &'static str {
        match self.id() {
            0 => "f32",
            1 => "f16",
            2 => "q4_0",
            3 => "q4_1",
            6 => "q5_0",
            7 => "q5_1",
            8 => "q8_0",
            9 => "q8_1",
            10 => "q2_K",
            11 => "q3_K",
            12 => "q4_K",
            13 => "q5_K",
            14 => "q6_K",
            15 => "q8_K",
            16 => "iq2_xxs",
            17 => "iq2_xs",
            18 => "iq3_xxs",
            19 => "iq1_s",
            20 => "iq4_nl",
            21 => "iq3_s",
            22 => "iq2_s",
            23 => "iq4_xs",
            24 => "i8",
            25 => "i16",
            26 => "i32",
            27 => "i64",
            28 => "f64",
            29 => "iq1_m",
            30 => "bf16",
            34 => "tq1_0",
            35 => "tq2_0",
            39 => "mxfp4",
            _ => "unknown",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (type id {})", self.name(), self.id())
    }
}

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

/// Where a tensor's data lives in its file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` (`ne0`) varies fastest.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Absolute file offset of this tensor's info record (for error messages).
    pub info_offset: u64,
}

impl TensorInfo {
    /// Number of elements (product of the dims).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Where the bytes of an opened file come from.
#[derive(Clone, Debug)]
enum Source {
    File(PathBuf),
    Bytes(Arc<Vec<u8>>),
}

/// An opened GGUF file: its metadata and tensor infos, with tensor data read on demand.
#[derive(Clone, Debug)]
pub struct GgufFile {
    source: Source,
    file_len: u64,
    /// The format version (always 3).
    pub version: u32,
    /// Alignment of tensor data.
    pub alignment: u64,
    /// Key/value pairs, in file order.
    pub metadata: Vec<(String, GgufValue)>,
    /// Tensor infos, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

/// A reader that tracks its absolute offset and turns short reads into [`GgufError::Truncated`].
struct Cursor<R> {
    inner: R,
    offset: u64,
    file_len: u64,
}

impl<R: Read> Cursor<R> {
    fn bytes(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>, GgufError> {
        if self.offset.saturating_add(n) > MAX_GGUF_HEADER_BYTES {
            return Err(GgufError::Malformed {
                offset: self.offset,
                what: format!(
                    "{} ({n} bytes) would end past the {MAX_GGUF_HEADER_BYTES}-byte header limit",
                    what()
                ),
            });
        }
        let remaining = self.file_len.saturating_sub(self.offset);
        if n > remaining {
            return Err(GgufError::Truncated {
                offset: self.offset,
                needed: n,
                what: what(),
                file_len: self.file_len,
            });
        }
        let mut buf = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|_| GgufError::Truncated {
                offset: self.offset,
                needed: n,
                what: what(),
                file_len: self.file_len,
            })?;
        self.offset += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let v = self.bytes(N as u64, &|| what.to_string())?;
        let mut out = [0u8; N];
        out.copy_from_slice(&v);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, GgufError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let start = self.offset;
        let len = self.u64(&format!("length of {what}"))?;
        if len > MAX_GGUF_STRING_BYTES {
            return Err(GgufError::Malformed {
                offset: start,
                what: format!(
                    "{what} is {len} bytes long, more than the {MAX_GGUF_STRING_BYTES}-byte limit"
                ),
            });
        }
        let raw = self.bytes(len, &|| format!("{what} ({len} bytes)"))?;
        String::from_utf8(raw).map_err(|e| GgufError::Malformed {
            offset: start,
            what: format!("{what} is not valid UTF-8: {e}"),
        })
    }

    fn value(&mut self, ty: GgufValueType, what: &str, depth: u32) -> Result<GgufValue, GgufError> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(what)?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            GgufValueType::U32 => GgufValue::U32(self.u32(what)?),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            GgufValueType::Bool => {
                let at = self.offset;
                match self.array::<1>(what)?[0] {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    b => {
                        return Err(GgufError::Malformed {
                            offset: at,
                            what: format!("{what}: bool byte is {b}, expected 0 or 1"),
                        })
                    }
                }
            }
            GgufValueType::String => GgufValue::String(self.string(what)?),
            GgufValueType::U64 => GgufValue::U64(self.u64(what)?),
            GgufValueType::I64 => GgufValue::I64(self.i64(what)?),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            GgufValueType::Array => {
                let at = self.offset;
                if depth > 0 {
                    return Err(GgufError::Malformed {
                        offset: at,
                        what: format!("{what}: nested arrays are not supported"),
                    });
                }
                let elem_id = self.u32(&format!("element type of {what}"))?;
                let elem = GgufValueType::from_id(elem_id).ok_or_else(|| GgufError::Malformed {
                    offset: at,
                    what: format!("{what}: unknown array element type {elem_id}"),
                })?;
                let n_at = self.offset;
                let n = self.u64(&format!("element count of {what}"))?;
                let remaining = self.file_len.saturating_sub(self.offset);
                if n > MAX_GGUF_ARRAY_LEN {
                    return Err(GgufError::Malformed {
                        offset: n_at,
                        what: format!(
                            "{what}: array of {n} elements, more than the limit of {MAX_GGUF_ARRAY_LEN}"
                        ),
                    });
                }
                if n.checked_mul(elem.min_size())
                    .map_or(true, |b| b > remaining)
                {
                    return Err(GgufError::Malformed {
                        offset: n_at,
                        what: format!(
                            "{what}: array of {n} {elem} elements cannot fit in the {remaining} bytes left"
                        ),
                    });
                }
                let mut items = Vec::with_capacity(n as usize);
                for i in 0..n {
                    items.push(self.value(elem, &format!("{what}[{i}]"), depth + 1)?);
                }
                GgufValue::Array(elem, items)
            }
        })
    }
}

fn align_up(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment) * alignment
}

impl GgufFile {
    /// Opens a GGUF file and reads its header (metadata and tensor infos). Tensor data stays on
    /// disk until asked for.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        // A folder opens on Linux and reads as an error much later; say what it is.
        if !meta.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let file_len = meta.len();
        let cursor = Cursor {
            inner: BufReader::new(file),
            offset: 0,
            file_len,
        };
        Self::parse(cursor, Source::File(path))
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let bytes = Arc::new(bytes);
        let cursor = Cursor {
            inner: &bytes[..],
            offset: 0,
            file_len: bytes.len() as u64,
        };
        Self::parse(cursor, Source::Bytes(Arc::clone(&bytes)))
    }

    fn parse<R: Read>(mut c: Cursor<R>, source: Source) -> Result<GgufFile, GgufError> {
        let magic: [u8; 4] = c.array("magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = c.u32("version")?;
        if version != GGUF_VERSION {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let count = |c: &mut Cursor<R>, what: &str, min_size: u64, most: u64| {
            let at = c.offset;
            let n = c.i64(what)?;
            let remaining = c.file_len.saturating_sub(c.offset);
            if n > 0 && n as u64 > most {
                return Err(GgufError::Malformed {
                    offset: at,
                    what: format!("{what} is {n}, more than the limit of {most}"),
                });
            }
            if n < 0 || (n as u64).saturating_mul(min_size) > remaining {
                return Err(GgufError::Malformed {
                    offset: at,
                    what: format!("{what} is {n}, impossible for the {remaining} bytes left"),
                });
            }
            Ok(n as u64)
        };
        let n_tensors = count(&mut c, "tensor count", 8 + 4 + 4 + 8, MAX_GGUF_TENSORS)?;
        let n_kv = count(&mut c, "key/value count", 8 + 4, MAX_GGUF_KV)?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut key_index = HashMap::new();
        for i in 0..n_kv {
            let at = c.offset;
            let key = c.string(&format!("key #{i}"))?;
            let ty_at = c.offset;
            let ty_id = c.u32(&format!("value type of key {key:?}"))?;
            let ty = GgufValueType::from_id(ty_id).ok_or_else(|| GgufError::Malformed {
                offset: ty_at,
                what: format!("key {key:?} has unknown value type {ty_id}"),
            })?;
            let value = c.value(ty, &format!("value of key {key:?}"), 0)?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::Malformed {
                    offset: at,
                    what: format!("duplicate key {key:?}"),
                });
            }
            metadata.push((key, value));
        }

        let alignment = match key_index.get(GGUF_KEY_ALIGNMENT).map(|&i| &metadata[i].1) {
            None => GGUF_DEFAULT_ALIGNMENT,
            Some(GgufValue::U32(a)) if *a > 0 && a.is_power_of_two() => u64::from(*a),
            Some(other) => {
                return Err(GgufError::Malformed {
                    offset: 0,
                    what: format!(
                        "{GGUF_KEY_ALIGNMENT} must be a power-of-two uint32, found {other:?}"
                    ),
                })
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::new();
        for i in 0..n_tensors {
            let info_offset = c.offset;
            let name = c.string(&format!("name of tensor #{i}"))?;
            let dims_at = c.offset;
            let n_dims = c.u32(&format!("n_dims of tensor {name:?}"))?;
            if n_dims > GGML_MAX_DIMS {
                return Err(GgufError::Malformed {
                    offset: dims_at,
                    what: format!(
                        "tensor {name:?} has {n_dims} dims, ggml allows at most {GGML_MAX_DIMS}"
                    ),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                let at = c.offset;
                let ne = c.i64(&format!("dim {d} of tensor {name:?}"))?;
                if ne < 0 {
                    return Err(GgufError::Malformed {
                        offset: at,
                        what: format!("tensor {name:?} dim {d} is negative ({ne})"),
                    });
                }
                dims.push(ne as u64);
            }
            if dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .is_none()
            {
                return Err(GgufError::Malformed {
                    offset: dims_at,
                    what: format!("tensor {name:?} dims {dims:?} overflow the element count"),
                });
            }
            let ty = GgmlType::from_id(c.u32(&format!("type of tensor {name:?}"))?);
            let off_at = c.offset;
            let offset = c.u64(&format!("data offset of tensor {name:?}"))?;
            if offset % alignment != 0 {
                return Err(GgufError::Malformed {
                    offset: off_at,
                    what: format!(
                        "tensor {name:?} data offset {offset} is not a multiple of the alignment {alignment}"
                    ),
                });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::Malformed {
                    offset: info_offset,
                    what: format!("duplicate tensor name {name:?}"),
                });
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                info_offset,
            });
        }

        let data_offset = align_up(c.offset, alignment);
        let file_len = c.file_len;
        for t in &tensors {
            // Only the readable types have a known size here; others are checked when read.
            if let Some(es) = t.ty.element_size() {
                let start = data_offset.saturating_add(t.offset);
                let end = start.saturating_add(t.n_elements().saturating_mul(es));
                if end > file_len {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        info_offset: t.info_offset,
                        start,
                        end,
                        file_len,
                    });
                }
            }
        }

        Ok(GgufFile {
            source,
            file_len,
            version,
            alignment,
            metadata,
            tensors,
            data_offset,
            key_index,
            tensor_index,
        })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong(key: &str, expected: GgufValueType, found: &GgufValue) -> GgufError {
        GgufError::WrongKeyType {
            key: key.to_string(),
            expected,
            found: found.value_type(),
        }
    }

    /// A required `uint32` key (strictly typed, as llama.cpp reads it).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        match self.require(key)? {
            GgufValue::U32(v) => Ok(*v),
            other => Err(Self::wrong(key, GgufValueType::U32, other)),
        }
    }

    /// A required `float32` key.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            GgufValue::F32(v) => Ok(*v),
            other => Err(Self::wrong(key, GgufValueType::F32, other)),
        }
    }

    /// A required `string` key.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            GgufValue::String(v) => Ok(v),
            other => Err(Self::wrong(key, GgufValueType::String, other)),
        }
    }

    /// An optional `uint32` key: `Ok(None)` when absent, an error when present with another type.
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.get_u32(key).map(Some),
        }
    }

    /// An optional `float32` key.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.get_f32(key).map(Some),
        }
    }

    /// The info of tensor `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Reads tensor `name` and converts it to f32 (from F32, F16 or BF16). Any other element type
    /// is [`GgufError::UnsupportedTensorType`].
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor {
                name: name.to_string(),
            })?;
        let es = info
            .ty
            .element_size()
            .ok_or_else(|| GgufError::UnsupportedTensorType {
                name: name.to_string(),
                ty: info.ty,
            })?;
        let n = info.n_elements();
        let start = self.data_offset + info.offset;
        let len = n * es;
        let raw = self.read_range(start, len, info)?;
        Ok(match info.ty {
            GgmlType::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            GgmlType::F16 => raw
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            GgmlType::Bf16 => raw
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect(),
            GgmlType::Other(_) => unreachable!("element_size() is None for Other"),
        })
    }

    fn read_range(&self, start: u64, len: u64, info: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        let end = start.saturating_add(len);
        let oob = || GgufError::TensorOutOfBounds {
            name: info.name.clone(),
            info_offset: info.info_offset,
            start,
            end,
            file_len: self.file_len,
        };
        if end > self.file_len {
            return Err(oob());
        }
        match &self.source {
            Source::Bytes(b) => Ok(b[start as usize..end as usize].to_vec()),
            Source::File(path) => {
                let io = |source| GgufError::Io {
                    path: path.clone(),
                    source,
                };
                let mut f = File::open(path).map_err(io)?;
                f.seek(SeekFrom::Start(start)).map_err(io)?;
                let mut buf = vec![0u8; len as usize];
                f.read_exact(&mut buf).map_err(|_| oob())?;
                Ok(buf)
            }
        }
    }
}

/// Fuzz target `gguf` (`fuzz/fuzz_targets/gguf.rs`, and `tests/it/fuzz_seeds.rs` over its seeds):
/// any bytes open as a GGUF file or fail with a [`GgufError`]; every key and tensor of one that
/// opens can be asked for, with a value or an error. Panics otherwise.
#[doc(hidden)]
pub fn fuzz_gguf(data: &[u8]) {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, _) in &f.metadata {
        assert!(f.get(key).is_some());
        let _ = (f.get_u32(key), f.get_f32(key), f.get_str(key));
    }
    for t in &f.tensors {
        if let Ok(values) = f.tensor_f32(&t.name) {
            assert_eq!(values.len() as u64, t.n_elements());
        }
    }
}

/// IEEE half to single precision, exact: the crate's one decoder, shared with the state parser.
pub use crate::base::state::f16_to_f32;

/// Builds a GGUF v3 file in memory: metadata in insertion order, then F32 tensors in insertion
/// order, each at the next multiple of [`GGUF_DEFAULT_ALIGNMENT`]. The output depends only on what
/// was added, so the same inputs give byte-identical files.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a key/value pair. Panics on a duplicate key (a bug in the caller, not in a file).
    pub fn add_kv(&mut self, key: impl Into<String>, value: GgufValue) -> &mut Self {
        let key = key.into();
        assert!(
            self.metadata.iter().all(|(k, _)| *k != key),
            "duplicate GGUF key {key:?}"
        );
        assert!(
            key != GGUF_KEY_ALIGNMENT,
            "the writer always uses the default alignment"
        );
        self.metadata.push((key, value));
        self
    }

    /// Adds an F32 tensor with `dims` in ggml order (`dims[0]` fastest). Panics when the data
    /// length does not match the dims or the name is taken.
    pub fn add_tensor_f32(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        data: Vec<f32>,
    ) -> &mut Self {
        let name = name.into();
        assert!(
            !dims.is_empty() && dims.len() <= GGML_MAX_DIMS as usize,
            "tensor {name:?}: 1 to {GGML_MAX_DIMS} dims"
        );
        assert_eq!(
            dims.iter().product::<u64>(),
            data.len() as u64,
            "tensor {name:?}: dims {dims:?} do not match {} elements",
            data.len()
        );
        assert!(
            self.tensors.iter().all(|(n, _, _)| *n != name),
            "duplicate GGUF tensor {name:?}"
        );
        self.tensors.push((name, dims.to_vec(), data));
        self
    }

    /// The encoded file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as i64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as i64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, dims, data) in &self.tensors {
            write_string(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for &d in dims {
                out.extend_from_slice(&(d as i64).to_le_bytes());
            }
            out.extend_from_slice(&GgmlType::F32.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = align_up(offset + data.len() as u64 * 4, GGUF_DEFAULT_ALIGNMENT);
        }
        let data_start = align_up(out.len() as u64, GGUF_DEFAULT_ALIGNMENT);
        out.resize(data_start as usize, 0);
        for ((_, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            for x in data {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        // Pad the last tensor too, as gguf.cpp's writer does.
        let end = align_up(out.len() as u64, GGUF_DEFAULT_ALIGNMENT);
        out.resize(end as usize, 0);
        out
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &GgufValue) {
    match value {
        GgufValue::U8(v) => out.push(*v),
        GgufValue::I8(v) => out.push(*v as u8),
        GgufValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(u8::from(*v)),
        GgufValue::String(s) => write_string(out, s),
        GgufValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::Array(elem, items) => {
            assert!(
                *elem != GgufValueType::Array,
                "nested GGUF arrays are not supported"
            );
            out.extend_from_slice(&elem.id().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                assert_eq!(
                    item.value_type(),
                    *elem,
                    "GGUF array element of the wrong type"
                );
                write_value(out, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", GgufValue::String("llama".into()))
            .add_kv("llama.block_count", GgufValue::U32(2))
            .add_kv(
                "llama.attention.layer_norm_rms_epsilon",
                GgufValue::F32(1e-5),
            )
            .add_kv("flag", GgufValue::Bool(true))
            .add_kv("big", GgufValue::I64(-7))
            .add_kv(
                "list",
                GgufValue::Array(
                    GgufValueType::String,
                    vec![
                        GgufValue::String("a".into()),
                        GgufValue::String("bc".into()),
                    ],
                ),
            )
            .add_tensor_f32("t0", &[3], vec![1.0, -2.0, 3.5])
            .add_tensor_f32("t1", &[2, 3], (0..6).map(|i| i as f32 * 0.25).collect());
        w
    }

    #[test]
    fn round_trip_keys_and_tensors() {
        let bytes = sample().to_bytes();
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.alignment, 32);
        assert_eq!(f.data_offset % 32, 0);
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
        assert_eq!(
            f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
            1e-5
        );
        assert_eq!(f.get("flag"), Some(&GgufValue::Bool(true)));
        assert_eq!(f.get("big"), Some(&GgufValue::I64(-7)));
        assert!(
            matches!(f.get("list"), Some(GgufValue::Array(GgufValueType::String, v)) if v.len() == 2)
        );
        assert_eq!(f.tensor_f32("t0").unwrap(), vec![1.0, -2.0, 3.5]);
        let t1 = f.tensor_info("t1").unwrap();
        assert_eq!(t1.dims, vec![2, 3]);
        assert_eq!(t1.offset % 32, 0);
        assert_eq!(f.tensor_f32("t1").unwrap()[5], 1.25);
        // Strict key types, as llama.cpp checks them.
        assert!(matches!(
            f.get_u32("llama.attention.layer_norm_rms_epsilon"),
            Err(GgufError::WrongKeyType { .. })
        ));
        assert!(matches!(
            f.get_u32("nope"),
            Err(GgufError::MissingKey { .. })
        ));
    }

    #[test]
    fn round_trip_through_a_file() {
        let dir = std::env::temp_dir().join(format!("kvaudit-gguf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sample.gguf");
        std::fs::write(&path, sample().to_bytes()).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.tensor_f32("t1").unwrap().len(), 6);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn truncation_reports_an_offset_not_a_panic() {
        let bytes = sample().to_bytes();
        // Every prefix of the header must fail cleanly.
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        for cut in 0..f.data_offset as usize {
            let err = GgufFile::from_bytes(bytes[..cut].to_vec()).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("byte"), "cut at {cut}: {msg}");
        }
        // A cut inside the data section is caught at open time for f32 tensors.
        let err = GgufFile::from_bytes(bytes[..bytes.len() - 40].to_vec()).unwrap_err();
        assert!(matches!(err, GgufError::TensorOutOfBounds { .. }), "{err}");
    }

    #[test]
    fn malformed_fields_are_errors() {
        let mut bytes = sample().to_bytes();
        bytes[0] = b'X';
        assert!(matches!(
            GgufFile::from_bytes(bytes).unwrap_err(),
            GgufError::BadMagic { .. }
        ));
        let mut bytes = sample().to_bytes();
        bytes[4] = 2;
        assert!(matches!(
            GgufFile::from_bytes(bytes).unwrap_err(),
            GgufError::UnsupportedVersion { version: 2 }
        ));
        // A huge tensor count.
        let mut bytes = sample().to_bytes();
        bytes[8..16].copy_from_slice(&i64::MAX.to_le_bytes());
        let err = GgufFile::from_bytes(bytes).unwrap_err();
        assert!(
            matches!(err, GgufError::Malformed { offset: 8, .. }),
            "{err}"
        );
        // An unknown value type on the first key: key string starts at 24 (8 + 21 bytes).
        let mut bytes = sample().to_bytes();
        let ty_at = 24 + 8 + "general.architecture".len();
        bytes[ty_at..ty_at + 4].copy_from_slice(&99u32.to_le_bytes());
        let err = GgufFile::from_bytes(bytes).unwrap_err();
        assert!(
            matches!(err, GgufError::Malformed { offset, .. } if offset == ty_at as u64),
            "{err}"
        );
    }

    #[test]
    fn unsupported_tensor_type_is_an_error() {
        let mut bytes = sample().to_bytes();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        let info = f.tensor_info("t0").unwrap();
        // name (8 + 2) + n_dims (4) + one dim (8) -> type field.
        let ty_at = info.info_offset as usize + 8 + 2 + 4 + 8;
        bytes[ty_at..ty_at + 4].copy_from_slice(&8u32.to_le_bytes()); // q8_0
        let f = GgufFile::from_bytes(bytes).unwrap();
        let err = f.tensor_f32("t0").unwrap_err();
        assert!(
            matches!(err, GgufError::UnsupportedTensorType { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("q8_0"), "{err}");
    }

    #[test]
    fn f16_conversion() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    }
}
