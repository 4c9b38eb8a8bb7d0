//! Exact escalation inside the continuous-batching engine: opted-in sessions draft with the
//! engine's draft profile and are verified in the same step's pass as plain decodes and
//! prompt chunks. Greedy ones' tokens (and log-probabilities) equal plain decoding's alone, at
//! 6–16 slots, with cancellations and replacements, plain sampled and constrained sessions
//! beside them; sampled ones' tokens equal `generate_exact`'s speculative sampling for their
//! seed; a draft of another model is refused.

mod common;

use std::sync::Arc;

use common::{Ids, drain, prompts, solo, tokens};
use synapse_runtime::Model;
use synapse_runtime::engine::{EngineConfig, Event, Request, Scheduler, Session};
use synapse_runtime::precision::{Precision, apply};

fn variant(model: &Arc<Model>, spec: &str) -> Arc<Model> {
    apply(model, &Precision::parse_profile(spec).unwrap(), None)
        .unwrap()
        .model
}

fn request(prompt: Vec<u32>, n: usize, i: usize) -> Request {
    let mut r = Request::greedy(prompt, n);
    r.stop_at_eog = false;
    r.logprobs = Some(2);
    r.escalation = i % 4 != 3;
    if i % 5 == 4 {
        // Sampled, plainly (a sampled session that escalates draws by speculative sampling:
        // `sampled_drafted_sessions_in_the_engine_equal_generate_exact`).
        r.escalation = false;
        r.sampling.temperature = 0.8;
        r.sampling.top_k = 20;
        r.sampling.seed = i as u64;
    }
    r
}

/// Runs `reqs` on an engine with `slots` slots and a draft, cancelling the sessions in
/// `cancel_at` (index → step) and submitting the rest as slots free up; returns each
/// session's events.
fn run(
    model: &Arc<Model>,
    cfg: &EngineConfig,
    reqs: Vec<Request>,
    cancel_at: &[(usize, usize)],
) -> Vec<Vec<Event>> {
    let (events, s) = common::run_replacing(model, cfg, reqs, cancel_at);
    let st = s.stats();
    eprintln!(
        "{} slots: {} drafted, {} accepted, {} steps, {} tokens",
        cfg.slots, st.drafted, st.draft_accepted, st.steps, st.generated_tokens
    );
    assert!(st.drafted > 0, "nothing was drafted");
    assert!(st.draft_accepted > 0 && st.draft_accepted <= st.drafted);
    // The acceptance estimate exported as an online signal.
    assert!(
        st.draft_acceptance_ppm > 0 && st.draft_acceptance_ppm < 1_000_000,
        "{st:?}"
    );
    events
}

fn check(
    family_model: (Arc<Model>, Vec<u32>),
    draft_spec: &str,
    slots: usize,
    n_req: usize,
    max_tokens: usize,
) {
    let (model, toks) = family_model;
    let draft = variant(&model, draft_spec);
    let cfg = EngineConfig {
        slots,
        ctx: 128,
        ubatch: 16,
        step_tokens: 16 * slots + 17,
        draft: Some(draft),
        draft_k: 5,
        draft_adaptive: false,
        ..EngineConfig::default()
    };
    let reqs: Vec<Request> = prompts(&toks, n_req)
        .into_iter()
        .enumerate()
        .map(|(i, p)| request(p, max_tokens + i % 7, i))
        .collect();
    let refs: Vec<Vec<(u32, u32)>> = reqs
        .iter()
        .map(|r| {
            let mut c = request(r.prompt.clone(), r.max_tokens, 0);
            c.sampling = r.sampling.clone();
            solo(&model, &cfg, c)
        })
        .collect();
    let cancel: Vec<(usize, usize)> = (0..n_req)
        .filter(|i| i % 6 == 2)
        .map(|i| (i, 3 + i))
        .collect();
    let got = run(&model, &cfg, reqs, &cancel);
    common::assert_sessions_match(&got, &refs, &cancel);
}

#[test]
fn drafted_sessions_in_the_engine_equal_plain_decoding() {
    // The MoE families too: a session's experts serve rows of many sessions in one call.
    for (family, slots) in [
        ("llama", 6),
        ("qwen2", 8),
        ("gemma3", 16),
        ("mixtral", 6),
        ("qwen2moe", 8),
    ] {
        let Some(m) = common::tiny_q8_model(family) else {
            return;
        };
        check(
            m,
            "uniform:syn.q3.symmetric.g64.v1",
            slots,
            2 * slots + 3,
            30,
        );
    }
}

#[test]
fn drafted_sessions_on_the_default_model_equal_plain_decoding() {
    let Some(m) = common::default_model_and_ids() else {
        return;
    };
    check(m, "uniform:syn.q8.symmetric.g64.v1", 6, 9, 12);
}

#[test]
fn a_draft_must_be_a_profile_of_the_served_model() {
    let (Some((llama, _)), Some((qwen, _))) = (
        common::tiny_q8_model("llama"),
        common::tiny_q8_model("qwen2"),
    ) else {
        return;
    };
    let cfg = EngineConfig {
        slots: 2,
        ctx: 64,
        ubatch: 8,
        step_tokens: 16,
        draft: Some(qwen),
        ..EngineConfig::default()
    };
    let e = Scheduler::new(llama.clone(), Arc::new(Ids), cfg.clone()).unwrap_err();
    assert!(e.to_string().contains("another model"), "{e}");
    let cfg = EngineConfig {
        draft: Some(llama.clone()),
        draft_k: 0,
        ..cfg
    };
    let e = Scheduler::new(llama, Arc::new(Ids), cfg).unwrap_err();
    assert!(e.to_string().contains("outside 1..=16"), "{e}");
}

/// Cache / resume / fresh under drafting: a second turn whose prompt extends a drafted first
/// turn reuses the slot's prefix and equals a fresh plain run; so does the same prompt again.
#[test]
fn a_drafted_session_leaves_a_prefix_a_second_turn_reuses_exactly() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let draft = variant(&model, "uniform:syn.q3.symmetric.g64.v1");
    let cfg = EngineConfig {
        slots: 1,
        ctx: 128,
        ubatch: 16,
        step_tokens: 40,
        draft: Some(draft),
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

/// `generate_exact`'s sampled output for `req` (its seed, its sampling parameters), with the
/// engine's draft and chunking: the reference of a sampled escalating engine session.
fn exact_sampled(
    model: &Arc<Model>,
    draft: &Arc<Model>,
    cfg: &EngineConfig,
    req: &Request,
) -> Vec<u32> {
    use synapse_runtime::escalation::{DraftParams, generate_exact};
    let mut kv =
        synapse_runtime::KvCache::new(model, synapse_runtime::KvDtype::F32, 2, cfg.ctx, cfg.ubatch)
            .unwrap();
    let mut src = synapse_runtime::Executor::new(model.clone(), 1).unwrap();
    let mut dra = synapse_runtime::Executor::new(draft.clone(), 1).unwrap();
    let params = synapse_runtime::GenerateParams {
        max_tokens: req.max_tokens,
        sampling: req.sampling.clone(),
        stop: Vec::new(),
        prefill_chunk: cfg.ubatch,
        stop_at_eog: req.stop_at_eog,
    };
    let dp = DraftParams {
        max_k: 3,
        adaptive: false,
    };
    let (g, _) = generate_exact(
        &mut src,
        &mut dra,
        &mut kv,
        0,
        1,
        &req.prompt,
        &params,
        &dp,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    g.tokens
}

/// Sampled sessions escalate too (speculative sampling: a draft token accepted with
/// probability `min(1, p/q)`, else drawn from `(p − q)⁺`, every draw tied to its position and
/// the seed): beside greedy drafted, plain sampled and plain greedy sessions, with fixed or
/// adaptive `k` (rounds without drafts included), each one's tokens are exactly
/// `generate_exact`'s for its seed — a function of the seed alone, however the engine cut its
/// rounds or whatever shared its passes — and not plain sampling's stream.
#[test]
fn sampled_drafted_sessions_in_the_engine_equal_generate_exact() {
    for (family, slots, adaptive) in [("llama", 6, false), ("qwen2", 8, true), ("gemma3", 5, true)]
    {
        let Some((model, toks)) = common::tiny_q8_model(family) else {
            return;
        };
        let draft = variant(&model, "uniform:syn.q4.symmetric.g64.v1");
        let cfg = EngineConfig {
            slots,
            ctx: 128,
            ubatch: 16,
            step_tokens: 16 * slots + 17,
            draft: Some(draft.clone()),
            draft_k: 4,
            draft_adaptive: adaptive,
            ..EngineConfig::default()
        };
        let n_req = 2 * slots + 1;
        let reqs: Vec<Request> = prompts(&toks, n_req)
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut r = Request::greedy(p, 24 + i % 5);
                r.stop_at_eog = false;
                r.escalation = i % 4 != 3;
                if i % 3 != 1 {
                    r.sampling.temperature = 0.7 + 0.1 * (i % 4) as f32;
                    r.sampling.top_k = if i % 2 == 0 { 40 } else { 0 };
                    r.sampling.top_p = 0.95;
                    r.sampling.repetition_penalty = if i % 5 == 0 { 1.1 } else { 1.0 };
                    r.sampling.seed = 1000 + i as u64;
                }
                r
            })
            .collect();
        let want: Vec<Vec<u32>> = reqs
            .iter()
            .map(|r| {
                if r.escalation && r.sampling.temperature > 0.0 {
                    exact_sampled(&model, &draft, &cfg, r)
                } else {
                    let mut c = Request::greedy(r.prompt.clone(), r.max_tokens);
                    c.stop_at_eog = false;
                    c.sampling = r.sampling.clone();
                    solo(&model, &cfg, c).into_iter().map(|t| t.0).collect()
                }
            })
            .collect();
        let copies: Vec<Request> = reqs
            .iter()
            .map(|r| {
                let mut c = Request::greedy(r.prompt.clone(), r.max_tokens);
                c.stop_at_eog = false;
                c.sampling = r.sampling.clone();
                c.escalation = r.escalation;
                c
            })
            .collect();
        let got = run(&model, &cfg, copies, &[]);
        let mut differs_from_plain = 0;
        for (i, ev) in got.iter().enumerate() {
            let (t, done) = tokens(ev);
            assert!(done, "{family} session {i} did not finish");
            let t: Vec<u32> = t.into_iter().map(|x| x.0).collect();
            assert_eq!(t, want[i], "{family} session {i}");
            if reqs[i].escalation && reqs[i].sampling.temperature > 0.0 {
                let mut plain = Request::greedy(reqs[i].prompt.clone(), reqs[i].max_tokens);
                plain.stop_at_eog = false;
                plain.sampling = reqs[i].sampling.clone();
                let p: Vec<u32> = solo(&model, &cfg, plain).into_iter().map(|x| x.0).collect();
                differs_from_plain += usize::from(p != t);
            }
        }
        // Speculative sampling draws other variates than plain sampling's one stream.
        assert!(differs_from_plain > 0, "{family}");
    }
}

/// A draft that reads no fewer weight bytes than the model (here the model itself) cannot
/// make a step faster: with the cost model on, the engine never drafts with it (no probe
/// round), and the tokens are plain decoding's; with a fixed `k` it drafts as told.
#[test]
fn a_draft_no_smaller_than_the_model_is_never_run_by_the_cost_model() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    for adaptive in [true, false] {
        let cfg = EngineConfig {
            slots: 2,
            ctx: 128,
            ubatch: 16,
            step_tokens: 40,
            draft: Some(model.clone()),
            draft_k: 3,
            draft_adaptive: adaptive,
            ..EngineConfig::default()
        };
        let mut s = Scheduler::new(model.clone(), Arc::new(Ids), cfg.clone()).unwrap();
        let reqs: Vec<Request> = prompts(&toks, 2)
            .into_iter()
            .map(|p| {
                let mut r = Request::greedy(p, 30);
                r.stop_at_eog = false;
                r.escalation = true;
                r
            })
            .collect();
        let want: Vec<Vec<u32>> = reqs
            .iter()
            .map(|r| {
                let mut c = Request::greedy(r.prompt.clone(), r.max_tokens);
                c.stop_at_eog = false;
                solo(&model, &cfg, c).into_iter().map(|t| t.0).collect()
            })
            .collect();
        let mut sessions: Vec<Session> = reqs.into_iter().map(|r| s.submit(r).unwrap()).collect();
        while s.step() {}
        for (i, ss) in sessions.iter_mut().enumerate() {
            let (t, done) = tokens(&drain(ss));
            assert!(done);
            let t: Vec<u32> = t.into_iter().map(|x| x.0).collect();
            assert_eq!(t, want[i], "session {i}");
        }
        let st = s.stats();
        if adaptive {
            assert_eq!(st.drafted, 0, "{st:?}");
        } else {
            assert!(st.drafted > 0, "{st:?}");
        }
    }
}
