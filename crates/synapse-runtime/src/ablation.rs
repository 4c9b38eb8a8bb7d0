//! Validation of an importance map by ablation: one group of tensors at a time is demoted to
//! one encoding while every other tensor keeps its source precision, and the mean KL divergence
//! of the next-token distribution from the source's is measured on held-out text (the
//! perplexity protocol, [`crate::perplexity`]). Beside each measurement stands what the map
//! predicted for the same demotion — the sum of the group's measured output distortions, the
//! selector's objective — and the report gives Spearman's rank correlation of the two: how well
//! the map orders what hurts.

use std::collections::BTreeMap;
use std::sync::Arc;

use synapse_codecs::EncodingId;
use synapse_sensitivity::ImportanceMap;
use synapse_sensitivity::rank::spearman;

use crate::error::{Result, RuntimeError};
use crate::executor::Executor;
use crate::load::Model;
use crate::perplexity::{PerplexityParams, perplexity_against};

/// Tensors demoted together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// A name for the report (`blk.3.attn`, `blk.3.ffn`, the head's tensor name).
    pub name: String,
    /// IR weight names of the linears.
    pub tensors: Vec<String>,
}

/// The default grouping: per layer its attention linears (`blk.N.attn`: q, k, v, output) and
/// its FFN's tensors (`blk.N.ffn`: the dense projections, or a mixture's router, shared expert
/// and routed experts' tensors), and the LM head alone.
pub fn layer_groups(model: &Model) -> Vec<Group> {
    let ir = &model.ir;
    let name = |id| ir.weight(id).name.clone();
    let mut groups = Vec::with_capacity(2 * ir.layers.len() + 1);
    for (l, r) in ir.layers.iter().enumerate() {
        let ids = crate::load::layer_weight_ids(r);
        let (attn, ffn) = ids.split_at(4);
        groups.push(Group {
            name: format!("blk.{l}.attn"),
            tensors: attn.iter().map(|&id| name(id)).collect(),
        });
        let mut tensors: Vec<String> = ffn.iter().map(|&id| name(id)).collect();
        if let synapse_model::FfnRegion::Moe(m) = &r.ffn {
            for e in &m.experts {
                for el in [&e.gate, &e.up, &e.down] {
                    let n = name(el.weight);
                    if !tensors.contains(&n) {
                        tensors.push(n);
                    }
                }
            }
        }
        groups.push(Group {
            name: format!("blk.{l}.ffn"),
            tensors,
        });
    }
    let head = name(ir.lm_head.linear.weight);
    groups.push(Group {
        name: head.clone(),
        tensors: vec![head],
    });
    groups
}

/// One group's measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AblationRow {
    /// The group's name.
    pub group: String,
    /// Σ of the map's distortion of the group's tensors at the encoding, each times its
    /// `kl_weight` (the selector's cost).
    pub predicted: f64,
    /// Measured mean KL divergence from the source.
    pub kl: f64,
    /// Weight bytes the demotion saves.
    pub saved_bytes: u64,
}

/// Every group's measurement and the rank agreement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AblationReport {
    /// The encoding every group was demoted to.
    pub encoding: String,
    /// Per group, in the order given.
    pub rows: Vec<AblationRow>,
    /// Spearman's ρ of `predicted` against `kl` (`None` below 2 groups or with a constant side).
    pub spearman: Option<f64>,
    /// Tokens scored per group.
    pub tokens: usize,
}

/// Demotes each group of `groups` to `enc` in turn and measures it on `tokens` (see the module
/// docs); `progress(done, total, row)` after each group. The map must be `model`'s and hold
/// `enc` for every tensor of the groups.
#[allow(clippy::too_many_arguments)]
pub fn ablate(
    model: &Arc<Model>,
    map: &ImportanceMap,
    enc: EncodingId,
    groups: &[Group],
    tokens: &[u32],
    p: &PerplexityParams,
    threads: usize,
    mut progress: impl FnMut(usize, usize, &AblationRow),
) -> Result<AblationReport> {
    map.check_applies_to(&model.ir.fingerprint)?;
    let id = enc.to_string();
    let mut predicted = Vec::with_capacity(groups.len());
    for g in groups {
        if g.tensors.is_empty() {
            return Err(RuntimeError::InvalidParam {
                name: "groups",
                reason: format!("group {:?} has no tensor", g.name),
            });
        }
        let mut d = 0f64;
        let mut saved = 0u64;
        for t in &g.tensors {
            let ti = map
                .tensors
                .get(t)
                .ok_or_else(|| RuntimeError::InvalidParam {
                    name: "importance map",
                    reason: format!("has no entry for {t:?}"),
                })?;
            let o = ti
                .options
                .iter()
                .find(|o| o.encoding == id)
                .ok_or_else(|| RuntimeError::InvalidParam {
                    name: "importance map",
                    reason: format!("{t:?} was not measured at {id}"),
                })?;
            d += ti.kl_weight * o.distortion;
            saved += ti.source_bytes.saturating_sub(o.bytes);
        }
        predicted.push((d, saved));
    }
    let mut reference = Executor::new(model.clone(), threads)?;
    let mut rows = Vec::with_capacity(groups.len());
    let mut count = 0;
    for (g, &(d, saved)) in groups.iter().zip(&predicted) {
        let changes: BTreeMap<String, EncodingId> =
            g.tensors.iter().map(|t| (t.clone(), enc)).collect();
        let variant = Arc::new(model.with_encodings(&changes)?);
        let mut exec = Executor::new(variant, threads)?;
        let r = perplexity_against(&mut exec, Some(&mut reference), tokens, p, |_, _| {})?;
        count = r.count;
        let row = AblationRow {
            group: g.name.clone(),
            predicted: d,
            kl: r.kl.unwrap_or(f64::NAN),
            saved_bytes: saved,
        };
        progress(rows.len() + 1, groups.len(), &row);
        rows.push(row);
    }
    let (a, b): (Vec<f64>, Vec<f64>) = rows.iter().map(|r| (r.predicted, r.kl)).unzip();
    Ok(AblationReport {
        encoding: id,
        spearman: spearman(&a, &b),
        rows,
        tokens: count,
    })
}

/// Per tensor, what one unit of its relative distortion costs in KL divergence, measured by
/// ablation on *calibration* tokens: each group demoted alone to `enc`, its measured KL divided
/// by its predicted distortion, the quotient given to every tensor of the group (a group whose
/// demotion measured no KL gets the smallest positive quotient measured). The map's
/// `set_kl_weights` then makes the selector minimize predicted KL instead of summed relative
/// distortion. `progress` as in [`ablate`].
#[allow(clippy::too_many_arguments)]
pub fn kl_weights(
    model: &Arc<Model>,
    map: &ImportanceMap,
    enc: EncodingId,
    groups: &[Group],
    calibration_tokens: &[u32],
    p: &PerplexityParams,
    threads: usize,
    progress: impl FnMut(usize, usize, &AblationRow),
) -> Result<BTreeMap<String, f64>> {
    let r = ablate(
        model,
        map,
        enc,
        groups,
        calibration_tokens,
        p,
        threads,
        progress,
    )?;
    let q: Vec<Option<f64>> = r
        .rows
        .iter()
        .map(|row| {
            (row.predicted > 0.0 && row.kl.is_finite() && row.kl > 0.0)
                .then(|| row.kl / row.predicted)
        })
        .collect();
    let floor = q.iter().flatten().copied().fold(f64::INFINITY, f64::min);
    if !floor.is_finite() {
        return Err(RuntimeError::InvalidParam {
            name: "kl weights",
            reason: "no group's demotion measured a KL divergence".into(),
        });
    }
    let mut out = BTreeMap::new();
    for (g, w) in groups.iter().zip(q) {
        for t in &g.tensors {
            // Relative to the weight the prediction already carried (1 for a fresh map).
            let prev = map.tensors.get(t).map_or(1.0, |x| x.kl_weight);
            out.insert(t.clone(), prev * w.unwrap_or(floor));
        }
    }
    Ok(out)
}
