//! The plain vocabulary data a tokenizer is built from, whatever file it came from.
//!
//! [`Vocab`] mirrors the `tokenizer.ggml.*` metadata of a GGUF file: it holds data only, no
//! indexes. [`crate::Tokenizer::new`] resolves the defaults the way llama.cpp does and builds
//! the lookup tables.

use std::borrow::Cow;

use synapse_formats::gguf::{GgufStrings, GgufStringsIter};

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp numbers them.
pub mod token_type {
    /// Undefined.
    pub const UNDEFINED: i32 = 0;
    /// Normal text piece.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// Control token (BOS, EOS, turn markers).
    pub const CONTROL: i32 = 3;
    /// User-defined token: matched in text before the model's algorithm runs.
    pub const USER_DEFINED: i32 = 4;
    /// Unused slot.
    pub const UNUSED: i32 = 5;
    /// Byte-fallback token `<0xXX>`.
    pub const BYTE: i32 = 6;
}

/// The tokenizer algorithm family (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// `llama`: SentencePiece-style vocabulary, llama.cpp's score-driven pair merging with byte
    /// fallback (Llama 2, Gemma 1–3, Phi-3).
    Spm,
    /// `gpt2`: byte-level BPE with a regex pre-tokenizer (Llama 3, Qwen2, GPT-2, …).
    Bpe,
    /// `gemma4`: BPE merges over raw UTF-8 with spaces escaped to `▁` and `<0xXX>` byte fallback.
    Gemma4,
}

impl ModelKind {
    /// Parses a `tokenizer.ggml.model` value.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Self::Spm),
            "gpt2" => Some(Self::Bpe),
            "gemma4" => Some(Self::Gemma4),
            _ => None,
        }
    }
}

/// Special token ids as stored in the metadata (`None` = key absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// A list of strings borrowed from a [`Vocab`]'s `Vec<String>` or from a GGUF file's compact
/// string array (which holds no `String`s to borrow).
#[derive(Debug, Clone, Copy)]
pub(crate) enum StrList<'a> {
    /// A [`Vocab`] field.
    Strings(&'a [String]),
    /// A GGUF metadata array.
    Gguf(&'a GgufStrings),
}

impl<'a> StrList<'a> {
    pub(crate) fn len(self) -> usize {
        match self {
            StrList::Strings(v) => v.len(),
            StrList::Gguf(v) => v.len(),
        }
    }

    pub(crate) fn iter(self) -> StrIter<'a> {
        match self {
            StrList::Strings(v) => StrIter::Strings(v.iter()),
            StrList::Gguf(v) => StrIter::Gguf(v.iter()),
        }
    }

    pub(crate) fn to_vec(self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }
}

/// [`StrList::iter`].
#[derive(Debug, Clone)]
pub(crate) enum StrIter<'a> {
    Strings(std::slice::Iter<'a, String>),
    Gguf(GgufStringsIter<'a>),
}

impl<'a> Iterator for StrIter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        match self {
            StrIter::Strings(i) => i.next().map(String::as_str),
            StrIter::Gguf(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            StrIter::Strings(i) => i.size_hint(),
            StrIter::Gguf(i) => i.size_hint(),
        }
    }
}

impl ExactSizeIterator for StrIter<'_> {}

/// A [`Vocab`] borrowed from wherever it lives (a [`Vocab`] or a GGUF file's metadata), so a
/// tokenizer can be built without first copying a few hundred thousand strings.
#[derive(Debug, Clone)]
pub(crate) struct VocabView<'a> {
    pub(crate) model: ModelKind,
    pub(crate) pre: Option<&'a str>,
    pub(crate) tokens: StrList<'a>,
    pub(crate) scores: Cow<'a, [f32]>,
    pub(crate) token_types: &'a [i32],
    pub(crate) merges: StrList<'a>,
    pub(crate) special: SpecialIds,
    pub(crate) add_bos: Option<bool>,
    pub(crate) add_eos: Option<bool>,
    pub(crate) add_space_prefix: Option<bool>,
    pub(crate) model_name: Option<&'a str>,
}

impl VocabView<'_> {
    /// An owned copy.
    pub(crate) fn to_vocab(&self) -> Vocab {
        Vocab {
            model: self.model,
            pre: self.pre.map(str::to_string),
            tokens: self.tokens.to_vec(),
            scores: self.scores.to_vec(),
            token_types: self.token_types.to_vec(),
            merges: self.merges.to_vec(),
            special: self.special.clone(),
            add_bos: self.add_bos,
            add_eos: self.add_eos,
            add_space_prefix: self.add_space_prefix,
            model_name: self.model_name.map(str::to_string),
        }
    }
}

/// A vocabulary: what `tokenizer.ggml.*` holds, before any defaults are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocab {
    /// The algorithm family.
    pub model: ModelKind,
    /// `tokenizer.ggml.pre` (BPE pre-tokenizer name); `None` when absent.
    pub pre: Option<String>,
    /// Token texts, indexed by id.
    pub tokens: Vec<String>,
    /// Scores (SPM merge priority); empty means all zero.
    pub scores: Vec<f32>,
    /// GGUF token types (see [`token_type`]); empty means all normal.
    pub token_types: Vec<i32>,
    /// BPE merges, `"left right"`, in rank order.
    pub merges: Vec<String>,
    /// Special ids from the metadata.
    pub special: SpecialIds,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `general.name` (llama.cpp keys a few per-model token attributes on it, e.g. Phi-3).
    pub model_name: Option<String>,
}

impl Vocab {
    /// A borrowed view of this vocabulary (what the tokenizer is built from).
    pub(crate) fn view(&self) -> VocabView<'_> {
        VocabView {
            model: self.model,
            pre: self.pre.as_deref(),
            tokens: StrList::Strings(&self.tokens),
            scores: Cow::Borrowed(&self.scores),
            token_types: &self.token_types,
            merges: StrList::Strings(&self.merges),
            special: self.special.clone(),
            add_bos: self.add_bos,
            add_eos: self.add_eos,
            add_space_prefix: self.add_space_prefix,
            model_name: self.model_name.as_deref(),
        }
    }

    /// An empty vocabulary of the given kind (fill the fields, then build a tokenizer).
    pub fn new(model: ModelKind) -> Self {
        Self {
            model,
            pre: None,
            tokens: Vec::new(),
            scores: Vec::new(),
            token_types: Vec::new(),
            merges: Vec::new(),
            special: SpecialIds::default(),
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            model_name: None,
        }
    }
}
