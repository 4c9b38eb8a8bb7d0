//! `cargo xtask vocab-suite`: fetches llama.cpp's tokenizer test suite.
//!
//! The suite (`models/ggml-vocab-*.gguf` with `.gguf.inp`/`.gguf.out` case files) ships inside
//! the llama-cpp-python source distribution on PyPI. This downloads that sdist with pip
//! (`--no-binary llama-cpp-python`, ~77 MB, no build) and extracts only the vocabulary files
//! and the chat templates (`models/templates/*.jinja`) into
//! `${XDG_CACHE_HOME:-~/.cache}/synapse/vocab-suite/`, where
//! `crates/synapse-tokenizer/tests/vocab_suite.rs` finds them.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned llama-cpp-python version whose vendored llama.cpp is the oracle.
pub const LLAMA_CPP_PYTHON: &str = "0.3.36";

/// Arguments of `vocab-suite`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to put the suite (default: the user cache folder).
    #[arg(long)]
    dest: Option<PathBuf>,
    /// Use an already downloaded sdist (.tar.gz) instead of calling pip.
    #[arg(long)]
    sdist: Option<PathBuf>,
    /// Fetch again even if the suite is already there.
    #[arg(long)]
    force: bool,
}

/// `${XDG_CACHE_HOME:-~/.cache}/synapse/vocab-suite`.
pub fn default_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("synapse").join("vocab-suite")
}

fn python() -> PathBuf {
    // The oracle venv if there is one, else the system interpreter (pip only downloads here).
    crate::oracle_env::python().unwrap_or_else(|_| PathBuf::from("python3"))
}

fn has_suite(dir: &Path) -> bool {
    dir.join("ggml-vocab-llama-spm.gguf.inp").exists()
        && dir.join("ggml-vocab-llama-spm.gguf").exists()
}

/// Downloads and extracts the suite.
pub fn run(args: Args) -> Result<()> {
    let dest = args.dest.unwrap_or_else(default_dir);
    if has_suite(&dest) && !args.force {
        println!("vocab suite already at {}", dest.display());
        return Ok(());
    }
    std::fs::create_dir_all(&dest).with_context(|| format!("creating {}", dest.display()))?;
    let tmp = dest.join(".download");
    std::fs::create_dir_all(&tmp)?;
    let sdist = match args.sdist {
        Some(p) => p,
        None => {
            let status = Command::new(python())
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    "llama-cpp-python",
                    "-d",
                ])
                .arg(&tmp)
                .arg(format!("llama-cpp-python=={LLAMA_CPP_PYTHON}"))
                .status()
                .context("running pip download")?;
            if !status.success() {
                bail!("pip download of llama-cpp-python=={LLAMA_CPP_PYTHON} failed ({status})");
            }
            tmp.join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
        }
    };
    if !sdist.exists() {
        bail!("sdist not found at {}", sdist.display());
    }
    let prefix = format!("llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/models");
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&dest)
        .args(["--strip-components=4", "--wildcards"])
        .arg(format!("{prefix}/ggml-vocab-*"))
        .arg(format!("{prefix}/templates/*"))
        .status()
        .context("running tar")?;
    if !status.success() {
        bail!("extracting {} failed ({status})", sdist.display());
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if !has_suite(&dest) {
        bail!("the sdist did not contain the vocab suite");
    }
    let n = std::fs::read_dir(&dest)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".gguf.inp"))
        .count();
    println!(
        "vocab suite ready: {} ({n} vocabularies with test cases)",
        dest.display()
    );
    Ok(())
}
