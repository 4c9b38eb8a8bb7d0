//! `synapse-codecs`: Synapse's own on-the-fly target encodings.
//!
//! Every encoding has a versioned ID (`syn.q4.symmetric.g64.v1`), an exact encoded size, an
//! encoder that refuses non-finite input, a decoder that refuses reserved codes and invalid
//! scales, and `linear`/`dot` computed straight from the encoded bytes. Byte layouts are in the
//! module docs of [`symmetric`], [`asymmetric`] and [`ternary`] and in `docs/formats.md`.
//!
//! ```
//! use synapse_codecs::resolve;
//!
//! let codec = resolve("syn.q4.symmetric.g64.v1")?;
//! let w = [0.5f32, -1.0, 0.25, 0.0];
//! let bytes = codec.encode(&w)?;
//! assert_eq!(bytes.len(), 34); // one FP16 scale + 64 four-bit codes (60 of them padding)
//! // every element within half a step (the scale is ≈ max|w| / 7)
//! let back = codec.decode(&bytes, w.len())?;
//! for (a, b) in w.iter().zip(&back) {
//!     assert!((a - b).abs() <= 0.5 * 1.001 / 7.0);
//! }
//! // dot straight from the bytes equals dot of the decoded weights
//! let x = [1.0f32, 2.0, 3.0, 4.0];
//! let y = codec.dot(&bytes, &x)?;
//! let reference: f32 = back.iter().zip(&x).map(|(a, b)| a * b).sum();
//! assert!((y - reference).abs() < 1e-6);
//! # Ok::<(), synapse_codecs::CodecError>(())
//! ```
//!
//! This crate is a pure library: it knows nothing of files, models, executors or the network,
//! and depends on no other Synapse crate.
#![deny(missing_docs)]

pub mod asymmetric;
pub mod candidates;
pub mod codec;
pub mod error;
pub mod ggml;
mod ggml_k;
pub mod id;
mod pack;
pub mod registry;
mod scale;
pub mod symmetric;
pub mod ternary;

pub use asymmetric::Asymmetric;
pub use candidates::{Candidate, PrecisionCandidates, relative_distortion};
pub use codec::Codec;
pub use error::{CodecError, Result};
pub use ggml::{GgmlBlock, GgmlLegacy};
pub use id::EncodingId;
pub use registry::{codec_for, default_ladder, resolve};
pub use symmetric::Symmetric;
pub use ternary::{TernaryGroup, TernaryTensor};
