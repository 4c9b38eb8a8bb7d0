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
    measure_parts(
        &[TensorPart { w, rows, calib }],
        source_encoding,
        source_bytes,
        codecs,
    )
}

/// One part of a tensor that sees its own inputs: one routed expert's slice of a stacked
/// expert tensor, with the rows routed to that expert.
#[derive(Debug, Clone, Copy)]
pub struct TensorPart<'a> {
    /// The part's weights, row-major `rows × calib.cols()`.
    pub w: &'a [f32],
    /// Its rows.
    pub rows: usize,
    /// Its inputs.
    pub calib: &'a Calibration,
}

/// [`measure_tensor`] for a tensor made of parts, each encoded on its own (as the executor
/// re-encodes each expert of a stacked tensor) and measured on its own inputs: an option's
/// bytes are the parts' sum, its distortion the pooled ratio
/// `Σ_p ‖(W_p − Q(W_p)) X_p‖² / Σ_p ‖W_p X_p‖²` — the relative error of every product the tensor
/// takes part in, each part weighted by the energy of its own outputs.
pub fn measure_parts(
    parts: &[TensorPart<'_>],
    source_encoding: &str,
    source_bytes: u64,
    codecs: &[&dyn Codec],
) -> Result<TensorImportance> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    measure_parts_on(parts, source_encoding, source_bytes, codecs, threads)
}

/// [`measure_parts`] with the codecs measured on up to `threads` threads.
pub(crate) fn measure_parts_on(
    parts: &[TensorPart<'_>],
    source_encoding: &str,
    source_bytes: u64,
    codecs: &[&dyn Codec],
    threads: usize,
) -> Result<TensorImportance> {
    struct Prepared {
        g: Option<Vec<f64>>,
        pick: Vec<usize>,
        wf: Vec<f64>,
    }
    let mut prepared = Vec::with_capacity(parts.len());
    let mut den = 0.0f64;
    for p in parts {
        let cols = p.calib.cols();
        check_shape(p.w.len(), p.rows, cols, "weight elements")?;
        // The reference energy and the Gram matrix are shared by every codec.
        let g = (cols > 0 && use_gram(p.calib)).then(|| gram(p.calib));
        let pick = measured_rows(p.rows);
        let wf = take_rows(p.w, &pick, cols);
        if cols > 0 {
            den += energy(&wf, p.calib, g.as_deref());
        }
        prepared.push(Prepared { g, pick, wf });
    }
    let measure = |codec: &dyn Codec| -> Result<EncodingOption> {
        let (mut bytes, mut num) = (0u64, 0.0f64);
        for (p, pr) in parts.iter().zip(&prepared) {
            let cols = p.calib.cols();
            let enc = codec.encode_matrix(p.w, p.rows, cols)?;
            bytes += enc.len() as u64;
            if cols == 0 {
                continue;
            }
            let q = codec.decode_matrix(&enc, p.rows, cols)?;
            let err: Vec<f64> = pr
                .wf
                .iter()
                .zip(take_rows(&q, &pr.pick, cols))
                .map(|(&a, b)| a - b)
                .collect();
            num += energy(&err, p.calib, pr.g.as_deref());
        }
        Ok(EncodingOption {
            encoding: codec.id().to_string(),
            bytes,
            distortion: ratio(num, den),
        })
    };
    // The codecs are measured side by side on the machine's cores (each option is computed
    // alone, in the same order of operations whatever the thread count: the same bits).
    let threads = threads.min(codecs.len()).max(1);
    let mut options = if threads == 1 {
        codecs
            .iter()
            .map(|c| measure(*c))
            .collect::<Result<Vec<_>>>()?
    } else {
        let measure = &measure;
        let per_thread: Vec<Vec<Result<EncodingOption>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        codecs
                            .iter()
                            .skip(t)
                            .step_by(threads)
                            .map(|c| measure(*c))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        let mut its: Vec<_> = per_thread.into_iter().map(Vec::into_iter).collect();
        (0..codecs.len())
            .map(|i| its[i % threads].next().expect("one result per codec"))
            .collect::<Result<Vec<_>>>()?
    };
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

/// Rows `pick` of the row-major matrix `m` (`cols` wide), widened to f64.
fn take_rows(m: &[f32], pick: &[usize], cols: usize) -> Vec<f64> {
    pick.iter()
        .flat_map(|&r| m[r * cols..(r + 1) * cols].iter().map(|&a| f64::from(a)))
        .collect()
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

    #[test]
    fn parts_pool_their_errors_and_energies() {
        let cols = 64;
        let mk = |n: usize, k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i * k) % 211) as f32 / 105.0 - 1.0) * (1.0 + (i % 7) as f32 / 3.0))
                .collect()
        };
        // Two experts: different weights, different routed rows (one part's inputs large).
        let (w1, w2) = (mk(6 * cols, 7919), mk(4 * cols, 104_729));
        let c1 = Calibration::new(mk(80 * cols, 37), 80, cols).unwrap();
        let x2: Vec<f32> = mk(3 * cols, 53).iter().map(|v| 9.0 * v).collect();
        let c2 = Calibration::new(x2, 3, cols).unwrap();
        let codec = synapse_codecs::resolve("syn.q3.symmetric.g64.v1").unwrap();
        let parts = [
            TensorPart {
                w: &w1,
                rows: 6,
                calib: &c1,
            },
            TensorPart {
                w: &w2,
                rows: 4,
                calib: &c2,
            },
        ];
        let t = measure_parts(&parts, "f32", 1 << 20, &[&*codec]).unwrap();
        let mut num = 0.0;
        let mut den = 0.0;
        let mut bytes = 0;
        for p in &parts {
            let enc = codec.encode_matrix(p.w, p.rows, cols).unwrap();
            bytes += enc.len() as u64;
            let q = codec.decode_matrix(&enc, p.rows, cols).unwrap();
            let wf: Vec<f64> = p.w.iter().map(|&v| f64::from(v)).collect();
            let e: Vec<f64> =
                p.w.iter()
                    .zip(&q)
                    .map(|(&a, &b)| f64::from(a) - f64::from(b))
                    .collect();
            num += energy(&e, p.calib, None);
            den += energy(&wf, p.calib, None);
        }
        assert_eq!(t.options[0].bytes, bytes);
        let want = num / den;
        assert!(
            (t.options[0].distortion - want).abs() <= 1e-12 * want,
            "{t:?} vs {want}"
        );
        // Not the mean of the parts' own ratios: the heavier part weighs more.
        let d1 = measure_tensor(&w1, 6, "f32", 1 << 20, &c1, &[&*codec]).unwrap();
        let d2 = measure_tensor(&w2, 4, "f32", 1 << 20, &c2, &[&*codec]).unwrap();
        let mean = (d1.options[0].distortion + d2.options[0].distortion) / 2.0;
        assert!((t.options[0].distortion - mean).abs() > 1e-6 * mean);
        // One part is measure_tensor, bit for bit.
        let one = measure_parts(&parts[..1], "f32", 1 << 20, &[&*codec]).unwrap();
        assert_eq!(one, d1);
    }

    /// The codecs measured on several threads: the same options, bit for bit and in the same
    /// order, as on one; an error of any codec is the result's.
    #[test]
    fn codecs_measured_side_by_side_give_the_same_map_entry() {
        // Whole 256-element rows: every codec of the default ladder holds them (the K-quants'
        // super-blocks included).
        let cols = 256;
        let w: Vec<f32> = (0..8 * cols)
            .map(|i| ((i * 7919) % 211) as f32 / 105.0 - 1.0)
            .collect();
        let x: Vec<f32> = (0..40 * cols)
            .map(|i| ((i * 37) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let c = Calibration::new(x, 40, cols).unwrap();
        let codecs: Vec<Box<dyn Codec>> = synapse_codecs::default_ladder()
            .into_iter()
            .map(synapse_codecs::codec_for)
            .collect();
        let refs: Vec<&dyn Codec> = codecs.iter().map(|c| c.as_ref()).collect();
        let parts = [TensorPart {
            w: &w,
            rows: 8,
            calib: &c,
        }];
        let one = measure_parts_on(&parts, "f32", 1 << 20, &refs, 1).unwrap();
        assert!(one.options.len() > 5, "{one:?}");
        for threads in [2, 3, 7, 64] {
            let many = measure_parts_on(&parts, "f32", 1 << 20, &refs, threads).unwrap();
            assert_eq!(many, one, "{threads} threads");
        }
        // A codec that cannot hold the shape fails the measurement on any thread count.
        let odd: Vec<f32> = w[..8 * 48].to_vec();
        let c48 = Calibration::new(vec![0.5; 40 * 48], 40, 48).unwrap();
        let parts = [TensorPart {
            w: &odd,
            rows: 8,
            calib: &c48,
        }];
        for threads in [1, 2, 5] {
            assert!(measure_parts_on(&parts, "f32", 1 << 20, &refs, threads).is_err());
        }
    }
}
