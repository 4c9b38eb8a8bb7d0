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
        &SelectiveParams::margin(margin),
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
            &SelectiveParams::margin(m),
            &mut |_| String::new(),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("must be ≥ 0"), "{e}");
    }
}

/// Selective escalation with a head-only draft (`generate_selective_head`): the body runs at
/// the source precision, so an escalated step is the source's own choice. Every step
/// escalating (infinite margin, or an entropy threshold of 0) gives plain decoding's
/// tokens; no step escalating gives the shortlist's own greedy choice — checked against the
/// full logits restricted to the listed ids, computed apart; in between some steps escalate
/// and tokens chosen off the list join it. Sampled: every step escalating is plain sampling
/// for the seed. Bad thresholds are refused.
#[test]
fn a_head_only_selective_draft_spans_the_source_and_the_shortlist() {
    use synapse_runtime::head_draft::Shortlist;
    use synapse_runtime::selective::generate_selective_head;
    use synapse_runtime::{OrderClass, Row, prompt_order};

    let run = |model: &Arc<Model>,
               prompt: &[u32],
               params: &GenerateParams,
               sp: SelectiveParams,
               list: usize| {
        let mut kv = KvCache::new(model, KvDtype::F32, 1, 256, 32).unwrap();
        let mut ex = Executor::new(model.clone(), 2).unwrap();
        let mut sl = Shortlist::lowest_ids(model, list, &[]).unwrap();
        let (g, st) = generate_selective_head(
            &mut ex,
            &mut kv,
            0,
            prompt,
            params,
            &sp,
            &mut sl,
            &mut |_| String::new(),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(g.tokens.len(), st.steps);
        assert!(st.off_shortlist <= st.escalated);
        (g.tokens, st, sl.len())
    };
    for family in ["llama", "qwen2", "gemma3"] {
        let Some((model, toks)) = common::tiny_q8_model(family) else {
            return;
        };
        let params = GenerateParams {
            max_tokens: 40,
            stop_at_eog: false,
            prefill_chunk: 8,
            ..GenerateParams::default()
        };
        let none = SelectiveParams::margin(0.0);
        for start in [0, 11, 23] {
            let prompt = &toks[start..start + 13];
            let src = plain(&model, prompt, &params);
            // Every step escalates: the source's tokens (the first is the prompt pass's).
            let (all, st, _) = run(
                &model,
                prompt,
                &params,
                SelectiveParams::margin(f32::INFINITY),
                16,
            );
            assert_eq!(all, src, "{family}: infinite margin = the source");
            assert_eq!(st.escalated, st.steps - 1);
            let by_entropy = SelectiveParams {
                max_entropy: 0.0,
                ..none
            };
            let (all, _, _) = run(&model, prompt, &params, by_entropy, 16);
            assert_eq!(all, src, "{family}: entropy threshold 0 = the source");

            // No step escalates: the list's own greedy choice, computed apart from the full
            // logits restricted to the listed ids (lowest id on ties).
            let (alone, st, len) = run(&model, prompt, &params, none, 16);
            assert_eq!(st.escalated, 0);
            let list = Shortlist::lowest_ids(&model, 16, &[]).unwrap();
            assert_eq!(len, list.len(), "the list grows only by escalated steps");
            let mut kv = KvCache::new(&model, KvDtype::F32, 1, 256, 32).unwrap();
            kv.open(0).unwrap();
            let mut ex = Executor::new(model.clone(), 2).unwrap();
            let mut logits = Vec::new();
            for (c, part) in prompt.chunks(8).enumerate() {
                let rows: Vec<Row> = part
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| {
                        let p = c * 8 + i;
                        Row {
                            logits: p + 1 == prompt.len(),
                            order: prompt_order(p, prompt.len(), 8),
                            ..Row::decode(0, p as u32, t)
                        }
                    })
                    .collect();
                logits = ex.forward(&mut kv, &rows).unwrap().to_vec();
            }
            let mut want = vec![synapse_runtime::argmax(&logits)];
            while want.len() < params.max_tokens {
                let pos = prompt.len() + want.len() - 1;
                let row = Row::decode(0, pos as u32, *want.last().unwrap());
                assert_eq!(row.order, OrderClass::One);
                let l = ex.forward(&mut kv, &[row]).unwrap();
                let mut best = (f32::NEG_INFINITY, u32::MAX);
                for t in (0..model.vocab() as u32).filter(|&t| list.contains(t)) {
                    if l[t as usize] > best.0 {
                        best = (l[t as usize], t);
                    }
                }
                want.push(best.1);
            }
            assert_eq!(
                alone, want,
                "{family}: no escalation = the list's greedy choice"
            );
            assert!(alone[1..].iter().all(|&t| list.contains(t)));

            // In between: some steps escalate, and tokens chosen off the list join it.
            let (_, st, len) = run(&model, prompt, &params, SelectiveParams::margin(0.5), 16);
            assert!(st.escalated > 0, "{family}: {st:?}");
            assert_eq!(len, list.len() + st.off_shortlist, "{family}: {st:?}");
        }
        // Sampled, every step escalating: plain sampling's tokens for the seed.
        let sampled = GenerateParams {
            sampling: synapse_runtime::SamplingParams {
                temperature: 0.8,
                seed: 11,
                ..Default::default()
            },
            ..params.clone()
        };
        let prompt = &toks[..13];
        let (all, _, _) = run(
            &model,
            prompt,
            &sampled,
            SelectiveParams::margin(f32::INFINITY),
            16,
        );
        assert_eq!(all, plain(&model, prompt, &sampled), "{family}: sampled");
    }
    // Bad thresholds, before anything runs.
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
    let mut ex = Executor::new(model.clone(), 1).unwrap();
    let mut sl = Shortlist::lowest_ids(&model, 16, &[]).unwrap();
    for (sp, what) in [
        (SelectiveParams::margin(-1.0), "must be ≥ 0"),
        (SelectiveParams::margin(f32::NAN), "must be ≥ 0"),
        (
            SelectiveParams {
                margin: 1.0,
                max_entropy: -0.5,
            },
            "must be ≥ 0 (inf: never by entropy)",
        ),
    ] {
        let e = generate_selective_head(
            &mut ex,
            &mut kv,
            0,
            &toks[..4],
            &GenerateParams::default(),
            &sp,
            &mut sl,
            &mut |_| String::new(),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains(what), "{e}");
    }
    assert_eq!(kv.len(0).unwrap_or(0), 0, "nothing ran");
}

/// The monitor's signals: the entropy of a uniform distribution over `n` entries is ln n
/// (−∞ entries are not candidates), a one-hot one's is 0; the margin or the entropy fires.
#[test]
fn the_monitor_fires_on_a_small_margin_or_a_high_entropy() {
    use synapse_runtime::selective::entropy;
    let flat = [1.0f32, 1.0, 1.0, 1.0, f32::NEG_INFINITY];
    assert!((entropy(&flat) - 4f32.ln()).abs() < 1e-6);
    assert_eq!(entropy(&[5.0, f32::NEG_INFINITY]), 0.0);
    assert_eq!(entropy(&[f32::NEG_INFINITY; 3]), 0.0);
    let peaked = [10.0f32, 0.0, 0.0, 0.0];
    assert!(entropy(&peaked) < 0.01);
    let sp = SelectiveParams {
        margin: 2.0,
        max_entropy: 1.0,
    };
    assert!(!sp.fires(&peaked));
    assert!(sp.fires(&[10.0, 9.0, 0.0])); // margin 1 < 2
    assert!(sp.fires(&flat)); // margin 0
    let wide: Vec<f32> = (0..64).map(|i| if i == 0 { 3.0 } else { 0.0 }).collect();
    assert!(top2_margin(&wide) > 2.0 && entropy(&wide) > 1.0);
    assert!(sp.fires(&wide)); // by entropy only
    assert!(!SelectiveParams::margin(2.0).fires(&wide));
}
