//! `/v1/completions` and `/v1/chat/completions`: prompt → engine sessions → a JSON response
//! or an SSE stream.
//!
//! The sessions live in the handler's future (non-streaming) or in the SSE body stream
//! (streaming): when a client goes away, hyper drops that future or stream, the sessions are
//! dropped with it, and dropping a session cancels it in the engine, which frees its slot.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{Stream, StreamExt, select_all};
use synapse_runtime::engine::{Event, Request, Session};

use crate::error::{Result, ServerError};
use crate::extract::JsonBody;
use crate::openai::{GenerationRequest, Usage};
use crate::params::{Api, Limits, MAX_SESSIONS, ResponseFormat, validate};
use crate::prompt::{flatten_messages, prompt_ids, render_chat, tokenize_text};
use crate::response::{ChunkWriter, Collector, Frame, Pieces, ResponseCtx};
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
        exact: info.exact_available(),
    };
    let p = validate(&req, api, lim)?;
    check_precision(req.precision.as_deref(), &info)?;
    // Templates and tokenization of a body up to the limit: off the async workers.
    let st = state.clone();
    let (req, prompts) = tokio::task::spawn_blocking(move || {
        let r = prompts(&st, &req, api);
        (req, r)
    })
    .await
    .map_err(|e| ServerError::Internal(format!("tokenizing: {e}")))?;
    let prompts = prompts?;
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
                escalation: p.escalation,
                forced: Vec::new(),
            };
            match engine.submit(r) {
                Ok(s) => sessions.push(s),
                Err(e) => {
                    if matches!(e, synapse_runtime::engine::SubmitError::QueueFull { .. }) {
                        metrics::rejected("queue_full");
                    }
                    // The sessions already submitted are dropped here, which cancels them.
                    return Err(match ServerError::from(e) {
                        ServerError::PromptTooLong { tokens, limit, .. } => {
                            ServerError::PromptTooLong {
                                param: if api == Api::Chat {
                                    "messages"
                                } else {
                                    "prompt"
                                },
                                tokens,
                                limit,
                            }
                        }
                        other => other,
                    });
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
    let tok = state.tokenizer().clone();
    let reply = Reply {
        ctx: ResponseCtx {
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
                info.fingerprint.chars().take(12).collect::<String>()
            ),
            n: p.n,
            profile: info.profile.clone(),
        },
        route: if api == Api::Chat {
            "chat"
        } else {
            "completions"
        },
        request_id,
        t0,
        logprobs: p.logprobs.is_some(),
        include_usage: p.include_usage,
        pieces: Arc::new(move |id| tok.token_to_piece(id, true).unwrap_or_default().to_vec()),
    };
    let streams: Vec<EventStream> = sessions
        .into_iter()
        .enumerate()
        .map(|(i, s)| session_events(s, i, t0))
        .collect();
    if p.stream {
        Ok(stream_response(reply, streams).into_response())
    } else {
        collect_response(reply, streams).await
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

/// How one request's response is made.
struct Reply {
    ctx: ResponseCtx,
    route: &'static str,
    request_id: String,
    t0: Instant,
    logprobs: bool,
    include_usage: bool,
    pieces: Pieces,
}

impl Reply {
    fn done(&self, usage: &Usage, what: &str) {
        metrics::request_done(self.route, self.t0.elapsed());
        tracing::info!(
            request_id = %self.request_id,
            prompt_tokens = usage.prompt_tokens,
            cached_tokens = usage.prompt_tokens_details.cached_tokens,
            completion_tokens = usage.completion_tokens,
            elapsed_ms = self.t0.elapsed().as_millis() as u64,
            "{what}"
        );
    }
}

async fn collect_response(r: Reply, streams: Vec<EventStream>) -> Result<Response> {
    let mut guard = DisconnectGuard {
        request_id: r.request_id.clone(),
        done: false,
    };
    let mut c = Collector::new(r.ctx.clone(), streams.len(), r.logprobs, r.pieces.clone());
    let mut merged = select_all(streams);
    while let Some((i, ev)) = merged.next().await {
        if let Err(e) = c.event(i, ev) {
            guard.done = true;
            return Err(e);
        }
    }
    guard.done = true;
    let (body, usage) = c.finish();
    r.done(&usage, "generation done");
    Ok(Json(body).into_response())
}

fn sse(frame: Frame) -> SseEvent {
    match frame {
        Frame::Chunk(v) => SseEvent::default().data(v.to_string()),
        Frame::Error(e) => SseEvent::default()
            .event("error")
            .data(serde_json::to_string(&e).unwrap_or_default()),
        Frame::Done => SseEvent::default().data("[DONE]"),
    }
}

/// The SSE response; the stream owns the sessions (a dropped connection drops them).
fn stream_response(
    r: Reply,
    streams: Vec<EventStream>,
) -> Sse<impl Stream<Item = std::result::Result<SseEvent, Infallible>>> {
    let s = async_stream::stream! {
        let mut guard = DisconnectGuard { request_id: r.request_id.clone(), done: false };
        let mut w = ChunkWriter::new(r.ctx.clone(), streams.len(), r.logprobs,
                                     r.include_usage, r.pieces.clone());
        let mut merged = select_all(streams);
        for f in w.start() {
            yield Ok(sse(f));
        }
        while let Some((i, ev)) = merged.next().await {
            for f in w.event(i, ev) {
                yield Ok(sse(f));
            }
            if w.failed() {
                guard.done = true;
                tracing::warn!(request_id = %r.request_id, "stream failed");
                return;
            }
        }
        drop(merged);
        guard.done = true;
        let (frames, usage) = w.end();
        r.done(&usage, "stream done");
        for f in frames {
            yield Ok(sse(f));
        }
    };
    Sse::new(s)
}

/// A request's `precision` field against the profile new sessions run on: `"source"` is served
/// only at the source profile, a profile hash only when it is the one in effect; otherwise a
/// 400 naming what this server runs.
fn check_precision(want: Option<&str>, info: &synapse_runtime::engine::EngineInfo) -> Result<()> {
    let Some(want) = want else {
        return Ok(());
    };
    let at_source = info.profile == info.source_profile;
    let ok = match want {
        "source" => at_source,
        p => p == info.profile || (at_source && p == info.source_profile),
    };
    if ok {
        return Ok(());
    }
    Err(ServerError::invalid(
        "precision",
        format!(
            "this server runs profile {}{}; a request can ask for it{} only (a profile is \
             chosen at start: serve --profile / --budget)",
            info.profile,
            if at_source { " (the source)" } else { "" },
            if at_source { " or \"source\"" } else { "" },
        ),
    ))
}
