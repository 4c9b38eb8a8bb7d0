//! The importance map of a real model: calibration text runs through the executor with a
//! [`CalibrationRecorder`] attached; each linear's weights (decoded from their source
//! encoding) are measured under every codec of the candidate ladder on its own input rows
//! (`synapse_sensitivity::measure_tensor`: exact size and activation-aware output distortion
//! `‖(W − Q(W))X‖² / ‖WX‖²`); a mixture's routed experts likewise, each expert's projections
//! on the rows routed to that expert, a stacked tensor's experts pooled into one entry
//! (`measure_parts`); the measurements and their provenance (model fingerprint, calibration
//! hash, sample count, codec versions) form an [`ImportanceMap`].

use std::collections::BTreeMap;
use std::sync::Arc;

use synapse_codecs::{Codec, EncodingId, codec_for, default_ladder};
use synapse_kernels::QuantMatrix;
use synapse_sensitivity::{
    Calibration, ImportanceMap, ImportanceMapBuilder, TensorPart, measure_parts, measure_tensor,
};

use crate::calib::{CalibrationRecorder, Site, SiteSamples};
use crate::error::{Result, RuntimeError};
use crate::executor::{Executor, Row, prompt_order};
use crate::kv::{KvCache, KvDtype};
use crate::load::Model;
use crate::tap::Stage;

/// How to build a map.
#[derive(Debug, Clone)]
pub struct ImportanceParams {
    /// Input rows kept per capture site.
    pub max_rows: usize,
    /// Rows per forward pass (one session; positions restart every `batch · chunks` tokens).
    pub batch: usize,
    /// Positions per session before the cache restarts (the context the text is run at).
    pub ctx: usize,
    /// The candidate encodings (default: `synapse_codecs::default_ladder()`; empty: measure
    /// nothing, the pass yields only the imatrix).
    pub ladder: Vec<EncodingId>,
    /// What the calibration text is (its hash, e.g. the corpus part's), recorded in the
    /// provenance together with the token count and `max_rows`.
    pub text_id: String,
}

impl Default for ImportanceParams {
    fn default() -> Self {
        ImportanceParams {
            max_rows: 512,
            batch: 512,
            ctx: 512,
            ladder: default_ladder(),
            text_id: String::new(),
        }
    }
}

/// Every linear of `model` by its IR weight name.
pub fn linears(model: &Model) -> Vec<(String, Arc<QuantMatrix>)> {
    let ir = &model.ir;
    let name = |id| ir.weight(id).name.clone();
    let mut v = Vec::new();
    for (l, r) in model.layers.iter().zip(&ir.layers) {
        for (id, lin) in crate::load::layer_weight_ids(r)
            .into_iter()
            .zip(l.linears())
        {
            v.push((name(id), lin.m.clone()));
        }
    }
    v.push((name(ir.lm_head.linear.weight), model.head.m.clone()));
    v
}

/// The tensors holding a mixture of experts' routed experts (IR weight names, each once: a
/// GGUF's stacked `ffn_*_exps`, or each expert's own tensors), in layer order. Not among
/// [`linears`] (a stacked tensor is many matrices); the importance map measures them too,
/// each expert on the rows routed to it.
pub fn expert_tensors(model: &Model) -> Vec<String> {
    expert_projections(model)
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// The routed experts' matrices by tensor (IR weight names as [`expert_tensors`] gives them,
/// in layer order): a stacked tensor's experts in expert order (each expert's slice of it),
/// or a per-expert tensor's one matrix — what a writer needs to lay a stacked tensor out again.
pub fn expert_matrices(model: &Model) -> Vec<(String, Vec<Arc<QuantMatrix>>)> {
    expert_projections(model)
        .into_iter()
        .map(|(n, parts)| (n, parts.into_iter().map(|p| p.m).collect()))
        .collect()
}

/// Per linear (IR weight name), the mean of `x²` of each input column over every calibration
/// row its input saw — llama.cpp's importance matrix, as `llama_model_quantize` takes it.
pub type Imatrix = std::collections::BTreeMap<String, Vec<f32>>;

/// Runs `tokens` (the calibration part, tokenized) through `exec` and measures every linear
/// (see the module docs); `progress(done, total, name)` after each tensor.
pub fn build_importance_map(
    exec: &mut Executor,
    tokens: &[u32],
    p: &ImportanceParams,
    progress: impl FnMut(usize, usize, &str),
) -> Result<ImportanceMap> {
    build_importance_map_and_imatrix(exec, tokens, p, progress).map(|(m, _)| m)
}

/// [`build_importance_map`], and the [`Imatrix`] of the same pass.
pub fn build_importance_map_and_imatrix(
    exec: &mut Executor,
    tokens: &[u32],
    p: &ImportanceParams,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<(ImportanceMap, Imatrix)> {
    if tokens.is_empty() || p.max_rows == 0 || p.batch == 0 || p.ctx == 0 {
        return Err(RuntimeError::InvalidParam {
            name: "importance",
            reason: "needs calibration tokens and positive rows, batch and ctx".into(),
        });
    }
    let model = exec.model().clone();
    let rec = CalibrationRecorder::new(&model, p.max_rows, tokens.len() as u64);
    let prev = exec.set_tap(Some(Box::new(rec.clone())));
    let batch = p.batch.min(p.ctx);
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, p.ctx, batch)?;
    let run = (|| -> Result<()> {
        for seg in tokens.chunks(p.ctx) {
            kv.open(0)?;
            for b0 in (0..seg.len()).step_by(batch) {
                let b1 = (b0 + batch).min(seg.len());
                let rows: Vec<Row> = (b0..b1)
                    .map(|pos| Row {
                        slot: 0,
                        pos: pos as u32,
                        token: seg[pos],
                        // Every row through the LM head: its input is a site too.
                        logits: true,
                        order: prompt_order(pos, seg.len(), batch),
                    })
                    .collect();
                exec.forward(&mut kv, &rows)?;
            }
        }
        Ok(())
    })();
    exec.set_tap(prev);
    run?;
    let sites = rec.sites();
    let mut imatrix = Imatrix::new();
    for (site, s) in &sites {
        if site.expert.is_some() {
            // llama.cpp's imatrix keeps a stacked expert tensor's statistics by expert; the
            // re-quantization baselines run on dense models only.
            continue;
        }
        let n = s.seen.max(1) as f64;
        let mean: Vec<f32> = s.sq.iter().map(|&v| (v / n) as f32).collect();
        for w in &s.weights {
            imatrix.insert(w.clone(), mean.clone());
        }
    }
    let by_name = linears(&model);
    let mut h = blake3::Hasher::new();
    h.update(p.text_id.as_bytes());
    h.update(&(tokens.len() as u64).to_le_bytes());
    h.update(&(p.max_rows as u64).to_le_bytes());
    let rows_total: usize = sites.iter().map(|(_, s)| s.rows()).sum();
    if p.ladder.is_empty() {
        // Nothing to measure: the imatrix alone.
        let b = ImportanceMapBuilder::new(&model.ir.fingerprint, "", 0);
        return Ok((b.finish(), imatrix));
    }
    let mut b = ImportanceMapBuilder::new(
        &model.ir.fingerprint,
        h.finalize().to_hex().as_ref(),
        rows_total as u64,
    );
    let codecs: Vec<Box<dyn Codec>> = p.ladder.iter().map(|&id| codec_for(id)).collect();
    let refs: Vec<&dyn Codec> = codecs.iter().map(|c| c.as_ref()).collect();
    let experts = expert_projections(&model);
    let total = by_name.len() + experts.len();
    let mut done = 0;
    // A head tied to the token embedding is one table with two uses: its options also carry
    // the lookup's distortion (below).
    let tied = Arc::ptr_eq(&model.embd, &model.head.m);
    let head_name = model.ir.weight(model.ir.lm_head.linear.weight).name.clone();
    for (_, s) in &sites {
        let calib = Calibration::new(s.data.clone(), s.rows(), s.cols)?;
        for name in &s.weights {
            let Some((_, m)) = by_name.iter().find(|(n, _)| n == name) else {
                continue;
            };
            let (rows, cols) = (m.rows(), m.cols());
            let w = dequantize(m)?;
            let source = model
                .profile
                .encoding(name)
                .map(str::to_owned)
                .unwrap_or_else(|| "f32".into());
            let fit = fitting(&refs, rows, cols);
            let mut t = measure_tensor(&w, rows, &source, m.weight_bytes() as u64, &calib, &fit)?;
            if tied && *name == head_name {
                add_lookup_distortion(&mut t, &w, cols, tokens, &fit)?;
            }
            b.add(name, t)?;
            done += 1;
            progress(done, total, name);
        }
    }
    // Routed experts: a tensor's parts (a stacked tensor: one per expert) each measured on
    // the rows routed to its expert, pooled (`measure_parts`).
    let by_site: BTreeMap<&Site, &SiteSamples> = sites.iter().map(|(k, v)| (k, v)).collect();
    for (name, parts) in &experts {
        let mut inputs = Vec::with_capacity(parts.len());
        let mut weights = Vec::with_capacity(parts.len());
        let mut source_bytes = 0u64;
        for p in parts {
            weights.push(dequantize(&p.m)?);
            inputs.push(expert_input(&model, &by_site, p)?);
            source_bytes += p.m.weight_bytes() as u64;
        }
        let calibs = inputs
            .into_iter()
            .map(|(x, rows, cols)| Calibration::new(x, rows, cols))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let tp: Vec<TensorPart<'_>> = parts
            .iter()
            .zip(&weights)
            .zip(&calibs)
            .map(|((p, w), calib)| TensorPart {
                w,
                rows: p.m.rows(),
                calib,
            })
            .collect();
        let source = model
            .profile
            .encoding(name)
            .map(str::to_owned)
            .unwrap_or_else(|| "f32".into());
        let fit = match parts.first() {
            Some(p) => fitting(&refs, p.m.rows(), p.m.cols()),
            None => refs.clone(),
        };
        b.add(name, measure_parts(&tp, &source, source_bytes, &fit)?)?;
        done += 1;
        progress(done, total, name);
    }
    Ok((b.finish(), imatrix))
}

/// The ladder's codecs that can hold a `rows × cols` matrix (ggml's block types need rows of
/// whole 32-element blocks; a tensor whose rows are not is measured without them).
fn fitting<'a>(codecs: &[&'a dyn Codec], rows: usize, cols: usize) -> Vec<&'a dyn Codec> {
    codecs
        .iter()
        .copied()
        .filter(|c| c.matrix_size(rows, cols).is_ok())
        .collect()
}

/// `m`'s weights in f32, row-major.
pub(crate) fn dequantize(m: &QuantMatrix) -> Result<Vec<f32>> {
    let (rows, cols) = (m.rows(), m.cols());
    let mut w = vec![0f32; rows * cols];
    for (r, out) in w.chunks_exact_mut(cols).enumerate() {
        m.dequantize_row(r, out)?;
    }
    Ok(w)
}

/// One routed expert's projection, a part of its tensor.
pub(crate) struct ExpertProjection {
    /// Layer index.
    layer: usize,
    /// Expert index in the layer's mixture.
    expert: usize,
    /// Its input: [`Stage::FfnNorm`] (gate, up) or [`Stage::FfnAct`] (down).
    stage: Stage,
    /// Its weights.
    pub(crate) m: Arc<QuantMatrix>,
}

/// The routed experts' projections by tensor name, each name once in layer order (a stacked
/// tensor's parts in expert order).
pub(crate) fn expert_projections(model: &Model) -> Vec<(String, Vec<ExpertProjection>)> {
    let ir = &model.ir;
    let mut v: Vec<(String, Vec<ExpertProjection>)> = Vec::new();
    let mut at: BTreeMap<&str, usize> = BTreeMap::new();
    for (layer, (l, r)) in model.layers.iter().zip(&ir.layers).enumerate() {
        let (crate::load::FfnW::Moe(mw), synapse_model::FfnRegion::Moe(mr)) = (&l.ffn, &r.ffn)
        else {
            continue;
        };
        for (expert, (ew, er)) in mw.experts.iter().zip(&mr.experts).enumerate() {
            for (m, el, stage) in [
                (&ew.gate, &er.gate, Stage::FfnNorm),
                (&ew.up, &er.up, Stage::FfnNorm),
                (&ew.down, &er.down, Stage::FfnAct),
            ] {
                let name = ir.weight(el.weight).name.as_str();
                let part = ExpertProjection {
                    layer,
                    expert,
                    stage,
                    m: m.clone(),
                };
                match at.get(name) {
                    Some(&i) => v[i].1.push(part),
                    None => {
                        at.insert(name, v.len());
                        v.push((name.to_owned(), vec![part]));
                    }
                }
            }
        }
    }
    v
}

/// The calibration rows (`data, rows, cols`) of one expert projection: those routed to its
/// expert. An expert the calibration text never routed to is measured on what it would have
/// seen had every row been routed to it — the layer's normed input rows (the router's sample)
/// and, for its down projection, its own gated activation of them (computed here in f32) —
/// so that no expert's error goes unmeasured.
fn expert_input(
    model: &Model,
    sites: &BTreeMap<&Site, &SiteSamples>,
    p: &ExpertProjection,
) -> Result<(Vec<f32>, usize, usize)> {
    let site = |stage, expert| Site {
        layer: Some(p.layer),
        stage,
        expert,
    };
    let own = sites.get(&site(p.stage, Some(p.expert as u32)));
    if let Some(s) = own.filter(|s| s.rows() > 0) {
        return Ok((s.data.clone(), s.rows(), s.cols));
    }
    let cols = p.m.cols();
    let Some(x) = sites
        .get(&site(Stage::FfnNorm, None))
        .filter(|s| s.rows() > 0)
    else {
        return Ok((Vec::new(), 0, cols));
    };
    let rows = x.rows();
    if p.stage == Stage::FfnNorm {
        return Ok((x.data.clone(), rows, x.cols));
    }
    let crate::load::FfnW::Moe(mw) = &model.layers[p.layer].ffn else {
        return Ok((Vec::new(), 0, cols));
    };
    let e = &mw.experts[p.expert];
    let ff = e.gate.rows();
    let project = |m: &QuantMatrix| -> Result<Vec<f32>> {
        let w = dequantize(m)?;
        let mut y = vec![0f32; rows * ff];
        for (xr, yr) in x.data.chunks_exact(x.cols).zip(y.chunks_exact_mut(ff)) {
            for (o, wr) in yr.iter_mut().zip(w.chunks_exact(x.cols)) {
                *o = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
            }
        }
        Ok(y)
    };
    let (g, u) = (project(&e.gate)?, project(&e.up)?);
    let mut h = vec![0f32; rows * ff];
    crate::moe::gated(mw.act, &g, &u, &mut h, ff, model.gelu_f16_table);
    Ok((h, rows, ff))
}

/// Adds to each option of a tied embedding / head table the distortion of its other use, the
/// token lookup: `Σ_r c_r ‖w_r − q_r‖² / Σ_r c_r ‖w_r‖²` over the rows `r` the calibration text
/// reads, `c_r` times each — the relative error of the residual stream's first input, beside
/// the head's output distortion (the selector sums distortions, so the table pays for both).
fn add_lookup_distortion(
    t: &mut synapse_sensitivity::TensorImportance,
    w: &[f32],
    cols: usize,
    tokens: &[u32],
    codecs: &[&dyn Codec],
) -> Result<()> {
    let ce = |e| RuntimeError::from(synapse_kernels::KernelError::from(e));
    let rows = w.len() / cols.max(1);
    let mut counts = std::collections::BTreeMap::<usize, u64>::new();
    for &tok in tokens {
        if (tok as usize) < rows {
            *counts.entry(tok as usize).or_default() += 1;
        }
    }
    let den: f64 = counts
        .iter()
        .map(|(&r, &c)| {
            c as f64
                * w[r * cols..(r + 1) * cols]
                    .iter()
                    .map(|&v| f64::from(v) * f64::from(v))
                    .sum::<f64>()
        })
        .sum();
    for o in &mut t.options {
        let Some(codec) = codecs.iter().find(|c| c.id().to_string() == o.encoding) else {
            continue;
        };
        let one = codec.matrix_size(1, cols).map_err(ce)?;
        let whole = codec.matrix_size(rows, cols).map_err(ce)?;
        let mut num = 0f64;
        if rows * one == whole {
            // Row-separable: encode and decode only the rows read.
            for (&r, &c) in &counts {
                let row = &w[r * cols..(r + 1) * cols];
                let q = codec
                    .decode(&codec.encode_matrix(row, 1, cols).map_err(ce)?, cols)
                    .map_err(ce)?;
                num += c as f64
                    * row
                        .iter()
                        .zip(&q)
                        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                        .sum::<f64>();
            }
        } else {
            let q = codec
                .decode_matrix(&codec.encode_matrix(w, rows, cols).map_err(ce)?, rows, cols)
                .map_err(ce)?;
            for (&r, &c) in &counts {
                num += c as f64
                    * w[r * cols..(r + 1) * cols]
                        .iter()
                        .zip(&q[r * cols..(r + 1) * cols])
                        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                        .sum::<f64>();
            }
        }
        if den > 0.0 {
            o.distortion += num / den;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor is measured under the ladder's codecs that can hold its shape: ggml's legacy
    /// block types only for rows of whole 32-element blocks, its K-quants only for rows of
    /// whole 256-element super-blocks, Synapse's grouped codecs always.
    #[test]
    fn a_tensor_is_measured_under_the_codecs_that_hold_its_shape() {
        let codecs: Vec<Box<dyn Codec>> = default_ladder().into_iter().map(codec_for).collect();
        let refs: Vec<&dyn Codec> = codecs.iter().map(|c| c.as_ref()).collect();
        let ggml = |v: &[&dyn Codec]| {
            v.iter()
                .filter(|c| matches!(c.id(), EncodingId::Ggml(_)))
                .count()
        };
        let whole = fitting(&refs, 4, 512);
        assert_eq!((whole.len(), ggml(&whole)), (refs.len(), 8));
        let blocks = fitting(&refs, 4, 64);
        assert_eq!((blocks.len(), ggml(&blocks)), (refs.len() - 3, 5));
        let odd = fitting(&refs, 4, 48);
        assert_eq!((odd.len(), ggml(&odd)), (refs.len() - 8, 0));
    }
}
