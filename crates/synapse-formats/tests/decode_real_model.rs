//! The decoders on the default real model (Gemma 3 270M Q4_K_M): one sampled block (or run of
//! 16 values for F32 tensors) of each of its 236 tensors, with ggml's own f32 output, is
//! committed under `fixtures/decode/gemma3_270m_q4_k_m/` (`cargo xtask oracle-fixtures`).
//!
//! - `sampled_blocks_match_ggml` needs only the fixture and always runs.
//! - `real_file_every_tensor_decodes` opens the real file from the user cache with
//!   [`GgufFile`], checks each tensor against the fixture's recorded name, type, offset and
//!   size, decodes every tensor in full, and checks the sampled block of the file against ggml.
//!   If the file is absent it prints why and passes, unless `CI` is set (then it fails).

use serde_json::Value;
use std::path::PathBuf;
use synapse_formats::decode::{dequantize, dequantize_to_vec};
use synapse_formats::gguf::{GgufFile, TensorType};
use synapse_formats::{FormatError, GgmlType};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/decode/gemma3_270m_q4_k_m")
}

fn read(name: &str) -> Vec<u8> {
    let p = fixture_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

struct Sample {
    name: String,
    ty: GgmlType,
    offset: u64,
    n_elements: u64,
    n_bytes: u64,
    block: u64,
    blocks: u64,
    raw: Vec<u8>,
    want: Vec<f32>,
}

fn samples() -> Vec<Sample> {
    let idx: Value = serde_json::from_slice(&read("index.json")).expect("index.json");
    let bin = read("samples.bin");
    let f32s: Vec<f32> = read("samples.f32")
        .as_chunks::<4>()
        .0
        .iter()
        .map(|b| f32::from_le_bytes(*b))
        .collect();
    let u = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("field {k}"));
    idx["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| {
            let name = t["type"].as_str().expect("type");
            let ty = *synapse_formats::ALL_TYPES
                .iter()
                .find(|g| g.name() == name)
                .unwrap_or_else(|| panic!("type {name}"));
            let blocks = u(t, "sample_blocks");
            let (b0, f0) = (u(t, "bin_offset") as usize, u(t, "f32_offset") as usize);
            let nb = blocks as usize * ty.type_size();
            let nf = blocks as usize * ty.block_size();
            Sample {
                name: t["name"].as_str().expect("name").to_string(),
                ty,
                offset: u(t, "offset"),
                n_elements: u(t, "n_elements"),
                n_bytes: u(t, "n_bytes"),
                block: u(t, "sample_block"),
                blocks,
                raw: bin[b0..b0 + nb].to_vec(),
                want: f32s[f0..f0 + nf].to_vec(),
            }
        })
        .collect()
}

fn same(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
}

#[test]
fn sampled_blocks_match_ggml() {
    let s = samples();
    assert_eq!(s.len(), 236);
    let mut bad = Vec::new();
    for x in &s {
        let got = dequantize_to_vec(x.ty, &x.raw).expect("decodes");
        if !same(&got, &x.want) {
            bad.push(format!("{} ({}) block {}", x.name, x.ty, x.block));
        }
    }
    assert!(bad.is_empty(), "mismatches vs ggml: {bad:?}");
}

#[test]
fn real_file_every_tensor_decodes() {
    let path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    if !synapse_testdata::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let f = GgufFile::open(&path).expect("the real model opens");
    let s = samples();
    assert_eq!(f.tensors().len(), s.len());
    let mut buf = Vec::new();
    let mut decoded = 0u64;
    let mut decode_time = std::time::Duration::ZERO;
    for x in &s {
        let t = f
            .tensor(&x.name)
            .unwrap_or_else(|| panic!("{} missing", x.name));
        assert_eq!(t.ty, TensorType::Ggml(x.ty), "{}", x.name);
        assert_eq!(
            (t.offset, t.n_elements(), t.n_bytes),
            (x.offset, x.n_elements, x.n_bytes),
            "{}",
            x.name
        );
        let data = f.tensor_data(t);
        // the whole tensor decodes, to finite values
        buf.resize(x.n_elements as usize, 0.0);
        let t0 = std::time::Instant::now();
        dequantize(x.ty, data, &mut buf).unwrap_or_else(|e| panic!("{}: {e}", x.name));
        decode_time += t0.elapsed();
        assert!(
            buf.iter().all(|v| v.is_finite()),
            "{}: non-finite value",
            x.name
        );
        decoded += buf.len() as u64;
        // the sampled block is the fixture's, and decodes to ggml's values in place
        let (bs, ts) = (x.ty.block_size() as u64, x.ty.type_size() as u64);
        let raw = &data[(x.block * ts) as usize..((x.block + x.blocks) * ts) as usize];
        assert_eq!(
            raw,
            &x.raw[..],
            "{}: file bytes differ from fixture",
            x.name
        );
        let from_file = &buf[(x.block * bs) as usize..((x.block + x.blocks) * bs) as usize];
        assert!(same(from_file, &x.want), "{}: differs from ggml", x.name);
    }
    println!(
        "decoded all {} tensors, {decoded} values ({} MB of source) in {:.2?}",
        s.len(),
        s.iter().map(|x| x.n_bytes).sum::<u64>() / 1_000_000,
        decode_time
    );
}

#[test]
fn wrong_lengths_are_typed_errors() {
    for x in samples() {
        let mut dst = vec![0.0f32; x.want.len() + 1];
        assert!(matches!(
            dequantize(x.ty, &x.raw, &mut dst),
            Err(FormatError::DecodeLength { .. })
        ));
        if x.raw.len() > 1 && x.ty.type_size() > 1 {
            assert!(matches!(
                dequantize_to_vec(x.ty, &x.raw[..x.raw.len() - 1]),
                Err(FormatError::DecodeLength { .. })
            ));
        }
    }
}
