//! End to end: `synapse-cli inspect` and `synapse-cli tensor` on a GGUF written with
//! `GgufWriter` and on a sharded safetensors directory generated here.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use synapse_formats::GgmlType;
use synapse_formats::gguf::{GgufArray, GgufValue, GgufWriter};

fn cli(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_synapse-cli"))
        .args(args)
        .output()
        .expect("run synapse-cli");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn json_of(args: &[&str]) -> Value {
    let (ok, out, err) = cli(args);
    assert!(ok, "{args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn read_f32(p: &Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A GGUF with an F32 [3, 2] tensor, an F16 [4] tensor and one Q8_0 row, plus a long array.
fn write_gguf(path: &Path) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", GgufValue::String("llama".into()))
        .unwrap();
    w.add_metadata("llama.block_count", GgufValue::U32(1))
        .unwrap();
    let toks: Vec<String> = (0..100).map(|i| format!("tok{i}")).collect();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        GgufValue::Array(GgufArray::String(toks.into())),
    )
    .unwrap();
    let a: Vec<f32> = vec![1.0, 2.0, 3.0, -4.0, 5.5, 0.25];
    w.add_tensor(
        "a",
        &[3, 2],
        GgmlType::F32,
        a.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
    .unwrap();
    // f16 bits: 1.0, -2.0, 0.5, 65504
    let h: Vec<u8> = [0x3C00u16, 0xC000, 0x3800, 0x7BFF]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    w.add_tensor("h", &[4], GgmlType::F16, h).unwrap();
    // Q8_0: d = 0.5 (f16 0x3800), q = -16..16
    let mut q = 0x3800u16.to_le_bytes().to_vec();
    q.extend((0..32).map(|i| (i as i8 - 16) as u8));
    w.add_tensor("q", &[32], GgmlType::Q8_0, q).unwrap();
    w.write_file(path).unwrap();
    let qv = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
    (a, vec![1.0, -2.0, 0.5, 65504.0], qv)
}

#[test]
fn gguf_inspect_and_tensor() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("m.gguf");
    let (a, h, q) = write_gguf(&f);
    let fs = f.to_str().unwrap();

    let v = json_of(&["inspect", fs, "--json"]);
    assert_eq!(v["header"]["format"], "gguf");
    assert_eq!(v["header"]["version"], 3);
    assert_eq!(v["metadata"]["general.architecture"], "llama");
    let toks = &v["metadata"]["tokenizer.ggml.tokens"];
    assert_eq!(toks["type"], "array<string>");
    assert_eq!(toks["len"], 100);
    assert_eq!(toks["head"][0], "tok0");
    let ts = v["tensors"].as_array().unwrap();
    assert_eq!(ts.len(), 3);
    assert_eq!(ts[0]["name"], "a");
    assert_eq!(ts[0]["type"], "f32");
    assert_eq!(ts[0]["shape"], json!([3, 2]));
    assert_eq!(ts[0]["bytes"], 24);
    assert_eq!(ts[2]["type"], "q8_0");
    assert_eq!(ts[2]["bytes"], 34);
    assert_eq!(v["histogram"]["f32"]["tensors"], 1);
    assert_eq!(v["histogram"]["q8_0"]["params"], 32);
    assert_eq!(v["total_params"], 6 + 4 + 32);
    assert_eq!(v["total_bytes"], 24 + 8 + 34);

    // The text form mentions the summarized array and the histogram.
    let (ok, text, _) = cli(&["inspect", fs]);
    assert!(ok);
    assert!(text.contains("[string; 100]"), "{text}");
    assert!(text.contains("type histogram"), "{text}");

    for (name, want, shape) in [
        ("a", &a, json!([2, 3])),
        ("h", &h, json!([4])),
        ("q", &q, json!([32])),
    ] {
        let out = d.path().join(format!("{name}.f32"));
        let v = json_of(&["tensor", fs, name, "--out", out.to_str().unwrap(), "--json"]);
        assert_eq!(v["shape"], shape, "{name}: row-major, outermost first");
        assert_eq!(read_f32(&out), *want, "{name}");
    }
    let (ok, _, err) = cli(&["tensor", fs, "nope", "--json"]);
    assert!(!ok && err.contains("nope"), "{err}");
}

fn st_file(tensors: &[(&str, &str, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    let mut h = serde_json::Map::new();
    let mut off = 0;
    let mut data = Vec::new();
    for (n, dt, shape, b) in tensors {
        h.insert(
            (*n).into(),
            json!({"dtype": dt, "shape": shape, "data_offsets": [off, off + b.len()]}),
        );
        off += b.len();
        data.extend_from_slice(b);
    }
    let hb = serde_json::to_vec(&h).unwrap();
    let mut out = (hb.len() as u64).to_le_bytes().to_vec();
    out.extend(hb);
    out.extend(data);
    out
}

#[test]
fn sharded_safetensors_inspect_and_tensor() {
    let d = tempfile::tempdir().unwrap();
    let w: Vec<f32> = (0..6).map(|i| i as f32 * 1.5).collect();
    let wb: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    // bf16 bits for 1.0, -2.0, 0.5
    let nb: Vec<u8> = [0x3F80u16, 0xC000, 0x3F00]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    std::fs::write(
        d.path().join("model-00001-of-00002.safetensors"),
        st_file(&[("layer.weight", "F32", vec![2, 3], wb)]),
    )
    .unwrap();
    std::fs::write(
        d.path().join("model-00002-of-00002.safetensors"),
        st_file(&[
            ("norm.weight", "BF16", vec![3], nb),
            ("ids", "I64", vec![1], 7i64.to_le_bytes().to_vec()),
        ]),
    )
    .unwrap();
    let index = json!({"metadata": {}, "weight_map": {
        "layer.weight": "model-00001-of-00002.safetensors",
        "norm.weight": "model-00002-of-00002.safetensors",
        "ids": "model-00002-of-00002.safetensors"}});
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let ds = d.path().to_str().unwrap();

    let v = json_of(&["inspect", ds, "--json"]);
    assert_eq!(v["header"]["format"], "safetensors");
    assert_eq!(v["header"]["shards"].as_array().unwrap().len(), 2);
    assert_eq!(v["tensors"].as_array().unwrap().len(), 3);
    assert_eq!(v["histogram"]["BF16"]["tensors"], 1);
    assert_eq!(v["total_params"], 6 + 3 + 1);

    for (name, want, shape, ty) in [
        ("layer.weight", w.clone(), json!([2, 3]), "F32"),
        ("norm.weight", vec![1.0, -2.0, 0.5], json!([3]), "BF16"),
        ("ids", vec![7.0], json!([1]), "I64"),
    ] {
        let out = d.path().join("t.f32");
        let v = json_of(&["tensor", ds, name, "--out", out.to_str().unwrap(), "--json"]);
        assert_eq!(v["shape"], shape);
        assert_eq!(v["type"], ty);
        assert_eq!(read_f32(&out), want, "{name}");
    }
    // A missing shard is reported, not a panic.
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    let (ok, _, err) = cli(&["inspect", ds]);
    assert!(
        !ok && err.contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
}
