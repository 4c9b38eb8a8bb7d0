//! Measuring what each candidate encoding would cost and lose on one tensor.

use crate::codec::Codec;
use crate::error::Result;
use crate::id::EncodingId;

/// One measured option for a tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The encoding.
    pub encoding: EncodingId,
    /// Exact encoded bytes of the tensor.
    pub bytes: usize,
    /// Relative weight-space distortion `‖W − Q(W)‖² / ‖W‖²` (0 for an all-zero tensor).
    pub distortion: f64,
}

/// The options worth considering for one tensor, sorted by size ascending.
#[derive(Debug, Clone, PartialEq)]
pub struct PrecisionCandidates {
    /// Bytes of the tensor in its source encoding.
    pub source_bytes: usize,
    /// Options strictly smaller than the source; at most one per size (the lower distortion).
    pub candidates: Vec<Candidate>,
}

/// `‖a − b‖² / ‖a‖²` in f64 (0 when `a` is all zero and `b` equals it; `a` and `b` same length).
pub fn relative_distortion(a: &[f32], b: &[f32]) -> f64 {
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        let e = f64::from(x) - f64::from(y);
        num += e * e;
        den += f64::from(x) * f64::from(x);
    }
    if den == 0.0 {
        if num == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        num / den
    }
}

impl PrecisionCandidates {
    /// Encodes and decodes the row-major `rows × cols` tensor `w` with every codec and keeps the
    /// options that are smaller than `source_bytes`. Among options of equal size the one with
    /// the lower distortion is kept (ties: the smaller ID string, for determinism).
    pub fn measure(
        w: &[f32],
        rows: usize,
        cols: usize,
        source_bytes: usize,
        codecs: &[&dyn Codec],
    ) -> Result<Self> {
        let mut all = Vec::with_capacity(codecs.len());
        for codec in codecs {
            let bytes = codec.encode_matrix(w, rows, cols)?;
            let back = codec.decode_matrix(&bytes, rows, cols)?;
            all.push(Candidate {
                encoding: codec.id(),
                bytes: bytes.len(),
                distortion: relative_distortion(w, &back),
            });
        }
        all.retain(|c| c.bytes < source_bytes);
        all.sort_by(|a, b| {
            a.bytes
                .cmp(&b.bytes)
                .then(a.distortion.total_cmp(&b.distortion))
                .then_with(|| a.encoding.to_string().cmp(&b.encoding.to_string()))
        });
        all.dedup_by_key(|c| c.bytes);
        Ok(PrecisionCandidates {
            source_bytes,
            candidates: all,
        })
    }
}
