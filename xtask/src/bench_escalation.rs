//! `cargo xtask bench-escalation`: single-stream greedy decode, plain vs exact escalation
//! (`synapse-cli generate --escalation exact --draft-profile …`), side by side in one run.
//!
//! For every model, prompt and draft profile, the plain run and the drafted runs are child
//! processes of the release `synapse-cli`, alternated (the order rotates every round); a run
//! during which other processes used more than `--foreign-limit` CPU-seconds is redone (up to
//! `--max-redo` times, then kept and flagged). Every drafted run's tokens must equal the plain
//! run's (the bench stops otherwise). Medians of decode tok/s, the drafted/plain ratio and the
//! acceptance are printed and written to `<target>/bench-escalation.json`.

use crate::bench_vs_llama::{median, run_measured, target_dir};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;

/// Arguments of `bench-escalation`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Models (paths or published names), comma-separated (default: the default model).
    #[arg(long)]
    models: Option<String>,
    /// Draft profiles, comma-separated.
    #[arg(
        long,
        default_value = "uniform:syn.q8.symmetric.g64.v1,uniform:syn.q4.symmetric.g64.v1"
    )]
    drafts: String,
    /// Timed rounds (each runs plain and every draft once, after one warm-up round).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 128)]
    n_gen: usize,
    /// Most drafts per round (`--draft-k`).
    #[arg(long, default_value_t = 8)]
    draft_k: usize,
    /// Draft a fixed `--draft-k` every round (no cost model).
    #[arg(long)]
    fixed_k: bool,
    /// A run is redone when other processes used more CPU-seconds than this during it.
    #[arg(long, default_value_t = 0.5)]
    foreign_limit: f64,
    /// How many times a contaminated run is redone before it is kept (and flagged).
    #[arg(long, default_value_t = 3)]
    max_redo: usize,
    /// Stream counts: instead of single-stream `generate`, the engine's aggregate decode
    /// (`examples/engine_bench`, every session opted in) with and without the draft, e.g.
    /// `1,4,8,16` (the model must be a GGUF path then, or the default model).
    #[arg(long)]
    streams: Option<String>,
}

const PROMPTS: [&str; 3] = [
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n",
    "The history of the printing press begins",
];

struct Run {
    tok_s: f64,
    tokens: Value,
    esc: Option<Value>,
    flagged: bool,
}

fn one(bin: &PathBuf, a: &Args, model: &str, prompt: &str, draft: Option<&str>) -> Result<Run> {
    let mut redo = 0;
    loop {
        let mut c = Command::new(bin);
        c.args(["generate", prompt, "--json", "--ignore-eos"]);
        if !model.is_empty() {
            c.args(["-m", model]);
        }
        c.args(["-n", &a.n_gen.to_string(), "-t", &a.threads.to_string()]);
        if let Some(d) = draft {
            c.args(["--escalation", "exact", "--draft-profile", d])
                .args(["--draft-k", &a.draft_k.to_string()]);
            if a.fixed_k {
                c.arg("--fixed-k");
            }
        }
        let o = run_measured(&mut c)?;
        if !o.success {
            bail!("{c:?} failed: {}", o.stderr);
        }
        let j = last_json(&o.stdout)?;
        let contaminated = o.foreign_cpu_s > a.foreign_limit;
        if contaminated && redo < a.max_redo {
            redo += 1;
            eprintln!(
                "  redo ({:.2} foreign CPU-s during the run)",
                o.foreign_cpu_s
            );
            continue;
        }
        return Ok(Run {
            tok_s: j["timings"]["decode_tok_s"].as_f64().unwrap_or(f64::NAN),
            tokens: j["tokens"].clone(),
            esc: j.get("escalation").cloned(),
            flagged: contaminated,
        });
    }
}

/// The last JSON object line a child printed (`synapse-cli … --json`).
pub(crate) fn last_json(stdout: &str) -> Result<Value> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("no JSON line")?;
    Ok(serde_json::from_str(line)?)
}

/// The engine at several stream counts, plain vs each draft, alternating.
fn run_streams(a: &Args, streams: &str) -> Result<()> {
    let st = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "-p",
            "synapse-runtime",
            "--example",
            "engine_bench",
        ])
        .status()
        .context("building engine_bench")?;
    if !st.success() {
        bail!("building engine_bench failed ({st})");
    }
    let bin = target_dir().join("release/examples/engine_bench");
    let model = match &a.models {
        Some(m) => PathBuf::from(m.split(',').next().unwrap_or_default().trim()),
        None => {
            let dir = std::env::var_os("SYNAPSE_MODEL_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/synapse/models")
                });
            dir.join("gemma-3-270m-q4_k_m.gguf")
        }
    };
    let mut variants: Vec<&str> = vec!["none"];
    variants.extend(a.drafts.split(',').map(str::trim));
    let ns: Vec<usize> = streams
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // rates[variant][stream index]
    let mut rates = vec![vec![Vec::new(); ns.len()]; variants.len()];
    let mut acc = vec![vec![Vec::new(); ns.len()]; variants.len()];
    // The tokens' hash of every run: each drafted run's must equal the plain runs'.
    let mut hashes = vec![vec![Vec::new(); ns.len()]; variants.len()];
    println!(
        "engine aggregate decode, plain vs exact escalation: {} tokens per stream, {} threads",
        a.n_gen, a.threads
    );
    for round in 0..=a.runs {
        for i in 0..variants.len() {
            let v = (i + round) % variants.len();
            let mut redo = 0;
            let o = loop {
                let mut c = Command::new(&bin);
                c.arg(&model)
                    .arg(streams)
                    .arg(a.n_gen.to_string())
                    .arg(a.threads.to_string())
                    .env("ENGINE_BENCH_DRAFT", variants[v])
                    .env("ENGINE_BENCH_DRAFT_K", a.draft_k.to_string())
                    .env("ENGINE_BENCH_FIXED_K", if a.fixed_k { "1" } else { "0" });
                let o = run_measured(&mut c)?;
                if !o.success {
                    bail!("{c:?} failed: {}", o.stderr);
                }
                if o.foreign_cpu_s > a.foreign_limit && redo < a.max_redo {
                    redo += 1;
                    eprintln!("  redo ({:.2} foreign CPU-s)", o.foreign_cpu_s);
                    continue;
                }
                break o;
            };
            if round == 0 {
                continue;
            }
            for line in o.stdout.lines().filter(|l| l.starts_with('{')) {
                let j: Value = serde_json::from_str(line)?;
                let s = j["streams"].as_u64().unwrap_or(0) as usize;
                if let Some(si) = ns.iter().position(|&n| n == s) {
                    hashes[v][si].push(j["tokens_fnv"].as_str().unwrap_or_default().to_string());
                    rates[v][si].push(j["aggregate_decode_tok_s"].as_f64().unwrap_or(f64::NAN));
                    let d = j["drafted"].as_f64().unwrap_or(0.0);
                    if d > 0.0 {
                        acc[v][si].push(j["draft_accepted"].as_f64().unwrap_or(0.0) / d);
                    }
                }
            }
        }
    }
    for (si, &n) in ns.iter().enumerate() {
        for (v, hs) in hashes.iter().enumerate() {
            if let Some(h) = hs[si].iter().find(|h| Some(*h) != hashes[0][si].first()) {
                bail!(
                    "{} at {n} streams produced other tokens than plain decoding ({h} vs {:?})",
                    variants[v],
                    hashes[0][si].first()
                );
            }
        }
    }
    println!("identical tokens: every run at every stream count");
    let mut report = Vec::new();
    for (si, &n) in ns.iter().enumerate() {
        let plain = median(rates[0][si].clone());
        println!("{n:>2} streams: plain {plain:.1} tok/s");
        let mut rows = vec![json!({"profile": "plain", "aggregate_tok_s": plain})];
        for v in 1..variants.len() {
            let r = median(rates[v][si].clone());
            let ac = median(acc[v][si].clone());
            println!(
                "   draft {}: {r:.1} tok/s = {:.2}× plain, acceptance {:.0}%",
                variants[v],
                r / plain,
                100.0 * ac
            );
            rows.push(
                json!({"profile": variants[v], "aggregate_tok_s": r, "ratio": r / plain,
                "acceptance": ac}),
            );
        }
        report.push(json!({"streams": n, "results": rows}));
    }
    let out = target_dir().join("bench-escalation-streams.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// Runs the benchmark.
pub fn run(a: Args) -> Result<()> {
    if let Some(s) = a.streams.clone() {
        return run_streams(&a, &s);
    }
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "synapse-cli"])
        .status()
        .context("cargo build --release -p synapse-cli")?;
    if !st.success() {
        bail!("building synapse-cli failed ({st})");
    }
    let bin = target_dir().join("release/synapse-cli");
    let models: Vec<String> = match &a.models {
        Some(m) => m.split(',').map(|s| s.trim().to_string()).collect(),
        // `synapse-cli`'s own default (Gemma 3 270M from the model cache).
        None => vec![String::new()],
    };
    let drafts: Vec<&str> = a.drafts.split(',').map(str::trim).collect();
    let mut report = Vec::new();
    println!(
        "exact escalation vs plain greedy decode: {} tokens, {} threads, draft k ≤ {}{}",
        a.n_gen,
        a.threads,
        a.draft_k,
        if a.fixed_k {
            " (fixed)"
        } else {
            " (cost model)"
        }
    );
    for model in &models {
        let shown = if model.is_empty() {
            "default model"
        } else {
            model.as_str()
        };
        for (pi, prompt) in PROMPTS.iter().enumerate() {
            // Variant 0 is plain; 1.. the drafts.
            let nv = drafts.len() + 1;
            let mut rates: Vec<Vec<f64>> = vec![Vec::new(); nv];
            let mut acc: Vec<Vec<f64>> = vec![Vec::new(); nv];
            let mut flagged = vec![false; nv];
            let mut want: Option<Value> = None;
            for round in 0..=a.runs {
                for i in 0..nv {
                    let v = (i + round) % nv;
                    let r = one(&bin, &a, model, prompt, v.checked_sub(1).map(|d| drafts[d]))?;
                    // Round 0 starts with the plain run: every drafted run is checked.
                    if v == 0 && want.is_none() {
                        want = Some(r.tokens.clone());
                    }
                    if let Some(w) = want.as_ref().filter(|_| v > 0)
                        && *w != r.tokens
                    {
                        bail!(
                            "{shown} prompt {pi} draft {}: tokens differ from plain decoding",
                            drafts[v - 1]
                        );
                    }
                    if round == 0 {
                        continue; // warm-up
                    }
                    rates[v].push(r.tok_s);
                    if let Some(e) = &r.esc {
                        acc[v].push(e["acceptance"].as_f64().unwrap_or(0.0));
                    }
                    flagged[v] |= r.flagged;
                }
            }
            let plain = median(rates[0].clone());
            println!("{shown} prompt {pi}: plain {plain:.1} tok/s");
            let mut rows = vec![json!({"profile": "plain", "decode_tok_s": plain,
                "runs": rates[0], "flagged": flagged[0]})];
            for (d, name) in drafts.iter().enumerate() {
                let r = median(rates[d + 1].clone());
                let ac = median(acc[d + 1].clone());
                println!(
                    "  draft {name}: {r:.1} tok/s = {:.2}× plain, acceptance {:.0}%{} — identical tokens",
                    r / plain,
                    100.0 * ac,
                    if flagged[d + 1] { " (flagged)" } else { "" }
                );
                rows.push(
                    json!({"profile": name, "decode_tok_s": r, "ratio": r / plain,
                    "acceptance": ac, "runs": rates[d + 1], "flagged": flagged[d + 1]}),
                );
            }
            report.push(json!({"model": shown, "prompt": prompt, "results": rows}));
        }
    }
    let out = target_dir().join("bench-escalation.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
