//! Hostile safetensors files and sharded checkpoints: a typed error every time, never a panic.

use proptest::prelude::*;
use serde_json::json;
use synapse_formats::FormatError;
use synapse_formats::safetensors::{SafetensorsFile, SafetensorsModel};

/// A file from a raw header string and data section.
fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn header_err(b: Vec<u8>) -> String {
    match SafetensorsFile::from_bytes(b) {
        Err(FormatError::SafetensorsHeader { reason, .. }) => reason,
        other => panic!("expected a header error, got {other:?}"),
    }
}

fn valid() -> Vec<u8> {
    let h = json!({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]},
        "__metadata__": {"format": "pt"}
    });
    raw(&h.to_string(), &[7u8; 16])
}

#[test]
fn truncated_at_every_byte() {
    let b = valid();
    assert!(SafetensorsFile::from_bytes(b.clone()).is_ok());
    for n in 0..b.len() {
        assert!(
            SafetensorsFile::from_bytes(b[..n].to_vec()).is_err(),
            "len {n}"
        );
    }
}

#[test]
fn bad_header_lengths() {
    for n in [u64::MAX, 1 << 40, 100_000_001, 1000] {
        let mut b = n.to_le_bytes().to_vec();
        b.extend_from_slice(b"{}");
        header_err(b);
    }
    header_err(vec![1, 2, 3]);
    // Not JSON, not an object, not UTF-8.
    header_err(raw("{not json", b""));
    header_err(raw("[1, 2]", b""));
    header_err(raw(" {}", b""));
    let mut b = raw("{\"\u{e9}\": 1}", b"");
    b[10] = 0xff;
    header_err(b);
}

#[test]
fn bad_entries() {
    let e = |v: serde_json::Value, data: usize| header_err(raw(&v.to_string(), &vec![0u8; data]));
    // Out of range, reversed and overflowing offsets.
    e(
        json!({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}),
        8,
    );
    e(
        json!({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}),
        8,
    );
    e(
        json!({"a": {"dtype": "U8", "shape": [1], "data_offsets": [u64::MAX, u64::MAX]}}),
        8,
    );
    // Overlap, hole, trailing bytes.
    e(
        json!({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
             "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}),
        6,
    );
    e(
        json!({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
             "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}),
        6,
    );
    e(
        json!({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}),
        6,
    );
    // dtype/shape/size mismatch, and shapes whose byte size overflows.
    e(
        json!({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}),
        8,
    );
    e(
        json!({"a": {"dtype": "F64", "shape": [1u64 << 62, 4], "data_offsets": [0, 8]}}),
        8,
    );
    e(
        json!({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}),
        4,
    );
    e(
        json!({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}),
        4,
    );
    // Missing fields, wrong kinds.
    e(json!({"a": {"shape": [1], "data_offsets": [0, 4]}}), 4);
    e(json!({"a": {"dtype": "F32", "data_offsets": [0, 4]}}), 4);
    e(json!({"a": {"dtype": "F32", "shape": [1]}}), 4);
    e(
        json!({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}),
        4,
    );
    e(json!({"a": 5}), 0);
    e(json!({"__metadata__": {"k": 1}}), 0);
    e(json!({"__metadata__": [1]}), 0);
    // Unknown dtype names the tensor.
    let h = json!({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}});
    match SafetensorsFile::from_bytes(raw(&h.to_string(), &[0])) {
        Err(FormatError::UnknownDtype { tensor, dtype }) => {
            assert_eq!((tensor.as_str(), dtype.as_str()), ("w", "F4"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn deeply_nested_json_is_an_error_not_a_stack_overflow() {
    let h = format!("{{\"a\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    header_err(raw(&h, b""));
}

#[test]
fn hostile_indexes() {
    let d = tempfile::tempdir().unwrap();
    let idx = d.path().join("model.safetensors.index.json");
    let open = |text: &str| {
        std::fs::write(&idx, text).unwrap();
        SafetensorsModel::open(d.path())
    };
    assert!(matches!(open("{bad"), Err(FormatError::BadIndex { .. })));
    assert!(matches!(open("{}"), Err(FormatError::BadIndex { .. })));
    assert!(matches!(
        open(r#"{"weight_map": {"a": 1}}"#),
        Err(FormatError::BadIndex { .. })
    ));
    for escape in [
        "../x.safetensors",
        "/etc/passwd",
        "sub/x.safetensors",
        ".",
        "",
    ] {
        let text = json!({"weight_map": {"a": escape}}).to_string();
        assert!(
            matches!(open(&text), Err(FormatError::BadIndex { .. })),
            "{escape}"
        );
    }
    assert!(matches!(
        open(r#"{"weight_map": {"a": "gone.safetensors"}}"#),
        Err(FormatError::MissingShard { .. })
    ));
    // The shard exists but lacks the tensor the map assigns to it.
    std::fs::write(d.path().join("s.safetensors"), valid()).unwrap();
    assert!(matches!(
        open(r#"{"weight_map": {"a": "s.safetensors", "zzz": "s.safetensors"}}"#),
        Err(FormatError::BadIndex { .. })
    ));
    let m = open(r#"{"weight_map": {"a": "s.safetensors", "b": "s.safetensors"}}"#).unwrap();
    assert_eq!(m.len(), 2);
    // A corrupt shard surfaces its own header error.
    std::fs::write(d.path().join("s.safetensors"), &valid()[..20]).unwrap();
    assert!(matches!(
        open(r#"{"weight_map": {"a": "s.safetensors"}}"#),
        Err(FormatError::SafetensorsHeader { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn random_mutations_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut b = valid();
        for (i, v) in edits {
            let k = i.index(b.len());
            b[k] = v;
        }
        if let Ok(f) = SafetensorsFile::from_bytes(b) {
            for e in f.entries() {
                prop_assert_eq!(f.data(e).len() as u64, e.n_bytes);
            }
        }
    }
}

/// The fuzz seed corpus (fuzz/corpus/safetensors) holds valid files: they must keep opening.
#[test]
fn fuzz_seed_corpus_opens() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/safetensors");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        SafetensorsFile::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        n += 1;
    }
    assert!(n >= 4, "{n} seeds in {}", dir.display());
}
