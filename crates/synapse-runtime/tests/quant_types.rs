//! Every ggml weight type no real parity model holds, end to end against llama.cpp (fixtures
//! from `cargo xtask quant-models`): one llama-architecture model of 256-wide rows quantized by
//! llama.cpp to Q4_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, BF16, F16 and the i-quant grids
//! IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (every matrix, the embeddings and the
//! head in the one type). Synapse's logits at every position of three
//! sequences (one batch each: the many-row orders) and after each of 8 decode steps on
//! llama.cpp's greedy tokens (the one-row order) must be llama.cpp's, bit for bit, and its greedy
//! tokens the same.

mod common;

use std::sync::Arc;

use serde_json::Value;
use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row};

fn check(stem: &str) {
    let dir = common::workspace_root().join("fixtures/quant");
    if !common::require(&dir.join("oracle.json"), "quant-model fixture") {
        return;
    }
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    let t = &doc["types"][stem];
    let seqs: Vec<Vec<u32>> = serde_json::from_value(doc["sequences"].clone()).unwrap();
    let greedy: Vec<Vec<u32>> = serde_json::from_value(t["greedy"].clone()).unwrap();
    let n_vocab = t["n_vocab"].as_u64().unwrap() as usize;
    let want: Vec<f32> = std::fs::read(dir.join(t["logits"].as_str().unwrap()))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let model = Arc::new(Model::load(&dir.join(t["file"].as_str().unwrap())).unwrap());
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let mut ours = Vec::with_capacity(want.len());
    let mut our_greedy = Vec::new();
    for (s, g) in seqs.iter().zip(&greedy) {
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 128, 64).unwrap();
        kv.open(0).unwrap();
        ours.extend_from_slice(exec.forward(&mut kv, &common::all_logit_rows(s)).unwrap());
        let mut toks = vec![synapse_runtime::argmax(&ours[ours.len() - n_vocab..])];
        for (k, &tok) in g.iter().enumerate() {
            // llama.cpp's token, so the inputs stay the same even where the argmax differs.
            let o = exec
                .forward(&mut kv, &[Row::decode(0, (s.len() + k) as u32, tok)])
                .unwrap();
            ours.extend_from_slice(o);
            if k + 1 < g.len() {
                toks.push(synapse_runtime::argmax(o));
            }
        }
        our_greedy.push(toks);
    }
    assert_eq!(ours.len(), want.len(), "{stem}: logit rows");
    let rows_differ: Vec<usize> = (0..want.len() / n_vocab)
        .filter(|&r| {
            let (a, b) = (
                &ours[r * n_vocab..][..n_vocab],
                &want[r * n_vocab..][..n_vocab],
            );
            a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits())
        })
        .collect();
    let max_abs = ours
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!(
        "{stem:7} ({}): {} of {} logit rows differ in bits (max |Δ| {max_abs:e}); greedy {}",
        t["ggml_type"].as_str().unwrap_or("?"),
        rows_differ.len(),
        want.len() / n_vocab,
        if our_greedy == greedy {
            "equal"
        } else {
            "DIFFERS"
        }
    );
    assert!(
        rows_differ.is_empty(),
        "{stem}: rows {rows_differ:?} differ from llama.cpp's"
    );
    assert_eq!(our_greedy, greedy, "{stem}: greedy tokens");
}

#[test]
fn q4_0_matches_llama_cpp() {
    check("q4_0");
}

#[test]
fn q5_1_matches_llama_cpp() {
    check("q5_1");
}

#[test]
fn q2_k_matches_llama_cpp() {
    check("q2_k");
}

#[test]
fn q3_k_matches_llama_cpp() {
    check("q3_k");
}

#[test]
fn q5_k_matches_llama_cpp() {
    check("q5_k");
}

#[test]
fn iq4_nl_matches_llama_cpp() {
    check("iq4_nl");
}

#[test]
fn iq4_xs_matches_llama_cpp() {
    check("iq4_xs");
}

/// BF16 (every matrix, the embeddings and the head): ggml's order, activations rounded to
/// bf16, `vdpbf16ps` sums (emulated exactly where the CPU lacks the instruction).
#[test]
fn bf16_matches_llama_cpp() {
    check("bf16");
}

/// F16 (every matrix, the embeddings and the head): activations rounded to f16, `vec_dot_f16`
/// for one row and tinyBLAS's order for a batch (the register tiles).
#[test]
fn f16_matches_llama_cpp() {
    check("f16");
}

/// The i-quant grids (quantized by llama.cpp with a seeded importance matrix): `vec_dot`'s
/// orders for the decode steps, the tiled matmul's for the batches.
#[test]
fn iq2_xxs_matches_llama_cpp() {
    check("iq2_xxs");
}

#[test]
fn iq2_xs_matches_llama_cpp() {
    check("iq2_xs");
}

#[test]
fn iq2_s_matches_llama_cpp() {
    check("iq2_s");
}

#[test]
fn iq3_xxs_matches_llama_cpp() {
    check("iq3_xxs");
}

#[test]
fn iq3_s_matches_llama_cpp() {
    check("iq3_s");
}

#[test]
fn iq1_s_matches_llama_cpp() {
    check("iq1_s");
}

#[test]
fn iq1_m_matches_llama_cpp() {
    check("iq1_m");
}
