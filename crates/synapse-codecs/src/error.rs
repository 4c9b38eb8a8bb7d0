//! The one error enum of `synapse-codecs`.

/// Everything that can go wrong resolving, encoding or decoding a Synapse encoding.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    // ---- encoding IDs ----
    /// The ID does not name any codec family Synapse knows.
    #[error("unknown encoding id `{id}`")]
    UnknownEncoding {
        /// The ID as given.
        id: String,
    },
    /// The ID names a known family but with parameters outside its domain.
    #[error("invalid encoding id `{id}`: {reason}")]
    InvalidEncoding {
        /// The ID as given.
        id: String,
        /// Why it is refused.
        reason: String,
    },

    // ---- input data ----
    /// An input value is NaN or infinite.
    #[error("non-finite input value {value} at index {index}")]
    NonFinite {
        /// Flat index of the offending value.
        index: usize,
        /// The value itself.
        value: f32,
    },
    /// A group's values are too large for its FP16 scale (or minimum).
    #[error("group {group} needs a scale of {needed:e}, outside the FP16 range")]
    ScaleOutOfRange {
        /// Group index within the row (or 0 for a per-tensor scale).
        group: usize,
        /// The scale (or offset) that would have been needed.
        needed: f64,
    },
    /// Two lengths that must agree do not.
    #[error("{what}: expected {expected}, got {actual}")]
    LengthMismatch {
        /// Which length.
        what: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A row does not hold whole blocks of a block type that has no partial block (ggml's).
    #[error("`{id}` needs rows of a multiple of {block} elements, not {cols}")]
    PartialBlock {
        /// The encoding.
        id: String,
        /// Elements per row given.
        cols: usize,
        /// Its block size.
        block: usize,
    },
    /// The requested element count overflows `usize` once encoded.
    #[error("{elements} elements overflow the encoded size computation")]
    SizeOverflow {
        /// The element count.
        elements: usize,
    },

    // ---- encoded data ----
    /// A stored code is the reserved one, which no encoder emits.
    #[error("reserved code at element {index}")]
    ReservedCode {
        /// Flat element index of the code.
        index: usize,
    },
    /// A stored scale is negative, NaN or infinite.
    #[error("invalid stored scale in group {group}")]
    InvalidScale {
        /// Group index (row-major across the whole buffer).
        group: usize,
    },
}

/// Result alias for this crate.
pub type Result<T, E = CodecError> = std::result::Result<T, E>;
