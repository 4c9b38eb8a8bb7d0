//! Synapse's own codecs through the port: `syn.q{2..8}.symmetric`, `syn.ternary.absmean` (per
//! group and per tensor), against f64 dots of the codec's decoded matrix.

mod common;

use synapse_codecs::resolve;
use synapse_kernels::{Encoding, KernelCtx, KernelPath, QuantMatrix};

#[test]
fn codec_matrices_match_decoded_f64_dots() {
    let mut ids: Vec<String> = (2..=8)
        .map(|b| format!("syn.q{b}.symmetric.g64.v1"))
        .collect();
    ids.push("syn.q4.symmetric.g32.v1".into());
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
                        let tol = 1e-5 * common::abs_dot(wr, xt) + 1e-6;
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

#[test]
fn malformed_codec_bytes_are_refused_at_load() {
    // Code 0 is reserved in the symmetric family: an all-zero group is malformed.
    let bytes = vec![0u8; 2 + 64 / 2];
    assert!(QuantMatrix::from_codec("syn.q4.symmetric.g64.v1", &bytes, 1, 64).is_err());
    assert!(QuantMatrix::from_codec("syn.q4.symmetric.g64.v1", &bytes[1..], 1, 64).is_err());
    assert!(QuantMatrix::from_codec("syn.q9.symmetric.g64.v1", &bytes, 1, 64).is_err());
}
