//! Request parameters: domains checked, OpenAI's names mapped to the engine's.

use serde_json::Value;
use synapse_runtime::SamplingParams;

use crate::error::{Result, ServerError};
use crate::openai::{GenerationRequest, LogprobsField};

/// Most choices per prompt.
pub const MAX_N: i64 = 16;
/// Most sessions one request may start (prompts × n).
pub const MAX_SESSIONS: usize = 64;
/// Most alternatives per token.
pub const MAX_TOP_LOGPROBS: i64 = 20;
/// Most stop strings.
pub const MAX_STOP: usize = 16;
/// Longest stop string, bytes.
pub const MAX_STOP_BYTES: usize = 4096;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// Structured-output request.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// JSON (`None`: any object; `Some`: this schema).
    Json(Option<Value>),
}

/// A request's parameters, checked.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Most tokens per choice (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    /// Sampling (seed of choice 0; choice i uses seed + i).
    pub sampling: SamplingParams,
    /// Logit biases.
    pub logit_bias: Vec<(u32, f32)>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stop at end-of-generation tokens.
    pub stop_at_eog: bool,
    /// Alternatives per token, when logprobs are asked for.
    pub logprobs: Option<usize>,
    /// Choices per prompt.
    pub n: usize,
    /// Stream SSE.
    pub stream: bool,
    /// Final usage chunk.
    pub include_usage: bool,
    /// Structured output.
    pub response_format: ResponseFormat,
    /// Exact escalation asked for (`"escalation": "exact"`).
    pub escalation: bool,
}

/// Limits a request is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Vocabulary size (logit-bias ids).
    pub vocab: usize,
    /// Positions per session (largest `max_tokens`).
    pub ctx: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: Option<usize>,
    /// Whether requests may ask for exact escalation (the server drafts, or runs at the
    /// source precision: [`synapse_runtime::engine::EngineInfo::exact_available`]).
    pub exact: bool,
}

fn range_f(param: &'static str, v: Option<f64>, lo: f64, hi: f64, default: f64) -> Result<f32> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x as f32),
        Some(x) => Err(ServerError::invalid(
            param,
            format!("{param} must be in [{lo}, {hi}], not {x}"),
        )),
    }
}

/// A fresh random number (seeds of requests without one, response ids).
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Checks `req` and maps it to the engine's parameters.
pub fn validate(req: &GenerationRequest, api: Api, lim: Limits) -> Result<GenParams> {
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ServerError::Unsupported {
            param: "tools",
            message: "tools (function calling) are not supported by this server".into(),
        });
    }
    if req.echo == Some(true) {
        return Err(ServerError::Unsupported {
            param: "echo",
            message: "echo is not supported".into(),
        });
    }
    let max_tokens = match req.max_completion_tokens.or(req.max_tokens) {
        None => lim.default_max_tokens,
        Some(m) if m >= 1 && (m as u64) <= lim.ctx as u64 => Some(m as usize),
        Some(m) => {
            return Err(ServerError::invalid(
                "max_tokens",
                format!(
                    "max_tokens must be between 1 and the context size ({}), not {m}",
                    lim.ctx
                ),
            ));
        }
    };
    let n = match req.n {
        None => 1,
        Some(n) if (1..=MAX_N).contains(&n) => n as usize,
        Some(n) => {
            return Err(ServerError::invalid(
                "n",
                format!("n must be between 1 and {MAX_N}, not {n}"),
            ));
        }
    };
    let temperature = range_f("temperature", req.temperature, 0.0, 2.0, 1.0)?;
    let top_p = range_f("top_p", req.top_p, 0.0, 1.0, 1.0)?;
    if top_p <= 0.0 {
        return Err(ServerError::invalid(
            "top_p",
            "top_p must be greater than 0",
        ));
    }
    let presence_penalty = range_f("presence_penalty", req.presence_penalty, -2.0, 2.0, 0.0)?;
    let frequency_penalty = range_f("frequency_penalty", req.frequency_penalty, -2.0, 2.0, 0.0)?;
    let min_p = range_f("min_p", req.min_p, 0.0, 1.0, 0.0)?;
    let repeat_penalty = range_f(
        "repeat_penalty",
        req.repeat_penalty.or(req.repetition_penalty),
        0.0,
        10.0,
        1.0,
    )?;
    if repeat_penalty <= 0.0 {
        return Err(ServerError::invalid(
            "repeat_penalty",
            "repeat_penalty must be greater than 0",
        ));
    }
    let top_k = match req.top_k {
        None => 0,
        // vLLM's -1 means off, like llama.cpp's 0.
        Some(-1) => 0,
        Some(k) if k >= 0 && (k as u64) <= lim.vocab as u64 => k as usize,
        Some(k) if k > 0 => lim.vocab,
        Some(k) => {
            return Err(ServerError::invalid(
                "top_k",
                format!("top_k must be >= 0, not {k}"),
            ));
        }
    };
    let seed = req.seed.map(|s| s as u64).unwrap_or_else(random_u64);

    let mut logit_bias = Vec::new();
    if let Some(map) = &req.logit_bias {
        if map.len() > lim.vocab {
            return Err(ServerError::invalid("logit_bias", "too many entries"));
        }
        for (k, &v) in map {
            let id: u32 = k.trim().parse().map_err(|_| {
                ServerError::invalid(
                    "logit_bias",
                    format!("logit_bias keys must be token ids, not {k:?}"),
                )
            })?;
            if id as usize >= lim.vocab {
                return Err(ServerError::invalid(
                    "logit_bias",
                    format!("token id {id} is outside the vocabulary (0..{})", lim.vocab),
                ));
            }
            if !v.is_finite() || !(-100.0..=100.0).contains(&v) {
                return Err(ServerError::invalid(
                    "logit_bias",
                    format!("logit_bias values must be in [-100, 100], not {v}"),
                ));
            }
            logit_bias.push((id, v as f32));
        }
    }

    let stop = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(ServerError::invalid(
            "stop",
            format!("at most {MAX_STOP} stop strings"),
        ));
    }
    if stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ServerError::invalid(
            "stop",
            format!("stop strings are at most {MAX_STOP_BYTES} bytes"),
        ));
    }

    let top_logprobs = match req.top_logprobs {
        None => None,
        Some(k) if (0..=MAX_TOP_LOGPROBS).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ServerError::invalid(
                "top_logprobs",
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, not {k}"),
            ));
        }
    };
    let logprobs = match (api, req.logprobs) {
        (_, None) => None,
        (Api::Chat, Some(LogprobsField::Bool(false))) => None,
        (Api::Chat, Some(LogprobsField::Bool(true))) => Some(top_logprobs.unwrap_or(0)),
        (Api::Completions, Some(LogprobsField::Int(k))) if (0..=MAX_TOP_LOGPROBS).contains(&k) => {
            Some(k as usize)
        }
        (Api::Completions, Some(LogprobsField::Int(k))) => {
            return Err(ServerError::invalid(
                "logprobs",
                format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, not {k}"),
            ));
        }
        (Api::Completions, Some(LogprobsField::Bool(b))) => b.then_some(0),
        (Api::Chat, Some(LogprobsField::Int(_))) => {
            return Err(ServerError::invalid(
                "logprobs",
                "logprobs is a boolean in chat completions (use top_logprobs for the count)",
            ));
        }
    };

    let response_format = parse_response_format(req.response_format.as_ref())?;
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream
        && req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
    let escalation = match req.escalation.as_deref() {
        None | Some("off") => false,
        Some("exact") if lim.exact => true,
        Some("exact") => {
            return Err(ServerError::invalid(
                "escalation",
                "this server runs below the source precision without a draft profile (start \
                 it with --draft-profile or --draft-budget)"
                    .to_string(),
            ));
        }
        // Selective escalation (approximate) was evaluated against exact escalation on a
        // sealed prompt suite (`cargo xtask bench-selective`) and was dominated by it: it is
        // not offered here (a response would not be the model's own output for no gain).
        Some("selective") => {
            return Err(ServerError::invalid(
                "escalation",
                "selective escalation (approximate output) is not served: on the sealed \
                 evaluation suite it was slower than exact escalation at the same agreement; \
                 ask for \"exact\" (the model's own output, drafted)"
                    .to_string(),
            ));
        }
        Some(other) => {
            return Err(ServerError::invalid(
                "escalation",
                format!("escalation must be \"exact\" or \"off\", not {other:?}"),
            ));
        }
    };
    Ok(GenParams {
        max_tokens,
        sampling: SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty: repeat_penalty,
            presence_penalty,
            frequency_penalty,
            seed,
            ..SamplingParams::default()
        },
        logit_bias,
        stop,
        stop_at_eog: !req.ignore_eos.unwrap_or(false),
        logprobs,
        n,
        stream,
        include_usage,
        response_format,
        escalation,
    })
}

/// `response_format`: `text`, `json_object`, `json_schema` (with `json_schema.schema`).
pub fn parse_response_format(v: Option<&Value>) -> Result<ResponseFormat> {
    let Some(v) = v else {
        return Ok(ResponseFormat::Text);
    };
    if v.is_null() {
        return Ok(ResponseFormat::Text);
    }
    let bad = |m: &str| ServerError::invalid("response_format", m.to_string());
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("response_format needs a string `type`"))?;
    match kind {
        "text" => Ok(ResponseFormat::Text),
        "json_object" => Ok(ResponseFormat::Json(None)),
        "json_schema" => {
            let js = v
                .get("json_schema")
                .ok_or_else(|| bad("response_format json_schema needs `json_schema`"))?;
            // OpenAI nests it as json_schema.schema; accept a bare schema as well.
            let schema = js.get("schema").unwrap_or(js);
            if !schema.is_object() {
                return Err(bad("json_schema.schema must be a JSON object"));
            }
            Ok(ResponseFormat::Json(Some(schema.clone())))
        }
        other => Err(bad(&format!(
            "response_format type `{other}` is not supported (text, json_object, json_schema)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: Limits = Limits {
        vocab: 1000,
        ctx: 4096,
        default_max_tokens: None,
        exact: false,
    };

    fn check(api: Api, body: &str) -> Result<GenParams> {
        let r: GenerationRequest = serde_json::from_str(body).unwrap();
        validate(&r, api, LIM)
    }

    fn param_of(r: Result<GenParams>) -> String {
        match r {
            Err(ServerError::InvalidParam { param, .. }) => param.to_string(),
            Err(ServerError::Unsupported { param, .. }) => param.to_string(),
            other => panic!("expected a parameter error, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let p = check(Api::Completions, r#"{"prompt":"x","seed":7}"#).unwrap();
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.n, 1);
        assert_eq!(p.sampling.temperature, 1.0);
        assert_eq!(p.sampling.seed, 7);
        assert!(p.stop_at_eog);
        assert!(!p.stream);
        assert_eq!(p.response_format, ResponseFormat::Text);
    }

    #[test]
    fn domains_are_checked() {
        for (body, param) in [
            (r#"{"max_tokens":-1}"#, "max_tokens"),
            (r#"{"max_tokens":0}"#, "max_tokens"),
            (r#"{"max_tokens":1000000000000}"#, "max_tokens"),
            (r#"{"n":0}"#, "n"),
            (r#"{"n":1000}"#, "n"),
            (r#"{"temperature":2.5}"#, "temperature"),
            (r#"{"temperature":-0.1}"#, "temperature"),
            (r#"{"top_p":0}"#, "top_p"),
            (r#"{"logit_bias":{"abc":1}}"#, "logit_bias"),
            (r#"{"logit_bias":{"5000":1}}"#, "logit_bias"),
            (r#"{"logit_bias":{"5":200}}"#, "logit_bias"),
            (r#"{"logprobs":true,"top_logprobs":1000}"#, "top_logprobs"),
            (r#"{"tools":[{"type":"function"}]}"#, "tools"),
            (
                r#"{"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}"#,
                "stop",
            ),
            (r#"{"response_format":{"type":"yaml"}}"#, "response_format"),
            (
                r#"{"response_format":{"type":"json_schema","json_schema":{"schema":3}}}"#,
                "response_format",
            ),
        ] {
            assert_eq!(param_of(check(Api::Chat, body)), param, "{body}");
        }
        assert_eq!(
            param_of(check(Api::Completions, r#"{"logprobs":1000}"#)),
            "logprobs"
        );
        // Empty tools list is fine.
        assert!(check(Api::Chat, r#"{"tools":[]}"#).is_ok());
    }

    #[test]
    fn openai_names_map_to_the_engine() {
        let p = check(
            Api::Chat,
            r#"{"max_completion_tokens":5,"max_tokens":9,"temperature":0,"logprobs":true,
                "top_logprobs":3,"stop":["a"],"logit_bias":{"12":-100},"top_k":40,"min_p":0.05,
                "repeat_penalty":1.1,"ignore_eos":true,"stream":true,
                "stream_options":{"include_usage":true},
                "response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}"#,
        )
        .unwrap();
        assert_eq!(p.max_tokens, Some(5));
        assert_eq!(p.logprobs, Some(3));
        assert_eq!(p.logit_bias, vec![(12, -100.0)]);
        assert_eq!(p.sampling.top_k, 40);
        assert!(!p.stop_at_eog);
        assert!(p.include_usage);
        assert_eq!(
            p.response_format,
            ResponseFormat::Json(Some(serde_json::json!({"type":"object"})))
        );
        let c = check(Api::Completions, r#"{"logprobs":2}"#).unwrap();
        assert_eq!(c.logprobs, Some(2));
        let j = check(Api::Chat, r#"{"response_format":{"type":"json_object"}}"#).unwrap();
        assert_eq!(j.response_format, ResponseFormat::Json(None));
    }
}
