//! The GGUF reader: a bounded header parse (every count checked against the bytes left and the
//! `MAX_GGUF_*` limits before anything is allocated), tensor data read on demand.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    align_up, f16_to_f32, GgmlType, GgufError, GgufValue, GgufValueType, TensorInfo, GGML_MAX_DIMS,
    GGUF_DEFAULT_ALIGNMENT, GGUF_KEY_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_GGUF_ARRAY_LEN,
    MAX_GGUF_HEADER_BYTES, MAX_GGUF_KV, MAX_GGUF_STRING_BYTES, MAX_GGUF_TENSORS,
};

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
