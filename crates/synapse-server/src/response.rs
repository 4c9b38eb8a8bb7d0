//! Response assembly: engine events in, OpenAI responses and stream chunks out. Pure (no
//! HTTP, no engine): the handlers feed it events, the tests feed it made-up ones.
//!
//! Stream rules ([`ChunkWriter`]): one id per stream; chat sends `role` only in each
//! choice's first delta; `finish_reason` is non-null only in a choice's last chunk; with
//! `include_usage` a final chunk carries the usage and `choices: []`; then exactly one
//! `[DONE]`. A failed session ends the stream with one error frame instead.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use synapse_runtime::engine::{Event, FinishReason, Finished, Logprob};

use crate::error::{ErrorBody, ServerError};
use crate::openai::{
    ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, PromptTokensDetails, Usage,
};
use crate::params::Api;

/// A token's bytes as shown in logprobs (control tokens with their text).
pub type Pieces = Arc<dyn Fn(u32) -> Vec<u8> + Send + Sync>;

/// What every response and chunk of one request shares.
#[derive(Debug, Clone)]
pub struct ResponseCtx {
    /// Endpoint.
    pub api: Api,
    /// `cmpl-…` / `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model id.
    pub model: String,
    /// `system_fingerprint`.
    pub fingerprint: String,
    /// Choices per prompt.
    pub n: usize,
    /// The precision profile (hash) new sessions ran on when the request was accepted
    /// (`precision_profile`; a profile installed by `POST /v1/precision` before the request's
    /// admission would serve it instead).
    pub profile: String,
}

impl ResponseCtx {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completions, _) => "text_completion",
        }
    }

    /// The object around `choices`.
    pub fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "precision_profile": self.profile,
            "choices": choices,
        })
    }

    /// Usage over all choices: each prompt counted once (its first choice's numbers).
    pub fn usage(&self, finished: &[Option<Finished>]) -> Usage {
        let mut u = Usage {
            prompt_tokens_details: PromptTokensDetails::default(),
            ..Usage::default()
        };
        for (i, f) in finished.iter().enumerate() {
            let Some(f) = f else { continue };
            if i % self.n.max(1) == 0 {
                u.prompt_tokens += f.prompt_tokens;
                u.prompt_tokens_details.cached_tokens += f.cached_tokens;
            }
            u.completion_tokens += f.completion_tokens;
        }
        u.total_tokens = u.prompt_tokens + u.completion_tokens;
        u
    }
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        // `cancelled` is never a client's answer (a cancelled client is gone).
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

fn token_string(pieces: &Pieces, id: u32) -> (String, Vec<u8>) {
    let b = pieces(id);
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// Completions' logprobs for `tokens`, text offsets starting at `*offset` (advanced).
pub fn completion_logprobs(
    pieces: &Pieces,
    tokens: &[(u32, Logprob)],
    offset: &mut usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for (id, lp) in tokens {
        let (s, b) = token_string(pieces, *id);
        out.text_offset.push(*offset);
        *offset += b.len();
        out.tokens.push(s);
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs.push(
            lp.top
                .iter()
                .map(|&(t, l)| (token_string(pieces, t).0, l))
                .collect(),
        );
    }
    out
}

/// Chat's logprobs for `tokens`.
pub fn chat_logprobs(pieces: &Pieces, tokens: &[(u32, Logprob)]) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|(id, lp)| {
                let (token, bytes) = token_string(pieces, *id);
                ChatTokenLogprob {
                    token,
                    logprob: lp.logprob,
                    bytes,
                    top_logprobs: lp
                        .top
                        .iter()
                        .map(|&(t, l)| {
                            let (token, bytes) = token_string(pieces, t);
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

/// Accumulates a whole (non-streamed) response.
pub struct Collector {
    ctx: ResponseCtx,
    logprobs: bool,
    pieces: Pieces,
    texts: Vec<String>,
    lps: Vec<Vec<(u32, Logprob)>>,
    finished: Vec<Option<Finished>>,
}

impl Collector {
    /// A collector for `total` choices.
    pub fn new(ctx: ResponseCtx, total: usize, logprobs: bool, pieces: Pieces) -> Self {
        Collector {
            ctx,
            logprobs,
            pieces,
            texts: vec![String::new(); total],
            lps: vec![Vec::new(); total],
            finished: vec![None; total],
        }
    }

    /// Takes one event of choice `i`; a failed session is the request's error.
    pub fn event(&mut self, i: usize, ev: Event) -> Result<(), ServerError> {
        match ev {
            Event::Admitted { .. } => {}
            Event::Token(t) => {
                self.texts[i].push_str(&t.text);
                if let Some(lp) = t.logprob {
                    self.lps[i].push((t.id, lp));
                }
            }
            Event::Done(f) => {
                self.texts[i].push_str(&f.tail);
                self.finished[i] = Some(f);
            }
            Event::Error(e) => return Err(ServerError::Engine(e)),
        }
        Ok(())
    }

    /// The response body and its usage.
    pub fn finish(mut self) -> (Value, Usage) {
        let usage = self.ctx.usage(&self.finished);
        let mut choices = Vec::with_capacity(self.texts.len());
        for i in 0..self.texts.len() {
            let reason = self.finished[i]
                .as_ref()
                .map(|f| finish_reason(f.reason))
                .unwrap_or("stop");
            let text = std::mem::take(&mut self.texts[i]);
            choices.push(match self.ctx.api {
                Api::Completions => {
                    let logprobs = self.logprobs.then(|| {
                        let mut off = 0;
                        completion_logprobs(&self.pieces, &self.lps[i], &mut off)
                    });
                    json!({"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason})
                }
                Api::Chat => {
                    let logprobs = self
                        .logprobs
                        .then(|| chat_logprobs(&self.pieces, &self.lps[i]));
                    json!({
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": logprobs,
                        "finish_reason": reason,
                    })
                }
            });
        }
        let mut body = self.ctx.envelope(false, Value::Array(choices));
        body["usage"] = serde_json::to_value(usage).unwrap_or(Value::Null);
        (body, usage)
    }
}

/// One frame of a stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `data: <json>`.
    Chunk(Value),
    /// `event: error` + `data: <error object>`; the stream ends after it.
    Error(ErrorBody),
    /// `data: [DONE]`.
    Done,
}

/// Turns the events of a streamed request's sessions into chunks.
pub struct ChunkWriter {
    ctx: ResponseCtx,
    logprobs: bool,
    include_usage: bool,
    pieces: Pieces,
    pending: Vec<Vec<(u32, Logprob)>>,
    offsets: Vec<usize>,
    finished: Vec<Option<Finished>>,
    failed: bool,
}

impl ChunkWriter {
    /// A writer for `total` choices.
    pub fn new(
        ctx: ResponseCtx,
        total: usize,
        logprobs: bool,
        include_usage: bool,
        pieces: Pieces,
    ) -> Self {
        ChunkWriter {
            ctx,
            logprobs,
            include_usage,
            pieces,
            pending: vec![Vec::new(); total],
            offsets: vec![0; total],
            finished: vec![None; total],
            failed: false,
        }
    }

    fn choice(
        &mut self,
        i: usize,
        text: Option<&str>,
        first: bool,
        lp: &[(u32, Logprob)],
        reason: Option<&str>,
    ) -> Value {
        let c = match self.ctx.api {
            Api::Chat => {
                let mut delta = Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                let logprobs = if self.logprobs && (!lp.is_empty() || reason.is_some()) {
                    json!(chat_logprobs(&self.pieces, lp))
                } else {
                    Value::Null
                };
                json!({"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason})
            }
            Api::Completions => {
                let logprobs = if self.logprobs {
                    json!(completion_logprobs(&self.pieces, lp, &mut self.offsets[i]))
                } else {
                    Value::Null
                };
                json!({"index": i, "text": text.unwrap_or(""), "logprobs": logprobs,
                       "finish_reason": reason})
            }
        };
        self.ctx.envelope(true, json!([c]))
    }

    /// The frames before any event: chat's role deltas.
    pub fn start(&mut self) -> Vec<Frame> {
        if self.ctx.api != Api::Chat {
            return Vec::new();
        }
        (0..self.pending.len())
            .map(|i| Frame::Chunk(self.choice(i, Some(""), true, &[], None)))
            .collect()
    }

    /// The frames for one event of choice `i` (none for a token whose text is held back).
    pub fn event(&mut self, i: usize, ev: Event) -> Vec<Frame> {
        if self.failed {
            return Vec::new();
        }
        match ev {
            Event::Admitted { .. } => Vec::new(),
            Event::Token(t) => {
                if let Some(lp) = t.logprob {
                    self.pending[i].push((t.id, lp));
                }
                if t.text.is_empty() {
                    return Vec::new();
                }
                let lp = std::mem::take(&mut self.pending[i]);
                vec![Frame::Chunk(self.choice(
                    i,
                    Some(&t.text),
                    false,
                    &lp,
                    None,
                ))]
            }
            Event::Done(f) => {
                let lp = std::mem::take(&mut self.pending[i]);
                let text = (!f.tail.is_empty() || self.ctx.api == Api::Completions)
                    .then_some(f.tail.as_str());
                let c = self.choice(i, text, false, &lp, Some(finish_reason(f.reason)));
                self.finished[i] = Some(f);
                vec![Frame::Chunk(c)]
            }
            Event::Error(e) => {
                self.failed = true;
                vec![Frame::Error(ServerError::Engine(e).body())]
            }
        }
    }

    /// Whether a session failed (the stream is over).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The closing frames: the usage chunk (when asked for) and `[DONE]`.
    pub fn end(&mut self) -> (Vec<Frame>, Usage) {
        let usage = self.ctx.usage(&self.finished);
        if self.failed {
            return (Vec::new(), usage);
        }
        if self.finished.iter().any(Option::is_none) {
            self.failed = true;
            let e = ServerError::Engine("a session ended without a result".into());
            return (vec![Frame::Error(e.body())], usage);
        }
        let mut out = Vec::new();
        if self.include_usage {
            let mut u = self.ctx.envelope(true, json!([]));
            u["usage"] = serde_json::to_value(usage).unwrap_or(Value::Null);
            out.push(Frame::Chunk(u));
        }
        out.push(Frame::Done);
        (out, usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use synapse_runtime::engine::TokenEvent;

    fn ctx(api: Api, n: usize) -> ResponseCtx {
        ResponseCtx {
            api,
            id: "x-1".into(),
            created: 1,
            model: "m".into(),
            fingerprint: "f".into(),
            profile: "p".into(),
            n,
        }
    }

    fn pieces() -> Pieces {
        Arc::new(|id| format!("<{id}>").into_bytes())
    }

    fn tok(id: u32, text: &str, lp: bool) -> Event {
        Event::Token(TokenEvent {
            id,
            text: text.into(),
            logprob: lp.then(|| Logprob {
                logprob: -0.5,
                top: vec![(id, -0.5), (7, -1.5)],
            }),
        })
    }

    fn done(reason: FinishReason, tail: &str, completion: usize) -> Event {
        Event::Done(Finished {
            reason,
            prompt_tokens: 5,
            cached_tokens: 2,
            completion_tokens: completion,
            tail: tail.into(),
        })
    }

    fn chunks(frames: &[Frame]) -> Vec<&Value> {
        frames
            .iter()
            .filter_map(|f| match f {
                Frame::Chunk(v) => Some(v),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn chat_stream_follows_openai_rules() {
        let mut w = ChunkWriter::new(ctx(Api::Chat, 2), 2, false, true, pieces());
        let mut frames = w.start();
        frames.extend(w.event(0, Event::Admitted { cached_tokens: 0 }));
        frames.extend(w.event(0, tok(1, "Hel", false)));
        frames.extend(w.event(1, tok(1, "Hel", false)));
        frames.extend(w.event(0, tok(2, "", false))); // held back: no chunk
        frames.extend(w.event(0, done(FinishReason::Stop, "lo", 3)));
        frames.extend(w.event(1, done(FinishReason::Length, "", 1)));
        let (end, usage) = w.end();
        frames.extend(end);
        assert_eq!(frames.last(), Some(&Frame::Done));
        assert_eq!(frames.iter().filter(|f| **f == Frame::Done).count(), 1);
        let cs = chunks(&frames);
        assert!(cs.iter().all(|c| c["id"] == "x-1"));
        assert!(cs.iter().all(|c| c["object"] == "chat.completion.chunk"));
        // role only in the first delta of each choice
        let with_role: Vec<_> = cs
            .iter()
            .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
            .filter(|c| c["choices"][0]["delta"].get("role").is_some())
            .map(|c| c["choices"][0]["index"].as_u64().unwrap())
            .collect();
        assert_eq!(with_role, vec![0, 1]);
        // finish_reason only in each choice's last chunk; the tail arrives with it
        let fin: Vec<_> = cs
            .iter()
            .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
            .filter(|c| !c["choices"][0]["finish_reason"].is_null())
            .map(|c| {
                (
                    c["choices"][0]["index"].clone(),
                    c["choices"][0]["delta"].clone(),
                )
            })
            .collect();
        assert_eq!(
            fin,
            vec![(json!(0), json!({"content": "lo"})), (json!(1), json!({}))]
        );
        // usage: last chunk, no choices, the prompt counted once per prompt
        let last = cs.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["prompt_tokens"], 5);
        assert_eq!(last["usage"]["completion_tokens"], 4);
        assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
        assert_eq!(usage.total_tokens, 9);
    }

    #[test]
    fn completion_stream_logprobs_and_error() {
        let mut w = ChunkWriter::new(ctx(Api::Completions, 1), 1, true, false, pieces());
        assert!(w.start().is_empty());
        assert!(w.event(0, tok(3, "", true)).is_empty());
        let f = w.event(0, tok(4, "ab", true));
        let c = chunks(&f)[0];
        assert_eq!(c["object"], "text_completion");
        // the held-back token's logprobs come with the next text
        assert_eq!(c["choices"][0]["logprobs"]["tokens"], json!(["<3>", "<4>"]));
        assert_eq!(c["choices"][0]["logprobs"]["text_offset"], json!([0, 3]));
        assert_eq!(c["choices"][0]["logprobs"]["top_logprobs"][0]["<7>"], -1.5);
        let e = w.event(0, Event::Error("boom".into()));
        assert!(matches!(&e[..], [Frame::Error(b)] if b.error.message.contains("boom")));
        assert!(w.failed());
        assert!(w.event(0, done(FinishReason::Stop, "", 2)).is_empty());
        assert!(w.end().0.is_empty(), "no [DONE] after an error");
    }

    #[test]
    fn a_session_without_result_is_an_error_frame() {
        let mut w = ChunkWriter::new(ctx(Api::Completions, 1), 1, false, false, pieces());
        let _ = w.event(0, tok(1, "x", false));
        assert!(matches!(&w.end().0[..], [Frame::Error(_)]));
    }

    #[test]
    fn collected_chat_response() {
        let mut c = Collector::new(ctx(Api::Chat, 1), 1, true, pieces());
        c.event(0, tok(1, "Hi", true)).unwrap();
        c.event(0, done(FinishReason::Cancelled, "!", 1)).unwrap();
        let (body, usage) = c.finish();
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["choices"][0]["message"]["content"], "Hi!");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            body["choices"][0]["logprobs"]["content"][0]["bytes"],
            json!(b"<1>".to_vec())
        );
        assert_eq!(usage.total_tokens, 6);
        let mut c = Collector::new(ctx(Api::Completions, 1), 1, false, pieces());
        assert!(c.event(0, Event::Error("x".into())).is_err());
    }
}
