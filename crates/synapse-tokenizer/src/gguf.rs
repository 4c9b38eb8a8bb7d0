//! Building a [`Tokenizer`] from a GGUF file's `tokenizer.ggml.*` metadata.

use crate::error::{Result, TokenizerError};
use crate::tokenizer::Tokenizer;
use crate::vocab::{ModelKind, SpecialIds, StrList, Vocab, VocabView};
use std::borrow::Cow;
use synapse_formats::gguf::{GgufArray, GgufFile, GgufValue};

fn invalid(key: &str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidKey {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn get_str<'a>(f: &'a GgufFile, key: &str) -> Result<Option<&'a str>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| invalid(key, "expected a string")),
    }
}

fn get_bool(f: &GgufFile, key: &str) -> Result<Option<bool>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| invalid(key, "expected a bool")),
    }
}

fn get_id(f: &GgufFile, key: &str) -> Result<Option<u32>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => {
            let x = v
                .as_i64()
                .ok_or_else(|| invalid(key, "expected an integer"))?;
            // A negative or huge id is "no token", as in llama.cpp (out of range is ignored).
            Ok(u32::try_from(x).ok())
        }
    }
}

fn get_strings<'a>(f: &'a GgufFile, key: &str) -> Result<Option<StrList<'a>>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_strings()
            .map(|s| Some(StrList::Gguf(s)))
            .ok_or_else(|| invalid(key, "expected an array of strings")),
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    ///
    /// The vocabulary is read in place from the file's metadata: no copy of the token list is
    /// made on the way.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let (vocab, template) = vocab_view_from_gguf(f)?;
        Self::build(vocab, template.map(str::to_string))
    }
}

/// Reads the vocabulary (and chat template) out of GGUF metadata.
pub fn vocab_from_gguf(f: &GgufFile) -> Result<(Vocab, Option<String>)> {
    let (v, template) = vocab_view_from_gguf(f)?;
    Ok((v.to_vocab(), template.map(str::to_string)))
}

/// [`vocab_from_gguf`], borrowing the strings from the file's metadata.
fn vocab_view_from_gguf(f: &GgufFile) -> Result<(VocabView<'_>, Option<&str>)> {
    let model_name =
        get_str(f, "tokenizer.ggml.model")?.ok_or_else(|| TokenizerError::MissingKey {
            key: "tokenizer.ggml.model".into(),
        })?;
    let model =
        ModelKind::from_gguf_name(model_name).ok_or_else(|| TokenizerError::UnsupportedModel {
            model: model_name.to_string(),
        })?;
    let pre = get_str(f, "tokenizer.ggml.pre")?;
    let tokens =
        get_strings(f, "tokenizer.ggml.tokens")?.ok_or_else(|| TokenizerError::MissingKey {
            key: "tokenizer.ggml.tokens".into(),
        })?;
    let mut scores = Cow::Borrowed(&[][..]);
    if let Some(s) = f.get("tokenizer.ggml.scores") {
        let arr = s
            .as_array()
            .ok_or_else(|| invalid("tokenizer.ggml.scores", "expected an array"))?;
        scores = match arr {
            GgufArray::F32(x) => Cow::Borrowed(&x[..]),
            GgufArray::I32(x) => Cow::Owned(x.iter().map(|&i| i as f32).collect()),
            _ => {
                return Err(invalid(
                    "tokenizer.ggml.scores",
                    "expected f32 or i32 elements",
                ));
            }
        };
    }
    let mut token_types = &[][..];
    if let Some(t) = f.get("tokenizer.ggml.token_type") {
        token_types = t
            .as_i32s()
            .ok_or_else(|| invalid("tokenizer.ggml.token_type", "expected i32 elements"))?;
    }
    let mut merges = StrList::Strings(&[]);
    if matches!(model, ModelKind::Bpe | ModelKind::Gemma4) {
        merges =
            get_strings(f, "tokenizer.ggml.merges")?.ok_or_else(|| TokenizerError::MissingKey {
                key: "tokenizer.ggml.merges".into(),
            })?;
    }
    let id = |k: &str| get_id(f, &format!("tokenizer.ggml.{k}"));
    let special = SpecialIds {
        bos: id("bos_token_id")?,
        eos: id("eos_token_id")?,
        eot: id("eot_token_id")?,
        eom: id("eom_token_id")?,
        unk: id("unknown_token_id")?,
        sep: id("seperator_token_id")?,
        pad: id("padding_token_id")?,
        mask: id("mask_token_id")?,
        fim_pre: id("fim_pre_token_id")?.or(id("prefix_token_id")?),
        fim_suf: id("fim_suf_token_id")?.or(id("suffix_token_id")?),
        fim_mid: id("fim_mid_token_id")?.or(id("middle_token_id")?),
        fim_pad: id("fim_pad_token_id")?,
        fim_rep: id("fim_rep_token_id")?,
        fim_sep: id("fim_sep_token_id")?,
    };
    let v = VocabView {
        model,
        pre,
        tokens,
        scores,
        token_types,
        merges,
        special,
        add_bos: get_bool(f, "tokenizer.ggml.add_bos_token")?,
        add_eos: get_bool(f, "tokenizer.ggml.add_eos_token")?,
        add_space_prefix: get_bool(f, "tokenizer.ggml.add_space_prefix")?,
        model_name: get_str(f, "general.name")?,
    };
    let template = match f.get("tokenizer.chat_template") {
        Some(GgufValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    Ok((v, template))
}
