//! `cargo xtask tiny-models`: tiny random-weight models of every family (transformers →
//! safetensors → GGUF F32/Q8_0 via llama.cpp's `convert_hf_to_gguf.py`) with transformers' and
//! llama.cpp's logits for fixed token sequences. Regenerates `fixtures/tiny/` (format:
//! `fixtures/README.md`).
//!
//! The work is done by `xtask/py/tiny_models.py` in the oracle venv (needs torch, transformers,
//! safetensors, sentencepiece and llama-cpp-python there).

use crate::{oracle_env, parity_fixtures::run_py};
use anyhow::{Result, bail};
use std::ffi::OsStr;
use std::path::PathBuf;

/// The families the generator can make (folder names under `fixtures/tiny/`).
pub const FAMILIES: [&str; 6] = ["llama", "qwen2", "gemma3", "olmoe", "granitemoe", "bitnet"];

/// The families made when none are named: those whose fixtures are committed.
pub const COMMITTED: [&str; 3] = ["llama", "qwen2", "gemma3"];

/// Arguments of `tiny-models`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The llama.cpp source tree holding `convert_hf_to_gguf.py` and `gguf-py/` (default:
    /// `$SYNAPSE_LLAMA_CPP_DIR`, else `<venv>/../llama_cpp_python-0.3.36/vendor/llama.cpp`).
    #[arg(long, env = "SYNAPSE_LLAMA_CPP_DIR")]
    llama_cpp_dir: Option<PathBuf>,
    /// Output folder (default: `fixtures/tiny`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Families to make (default: the committed ones, llama qwen2 gemma3; also known: olmoe
    /// granitemoe bitnet).
    families: Vec<String>,
}

/// Regenerates the tiny-model fixtures.
pub fn run(args: Args) -> Result<()> {
    let llama_dir = args.llama_cpp_dir.unwrap_or_else(|| {
        oracle_env::venv_dir()
            .parent()
            .map(|p| p.join("llama_cpp_python-0.3.36/vendor/llama.cpp"))
            .unwrap_or_default()
    });
    if !llama_dir.join("convert_hf_to_gguf.py").is_file() {
        bail!(
            "no convert_hf_to_gguf.py in {}: unpack the llama-cpp-python 0.3.36 sdist \
             (`pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36`) and pass \
             --llama-cpp-dir <sdist>/vendor/llama.cpp",
            llama_dir.display()
        );
    }
    for f in &args.families {
        if !FAMILIES.contains(&f.as_str()) {
            bail!("unknown family {f}; known: {}", FAMILIES.join(", "));
        }
    }
    let out = args
        .out
        .unwrap_or_else(|| oracle_env::repo_root().join("fixtures/tiny"));
    println!(
        "tiny-models: converting with {} -> {}",
        llama_dir.display(),
        out.display()
    );
    let mut argv: Vec<&OsStr> = vec![llama_dir.as_os_str(), out.as_os_str()];
    if args.families.is_empty() {
        argv.extend(COMMITTED.iter().map(OsStr::new));
    } else {
        argv.extend(args.families.iter().map(OsStr::new));
    }
    run_py("tiny_models.py", &argv, &[])
}
