//! Real-model parity with llama.cpp, bit for bit (fixtures from `cargo xtask parity-fixtures`):
//! for each real model, on every fixture prompt, the prompt tokens (and for chat prompts the
//! text Synapse's chat template renders), every greedy token (64, or up to end of
//! generation), every stored logit of the last prompt position (llama.cpp's top 256; the whole
//! vocabulary for the prompts with a `full_logits_file`) and the top-8 logits after every
//! decode step (the one-row path) must equal llama.cpp's: the same tokens, the same `f32` bits.
//!
//! Why bits and not a tolerance: Synapse reproduces the arithmetic of the llama.cpp build the
//! fixtures come from (llama-cpp-python 0.3.36, x86 AVX-512): ggml's activation quantizers, the
//! per-lane FMA order and horizontal sums of `vec_dot` / llamafile `tinyBLAS`, the tiled K-quant
//! matmul order from 8 rows on, the f32 attention (`vec_dot_f32`, ggml's vector `expf`, chunked
//! f64 softmax sums, the GEMM or vec_dot order for P·V), the f16 GELU table, SwiGLU with ggml's
//! vector `expf`, and the FMA contractions GCC made in RoPE. A deliberate one-ulp change of any
//! of these shows up here (activation quantization amplifies it within a few layers).
//!
//! `SYNAPSE_PARITY_PROMPTS=0,13` runs a subset of the prompts (diagnosis).

mod common;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row, prompt_order};

struct Run {
    last_logits: Vec<f32>,
    greedy: Vec<u32>,
    /// After decode step i: the logits at the fixture's `step_top_ids[i]`.
    steps: Vec<Vec<f32>>,
}

fn greedy(
    exec: &mut Executor,
    kv: &mut KvCache,
    prompt: &[u32],
    n: usize,
    eog: &[u32],
    step_ids: &[Vec<u32>],
) -> Run {
    kv.open(0).unwrap();
    let vocab = exec.model().vocab();
    let chunk = kv.max_chunk();
    let mut pos = 0u32;
    let mut logits = vec![0.0f32; vocab];
    for start in (0..prompt.len()).step_by(chunk) {
        let end = (start + chunk).min(prompt.len());
        let rows: Vec<Row> = (start..end)
            .map(|i| Row {
                slot: 0,
                pos: i as u32,
                token: prompt[i],
                logits: i + 1 == prompt.len(),
                order: prompt_order(i, prompt.len(), chunk),
            })
            .collect();
        pos = end as u32;
        let out = exec.forward(kv, &rows).unwrap();
        if end == prompt.len() {
            logits.copy_from_slice(out);
        }
    }
    let last_logits = logits.clone();
    let (mut out, mut steps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = synapse_runtime::argmax(&logits);
        out.push(t);
        if eog.contains(&t) {
            break;
        }
        let o = exec.forward(kv, &[Row::decode(0, pos, t)]).unwrap();
        logits.copy_from_slice(o);
        if let Some(ids) = step_ids.get(steps.len()) {
            steps.push(ids.iter().map(|&i| logits[i as usize]).collect());
        }
        pos += 1;
    }
    kv.close(0);
    Run {
        last_logits,
        greedy: out,
        steps,
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .unwrap_or_default()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .unwrap_or_default()
}

/// Positions where `ours` and `want` differ in their bits (the first few) and how many.
fn bit_diffs(ours: &[f32], want: &[f32], at: &[u32]) -> (usize, Vec<String>) {
    let mut n = 0;
    let mut first = Vec::new();
    for (k, (&o, &w)) in ours.iter().zip(want).enumerate() {
        if o.to_bits() != w.to_bits() {
            n += 1;
            if first.len() < 3 {
                let id = at.get(k).copied().unwrap_or(k as u32);
                first.push(format!("id {id}: llama.cpp {w:e} synapse {o:e}"));
            }
        }
    }
    (n, first)
}

/// Checks one model against its fixture `fixtures/parity/<stem>.json`.
fn check(stem: &str, model_path: &Path) {
    let fx = common::workspace_root().join(format!("fixtures/parity/{stem}.json"));
    if !common::require(&fx, "parity fixture") || !common::require(model_path, "model") {
        return;
    }
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&fx).unwrap()).unwrap();
    let model = Arc::new(Model::load(model_path).unwrap());
    let gguf = synapse_formats::gguf::GgufFile::open(model_path).unwrap();
    let tok = synapse_tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let template = synapse_tokenizer::ChatTemplate::from_tokenizer(&tok).ok();
    let n_ctx = doc["settings"]["n_ctx"].as_u64().unwrap() as usize;
    let n_batch = doc["settings"]["n_batch"].as_u64().unwrap() as usize;
    let n_gen = doc["settings"]["n_gen"].as_u64().unwrap() as usize;
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, n_ctx, n_batch).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let eog = model.ir.special.eos.clone();

    let prompts = doc["prompts"].as_array().unwrap();
    let only: Option<Vec<usize>> = std::env::var("SYNAPSE_PARITY_PROMPTS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect());
    let (mut run_count, mut exact, mut compared) = (0, 0, 0usize);
    let mut failures = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        if only.as_ref().is_some_and(|o| !o.contains(&i)) {
            continue;
        }
        run_count += 1;
        let name = p["name"].as_str().unwrap_or("?");
        let before = failures.len();
        let text = p["text"].as_str().unwrap_or_default();
        // A chat prompt rendered by the model's own template: Synapse's rendering must be the
        // text llama.cpp was given (the built-in Gemma format has no template in the GGUF).
        if let (Some(msgs), Some(t)) = (p["chat_messages"].as_array(), &template) {
            let msgs: Vec<synapse_tokenizer::Message> = msgs
                .iter()
                .map(|m| {
                    synapse_tokenizer::Message::new(
                        m["role"].as_str().unwrap(),
                        m["content"].as_str().unwrap(),
                    )
                })
                .collect();
            let ours = t.render(&msgs, true).unwrap();
            if ours != text {
                failures.push(format!(
                    "[{i} {name}] chat text differs: llama.cpp {text:?} synapse {ours:?}"
                ));
            }
        }
        let want_prompt = ids(&p["prompt_ids"]);
        let special = p["parse_special"].as_bool().unwrap_or(false);
        let ours = tok.encode(text, true, special).unwrap();
        if ours != want_prompt {
            failures.push(format!(
                "[{i} {name}] prompt tokens differ: llama.cpp {want_prompt:?} synapse {ours:?}"
            ));
        }
        let want = ids(&p["greedy_ids"]);
        let step_ids: Vec<Vec<u32>> = p["step_top_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(ids)
            .collect();
        let step_vals: Vec<Vec<f32>> = p["step_top_values"]
            .as_array()
            .unwrap()
            .iter()
            .map(f32s)
            .collect();
        let run = greedy(&mut exec, &mut kv, &want_prompt, n_gen, &eog, &step_ids);
        if run.greedy != want {
            let step = want
                .iter()
                .zip(&run.greedy)
                .position(|(a, b)| a != b)
                .unwrap_or(want.len().min(run.greedy.len()));
            failures.push(format!(
                "[{i} {name}] greedy tokens differ from step {step} (llama.cpp {} tokens, synapse {})",
                want.len(),
                run.greedy.len()
            ));
        }
        // Last-position logits: llama.cpp's top 256, and the whole vocabulary where stored.
        let top_ids = ids(&p["last_logits_top_ids"]);
        let top_vals = f32s(&p["last_logits_top_values"]);
        let ours_top: Vec<f32> = top_ids
            .iter()
            .map(|&id| run.last_logits[id as usize])
            .collect();
        let (n, first) = bit_diffs(&ours_top, &top_vals, &top_ids);
        compared += top_vals.len();
        if n > 0 {
            failures.push(format!(
                "[{i} {name}] {n} of {} top last-position logits differ in bits: {first:?}",
                top_vals.len()
            ));
        }
        if let Some(f) = p["full_logits_file"].as_str() {
            let bytes = std::fs::read(fx.with_file_name(f)).unwrap();
            let full: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(full.len(), run.last_logits.len(), "{f}: vocabulary size");
            let (n, first) = bit_diffs(&run.last_logits, &full, &[]);
            compared += full.len();
            if n > 0 {
                failures.push(format!(
                    "[{i} {name}] {n} of {} last-position logits ({f}) differ in bits: {first:?}",
                    full.len()
                ));
            }
        }
        // Decode steps (as far as the greedy tokens agree, so the inputs are the same).
        if run.steps.len() != step_vals.len() && run.greedy == want {
            failures.push(format!(
                "[{i} {name}] {} decode steps, the fixture has {}",
                run.steps.len(),
                step_vals.len()
            ));
        }
        for (s, (ours, want)) in run.steps.iter().zip(&step_vals).enumerate() {
            compared += want.len();
            let (n, first) = bit_diffs(ours, want, &step_ids[s]);
            if n > 0 {
                failures.push(format!(
                    "[{i} {name}] decode step {s}: {n} of {} top logits differ in bits: {first:?}",
                    want.len()
                ));
                break;
            }
        }
        let ok = failures.len() == before;
        exact += ok as usize;
        eprintln!(
            "[{i:2} {name:22}] prompt {:4} tok, {:2} greedy tokens, {} decode steps: {}",
            want_prompt.len(),
            run.greedy.len(),
            run.steps.len(),
            if ok { "bit-identical" } else { "DIFFERS" }
        );
    }
    eprintln!(
        "{stem}: {exact}/{run_count} prompts bit-identical to llama.cpp ({compared} logits compared)"
    );
    assert!(failures.is_empty(), "{failures:#?}");
    if only.is_none() {
        assert!(
            run_count >= 16,
            "{stem}: only {run_count} prompts in the fixture"
        );
    }
}

#[test]
fn gemma3_270m_matches_llama_cpp() {
    check("gemma3-270m-q4_k_m", &common::default_model());
}

#[test]
fn qwen25_coder_05b_instruct_matches_llama_cpp() {
    check(
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
        &common::known_model("qwen2.5-coder-0.5b-instruct"),
    );
}

#[test]
fn smollm2_135m_instruct_matches_llama_cpp() {
    check(
        "smollm2-135m-instruct-q4_1",
        &common::known_model("smollm2-135m-instruct"),
    );
}
