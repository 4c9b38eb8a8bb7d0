//! `cargo xtask bench-selective`: selective escalation (approximate) evaluated against plain
//! source decoding and exact escalation on a sealed prompt suite.
//!
//! The suite is split once, by a hash of each prompt, into a tuning part and a sealed part.
//! On the tuning part only, each candidate monitor (`--margin` × `--max-entropy`) runs
//! `synapse-cli generate --escalation selective` and is scored by its agreement with the
//! source's greedy output (tokens before the first difference, of `--n-gen`); the chosen
//! one is the cheapest (fewest escalated steps) whose mean agreement reaches `--target`. The sealed part is then run once with the
//! source, exact escalation, the draft alone and selective escalation at the chosen margin:
//! mean agreement and median decode tok/s each, printed and written to
//! `<target>/bench-selective.json`. The sealed part never influences the margin.

use crate::bench_vs_llama::{median, run_measured, target_dir};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::process::Command;

/// Arguments of `bench-selective`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model (path or published name; default: the default model).
    #[arg(long)]
    model: Option<String>,
    /// The draft profile.
    #[arg(long, default_value = "uniform:syn.q4.symmetric.g64.v1")]
    draft: String,
    /// Candidate margins for the tuning part.
    #[arg(long, default_value = "0.25,0.5,1,2,4")]
    margins: String,
    /// Candidate entropy thresholds (nats; `inf`: the entropy never fires), each tried with
    /// every margin on the tuning part.
    #[arg(long, default_value = "inf")]
    entropies: String,
    /// Mean agreement (fraction of `--n-gen` before the first difference) the margin must
    /// reach on the tuning part.
    #[arg(long, default_value_t = 0.9)]
    target: f64,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 48)]
    n_gen: usize,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// The suite (split by hash into tuning and sealed parts).
const SUITE: [&str; 24] = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "def fibonacci(n):",
    "The three primary colors are red, blue and",
    "Write a haiku about the sea.",
    "import numpy as np\n\ndef softmax(x):\n",
    "Q: What is the boiling point of water at sea level?\nA:",
    "The quick brown fox",
    "In 1969, the first humans",
    "SELECT name, COUNT(*) FROM users",
    "Dear Sir or Madam,\n\nI am writing to",
    "The mitochondria is",
    "fn main() {\n    let v: Vec<u32> =",
    "Photosynthesis converts light energy into",
    "A list of prime numbers: 2, 3, 5, 7,",
    "The meaning of life is",
    "The history of the printing press begins",
    "To make a cup of tea, first",
    "The largest planet in the solar system",
    "class Stack:\n    def __init__(self):\n",
    "Rain fell on the old stone bridge as",
    "The French Revolution began in",
    "Here is a short poem about autumn:\n",
    "Water is made of hydrogen and",
];

fn sealed(prompt: &str) -> bool {
    blake3::hash(prompt.as_bytes()).as_bytes()[0] & 1 == 1
}

struct Out {
    tokens: Vec<u64>,
    tok_s: f64,
    escalated: u64,
}

fn generate_once(bin: &std::path::Path, a: &Args, prompt: &str, extra: &[String]) -> Result<Out> {
    let mut c = Command::new(bin);
    c.args(["generate", prompt, "--json", "--ignore-eos"])
        .args(["-n", &a.n_gen.to_string(), "-t", &a.threads.to_string()])
        .args(extra);
    if let Some(m) = &a.model {
        c.args(["-m", m]);
    }
    let o = run_measured(&mut c)?;
    if !o.success {
        bail!("{c:?} failed: {}", o.stderr);
    }
    let j = crate::bench_escalation::last_json(&o.stdout)?;
    Ok(Out {
        tokens: j["tokens"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default(),
        tok_s: j["timings"]["decode_tok_s"].as_f64().unwrap_or(f64::NAN),
        escalated: j["escalation"]["escalated"].as_u64().unwrap_or(0),
    })
}

/// Tokens before the first difference, as a fraction of `n`.
fn agreement(a: &[u64], b: &[u64], n: usize) -> f64 {
    a.iter().zip(b).take_while(|(x, y)| x == y).count() as f64 / n.max(1) as f64
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Runs the evaluation.
pub fn run(a: Args) -> Result<()> {
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "synapse-cli"])
        .status()
        .context("cargo build --release -p synapse-cli")?;
    if !st.success() {
        bail!("building synapse-cli failed ({st})");
    }
    let bin = target_dir().join("release/synapse-cli");
    let (tune, seal): (Vec<&str>, Vec<&str>) = SUITE.iter().partition(|p| !sealed(p));
    let list =
        |s: &str| -> Vec<f64> { s.split(',').filter_map(|m| m.trim().parse().ok()).collect() };
    let (margins, entropies) = (list(&a.margins), list(&a.entropies));
    if margins.is_empty() || entropies.is_empty() {
        bail!("--margins and --entropies need at least one number each");
    }
    let sel = |(m, h): (f64, f64)| -> Vec<String> {
        [
            "--escalation",
            "selective",
            "--draft-profile",
            &a.draft,
            "--margin",
            &m.to_string(),
            "--max-entropy",
            &h.to_string(),
        ]
        .map(String::from)
        .to_vec()
    };
    let label = |(m, h): (f64, f64)| {
        if h.is_finite() {
            format!("margin {m}, entropy {h}")
        } else {
            format!("margin {m}")
        }
    };
    println!(
        "selective escalation, draft {}: {} tuning prompts, {} sealed, {} tokens each",
        a.draft,
        tune.len(),
        seal.len(),
        a.n_gen
    );
    // Tuning: the source's output, then every candidate margin.
    let src_tune: Vec<Out> = tune
        .iter()
        .map(|p| generate_once(&bin, &a, p, &[]))
        .collect::<Result<_>>()?;
    let mut tuned = Vec::new();
    for &h in &entropies {
        for &m in &margins {
            let mut agr = Vec::new();
            let mut esc = 0u64;
            for (p, s) in tune.iter().zip(&src_tune) {
                let o = generate_once(&bin, &a, p, &sel((m, h)))?;
                agr.push(agreement(&o.tokens, &s.tokens, a.n_gen));
                esc += o.escalated;
            }
            let rate = esc as f64 / (tune.len() * a.n_gen) as f64;
            println!(
                "  tuning {}: agreement {:.3}, {:.0}% of steps escalated",
                label((m, h)),
                mean(&agr),
                100.0 * rate
            );
            tuned.push(((m, h), mean(&agr), rate));
        }
    }
    let js = |t: &((f64, f64), f64, f64)| {
        json!({"margin": t.0.0, "max_entropy": t.0.1.is_finite().then_some(t.0.1),
            "agreement": t.1, "escalated": t.2})
    };
    let chosen = tuned
        .iter()
        .filter(|t| t.1 >= a.target)
        .min_by(|x, y| x.2.total_cmp(&y.2))
        .map(|t| t.0);
    let Some(chosen) = chosen else {
        println!(
            "no candidate margin reaches agreement {} on the tuning part: selective escalation \
             is not offered for this draft",
            a.target
        );
        let out = target_dir().join("bench-selective.json");
        std::fs::write(
            &out,
            serde_json::to_string_pretty(&json!({"tuning": tuned.iter()
                .map(js).collect::<Vec<_>>(), "chosen": null}))?,
        )?;
        return Ok(());
    };
    println!("chosen (tuning part only): {}", label(chosen));
    // Sealed: source, exact, draft alone, selective at the chosen margin.
    let modes: Vec<(&str, Vec<String>)> = vec![
        ("source", vec![]),
        (
            "exact",
            ["--escalation", "exact", "--draft-profile", &a.draft]
                .map(String::from)
                .to_vec(),
        ),
        ("draft alone", sel((0.0, f64::INFINITY))),
        ("selective", sel(chosen)),
    ];
    let mut rows = Vec::new();
    let mut src_seal: Vec<Vec<u64>> = Vec::new();
    for (name, extra) in &modes {
        let mut agr = Vec::new();
        let mut rates = Vec::new();
        let mut esc = 0u64;
        for (i, p) in seal.iter().enumerate() {
            let o = generate_once(&bin, &a, p, extra)?;
            if *name == "source" {
                src_seal.push(o.tokens.clone());
            }
            agr.push(agreement(&o.tokens, &src_seal[i], a.n_gen));
            rates.push(o.tok_s);
            esc += o.escalated;
        }
        let r = median(rates.clone());
        println!(
            "  sealed {name:>12}: agreement {:.3}, decode {r:.1} tok/s (median over prompts){}",
            mean(&agr),
            if *name == "selective" {
                format!(
                    ", {:.0}% of steps escalated",
                    100.0 * esc as f64 / (seal.len() * a.n_gen) as f64
                )
            } else {
                String::new()
            }
        );
        rows.push(json!({"mode": name, "agreement": mean(&agr), "decode_tok_s": r}));
    }
    let out = target_dir().join("bench-selective.json");
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&json!({
            "draft": a.draft,
            "tuning": tuned.iter().map(js).collect::<Vec<_>>(),
            "chosen": {"margin": chosen.0, "max_entropy": chosen.1.is_finite().then_some(chosen.1)},
            "sealed": rows,
        }))?,
    )?;
    println!("wrote {}", out.display());
    Ok(())
}
