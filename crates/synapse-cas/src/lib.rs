//! `synapse-cas`: Synapse's storage ring.
//!
//! - [`store`]: a content-addressed object store on the local filesystem. Objects are named by
//!   the blake3 of their bytes, written crash-safely (temp file, fsync, rename, fsync dir),
//!   verified on every read (a flipped byte is [`CasError::Corrupt`], never a wrong tensor),
//!   memory-mapped, safe for several processes at once, garbage-collected from package roots.
//! - [`index`]: a `redb` index (source tensor, encoding, codec version) → object, for cached
//!   precision variants that survive restarts and crashes.
//! - [`package`]: the Synapse package: a deterministic TOML manifest plus objects.
//!
//! The crate knows nothing about model formats: importers (`synapse-import`) turn GGUF or
//! safetensors into calls on [`package::PackageBuilder`]; runtimes read a [`package::Package`].
#![deny(missing_docs)]

pub mod error;
pub mod id;
pub mod index;
pub mod package;
pub mod store;

pub use error::{CasError, Result};
pub use id::{FileDigest, ObjectId};
pub use index::{Index, IndexKey, VariantLookup};
pub use package::{BuiltPackage, Manifest, ManifestTarget, Package, PackageBuilder};
pub use store::{
    Object, PutOutcome, Store, StoreStats, VerifyProblem, VerifyReport, WriteSession,
    default_store_dir,
};
