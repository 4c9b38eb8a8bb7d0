//! End to end: the router in-process on 127.0.0.1:0 over the real engine and the default
//! model (Gemma 3 270M Q4_K_M), driven over HTTP with reqwest. Skipped, with the reason
//! printed, when the model file is absent; a failure then when `CI` is set (CI fetches it first).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use synapse_runtime::Model;
use synapse_runtime::engine::{Engine, EngineConfig};
use synapse_server::{AppState, ServerConfig, TokenizerPieces};
use synapse_tokenizer::Tokenizer;

struct Srv {
    base: String,
    state: AppState,
    http: reqwest::Client,
}

/// The default model in the model cache. Absent: skipped with a message locally, a failure
/// when `CI` is set (`synapse_testdata::require`).
fn model_path() -> Option<std::path::PathBuf> {
    let p = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    synapse_testdata::require(&p, "the default model (Gemma 3 270M Q4_K_M)").then_some(p)
}

async fn start(ecfg: EngineConfig, cfg: ServerConfig) -> Option<Srv> {
    let path = model_path()?;
    let tok = Arc::new(
        Tokenizer::from_gguf(&synapse_formats::gguf::GgufFile::open(&path).unwrap()).unwrap(),
    );
    Some(start_with(&path, tok, ecfg, cfg).await)
}

async fn start_with(
    path: &std::path::Path,
    tok: Arc<Tokenizer>,
    ecfg: EngineConfig,
    cfg: ServerConfig,
) -> Srv {
    start_model(path, Arc::new(Model::load(path).unwrap()), tok, ecfg, cfg).await
}

/// A server over `model` (loaded from `path`, maybe at another precision).
async fn start_model(
    path: &std::path::Path,
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    ecfg: EngineConfig,
    mut cfg: ServerConfig,
) -> Srv {
    cfg.family = model.ir.family.name().to_string();
    if cfg.model_id == ServerConfig::default().model_id {
        cfg.model_id = "gemma3".into();
        cfg.model_aliases = vec![path.file_name().unwrap().to_string_lossy().into_owned()];
    }
    let engine = Engine::start(model, Arc::new(TokenizerPieces(tok.clone())), ecfg).unwrap();
    let state = AppState::new(Arc::new(engine), tok, cfg).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let st = state.clone();
    tokio::spawn(async move {
        synapse_server::serve(listener, st, std::future::pending())
            .await
            .unwrap();
    });
    Srv {
        base: format!("http://{addr}"),
        state,
        http: reqwest::Client::new(),
    }
}

fn small_engine() -> EngineConfig {
    EngineConfig {
        slots: 4,
        ctx: 1024,
        queue: 64,
        threads: 2,
        ..EngineConfig::default()
    }
}

impl Srv {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text:?}"));
        (status, v)
    }

    async fn post_raw(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap();
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text:?}"));
        (status, headers, v)
    }

    /// A streaming request: its SSE events as (event name, data).
    async fn stream(&self, path: &str, body: &Value) -> Vec<(String, String)> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path} {body}");
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let mut buf = Vec::new();
        let mut s = r.bytes_stream();
        while let Some(b) = s.next().await {
            buf.extend_from_slice(&b.unwrap());
        }
        parse_sse(&String::from_utf8(buf).unwrap())
    }

    /// The `/metrics` exposition.
    async fn models(&self) -> Value {
        let r = self.http.get(format!("{}/v1/models", self.base)).send();
        r.await.unwrap().json().await.unwrap()
    }

    async fn metrics(&self) -> String {
        let r = self.http.get(format!("{}/metrics", self.base)).send();
        r.await.unwrap().text().await.unwrap()
    }

    async fn healthy(&self) {
        let r = self
            .http
            .get(format!("{}/health", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }

    /// Waits until the engine holds no session and no queued request.
    async fn drained(&self) -> synapse_runtime::engine::EngineStats {
        let t = Instant::now();
        loop {
            let s = self.state.engine().stats();
            if s.active == 0 && s.queued == 0 {
                return s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "sessions leaked: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Strict SSE framing: events separated by a blank line, `event:` and `data:` fields only.
fn parse_sse(text: &str) -> Vec<(String, String)> {
    assert!(
        text.ends_with("\n\n"),
        "stream does not end with a blank line: {text:?}"
    );
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let mut event = "message".to_string();
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            } else if line.starts_with(':') {
                // comment
            } else {
                panic!("unexpected SSE line {line:?}");
            }
        }
        out.push((event, data.join("\n")));
    }
    out
}

/// Checks OpenAI's stream rules and returns (per-choice text, usage chunk, JSON chunks).
fn check_stream(
    events: &[(String, String)],
    chat: bool,
    n: usize,
    usage: bool,
) -> (Vec<String>, Option<Value>, Vec<Value>) {
    assert!(
        events.iter().all(|(e, _)| e == "message"),
        "error event in {events:?}"
    );
    let dones = events.iter().filter(|(_, d)| d == "[DONE]").count();
    assert_eq!(dones, 1, "exactly one [DONE]");
    assert_eq!(events.last().unwrap().1, "[DONE]", "[DONE] is last");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let ids: BTreeSet<&str> = chunks.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 1, "one id per stream");
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let mut texts = vec![String::new(); n];
    let mut seen = vec![0usize; n];
    let mut finished = vec![false; n];
    let mut usage_chunk = None;
    for (k, c) in chunks.iter().enumerate() {
        assert_eq!(c["object"], object);
        let choices = c["choices"].as_array().unwrap();
        if choices.is_empty() {
            assert!(usage, "a chunk without choices but no include_usage");
            assert_eq!(k, chunks.len() - 1, "the usage chunk is the last");
            usage_chunk = Some(c["usage"].clone());
            continue;
        }
        assert!(
            c.get("usage").is_none_or(Value::is_null),
            "usage only in the last chunk"
        );
        for ch in choices {
            let i = ch["index"].as_u64().unwrap() as usize;
            assert!(
                !finished[i],
                "choice {i} has a chunk after its finish_reason"
            );
            if chat {
                let d = &ch["delta"];
                assert_eq!(
                    d.get("role").is_some(),
                    seen[i] == 0,
                    "role only in the first delta of choice {i}: {c}"
                );
                if let Some(t) = d.get("content").and_then(Value::as_str) {
                    texts[i].push_str(t);
                }
            } else {
                texts[i].push_str(ch["text"].as_str().unwrap());
            }
            seen[i] += 1;
            match ch["finish_reason"].as_str() {
                Some(r) => {
                    assert!(r == "stop" || r == "length", "finish_reason {r}");
                    finished[i] = true;
                }
                None => assert!(ch["finish_reason"].is_null()),
            }
        }
    }
    assert!(
        finished.iter().all(|&f| f),
        "every choice has a finish_reason"
    );
    assert_eq!(usage_chunk.is_some(), usage);
    (texts, usage_chunk, chunks)
}

fn check_usage(u: &Value) {
    let p = u["prompt_tokens"].as_u64().unwrap();
    let c = u["completion_tokens"].as_u64().unwrap();
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + c);
    assert!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            <= p
    );
}

const PROMPT: &str = "The capital of France is";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_chat_streaming_and_not() {
    let Some(s) = start(small_engine(), ServerConfig::default()).await else {
        return;
    };
    let body = json!({"model": "gemma3", "prompt": PROMPT, "max_tokens": 16, "temperature": 0});
    let (st, v) = s.post("/v1/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "gemma3");
    let solo = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!solo.is_empty());
    check_usage(&v["usage"]);
    assert_eq!(v["usage"]["completion_tokens"], 16);

    // Streaming, without the /v1 prefix, by the model's file name.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    sb["model"] = json!("gemma-3-270m-q4_k_m.gguf");
    let ev = s.stream("/completions", &sb).await;
    let (texts, usage, _) = check_stream(&ev, false, 1, true);
    assert_eq!(texts[0], solo, "stream = non-stream at temperature 0");
    check_usage(usage.as_ref().unwrap());

    // n = 3 at temperature 0, beside other requests: every choice equals the solo run.
    let mut nb = body.clone();
    nb["n"] = json!(3);
    let other = json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0});
    let (a, b) = tokio::join!(
        s.post("/v1/completions", &nb),
        s.post("/v1/completions", &other)
    );
    assert_eq!(a.0, 200);
    assert_eq!(b.0, 200);
    let choices = a.1["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], solo.as_str(), "choice {i} equals the solo run");
    }
    assert_eq!(a.1["usage"]["completion_tokens"], 48);

    // Several prompts, and token-id prompts.
    let (st, tk) = s
        .post(
            "/tokenize",
            &json!({"content": PROMPT, "add_special": true}),
        )
        .await;
    assert_eq!(st, 200);
    let ids = tk["tokens"].clone();
    let (st, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": [ids.clone(), ids], "max_tokens": 16, "temperature": 0}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], solo.as_str());
    assert_eq!(v["choices"][1]["text"], solo.as_str());

    // Chat, non-streaming and streaming.
    let chat = json!({
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Name a color."}]}
        ],
        "max_tokens": 12, "temperature": 0, "seed": 1
    });
    let (st, v) = s.post("/v1/chat/completions", &chat).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let chat_solo = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    check_usage(&v["usage"]);
    let mut cs = chat.clone();
    cs["stream"] = json!(true);
    cs["stream_options"] = json!({"include_usage": true});
    let ev = s.stream("/v1/chat/completions", &cs).await;
    let (texts, usage, _) = check_stream(&ev, true, 1, true);
    assert_eq!(texts[0], chat_solo);
    let u = usage.unwrap();
    check_usage(&u);
    assert!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "the same conversation again reuses its prefix: {u}"
    );
    // Without include_usage: no usage chunk; n = 2 streams two choices.
    cs["stream_options"] = Value::Null;
    cs["n"] = json!(2);
    let ev = s.stream("/chat/completions", &cs).await;
    let (texts, _, _) = check_stream(&ev, true, 2, false);
    assert_eq!(texts, vec![chat_solo.clone(), chat_solo]);

    // Models, tokenize / detokenize round trip, metrics.
    let m: Value = s.models().await;
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "gemma3");
    let text = "Hello, wörld! <start_of_turn>user\n日本語";
    let (_, t) = s
        .post("/tokenize", &json!({"content": text, "add_special": false}))
        .await;
    let toks = t["tokens"].as_array().unwrap().clone();
    assert!(
        toks.contains(&json!(105)),
        "special tokens parsed: {toks:?}"
    );
    let (st, d) = s.post("/detokenize", &json!({"tokens": toks})).await;
    assert_eq!(st, 200);
    assert_eq!(d["content"], text);
    let metrics = s.metrics().await;
    for name in [
        "synapse_queue_depth",
        "synapse_active_sessions",
        "synapse_generated_tokens_total",
        "synapse_prompt_tokens_total",
        "synapse_prefix_cache_hit_tokens_total",
        "synapse_kv_bytes",
        "synapse_time_to_first_token_seconds_bucket",
        "synapse_inter_token_latency_seconds_bucket",
        "synapse_rejected_requests_total",
        "synapse_weight_bytes",
    ] {
        assert!(
            metrics.contains(name),
            "{name} missing from /metrics:\n{metrics}"
        );
    }
    // The precision the engine runs, as `/v1/models` names it.
    let profile = m["data"][0]["meta"]["profile"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        metrics.contains(&format!(
            "synapse_precision_profile_info{{profile=\"{profile}\"}} 1"
        )),
        "{metrics}"
    );
    s.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_shapes() {
    let Some(s) = start(small_engine(), ServerConfig::default()).await else {
        return;
    };
    let (st, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4, "{lp}");
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["text_offset"].as_array().unwrap().len(), 4);
    let top0 = lp["top_logprobs"][0].as_object().unwrap();
    assert!(!top0.is_empty() && top0.len() <= 2);
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                    "temperature": 0, "logprobs": true, "top_logprobs": 3}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let c = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!c.is_empty());
    assert!(c[0]["token"].is_string() && c[0]["bytes"].is_array());
    assert_eq!(c[0]["top_logprobs"].as_array().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_never_leak() {
    let Some(s) = start(small_engine(), ServerConfig::default()).await else {
        return;
    };
    let body = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": true});
    let ev = s.stream("/v1/completions", &body).await;
    let (_, _, chunks) = check_stream(&ev, false, 1, false);
    let pieces: Vec<String> = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
        .filter(|t| !t.is_empty())
        .collect();
    let full: String = pieces.concat();
    // A stop string across a chunk boundary: the end of one chunk + the start of the next.
    let k = (1..pieces.len() - 1)
        .find(|&k| pieces[k].chars().count() >= 2 && pieces[k + 1].chars().count() >= 2)
        .expect("two chunks of two characters");
    let tail: String = {
        let c: Vec<char> = pieces[k].chars().collect();
        c[c.len() - 2..].iter().collect()
    };
    let head: String = pieces[k + 1].chars().take(2).collect();
    let stop = format!("{tail}{head}");
    let expect = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let req = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                         "stream": stream, "stop": [stop.clone(), "zzzz-never"]});
        let text = if stream {
            let ev = s.stream("/v1/completions", &req).await;
            let (texts, _, chunks) = check_stream(&ev, false, 1, false);
            for c in &chunks {
                let t = c["choices"][0]["text"].as_str().unwrap();
                assert!(!t.contains(&stop), "a chunk carries the stop string: {t:?}");
            }
            assert_eq!(
                chunks.last().unwrap()["choices"][0]["finish_reason"],
                "stop"
            );
            texts[0].clone()
        } else {
            let (st, v) = s.post("/v1/completions", &req).await;
            assert_eq!(st, 200);
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            v["choices"][0]["text"].as_str().unwrap().to_string()
        };
        assert!(
            !text.contains(&stop),
            "stop string leaked: {text:?} / {stop:?}"
        );
        assert_eq!(text, expect, "stream={stream}: text up to the stop string");
    }
    s.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_outputs() {
    let Some(s) = start(small_engine(), ServerConfig::default()).await else {
        return;
    };
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Describe a cat as JSON."}],
                    "max_tokens": 48, "temperature": 0,
                    "response_format": {"type": "json_object"}}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        let parsed: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("json_object output is not JSON ({e}): {text:?}"));
        assert!(parsed.is_object());
    } else {
        assert!(text.starts_with('{'), "{text:?}");
    }
    let schema = json!({"type": "object",
                        "properties": {"color": {"enum": ["red", "green", "blue"]},
                                       "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
                        "required": ["color", "legs"], "additionalProperties": false});
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Describe the cat."}],
                    "max_tokens": 32, "temperature": 0,
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "a", "schema": schema}}}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let parsed: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("schema output is not JSON ({e}): {text:?}"));
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(
        ["red", "green", "blue"].contains(&parsed["color"].as_str().unwrap()),
        "{parsed}"
    );
    assert!(parsed["legs"].as_u64().unwrap() <= 8, "{parsed}");
    // An invalid schema is a 400.
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "x"}],
                    "response_format": {"type": "json_schema",
                        "json_schema": {"schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}}),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "response_format");
}

/// Writes `head` on a fresh connection and reads one response (status, JSON body).
async fn raw_http(base: &str, head: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.strip_prefix("http://").unwrap();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = tokio::time::timeout_at(deadline.into(), sock.read(&mut chunk))
            .await
            .expect("a response in time")
            .unwrap();
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(h) = text.find("\r\n\r\n") {
            let head = text[..h].to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("content-length");
            if buf.len() >= h + 4 + len {
                let status = text[9..12].parse().unwrap();
                let body = serde_json::from_slice(&buf[h + 4..h + 4 + len]).unwrap();
                return (status, body);
            }
        }
        assert!(n > 0, "connection closed before a whole response: {text:?}");
    }
}

fn assert_error(st: u16, v: &Value, want: u16, what: &str) {
    assert_eq!(st, want, "{what}: {v}");
    let e = &v["error"];
    assert!(e["message"].is_string(), "{what}: {v}");
    assert!(e["type"].is_string(), "{what}: {v}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{what}: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_and_hostile_requests() {
    let ecfg = EngineConfig {
        ctx: 256,
        ..small_engine()
    };
    let Some(s) = start(ecfg, ServerConfig::default()).await else {
        return;
    };
    let c = "/v1/completions";
    let chat = "/v1/chat/completions";
    let ok = json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0});
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            c,
            json!({"prompt": {"a": 1}}),
            400,
            "prompt of the wrong shape",
        ),
        (c, json!({"max_tokens": 2}), 400, "no prompt"),
        (
            c,
            json!({"prompt": "x", "max_tokens": "many"}),
            400,
            "max_tokens a string",
        ),
        (
            c,
            json!({"prompt": "x", "max_tokens": -1}),
            400,
            "max_tokens -1",
        ),
        (
            c,
            json!({"prompt": "x", "max_tokens": 1_000_000_000_000i64}),
            400,
            "max_tokens 1e12",
        ),
        (c, json!({"prompt": "x", "n": 1000}), 400, "n = 1000"),
        (c, json!({"prompt": "x", "n": 0}), 400, "n = 0"),
        (
            c,
            json!({"prompt": "x", "temperature": 3}),
            400,
            "temperature 3",
        ),
        (
            c,
            json!({"prompt": "x", "logit_bias": {"x": 1}}),
            400,
            "logit_bias key",
        ),
        (
            c,
            json!({"prompt": "x", "logprobs": 1000}),
            400,
            "logprobs 1000",
        ),
        (
            c,
            json!({"prompt": [999999999u32]}),
            400,
            "token id outside the vocabulary",
        ),
        (
            c,
            json!({"prompt": "word ".repeat(400)}),
            400,
            "prompt longer than the context",
        ),
        (
            c,
            json!({"prompt": "x", "model": "gpt-4"}),
            404,
            "unknown model",
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 1000, "logprobs": true}),
            400,
            "top_logprobs 1000",
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": "x"}],
                      "tools": [{"type": "function", "function": {"name": "f"}}]}),
            400,
            "tools",
        ),
        (chat, json!({"messages": "hello"}), 400, "messages a string"),
        (chat, json!({"messages": []}), 400, "no messages"),
        (
            chat,
            json!({"messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "xml"}}),
            400,
            "response_format type",
        ),
    ];
    for (path, body, want, what) in &cases {
        let (st, v) = s.post(path, body).await;
        assert_error(st, &v, *want, what);
        if *what == "tools" {
            assert!(v["error"]["message"].as_str().unwrap().contains("tools"));
        }
        if *what == "prompt longer than the context" {
            assert_eq!(v["error"]["code"], "context_length_exceeded");
            assert_eq!(v["error"]["param"], "prompt");
        }
    }

    // Raw hostile bodies.
    let deep = format!(
        "{{\"messages\":{}{}}}",
        "[".repeat(50_000),
        "]".repeat(50_000)
    );
    let raw: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{".to_vec(), 400, "truncated JSON"),
        (b"not json".to_vec(), 400, "not JSON"),
        (b"{\"prompt\":\"\xff\xfe\"}".to_vec(), 400, "invalid UTF-8"),
        (deep.into_bytes(), 400, "deeply nested JSON"),
    ];
    for (body, want, what) in raw {
        let (st, h, v) = s.post_raw(c, body).await;
        assert_error(st, &v, want, what);
        assert!(h.contains_key("x-request-id"));
        s.healthy().await;
    }
    // A 5 MiB content-length: answered from the head, before the body (a client that insists
    // on writing the whole body first may see the connection close under it instead).
    let (st, v) = raw_http(
        &s.base,
        &format!(
            "POST {c} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{{\"prompt\":\"",
            5 << 20
        ),
    )
    .await;
    assert_error(st, &v, 413, "5 MiB body");
    s.healthy().await;
    // Chunked (no content-length), just over the limit: still a 413 error object.
    let mut head = format!(
        "POST {c} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    );
    let chunk = " ".repeat(64 << 10);
    for _ in 0..65 {
        head.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    let (st, v) = raw_http(&s.base, &head).await;
    assert_error(st, &v, 413, "chunked body over the limit");
    s.healthy().await;

    // Unknown route, wrong method.
    let r = s
        .http
        .get(format!("{}/v1/nope", s.base))
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    assert_error(st, &r.json().await.unwrap(), 404, "unknown route");
    let r = s.http.get(format!("{}{c}", s.base)).send().await.unwrap();
    let st = r.status().as_u16();
    assert_error(st, &r.json().await.unwrap(), 405, "GET on a POST route");

    // A request id is echoed.
    let r = s
        .http
        .post(format!("{}{c}", s.base))
        .header("x-request-id", "abc-123")
        .json(&ok)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "abc-123");
    assert_eq!(r.status().as_u16(), 200);

    // Still serving.
    let (st, v) = s.post(c, &ok).await;
    assert_eq!(st, 200, "{v}");
    s.drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_queue_full() {
    let ecfg = EngineConfig {
        slots: 1,
        queue: 0,
        ..small_engine()
    };
    let cfg = ServerConfig {
        api_key: Some("sekrit".into()),
        ..ServerConfig::default()
    };
    let Some(s) = start(ecfg, cfg).await else {
        return;
    };
    let url = format!("{}/v1/completions", s.base);
    let body = json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0});
    for auth in [None, Some("Bearer wrong"), Some("sekrit")] {
        let mut r = s.http.post(&url).json(&body);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        let r = r.send().await.unwrap();
        let st = r.status().as_u16();
        assert_error(st, &r.json().await.unwrap(), 401, "bad key");
    }
    s.healthy().await; // /health needs no key
    let r = s
        .http
        .post(&url)
        .bearer_auth("sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // One slot, no queue: a second request while one runs is a 503 with Retry-After.
    s.drained().await; // the engine frees a slot just after its last event
    let long = json!({"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": true,
                      "ignore_eos": true});
    let r = s
        .http
        .post(&url)
        .bearer_auth("sekrit")
        .json(&long)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut stream = r.bytes_stream();
    let _first = stream.next().await.unwrap().unwrap();
    let r2 = s
        .http
        .post(&url)
        .bearer_auth("sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r2.status().as_u16();
    let retry = r2.headers().get("retry-after").cloned();
    assert_error(st, &r2.json().await.unwrap(), 503, "queue full");
    assert!(retry.is_some(), "503 carries Retry-After");
    drop(stream); // the client goes away: its session is cancelled and the slot freed
    let stats = s.drained().await;
    assert!(stats.rejected >= 1);
    let r = s
        .http
        .post(&url)
        .bearer_auth("sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "the slot is free again");
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_64_clients_with_disconnects() {
    let Some(s) = start(small_engine(), ServerConfig::default()).await else {
        return;
    };
    let s = Arc::new(s);
    const CLIENTS: usize = 64;
    const TOKENS: usize = 16;
    let prompts = [
        "The capital of France is",
        "Once upon a time",
        "The best way to learn Rust is",
        "In 1969, humans",
        "My favourite food is",
        "The ocean is",
        "Water boils at",
        "A haiku about autumn:",
    ];
    // Solo runs first.
    let mut solo = Vec::new();
    for p in prompts {
        let (st, v) = s
            .post(
                "/v1/completions",
                &json!({"prompt": p, "max_tokens": TOKENS, "temperature": 0}),
            )
            .await;
        assert_eq!(st, 200);
        solo.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let t_all = Instant::now();
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let s = s.clone();
        let pi = i % prompts.len();
        let prompt = prompts[pi];
        let stream = i % 2 == 0;
        let disconnect = next() % 4 == 0;
        let cut_after_chunks = 1 + (next() % 8) as usize;
        let cut_after_ms = 50 + next() % 3000;
        tasks.push(tokio::spawn(async move {
            let body = json!({"prompt": prompt, "max_tokens": TOKENS, "temperature": 0,
                              "stream": stream});
            let t0 = Instant::now();
            let req = s
                .http
                .post(format!("{}/v1/completions", s.base))
                .json(&body)
                .send();
            if !stream {
                let fut = async {
                    let r = req.await.unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                    r.json::<Value>().await.unwrap()
                };
                if disconnect {
                    match tokio::time::timeout(Duration::from_millis(cut_after_ms), fut).await {
                        Ok(v) => (
                            pi,
                            Some(v["choices"][0]["text"].as_str().unwrap().to_string()),
                            None,
                            vec![],
                        ),
                        Err(_) => (pi, None, None, vec![]),
                    }
                } else {
                    let v = fut.await;
                    (
                        pi,
                        Some(v["choices"][0]["text"].as_str().unwrap().to_string()),
                        None,
                        vec![],
                    )
                }
            } else {
                let r = req.await.unwrap();
                assert_eq!(r.status().as_u16(), 200);
                let mut bs = r.bytes_stream();
                let mut buf = String::new();
                let mut ttft = None;
                let mut gaps = Vec::new();
                let mut last: Option<Instant> = None;
                let mut chunks = 0;
                while let Some(b) = bs.next().await {
                    let b = b.unwrap();
                    let now = Instant::now();
                    buf.push_str(std::str::from_utf8(&b).unwrap());
                    if buf.contains("\"text\":\"") && ttft.is_none() {
                        ttft = Some((now - t0).as_secs_f64());
                    }
                    if let Some(l) = last {
                        gaps.push((now - l).as_secs_f64());
                    }
                    last = Some(now);
                    chunks += 1;
                    if disconnect && chunks >= cut_after_chunks {
                        return (pi, None, ttft, gaps);
                    }
                }
                let ev = parse_sse(&buf);
                let (texts, _, _) = check_stream(&ev, false, 1, false);
                (pi, Some(texts[0].clone()), ttft, gaps)
            }
        }));
    }
    let mut completed = 0;
    let mut cut = 0;
    let mut ttfts = Vec::new();
    let mut itls = Vec::new();
    for t in tasks {
        let (pi, text, ttft, gaps) = t.await.unwrap();
        ttfts.extend(ttft);
        itls.extend(gaps);
        match text {
            Some(text) => {
                assert_eq!(
                    text, solo[pi],
                    "a completed response differs from its solo run"
                );
                completed += 1;
            }
            None => cut += 1,
        }
    }
    let wall = t_all.elapsed().as_secs_f64();
    let stats = s.drained().await;
    assert_eq!(stats.active, 0);
    assert_eq!(stats.queued, 0);
    assert!(completed >= CLIENTS / 2, "{completed} completed");
    println!(
        "load: {CLIENTS} clients, {completed} completed, {cut} disconnected, {wall:.1} s; \
         client TTFT p50 {:.3} s p99 {:.3} s; inter-chunk p50 {:.4} s p99 {:.4} s; \
         engine: {} requests, {} cancelled, {} generated tokens",
        percentile(&mut ttfts, 0.5),
        percentile(&mut ttfts, 0.99),
        percentile(&mut itls, 0.5),
        percentile(&mut itls, 0.99),
        stats.requests,
        stats.cancelled,
        stats.generated_tokens,
    );
    // The server still answers after the storm.
    let (st, _) = s
        .post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}))
        .await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_and_timeout() {
    let cfg = ServerConfig {
        cors: true,
        request_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let Some(s) = start(small_engine(), cfg).await else {
        return;
    };
    let url = format!("{}/v1/chat/completions", s.base);
    let r = s
        .http
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "http://example.test")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type,authorization",
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://example.test"
    );
    // The timeout, shown by events rather than by how long a generation should take. A stream
    // is opened first and a non-streamed request after it; the request's 408 is the evidence
    // that the timeout has elapsed, so the stream, older than the request, has outlived it.
    let body = json!({"messages": [{"role": "user", "content": "Count to a thousand."}],
                      "max_tokens": 500, "ignore_eos": true, "temperature": 0});
    let mut sb = body.clone();
    sb["max_tokens"] = json!(200);
    sb["stream"] = json!(true);
    let r = s.http.post(&url).json(&sb).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut stream = r.bytes_stream();
    // A non-streamed request that outlives the timeout: a 408 error object, and its session is
    // cancelled with the handler.
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_error(st, &v, 408, "timeout");
    // The engine drops the cancelled session at its next step. Then the stream's session is
    // the one left running: it was not cut by the timeout (a stream answers its head at once).
    let deadline = Instant::now() + Duration::from_secs(30);
    let stats = loop {
        let st = s.state.engine().stats();
        if st.cancelled >= 1 && st.active <= 1 {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the 408's session was not cancelled: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(stats.cancelled, 1, "{stats:?}");
    assert_eq!(
        stats.active, 1,
        "the stream ended before the timeout fired, so this shows nothing (make it longer): \
         {stats:?}"
    );
    // It then runs to its end: all its tokens, a finish_reason and [DONE].
    let mut buf = Vec::new();
    while let Some(b) = stream.next().await {
        buf.extend_from_slice(&b.unwrap());
    }
    let ev = parse_sse(&String::from_utf8(buf).unwrap());
    let (_, _, chunks) = check_stream(&ev, true, 1, false);
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "length", "{last}");
    let stats = s.drained().await;
    assert_eq!(
        stats.cancelled, 1,
        "only the 408's session is cancelled: {stats:?}"
    );
}

/// Chat through the server against llama.cpp's own run of the same conversation (the parity
/// fixture's chat prompt: llama.cpp's built-in `gemma` template, 64 greedy tokens): the same
/// prompt tokens and the same text, streamed and not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_matches_llama_cpp_on_the_gemma_template() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/parity/gemma3-270m-q4_k_m.json");
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    let p = fx["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "chat_gemma")
        .unwrap()
        .clone();
    let n = p["greedy_ids"].as_array().unwrap().len();
    let want_text = p["greedy_text"].as_str().unwrap();
    let want_prompt = p["prompt_ids"].as_array().unwrap().len() as u64;
    let Some(s) = start(small_engine(), ServerConfig::default()).await else {
        return;
    };
    let body = json!({"messages": p["chat_messages"], "max_tokens": n, "temperature": 0});
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(want_prompt));
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        Some(want_text)
    );
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = s.stream("/v1/chat/completions", &sb).await;
    let text: String = ev
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(text, want_text);
}

/// An opted-in greedy request (`"escalation": "exact"`) gives the text a plain request gives,
/// non-streaming beside a plain request and `others`, and streaming; the server drafted and
/// accepted tokens. Returns the plain request's body and response.
async fn escalated_text_is_plain(s: &Srv, others: &[Value]) -> (Value, Value) {
    let body = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0});
    let (st, plain) = s.post("/v1/completions", &body).await;
    assert_eq!(st, 200, "{plain}");
    let mut eb = body.clone();
    eb["escalation"] = json!("exact");
    let other = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0});
    let all: Vec<&Value> = [&eb, &other].into_iter().chain(others).collect();
    let got =
        futures_util::future::join_all(all.iter().map(|b| s.post("/v1/completions", b))).await;
    for (st, v) in &got {
        assert_eq!(*st, 200, "{v}");
    }
    assert_eq!(got[0].1["choices"][0]["text"], plain["choices"][0]["text"]);
    assert_eq!(got[0].1["usage"]["completion_tokens"], 24);
    let mut sb = eb.clone();
    sb["stream"] = json!(true);
    let ev = s.stream("/v1/completions", &sb).await;
    let (texts, _, _) = check_stream(&ev, false, 1, false);
    assert_eq!(texts[0], plain["choices"][0]["text"].as_str().unwrap());
    let st = s.drained().await;
    assert!(st.drafted > 0 && st.draft_accepted > 0, "{st:?}");
    (body, plain)
}

/// `"escalation": "exact"`: a server with a draft profile drafts opted-in requests and gives
/// the same text as without (non-streaming and streaming, beside a plain request); the draft
/// is in `/v1/models` and `/metrics`; a server at the source precision without a draft serves
/// it by plain decoding; one below the source without a draft, and a bad value, are 400s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_escalation_is_a_request_field() {
    let Some(path) = model_path() else {
        return;
    };
    let source = Arc::new(Model::load(&path).unwrap());
    let spec =
        synapse_runtime::precision::Precision::parse_profile("uniform:syn.q8.symmetric.g64.v1")
            .unwrap();
    let draft = synapse_runtime::precision::apply(&source, &spec, None)
        .unwrap()
        .model;
    let ecfg = EngineConfig {
        draft: Some(draft.clone()),
        draft_k: 4,
        draft_adaptive: false,
        ..small_engine()
    };
    let Some(s) = start(ecfg, ServerConfig::default()).await else {
        return;
    };
    let (body, plain) = escalated_text_is_plain(&s, &[]).await;
    let mut eb = body.clone();
    eb["escalation"] = json!("exact");

    let models: Value = s.models().await;
    assert_eq!(
        models["data"][0]["meta"]["draft_profile"],
        draft.profile.hash()
    );
    let m = s.metrics().await;
    assert!(m.contains("synapse_draft_tokens_total"), "{m}");

    let mut bad = body.clone();
    bad["escalation"] = json!("sometimes");
    let (st, v) = s.post("/v1/completions", &bad).await;
    assert_eq!(st, 400);
    assert_eq!(v["error"]["param"], "escalation");
    // Selective escalation (approximate) is not served, and the message says why.
    bad["escalation"] = json!("selective");
    let (st, v) = s.post("/v1/completions", &bad).await;
    assert_eq!(st, 400);
    assert_eq!(v["error"]["param"], "escalation");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("selective escalation (approximate output) is not served"),
        "{v}"
    );

    // Without a draft at the source precision, plain decoding is the exact output: served.
    let Some(plain_srv) = start(small_engine(), ServerConfig::default()).await else {
        return;
    };
    let (st, v) = plain_srv.post("/v1/completions", &eb).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], plain["choices"][0]["text"]);
    assert_eq!(plain_srv.drained().await.drafted, 0);
    // Without a draft below the source precision it cannot be: a 400.
    let tok = Arc::new(
        Tokenizer::from_gguf(&synapse_formats::gguf::GgufFile::open(&path).unwrap()).unwrap(),
    );
    let low = start_model(&path, draft, tok, small_engine(), ServerConfig::default()).await;
    let (st, v) = low.post("/v1/completions", &eb).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "escalation");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("below the source precision without a draft profile"),
        "{v}"
    );
}

/// A server with a head-only draft (`EngineConfig::head_draft`): opted-in greedy requests
/// are drafted by the model's own head cut to a shortlist and give the same text as plain
/// decoding (non-streaming, streaming, beside a plain request and a sampled escalating one,
/// which decodes plainly); `/v1/models` names the draft `head:N`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_only_draft_serves_exact_escalation() {
    let ecfg = EngineConfig {
        head_draft: Some((0..8192).collect()),
        draft_k: 4,
        draft_adaptive: false,
        ..small_engine()
    };
    let Some(s) = start(ecfg, ServerConfig::default()).await else {
        return;
    };
    let sampled = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.8,
        "seed": 7, "escalation": "exact"});
    escalated_text_is_plain(&s, &[sampled]).await;
    let models: Value = s.models().await;
    let d = models["data"][0]["meta"]["draft_profile"].as_str().unwrap();
    assert!(d.starts_with("head:"), "{models}");
    let m = s.metrics().await;
    assert!(m.contains("synapse_draft_acceptance "), "{m}");
    assert!(m.contains("synapse_draft_shortlist_tokens "), "{m}");
}

/// The per-request `precision` field: a source-precision server serves `"source"` and its own
/// profile hash, and refuses another profile with a 400 naming what it runs; a server at a
/// lower profile refuses `"source"` (it never serves a request that asked for the source at an
/// approximate profile) and serves its own hash. Every response, streamed chunks included,
/// names the profile it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precision_is_a_request_field() {
    let Some(path) = model_path() else {
        return;
    };
    let Some(src) = start(small_engine(), ServerConfig::default()).await else {
        return;
    };
    let source = Arc::new(Model::load(&path).unwrap());
    let source_hash = source.profile.hash();
    let body = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0});
    let (st, plain) = src.post("/v1/completions", &body).await;
    assert_eq!(st, 200, "{plain}");
    assert_eq!(plain["precision_profile"], source_hash);
    for want in [json!("source"), json!(source_hash)] {
        let mut b = body.clone();
        b["precision"] = want;
        let (st, v) = src.post("/v1/completions", &b).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], plain["choices"][0]["text"]);
    }
    let spec =
        synapse_runtime::precision::Precision::parse_profile("uniform:syn.q8.symmetric.g64.v1")
            .unwrap();
    let q8 = synapse_runtime::precision::apply(&source, &spec, None)
        .unwrap()
        .model;
    let q8_hash = q8.profile.hash();
    assert_ne!(q8_hash, source_hash);
    let mut other = body.clone();
    other["precision"] = json!(q8_hash);
    let (st, v) = src.post("/v1/completions", &other).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "precision");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("runs profile {source_hash} (the source)")),
        "{v}"
    );

    let tok = Arc::new(
        Tokenizer::from_gguf(&synapse_formats::gguf::GgufFile::open(&path).unwrap()).unwrap(),
    );
    let low = start_model(&path, q8, tok, small_engine(), ServerConfig::default()).await;
    let mut b = body.clone();
    b["precision"] = json!("source");
    let (st, v) = low.post("/v1/completions", &b).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "precision");
    let (st, v) = low.post("/v1/completions", &other).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["precision_profile"], q8_hash);
    let mut sb = other.clone();
    sb["stream"] = json!(true);
    let ev = low.stream("/v1/completions", &sb).await;
    let chunks: Vec<Value> = ev
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert!(!chunks.is_empty());
    assert!(
        chunks.iter().all(|c| c["precision_profile"] == q8_hash),
        "{chunks:?}"
    );
}

/// A counter's value in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

/// A BitNet b1.58 model (the tiny TQ2_0 GGUF that llama.cpp's converter made) served like any
/// model, through the same scheduler: completions and chat, streaming and not, exactly one
/// `[DONE]`, `finish_reason` set, `tools` refused, and the ternary traffic in `/metrics`. Its
/// greedy continuation of the fixture's first sequence (token ids) is llama.cpp's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bitnet_ternary_model_is_served_like_any_model() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/bitnet");
    let path = dir.join("model.tq2_0.gguf");
    if !synapse_testdata::require(&path, "the tiny BitNet fixture") {
        return;
    }
    let oracle: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    // The tiny model's GGUF has no chat template: give its tokenizer ChatML for the chat route.
    let (vocab, _) =
        synapse_tokenizer::vocab_from_gguf(&synapse_formats::gguf::GgufFile::open(&path).unwrap())
            .unwrap();
    let chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n\
                  {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let tok = Arc::new(Tokenizer::with_template(vocab, Some(chatml.to_string())).unwrap());
    let cfg = ServerConfig {
        model_id: "bitnet".into(),
        ..ServerConfig::default()
    };
    let s = start_with(&path, tok, small_engine(), cfg).await;

    // llama.cpp's greedy continuation of sequence 0 on this GGUF.
    let seq0 = oracle["sequences"][0].clone();
    let want_ids = oracle["gguf"]["tq2_0"]["greedy_after_seq0"].clone();
    let n = want_ids.as_array().unwrap().len();
    let (st, want) = s.post("/detokenize", &json!({"tokens": want_ids})).await;
    assert_eq!(st, 200);
    let body = json!({"model": "bitnet", "prompt": seq0, "max_tokens": n, "temperature": 0});
    let (st, v) = s.post("/v1/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["choices"][0]["text"], want["content"],
        "llama.cpp's greedy tokens"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    check_usage(&v["usage"]);
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (texts, _, _) = check_stream(&s.stream("/v1/completions", &sb).await, false, 1, false);
    assert_eq!(texts[0], want["content"].as_str().unwrap());

    // Chat, streaming and not, several at once (one scheduler, no serializing path).
    let chat = json!({"model": "bitnet", "messages": [{"role": "user", "content": "The quick brown fox"}],
                      "max_tokens": 12, "temperature": 0});
    let mut cs = chat.clone();
    cs["stream"] = json!(true);
    cs["stream_options"] = json!({"include_usage": true});
    let other = json!({"prompt": "Numbers 0 1 2", "max_tokens": 12});
    let (a, b, c) = tokio::join!(
        s.post("/v1/chat/completions", &chat),
        s.stream("/v1/chat/completions", &cs),
        s.post("/v1/completions", &other)
    );
    assert_eq!(a.0, 200, "{}", a.1);
    assert_eq!(a.1["object"], "chat.completion");
    assert!(a.1["choices"][0]["finish_reason"].is_string());
    let (texts, usage, _) = check_stream(&b, true, 1, true);
    assert_eq!(
        texts[0],
        a.1["choices"][0]["message"]["content"].as_str().unwrap()
    );
    check_usage(usage.as_ref().unwrap());
    assert_eq!(c.0, 200, "{}", c.1);

    // Tools are refused with a clear message.
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}]}),
        )
        .await;
    assert_error(st, &v, 400, "tools");
    assert!(v["error"]["message"].as_str().unwrap().contains("tools"));

    s.drained().await;
    let metrics = s.metrics().await;
    let generated = metric(&metrics, "synapse_generated_tokens_total");
    assert!(generated >= (2 * n + 12) as f64, "generated {generated}");
    assert!(metric(&metrics, "synapse_prompt_tokens_total") >= 32.0);
}
