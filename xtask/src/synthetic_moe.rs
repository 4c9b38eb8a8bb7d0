//! `cargo xtask synthetic-moe`: a mixture-of-experts GGUF of realistic size with random
//! weights, for paging and speed benchmarks (the model and its layout:
//! `synapse_testdata::synthetic_moe`).

use anyhow::{Result, anyhow, bail};
use std::path::PathBuf;
use synapse_formats::GgmlType;
use synapse_testdata::synthetic_moe::{MoeShape, write};

use crate::oracle_env::repo_root;

/// Arguments of `synthetic-moe`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Experts per layer.
    #[arg(long, default_value_t = 32)]
    pub experts: u32,
    /// Experts each token runs.
    #[arg(long, default_value_t = 4)]
    pub top_k: u32,
    /// Model width.
    #[arg(long, default_value_t = 1024)]
    pub hidden: u32,
    /// Each expert's FFN width.
    #[arg(long, default_value_t = 1024)]
    pub expert_ff: u32,
    /// Transformer blocks.
    #[arg(long, default_value_t = 12)]
    pub layers: u32,
    /// Weight encoding of the projections and experts: q8_0 or q4_0.
    #[arg(long, default_value = "q8_0")]
    pub encoding: String,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file (default: `<target>/synthetic-moe/<shape>.gguf`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The shape the arguments describe.
pub fn shape(args: &Args) -> Result<MoeShape> {
    let encoding = match args.encoding.as_str() {
        "q8_0" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        other => bail!("--encoding {other}: q8_0 or q4_0"),
    };
    Ok(MoeShape {
        experts: args.experts,
        top_k: args.top_k,
        hidden: args.hidden,
        expert_ff: args.expert_ff,
        layers: args.layers,
        encoding,
        seed: args.seed,
    })
}

/// Writes the model (or keeps an existing file of the same shape); returns its path.
pub fn run(args: Args) -> Result<PathBuf> {
    let shape = shape(&args)?;
    let out = args.out.clone().unwrap_or_else(|| {
        repo_root()
            .join("target/synthetic-moe")
            .join(shape.file_name())
    });
    write(&shape, &out).map_err(|e| anyhow!("synthetic-moe: {e}"))?;
    let bytes = std::fs::metadata(&out)?.len();
    println!(
        "synthetic-moe: wrote {} ({:.1} MB: {} layers × {} experts of {}×{}, top-{}, {})",
        out.display(),
        bytes as f64 / 1e6,
        shape.layers,
        shape.experts,
        shape.hidden,
        shape.expert_ff,
        shape.top_k,
        args.encoding
    );
    Ok(out)
}
