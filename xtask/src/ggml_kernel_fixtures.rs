//! `cargo xtask ggml-kernel-fixtures`: ggml's own `mul_mat` outputs per weight type at several
//! activation-row counts and its CPU activation quantizers, the kernel-level oracle of
//! `crates/synapse-kernels/tests/ggml_oracle.rs` and `act.rs`'s tests. Regenerates
//! `fixtures/ggml-kernels/` (format: `fixtures/README.md`) through
//! `xtask/py/ggml_kernel_fixtures.py` in the oracle venv.

use crate::oracle_env;
use crate::parity_fixtures::run_py;
use anyhow::{Context, Result};
use std::path::PathBuf;

/// Arguments of `ggml-kernel-fixtures`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output folder (default: `fixtures/ggml-kernels`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Regenerates the fixtures.
pub fn run(args: Args) -> Result<()> {
    let out = args
        .out
        .unwrap_or_else(|| oracle_env::repo_root().join("fixtures/ggml-kernels"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!(
        "ggml-kernel-fixtures: ggml mul_mat + quantizers -> {}",
        out.display()
    );
    run_py("ggml_kernel_fixtures.py", &[out.as_os_str()], &[])
}
