//! safetensors element types.

use crate::error::{FormatError, Result};
use crate::types::GgmlType;

/// A safetensors dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types, missing_docs)]
pub enum Dtype {
    F64,
    F32,
    F16,
    BF16,
    F8_E4M3,
    F8_E5M2,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    BOOL,
}

impl Dtype {
    /// Every dtype, for tests and tables.
    pub const ALL: [Dtype; 15] = [
        Dtype::F64,
        Dtype::F32,
        Dtype::F16,
        Dtype::BF16,
        Dtype::F8_E4M3,
        Dtype::F8_E5M2,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
        Dtype::BOOL,
    ];

    /// Parses the header's dtype string (`"BF16"`, `"F8_E4M3"`, ...).
    pub fn parse(s: &str) -> Option<Self> {
        Dtype::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// The header spelling.
    pub fn as_str(self) -> &'static str {
        use Dtype::*;
        match self {
            F64 => "F64",
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            F8_E4M3 => "F8_E4M3",
            F8_E5M2 => "F8_E5M2",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            U8 => "U8",
            U16 => "U16",
            U32 => "U32",
            U64 => "U64",
            BOOL => "BOOL",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        use Dtype::*;
        match self {
            F8_E4M3 | F8_E5M2 | I8 | U8 | BOOL => 1,
            F16 | BF16 | I16 | U16 => 2,
            F32 | I32 | U32 => 4,
            F64 | I64 | U64 => 8,
        }
    }

    /// The ggml type with the same element encoding, where one exists.
    pub fn ggml(self) -> Option<GgmlType> {
        use Dtype::*;
        Some(match self {
            F64 => GgmlType::F64,
            F32 => GgmlType::F32,
            F16 => GgmlType::F16,
            BF16 => GgmlType::BF16,
            I8 => GgmlType::I8,
            I16 => GgmlType::I16,
            I32 => GgmlType::I32,
            I64 => GgmlType::I64,
            F8_E4M3 | F8_E5M2 | U8 | U16 | U32 | U64 | BOOL => return None,
        })
    }
}

impl Dtype {
    /// Decodes `src` (elements of this dtype, little-endian) into `dst`, one f32 each.
    ///
    /// Float dtypes and the signed integers go through [`crate::decode`] (exact widening,
    /// FP8 E4M3FN/E5M2 included); unsigned integers convert as `as f32` (round to nearest
    /// even) and BOOL as 0/1 (any non-zero byte is true). A length mismatch is
    /// [`FormatError::DtypeLength`].
    pub fn decode_to_f32(self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        let size = self.size();
        if !src.len().is_multiple_of(size) || src.len() / size != dst.len() {
            return Err(FormatError::DtypeLength {
                dtype: self.as_str(),
                src_bytes: src.len(),
                dst_len: dst.len(),
                elem_bytes: size,
            });
        }
        use crate::decode::dequantize;
        match self {
            Dtype::F64 => return dequantize(GgmlType::F64, src, dst),
            Dtype::F32 => return dequantize(GgmlType::F32, src, dst),
            Dtype::F16 => return dequantize(GgmlType::F16, src, dst),
            Dtype::BF16 => return dequantize(GgmlType::BF16, src, dst),
            Dtype::I8 => return dequantize(GgmlType::I8, src, dst),
            Dtype::I16 => return dequantize(GgmlType::I16, src, dst),
            Dtype::I32 => return dequantize(GgmlType::I32, src, dst),
            Dtype::I64 => return dequantize(GgmlType::I64, src, dst),
            Dtype::F8_E4M3 => return crate::decode::decode_f8_e4m3fn(src, dst),
            Dtype::F8_E5M2 => return crate::decode::decode_f8_e5m2(src, dst),
            Dtype::U8 => {
                for (v, &b) in dst.iter_mut().zip(src) {
                    *v = f32::from(b);
                }
            }
            Dtype::BOOL => {
                for (v, &b) in dst.iter_mut().zip(src) {
                    *v = if b != 0 { 1.0 } else { 0.0 };
                }
            }
            Dtype::U16 => {
                for (v, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *v = f32::from(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Dtype::U32 => {
                for (v, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32;
                }
            }
            Dtype::U64 => {
                for (v, b) in dst.iter_mut().zip(src.chunks_exact(8)) {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    *v = u64::from_le_bytes(a) as f32;
                }
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
