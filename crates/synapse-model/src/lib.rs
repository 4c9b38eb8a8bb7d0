//! `synapse-model`: the model graph ring.
//!
//! A model file (GGUF, or `config.json` + safetensors) becomes a [`SourceDesc`] (metadata and
//! a tensor table); a family adapter (one file per family under [`family`]) turns it into a
//! [`ModelIr`]: regions, operation attributes, weight descriptors, tied aliases and a
//! fingerprint. Anything an adapter does not understand — an architecture, a tensor no
//! operation uses, a rope scaling kind — is a typed [`ModelError`] here, before any
//! generation starts.
//!
//! Architecture invariant: this crate reads metadata and tensor tables, never tensor data
//! (weights are described by byte ranges), and knows nothing about kernels or execution.
#![deny(missing_docs)]

pub mod error;
pub mod family;
pub mod ir;
pub mod source;

pub use error::{ModelError, Result};
pub use family::build_ir;
pub use ir::*;
pub use source::{MetaValue, SourceDesc, SourceTensor};
