//! BPE pre-tokenizers: the regex cascades llama.cpp applies per `tokenizer.ggml.pre`.
//!
//! A pre-tokenizer is a list of regexes applied in order. Each one splits every current
//! fragment into its matches *and* the unmatched text between them (both kept), exactly like
//! llama.cpp's `unicode_regex_split`. The patterns are the ones llama.cpp uses (which are the
//! models' `tokenizer.json` patterns with `(?i:…)` spelled out); `fancy-regex` provides the
//! look-arounds (`\s+(?!\S)`).
//!
//! Known, deliberate difference: llama.cpp runs its patterns that contain literal non-ASCII
//! characters through `std::wregex` after replacing non-ASCII whitespace with U+000B, so such a
//! character inside a literal range (U+3000 in deepseek-llm's `　-。`) never matches there;
//! here it does. No vocabulary test case exercises it.

use crate::error::{Result, TokenizerError};
use fancy_regex::Regex;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const PORO: &str = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+";
const NEWLINES: &str = r"[^\n]+|[\n]+";
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";

/// How one `tokenizer.ggml.pre` value tokenizes: its regex cascade and the vocabulary flags
/// llama.cpp sets with it.
#[derive(Debug, Clone)]
pub(crate) struct PreSpec {
    /// The regexes, applied in order.
    pub regexes: Vec<&'static str>,
    /// GPT-2 byte encoding of each fragment (false for SPM-style BPE such as Gemma 4).
    pub byte_encode: bool,
    /// Clean up spaces before punctuation when detokenizing.
    pub clean_spaces: bool,
    /// A fragment that is itself a token is emitted whole (Llama 3).
    pub ignore_merges: bool,
    /// The pre-type's own `add_bos` default (metadata can override it).
    pub add_bos: bool,
    /// Spaces become `▁` before merging (Gemma 4).
    pub escape_whitespaces: bool,
}

impl PreSpec {
    fn new(regexes: Vec<&'static str>) -> Self {
        Self {
            regexes,
            byte_encode: true,
            clean_spaces: true,
            ignore_merges: false,
            add_bos: false,
            escape_whitespaces: false,
        }
    }
    fn no_clean(mut self) -> Self {
        self.clean_spaces = false;
        self
    }
    fn ignore_merges(mut self) -> Self {
        self.ignore_merges = true;
        self
    }
    fn bos(mut self) -> Self {
        self.add_bos = true;
        self
    }
}

/// The spec for a pre-tokenizer name (`None` for names this crate does not implement).
pub(crate) fn pre_spec(name: &str) -> Option<PreSpec> {
    let default = || {
        PreSpec::new(vec![
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2,
            r"\p{N}+",
            r"[0-9][0-9][0-9]",
        ])
    };
    let s = match name {
        "" | "default" => default(),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreSpec::new(vec![LLAMA3]).ignore_merges().bos(),
        "dbrx" | "smaug-bpe" => PreSpec::new(vec![LLAMA3]),
        "deepseek-llm" => PreSpec::new(vec![
            r"[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
            r"\s+$",
            r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
            r"\p{N}+",
        ])
        .no_clean(),
        "deepseek-coder" => PreSpec::new(vec![
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
            r"\p{N}",
        ])
        .no_clean(),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => PreSpec::new(vec![
            r"\p{N}{1,3}",
            r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
            DEEPSEEK3,
        ])
        .no_clean(),
        "falcon" => PreSpec::new(vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"]),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            PreSpec::new(vec![r"\p{N}", GPT2])
        }
        "command-r" | "smollm" => PreSpec::new(vec![r"\p{N}", GPT2]).no_clean(),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4"
        | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => PreSpec::new(vec![GPT2]),
        "trillion" | "granite-docling" => PreSpec::new(vec![GPT2]).no_clean(),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => PreSpec::new(vec![QWEN2]).no_clean(),
        "stablelm2" | "megrez" => PreSpec::new(vec![QWEN2]),
        "qwen35" => PreSpec::new(vec![QWEN35]).no_clean(),
        "poro-chat" => PreSpec::new(vec![PORO]).no_clean(),
        "bloom" | "gpt3-finnish" => PreSpec::new(vec![PORO]),
        "viking" => PreSpec::new(vec![PORO, r"\p{N}"]).no_clean(),
        "chatglm-bpe" => PreSpec::new(vec![LLAMA3]),
        "glm4" | "glm5" => PreSpec::new(vec![LLAMA3]).ignore_merges(),
        "tekken" => PreSpec::new(vec![TEKKEN]).no_clean().ignore_merges().bos(),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => {
            PreSpec::new(vec![GPT4O]).no_clean()
        }
        "gemma4" | "granite-embed-multi-311m" => {
            let mut s = PreSpec::new(vec![NEWLINES]);
            s.byte_encode = false;
            s.escape_whitespaces = true;
            s
        }
        _ => return None,
    };
    Some(s)
}

/// A compiled regex cascade.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    /// Each regex, and whether it runs in llama.cpp's `std::wregex` mode (patterns with literal
    /// non-ASCII characters): there, non-ASCII whitespace in the text is first replaced by
    /// U+000B, so it matches `\s` but never a literal range.
    regexes: Vec<(Regex, bool)>,
}

impl PreTokenizer {
    /// Compiles the spec's regexes.
    pub fn new(spec: &PreSpec) -> Result<Self> {
        let regexes = spec
            .regexes
            .iter()
            .map(|r| {
                let wide = r.contains("\\x{") && !r.contains("\\p{");
                Regex::new(r)
                    .map(|re| (re, wide))
                    .map_err(|e| TokenizerError::Regex(format!("{r}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { regexes })
    }

    /// Splits `text` into fragments (byte ranges) the way llama.cpp's `unicode_regex_split` does.
    pub fn split(&self, text: &str) -> Result<Vec<(usize, usize)>> {
        let mut frags = vec![(0usize, text.len())];
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let mut mapped = String::new();
        let mut pos: Vec<usize> = Vec::new();
        for (re, wide) in &self.regexes {
            let mut next = Vec::with_capacity(frags.len() * 2);
            for &(s, e) in &frags {
                let orig = &text[s..e];
                // In wregex mode, run on a copy with non-ASCII whitespace replaced by U+000B and
                // map match offsets back (`pos[i]`: original offset of copy offset `i`).
                let hay = if *wide && orig.chars().any(|c| !c.is_ascii() && c.is_whitespace()) {
                    mapped.clear();
                    pos.clear();
                    for (i, c) in orig.char_indices() {
                        let c2 = if !c.is_ascii() && c.is_whitespace() {
                            '\u{0B}'
                        } else {
                            c
                        };
                        for _ in 0..c2.len_utf8() {
                            pos.push(i);
                        }
                        mapped.push(c2);
                    }
                    pos.push(orig.len());
                    Some(mapped.as_str())
                } else {
                    None
                };
                let (h, map): (&str, Option<&[usize]>) = match hay {
                    Some(h) => (h, Some(&pos)),
                    None => (orig, None),
                };
                let at = |i: usize| map.map_or(i, |m| m[i]);
                let mut prev = 0usize;
                for m in re.find_iter(h) {
                    let m = m.map_err(|e| TokenizerError::Regex(e.to_string()))?;
                    if m.start() == m.end() {
                        continue;
                    }
                    let (ms, me) = (at(m.start()), at(m.end()));
                    if ms > prev {
                        next.push((s + prev, s + ms));
                    }
                    next.push((s + ms, s + me));
                    prev = me;
                }
                if prev < orig.len() {
                    next.push((s + prev, e));
                }
            }
            frags = next;
        }
        Ok(frags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(&pre_spec(pre).unwrap()).unwrap();
        p.split(text)
            .unwrap()
            .into_iter()
            .map(|(s, e)| text[s..e].to_string())
            .collect()
    }

    #[test]
    fn gpt2_keeps_last_space_with_word() {
        assert_eq!(
            split("gpt-2", "Hello   world's"),
            ["Hello", "  ", " world", "'s"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(
            split("llama-bpe", "1234567 ab\n\n"),
            ["123", "456", "7", " ab", "\n\n"]
        );
    }

    #[test]
    fn every_spec_compiles() {
        for name in [
            "default",
            "llama-bpe",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "starcoder",
            "command-r",
            "gpt-2",
            "qwen2",
            "qwen35",
            "poro-chat",
            "viking",
            "tekken",
            "gpt-4o",
            "gemma4",
        ] {
            PreTokenizer::new(&pre_spec(name).unwrap()).unwrap();
        }
    }
}
