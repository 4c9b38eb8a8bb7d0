//! `synapse-formats`: the innermost ring of Synapse.
//!
//! It reads model files (GGUF v3, safetensors) without trusting them, writes GGUF, and decodes
//! every source tensor type to the f32 reference exactly as ggml does. It knows nothing about
//! kernels, scheduling, codecs or the network.
#![deny(missing_docs)]

mod backing;
pub mod blocks;
pub mod config;
pub mod decode;
pub mod error;
pub mod gguf;
pub mod safetensors;
pub mod types;

pub use error::{FormatError, Result};
pub use types::{ALL_TYPES, GgmlType, QK_K};
