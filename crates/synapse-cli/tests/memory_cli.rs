//! `generate --memory`: one budget over what generation holds. On a synthetic mixture of
//! experts the routed experts page within what the rest leaves (the same tokens as without a
//! budget, peak RSS above the process's start within the budget, the paging counters in
//! `--json`), also with exact escalation by a head-only draft (its shortlist counted; other
//! drafts refused under a budget); a budget too small to run the model is a clear error
//! before generation; the
//! default (dense) model runs within a budget that fits it, and below its weights pages its
//! blocks (the same tokens, peak RSS within the budget). `serve --memory` likewise: its
//! peak RSS above its start stays within the budget while concurrent requests page experts,
//! with the texts of an unbudgeted server.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{Server, http};

use serde_json::Value;
use synapse_testdata::synthetic_moe::{MoeShape, write};

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

fn cli(args: &[&str]) -> Output {
    cli_in(None, args)
}

/// `synapse-cli` with its store and stored importance maps in `dir` (when given).
fn cli_in(dir: Option<&Path>, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("RUST_BACKTRACE", "0")
        .env_remove("SYNAPSE_MODEL");
    if let Some(d) = dir {
        c.env("SYNAPSE_STORE", d.join("store"))
            .env("SYNAPSE_IMPORTANCE_DIR", d);
    }
    c.output().unwrap()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(s.lines().last().unwrap()).unwrap()
}

fn generate(model: &Path, memory: Option<&str>) -> Output {
    generate_in(None, model, memory, &[])
}

/// 24 greedy tokens of `model` (`--ctx 256`, `--json`) under `memory`, with `extra` flags,
/// store and maps in `dir`.
fn generate_in(dir: Option<&Path>, model: &Path, memory: Option<&str>, extra: &[&str]) -> Output {
    let m = model.to_str().unwrap();
    let mut a = vec![
        "generate",
        "--model",
        m,
        "-n",
        "24",
        "--ignore-eos",
        "--json",
        "--ctx",
        "256",
    ];
    if let Some(b) = memory {
        a.extend(["--memory", b]);
    }
    a.extend(extra);
    a.push("The quick brown fox jumps over the lazy dog");
    cli_in(dir, &a)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

#[test]
fn moe_experts_page_within_the_budget_with_the_same_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = MoeShape::small();
    let path = tmp.path().join(shape.file_name());
    write(&shape, &path).unwrap();
    let free = json(&generate(&path, None));
    assert!(free["memory"].is_null());
    // A generous budget shows the ledger: the fixed parts and the experts' bytes.
    let big = json(&generate(&path, Some("4G")));
    let m = &big["memory"];
    assert_eq!(big["tokens"], free["tokens"]);
    let fixed = u(&m["loaded"]) + u(&m["weights_outside_experts"]) + u(&m["kv"]) + u(&m["scratch"]);
    let experts = u(&m["experts_total"]);
    assert_eq!(u(&m["experts_budget"]), experts);
    // Every expert fits: nothing pages (they stay pages of the mapping).
    assert!(m["paging"].is_null());
    let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
    assert!(used <= fixed + experts, "peak RSS rose {used} B");
    for quarters in [2u64, 1] {
        let budget = fixed + experts * quarters / 4;
        let o = json(&generate(&path, Some(&budget.to_string())));
        let m = &o["memory"];
        assert_eq!(
            o["tokens"], free["tokens"],
            "{quarters}/4 of the experts: other tokens"
        );
        let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
        eprintln!(
            "{quarters}/4 of the experts: budget {:.1} MB, peak RSS above start {:.1} MB, \
             experts held {:.1} of {:.1} MB, hit rate {:.3}, {} misses, {} evictions",
            budget as f64 / 1e6,
            used as f64 / 1e6,
            u(&m["experts_held"]) as f64 / 1e6,
            experts as f64 / 1e6,
            m["paging"]["hit_rate"].as_f64().unwrap(),
            m["paging"]["misses"],
            m["paging"]["evictions"]
        );
        assert!(
            used <= budget,
            "peak RSS rose {used} B over a {budget} B budget"
        );
        assert!(u(&m["experts_held"]) <= u(&m["experts_budget"]));
        assert!(u(&m["paging"]["evictions"]) > 0);
    }
    // Exact escalation with a head-only draft runs under the budget too (the draft is the
    // model itself; its shortlist is counted): the same tokens, peak RSS within the budget.
    let budget = fixed + experts / 2 + (8 << 20);
    let b = budget.to_string();
    let m_ = path.to_str().unwrap();
    let o = json(&cli(&[
        "generate",
        "--model",
        m_,
        "-n",
        "24",
        "--ignore-eos",
        "--json",
        "--ctx",
        "256",
        "--memory",
        &b,
        "--escalation",
        "exact",
        "--draft-profile",
        "head:512",
        "The quick brown fox jumps over the lazy dog",
    ]));
    assert_eq!(o["tokens"], free["tokens"], "head-drafted under a budget");
    let m = &o["memory"];
    let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
    eprintln!(
        "head-drafted: budget {:.1} MB, peak RSS above start {:.1} MB, draft {:.2} MB, {} drafted",
        budget as f64 / 1e6,
        used as f64 / 1e6,
        u(&m["draft"]) as f64 / 1e6,
        o["escalation"]["drafted"]
    );
    assert!(u(&m["draft"]) > 0);
    assert!(
        used <= budget,
        "peak RSS rose {used} B over a {budget} B budget"
    );
    assert!(u(&o["escalation"]["drafted"]) > 0);
    // Another draft would sit outside the budget: refused before anything runs.
    let o = cli(&[
        "generate",
        "--model",
        m_,
        "--memory",
        &b,
        "--escalation",
        "exact",
        "--draft-profile",
        "uniform:syn.q8.symmetric.g64.v1",
        "hi",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("head-only draft"));

    // Too small for one expert beside the rest: refused before generation.
    let o = generate(&path, Some(&fixed.to_string()));
    assert!(!o.status.success());
    assert!(o.stdout.is_empty(), "generated before refusing");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("cannot run this model"), "{e}");
    assert!(e.contains("routed experts"), "{e}");
    // Nonsense sizes are refused too.
    let o = generate(&path, Some("lots"));
    assert!(!o.status.success());
}

/// A Synapse package (`import --out`) pages its experts under `--memory` as its GGUF does:
/// the GGUF's tokens, peak RSS above the start within the budget, experts held within theirs.
#[test]
fn a_package_pages_its_experts_within_the_budget_with_the_same_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = MoeShape::small();
    let path = tmp.path().join(shape.file_name());
    write(&shape, &path).unwrap();
    let free = json(&generate(&path, None));
    let pkg = tmp.path().join("pkg");
    let o = cli(&[
        "import",
        path.to_str().unwrap(),
        "--out",
        pkg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let big = json(&generate(&pkg, Some("4G")));
    assert_eq!(big["tokens"], free["tokens"], "the package unbudgeted");
    let m = &big["memory"];
    let fixed = u(&m["loaded"]) + u(&m["weights_outside_experts"]) + u(&m["kv"]) + u(&m["scratch"]);
    let experts = u(&m["experts_total"]);
    let budget = fixed + experts / 2;
    let o = json(&generate(&pkg, Some(&budget.to_string())));
    let m = &o["memory"];
    assert_eq!(
        o["tokens"], free["tokens"],
        "the package at half its experts"
    );
    let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
    eprintln!(
        "package at half its experts: budget {:.1} MB, peak RSS above start {:.1} MB, {} misses",
        budget as f64 / 1e6,
        used as f64 / 1e6,
        m["paging"]["misses"]
    );
    assert!(
        used <= budget,
        "peak RSS rose {used} B over a {budget} B budget"
    );
    assert!(u(&m["experts_held"]) <= u(&m["experts_budget"]));
    assert!(u(&m["paging"]["evictions"]) > 0);
}

/// A precision profile's re-encoded experts (objects of the variant cache) page under
/// `--memory` as the file's own do: the same tokens as the profile unbudgeted, peak RSS above
/// the start within the budget, and what loading the profile read (the source's pages, the
/// cached variants') not counted as held.
#[test]
fn re_encoded_experts_page_within_the_budget_too() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = MoeShape::small();
    let path = tmp.path().join(shape.file_name());
    write(&shape, &path).unwrap();
    let q4 = ["--profile", "uniform:syn.q4.symmetric.g64.v1"];
    let run = |memory: Option<&str>| json(&generate_in(Some(tmp.path()), &path, memory, &q4));
    let free = run(None);
    let source = json(&generate(&path, None));
    assert_ne!(
        free["tokens"], source["tokens"],
        "q4 experts change the output"
    );
    let big = run(Some("4G"));
    assert_eq!(big["tokens"], free["tokens"]);
    let m = &big["memory"];
    let experts = u(&m["experts_total"]);
    assert!(
        experts * 3 < 2 * u(&source["weight_bytes"]),
        "q4 experts are smaller"
    );
    // Loading read every source expert (to key the cache) and every cached variant: none of
    // it stays held.
    assert!(u(&m["loaded"]) < experts / 4, "{m}");
    let fixed = u(&m["loaded"]) + u(&m["weights_outside_experts"]) + u(&m["kv"]) + u(&m["scratch"]);
    let budget = fixed + experts / 2;
    let o = run(Some(&budget.to_string()));
    assert_eq!(
        o["tokens"], free["tokens"],
        "half the q4 experts: other tokens"
    );
    let m = &o["memory"];
    let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
    eprintln!(
        "q4 experts at half: budget {:.1} MB, peak RSS above start {:.1} MB, experts held {:.1} \
         of {:.1} MB, {} misses",
        budget as f64 / 1e6,
        used as f64 / 1e6,
        u(&m["experts_held"]) as f64 / 1e6,
        experts as f64 / 1e6,
        m["paging"]["misses"]
    );
    assert!(
        used <= budget,
        "peak RSS rose {used} B over a {budget} B budget"
    );
    assert!(u(&m["paging"]["evictions"]) > 0);
}

/// `--budget fit`: the weights' budget is what `--memory` leaves beside the KV cache, the
/// scratch and what loading left, so the selector's profile (experts included) is resident
/// whole where the source's experts would page; without `--memory`, or with no room left, a
/// clear error before anything runs.
#[test]
fn budget_fit_keeps_the_weights_resident_within_the_memory_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = MoeShape::small();
    let path = tmp.path().join(shape.file_name());
    write(&shape, &path).unwrap();
    let text = tmp.path().join("calibration.txt");
    let words: Vec<String> = (0..600)
        .map(|i| format!("word{} and more", i % 97))
        .collect();
    std::fs::write(&text, words.join(" ")).unwrap();
    let m = path.to_str().unwrap();
    let run = |args: &[&str]| cli_in(Some(tmp.path()), args);
    let o = run(&common::importance_args(m, text.to_str().unwrap()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let fit_flags = ["--budget", "fit"];
    let generate_at = |memory: &str, fit: bool| {
        let extra: &[&str] = if fit { &fit_flags } else { &[] };
        generate_in(Some(tmp.path()), &path, Some(memory), extra)
    };
    let probe = json(&generate_at("4G", false));
    let l = &probe["memory"];
    let source = u(&probe["weight_bytes"]);
    // Room for half the source's weights beside the rest.
    let budget = u(&l["loaded"]) + u(&l["kv"]) + u(&l["scratch"]) + source / 2;
    let b = budget.to_string();
    let paged = json(&generate_at(&b, false));
    assert!(
        !paged["memory"]["paging"].is_null(),
        "the source's experts page"
    );
    let o = generate_at(&b, true);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let fit = json(&o);
    let room: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("--budget fit: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no --budget fit line: {err}"));
    let w = u(&fit["weight_bytes"]);
    let fm = &fit["memory"];
    eprintln!(
        "--budget fit under {:.1} MB: {:.1} MB for weights, {:.1} MB resident (source {:.1} \
         MB), peak RSS above start {:.1} MB",
        budget as f64 / 1e6,
        room as f64 / 1e6,
        w as f64 / 1e6,
        source as f64 / 1e6,
        (u(&fm["peak_rss"]) - u(&fm["baseline_rss"])) as f64 / 1e6
    );
    assert!(w <= room && w < source, "{w} of {room}");
    assert!(fm["paging"].is_null(), "the fitted profile pages: {fm}");
    assert_eq!(u(&fm["experts_budget"]), u(&fm["experts_total"]));
    assert!(u(&fm["peak_rss"]) - u(&fm["baseline_rss"]) <= budget);
    assert_ne!(fit["profile"], probe["profile"]);
    // Without --memory, or with nothing left for weights: refused before anything runs.
    let o = run(&["generate", "--model", m, "--budget", "fit", "hi"]);
    assert!(!o.status.success() && o.stdout.is_empty());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--memory"));
    let o = generate_at(&(u(&l["kv"]) + u(&l["scratch"])).to_string(), true);
    assert!(!o.status.success() && o.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no room for weights"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // `serve --budget fit`: the engine's own KV and scratch taken off, the profile resident
    // whole ("everything fits"), requests answered on it with no expert paged.
    let server = |memory: &str, fit: bool| {
        let mut c = serve(&path, memory);
        if fit {
            c.args(["--budget", "fit"]);
        }
        c.env("SYNAPSE_STORE", tmp.path().join("store"))
            .env("SYNAPSE_IMPORTANCE_DIR", tmp.path());
        Server::started(c.spawn().unwrap())
    };
    let line = |log: &[String], prefix: &str| {
        log.iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in {log:?}"))
            .clone()
    };
    let (probe, _, log) = server("8G", false);
    drop(probe);
    let ledger = line(&log, "memory ledger:");
    let rest = after(&line(&log, "memory: budget"), "loading left")
        + after(&ledger, "KV")
        + after(&ledger, "scratch");
    let budget = rest + source / 2;
    let (srv, addr, log) = server(&budget.to_string(), true);
    let room = after(&line(&log, "--budget fit:"), "--budget fit:");
    let ledger = line(&log, "memory ledger:");
    assert!(ledger.contains("everything fits"), "{ledger}");
    let weights = after(&ledger, "weights");
    assert!(weights <= room && weights < source, "{weights} of {room}");
    let (_, models) = http(&addr, "GET", "/v1/models", "");
    assert_eq!(u(&models["data"][0]["meta"]["weight_bytes"]), weights);
    assert!(completions(&addr).iter().all(|t| !t.is_empty()));
    let (_, m) = http(&addr, "GET", "/metrics", "");
    assert_eq!(
        metric(m.as_str().unwrap(), "synapse_expert_misses_total"),
        0.0
    );
    assert!(
        srv.status_bytes("VmHWM:")
            <= budget + after(&line(&log, "memory: budget"), "baseline RSS of")
    );
    drop(srv);
}

#[test]
fn the_default_model_runs_within_a_budget_and_pages_its_blocks_below_its_weights() {
    let model = synapse_testdata::default_model();
    if !synapse_testdata::require(&model, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let free = json(&generate(&model, None));
    let o = json(&generate(&model, Some("1G")));
    assert_eq!(o["tokens"], free["tokens"]);
    let m = &o["memory"];
    let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
    eprintln!(
        "Gemma 3 270M under 1 GB: peak RSS above start {:.1} MB (weights {:.1}, KV {:.1}, \
         scratch {:.1}, loading {:.1})",
        used as f64 / 1e6,
        u(&m["weights_outside_experts"]) as f64 / 1e6,
        u(&m["kv"]) as f64 / 1e6,
        u(&m["scratch"]) as f64 / 1e6,
        u(&m["loaded"]) as f64 / 1e6
    );
    assert!(used <= u(&m["budget"]));
    assert!(
        m["layers_budget"].is_null(),
        "everything fits: nothing pages"
    );
    // Budgets below its weights: the blocks' projections page within what the embedding and
    // head (their mapped folios counted), the KV and scratch leave. The same tokens; peak RSS
    // above the start within the budget.
    let whole = u(&m["loaded"]) + u(&m["weights_outside_experts"]) + u(&m["kv"]) + u(&m["scratch"]);
    for cut in [16u64 << 20, 48 << 20] {
        let budget = whole - cut;
        let o = json(&generate(&model, Some(&budget.to_string())));
        assert_eq!(o["tokens"], free["tokens"], "{budget} B: other tokens");
        let m = &o["memory"];
        let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
        let p = &m["paging"];
        eprintln!(
            "Gemma 3 270M under {:.1} MB ({:.1} MB below all of it): peak RSS above start \
             {:.1} MB; blocks {:.1} MB paging within {:.1} MB ({} kept, streaming {}, {:.1} MB held), hit \
             rate {:.3}, {} misses, {:.1} MB paged in",
            budget as f64 / 1e6,
            cut as f64 / 1e6,
            used as f64 / 1e6,
            u(&m["layers_total"]) as f64 / 1e6,
            u(&m["layers_budget"]) as f64 / 1e6,
            m["layers_kept"],
            m["layers_stream"],
            u(&m["layers_held"]) as f64 / 1e6,
            p["hit_rate"].as_f64().unwrap(),
            p["misses"],
            u(&p["bytes_in"]) as f64 / 1e6
        );
        assert!(
            used <= budget,
            "peak RSS rose {used} B over a {budget} B budget"
        );
        assert!(u(&m["layers_held"]) <= u(&m["layers_budget"]));
        assert!(u(&p["evictions"]) > 0 && u(&p["misses"]) > 0, "{p}");
    }
    // A budget below what does not page (the 178 MB tied head/embedding alone): refused
    // before generation.
    let o = generate(&model, Some("100M"));
    assert!(!o.status.success());
    assert!(o.stdout.is_empty(), "generated before refusing");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("cannot run this model"), "{e}");
    assert!(e.contains("leaving 0.0 MB for blocks"), "{e}");
}

/// The number after `key` in `line` (`… key 123 B …`).
fn after(line: &str, key: &str) -> u64 {
    let rest = &line[line
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} not in {line:?}"))
        + key.len()..];
    rest.split_whitespace()
        .next()
        .and_then(|v| v.trim_end_matches([',', ';', ')']).parse().ok())
        .unwrap_or_else(|| panic!("no count after {key:?} in {line:?}"))
}

fn serve(model: &Path, memory: &str) -> std::process::Command {
    let mut c = Command::new(BIN);
    c.args([
        "serve",
        "--model",
        model.to_str().unwrap(),
        "--port",
        "0",
        "-np",
        "4",
        "-c",
        "1024",
        "--memory",
        memory,
    ])
    .env("RUST_BACKTRACE", "0")
    .env_remove("SYNAPSE_MODEL")
    .stderr(Stdio::piped());
    c
}

const PROMPTS: [&str; 4] = [
    "The quick brown fox jumps over the lazy dog",
    "Once upon a time",
    "In the beginning",
    "A B C D E F G",
];

/// Each prompt's greedy completion (24 tokens), all four requests at once.
fn completions(addr: &str) -> Vec<String> {
    let handles: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            let addr = addr.to_string();
            let body = serde_json::json!({
                "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true
            })
            .to_string();
            std::thread::spawn(move || {
                let (st, v) = http(&addr, "POST", "/v1/completions", &body);
                assert_eq!(st, 200, "{v}");
                assert_eq!(v["usage"]["completion_tokens"], 24, "{v}");
                v["choices"][0]["text"].as_str().unwrap().to_string()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

#[test]
fn a_server_pages_experts_within_its_budget_with_the_same_text() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = MoeShape::small();
    let path = tmp.path().join(shape.file_name());
    write(&shape, &path).unwrap();

    // A budget everything fits in: the texts to match, and the ledger.
    let (big, addr, log) = Server::started(serve(&path, "8G").spawn().unwrap());
    let want = completions(&addr);
    let line = |log: &[String], prefix: &str| {
        log.iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in {log:?}"))
            .clone()
    };
    let ledger = line(&log, "memory ledger:");
    assert!(ledger.contains("everything fits"), "{ledger}");
    let loaded = after(&line(&log, "memory: budget"), "loading left");
    let (weights, experts) = (after(&ledger, "weights"), after(&ledger, "routed experts"));
    let (kv, scratch) = (after(&ledger, "KV"), after(&ledger, "scratch"));
    let (_, m) = http(&addr, "GET", "/metrics", "");
    assert_eq!(
        metric(m.as_str().unwrap(), "synapse_expert_misses_total"),
        0.0
    );
    drop(big);

    // Half the experts: they page, the texts are the same, and the process stays within.
    let fixed = loaded + (weights - experts) + kv + scratch;
    let budget = fixed + experts / 2;
    let (srv, addr, log) = Server::started(serve(&path, &budget.to_string()).spawn().unwrap());
    let baseline = after(&line(&log, "memory: budget"), "baseline RSS of");
    let ledger = line(&log, "memory ledger:");
    assert!(!ledger.contains("everything fits"), "{ledger}");
    for round in 0..2 {
        assert_eq!(completions(&addr), want, "round {round}");
    }
    let (_, m) = http(&addr, "GET", "/metrics", "");
    let m = m.as_str().unwrap().to_string();
    let misses = metric(&m, "synapse_expert_misses_total");
    let evictions = metric(&m, "synapse_expert_evictions_total");
    assert!(
        misses > 0.0 && evictions > 0.0,
        "{misses} misses, {evictions} evictions"
    );
    // Reads advised ahead (each layer's misses, the router lookahead's predictions).
    let (advised, predicted, used) = (
        metric(&m, "synapse_expert_prefetches_total"),
        metric(&m, "synapse_expert_predicted_total"),
        metric(&m, "synapse_expert_predicted_used_total"),
    );
    assert!(
        advised > 0.0 && predicted > 0.0 && used <= predicted,
        "{advised} advised, {predicted} predicted, {used} used"
    );
    // Misses the frequency filter did not admit ran from the scratch slot.
    let bypassed = metric(&m, "synapse_expert_bypassed_total");
    assert!(
        bypassed > 0.0 && bypassed <= misses,
        "{bypassed} bypassed of {misses} misses"
    );
    let peak = srv.status_bytes("VmHWM:");
    assert!(metric(&m, "synapse_process_peak_resident_bytes") > 0.0);
    let used = peak - baseline;
    eprintln!(
        "serve under {:.1} MB (experts {:.1} of {:.1} MB): peak RSS above start {:.1} MB, \
         {misses} misses, {evictions} evictions",
        budget as f64 / 1e6,
        (budget - fixed) as f64 / 1e6,
        experts as f64 / 1e6,
        used as f64 / 1e6
    );
    assert!(
        used <= budget,
        "peak RSS rose {used} B over a {budget} B budget"
    );
    drop(srv);

    // Too small to hold one expert beside the rest: refused before listening.
    let o = serve(&path, &(fixed - scratch).to_string())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("memory budget"), "{e}");
    assert!(!e.contains("listening on"), "{e}");
}

#[test]
fn a_server_pages_a_dense_models_blocks_below_its_weights_with_the_same_text() {
    let path = synapse_testdata::model("smollm2-135m-instruct");
    if !synapse_testdata::require(&path, "SmolLM2-135M-Instruct") {
        return;
    }
    let line = |log: &[String], prefix: &str| {
        log.iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in {log:?}"))
            .clone()
    };
    let (big, addr, log) = Server::started(serve(&path, "8G").spawn().unwrap());
    let want = completions(&addr);
    let ledger = line(&log, "memory ledger:");
    assert!(ledger.contains("everything fits"), "{ledger}");
    let loaded = after(&line(&log, "memory: budget"), "loading left");
    let (weights, blocks) = (after(&ledger, "weights"), after(&ledger, "dense blocks"));
    let (kv, scratch) = (after(&ledger, "KV"), after(&ledger, "scratch"));
    assert!(blocks > 0 && blocks < weights, "{ledger}");
    drop(big);

    // A third of the blocks' bytes taken away: they page, the texts are the same, and the
    // process stays within the budget.
    let budget = loaded + weights + kv + scratch - blocks / 3;
    let (srv, addr, log) = Server::started(serve(&path, &budget.to_string()).spawn().unwrap());
    let baseline = after(&line(&log, "memory: budget"), "baseline RSS of");
    let ledger = line(&log, "memory ledger:");
    assert!(ledger.contains("blocks page within"), "{ledger}");
    for round in 0..2 {
        assert_eq!(completions(&addr), want, "round {round}");
    }
    let (_, m) = http(&addr, "GET", "/metrics", "");
    let m = m.as_str().unwrap().to_string();
    let misses = metric(&m, "synapse_block_misses_total");
    let evictions = metric(&m, "synapse_block_evictions_total");
    assert!(
        misses > 0.0 && evictions > 0.0,
        "{misses} misses, {evictions} evictions"
    );
    let used = srv.status_bytes("VmHWM:") - baseline;
    eprintln!(
        "serve SmolLM2-135M under {:.1} MB (weights {:.1} MB, blocks {:.1} MB): peak RSS above \
         start {:.1} MB, {misses} block misses, {evictions} evictions; {ledger}",
        budget as f64 / 1e6,
        weights as f64 / 1e6,
        blocks as f64 / 1e6,
        used as f64 / 1e6
    );
    assert!(
        used <= budget,
        "peak RSS rose {used} B over a {budget} B budget"
    );
}
