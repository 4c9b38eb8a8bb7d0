//! The one error enum of `synapse-import`.

use std::path::PathBuf;

/// Everything that can go wrong importing a model or opening a package as a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// A source file could not be read.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The source is not something Synapse imports.
    #[error("{path} is not an importable model: {reason}")]
    NotAModel {
        /// The path given.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The model file is malformed or uses an encoding the formats ring refuses.
    #[error(transparent)]
    Format(#[from] synapse_formats::FormatError),
    /// The family adapter refused the model (unknown architecture, missing or unexpected
    /// tensor, wrong shape, unsupported operation or encoding). Raised before anything is
    /// written.
    #[error("the model does not pass its family adapter: {0}")]
    Model(#[from] synapse_model::ModelError),
    /// The object store or package layer failed.
    #[error(transparent)]
    Cas(#[from] synapse_cas::CasError),
    /// A tensor could not be transcoded into the encoding its model runs (e.g. a BitNet
    /// projection with a code that is not ternary): at import, before anything is written, or
    /// loading a source file.
    #[error("tensor `{tensor}` cannot be made {encoding}: {reason}")]
    Transcode {
        /// The tensor.
        tensor: String,
        /// The package encoding.
        encoding: &'static str,
        /// Why.
        reason: String,
    },
    /// A tensor is stored transcoded, where its source bytes were asked for.
    #[error(
        "tensor `{tensor}` is stored as {encoding}, not in its source encoding {source_encoding}"
    )]
    Transcoded {
        /// The tensor.
        tensor: String,
        /// Its stored encoding.
        encoding: String,
        /// The encoding the source held it in.
        source_encoding: String,
    },
    /// A package does not hold what a model needs (e.g. a GGUF package without its metadata).
    #[error("package {package}: {reason}")]
    BadPackage {
        /// The package hash.
        package: String,
        /// What is missing or wrong.
        reason: String,
    },
}

impl ImportError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ImportError {
        let path = path.into();
        move |source| ImportError::Io { path, source }
    }
}

/// Result alias for this crate.
pub type Result<T, E = ImportError> = std::result::Result<T, E>;
