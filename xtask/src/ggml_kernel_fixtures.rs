//! `cargo xtask ggml-kernel-fixtures`: ggml's own `mul_mat` outputs per weight type at several
//! activation-row counts and its CPU activation quantizers, the kernel-level oracle of
//! `crates/synapse-kernels/tests/ggml_oracle.rs` and `act.rs`'s tests. Regenerates
//! `fixtures/ggml-kernels/` (format: `fixtures/README.md`) through
//! `xtask/py/ggml_kernel_fixtures.py` in the oracle venv.

use anyhow::Result;
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
    crate::parity_fixtures::run_fixture_script(
        "ggml-kernel-fixtures: ggml mul_mat + quantizers",
        "ggml_kernel_fixtures.py",
        args.out,
        "fixtures/ggml-kernels",
    )
}
