//! The oracle toolchain: a Python venv holding llama.cpp's own code (gguf-py, llama-cpp-python).
//! Everything comes from PyPI. Generators that need it call [`python`] to find its interpreter.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Arguments of `oracle-env`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also build llama-cpp-python (compiles llama.cpp: 4–8 minutes on 2 cores).
    #[arg(long)]
    llama: bool,
}

/// The venv folder: `$SYNAPSE_ORACLE_VENV`, else `<repo>/.venv-oracle`.
pub fn venv_dir() -> PathBuf {
    std::env::var_os("SYNAPSE_ORACLE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv-oracle"))
}

/// The repository root (the parent of `xtask/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the repo")
        .to_path_buf()
}

#[allow(dead_code)] // used by the fixture generators as they land
/// The venv's python interpreter; errors with the command to run if it is missing.
pub fn python() -> Result<PathBuf> {
    let py = venv_dir().join("bin/python");
    if !py.exists() {
        bail!(
            "oracle venv missing at {}: run `cargo xtask oracle-env --llama` (or set SYNAPSE_ORACLE_VENV)",
            venv_dir().display()
        );
    }
    Ok(py)
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Creates the venv and installs the pinned oracle packages.
pub fn run(args: Args) -> Result<()> {
    let venv = venv_dir();
    if !venv.join("bin/python").exists() {
        run_cmd(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    let pip = venv.join("bin/pip");
    run_cmd(Command::new(&pip).args(["install", "-q", "gguf==0.19.0", "numpy"]))?;
    if args.llama {
        run_cmd(
            Command::new(&pip)
                .args(["install", "-q", "llama-cpp-python==0.3.36"])
                .env("CMAKE_ARGS", "-DGGML_NATIVE=ON")
                .env("CMAKE_BUILD_PARALLEL_LEVEL", "2"),
        )?;
    }
    println!("oracle venv ready: {}", venv.display());
    Ok(())
}
