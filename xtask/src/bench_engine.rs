//! `cargo xtask bench-engine`: aggregate decode throughput of Synapse's continuous-batching
//! engine against llama.cpp's batched decode of as many sequences, at several stream counts.
//!
//! Each timed run is one child process per engine covering every stream count:
//! `examples/engine_bench` of `synapse-runtime` (built here in release) and
//! `xtask/py/bench_llama_batched.py` in the oracle venv (llama.cpp through llama-cpp-python's
//! low-level API, its default context settings, `n_seq_max` = streams). Both decode the same
//! distinct prompts greedily and print one JSON line per stream count. Runs alternate ABBA; a
//! run during which other processes used more than `--foreign-limit` CPU-seconds is redone (up
//! to `--max-redo` times, then kept and flagged). Medians per stream count and the
//! Synapse/llama.cpp ratio are printed and written to `<target>/bench-engine.json`.

use crate::bench_vs_llama::{median, run_measured, target_dir};
use crate::{oracle_env, parity_fixtures};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// Arguments of `bench-engine`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF to run (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Stream counts.
    #[arg(long, default_value = "1,2,4,8,16")]
    streams: String,
    /// Timed runs per engine (after one warm-up run each).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Compute threads for both engines.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 128)]
    n_gen: usize,
    /// Prompt tokens per stream.
    #[arg(long, default_value_t = 16)]
    prompt_tokens: usize,
    /// A run is redone when other processes used more CPU-seconds than this during it.
    #[arg(long, default_value_t = 0.5)]
    foreign_limit: f64,
    /// How many times a contaminated run is redone before it is kept (and flagged).
    #[arg(long, default_value_t = 3)]
    max_redo: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Engine {
    Synapse,
    Llama,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Synapse => "synapse",
            Engine::Llama => "llama.cpp",
        }
    }
}

struct Ctx {
    model: PathBuf,
    bench_bin: PathBuf,
    python: PathBuf,
    script: PathBuf,
    args: Args,
}

fn command(ctx: &Ctx, e: Engine) -> Command {
    let a = &ctx.args;
    match e {
        Engine::Synapse => {
            let mut c = Command::new(&ctx.bench_bin);
            c.arg(&ctx.model)
                .arg(&a.streams)
                .arg(a.n_gen.to_string())
                .arg(a.threads.to_string())
                .arg(a.prompt_tokens.to_string());
            c
        }
        Engine::Llama => {
            let mut c = Command::new(&ctx.python);
            c.arg(&ctx.script)
                .arg(&ctx.model)
                .args(["--streams", &a.streams])
                .args(["--n-gen", &a.n_gen.to_string()])
                .args(["--threads", &a.threads.to_string()])
                .args(["--prompt-tokens", &a.prompt_tokens.to_string()]);
            c
        }
    }
}

/// One run: stream count → aggregate decode tok/s, and the foreign CPU-seconds during it.
fn run_once(ctx: &Ctx, e: Engine) -> Result<(BTreeMap<usize, f64>, f64)> {
    let out = run_measured(&mut command(ctx, e))?;
    if !out.success {
        bail!(
            "{} run failed:\n{}",
            e.name(),
            out.stderr
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let mut m = BTreeMap::new();
    for line in out.stdout.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let s = v["streams"].as_u64().context("streams")? as usize;
        let r = v["aggregate_decode_tok_s"].as_f64().context("tok/s")?;
        m.insert(s, r);
    }
    Ok((m, out.foreign_cpu_s))
}

/// Runs the benchmark.
pub fn run(args: Args) -> Result<()> {
    let model = parity_fixtures::resolve_model(args.model.as_deref())?;
    let python = oracle_env::python()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(oracle_env::repo_root())
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
    if !status.success() {
        bail!("building engine_bench failed ({status})");
    }
    let ctx = Ctx {
        model,
        bench_bin: target_dir().join("release/examples/engine_bench"),
        python,
        script: oracle_env::repo_root().join("xtask/py/bench_llama_batched.py"),
        args,
    };
    let a = &ctx.args;
    println!(
        "bench-engine: {} | {} threads | streams {} | {} prompt + {} generated tokens each | {} runs",
        ctx.model.display(),
        a.threads,
        a.streams,
        a.prompt_tokens,
        a.n_gen,
        a.runs
    );
    let engines = [Engine::Synapse, Engine::Llama];
    for e in engines {
        run_once(&ctx, e).with_context(|| format!("{} warm-up", e.name()))?;
    }
    let mut all: BTreeMap<(Engine, usize), Vec<f64>> = BTreeMap::new();
    let mut flagged = Vec::new();
    for round in 0..a.runs {
        let order: Vec<Engine> = if round % 2 == 0 {
            engines.to_vec()
        } else {
            engines.iter().rev().copied().collect()
        };
        for e in order {
            let mut redo = 0;
            let (m, foreign) = loop {
                let (m, foreign) = run_once(&ctx, e)?;
                if foreign <= a.foreign_limit || redo >= a.max_redo {
                    break (m, foreign);
                }
                println!(
                    "    {:9} run contaminated: other processes used {foreign:.2} CPU-s; redoing",
                    e.name()
                );
                redo += 1;
                std::thread::sleep(std::time::Duration::from_secs(2));
            };
            if foreign > a.foreign_limit {
                flagged.push(format!(
                    "{} round {round}: foreign {foreign:.2} CPU-s",
                    e.name()
                ));
            }
            let line: Vec<String> = m.iter().map(|(s, r)| format!("{s}:{r:.1}")).collect();
            println!("  round {round} {:9} {}", e.name(), line.join("  "));
            for (s, r) in m {
                all.entry((e, s)).or_default().push(r);
            }
        }
    }
    println!(
        "\nstreams | synapse tok/s | llama.cpp tok/s | ratio   (medians of {} runs)",
        a.runs
    );
    let mut rows = Vec::new();
    let streams: Vec<usize> = a
        .streams
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    for s in streams {
        let syn = median(all.get(&(Engine::Synapse, s)).cloned().unwrap_or_default());
        let lla = median(all.get(&(Engine::Llama, s)).cloned().unwrap_or_default());
        println!("{s:7} | {syn:13.1} | {lla:15.1} | {:.2}x", syn / lla);
        rows.push(serde_json::json!({
            "streams": s, "synapse_tok_s": syn, "llama_tok_s": lla, "ratio": syn / lla,
            "synapse_runs": all.get(&(Engine::Synapse, s)), "llama_runs": all.get(&(Engine::Llama, s)),
        }));
    }
    if !flagged.is_empty() {
        println!("contaminated runs kept: {}", flagged.join("; "));
    }
    let out = target_dir().join("bench-engine.json");
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&serde_json::json!({
            "model": ctx.model, "threads": a.threads, "n_gen": a.n_gen,
            "prompt_tokens": a.prompt_tokens, "rows": rows, "flagged": flagged,
        }))?,
    )?;
    println!("written {}", out.display());
    Ok(())
}
