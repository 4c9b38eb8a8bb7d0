//! `cargo xtask requant-digests`: llama.cpp's own pure re-quantization of a real model (default
//! SmolLM2-135M-Instruct) to each ggml legacy type, every tensor as a digest — the oracle of
//! `--profile uniform:ggml.<type>.v1`. Regenerates `fixtures/requant/<stem>.json` (format:
//! `fixtures/README.md`) through `xtask/py/requant_digests.py` in the oracle venv.

use anyhow::{Context, Result, bail};
use std::path::PathBuf;

use crate::oracle_env;
use crate::parity_fixtures::{REAL_MODELS, model_dir, run_py};

/// Arguments of `requant-digests`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model (a name of the real models, read from the model cache).
    #[arg(long, default_value = "smollm2-135m-instruct")]
    pub model: String,
    /// Output file (default: `fixtures/requant/<stem>.json`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Regenerates the digests.
pub fn run(args: Args) -> Result<()> {
    let (name, file, stem) = REAL_MODELS
        .iter()
        .find(|m| m.0 == args.model)
        .with_context(|| format!("unknown model {:?}", args.model))?;
    let src = model_dir().join(file);
    if !src.is_file() {
        bail!(
            "{name}: not found at {} (`synapse-cli fetch-model {name}` fetches it)",
            src.display()
        );
    }
    let out = args.out.unwrap_or_else(|| {
        oracle_env::repo_root()
            .join("fixtures/requant")
            .join(format!("{stem}.json"))
    });
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    println!(
        "requant-digests: llama.cpp pure re-quantization of {name} -> {}",
        out.display()
    );
    run_py(
        "requant_digests.py",
        &[src.as_os_str(), out.as_os_str()],
        &[],
    )
}
