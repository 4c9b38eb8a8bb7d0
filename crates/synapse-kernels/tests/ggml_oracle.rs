//! The kernels against ggml itself (fixtures from `cargo xtask ggml-kernel-fixtures`): for every
//! weight type with a ggml-order kernel, `W·X` of ggml's own quantized weights and seeded
//! activations at 1, 2, 4, 7, 8, 16, 32 and 128 activation rows — llama.cpp's `ggml_mul_mat`
//! on its CPU backend — must come out bit for bit, on every kernel path this CPU supports, with
//! 1 and 2 threads. (ggml's float order changes with the row count: 1 row, 2+ rows for F32 and
//! IQ4_NL, 8+ rows for the K-quants; the row counts straddle each switch.)

use std::path::PathBuf;

use serde_json::Value;
use synapse_formats::GgmlType;
use synapse_kernels::{KernelCtx, KernelPath, QuantMatrix};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/ggml-kernels")
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn ggml_type(name: &str) -> GgmlType {
    synapse_formats::ALL_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

#[test]
fn matmul_is_bit_identical_to_ggml_mul_mat_on_every_path() {
    let d = dir();
    let index: Value =
        serde_json::from_slice(&std::fs::read(d.join("index.json")).expect("fixture index"))
            .expect("index.json");
    let (rows, k) = (
        index["rows"].as_u64().unwrap() as usize,
        index["k"].as_u64().unwrap() as usize,
    );
    let ns: Vec<usize> = index["ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let x = f32s(&std::fs::read(d.join("x.f32")).unwrap());
    let types = index["types"].as_object().unwrap();
    assert!(types.len() >= 13, "fixture types: {}", types.len());
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for (name, t) in types {
        let ty = ggml_type(name);
        let w = std::fs::read(d.join(t["w"].as_str().unwrap())).unwrap();
        let want = f32s(&std::fs::read(d.join(t["y"].as_str().unwrap())).unwrap());
        // The fixtures are ggml's own products: BF16 in ggml's order (a GGUF's numerics).
        let m = QuantMatrix::from_ggml(ty, &w, rows, k)
            .unwrap()
            .with_ggml_bf16(true);
        for path in KernelPath::supported() {
            for threads in [1, 2] {
                let mut ctx = KernelCtx::with_path_and_threads(path, threads).unwrap();
                let mut at = 0;
                for &n in &ns {
                    let mut y = vec![f32::NAN; n * rows];
                    m.matmul(&x[..n * k], n, &mut y, &mut ctx).unwrap();
                    let exp = &want[at..at + n * rows];
                    at += n * rows;
                    let bad = y
                        .iter()
                        .zip(exp)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                    checked += y.len();
                    if bad > 0 {
                        let (i, (g, e)) = y
                            .iter()
                            .zip(exp)
                            .enumerate()
                            .find(|(_, (a, b))| a.to_bits() != b.to_bits())
                            .unwrap();
                        failures.push(format!(
                            "{name} {path} threads {threads} n {n}: {bad} of {} differ \
                             (first at {i}: synapse {g:e}, ggml {e:e})",
                            y.len()
                        ));
                    }
                }
            }
        }
    }
    eprintln!("{checked} outputs compared with ggml's");
    assert!(failures.is_empty(), "{failures:#?}");
}
