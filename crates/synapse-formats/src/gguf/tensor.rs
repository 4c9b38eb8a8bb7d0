//! GGUF tensor infos and the tensor type, including the bitnet.cpp fork's ids.

use std::fmt;

use crate::error::{FormatError, Result};
use crate::types::GgmlType;

/// The bitnet.cpp fork's tensor types, which reuse ids 36–39 (see the module docs of
/// [`crate::gguf`] for how a reader tells them from upstream's meaning of those ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum BitnetType {
    /// 2-bit ternary weights with a per-tensor scale (id 36).
    I2_S = 36,
    /// 8-bit activations (id 37).
    I8_S = 37,
    /// Lookup-table kernel layout 1 (id 38).
    TL1 = 38,
    /// Lookup-table kernel layout 2 (id 39; upstream ggml uses 39 for MXFP4).
    TL2 = 39,
}

impl BitnetType {
    /// The fork type for a raw id in 36..=39.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            36 => BitnetType::I2_S,
            37 => BitnetType::I8_S,
            38 => BitnetType::TL1,
            39 => BitnetType::TL2,
            _ => return None,
        })
    }

    /// bitnet.cpp's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            BitnetType::I2_S => "i2_s",
            BitnetType::I8_S => "i8_s",
            BitnetType::TL1 => "tl1",
            BitnetType::TL2 => "tl2",
        }
    }
}

/// A tensor's element type: an upstream ggml type, or a bitnet.cpp fork type when the file's
/// provenance says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorType {
    /// An upstream ggml type.
    Ggml(GgmlType),
    /// A bitnet.cpp fork type (ids 36–39 in bitnet files).
    Bitnet(BitnetType),
}

impl TensorType {
    /// The raw id stored in the file.
    pub fn id(self) -> u32 {
        match self {
            TensorType::Ggml(t) => t.id(),
            TensorType::Bitnet(t) => t as u32,
        }
    }

    /// The type's name (`q4_K`, `i2_s`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TensorType::Ggml(t) => t.name(),
            TensorType::Bitnet(t) => t.name(),
        }
    }

    /// The upstream ggml type, or a typed [`FormatError::Unsupported`] for the fork types:
    /// they are no ggml type. (The model layer reads I2_S projections of a `bitnet-b1.58`
    /// file itself; I8_S, TL1 and TL2 are not read, and packages hold ggml types only.)
    pub fn ggml(self) -> Result<GgmlType> {
        match self {
            TensorType::Ggml(t) => Ok(t),
            TensorType::Bitnet(t) => Err(FormatError::Unsupported {
                name: t.name().to_string(),
                reason: match t {
                    BitnetType::I2_S => format!(
                        "bitnet.cpp fork type (id {}) is no ggml type: a Synapse package cannot \
                         hold it (load the GGUF itself: its bitnet-b1.58 projections run as \
                         W1.58A8)",
                        t as u32
                    ),
                    _ => format!("bitnet.cpp fork type (id {}) is not read", t as u32),
                },
            }),
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<GgmlType> for TensorType {
    fn from(t: GgmlType) -> Self {
        TensorType::Ggml(t)
    }
}

/// One tensor's description, validated against the file at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is `ne0`, the fastest-varying (contiguous) one.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: TensorType,
    /// Absolute byte offset of the tensor's data in the file.
    pub offset: u64,
    /// Size of the tensor's data in bytes. For upstream types this is ggml's `nbytes`; for
    /// the bitnet.cpp fork types (whose sizes the reader does not model) it is the span up to
    /// the next tensor or the end of the file.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (the product of `dims`; checked for overflow at open, saturating
    /// for a hand-built info).
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Dimensions in row-major (outermost first) order, as numpy / safetensors print them.
    pub fn shape_row_major(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}
