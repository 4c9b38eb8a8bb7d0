//! `cargo xtask quant-models`: one llama-architecture model of 256-wide rows quantized by
//! llama.cpp to each ggml weight type no real parity model holds, with llama.cpp's logits.
//! Regenerates `fixtures/quant/` (format: `fixtures/README.md`) through
//! `xtask/py/quant_models.py` in the oracle venv.

use crate::oracle_env;
use crate::parity_fixtures::run_py;
use anyhow::{Context, Result};
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
    let out = args
        .out
        .unwrap_or_else(|| oracle_env::repo_root().join("fixtures/quant"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!(
        "quant-models: llama.cpp quantize + logits -> {}",
        out.display()
    );
    run_py("quant_models.py", &[out.as_os_str()], &[])
}
