//! GGUF metadata values: scalars, strings and (nested) typed arrays.

use super::strings::GgufStrings;

/// The GGUF metadata value type ids (`gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum GgufValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufValueType {
    /// The type for a raw id, or `None` outside the specification.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The raw id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Smallest number of bytes one value of this type occupies in a file (used to bound
    /// counts before allocating).
    pub fn min_encoded_size(self) -> u64 {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,
            Array => 12,
        }
    }

    /// Lower-case name as gguf-py prints it.
    pub fn name(self) -> &'static str {
        use GgufValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed metadata array: one vector per element type, so score lists are `Vec<f32>`; string
/// arrays are a compact [`GgufStrings`] (one buffer plus offsets, borrowed from the file when
/// read), so a 262,144-entry token list is not 262,144 allocations.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(GgufStrings),
    /// Arrays of arrays; each inner array has its own element type.
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl GgufValue {
    /// The value's type id.
    pub fn value_type(&self) -> GgufValueType {
        use GgufValue as V;
        use GgufValueType as T;
        match self {
            V::U8(_) => T::U8,
            V::I8(_) => T::I8,
            V::U16(_) => T::U16,
            V::I16(_) => T::I16,
            V::U32(_) => T::U32,
            V::I32(_) => T::I32,
            V::F32(_) => T::F32,
            V::Bool(_) => T::Bool,
            V::String(_) => T::String,
            V::Array(_) => T::Array,
            V::U64(_) => T::U64,
            V::I64(_) => T::I64,
            V::F64(_) => T::F64,
        }
    }

    /// Any non-negative integer value as `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        use GgufValue as V;
        match *self {
            V::U8(v) => Some(v.into()),
            V::U16(v) => Some(v.into()),
            V::U32(v) => Some(v.into()),
            V::U64(v) => Some(v),
            V::I8(v) => u64::try_from(v).ok(),
            V::I16(v) => u64::try_from(v).ok(),
            V::I32(v) => u64::try_from(v).ok(),
            V::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        use GgufValue as V;
        match *self {
            V::U8(v) => Some(v.into()),
            V::U16(v) => Some(v.into()),
            V::U32(v) => Some(v.into()),
            V::U64(v) => i64::try_from(v).ok(),
            V::I8(v) => Some(v.into()),
            V::I16(v) => Some(v.into()),
            V::I32(v) => Some(v.into()),
            V::I64(v) => Some(v),
            _ => None,
        }
    }

    /// An `f32` or `f64` value as `f32`.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An `f32` or `f64` value as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A string array (e.g. `tokenizer.ggml.tokens`), without copying.
    pub fn as_strings(&self) -> Option<&GgufStrings> {
        self.as_array().and_then(GgufArray::as_strings)
    }

    /// An `f32` array as a slice (e.g. `tokenizer.ggml.scores`), without copying.
    pub fn as_f32s(&self) -> Option<&[f32]> {
        self.as_array().and_then(GgufArray::as_f32s)
    }

    /// An `i32` array as a slice (e.g. `tokenizer.ggml.token_type`), without copying.
    pub fn as_i32s(&self) -> Option<&[i32]> {
        self.as_array().and_then(GgufArray::as_i32s)
    }
}

impl GgufArray {
    /// The element type.
    pub fn element_type(&self) -> GgufValueType {
        use GgufArray as A;
        use GgufValueType as T;
        match self {
            A::U8(_) => T::U8,
            A::I8(_) => T::I8,
            A::U16(_) => T::U16,
            A::I16(_) => T::I16,
            A::U32(_) => T::U32,
            A::I32(_) => T::I32,
            A::F32(_) => T::F32,
            A::Bool(_) => T::Bool,
            A::String(_) => T::String,
            A::Array(_) => T::Array,
            A::U64(_) => T::U64,
            A::I64(_) => T::I64,
            A::F64(_) => T::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        use GgufArray as A;
        match self {
            A::U8(v) => v.len(),
            A::I8(v) => v.len(),
            A::U16(v) => v.len(),
            A::I16(v) => v.len(),
            A::U32(v) => v.len(),
            A::I32(v) => v.len(),
            A::F32(v) => v.len(),
            A::Bool(v) => v.len(),
            A::String(v) => v.len(),
            A::Array(v) => v.len(),
            A::U64(v) => v.len(),
            A::I64(v) => v.len(),
            A::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as an owned value (strings and inner arrays are cloned).
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        use GgufArray as A;
        use GgufValue as V;
        Some(match self {
            A::U8(v) => V::U8(*v.get(i)?),
            A::I8(v) => V::I8(*v.get(i)?),
            A::U16(v) => V::U16(*v.get(i)?),
            A::I16(v) => V::I16(*v.get(i)?),
            A::U32(v) => V::U32(*v.get(i)?),
            A::I32(v) => V::I32(*v.get(i)?),
            A::F32(v) => V::F32(*v.get(i)?),
            A::Bool(v) => V::Bool(*v.get(i)?),
            A::String(v) => V::String(v.get(i)?.to_owned()),
            A::Array(v) => V::Array(v.get(i)?.clone()),
            A::U64(v) => V::U64(*v.get(i)?),
            A::I64(v) => V::I64(*v.get(i)?),
            A::F64(v) => V::F64(*v.get(i)?),
        })
    }

    /// Iterates the elements as owned values (see [`GgufArray::get`]).
    pub fn iter(&self) -> impl Iterator<Item = GgufValue> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The strings of a string array.
    pub fn as_strings(&self) -> Option<&GgufStrings> {
        match self {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// The values of an `f32` array.
    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            GgufArray::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The values of an `i32` array.
    pub fn as_i32s(&self) -> Option<&[i32]> {
        match self {
            GgufArray::I32(v) => Some(v),
            _ => None,
        }
    }

    /// The values of a `u32` array.
    pub fn as_u32s(&self) -> Option<&[u32]> {
        match self {
            GgufArray::U32(v) => Some(v),
            _ => None,
        }
    }

    /// Every element of an integer array as `i64` (`None` for non-integer arrays or a `u64`
    /// above `i64::MAX`).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        self.iter().map(|v| v.as_i64()).collect()
    }

    /// Every element of a numeric (integer or float) array as `f32`; `None` otherwise.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        self.iter()
            .map(|v| v.as_f32().or_else(|| v.as_i64().map(|i| i as f32)))
            .collect()
    }
}
