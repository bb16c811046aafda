//! The GGUF value types, metadata values, ggml tensor element types and tensor infos that the
//! reader and the writer share.

use std::fmt;

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
    pub(super) fn min_size(self) -> u64 {
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
