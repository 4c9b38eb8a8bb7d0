//! The crate's one error type.

use thiserror::Error;

/// Everything that can go wrong while building a tokenizer, encoding, or rendering a template.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// A required metadata key is missing.
    #[error("missing tokenizer metadata key `{key}`")]
    MissingKey {
        /// The GGUF (or tokenizer.json) key.
        key: String,
    },
    /// A metadata key holds a value of the wrong type or size.
    #[error("invalid tokenizer metadata `{key}`: {reason}")]
    InvalidKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `tokenizer.ggml.model` names a model this crate does not implement.
    #[error("unsupported tokenizer model `{model}` (supported: llama, gpt2, gemma4)")]
    UnsupportedModel {
        /// The model name.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unsupported pre-tokenizer `{pre}`")]
    UnsupportedPreTokenizer {
        /// The pre-tokenizer name.
        pre: String,
    },
    /// The vocabulary has two entries with the same text.
    #[error("duplicate token text `{text}` (ids {first} and {second})")]
    DuplicateToken {
        /// The text.
        text: String,
        /// The first id.
        first: u32,
        /// The second id.
        second: u32,
    },
    /// A byte had to be emitted as a byte token but the vocabulary has none for it.
    #[error("vocabulary has no token for byte 0x{byte:02X}")]
    NoByteToken {
        /// The byte.
        byte: u8,
    },
    /// `add_special` asked for a BOS/EOS the vocabulary does not define.
    #[error("the model asks for a {which} token but defines none")]
    MissingSpecial {
        /// "BOS" or "EOS".
        which: &'static str,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} out of range (vocabulary has {n_vocab})")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// A pre-tokenizer regex failed to compile or to run.
    #[error("pre-tokenizer regex: {0}")]
    Regex(String),
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A tokenizer.json / tokenizer_config.json could not be parsed or uses features not supported.
    #[error("tokenizer.json: {0}")]
    HfJson(String),
    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    Template(String),
    /// The chat template uses a Jinja feature that is not supported.
    #[error("chat template uses an unsupported feature: {0}")]
    UnsupportedTemplateFeature(String),
    /// The template called `raise_exception(msg)`.
    #[error("chat template raised: {0}")]
    TemplateRaised(String),
    /// The model file carries no chat template.
    #[error("the model has no chat template")]
    NoTemplate,
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, TokenizerError>;
