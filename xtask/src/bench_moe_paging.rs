//! `cargo xtask bench-moe-paging`: greedy decode on the synthetic MoE (`synthetic-moe`'s
//! default: 32 experts of 1024×1024 per layer, top-4, 12 layers, Q8_0) with its routed
//! experts held to 100 / 50 / 25 / 12.5% of their bytes by `generate --memory`, each run
//! alternating with an unbudgeted one; medians of decode tok/s, the pager's hit rate, load
//! time and time to the first token, and each budget's speed over the unbudgeted runs'.
//! With `--profile` every run is at that precision (re-encoded experts page from the
//! variant cache), so a re-encoded model fully resident can be set beside the source's
//! experts paged in the same memory.
//! `--admission both` alternates runs with and without the pager's frequency filter. Each
//! budgeted row's speed is set beside the unlimited runs' (the weights read from the file
//! mapping) and beside the same mode's 100% row (every expert in the pager's copies).
//!
//! A dense model (`--model`, e.g. the default Gemma 3 270M) pages its blocks' projections
//! instead: the fraction is of those bytes, and the fixed part holds the embedding and head.
//!
//! The budget of a fraction `f` is the ledger's fixed part (what loading left, the weights
//! outside the experts, the KV cache, scratch — read from a first `--memory` run) plus `f` of
//! the experts' bytes (at 100% plus 16 MiB, so that all experts fit and none pages: the fully
//! resident reference). Each run starts with every expert paged out, so its first uses are
//! misses. Every run is one `synapse-cli generate --json` child; a run during
//! which other processes used more than `--foreign-limit` CPU-seconds is redone. The bench
//! fails when a budgeted run's peak RSS over its start exceeds its budget or its tokens differ
//! from the unlimited runs' (paging may change the speed, never a result).

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

use crate::bench_vs_llama::{median, run_measured};
use crate::oracle_env::repo_root;

/// Arguments of `bench-moe-paging`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The MoE GGUF (default: the synthetic one, written first if missing).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Fractions of the experts' bytes to hold resident.
    #[arg(long, value_delimiter = ',', default_value = "1,0.5,0.25,0.125")]
    fractions: Vec<f64>,
    /// Timed runs per setting.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Tokens decoded per run (a run starts with every expert paged out: its first uses
    /// are misses).
    #[arg(long, default_value_t = 256)]
    n_gen: usize,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// A run is redone when other processes used more CPU-seconds than this during it.
    #[arg(long, default_value_t = 0.3)]
    foreign_limit: f64,
    /// Use this synapse-cli binary instead of `target/release/synapse-cli` (built first).
    #[arg(long)]
    synapse_bin: Option<PathBuf>,
    /// A dense model's streamed blocks: `mapped` (the default where the budget holds a
    /// block's mapped extent) or `copy` (through a copy slot; `SYNAPSE_BLOCK_STREAM=copy`).
    #[arg(long, default_value = "mapped")]
    block_stream: String,
    /// Reads advised ahead of use (the router lookahead's predicted experts, a layer's
    /// routed misses, the next streamed block): `on`, `off` (`SYNAPSE_PREFETCH=off`), or
    /// `both` (budgeted runs with and without, alternated).
    #[arg(long, default_value = "on")]
    prefetch: String,
    /// The expert pager's frequency filter (a miss used no more often than the least used
    /// resident expert runs from a scratch slot, nothing paged out): `on`, `off`
    /// (`SYNAPSE_EXPERT_ADMISSION=off`: every miss replaces the LRU-2 victim), or `both`.
    #[arg(long, default_value = "on")]
    admission: String,
    /// Memory pressure: while a run goes, the model file's pages that no process maps are
    /// dropped from the page cache every this many milliseconds (`posix_fadvise(…,
    /// POSIX_FADV_DONTNEED)`), as on a machine whose page cache cannot hold the file: a
    /// miss then reads the disk unless its read was advised ahead. 0: off.
    #[arg(long, default_value_t = 0)]
    cold_ms: u64,
    /// Run every generate at this precision (`--profile`, e.g.
    /// `uniform:syn.q4.symmetric.g64.v1`; its re-encoded experts page from the variant
    /// cache): the fractions are then of the re-encoded experts' bytes.
    #[arg(long)]
    profile: Option<String>,
}

/// Drops `path`'s unmapped pages from the page cache every `every` until `stop` is set;
/// returns the CPU-seconds the dropping took (this process's, not the run's: taken off the
/// foreign CPU time a run is judged by).
fn evicter(
    path: PathBuf,
    every: std::time::Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<f64> {
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let Ok(f) = std::fs::File::open(&path) else {
            return 0.0;
        };
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: a valid descriptor; the advice only drops clean, unmapped page-cache
            // pages of the file (they are read again on use).
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            std::thread::sleep(every);
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    })
}

/// How a budgeted run pages: reads advised ahead, and the frequency filter.
#[derive(Clone, Copy, Debug)]
struct Mode {
    prefetch: bool,
    admission: bool,
}

impl Mode {
    const DEFAULT: Mode = Mode {
        prefetch: true,
        admission: true,
    };
}

fn on_off(v: &str, what: &str) -> Result<Vec<bool>> {
    Ok(match v {
        "on" => vec![true],
        "off" => vec![false],
        "both" => vec![true, false],
        other => bail!("--{what} must be on, off or both, not {other:?}"),
    })
}

struct Run {
    decode: f64,
    load: f64,
    first_token_s: f64,
    hit_rate: Option<f64>,
    kept: Option<u64>,
    peak_over_start: Option<u64>,
    budget: Option<u64>,
    /// The generated token ids (every run of a fraction must give the unlimited runs' ids).
    tokens: Vec<u64>,
}

fn run_once(
    bin: &PathBuf,
    model: &PathBuf,
    a: &Args,
    memory: Option<u64>,
    mode: Mode,
) -> Result<(Value, f64)> {
    let mut c = Command::new(bin);
    c.args(["generate", "--model"])
        .arg(model)
        .args([
            "-n",
            &a.n_gen.to_string(),
            "--ignore-eos",
            "--json",
            "--ctx",
            "1024",
        ])
        .args(["-t", &a.threads.to_string()]);
    if let Some(m) = memory {
        c.args(["--memory", &m.to_string()]);
    }
    if let Some(p) = &a.profile {
        c.args(["--profile", p]);
    }
    c.env("SYNAPSE_BLOCK_STREAM", &a.block_stream);
    let on = |b: bool| if b { "on" } else { "off" };
    c.env("SYNAPSE_PREFETCH", on(mode.prefetch));
    c.env("SYNAPSE_EXPERT_ADMISSION", on(mode.admission));
    c.arg("The quick brown fox jumps over the lazy dog, and the dog sleeps on.");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ev = (a.cold_ms > 0).then(|| {
        evicter(
            model.clone(),
            std::time::Duration::from_millis(a.cold_ms),
            stop.clone(),
        )
    });
    let out = run_measured(&mut c);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let own = ev.map_or(0.0, |h| h.join().unwrap_or(0.0));
    let mut out = out?;
    out.foreign_cpu_s = (out.foreign_cpu_s - own).max(0.0);
    if !out.success {
        bail!("synapse-cli generate failed:\n{}", out.stderr);
    }
    let j: Value = serde_json::from_str(out.stdout.lines().last().unwrap_or(""))
        .context("generate --json output")?;
    Ok((j, out.foreign_cpu_s))
}

fn parse(j: &Value) -> Run {
    let t = &j["timings"];
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let prompt = j["prompt_tokens"].as_array().map_or(0, |a| a.len()) as f64;
    let m = &j["memory"];
    Run {
        decode: f(&t["decode_tok_s"]),
        load: f(&t["load_s"]),
        // Timed by generate (from the start of generation to the first token); older
        // binaries: the prompt over the prefill rate.
        first_token_s: t["first_token_s"]
            .as_f64()
            .unwrap_or(prompt / f(&t["prefill_tok_s"])),
        tokens: j["tokens"].as_array().map_or(Vec::new(), |a| {
            a.iter().filter_map(|v| v.as_u64()).collect()
        }),
        hit_rate: m["paging"]["hit_rate"].as_f64(),
        kept: m["layers_kept"].as_u64(),
        peak_over_start: match (m["peak_rss"].as_u64(), m["baseline_rss"].as_u64()) {
            (Some(p), Some(b)) => Some(p.saturating_sub(b)),
            _ => None,
        },
        budget: m["budget"].as_u64(),
    }
}

/// Runs the benchmark.
pub fn run(a: Args) -> Result<()> {
    let model = match &a.model {
        Some(m) => m.clone(),
        None => {
            let shape = synapse_testdata::synthetic_moe::MoeShape::default();
            let p = repo_root()
                .join("target/synthetic-moe")
                .join(shape.file_name());
            if !p.exists() {
                synapse_testdata::synthetic_moe::write(&shape, &p)
                    .map_err(|e| anyhow::anyhow!("synthetic-moe: {e}"))?;
            }
            p
        }
    };
    let bin = match &a.synapse_bin {
        Some(b) => b.clone(),
        None => {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let st = Command::new(cargo)
                .current_dir(repo_root())
                .args(["build", "--release", "-p", "synapse-cli"])
                .status()?;
            if !st.success() {
                bail!("building synapse-cli failed");
            }
            repo_root().join("target/release/synapse-cli")
        }
    };
    // The ledger's fixed part and the experts' bytes.
    let (probe, _) = run_once(&bin, &model, &a, Some(1 << 40), Mode::DEFAULT)?;
    let mut modes = Vec::new();
    for prefetch in on_off(&a.prefetch, "prefetch")? {
        for admission in on_off(&a.admission, "admission")? {
            modes.push(Mode {
                prefetch,
                admission,
            });
        }
    }
    let m = &probe["memory"];
    let g = |k: &str| m[k].as_u64().unwrap_or(0);
    let mut fixed = g("loaded") + g("weights_outside_experts") + g("kv") + g("scratch");
    // What pages: the routed experts, or a dense model's blocks (then outside the fixed part).
    let (experts, what) = match g("experts_total") {
        0 => {
            fixed -= g("layers_total");
            (g("layers_total"), "blocks")
        }
        e => (e, "experts"),
    };
    if experts == 0 {
        bail!("{} has nothing to page", model.display());
    }
    println!(
        "bench-moe-paging: {}{} | {} threads | {} decoded | {what} {:.1} MB, fixed part {:.1} MB | {} runs | prefetch {} | filter {}{}",
        model.display(),
        a.profile
            .as_ref()
            .map_or(String::new(), |p| format!(" at {p}")),
        a.threads,
        a.n_gen,
        experts as f64 / 1e6,
        fixed as f64 / 1e6,
        a.runs,
        a.prefetch,
        a.admission,
        if a.cold_ms > 0 {
            format!(" | cold: unmapped pages dropped every {} ms", a.cold_ms)
        } else {
            String::new()
        }
    );
    let mut rows = Vec::new();
    for &frac in &a.fractions {
        // At 100% a margin over what loading left (it varies by a few MB run to run), so the
        // experts all fit and nothing pages: the fully resident reference.
        let margin = if frac >= 1.0 { 16 << 20 } else { 0 };
        let budget = fixed + (experts as f64 * frac) as u64 + margin;
        // Budgeted runs by prefetch mode (in `modes` order), and unlimited runs.
        let mut with: Vec<Vec<Run>> = modes.iter().map(|_| Vec::new()).collect();
        let mut without = Vec::new();
        for r in 0..a.runs {
            let kinds = modes.iter().map(|&m| Some(m)).chain([None]);
            for (ki, kind) in kinds.enumerate() {
                let mut tries = 0;
                loop {
                    let (j, foreign) = run_once(
                        &bin,
                        &model,
                        &a,
                        kind.is_some().then_some(budget),
                        kind.unwrap_or(Mode::DEFAULT),
                    )?;
                    tries += 1;
                    if foreign > a.foreign_limit && tries < 4 {
                        println!("    run contaminated ({foreign:.2} foreign CPU-s); redoing");
                        continue;
                    }
                    let p = parse(&j);
                    println!(
                        "  {:>5.1}% run {r} {}: decode {:6.1} tok/s{}",
                        frac * 100.0,
                        match kind {
                            Some(m) if modes.len() > 1 => format!(
                                "budgeted, prefetch {:3}, filter {:3}",
                                if m.prefetch { "on" } else { "off" },
                                if m.admission { "on" } else { "off" }
                            ),
                            Some(_) => "budgeted ".into(),
                            None => "unlimited".into(),
                        },
                        p.decode,
                        p.hit_rate
                            .map_or(String::new(), |h| format!("  hit rate {h:.3}"))
                            + &p.kept
                                .map_or(String::new(), |k| format!(", {k} blocks kept"))
                    );
                    match kind {
                        Some(_) => with[ki].push(p),
                        None => without.push(p),
                    }
                    break;
                }
            }
        }
        let md = |v: &[Run], f: &dyn Fn(&Run) -> f64| median(v.iter().map(f).collect());
        let base = md(&without, &|r| r.decode);
        for (mi, with) in with.iter().enumerate() {
            let dec = md(with, &|r| r.decode);
            let row = serde_json::json!({
                "fraction": frac,
                "prefetch": modes[mi].prefetch,
                "admission": modes[mi].admission,
                "budget": budget,
                "decode_tok_s": dec,
                "unlimited_decode_tok_s": base,
                "ratio": dec / base,
                "hit_rate": md(with, &|r| r.hit_rate.unwrap_or(f64::NAN)),
                "blocks_kept": with.iter().find_map(|r| r.kept),
                "load_s": md(with, &|r| r.load),
                "first_token_s": md(with, &|r| r.first_token_s),
                "unlimited_first_token_s": md(&without, &|r| r.first_token_s),
                "peak_rss_over_start": with.iter().filter_map(|r| r.peak_over_start).max(),
                "within_budget": with.iter().all(|r| r.peak_over_start.zip(r.budget).is_some_and(|(p, b)| p <= b)),
                "same_tokens": !without.is_empty() && with.iter().chain(&without).all(|r| r.tokens == without[0].tokens),
            });
            rows.push(row);
        }
    }
    // Beside the ratio to the unlimited runs (weights read from the file mapping), the
    // ratio to the same mode's 100% row (every expert in the pager's copies) when measured.
    for i in 0..rows.len() {
        let same = |r: &Value| {
            r["prefetch"] == rows[i]["prefetch"] && r["admission"] == rows[i]["admission"]
        };
        let full = rows
            .iter()
            .find(|r| same(r) && r["fraction"].as_f64().is_some_and(|f| f >= 1.0))
            .and_then(|r| r["decode_tok_s"].as_f64());
        if let (Some(full), Some(d)) = (full, rows[i]["decode_tok_s"].as_f64()) {
            rows[i]["ratio_to_resident"] = serde_json::json!(d / full);
        }
    }
    println!(
        "\n{what} resident | prefetch | filter | budget MB | decode tok/s (unlimited) | ratio | vs 100% | hit rate | load s | first token s (unlimited) | peak RSS over start MB"
    );
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let on = |k: &str| {
            if r[k].as_bool() == Some(true) {
                "on"
            } else {
                "off"
            }
        };
        println!(
            "{:>15.1}% | {:>8} | {:>6} | {:>9.1} | {:>7.1} ({:>6.1}) | {:>5.2}× | {:>6.2}× | {:>8.3} | {:>6.3} | {:>6.3} ({:.3}) | {:.1}{}",
            f("fraction") * 100.0,
            on("prefetch"),
            on("admission"),
            f("budget") / 1e6,
            f("decode_tok_s"),
            f("unlimited_decode_tok_s"),
            f("ratio"),
            f("ratio_to_resident"),
            f("hit_rate"),
            f("load_s"),
            f("first_token_s"),
            f("unlimited_first_token_s"),
            f("peak_rss_over_start") / 1e6,
            if r["within_budget"].as_bool() == Some(true) {
                ""
            } else {
                "  OVER BUDGET"
            }
        );
    }
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| r["within_budget"] != true || r["same_tokens"] != true)
        .map(|r| {
            format!(
                "{:.1}%: within budget {}, same tokens as unlimited {}",
                r["fraction"].as_f64().unwrap_or(f64::NAN) * 100.0,
                r["within_budget"],
                r["same_tokens"]
            )
        })
        .collect();
    let out = repo_root().join("target/bench-moe-paging.json");
    std::fs::write(
        &out,
        serde_json::to_vec_pretty(&serde_json::json!({
            "model": model, "pages": what, "block_stream": a.block_stream, "cold_ms": a.cold_ms, "n_gen": a.n_gen, "threads": a.threads, "rows": rows
        }))?,
    )?;
    println!("wrote {}", out.display());
    if !bad.is_empty() {
        bail!(
            "a budgeted run broke its budget or changed the tokens: {}",
            bad.join("; ")
        );
    }
    println!("every budgeted run: within its budget, the unlimited runs' tokens");
    Ok(())
}
