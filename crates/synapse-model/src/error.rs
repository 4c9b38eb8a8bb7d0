//! The one error enum of `synapse-model`.

/// Everything that can go wrong turning a model source into the IR.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    // ---- family / architecture ----
    /// The source names an architecture no adapter handles.
    #[error("unsupported model architecture {arch:?} (supported: {supported})")]
    UnsupportedArchitecture {
        /// The architecture string found in the source.
        arch: String,
        /// The supported families, comma separated.
        supported: String,
    },
    /// The source carries a feature this adapter cannot run (an operation, a rope scaling …).
    #[error("{family}: unsupported feature: {what}")]
    UnsupportedFeature {
        /// The family adapter.
        family: &'static str,
        /// What is not supported.
        what: String,
    },

    // ---- metadata ----
    /// A required metadata key is absent.
    #[error("{family}: missing metadata key {key:?}")]
    MissingKey {
        /// The family adapter.
        family: &'static str,
        /// The key (in the source's own naming).
        key: String,
    },
    /// A metadata value has the wrong type or an impossible value.
    #[error("{family}: metadata key {key:?} is invalid: {reason}")]
    InvalidValue {
        /// The family adapter.
        family: &'static str,
        /// The key.
        key: String,
        /// Why it is invalid.
        reason: String,
    },

    // ---- tensors ----
    /// A tensor the family needs is absent.
    #[error("{family}: missing tensor {name:?}")]
    MissingTensor {
        /// The family adapter.
        family: &'static str,
        /// The tensor name.
        name: String,
    },
    /// A tensor has a shape other than the hyperparameters imply.
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The tensor name.
        name: String,
        /// The row-major shape found.
        found: Vec<u64>,
        /// The row-major shape expected.
        expected: Vec<u64>,
    },
    /// A tensor is in the source but no part of the graph uses it.
    #[error("{family}: tensor {name:?} is not used by any supported operation")]
    UnexpectedTensor {
        /// The family adapter.
        family: &'static str,
        /// The tensor name.
        name: String,
    },
    /// A tensor's encoding cannot be used where the graph needs it.
    #[error("tensor {name:?}: encoding {encoding} is not supported for {role}")]
    UnsupportedEncoding {
        /// The tensor name.
        name: String,
        /// The encoding name.
        encoding: String,
        /// The role in the graph.
        role: String,
    },

    // ---- sources ----
    /// The underlying model file could not be read.
    #[error(transparent)]
    Format(#[from] synapse_formats::FormatError),
    /// A `config.json` could not be parsed.
    #[error("config.json: {0}")]
    Config(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
