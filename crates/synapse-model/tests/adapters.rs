//! Family adapters on synthetic sources (no files) and on the real default model when present.

use std::collections::HashMap;

use synapse_formats::GgmlType;
use synapse_model::{
    Family, MetaValue, ModelError, RopeStyle, SourceDesc, SourceKind, SourceTensor, build_ir,
};

fn t(name: &str, shape: &[u64], ty: GgmlType) -> SourceTensor {
    SourceTensor {
        name: name.into(),
        shape: shape.to_vec(),
        encoding: ty,
        file: 0,
        offset: 0,
        n_bytes: 0,
    }
}

/// A tiny GGUF-style Llama: hidden 8, 2 heads (1 KV head), FFN 16, 2 layers, vocab 10.
fn tiny_llama_gguf() -> SourceDesc {
    let mut meta = HashMap::new();
    for (k, v) in [
        ("llama.block_count", 2),
        ("llama.embedding_length", 8),
        ("llama.feed_forward_length", 16),
        ("llama.attention.head_count", 2),
        ("llama.attention.head_count_kv", 1),
        ("tokenizer.ggml.eos_token_id", 2),
        ("tokenizer.ggml.bos_token_id", 1),
    ] {
        meta.insert(k.to_string(), MetaValue::Int(v));
    }
    let mut tensors = vec![
        t("token_embd.weight", &[10, 8], GgmlType::F32),
        t("output_norm.weight", &[8], GgmlType::F32),
    ];
    for l in 0..2 {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        tensors.extend([
            t(&n("attn_norm"), &[8], GgmlType::F32),
            t(&n("attn_q"), &[8, 8], GgmlType::F32),
            t(&n("attn_k"), &[4, 8], GgmlType::F32),
            t(&n("attn_v"), &[4, 8], GgmlType::F32),
            t(&n("attn_output"), &[8, 8], GgmlType::F32),
            t(&n("ffn_norm"), &[8], GgmlType::F32),
            t(&n("ffn_gate"), &[16, 8], GgmlType::F32),
            t(&n("ffn_up"), &[16, 8], GgmlType::F32),
            t(&n("ffn_down"), &[8, 16], GgmlType::F32),
        ]);
    }
    SourceDesc {
        kind: SourceKind::Gguf,
        arch: "llama".into(),
        meta,
        tensors,
        eog_tokens: vec![],
    }
}

#[test]
fn tiny_llama_builds_with_tied_head_and_interleaved_rope() {
    let ir = build_ir(&tiny_llama_gguf()).unwrap();
    assert_eq!(ir.family, Family::Llama);
    assert_eq!(ir.layers.len(), 2);
    assert!(ir.lm_head.tied);
    assert_eq!(ir.aliases.len(), 1);
    assert_eq!(ir.layers[0].attention.rope.style, RopeStyle::Interleaved);
    assert_eq!(ir.layers[0].attention.head_dim, 4);
    assert_eq!(ir.special.eos, vec![2]);
    assert_eq!(ir.fingerprint, ir.compute_fingerprint());
    // Serde round trip keeps the fingerprint.
    let json = serde_json::to_string(&ir).unwrap();
    let back: synapse_model::ModelIr = serde_json::from_str(&json).unwrap();
    assert_eq!(back.compute_fingerprint(), ir.fingerprint);
}

#[test]
fn unknown_architecture_is_a_typed_error() {
    let mut s = tiny_llama_gguf();
    s.arch = "mamba".into();
    assert!(matches!(
        build_ir(&s),
        Err(ModelError::UnsupportedArchitecture { .. })
    ));
}

#[test]
fn unused_tensor_is_refused_before_generation() {
    let mut s = tiny_llama_gguf();
    s.tensors
        .push(t("blk.0.mystery.weight", &[8], GgmlType::F32));
    assert!(matches!(
        build_ir(&s),
        Err(ModelError::UnexpectedTensor { .. })
    ));
}

#[test]
fn wrong_shape_is_refused() {
    let mut s = tiny_llama_gguf();
    s.tensors[2].shape = vec![8, 7];
    s.tensors[3].shape = vec![9, 8];
    assert!(matches!(
        build_ir(&s),
        Err(ModelError::ShapeMismatch { .. })
    ));
}

#[test]
fn quantized_norm_is_refused() {
    let mut s = tiny_llama_gguf();
    s.tensors[1].encoding = GgmlType::Q8_0;
    assert!(matches!(
        build_ir(&s),
        Err(ModelError::UnsupportedEncoding { .. })
    ));
}

#[test]
fn fingerprint_changes_with_content() {
    let a = build_ir(&tiny_llama_gguf()).unwrap();
    let mut s = tiny_llama_gguf();
    s.meta
        .insert("llama.rope.freq_base".into(), MetaValue::Float(500000.0));
    let b = build_ir(&s).unwrap();
    assert_ne!(a.fingerprint, b.fingerprint);
}

#[test]
fn gemma3_270m_ir() {
    let path = synapse_testdata::default_model();
    if !synapse_testdata::require(&path, "the default model") {
        return;
    }
    let f = synapse_formats::gguf::GgufFile::open(&path).unwrap();
    let ir = build_ir(&SourceDesc::from_gguf(&f).unwrap()).unwrap();
    assert_eq!(ir.family, Family::Gemma3);
    assert_eq!(ir.hparams.n_layers, 18);
    assert_eq!(ir.hparams.hidden, 640);
    assert_eq!(ir.hparams.vocab_size, 262_144);
    assert_eq!(ir.weights.len(), 236);
    assert!(ir.lm_head.tied);
    let globals: Vec<u32> = ir
        .layers
        .iter()
        .filter(|l| l.attention.window.is_none())
        .map(|l| l.index)
        .collect();
    assert_eq!(globals, vec![5, 11, 17]);
    for l in &ir.layers {
        let a = &l.attention;
        assert_eq!((a.n_heads, a.n_kv_heads, a.head_dim), (4, 1, 256));
        assert_eq!(a.rope.style, RopeStyle::Neox);
        match a.window {
            Some(w) => {
                assert_eq!(w, 512);
                assert_eq!(a.rope.base, 10_000.0);
            }
            None => assert_eq!(a.rope.base, 1_000_000.0),
        }
        assert_eq!(a.scale, 1.0 / 16.0);
        assert_eq!(a.norm.weight_offset, 0.0);
    }
    assert_eq!(ir.embedding.scale, 640f32.sqrt());
    // EOS 1 and <end_of_turn> 106.
    assert!(ir.special.eos.contains(&1) && ir.special.eos.contains(&106));
    assert_eq!(ir.special.bos, Some(2));
}
