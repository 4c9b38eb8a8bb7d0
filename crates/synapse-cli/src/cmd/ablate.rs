//! `synapse-cli ablate`: an importance map checked against what demoting each tensor group
//! actually does (`synapse_runtime::ablation`): per group the predicted distortion, the
//! measured KL divergence from the source on held-out text, and Spearman's ρ of the two.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args as ClapArgs;
use synapse_runtime::ablation::{ablate, layer_groups};

use super::load::ModelArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Held-out text (UTF-8; the evaluation part, never the calibration text).
    #[arg(long, short = 'f')]
    file: PathBuf,
    /// The importance map (default: the one `synapse-cli importance` stored for this model).
    #[arg(long)]
    map: Option<PathBuf>,
    /// The encoding each group is demoted to.
    #[arg(long, default_value = "syn.q3.symmetric.g64.v1")]
    encoding: String,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Chunks scored per group.
    #[arg(long, default_value_t = 1)]
    chunks: usize,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `ablate`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {} (UTF-8 text)", a.file.display()))?;
    if a.file.file_name().is_some_and(|n| n == "calibration.txt") {
        anyhow::bail!(
            "{}: ablation validates on held-out text, not on the calibration part",
            a.file.display()
        );
    }
    let (model, tok) = a.model.load()?;
    let model = Arc::new(model);
    let map = super::load::read_map(
        a.map.as_deref(),
        &model.ir.fingerprint,
        a.model.package()?.as_ref(),
    )?;
    let enc = synapse_codecs::EncodingId::parse(&a.encoding)
        .with_context(|| format!("--encoding {:?}", a.encoding))?;
    let (tokens, p) = super::load::perplexity_tokens(&tok, &text, a.ctx, Some(a.chunks.max(1)))?;
    let groups = layer_groups(&model);
    let t0 = Instant::now();
    let r = ablate(
        &model,
        &map,
        enc,
        &groups,
        &tokens,
        &p,
        a.threads,
        |done, total, row| {
            eprintln!(
                "  [{done}/{total}] {:<14} predicted {:.5e}  KL {:.6}  ({:.0} s)",
                row.group,
                row.predicted,
                row.kl,
                t0.elapsed().as_secs_f64()
            );
        },
    )?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} groups demoted to {}, {} tokens each: Spearman rho(predicted distortion, KL) = {}",
            r.rows.len(),
            r.encoding,
            r.tokens,
            r.spearman.map_or("n/a".into(), |v| format!("{v:.3}"))
        );
    }
    Ok(())
}
