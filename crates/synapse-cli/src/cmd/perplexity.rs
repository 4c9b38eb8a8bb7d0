//! `synapse-cli perplexity`: a text's perplexity under a model, computed as llama.cpp's
//! `llama-perplexity` does (`synapse_runtime::perplexity`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use synapse_runtime::Executor;
use synapse_runtime::perplexity::{PerplexityParams, perplexity_against};

use super::load::ModelArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file (UTF-8).
    #[arg(long, short = 'f')]
    file: PathBuf,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Rows per forward pass (at most `--ctx`).
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// At most this many chunks (default: every whole chunk of the text).
    #[arg(long)]
    chunks: Option<usize>,
    #[command(flatten)]
    precision: super::load::PrecisionArgs,
    /// Report the KL divergence from this model instead (another file of the same model, e.g.
    /// the source a re-quantized GGUF was made from). It must tokenize the text the same way
    /// and have the same vocabulary size; that is all that is checked, so another model of the
    /// same vocabulary is accepted (the KL between two models).
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Print one JSON object instead of llama.cpp-style lines.
    #[arg(long)]
    json: bool,
}

/// Runs `perplexity`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {} (UTF-8 text)", a.file.display()))?;
    let (model, tok) = a.model.load()?;
    let model = Arc::new(model);
    let tokens = tok.encode(&text, true, false)?;
    let bos = tok.bos().filter(|&b| tokens.first() == Some(&b));
    if a.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    // Another precision than the source's: the variant runs, the source is the KL reference.
    let prepared = a
        .precision
        .apply(&model, a.model.model.as_deref(), a.model.store.as_deref())?;
    let applied = &prepared.applied;
    let run_model = applied.model.clone();
    let mut reference = if let Some(r) = &a.reference {
        let (rm, rtok) = super::load::load_model(Some(r), a.model.store.as_deref(), false)?;
        let head = &text[..text.char_indices().nth(4096).map_or(text.len(), |(i, _)| i)];
        if rtok.encode(head, true, false)? != tok.encode(head, true, false)? {
            bail!("--reference tokenizes the text differently: not the same model");
        }
        Some(Executor::new(Arc::new(rm), a.threads)?)
    } else if Arc::ptr_eq(&run_model, &model) {
        None
    } else {
        Some(Executor::new(model.clone(), a.threads)?)
    };
    let mut exec = Executor::new(run_model.clone(), a.threads)?;
    let t0 = Instant::now();
    let p = PerplexityParams {
        ctx: a.ctx,
        batch: a.batch,
        max_chunks: a.chunks,
        bos,
    };
    let json = a.json;
    let r = perplexity_against(&mut exec, reference.as_mut(), &tokens, &p, |i, ppl| {
        if !json {
            eprint!("[{}]{ppl:.4},", i + 1);
        }
    })?;
    let secs = t0.elapsed().as_secs_f64();
    if json {
        let j = serde_json::json!({
            "ppl": r.ppl,
            "ppl_err": r.ppl_err,
            "nll": r.nll,
            "tokens": r.count,
            "text_tokens": tokens.len(),
            "chunks": r.running.len(),
            "running": r.running,
            "ctx": a.ctx,
            "kl": r.kl,
            "profile": run_model.profile.hash(),
            "weight_bytes": run_model.weight_bytes(),
            "source_weight_bytes": model.weight_bytes(),
            "budget_distortion": applied.profile.as_ref().map(|p| p.total_distortion),
            "variants": prepared.json(),
            "seconds": secs,
        });
        println!("{}", serde_json::to_string(&j)?);
    } else {
        eprintln!();
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5} ({} tokens scored in {} chunks of {}, {:.1} s){}",
            r.ppl,
            r.ppl_err,
            r.count,
            r.running.len(),
            a.ctx,
            secs,
            r.kl.map_or(String::new(), |k| format!(", KL vs source {k:.6}"))
        );
    }
    Ok(())
}
