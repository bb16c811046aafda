//! The GGUF writer: F32 tensors at the default alignment, byte-identical output for identical
//! inputs.

use super::{
    align_up, GgmlType, GgufValue, GgufValueType, GGML_MAX_DIMS, GGUF_DEFAULT_ALIGNMENT,
    GGUF_KEY_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION,
};

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
