//! `synapse-cli importance`: the importance map of a model (`synapse_runtime::importance`):
//! calibration text through the executor, every linear measured under the codec ladder on its
//! own captured inputs, written as the map's versioned JSON.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use synapse_runtime::Executor;
use synapse_runtime::importance::{ImportanceParams, build_importance_map_and_imatrix};

use super::load::ModelArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Calibration text (UTF-8): the calibration part only, never the evaluation text
    /// (`cargo xtask text-corpus` writes both).
    #[arg(long)]
    calib: PathBuf,
    /// Tokens of the text to run (its first ones).
    #[arg(long, default_value_t = 8192)]
    tokens: usize,
    /// Input rows kept per capture site.
    #[arg(long, default_value_t = 512)]
    rows: usize,
    /// Positions per session (the text runs in sessions of this many tokens).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Where to write the map (JSON; default: the model's stored map, which `--budget` then
    /// finds by itself: `$SYNAPSE_IMPORTANCE_DIR` or `~/.cache/synapse/importance`, one
    /// `<model fingerprint>.json` per model; when `--model` is a Synapse package, the map is
    /// also stored in the package, whose own map `--budget` then prefers).
    #[arg(long, short = 'o')]
    out: Option<PathBuf>,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also write the importance matrix of the same pass (per linear, the mean `x²` of each
    /// input column: llama.cpp's `imatrix`, for `llama_model_quantize`) as JSON.
    #[arg(long)]
    imatrix_out: Option<PathBuf>,
    /// Keep the measured distortions of the stored map (or `--map`), and measure its KL weights
    /// afresh (at `--kl-encoding`); no capture pass.
    #[arg(long, conflicts_with_all = ["imatrix_only", "no_kl_weights"])]
    reweight: bool,
    /// The map `--reweight` starts from (default: the stored one).
    #[arg(long, requires = "reweight")]
    map: Option<PathBuf>,
    /// Only the capture pass and `--imatrix-out` (no map is measured or written).
    #[arg(long, requires = "imatrix_out")]
    imatrix_only: bool,
    /// Skip weighting tensors by measured KL (by default each group of tensors — a layer's
    /// attention, its FFN, the head — is demoted alone to `--kl-encoding` on calibration text
    /// and its KL divergence per unit of predicted distortion becomes its tensors' weight).
    #[arg(long)]
    no_kl_weights: bool,
    /// The encoding the KL weights are measured at (one the map measures; default
    /// `syn.q4.symmetric.g64.v1`, or with a `--ladder` without it the ladder's encoding
    /// nearest to it in bits per weight).
    #[arg(long)]
    kl_encoding: Option<String>,
    /// Chunks of `--ctx` calibration tokens each KL-weight ablation scores.
    #[arg(long, default_value_t = 2)]
    kl_chunks: usize,
    /// The candidate encodings measured: `default` (the default ladder: symmetric g64 8…2,
    /// asymmetric g64 6…2, ggml's q8_0/q6_k/q5_1/q5_0/q5_k/q4_1/q4_0/q4_k, ternary g64),
    /// `ggml` (ggml's eight types alone: every budget's profile is one llama.cpp runs, see
    /// `export-gguf`), or a comma-separated list of encoding IDs (fewer candidates measure
    /// faster; a budget then picks among them).
    #[arg(long, default_value = "default")]
    ladder: String,
}

/// The encoding the KL weights are measured at: `--kl-encoding` (which must be among the
/// candidates measured, when they are known here), else `syn.q4.symmetric.g64.v1`, or the
/// candidate nearest to it in bits per weight when the ladder lacks it.
fn kl_encoding(
    given: Option<&str>,
    ladder: Option<&[synapse_codecs::EncodingId]>,
) -> anyhow::Result<synapse_codecs::EncodingId> {
    use synapse_codecs::EncodingId;
    let q4 = EncodingId::Symmetric { bits: 4, group: 64 };
    match (given, ladder) {
        (Some(s), l) => {
            let e = EncodingId::parse(s).with_context(|| format!("--kl-encoding {s:?}"))?;
            if l.is_some_and(|l| !l.contains(&e)) {
                bail!("--kl-encoding {s} is not among the encodings --ladder measures");
            }
            Ok(e)
        }
        (None, Some(l)) if !l.contains(&q4) => l
            .iter()
            .copied()
            .min_by(|a, b| {
                let d = |e: &EncodingId| (e.bits_per_weight() - q4.bits_per_weight()).abs();
                d(a).total_cmp(&d(b))
            })
            .context("--ladder names no encoding"),
        (None, _) => Ok(q4),
    }
}

/// `--ladder`'s candidates: the default ladder, ggml's types alone, or the listed IDs (each
/// valid, none twice), most bits per weight first.
fn parse_ladder(spec: &str) -> anyhow::Result<Vec<synapse_codecs::EncodingId>> {
    match spec {
        "default" => return Ok(synapse_codecs::default_ladder()),
        "ggml" => {
            return Ok(synapse_codecs::GgmlBlock::ALL
                .map(synapse_codecs::EncodingId::Ggml)
                .to_vec());
        }
        _ => {}
    }
    let mut v = Vec::new();
    for s in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let id = synapse_codecs::EncodingId::parse(s).with_context(|| format!("--ladder {s:?}"))?;
        if v.contains(&id) {
            bail!("--ladder names {s} twice");
        }
        v.push(id);
    }
    if v.is_empty() {
        bail!("--ladder names no encoding (`default`, or IDs separated by commas)");
    }
    v.sort_by(|a, b| b.bits_per_weight().total_cmp(&a.bits_per_weight()));
    Ok(v)
}

/// Runs `importance`.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.calib.file_name().is_some_and(|n| n == "evaluation.txt") {
        bail!(
            "{}: the held-out evaluation text is never used for calibration",
            a.calib.display()
        );
    }
    let ladder = parse_ladder(&a.ladder)?;
    let kl_encoding = kl_encoding(
        a.kl_encoding.as_deref(),
        (!a.reweight).then_some(&ladder[..]),
    )?;
    let bytes =
        std::fs::read(&a.calib).with_context(|| format!("reading {}", a.calib.display()))?;
    let text = String::from_utf8(bytes).context("the calibration text is not UTF-8")?;
    let (model, tok) = a.model.load()?;
    let model = Arc::new(model);
    let mut ids = tok.encode(&text, true, false)?;
    ids.truncate(a.tokens);
    if ids.is_empty() {
        bail!("the calibration text tokenizes to nothing");
    }
    let mut exec = Executor::new(model.clone(), a.threads)?;
    let p = ImportanceParams {
        max_rows: a.rows,
        batch: a.ctx.min(512),
        ctx: a.ctx,
        text_id: blake3::hash(text.as_bytes()).to_hex().to_string(),
        ladder,
    };
    let p = if a.imatrix_only {
        ImportanceParams {
            ladder: Vec::new(),
            ..p
        }
    } else {
        p
    };
    let t0 = Instant::now();
    eprintln!(
        "importance: {} calibration tokens, {} rows per site",
        ids.len(),
        a.rows
    );
    let (map, imatrix) = if a.reweight {
        let mut m = super::load::read_map(
            a.map.as_deref(),
            &model.ir.fingerprint,
            a.model.package()?.as_ref(),
        )?;
        m.check_applies_to(&model.ir.fingerprint)?;
        for t in m.tensors.values_mut() {
            t.kl_weight = 1.0;
        }
        (m, Default::default())
    } else {
        build_importance_map_and_imatrix(&mut exec, &ids, &p, |done, total, name| {
            eprintln!(
                "  [{done}/{total}] {name} ({:.1} s)",
                t0.elapsed().as_secs_f64()
            );
        })?
    };
    if let Some(p) = &a.imatrix_out {
        std::fs::write(p, serde_json::to_string(&imatrix)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!(
            "importance: imatrix of {} tensors -> {}",
            imatrix.len(),
            p.display()
        );
    }
    if a.imatrix_only {
        return Ok(());
    }
    let mut map = map;
    if !a.no_kl_weights {
        use synapse_runtime::ablation::{kl_weights, layer_groups};
        let enc = kl_encoding;
        let (all, p) =
            super::load::perplexity_tokens(&tok, &text, a.ctx, Some(a.kl_chunks.max(1)))?;
        let groups = layer_groups(&model);
        eprintln!(
            "importance: KL weights, {} groups at {} on {} calibration chunks",
            groups.len(),
            enc,
            a.kl_chunks
        );
        let w = kl_weights(
            &model,
            &map,
            enc,
            &groups,
            &all,
            &p,
            a.threads,
            |d, n, r| {
                eprintln!(
                    "  [{d}/{n}] {:<14} predicted {:.4e} KL {:.5} ({:.1} s)",
                    r.group,
                    r.predicted,
                    r.kl,
                    t0.elapsed().as_secs_f64()
                );
            },
        )?;
        map.set_kl_weights(
            &w,
            format!(
                "ablation at {enc}, {} chunks of {} calibration tokens",
                a.kl_chunks, a.ctx
            ),
        )?;
    }
    let out = match &a.out {
        Some(p) => p.clone(),
        None => {
            let p = super::load::stored_map_path(&model.ir.fingerprint)?;
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            }
            p
        }
    };
    // Written whole to a temporary file, then renamed: a stored map is never half written.
    let tmp = out.with_extension("json.tmp");
    std::fs::write(&tmp, map.to_json()? + "\n")
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &out).with_context(|| format!("writing {}", out.display()))?;
    // A package keeps its own map too (`--budget` prefers it): a new manifest with the map in
    // its importance slot.
    if a.out.is_none()
        && let Some(pkg) = a.model.package()?
    {
        let pv = &map.provenance;
        let calibration = [
            ("model_fingerprint", pv.model_fingerprint.clone()),
            ("calibration_hash", pv.calibration_hash.clone()),
            ("sample_count", pv.sample_count.to_string()),
            ("codec_versions", pv.codec_versions.join(",")),
            ("kl_weights", pv.kl_weights.clone().unwrap_or_default()),
            ("tool", format!("synapse-cli {}", env!("CARGO_PKG_VERSION"))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let new = pkg
            .with_importance((map.to_json()? + "\n").as_bytes(), calibration)
            .with_context(|| format!("storing the map in package {}", pkg.hash()))?;
        eprintln!(
            "importance: stored in the package: {} (was {}), manifest {}",
            new.hash(),
            pkg.hash(),
            new.manifest_path().display()
        );
    }
    eprintln!(
        "importance: {} tensors, calibration {}, {} samples -> {} ({:.1} s)",
        map.tensors.len(),
        &map.provenance.calibration_hash[..12],
        map.provenance.sample_count,
        out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
