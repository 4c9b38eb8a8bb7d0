//! ggml's block types as codecs (legacy and K-quants), against ggml itself: `ggml_quantize_chunk`'s bytes
//! (`fixtures/ggml-kernels/quant.*`, `cargo xtask ggml-kernel-fixtures`) reproduced bit for
//! bit by the encoder, and the decoder equal to `synapse-formats`' ggml dequantizer (itself
//! tested against ggml's) on ggml's bytes.

use std::path::PathBuf;

use synapse_codecs::{Codec, CodecError, EncodingId, GgmlBlock, GgmlLegacy, resolve};
use synapse_formats::GgmlType;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/ggml-kernels")
}

fn ggml_type(b: GgmlBlock) -> GgmlType {
    match b {
        GgmlBlock::Q8_0 => GgmlType::Q8_0,
        GgmlBlock::Q5_1 => GgmlType::Q5_1,
        GgmlBlock::Q5_0 => GgmlType::Q5_0,
        GgmlBlock::Q4_1 => GgmlType::Q4_1,
        GgmlBlock::Q4_0 => GgmlType::Q4_0,
        GgmlBlock::Q6K => GgmlType::Q6_K,
        GgmlBlock::Q5K => GgmlType::Q5_K,
        GgmlBlock::Q4K => GgmlType::Q4_K,
    }
}

#[test]
fn encoder_reproduces_ggml_quantize_chunk_and_decoder_ggml_dequantize() {
    let dir = fixtures();
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let q = &index["quant"];
    let (rows, k) = (
        q["rows"].as_u64().unwrap() as usize,
        q["k"].as_u64().unwrap() as usize,
    );
    let src: Vec<f32> = std::fs::read(dir.join("quant.src.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(src.len(), rows * k);
    for b in GgmlBlock::ALL {
        let want = std::fs::read(dir.join(format!("quant.{}.bin", b.name()))).unwrap();
        let codec = resolve(&format!("ggml.{}.v1", b.name())).unwrap();
        assert_eq!(codec.id(), EncodingId::Ggml(b));
        assert_eq!(codec.matrix_size(rows, k).unwrap(), want.len());
        let got = codec.encode_matrix(&src, rows, k).unwrap();
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(first, None, "{}: first differing byte", b.name());
        assert_eq!(got.len(), want.len());
        // Decoding ggml's bytes: synapse-formats' dequantizer, bit for bit.
        let dec = codec.decode_matrix(&want, rows, k).unwrap();
        let mut reference = vec![0f32; rows * k];
        synapse_formats::decode::dequantize(ggml_type(b), &want, &mut reference).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&dec), bits(&reference), "{}: decode", b.name());
        // `linear` is the decoded weights' dot.
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let mut y = vec![0f32; rows];
        codec.linear(&want, rows, &x, &mut y).unwrap();
        for (r, &yr) in y.iter().enumerate() {
            let exact: f64 = dec[r * k..(r + 1) * k]
                .iter()
                .zip(&x)
                .map(|(w, x)| f64::from(*w) * f64::from(*x))
                .sum();
            let scale: f64 = dec[r * k..(r + 1) * k]
                .iter()
                .zip(&x)
                .map(|(w, x)| (f64::from(*w) * f64::from(*x)).abs())
                .sum();
            assert!(
                (f64::from(yr) - exact).abs() <= 1e-5 * scale.max(1e-30),
                "{} row {r}: {yr} vs {exact}",
                b.name()
            );
        }
        eprintln!(
            "{}: {} rows × {k} encoded as ggml_quantize_chunk ({} B), decoded as ggml",
            b.name(),
            rows,
            want.len()
        );
    }
}

#[test]
fn ids_sizes_and_refusals() {
    for b in GgmlBlock::ALL {
        let id = format!("ggml.{}.v1", b.name());
        let e = EncodingId::parse(&id).unwrap();
        assert_eq!(e.to_string(), id);
        let n = b.block_elems();
        let k = matches!(b, GgmlBlock::Q6K | GgmlBlock::Q5K | GgmlBlock::Q4K);
        assert_eq!(n, if k { 256 } else { 32 }, "{id}");
        assert_eq!(
            e.bits_per_weight(),
            (8 * b.block_bytes()) as f64 / n as f64,
            "{id}"
        );
        let c = GgmlLegacy::new(b);
        assert_eq!(c.matrix_size(3, 2 * n).unwrap(), 3 * 2 * b.block_bytes());
        // Rows of whole blocks only, as ggml.
        let part = n + 16;
        assert!(matches!(
            c.matrix_size(1, part),
            Err(CodecError::PartialBlock { cols, block, .. }) if cols == part && block == n
        ));
        assert!(matches!(
            c.encode_matrix(&vec![0.0; part], 1, part),
            Err(CodecError::PartialBlock { .. })
        ));
        // Non-finite input and a non-finite stored scale are refused.
        let mut w = vec![0.5f32; n];
        w[3] = f32::NAN;
        assert!(matches!(
            c.encode_matrix(&w, 1, n),
            Err(CodecError::NonFinite { index: 3, .. })
        ));
        let mut bytes = c.encode_matrix(&vec![0.25f32; n], 1, n).unwrap();
        // The FP16 scale: first in every block but Q6_K's, whose `d` ends it.
        let at = if b == GgmlBlock::Q6K { 208 } else { 0 };
        bytes[at..at + 2].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
        assert!(matches!(
            c.decode_matrix(&bytes, 1, n),
            Err(CodecError::InvalidScale { group: 0 })
        ));
    }
    for bad in [
        "ggml.q4_2.v1",
        "ggml.q3_k.v1",
        "ggml.q4_0",
        "ggml.q4_0.v2",
        "ggml.q4_K.v1",
    ] {
        assert!(EncodingId::parse(bad).is_err(), "{bad}");
    }
}
