//! `cargo xtask bench-kernels-vs-ggml`: Synapse's quantized matmul and ggml's, side by side on the
//! same weights, activations, shapes and thread count, alternated shape by shape in one run.
//!
//! Per case (type × rows × K) the Synapse example `kbench_ggml gen` writes random weights (f16
//! scales in [0.005, 0.015)) and activations to `<target>/bench-kernels-vs-ggml/<case>/`; then for
//! `--rounds` rounds, in rotating order, one child process per engine times single calls for each
//! `n`: `kbench_ggml run` (`QuantMatrix::from_ggml` + `matmul`) and `xtask/py/bench_ggml_matmul.py`
//! in the oracle venv (ggml's own `ggml_mul_mat` graph from llama-cpp-python's `libggml-cpu.so`;
//! for the types in `--repack-types` also with the weights in ggml's CPU_REPACK buffer, which is
//! what llama.cpp runs by default). Both sides cycle through enough copies of the weights to exceed
//! `--cold-mib` MiB, so each call streams its weights from DRAM as in decode. Each child reports,
//! per `n`, every call's wall time and the system-wide and own CPU ticks over the timed loop. Each
//! run waits (up to `--quiet-wait-s`) for the machine to be quiet first; a run
//! in which other processes used more than `--foreign-frac` of a core (and ≥ 5 ticks) is redone up
//! to `--max-redo` times, then kept and flagged. The outputs of copy 0 for n = 1..8 and the timed
//! `n` are compared element by element (Synapse reproduces ggml's plain kernels bit for bit).
//! The machine's streaming bandwidth is measured before and after with `cargo xtask membw`'s code
//! (this binary's `membw` subcommand, 2 threads), and again before and after each case (the VM's
//! bandwidth drifts over minutes), so n = 1 is reported as GB/s and % of both; and Synapse's
//! n = 1 calls are each followed by a timed plain streaming read of as many cold bytes through
//! the same thread pool (`kbench_ggml --stream-ns 1`), reported as the median per-pair fraction:
//! the tightest reference, same size, same threads, same coldness, seconds apart.
//!
//! `--types` also takes Synapse codec ids (`syn.q8.symmetric.g64.v1`, `syn.q4.symmetric.g64.v1`
//! …: the encodings a precision profile runs): their weights are random values encoded by the
//! codec, only Synapse runs them (ggml has no such encoding; put the ggml type of the same bits,
//! `q8_0`/`q4_0`, beside them), and the n = 1 row gives the codec GEMV's weight GB/s and its
//! fraction of the paired streaming read — the figure the precision issue's ≥ 80% goal is about.
//! `w158a8` is BitNet's W1.58A8 kernel (`QuantMatrix::from_ternary_a8`: random ternary weights
//! in Synapse's 2-bit packing, 64 bytes a 256 with one scale a tensor, 8-bit activations a row)
//! — Synapse's own ternary packing, to put beside ggml's `tq2_0` (the BitNet issue's ≥ 85% goal).

use crate::oracle_env;
use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Arguments of `bench-kernels-vs-ggml`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Weight types (ggml names); shapes whose K is not a multiple of the block are skipped.
    #[arg(long, value_delimiter = ',', default_values_t = ["q8_0".to_string(), "q5_0".into(), "q4_K".into(), "q6_K".into()])]
    types: Vec<String>,
    /// Activation rows per call to time.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 8, 128])]
    ns: Vec<usize>,
    /// Compute threads for both engines.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Child runs per engine per case (alternating order).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Total size of the weight copies cycled through (MiB; 0 = one cache-resident copy).
    #[arg(long, default_value_t = 1024)]
    cold_mib: usize,
    /// Timed calls per n run for at least this long (ms) ...
    #[arg(long, default_value_t = 200.0)]
    budget_ms: f64,
    /// ... and at least this many calls ...
    #[arg(long, default_value_t = 5)]
    min_calls: usize,
    /// ... and at most this many.
    #[arg(long, default_value_t = 2000)]
    max_calls: usize,
    /// Types also timed with ggml's CPU_REPACK buffer (llama.cpp's default on AVX2: q4_0, q4_K, iq4_nl).
    #[arg(long, value_delimiter = ',', default_values_t = ["q4_K".to_string()])]
    repack_types: Vec<String>,
    /// A run is redone when other processes used more than this fraction of one core during it.
    #[arg(long, default_value_t = 0.2)]
    foreign_frac: f64,
    /// How many times a contaminated run is redone before it is kept (and flagged).
    #[arg(long, default_value_t = 2)]
    max_redo: usize,
    /// Before each run, wait up to this many seconds for the machine to be quiet (others using
    /// less than `--foreign-frac` of a core over half a second).
    #[arg(long, default_value_t = 120.0)]
    quiet_wait_s: f64,
    /// Only cases whose `type/ROWSxK` contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Skip the 262144×640 LM head (178 MB of Q8_0 per copy).
    #[arg(long)]
    no_lm_head: bool,
    /// Matrix shapes `ROWSxK` instead of Gemma 3 270M's (e.g. BitNet b1.58 2B4T's
    /// `2560x2560,640x2560,6912x2560,2560x6912`); the LM head is then left out.
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    shapes: Vec<(usize, usize)>,
    /// Buffer for the bandwidth measurement (MiB).
    #[arg(long, default_value_t = 512)]
    membw_mib: usize,
    /// Use an already built `kbench_ggml` example instead of building it.
    #[arg(long)]
    no_build: bool,
    /// Where to write the results (default: `<target>/bench-kernels-vs-ggml.json`).
    #[arg(long)]
    json_out: Option<PathBuf>,
}

/// Gemma 3 270M's matmul shapes (rows × K).
const SHAPES: [(usize, usize); 5] = [
    (1024, 640),
    (640, 1024),
    (2048, 640),
    (640, 2048),
    (256, 640),
];
const LM_HEAD: (usize, usize) = (262144, 640);

/// `ROWSxK` → (rows, K).
fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let (r, k) = s
        .trim()
        .split_once('x')
        .ok_or_else(|| format!("`{s}`: expected ROWSxK"))?;
    let parse = |v: &str| {
        v.parse::<usize>()
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("`{s}`: `{v}` is not a positive integer"))
    };
    Ok((parse(r)?, parse(k)?))
}
/// (type, rows, K) of the tensors of the default model (gemma-3-270m Q4_K_M).
const MODEL: [(&str, usize, usize); 7] = [
    ("q5_0", 1024, 640),
    ("q5_0", 256, 640),
    ("q8_0", 256, 640),
    ("q4_K", 640, 1024),
    ("q5_0", 2048, 640),
    ("q4_K", 640, 2048),
    ("q6_K", 640, 2048),
];

/// Whether `ty` is a Synapse codec id or `w158a8` (only Synapse runs it: ggml has no such
/// encoding).
fn is_codec(ty: &str) -> bool {
    ty.starts_with("syn.") || ty.eq_ignore_ascii_case("w158a8")
}

fn block_size(ty: &str) -> Result<usize> {
    if ty.eq_ignore_ascii_case("w158a8") {
        return Ok(256);
    }
    if is_codec(ty) {
        // The symmetric group codecs' group (`syn.qN.symmetric.g64.v1`).
        return Ok(64);
    }
    match ty.to_ascii_lowercase().as_str() {
        "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q8_0" | "iq4_nl" => Ok(32),
        "q2_k" | "q3_k" | "q4_k" | "q5_k" | "q6_k" | "iq4_xs" | "tq1_0" | "tq2_0" => Ok(256),
        _ => bail!(
            "bench-kernels-vs-ggml supports q4_0 q4_1 q5_0 q5_1 q8_0 iq4_nl q2_K..q6_K iq4_xs tq1_0 tq2_0, Synapse codec ids (syn.q4.symmetric.g64.v1 …) and w158a8, not {ty}"
        ),
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| oracle_env::repo_root().join("target"))
}

fn join(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("spawning {what}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(15).collect();
        bail!(
            "{what} failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn last_json(stdout: &str) -> Result<Value> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("no JSON object on stdout"))?;
    serde_json::from_str(line).with_context(|| format!("parsing {line:.200}"))
}

/// `(pass GB/s, segment p90 GB/s)` with `threads` threads, from this binary's `membw`: its
/// first section, on 4 KiB pages, as the weights this bench times are (plain vectors).
fn membw(mib: usize, threads: usize) -> Result<(f64, f64)> {
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let out = output(
        Command::new(exe).args([
            "membw",
            "--mib",
            &mib.to_string(),
            "--threads",
            &threads.to_string(),
        ]),
        "xtask membw",
    )?;
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("threads {threads}:")))
        .ok_or_else(|| anyhow!("unexpected membw output: {out}"))?;
    let nums: Vec<f64> = line
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter_map(|t| t.parse().ok())
        .collect();
    match nums.as_slice() {
        [pass, seg, ..] => Ok((*pass, *seg)),
        _ => bail!("unexpected membw line: {line}"),
    }
}

struct Case {
    ty: String,
    rows: usize,
    k: usize,
    dir: PathBuf,
}

impl Case {
    fn name(&self) -> String {
        format!("{}/{}x{}", self.ty, self.rows, self.k)
    }
    fn in_model(&self) -> bool {
        MODEL.contains(&(self.ty.as_str(), self.rows, self.k)) || (self.rows, self.k) == LM_HEAD
    }
}

struct Runner<'a> {
    args: &'a Args,
    python: PathBuf,
    script: PathBuf,
    kbench: PathBuf,
    hz: f64,
}

/// max |y_synapse - y_engine| per engine and n.
type Diffs = BTreeMap<String, BTreeMap<usize, f32>>;

/// Each engine's accumulated times, in run order.
type Engines = Vec<(String, Acc)>;

/// Times (ns) of every call per n, for one engine of one case.
#[derive(Default)]
struct Acc {
    times: BTreeMap<usize, Vec<u64>>,
    /// (kernel ns, paired streaming-read ns) per call, for the n the reference is paired with.
    pairs: BTreeMap<usize, Vec<(u64, u64)>>,
    copies: u64,
    weight_bytes: u64,
    flagged: usize,
    redone: usize,
}

impl Runner<'_> {
    fn command(&self, engine: &str, c: &Case, check: &[usize]) -> Command {
        let a = self.args;
        let mut cmd = if engine == "synapse" {
            let mut cmd = Command::new(&self.kbench);
            cmd.arg("run");
            cmd
        } else {
            let mut cmd = Command::new(&self.python);
            cmd.arg(&self.script);
            cmd
        };
        cmd.arg(&c.ty)
            .arg(c.rows.to_string())
            .arg(c.k.to_string())
            .arg(&c.dir)
            .args(["--threads", &a.threads.to_string()])
            .args(["--ns", &join(&a.ns)])
            .args(["--cold-mib", &a.cold_mib.to_string()])
            .args(["--budget-ms", &a.budget_ms.to_string()])
            .args(["--min-calls", &a.min_calls.to_string()])
            .args(["--max-calls", &a.max_calls.to_string()]);
        if !check.is_empty() {
            cmd.args(["--check-ns", &join(check)]);
        }
        if engine == "ggml-repack" {
            cmd.arg("--repack");
        }
        if engine == "synapse" {
            cmd.args(["--stream-ns", "1"]);
        }
        cmd
    }

    /// Waits (up to `--quiet-wait-s`) until other processes use less than `--foreign-frac` of a
    /// core over half a second; returns whether the machine was quiet.
    fn wait_quiet(&self) -> bool {
        let t0 = std::time::Instant::now();
        loop {
            let b0 = busy_ticks();
            std::thread::sleep(Duration::from_millis(500));
            let used = busy_ticks().saturating_sub(b0) as f64 / self.hz / 0.5;
            if used < self.args.foreign_frac {
                return true;
            }
            if t0.elapsed().as_secs_f64() > self.args.quiet_wait_s {
                println!(
                    "    machine still busy ({:.0}% of a core used by others); running anyway",
                    used * 100.0
                );
                return false;
            }
        }
    }

    /// One child run, redone while contaminated; adds its times to `acc`.
    fn run(&self, engine: &str, c: &Case, check: &[usize], acc: &mut Acc) -> Result<()> {
        let mut tries = 0;
        loop {
            self.wait_quiet();
            let out = output(
                &mut self.command(engine, c, check),
                &format!("{engine} on {}", c.name()),
            )?;
            let j = last_json(&out)?;
            let results = j["results"]
                .as_array()
                .ok_or_else(|| anyhow!("{engine}: no results"))?;
            let mut worst = 0.0f64;
            let mut bad = false;
            for r in results {
                let busy = r["busy_ticks"].as_f64().unwrap_or(0.0);
                let own = r["self_ticks"].as_f64().unwrap_or(0.0);
                let wall = r["wall_s"].as_f64().unwrap_or(0.0);
                let foreign = (busy - own).max(0.0) / self.hz;
                worst = worst.max(foreign / wall.max(1e-9));
                bad |= foreign > (5.0 / self.hz).max(self.args.foreign_frac * wall);
            }
            if bad && tries < self.args.max_redo {
                tries += 1;
                acc.redone += 1;
                println!(
                    "    {engine:11} contaminated (others used {:.0}% of a core); redoing",
                    worst * 100.0
                );
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            if bad {
                acc.flagged += 1;
            }
            acc.copies = j["copies"].as_u64().unwrap_or(0);
            acc.weight_bytes = j["weight_bytes"].as_u64().unwrap_or(0);
            for r in results {
                let n = r["n"].as_u64().unwrap_or(0) as usize;
                let ts = r["ns"].as_array().map(|v| v.as_slice()).unwrap_or(&[]);
                acc.times
                    .entry(n)
                    .or_default()
                    .extend(ts.iter().filter_map(|t| t.as_u64()));
                if let Some(ss) = r["stream_ns"].as_array().filter(|v| v.len() == ts.len()) {
                    acc.pairs.entry(n).or_default().extend(
                        ts.iter()
                            .zip(ss)
                            .filter_map(|(t, s)| Some((t.as_u64()?, s.as_u64()?))),
                    );
                }
            }
            return Ok(());
        }
    }
}

/// System-wide busy CPU ticks (user+nice+system+irq+softirq+steal) from `/proc/stat`.
fn busy_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    if v.len() < 8 {
        return 0;
    }
    v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
}

fn read_f32(p: &Path) -> Result<Vec<f32>> {
    let b = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Median over calls of (paired streaming-read time / kernel time): the kernel's bandwidth as
/// a fraction of a plain read of the same bytes right after it.
fn paired_fraction(acc: Option<&Acc>, n: usize) -> Option<f64> {
    let mut r: Vec<f64> = acc?
        .pairs
        .get(&n)?
        .iter()
        .map(|&(k, s)| s as f64 / k.max(1) as f64)
        .collect();
    if r.is_empty() {
        return None;
    }
    r.sort_by(f64::total_cmp);
    Some(r[r.len() / 2])
}

/// `(median, best)` of `v` in ns.
fn stats(v: &[u64]) -> Option<(f64, f64)> {
    let mut s = v.to_vec();
    s.sort_unstable();
    let n = s.len();
    if n == 0 {
        return None;
    }
    let med = if n % 2 == 1 {
        s[n / 2] as f64
    } else {
        (s[n / 2 - 1] + s[n / 2]) as f64 / 2.0
    };
    Some((med, s[0] as f64))
}

/// Runs the benchmark.
pub fn run(args: Args) -> Result<()> {
    let python = oracle_env::python().context(
        "the ggml side needs the oracle venv with llama-cpp-python (SYNAPSE_ORACLE_VENV=/work/oracle/venv)",
    )?;
    let root = oracle_env::repo_root();
    let script = root.join("xtask/py/bench_ggml_matmul.py");
    let probe = output(
        Command::new(&python).arg(&script).arg("--probe"),
        "the ggml probe (is llama-cpp-python installed in the oracle venv? `cargo xtask oracle-env --llama`)",
    )?;
    let probe = last_json(&probe)?;
    if !args.no_build {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&root)
            .args([
                "build",
                "--release",
                "-p",
                "synapse-kernels",
                "--example",
                "kbench_ggml",
            ])
            .status()
            .context("running cargo build")?;
        if !status.success() {
            bail!("`cargo build --release -p synapse-kernels --example kbench_ggml` failed");
        }
    }
    let kbench = target_dir().join("release/examples/kbench_ggml");
    if !kbench.is_file() {
        bail!("no kbench_ggml binary at {}", kbench.display());
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let runner = Runner {
        args: &args,
        python,
        script,
        kbench,
        hz,
    };

    let base = target_dir().join("bench-kernels-vs-ggml");
    let mut cases = Vec::new();
    let shapes: Vec<(usize, usize)> = if args.shapes.is_empty() {
        SHAPES
            .iter()
            .copied()
            .chain((!args.no_lm_head).then_some(LM_HEAD))
            .collect()
    } else {
        args.shapes.clone()
    };
    for &(rows, k) in &shapes {
        for ty in &args.types {
            // The LM head in the default model's Q8_0, and in any codec a profile may give it.
            if !k.is_multiple_of(block_size(ty)?)
                || ((rows, k) == LM_HEAD && ty != "q8_0" && !is_codec(ty))
            {
                continue;
            }
            let c = Case {
                ty: ty.clone(),
                rows,
                k,
                dir: base.join(format!("{ty}_{rows}x{k}")),
            };
            if args.filter.as_ref().is_some_and(|f| !c.name().contains(f)) {
                continue;
            }
            cases.push(c);
        }
    }
    let mut check: Vec<usize> = (1..=8).chain(args.ns.iter().copied()).collect();
    check.sort_unstable();
    check.dedup();
    let nmax = check.iter().copied().max().unwrap_or(1);

    let bw0 = membw(args.membw_mib, args.threads)?;
    println!(
        "bench-kernels-vs-ggml: {} cases, n = {:?}, {} threads, {} rounds, weights cycled through copies \
         totalling >= {} MiB per engine (DRAM-streamed); ggml: {probe}",
        cases.len(),
        args.ns,
        args.threads,
        args.rounds,
        args.cold_mib
    );
    println!(
        "streaming read bandwidth ({} threads, {} MiB): pass {:.2} GB/s, segment p90 {:.2} GB/s",
        args.threads, args.membw_mib, bw0.0, bw0.1
    );

    let mut all: Vec<(Case, Engines, Diffs, (f64, f64))> = Vec::new();
    for c in cases {
        output(
            Command::new(&runner.kbench)
                .arg("gen")
                .arg(&c.ty)
                .arg(c.rows.to_string())
                .arg(c.k.to_string())
                .arg(nmax.to_string())
                .arg(&c.dir),
            "kbench_ggml gen",
        )?;
        let mut engines = vec!["synapse".to_string()];
        if !is_codec(&c.ty) {
            engines.push("ggml".into());
        }
        if args
            .repack_types
            .iter()
            .any(|t| t.eq_ignore_ascii_case(&c.ty))
        {
            engines.push("ggml-repack".into());
        }
        let mut accs: Engines = engines
            .iter()
            .map(|e| (e.clone(), Acc::default()))
            .collect();
        // The bandwidth right beside this case (the VM's drifts over minutes): before and after.
        let near0 = membw(args.membw_mib, args.threads)?;
        for round in 0..args.rounds.max(1) {
            for i in 0..engines.len() {
                let e = (i + round) % engines.len();
                let ck: &[usize] = if round == 0 { &check } else { &[] };
                runner.run(&engines[e], &c, ck, &mut accs[e].1)?;
            }
        }
        let syn = |n: usize| read_f32(&c.dir.join(format!("y_synapse_n{n}.bin")));
        let mut diffs = Diffs::new();
        for e in engines.iter().skip(1) {
            for &n in &check {
                let (a, b) = (syn(n)?, read_f32(&c.dir.join(format!("y_{e}_n{n}.bin")))?);
                if a.len() != b.len() {
                    bail!("{}: output lengths differ for {e} n={n}", c.name());
                }
                let d = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, |m, v| {
                        if v.is_nan() || m.is_nan() {
                            f32::NAN
                        } else {
                            m.max(v)
                        }
                    });
                diffs.entry(e.clone()).or_default().insert(n, d);
            }
        }
        let mut line = format!("  {:16}", c.name());
        for (e, acc) in &accs {
            let t: Vec<String> = acc
                .times
                .iter()
                .map(|(n, v)| {
                    let (m, _) = stats(v).unwrap_or((f64::NAN, f64::NAN));
                    format!("n{n} {:.1}", (2 * c.rows * c.k * n) as f64 / m)
                })
                .collect();
            line += &format!(" | {e}: {} GF/s", t.join(" "));
        }
        let near1 = membw(args.membw_mib, args.threads)?;
        let near = (near0.0.max(near1.0), near0.1.max(near1.1));
        println!("{line} | membw beside {:.2}/{:.2} GB/s", near.0, near.1);
        all.push((c, accs, diffs, near));
    }
    let bw1 = membw(args.membw_mib, args.threads)?;
    let (bw, bwp) = (bw0.0.max(bw1.0), bw0.1.max(bw1.1));
    println!(
        "streaming read bandwidth after: pass {:.2} GB/s, segment p90 {:.2} GB/s; references = {bw:.2} (pass) and {bwp:.2} (p90) GB/s",
        bw1.0, bw1.1
    );

    // the table
    println!(
        "\nmedian (best) per-call GFLOP/s, {} threads; ratio = Synapse GF/s / ggml GF/s (> 1: Synapse faster), median (best); * = a tensor of the default model; \
         n=1 also as weight GB/s and % of: a plain streaming read of as many cold bytes through the same pool timed right after each call (median of the per-pair ratios; Synapse only) / the 512 MiB streaming pass measured beside the case / the run's pass reference / its p90; diff = max |y_synapse - y_ggml| over n = 1..8 and the timed n",
        args.threads
    );
    println!(
        "{:5} {:>12} {:>4} | {:>15} {:>15} {:>13} | {:>15} {:>6} | {:>29} {:>22} | {:>9} {:>9}",
        "type",
        "rows x K",
        "n",
        "synapse GF/s",
        "ggml GF/s",
        "ratio",
        "ggml-rp GF/s",
        "ratio",
        "syn GB/s %paired/near/pass/p90",
        "ggml GB/s %near/pass/p90",
        "diff",
        "diff-rp"
    );
    let mut jcases = Vec::new();
    for (c, accs, diffs, near) in &all {
        let get = |e: &str| accs.iter().find(|(n, _)| n == e).map(|(_, a)| a);
        let flops = |n: usize| (2 * c.rows * c.k * n) as f64;
        let mut jeng = serde_json::Map::new();
        for (e, acc) in accs {
            let mut per_n = serde_json::Map::new();
            for (n, v) in &acc.times {
                if let Some((m, b)) = stats(v) {
                    per_n.insert(
                        n.to_string(),
                        json!({"calls": v.len(), "median_ns": m, "best_ns": b,
                               "gflops_median": flops(*n) / m, "gflops_best": flops(*n) / b}),
                    );
                }
            }
            jeng.insert(
                e.clone(),
                json!({"copies": acc.copies, "runs_redone": acc.redone, "runs_flagged": acc.flagged, "per_n": per_n}),
            );
        }
        let wbytes = get("ggml").or(get("synapse")).map_or(0, |a| a.weight_bytes);
        for &n in &args.ns {
            let st = |e: &str| get(e).and_then(|a| a.times.get(&n)).and_then(|v| stats(v));
            let (s, g, r) = (st("synapse"), st("ggml"), st("ggml-repack"));
            let gf = |x: Option<(f64, f64)>| {
                x.map_or("-".to_string(), |(m, b)| {
                    format!("{:.1} ({:.1})", flops(n) / m, flops(n) / b)
                })
            };
            let ratio = |x: Option<(f64, f64)>| match (s, x) {
                (Some((sm, sb)), Some((xm, xb))) => format!("{:.2} ({:.2})", xm / sm, xb / sb),
                _ => "-".into(),
            };
            let bwcol = |x: Option<(f64, f64)>, paired: Option<f64>| match x {
                Some((m, _)) if n == 1 => {
                    let gbs = wbytes as f64 / m;
                    format!(
                        "{gbs:.2} {}{:.0}/{:.0}/{:.0}%",
                        paired.map_or(String::new(), |p| format!("{:.0}/", 100.0 * p)),
                        100.0 * gbs / near.0,
                        100.0 * gbs / bw,
                        100.0 * gbs / bwp
                    )
                }
                _ => String::new(),
            };
            let paired = paired_fraction(get("synapse"), n);
            let dmax = |e: &str| {
                diffs.get(e).map_or(String::new(), |m| {
                    let d = m.values().fold(0f32, |a, v| a.max(*v));
                    if d == 0.0 {
                        "0".to_string()
                    } else {
                        format!("{d:.2e}")
                    }
                })
            };
            let flag = if c.in_model() { "*" } else { "" };
            println!(
                "{:5} {:>12} {:>4} | {:>15} {:>15} {:>13} | {:>15} {:>6} | {:>29} {:>22} | {:>9} {:>9}",
                c.ty,
                format!("{flag}{}x{}", c.rows, c.k),
                n,
                gf(s),
                gf(g),
                ratio(g),
                gf(r),
                if r.is_some() {
                    ratio(r).split(' ').next().unwrap_or("").to_string()
                } else {
                    String::new()
                },
                bwcol(s, paired),
                bwcol(g, None),
                if n == args.ns[0] {
                    dmax("ggml")
                } else {
                    String::new()
                },
                if n == args.ns[0] {
                    dmax("ggml-repack")
                } else {
                    String::new()
                },
            );
        }
        let flagged: usize = accs.iter().map(|(_, a)| a.flagged).sum();
        if flagged > 0 {
            println!("      ({flagged} run(s) of this case kept although contaminated)");
        }
        jcases.push(json!({
            "type": c.ty, "rows": c.rows, "k": c.k, "weight_bytes": wbytes, "model_tensor": c.in_model(),
            "engines": jeng,
            "membw_beside_gbs": {"pass": near.0, "segment_p90": near.1},
            "synapse_n1_fraction_of_paired_stream": paired_fraction(get("synapse"), 1),
            "max_abs_diff_vs_synapse": diffs,
        }));
    }
    let json_out = args
        .json_out
        .clone()
        .unwrap_or_else(|| target_dir().join("bench-kernels-vs-ggml.json"));
    let doc = json!({
        "threads": args.threads, "ns": args.ns, "rounds": args.rounds, "cold_mib": args.cold_mib,
        "budget_ms": args.budget_ms, "foreign_frac": args.foreign_frac, "ggml": probe,
        "membw_gbs": {"before": {"pass": bw0.0, "segment_p90": bw0.1},
                      "after": {"pass": bw1.0, "segment_p90": bw1.1}, "reference_pass": bw, "reference_p90": bwp},
        "cases": jcases,
    });
    std::fs::write(&json_out, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", json_out.display()))?;
    println!("wrote {}", json_out.display());
    Ok(())
}
