//! Building a [`Tokenizer`] from a Hugging Face `tokenizer.json` (safetensors checkpoints).
//!
//! The file is mapped onto the same [`Vocab`] the GGUF path produces, the way llama.cpp's
//! `convert_hf_to_gguf.py` does it, so both sources run the same engine:
//! - `model.type == "BPE"` with a `ByteLevel` pre-tokenizer → byte-level BPE; the
//!   pre-tokenizer's split regex picks the llama.cpp pre-type (Llama 3, Qwen2, GPT-2 patterns).
//! - `model.type == "BPE"` with `byte_fallback` and a `▁` replace normalizer → SPM-style
//!   (scores = −rank, as the converter writes them, `<0xXX>` byte tokens).
//! - `added_tokens` become control (`special: true`) or user-defined tokens.
//!
//! Other tokenizer.json shapes (Unigram, WordPiece) are a typed error.

use crate::error::{Result, TokenizerError};
use crate::tokenizer::Tokenizer;
use crate::vocab::{ModelKind, Vocab, token_type};
use serde_json::Value;
use std::path::Path;

fn bad(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::HfJson(msg.into())
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", path.display())))
}

/// The split regexes transformers' Llama 3 / Qwen2 / GPT-2 tokenizer.json files carry, and the
/// llama.cpp pre-type each one means.
fn pre_from_pattern(pattern: &str) -> Option<&'static str> {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT2: &str =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    match pattern {
        LLAMA3 => Some("llama-bpe"),
        QWEN2 => Some("qwen2"),
        GPT2 => Some("gpt-2"),
        _ => None,
    }
}

fn find_split_pattern(pre: &Value) -> Option<String> {
    match pre.get("type")?.as_str()? {
        "Sequence" => pre
            .get("pretokenizers")?
            .as_array()?
            .iter()
            .find_map(find_split_pattern),
        "Split" => pre
            .get("pattern")?
            .get("Regex")?
            .as_str()
            .map(str::to_string),
        _ => None,
    }
}

fn has_type(v: &Value, key: &str, ty: &str) -> bool {
    match v.get("type").and_then(Value::as_str) {
        Some(t) if t == ty => true,
        Some("Sequence") => v
            .get(key)
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| has_type(x, key, ty))),
        _ => false,
    }
}

impl Tokenizer {
    /// Builds a tokenizer from a HF `tokenizer.json`; `tokenizer_config.json` beside it (if
    /// present) supplies `add_bos_token`/`add_eos_token`, the BOS/EOS strings and the chat
    /// template.
    pub fn from_hf_tokenizer_json(path: &Path) -> Result<Self> {
        let j = read_json(path)?;
        let config = path
            .parent()
            .map(|d| d.join("tokenizer_config.json"))
            .filter(|p| p.exists())
            .map(|p| read_json(&p))
            .transpose()?;
        let (vocab, template) = vocab_from_hf_json(&j, config.as_ref())?;
        Self::with_template(vocab, template)
    }

    /// [`Tokenizer::from_hf_tokenizer_json`] from bytes already in memory (e.g. the
    /// `tokenizer.json` and `tokenizer_config.json` objects of a Synapse package).
    pub fn from_hf_tokenizer_json_bytes(
        tokenizer_json: &[u8],
        tokenizer_config: Option<&[u8]>,
    ) -> Result<Self> {
        let parse = |what: &str, b: &[u8]| -> Result<Value> {
            serde_json::from_slice(b).map_err(|e| bad(format!("{what}: {e}")))
        };
        let j = parse("tokenizer.json", tokenizer_json)?;
        let config = tokenizer_config
            .map(|b| parse("tokenizer_config.json", b))
            .transpose()?;
        let (vocab, template) = vocab_from_hf_json(&j, config.as_ref())?;
        Self::with_template(vocab, template)
    }
}

/// Maps a parsed `tokenizer.json` (and optional `tokenizer_config.json`) onto a [`Vocab`].
pub fn vocab_from_hf_json(j: &Value, config: Option<&Value>) -> Result<(Vocab, Option<String>)> {
    let model = j.get("model").ok_or_else(|| bad("no `model`"))?;
    let mtype = model.get("type").and_then(Value::as_str).unwrap_or("");
    if mtype != "BPE" {
        return Err(bad(format!(
            "model type `{mtype}` not supported (BPE only)"
        )));
    }
    let vocab_map = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no `model.vocab`"))?;
    let added = j
        .get("added_tokens")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut n = 0usize;
    for id in vocab_map.values().filter_map(Value::as_u64) {
        n = n.max(id as usize + 1);
    }
    for t in &added {
        if let Some(id) = t.get("id").and_then(Value::as_u64) {
            n = n.max(id as usize + 1);
        }
    }
    if n > (1 << 24) {
        return Err(bad(format!("vocabulary of {n} entries is implausible")));
    }
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![token_type::NORMAL; n];
    for (text, id) in vocab_map {
        let id = id.as_u64().ok_or_else(|| bad("non-integer id"))? as usize;
        tokens[id] = Some(text.clone());
    }
    for t in &added {
        let (Some(id), Some(content)) = (
            t.get("id").and_then(Value::as_u64),
            t.get("content").and_then(Value::as_str),
        ) else {
            continue;
        };
        let special = t.get("special").and_then(Value::as_bool).unwrap_or(false);
        tokens[id as usize] = Some(content.to_string());
        types[id as usize] = if special {
            token_type::CONTROL
        } else {
            token_type::USER_DEFINED
        };
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();
    for (i, t) in tokens.iter().enumerate() {
        if t.starts_with("[PAD") && !vocab_map.contains_key(t) {
            types[i] = token_type::UNUSED;
        }
    }
    let merges: Vec<String> = model
        .get("merges")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|m| match m {
                    Value::String(s) => Some(s.clone()),
                    Value::Array(p) if p.len() == 2 => {
                        Some(format!("{} {}", p[0].as_str()?, p[1].as_str()?))
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();

    let byte_fallback = model
        .get("byte_fallback")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let pre = j.get("pre_tokenizer").cloned().unwrap_or(Value::Null);
    let normalizer = j.get("normalizer").cloned().unwrap_or(Value::Null);
    let mut v;
    if has_type(&pre, "pretokenizers", "ByteLevel") {
        v = Vocab::new(ModelKind::Bpe);
        let pattern = find_split_pattern(&pre);
        let pre_name = match pattern.as_deref() {
            Some(p) => pre_from_pattern(p)
                .ok_or_else(|| bad(format!("unknown pre-tokenizer split regex `{p}`")))?,
            None => "gpt-2",
        };
        v.pre = Some(pre_name.to_string());
        v.tokens = tokens;
        v.token_types = types;
        v.merges = merges;
    } else if byte_fallback
        && (has_type(&normalizer, "normalizers", "Replace")
            || has_type(&pre, "pretokenizers", "Metaspace"))
    {
        // SentencePiece BPE exported by transformers: llama.cpp's converter writes it as an SPM
        // vocabulary whose scores are -rank of the merge that creates each token.
        v = Vocab::new(ModelKind::Spm);
        let mut scores = vec![0.0f32; tokens.len()];
        for (i, t) in tokens.iter().enumerate() {
            if t.len() == 6 && t.starts_with("<0x") && t.ends_with('>') {
                types[i] = token_type::BYTE;
            }
            scores[i] = -(i as f32);
        }
        v.scores = scores;
        v.tokens = tokens;
        v.token_types = types;
        let prepend = has_type(&normalizer, "normalizers", "Prepend");
        v.add_space_prefix = Some(prepend);
    } else {
        return Err(bad(
            "BPE tokenizer without ByteLevel or SentencePiece-style normalizer",
        ));
    }

    let mut template = None;
    if let Some(c) = config {
        v.add_bos = c.get("add_bos_token").and_then(Value::as_bool);
        v.add_eos = c.get("add_eos_token").and_then(Value::as_bool);
        let tok_str = |k: &str| -> Option<String> {
            match c.get(k)? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        let id_of = |s: Option<String>| {
            s.and_then(|s| v.tokens.iter().position(|t| *t == s))
                .map(|i| i as u32)
        };
        v.special.bos = id_of(tok_str("bos_token"));
        v.special.eos = id_of(tok_str("eos_token"));
        v.special.unk = id_of(tok_str("unk_token"));
        v.special.pad = id_of(tok_str("pad_token"));
        template = match c.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        };
    }
    Ok((v, template))
}
