//! Choosing exact escalation's draft by measurement (`draft_choice`): the probe's continuation
//! is the source's own greedy output, a draft equal to the source agrees everywhere, a
//! coarse draft agrees less than a fine one, the slots are left empty, and the decision rule
//! (`best_k`, `pick`) takes a draft only when it is expected to pay.

mod common;

use std::sync::Arc;

use synapse_runtime::draft_choice::{
    DraftTrial, MIN_GAIN, ProbeParams, pick, probe_source, try_draft,
};
use synapse_runtime::escalation::best_k;
use synapse_runtime::precision::{Precision, apply};
use synapse_runtime::{Executor, GenerateParams, KvCache, KvDtype, Model, generate};

fn variant(model: &Arc<Model>, spec: &str) -> Arc<Model> {
    apply(model, &Precision::parse_profile(spec).unwrap(), None)
        .unwrap()
        .model
}

#[test]
fn the_probe_follows_the_source_and_ranks_drafts_by_agreement() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let prompt = &toks[..12];
    let pp = ProbeParams {
        steps: 20,
        max_k: 4,
        repeats: 2,
    };
    let mut kv = KvCache::new(&model, KvDtype::F32, 2, 64, 16).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let probe = probe_source(&mut exec, &mut kv, 0, prompt, &pp).unwrap();
    assert_eq!(probe.continuation.len(), 20);
    assert_eq!(probe.max_k, 4);
    assert_eq!(probe.verify_s.len(), 6);
    assert!(
        probe.verify_s[1..]
            .iter()
            .all(|v| v.is_some_and(|t| t > 0.0))
    );
    assert!(probe.verify_s[0].is_none());
    assert!(
        kv.tokens(0).unwrap().is_empty(),
        "the probe leaves the slot empty"
    );

    // The continuation is plain greedy decoding's output.
    let mut kv2 = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
    let mut exec2 = Executor::new(model.clone(), 2).unwrap();
    let params = GenerateParams {
        max_tokens: 21,
        stop_at_eog: false,
        prefill_chunk: 16,
        ..GenerateParams::default()
    };
    let g = generate(
        &mut exec2,
        &mut kv2,
        0,
        prompt,
        &params,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(&g.tokens[..20], &probe.continuation[..]);

    // The source as its own draft agrees everywhere (up to prompt-order vs one-row-order
    // bits, which a tiny model's argmax does not see); a ternary draft agrees less than q8.
    let mut same = Executor::new(model.clone(), 1).unwrap();
    let t_same = try_draft(&mut exec, &mut same, &mut kv, 1, &probe, &pp).unwrap();
    assert_eq!(t_same.acceptance, 1.0, "{t_same:?}");
    assert!(kv.tokens(1).unwrap().is_empty());
    let mut q8 = Executor::new(variant(&model, "uniform:syn.q8.symmetric.g64.v1"), 1).unwrap();
    let t_q8 = try_draft(&mut exec, &mut q8, &mut kv, 1, &probe, &pp).unwrap();
    let mut q2 = Executor::new(variant(&model, "uniform:syn.q2.symmetric.g64.v1"), 1).unwrap();
    let t_q2 = try_draft(&mut exec, &mut q2, &mut kv, 1, &probe, &pp).unwrap();
    eprintln!("same {t_same:?}\nq8 {t_q8:?}\nq2 {t_q2:?}");
    assert!(t_q8.acceptance > t_q2.acceptance, "{t_q8:?} vs {t_q2:?}");
    for t in [t_same, t_q8, t_q2] {
        assert!(t.step_s > 0.0 && t.tok_s > 0.0 && t.speedup > 0.0);
        assert!(t.k <= 4);
        // The rate is never below plain decoding's (k = 0 is always a choice).
        assert!(t.speedup >= 1.0 - 1e-12, "{t:?}");
    }

    // A head-only draft: its acceptance is the continuation's share on the list (all of it
    // for the whole vocabulary, none for a list without those tokens); the slot is left
    // empty; the source still decodes the same tokens after it.
    use synapse_runtime::head_draft::{Shortlist, best_head_k, try_head_draft};
    let vocab = model.vocab() as u32;
    let mut all = Shortlist::new(&model, 0..vocab).unwrap();
    let t_all = try_head_draft(&mut exec, &mut kv, 1, &probe, &mut all, &pp).unwrap();
    assert_eq!(t_all.acceptance, 1.0, "{t_all:?}");
    assert!(kv.tokens(1).unwrap().is_empty());
    let off: Vec<u32> = (0..vocab)
        .filter(|t| !probe.continuation.contains(t))
        .collect();
    let mut none = Shortlist::new(&model, off).unwrap();
    let t_none = try_head_draft(&mut exec, &mut kv, 1, &probe, &mut none, &pp).unwrap();
    assert_eq!(t_none.acceptance, 0.0, "{t_none:?}");
    let some: Vec<u32> = probe.continuation[..10].to_vec();
    let mut part = Shortlist::new(&model, some.iter().copied()).unwrap();
    let t_part = try_head_draft(&mut exec, &mut kv, 1, &probe, &mut part, &pp).unwrap();
    let want = probe
        .continuation
        .iter()
        .filter(|t| some.contains(t))
        .count() as f64
        / probe.continuation.len() as f64;
    assert_eq!(t_part.acceptance, want);
    for t in [t_all, t_none, t_part] {
        assert!(t.step_s > 0.0 && t.tok_s > 0.0 && t.k <= 4, "{t:?}");
        // Never below plain decoding's rate (k = 0 when no round pays).
        assert!(t.speedup >= 1.0 - 1e-12, "{t:?}");
    }
    // With nothing accepted every round commits one token, so more than one draft never
    // pays (whether one does against a plain step is the timing's noise on a tiny model).
    assert!(t_none.k <= 1, "{t_none:?}");
    // The rule: a round of k commits 1 + a + … + a^(k−1) tokens for k steps and one head.
    let head = |k: usize| Some(0.004 + 0.0005 * k as f64);
    assert_eq!(best_head_k(0.0, 0.006, 8, head).0, 1);
    let (k, rate) = best_head_k(1.0, 0.006, 8, head);
    assert_eq!(k, 8);
    assert!((rate - 8.0 / (8.0 * 0.006 + 0.008)).abs() < 1e-9);
    assert_eq!(
        best_head_k(0.9, 0.006, 3, |k| (k != 3).then_some(0.005)).0,
        2
    );

    // The pool went back to the source: it still decodes the same tokens.
    let again = probe_source(&mut exec, &mut kv, 0, prompt, &pp).unwrap();
    assert_eq!(again.continuation, probe.continuation);
    // Another model as a draft is refused.
    let other = common::tiny_q8_model("qwen2").unwrap().0;
    let mut o = Executor::new(other, 1).unwrap();
    assert!(try_draft(&mut exec, &mut o, &mut kv, 1, &probe, &pp).is_err());
    // A cache too small for the probe is refused before anything runs.
    let mut small = KvCache::new(&model, KvDtype::F32, 2, 24, 16).unwrap();
    let e = probe_source(&mut exec, &mut small, 0, prompt, &pp).unwrap_err();
    assert!(e.to_string().contains("positions"), "{e}");
    assert!(probe_source(&mut exec, &mut kv, 0, &[], &pp).is_err());
}

#[test]
fn best_k_and_pick_take_a_draft_only_when_it_pays() {
    let t1 = 0.010;
    // Verify passes cost a plain step plus 10% per extra row.
    let verify = |rows: usize| Some(t1 * (1.0 + 0.1 * (rows as f64 - 1.0)));
    // A free, always-right draft: the most drafts.
    let (k, rate) = best_k(1.0, 0.0, t1, 8, verify);
    assert_eq!(k, 8);
    assert!((rate * t1 - 9.0 / 1.8).abs() < 1e-9);
    // A draft as slow as the source never pays, whatever its acceptance.
    assert_eq!(best_k(1.0, t1, t1, 8, verify).0, 0);
    // A draft that is never right never pays.
    assert_eq!(best_k(0.0, 0.001, t1, 8, verify).0, 0);
    // Unknown verify costs are skipped.
    assert_eq!(best_k(1.0, 0.0, t1, 8, |_| None), (0, 1.0 / t1));
    // A cheap, mostly right draft pays with a middling k.
    let (k, rate) = best_k(0.8, 0.002, t1, 8, verify);
    assert!((2..8).contains(&k), "{k}");
    assert!(rate * t1 > 1.5);

    let trial = |k: usize, speedup: f64| DraftTrial {
        acceptance: 0.5,
        step_s: 0.001,
        k,
        tok_s: speedup / t1,
        speedup,
    };
    assert_eq!(pick(&[]), None);
    assert_eq!(pick(&[trial(0, 1.0), trial(0, 1.0)]), None);
    assert_eq!(pick(&[trial(1, MIN_GAIN - 0.01)]), None);
    assert_eq!(
        pick(&[trial(1, 1.2), trial(3, 1.6), trial(2, 1.4)]),
        Some(1)
    );
    assert_eq!(pick(&[trial(0, 1.0), trial(2, MIN_GAIN)]), Some(1));
}
