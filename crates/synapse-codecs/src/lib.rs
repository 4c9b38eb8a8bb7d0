//! `synapse-codecs`: Synapse's own on-the-fly target encodings.
//!
//! Every encoding has a versioned ID (`syn.q4.symmetric.g64.v1`), an exact encoded size, an
//! encoder that refuses non-finite input, a decoder that refuses reserved codes and invalid
//! scales, and `linear`/`dot` computed straight from the encoded bytes. Byte layouts are in the
//! module docs of [`symmetric`], [`asymmetric`] and [`ternary`] and in `docs/formats.md`.
//!
//! This crate is a pure library: it knows nothing of files, models, executors or the network,
//! and depends on no other Synapse crate.
#![deny(missing_docs)]

pub mod asymmetric;
pub mod candidates;
pub mod codec;
pub mod error;
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
pub use id::EncodingId;
pub use registry::{codec_for, default_ladder, resolve};
pub use symmetric::Symmetric;
pub use ternary::{TernaryGroup, TernaryTensor};
