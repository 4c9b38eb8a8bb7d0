//! `cargo xtask bench-server`: `synapse-cli serve` against llama.cpp's own `llama-server`, end
//! to end through HTTP with one load driver for both (`xtask/py/bench_server.py`: C concurrent
//! clients streaming `/v1/completions`, `ignore_eos`, temperature 0), same GGUF, same threads,
//! same `--parallel`. For every client count the two servers run alternately (each started
//! fresh, waited on until `/health` answers, stopped with SIGTERM); a run during which other
//! processes used more than `--foreign-limit` CPU-seconds is redone. Prints throughput, TTFT and
//! inter-token p50/p99 per client count and engine, medians over `--runs`, and the throughput
//! ratio; JSON in `<target>/bench-server.json`.
//!
//! `cargo xtask build-llama-server` builds llama-server from the vendored llama.cpp of the
//! llama-cpp-python sdist (PyPI), with cmake and ninja from PyPI, into
//! `<target>/llama-server/bin/llama-server`.

use crate::bench_vs_llama::{busy_ticks, median, target_dir};
use crate::{oracle_env, parity_fixtures};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `bench-server`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF both servers serve (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// llama-server binary (default: `<target>/llama-server/bin/llama-server`, made by
    /// `cargo xtask build-llama-server`).
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// Concurrent client counts.
    #[arg(long, default_value = "1,4,8,16")]
    clients: String,
    /// Requests each client sends, one after another.
    #[arg(long, default_value_t = 2)]
    requests: usize,
    /// Tokens per completion.
    #[arg(long, default_value_t = 128)]
    n_gen: usize,
    /// Slots of both servers (`--parallel`).
    #[arg(long, default_value_t = 8)]
    parallel: usize,
    /// Context positions per slot.
    #[arg(long, default_value_t = 512)]
    slot_ctx: usize,
    /// Threads of both servers.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed runs per engine and client count.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// A run is redone when other processes used more CPU-seconds than this during it.
    #[arg(long, default_value_t = 1.0)]
    foreign_limit: f64,
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
            Engine::Llama => "llama-server",
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_healthy(port: u16, child: &mut Child) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        if let Some(st) = child.try_wait()? {
            bail!("server exited early ({st})");
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            use std::io::Write;
            let _ = s
                .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            if buf.starts_with("HTTP/1.1 200") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("server on port {port} not healthy after 120 s")
}

fn proc_ticks(pid: u32) -> u64 {
    // utime + stime of the process (all its threads).
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_string();
            // Fields from 3 (state) on; utime and stime are fields 14 and 15.
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            Some(f.get(11)? + f.get(12)?)
        })
        .unwrap_or(0)
}

struct Ctx {
    model: PathBuf,
    synapse: PathBuf,
    llama: PathBuf,
    python: PathBuf,
    driver: PathBuf,
    a: Args,
}

fn start(ctx: &Ctx, e: Engine, port: u16) -> Result<Child> {
    let a = &ctx.a;
    let total_ctx = (a.slot_ctx * a.parallel).to_string();
    let mut c = match e {
        Engine::Synapse => {
            let mut c = Command::new(&ctx.synapse);
            c.arg("serve");
            c
        }
        Engine::Llama => Command::new(&ctx.llama),
    };
    c.arg("--model")
        .arg(&ctx.model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--parallel", &a.parallel.to_string()])
        .args(["--ctx-size", &total_ctx])
        .args(["--threads", &a.threads.to_string()]);
    if e == Engine::Llama {
        c.args(["--threads-batch", &a.threads.to_string()]);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c.spawn().with_context(|| format!("starting {}", e.name()))
}

fn stop(mut child: Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn run_once(ctx: &Ctx, e: Engine, clients: usize) -> Result<(serde_json::Value, f64)> {
    let port = free_port()?;
    let mut child = start(ctx, e, port)?;
    if let Err(err) = wait_healthy(port, &mut child) {
        stop(child);
        return Err(err.context(format!("{} did not come up", e.name())));
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let b0 = busy_ticks()?;
    let s0 = proc_ticks(child.id());
    let out = Command::new(&ctx.python)
        .arg(&ctx.driver)
        .arg(format!("http://127.0.0.1:{port}"))
        .args(["--clients", &clients.to_string()])
        .args(["--requests", &ctx.a.requests.to_string()])
        .args(["--n-gen", &ctx.a.n_gen.to_string()])
        .output()
        .context("running the load driver")?;
    let s1 = proc_ticks(child.id());
    let b1 = busy_ticks()?;
    stop(child);
    if !out.status.success() {
        bail!(
            "load driver failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("no JSON from the load driver")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    // Everything but the server and the driver (the driver's own CPU is small but counted as
    // foreign here; the limit allows for it).
    let foreign = (b1.saturating_sub(b0) as f64 - (s1.saturating_sub(s0)) as f64) / hz;
    Ok((v, foreign.max(0.0)))
}

/// Runs the benchmark.
pub fn run(a: Args) -> Result<()> {
    let model = parity_fixtures::resolve_model(a.model.as_deref())?;
    let python = oracle_env::python()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(oracle_env::repo_root())
        .args(["build", "--release", "-p", "synapse-cli"])
        .status()?;
    if !st.success() {
        bail!("building synapse-cli failed");
    }
    let llama = a
        .llama_server
        .clone()
        .unwrap_or_else(|| target_dir().join("llama-server/bin/llama-server"));
    if !llama.is_file() {
        bail!(
            "no llama-server at {}: run `cargo xtask build-llama-server` first",
            llama.display()
        );
    }
    let ctx = Ctx {
        model,
        synapse: target_dir().join("release/synapse-cli"),
        llama,
        python,
        driver: oracle_env::repo_root().join("xtask/py/bench_server.py"),
        a,
    };
    let a = &ctx.a;
    println!(
        "bench-server: {} | --parallel {} | {} threads | {} tokens per request, {} requests per client",
        ctx.model.display(),
        a.parallel,
        a.threads,
        a.n_gen,
        a.requests
    );
    let clients: Vec<usize> = a
        .clients
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let mut all: BTreeMap<(usize, Engine), Vec<serde_json::Value>> = BTreeMap::new();
    let mut round = 0;
    for &c in &clients {
        for _ in 0..a.runs {
            let order = if round % 2 == 0 {
                [Engine::Synapse, Engine::Llama]
            } else {
                [Engine::Llama, Engine::Synapse]
            };
            round += 1;
            for e in order {
                let mut tries = 0;
                let (v, foreign) = loop {
                    let (v, f) = run_once(&ctx, e, c)?;
                    tries += 1;
                    if f <= a.foreign_limit || tries > 3 {
                        break (v, f);
                    }
                    println!(
                        "    {} {c} clients: foreign CPU {f:.2} s, redoing",
                        e.name()
                    );
                };
                println!(
                    "  {c:2} clients {:12} {:7.1} tok/s  TTFT p50 {} p99 {} ms  ITL p50 {} p99 {} ms  ok {}/{}  foreign {foreign:.2} s",
                    e.name(),
                    v["throughput_tok_s"].as_f64().unwrap_or(f64::NAN),
                    v["ttft_p50_ms"],
                    v["ttft_p99_ms"],
                    v["itl_p50_ms"],
                    v["itl_p99_ms"],
                    v["ok"],
                    v["requests"]
                );
                all.entry((c, e)).or_default().push(v);
            }
        }
    }
    println!(
        "\nclients | engine       | tok/s  | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 (ms; medians of {} runs)",
        a.runs
    );
    let mut rows = Vec::new();
    for &c in &clients {
        let mut tput = [0.0f64; 2];
        for (k, e) in [Engine::Synapse, Engine::Llama].into_iter().enumerate() {
            let vs = all.get(&(c, e)).cloned().unwrap_or_default();
            let m = |key: &str| median(vs.iter().filter_map(|v| v[key].as_f64()).collect());
            tput[k] = m("throughput_tok_s");
            println!(
                "{c:7} | {:12} | {:6.1} | {:8.1} | {:8.1} | {:7.1} | {:7.1}",
                e.name(),
                tput[k],
                m("ttft_p50_ms"),
                m("ttft_p99_ms"),
                m("itl_p50_ms"),
                m("itl_p99_ms")
            );
            rows.push(serde_json::json!({"clients": c, "engine": e.name(),
                "throughput_tok_s": tput[k], "ttft_p50_ms": m("ttft_p50_ms"), "ttft_p99_ms": m("ttft_p99_ms"),
                "itl_p50_ms": m("itl_p50_ms"), "itl_p99_ms": m("itl_p99_ms"), "runs": vs}));
        }
        println!("{c:7} | ratio        | {:.2}x", tput[0] / tput[1]);
    }
    let out = target_dir().join("bench-server.json");
    std::fs::write(&out, serde_json::to_string_pretty(&rows)?)?;
    println!("written {}", out.display());
    Ok(())
}

/// Arguments of `build-llama-server`.
#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// llama-cpp-python version whose vendored llama.cpp to build.
    #[arg(long, default_value = "0.3.36")]
    version: String,
}

/// Builds llama-server from the llama-cpp-python sdist.
pub fn build(b: BuildArgs) -> Result<()> {
    let py = oracle_env::python()?;
    let venv_bin = py.parent().context("venv bin")?.to_path_buf();
    let run = |c: &mut Command| -> Result<()> {
        let st = c.status().with_context(|| format!("{c:?}"))?;
        if !st.success() {
            bail!("{c:?} failed ({st})");
        }
        Ok(())
    };
    run(Command::new(&py).args(["-m", "pip", "install", "-q", "cmake", "ninja"]))?;
    let src = target_dir().join("llama-src");
    std::fs::create_dir_all(&src)?;
    let sdist = src.join(format!("llama_cpp_python-{}.tar.gz", b.version));
    if !sdist.is_file() {
        run(Command::new(&py)
            .args([
                "-m",
                "pip",
                "download",
                // This package only: `:all:` would build its build dependencies
                // (cmake) from source as well.
                "--no-binary",
                "llama-cpp-python",
                "--no-deps",
                "-d",
            ])
            .arg(&src)
            .arg(format!("llama-cpp-python=={}", b.version)))?;
    }
    run(Command::new("tar")
        .arg("xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&src))?;
    let root = src.join(format!("llama_cpp_python-{}/vendor/llama.cpp", b.version));
    let build = target_dir().join("llama-server/build");
    let path = format!(
        "{}:{}",
        venv_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run(Command::new(venv_bin.join("cmake"))
        .env("PATH", &path)
        .arg("-S")
        .arg(&root)
        .arg("-B")
        .arg(&build)
        .args([
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
        ]))?;
    run(Command::new(venv_bin.join("cmake"))
        .env("PATH", &path)
        .arg("--build")
        .arg(&build)
        .args(["--target", "llama-server", "-j", "2"]))?;
    let bin = target_dir().join("llama-server/bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::copy(build.join("bin/llama-server"), bin.join("llama-server"))?;
    println!("built {}", bin.join("llama-server").display());
    Ok(())
}
