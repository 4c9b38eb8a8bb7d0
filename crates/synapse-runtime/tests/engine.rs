//! The continuous-batching engine on the default real model (Gemma 3 270M Q4_K_M): batch
//! invariance (every logit bit for bit), decode not starved by a long prefill, cancellation
//! at every point with safe slot reuse, the prefix cache equal to a fresh run, admission
//! limits.

mod common;

use std::sync::Arc;
use std::time::Instant;

use synapse_runtime::engine::{
    Engine, EngineConfig, Event, FinishReason, Request, Scheduler, Session, SubmitError,
    TokenPieces,
};
use synapse_runtime::{
    Executor, GenerateParams, KvCache, KvDtype, Model, OrderClass, Row, generate, prompt_order,
};
use synapse_tokenizer::Tokenizer;

struct Pieces(Tokenizer);

impl TokenPieces for Pieces {
    fn piece(&self, token: u32) -> Vec<u8> {
        self.0
            .token_to_piece(token, false)
            .unwrap_or_default()
            .to_vec()
    }
}

fn setup() -> Option<(Arc<Model>, Arc<Pieces>)> {
    let path = common::default_model();
    if !common::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return None;
    }
    let model = Arc::new(Model::load(&path).unwrap());
    let f = synapse_formats::gguf::GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    Some((model, Arc::new(Pieces(tok))))
}

fn encode(p: &Pieces, text: &str) -> Vec<u32> {
    p.0.encode(text, true, false).unwrap()
}

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old \
     woodcutter and his three daughters. Every morning the woodcutter",
    "def fibonacci(n):",
    "Hi",
    "The three primary colors are red, blue and",
];

/// Each session alone in its own engine: the reference the batched runs must equal.
fn solo(model: &Arc<Model>, pieces: &Arc<Pieces>, cfg: &EngineConfig, req: Request) -> Vec<Event> {
    let mut cfg = cfg.clone();
    cfg.slots = 1;
    let mut s = Scheduler::new(model.clone(), pieces.clone(), cfg).unwrap();
    let mut sess = s.submit(req).unwrap();
    while s.step() {}
    drain(&mut sess)
}

fn drain(s: &mut Session) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(e) = s.try_next() {
        out.push(e);
    }
    out
}

fn tokens(ev: &[Event]) -> Vec<u32> {
    ev.iter()
        .filter_map(|e| match e {
            Event::Token(t) => Some(t.id),
            _ => None,
        })
        .collect()
}

fn text(ev: &[Event]) -> String {
    let mut s = String::new();
    for e in ev {
        match e {
            Event::Token(t) => s.push_str(&t.text),
            Event::Done(d) => s.push_str(&d.tail),
            _ => {}
        }
    }
    s
}

fn finished(ev: &[Event]) -> &synapse_runtime::engine::Finished {
    match ev.last() {
        Some(Event::Done(d)) => d,
        other => panic!("last event is not Done: {other:?}"),
    }
}

fn req(prompt: Vec<u32>, n: usize, i: usize) -> Request {
    let mut r = Request::greedy(prompt, n);
    r.logprobs = Some(5);
    if i % 2 == 1 {
        // Some sessions sample (seeded): their draws depend only on their own logits.
        r.sampling.temperature = 0.8;
        r.sampling.top_k = 40;
        r.sampling.seed = 1000 + i as u64;
    }
    r.stop_at_eog = false;
    r
}

use common::bits;

fn small_cfg() -> EngineConfig {
    EngineConfig {
        slots: 4,
        ctx: 256,
        ubatch: 16,
        step_tokens: 24,
        queue: 16,
        kv_dtype: KvDtype::F32,
        threads: 2,
        memory: None,
        ..EngineConfig::default()
    }
}

/// Executor level, every logit: sessions of every order class (prompt batches of 1, 3, 9
/// and 16+ rows, then decode rows) in one ragged pass against each session alone.
#[test]
fn ragged_batch_matches_independent() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let vocab = model.vocab();
    let ub = 16;
    let mut prompts: Vec<Vec<u32>> = ["Hi", "The capital of France is", PROMPTS[2], "1, 2, 3"]
        .iter()
        .map(|t| encode(&pieces, t))
        .collect();
    // 33 tokens: batches of 16, 16 and a one-row tail.
    prompts[2].truncate(2 * ub + 1);
    // prompt_order classes present: One (a 1-token tail batch), Few, Many.
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    eprintln!("prompt lengths {lens:?}");
    let steps = 4;
    // Alone: prefill in ubatch passes, then `steps` decode steps feeding back argmax.
    let alone = |p: &[u32]| -> Vec<Vec<f32>> {
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 128, ub).unwrap();
        kv.open(0).unwrap();
        let mut ex = Executor::new(model.clone(), 2).unwrap();
        let mut out = Vec::new();
        for (c, part) in p.chunks(ub).enumerate() {
            let rows: Vec<Row> = part
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    let pos = c * ub + i;
                    Row {
                        slot: 0,
                        pos: pos as u32,
                        token: t,
                        logits: pos + 1 == p.len(),
                        order: prompt_order(pos, p.len(), ub),
                    }
                })
                .collect();
            let l = ex.forward(&mut kv, &rows).unwrap();
            if !l.is_empty() {
                out.push(l.to_vec());
            }
        }
        for s in 0..steps {
            let next = synapse_runtime::argmax(out.last().unwrap());
            let l = ex
                .forward(&mut kv, &[Row::decode(0, (p.len() + s) as u32, next)])
                .unwrap();
            out.push(l.to_vec());
        }
        out
    };
    let want: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| alone(p)).collect();

    // Together: every pass mixes the sessions' prompt chunks (cut at 5 rows, not at ubatch
    // boundaries) and decode rows, in a rotating session order.
    let n = prompts.len();
    let mut kv = KvCache::new(&model, KvDtype::F32, n, 128, ub).unwrap();
    let mut ex = Executor::new(model.clone(), 2).unwrap();
    for s in 0..n {
        kv.open(s as u32).unwrap();
    }
    let mut pos = vec![0usize; n];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n];
    let mut pass = 0;
    while (0..n).any(|s| got[s].len() < steps + 1) {
        let mut rows = Vec::new();
        let mut owners = Vec::new();
        for k in 0..n {
            let s = (k + pass) % n;
            let p = &prompts[s];
            if got[s].len() > steps {
                continue;
            }
            if pos[s] < p.len() {
                let end = (pos[s] + 5).min(p.len());
                for q in pos[s]..end {
                    rows.push(Row {
                        slot: s as u32,
                        pos: q as u32,
                        token: p[q],
                        logits: q + 1 == p.len(),
                        order: prompt_order(q, p.len(), ub),
                    });
                    if q + 1 == p.len() {
                        owners.push(s);
                    }
                }
                pos[s] = end;
            } else {
                let next = synapse_runtime::argmax(got[s].last().unwrap());
                rows.push(Row::decode(s as u32, pos[s] as u32, next));
                owners.push(s);
                pos[s] += 1;
            }
        }
        let out = ex.forward(&mut kv, &rows).unwrap();
        for (j, &s) in owners.iter().enumerate() {
            got[s].push(out[j * vocab..(j + 1) * vocab].to_vec());
        }
        pass += 1;
    }
    for s in 0..n {
        assert_eq!(got[s].len(), want[s].len());
        for (step, (g, w)) in got[s].iter().zip(&want[s]).enumerate() {
            let diff = g
                .iter()
                .zip(w)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                diff, None,
                "session {s} (prompt {} tokens) step {step}: logit differs at {diff:?}",
                lens[s]
            );
        }
    }
    // The classes the test claims to cover.
    let classes: Vec<OrderClass> = prompts
        .iter()
        .flat_map(|p| (0..p.len()).map(|q| prompt_order(q, p.len(), ub)))
        .collect();
    for c in [OrderClass::One, OrderClass::Few, OrderClass::Many] {
        assert!(classes.contains(&c), "no prompt row of class {c:?}");
    }
}

/// Engine level: six concurrent sessions (greedy and seeded sampling, prompts cut by the
/// step budget) give exactly the tokens and log-probability bits of each alone.
#[test]
fn concurrent_sessions_equal_their_solo_runs() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let cfg = small_cfg();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|t| encode(&pieces, t)).collect();
    let want: Vec<Vec<Event>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| solo(&model, &pieces, &cfg, req(p.clone(), 12, i)))
        .collect();
    let engine = Engine::start(model.clone(), pieces.clone(), cfg).unwrap();
    let mut sessions: Vec<Session> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| engine.submit(req(p.clone(), 12, i)).unwrap())
        .collect();
    for (i, s) in sessions.iter_mut().enumerate() {
        let mut ev = Vec::new();
        while let Some(e) = s.blocking_next() {
            let end = matches!(e, Event::Done(_) | Event::Error(_));
            ev.push(e);
            if end {
                break;
            }
        }
        assert_eq!(tokens(&ev).len(), 12, "session {i}: {ev:?}");
        assert_eq!(bits(&ev), bits(&want[i]), "session {i}");
        assert_eq!(text(&ev), text(&want[i]), "session {i}");
        assert_eq!(finished(&ev).reason, FinishReason::Length);
    }
    let st = engine.stats();
    assert_eq!(st.generated_tokens, 6 * 12);
    engine.shutdown();
    assert_eq!(engine.stats().active, 0);
}

/// A long prompt arriving while a session decodes: the decoding session gets one token in
/// every step of the prefill (which the step budget cuts into chunks).
#[test]
fn long_prefill_does_not_starve_decode() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let mut cfg = small_cfg();
    cfg.ctx = 1024;
    cfg.ubatch = 64;
    cfg.step_tokens = 65;
    let mut s = Scheduler::new(model.clone(), pieces.clone(), cfg).unwrap();
    let mut a = s
        .submit(Request {
            stop_at_eog: false,
            ..Request::greedy(encode(&pieces, "The capital of France is"), 400)
        })
        .unwrap();
    while !drain(&mut a).iter().any(|e| matches!(e, Event::Token(_))) {
        s.step();
    }
    let long: Vec<u32> = encode(&pieces, &PROMPTS[2].repeat(12));
    let long_len = long.len();
    assert!(long_len > 300, "{long_len}");
    let mut b = s.submit(Request::greedy(long, 4)).unwrap();
    let mut steps = 0;
    let mut gaps = Vec::new();
    let mut last = Instant::now();
    loop {
        s.step();
        steps += 1;
        let ea = drain(&mut a);
        let got = ea.iter().filter(|e| matches!(e, Event::Token(_))).count();
        assert_eq!(
            got, 1,
            "step {steps}: the decoding session got {got} tokens"
        );
        gaps.push(last.elapsed().as_secs_f64() * 1e3);
        last = Instant::now();
        if drain(&mut b).iter().any(|e| matches!(e, Event::Token(_))) {
            break;
        }
    }
    // The prefill took ceil(len / 64) steps, each with the decode row first.
    assert_eq!(steps, long_len.div_ceil(64));
    gaps.sort_by(f64::total_cmp);
    eprintln!(
        "long prefill of {long_len} tokens over {steps} steps; decode inter-token gap \
         median {:.1} ms, max {:.1} ms",
        gaps[gaps.len() / 2],
        gaps[gaps.len() - 1]
    );
}

/// Cancelled while queued, mid-prefill and mid-decode: each frees its slot at the next step,
/// and a session that then reuses the slot gets exactly its solo result.
#[test]
fn cancelled_slot_reused_safely() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let mut cfg = small_cfg();
    cfg.slots = 1;
    cfg.step_tokens = 8;
    let probe = encode(&pieces, PROMPTS[5]);
    let want = solo(&model, &pieces, &cfg, req(probe.clone(), 10, 0));
    let mut s = Scheduler::new(model.clone(), pieces.clone(), cfg).unwrap();

    // Mid-prefill: a long prompt, cancelled after its first chunk.
    let mut a = s.submit(req(encode(&pieces, PROMPTS[2]), 10, 1)).unwrap();
    // Queued behind it, cancelled before admission.
    let mut q = s.submit(req(encode(&pieces, PROMPTS[0]), 10, 2)).unwrap();
    s.step();
    assert_eq!(s.active(), 1);
    assert!(
        drain(&mut a)
            .iter()
            .any(|e| matches!(e, Event::Admitted { .. }))
    );
    a.cancel();
    q.cancel();
    s.step();
    let ea = drain(&mut a);
    assert!(matches!(ea.last(), Some(Event::Done(d)) if d.reason == FinishReason::Cancelled));
    let eq = drain(&mut q);
    assert!(matches!(eq.last(), Some(Event::Done(d)) if d.reason == FinishReason::Cancelled));
    // Mid-decode: dropped (a client that went away) after three tokens.
    let mut d = s.submit(req(encode(&pieces, PROMPTS[3]), 50, 3)).unwrap();
    let mut n = 0;
    while n < 3 {
        s.step();
        n += drain(&mut d)
            .iter()
            .filter(|e| matches!(e, Event::Token(_)))
            .count();
    }
    drop(d);
    // The probe reuses the one slot after all of that.
    let mut p = s.submit(req(probe, 10, 0)).unwrap();
    while s.step() {}
    let ep = drain(&mut p);
    assert_eq!(bits(&ep), bits(&want));
    assert_eq!(text(&ep), text(&want));
    assert!(s.is_idle());
    let st = s.kv();
    assert_eq!(st.n_slots(), 1);
}

/// A second turn and a shared system prompt skip their prefill, and equal a fresh run.
#[test]
fn prefix_cache_equals_fresh_run() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let cfg = small_cfg();
    let system = "You are a helpful assistant who answers questions about geography in one short \
                  sentence, politely and precisely. Question: ";
    let p1 = encode(&pieces, &format!("{system}What is the capital of France?"));
    let p2 = encode(&pieces, &format!("{system}What is the capital of Spain?"));
    let fresh2 = solo(&model, &pieces, &cfg, req(p2.clone(), 8, 0));
    let mut s = Scheduler::new(model.clone(), pieces.clone(), cfg.clone()).unwrap();
    // Cached in a free slot after the first session ends.
    let mut a = s.submit(req(p1.clone(), 8, 0)).unwrap();
    while s.step() {}
    drain(&mut a);
    let mut b = s.submit(req(p2.clone(), 8, 0)).unwrap();
    while s.step() {}
    let eb = drain(&mut b);
    let hit = finished(&eb).cached_tokens;
    assert!(hit >= 16, "reused {hit} of {}", p2.len());
    assert_eq!(bits(&eb), bits(&fresh2));

    // Copied from a running session: c runs, d arrives with the same system prompt.
    let mut s = Scheduler::new(model.clone(), pieces.clone(), cfg).unwrap();
    let mut c = s.submit(req(p1, 30, 0)).unwrap();
    for _ in 0..6 {
        s.step();
    }
    let mut d = s.submit(req(p2.clone(), 8, 0)).unwrap();
    while s.step() {}
    drain(&mut c);
    let ed = drain(&mut d);
    let hit = finished(&ed).cached_tokens;
    assert!(hit >= 16, "copied {hit} of {}", p2.len());
    assert_eq!(bits(&ed), bits(&fresh2));
    // And the plain single-session loop agrees on the tokens.
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, 256, 16).unwrap();
    let mut ex = Executor::new(model.clone(), 2).unwrap();
    let g = generate(
        &mut ex,
        &mut kv,
        0,
        &p2,
        &GenerateParams {
            max_tokens: 8,
            stop_at_eog: false,
            prefill_chunk: 16,
            ..GenerateParams::default()
        },
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(g.tokens, tokens(&ed));
}

/// Stop strings end the session and never reach the text; max_tokens and EOG end it too.
#[test]
fn stop_strings_and_limits() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let cfg = small_cfg();
    let p = encode(&pieces, PROMPTS[0]);
    let full = solo(&model, &pieces, &cfg, req(p.clone(), 16, 0));
    let full_text = text(&full);
    // A stop string from the middle of the greedy text.
    let stop = full_text[6..12].to_string();
    let at = full_text.find(&stop).unwrap();
    let mut r = req(p.clone(), 16, 0);
    r.stop = vec![stop.clone()];
    let ev = solo(&model, &pieces, &cfg, r);
    assert_eq!(text(&ev), full_text[..at], "stop {stop:?}");
    assert_eq!(finished(&ev).reason, FinishReason::Stop);
    // EOG: the Rust prompt of the parity fixtures stops at EOS.
    let mut r = Request::greedy(
        encode(&pieces, "fn main() {\n    println!(\"Hello, world!\");\n}"),
        64,
    );
    r.stop_at_eog = true;
    let ev = solo(&model, &pieces, &cfg, r);
    let f = finished(&ev);
    assert!(
        f.reason == FinishReason::Stop || f.completion_tokens == 64,
        "{f:?}"
    );
}

/// The bounded queue and the context limit.
#[test]
fn admission_limits() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let mut cfg = small_cfg();
    cfg.slots = 1;
    cfg.queue = 2;
    let engine = Engine::start(model.clone(), pieces.clone(), cfg.clone()).unwrap();
    let p = encode(&pieces, PROMPTS[0]);
    let long: Vec<u32> = std::iter::repeat_n(p[1], cfg.ctx).collect();
    assert!(matches!(
        engine.submit(Request::greedy(long, 4)),
        Err(SubmitError::PromptTooLong { .. })
    ));
    assert!(matches!(
        engine.submit(Request::greedy(vec![u32::MAX], 4)),
        Err(SubmitError::Invalid { .. })
    ));
    let mut huge = Request::greedy(p.clone(), 4);
    huge.logprobs = Some(1 << 40);
    assert!(matches!(
        engine.submit(huge),
        Err(SubmitError::Invalid { .. })
    ));
    let mut held = Vec::new();
    let mut full = false;
    for _ in 0..8 {
        match engine.submit(Request::greedy(p.clone(), 200)) {
            Ok(s) => held.push(s),
            Err(SubmitError::QueueFull { retry_after_s, .. }) => {
                assert!(retry_after_s >= 1);
                full = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        full,
        "8 requests into 1 slot + 2 queue places were all accepted"
    );
    assert!(held.len() <= 3, "{}", held.len());
    drop(held);
    // Everything cancelled: the engine drains to zero.
    let t = Instant::now();
    while engine.stats().active + engine.stats().queued > 0 {
        assert!(t.elapsed().as_secs() < 60, "{:?}", engine.stats());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(engine.stats().rejected >= 1);
    // A memory budget too small for the KV is refused at start (with the weights that do not
    // page and nothing for the blocks, which do).
    let mut small = cfg;
    small.memory = Some(
        model.weight_bytes() as u64
            - synapse_runtime::residency::LayerPager::pageable_bytes(&model, 0..model.layers.len()),
    );
    match Engine::start(model, pieces, small.clone()) {
        Err(synapse_runtime::RuntimeError::MemoryBudget { budget, reason }) => {
            assert_eq!(Some(budget), small.memory);
            assert!(reason.contains("slots fit"), "{reason}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// Regression (a CI run of the server's queue-full test): a session being admitted was for a
/// moment neither pending nor active in the gauges, so a request submitted then was accepted
/// past a full queue; and a session's `Done` went out before its slot counted free, so a client
/// resubmitting at once was refused. One slot, no queue: a submission is accepted only once the
/// running session has sent all its tokens, and right after its `Done` one is accepted.
#[test]
fn admission_gauges_have_no_gap() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let mut cfg = small_cfg();
    cfg.slots = 1;
    cfg.queue = 0;
    let engine = Engine::start(model, pieces.clone(), cfg).unwrap();
    let p = encode(&pieces, PROMPTS[2]);
    const N: usize = 6;
    for round in 0..3 {
        let mut a = engine
            .submit(Request {
                stop_at_eog: false,
                ..Request::greedy(p.clone(), N)
            })
            .unwrap();
        let mut tokens = 0;
        let mut done = false;
        let count = |e: Event, tokens: &mut usize, done: &mut bool| match e {
            Event::Token(_) => *tokens += 1,
            Event::Done(_) => *done = true,
            Event::Error(e) => panic!("{e}"),
            Event::Admitted { .. } => {}
        };
        // Hammer the engine while `a` is admitted, prefilled and decoded.
        let mut refused = 0;
        let mut next = loop {
            match engine.submit(Request::greedy(p.clone(), 1)) {
                Ok(b) => break Some(b),
                Err(SubmitError::QueueFull { .. }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
            while let Some(e) = a.try_next() {
                count(e, &mut tokens, &mut done);
            }
            if done {
                break None;
            }
        };
        if next.is_some() {
            // Accepted before `a`'s Done arrived: `a` must have released its slot, so all its
            // tokens were already sent.
            while let Some(e) = a.try_next() {
                count(e, &mut tokens, &mut done);
            }
            assert_eq!(tokens, N, "round {round}: accepted while the slot was busy");
        } else {
            assert!(refused > 0);
            // Right after Done the slot is free.
            let b = engine.submit(Request::greedy(p.clone(), 1));
            assert!(b.is_ok(), "round {round}: refused right after Done: {b:?}");
            next = b.ok();
        }
        let mut b = next.unwrap();
        while let Some(e) = b.blocking_next() {
            if matches!(e, Event::Done(_)) {
                break;
            }
        }
    }
}

/// A precision profile installed while serving: the sessions admitted after it run on it
/// (bit for bit as alone on that profile), a session already running finishes on its own
/// (bit for bit as alone on the source), and no K/V crosses profiles — a prompt cached
/// under one profile is not reused under the other, and is again once its profile returns.
#[test]
fn a_new_profile_serves_new_sessions_while_running_ones_keep_theirs() {
    let Some((model, pieces)) = setup() else {
        return;
    };
    let cfg = small_cfg();
    let q4 = synapse_codecs::EncodingId::Symmetric { bits: 4, group: 64 };
    let changes: std::collections::BTreeMap<String, synapse_codecs::EncodingId> =
        synapse_runtime::importance::linears(&model)
            .into_iter()
            .take(7)
            .map(|(n, _)| (n, q4))
            .collect();
    let variant = Arc::new(model.with_encodings(&changes).unwrap());
    let (pa, pb) = (encode(&pieces, PROMPTS[2]), encode(&pieces, PROMPTS[0]));
    let ref_a = bits(&solo(&model, &pieces, &cfg, req(pa.clone(), 24, 0)));
    let ref_b = bits(&solo(&variant, &pieces, &cfg, req(pb.clone(), 16, 2)));
    let ref_b_source = bits(&solo(&model, &pieces, &cfg, req(pb.clone(), 16, 2)));
    assert_ne!(ref_b, ref_b_source, "the profile changes the logits");

    let mut s = Scheduler::new(model.clone(), pieces.clone(), cfg.clone()).unwrap();
    let mut a = s.submit(req(pa.clone(), 24, 0)).unwrap();
    for _ in 0..4 {
        assert!(s.step());
    }
    s.install(variant.clone()).unwrap();
    assert_eq!(s.executor().model().profile.hash(), variant.profile.hash());
    // Installing it again is a no-op.
    s.install(variant.clone()).unwrap();
    let mut b = s.submit(req(pb.clone(), 16, 2)).unwrap();
    // The same prompt as the running source session: nothing of its K/V is borrowed.
    let mut c = s.submit(req(pa.clone(), 24, 0)).unwrap();
    while s.step() {}
    let (ea, eb, ec) = (drain(&mut a), drain(&mut b), drain(&mut c));
    assert_eq!(
        bits(&ea),
        ref_a,
        "the running session kept the source profile"
    );
    assert_eq!(bits(&eb), ref_b, "a new session runs on the new profile");
    assert_eq!(finished(&ec).cached_tokens, 0);
    let ref_c = bits(&solo(&variant, &pieces, &cfg, req(pa.clone(), 24, 0)));
    assert_eq!(bits(&ec), ref_c);
    // Back to the source: the prompt cached under it is reused, with the same bits.
    s.install(model.clone()).unwrap();
    let mut d = s.submit(req(pa.clone(), 24, 0)).unwrap();
    while s.step() {}
    let ed = drain(&mut d);
    assert!(
        finished(&ed).cached_tokens > 0,
        "the source profile's prefix again"
    );
    assert_eq!(bits(&ed), ref_a);

    // Through the engine: `info()` follows the installed profile, `stats()` counts changes.
    let engine = Engine::start(model.clone(), pieces.clone(), cfg.clone()).unwrap();
    assert_eq!(engine.info().profile, model.profile.hash());
    engine.install(variant.clone()).unwrap();
    assert_eq!(engine.info().profile, variant.profile.hash());
    assert_eq!(engine.info().weight_bytes, variant.weight_bytes() as u64);
    assert_eq!(engine.stats().profile_changes, 1);
    let mut tight = cfg.clone();
    let kv = KvCache::new(&model, KvDtype::F32, tight.slots, tight.ctx, tight.ubatch)
        .unwrap()
        .slot_bytes()
        * tight.slots;
    let scratch =
        model.pass_scratch_bytes(tight.step_tokens, tight.slots + 1, tight.ctx, tight.threads);
    tight.memory = Some(variant.weight_bytes() as u64 + kv as u64 + scratch);
    // Over the memory budget, a profile pages its blocks within what the rest leaves, as the
    // engine would at start under that budget (the source's blocks are the file's) ...
    let smaller = Engine::start(variant.clone(), pieces.clone(), tight.clone()).unwrap();
    smaller.install(model.clone()).unwrap();
    assert_eq!(smaller.info().profile, model.profile.hash());
    // ... and one whose blocks cannot page (re-encoded in memory, without a variant cache)
    // is refused; nothing changes.
    let fewer: std::collections::BTreeMap<_, _> = changes.into_iter().take(3).collect();
    let larger = Arc::new(model.with_encodings(&fewer).unwrap());
    assert!(larger.weight_bytes() > variant.weight_bytes());
    let other = Engine::start(variant.clone(), pieces.clone(), tight).unwrap();
    assert!(other.install(larger).is_err());
    assert_eq!(other.info().profile, variant.profile.hash());
    engine.shutdown();
    smaller.shutdown();
    other.shutdown();
}
