//! `synapse-cli refine`: a budget's precision profile refined by the KL divergence it measures
//! on calibration text (`synapse_runtime::refine`), saved for `--profile FILE`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use synapse_runtime::precision::{SAVED_PROFILE_FORMAT, SavedProfile};
use synapse_runtime::refine::{KlProbe, RefineParams, refine};

use super::load::{ModelArgs, PrecisionArgs, perplexity_tokens};

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Resident weight bytes to fit, as for `generate --budget` (`180MB`, `75%`, a byte count).
    #[arg(long)]
    budget: String,
    /// The importance map the candidates come from (default: as for `--budget`).
    #[arg(long)]
    map: Option<PathBuf>,
    /// Calibration text (UTF-8): the calibration part only, never the evaluation text.
    #[arg(long)]
    calib: PathBuf,
    /// Tokens per chunk of the KL measurements.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Chunks of calibration text each measurement scores (the source's logits of their
    /// scored rows are kept in memory: chunks · ctx/2 · vocabulary floats).
    #[arg(long, default_value_t = 2)]
    chunks: usize,
    /// At most this many measurements.
    #[arg(long, default_value_t = 200)]
    evals: usize,
    /// Where to write the profile (`--profile FILE` runs it).
    #[arg(long, short = 'o')]
    out: PathBuf,
    /// Quantize re-encoded tensors here instead of through the store's variant cache.
    #[arg(long)]
    no_variant_cache: bool,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Print one JSON object (the result and every measurement) instead of a summary.
    #[arg(long)]
    json: bool,
}

/// Runs `refine`.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.chunks == 0 {
        bail!("--chunks must be at least 1");
    }
    let text = std::fs::read_to_string(&a.calib)
        .with_context(|| format!("reading {} (UTF-8 text)", a.calib.display()))?;
    let (model, tok) = a.model.load()?;
    let model = Arc::new(model);
    let precision = PrecisionArgs {
        budget: Some(a.budget.clone()),
        map: a.map.clone(),
        no_variant_cache: a.no_variant_cache,
        ..PrecisionArgs::default()
    };
    let (budget, map) = precision
        .budget_and_map(&model, a.model.model.as_deref(), a.model.store.as_deref())?
        .expect("a budget was given");
    let cache = precision.variant_cache(a.model.store.as_deref())?;
    let (tokens, p) = perplexity_tokens(&tok, &text, a.ctx, Some(a.chunks))?;
    let want = budget.bytes(model.weight_bytes() as u64);
    let t0 = Instant::now();
    let probe = KlProbe::new(&model, &tokens, &p, a.threads)?;
    if !a.json {
        eprintln!(
            "refine: budget {want} B; source logits of {} calibration rows kept ({:.1} s)",
            probe.rows(),
            t0.elapsed().as_secs_f64()
        );
    }
    let json = a.json;
    let r = refine(
        &model,
        &map,
        want,
        &probe,
        RefineParams { max_evals: a.evals },
        cache.as_ref(),
        |e, done, max| {
            if !json {
                eprintln!(
                    "  [{done}/{max}] {:<60} {:>11} B  KL {:.5}{}",
                    e.what,
                    e.bytes,
                    e.kl,
                    if e.kept { "  kept" } else { "" }
                );
            }
        },
    )?;
    let secs = t0.elapsed().as_secs_f64();
    let calib_hash = blake3::hash(text.as_bytes()).to_hex().to_string();
    let saved = SavedProfile {
        format: SAVED_PROFILE_FORMAT.into(),
        model_fingerprint: model.ir.fingerprint.clone(),
        resident_bytes: r.resident_bytes,
        made_by: format!(
            "synapse-cli refine: budget {want} B, {} measurements of the KL divergence on {} \
             rows of calibration text {calib_hash} (ctx {}), map calibrated on {}",
            r.evaluations.len(),
            probe.rows(),
            a.ctx,
            map.provenance.calibration_hash
        ),
        measured_kl: Some(r.kl),
        profile: r.profile.clone(),
    };
    let tmp = a.out.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&saved)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &a.out).with_context(|| format!("writing {}", a.out.display()))?;
    if json {
        let j = serde_json::json!({
            "out": a.out,
            "budget_bytes": want,
            "resident_bytes": r.resident_bytes,
            "kl": r.kl,
            "select_best_kl": r.select_best_kl,
            "rows": probe.rows(),
            "evaluations": r.evaluations,
            "seconds": secs,
        });
        println!("{}", serde_json::to_string(&j)?);
    } else {
        println!(
            "refined: KL {:.5} on calibration text (the selector's own profile: {:.5}), {} B \
             resident of a {want} B budget, {} measurements in {secs:.0} s → {}",
            r.kl,
            r.select_best_kl,
            r.resident_bytes,
            r.evaluations.len(),
            a.out.display()
        );
    }
    Ok(())
}
