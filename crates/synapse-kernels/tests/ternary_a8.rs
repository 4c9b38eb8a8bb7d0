//! BitNet's W1.58A8 matrices (`QuantMatrix::from_ternary_a8`): the same weights as the
//! `syn.ternary.absmean.tensor.v1` codec they come from, the codec's output on inputs
//! quantised as transformers' `ActQuant` within float noise, the same bits on every kernel
//! path, and the codec's own path where rows are not whole 256-blocks.

use rand::{Rng, SeedableRng};
use synapse_codecs::TernaryTensor;
use synapse_kernels::{KernelCtx, KernelPath, QuantMatrix};

/// transformers' `ActQuant` in f32: `clamp(round(x·a), −128, 127) / a`, `a = 127 / max|x|`.
fn act_quant(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for r in x.chunks_exact(cols) {
        let amax = r.iter().fold(0f32, |m, v| m.max(v.abs()));
        let a = 127.0 / amax.max(1e-5);
        out.extend(
            r.iter()
                .map(|v| (v * a).round_ties_even().clamp(-128.0, 127.0) / a),
        );
    }
    out
}

#[test]
fn ternary_a8_matches_the_codec_on_quantised_inputs_on_every_path() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let (rows, cols) = (13usize, 768usize);
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-0.05f32..0.05))
        .collect();
    let bytes = TernaryTensor::encode_bitnet_weight_quant(&w).unwrap();
    let id = "syn.ternary.absmean.tensor.v1";
    let codec = QuantMatrix::from_codec(id, &bytes, rows, cols).unwrap();
    let a8 = QuantMatrix::from_ternary_a8(&bytes, rows, cols).unwrap();
    assert!(a8.quantizes_inputs() && !codec.quantizes_inputs());
    assert_eq!(a8.encoding(), codec.encoding());

    // The same weights, bit for bit.
    let (mut r1, mut r2) = (vec![0f32; cols], vec![0f32; cols]);
    for r in 0..rows {
        codec.dequantize_row(r, &mut r1).unwrap();
        a8.dequantize_row(r, &mut r2).unwrap();
        for (a, b) in r1.iter().zip(&r2) {
            assert_eq!(a.to_bits(), b.to_bits(), "row {r}");
        }
    }

    let mut scalar_ctx = KernelCtx::with_path_and_threads(KernelPath::Scalar, 1).unwrap();
    for n in [1usize, 2, 5, 8, 40] {
        // Activations with a wide spread, so the 8-bit quantisation matters.
        let x: Vec<f32> = (0..n * cols)
            .map(|_| rng.random_range(-4f32..4.0).powi(3))
            .collect();
        let mut want = vec![0f32; n * rows];
        codec
            .matmul(&act_quant(&x, cols), n, &mut want, &mut scalar_ctx)
            .unwrap();
        let mut first: Option<Vec<f32>> = None;
        for path in KernelPath::supported() {
            let mut ctx = KernelCtx::with_path_and_threads(path, 2).unwrap();
            let mut got = vec![f32::NAN; n * rows];
            a8.matmul(&x, n, &mut got, &mut ctx).unwrap();
            for (t, (g, e)) in got.chunks(rows).zip(want.chunks(rows)).enumerate() {
                let scale = e.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (a, b)) in g.iter().zip(e).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale,
                        "{path:?} n {n} row {t} out {i}: {a} vs {b} (scale {scale})"
                    );
                }
            }
            match &first {
                None => first = Some(got),
                Some(f) => {
                    for (a, b) in got.iter().zip(f) {
                        assert_eq!(a.to_bits(), b.to_bits(), "{path:?} n {n}: paths differ");
                    }
                }
            }
        }
    }

    // Rows that are not whole 256-blocks keep the codec (inputs quantised by the caller).
    let cols = 320;
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-0.05f32..0.05))
        .collect();
    let bytes = TernaryTensor::encode_bitnet_weight_quant(&w).unwrap();
    let m = QuantMatrix::from_ternary_a8(&bytes, rows, cols).unwrap();
    assert!(!m.quantizes_inputs());
    // Malformed bytes are refused as the codec refuses them.
    assert!(QuantMatrix::from_ternary_a8(&bytes[..bytes.len() - 1], rows, cols).is_err());
}

/// The table-lookup packing (`TernaryTlMatrix`, 1.67 bits a weight) gives the 2-bit packing's
/// outputs bit for bit on every path, with ragged tiles (rows not a multiple of 64, K not one
/// of 6), and refuses what it cannot run.
#[test]
fn table_lookup_packing_gives_the_same_bits() {
    use synapse_kernels::TernaryTlMatrix;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for (rows, cols) in [(13usize, 768usize), (130, 2560), (64, 256)] {
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-0.05f32..0.05))
            .collect();
        let bytes = TernaryTensor::encode_bitnet_weight_quant(&w).unwrap();
        let a8 = QuantMatrix::from_ternary_a8(&bytes, rows, cols).unwrap();
        let tl = TernaryTlMatrix::from_ternary_a8(&bytes, rows, cols).unwrap();
        assert_eq!((tl.rows(), tl.cols()), (rows, cols));
        // 80 bytes per 64 rows and 6 columns: 1.67 bits a weight, rows padded to 64.
        assert_eq!(tl.weight_bytes(), rows.div_ceil(64) * cols.div_ceil(6) * 80);
        if rows % 64 == 0 {
            assert!(tl.weight_bytes() * 100 <= a8.weight_bytes() * 84);
        }
        for n in [1usize, 3, 8] {
            let x: Vec<f32> = (0..n * cols)
                .map(|_| rng.random_range(-4f32..4.0).powi(3))
                .collect();
            let mut want = vec![0f32; n * rows];
            let mut ctx = KernelCtx::with_path_and_threads(KernelPath::Scalar, 1).unwrap();
            a8.matmul(&x, n, &mut want, &mut ctx).unwrap();
            for path in KernelPath::supported() {
                let mut ctx = KernelCtx::with_path_and_threads(path, 2).unwrap();
                let mut got = vec![f32::NAN; n * rows];
                tl.matmul(&x, n, &mut got, &mut ctx).unwrap();
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{path:?} {rows}x{cols} n {n} out {i}"
                    );
                }
            }
        }
    }
    let bytes = TernaryTensor::encode_bitnet_weight_quant(&vec![0.01f32; 4 * 100]).unwrap();
    assert!(TernaryTlMatrix::from_ternary_a8(&bytes, 4, 100).is_err());
    let bytes = TernaryTensor::encode_bitnet_weight_quant(&vec![0.01f32; 4 * 256]).unwrap();
    let tl = TernaryTlMatrix::from_ternary_a8(&bytes, 4, 256).unwrap();
    let mut ctx = KernelCtx::with_path_and_threads(KernelPath::Scalar, 1).unwrap();
    assert!(tl.matmul(&[0.0; 255], 1, &mut [0.0; 4], &mut ctx).is_err());
}
