//! Head-only drafting inside the continuous-batching engine (`EngineConfig::head_draft`):
//! greedy escalating sessions draft with a shared vocabulary shortlist of the model's own
//! LM head, running their body passes in their own slots, and are verified by the full head
//! over their stored rows. Their tokens and log-probabilities equal plain decoding's alone,
//! at 1–16 slots, with cancellations and replacements, sessions with bias and penalties,
//! plain and sampled sessions beside them, fixed and adaptive `k`; a second turn reuses a
//! head-drafted prefix exactly; the configuration is checked.

mod common;

use std::sync::Arc;

use common::{Ids, prompts, tokens};

fn solo(model: &Arc<Model>, cfg: &EngineConfig, req: &Request) -> Vec<(u32, u32)> {
    common::solo(model, cfg, copy(req))
}
use synapse_runtime::Model;
use synapse_runtime::engine::{EngineConfig, Event, Request, Scheduler};

/// Request `i`: mostly greedy escalating; some with a logit bias or a repetition penalty
/// (their drafts read the list's logits as they read logits), some plain, some sampled
/// (sampled sessions do not head-draft: they decode plainly).
fn request(prompt: Vec<u32>, n: usize, i: usize) -> Request {
    let mut r = Request::greedy(prompt, n);
    r.stop_at_eog = false;
    r.logprobs = Some(2);
    r.escalation = i % 4 != 3;
    match i % 6 {
        1 => r.logit_bias = vec![(5, 1.5), (9, -2.0)],
        2 => r.sampling.repetition_penalty = 1.2,
        4 => {
            r.sampling.temperature = 0.8;
            r.sampling.top_k = 20;
            r.sampling.seed = i as u64;
        }
        _ => {}
    }
    r
}

fn copy(r: &Request) -> Request {
    let mut c = Request::greedy(r.prompt.clone(), r.max_tokens);
    c.stop_at_eog = r.stop_at_eog;
    c.logprobs = r.logprobs;
    c.logit_bias = r.logit_bias.clone();
    c.sampling = r.sampling.clone();
    c.escalation = r.escalation;
    c
}

/// Runs `reqs` with `cfg.slots` slots (cancellations, replacements); returns each
/// session's events and the engine's (drafted, accepted) counts.
fn run(
    model: &Arc<Model>,
    cfg: &EngineConfig,
    reqs: Vec<Request>,
    cancel_at: &[(usize, usize)],
) -> (Vec<Vec<Event>>, u64, u64) {
    let (events, s) = common::run_replacing(model, cfg, reqs, cancel_at);
    let st = s.stats();
    let (list, misses, _) = s.head_shortlist().unwrap();
    // The exported signals: the list's size, and the decayed acceptance estimate.
    assert_eq!(st.draft_shortlist, list as u64);
    if st.drafted > 0 {
        assert!(
            st.draft_acceptance_ppm > 0 && st.draft_acceptance_ppm < 1_000_000,
            "{st:?}"
        );
    }
    eprintln!(
        "{} slots: {} drafted, {} accepted, {} steps, {} tokens; shortlist {list}, {misses} misses",
        cfg.slots, st.drafted, st.draft_accepted, st.steps, st.generated_tokens
    );
    (events, st.drafted, st.draft_accepted)
}

/// The shortlist's base: every `stride`-th id of the vocabulary's lower half (so drafts are
/// often right and often wrong).
fn base(model: &Model, stride: usize) -> Vec<u32> {
    (0..model.vocab() as u32 / 2).step_by(stride).collect()
}

fn check(model: &Arc<Model>, toks: &[u32], slots: usize, adaptive: bool, max_tokens: usize) {
    let cfg = EngineConfig {
        slots,
        ctx: 128,
        ubatch: 16,
        step_tokens: 16 * slots + 17,
        head_draft: Some(base(model, 2)),
        draft_k: 5,
        draft_adaptive: adaptive,
        ..EngineConfig::default()
    };
    let n_req = 2 * slots + 3;
    let reqs: Vec<Request> = prompts(toks, n_req)
        .into_iter()
        .enumerate()
        .map(|(i, p)| request(p, max_tokens + i % 7, i))
        .collect();
    let refs: Vec<Vec<(u32, u32)>> = reqs.iter().map(|r| solo(model, &cfg, r)).collect();
    let cancel: Vec<(usize, usize)> = (0..n_req)
        .filter(|i| i % 6 == 5)
        .map(|i| (i, 3 + i))
        .collect();
    let (got, drafted, accepted) = run(model, &cfg, reqs.iter().map(copy).collect(), &cancel);
    common::assert_sessions_match(&got, &refs, &cancel);
    if !adaptive {
        assert!(drafted > 0, "nothing was drafted");
        assert!(
            accepted > 0 && accepted < drafted,
            "{accepted} of {drafted}"
        );
    }
}

#[test]
fn head_drafted_sessions_in_the_engine_equal_plain_decoding() {
    for (family, slots) in [
        ("llama", 1),
        ("qwen2", 3),
        ("gemma3", 8),
        ("mixtral", 6),
        ("llama", 16),
    ] {
        let Some((model, toks)) = common::tiny_q8_model(family) else {
            return;
        };
        check(&model, &toks, slots, false, 30);
    }
}

/// With the cost model choosing `k` (plain steps, drafted rounds, exploration): the same.
#[test]
fn adaptive_head_drafting_in_the_engine_equals_plain_decoding() {
    for (family, slots) in [("qwen2", 1), ("gemma3", 2), ("llama", 6)] {
        let Some((model, toks)) = common::tiny_q8_model(family) else {
            return;
        };
        check(&model, &toks, slots, true, 40);
    }
}

#[test]
fn head_drafted_sessions_on_the_default_model_equal_plain_decoding() {
    let Some((model, toks)) = common::default_model_and_ids() else {
        return;
    };
    let cfg = EngineConfig {
        slots: 3,
        ctx: 128,
        ubatch: 16,
        step_tokens: 64,
        head_draft: Some((0..8192).collect()),
        draft_k: 4,
        draft_adaptive: false,
        ..EngineConfig::default()
    };
    let reqs: Vec<Request> = prompts(&toks, 5)
        .into_iter()
        .enumerate()
        .map(|(i, p)| request(p, 12, i))
        .collect();
    let refs: Vec<Vec<(u32, u32)>> = reqs.iter().map(|r| solo(&model, &cfg, r)).collect();
    let (got, drafted, accepted) = run(&model, &cfg, reqs, &[]);
    for (i, ev) in got.iter().enumerate() {
        let (t, done) = tokens(ev);
        assert!(done, "session {i}");
        assert_eq!(t, refs[i], "session {i}");
    }
    assert!(drafted > 0 && accepted > 0, "{accepted} of {drafted}");
}

#[test]
fn a_head_draft_is_checked_at_start() {
    let Some((model, _)) = common::tiny_q8_model("llama") else {
        return;
    };
    let cfg = EngineConfig {
        slots: 2,
        ctx: 64,
        ubatch: 8,
        step_tokens: 16,
        head_draft: Some(vec![1, 2, 3]),
        draft: Some(model.clone()),
        ..EngineConfig::default()
    };
    let e = Scheduler::new(model.clone(), Arc::new(Ids), cfg.clone()).unwrap_err();
    assert!(e.to_string().contains("exclude each other"), "{e}");
    let bad = EngineConfig {
        draft: None,
        head_draft: Some(vec![model.vocab() as u32]),
        ..cfg.clone()
    };
    let e = Scheduler::new(model.clone(), Arc::new(Ids), bad).unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    let bad = EngineConfig {
        draft: None,
        draft_k: 17,
        ..cfg.clone()
    };
    let e = Scheduler::new(model.clone(), Arc::new(Ids), bad).unwrap_err();
    assert!(e.to_string().contains("outside 1..=16"), "{e}");
    let ok = EngineConfig { draft: None, ..cfg };
    let model_eos = model.ir.special.eos.len();
    let s = Scheduler::new(model, Arc::new(Ids), ok).unwrap();
    // The base and the end-of-generation tokens.
    let n = s.head_shortlist_base().unwrap();
    assert!(n >= 3 && n <= 3 + model_eos, "{n}");
}

/// Cache / resume / fresh under head drafting: a second turn whose prompt extends a drafted
/// first turn reuses the slot's prefix and equals a fresh plain run.
#[test]
fn a_head_drafted_session_leaves_a_prefix_a_second_turn_reuses_exactly() {
    let Some((model, toks)) = common::tiny_q8_model("qwen2") else {
        return;
    };
    let cfg = EngineConfig {
        slots: 1,
        ctx: 128,
        ubatch: 16,
        step_tokens: 40,
        head_draft: Some(base(&model, 2)),
        draft_k: 4,
        draft_adaptive: false,
        ..EngineConfig::default()
    };
    common::second_turn_reuses_prefix(&model, &cfg, &toks, |p, n| {
        let mut r = request(p, n, 0);
        r.logprobs = None;
        r
    });
}
