//! OpenAI's wire types, as much of them as the server speaks.
//!
//! Requests are parsed leniently: unknown fields are ignored, `null` is the same as absent,
//! and the fields OpenAI lets take several shapes (`prompt`, `stop`, message `content`,
//! `logprobs`) accept each of them. Shapes are checked here; domains (ranges, vocabulary
//! ids) in [`crate::params`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The body of `/v1/completions` and `/v1/chat/completions` (one type: the two share all but
/// `prompt` / `messages` and the shape of `logprobs`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct GenerationRequest {
    /// Model name (absent: the default model).
    pub model: Option<String>,
    /// Completions: the prompt(s).
    pub prompt: Option<Prompt>,
    /// Chat: the conversation.
    pub messages: Option<Vec<ChatMessage>>,
    /// Most tokens to generate (legacy name).
    pub max_tokens: Option<i64>,
    /// Most tokens to generate (chat's newer name; wins over `max_tokens`).
    pub max_completion_tokens: Option<i64>,
    /// Softmax temperature, 0..=2.
    pub temperature: Option<f64>,
    /// Nucleus sampling, (0, 1].
    pub top_p: Option<f64>,
    /// Choices per prompt.
    pub n: Option<i64>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Completions: number of top alternatives (int); chat: whether to return logprobs (bool).
    pub logprobs: Option<LogprobsField>,
    /// Chat: number of top alternatives per token.
    pub top_logprobs: Option<i64>,
    /// Stop string(s).
    pub stop: Option<Stop>,
    /// OpenAI presence penalty, -2..=2.
    pub presence_penalty: Option<f64>,
    /// OpenAI frequency penalty, -2..=2.
    pub frequency_penalty: Option<f64>,
    /// Token id (as a string) → bias added to its logit, -100..=100.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// End-user id (logged only).
    pub user: Option<String>,
    /// Completions: echo the prompt (not supported beyond `false`).
    pub echo: Option<bool>,
    /// Structured outputs.
    pub response_format: Option<Value>,
    /// Tools (not supported: a non-empty list is refused).
    pub tools: Option<Vec<Value>>,
    /// llama.cpp / vLLM: top-k (0: off).
    pub top_k: Option<i64>,
    /// llama.cpp / vLLM: min-p.
    pub min_p: Option<f64>,
    /// llama.cpp: repetition penalty (1: off).
    pub repeat_penalty: Option<f64>,
    /// vLLM's name for `repeat_penalty`.
    pub repetition_penalty: Option<f64>,
    /// llama.cpp / vLLM: keep going after end-of-generation tokens.
    pub ignore_eos: Option<bool>,
    /// Synapse: `"exact"` — tokens drafted by the server's draft profile and verified by the
    /// served precision (the same output as without, possibly sooner); `"off"` (default).
    pub escalation: Option<String>,
    /// Synapse: the precision the request accepts — `"source"` (every weight in its source
    /// encoding) or a profile hash as `/v1/models` lists it (`meta.profile`). A server running
    /// another profile answers 400 instead of serving it at that one (profiles are not
    /// resident side by side under a budget). Every response names the profile it ran
    /// (`precision_profile`).
    pub precision: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    /// Send a final chunk with usage and no choices.
    pub include_usage: Option<bool>,
}

/// `logprobs`: an int (completions) or a bool (chat).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum LogprobsField {
    /// Chat's form.
    Bool(bool),
    /// Completions' form.
    Int(i64),
}

/// `prompt`: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts (one set of choices each).
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// One prompt, text or tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptItem {
    /// Text, to be tokenized.
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The prompts this field holds.
    pub fn items(self) -> Vec<PromptItem> {
        match self {
            Prompt::Text(s) => vec![PromptItem::Text(s)],
            Prompt::Texts(v) => v.into_iter().map(PromptItem::Text).collect(),
            Prompt::Tokens(t) => vec![PromptItem::Tokens(t)],
            Prompt::TokenLists(v) => v.into_iter().map(PromptItem::Tokens).collect(),
        }
    }
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Stop {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings, empty ones dropped.
    pub fn into_vec(self) -> Vec<String> {
        let v = match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        };
        v.into_iter().filter(|s| !s.is_empty()).collect()
    }
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant`, …
    pub role: String,
    /// The text (absent for e.g. an assistant turn that only called tools).
    #[serde(default)]
    pub content: Option<Content>,
}

/// A message's `content`: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One content part (`{"type": "text", "text": ...}`; other types are refused).
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

/// `POST /v1/precision`'s body: the weight budget to run at (Synapse's extension).
#[derive(Debug, Deserialize)]
pub struct PrecisionRequest {
    /// Bytes (`188743680`), with a unit (`"180MB"`, `"180MiB"`), or a share of the source's
    /// weight bytes (`"75%"`).
    pub budget: serde_json::Value,
}

/// `/tokenize`'s body (llama-server's shape).
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    /// Text to tokenize.
    pub content: String,
    /// Add BOS (and EOS where the model does).
    #[serde(default)]
    pub add_special: bool,
}

/// `/tokenize`'s answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// `/detokenize`'s body.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// `/detokenize`'s answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The text.
    pub content: String,
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Details of the prompt tokens.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// Completions' `logprobs` object.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    pub token_logprobs: Vec<f32>,
    /// Per token: the most likely alternatives, text → log-probability.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Per token: its byte offset in the completion text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends `other` (a later part of the same completion).
    pub fn extend(&mut self, other: CompletionLogprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}

/// Chat's `logprobs` object.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// One token of chat's `logprobs.content`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// One alternative of [`ChatTokenLogprob::top_logprobs`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> GenerationRequest {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn prompt_takes_every_openai_shape() {
        assert_eq!(
            parse(r#"{"prompt":"hi"}"#).prompt.unwrap().items(),
            vec![PromptItem::Text("hi".into())]
        );
        assert_eq!(
            parse(r#"{"prompt":["a","b"]}"#)
                .prompt
                .unwrap()
                .items()
                .len(),
            2
        );
        assert_eq!(
            parse(r#"{"prompt":[1,2,3]}"#).prompt.unwrap().items(),
            vec![PromptItem::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(
            parse(r#"{"prompt":[[1,2],[3]]}"#).prompt.unwrap().items(),
            vec![PromptItem::Tokens(vec![1, 2]), PromptItem::Tokens(vec![3])]
        );
        assert!(serde_json::from_str::<GenerationRequest>(r#"{"prompt":[-1]}"#).is_err());
        assert!(serde_json::from_str::<GenerationRequest>(r#"{"prompt":{"a":1}}"#).is_err());
    }

    #[test]
    fn unknown_fields_and_nulls_are_ignored() {
        let r = parse(
            r#"{"model":null,"prompt":"x","frobnicate":{"deep":[1]},"temperature":null,
                "stop":null,"logit_bias":{"12":-100}}"#,
        );
        assert!(r.model.is_none());
        assert!(r.temperature.is_none());
        assert_eq!(r.logit_bias.unwrap()["12"], -100.0);
    }

    #[test]
    fn stop_logprobs_and_content_shapes() {
        assert_eq!(
            parse(r#"{"stop":"\n"}"#).stop.unwrap().into_vec(),
            vec!["\n"]
        );
        assert_eq!(
            parse(r#"{"stop":["a","","b"]}"#).stop.unwrap().into_vec(),
            vec!["a", "b"]
        );
        assert_eq!(
            parse(r#"{"logprobs":true}"#).logprobs,
            Some(LogprobsField::Bool(true))
        );
        assert_eq!(
            parse(r#"{"logprobs":3}"#).logprobs,
            Some(LogprobsField::Int(3))
        );
        let r = parse(
            r#"{"messages":[{"role":"system","content":"s"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null}]}"#,
        );
        let m = r.messages.unwrap();
        assert_eq!(m.len(), 3);
        assert!(matches!(m[1].content, Some(Content::Parts(ref p)) if p.len() == 2));
        assert!(m[2].content.is_none());
    }
}
