//! `synapse-tokenizer`: the text ring of Synapse.
//!
//! Token ids must be exactly llama.cpp's, or every later parity test is meaningless, so this
//! crate re-implements llama.cpp's tokenizers rather than using HF `tokenizers`:
//!
//! - [`vocab`]: the plain vocabulary data ([`Vocab`]), from GGUF ([`Tokenizer::from_gguf`]) or
//!   a HF `tokenizer.json` ([`Tokenizer::from_hf_tokenizer_json`]).
//! - `spm`: SentencePiece-style score-driven pair merging with `<0xXX>` byte fallback
//!   (`tokenizer.ggml.model = llama`: Llama 2, Gemma 3, Phi-3).
//! - `bpe` + `pretokenize`: byte-level BPE with every pre-tokenizer regex cascade llama.cpp
//!   uses for the families in scope (`gpt2`), and Gemma 4's SPM-style BPE (`gemma4`).
//! - `special`: llama.cpp's special-token partitioning (`parse_special`).
//! - [`Decoder`]: streaming detokenization that only emits complete UTF-8.
//! - `tables`: the vocabulary held once, compactly: one text buffer indexed by id and hash
//!   tables of ids, never a `String` per token ([`Tokenizer::heap_bytes`] measures it).
//! - [`chat`]: chat templates rendered with minijinja the way transformers renders them.
//!
//! Design: [`Tokenizer::new`] is pure (data in, tables out); only the `from_*` constructors do IO.
#![deny(missing_docs)]

mod bpe;
mod bytes;
pub mod chat;
mod decoder;
pub mod error;
mod gguf;
mod hf;
mod pretokenize;
mod special;
mod spm;
mod tables;
mod tokenizer;
pub mod vocab;

pub use chat::{ChatTemplate, Message};
pub use decoder::Decoder;
pub use error::{Result, TokenizerError};
pub use gguf::vocab_from_gguf;
pub use tokenizer::{Tokenizer, attr};
pub use vocab::{ModelKind, SpecialIds, Vocab};
