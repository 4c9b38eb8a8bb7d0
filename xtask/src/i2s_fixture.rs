//! `cargo xtask i2s-fixture`: `fixtures/tiny/bitnet-packed/model.i2_s.gguf`, the tiny packed
//! BitNet checkpoint as bitnet.cpp's `bitnet-b1.58` GGUF with I2_S projections, packed by
//! bitnet.cpp's own `quantize_to_i2_s` (taken from its converter; see `xtask/py/i2s_fixture.py`).

use crate::{oracle_env, parity_fixtures::run_py};
use anyhow::{Result, bail};
use std::ffi::OsStr;
use std::path::PathBuf;

/// Arguments of `i2s-fixture`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// microsoft/BitNet's `utils/convert-hf-to-gguf-bitnet.py` (from a checkout of
    /// github.com/microsoft/BitNet).
    #[arg(long)]
    bitnet_converter: PathBuf,
}

/// Regenerates the I2_S fixture (needs torch, transformers, safetensors, sentencepiece, gguf).
pub fn run(args: Args) -> Result<()> {
    if !args.bitnet_converter.is_file() {
        bail!("{} is not a file", args.bitnet_converter.display());
    }
    let dir = oracle_env::repo_root().join("fixtures/tiny/bitnet-packed");
    if !dir.join("model.safetensors").is_file() {
        bail!(
            "{} has no packed checkpoint: run `cargo xtask tiny-models bitnet-packed` first",
            dir.display()
        );
    }
    run_py(
        "i2s_fixture.py",
        &[args.bitnet_converter.as_os_str(), OsStr::new(&dir)],
        &[],
    )
}
