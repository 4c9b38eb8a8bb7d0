//! `cargo xtask quant-models`: one llama-architecture model of 256-wide rows quantized by
//! llama.cpp to each ggml weight type no real parity model holds, with llama.cpp's logits.
//! Regenerates `fixtures/quant/` (format: `fixtures/README.md`) through
//! `xtask/py/quant_models.py` in the oracle venv.

use anyhow::Result;
use std::path::PathBuf;

/// Arguments of `quant-models`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output folder (default: `fixtures/quant`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Regenerates the fixtures.
pub fn run(args: Args) -> Result<()> {
    crate::parity_fixtures::run_fixture_script(
        "quant-models: llama.cpp quantize + logits",
        "quant_models.py",
        args.out,
        "fixtures/quant",
    )
}
