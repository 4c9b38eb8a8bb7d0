//! `cargo xtask oracle-fixtures`: regenerates `fixtures/decode/` — seeded blocks of every ggml
//! type (plus edge cases) and the f32 values ggml itself decodes them to, the FP8 code tables
//! from ml_dtypes, and sampled blocks of every tensor of the default real model.
//!
//! Needs the oracle venv (`SYNAPSE_ORACLE_VENV`, with llama-cpp-python, gguf, numpy and
//! ml_dtypes). The Python side is `oracle_fixtures.py`, next to this file, fed to the venv's
//! interpreter on stdin.

use anyhow::{Context, Result, bail};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const SCRIPT: &str = include_str!("oracle_fixtures.py");

/// Arguments of `oracle-fixtures`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The real model to sample (default:
    /// `${SYNAPSE_MODEL_DIR:-${XDG_CACHE_HOME:-~/.cache}/synapse/models}/gemma-3-270m-q4_k_m.gguf`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Output folder (default: `<repo>/fixtures/decode`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The default location of the real model file.
fn default_model() -> PathBuf {
    let dir = std::env::var_os("SYNAPSE_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
                });
            cache.join("synapse").join("models")
        });
    dir.join("gemma-3-270m-q4_k_m.gguf")
}

/// Runs the generator.
pub fn run(args: Args) -> Result<()> {
    let py = crate::oracle_env::python()?;
    let out = args
        .out
        .unwrap_or_else(|| crate::oracle_env::repo_root().join("fixtures/decode"));
    let model = args.model.unwrap_or_else(default_model);
    if !model.exists() {
        bail!(
            "model {} not found: fetch it first (or pass --model)",
            model.display()
        );
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut child = Command::new(&py)
        .arg("-")
        .arg(&out)
        .arg(&model)
        .stdin(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {}", py.display()))?;
    child
        .stdin
        .take()
        .context("python stdin")?
        .write_all(SCRIPT.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        bail!("oracle_fixtures.py failed with {status}");
    }
    println!("fixtures written to {}", out.display());
    Ok(())
}
