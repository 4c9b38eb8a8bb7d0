//! `cargo xtask parity-fixtures`: llama.cpp's greedy outputs on the default real model, the oracle
//! side of the runtime parity tests. Regenerates `fixtures/parity/` (format: `fixtures/README.md`).
//!
//! The work is done by `xtask/py/parity_fixtures.py` in the oracle venv (llama-cpp-python); this
//! module finds the model and the interpreter and runs it.

use crate::oracle_env;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Arguments of `parity-fixtures`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF to run (default: `$SYNAPSE_MODEL_DIR/gemma-3-270m-q4_k_m.gguf`, where
    /// `SYNAPSE_MODEL_DIR` defaults to `${XDG_CACHE_HOME:-~/.cache}/synapse/models`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Output folder (default: `fixtures/parity`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// File name of the default real model (Gemma 3 270M Q4_K_M).
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The folder holding downloaded models: `$SYNAPSE_MODEL_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/synapse/models`.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SYNAPSE_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache")
        });
    cache.join("synapse").join("models")
}

/// `--model` if given, else the default model in [`model_dir`]; errors if the file is missing.
pub fn resolve_model(model: Option<&Path>) -> Result<PathBuf> {
    let p = match model {
        Some(p) => p.to_path_buf(),
        None => model_dir().join(DEFAULT_MODEL_FILE),
    };
    if !p.is_file() {
        bail!(
            "model not found at {}: pass --model PATH or set SYNAPSE_MODEL_DIR to the folder holding {}",
            p.display(),
            DEFAULT_MODEL_FILE
        );
    }
    Ok(p)
}

/// Runs `xtask/py/<script>` with the oracle venv's interpreter; fails if it fails.
pub fn run_py(script: &str, args: &[&std::ffi::OsStr], envs: &[(&str, &Path)]) -> Result<()> {
    let py = oracle_env::python()?;
    let path = oracle_env::repo_root().join("xtask/py").join(script);
    let mut cmd = Command::new(&py);
    cmd.arg(&path).args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let status = cmd
        .status()
        .with_context(|| format!("spawning {} {}", py.display(), path.display()))?;
    if !status.success() {
        bail!("{} failed with {status}", path.display());
    }
    Ok(())
}

/// Regenerates the parity fixtures.
pub fn run(args: Args) -> Result<()> {
    let model = resolve_model(args.model.as_deref())?;
    let out = args
        .out
        .unwrap_or_else(|| oracle_env::repo_root().join("fixtures/parity"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!(
        "parity-fixtures: llama.cpp on {} -> {}",
        model.display(),
        out.display()
    );
    run_py(
        "parity_fixtures.py",
        &[model.as_os_str(), out.as_os_str()],
        &[],
    )
}
