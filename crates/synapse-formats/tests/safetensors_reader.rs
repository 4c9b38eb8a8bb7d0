//! The safetensors reader on files built here: every dtype, shapes, metadata, sharded
//! directories, and `decode_to_f32`.

use std::path::Path;

use serde_json::json;
use synapse_formats::FormatError;
use synapse_formats::safetensors::{Dtype, SafetensorsFile, SafetensorsModel};

/// (name, dtype, shape, bytes) of one tensor to write.
type Entry<'a> = (&'a str, Dtype, Vec<u64>, Vec<u8>);

/// Serializes tensors (name, dtype, shape, bytes) as safetensors, in the given order.
pub fn build(
    tensors: &[(&str, Dtype, Vec<u64>, Vec<u8>)],
    metadata: Option<serde_json::Value>,
) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if let Some(m) = metadata {
        header.insert("__metadata__".into(), m);
    }
    let mut off = 0usize;
    let mut data = Vec::new();
    for (name, dt, shape, bytes) in tensors {
        header.insert(
            (*name).into(),
            json!({"dtype": dt.as_str(), "shape": shape, "data_offsets": [off, off + bytes.len()]}),
        );
        off += bytes.len();
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn every_dtype_reads_and_decodes() {
    let h = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let bf = |v: f32| half::bf16::from_f32(v).to_le_bytes();
    let cases: Vec<(&str, Dtype, Vec<u8>, Vec<f32>)> = vec![
        (
            "f64",
            Dtype::F64,
            [1.5f64, -2.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            vec![1.5, -2.0],
        ),
        (
            "f32",
            Dtype::F32,
            f32_bytes(&[0.25, -8.0]),
            vec![0.25, -8.0],
        ),
        (
            "f16",
            Dtype::F16,
            [h(0.5), h(-3.0)].concat(),
            vec![0.5, -3.0],
        ),
        (
            "bf16",
            Dtype::BF16,
            [bf(2.0), bf(-0.125)].concat(),
            vec![2.0, -0.125],
        ),
        // E4M3FN: 0x38 = 1.0, 0xC0 = -2.0; E5M2: 0x3C = 1.0, 0xC0 = -2.0.
        ("e4m3", Dtype::F8_E4M3, vec![0x38, 0xC0], vec![1.0, -2.0]),
        ("e5m2", Dtype::F8_E5M2, vec![0x3C, 0xC0], vec![1.0, -2.0]),
        ("i8", Dtype::I8, vec![0x80, 0x7f], vec![-128.0, 127.0]),
        (
            "i16",
            Dtype::I16,
            [(-300i16).to_le_bytes(), 7i16.to_le_bytes()].concat(),
            vec![-300.0, 7.0],
        ),
        (
            "i32",
            Dtype::I32,
            [(-5i32).to_le_bytes(), 1i32.to_le_bytes()].concat(),
            vec![-5.0, 1.0],
        ),
        (
            "i64",
            Dtype::I64,
            [(-9i64).to_le_bytes(), 3i64.to_le_bytes()].concat(),
            vec![-9.0, 3.0],
        ),
        ("u8", Dtype::U8, vec![0, 255], vec![0.0, 255.0]),
        (
            "u16",
            Dtype::U16,
            [0u16.to_le_bytes(), 65535u16.to_le_bytes()].concat(),
            vec![0.0, 65535.0],
        ),
        (
            "u32",
            Dtype::U32,
            [1u32.to_le_bytes(), 70000u32.to_le_bytes()].concat(),
            vec![1.0, 70000.0],
        ),
        (
            "u64",
            Dtype::U64,
            [2u64.to_le_bytes(), (1u64 << 40).to_le_bytes()].concat(),
            vec![2.0, (1u64 << 40) as f32],
        ),
        ("bool", Dtype::BOOL, vec![0, 1], vec![0.0, 1.0]),
    ];
    let tensors: Vec<_> = cases
        .iter()
        .map(|(n, d, b, _)| (*n, *d, vec![2u64], b.clone()))
        .collect();
    let f = SafetensorsFile::from_bytes(build(&tensors, Some(json!({"format": "pt"})))).unwrap();
    assert_eq!(f.metadata().get("format").map(String::as_str), Some("pt"));
    let m = SafetensorsModel::from_file(f);
    assert_eq!(m.len(), cases.len());
    for (name, dt, bytes, want) in &cases {
        let t = m.tensor(name).unwrap();
        assert_eq!(t.dtype, *dt);
        assert_eq!(t.shape, &[2]);
        assert_eq!(t.bytes, &bytes[..]);
        let mut out = vec![0f32; 2];
        t.dtype.decode_to_f32(t.bytes, &mut out).unwrap();
        assert_eq!(&out, want, "{name}");
        assert!(matches!(
            t.dtype.decode_to_f32(t.bytes, &mut [0f32; 3]),
            Err(FormatError::DtypeLength { .. })
        ));
    }
    // File order is data-offset order.
    let names: Vec<_> = m.tensors().map(|t| t.name.to_string()).collect();
    assert_eq!(names[0], "f64");
    assert_eq!(names.last().map(String::as_str), Some("bool"));
}

/// Writes a sharded checkpoint: `n` shards, tensors spread round-robin, plus the index.
pub fn write_sharded(dir: &Path, tensors: &[(&str, Vec<u64>, Vec<f32>)], n: usize) {
    let mut map = serde_json::Map::new();
    let mut shards: Vec<Vec<Entry>> = vec![Vec::new(); n];
    for (i, (name, shape, vals)) in tensors.iter().enumerate() {
        let k = i % n;
        let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, n);
        map.insert((*name).into(), json!(file));
        shards[k].push((name, Dtype::F32, shape.clone(), f32_bytes(vals)));
    }
    for (k, s) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, n);
        std::fs::write(dir.join(file), build(s, None)).unwrap();
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn sharded_directory() {
    let d = tempfile::tempdir().unwrap();
    let tensors: Vec<(&str, Vec<u64>, Vec<f32>)> = vec![
        (
            "model.embed_tokens.weight",
            vec![4, 3],
            (0..12).map(|x| x as f32).collect(),
        ),
        ("model.norm.weight", vec![3], vec![1.0, 2.0, 3.0]),
        (
            "lm_head.weight",
            vec![4, 3],
            (0..12).map(|x| -(x as f32)).collect(),
        ),
    ];
    write_sharded(d.path(), &tensors, 2);
    for p in [
        d.path().to_path_buf(),
        d.path().join("model.safetensors.index.json"),
    ] {
        let m = SafetensorsModel::open(&p).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m.shards().len(), 2);
        for (name, shape, vals) in &tensors {
            let t = m.tensor(name).unwrap();
            assert_eq!(t.shape, &shape[..]);
            assert_eq!(t.bytes, &f32_bytes(vals)[..]);
        }
    }
    // A missing shard is a typed error naming it.
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    match SafetensorsModel::open(d.path()) {
        Err(FormatError::MissingShard { shard, .. }) => {
            assert_eq!(shard, "model-00002-of-00002.safetensors")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn single_file_directory_and_missing_files() {
    let d = tempfile::tempdir().unwrap();
    assert!(matches!(
        SafetensorsModel::open(d.path()),
        Err(FormatError::NotAModel { .. })
    ));
    let b = build(&[("x", Dtype::F32, vec![1], f32_bytes(&[4.0]))], None);
    std::fs::write(d.path().join("model.safetensors"), b).unwrap();
    let m = SafetensorsModel::open(d.path()).unwrap();
    assert_eq!(m.tensor("x").unwrap().bytes, &4.0f32.to_le_bytes());
    assert!(matches!(
        SafetensorsModel::open(&d.path().join("nope.safetensors")),
        Err(FormatError::Io { .. })
    ));
}
