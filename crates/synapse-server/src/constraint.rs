//! Structured outputs: `response_format` → an llguidance grammar → an engine
//! [`Constraint`].
//!
//! The token trie (`toktrie`) is built once per server from the tokenizer's vocabulary (each
//! token's bytes from `token_to_piece(id, true)`; control tokens carry toktrie's special
//! marker byte so no grammar matches them as text), and so is llguidance's
//! [`ParserFactory`] (its token-slice tables cost about a second on a 262k vocabulary). Each
//! request compiles its schema to a [`TokenParser`] before it is submitted (an invalid schema
//! is a 400), and the engine drives a [`Matcher`] per session: `mask` sets every disallowed
//! logit to `-inf`, `commit` consumes the sampled token.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{JsonCompileOptions, Matcher, ParserFactory, TokenParser};
use serde_json::Value;
use synapse_runtime::engine::Constraint;
use synapse_tokenizer::Tokenizer;
use toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::{Result, ServerError};

/// The tokenizer as llguidance sees it.
struct SynapseTokEnv {
    tok: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for SynapseTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let text = String::from_utf8_lossy(s);
        self.tok.encode(&text, false, false).unwrap_or_default()
    }
}

/// What a structured-output request compiles against: the trie and the parser factory.
pub struct Grammars {
    factory: ParserFactory,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl Grammars {
    /// Builds the token trie and the parser factory for `tok` (slow: call once).
    pub fn new(tok: Arc<Tokenizer>) -> Result<Self> {
        let n = tok.vocab_size();
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let piece = tok.token_to_piece(id, true).unwrap_or_default();
            if tok.is_control(id) {
                let mut w = Vec::with_capacity(piece.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(piece);
                words.push(w);
            } else {
                words.push(piece.to_vec());
            }
        }
        let eos = tok.eot().or(tok.eos()).unwrap_or(0);
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: eos,
            tok_bos: tok.bos(),
            tok_pad: tok.pad(),
            tok_unk: tok.unk(),
            tok_end_of_turn: tok.eot(),
        };
        let trie = TokTrie::from(&info, &words);
        let eog = tok.stop_tokens();
        let env: TokEnv = Arc::new(SynapseTokEnv { tok, trie });
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| ServerError::Internal(format!("llguidance: {e}")))?;
        factory.quiet();
        Ok(Grammars { factory, eog })
    }

    /// Compiles a JSON schema (OpenAI's `json_schema.schema`; `None`: any JSON object).
    pub fn json_constraint(&self, schema: Option<&Value>) -> Result<Box<dyn Constraint>> {
        let spec = serde_json::json!({ "json_schema": schema }).to_string();
        let mut schema = match schema {
            None => serde_json::json!({"type": "object"}),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => {
                return Err(ServerError::invalid(
                    "response_format",
                    "json_schema.schema must be a JSON object",
                ));
            }
        };
        if schema.get("x-guidance").is_none() {
            // Compact JSON: a small model left free whitespace tends to emit it forever.
            JsonCompileOptions {
                whitespace_flexible: false,
                ..JsonCompileOptions::default()
            }
            .apply_to(&mut schema);
        }
        let grammar = TopLevelGrammar::from_json_schema(schema);
        let parser: TokenParser =
            std::panic::catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
                .map_err(|_| {
                    ServerError::invalid("response_format", "the schema could not be compiled")
                })?
                .map_err(|e| {
                    ServerError::invalid("response_format", format!("invalid schema: {e}"))
                })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ServerError::invalid(
                "response_format",
                format!("invalid schema: {e}"),
            ));
        }
        Ok(Box::new(GrammarConstraint {
            matcher,
            eog: self.eog.clone(),
            spec,
        }))
    }

    /// Compiles a constraint again from its [`Constraint::spec`] (a cluster worker serving
    /// a structured-output request routed to it).
    pub fn from_spec(&self, spec: &str) -> Result<Box<dyn Constraint>> {
        let v: Value = serde_json::from_str(spec).map_err(|e| {
            ServerError::invalid("response_format", format!("constraint spec: {e}"))
        })?;
        match v.get("json_schema") {
            Some(Value::Null) => self.json_constraint(None),
            Some(s) => self.json_constraint(Some(s)),
            None => Err(ServerError::invalid(
                "response_format",
                "constraint spec without json_schema",
            )),
        }
    }
}

/// One session's grammar state.
struct GrammarConstraint {
    matcher: Matcher,
    eog: Vec<u32>,
    /// `{"json_schema": <schema or null>}`, what [`Grammars::from_spec`] compiles again.
    spec: String,
}

impl Constraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), String> {
        let accepting = self.matcher.is_accepting().map_err(|e| e.to_string())?;
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let n = allowed.len();
        for (i, l) in logits.iter_mut().enumerate() {
            if i >= n || !allowed.is_allowed(i as TokenId) {
                // Any end-of-generation token ends an accepted output (the trie knows one EOS).
                if accepting && self.eog.contains(&(i as u32)) {
                    continue;
                }
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> std::result::Result<bool, String> {
        if self.eog.contains(&token) && self.matcher.is_accepting().unwrap_or(false) {
            return Ok(true);
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| e.to_string())?;
        Ok(self.matcher.is_stopped())
    }

    fn spec(&self) -> Option<String> {
        Some(self.spec.clone())
    }
}
