//! Reads every tensor of the default real model (Gemma 3 270M Q4_K_M) from the user cache,
//! where `synapse-cli fetch-model` (and `.ci/fetch-test-data`) puts it.
//!
//! Absent file: the test prints why and passes, unless `CI` is set, where it fails
//! (`synapse_testdata::require`).

use std::collections::BTreeMap;

use synapse_formats::GgmlType;
use synapse_formats::gguf::{GgufFile, TensorType};

fn open_or_skip() -> Option<GgufFile> {
    let path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    synapse_testdata::require(&path, "the default model (Gemma 3 270M Q4_K_M)")
        .then(|| GgufFile::open(&path).expect("the real model must open"))
}

#[test]
fn real_gemma3_all_tensors() {
    let Some(f) = open_or_skip() else { return };
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture(), Some("gemma3"));
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.file_len(), 253_113_024);
    assert_eq!(f.tensors().len(), 236);

    let mut hist: BTreeMap<GgmlType, usize> = BTreeMap::new();
    let mut params = 0u64;
    for t in f.tensors() {
        let TensorType::Ggml(g) = t.ty else {
            panic!("{}: fork type {:?} in a gemma3 file", t.name, t.ty)
        };
        *hist.entry(g).or_default() += 1;
        assert!(t.offset >= f.data_start() && t.offset + t.n_bytes <= f.file_len());
        assert_eq!(t.offset % f.alignment(), 0, "{}", t.name);
        assert_eq!(Some(t.n_bytes), g.bytes_for(t.n_elements()), "{}", t.name);
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(f.tensor(&t.name), Some(t));
        params += t.n_elements();
    }
    let want: BTreeMap<GgmlType, usize> = [
        (GgmlType::Q8_0, 10),
        (GgmlType::Q5_0, 81),
        (GgmlType::Q4_K, 27),
        (GgmlType::Q6_K, 9),
        (GgmlType::F32, 109),
    ]
    .into_iter()
    .collect();
    assert_eq!(hist, want);
    assert!(params > 260_000_000 && params < 280_000_000, "{params}");

    // Shapes that the model card states (ggml order: ne0 first).
    let emb = f.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(emb.dims, vec![640, 262_144]);
    assert_eq!(emb.ty, TensorType::Ggml(GgmlType::Q8_0));
    assert_eq!(
        f.get("gemma3.block_count").and_then(|v| v.as_u64()),
        Some(18)
    );
    assert_eq!(
        f.get("gemma3.embedding_length").and_then(|v| v.as_u64()),
        Some(640)
    );
    let tokens = f
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_strings())
        .expect("token list");
    assert_eq!(tokens.len(), 262_144);
    let scores = f.get("tokenizer.ggml.scores").and_then(|v| v.as_f32s());
    assert_eq!(scores.map(<[f32]>::len), Some(262_144));
}
