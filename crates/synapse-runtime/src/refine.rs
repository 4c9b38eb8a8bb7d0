//! Profiles measured, not only predicted: a budget's profile refined by the KL divergence it
//! actually gives on calibration text.
//!
//! The selector minimizes a sum of per-tensor costs (each tensor's measured output distortion
//! times its group's KL weight, measured with that group demoted alone). At a tight budget the
//! sum misleads: demotions compound (a whole FFN at `q2` beside others at `q3` hurts far more
//! than the sum of each alone), so the cheapest predicted profile can measure worse than a
//! plain uniform one. [`refine`] measures instead of summing:
//!
//! 1. **Candidates.** The selector's knapsack (`select_best`) over the whole ladder, then with
//!    the smallest encodings taken away one by one (no ternary, no ternary or `q2`, …) while the
//!    budget is still met, and the most precise uniform encoding that fits. Each is measured
//!    ([`KlProbe::kl`]); the best is the incumbent.
//! 2. **Sensitivity in context.** Each group of tensors (a layer's attention, its FFN, the head:
//!    [`crate::ablation::layer_groups`]) is moved one rung down and one rung up its tensors'
//!    ladders (the map's options, source first) *from the incumbent*, and measured: what that
//!    group costs or gives back beside everything else the profile demotes.
//! 3. **Exchanges.** Promotions in order of measured gain per byte, each paid for by the
//!    demotions of least measured loss per byte until the budget holds again; an exchange whose
//!    measured parts predict a gain is built and measured, and kept only when its KL is lower.
//!    Then again from 2 around the new profile, while a round keeps something and the
//!    measurements left cover another round's sensitivities with a quarter to spare.
//!
//! The result never measures worse than the knapsack's profile or the uniform one that fits
//! (both are candidates), always fits the budget, and is deterministic for a model, map, text
//! and budget. Everything is measured on the text given — calibration text only; held-out text
//! is what judges the result afterwards.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use synapse_selector::{Assignment, Constraints, Profile, Selector};
use synapse_sensitivity::ImportanceMap;

use crate::error::{Result, RuntimeError};
use crate::executor::{Executor, Row};
use crate::kv::{KvCache, KvDtype};
use crate::load::Model;
use crate::perplexity::{PerplexityParams, check_chunks, chunk_logits, kl_divergence};
use crate::variant::VariantCache;

/// The mean next-token KL divergence of a model from a reference (the source precision of the
/// same model) over fixed chunks of text, with the reference's logits computed once: the
/// perplexity protocol's chunks and scored rows ([`crate::perplexity`]), and the same sum, so
/// [`KlProbe::kl`] equals `perplexity_against(…).kl` bit for bit.
#[derive(Debug)]
pub struct KlProbe {
    tokens: Vec<u32>,
    p: PerplexityParams,
    n_chunk: usize,
    vocab: usize,
    fingerprint: String,
    threads: usize,
    /// The reference's logits of every scored row (`ctx − 1 − ctx/2` per chunk), in order.
    reference: Vec<f32>,
}

impl KlProbe {
    /// Runs `reference` over the chunks of `tokens` that `p` selects and keeps its logits of the
    /// scored rows (`chunks · (ctx/2 − 1) · vocab` floats: an allocation that fails is an
    /// error, not an abort).
    pub fn new(
        reference: &Arc<Model>,
        tokens: &[u32],
        p: &PerplexityParams,
        threads: usize,
    ) -> Result<Self> {
        check_chunks(p, tokens.len())?;
        let ctx = p.ctx;
        let n_chunk = (tokens.len() / ctx).min(p.max_chunks.unwrap_or(usize::MAX));
        let vocab = reference.vocab();
        let first = ctx / 2;
        let scored = ctx - 1 - first;
        let n = n_chunk
            .checked_mul(scored)
            .and_then(|r| r.checked_mul(vocab))
            .ok_or_else(|| too_large(n_chunk, ctx, vocab))?;
        let mut kept: Vec<f32> = Vec::new();
        kept.try_reserve_exact(n)
            .map_err(|_| too_large(n_chunk, ctx, vocab))?;
        let mut exec = Executor::new(reference.clone(), threads)?;
        let batch = p.batch.clamp(1, ctx);
        let mut kv = KvCache::new(reference, KvDtype::F32, 1, ctx, batch)?;
        let mut rows: Vec<Row> = Vec::with_capacity(batch);
        let mut logits = vec![0f32; (ctx - first) * vocab];
        for c in 0..n_chunk {
            chunk_logits(
                &mut exec,
                &mut kv,
                &tokens[c * ctx..(c + 1) * ctx],
                p,
                &mut rows,
                &mut logits,
            )?;
            kept.extend_from_slice(&logits[..scored * vocab]);
        }
        Ok(KlProbe {
            tokens: tokens[..n_chunk * ctx].to_vec(),
            p: *p,
            n_chunk,
            vocab,
            fingerprint: reference.ir.fingerprint.clone(),
            threads,
            reference: kept,
        })
    }

    /// Rows scored per measurement.
    pub fn rows(&self) -> usize {
        self.n_chunk * (self.p.ctx - 1 - self.p.ctx / 2)
    }

    /// The mean KL divergence `KL(p_reference ‖ p_model)` over the scored rows. `model` must
    /// be the reference's model at another precision (same fingerprint).
    pub fn kl(&self, model: &Arc<Model>) -> Result<f64> {
        if model.ir.fingerprint != self.fingerprint || model.vocab() != self.vocab {
            return Err(RuntimeError::InvalidParam {
                name: "model",
                reason: "not the model the KL probe's reference is a precision of".into(),
            });
        }
        let ctx = self.p.ctx;
        let first = ctx / 2;
        let scored = ctx - 1 - first;
        let vocab = self.vocab;
        let batch = self.p.batch.clamp(1, ctx);
        let mut exec = Executor::new(model.clone(), self.threads)?;
        let mut kv = KvCache::new(model, KvDtype::F32, 1, ctx, batch)?;
        let mut rows: Vec<Row> = Vec::with_capacity(batch);
        let mut logits = vec![0f32; (ctx - first) * vocab];
        let mut kl_sum = 0f64;
        for c in 0..self.n_chunk {
            chunk_logits(
                &mut exec,
                &mut kv,
                &self.tokens[c * ctx..(c + 1) * ctx],
                &self.p,
                &mut rows,
                &mut logits,
            )?;
            let r0 = c * scored * vocab;
            for i in 0..scored {
                kl_sum += kl_divergence(
                    &self.reference[r0 + i * vocab..r0 + (i + 1) * vocab],
                    &logits[i * vocab..(i + 1) * vocab],
                );
            }
        }
        Ok(kl_sum / self.rows() as f64)
    }
}

fn too_large(chunks: usize, ctx: usize, vocab: usize) -> RuntimeError {
    RuntimeError::InvalidParam {
        name: "chunks",
        reason: format!(
            "keeping the reference logits of {chunks} chunks of {ctx} tokens over {vocab} \
             tokens does not fit in memory: use fewer chunks"
        ),
    }
}

/// How far [`refine`] may go.
#[derive(Debug, Clone, Copy)]
pub struct RefineParams {
    /// At most this many measurements (candidates, sensitivities and exchanges together).
    pub max_evals: usize,
}

impl Default for RefineParams {
    fn default() -> Self {
        RefineParams { max_evals: 200 }
    }
}

/// One measurement [`refine`] made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// What was measured (`select_best`, `uniform syn.q3…`, `blk.4.ffn down`, `exchange: …`).
    pub what: String,
    /// Resident weight bytes of the measured profile (fixed weights included).
    pub bytes: u64,
    /// Its measured KL divergence from the source.
    pub kl: f64,
    /// Whether it became the profile the search continues from.
    pub kept: bool,
}

/// What [`refine`] found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refined {
    /// The profile (every tensor of the map).
    pub profile: Profile,
    /// Its measured KL divergence on the probe's text.
    pub kl: f64,
    /// Resident weight bytes (the profile's and the weights outside the map).
    pub resident_bytes: u64,
    /// The selector's own profile for the budget (`select_best`) and its measured KL.
    pub select_best_kl: f64,
    /// Every measurement, in order.
    pub evaluations: Vec<Evaluation>,
}

/// One tensor's rungs: the source, then the map's options, bytes descending.
struct Ladder {
    name: String,
    rungs: Vec<Assignment>,
}

/// The search state: a rung per tensor.
#[derive(Clone, PartialEq)]
struct Levels(Vec<usize>);

struct Search<'a> {
    source: &'a Arc<Model>,
    map_encodings: BTreeMap<String, String>,
    ladders: Vec<Ladder>,
    index: BTreeMap<String, usize>,
    fixed: u64,
    probe: &'a KlProbe,
    cache: Option<&'a VariantCache>,
    evals: Vec<Evaluation>,
    max_evals: usize,
}

impl Search<'_> {
    fn bytes(&self, l: &Levels) -> u64 {
        self.ladders
            .iter()
            .zip(&l.0)
            .map(|(t, &k)| t.rungs[k].bytes)
            .sum()
    }

    fn profile(&self, l: &Levels) -> Profile {
        let mut assignments = BTreeMap::new();
        let mut total_distortion = 0.0;
        for (t, &k) in self.ladders.iter().zip(&l.0) {
            total_distortion += t.rungs[k].distortion;
            assignments.insert(t.name.clone(), t.rungs[k].clone());
        }
        Profile {
            assignments,
            total_bytes: self.bytes(l),
            total_distortion,
        }
    }

    fn levels_of(&self, p: &Profile) -> Levels {
        Levels(
            self.ladders
                .iter()
                .map(|t| {
                    let enc = &p.assignments[&t.name].encoding;
                    t.rungs.iter().position(|r| &r.encoding == enc).unwrap_or(0)
                })
                .collect(),
        )
    }

    fn exhausted(&self) -> bool {
        self.evals.len() >= self.max_evals
    }

    /// Measures `l`: its KL divergence, recorded (not yet kept: see [`Search::report`]).
    fn measure(&mut self, what: String, l: &Levels) -> Result<f64> {
        let p = self.profile(l);
        let (model, _) = crate::precision::model_for_profile(
            self.source,
            &p,
            |n| self.map_encodings.get(n),
            self.cache,
        )?;
        let kl = self.probe.kl(&model)?;
        self.evals.push(Evaluation {
            what,
            bytes: self.fixed + p.total_bytes,
            kl,
            kept: false,
        });
        Ok(kl)
    }

    /// Marks the last measurement kept or not and shows it to `progress`.
    fn report(&mut self, kept: bool, progress: &mut dyn FnMut(&Evaluation, usize, usize)) {
        let (n, max) = (self.evals.len(), self.max_evals);
        if let Some(e) = self.evals.last_mut() {
            e.kept = kept;
            progress(e, n, max);
        }
    }

    /// `l` with every member of `group` one rung down (`down`) or up; `None` when no member
    /// moves or (up) the result would not fit the budget even alone.
    fn moved(&self, l: &Levels, group: &[usize], down: bool) -> Option<Levels> {
        let mut n = l.clone();
        let mut any = false;
        for &t in group {
            let k = n.0[t];
            if down && k + 1 < self.ladders[t].rungs.len() {
                n.0[t] = k + 1;
                any = true;
            } else if !down && k > 0 {
                n.0[t] = k - 1;
                any = true;
            }
        }
        any.then_some(n)
    }
}

/// A group's measured move from the profile a round started at.
struct Measured {
    group: usize,
    /// KL change (down: loss, positive when worse; up: gain, positive when better).
    delta: f64,
    /// Bytes moved (down: saved; up: added).
    bytes: u64,
}

/// Refines the profile for a whole-model `budget` (weight bytes, fixed weights included) of
/// `source` from `map`, measuring each step on `probe` (see the module docs). Re-encoded
/// tensors come from `cache` when given (each variant is quantized once across the search).
/// `progress(evaluation, done, max)` after each measurement.
#[allow(clippy::too_many_arguments)]
pub fn refine(
    source: &Arc<Model>,
    map: &ImportanceMap,
    budget: u64,
    probe: &KlProbe,
    params: RefineParams,
    cache: Option<&VariantCache>,
    mut progress: impl FnMut(&Evaluation, usize, usize),
) -> Result<Refined> {
    let progress: &mut dyn FnMut(&Evaluation, usize, usize) = &mut progress;
    if params.max_evals == 0 {
        return Err(RuntimeError::InvalidParam {
            name: "evals",
            reason: "at least one measurement (the selector's own profile) is needed".into(),
        });
    }
    if probe.fingerprint != source.ir.fingerprint {
        return Err(RuntimeError::InvalidParam {
            name: "probe",
            reason: "measured on another model".into(),
        });
    }
    let full = Selector::new(map, &Constraints::default())?;
    let (fixed, linear_budget) = crate::precision::linear_budget(source, map, &full, budget)?;
    let best = full.select_best(linear_budget)?;

    let ladders: Vec<Ladder> = map
        .tensors
        .iter()
        .map(|(name, t)| {
            let mut rungs = vec![Assignment {
                encoding: t.source_encoding.clone(),
                bytes: t.source_bytes,
                distortion: 0.0,
            }];
            rungs.extend(t.options.iter().map(|o| Assignment {
                encoding: o.encoding.clone(),
                bytes: o.bytes,
                distortion: t.kl_weight * o.distortion,
            }));
            Ladder {
                name: name.clone(),
                rungs,
            }
        })
        .collect();
    let index: BTreeMap<String, usize> = ladders
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), i))
        .collect();
    let mut s = Search {
        source,
        map_encodings: map
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.source_encoding.clone()))
            .collect(),
        ladders,
        index,
        fixed,
        probe,
        cache,
        evals: Vec::new(),
        max_evals: params.max_evals,
    };

    // 1. Candidates.
    let mut candidates: Vec<(String, Levels)> = vec![("select_best".into(), s.levels_of(&best))];
    // Every encoding of the map, smallest per source byte first (over the tensors that have
    // it); those every tensor has, for the uniform candidate.
    let mut totals: BTreeMap<&str, (u64, u64, usize)> = BTreeMap::new();
    for t in map.tensors.values() {
        for o in &t.options {
            let e = totals.entry(o.encoding.as_str()).or_default();
            e.0 += o.bytes;
            e.1 += t.source_bytes;
            e.2 += 1;
        }
    }
    let mut by_size: Vec<(&str, f64)> = totals
        .iter()
        .map(|(e, &(b, src, _))| (*e, b as f64 / src.max(1) as f64))
        .collect();
    by_size.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(b.0)));
    let shared: Vec<(&str, u64)> = by_size
        .iter()
        .filter(|(e, _)| totals[e].2 == map.tensors.len())
        .map(|(e, _)| (*e, totals[e].0))
        .collect();
    let sources: BTreeSet<String> = map
        .tensors
        .values()
        .map(|t| t.source_encoding.clone())
        .collect();
    let every: BTreeSet<String> = totals.keys().map(|e| e.to_string()).collect();
    for k in 1..by_size.len() {
        let dropped: Vec<&str> = by_size[..k].iter().map(|(e, _)| *e).collect();
        let supported: BTreeSet<String> = every
            .iter()
            .filter(|e| !dropped.contains(&e.as_str()))
            .chain(&sources)
            .cloned()
            .collect();
        let c = Constraints {
            supported: Some(supported),
            ..Constraints::default()
        };
        let Ok(p) = Selector::new(map, &c).and_then(|sel| sel.select_best(linear_budget)) else {
            break;
        };
        candidates.push((
            format!("select_best without {}", dropped.join(", ")),
            s.levels_of(&p),
        ));
    }
    if let Some(&(enc, _)) = shared.iter().rev().find(|(_, b)| *b <= linear_budget) {
        let l = Levels(
            s.ladders
                .iter()
                .map(|t| t.rungs.iter().position(|r| r.encoding == enc).unwrap_or(0))
                .collect(),
        );
        candidates.push((format!("uniform {enc}"), l));
    }
    let mut seen: Vec<Levels> = Vec::new();
    let mut current: Option<(Levels, f64)> = None;
    let mut select_best_kl = f64::NAN;
    for (what, l) in candidates {
        if seen.contains(&l) || s.exhausted() {
            continue;
        }
        debug_assert!(s.bytes(&l) <= linear_budget);
        let kl = s.measure(what, &l)?;
        if seen.is_empty() {
            select_best_kl = kl;
        }
        seen.push(l.clone());
        let better = current.as_ref().is_none_or(|c| kl < c.1);
        s.report(better, progress);
        if better {
            current = Some((l, kl));
        }
    }
    let (mut cur, mut cur_kl) = current.expect("the selector's profile was measured");

    // 2–3. Rounds of sensitivities and exchanges.
    let groups: Vec<(String, Vec<usize>)> = crate::ablation::layer_groups(source)
        .into_iter()
        .map(|g| {
            let members = g
                .tensors
                .iter()
                .filter_map(|t| s.index.get(t).copied())
                .collect();
            (g.name, members)
        })
        .filter(|(_, m): &(String, Vec<usize>)| !m.is_empty())
        .collect();
    // A round after the first only when its sensitivities leave measurements for exchanges.
    let per_round = 2 * groups.len();
    let mut round = 0;
    while !s.exhausted() && (round == 0 || s.max_evals - s.evals.len() >= per_round + per_round / 4)
    {
        round += 1;
        let base_bytes = s.bytes(&cur);
        let mut downs: Vec<Measured> = Vec::new();
        let mut ups: Vec<Measured> = Vec::new();
        for (gi, (name, members)) in groups.iter().enumerate() {
            for down in [true, false] {
                if s.exhausted() {
                    break;
                }
                let Some(n) = s.moved(&cur, members, down) else {
                    continue;
                };
                let nb = s.bytes(&n);
                let dir = if down { "down" } else { "up" };
                let kl = s.measure(format!("{name} {dir}"), &n)?;
                s.report(false, progress);
                if down {
                    downs.push(Measured {
                        group: gi,
                        delta: kl - cur_kl,
                        bytes: base_bytes - nb,
                    });
                } else {
                    ups.push(Measured {
                        group: gi,
                        delta: cur_kl - kl,
                        bytes: nb - base_bytes,
                    });
                }
            }
        }
        // Gains per byte, best first; losses per byte, least first.
        let per_byte = |m: &Measured| m.delta / m.bytes.max(1) as f64;
        ups.retain(|m| m.delta > 0.0);
        ups.sort_by(|a, b| per_byte(b).total_cmp(&per_byte(a)));
        downs.sort_by(|a, b| per_byte(a).total_cmp(&per_byte(b)));
        let mut touched = vec![false; groups.len()];
        let mut kept_any = false;
        for up in &ups {
            if s.exhausted() {
                break;
            }
            if touched[up.group] {
                continue;
            }
            let Some(mut n) = s.moved(&cur, &groups[up.group].1, false) else {
                continue;
            };
            let mut paid_by = Vec::new();
            let mut predicted = up.delta;
            for d in &downs {
                if s.bytes(&n) <= linear_budget {
                    break;
                }
                if d.group == up.group || touched[d.group] {
                    continue;
                }
                if let Some(m) = s.moved(&n, &groups[d.group].1, true) {
                    n = m;
                    predicted -= d.delta;
                    paid_by.push(d.group);
                }
            }
            if s.bytes(&n) > linear_budget || predicted <= 0.0 {
                continue;
            }
            let what = if paid_by.is_empty() {
                format!("{} up", groups[up.group].0)
            } else {
                format!(
                    "exchange: {} up; {} down",
                    groups[up.group].0,
                    paid_by
                        .iter()
                        .map(|&g| groups[g].0.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            let kl = s.measure(what, &n)?;
            s.report(kl < cur_kl, progress);
            if kl < cur_kl {
                cur = n;
                cur_kl = kl;
                touched[up.group] = true;
                for g in paid_by {
                    touched[g] = true;
                }
                kept_any = true;
            }
        }
        if !kept_any {
            break;
        }
    }
    let profile = s.profile(&cur);
    Ok(Refined {
        resident_bytes: fixed + profile.total_bytes,
        profile,
        kl: cur_kl,
        select_best_kl,
        evaluations: s.evals,
    })
}
