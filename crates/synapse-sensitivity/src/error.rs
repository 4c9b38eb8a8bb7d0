//! The one error enum of `synapse-sensitivity`.

use synapse_codecs::CodecError;

/// Everything that can go wrong measuring distortion or handling an importance map.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SensitivityError {
    /// A codec refused the data.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Two sizes that must agree do not.
    #[error("{what}: expected {expected}, got {actual}")]
    ShapeMismatch {
        /// Which size.
        what: &'static str,
        /// Required.
        expected: usize,
        /// Given.
        actual: usize,
    },
    /// A calibration activation is NaN or infinite.
    #[error("non-finite calibration value at index {index}")]
    NonFinite {
        /// Flat index.
        index: usize,
    },
    /// The JSON text is not a well-formed importance map.
    #[error("importance map is malformed: {reason}")]
    Malformed {
        /// Parser message or the violated rule.
        reason: String,
    },
    /// The map was written by a format version this build does not read.
    #[error(
        "importance map format version {found} is not supported (this build reads {supported})"
    )]
    UnsupportedFormatVersion {
        /// Version in the file.
        found: u64,
        /// Version this build reads.
        supported: u32,
    },
    /// The map's provenance does not match what it is being applied to.
    #[error(
        "importance map provenance mismatch on {field}: map has `{found}`, expected `{expected}`"
    )]
    ProvenanceMismatch {
        /// Which provenance field.
        field: &'static str,
        /// What the caller's model / codecs have.
        expected: String,
        /// What the map records.
        found: String,
    },
    /// A tensor is added twice to a map.
    #[error("tensor `{name}` is already in the map")]
    DuplicateTensor {
        /// Tensor name.
        name: String,
    },
}

/// Result alias for this crate.
pub type Result<T, E = SensitivityError> = std::result::Result<T, E>;
