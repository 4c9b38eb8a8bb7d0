//! The synthetic BitNet writer: llama.cpp's `bitnet` layout, the padded vocabulary, ternary
//! weights that decode (by ggml's own dequantization rules) to {−d, 0, d}, the same trits in
//! TQ1_0 and TQ2_0, and the same bytes for the same seed.

use synapse_formats::GgmlType;
use synapse_formats::decode::dequantize_to_vec;
use synapse_formats::gguf::GgufFile;
use synapse_testdata::synthetic_bitnet::{BitnetShape, write};

fn written(shape: &BitnetShape, dir: &std::path::Path) -> GgufFile {
    let path = dir.join(shape.file_name());
    write(shape, &path).unwrap();
    GgufFile::open(&path).unwrap()
}

#[test]
fn synthetic_bitnet_is_ternary_in_both_packings_and_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let tq2 = BitnetShape::small();
    let tq1 = BitnetShape {
        ternary: GgmlType::TQ1_0,
        embedding: GgmlType::Q8_0,
        ..tq2.clone()
    };
    let (g2, g1) = (written(&tq2, dir.path()), written(&tq1, dir.path()));

    let meta = |g: &GgufFile, k: &str| {
        g.metadata()
            .iter()
            .find(|(key, _)| key.as_str() == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {k}"))
    };
    assert_eq!(meta(&g2, "general.architecture").as_str(), Some("bitnet"));
    let types = meta(&g2, "tokenizer.ggml.token_type");
    let types = types.as_i32s().unwrap();
    assert_eq!(types.len(), tq2.vocab as usize);
    assert!(
        types[512..].iter().all(|&t| t == 5),
        "padding pieces are unused (type 5)"
    );
    assert_eq!(
        meta(&g2, "tokenizer.ggml.tokens")
            .as_strings()
            .unwrap()
            .get(600),
        Some("<synthetic_88>")
    );

    let (mut proj, mut zeros, mut total) = (0u64, 0usize, 0usize);
    for t in g2.tensors() {
        let name = &t.name;
        if t.ty.ggml().unwrap() != GgmlType::TQ2_0 {
            continue;
        }
        proj += t.n_bytes;
        let other = g1.tensors().iter().find(|u| &u.name == name).unwrap();
        assert_eq!(other.ty.ggml().unwrap(), GgmlType::TQ1_0);
        let v2 = dequantize_to_vec(GgmlType::TQ2_0, g2.tensor_data(t)).unwrap();
        let v1 = dequantize_to_vec(GgmlType::TQ1_0, g1.tensor_data(other)).unwrap();
        assert_eq!(v1.len(), v2.len());
        for (b, (c2, c1)) in v2.chunks(256).zip(v1.chunks(256)).enumerate() {
            let d = c2.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(d > 0.0, "{name} block {b}: all zero");
            for (i, (&x2, &x1)) in c2.iter().zip(c1).enumerate() {
                assert!(
                    x2 == 0.0 || x2.abs() == d,
                    "{name} block {b}[{i}] = {x2} (d {d})"
                );
                assert_eq!(
                    x2.to_bits(),
                    x1.to_bits(),
                    "{name} block {b}[{i}]: TQ2_0 vs TQ1_0"
                );
            }
            zeros += c2.iter().filter(|&&x| x == 0.0).count();
            total += c2.len();
        }
    }
    assert_eq!(proj, tq2.weight_bytes().0, "projection bytes");
    let frac = zeros as f64 / total as f64;
    assert!((0.30..0.37).contains(&frac), "share of zero weights {frac}");

    // The same shape and seed, the same bytes; another seed, other bytes.
    let again = dir.path().join("again.gguf");
    write(&tq2, &again).unwrap();
    let first = std::fs::read(dir.path().join(tq2.file_name())).unwrap();
    assert_eq!(std::fs::read(&again).unwrap(), first);
    let other = BitnetShape {
        seed: 2,
        ..tq2.clone()
    };
    write(&other, &again).unwrap();
    assert_ne!(std::fs::read(&again).unwrap(), first);

    // Bad shapes are refused before anything is written.
    let bad = BitnetShape {
        hidden: 500,
        ..tq2.clone()
    };
    let path = dir.path().join("bad.gguf");
    assert!(write(&bad, &path).is_err());
    assert!(!path.exists());
}
