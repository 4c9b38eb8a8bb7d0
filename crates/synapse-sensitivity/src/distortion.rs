//! Relative output distortion `‖(W − Q(W)) X‖² / ‖W X‖²`.

use synapse_codecs::Codec;

use crate::calibration::Calibration;
use crate::error::{Result, SensitivityError};
use crate::map::{EncodingOption, TensorImportance};

/// The value stored when `‖W X‖² = 0` but the error is not (JSON has no infinity).
pub const UNBOUNDED: f64 = f64::MAX;

/// Relative output distortion of `q` against `w` (both row-major `rows × cols`, `cols` equal to
/// the calibration width), accumulated in f64. Returns 0 when both norms are 0 and
/// [`UNBOUNDED`] when only the reference output is 0.
pub fn output_distortion(w: &[f32], q: &[f32], rows: usize, calib: &Calibration) -> Result<f64> {
    let cols = calib.cols();
    let n = rows
        .checked_mul(cols)
        .ok_or(SensitivityError::ShapeMismatch {
            what: "weight elements",
            expected: usize::MAX,
            actual: w.len(),
        })?;
    for (what, len) in [
        ("weight elements", w.len()),
        ("encoded weight elements", q.len()),
    ] {
        if len != n {
            return Err(SensitivityError::ShapeMismatch {
                what,
                expected: n,
                actual: len,
            });
        }
    }
    if cols == 0 {
        return Ok(0.0);
    }
    let err: Vec<f64> = w
        .iter()
        .zip(q)
        .map(|(&a, &b)| f64::from(a) - f64::from(b))
        .collect();
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for x in calib.data().chunks_exact(cols) {
        for (wr, er) in w.chunks_exact(cols).zip(err.chunks_exact(cols)) {
            let mut y = 0.0f64;
            let mut e = 0.0f64;
            for ((&a, &b), &xi) in wr.iter().zip(er).zip(x) {
                let xi = f64::from(xi);
                y += f64::from(a) * xi;
                e += b * xi;
            }
            num += e * e;
            den += y * y;
        }
    }
    Ok(if den > 0.0 {
        num / den
    } else if num == 0.0 {
        0.0
    } else {
        UNBOUNDED
    })
}

/// Measures every codec on one `rows × cols` tensor: its exact encoded size and its output
/// distortion on `calib`. Options not smaller than `source_bytes` are dropped; among equal
/// sizes the lower distortion is kept (ties: smaller ID). Options are sorted by size, descending
/// (most precise first).
pub fn measure_tensor(
    w: &[f32],
    rows: usize,
    source_encoding: &str,
    source_bytes: u64,
    calib: &Calibration,
    codecs: &[&dyn Codec],
) -> Result<TensorImportance> {
    let cols = calib.cols();
    let mut options = Vec::with_capacity(codecs.len());
    for codec in codecs {
        let enc = codec.encode_matrix(w, rows, cols)?;
        let q = codec.decode_matrix(&enc, rows, cols)?;
        options.push(EncodingOption {
            encoding: codec.id().to_string(),
            bytes: enc.len() as u64,
            distortion: output_distortion(w, &q, rows, calib)?,
        });
    }
    options.retain(|o| o.bytes < source_bytes);
    options.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.distortion.total_cmp(&b.distortion))
            .then_with(|| a.encoding.cmp(&b.encoding))
    });
    options.dedup_by_key(|o| o.bytes);
    Ok(TensorImportance {
        source_encoding: source_encoding.to_owned(),
        source_bytes,
        options,
    })
}
