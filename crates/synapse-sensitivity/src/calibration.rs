//! Calibration activations and their content hash.

use crate::error::{Result, SensitivityError};

/// `samples` activation vectors of length `cols` (row-major `samples × cols`): the inputs `x` of
/// a linear layer `y = W x` captured on calibration text.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    samples: usize,
    cols: usize,
    x: Vec<f32>,
    hash: String,
}

impl Calibration {
    /// Validates shape and finiteness and hashes the data (BLAKE3 over `samples` and `cols` as
    /// u64 LE followed by the f32 LE values).
    pub fn new(x: Vec<f32>, samples: usize, cols: usize) -> Result<Self> {
        let n = samples
            .checked_mul(cols)
            .ok_or(SensitivityError::ShapeMismatch {
                what: "calibration elements",
                expected: usize::MAX,
                actual: x.len(),
            })?;
        if n != x.len() {
            return Err(SensitivityError::ShapeMismatch {
                what: "calibration elements",
                expected: n,
                actual: x.len(),
            });
        }
        if let Some(index) = x.iter().position(|v| !v.is_finite()) {
            return Err(SensitivityError::NonFinite { index });
        }
        let mut h = blake3::Hasher::new();
        h.update(&(samples as u64).to_le_bytes());
        h.update(&(cols as u64).to_le_bytes());
        for v in &x {
            h.update(&v.to_le_bytes());
        }
        Ok(Calibration {
            samples,
            cols,
            x,
            hash: h.finalize().to_hex().to_string(),
        })
    }

    /// Number of activation vectors.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Length of each activation vector (the layer's input width).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The activations, row-major `samples × cols`.
    pub fn data(&self) -> &[f32] {
        &self.x
    }

    /// Hex BLAKE3 content hash (recorded as provenance).
    pub fn hash(&self) -> &str {
        &self.hash
    }
}
