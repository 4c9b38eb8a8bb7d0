//! `cargo xtask synthetic-bitnet`: a BitNet b1.58 GGUF of microsoft/bitnet-b1.58-2B-4T's shape
//! with random ternary weights, for end-to-end speed benchmarks (`bench-vs-llama --model
//! <file>`; the model and its layout: `synapse_testdata::synthetic_bitnet`).

use anyhow::{Result, anyhow, bail};
use std::path::PathBuf;
use synapse_formats::GgmlType;
use synapse_testdata::synthetic_bitnet::{BitnetShape, write};

use crate::oracle_env::repo_root;

/// Arguments of `synthetic-bitnet` (defaults: the 2B4T shape).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model width.
    #[arg(long, default_value_t = 2560)]
    pub hidden: u32,
    /// Transformer blocks.
    #[arg(long, default_value_t = 30)]
    pub layers: u32,
    /// FFN width.
    #[arg(long, default_value_t = 6912)]
    pub ff: u32,
    /// Query heads.
    #[arg(long, default_value_t = 20)]
    pub heads: u32,
    /// Key/value heads.
    #[arg(long, default_value_t = 5)]
    pub kv_heads: u32,
    /// Vocabulary size.
    #[arg(long, default_value_t = 128_256)]
    pub vocab: u32,
    /// The projections' encoding: tq2_0 or tq1_0.
    #[arg(long, default_value = "tq2_0")]
    pub ternary: String,
    /// The tied embedding / LM head's encoding: f16 (what llama.cpp's converter writes) or q8_0.
    #[arg(long, default_value = "f16")]
    pub embedding: String,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file (default: `<target>/synthetic-bitnet/<shape>.gguf`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Writes the model (or keeps an existing file of the same shape); returns its path.
pub fn run(args: Args) -> Result<PathBuf> {
    let pick = |s: &str, allowed: &[GgmlType]| {
        allowed
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    };
    let Some(ternary) = pick(&args.ternary, &[GgmlType::TQ2_0, GgmlType::TQ1_0]) else {
        bail!("--ternary {}: tq2_0 or tq1_0", args.ternary);
    };
    let Some(embedding) = pick(&args.embedding, &[GgmlType::F16, GgmlType::Q8_0]) else {
        bail!("--embedding {}: f16 or q8_0", args.embedding);
    };
    let shape = BitnetShape {
        hidden: args.hidden,
        layers: args.layers,
        ff: args.ff,
        heads: args.heads,
        kv_heads: args.kv_heads,
        vocab: args.vocab,
        ternary,
        embedding,
        seed: args.seed,
    };
    let out = args.out.clone().unwrap_or_else(|| {
        repo_root()
            .join("target/synthetic-bitnet")
            .join(shape.file_name())
    });
    if out.is_file() {
        println!(
            "synthetic-bitnet: {} exists (same shape and seed)",
            out.display()
        );
        return Ok(out);
    }
    println!("synthetic-bitnet: writing {} ...", out.display());
    write(&shape, &out).map_err(|e| anyhow!("synthetic-bitnet: {e}"))?;
    let (proj, head) = shape.weight_bytes();
    println!(
        "synthetic-bitnet: wrote {} ({:.1} MB: {} layers of hidden {}, FFN {}, {}/{} heads, \
         projections {:.1} MB {}, tied embedding/head {:.1} MB {})",
        out.display(),
        std::fs::metadata(&out)?.len() as f64 / 1e6,
        shape.layers,
        shape.hidden,
        shape.ff,
        shape.heads,
        shape.kv_heads,
        proj as f64 / 1e6,
        ternary,
        head as f64 / 1e6,
        embedding
    );
    Ok(out)
}
