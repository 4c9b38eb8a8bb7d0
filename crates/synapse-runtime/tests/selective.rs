//! Selective escalation: with an infinite margin every step escalates and the output is plain
//! source decoding's; with 0 none does and it is the draft's own; in between some steps
//! escalate. Bad thresholds are refused.

mod common;

use std::sync::Arc;

use synapse_runtime::precision::{Precision, apply};
use synapse_runtime::selective::{SelectiveParams, generate_selective, top2_margin};
use synapse_runtime::{Executor, GenerateParams, KvCache, KvDtype, Model, generate};

fn plain(model: &Arc<Model>, prompt: &[u32], params: &GenerateParams) -> Vec<u32> {
    let mut kv = KvCache::new(model, KvDtype::F32, 1, 256, 32).unwrap();
    let mut ex = Executor::new(model.clone(), 2).unwrap();
    generate(
        &mut ex,
        &mut kv,
        0,
        prompt,
        params,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap()
    .tokens
}

fn selective(
    model: &Arc<Model>,
    draft: &Arc<Model>,
    prompt: &[u32],
    params: &GenerateParams,
    margin: f32,
) -> (Vec<u32>, synapse_runtime::selective::SelectiveStats) {
    let mut kv = KvCache::new(model, KvDtype::F32, 2, 256, 32).unwrap();
    let mut src = Executor::new(model.clone(), 2).unwrap();
    let mut dr = Executor::new(draft.clone(), 2).unwrap();
    let (g, st) = generate_selective(
        &mut src,
        &mut dr,
        &mut kv,
        0,
        1,
        prompt,
        params,
        &SelectiveParams { margin },
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    (g.tokens, st)
}

#[test]
fn the_limits_are_the_source_and_the_draft_and_between_some_steps_escalate() {
    for family in ["llama", "qwen2", "gemma3"] {
        let Some((model, toks)) = common::tiny_q8_model(family) else {
            return;
        };
        let draft = apply(
            &model,
            &Precision::parse_profile("uniform:syn.q3.symmetric.g64.v1").unwrap(),
            None,
        )
        .unwrap()
        .model;
        let params = GenerateParams {
            max_tokens: 40,
            stop_at_eog: false,
            prefill_chunk: 8,
            ..GenerateParams::default()
        };
        for start in [0, 11, 23] {
            let prompt = &toks[start..start + 13];
            let src = plain(&model, prompt, &params);
            let own = plain(&draft, prompt, &params);
            let (all, st) = selective(&model, &draft, prompt, &params, f32::INFINITY);
            assert_eq!(all, src, "{family}: every step escalated = the source");
            assert_eq!(st.escalated, st.steps);
            let (none, st) = selective(&model, &draft, prompt, &params, 0.0);
            assert_eq!(none, own, "{family}: no step escalated = the draft");
            assert_eq!(st.escalated, 0);
            let (_, st) = selective(&model, &draft, prompt, &params, 0.5);
            assert!(st.escalated <= st.steps);
        }
    }
}

#[test]
fn a_bad_margin_is_refused_and_the_margin_is_top1_minus_top2() {
    assert_eq!(top2_margin(&[1.0, 3.5, 2.0]), 1.5);
    assert_eq!(top2_margin(&[2.0, 2.0]), 0.0);
    assert_eq!(top2_margin(&[1.0]), f32::INFINITY);
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let mut kv = KvCache::new(&model, KvDtype::F32, 2, 64, 16).unwrap();
    let mut src = Executor::new(model.clone(), 1).unwrap();
    let mut dr = Executor::new(model.clone(), 1).unwrap();
    for m in [-1.0, f32::NAN] {
        let e = generate_selective(
            &mut src,
            &mut dr,
            &mut kv,
            0,
            1,
            &toks[..4],
            &GenerateParams::default(),
            &SelectiveParams { margin: m },
            &mut |_| String::new(),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("must be ≥ 0"), "{e}");
    }
}
