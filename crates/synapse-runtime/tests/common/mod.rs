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
/// checking that the progress callback counts every linear and routed expert tensor.
pub fn tiny_importance_map(
    model: &std::sync::Arc<synapse_runtime::Model>,
    toks: &[u32],
) -> synapse_sensitivity::ImportanceMap {
    use synapse_runtime::importance::{ImportanceParams, build_importance_map};
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
    assert_eq!(seen, synapse_runtime::precision::assignable(model).len());
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

/// Counts of the tokens at output positions 1 and 2 over `n` seeds.
#[allow(dead_code)]
pub fn token_counts(
    n: u64,
    mut run: impl FnMut(u64) -> Vec<u32>,
) -> std::collections::BTreeMap<(usize, u32), f64> {
    let mut m = std::collections::BTreeMap::new();
    for seed in 0..n {
        let t = run(seed);
        for at in [1, 2] {
            *m.entry((at, t[at])).or_insert(0.0) += 1.0;
        }
    }
    m
}

/// A two-sample chi-square homogeneity statistic over the categories of position `at`
/// (categories with fewer than 10 expected pooled), as a Wilson–Hilferty z score.
#[allow(dead_code)]
pub fn homogeneity_z(
    a: &std::collections::BTreeMap<(usize, u32), f64>,
    b: &std::collections::BTreeMap<(usize, u32), f64>,
    at: usize,
) -> f64 {
    let mut keys: Vec<u32> = a
        .keys()
        .chain(b.keys())
        .filter(|k| k.0 == at)
        .map(|k| k.1)
        .collect();
    keys.sort();
    keys.dedup();
    let (na, nb): (f64, f64) = (
        a.iter().filter(|e| e.0.0 == at).map(|e| e.1).sum(),
        b.iter().filter(|e| e.0.0 == at).map(|e| e.1).sum(),
    );
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut rest = (0.0, 0.0);
    for k in keys {
        let x = (
            *a.get(&(at, k)).unwrap_or(&0.0),
            *b.get(&(at, k)).unwrap_or(&0.0),
        );
        if x.0 + x.1 < 20.0 {
            rest = (rest.0 + x.0, rest.1 + x.1);
        } else {
            cells.push(x);
        }
    }
    if rest.0 + rest.1 > 0.0 {
        cells.push(rest);
    }
    let mut chi = 0.0;
    for (x, y) in &cells {
        let t = x + y;
        let (ea, eb) = (t * na / (na + nb), t * nb / (na + nb));
        chi += (x - ea).powi(2) / ea + (y - eb).powi(2) / eb;
    }
    let d = (cells.len() - 1).max(1) as f64;
    ((chi / d).powf(1.0 / 3.0) - (1.0 - 2.0 / (9.0 * d))) / (2.0 / (9.0 * d)).sqrt()
}

/// Sampling at temperature 1 with top-k 40, `seed`, `max_tokens` tokens, end-of-generation ignored.
#[allow(dead_code)]
pub fn sampled_params(seed: u64, max_tokens: usize) -> synapse_runtime::GenerateParams {
    let mut p = synapse_runtime::GenerateParams {
        max_tokens,
        stop_at_eog: false,
        ..synapse_runtime::GenerateParams::default()
    };
    p.sampling.temperature = 1.0;
    p.sampling.top_k = 40;
    p.sampling.seed = seed;
    p
}

/// Token pieces that show the id (`<id>`): stop strings and text need no tokenizer.
#[allow(dead_code)]
pub struct Ids;

impl synapse_runtime::engine::TokenPieces for Ids {
    fn piece(&self, token: u32) -> Vec<u8> {
        format!("<{token}>").into_bytes()
    }
}

/// The events a session has sent so far.
#[allow(dead_code)]
pub fn drain(s: &mut synapse_runtime::engine::Session) -> Vec<synapse_runtime::engine::Event> {
    let mut out = Vec::new();
    while let Some(e) = s.try_next() {
        out.push(e);
    }
    out
}

/// (id, log-probability bits) of every token, and whether the stream ended with `Done`.
#[allow(dead_code)]
pub fn tokens(ev: &[synapse_runtime::engine::Event]) -> (Vec<(u32, u32)>, bool) {
    use synapse_runtime::engine::Event;
    let t = ev
        .iter()
        .filter_map(|e| match e {
            Event::Token(t) => Some((t.id, t.logprob.as_ref().map_or(0, |l| l.logprob.to_bits()))),
            _ => None,
        })
        .collect();
    (t, matches!(ev.last(), Some(Event::Done(_))))
}

/// `n` prompts of 3–11 tokens cut from `toks` at spread-out places.
#[allow(dead_code)]
pub fn prompts(toks: &[u32], n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let start = (i * 7) % (toks.len() - 12);
            toks[start..start + 3 + i % 9].to_vec()
        })
        .collect()
}

/// Runs `reqs` on a scheduler of `model` with `cfg`, cancelling the sessions in `cancel_at`
/// (index → step) and submitting the rest as slots free up; returns each session's events
/// and the scheduler (its stats and state after the run).
#[allow(dead_code)]
pub fn run_replacing(
    model: &std::sync::Arc<synapse_runtime::Model>,
    cfg: &synapse_runtime::engine::EngineConfig,
    reqs: Vec<synapse_runtime::engine::Request>,
    cancel_at: &[(usize, usize)],
) -> (
    Vec<Vec<synapse_runtime::engine::Event>>,
    synapse_runtime::engine::Scheduler,
) {
    use synapse_runtime::engine::{Event, Request, Scheduler, Session};
    let mut s = Scheduler::new(model.clone(), std::sync::Arc::new(Ids), cfg.clone()).unwrap();
    let n = reqs.len();
    let mut pending: std::collections::VecDeque<(usize, Request)> =
        reqs.into_iter().enumerate().collect();
    let mut sessions: Vec<Option<Session>> = (0..n).map(|_| None).collect();
    let mut events: Vec<Vec<Event>> = vec![Vec::new(); n];
    let mut step = 0;
    loop {
        // Replacement: a new session whenever a slot is free.
        while s.active() + s.waiting() < cfg.slots {
            let Some((i, r)) = pending.pop_front() else {
                break;
            };
            sessions[i] = Some(s.submit(r).unwrap());
        }
        for &(i, at) in cancel_at {
            if at == step
                && let Some(ss) = &sessions[i]
            {
                ss.cancel();
            }
        }
        let ran = s.step();
        step += 1;
        for (i, ss) in sessions.iter_mut().enumerate() {
            if let Some(ss) = ss {
                events[i].extend(drain(ss));
            }
        }
        if !ran && pending.is_empty() && s.is_idle() {
            break;
        }
        assert!(step < 10_000, "the engine did not finish");
    }
    (events, s)
}

/// `req` alone in a one-slot engine of `cfg` without any draft, escalation off: the
/// reference its tokens (id, log-probability bits) must equal.
#[allow(dead_code)]
pub fn solo(
    model: &std::sync::Arc<synapse_runtime::Model>,
    cfg: &synapse_runtime::engine::EngineConfig,
    mut req: synapse_runtime::engine::Request,
) -> Vec<(u32, u32)> {
    let mut cfg = cfg.clone();
    cfg.slots = 1;
    cfg.step_tokens = cfg.step_tokens.max(2);
    cfg.draft = None;
    cfg.head_draft = None;
    req.escalation = false;
    let mut s =
        synapse_runtime::engine::Scheduler::new(model.clone(), std::sync::Arc::new(Ids), cfg)
            .unwrap();
    let mut sess = s.submit(req).unwrap();
    while s.step() {}
    tokens(&drain(&mut sess)).0
}

/// Cache / resume / fresh under drafting: a first turn (`mk(prompt, max_tokens)`) runs on a
/// scheduler of `cfg`; a second turn whose prompt is the first's, its output and new tokens
/// reuses the slot's prefix (at least the first prompt) and equals a fresh plain run.
#[allow(dead_code)]
pub fn second_turn_reuses_prefix(
    model: &std::sync::Arc<synapse_runtime::Model>,
    cfg: &synapse_runtime::engine::EngineConfig,
    toks: &[u32],
    mk: impl Fn(Vec<u32>, usize) -> synapse_runtime::engine::Request,
) {
    use synapse_runtime::engine::{Event, Scheduler};
    let mut s = Scheduler::new(model.clone(), std::sync::Arc::new(Ids), cfg.clone()).unwrap();
    let first = toks[..9].to_vec();
    let mut a = s.submit(mk(first.clone(), 20)).unwrap();
    while s.step() {}
    let ev1 = drain(&mut a);
    let (t1, done) = tokens(&ev1);
    assert!(done, "{ev1:?}");
    // Turn two: the conversation so far plus new tokens.
    let mut second = first.clone();
    second.extend(t1.iter().map(|t| t.0));
    second.extend_from_slice(&toks[20..25]);
    let mut b = s.submit(mk(second.clone(), 15)).unwrap();
    while s.step() {}
    let ev = drain(&mut b);
    let cached = ev.iter().find_map(|e| match e {
        Event::Admitted { cached_tokens } => Some(*cached_tokens),
        _ => None,
    });
    assert!(cached.unwrap_or(0) >= first.len() - 1, "{cached:?}");
    assert_eq!(tokens(&ev).0, solo(model, cfg, mk(second, 15)));
    assert!(s.stats().drafted > 0);
}

/// The default model (Gemma 3 270M Q4_K_M) and 200 spread-out ordinary token ids to cut
/// prompts from (`None`, skipped locally, when the model is absent).
#[allow(dead_code)]
pub fn default_model_and_ids() -> Option<(std::sync::Arc<synapse_runtime::Model>, Vec<u32>)> {
    let path = default_model();
    if !require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return None;
    }
    let model = std::sync::Arc::new(synapse_runtime::Model::load(&path).unwrap());
    Some((model, (0..200u32).map(|i| 2 + (i * 7919) % 20000).collect()))
}

/// Every session of `got` ended with `Done` and its tokens (id, log-probability bits) equal
/// its reference in `refs` — a prefix of it for the sessions cancelled (`cancel`).
#[allow(dead_code)]
pub fn assert_sessions_match(
    got: &[Vec<synapse_runtime::engine::Event>],
    refs: &[Vec<(u32, u32)>],
    cancel: &[(usize, usize)],
) {
    for (i, ev) in got.iter().enumerate() {
        let (t, done) = tokens(ev);
        assert!(done, "session {i} did not finish: {ev:?}");
        if cancel.iter().any(|c| c.0 == i) {
            // A cancelled session's tokens so far are a prefix of the reference.
            assert_eq!(&refs[i][..t.len()], &t[..], "cancelled session {i}");
        } else {
            assert_eq!(t, refs[i], "session {i}");
        }
    }
}

/// Resident bytes of the mappings of `file` (or of the files under it, for a directory), from
/// `/proc/self/smaps` (a page-table walk: exact, where `/proc/self/status` counters lag).
#[allow(dead_code)]
pub fn mapped_rss(file: &Path) -> u64 {
    let name = file.to_string_lossy();
    let dir = file.is_dir();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut kb = 0u64;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            inside = if dir {
                line.contains(&format!("{name}/"))
            } else {
                line.ends_with(name.as_ref())
            };
        } else if inside && line.starts_with("Rss:") {
            kb += line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    kb * 1024
}

/// `src` imported as a self-contained package directory `dir`.
#[allow(dead_code)]
pub fn import_dir(src: &Path, dir: &Path) {
    synapse_import::import(
        src,
        &synapse_import::Destination::Directory(dir.to_path_buf()),
        &synapse_import::progress::Silent,
    )
    .unwrap();
}

/// Greedy tokens of `n` concurrent sessions in a scheduler with `memory` (session `i`: `prompt`
/// with its second token raised by `7·i`, `tokens + i` tokens, end-of-generation ignored),
/// and the scheduler's stats.
#[allow(dead_code)]
pub fn engine_greedy(
    m: &std::sync::Arc<synapse_runtime::Model>,
    memory: Option<u64>,
    n: u32,
    prompt: &[u32],
    tokens: usize,
) -> (Vec<Vec<u32>>, synapse_runtime::engine::EngineStats) {
    use synapse_runtime::engine::{EngineConfig, Scheduler};
    let cfg = EngineConfig {
        slots: n as usize,
        ctx: 128,
        ubatch: 32,
        step_tokens: 64,
        memory,
        ..EngineConfig::default()
    };
    let mut s = Scheduler::new(m.clone(), std::sync::Arc::new(Ids), cfg).unwrap();
    let toks = engine_greedy_on(&mut s, n, prompt, tokens);
    (toks, s.stats())
}

/// [`engine_greedy`]'s sessions on an existing scheduler (`n` slots at least): their tokens.
#[allow(dead_code)]
pub fn engine_greedy_on(
    s: &mut synapse_runtime::engine::Scheduler,
    n: u32,
    prompt: &[u32],
    tokens: usize,
) -> Vec<Vec<u32>> {
    use synapse_runtime::engine::{Event, Request};
    let mut sessions: Vec<_> = (0..n)
        .map(|i| {
            let mut p = prompt.to_vec();
            p[1] += 7 * i;
            let mut r = Request::greedy(p, tokens + i as usize);
            r.stop_at_eog = false;
            s.submit(r).unwrap()
        })
        .collect();
    let mut toks = vec![Vec::new(); n as usize];
    let mut done = 0;
    while done < n {
        s.step();
        for (i, ss) in sessions.iter_mut().enumerate() {
            while let Some(e) = ss.try_next() {
                match e {
                    Event::Token(t) => toks[i].push(t.id),
                    Event::Done(_) => done += 1,
                    Event::Error(e) => panic!("{e}"),
                    _ => {}
                }
            }
        }
    }
    toks
}

/// `m` at the profile `spec` (`uniform:ENCODING`), re-encoded through a variant cache in `store`
/// (so its re-encoded tensors are memory-mapped objects, as a pager needs them).
#[allow(dead_code)]
pub fn through_cache(
    m: &std::sync::Arc<synapse_runtime::Model>,
    spec: &str,
    store: &Path,
) -> std::sync::Arc<synapse_runtime::Model> {
    use synapse_runtime::precision::{Precision, apply};
    let cache = synapse_runtime::VariantCache::open(store).unwrap();
    apply(m, &Precision::parse_profile(spec).unwrap(), Some(&cache))
        .unwrap()
        .model
}
