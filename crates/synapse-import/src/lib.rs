//! `synapse-import`: model files in, Synapse packages out (and back).
//!
//! - [`import()`]: a GGUF v3 file or a safetensors checkpoint (single or sharded, with its
//!   `config.json`) becomes a content-addressed package in a store or a self-contained
//!   directory. Everything is validated by the family adapter of `synapse-model` before the
//!   first byte is written; the manifest is written last.
//! - [`PackageModel`]: a package opened for running: the same [`synapse_model::SourceDesc`]
//!   and IR the source file gives, with tensor bytes memory-mapped from verified objects.
//!
//! Why a crate of its own: `synapse-cas` knows nothing about model formats (it stores bytes
//! and manifests), and `synapse-formats`/`synapse-model` know nothing about storage. This crate
//! is the one place where the two meet, and both the CLI (`synapse-cli import`) and
//! `cargo xtask import` call [`import()`], so there is one code path.
#![deny(missing_docs)]

pub mod error;
pub mod export;
pub mod gguf;
pub mod import;
pub mod package_model;
pub mod progress;
pub mod safetensors;
pub mod ternary;

pub use error::{ImportError, Result};
pub use export::export_gguf;
pub use import::{
    CONVERTER, CONVERTER_VERSION, Destination, ImportReport, SourceFormat, detect, import, summary,
};
pub use package_model::{PackageModel, is_package_dir};
pub use ternary::TERNARY_ENCODING;
