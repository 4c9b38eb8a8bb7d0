//! `synapse-sensitivity`: what matters, measured on activations.
//!
//! The distortion of encoding a weight matrix `W` as `Q(W)` is measured where it shows — on the
//! layer's output for calibration activations `X`:
//! `‖(W − Q(W)) X‖² / ‖W X‖²`, not on weight magnitudes. Two tensors with the same weights and
//! the same quantizer rank differently under different activations ([`distortion`]).
//!
//! An [`ImportanceMap`] records, per tensor and per candidate encoding, the measured distortion
//! and exact size, together with the calibration provenance (model fingerprint, calibration-data
//! hash, sample count, codec versions). It serializes to versioned JSON and refuses, with a
//! typed error, to be applied to a model or codec set it was not measured for.
//!
//! [`rank`] measures how well predicted distortions rank measured effects (Spearman).
//!
//! [`corpus`] splits calibration text into a calibration part and a held-out evaluation part,
//! by document.
//!
//! Pure library: no files, no executor, no network. Depends only on `synapse-codecs`.
#![deny(missing_docs)]

pub mod calibration;
pub mod corpus;
pub mod distortion;
pub mod error;
pub mod map;
pub mod rank;

pub use calibration::Calibration;
pub use distortion::{TensorPart, measure_parts, measure_tensor, output_distortion};
pub use error::{Result, SensitivityError};
pub use map::{
    EncodingOption, FORMAT_VERSION, ImportanceMap, ImportanceMapBuilder, Provenance,
    TensorImportance,
};
