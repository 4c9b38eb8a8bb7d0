//! `cargo xtask bench-cluster`: placement by measured speed against placement by memory share
//! (llama.cpp RPC's and exo's rule) on a 2:1 pair of workers, side by side.
//!
//! Each run starts its own etcd (free ports, temporary data directory), a fast worker
//! (`--fast-threads`, default 1) and, once it has registered (so their start-up
//! measurements do not overlap), a slow one (`--slow-threads`, default 1) whose cgroup allows
//! it `--slow-quota` percent of one CPU (default 50: each worker a core of this 2-core
//! machine, the slow one at half speed; `--slow-quota 0 --fast-threads 2` makes the pair by
//! thread count instead, which is 2:1 only while one stage computes at a time), both
//! offering `--memory` (default: 85% of the model plus its KV,
//! so neither holds it and the model is split), then `synapse-cli serve --cluster` as the
//! front end. The leader places the layers by `--placement speed` or `memory-share`. After a
//! warm-up request, `--streams` concurrent greedy streams of `--n-gen` tokens (`ignore_eos`)
//! run through the front end; aggregate tokens/s = tokens / wall time. The two placements
//! alternate run by run; medians over `--runs`; a run during which other processes used more
//! than `--foreign-limit` CPU-seconds is redone. Prints each plan's stages and the ratio.
//! Needs `etcd` (Debian `etcd-server`); the plan is read through etcd's JSON gateway.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench_vs_llama::{busy_ticks, median, target_dir};
use crate::oracle_env;

/// Arguments of `bench-cluster`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model (default: SmolLM2-135M-Instruct from the model cache).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Memory each worker offers (default: 85% of the model's weights plus its KV).
    #[arg(long)]
    memory: Option<String>,
    /// Threads of the fast worker.
    #[arg(long, default_value_t = 1)]
    fast_threads: usize,
    /// Threads of the slow worker.
    #[arg(long, default_value_t = 1)]
    slow_threads: usize,
    /// The slow worker's CPU quota: this percent of one CPU (its cgroup's
    /// `cpu.cfs_quota_us` / `cpu.max`; 0: none). Needs a writable cgroup cpu controller
    /// (root).
    #[arg(long, default_value_t = 50)]
    slow_quota: u32,
    /// Passes a pipeline keeps in flight (the workers' `--in-flight`).
    #[arg(long, default_value_t = 2)]
    in_flight: usize,
    /// Concurrent streams.
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// Tokens per stream.
    #[arg(long, default_value_t = 64)]
    n_gen: usize,
    /// Timed runs per placement.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Positions per slot.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// A run is redone when other processes used more CPU-seconds than this during it.
    #[arg(long, default_value_t = 2.0)]
    foreign_limit: f64,
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cgroup holding one process under a CPU quota; removed when dropped.
struct Quota(PathBuf);

impl Quota {
    /// Moves process `pid` into a new cgroup allowed `pct` percent of one CPU.
    fn put(pid: u32, pct: u32) -> Result<Quota> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let period = 100_000u64;
        let quota = period * pct as u64 / 100;
        let (dir, file, value) = if std::fs::read_to_string(v2).is_ok_and(|c| c.contains("cpu")) {
            (
                PathBuf::from(format!("/sys/fs/cgroup/synapse-bench-{pid}")),
                "cpu.max",
                format!("{quota} {period}"),
            )
        } else {
            (
                PathBuf::from(format!("/sys/fs/cgroup/cpu/synapse-bench-{pid}")),
                "cpu.cfs_quota_us",
                quota.to_string(),
            )
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join(file), value)
            .with_context(|| format!("{file} of {}", dir.display()))?;
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", dir.display()))?;
        Ok(Quota(dir))
    }
}

impl Drop for Quota {
    fn drop(&mut self) {
        // The process is gone by now (its Proc drops first): the cgroup is empty.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let t0 = Instant::now();
    while !ok() {
        if t0.elapsed() > timeout {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

struct Run {
    tok_s: f64,
    stages: String,
    foreign_s: f64,
}

/// The published plan, read through etcd's JSON gateway (`POST /v3/kv/range`: no `etcdctl`,
/// which Debian ships apart from the server). HTTP/1.0, so the reply is never chunked.
fn plan_json(etcd: &str) -> Option<serde_json::Value> {
    let addr = etcd.strip_prefix("http://")?;
    let body = serde_json::json!({ "key": base64(b"/synapse/bench/plan") }).to_string();
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "POST /v3/kv/range HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).ok()?;
    let at = reply.windows(4).position(|w| w == b"\r\n\r\n")?;
    let v: serde_json::Value = serde_json::from_slice(&reply[at + 4..]).ok()?;
    serde_json::from_slice(&unbase64(v["kvs"][0]["value"].as_str()?)?).ok()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (what etcd's gateway takes for keys).
fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 decoded (`None` on a character outside the alphabet).
fn unbase64(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0);
    for ch in text.bytes().filter(|&b| b != b'=') {
        let v = B64.iter().position(|&b| b == ch)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[allow(clippy::too_many_arguments)]
fn run_once(
    bin: &Path,
    model: &Path,
    memory: &str,
    placement: &str,
    a: &Args,
    dir: &Path,
) -> Result<Run> {
    let (c, p) = (free_port()?, free_port()?);
    let etcd_url = format!("http://127.0.0.1:{c}");
    let data = dir.join(format!("etcd-{placement}-{c}"));
    let _etcd = Proc(
        Command::new("etcd")
            .args(["--data-dir", data.to_str().unwrap_or_default()])
            .args([
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{p}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{p}"),
            ])
            .args([
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{p}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting etcd (Debian etcd-server)")?,
    );
    wait_for("etcd", Duration::from_secs(20), || {
        TcpStream::connect(("127.0.0.1", c)).is_ok()
    })?;
    let worker = |id: &str, threads: usize| -> Result<(Proc, PathBuf)> {
        let log = dir.join(format!("{placement}-{id}-{c}.log"));
        let child = Command::new(bin)
            .args(["worker", "--etcd", &etcd_url, "-m"])
            .arg(model)
            .args(["--id", id, "--memory", memory, "--cluster-name", "bench"])
            .args([
                "-c",
                &a.ctx.to_string(),
                "--parallel",
                &a.streams.to_string(),
            ])
            .args(["--threads", &threads.to_string(), "--placement", placement])
            .args(["--in-flight", &a.in_flight.to_string()])
            .env("SYNAPSE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok((Proc(child), log))
    };
    let registered =
        |log: &Path| std::fs::read_to_string(log).is_ok_and(|s| s.contains("registered"));
    let (_fast, flog) = worker("fast", a.fast_threads)?;
    wait_for("the fast worker", Duration::from_secs(120), || {
        registered(&flog)
    })?;
    let (slow, slog) = worker("slow", a.slow_threads)?;
    let _quota = match a.slow_quota {
        0 => None,
        pct => Some(Quota::put(slow.0.id(), pct)?),
    };
    let _slow = slow;
    wait_for("the slow worker", Duration::from_secs(120), || {
        registered(&slog)
    })?;
    let mut plan = None;
    wait_for("a plan over both workers", Duration::from_secs(60), || {
        plan = plan_json(&etcd_url).filter(|p| {
            p["pipelines"][0]["stages"]
                .as_array()
                .is_some_and(|s| s.len() == 2)
        });
        plan.is_some()
    })?;
    let plan = plan.unwrap_or_default();
    let stages = plan["pipelines"][0]["stages"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|x| {
                    format!(
                        "{} {}..{}",
                        x["worker"].as_str().unwrap_or("?"),
                        x["layers"]["start"],
                        x["layers"]["end"]
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    // Both roles up: the head logs its role after its next stage took the plan.
    wait_for("the roles", Duration::from_secs(60), || {
        [&flog, &slog]
            .iter()
            .all(|l| std::fs::read_to_string(l).is_ok_and(|s| s.contains("took a role")))
    })?;
    let mut fe = Command::new(bin)
        .args([
            "serve",
            "--cluster",
            &etcd_url,
            "--cluster-name",
            "bench",
            "-m",
        ])
        .arg(model)
        .args(["--port", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let err = fe.stderr.take().context("front end stderr")?;
    let _fe = Proc(fe);
    let mut lines = BufReader::new(err).lines();
    let addr = loop {
        let l = lines.next().context("the front end exited")??;
        if let Some(x) = l.split("listening on http://").nth(1) {
            break x.split_whitespace().next().unwrap_or_default().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    // Warm-up (maps the weights in on both workers).
    stream_tokens(&addr, 8)?;
    let b0 = busy_ticks()?;
    let t0 = Instant::now();
    let total: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.streams)
            .map(|_| s.spawn(|| stream_tokens(&addr, a.n_gen)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().ok().and_then(|r| r.ok()).unwrap_or(0))
            .sum()
    });
    let wall = t0.elapsed().as_secs_f64();
    let busy = (busy_ticks()? - b0) as f64 / 100.0;
    if total != a.streams * a.n_gen {
        bail!("{total} tokens of {} came back", a.streams * a.n_gen);
    }
    // The machine's two cores during the run, minus what the workers could use.
    let foreign_s = (busy - wall * 2.0).max(0.0);
    Ok(Run {
        tok_s: total as f64 / wall,
        stages,
        foreign_s,
    })
}

/// One greedy stream of `n` tokens (`ignore_eos`); the tokens that came back.
fn stream_tokens(addr: &str, n: usize) -> Result<usize> {
    let body = serde_json::json!({
        "prompt": "The history of the printing press begins",
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut got = 0;
    for line in BufReader::new(s).lines() {
        let line = line?;
        if let Some(d) = line.strip_prefix("data: ") {
            if d == "[DONE]" {
                break;
            }
            let v: serde_json::Value = serde_json::from_str(d)?;
            if let Some(e) = v.get("error") {
                bail!("stream error: {e}");
            }
            if let Some(u) = v["usage"]["completion_tokens"].as_u64() {
                got = u as usize;
            }
        }
    }
    Ok(got)
}

/// Runs `bench-cluster`.
pub fn run(a: Args) -> Result<()> {
    let root = oracle_env::repo_root();
    let st = Command::new("cargo")
        .current_dir(&root)
        .args(["build", "--release", "-p", "synapse-cli"])
        .status()?;
    if !st.success() {
        bail!("building synapse-cli failed");
    }
    let bin = target_dir().join("release/synapse-cli");
    let model = a
        .model
        .clone()
        .unwrap_or_else(|| synapse_testdata::model("smollm2-135m-instruct"));
    if !model.exists() {
        bail!(
            "{} is missing (synapse-cli fetch-model smollm2-135m-instruct)",
            model.display()
        );
    }
    let memory = match &a.memory {
        Some(m) => m.clone(),
        None => {
            // Weights ≈ the file; KV = 2 · 4 B · kv width · layers · positions, read off the
            // worker's plan would need a model load: take the file plus a 40% KV allowance.
            let file = std::fs::metadata(&model)?.len();
            let kv_guess = (a.streams * a.ctx) as u64 * 46 * 1024;
            format!("{}", ((file + kv_guess) as f64 * 0.85) as u64)
        }
    };
    let dir = target_dir().join("bench-cluster");
    std::fs::create_dir_all(&dir)?;
    println!(
        "bench-cluster: {} · workers fast {} threads / slow {} threads{}, {memory} B each · {} in flight · {} streams × {} tokens · {} runs",
        model.display(),
        a.fast_threads,
        a.slow_threads,
        match a.slow_quota {
            0 => String::new(),
            q => format!(" under a {q}% CPU quota"),
        },
        a.in_flight,
        a.streams,
        a.n_gen,
        a.runs
    );
    let mut res: Vec<(&str, f64, String)> = Vec::new();
    for r in 0..a.runs {
        let order: [&str; 2] = if r % 2 == 0 {
            ["speed", "memory-share"]
        } else {
            ["memory-share", "speed"]
        };
        for placement in order {
            let mut tries = 0;
            loop {
                tries += 1;
                let run = run_once(&bin, &model, &memory, placement, &a, &dir)?;
                if run.foreign_s > a.foreign_limit && tries < 4 {
                    println!(
                        "  {placement}: run contaminated ({:.2} foreign CPU-s); redoing",
                        run.foreign_s
                    );
                    continue;
                }
                println!(
                    "  run {} {placement:>12}: {:7.1} tok/s  stages [{}]{}",
                    r + 1,
                    run.tok_s,
                    run.stages,
                    if run.foreign_s > a.foreign_limit {
                        "  (foreign CPU, flagged)"
                    } else {
                        ""
                    }
                );
                res.push((placement, run.tok_s, run.stages));
                break;
            }
        }
    }
    let med = |p: &str| median(res.iter().filter(|x| x.0 == p).map(|x| x.1).collect());
    let (s, m) = (med("speed"), med("memory-share"));
    println!(
        "median tok/s: by speed {s:.1}, by memory share {m:.1}: ratio {:.2}×",
        s / m
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{base64, unbase64};

    #[test]
    fn base64_round_trips() {
        assert_eq!(
            base64(b"/synapse/bench/plan"),
            "L3N5bmFwc2UvYmVuY2gvcGxhbg=="
        );
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        for n in 0..10 {
            let v: Vec<u8> = (0..n).map(|i| (i * 37 + 5) as u8).collect();
            assert_eq!(unbase64(&base64(&v)).unwrap(), v);
        }
        assert!(unbase64("YW*j").is_none());
    }
}
