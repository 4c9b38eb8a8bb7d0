//! Every kernel path against the scalar path, and the scalar path against f32 decode-then-dot
//! within the error of its activation quantization, on random data of every encoding, at odd
//! shapes.

mod common;

use common::*;
use synapse_formats::GgmlType;
use synapse_kernels::{KernelCtx, KernelPath, PoolKind, QuantMatrix};

/// Encodings with a kernel, and the column counts tested for each (block-size multiples).
fn encodings() -> Vec<GgmlType> {
    use GgmlType as T;
    vec![
        T::F32,
        T::F16,
        T::BF16,
        T::Q8_0,
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q5_1,
        T::Q4_K,
        T::Q5_K,
        T::Q6_K,
        T::Q2_K,
        T::Q3_K,
        T::IQ4_NL,
        T::IQ4_XS,
        T::MXFP4,
        T::TQ1_0,
        T::TQ2_0,
        T::IQ2_XXS,
        T::IQ2_XS,
        T::IQ2_S,
        T::IQ3_XXS,
        T::IQ3_S,
        T::IQ1_S,
    ]
}

fn shapes(ty: GgmlType) -> Vec<(usize, usize, usize)> {
    let b = ty.block_size().max(32);
    // (rows, cols, n activation rows): K at one block, odd row counts, tile remainders, larger K.
    vec![
        (1, b, 1),
        (3, b, 2),
        (13, 2 * b, 5),
        (67, 640usize.next_multiple_of(b), 9),
        (16, 2048, 1),
        (67, 640usize.next_multiple_of(b), 1),
        (9, 4 * b, 17),
    ]
}

/// Every element of `got` has exactly the bits of the scalar path's `want`.
fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, e)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{what} element {i}: {g} vs scalar {e}"
        );
    }
}

fn run(m: &QuantMatrix, x: &[f32], n: usize, path: KernelPath, threads: usize) -> Vec<f32> {
    let mut ctx = KernelCtx::with_path_and_threads(path, threads).unwrap();
    let mut y = vec![f32::NAN; n * m.rows()];
    m.matmul(x, n, &mut y, &mut ctx).unwrap();
    y
}

/// How a kernel quantizes its activations (`scalar::select` in src/kernels/scalar.rs).
#[derive(Clone, Copy)]
enum Act {
    /// f32 activations: float weights and the decode-then-dot encodings.
    F32,
    /// f16-rounded activations (ggml's `vec_dot_type` for F16 weights).
    F16,
    /// ggml's `block_q8_0` per 32 values (f16 scale).
    Q8_0,
    /// `block_q8_1`: Q8_0 plus the f16 sum `s = d·Σq` that a weight block's minimum multiplies.
    Q8_1,
    /// `block_q8_K` per 256 values (f32 scale).
    Q8K,
}

fn act_of(ty: GgmlType) -> Act {
    use GgmlType as T;
    match ty {
        T::Q8_0 | T::Q4_0 | T::Q5_0 | T::IQ4_NL | T::MXFP4 | T::NVFP4 | T::Q1_0 | T::Q2_0 => {
            Act::Q8_0
        }
        T::Q4_1 | T::Q5_1 => Act::Q8_1,
        T::Q4_K
        | T::Q5_K
        | T::Q6_K
        | T::Q2_K
        | T::Q3_K
        | T::IQ4_XS
        | T::TQ1_0
        | T::TQ2_0
        | T::IQ2_XXS
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ1_S
        | T::IQ1_M => Act::Q8K,
        T::F16 => Act::F16,
        _ => Act::F32,
    }
}

/// The activations as the kernel sees them, dequantized: ggml's `quantize_row_q8_0` /
/// `quantize_row_q8_K_ref` (`d = max|x| / 127`, quants `round_half_even(x · 127 / max|x|)`,
/// Q8_0's `d` stored as f16), recomputed here in the same f32 steps. Also, per 32-block,
/// `|s − d·Σq|`: how far `block_q8_1`'s stored f16 sum is from the sum of the quants.
fn quantized_activations(act: Act, x: &[f32]) -> (Vec<f32>, Vec<f64>) {
    let f16r = |v: f32| half::f16::from_f32(v).to_f32();
    let block = match act {
        Act::F32 => return (x.to_vec(), vec![0.0; x.len() / 32]),
        Act::F16 => {
            return (
                x.iter().map(|&v| f16r(v)).collect(),
                vec![0.0; x.len() / 32],
            );
        }
        Act::Q8K => 256,
        _ => 32,
    };
    let (mut xq, mut s_err) = (Vec::with_capacity(x.len()), Vec::new());
    for xb in x.chunks_exact(block) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let q: Vec<f32> = xb
            .iter()
            .map(|v| (v * id).round_ties_even().clamp(-127.0, 127.0))
            .collect();
        let d = match act {
            Act::Q8K if amax != 0.0 => 1.0 / id,
            Act::Q8K => 0.0,
            _ => f16r(amax / 127.0),
        };
        xq.extend(q.iter().map(|q| q * d));
        for qb in q.chunks_exact(32) {
            let sum: f32 = qb.iter().sum();
            s_err.push((f64::from(f16r(amax / 127.0 * sum)) - f64::from(d) * f64::from(sum)).abs());
        }
    }
    (xq, s_err)
}

/// The scalar path against an f64 dot of the f32-decoded weights with the unquantized
/// activations, to within the error its own activation quantization allows: for each output
/// `Σ|w_i|·|x_i − x̂_i|` (x̂: the activations as quantized above; the bound of `Σ w_i(x_i −
/// x̂_i)`), for Q4_1/Q5_1 also `Σ |m_b|·|s_b − d_b·Σq_b|` (the minimum times the f16 rounding
/// of `block_q8_1`'s sum), plus f32 rounding `1e-5·Σ|w_i·x_i|` (the only term for the
/// f32-activation encodings). A missing block or a wrong scale costs far more than that.
#[test]
fn scalar_path_matches_f32_decode_then_dot_within_activation_quantization_error() {
    for ty in encodings() {
        let act = act_of(ty);
        for (rows, cols, n) in shapes(ty) {
            let w = random_weights(ty, rows, cols, 7 + rows as u64);
            let m = QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap();
            let x: Vec<f32> = (0..n)
                .flat_map(|t| generate_data(1.0 + t as f32, cols, 2.0))
                .collect();
            let y = run(&m, &x, n, KernelPath::Scalar, 1);
            let mut wr = vec![0f32; cols];
            for r in 0..rows {
                m.dequantize_row(r, &mut wr).unwrap();
                // Q4_1/Q5_1: each 32-block's f16 minimum (offset 2 of the block).
                let mins: Vec<f64> = match ty {
                    GgmlType::Q4_1 | GgmlType::Q5_1 => {
                        let ts = ty.type_size();
                        let row = &w[r * cols / 32 * ts..(r + 1) * cols / 32 * ts];
                        row.chunks_exact(ts)
                            .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f64().abs())
                            .collect()
                    }
                    _ => vec![0.0; cols / 32],
                };
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    let (xq, s_err) = quantized_activations(act, xt);
                    let reference = dot64(&wr, xt);
                    let act_err: f64 = wr
                        .iter()
                        .zip(xt.iter().zip(&xq))
                        .map(|(&w, (&a, &q))| {
                            f64::from(w).abs() * (f64::from(a) - f64::from(q)).abs()
                        })
                        .sum();
                    let sum_err: f64 = mins.iter().zip(&s_err).map(|(m, e)| m * e).sum();
                    let bound = act_err + sum_err + 1e-5 * abs_dot(&wr, xt);
                    let err = (f64::from(y[t * rows + r]) - reference).abs();
                    assert!(
                        err <= bound,
                        "{ty} {rows}x{cols} n={n} r={r} t={t}: got {} want {reference} (err {err}, bound {bound})",
                        y[t * rows + r]
                    );
                }
            }
        }
    }
}

#[test]
fn every_supported_path_matches_scalar() {
    for path in KernelPath::supported() {
        for ty in encodings() {
            for (rows, cols, n) in shapes(ty) {
                let w = random_weights(ty, rows, cols, 11 + cols as u64);
                let m = QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap();
                let x: Vec<f32> = (0..n)
                    .flat_map(|t| generate_data(0.5 + t as f32, cols, 1.5))
                    .collect();
                let want = run(&m, &x, n, KernelPath::Scalar, 1);
                for threads in [1, 2] {
                    let got = run(&m, &x, n, path, threads);
                    let mut wr = vec![0f32; cols];
                    for r in 0..rows {
                        m.dequantize_row(r, &mut wr).unwrap();
                        for t in 0..n {
                            let scale = abs_dot(&wr, &x[t * cols..(t + 1) * cols]) + 1e-6;
                            let (g, e) = (got[t * rows + r], want[t * rows + r]);
                            assert!(
                                ((g - e) as f64).abs() <= 2e-5 * scale,
                                "{path} {ty} {rows}x{cols} n={n} threads={threads} r={r} t={t}: {g} vs scalar {e}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn large_matrix_threads_cover_every_row() {
    let (rows, cols) = (1000, 256);
    let w = random_weights(GgmlType::Q8_0, rows, cols, 3);
    let m = QuantMatrix::from_ggml(GgmlType::Q8_0, &w, rows, cols).unwrap();
    let x = generate_data(0.0, cols, 1.0);
    let a = run(&m, &x, 1, KernelPath::best_supported(), 1);
    assert!(a.iter().all(|v| v.is_finite()));
    for pool in [PoolKind::Spin, PoolKind::Rayon] {
        let mut ctx = KernelCtx::with_options(KernelPath::best_supported(), 2, pool).unwrap();
        for n in [1, 3] {
            let xs: Vec<f32> = x.iter().cycle().take(n * cols).copied().collect();
            let mut y = vec![f32::NAN; n * rows];
            for _ in 0..50 {
                m.matmul(&xs, n, &mut y, &mut ctx).unwrap();
                for t in 0..n {
                    assert_eq!(&y[t * rows..(t + 1) * rows], &a[..], "{pool:?} n={n}");
                }
            }
        }
    }
}

/// A Q8_0 matrix larger than any cache (71 MB, as a 262,144-row LM head is read), at the
/// activation-row counts whose AVX2 GEMM reads its blocks in place (8, and 16 for a matrix this
/// large) and one beside them: every row has its one-row call's bits.
#[test]
fn dram_sized_q8_0_matrix_keeps_the_one_row_bits() {
    let (rows, cols) = (131_072, 512);
    let w = random_weights(GgmlType::Q8_0, rows, cols, 41);
    let m = QuantMatrix::from_ggml(GgmlType::Q8_0, &w, rows, cols).unwrap();
    let path = KernelPath::best_supported();
    let n = 16;
    let x: Vec<f32> = (0..n)
        .flat_map(|t| generate_data(0.7 + t as f32, cols, 2.0))
        .collect();
    let alone: Vec<Vec<f32>> = (0..n)
        .map(|t| run(&m, &x[t * cols..(t + 1) * cols], 1, path, 2))
        .collect();
    for n in [8, 12, 16] {
        let got = run(&m, &x[..n * cols], n, path, 2);
        for (t, want) in alone.iter().enumerate().take(n) {
            assert_same_bits(
                &got[t * rows..(t + 1) * rows],
                want,
                &format!("{path} n={n} row {t}"),
            );
        }
    }
}

#[test]
fn shape_errors_are_typed() {
    let w = random_weights(GgmlType::Q8_0, 2, 64, 1);
    assert!(QuantMatrix::from_ggml(GgmlType::Q8_0, &w, 2, 63).is_err());
    assert!(QuantMatrix::from_ggml(GgmlType::Q8_0, &w[1..], 2, 64).is_err());
    assert!(QuantMatrix::from_ggml(GgmlType::I32, &w, 2, 64).is_err());
    let m = QuantMatrix::from_ggml(GgmlType::Q8_0, &w, 2, 64).unwrap();
    let mut ctx = KernelCtx::with_path_and_threads(KernelPath::Scalar, 1).unwrap();
    let mut y = vec![0f32; 2];
    assert!(m.matvec(&[0.0; 63], &mut y, &mut ctx).is_err());
    assert!(m.matvec(&[0.0; 64], &mut y[..1], &mut ctx).is_err());
}

/// The encodings whose kernels reproduce ggml's float order (quantized activations, 8-lane
/// FMA accumulation, ggml's horizontal sums, the tiled K-quant order from 8 rows on): every
/// path must give the scalar path's bits exactly, for one row, the 4-row tile and many rows.
#[test]
fn ggml_order_encodings_are_bit_identical_on_every_path() {
    use GgmlType as T;
    let tys = [
        T::Q8_0,
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q5_1,
        T::Q4_K,
        T::Q5_K,
        T::Q6_K,
    ];
    for path in KernelPath::supported() {
        for ty in tys {
            for (rows, cols, n) in shapes(ty) {
                let w = random_weights(ty, rows, cols, 29 + cols as u64);
                let m = QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap();
                let x: Vec<f32> = (0..n)
                    .flat_map(|t| generate_data(0.25 + t as f32, cols, 3.0))
                    .collect();
                let want = run(&m, &x, n, KernelPath::Scalar, 1);
                let got = run(&m, &x, n, path, 2);
                assert_same_bits(&got, &want, &format!("{path} {ty} {rows}x{cols} n={n}"));
            }
        }
    }
}

/// More activation rows than the tiled GEMM keeps accumulators for at once (32 groups of 16)
/// and a ragged last group: still the scalar path's bits.
#[test]
fn tiled_gemm_many_groups_is_bit_identical() {
    use GgmlType as T;
    for path in KernelPath::supported() {
        // 5 rows: one- and two-row passes; 37: several weight-row tiles with a ragged end.
        for (ty, cols, rows) in [
            (T::Q4_K, 512, 5),
            (T::Q6_K, 256, 5),
            (T::Q5_0, 64, 5),
            (T::Q8_0, 96, 5),
            (T::Q4_K, 256, 37),
            (T::Q5_K, 256, 37),
            (T::Q6_K, 256, 37),
            (T::Q4_0, 64, 37),
            (T::Q8_0, 64, 37),
            (T::Q2_K, 512, 37),
            (T::Q3_K, 256, 37),
            (T::IQ4_XS, 512, 5),
            (T::IQ4_XS, 256, 37),
            (T::IQ4_NL, 64, 37),
            (T::Q4_1, 64, 37),
            (T::Q5_1, 96, 37),
            // A row wider than the AVX2 GEMM's weight tile holds more than two of.
            (T::Q8_0, 4096, 7),
            (T::Q4_1, 4096, 5),
        ] {
            let n = 530;
            let w = random_weights(ty, rows, cols, 7 + cols as u64);
            let m = QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap();
            let x: Vec<f32> = (0..n)
                .flat_map(|t| generate_data(0.1 + t as f32, cols, 2.0))
                .collect();
            let want = run(&m, &x, n, KernelPath::Scalar, 1);
            let got = run(&m, &x, n, path, 2);
            assert_same_bits(&got, &want, &format!("{path} {ty}"));
        }
    }
}

/// Every activation-row count from 1 to 17 against the K-quants and the 32-block types (the
/// few-row kernels take groups of up to 4 or 8 rows, one or two weight-row pairs at a time,
/// the tiled GEMM the rest), odd and even weight-row counts: the scalar bits.
#[test]
fn few_rows_every_count_is_bit_identical() {
    use GgmlType as T;
    for path in KernelPath::supported() {
        for (ty, cols, rows) in [
            (T::Q4_K, 512, 7),
            (T::Q6_K, 768, 5),
            (T::Q4_K, 256, 1),
            (T::Q8_0, 256, 7),
            (T::Q5_0, 512, 6),
            (T::Q4_1, 256, 5),
            (T::Q5_1, 256, 3),
            (T::Q4_0, 128, 1),
            (T::Q8_0, 64, 4),
        ] {
            let w = random_weights(ty, rows, cols, 11 + cols as u64);
            let m = QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap();
            for n in 1..=17 {
                let x: Vec<f32> = (0..n)
                    .flat_map(|t| generate_data(0.3 + t as f32, cols, 2.5))
                    .collect();
                let want = run(&m, &x, n, KernelPath::Scalar, 1);
                let got = run(&m, &x, n, path, 2);
                assert_same_bits(&got, &want, &format!("{path} {ty} {rows}x{cols} n={n}"));
            }
        }
    }
}

/// The few-row kernels of one parallel region (decode's q/k/v and gate/up: on AVX2 the row
/// pairs of `gemv32_avx2`, whose Q5_0 and Q4_0 lanes start at `−16·Σ` and `−8·Σ` of the
/// activations) against the scalar path, matrix by matrix, at every row count they take
/// and past it; odd weight-row counts leave a last row without a pair.
#[test]
fn few_row_regions_of_mixed_types_match_the_scalar_path() {
    use GgmlType as T;
    use synapse_kernels::OrderClass;
    let sets: [&[(GgmlType, usize)]; 3] = [
        &[(T::Q5_0, 37), (T::Q4_0, 18), (T::Q8_0, 9)],
        &[(T::Q4_0, 5), (T::Q5_1, 23), (T::Q4_1, 16), (T::Q5_0, 1)],
        &[(T::Q5_0, 64), (T::Q5_0, 17)],
    ];
    let cols = 320;
    for path in KernelPath::supported() {
        for (si, set) in sets.iter().enumerate() {
            let ms: Vec<QuantMatrix> = set
                .iter()
                .enumerate()
                .map(|(i, &(ty, rows))| {
                    let w = random_weights(ty, rows, cols, 300 + (si * 8 + i) as u64);
                    QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap()
                })
                .collect();
            let refs: Vec<&QuantMatrix> = ms.iter().collect();
            for n in 1..=7 {
                let x: Vec<f32> = (0..n)
                    .flat_map(|t| generate_data(0.7 + t as f32, cols, 3.0))
                    .collect();
                let mut ctx = KernelCtx::with_path_and_threads(path, 2).unwrap();
                let mut got: Vec<Vec<f32>> =
                    ms.iter().map(|m| vec![f32::NAN; n * m.rows()]).collect();
                {
                    let mut ys: Vec<&mut [f32]> =
                        got.iter_mut().map(|y| y.as_mut_slice()).collect();
                    QuantMatrix::matmul_runs_shared(
                        &refs,
                        &x,
                        &[(n, OrderClass::One)],
                        &mut ys,
                        &mut ctx,
                    )
                    .unwrap();
                }
                for (i, m) in ms.iter().enumerate() {
                    let want = run(m, &x, n, KernelPath::Scalar, 1);
                    assert_same_bits(&got[i], &want, &format!("{path} set {si} matrix {i} n={n}"));
                }
            }
        }
    }
}

/// `matmul_as`: any number of rows summed in the order of a call of another size (batch
/// invariance): every row equals that row inside a plain call of the class's size on the
/// same path, bit for bit, on every path (and the ggml-order encodings equal the scalar path
/// there, tested above).
#[test]
fn matmul_as_keeps_the_requested_order_for_any_row_count() {
    use GgmlType as T;
    use synapse_kernels::OrderClass;
    let tys = [
        T::F32,
        T::F16,
        T::Q8_0,
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q5_1,
        T::Q4_K,
        T::Q5_K,
        T::Q6_K,
        T::Q2_K,
        T::Q3_K,
        T::IQ4_XS,
        T::IQ4_NL,
    ];
    for path in KernelPath::supported() {
        for (i, ty) in tys.into_iter().enumerate() {
            // IQ4_NL: an odd block count (its one-row order adds the last block apart).
            let (rows, cols) = (11, if ty == T::IQ4_NL { 480 } else { 512 });
            let w = random_weights(ty, rows, cols, 5 + i as u64);
            let m = QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap();
            for class in [OrderClass::One, OrderClass::Few, OrderClass::Many] {
                for n in [1usize, 3, 9, 20, 37] {
                    let x: Vec<f32> = (0..n)
                        .flat_map(|t| generate_data(0.2 + t as f32, cols, 2.0))
                        .collect();
                    let mut ctx = KernelCtx::with_path_and_threads(path, 2).unwrap();
                    let mut got = vec![f32::NAN; n * rows];
                    m.matmul_as(&x, n, &mut got, class.rows(), &mut ctx)
                        .unwrap();
                    for t in 0..n {
                        // Row t alone, repeated to fill a call of the class's size.
                        let k = class.rows();
                        let xt = &x[t * cols..(t + 1) * cols];
                        let xr: Vec<f32> = (0..k).flat_map(|_| xt.iter().copied()).collect();
                        let want = run(&m, &xr, k, path, 1);
                        assert_same_bits(
                            &got[t * rows..(t + 1) * rows],
                            &want[..rows],
                            &format!("{path} {ty} {class:?} n={n} row {t}"),
                        );
                    }
                }
            }
        }
    }
}

/// `matmul_runs_shared` (q/k/v or gate/up over the same input rows in one parallel region)
/// gives each matrix the bits of its own `matmul_runs`, on every path, in every order class,
/// for row counts on both sides of the few-row kernels' bounds, with matrices whose row counts
/// are not multiples of the chunk granule and mixes of kernels (32-block types, Q4_K/Q6_K, and
/// sets with a type neither few-row kernel takes, which run one call per matrix).
#[test]
fn shared_input_matmuls_equal_separate_calls() {
    use GgmlType as T;
    use synapse_kernels::OrderClass;
    let sets: [&[(GgmlType, usize)]; 5] = [
        &[(T::Q4_1, 21), (T::Q8_0, 11), (T::Q5_0, 40)],
        &[(T::Q4_K, 19), (T::Q6_K, 8)],
        &[(T::Q4_K, 13), (T::Q5_0, 7), (T::Q6_K, 33)],
        &[(T::Q5_K, 16), (T::Q4_0, 9)],
        &[(T::Q4_0, 64), (T::F32, 5)],
    ];
    let cols = 512;
    for path in KernelPath::supported() {
        for (si, set) in sets.iter().enumerate() {
            let ms: Vec<QuantMatrix> = set
                .iter()
                .enumerate()
                .map(|(i, &(ty, rows))| {
                    let w = random_weights(ty, rows, cols, 90 + (si * 8 + i) as u64);
                    QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap()
                })
                .collect();
            let refs: Vec<&QuantMatrix> = ms.iter().collect();
            for class in [OrderClass::One, OrderClass::Few, OrderClass::Many] {
                for n in [1usize, 3, 9, 20, 37] {
                    let x: Vec<f32> = (0..n)
                        .flat_map(|t| generate_data(0.3 + t as f32, cols, 2.0))
                        .collect();
                    let runs = [(n, class)];
                    let mut ctx = KernelCtx::with_path_and_threads(path, 2).unwrap();
                    let mut got: Vec<Vec<f32>> =
                        ms.iter().map(|m| vec![f32::NAN; n * m.rows()]).collect();
                    {
                        let mut ys: Vec<&mut [f32]> =
                            got.iter_mut().map(|y| y.as_mut_slice()).collect();
                        QuantMatrix::matmul_runs_shared(&refs, &x, &runs, &mut ys, &mut ctx)
                            .unwrap();
                    }
                    for (i, m) in ms.iter().enumerate() {
                        let mut want = vec![f32::NAN; n * m.rows()];
                        m.matmul_runs(&x, &runs, &mut want, &mut ctx).unwrap();
                        assert_same_bits(
                            &got[i],
                            &want,
                            &format!("{path} set {si} matrix {i} {class:?} n={n}"),
                        );
                    }
                }
            }
            // A wrong output count is a typed error.
            let mut ctx = KernelCtx::with_path_and_threads(path, 2).unwrap();
            let x = generate_data(0.1, cols, 1.0);
            let mut y0 = vec![0f32; ms[0].rows()];
            let err = QuantMatrix::matmul_runs_shared(
                &refs,
                &x,
                &[(1, OrderClass::One)],
                &mut [&mut y0[..]],
                &mut ctx,
            );
            assert!(
                err.is_err(),
                "set {si}: one output for {} matrices",
                ms.len()
            );
        }
    }
}

/// `gather_rows` (a vocabulary shortlist of an LM head): each gathered row gives the bits its
/// source row gives, in every order class, on every path, whatever rows sit beside it (odd
/// and even counts, repeats, reversed order); an empty or out-of-range selection is refused.
#[test]
fn gathered_rows_give_their_source_rows_bits() {
    use GgmlType as T;
    use synapse_kernels::OrderClass;
    let tys = [T::F32, T::F16, T::Q8_0, T::Q4_1, T::Q5_0, T::Q4_K, T::Q6_K];
    for path in KernelPath::supported() {
        for (i, ty) in tys.into_iter().enumerate() {
            let (rows, cols) = (37, 512);
            let w = random_weights(ty, rows, cols, 40 + i as u64);
            let m = QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap();
            for which in [
                vec![5u32],
                vec![36, 0, 7],
                vec![3, 3, 9, 1, 20, 30, 2, 11, 8],
            ] {
                let g = m.gather_rows(&which).unwrap();
                assert_eq!(g.rows(), which.len());
                for class in [OrderClass::One, OrderClass::Few, OrderClass::Many] {
                    for n in [1usize, 2, 5] {
                        let x: Vec<f32> = (0..n)
                            .flat_map(|t| generate_data(0.7 + t as f32, cols, 2.0))
                            .collect();
                        let mut ctx = KernelCtx::with_path_and_threads(path, 2).unwrap();
                        let mut full = vec![f32::NAN; n * rows];
                        m.matmul_as(&x, n, &mut full, class.rows(), &mut ctx)
                            .unwrap();
                        let mut got = vec![f32::NAN; n * which.len()];
                        g.matmul_as(&x, n, &mut got, class.rows(), &mut ctx)
                            .unwrap();
                        let want: Vec<f32> = (0..n)
                            .flat_map(|t| which.iter().map(move |&r| (t, r)))
                            .map(|(t, r)| full[t * rows + r as usize])
                            .collect();
                        assert_same_bits(
                            &got,
                            &want,
                            &format!("{path} {ty} {class:?} n={n} rows {which:?}"),
                        );
                    }
                }
            }
            assert!(m.gather_rows(&[]).is_err());
            assert!(m.gather_rows(&[rows as u32]).is_err());
        }
    }
}

/// The order classes change where the kernels' orders do (a mutation of either shows here).
#[test]
fn order_classes_separate_orders_that_differ() {
    use synapse_kernels::OrderClass;
    assert_eq!(OrderClass::of(0), OrderClass::One);
    assert_eq!(OrderClass::of(1), OrderClass::One);
    assert_eq!(OrderClass::of(2), OrderClass::Few);
    assert_eq!(OrderClass::of(7), OrderClass::Few);
    assert_eq!(OrderClass::of(8), OrderClass::Many);
    for c in [OrderClass::One, OrderClass::Few, OrderClass::Many] {
        assert_eq!(OrderClass::of(c.rows()), c);
    }
    // K-quants: 7 and 8 rows sum differently somewhere on random data; F32: 1 and 2.
    let (rows, cols) = (16, 1024);
    for (ty, a, b) in [(GgmlType::Q4_K, 7, 8), (GgmlType::F32, 1, 2)] {
        let w = random_weights(ty, rows, cols, 77);
        let m = QuantMatrix::from_ggml(ty, &w, rows, cols).unwrap();
        let x = generate_data(0.7, cols, 3.0);
        let mut ctx = KernelCtx::with_path_and_threads(KernelPath::Scalar, 1).unwrap();
        let (mut ya, mut yb) = (vec![0.0; rows], vec![0.0; rows]);
        m.matmul_as(&x, 1, &mut ya, a, &mut ctx).unwrap();
        m.matmul_as(&x, 1, &mut yb, b, &mut ctx).unwrap();
        assert!(
            ya.iter().zip(&yb).any(|(p, q)| p.to_bits() != q.to_bits()),
            "{ty}: orders of {a} and {b} rows gave the same bits everywhere"
        );
    }
}

/// f32 weights with several activation rows: llamafile's GEMM order only for weights whose
/// row count is a multiple of 4 (and rows a multiple of 16 long); ggml's `vec_dot` order for
/// the others (a one-row gate such as Qwen2-MoE's shared-expert gate).
#[test]
fn f32_gemm_order_only_for_weights_of_four_rows() {
    use synapse_kernels::ggml_f32;
    let cols = 64;
    let n = 3;
    let x = generate_data(0.3, n * cols, 1.7);
    let mut ctx = KernelCtx::new().unwrap();
    for rows in [1usize, 2, 3, 4, 6, 8, 12] {
        let w = generate_data(rows as f32 * 0.11, rows * cols, 0.9);
        let m = QuantMatrix::from_f32(&w, rows, cols).unwrap();
        let mut y = vec![0f32; n * rows];
        m.matmul_as(&x, n, &mut y, 2, &mut ctx).unwrap();
        for t in 0..n {
            for r in 0..rows {
                let (wr, xt) = (&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                let want = if rows % 4 == 0 {
                    ggml_f32::dot_f32_gemm(wr, xt)
                } else {
                    ggml_f32::dot_f32(wr, xt)
                };
                assert_eq!(
                    y[t * rows + r].to_bits(),
                    want.to_bits(),
                    "{rows} rows: output ({t}, {r})"
                );
            }
        }
    }
}
