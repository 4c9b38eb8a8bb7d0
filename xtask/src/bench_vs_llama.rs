//! `cargo xtask bench-vs-llama`: Synapse and llama.cpp side by side on the same GGUF, same machine,
//! same thread count, run alternately.
//!
//! Each timed run is one child process: `synapse-cli generate --json` (built here with
//! `cargo build --release -p synapse-cli`) or `xtask/py/bench_llama.py` in the oracle venv (llama.cpp
//! through llama-cpp-python's low-level API, llama.cpp's default context settings). Both print
//! `{"prompt_tokens", "tokens", "text", "timings": {"load_s", "prefill_tok_s", "decode_tok_s"}}`.
//! Peak RSS and the child's CPU time come from `wait4`'s rusage. The machine is shared, so around
//! every run the CPU time used by all other processes is read from `/proc/stat`; a run during
//! which others used more than `--foreign-limit` CPU-seconds (per 10 s of wall clock for longer
//! runs) is redone (up to `--max-redo` times, then kept and flagged). Medians and Synapse/llama.cpp ratios are printed and written as JSON.
//!
//! `--context 512,2048,8192` sweeps prompt lengths: for each, a prompt of that many tokens (with
//! BOS, by the model's own tokenizer through `synapse-cli tokenize --json`, within a word's
//! tokens) is cut from the benchmark prose repeated as often as needed (see [`fit_prompt`]); both
//! engines get the identical text, each context is benchmarked as above (warm-up, alternating
//! runs, medians), and a summary table follows. A context the fixed prose already tokenizes to
//! within [`VERBATIM_TOL`] tokens gets the prose verbatim, so the default `--context 512` runs
//! the same prompt as before the sweep existed.

use crate::{oracle_env, parity_fixtures};
use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `bench-vs-llama`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF to run: a path, or a published model's name in the model cache
    /// (`gemma-3-270m`, `qwen2.5-coder-0.5b-instruct`, `smollm2-135m-instruct`; `synapse-cli
    /// fetch-model NAME` puts it there) (default: Gemma 3 270M, as for `parity-fixtures`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt lengths in tokens (with BOS), comma-separated: each is benchmarked in turn, then a
    /// summary table compares them (default: 512, the fixed prose).
    #[arg(long, value_delimiter = ',', default_value = "512")]
    context: Vec<usize>,
    /// Timed runs per engine (after one warm-up run each).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Compute threads for both engines.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Tokens decoded per run.
    #[arg(long, default_value_t = 128)]
    n_gen: usize,
    /// A run is redone when other processes used more CPU-seconds than this during it (per
    /// 10 s of the run's wall clock for longer runs).
    #[arg(long, default_value_t = 0.3)]
    foreign_limit: f64,
    /// How many times a contaminated run is redone before it is kept (and flagged).
    #[arg(long, default_value_t = 4)]
    max_redo: usize,
    /// Use this synapse-cli binary instead of building one.
    #[arg(long)]
    synapse_bin: Option<PathBuf>,
    /// Where to write the results (default: `<target>/bench-vs-llama.json`).
    #[arg(long)]
    json_out: Option<PathBuf>,
}

/// The benchmark prose: tokenizes to ≈ 512 tokens (with BOS): 511 with Gemma 3's tokenizer, 516
/// with SmolLM2's, 522 with Qwen2.5's. Longer prompts repeat it (see [`prose_words`]).
const PROMPT: &str = "In the beginning of the twentieth century, the small coastal town was known mostly for its \
fishing fleet and its lighthouse. Travelers who arrived by train would walk along the harbor, watching the boats \
return with their catch, while children ran between the nets drying in the sun. The local school taught arithmetic, \
geography and history, and every spring the town held a festival where musicians played late into the night. Over \
the decades, the town changed: new roads were built, the railway station was expanded, and a university opened on \
the hill above the bay. Scientists came to study the tides and the migrating birds, and the old lighthouse became a \
museum that told the story of the sailors who had lived and worked there for generations. Today the town welcomes \
visitors from all over the world, who come to enjoy the beaches, the food, and the quiet evenings by the sea. \
The harbor master, a tall woman with a weathered face, still keeps a logbook of every vessel that enters the bay. \
Her grandfather started it in 1921, writing in pencil on squared paper the name of each boat, its tonnage, its \
cargo and the state of the sea. The logbooks fill a whole wall of the museum now, and researchers from the \
university use them to reconstruct storms, fish migrations and the slow rise of the water along the quay. \
Every summer, students arrive with laptops and cameras, and they spend their evenings arguing in the cafés about \
what the numbers mean. Some say the town will have to move its lowest streets within a century; others point out \
that the harbor wall has been raised three times already, and that the town has always adapted. The fishermen, for \
their part, mostly listen and smile. They have seen the sea take boats and give back fish, close the bay with ice \
in the coldest winters and flood the market square in the autumn gales. They repair their nets, paint their hulls, \
and go out before dawn, as their parents did. In the evening the lighthouse still turns, although no ship needs it \
any more, because the town voted to keep it lit. Visitors stop on the pier to watch the beam sweep across the water, \
and for a moment the old town and the new one seem to be the same place. Later that year, a storm arrived from the \
west, and the harbor master opened her logbook to a fresh page. She wrote the date, the direction of the wind \
and the height of the waves at the harbor mouth, and then, after a pause, a single line about the lighthouse.";

/// A context whose target the fixed prose tokenizes to within this many tokens gets the prose
/// verbatim (all three published models at 512), others a fitted cut of it.
pub(crate) const VERBATIM_TOL: usize = 16;

/// Longest prompt text: it goes on the command line of `synapse-cli`, and Linux limits one
/// argument to 128 KiB (`MAX_ARG_STRLEN`); ≈ 25k tokens of the prose.
const MAX_PROMPT_BYTES: usize = 120 * 1024;

/// The first `k` words of the prose repeated without end: the words of [`PROMPT`] joined by its
/// own single spaces, a blank line between repetitions. `prose_words(n)` for the prose's `n`
/// words is [`PROMPT`] itself.
pub(crate) fn prose_words(k: usize) -> String {
    let words: Vec<&str> = PROMPT.split(' ').collect();
    let n = words.len();
    let mut s = String::with_capacity(k * (PROMPT.len() / n + 1));
    for i in 0..k {
        if i > 0 {
            s.push_str(if i % n == 0 { "\n\n" } else { " " });
        }
        s.push_str(words[i % n]);
    }
    s
}

/// A prompt fitted to a target length.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fitted {
    pub text: String,
    /// Its length in tokens as `count` gave it.
    pub tokens: usize,
    /// Words of the repeated prose in it.
    pub words: usize,
    /// Whether it is [`PROMPT`] verbatim.
    pub verbatim: bool,
}

/// The prompt for a context of `target` tokens, `count` giving a text's length in tokens: the
/// prose verbatim if it counts within [`VERBATIM_TOL`] of `target`, else the word prefix of
/// [`prose_words`] whose count is closest to `target` (binary search for the first prefix that
/// reaches it, then that or the one a word shorter; counts grow with the prefix, so the result
/// is off by at most one word's tokens).
pub(crate) fn fit_prompt(
    target: usize,
    mut count: impl FnMut(&str) -> Result<usize>,
) -> Result<Fitted> {
    let n_words = PROMPT.split(' ').count();
    let base = count(PROMPT)?;
    if base.abs_diff(target) <= VERBATIM_TOL {
        return Ok(Fitted {
            text: PROMPT.to_string(),
            tokens: base,
            words: n_words,
            verbatim: true,
        });
    }
    // An upper bound: a prefix that reaches the target (from the prose's words per token).
    let mut hi = (target * n_words).div_ceil(base.max(1)) + 16;
    let mut hi_n = loop {
        let text = prose_words(hi);
        if text.len() > MAX_PROMPT_BYTES {
            bail!(
                "a {target}-token prompt needs more than {MAX_PROMPT_BYTES} bytes of text \
                 (the command-line limit of one argument)"
            );
        }
        let c = count(&text)?;
        if c >= target {
            break c;
        }
        hi *= 2;
    };
    // Invariant: count(prose_words(lo)) < target <= count(prose_words(hi)) = hi_n.
    let (mut lo, mut lo_n) = (0usize, 0usize);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let c = count(&prose_words(mid))?;
        if c >= target {
            (hi, hi_n) = (mid, c);
        } else {
            (lo, lo_n) = (mid, c);
        }
    }
    if lo == 0 {
        lo_n = count("")?;
    }
    let (words, tokens) = if lo > 0 && target - lo_n < hi_n - target {
        (lo, lo_n)
    } else {
        (hi, hi_n)
    };
    Ok(Fitted {
        text: prose_words(words),
        tokens,
        words,
        verbatim: false,
    })
}

#[derive(Deserialize, Debug)]
struct GenJson {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    #[allow(dead_code)]
    text: String,
    timings: Timings,
    #[serde(default)]
    baseline_rss_kb: Option<u64>,
    /// Weight bytes a decode step reads (Synapse reports it; llama.cpp reads the same GGUF).
    #[serde(default)]
    decode_read_bytes: Option<u64>,
    /// f32 KV bytes a decode step reads halfway through the generation.
    #[serde(default)]
    kv_read_bytes_mid: Option<u64>,
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy)]
struct Timings {
    load_s: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
}

#[derive(Serialize, Debug, Clone)]
struct RunResult {
    engine: &'static str,
    timings: Timings,
    peak_rss_mb: f64,
    /// Peak RSS minus the driver's own baseline (the Python interpreter, llama.cpp side only).
    peak_rss_engine_mb: f64,
    prompt_len: usize,
    generated: usize,
    wall_s: f64,
    child_cpu_s: f64,
    foreign_cpu_s: f64,
    contaminated: bool,
    redone: Vec<f64>,
    decode_read_bytes: Option<u64>,
    kv_read_bytes_mid: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
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

/// System-wide busy CPU ticks (user+nice+system+irq+softirq+steal) from `/proc/stat`.
pub(crate) fn busy_ticks() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = s
        .lines()
        .next()
        .ok_or_else(|| anyhow!("empty /proc/stat"))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    if v.len() < 8 {
        bail!("unexpected /proc/stat line: {line}");
    }
    Ok(v[0] + v[1] + v[2] + v[5] + v[6] + v[7])
}

pub(crate) struct ChildOutcome {
    pub stdout: String,
    pub stderr: String,
    pub success: bool,
    pub wall_s: f64,
    pub cpu_s: f64,
    pub maxrss_kb: u64,
    pub foreign_cpu_s: f64,
}

/// Runs `cmd` to completion, reaping it with `wait4` for its rusage.
pub(crate) fn run_measured(cmd: &mut Command) -> Result<ChildOutcome> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let b0 = busy_ticks()?;
    let t0 = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {cmd:?}"))?;
    let mut err_pipe = child
        .stderr
        .take()
        .ok_or_else(|| anyhow!("no stderr pipe"))?;
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout pipe"))?
        .read_to_string(&mut stdout)
        .context("reading child stdout")?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; wait4 fills it for our own child `pid`, which has not
    // been reaped (std's Child is not waited on afterwards).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    if r != pid {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let b1 = busy_ticks()?;
    let stderr = err_thread.join().unwrap_or_default();
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    let cpu_s = tv(ru.ru_utime) + tv(ru.ru_stime);
    let success = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok(ChildOutcome {
        stdout,
        stderr,
        success,
        wall_s,
        cpu_s,
        maxrss_kb: ru.ru_maxrss.max(0) as u64,
        foreign_cpu_s: ((b1.saturating_sub(b0)) as f64 / hz - cpu_s).max(0.0),
    })
}

fn parse_json(stdout: &str) -> Result<GenJson> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("no JSON object on stdout"))?;
    serde_json::from_str(line).with_context(|| format!("parsing {line:.200}"))
}

struct Ctx {
    model: PathBuf,
    synapse_bin: PathBuf,
    python: PathBuf,
    threads: usize,
    n_gen: usize,
}

/// One context's prompt: the text, the file llama.cpp's side reads it from, and its length.
struct Prompt {
    context: usize,
    text: String,
    file: PathBuf,
    /// Tokens by `synapse-cli tokenize` (None when it could not run).
    tokens: Option<usize>,
    verbatim: bool,
}

/// Synapse's `--ctx` for `prompt` and `n_gen` decoded tokens: room for both plus a margin, and
/// never below `generate`'s own default of 4096. (llama.cpp's side sizes its context the same
/// way, from its own token count: `xtask/py/bench_llama.py`.)
fn synapse_ctx(prompt: &Prompt, n_gen: usize) -> usize {
    // Unknown token count: the bytes bound it (every token but BOS covers at least one byte).
    let tokens = prompt.tokens.unwrap_or(prompt.text.len() + 1);
    (tokens + n_gen + 64).max(4096)
}

fn command(ctx: &Ctx, engine: Engine, prompt: &Prompt, n_gen: usize) -> Command {
    match engine {
        Engine::Synapse => {
            let mut c = Command::new(&ctx.synapse_bin);
            c.arg("generate")
                .arg("--model")
                .arg(&ctx.model)
                .args(["-n", &n_gen.to_string(), "--temp", "0"])
                .args(["--threads", &ctx.threads.to_string(), "--json"])
                .args(["--ctx", &synapse_ctx(prompt, n_gen).to_string()])
                // llama.cpp's side decodes all n_gen tokens whatever it samples.
                .arg("--ignore-eos")
                .arg(&prompt.text);
            c
        }
        Engine::Llama => {
            let mut c = Command::new(&ctx.python);
            c.arg(oracle_env::repo_root().join("xtask/py/bench_llama.py"))
                .arg(&ctx.model)
                .arg(&prompt.file)
                .args(["--threads", &ctx.threads.to_string()])
                .args(["--n-gen", &n_gen.to_string()]);
            c
        }
    }
}

/// The length in tokens (with BOS) of `text` by the model's tokenizer (`synapse-cli tokenize`).
fn count_tokens(ctx: &Ctx, text: &str) -> Result<usize> {
    let out = Command::new(&ctx.synapse_bin)
        .arg("tokenize")
        .arg("--model")
        .arg(&ctx.model)
        .arg("--json")
        .arg(text)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} tokenize", ctx.synapse_bin.display()))?;
    if !out.status.success() {
        bail!(
            "`synapse-cli tokenize` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)
        .context("parsing the output of `synapse-cli tokenize --json`")?;
    Ok(rows.len())
}

fn run_once(ctx: &Ctx, engine: Engine, prompt: &Prompt) -> Result<RunResult> {
    let out = run_measured(&mut command(ctx, engine, prompt, ctx.n_gen))?;
    if !out.success {
        bail!(
            "{} run failed:\n{}",
            engine.name(),
            out.stderr
                .lines()
                .rev()
                .take(15)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let j = parse_json(&out.stdout).with_context(|| format!("{} output", engine.name()))?;
    let base = j.baseline_rss_kb.unwrap_or(0);
    Ok(RunResult {
        engine: engine.name(),
        timings: j.timings,
        peak_rss_mb: out.maxrss_kb as f64 / 1024.0,
        peak_rss_engine_mb: out.maxrss_kb.saturating_sub(base) as f64 / 1024.0,
        prompt_len: j.prompt_tokens.len(),
        generated: j.tokens.len(),
        wall_s: out.wall_s,
        child_cpu_s: out.cpu_s,
        foreign_cpu_s: out.foreign_cpu_s,
        contaminated: false,
        redone: Vec::new(),
        decode_read_bytes: j.decode_read_bytes,
        kv_read_bytes_mid: j.kv_read_bytes_mid,
    })
}

fn run_clean(
    ctx: &Ctx,
    engine: Engine,
    prompt: &Prompt,
    limit: f64,
    max_redo: usize,
) -> Result<RunResult> {
    let mut redone = Vec::new();
    loop {
        let mut r = run_once(ctx, engine, prompt)?;
        // The allowance grows with the run: `limit` per 10 s of wall clock, at least `limit`
        // (an 8k-token prompt's minute-long run otherwise never passes on a machine whose
        // background takes ~0.5 CPU-s a minute).
        let allowed = limit * (r.wall_s / 10.0).max(1.0);
        if r.foreign_cpu_s <= allowed || redone.len() >= max_redo {
            r.contaminated = r.foreign_cpu_s > allowed;
            r.redone = redone;
            return Ok(r);
        }
        println!(
            "    {:9} run contaminated: other processes used {:.2} CPU-s; redoing",
            engine.name(),
            r.foreign_cpu_s
        );
        redone.push((r.foreign_cpu_s * 100.0).round() / 100.0);
        std::thread::sleep(Duration::from_secs(2));
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Builds synapse-cli (release) and checks that `generate --json` works; Err says why not.
fn prepare_synapse(ctx: &Ctx, prebuilt: bool) -> Result<()> {
    if !prebuilt {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(oracle_env::repo_root())
            .args(["build", "--release", "-p", "synapse-cli"])
            .status()
            .context("running cargo build --release -p synapse-cli")?;
        if !status.success() {
            bail!("`cargo build --release -p synapse-cli` failed ({status})");
        }
    }
    if !ctx.synapse_bin.is_file() {
        bail!("no synapse-cli binary at {}", ctx.synapse_bin.display());
    }
    let hello = Prompt {
        context: 0,
        text: "Hello".into(),
        file: PathBuf::new(),
        tokens: None,
        verbatim: false,
    };
    let out = run_measured(&mut command(ctx, Engine::Synapse, &hello, 2))?;
    if !out.success {
        bail!(
            "`synapse-cli generate --json` failed (is the `generate` command implemented yet?):\n{}",
            out.stderr
                .lines()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    parse_json(&out.stdout).context(
        "`synapse-cli generate --json` did not print {\"prompt_tokens\", \"tokens\", \"text\", \"timings\": {\"load_s\", \"prefill_tok_s\", \"decode_tok_s\"}}",
    )?;
    Ok(())
}

pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| oracle_env::repo_root().join("target"))
}

fn summarize(results: &[RunResult], engine: &str) -> Option<[f64; 5]> {
    let rs: Vec<&RunResult> = results.iter().filter(|r| r.engine == engine).collect();
    if rs.is_empty() {
        return None;
    }
    let m = |f: &dyn Fn(&RunResult) -> f64| median(rs.iter().map(|r| f(r)).collect());
    Some([
        m(&|r| r.timings.prefill_tok_s),
        m(&|r| r.timings.decode_tok_s),
        m(&|r| r.timings.load_s),
        m(&|r| r.peak_rss_mb),
        m(&|r| r.peak_rss_engine_mb),
    ])
}

/// Rows of the medians table (the order of [`summarize`]'s array).
const NAMES: [&str; 5] = [
    "prefill tok/s",
    "decode tok/s",
    "load s",
    "peak RSS MB",
    "RSS MB w/o driver",
];

/// Each context's prompt, fitted with the model's tokenizer and written where llama.cpp's side
/// reads it.
fn build_prompts(ctx: &Ctx, contexts: &[usize]) -> Result<Vec<Prompt>> {
    let mut memo = std::collections::HashMap::<String, usize>::new();
    let mut prompts = Vec::with_capacity(contexts.len());
    for &c in contexts {
        let fitted = fit_prompt(c, |t| {
            if let Some(&n) = memo.get(t) {
                return Ok(n);
            }
            let n = count_tokens(ctx, t)?;
            memo.insert(t.to_string(), n);
            Ok(n)
        });
        let (text, tokens, verbatim) = match fitted {
            Ok(f) => (f.text, Some(f.tokens), f.verbatim),
            // Without a tokenizer the fixed prose still serves its own ≈ 512 tokens.
            Err(e) if c == 512 => {
                println!("  note: cannot count tokens ({e:#}); context 512 gets the fixed prose");
                (PROMPT.to_string(), None, true)
            }
            Err(e) => return Err(e).with_context(|| format!("fitting the {c}-token prompt")),
        };
        let file = target_dir().join(if contexts.len() == 1 && verbatim {
            "bench-vs-llama.prompt.txt".to_string()
        } else {
            format!("bench-vs-llama.prompt-{c}.txt")
        });
        std::fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
        prompts.push(Prompt {
            context: c,
            text,
            file,
            tokens,
            verbatim,
        });
    }
    Ok(prompts)
}

/// One context's runs and medians.
struct ContextResult {
    results: Vec<RunResult>,
    synapse: Option<[f64; 5]>,
    llama: Option<[f64; 5]>,
    /// Prompt tokens as each engine reported them.
    prompt_len: [Option<usize>; 2],
}

impl ContextResult {
    /// Synapse / llama.cpp of row `i` of the medians.
    fn ratio(&self, i: usize) -> Option<f64> {
        match (self.synapse, self.llama) {
            (Some(a), Some(b)) if b[i] > 0.0 => Some(a[i] / b[i]),
            _ => None,
        }
    }
}

/// Warm-up, then `runs` alternating rounds on `prompt`; prints the runs and the medians table.
fn bench_context(
    ctx: &Ctx,
    engines: &[Engine],
    prompt: &Prompt,
    args: &Args,
    sweep: bool,
) -> Result<ContextResult> {
    if sweep {
        println!(
            "\ncontext {}: prompt {} tokens, {} chars{}",
            prompt.context,
            prompt.tokens.map_or("?".into(), |t| t.to_string()),
            prompt.text.len(),
            if prompt.verbatim {
                " (the fixed prose)"
            } else {
                ""
            }
        );
    }
    let mut prompt_len = [None, None];
    for &e in engines {
        let r = run_once(ctx, e, prompt)
            .with_context(|| format!("{} warm-up (context {})", e.name(), prompt.context))?;
        println!(
            "  warm-up {:9}: prompt {} tokens, {} generated",
            e.name(),
            r.prompt_len,
            r.generated
        );
        prompt_len[(e == Engine::Llama) as usize] = Some(r.prompt_len);
    }
    if let [Some(a), Some(b)] = prompt_len
        && a != b
    {
        println!("  WARNING: the engines tokenize the prompt differently ({a} vs {b} tokens)");
    }
    let mut results = Vec::new();
    for round in 0..args.runs {
        // ABBA order so that slow drifts of the machine hit both engines alike
        let order: Vec<Engine> = if round % 2 == 0 {
            engines.to_vec()
        } else {
            engines.iter().rev().copied().collect()
        };
        for e in order {
            let r = run_clean(ctx, e, prompt, args.foreign_limit, args.max_redo)?;
            println!(
                "  run {round} {:9}: prefill {:7.1} tok/s  decode {:6.2} tok/s  load {:.3} s  peak RSS {:6.1} MB  \
                 (prompt {} tok, {} gen, wall {:.2} s, foreign CPU {:.2} s{}{})",
                r.engine,
                r.timings.prefill_tok_s,
                r.timings.decode_tok_s,
                r.timings.load_s,
                r.peak_rss_mb,
                r.prompt_len,
                r.generated,
                r.wall_s,
                r.foreign_cpu_s,
                if r.redone.is_empty() {
                    String::new()
                } else {
                    format!(", redone after {:?}", r.redone)
                },
                if r.contaminated { ", CONTAMINATED" } else { "" }
            );
            results.push(r);
        }
    }

    let cr = ContextResult {
        synapse: summarize(&results, "synapse"),
        llama: summarize(&results, "llama.cpp"),
        results,
        prompt_len,
    };
    if sweep {
        println!(
            "\nmedians, context {} ({} runs each):",
            prompt.context, args.runs
        );
    } else {
        println!("\nmedians ({} runs each):", args.runs);
    }
    println!(
        "  {:18} {:>12} {:>12} {:>16}",
        "", "synapse", "llama.cpp", "synapse/llama"
    );
    let fmt = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
    for (i, n) in NAMES.iter().enumerate() {
        println!(
            "  {n:18} {:>12} {:>12} {:>16}",
            fmt(cr.synapse.map(|v| v[i])),
            fmt(cr.llama.map(|v| v[i])),
            fmt(cr.ratio(i))
        );
    }
    let n_cont = cr.results.iter().filter(|r| r.contaminated).count();
    if n_cont > 0 {
        println!(
            "  note: {n_cont} run(s) kept although other processes used > {} CPU-s during them",
            args.foreign_limit
        );
    }
    Ok(cr)
}

/// Runs the benchmark.
pub fn run(args: Args) -> Result<()> {
    if args.context.is_empty() || args.context.contains(&0) {
        bail!("--context needs token counts above 0");
    }
    let model = parity_fixtures::resolve_model(args.model.as_deref())?;
    let python = oracle_env::python()?;
    std::fs::create_dir_all(target_dir())?;
    let prebuilt = args.synapse_bin.is_some();
    let ctx = Ctx {
        synapse_bin: args
            .synapse_bin
            .clone()
            .unwrap_or_else(|| target_dir().join("release/synapse-cli")),
        model,
        python,
        threads: args.threads,
        n_gen: args.n_gen,
    };
    let synapse_err = prepare_synapse(&ctx, prebuilt).err();
    let prompts = build_prompts(&ctx, &args.context)?;
    let sweep = prompts.len() > 1;
    let chars: Vec<String> = prompts.iter().map(|p| p.text.len().to_string()).collect();
    let contexts: Vec<String> = prompts.iter().map(|p| p.context.to_string()).collect();
    println!(
        "bench-vs-llama: {} | {} threads | {} | {} decoded tokens | {} runs each",
        ctx.model.display(),
        ctx.threads,
        if sweep {
            format!(
                "contexts {} (prompts {} chars)",
                contexts.join("/"),
                chars.join("/")
            )
        } else {
            format!("prompt {} chars", chars[0])
        },
        ctx.n_gen,
        args.runs
    );
    if let Some(e) = &synapse_err {
        println!("SYNAPSE SIDE UNAVAILABLE: {e:#}\n(continuing with the llama.cpp side only)");
    }
    let engines: Vec<Engine> = if synapse_err.is_none() {
        vec![Engine::Synapse, Engine::Llama]
    } else {
        vec![Engine::Llama]
    };

    // The machine's streaming read rate with the engines' thread count, before and after the
    // runs (the best of both): what decode's weight (and KV) traffic is set against.
    let rate0 = crate::membw::stream_rate(512, 5, ctx.threads);
    let mut done = Vec::with_capacity(prompts.len());
    for p in &prompts {
        done.push(bench_context(&ctx, &engines, p, &args, sweep)?);
    }
    let stream = rate0.max(crate::membw::stream_rate(512, 5, ctx.threads));
    println!(
        "\ndecode traffic (medians) against the streaming read pass ({:.2} GB/s, {} threads, \
         2 MiB pages, best of before/after the runs; weights = every linear + the LM head; KV = f32 keys and \
         values at the generation's midpoint):",
        stream / 1e9,
        ctx.threads
    );
    let mut traffic = Vec::new();
    for (p, r) in prompts.iter().zip(&done) {
        let syn = r.results.iter().find(|x| x.engine == "synapse");
        let (Some(w), Some(kvb)) = (
            syn.and_then(|x| x.decode_read_bytes),
            syn.and_then(|x| x.kv_read_bytes_mid),
        ) else {
            continue;
        };
        let frac = |tok_s: f64, bytes: u64| tok_s * bytes as f64 / stream;
        let line = |name: &str, tok_s: Option<f64>| {
            tok_s.map(|t| {
                format!(
                    "{name} {:.2} GB/s weights = {:.0}%, weights+KV {:.0}%",
                    t * w as f64 / 1e9,
                    100.0 * frac(t, w),
                    100.0 * frac(t, w + kvb)
                )
            })
        };
        println!(
            "  context {:>6}: weights {:.1} MB + KV {:.1} MB per token | {} | {}",
            p.context,
            w as f64 / 1e6,
            kvb as f64 / 1e6,
            line("synapse", r.synapse.map(|v| v[1])).unwrap_or_default(),
            line("llama.cpp", r.llama.map(|v| v[1])).unwrap_or_default()
        );
        traffic.push(serde_json::json!({
            "context": p.context,
            "decode_read_bytes": w,
            "kv_read_bytes_mid": kvb,
            "synapse_weight_fraction": r.synapse.map(|v| frac(v[1], w)),
            "synapse_weight_kv_fraction": r.synapse.map(|v| frac(v[1], w + kvb)),
            "llama_weight_fraction": r.llama.map(|v| frac(v[1], w)),
            "llama_weight_kv_fraction": r.llama.map(|v| frac(v[1], w + kvb)),
        }));
    }

    // prefill and decode tok/s of each engine, and their ratios, per context
    let fmt = |x: Option<f64>, d: usize| x.map_or("-".to_string(), |x| format!("{x:.d$}"));
    let tokens = |p: &Prompt, r: &ContextResult| match r.prompt_len {
        [Some(a), Some(b)] if a != b => format!("{a}/{b}"),
        [Some(a), _] | [None, Some(a)] => a.to_string(),
        [None, None] => p.tokens.map_or("?".into(), |t| t.to_string()),
    };
    if sweep {
        println!(
            "\nsummary (medians of {} runs each; tok/s; ratio = synapse/llama.cpp):",
            args.runs
        );
        println!(
            "  {:>7} {:>8} {:>16} {:>15} {:>17} {:>16} {:>13} {:>12}",
            "context",
            "prompt",
            "synapse prefill",
            "synapse decode",
            "llama.cpp prefill",
            "llama.cpp decode",
            "prefill ratio",
            "decode ratio"
        );
        for (p, r) in prompts.iter().zip(&done) {
            println!(
                "  {:>7} {:>8} {:>16} {:>15} {:>17} {:>16} {:>13} {:>12}",
                p.context,
                tokens(p, r),
                fmt(r.synapse.map(|v| v[0]), 1),
                fmt(r.synapse.map(|v| v[1]), 2),
                fmt(r.llama.map(|v| v[0]), 1),
                fmt(r.llama.map(|v| v[1]), 2),
                fmt(r.ratio(0), 3),
                fmt(r.ratio(1), 3)
            );
        }
    }

    let json_out = args
        .json_out
        .clone()
        .unwrap_or_else(|| target_dir().join("bench-vs-llama.json"));
    let per_context: Vec<serde_json::Value> = prompts
        .iter()
        .zip(&done)
        .map(|(p, r)| {
            serde_json::json!({
                "context": p.context,
                "prompt_chars": p.text.len(),
                "prompt_verbatim": p.verbatim,
                "prompt_tokens_tokenizer": p.tokens,
                "prompt_tokens": { "synapse": r.prompt_len[0], "llama.cpp": r.prompt_len[1] },
                "synapse_ctx": synapse_ctx(p, ctx.n_gen),
                "results": r.results,
                "medians": { "order": NAMES, "synapse": r.synapse, "llama.cpp": r.llama },
                "ratios": (0..NAMES.len()).map(|i| r.ratio(i)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let summary: Vec<serde_json::Value> = prompts
        .iter()
        .zip(&done)
        .map(|(p, r)| {
            serde_json::json!({
                "context": p.context,
                "prompt_tokens": r.prompt_len[0].or(r.prompt_len[1]).or(p.tokens),
                "synapse_prefill_tok_s": r.synapse.map(|v| v[0]),
                "synapse_decode_tok_s": r.synapse.map(|v| v[1]),
                "llama_prefill_tok_s": r.llama.map(|v| v[0]),
                "llama_decode_tok_s": r.llama.map(|v| v[1]),
                "prefill_ratio": r.ratio(0),
                "decode_ratio": r.ratio(1),
            })
        })
        .collect();
    let mut doc = serde_json::json!({
        "model": ctx.model, "threads": ctx.threads, "n_gen": ctx.n_gen, "runs": args.runs,
        "foreign_limit_cpu_s": args.foreign_limit,
        "synapse_error": synapse_err.as_ref().map(|e| format!("{e:#}")),
        "contexts": per_context,
        "summary": summary,
        "stream_read_bytes_per_s": stream,
        "decode_traffic": traffic,
    });
    if let [r] = &done[..] {
        // one context: also the layout from before the sweep
        doc["results"] = serde_json::to_value(&r.results)?;
        doc["medians"] =
            serde_json::json!({ "order": NAMES, "synapse": r.synapse, "llama.cpp": r.llama });
    }
    write_json(&json_out, &doc)?;
    println!("wrote {}", json_out.display());
    if let Some(e) = synapse_err {
        bail!("the Synapse side could not run, so no ratios: {e:#}");
    }
    Ok(())
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)?)
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in tokenizer: BOS, then one token per word and one per 5 bytes of each word
    /// beyond its first 4 (so counts are not a fixed multiple of the words).
    fn fake_count(text: &str) -> Result<usize> {
        Ok(1 + text
            .split_whitespace()
            .map(|w| 1 + w.len().saturating_sub(4) / 5)
            .sum::<usize>())
    }

    #[test]
    fn prose_words_repeats_the_prose() {
        let n = PROMPT.split(' ').count();
        assert_eq!(prose_words(n), PROMPT);
        assert_eq!(prose_words(0), "");
        assert_eq!(prose_words(3), "In the beginning");
        let two = prose_words(2 * n);
        assert_eq!(two, format!("{PROMPT}\n\n{PROMPT}"));
        assert_eq!(
            prose_words(n + 2),
            format!("{PROMPT}\n\nIn the"),
            "the second repetition starts after a blank line"
        );
        // word prefixes are text prefixes
        assert!(prose_words(2 * n + 7).starts_with(&prose_words(n + 100)));
    }

    #[test]
    fn fit_prompt_keeps_the_prose_within_tolerance() {
        let base = fake_count(PROMPT).unwrap();
        for target in [base - VERBATIM_TOL, base, base + VERBATIM_TOL] {
            let f = fit_prompt(target, fake_count).unwrap();
            assert!(f.verbatim, "target {target}");
            assert_eq!(f.text, PROMPT);
            assert_eq!(f.tokens, base);
        }
    }

    #[test]
    fn fit_prompt_hits_the_target_within_one_word() {
        let base = fake_count(PROMPT).unwrap();
        for target in [
            5,
            100,
            base - VERBATIM_TOL - 1,
            base + VERBATIM_TOL + 1,
            2048,
            8192,
            8193,
        ] {
            let f = fit_prompt(target, fake_count).unwrap();
            assert!(!f.verbatim, "target {target}");
            assert_eq!(f.tokens, fake_count(&f.text).unwrap(), "target {target}");
            assert_eq!(f.text, prose_words(f.words));
            // the closest word prefix: neither one word more nor one less is closer
            let d = f.tokens.abs_diff(target);
            let more = fake_count(&prose_words(f.words + 1)).unwrap();
            let less = fake_count(&prose_words(f.words - 1)).unwrap();
            assert!(d <= more.abs_diff(target), "target {target}: {f:?}");
            assert!(d <= less.abs_diff(target), "target {target}: {f:?}");
            assert!(d <= 3, "target {target}: {} tokens", f.tokens);
            // deterministic
            assert_eq!(fit_prompt(target, fake_count).unwrap(), f);
        }
    }

    #[test]
    fn fit_prompt_refuses_what_the_command_line_cannot_carry() {
        let e = fit_prompt(200_000, fake_count).unwrap_err();
        assert!(format!("{e}").contains("command-line limit"), "{e}");
    }

    #[test]
    fn synapse_ctx_leaves_room() {
        let p = |tokens| Prompt {
            context: 8192,
            text: "x".repeat(40_000),
            file: PathBuf::new(),
            tokens,
            verbatim: false,
        };
        assert_eq!(synapse_ctx(&p(Some(512)), 128), 4096);
        assert!(synapse_ctx(&p(Some(8192)), 128) >= 8192 + 128);
        assert!(synapse_ctx(&p(None), 128) >= 40_000 + 128);
    }
}
