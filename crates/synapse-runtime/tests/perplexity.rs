//! Perplexity as llama.cpp computes it, against llama.cpp itself: Gemma 3 270M on the first
//! chunks of the held-out evaluation text (`fixtures/perplexity`, made by `cargo xtask
//! perplexity-fixtures` from `cargo xtask text-corpus`'s text): the same tokens (when the local
//! corpus is the fixture's Debian version), and every chunk's running perplexity over the
//! tokens llama.cpp scored within 1e-7 relative (the logits are llama.cpp's bit for bit; what
//! remains is numpy's `exp` against libm's `expf` in the log-softmax, ~2e-9).

mod common;

use std::sync::Arc;

use serde_json::Value;
use synapse_runtime::perplexity::{PerplexityParams, log_softmax, perplexity};
use synapse_runtime::{Executor, Model};

#[test]
fn gemma_perplexity_on_held_out_text_matches_llama_cpp() {
    let fx = common::workspace_root().join("fixtures/perplexity/gemma-3-270m-q4_k_m.json");
    let text_dir = synapse_testdata::text_corpus_dir();
    let model_path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    if !common::require(&fx, "perplexity fixture")
        || !common::require(&text_dir.join("manifest.json"), "calibration text corpus")
        || !common::require(&model_path, "model")
    {
        return;
    }
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&fx).unwrap()).unwrap();
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(text_dir.join("manifest.json")).unwrap())
            .unwrap();
    let model = Arc::new(Model::load(&model_path).unwrap());
    let gguf = synapse_formats::gguf::GgufFile::open(&model_path).unwrap();
    let tok = synapse_tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let ctx = doc["ctx"].as_u64().unwrap() as usize;
    let chunks = doc["chunks"].as_u64().unwrap() as usize;
    // The tokens llama.cpp scored: the perplexity is compared on them whatever text the
    // registry serves today.
    let want_ids: Vec<u32> = doc["chunk_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(want_ids.len(), ctx * chunks);
    // The text they came from: Debian updates `python3.11-doc` (the fixture's is named in its
    // `text`); when the local corpus is that same text, its tokenization must be llama.cpp's.
    if doc["text_blake3"] == manifest["evaluation"]["blake3"] {
        let text = std::fs::read_to_string(text_dir.join("evaluation.txt")).unwrap();
        let tokens = tok.encode(&text, true, false).unwrap();
        assert_eq!(tokens.len() as u64, doc["text_tokens"].as_u64().unwrap());
        assert_eq!(
            &tokens[..ctx * chunks],
            &want_ids[..],
            "tokenization differs"
        );
    } else {
        eprintln!(
            "the local corpus ({}) is not the fixture's text ({}): tokenization not compared \
             here (cargo xtask perplexity-fixtures remakes the fixture); perplexity compared on \
             the fixture's tokens",
            manifest["evaluation"]["blake3"], doc["text"]
        );
    }
    let tokens = want_ids;
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let p = PerplexityParams {
        ctx,
        batch: ctx,
        max_chunks: Some(chunks),
        bos: doc["add_bos"]
            .as_bool()
            .unwrap()
            .then(|| tok.bos().unwrap()),
    };
    let r = perplexity(&mut exec, &tokens, &p, |_, _| {}).unwrap();
    assert_eq!(r.count as u64, doc["count"].as_u64().unwrap());
    let want: Vec<f64> = doc["running_ppl"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(r.running.len(), want.len());
    for (i, (g, w)) in r.running.iter().zip(&want).enumerate() {
        let rel = (g - w).abs() / w;
        assert!(
            rel < 1e-7,
            "chunk {}: {g} vs llama.cpp {w} ({rel:.2e})",
            i + 1
        );
    }
    eprintln!(
        "perplexity over {} held-out tokens: {:.6} (llama.cpp {:.6})",
        r.count,
        r.ppl,
        doc["ppl"].as_f64().unwrap()
    );
}

#[test]
fn a_text_shorter_than_two_chunks_is_refused() {
    let dir = common::workspace_root().join("fixtures/tiny/llama");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let p = PerplexityParams {
        ctx: 32,
        batch: 32,
        max_chunks: None,
        bos: None,
    };
    let err = perplexity(&mut exec, &[5; 63], &p, |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("at least 64"), "{err}");
    // Two chunks: runs, scores 15 tokens each.
    let toks: Vec<u32> = (0..64).map(|i| 1 + (i * 37) % 400).collect();
    let r = perplexity(&mut exec, &toks, &p, |_, _| {}).unwrap();
    assert_eq!(r.count, 2 * 15);
    assert!(r.ppl.is_finite() && r.ppl > 1.0);
    // The log-softmax of a uniform row is -ln(n).
    assert!((log_softmax(&[0.5; 8], 3) + (8f64).ln()).abs() < 1e-12);
}
