//! One model over several worker processes on this machine, end to end: a real etcd
//! (started per test on free ports with its own data directory), `synapse-cli worker`
//! processes, and `synapse-cli serve --cluster` as the OpenAI front end, compared with one
//! machine's `synapse-cli serve` on the same requests.
//!
//! - Replicas: workers that each hold the model run it whole; the responses (text, tokens'
//!   log-probabilities, usage; structured outputs) equal one machine's.
//! - A pipeline: workers whose `--memory` is smaller than the model split its layers; the
//!   responses equal one machine's.
//! - Failures: a pipeline worker SIGKILLed mid-stream — its lease expires, the leader
//!   replans over the rest, the session resumes from its prompt and streamed tokens, and the
//!   client's stream equals an uninterrupted run; the killed worker restarted under its id
//!   rejoins and gets work again. A worker SIGSTOPped mid-stream (a partition: no reset, no
//!   answer) the same; SIGCONT, it finds its lease lost, leaves and joins again.
//! - Links with latency: workers reached only through a forwarder that delays every chunk
//!   5 ms each way measure it, and a pipeline over them answers as one machine, surviving a
//!   killed stage.
//! - Heterogeneity by CPU quota (root only; skipped elsewhere): a worker in a cgroup allowed
//!   25% of a CPU measures itself slower and gets fewer layers.
//! - Network namespaces (root only; skipped elsewhere): workers at addresses of their own
//!   behind rate-limited veth links measure those links; a pipeline across them answers as
//!   one machine; a stage's link cut mid-stream is survived with an identical stream, and the
//!   worker joins again when the link is back.
//!
//! Needs `etcd` (Debian `etcd-server`; `.ci/run` installs it) and SmolLM2-135M-Instruct in
//! the model cache.

#[path = "../crates/synapse-cli/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use synapse_cluster::membership::{self, Keys};
use synapse_cluster::plan::ClusterPlan;

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn etcd_bin() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/bin/etcd");
    synapse_testdata::require(&p, "etcd (Debian etcd-server)").then_some(p)
}

fn model() -> Option<PathBuf> {
    let p = synapse_testdata::model("smollm2-135m-instruct");
    synapse_testdata::require(&p, "SmolLM2-135M-Instruct").then_some(p)
}

/// An etcd on free ports with its own data directory.
struct Etcd {
    p: Option<Proc>,
    url: String,
    ports: (u16, u16),
    bin: PathBuf,
    dir: tempfile::TempDir,
    /// The address its client port listens on.
    host: String,
}

impl Etcd {
    fn spawn(&mut self) {
        let (c, p) = self.ports;
        let child = Command::new(&self.bin)
            .args([
                "--data-dir",
                self.dir.path().join("data").to_str().unwrap(),
                "--listen-client-urls",
                &format!("http://{}:{c}", self.host),
                "--advertise-client-urls",
                &self.url,
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{p}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{p}"),
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{p}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.p = Some(Proc(child));
        let t0 = Instant::now();
        // Up when its own health endpoint answers (not merely when something accepts on the
        // port: a port picked free can be taken by another process first).
        while !etcd_healthy(c) {
            let p = self.p.as_mut().unwrap();
            if let Ok(Some(status)) = p.0.try_wait() {
                panic!("etcd exited: {status}");
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process started last has exited (its ports were taken).
    fn exited(&mut self) -> bool {
        self.p
            .as_mut()
            .is_some_and(|p| matches!(p.0.try_wait(), Ok(Some(_))))
    }

    /// SIGKILL, then start again on the same ports and data.
    fn restart(&mut self) {
        drop(self.p.take());
        self.spawn();
    }
}

fn start_etcd(bin: &Path) -> Etcd {
    start_etcd_on(bin, "127.0.0.1")
}

/// An etcd whose client port listens on `host` (reached here at 127.0.0.1).
fn start_etcd_on(bin: &Path, host: &str) -> Etcd {
    // Ports picked free here can be taken by another process before etcd binds them: then
    // etcd exits and is started again on other ports.
    for _ in 0..5 {
        let ports = free_ports();
        let mut e = Etcd {
            p: None,
            url: format!("http://127.0.0.1:{}", ports.0),
            ports,
            bin: bin.to_path_buf(),
            dir: tempfile::tempdir().unwrap(),
            host: host.to_string(),
        };
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.spawn()));
        if started.is_ok() {
            return e;
        }
        assert!(e.exited(), "etcd did not start");
    }
    panic!("etcd did not start on five pairs of free ports");
}

/// Two distinct free ports.
fn free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

/// Whether an etcd answers its `/health` endpoint on 127.0.0.1:`port`.
fn etcd_healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// The first line of worker `id`'s log (colours stripped) that contains `needle`, waiting up
/// to a minute for it.
fn log_line(cluster: &str, id: &str, needle: &str) -> String {
    let log = std::env::temp_dir().join(format!("synapse-{cluster}-{id}.log"));
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let plain = strip_ansi(&text);
        if let Some(line) = plain.lines().find(|l| l.contains(needle)) {
            return line.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{id} logged no {needle:?}: {plain}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The address the worker `id` of `cluster` bound, from its `worker listening` log line.
fn bound_address(cluster: &str, id: &str) -> std::net::SocketAddr {
    let line = log_line(cluster, id, "worker listening");
    let local = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("local="))
        .unwrap_or_else(|| panic!("no local= in {line:?}"));
    local.parse().unwrap()
}

/// `s` without ANSI colour sequences.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn worker(etcd: &str, model: &Path, id: &str, memory: &str, cluster: &str) -> Proc {
    worker_ttl(etcd, model, id, memory, cluster, 2)
}

fn worker_ttl(etcd: &str, model: &Path, id: &str, memory: &str, cluster: &str, ttl: u32) -> Proc {
    worker_in(None, etcd, model, id, memory, cluster, ttl)
}

/// A worker, in network namespace `net.0` listening on `net.1` when given.
fn worker_in(
    net: Option<(&str, &str)>,
    etcd: &str,
    model: &Path,
    id: &str,
    memory: &str,
    cluster: &str,
    ttl: u32,
) -> Proc {
    Proc(
        worker_command(net, etcd, model, id, memory, cluster, ttl)
            .spawn()
            .unwrap(),
    )
}

/// The command line of a worker (its stderr into `synapse-<cluster>-<id>.log` in the temp
/// directory), in network namespace `net.0` listening on `net.1` when given.
fn worker_command(
    net: Option<(&str, &str)>,
    etcd: &str,
    model: &Path,
    id: &str,
    memory: &str,
    cluster: &str,
    ttl: u32,
) -> Command {
    let log =
        std::fs::File::create(std::env::temp_dir().join(format!("synapse-{cluster}-{id}.log")))
            .unwrap();
    let mut cmd = match net {
        Some((ns, listen)) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, BIN, "worker"]);
            c.args([
                "--listen",
                listen,
                "--advertise",
                &format!("http://{listen}"),
            ]);
            c
        }
        None => {
            let mut c = Command::new(BIN);
            c.arg("worker");
            c
        }
    };
    cmd.args([
        "--etcd",
        etcd,
        "-m",
        model.to_str().unwrap(),
        "--id",
        id,
        "--memory",
        memory,
        "--cluster-name",
        cluster,
        "-c",
        "384",
        "--parallel",
        "2",
        "--ubatch",
        "64",
        "--threads",
        "1",
        "--lease-ttl",
        &ttl.to_string(),
        "--step-timeout",
        "5",
        "--measure-mib",
        "8",
        "--measure-secs",
        "0.2",
    ])
    .env("SYNAPSE_LOG", "info")
    .env_remove("SYNAPSE_MODEL")
    .stdout(Stdio::null())
    .stderr(log);
    cmd
}

/// A server process and the address from its `listening on` line.
fn server(args: &[&str]) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("SYNAPSE_MODEL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let mut lines = BufReader::new(err).lines();
    let addr = loop {
        let l = lines
            .next()
            .expect("server exited before listening")
            .unwrap();
        if let Some(a) = l.split("listening on http://").nth(1) {
            break a.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining its stderr so it never blocks.
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), addr)
}

fn one_machine(model: &Path) -> (Proc, String) {
    server(&[
        "serve",
        "-m",
        model.to_str().unwrap(),
        "--port",
        "0",
        "-c",
        "768",
        "--parallel",
        "2",
        "-t",
        "1",
    ])
}

fn front_end(etcd: &str, model: &Path, cluster: &str) -> (Proc, String) {
    server(&[
        "serve",
        "--cluster",
        etcd,
        "--cluster-name",
        cluster,
        "-m",
        model.to_str().unwrap(),
        "--port",
        "0",
        "--resume-timeout",
        "60",
    ])
}

/// POST `body` to `path`: (status, JSON body).
fn post(addr: &str, path: &str, body: &str) -> (u16, Value) {
    common::http(addr, "POST", path, body)
}

/// A streamed completion; `on_chunk(n)` is called after the `n`-th content chunk. Returns the
/// concatenated text and the finish reason.
fn stream(addr: &str, body: &str, mut on_chunk: impl FnMut(usize)) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    let mut finish = String::new();
    let mut n = 0;
    let mut done = false;
    for line in BufReader::new(s).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        assert!(v.get("error").is_none(), "stream error: {v}");
        if let Some(c) = v["choices"].get(0) {
            if let Some(t) = c["text"].as_str()
                && !t.is_empty()
            {
                text.push_str(t);
                n += 1;
                on_chunk(n);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    assert!(done, "the stream ended without [DONE]");
    (text, finish)
}

/// Streams `body` from one machine, then from the cluster with `fault` done after the 8th
/// chunk; the two streams (text and finish reason) must be equal.
fn stream_survives(one: &str, fe: &str, body: &str, what: &str, fault: impl FnOnce()) {
    let (want, wfin) = stream(one, body, |_| {});
    let mut fault = Some(fault);
    let (got, gfin) = stream(fe, body, |n| {
        if n == 8
            && let Some(f) = fault.take()
        {
            f();
        }
    });
    assert!(
        fault.is_none(),
        "the stream ended before the fault ({what})"
    );
    assert_eq!(got, want, "the stream {what} equals an uninterrupted run");
    assert_eq!(gfin, wfin);
}

fn plan_now(etcd: &str, cluster: &str) -> Option<ClusterPlan> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = membership::connect(etcd).await.ok()?;
        membership::plan(&mut c, &Keys::new(cluster)).await.ok()?.0
    })
}

/// Waits for a plan that `ok` accepts.
fn wait_plan(
    etcd: &str,
    cluster: &str,
    what: &str,
    ok: impl Fn(&ClusterPlan) -> bool,
) -> ClusterPlan {
    let t0 = Instant::now();
    loop {
        if let Some(p) = plan_now(etcd, cluster)
            && ok(&p)
        {
            return p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no plan with {what}: {:?}",
            plan_now(etcd, cluster)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "List three colors:",
];

fn body(prompt: &str, n: usize, i: usize) -> String {
    // Greedy and seeded sampling, with log-probabilities; the later prompts (one greedy, one
    // sampled) with penalties and a logit bias too.
    let temp = if i % 2 == 1 { 0.8 } else { 0.0 };
    let mut b = serde_json::json!({
        "prompt": prompt,
        "max_tokens": n,
        "temperature": temp,
        "seed": 7 + i,
        "logprobs": 3,
    });
    if i >= 2 {
        b["frequency_penalty"] = 0.3.into();
        b["presence_penalty"] = 0.2.into();
        b["repeat_penalty"] = 1.1.into();
        b["logit_bias"] = serde_json::json!({"13": 2.0, "30": -1.5});
    }
    b.to_string()
}

/// The parts of a completion that must equal one machine's.
fn essence(v: &Value) -> Value {
    let c = &v["choices"][0];
    serde_json::json!({
        "text": c["text"],
        "finish": c["finish_reason"],
        "logprobs": c["logprobs"],
        "usage": {"prompt": v["usage"]["prompt_tokens"], "completion": v["usage"]["completion_tokens"]},
    })
}

/// Sends every prompt to both, concurrently to the cluster; the answers must be equal.
fn compare(cluster_addr: &str, one_addr: &str, n: usize) {
    let want: Vec<Value> = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (s, v) = post(one_addr, "/v1/completions", &body(p, n, i));
            assert_eq!(s, 200, "{v}");
            essence(&v)
        })
        .collect();
    let got: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = PROMPTS
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let b = body(p, n, i);
                sc.spawn(move || {
                    let (s, v) = post(cluster_addr, "/v1/completions", &b);
                    assert_eq!(s, 200, "{v}");
                    essence(&v)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w, g, "prompt {i}");
    }
}

/// Structured outputs through the cluster: JSON-schema chat requests (greedy and sampled)
/// answer as one machine's, the output valid for the schema; the worker compiles the
/// constraint again from its spec.
fn compare_structured(cluster_addr: &str, one_addr: &str) {
    let schema = serde_json::json!({"type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
        "required": ["color", "legs"], "additionalProperties": false});
    for temp in [0.0, 0.8] {
        let body = serde_json::json!({
            "messages": [{"role": "user", "content": "Describe the cat."}],
            "max_tokens": 40, "temperature": temp, "seed": 3,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "a", "schema": schema}}})
        .to_string();
        let (s1, v1) = post(one_addr, "/v1/chat/completions", &body);
        let (s2, v2) = post(cluster_addr, "/v1/chat/completions", &body);
        assert_eq!((s1, s2), (200, 200), "{v1} {v2}");
        let (c1, c2) = (
            &v1["choices"][0]["message"]["content"],
            &v2["choices"][0]["message"]["content"],
        );
        assert_eq!(c1, c2, "structured output at temperature {temp}");
        assert_eq!(
            v1["choices"][0]["finish_reason"],
            v2["choices"][0]["finish_reason"]
        );
        let parsed: Value = serde_json::from_str(c2.as_str().unwrap()).unwrap();
        assert!(parsed["legs"].as_u64().unwrap() <= 8, "{parsed}");
    }
}

#[test]
fn replicas_answer_as_one_machine_and_survive_etcd_and_replica_loss() {
    let (Some(etcd_bin), Some(m)) = (etcd_bin(), model()) else {
        return;
    };
    let mut etcd = start_etcd(&etcd_bin);
    // A lease TTL that outlasts an etcd restart.
    let mut ws: Vec<Proc> = ["r1", "r2"]
        .iter()
        .map(|id| worker_ttl(&etcd.url, &m, id, "4G", "replicas", 6))
        .collect();
    let p = wait_plan(&etcd.url, "replicas", "two replicas", |p| {
        p.pipelines.len() == 2
    });
    assert_eq!(p.rule, "replicas");
    assert!(
        p.pipelines
            .iter()
            .all(|x| x.stages.len() == 1 && x.stages[0].layers == (0..30))
    );
    // Each replica ran its warm-up pass when it took its role, before any request.
    for id in ["r1", "r2"] {
        let line = log_line("replicas", id, "warm-up pass");
        let ms: f64 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ms="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no ms= in {line:?}"));
        assert!(ms > 0.0, "{line}");
        eprintln!("replicas: {id} warmed up in {ms:.1} ms");
    }
    let (_fe, fe) = front_end(&etcd.url, &m, "replicas");
    let (_one, one) = one_machine(&m);
    compare(&fe, &one, 24);
    compare_structured(&fe, &one);
    eprintln!(
        "replicas: plan {} ({}), {} prompts and structured outputs equal to one machine",
        p.epoch,
        p.hash,
        PROMPTS.len()
    );

    // etcd killed and restarted: workers, leader and router carry on.
    etcd.restart();
    std::thread::sleep(Duration::from_secs(2));
    compare(&fe, &one, 16);
    assert_eq!(
        plan_now(&etcd.url, "replicas").map(|q| q.hash),
        Some(p.hash.clone())
    );
    eprintln!("replicas: etcd restarted, answers unchanged");

    // A replica SIGKILLed: sessions go to the other at once; the plan drops it.
    drop(ws.remove(0));
    compare(&fe, &one, 16);
    let q = wait_plan(&etcd.url, "replicas", "one replica", |q| {
        q.pipelines.len() == 1
    });
    assert_eq!(q.workers(), vec!["r2"]);
    compare(&fe, &one, 16);
    eprintln!("replicas: r1 killed; plan {} serves on r2 alone", q.epoch);
}

/// The registered worker ids.
fn registered(etcd: &str, cluster: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let Ok(mut c) = membership::connect(etcd).await else {
            return Vec::new();
        };
        membership::workers(&mut c, &Keys::new(cluster))
            .await
            .map(|(w, _)| w.into_keys().collect())
            .unwrap_or_default()
    })
}

fn wait_registered(etcd: &str, cluster: &str, ids: &[&str]) {
    let t0 = Instant::now();
    while !ids
        .iter()
        .all(|id| registered(etcd, cluster).iter().any(|r| r == id))
    {
        if t0.elapsed() > Duration::from_secs(120) {
            let have = registered(etcd, cluster);
            for id in ids.iter().filter(|id| !have.iter().any(|r| r == *id)) {
                let log = std::env::temp_dir().join(format!("synapse-{cluster}-{id}.log"));
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let plain = strip_ansi(&text);
                let lines: Vec<&str> = plain.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                eprintln!("--- {id}'s log, last lines ---\n{tail}");
            }
            panic!("{ids:?} not registered: {have:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_pipeline_answers_as_one_machine_and_survives_killed_and_partitioned_workers() {
    let (Some(etcd_bin), Some(m)) = (etcd_bin(), model()) else {
        return;
    };
    let etcd = start_etcd(&etcd_bin);
    // SmolLM2 Q4_1 is ~98 MB of weights and its KV for 2 × 384 positions ~35 MB: no worker
    // of 80 MB holds both, two do; the third is a spare (a pipeline of its own cannot hold
    // the model either).
    let mut ws: Vec<(String, Proc)> = ["p1", "p2", "p3"]
        .iter()
        .map(|id| (id.to_string(), worker(&etcd.url, &m, id, "80M", "pipe")))
        .collect();
    wait_registered(&etcd.url, "pipe", &["p1", "p2", "p3"]);
    std::thread::sleep(Duration::from_millis(1500)); // the leader's settle and publication
    let p = wait_plan(&etcd.url, "pipe", "a pipeline", |p| p.workers().len() >= 2);
    assert_eq!(p.rule, "pipeline");
    assert_eq!(p.pipelines.len(), 1);
    let stages = &p.pipelines[0].stages;
    assert!(stages.len() >= 2, "{p:?}");
    eprintln!(
        "pipeline: epoch {} stages {:?}",
        p.epoch,
        stages
            .iter()
            .map(|s| (s.worker.clone(), s.layers.clone()))
            .collect::<Vec<_>>()
    );
    let (_fe, fe) = front_end(&etcd.url, &m, "pipe");
    let (_one, one) = one_machine(&m);
    compare(&fe, &one, 24);
    compare_structured(&fe, &one);

    // A long greedy stream; the last stage's worker is SIGKILLed after 8 chunks.
    let victim = stages.last().unwrap().worker.clone();
    let long = serde_json::json!({
        "prompt": PROMPTS[2],
        "max_tokens": 96,
        "temperature": 0,
        "stream": true,
    })
    .to_string();
    stream_survives(&one, &fe, &long, "resumed after a SIGKILL", || {
        let i = ws.iter().position(|(id, _)| *id == victim).unwrap();
        let (_, mut pr) = ws.remove(i);
        pr.0.kill().unwrap(); // SIGKILL
        let _ = pr.0.wait();
    });
    let after = wait_plan(&etcd.url, "pipe", "a plan without the killed worker", |q| {
        q.epoch > p.epoch && !q.workers().contains(&victim.as_str())
    });
    eprintln!(
        "replanned without {victim}: epoch {} {:?}",
        after.epoch,
        after.workers()
    );
    compare(&fe, &one, 16);

    // Restarted under its id, the worker registers again (a spare now).
    ws.push((
        victim.clone(),
        worker(&etcd.url, &m, &victim, "80M", "pipe"),
    ));
    wait_registered(&etcd.url, "pipe", &[victim.as_str()]);
    std::thread::sleep(Duration::from_millis(1000));
    compare(&fe, &one, 16);

    // A partitioned worker: SIGSTOP (its peers see no reset and no answer, as across a cut
    // link) a stage after 8 chunks of a stream. Its lease expires, the leader replans, the
    // head's step times out and the session resumes; the stream equals an uninterrupted run.
    let now = plan_now(&etcd.url, "pipe").unwrap();
    eprintln!(
        "before the partition: epoch {} {:?}",
        now.epoch,
        now.workers()
    );
    let cut = now.pipelines[0].stages.last().unwrap().worker.clone();
    let pid = ws
        .iter()
        .find(|(id, _)| *id == cut)
        .unwrap()
        .1
        .0
        .id()
        .to_string();
    let signal = |sig: &str| {
        let st = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(st.success());
    };
    stream_survives(&one, &fe, &long, "across a partition", || signal("-STOP"));
    let cutoff = wait_plan(
        &etcd.url,
        "pipe",
        "a plan without the stopped worker",
        |q| q.epoch > now.epoch && !q.workers().contains(&cut.as_str()),
    );
    // The restarted worker has work again: in the plan the partition hit (the leader may
    // have preferred it once it joined), or in the one after.
    assert!(
        now.workers().contains(&victim.as_str()) || cutoff.workers().contains(&victim.as_str()),
        "the restarted {victim} has work again: {:?} then {:?}",
        now.workers(),
        cutoff.workers()
    );
    eprintln!(
        "{cut} stopped: epoch {} {:?}",
        cutoff.epoch,
        cutoff.workers()
    );
    // SIGCONT: it finds its lease lost, stops serving and joins again.
    signal("-CONT");
    std::thread::sleep(Duration::from_millis(500));
    wait_registered(&etcd.url, "pipe", &[cut.as_str()]);
    compare(&fe, &one, 16);
    eprintln!("{cut} continued and registered again");
}

/// The registered workers' profiles by id.
fn profiles(
    etcd: &str,
    cluster: &str,
) -> std::collections::BTreeMap<String, synapse_cluster::profile::WorkerProfile> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = membership::connect(etcd).await.unwrap();
        membership::workers(&mut c, &Keys::new(cluster))
            .await
            .unwrap()
            .0
            .into_iter()
            .collect()
    })
}

/// Every link measurement the registered workers of `cluster` published: (worker, peer,
/// measure), each printed.
fn links_measured(
    etcd: &str,
    cluster: &str,
) -> Vec<(String, String, synapse_cluster::profile::LinkMeasure)> {
    let mut out = Vec::new();
    for (id, w) in profiles(etcd, cluster) {
        for (peer, l) in w.links {
            eprintln!(
                "{cluster}: {id} → {peer}: latency {:.3} ms, {:.1} MB/s",
                l.latency_s * 1e3,
                l.bandwidth_bytes_per_s / 1e6
            );
            out.push((id.clone(), peer, l));
        }
    }
    out
}

/// Network namespaces, each joined to this one by a veth pair (10.213.<b+i>.1 here,
/// .2 inside, `b` a block no interface uses yet) whose two ends are shaped by a `tc` token bucket; this namespace forwards
/// between them. Removed (with IP forwarding restored) when dropped.
struct Netns {
    names: Vec<String>,
    hosts: Vec<String>,
    forward_before: String,
    /// The third octet of namespace 0's subnet (`10.213.<base + i>.0/24`).
    base: usize,
}

fn run_ok(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    /// `n` namespaces with links shaped to `rate` (a `tc` rate such as `200mbit`), or `None`
    /// where namespaces cannot be made (not root, no CAP_NET_ADMIN, no iproute2).
    fn create(n: usize, rate: &str) -> Option<Netns> {
        let tag = std::process::id() % 10_000;
        let probe = format!("syn{tag}probe");
        if !run_ok(&["ip", "netns", "add", &probe]) {
            return None;
        }
        run(&["ip", "netns", "del", &probe]);
        let forward_before = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .unwrap_or_default()
            .trim()
            .to_string();
        // Subnets no interface here uses yet (a namespace of an earlier run may outlive its
        // name for a while, and its veth with it).
        let used = String::from_utf8(
            Command::new("ip")
                .args(["-br", "addr"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let base = (1..250 - n)
            .step_by(n.max(1))
            .find(|b| (0..n).all(|i| !used.contains(&format!("10.213.{}.", b + i))))
            .expect("a free 10.213.x.0/24 block");
        let mut me = Netns {
            names: Vec::new(),
            hosts: Vec::new(),
            forward_before,
            base,
        };
        for i in 0..n {
            let (ns, h, v) = (
                format!("syn{tag}n{i}"),
                format!("sy{tag}h{i}"),
                format!("sy{tag}v{i}"),
            );
            run(&["ip", "netns", "add", &ns]);
            me.names.push(ns.clone());
            run(&["ip", "link", "add", &h, "type", "veth", "peer", "name", &v]);
            me.hosts.push(h.clone());
            run(&["ip", "link", "set", &v, "netns", &ns]);
            let (gw, ip) = (me.gateway(i), me.inside(i));
            run(&["ip", "addr", "add", &format!("{gw}/24"), "dev", &h]);
            run(&["ip", "link", "set", &h, "up"]);
            let inside = |a: &[&str]| {
                let mut v = vec!["ip", "netns", "exec", &ns];
                v.extend_from_slice(a);
                run(&v);
            };
            inside(&["ip", "addr", "add", &format!("{ip}/24"), "dev", &v]);
            inside(&["ip", "link", "set", &v, "up"]);
            inside(&["ip", "link", "set", "lo", "up"]);
            inside(&["ip", "route", "add", "default", "via", &gw]);
            let tbf = [
                "root", "tbf", "rate", rate, "burst", "64kb", "latency", "200ms",
            ];
            let mut a = vec!["tc", "qdisc", "add", "dev", &h];
            a.extend_from_slice(&tbf);
            run(&a);
            let mut a = vec!["tc", "qdisc", "add", "dev", &v];
            a.extend_from_slice(&tbf);
            inside(&a);
        }
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
        Some(me)
    }

    /// The address of namespace `i`'s end of its link, and of this namespace's end.
    fn inside(&self, i: usize) -> String {
        format!("10.213.{}.2", self.base + i)
    }
    fn gateway(&self, i: usize) -> String {
        format!("10.213.{}.1", self.base + i)
    }

    /// Takes namespace `i`'s link down (a cut cable: nothing arrives, nothing is refused)
    /// or up again.
    fn link(&self, i: usize, up: bool) {
        run(&[
            "ip",
            "link",
            "set",
            &self.hosts[i],
            if up { "up" } else { "down" },
        ]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // The veth pairs first: a namespace may outlive its name for a while.
        for h in &self.hosts {
            let _ = run_ok(&["ip", "link", "del", h]);
        }
        for ns in &self.names {
            let _ = run_ok(&["ip", "netns", "del", ns]);
        }
        if !self.forward_before.is_empty() {
            let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", &self.forward_before);
        }
    }
}

/// Workers in network namespaces of their own (distinct addresses, links shaped to
/// 200 Mbit/s by a token bucket; this kernel has no `netem` qdisc, so no added delay): the
/// workers measure their links through the shaping, a pipeline across the namespaces
/// answers as one machine, and a cut link (the stage's veth taken down mid-stream) is
/// survived with the stream identical to an uninterrupted run; with the link up again the
/// cut-off worker finds its lease lost and joins again.
#[test]
fn a_pipeline_across_network_namespaces_survives_a_cut_link() {
    let (Some(etcd_bin), Some(m)) = (etcd_bin(), model()) else {
        return;
    };
    let Some(net) = Netns::create(3, "200mbit") else {
        eprintln!(
            "skipping: network namespaces cannot be made here (needs root with CAP_NET_ADMIN \
             and iproute2)"
        );
        return;
    };
    // etcd on every address of this namespace.
    let mut etcd = start_etcd_on(&etcd_bin, "0.0.0.0");
    let port = etcd.ports.0;
    let ids = ["n1", "n2", "n3"];
    let mut ws: Vec<Proc> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let listen = format!("{}:{}", net.inside(i), 7700 + i);
            let url = format!("http://{}:{port}", net.gateway(i));
            worker_in(
                Some((&net.names[i], &listen)),
                &url,
                &m,
                id,
                "80M",
                "netns",
                2,
            )
        })
        .collect();
    wait_registered(&etcd.url, "netns", &ids);
    std::thread::sleep(Duration::from_millis(1500));
    let p = wait_plan(&etcd.url, "netns", "a pipeline", |p| p.workers().len() >= 2);
    assert_eq!(p.rule, "pipeline");
    let stages = p.pipelines[0].stages.clone();
    assert!(stages.iter().all(|s| s.addr.starts_with("http://10.213.")));
    // The workers measured their links through the shaping (a 1 MiB ping each way at
    // 200 Mbit/s takes ≥ 84 ms; unshaped, a loopback link measures GB/s).
    let links = links_measured(&etcd.url, "netns");
    for (id, peer, l) in &links {
        assert!(
            l.bandwidth_bytes_per_s < 40e6,
            "{id} → {peer} measured {:.1} MB/s through a 25 MB/s link",
            l.bandwidth_bytes_per_s / 1e6
        );
    }
    assert!(links.len() >= 2, "links measured: {links:?}");
    let (_fe, fe) = front_end(&etcd.url, &m, "netns");
    let (_one, one) = one_machine(&m);
    compare(&fe, &one, 24);
    eprintln!(
        "netns: epoch {} stages {:?} answer as one machine",
        p.epoch,
        stages
            .iter()
            .map(|s| (s.worker.clone(), s.addr.clone(), s.layers.clone()))
            .collect::<Vec<_>>()
    );

    // The last stage's link cut after 8 chunks of a stream.
    let cut = stages.last().unwrap().worker.clone();
    let ci = ids.iter().position(|i| *i == cut).unwrap();
    let long = serde_json::json!({
        "prompt": PROMPTS[2],
        "max_tokens": 96,
        "temperature": 0,
        "stream": true,
    })
    .to_string();
    stream_survives(&one, &fe, &long, "across a cut link", || {
        net.link(ci, false)
    });
    let after = wait_plan(
        &etcd.url,
        "netns",
        "a plan without the cut-off worker",
        |q| q.epoch > p.epoch && !q.workers().contains(&cut.as_str()),
    );
    eprintln!(
        "netns: {cut}'s link down: epoch {} {:?}",
        after.epoch,
        after.workers()
    );
    compare(&fe, &one, 16);
    // The link up again: the worker finds its lease lost, stops serving and joins again.
    net.link(ci, true);
    wait_registered(&etcd.url, "netns", &[cut.as_str()]);
    compare(&fe, &one, 16);
    eprintln!("netns: {cut}'s link up: registered again");
    ws.clear();
    etcd.p.take();
}

/// Imports `model` into a store at `dir`: the package hash.
fn import(model: &Path, dir: &Path) -> String {
    let out = Command::new(BIN)
        .arg("import")
        .arg(model)
        .arg("--store")
        .arg(dir)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["package"].as_str().unwrap().to_string()
}

/// Every object file of the store at `dir`, sorted.
fn objects(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(dir.join("objects")).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out.sort();
    out
}

/// A worker started with a package hash its store does not hold fetches the manifest and
/// the objects from a registered worker over gRPC, each verified by its hash: a corrupt
/// copy on the peer is never served (the fetch fails with the object named and nothing
/// wrong written); once the peer's copy is whole again, a restart fetches only what is
/// still missing, and the two replicas answer as one machine.
#[test]
fn a_worker_fetches_its_package_from_a_peer_verified_by_hash() {
    let (Some(etcd_bin), Some(m)) = (etcd_bin(), model()) else {
        return;
    };
    let etcd = start_etcd(&etcd_bin);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let hash = import(&m, a.path());
    let store_arg = |c: &mut Command, d: &Path| {
        c.arg("--store").arg(d).args(["--fetch", "whole"]);
    };
    let mut c1 = worker_command(None, &etcd.url, Path::new(&hash), "f1", "4G", "fetch", 2);
    store_arg(&mut c1, a.path());
    let _w1 = Proc(c1.spawn().unwrap());
    wait_registered(&etcd.url, "fetch", &["f1"]);

    // One object in the middle of the fetch order corrupted in f1's store (renamed over:
    // f1's own mapping keeps the old file).
    let objs = objects(a.path());
    let victim = objs[objs.len() / 2].clone();
    let good = std::fs::read(&victim).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x40;
    let tmp = a.path().join("tmp-corrupt");
    std::fs::write(&tmp, &bad).unwrap();
    std::fs::rename(&tmp, &victim).unwrap();
    let mut c2 = worker_command(None, &etcd.url, Path::new(&hash), "f2", "4G", "fetch", 2);
    store_arg(&mut c2, b.path());
    let st = c2.status().unwrap();
    assert!(!st.success(), "a fetch from a corrupt peer must fail");
    let log = std::fs::read_to_string(std::env::temp_dir().join("synapse-fetch-f2.log")).unwrap();
    let shard = victim
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let rest = victim.file_name().unwrap().to_str().unwrap();
    let vid = format!("{shard}{rest}");
    assert!(
        log.contains(&vid),
        "the error names the object {vid}: {log}"
    );
    let partial = objects(b.path());
    assert!(
        !partial
            .iter()
            .any(|p| p.ends_with(Path::new(shard).join(rest))),
        "the corrupt object was not written"
    );
    eprintln!(
        "fetch: a corrupt object on the peer failed the fetch after {} of {} objects",
        partial.len(),
        objs.len()
    );

    // Whole again: a restart fetches only the rest, then serves.
    let tmp = a.path().join("tmp-good");
    std::fs::write(&tmp, &good).unwrap();
    std::fs::rename(&tmp, &victim).unwrap();
    let mut c2 = worker_command(None, &etcd.url, Path::new(&hash), "f2", "4G", "fetch", 2);
    store_arg(&mut c2, b.path());
    let _w2 = Proc(c2.spawn().unwrap());
    wait_registered(&etcd.url, "fetch", &["f2"]);
    let log = std::fs::read_to_string(std::env::temp_dir().join("synapse-fetch-f2.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.starts_with("fetched package"))
        .unwrap_or_else(|| panic!("no fetch report: {log}"));
    eprintln!("fetch: {line}");
    assert!(
        line.contains(&format!(
            "{} of {} objects",
            objs.len() - partial.len(),
            objs.len()
        )),
        "only the missing objects: {line}"
    );
    assert_eq!(objects(b.path()).len(), objs.len());
    let p = wait_plan(&etcd.url, "fetch", "two replicas", |p| {
        p.pipelines.len() == 2
    });
    assert_eq!(p.rule, "replicas");
    let (_fe, fe) = front_end(&etcd.url, &m, "fetch");
    let (_one, one) = one_machine(&m);
    compare(&fe, &one, 16);
    eprintln!("fetch: the fetched replica and its peer answer as one machine");
}

/// Stage by stage: two workers of 80 MB serve SmolLM2 (98 MB of weights) by its package
/// hash; one holds the package, the other an empty store. The plan splits the model; the
/// second fetches from the first only the manifest, the package's small objects and its
/// own stage's tensors (each verified by hash) and loads only its layers; the pipeline
/// answers as one machine.
#[test]
fn a_pipeline_stage_fetches_and_loads_only_its_layers() {
    let (Some(etcd_bin), Some(m)) = (etcd_bin(), model()) else {
        return;
    };
    let etcd = start_etcd(&etcd_bin);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let hash = import(&m, a.path());
    let mut ws = Vec::new();
    for (id, dir) in [("s1", a.path()), ("s2", b.path())] {
        let mut c = worker_command(
            None,
            &etcd.url,
            Path::new(&hash),
            id,
            "80M",
            "stagefetch",
            2,
        );
        c.arg("--store").arg(dir);
        ws.push(Proc(c.spawn().unwrap()));
        // The first must be registered before the second asks peers for the manifest.
        wait_registered(&etcd.url, "stagefetch", &[id]);
    }
    let p = wait_plan(&etcd.url, "stagefetch", "a pipeline of two", |p| {
        p.pipelines.len() == 1 && p.pipelines[0].stages.len() == 2
    });
    // The front end named by the package hash too, over a store holding none of the
    // tensors (only the manifest, graph and tokenizer).
    let c = tempfile::tempdir().unwrap();
    copy_manifest_and_small_objects(a.path(), c.path(), &hash);
    let (_fe, fe) = server(&[
        "serve",
        "--cluster",
        &etcd.url,
        "--cluster-name",
        "stagefetch",
        "-m",
        &hash,
        "--store",
        c.path().to_str().unwrap(),
        "--port",
        "0",
        "--resume-timeout",
        "60",
    ]);
    let (_one, one) = one_machine(&m);
    compare(&fe, &one, 16);
    let stage = p.pipelines[0]
        .stages
        .iter()
        .find(|s| s.worker == "s2")
        .unwrap()
        .clone();
    // s2's store holds exactly what the stages it ran read (its log names each layer range
    // it fetched for: a later plan may have moved its cut), and less than the package.
    let log =
        std::fs::read_to_string(std::env::temp_dir().join("synapse-stagefetch-s2.log")).unwrap();
    let plain = strip_ansi(&log);
    let ranges: Vec<std::ops::Range<usize>> = plain
        .lines()
        .filter(|l| l.contains("a stage's tensors are in the store"))
        .filter_map(|l| {
            let r = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("layers="))?;
            let (a, b) = r.split_once("..")?;
            Some(a.parse().ok()?..b.parse().ok()?)
        })
        .collect();
    assert!(!ranges.is_empty(), "s2's log names no stage fetch: {plain}");
    let store = synapse_cas::Store::open_existing(a.path()).unwrap();
    let pkg = synapse_cas::Package::open_in_store(&store, &hash).unwrap();
    let pm = synapse_import::PackageModel::from_package(pkg.clone()).unwrap();
    let mut names = std::collections::BTreeSet::new();
    for r in &ranges {
        names.extend(synapse_runtime::Model::stage_tensor_names(
            pm.ir(),
            r.clone(),
        ));
    }
    let want = synapse_import::PackageModel::objects_for(&pkg, &names).unwrap();
    let held: Vec<String> = objects(b.path())
        .iter()
        .map(|p| {
            let shard = p.parent().unwrap().file_name().unwrap().to_str().unwrap();
            format!("{shard}{}", p.file_name().unwrap().to_str().unwrap())
        })
        .collect();
    let mut want_hex: Vec<String> = want.iter().map(|o| o.hex()).collect();
    want_hex.sort();
    let mut held_sorted = held.clone();
    held_sorted.sort();
    assert_eq!(held_sorted, want_hex, "s2 holds its stages' objects only");
    let all = objects(a.path());
    let size = |ps: &[PathBuf]| -> u64 { ps.iter().map(|p| p.metadata().unwrap().len()).sum() };
    let (got, whole) = (size(&objects(b.path())), size(&all));
    assert!(got < whole, "{got} of {whole} bytes");
    eprintln!(
        "stagefetch: s2 runs layers {:?} of {} (fetched for {ranges:?}); its store holds {} of {} objects, {got} of {whole} bytes",
        stage.layers,
        pm.ir().layers.len(),
        held.len(),
        all.len()
    );
}

/// Copies package `hash`'s manifest and its objects that are not tensors' (graph, metadata,
/// tokenizer) from the store at `from` into the store at `to`.
fn copy_manifest_and_small_objects(from: &Path, to: &Path, hash: &str) {
    let src = synapse_cas::Store::open_existing(from).unwrap();
    let pkg = synapse_cas::Package::open_in_store(&src, hash).unwrap();
    let dst = synapse_cas::Store::open(to).unwrap();
    let rel = Path::new("packages").join(format!("{}.toml", pkg.hash().hex()));
    let text = std::fs::read(pkg.manifest_path()).unwrap();
    dst.session().unwrap().write_file(&rel, &text).unwrap();
    let none = std::collections::BTreeSet::new();
    for id in synapse_import::PackageModel::objects_for(&pkg, &none).unwrap() {
        let o = src.get(&id).unwrap();
        dst.session().unwrap().put_with_id(id, &o).unwrap();
    }
    assert!(objects(to).len() < 10, "only the small objects");
}

/// A TCP forwarder on 127.0.0.1 that delays every byte by `delay` in each direction (a
/// link with latency, where the kernel has no `netem`): each chunk read is written on after
/// `delay` by a writer thread, so bandwidth is kept and only latency is added. Runs until
/// the test process ends.
fn delay_proxy(target: Arc<std::sync::OnceLock<std::net::SocketAddr>>, delay: Duration) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(down) = c else { continue };
            let target = *target.wait();
            let Ok(up) = TcpStream::connect(target) else {
                continue;
            };
            let _ = (down.set_nodelay(true), up.set_nodelay(true));
            for (mut from, to) in [
                (down.try_clone().unwrap(), up.try_clone().unwrap()),
                (up, down),
            ] {
                let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if tx
                                    .send((Instant::now() + delay, buf[..n].to_vec()))
                                    .is_err()
                                {
                                    break;
                                }
                            }
                        }
                    }
                });
                let mut to = to;
                std::thread::spawn(move || {
                    while let Ok((due, bytes)) = rx.recv() {
                        if let Some(w) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(w);
                        }
                        if to.write_all(&bytes).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    port
}

/// Workers reached by their peers and the router only through links that add 5 ms each way:
/// the workers measure that latency, a pipeline over the delayed links (its head keeping two
/// passes in flight) answers as one machine, and a stage killed mid-stream over them is
/// survived with the stream identical to an uninterrupted run.
#[test]
fn a_pipeline_over_links_with_latency_answers_as_one_machine() {
    let (Some(etcd_bin), Some(m)) = (etcd_bin(), model()) else {
        return;
    };
    let etcd = start_etcd(&etcd_bin);
    let delay = Duration::from_millis(5);
    let ids = ["d1", "d2", "d3"];
    let mut ws: Vec<(String, Proc)> = ids
        .iter()
        .map(|id| {
            // The worker binds a port of its own choosing (a port picked here and released
            // can be taken by another process before the worker binds it); the proxy learns
            // it from the worker's `worker listening` line.
            let real = Arc::new(std::sync::OnceLock::new());
            let front = delay_proxy(real.clone(), delay);
            let mut c = worker_command(None, &etcd.url, &m, id, "80M", "delay", 2);
            c.args([
                "--listen",
                "127.0.0.1:0",
                "--advertise",
                &format!("http://127.0.0.1:{front}"),
            ]);
            let p = Proc(c.spawn().unwrap());
            let _ = real.set(bound_address("delay", id));
            (id.to_string(), p)
        })
        .collect();
    wait_registered(&etcd.url, "delay", &ids);
    std::thread::sleep(Duration::from_millis(2500));
    let p = wait_plan(&etcd.url, "delay", "a pipeline", |p| p.workers().len() >= 2);
    // Every measured link carries the added latency (half a round trip ≥ 5 ms; on loopback
    // alone it is tens of microseconds).
    let links = links_measured(&etcd.url, "delay");
    for (id, peer, l) in &links {
        assert!(l.latency_s >= 0.0045, "{id} → {peer}: {l:?}");
    }
    assert!(links.len() >= 2, "{links:?}");
    let (_fe, fe) = front_end(&etcd.url, &m, "delay");
    let (_one, one) = one_machine(&m);
    compare(&fe, &one, 24);
    let stages = p.pipelines[0].stages.clone();
    eprintln!(
        "delay: epoch {} stages {:?} answer as one machine",
        p.epoch,
        stages
            .iter()
            .map(|s| (s.worker.clone(), s.layers.clone()))
            .collect::<Vec<_>>()
    );
    // The last stage SIGKILLed after 8 chunks: the stream resumes over the delayed links.
    let victim = stages.last().unwrap().worker.clone();
    let long = serde_json::json!({
        "prompt": PROMPTS[2], "max_tokens": 64, "temperature": 0, "stream": true,
    })
    .to_string();
    stream_survives(
        &one,
        &fe,
        &long,
        "over delayed links after a SIGKILL",
        || {
            let i = ws.iter().position(|(id, _)| *id == victim).unwrap();
            let (_, mut pr) = ws.remove(i);
            pr.0.kill().unwrap();
            let _ = pr.0.wait();
        },
    );
    eprintln!("delay: {victim} killed mid-stream, the stream identical");
}

/// A cgroup holding one process under a CPU quota (cgroup v2 `cpu.max` or v1
/// `cpu.cfs_quota_us`); removed when dropped. `None` where no cgroup can be made (not root).
struct CpuQuota(PathBuf);

impl CpuQuota {
    fn put(pid: u32, pct: u32) -> Option<CpuQuota> {
        let period = 100_000u64;
        let quota = period * pct as u64 / 100;
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.contains("cpu"));
        let (dir, file, value) = if v2 {
            (
                PathBuf::from(format!("/sys/fs/cgroup/synapse-test-{pid}")),
                "cpu.max",
                format!("{quota} {period}"),
            )
        } else {
            (
                PathBuf::from(format!("/sys/fs/cgroup/cpu/synapse-test-{pid}")),
                "cpu.cfs_quota_us",
                quota.to_string(),
            )
        };
        std::fs::create_dir_all(&dir).ok()?;
        let me = CpuQuota(dir);
        std::fs::write(me.0.join(file), value).ok()?;
        std::fs::write(me.0.join("cgroup.procs"), pid.to_string()).ok()?;
        Some(me)
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Heterogeneity by CPU quota: two workers with the same memory (neither holds the model),
/// one allowed 25% of a CPU by its cgroup. The slow one measures itself slower at start,
/// and the leader gives it fewer layers than memory share would (half) — and the pipeline
/// answers as one machine. Skipped (with a message) where no cgroup can be made.
#[test]
fn a_worker_under_a_cpu_quota_gets_fewer_layers() {
    let (Some(etcd_bin), Some(m)) = (etcd_bin(), model()) else {
        return;
    };
    let etcd = start_etcd(&etcd_bin);
    let fast = worker(&etcd.url, &m, "q-fast", "120M", "quota");
    let _fast = fast;
    let slow = worker(&etcd.url, &m, "q-slow", "120M", "quota");
    let Some(_quota) = CpuQuota::put(slow.0.id(), 25) else {
        eprintln!("skipping: no cgroup with a CPU quota can be made here (needs root)");
        return;
    };
    let _slow = slow;
    wait_registered(&etcd.url, "quota", &["q-fast", "q-slow"]);
    std::thread::sleep(Duration::from_millis(1500));
    let p = wait_plan(&etcd.url, "quota", "a pipeline over both", |p| {
        p.workers().len() == 2
    });
    let layers = |id: &str| {
        p.stage_of(id)
            .map(|(_, _, s)| s.layers.len())
            .unwrap_or_default()
    };
    let (nf, ns) = (layers("q-fast"), layers("q-slow"));
    let ps = profiles(&etcd.url, "quota");
    let rate = |id: &str| {
        ps.get(id)
            .map_or(0.0, |w| w.stream_rate.values().sum::<f64>())
    };
    let (rf, rs) = (rate("q-fast"), rate("q-slow"));
    eprintln!(
        "quota: measured streaming (sum over encodings) fast {:.2} GB/s, slow {:.2} GB/s; \
         layers fast {nf}, slow {ns}",
        rf / 1e9,
        rs / 1e9
    );
    assert!(rs < 0.7 * rf, "the throttled worker measured itself slower");
    assert!(
        ns < nf && ns < 15,
        "fewer layers on the throttled worker: {nf} / {ns}"
    );
    let (_fe, fe) = front_end(&etcd.url, &m, "quota");
    let (_one, one) = one_machine(&m);
    compare(&fe, &one, 16);
}
