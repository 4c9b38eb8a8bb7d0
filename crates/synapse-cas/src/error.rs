//! The one error enum of `synapse-cas`, grouped by category.

use crate::id::ObjectId;
use std::path::PathBuf;

/// Everything that can go wrong in the object store, the index or a package.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CasError {
    // ---- I/O ----
    /// A file or directory of the store could not be created, read, written, synced or locked.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    // ---- integrity ----
    /// An object's bytes do not hash to its name: the store is corrupt. Never returned as data.
    #[error("object {id} is corrupt: its content hashes to {actual} ({path})")]
    Corrupt {
        /// The object's name (its expected blake3).
        id: ObjectId,
        /// The blake3 of the bytes actually on disk.
        actual: ObjectId,
        /// Where it lives.
        path: PathBuf,
    },
    /// An object referenced by a manifest or the index is not in the store.
    #[error("object {id} is missing from the store at {store}")]
    Missing {
        /// The missing object.
        id: ObjectId,
        /// The store's root.
        store: PathBuf,
    },
    /// A string that should be an object id is not `blake3:` followed by 64 lowercase hex digits.
    #[error("`{text}` is not an object id (expected `blake3:` + 64 lowercase hex digits)")]
    BadId {
        /// The offending text.
        text: String,
    },

    // ---- index ----
    /// The embedded index database (redb) failed.
    #[error("index database {path}: {message}")]
    Index {
        /// The database file.
        path: PathBuf,
        /// What redb said.
        message: String,
    },

    // ---- packages ----
    /// A manifest could not be parsed or does not follow the package format.
    #[error("manifest {path}: {message}")]
    Manifest {
        /// Where the manifest was read from.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A manifest's format version is newer than this build understands.
    #[error("package format version {found} is not supported (this build reads up to {supported})")]
    UnsupportedVersion {
        /// The version in the manifest.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// No package matches the given directory, file or hash.
    #[error("no package found for `{query}` ({reason})")]
    PackageNotFound {
        /// What the user asked for.
        query: String,
        /// Why nothing matched.
        reason: String,
    },
    /// A hash prefix matches several packages.
    #[error("`{query}` matches {count} packages; give more digits")]
    AmbiguousPackage {
        /// The prefix given.
        query: String,
        /// How many packages matched.
        count: usize,
    },
    /// A package was built inconsistently (duplicate tensor, alias to nothing, ...).
    #[error("invalid package: {0}")]
    InvalidPackage(String),
    /// A tensor name is not in the package.
    #[error("tensor `{0}` is not in the package")]
    NoSuchTensor(String),
}

impl CasError {
    /// Wraps an I/O error with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CasError {
        let path = path.into();
        move |source| CasError::Io { path, source }
    }
}

/// Result alias for this crate.
pub type Result<T, E = CasError> = std::result::Result<T, E>;
