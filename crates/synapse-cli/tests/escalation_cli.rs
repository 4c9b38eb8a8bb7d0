//! `generate --escalation exact` through the command line on a tiny fixture: the same tokens
//! and text as plain greedy decoding, the drafting statistics and the automatic draft choice's
//! measures in `--json`, and the requests it cannot serve refused with a clear error before
//! anything runs. `serve --draft-profile head:N`: opted-in requests give the plain text.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn cli(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("SYNAPSE_STORE", dir.join("store"))
        .env("RUST_BACKTRACE", "0")
        .env_remove("SYNAPSE_MODEL")
        .output()
        .unwrap()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(s.lines().last().unwrap()).unwrap()
}

fn err(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn exact_escalation_prints_plain_greedy_output_and_its_drafting() {
    let llama = root().join("fixtures/tiny/llama/model.q8_0.gguf");
    if !synapse_testdata::require(&llama, "tiny-model fixture") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = llama.to_str().unwrap();
    let base = [
        "generate",
        "once upon a time",
        "-m",
        m,
        "-n",
        "40",
        "--ignore-eos",
        "--json",
    ];
    let plain = json(&cli(dir.path(), &base));
    for extra in [
        &["--escalation", "exact"][..],
        &[
            "--escalation",
            "exact",
            "--draft-profile",
            "uniform:syn.q3.symmetric.g64.v1",
            "--draft-k",
            "5",
            "--fixed-k",
        ],
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let j = json(&cli(dir.path(), &args));
        assert_eq!(j["tokens"], plain["tokens"], "{extra:?}");
        assert_eq!(j["text"], plain["text"]);
        assert_eq!(
            j["profile"], plain["profile"],
            "the verifier is the model itself"
        );
        let e = &j["escalation"];
        assert_eq!(e["mode"], "exact");
        assert_ne!(e["draft_profile"], plain["profile"]);
        if extra.len() == 2 {
            // No draft flag: the draft is chosen by measurement, or none when none pays.
            let a = &e["auto"];
            let cands = a["candidates"].as_array().unwrap();
            assert_eq!(cands.len(), 5, "{a}");
            for c in cands {
                let acc = c["acceptance"].as_f64().unwrap();
                assert!((0.0..=1.0).contains(&acc), "{c}");
                assert!(c["draft_step_ms"].as_f64().unwrap() > 0.0, "{c}");
                assert!(c["expected_speedup"].as_f64().unwrap() >= 1.0 - 1e-9, "{c}");
            }
            assert!(a["source_step_ms"].as_f64().unwrap() > 0.0);
            assert_eq!(a["continuation_tokens"], 24);
            match a["chosen"].as_str() {
                None => {
                    assert!(e["draft_profile"].is_null(), "{e}");
                    assert_eq!(e["drafted"], 0);
                }
                Some(spec) => {
                    assert!(cands.iter().any(|c| c["profile"] == spec), "{a}");
                    assert!(e["draft_profile"].is_string(), "{e}");
                }
            }
        }
        let (drafted, accepted) = (
            e["drafted"].as_u64().unwrap(),
            e["accepted"].as_u64().unwrap(),
        );
        assert!(accepted <= drafted);
        if extra.contains(&"--fixed-k") {
            // A fixed k drafts every round (but the last ones, which the token limit caps).
            assert!(
                drafted >= 5 * (e["rounds"].as_u64().unwrap() - 1).min(7),
                "{e}"
            );
            assert_eq!(e["adaptive"], false);
        }
    }
    assert!(plain.get("escalation").is_none());

    let run = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        err(&cli(dir.path(), &args))
    };
    // Sampling: speculative sampling, reproducible from the seed.
    let sampled: Vec<&str> = base
        .iter()
        .copied()
        .chain([
            "--escalation",
            "exact",
            "--draft-profile",
            "uniform:syn.q4.symmetric.g64.v1",
            "--temp",
            "0.9",
            "--seed",
            "5",
        ])
        .collect();
    let a = json(&cli(dir.path(), &sampled));
    let b = json(&cli(dir.path(), &sampled));
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["tokens"].as_array().unwrap().len(), 40);
    assert!(a["escalation"]["drafted"].as_u64().unwrap() > 0);
    assert!(run(&["--escalation", "exact", "--draft-k", "0"]).contains("outside 1..=16"));
    assert!(
        run(&["--draft-profile", "uniform:syn.q4.symmetric.g64.v1"])
            .contains("need --escalation exact")
    );
    assert!(run(&["--escalation", "exact", "--draft-profile", "uniform:nope"]).contains("nope"));
    assert!(run(&["--escalation", "sometimes"]).contains("invalid value"));
    assert!(
        run(&["--escalation", "selective", "--draft-profile", "auto"])
            .contains("auto is for --escalation exact")
    );
    // `auto` given explicitly is the default's choice.
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--escalation", "exact", "--draft-profile", "auto"])
        .collect();
    let j = json(&cli(dir.path(), &args));
    assert_eq!(j["tokens"], plain["tokens"]);
    assert_eq!(
        j["escalation"]["auto"]["candidates"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    // The first auto run stored its choice (this store, model, machine, threads): later runs
    // reuse it without measuring, `--remeasure` measures again.
    let first = {
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--escalation", "exact"])
            .collect();
        json(&cli(dir.path(), &args))
    };
    let a = &j["escalation"]["auto"];
    assert_eq!(a["cached"], true, "{a}");
    assert_eq!(a["chosen"], first["escalation"]["auto"]["chosen"]);
    assert!(a["seconds"].as_f64().unwrap() < 5.0, "{a}");
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--escalation", "exact", "--remeasure"])
        .collect();
    let r = json(&cli(dir.path(), &args));
    assert_eq!(r["escalation"]["auto"]["cached"], false);
    assert_eq!(r["tokens"], plain["tokens"]);
    // A stored file naming something else than a candidate is not trusted: measured again.
    let choices = dir.path().join("store/draft-choice");
    for f in std::fs::read_dir(&choices).unwrap() {
        let f = f.unwrap().path();
        let mut v: Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
        v["chosen"] = Value::from("uniform:nope");
        std::fs::write(&f, v.to_string()).unwrap();
    }
    let again = json(&cli(dir.path(), &args[..args.len() - 1]));
    assert_eq!(again["escalation"]["auto"]["cached"], false);
    assert_eq!(again["tokens"], plain["tokens"]);

    // Selective escalation: an infinite margin is the model's own output, 0 the draft's.
    let q4 = "uniform:syn.q4.symmetric.g64.v1";
    let own: Vec<&str> = base.iter().copied().chain(["--profile", q4]).collect();
    let own = json(&cli(dir.path(), &own));
    for (margin, want) in [("inf", &plain), ("0", &own)] {
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain([
                "--escalation",
                "selective",
                "--draft-profile",
                q4,
                "--margin",
                margin,
            ])
            .collect();
        let j = json(&cli(dir.path(), &args));
        assert_eq!(j["tokens"], want["tokens"], "margin {margin}");
        let e = &j["escalation"];
        assert_eq!(e["mode"], "selective");
        assert_eq!(e["approximate"], true);
        let steps = e["steps"].as_u64().unwrap();
        let escalated = e["escalated"].as_u64().unwrap();
        assert_eq!(escalated, if margin == "inf" { steps } else { 0 });
    }
    assert!(run(&["--escalation", "selective", "--margin", "-1"]).contains("must be ≥ 0"));
}

/// `--draft-profile head:N`: the model's own body with a shortlist head drafts; the output is
/// plain greedy decoding's, `--json` reports the shortlist (it grows by the tokens chosen off
/// it), and malformed sizes or other modes are refused.
#[test]
fn a_head_only_draft_prints_plain_greedy_output() {
    let llama = root().join("fixtures/tiny/llama/model.q8_0.gguf");
    if !synapse_testdata::require(&llama, "tiny-model fixture") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = llama.to_str().unwrap();
    let base = [
        "generate",
        "once upon a time",
        "-m",
        m,
        "-n",
        "40",
        "--ignore-eos",
        "--json",
    ];
    let plain = json(&cli(dir.path(), &base));
    for extra in [
        &["--escalation", "exact", "--draft-profile", "head:16"][..],
        &[
            "--escalation",
            "exact",
            "--draft-profile",
            "head:100000",
            "--draft-k",
            "4",
            "--fixed-k",
        ],
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let j = json(&cli(dir.path(), &args));
        assert_eq!(j["tokens"], plain["tokens"], "{extra:?}");
        assert_eq!(j["text"], plain["text"]);
        let e = &j["escalation"];
        assert_eq!(e["mode"], "exact");
        assert_eq!(e["draft_profile"], extra[3]);
        let (drafted, accepted) = (
            e["drafted"].as_u64().unwrap(),
            e["accepted"].as_u64().unwrap(),
        );
        assert!(drafted > 0 && accepted <= drafted, "{e}");
        let (start, end) = (
            e["shortlist_initial"].as_u64().unwrap(),
            e["shortlist"].as_u64().unwrap(),
        );
        if start == 16 {
            // 16 lowest ids plus the short pieces: the model chose tokens off the list, and
            // each joined it.
            let off = e["off_shortlist"].as_u64().unwrap();
            assert!(off > 0, "{e}");
            assert!(end >= 16 + off, "{e}");
        } else {
            // The whole vocabulary: every draft is the model's own choice, and every token
            // after the first (the prompt's) was a draft.
            assert_eq!(e["off_shortlist"], 0, "{e}");
            assert_eq!((drafted, accepted), (39, 39), "{e}");
        }
    }
    let run = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        err(&cli(dir.path(), &args))
    };
    assert!(run(&["--escalation", "exact", "--draft-profile", "head:0"]).contains("positive"));
    assert!(run(&["--escalation", "exact", "--draft-profile", "head:x"]).contains("positive"));
    assert!(run(&["--draft-profile", "head:64"]).contains("--escalation exact or selective"));
    assert!(
        run(&[
            "--escalation",
            "selective",
            "--draft-profile",
            "head:64",
            "--max-entropy",
            "-1"
        ])
        .contains("must be ≥ 0")
    );

    // Selective escalation with the head-only draft (approximate, and `--json` says so): an
    // infinite margin is the model's own output, every step after the first escalated.
    let sel = |margin: &str| {
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain([
                "--escalation",
                "selective",
                "--draft-profile",
                "head:16",
                "--margin",
                margin,
            ])
            .collect();
        json(&cli(dir.path(), &args))
    };
    let j = sel("inf");
    assert_eq!(j["tokens"], plain["tokens"]);
    let e = &j["escalation"];
    assert_eq!(e["mode"], "selective");
    assert_eq!(e["approximate"], true);
    assert_eq!(e["draft_profile"], "head:16");
    let steps = e["steps"].as_u64().unwrap();
    assert_eq!(e["escalated"].as_u64().unwrap(), steps - 1, "{e}");
    assert!(e["shortlist"].as_u64().unwrap() >= 16, "{e}");
    // No step escalated: the list's own choices (every token after the first on the list,
    // which does not grow).
    let j = sel("0");
    let e = &j["escalation"];
    assert_eq!(e["escalated"], 0, "{e}");
    assert_eq!(e["off_shortlist"], 0, "{e}");
    assert_ne!(
        j["tokens"], plain["tokens"],
        "a 16-token list cannot say what the model says"
    );
}

/// `serve --draft-profile head:N`: the engine drafts opted-in requests with the model's own
/// head cut to a shortlist; their texts equal the plain requests' (four at once, two opted
/// in), `/v1/models` names the draft `head:…` and `/metrics` counts drafted tokens.
#[test]
fn a_server_with_a_head_only_draft_serves_plain_text() {
    let llama = root().join("fixtures/tiny/llama/model.q8_0.gguf");
    if !synapse_testdata::require(&llama, "tiny-model fixture") {
        return;
    }
    let mut c = Command::new(BIN);
    c.args(["serve", "--model", llama.to_str().unwrap(), "--port", "0"])
        .args(["-np", "4", "-c", "256", "--draft-profile", "head:64"])
        .args(["--draft-k", "4", "--fixed-k"])
        .env("RUST_BACKTRACE", "0")
        .env_remove("SYNAPSE_MODEL")
        .stderr(Stdio::piped());
    let (_srv, addr, _) = common::Server::started(c.spawn().unwrap());
    let prompts = [
        "once upon a time",
        "the cat sat on",
        "one two three",
        "hello",
    ];
    let ask = |escalate: bool| -> Vec<String> {
        let hs: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let addr = addr.clone();
                let mut body = serde_json::json!({
                    "prompt": p, "max_tokens": 30, "temperature": 0, "ignore_eos": true
                });
                if escalate && i % 2 == 0 {
                    body["escalation"] = serde_json::json!("exact");
                }
                std::thread::spawn(move || {
                    let (st, v) = common::http(&addr, "POST", "/v1/completions", &body.to_string());
                    assert_eq!(st, 200, "{v}");
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    };
    let plain = ask(false);
    assert_eq!(ask(true), plain);
    let (_, models) = common::http(&addr, "GET", "/v1/models", "");
    let d = models["data"][0]["meta"]["draft_profile"].as_str().unwrap();
    assert!(d.starts_with("head:"), "{models}");
    let (_, m) = common::http(&addr, "GET", "/metrics", "");
    let drafted: f64 = m
        .as_str()
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("synapse_draft_tokens_total ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap();
    assert!(drafted > 0.0, "{m}");
    eprintln!("head-drafted server: {drafted} tokens drafted");
}
