//! `cargo xtask perplexity-fixtures`: llama.cpp's perplexity of the held-out evaluation text
//! (`cargo xtask text-corpus`) on Gemma 3 270M, the oracle of
//! `crates/synapse-runtime/tests/perplexity.rs`. Runs `xtask/py/perplexity_oracle.py` in the
//! oracle venv (llama.cpp's `tools/perplexity` algorithm through llama-cpp-python, exact
//! configuration) and writes `fixtures/perplexity/<model>.json`.

use anyhow::{Result, bail};
use std::path::PathBuf;

/// Arguments of `perplexity-fixtures`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output folder (default: `fixtures/perplexity`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Chunks scored (the first ones of the text).
    #[arg(long, default_value_t = 4)]
    chunks: usize,
}

/// Regenerates the fixture.
pub fn run(a: Args) -> Result<()> {
    let out = a
        .out
        .unwrap_or_else(|| crate::oracle_env::repo_root().join("fixtures/perplexity"));
    std::fs::create_dir_all(&out)?;
    let text = crate::text_corpus::corpus_dir();
    let (eval, manifest) = (text.join("evaluation.txt"), text.join("manifest.json"));
    if !eval.is_file() {
        bail!(
            "{} missing: run `cargo xtask text-corpus` first",
            eval.display()
        );
    }
    let file = crate::parity_fixtures::DEFAULT_MODEL_FILE;
    let model = crate::parity_fixtures::model_dir().join(file);
    if !model.is_file() {
        bail!(
            "{} missing: `synapse-cli fetch-model` fetches it",
            model.display()
        );
    }
    let dst = out.join(format!("{}.json", file.trim_end_matches(".gguf")));
    println!(
        "perplexity-fixtures: llama.cpp on {} -> {}",
        model.display(),
        dst.display()
    );
    let (ctx, chunks) = (a.ctx.to_string(), a.chunks.to_string());
    crate::parity_fixtures::run_py(
        "perplexity_oracle.py",
        &[
            model.as_os_str(),
            eval.as_os_str(),
            manifest.as_os_str(),
            ctx.as_ref(),
            chunks.as_ref(),
            dst.as_os_str(),
        ],
        &[],
    )
}
