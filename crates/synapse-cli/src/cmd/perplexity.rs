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
    /// Run every linear in one Synapse encoding (`uniform:syn.q4.symmetric.g64.v1`) and
    /// report the mean KL divergence from the source precision beside the perplexity.
    #[arg(long, value_name = "uniform:ENCODING")]
    profile: Option<String>,
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
    // `--profile uniform:ID`: the variant runs, the source is the KL reference.
    let variant = match &a.profile {
        None => None,
        Some(spec) => {
            let Some(id) = spec.strip_prefix("uniform:") else {
                bail!(
                    "--profile takes uniform:ENCODING (e.g. uniform:syn.q4.symmetric.g64.v1), not {spec:?}"
                );
            };
            let id = synapse_codecs::EncodingId::parse(id)
                .with_context(|| format!("--profile: unknown encoding {id:?}"))?;
            let all = synapse_runtime::importance::linears(&model)
                .into_iter()
                .map(|(n, _)| (n, id))
                .collect();
            Some(Arc::new(model.with_encodings(&all)?))
        }
    };
    let mut reference = match &variant {
        Some(_) => Some(Executor::new(model.clone(), a.threads)?),
        None => None,
    };
    let run_model = variant.clone().unwrap_or_else(|| model.clone());
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
