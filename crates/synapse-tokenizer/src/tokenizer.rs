//! [`Tokenizer`]: a [`Vocab`] with llama.cpp's defaults resolved and its lookup tables built.

use crate::bytes::{byte_to_char_table, char_to_byte};
use crate::error::{Result, TokenizerError};
use crate::pretokenize::{PreSpec, PreTokenizer, pre_spec};
use crate::special::{Fragment, SpecialMatcher, partition};
use crate::tables::{MergeRanks, PackedBytes, PackedStrs, TextIndex};
use crate::vocab::{ModelKind, Vocab, VocabView, token_type};
use crate::{bpe, spm};
use std::collections::BTreeSet;
use std::io::Write as _;

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub mod attr {
    /// The unknown token.
    pub const UNKNOWN: u32 = 1 << 0;
    /// Unused slot.
    pub const UNUSED: u32 = 1 << 1;
    /// Normal text piece.
    pub const NORMAL: u32 = 1 << 2;
    /// Control token.
    pub const CONTROL: u32 = 1 << 3;
    /// User-defined token.
    pub const USER_DEFINED: u32 = 1 << 4;
    /// Byte-fallback token.
    pub const BYTE: u32 = 1 << 5;
    /// Strip whitespace left of the token when it is matched in text.
    pub const LSTRIP: u32 = 1 << 7;
    /// Strip whitespace right of the token when it is matched in text.
    pub const RSTRIP: u32 = 1 << 8;
}

/// Resolved special token ids (`None`: the vocabulary has none).
#[derive(Debug, Clone, Default)]
struct Specials {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    fim: [Option<u32>; 6],
}

/// A tokenizer with exactly llama.cpp's behaviour for SPM (`llama`), byte-level BPE (`gpt2`) and
/// SPM-style BPE (`gemma4`) vocabularies.
///
/// The vocabulary is held once, compactly (see `tables`): all token texts in one buffer indexed
/// by id, a hash table of ids for text → id, scores and attributes in parallel vectors, and the
/// detokenizer's pieces in a second buffer.
#[derive(Debug)]
pub struct Tokenizer {
    kind: ModelKind,
    /// Token texts by id.
    texts: PackedStrs,
    /// Scores by id; empty when the vocabulary has none (all zero).
    scores: Vec<f32>,
    /// Attribute bits ([`attr`]) by id.
    attrs: Vec<u32>,
    /// Text → id over `texts`.
    index: TextIndex,
    bpe_ranks: MergeRanks,
    pre: Option<PreTokenizer>,
    pre_name: String,
    byte_encode: bool,
    byte_table: [char; 256],
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    ignore_merges: bool,
    escape_whitespaces: bool,
    specials: Specials,
    eog: BTreeSet<u32>,
    special_cache: Vec<u32>,
    special_matcher: SpecialMatcher,
    /// The bytes each token stands for (`token_to_piece` with `special = true`), by id.
    pieces: PackedBytes,
    chat_template: Option<String>,
}

const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_NAMES: [&[&str]; 6] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

impl Tokenizer {
    /// Builds a tokenizer from vocabulary data, applying llama.cpp's defaults and its
    /// text-based special-token detection (EOT/EOG/FIM markers become control tokens).
    pub fn new(vocab: Vocab) -> Result<Self> {
        Self::with_template(vocab, None)
    }

    /// Like [`Tokenizer::new`], keeping the model's chat template alongside.
    pub fn with_template(vocab: Vocab, chat_template: Option<String>) -> Result<Self> {
        Self::build(vocab.view(), chat_template)
    }

    /// Builds the tables from a borrowed vocabulary (the one construction path).
    pub(crate) fn build(vocab: VocabView<'_>, chat_template: Option<String>) -> Result<Self> {
        let kind = vocab.model;
        let n = vocab.tokens.len();
        let n_u32 = u32::try_from(n).map_err(|_| TokenizerError::InvalidKey {
            key: "tokenizer.ggml.tokens".into(),
            reason: "more than 2^32 tokens".into(),
        })?;
        if !vocab.scores.is_empty() && vocab.scores.len() < n {
            return Err(TokenizerError::InvalidKey {
                key: "tokenizer.ggml.scores".into(),
                reason: format!("{} scores for {n} tokens", vocab.scores.len()),
            });
        }
        if !vocab.token_types.is_empty() && vocab.token_types.len() < n {
            return Err(TokenizerError::InvalidKey {
                key: "tokenizer.ggml.token_type".into(),
                reason: format!("{} types for {n} tokens", vocab.token_types.len()),
            });
        }

        // Model defaults.
        let (mut bos, mut eos, mut unk): (Option<u32>, Option<u32>, Option<u32>);
        let mut add_bos;
        let mut add_eos = false;
        let mut add_space_prefix;
        let spec: Option<PreSpec>;
        let pre_name;
        match kind {
            ModelKind::Spm => {
                (bos, eos, unk) = (Some(1), Some(2), Some(0));
                add_bos = true;
                add_space_prefix = true;
                spec = None;
                pre_name = "default".to_string();
            }
            ModelKind::Bpe | ModelKind::Gemma4 => {
                if kind == ModelKind::Bpe {
                    (bos, eos, unk) = (Some(11), Some(11), None);
                } else {
                    (bos, eos, unk) = (None, None, None);
                }
                let name = if kind == ModelKind::Gemma4 {
                    "gemma4".to_string()
                } else {
                    vocab.pre.unwrap_or_default().to_string()
                };
                let s = pre_spec(&name)
                    .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer { pre: name.clone() })?;
                add_bos = s.add_bos;
                add_space_prefix = false;
                spec = Some(s);
                pre_name = if name.is_empty() {
                    "default".into()
                } else {
                    name
                };
            }
        }
        let clean_spaces = spec.as_ref().is_some_and(|s| s.clean_spaces);
        let ignore_merges = spec.as_ref().is_some_and(|s| s.ignore_merges);
        let escape_whitespaces = spec.as_ref().is_some_and(|s| s.escape_whitespaces);
        let byte_encode = spec.as_ref().is_some_and(|s| s.byte_encode);
        if let Some(v) = vocab.add_space_prefix {
            add_space_prefix = v;
        }

        // Tokens (an empty text becomes `[EMPTY_<id>]`), the text index, attributes.
        let empty_text = |i: usize| format!("[EMPTY_{i}]");
        let n_bytes: usize = vocab
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    empty_text(i).len()
                } else {
                    t.len()
                }
            })
            .sum();
        let mut texts = PackedStrs::with_capacity(n, n_bytes);
        let mut index = TextIndex::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        for (id, (i, text)) in (0..n_u32).zip(vocab.tokens.iter().enumerate()) {
            if text.is_empty() {
                texts.push(&empty_text(i), "tokenizer.ggml.tokens")?;
            } else {
                texts.push(text, "tokenizer.ggml.tokens")?;
            }
            if let Err(first) = index.insert(&texts, id) {
                return Err(TokenizerError::DuplicateToken {
                    text: texts.get(i).unwrap_or_default().to_string(),
                    first,
                    second: id,
                });
            }
            attrs.push(match vocab.token_types.get(i).copied() {
                None if vocab.token_types.is_empty() => attr::NORMAL,
                Some(token_type::NORMAL) => attr::NORMAL,
                Some(token_type::UNKNOWN) => attr::UNKNOWN,
                Some(token_type::CONTROL) => attr::CONTROL,
                Some(token_type::USER_DEFINED) => attr::USER_DEFINED,
                Some(token_type::UNUSED) => attr::UNUSED,
                Some(token_type::BYTE) => attr::BYTE,
                _ => 0,
            });
        }
        let scores = match vocab.scores.is_empty() {
            true => Vec::new(),
            false => vocab.scores[..n].to_vec(),
        };

        // Merges: "left right", split at the first space after the first byte; first rank wins.
        let bpe_ranks = MergeRanks::new(vocab.merges)?;

        // Special ids: defaults out of range are disabled; metadata ids in range override.
        let in_range = |id: Option<u32>| id.filter(|&i| i < n_u32);
        let pick = |default: Option<u32>, meta: Option<u32>| match in_range(meta) {
            Some(id) => Some(id),
            None => in_range(default),
        };
        let sp = &vocab.special;
        bos = pick(bos, sp.bos);
        eos = pick(eos, sp.eos);
        unk = pick(unk, sp.unk);
        let mut specials = Specials {
            bos,
            eos,
            eot: in_range(sp.eot),
            eom: in_range(sp.eom),
            unk,
            pad: in_range(sp.pad),
            fim: [
                in_range(sp.fim_pre),
                in_range(sp.fim_suf),
                in_range(sp.fim_mid),
                in_range(sp.fim_pad),
                in_range(sp.fim_rep),
                in_range(sp.fim_sep),
            ],
        };
        if let Some(v) = vocab.add_bos {
            add_bos = v;
        }
        if let Some(v) = vocab.add_eos {
            add_eos = v;
        }
        if kind == ModelKind::Gemma4 {
            add_bos = true;
        }

        let mut tok = Self {
            kind,
            texts,
            scores,
            attrs,
            index,
            bpe_ranks,
            pre: spec.as_ref().map(PreTokenizer::new).transpose()?,
            pre_name,
            byte_encode,
            byte_table: byte_to_char_table(),
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
            escape_whitespaces,
            specials: Specials::default(),
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
            special_matcher: SpecialMatcher::default(),
            pieces: PackedBytes::default(),
            chat_template,
        };

        // Text-based detection of EOT/EOM/FIM markers (llama.cpp walks a hash map; we walk ids
        // in order so the choice among several candidates is deterministic).
        let find = |tok: &Self, names: &[&str]| -> Option<u32> {
            names.iter().filter_map(|n| tok.text_to_token(n)).min()
        };
        let mark_control = |tok: &mut Self, id: u32| tok.attrs[id as usize] |= attr::CONTROL;
        if specials.eot.is_none() {
            specials.eot = find(&tok, EOT_NAMES);
            if let Some(id) = specials.eot {
                mark_control(&mut tok, id);
            }
        }
        if specials.eom.is_none() {
            specials.eom = find(&tok, EOM_NAMES);
            if let Some(id) = specials.eom {
                mark_control(&mut tok, id);
            }
        }
        for (k, names) in FIM_NAMES.iter().enumerate() {
            if specials.fim[k].is_none() {
                specials.fim[k] = find(&tok, names);
                if let Some(id) = specials.fim[k] {
                    mark_control(&mut tok, id);
                }
            }
        }
        for id in 0..n {
            if tok.attrs[id] & attr::CONTROL != 0
                && tok.texts.get(id).is_some_and(|t| t.contains("unused"))
            {
                tok.attrs[id] |= attr::UNUSED;
            }
        }
        let mut eog = BTreeSet::new();
        for id in [specials.fim[3], specials.fim[4], specials.fim[5]]
            .into_iter()
            .flatten()
        {
            eog.insert(id);
        }
        for name in EOG_NAMES {
            if let Some(id) = tok.text_to_token(name) {
                eog.insert(id);
                mark_control(&mut tok, id);
            }
        }
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = tok.text_to_token(name) {
                tok.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        for id in [specials.eos, specials.eot, specials.eom]
            .into_iter()
            .flatten()
        {
            eog.insert(id);
        }
        {
            let texts: Vec<(u32, String)> = eog
                .iter()
                .map(|&id| (id, tok.token_text_unchecked(id).to_string()))
                .collect();
            let has = |t: &str| texts.iter().any(|(_, x)| x == t);
            let harmony =
                has("<|return|>") && has("<|call|>") || has("<|calls|>") && has("<|flush|>");
            if harmony && let Some((id, _)) = texts.iter().find(|(_, x)| x == "<|end|>") {
                eog.remove(id);
                tok.attrs[*id as usize] = attr::USER_DEFINED;
            }
            let normal_s = has("<|tool_response>") || has("<|plamo:eos|>");
            if normal_s && let Some((id, _)) = texts.iter().find(|(_, x)| x == "</s>") {
                eog.remove(id);
                tok.attrs[*id as usize] = attr::NORMAL;
            }
        }
        tok.eog = eog;
        tok.specials = specials;

        // Special-token cache: control, user-defined and unknown tokens, longest text first.
        let mut cache: Vec<u32> = (0..n_u32)
            .filter(|&id| {
                tok.attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        cache.sort_by(|&a, &b| {
            tok.token_text_unchecked(b)
                .len()
                .cmp(&tok.token_text_unchecked(a).len())
        });
        tok.special_matcher =
            SpecialMatcher::new(cache.iter().map(|&id| (id, tok.token_text_unchecked(id))));
        tok.special_cache = cache;

        // Piece cache (special = true). Pieces are about as long as the texts.
        let mut pieces = PackedBytes::with_capacity(n, n_bytes);
        for id in 0..n_u32 {
            tok.write_piece(id, pieces.buf_mut());
            pieces.finish_entry("tokenizer.ggml.tokens")?;
        }
        pieces.shrink_to_fit();
        tok.pieces = pieces;

        // Per-model attributes keyed on general.name (llama.cpp does the same).
        let name = vocab.model_name.unwrap_or_default().to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &tok.special_cache {
                tok.attrs[id as usize] |= attr::RSTRIP;
            }
            if let Some(id) = tok.text_to_token("</s>") {
                tok.attrs[id as usize] |= attr::RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = tok.text_to_token(t) {
                    tok.attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        }
        Ok(tok)
    }

    /// Appends the bytes token `id` stands for (with `special = true`) to `out`.
    fn write_piece(&self, id: u32, out: &mut Vec<u8>) {
        let text = self.token_text_unchecked(id);
        let a = self.attrs[id as usize];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
            return;
        }
        if a & attr::NORMAL != 0 {
            if self.kind == ModelKind::Spm || self.escape_whitespaces {
                for (k, part) in text.split('\u{2581}').enumerate() {
                    if k > 0 {
                        out.push(b' ');
                    }
                    out.extend_from_slice(part.as_bytes());
                }
                return;
            }
            for c in text.chars() {
                match char_to_byte(c) {
                    Some(b) => out.push(b),
                    None => {
                        out.extend_from_slice(b"[UNK_BYTE_0x");
                        let mut buf = [0u8; 4];
                        for b in c.encode_utf8(&mut buf).bytes() {
                            // Writing to a Vec cannot fail.
                            let _ = write!(out, "{b:02x}");
                        }
                        out.extend_from_slice(text.as_bytes());
                        out.push(b']');
                    }
                }
            }
            return;
        }
        if a & attr::BYTE != 0
            && let Some(b) = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
        }
    }

    // ---- lookups used by the algorithms ----

    pub(crate) fn text_to_token(&self, text: &str) -> Option<u32> {
        self.index.get(&self.texts, text)
    }
    pub(crate) fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }
    pub(crate) fn bpe_rank(&self, left: &str, right: &str) -> Option<u32> {
        self.bpe_ranks.rank(left, right)
    }
    pub(crate) fn pre_tokenizer(&self) -> Option<&PreTokenizer> {
        self.pre.as_ref()
    }
    pub(crate) fn byte_encode(&self) -> bool {
        self.byte_encode
    }
    pub(crate) fn byte_table(&self) -> &[char; 256] {
        &self.byte_table
    }
    pub(crate) fn ignore_merges(&self) -> bool {
        self.ignore_merges
    }
    pub(crate) fn is_gemma4(&self) -> bool {
        self.escape_whitespaces
    }
    pub(crate) fn hex_byte_token(&self, b: u8) -> Option<u32> {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let name = [
            b'<',
            b'0',
            b'x',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 15)],
            b'>',
        ];
        std::str::from_utf8(&name)
            .ok()
            .and_then(|s| self.text_to_token(s))
    }
    pub(crate) fn spm_byte_to_token(&self, b: u8) -> Option<u32> {
        self.hex_byte_token(b).or_else(|| {
            let s = [b];
            std::str::from_utf8(&s)
                .ok()
                .and_then(|s| self.text_to_token(s))
        })
    }
    pub(crate) fn token_attr(&self, id: u32) -> u32 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }
    /// The text of an id known to be in range (`""` otherwise).
    pub(crate) fn token_text_unchecked(&self, id: u32) -> &str {
        self.texts.get(id as usize).unwrap_or_default()
    }
    pub(crate) fn special_cache(&self) -> &[u32] {
        &self.special_cache
    }

    pub(crate) fn special_matcher(&self) -> &SpecialMatcher {
        &self.special_matcher
    }

    // ---- public API ----

    /// Encodes `text` to token ids exactly as llama.cpp's `llama_tokenize` does.
    ///
    /// `add_special` adds BOS/EOS where the model's flags ask for them; `parse_special` lets
    /// control tokens written in the text (`<start_of_turn>`) be recognised. User-defined tokens
    /// are always recognised, as in llama.cpp and HF `tokenizers`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let frags = if text.is_empty() {
            Vec::new()
        } else {
            partition(self, text, parse_special)
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.push(
                self.specials
                    .bos
                    .ok_or(TokenizerError::MissingSpecial { which: "BOS" })?,
            );
        }
        match self.kind {
            ModelKind::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in frags {
                    match f {
                        Fragment::Text(s, e) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[s..e]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm::tokenize(self, &escaped, &mut out)?;
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            ModelKind::Bpe | ModelKind::Gemma4 => {
                for f in frags {
                    match f {
                        Fragment::Text(s, e) => {
                            if self.escape_whitespaces {
                                let escaped = text[s..e].replace(' ', "\u{2581}");
                                bpe::tokenize(self, &escaped, &mut out)?;
                            } else {
                                bpe::tokenize(self, &text[s..e], &mut out)?;
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.push(
                self.specials
                    .eos
                    .ok_or(TokenizerError::MissingSpecial { which: "EOS" })?,
            );
        }
        Ok(out)
    }

    /// The bytes a token stands for. With `special == false`, control and unknown tokens give
    /// nothing (what a user should see); with `true` they give their text.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Result<&[u8]> {
        let out_of_range = TokenizerError::TokenOutOfRange {
            id,
            n_vocab: self.texts.len(),
        };
        let a = *self.attrs.get(id as usize).ok_or(out_of_range)?;
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Ok(&[]);
        }
        Ok(self.pieces.get(id as usize).unwrap_or_default())
    }

    /// The vocabulary entry's raw text (`▁Hello`, `ĠHello`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize)
    }

    /// Looks a vocabulary entry up by its raw text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.text_to_token(text)
    }

    /// llama.cpp's `llama_detokenize`: pieces joined, the SPM leading space removed, and (for
    /// vocabularies that ask for it) spaces before punctuation cleaned up.
    pub fn detokenize(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<Vec<u8>> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && !ids.is_empty() && Some(ids[0]) == self.specials.bos {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special
            && self.add_eos
            && ids.last().copied() == self.specials.eos
            && !ids.is_empty()
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let mut piece = self.token_to_piece(id, unparse_special)?;
            if remove_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_spaces(&mut text);
        }
        Ok(text)
    }

    /// Decodes ids to text for display: control tokens are skipped, invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.detokenize(ids, false, false)?).into_owned())
    }

    /// A streaming decoder that only ever emits complete UTF-8.
    pub fn decoder(&self) -> crate::Decoder<'_> {
        crate::Decoder::new(self)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// The ids whose piece (as shown, control tokens empty) is ASCII of 1 to `max_bytes`
    /// bytes: digits, punctuation, single letters — the tokens a vocabulary-shortlist draft
    /// always keeps (some vocabularies, Gemma's among them, put them last).
    pub fn short_ascii_pieces(&self, max_bytes: usize) -> Vec<u32> {
        (0..self.texts.len() as u32)
            .filter(|&id| {
                self.token_to_piece(id, false)
                    .is_ok_and(|p| !p.is_empty() && p.len() <= max_bytes && p.is_ascii())
            })
            .collect()
    }
    /// The algorithm family.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }
    /// The pre-tokenizer name in effect (`default` for SPM).
    pub fn pre_name(&self) -> &str {
        &self.pre_name
    }
    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.specials.bos
    }
    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.specials.eos
    }
    /// End-of-turn token (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>` …).
    pub fn eot(&self) -> Option<u32> {
        self.specials.eot
    }
    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.specials.unk
    }
    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.specials.pad
    }
    /// Whether encoding with `add_special` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether encoding with `add_special` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// Every token that ends generation (llama.cpp's EOG set), ascending.
    pub fn stop_tokens(&self) -> Vec<u32> {
        self.eog.iter().copied().collect()
    }
    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
    /// Whether `id` is a control token.
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::CONTROL != 0)
    }
    /// The model's chat template, when the source carried one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
    /// The text of the BOS token (for chat templates).
    pub fn bos_text(&self) -> Option<&str> {
        self.specials.bos.and_then(|id| self.token_text(id))
    }
    /// An estimate of the heap memory the tokenizer holds, in bytes: the capacities of its
    /// vocabulary tables (texts, text index, scores, attributes, pieces, merge ranks), of the
    /// special-token cache and matcher, and of the chat template. The pre-tokenizer's compiled
    /// regexes (a fixed size per pre-tokenizer, independent of the vocabulary) are not counted.
    pub fn heap_bytes(&self) -> usize {
        self.texts.heap_bytes()
            + self.index.heap_bytes()
            + self.scores.capacity() * size_of::<f32>()
            + self.attrs.capacity() * size_of::<u32>()
            + self.pieces.heap_bytes()
            + self.bpe_ranks.heap_bytes()
            + self.special_cache.capacity() * size_of::<u32>()
            + self.special_matcher.heap_bytes()
            + self.eog.len() * size_of::<u32>()
            + self.chat_template.as_ref().map_or(0, String::capacity)
            + self.pre_name.capacity()
    }
    /// The text of the EOS token (for chat templates).
    pub fn eos_text(&self) -> Option<&str> {
        self.specials.eos.and_then(|id| self.token_text(id))
    }
}

/// llama.cpp's three clean-up passes over detokenized bytes (spaces before `?!.,`, a lone
/// `'` between spaces, and contractions `'s 'm 're 've`). Each pass is done in place with the
/// same index arithmetic as the reference, quirks included.
fn clean_spaces(text: &mut Vec<u8>) {
    // pass 1: " ?", " !", " .", " ,"
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
    // pass 2: " ' "
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);
    // pass 3: contractions
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if x1 == b't' || x1 == b'd' {
                // kept
            } else if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if i + 2 < n {
                let x2 = text[i + 2];
                if x2 == b'e' && (x1 == b'r' || x1 == b'v') {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

pub(crate) fn c_isspace(b: u8) -> bool {
    is_c_space(b)
}
