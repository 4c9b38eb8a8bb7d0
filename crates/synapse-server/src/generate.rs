//! `/v1/completions` and `/v1/chat/completions`: prompt → engine sessions → a JSON response
//! or an SSE stream.
//!
//! The sessions live in the handler's future (non-streaming) or in the SSE body stream
//! (streaming): when a client goes away, hyper drops that future or stream, the sessions are
//! dropped with it, and dropping a session cancels it in the engine, which frees its slot.

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{Stream, StreamExt, select_all};
use serde_json::{Value, json};
use synapse_runtime::engine::{Event, FinishReason, Finished, Logprob, Request, Session};
use synapse_tokenizer::Tokenizer;

use crate::error::{Result, ServerError};
use crate::extract::JsonBody;
use crate::openai::{
    ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, GenerationRequest, Usage,
};
use crate::params::{Api, GenParams, Limits, MAX_SESSIONS, ResponseFormat, validate};
use crate::prompt::{flatten_messages, prompt_ids, render_chat, tokenize_text};
use crate::state::AppState;
use crate::{metrics, request_id};

type EventStream = Pin<Box<dyn Stream<Item = (usize, Event)> + Send>>;

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<GenerationRequest>,
) -> Result<Response> {
    run(state, req, Api::Completions, request_id(&headers)).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<GenerationRequest>,
) -> Result<Response> {
    run(state, req, Api::Chat, request_id(&headers)).await
}

/// The prompts of a request as token ids.
fn prompts(state: &AppState, req: &GenerationRequest, api: Api) -> Result<Vec<Vec<u32>>> {
    let tok = state.tokenizer();
    match api {
        Api::Chat => {
            let msgs = req
                .messages
                .as_ref()
                .ok_or_else(|| ServerError::invalid("messages", "`messages` is required"))?;
            let msgs = flatten_messages(msgs)?;
            let text = render_chat(state, &msgs)?;
            let ids = tokenize_text(tok, &text)?;
            if ids.is_empty() {
                return Err(ServerError::invalid("messages", "the prompt is empty"));
            }
            Ok(vec![ids])
        }
        Api::Completions => {
            let p = req
                .prompt
                .clone()
                .ok_or_else(|| ServerError::invalid("prompt", "`prompt` is required"))?;
            let items = p.items();
            if items.is_empty() {
                return Err(ServerError::invalid("prompt", "the prompt list is empty"));
            }
            if items.len() > MAX_SESSIONS {
                return Err(ServerError::invalid(
                    "prompt",
                    format!("at most {MAX_SESSIONS} prompts per request"),
                ));
            }
            items
                .iter()
                .map(|it| prompt_ids(tok, it, tok.vocab_size()))
                .collect()
        }
    }
}

async fn run(
    state: AppState,
    req: GenerationRequest,
    api: Api,
    request_id: String,
) -> Result<Response> {
    let t0 = Instant::now();
    if let Some(m) = req.model.as_ref().filter(|m| !state.serves(m)) {
        return Err(ServerError::ModelNotFound(m.clone()));
    }
    let engine = state.engine().clone();
    let info = engine.info();
    let lim = Limits {
        vocab: state.tokenizer().vocab_size().min(info.vocab.max(1)),
        ctx: info.ctx,
        default_max_tokens: state.config().default_max_tokens,
    };
    let p = validate(&req, api, lim)?;
    let prompts = prompts(&state, &req, api)?;
    if prompts.len() * p.n > MAX_SESSIONS {
        return Err(ServerError::invalid(
            "n",
            format!("prompts × n must be at most {MAX_SESSIONS}"),
        ));
    }
    let grammars = match &p.response_format {
        ResponseFormat::Text => None,
        ResponseFormat::Json(_) => Some(state.grammars().await?),
    };

    let mut sessions: Vec<Session> = Vec::with_capacity(prompts.len() * p.n);
    for ids in &prompts {
        for j in 0..p.n {
            let constraint = match (&grammars, &p.response_format) {
                (Some(g), ResponseFormat::Json(schema)) => {
                    Some(g.json_constraint(schema.as_ref())?)
                }
                _ => None,
            };
            let mut sampling = p.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add(j as u64);
            let r = Request {
                prompt: ids.clone(),
                max_tokens: p.max_tokens.unwrap_or(info.ctx).min(info.ctx),
                sampling,
                logit_bias: p.logit_bias.clone(),
                stop: p.stop.clone(),
                stop_at_eog: p.stop_at_eog,
                logprobs: p.logprobs,
                constraint,
            };
            match engine.submit(r) {
                Ok(s) => sessions.push(s),
                Err(e) => {
                    if matches!(e, synapse_runtime::engine::SubmitError::QueueFull { .. }) {
                        metrics::rejected("queue_full");
                    }
                    // The sessions already submitted are dropped here, which cancels them.
                    return Err(e.into());
                }
            }
        }
    }
    tracing::info!(
        request_id = %request_id,
        api = ?api,
        prompts = prompts.len(),
        prompt_tokens = prompts.iter().map(Vec::len).sum::<usize>(),
        n = p.n,
        stream = p.stream,
        max_tokens = ?p.max_tokens,
        user = req.user.as_deref().unwrap_or(""),
        "generation submitted"
    );
    let ctx = ResponseCtx {
        api,
        id: format!(
            "{}-{:016x}",
            if api == Api::Chat { "chatcmpl" } else { "cmpl" },
            crate::params::random_u64()
        ),
        created: unix_now(),
        model: state.config().model_id.clone(),
        fingerprint: format!(
            "synapse-{}",
            &info.fingerprint[..info.fingerprint.len().min(12)]
        ),
        request_id,
        t0,
        n_prompts: prompts.len(),
        n: p.n,
    };
    let streams: Vec<EventStream> = sessions
        .into_iter()
        .enumerate()
        .map(|(i, s)| session_events(s, i, t0))
        .collect();
    let tok = state.tokenizer().clone();
    if p.stream {
        Ok(stream_response(ctx, p, tok, streams).into_response())
    } else {
        collect_response(ctx, p, tok, streams).await
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A session's events tagged with its choice index; records TTFT and inter-token latency.
fn session_events(mut s: Session, index: usize, t0: Instant) -> EventStream {
    Box::pin(async_stream::stream! {
        let mut last: Option<Instant> = None;
        loop {
            match s.next().await {
                Some(ev) => {
                    if let Event::Token(_) = &ev {
                        let now = Instant::now();
                        match last {
                            None => metrics::first_token(now - t0),
                            Some(l) => metrics::inter_token(now - l),
                        }
                        last = Some(now);
                    }
                    let end = matches!(ev, Event::Done(_) | Event::Error(_));
                    yield (index, ev);
                    if end {
                        break;
                    }
                }
                None => {
                    yield (index, Event::Error("the session ended without a result".into()));
                    break;
                }
            }
        }
    })
}

/// What every response and chunk of one request shares.
struct ResponseCtx {
    api: Api,
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
    request_id: String,
    t0: Instant,
    n_prompts: usize,
    n: usize,
}

impl ResponseCtx {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        })
    }

    fn route(&self) -> &'static str {
        match self.api {
            Api::Chat => "chat",
            Api::Completions => "completions",
        }
    }

    /// Usage over all choices: each prompt counted once (its first choice's numbers).
    fn usage(&self, finished: &[Option<Finished>]) -> Usage {
        let mut u = Usage::default();
        for (i, f) in finished.iter().enumerate() {
            let Some(f) = f else { continue };
            if i % self.n == 0 {
                u.prompt_tokens += f.prompt_tokens;
                u.prompt_tokens_details.cached_tokens += f.cached_tokens;
            }
            u.completion_tokens += f.completion_tokens;
        }
        u.total_tokens = u.prompt_tokens + u.completion_tokens;
        u
    }
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        // `cancelled` is never a client's answer (a cancelled client is gone).
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

fn token_string(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let b = tok.token_to_piece(id, true).unwrap_or_default().to_vec();
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// Completions' logprobs for `tokens`, offsets starting at `*offset` (advanced).
fn completion_logprobs(
    tok: &Tokenizer,
    tokens: &[(u32, Logprob)],
    offset: &mut usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for (id, lp) in tokens {
        let (s, b) = token_string(tok, *id);
        out.text_offset.push(*offset);
        *offset += b.len();
        out.tokens.push(s);
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs.push(
            lp.top
                .iter()
                .map(|&(t, l)| (token_string(tok, t).0, l))
                .collect(),
        );
    }
    out
}

fn chat_logprobs(tok: &Tokenizer, tokens: &[(u32, Logprob)]) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|(id, lp)| {
                let (token, bytes) = token_string(tok, *id);
                ChatTokenLogprob {
                    token,
                    logprob: lp.logprob,
                    bytes,
                    top_logprobs: lp
                        .top
                        .iter()
                        .map(|&(t, l)| {
                            let (token, bytes) = token_string(tok, t);
                            ChatTopLogprob {
                                token,
                                logprob: l,
                                bytes,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// Logs a request that ended before its response did (the client went away).
struct DisconnectGuard {
    request_id: String,
    done: bool,
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        if !self.done {
            tracing::info!(request_id = %self.request_id, "client went away; sessions cancelled");
        }
    }
}

async fn collect_response(
    ctx: ResponseCtx,
    p: GenParams,
    tok: std::sync::Arc<Tokenizer>,
    streams: Vec<EventStream>,
) -> Result<Response> {
    let total = streams.len();
    let mut guard = DisconnectGuard {
        request_id: ctx.request_id.clone(),
        done: false,
    };
    let mut texts = vec![String::new(); total];
    let mut lps: Vec<Vec<(u32, Logprob)>> = vec![Vec::new(); total];
    let mut finished: Vec<Option<Finished>> = vec![None; total];
    let mut merged = select_all(streams);
    while let Some((i, ev)) = merged.next().await {
        match ev {
            Event::Admitted { .. } => {}
            Event::Token(t) => {
                texts[i].push_str(&t.text);
                if let Some(lp) = t.logprob {
                    lps[i].push((t.id, lp));
                }
            }
            Event::Done(f) => {
                texts[i].push_str(&f.tail);
                finished[i] = Some(f);
            }
            Event::Error(e) => {
                guard.done = true;
                return Err(ServerError::Engine(e));
            }
        }
    }
    drop(merged);
    guard.done = true;
    let usage = ctx.usage(&finished);
    let mut choices = Vec::with_capacity(total);
    for i in 0..total {
        let reason = finished[i]
            .as_ref()
            .map(|f| finish_reason(f.reason))
            .unwrap_or("stop");
        let text = std::mem::take(&mut texts[i]);
        let choice = match ctx.api {
            Api::Completions => {
                let logprobs = p.logprobs.map(|_| {
                    let mut off = 0;
                    completion_logprobs(&tok, &lps[i], &mut off)
                });
                json!({"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason})
            }
            Api::Chat => {
                let logprobs = p.logprobs.map(|_| chat_logprobs(&tok, &lps[i]));
                json!({
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs,
                    "finish_reason": reason,
                })
            }
        };
        choices.push(choice);
    }
    let mut body = ctx.envelope(false, Value::Array(choices));
    body["usage"] = serde_json::to_value(usage).unwrap_or(Value::Null);
    metrics::request_done(ctx.route(), ctx.t0.elapsed());
    tracing::info!(
        request_id = %ctx.request_id,
        prompt_tokens = usage.prompt_tokens,
        cached_tokens = usage.prompt_tokens_details.cached_tokens,
        completion_tokens = usage.completion_tokens,
        prompts = ctx.n_prompts,
        elapsed_ms = ctx.t0.elapsed().as_millis() as u64,
        "generation done"
    );
    Ok(Json(body).into_response())
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

fn stream_response(
    ctx: ResponseCtx,
    p: GenParams,
    tok: std::sync::Arc<Tokenizer>,
    streams: Vec<EventStream>,
) -> Sse<impl Stream<Item = std::result::Result<SseEvent, Infallible>>> {
    let total = streams.len();
    let s = async_stream::stream! {
        let mut guard = DisconnectGuard { request_id: ctx.request_id.clone(), done: false };
        let mut merged = select_all(streams);
        let mut pending: Vec<Vec<(u32, Logprob)>> = vec![Vec::new(); total];
        let mut offsets = vec![0usize; total];
        let mut finished: Vec<Option<Finished>> = vec![None; total];
        let choice = |i: usize, text: Option<&str>, first: bool, lp: &[(u32, Logprob)],
                      offset: &mut usize, reason: Option<&str>| -> Value {
            match ctx.api {
                Api::Chat => {
                    let mut delta = serde_json::Map::new();
                    if first {
                        delta.insert("role".into(), json!("assistant"));
                    }
                    if let Some(t) = text {
                        delta.insert("content".into(), json!(t));
                    }
                    let logprobs = if p.logprobs.is_some() && (!lp.is_empty() || reason.is_some()) {
                        json!(chat_logprobs(&tok, lp))
                    } else {
                        Value::Null
                    };
                    json!({"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason})
                }
                Api::Completions => {
                    let logprobs = if p.logprobs.is_some() {
                        json!(completion_logprobs(&tok, lp, offset))
                    } else {
                        Value::Null
                    };
                    json!({"index": i, "text": text.unwrap_or(""), "logprobs": logprobs,
                           "finish_reason": reason})
                }
            }
        };
        if ctx.api == Api::Chat {
            for (i, off) in offsets.iter_mut().enumerate() {
                let c = choice(i, Some(""), true, &[], off, None);
                yield Ok(data(&ctx.envelope(true, json!([c]))));
            }
        }
        while let Some((i, ev)) = merged.next().await {
            match ev {
                Event::Admitted { .. } => {}
                Event::Token(t) => {
                    if let Some(lp) = t.logprob {
                        pending[i].push((t.id, lp));
                    }
                    if !t.text.is_empty() {
                        let lp = std::mem::take(&mut pending[i]);
                        let c = choice(i, Some(&t.text), false, &lp, &mut offsets[i], None);
                        yield Ok(data(&ctx.envelope(true, json!([c]))));
                    }
                }
                Event::Done(f) => {
                    let lp = std::mem::take(&mut pending[i]);
                    let text = (!f.tail.is_empty() || ctx.api == Api::Completions)
                        .then_some(f.tail.as_str());
                    let c = choice(i, text, false, &lp, &mut offsets[i],
                                   Some(finish_reason(f.reason)));
                    yield Ok(data(&ctx.envelope(true, json!([c]))));
                    finished[i] = Some(f);
                }
                Event::Error(e) => {
                    guard.done = true;
                    tracing::warn!(request_id = %ctx.request_id, error = %e, "stream failed");
                    let err = ServerError::Engine(e).body();
                    yield Ok(SseEvent::default().event("error").data(
                        serde_json::to_string(&err).unwrap_or_default()));
                    return;
                }
            }
        }
        drop(merged);
        guard.done = true;
        let usage = ctx.usage(&finished);
        if p.include_usage {
            let mut u = ctx.envelope(true, json!([]));
            u["usage"] = serde_json::to_value(usage).unwrap_or(Value::Null);
            yield Ok(data(&u));
        }
        metrics::request_done(ctx.route(), ctx.t0.elapsed());
        tracing::info!(
            request_id = %ctx.request_id,
            prompt_tokens = usage.prompt_tokens,
            cached_tokens = usage.prompt_tokens_details.cached_tokens,
            completion_tokens = usage.completion_tokens,
            elapsed_ms = ctx.t0.elapsed().as_millis() as u64,
            "stream done"
        );
        yield Ok(SseEvent::default().data("[DONE]"));
    };
    Sse::new(s)
}
