//! `cargo xtask hf-tokenizer-fixtures`: `tokenizer.json` files written by transformers'
//! `save_pretrained` (the tiny llama model's SentencePiece tokenizer converted by transformers,
//! and a byte-level BPE trained with `tokenizers`), each with transformers' ids for a set of
//! texts: the oracle of `crates/synapse-tokenizer/tests/hf_json.rs`. Regenerates
//! `fixtures/tokenizer/hf/` (format: `fixtures/README.md`) through
//! `xtask/py/hf_tokenizer_fixtures.py` in the oracle venv (transformers 4.57.6, sentencepiece,
//! protobuf).

use anyhow::Result;
use std::path::PathBuf;

/// Arguments of `hf-tokenizer-fixtures`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output folder (default: `fixtures/tokenizer/hf`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Regenerates the fixtures.
pub fn run(args: Args) -> Result<()> {
    crate::parity_fixtures::run_fixture_script(
        "hf-tokenizer-fixtures: tokenizer.json by transformers + its ids",
        "hf_tokenizer_fixtures.py",
        args.out,
        "fixtures/tokenizer/hf",
    )
}
