//! safetensors element types.

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

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
