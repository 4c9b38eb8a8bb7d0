//! Synapse's own codecs through the port: `syn.q{2..8}.symmetric`, `syn.q{2..8}.asymmetric`,
//! `syn.ternary.absmean` (per group and per tensor), against f64 dots of the codec's decoded
//! matrix; the integer path of the symmetric, asymmetric and ternary g64 codecs (activations
//! quantized as Q8_0) bit-identical between its SIMD and scalar versions and for any number of
//! activation rows beside it.

mod common;

use synapse_codecs::resolve;
use synapse_kernels::{Encoding, KernelCtx, KernelPath, QuantMatrix};

#[test]
fn codec_matrices_match_decoded_f64_dots() {
    let mut ids: Vec<String> = (2..=8)
        .map(|b| format!("syn.q{b}.symmetric.g64.v1"))
        .collect();
    ids.extend((2..=8).map(|b| format!("syn.q{b}.asymmetric.g64.v1")));
    ids.push("syn.q4.symmetric.g32.v1".into());
    ids.push("syn.q4.asymmetric.g32.v1".into());
    ids.push("syn.ternary.absmean.g64.v1".into());
    ids.push("syn.ternary.absmean.tensor.v1".into());
    for id in &ids {
        for (rows, cols, n) in [(1, 64, 1), (13, 192, 3), (70, 640, 2), (5, 100, 1)] {
            let codec = resolve(id).unwrap();
            let w = common::generate_data(0.7, rows * cols, 1.0);
            let bytes = codec.encode_matrix(&w, rows, cols).unwrap();
            let dec = codec.decode_matrix(&bytes, rows, cols).unwrap();
            let m = QuantMatrix::from_codec(id, &bytes, rows, cols).unwrap();
            assert!(matches!(m.encoding(), Encoding::Codec(_)));
            let x: Vec<f32> = (0..n)
                .flat_map(|t| common::generate_data(t as f32 + 0.2, cols, 1.5))
                .collect();
            for threads in [1, 2] {
                let mut ctx =
                    KernelCtx::with_path_and_threads(KernelPath::best_supported(), threads)
                        .unwrap();
                let mut y = vec![f32::NAN; n * rows];
                m.matmul(&x, n, &mut y, &mut ctx).unwrap();
                for t in 0..n {
                    for r in 0..rows {
                        let wr = &dec[r * cols..(r + 1) * cols];
                        let xt = &x[t * cols..(t + 1) * cols];
                        let want = common::dot64(wr, xt);
                        let tol = if int_path(id, cols) {
                            q8_act_bound(wr, xt)
                        } else {
                            1e-5 * common::abs_dot(wr, xt) + 1e-6
                        };
                        let got = y[t * rows + r] as f64;
                        assert!(
                            (got - want).abs() <= tol,
                            "{id} {rows}x{cols} t={t} r={r}: {got} vs {want}"
                        );
                    }
                }
            }
            let mut row = vec![0f32; cols];
            m.dequantize_row(rows - 1, &mut row).unwrap();
            assert_eq!(&row[..], &dec[(rows - 1) * cols..]);
        }
    }
}

/// Whether `id` at `cols` takes the integer path (activations quantized as Q8_0 blocks).
fn int_path(id: &str, cols: usize) -> bool {
    (id.contains("symmetric.g64.") || id.contains(".ternary.absmean.g64."))
        && cols.is_multiple_of(64)
}

/// How far a dot with activations quantized as Q8_0 blocks may be from the exact one: each
/// activation moves by at most `0.6·d` (`d = amax/127` of its 32-block: half a step, plus the
/// f16 rounding of `d` over 127 steps), plus float rounding.
fn q8_act_bound(w: &[f32], x: &[f32]) -> f64 {
    let mut b = 0f64;
    for (wb, xb) in w.chunks(32).zip(x.chunks(32)) {
        let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
        b += wb.iter().map(|v| v.abs() as f64).sum::<f64>() * 0.6 * d;
    }
    b + 1e-5 * common::abs_dot(w, x) + 1e-6
}

#[test]
fn g64_integer_path_simd_equals_scalar_and_rows_are_independent() {
    // The symmetric and asymmetric widths, and ternary g64 (the 2-bit layout with the absmean
    // scale).
    let ids = (2..=8u32)
        .map(|b| (b, format!("syn.q{b}.symmetric.g64.v1")))
        .chain((2..=8u32).map(|b| (b, format!("syn.q{b}.asymmetric.g64.v1"))))
        .chain([(2, "syn.ternary.absmean.g64.v1".to_string())]);
    for (bits, id) in ids {
        let codec = resolve(&id).unwrap();
        for (rows, cols) in [(1, 64), (9, 128), (37, 640), (16, 1536)] {
            let w = common::generate_data(0.3 + bits as f32, rows * cols, 1.0);
            let bytes = codec.encode_matrix(&w, rows, cols).unwrap();
            let dec = codec.decode_matrix(&bytes, rows, cols).unwrap();
            let m = QuantMatrix::from_codec(&id, &bytes, rows, cols).unwrap();
            let n = 11;
            let x: Vec<f32> = (0..n)
                .flat_map(|t| common::generate_data(t as f32 * 1.7 + 0.1, cols, 2.0))
                .collect();
            let run = |path: KernelPath, threads: usize, x: &[f32], n: usize| {
                let mut ctx = KernelCtx::with_path_and_threads(path, threads).unwrap();
                let mut y = vec![f32::NAN; n * rows];
                m.matmul(x, n, &mut y, &mut ctx).unwrap();
                y
            };
            let scalar = run(KernelPath::Scalar, 1, &x, n);
            // Every SIMD path this CPU has (AVX-512 VBMI/VNNI, AVX2 …), at 1 and 2 threads.
            let paths = KernelPath::supported()
                .into_iter()
                .filter(|p| *p != KernelPath::Scalar);
            for (path, threads) in paths.flat_map(|p| [(p, 1), (p, 2)]) {
                let got = run(path, threads, &x, n);
                for (i, (a, b)) in got.iter().zip(&scalar).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{id} {rows}x{cols} {path} [{i}]");
                }
                // Fewer rows: other groupings of the activation rows (1; 4 + 2; 4 + 1).
                for m in [1, 6, 5] {
                    let got = run(path, threads, &x[..m * cols], m);
                    for (i, (a, b)) in got.iter().zip(&scalar).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{id} {rows}x{cols} {path} n={m} [{i}]"
                        );
                    }
                }
            }
            // Each activation row alone: the same bits as beside the ten others.
            for t in [0, 5, n - 1] {
                let alone = run(
                    KernelPath::best_supported(),
                    2,
                    &x[t * cols..(t + 1) * cols],
                    1,
                );
                for r in 0..rows {
                    assert_eq!(
                        alone[r].to_bits(),
                        scalar[t * rows + r].to_bits(),
                        "{id} t={t} r={r}"
                    );
                }
            }
            for t in 0..n {
                for r in 0..rows {
                    let (wr, xt) = (&dec[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                    let (got, want) = (scalar[t * rows + r] as f64, common::dot64(wr, xt));
                    assert!(
                        (got - want).abs() <= q8_act_bound(wr, xt),
                        "{id} {rows}x{cols} t={t} r={r}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn malformed_codec_bytes_are_refused_at_load() {
    // Code 0 is reserved in the symmetric family: an all-zero group is malformed.
    let bytes = vec![0u8; 2 + 64 / 2];
    assert!(QuantMatrix::from_codec("syn.q4.symmetric.g64.v1", &bytes, 1, 64).is_err());
    assert!(QuantMatrix::from_codec("syn.q4.symmetric.g64.v1", &bytes[1..], 1, 64).is_err());
    assert!(QuantMatrix::from_codec("syn.q9.symmetric.g64.v1", &bytes, 1, 64).is_err());
}

/// A copy of a matrix's bytes, as a pager's slot holds it.
struct Copied(Vec<u8>);

impl synapse_kernels::WeightSource for Copied {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// `over_copy`: the same encoding and shape over a copy of the bytes computes the same bits;
/// a copy of another length, or of a W1.58A8 matrix (its codes are converted), is refused.
#[test]
fn a_matrix_over_a_copy_of_its_bytes_computes_the_same() {
    let (rows, cols) = (8, 256);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1009) as f32 / 504.0) - 1.0)
        .collect();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 31 % 97) as f32 / 48.0) - 1.0)
        .collect();
    let mut ctx = KernelCtx::new().unwrap();
    for id in ["syn.q4.symmetric.g64.v1", "syn.q3.asymmetric.g64.v1"] {
        let codec = resolve(id).unwrap();
        let bytes = codec.encode_matrix(&w, rows, cols).unwrap();
        let m = QuantMatrix::from_codec(id, &bytes, rows, cols).unwrap();
        let c = m
            .over_copy(std::sync::Arc::new(Copied(m.raw_bytes().to_vec())))
            .unwrap();
        assert!(c.is_borrowed() && c.encoding() == m.encoding());
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        m.matvec(&x, &mut a, &mut ctx).unwrap();
        c.matvec(&x, &mut b, &mut ctx).unwrap();
        assert_eq!(a, b, "{id}");
        let short = m.raw_bytes()[1..].to_vec();
        assert!(m.over_copy(std::sync::Arc::new(Copied(short))).is_err());
    }
    let t = synapse_codecs::resolve("syn.ternary.absmean.tensor.v1").unwrap();
    let tb = t.encode_matrix(&w, rows, cols).unwrap();
    let a8 = QuantMatrix::from_ternary_a8(&tb, rows, cols).unwrap();
    let copy = a8.raw_bytes().to_vec();
    assert!(a8.over_copy(std::sync::Arc::new(Copied(copy))).is_err());
}

/// ggml's legacy block types as codecs (`ggml.q4_0.v1` …): the encoded bytes make the ggml
/// type's own matrix (its kernels, every path), the same outputs bit for bit as
/// `QuantMatrix::from_ggml` over those bytes; rows of partial blocks refused.
#[test]
fn ggml_codec_matrices_are_the_ggml_types_matrices() {
    use synapse_formats::GgmlType;
    for (id, ty) in [
        ("ggml.q8_0.v1", GgmlType::Q8_0),
        ("ggml.q5_1.v1", GgmlType::Q5_1),
        ("ggml.q5_0.v1", GgmlType::Q5_0),
        ("ggml.q4_1.v1", GgmlType::Q4_1),
        ("ggml.q4_0.v1", GgmlType::Q4_0),
        ("ggml.q6_k.v1", GgmlType::Q6_K),
        ("ggml.q5_k.v1", GgmlType::Q5_K),
        ("ggml.q4_k.v1", GgmlType::Q4_K),
    ] {
        let (rows, cols) = (24, 512);
        let codec = resolve(id).unwrap();
        let w = common::generate_data(0.3, rows * cols, 1.0);
        let bytes = codec.encode_matrix(&w, rows, cols).unwrap();
        let m = QuantMatrix::from_codec(id, &bytes, rows, cols).unwrap();
        assert_eq!(m.encoding(), Encoding::Ggml(ty), "{id}");
        let g = QuantMatrix::from_ggml(ty, &bytes, rows, cols).unwrap();
        let dec = codec.decode_matrix(&bytes, rows, cols).unwrap();
        let mut row = vec![0f32; cols];
        g.dequantize_row(rows - 1, &mut row).unwrap();
        assert_eq!(&row[..], &dec[(rows - 1) * cols..], "{id}: decode");
        for path in KernelPath::supported() {
            for (n, threads) in [(1, 1), (3, 2), (16, 2)] {
                let mut ctx = KernelCtx::with_path_and_threads(path, threads).unwrap();
                let x: Vec<f32> = common::generate_data(1.7, n * cols, 1.0);
                let (mut a, mut b) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
                m.matmul(&x, n, &mut a, &mut ctx).unwrap();
                g.matmul(&x, n, &mut b, &mut ctx).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{id} {path:?} n={n}");
            }
        }
        assert!(QuantMatrix::from_codec(id, &bytes[..bytes.len() - 1], rows, cols).is_err());
        // A size that is not the matrix's (another shape's bytes) is refused.
        let half = codec.encode_matrix(&w[..rows * 256], rows, 256).unwrap();
        assert!(QuantMatrix::from_codec(id, &half, rows, 48).is_err());
        assert!(QuantMatrix::from_codec(id, &half, rows, cols).is_err());
    }
}
