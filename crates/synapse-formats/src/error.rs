//! The one error enum of `synapse-formats`, grouped by category.

use crate::types::GgmlType;

/// Everything that can go wrong reading, writing or decoding a model file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    // ---- I/O ----
    /// The underlying file could not be opened, mapped or read.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file concerned.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    // ---- types and decoding ----
    /// A GGUF tensor uses a type id this build cannot decode.
    #[error("tensor `{tensor}` has ggml type id {id}, which Synapse cannot decode")]
    UnknownType {
        /// The raw type id.
        id: u32,
        /// The tensor's name.
        tensor: String,
    },
    /// A known type that has no decoder yet (e.g. bitnet.cpp's I2_S).
    #[error("type {name} is not yet supported: {reason}")]
    Unsupported {
        /// The type's name.
        name: String,
        /// Why, and what would add it.
        reason: String,
    },
    /// A source buffer is not a whole number of blocks, or the destination length disagrees.
    #[error(
        "{ty}: {src_bytes} source bytes and {dst_len} outputs do not match ({block} elements per {type_size}-byte block)"
    )]
    DecodeLength {
        /// The type being decoded.
        ty: GgmlType,
        /// Bytes given.
        src_bytes: usize,
        /// Output elements asked for.
        dst_len: usize,
        /// Elements per block.
        block: usize,
        /// Bytes per block.
        type_size: usize,
    },
}

/// Result alias for this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;
