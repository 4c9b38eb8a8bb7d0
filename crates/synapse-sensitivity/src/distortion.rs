//! Relative output distortion `‖(W − Q(W)) X‖² / ‖W X‖²`.

use synapse_codecs::Codec;

use crate::calibration::Calibration;
use crate::error::{Result, SensitivityError};
use crate::map::{EncodingOption, TensorImportance};

/// The value stored when `‖W X‖² = 0` but the error is not (JSON has no infinity).
pub const UNBOUNDED: f64 = f64::MAX;

/// Widest layer input for which the Gram path is used (its `cols²` f64 matrix is 32 MiB here).
pub const GRAM_MAX_COLS: usize = 2048;

/// Rows of a tensor the output energies are summed over: a taller tensor (an LM head of
/// 262,144 rows) is measured on this many rows spread evenly over it (row `⌊i·rows/MAX⌋`),
/// the encoding itself always being of the whole tensor — the ratio of two sums over a
/// uniform sample of rows, not the cost of 262,144 · cols² multiply-adds per codec.
pub const MEASURE_MAX_ROWS: usize = 16_384;

/// The rows the energies are summed over (see [`MEASURE_MAX_ROWS`]).
fn measured_rows(rows: usize) -> Vec<usize> {
    if rows <= MEASURE_MAX_ROWS {
        (0..rows).collect()
    } else {
        (0..MEASURE_MAX_ROWS)
            .map(|i| i * rows / MEASURE_MAX_ROWS)
            .collect()
    }
}

fn check_shape(len: usize, rows: usize, cols: usize, what: &'static str) -> Result<()> {
    let n = rows
        .checked_mul(cols)
        .ok_or(SensitivityError::ShapeMismatch {
            what,
            expected: usize::MAX,
            actual: len,
        })?;
    if len != n {
        return Err(SensitivityError::ShapeMismatch {
            what,
            expected: n,
            actual: len,
        });
    }
    Ok(())
}

/// `XᵀX` (`cols × cols`, f64) of the calibration activations.
fn gram(calib: &Calibration) -> Vec<f64> {
    let cols = calib.cols();
    let mut g = vec![0.0f64; cols * cols];
    for x in calib.data().chunks_exact(cols) {
        for (i, &xi) in x.iter().enumerate() {
            let xi = f64::from(xi);
            if xi == 0.0 {
                continue;
            }
            for (gij, &xj) in g[i * cols..(i + 1) * cols].iter_mut().zip(x) {
                *gij += xi * f64::from(xj);
            }
        }
    }
    g
}

/// `‖M X‖²` for the row-major `rows × cols` matrix `m`: directly (`rows·cols·samples`) or, given
/// the Gram matrix, as `Σ_r m_r G m_rᵀ` (`rows·cols²`).
fn energy(m: &[f64], calib: &Calibration, gram: Option<&[f64]>) -> f64 {
    let cols = calib.cols();
    let mut total = 0.0f64;
    match gram {
        Some(g) => {
            for mr in m.chunks_exact(cols) {
                for (gi, &mi) in g.chunks_exact(cols).zip(mr) {
                    if mi != 0.0 {
                        let row: f64 = gi.iter().zip(mr).map(|(a, b)| a * b).sum();
                        total += mi * row;
                    }
                }
            }
        }
        None => {
            for x in calib.data().chunks_exact(cols) {
                for mr in m.chunks_exact(cols) {
                    let y: f64 = mr.iter().zip(x).map(|(&a, &b)| a * f64::from(b)).sum();
                    total += y * y;
                }
            }
        }
    }
    total
}

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else if num == 0.0 {
        0.0
    } else {
        UNBOUNDED
    }
}

fn use_gram(calib: &Calibration) -> bool {
    calib.samples() > calib.cols() && calib.cols() <= GRAM_MAX_COLS
}

/// Relative output distortion of `q` against `w` (both row-major `rows × cols`, `cols` equal to
/// the calibration width), accumulated in f64. Returns 0 when both norms are 0 and
/// [`UNBOUNDED`] when only the reference output is 0.
pub fn output_distortion(w: &[f32], q: &[f32], rows: usize, calib: &Calibration) -> Result<f64> {
    let cols = calib.cols();
    check_shape(w.len(), rows, cols, "weight elements")?;
    check_shape(q.len(), rows, cols, "encoded weight elements")?;
    if cols == 0 {
        return Ok(0.0);
    }
    let g = use_gram(calib).then(|| gram(calib));
    let wf: Vec<f64> = w.iter().map(|&a| f64::from(a)).collect();
    let err: Vec<f64> = w
        .iter()
        .zip(q)
        .map(|(&a, &b)| f64::from(a) - f64::from(b))
        .collect();
    Ok(ratio(
        energy(&err, calib, g.as_deref()),
        energy(&wf, calib, g.as_deref()),
    ))
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
    check_shape(w.len(), rows, cols, "weight elements")?;
    // The reference energy and the Gram matrix are shared by every codec.
    let g = (cols > 0 && use_gram(calib)).then(|| gram(calib));
    let pick = measured_rows(rows);
    let take = |m: &[f32]| -> Vec<f64> {
        pick.iter()
            .flat_map(|&r| m[r * cols..(r + 1) * cols].iter().map(|&a| f64::from(a)))
            .collect()
    };
    let wf: Vec<f64> = if cols == 0 { Vec::new() } else { take(w) };
    let den = if cols == 0 {
        0.0
    } else {
        energy(&wf, calib, g.as_deref())
    };
    let mut options = Vec::with_capacity(codecs.len());
    for codec in codecs {
        let enc = codec.encode_matrix(w, rows, cols)?;
        let q = codec.decode_matrix(&enc, rows, cols)?;
        let num = if cols == 0 {
            0.0
        } else {
            let err: Vec<f64> = wf.iter().zip(take(&q)).map(|(&a, b)| a - b).collect();
            energy(&err, calib, g.as_deref())
        };
        options.push(EncodingOption {
            encoding: codec.id().to_string(),
            bytes: enc.len() as u64,
            distortion: ratio(num, den),
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
        kl_weight: 1.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tall_tensor_is_measured_on_an_even_row_sample() {
        let (rows, cols, samples) = (2 * MEASURE_MAX_ROWS + 7, 64, 80);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| (((i * 7919) % 2003) as f32 / 1001.0 - 1.0) * (1.0 + (i / cols % 5) as f32))
            .collect();
        let x: Vec<f32> = (0..samples * cols)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        let calib = Calibration::new(x, samples, cols).unwrap();
        let codec = synapse_codecs::resolve("syn.q3.symmetric.g64.v1").unwrap();
        let t = measure_tensor(
            &w,
            rows,
            "f32",
            (rows * cols * 4) as u64,
            &calib,
            &[&*codec],
        )
        .unwrap();
        let pick = measured_rows(rows);
        assert_eq!(pick.len(), MEASURE_MAX_ROWS);
        assert!(pick.windows(2).all(|p| p[0] < p[1]) && *pick.last().unwrap() < rows);
        // Exactly the distortion of the sampled rows (the bytes are the whole tensor's) ...
        let q = codec
            .decode_matrix(&codec.encode_matrix(&w, rows, cols).unwrap(), rows, cols)
            .unwrap();
        let sub = |m: &[f32]| -> Vec<f32> {
            pick.iter()
                .flat_map(|&r| m[r * cols..(r + 1) * cols].to_vec())
                .collect()
        };
        let want = output_distortion(&sub(&w), &sub(&q), pick.len(), &calib).unwrap();
        assert_eq!(t.options[0].distortion, want);
        assert_eq!(
            t.options[0].bytes,
            codec.matrix_size(rows, cols).unwrap() as u64
        );
        // ... and close to the whole tensor's.
        let full = output_distortion(&w, &q, rows, &calib).unwrap();
        assert!((want - full).abs() <= 0.02 * full, "{want} vs {full}");
    }

    #[test]
    fn gram_and_direct_paths_agree() {
        for (samples, cols) in [(40, 8), (3, 16), (64, 64), (100, 24)] {
            let x: Vec<f32> = (0..samples * cols)
                .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
                .collect();
            let calib = Calibration::new(x, samples, cols).unwrap();
            let m: Vec<f64> = (0..5 * cols)
                .map(|i| ((i * 13 % 29) as f64 / 14.0) - 1.0)
                .collect();
            let d = energy(&m, &calib, None);
            let g = energy(&m, &calib, Some(&gram(&calib)));
            assert!(
                (d - g).abs() <= 1e-12 * d.abs().max(1.0),
                "{samples}x{cols}: {d} vs {g}"
            );
        }
    }
}
