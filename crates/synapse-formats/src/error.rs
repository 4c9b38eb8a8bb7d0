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

    // ---- GGUF container ----
    /// The file does not start with the GGUF magic.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The first bytes found (up to 4).
        found: Vec<u8>,
    },
    /// A GGUF version other than 3.
    #[error("GGUF version {version} is not supported (only version 3 is)")]
    UnsupportedVersion {
        /// The version field read from the header.
        version: u32,
    },
    /// The file ends before a structure it announces.
    #[error(
        "file truncated reading {what} at offset {offset}: need {needed} bytes, {available} left"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// Byte offset where the read started.
        offset: u64,
        /// Bytes the read needed.
        needed: u64,
        /// Bytes remaining in the file.
        available: u64,
    },
    /// A count read from a header cannot fit in the rest of the file.
    #[error("{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left")]
    CountTooLarge {
        /// What is being counted.
        what: String,
        /// The count read.
        count: u64,
        /// Byte offset of the count field.
        offset: u64,
        /// Bytes left after the count field.
        remaining: u64,
    },
    /// A string field is not valid UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string.
        what: String,
        /// Byte offset of the string's bytes.
        offset: u64,
    },
    /// A metadata value type id outside the GGUF specification.
    #[error("metadata key `{key}` has unknown value type id {id}")]
    UnknownValueType {
        /// The key being read.
        key: String,
        /// The raw value type id.
        id: u32,
    },
    /// Arrays nested deeper than the reader allows.
    #[error("metadata key `{key}`: arrays nested deeper than {limit} levels")]
    NestingTooDeep {
        /// The key being read.
        key: String,
        /// The nesting limit.
        limit: usize,
    },
    /// The same metadata key appears twice.
    #[error("metadata key `{key}` appears more than once")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// A well-known metadata key has the wrong type or an invalid value.
    #[error("metadata key `{key}`: {reason}")]
    BadMetadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("alignment {alignment} is not a non-zero power of two")]
    BadAlignment {
        /// The alignment read.
        alignment: u64,
    },
    /// The same tensor name appears twice.
    #[error("tensor `{name}` appears more than once")]
    DuplicateTensor {
        /// The repeated name.
        name: String,
    },
    /// A tensor's shape is invalid (too many dims, overflowing element count, partial blocks).
    #[error("tensor `{tensor}`: bad shape {dims:?}: {reason}")]
    BadShape {
        /// The tensor's name.
        tensor: String,
        /// Its dimensions as read.
        dims: Vec<u64>,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's data offset is not a multiple of the file's alignment.
    #[error("tensor `{tensor}`: data offset {offset} is not aligned to {alignment}")]
    Misaligned {
        /// The tensor's name.
        tensor: String,
        /// The offset (relative to the data section).
        offset: u64,
        /// The alignment required.
        alignment: u64,
    },
    /// A tensor's bytes lie (partly) outside the file.
    #[error(
        "tensor `{tensor}`: bytes [{start}, {start}+{len}) lie outside the {file_len}-byte file"
    )]
    OutOfBounds {
        /// The tensor's name.
        tensor: String,
        /// Absolute start offset (saturated on overflow).
        start: u64,
        /// Length in bytes.
        len: u64,
        /// File size.
        file_len: u64,
    },
    /// Two tensors' byte ranges overlap.
    #[error("tensors `{first}` and `{second}` overlap")]
    Overlap {
        /// The tensor that starts first.
        first: String,
        /// The tensor that starts inside it.
        second: String,
    },

    // ---- safetensors ----
    /// A safetensors header (length, JSON or entries) is invalid.
    #[error("safetensors {path}: {reason}")]
    SafetensorsHeader {
        /// The file concerned (or `<bytes>`).
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A safetensors dtype string this reader does not know.
    #[error("safetensors tensor `{tensor}` has unknown dtype `{dtype}`")]
    UnknownDtype {
        /// The tensor's name.
        tensor: String,
        /// The dtype string.
        dtype: String,
    },
    /// A sharded checkpoint refers to a shard that does not exist.
    #[error("shard `{shard}` named in {index} is missing")]
    MissingShard {
        /// The shard file name.
        shard: String,
        /// The index file.
        index: String,
    },
    /// A sharded index names a tensor its shard lacks, or is otherwise inconsistent.
    #[error("sharded checkpoint {index}: {reason}")]
    BadIndex {
        /// The index file.
        index: String,
        /// What is wrong.
        reason: String,
    },
    /// A `config.json` that cannot be parsed into [`crate::config::ModelConfig`].
    #[error("config {path}: {reason}")]
    BadConfig {
        /// The file concerned.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A path is neither a GGUF nor a safetensors model.
    #[error("{path}: {reason}")]
    NotAModel {
        /// The path concerned.
        path: String,
        /// Why it was not recognised.
        reason: String,
    },
    /// Writing a GGUF file failed validation (bad tensor size, duplicate name ...).
    #[error("GGUF writer: {reason}")]
    Write {
        /// What is wrong.
        reason: String,
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
    /// An element-wise dtype without a ggml id (e.g. safetensors FP8): lengths disagree.
    #[error(
        "{dtype}: {src_bytes} source bytes and {dst_len} outputs do not match ({elem_bytes} bytes per element)"
    )]
    DtypeLength {
        /// The dtype being decoded.
        dtype: &'static str,
        /// Bytes given.
        src_bytes: usize,
        /// Output elements asked for.
        dst_len: usize,
        /// Bytes per element.
        elem_bytes: usize,
    },
}

/// Result alias for this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;
