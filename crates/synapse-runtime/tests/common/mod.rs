//! Shared helpers of the runtime's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Test data: `require` (skip locally, fail under `CI`), `default_model` (`$SYNAPSE_MODEL`, else
/// the cached Gemma 3 270M) and `known_model` (a published model's cache path), from
/// `synapse-testdata`. (Not every test binary uses each.)
#[allow(unused_imports)]
pub use synapse_testdata::{default_model, model as known_model, require};

/// The token sequences of a tiny-model fixture (`oracle.json`'s `sequences`).
pub use synapse_testdata::tiny_sequences;

/// One prefill pass over `seq` in slot 0 from position 0, logits for every row.
pub fn all_logit_rows(seq: &[u32]) -> Vec<synapse_runtime::Row> {
    seq.iter()
        .enumerate()
        .map(|(i, &t)| synapse_runtime::Row {
            slot: 0,
            pos: i as u32,
            token: t,
            logits: true,
            order: synapse_runtime::OrderClass::of(seq.len()),
        })
        .collect()
}

/// One prefill pass over `prompt` in slot 0 from position 0, logits for the last row only,
/// in 64-row ubatches' orders.
#[allow(dead_code)]
pub fn prompt_rows(prompt: &[u32]) -> Vec<synapse_runtime::Row> {
    prompt
        .iter()
        .enumerate()
        .map(|(i, &t)| synapse_runtime::Row {
            slot: 0,
            pos: i as u32,
            token: t,
            logits: i + 1 == prompt.len(),
            order: synapse_runtime::prompt_order(i, prompt.len(), 64),
        })
        .collect()
}

/// Logits of every position of `seq`, run alone in slot 0 of a fresh 64-position cache in one
/// pass.
pub fn alone_logits(model: &std::sync::Arc<synapse_runtime::Model>, seq: &[u32]) -> Vec<f32> {
    use synapse_runtime::{Executor, KvCache, KvDtype};
    let mut kv = KvCache::new(model, KvDtype::F32, 1, 64, 64).unwrap();
    kv.open(0).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    exec.forward(&mut kv, &all_logit_rows(seq))
        .unwrap()
        .to_vec()
}

/// A tiny-model fixture's Q8_0 GGUF and its token sequences concatenated (`None`, skipped
/// locally, when the fixtures are absent).
pub fn tiny_q8_model(family: &str) -> Option<(std::sync::Arc<synapse_runtime::Model>, Vec<u32>)> {
    let dir = workspace_root().join("fixtures/tiny").join(family);
    if !require(&dir.join("oracle.json"), "tiny-model fixture") {
        return None;
    }
    let toks: Vec<u32> = tiny_sequences(&dir).concat();
    Some((
        std::sync::Arc::new(synapse_runtime::Model::load(&dir.join("model.q8_0.gguf")).unwrap()),
        toks,
    ))
}

/// The importance map of a tiny model on `toks` (48 rows per site, sessions of 32 positions),
/// checking that the progress callback counts every linear.
pub fn tiny_importance_map(
    model: &std::sync::Arc<synapse_runtime::Model>,
    toks: &[u32],
) -> synapse_sensitivity::ImportanceMap {
    use synapse_runtime::importance::{ImportanceParams, build_importance_map, linears};
    let mut exec = synapse_runtime::Executor::new(model.clone(), 2).unwrap();
    let p = ImportanceParams {
        max_rows: 48,
        batch: 16,
        ctx: 32,
        text_id: "tiny sequences".into(),
        ..ImportanceParams::default()
    };
    let mut seen = 0;
    let map = build_importance_map(&mut exec, toks, &p, |done, total, _| {
        assert!(done <= total);
        seen = done;
    })
    .unwrap();
    assert_eq!(seen, linears(model).len());
    map
}

/// A token's id, its log-probability's bits and its alternatives' (id, bits).
pub type TokenBits = (u32, u32, Vec<(u32, u32)>);

/// Bits of every token's id, log-probability and top alternatives of a session's events
/// (every token must carry its log-probability).
pub fn bits(ev: &[synapse_runtime::engine::Event]) -> Vec<TokenBits> {
    ev.iter()
        .filter_map(|e| match e {
            synapse_runtime::engine::Event::Token(t) => {
                let lp = t.logprob.as_ref().unwrap();
                Some((
                    t.id,
                    lp.logprob.to_bits(),
                    lp.top.iter().map(|&(i, v)| (i, v.to_bits())).collect(),
                ))
            }
            _ => None,
        })
        .collect()
}
