//! What a worker tells the cluster about itself ([`WorkerProfile`], stored under its lease),
//! what it measured to say it, and the model's shape as the planner needs it ([`ModelSpec`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use synapse_kernels::{Encoding, KernelCtx, KernelPath, QuantMatrix};
use synapse_runtime::Model;

use crate::error::Result;

/// A link to a peer as this worker measured it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkMeasure {
    /// One-way latency (half the median round trip of a small ping), seconds.
    pub latency_s: f64,
    /// Bytes/s of a 1 MiB ping's round trip (both ways counted).
    pub bandwidth_bytes_per_s: f64,
}

/// One worker: where it listens, what it holds and how fast it measured itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerProfile {
    /// Unique id (stable across restarts when given).
    pub id: String,
    /// gRPC address (`http://host:port`).
    pub addr: String,
    /// The model's IR fingerprint (workers of other models are not planned together).
    pub model: String,
    /// Memory it may use for weights and KV, bytes.
    pub memory_bytes: u64,
    /// Compute threads.
    pub threads: usize,
    /// Measured one-row weight-streaming rate per encoding the model uses, bytes/s.
    pub stream_rate: BTreeMap<String, f64>,
    /// Measured per-pass time not explained by streaming weights, seconds.
    pub dispatch_overhead_s: f64,
    /// Links to peers it measured (peer id → link).
    pub links: BTreeMap<String, LinkMeasure>,
    /// When it joined (its process start), seconds since the epoch.
    pub started_s: u64,
}

/// The model as the planner sees it: per layer its tensors (encoding and bytes) and KV
/// bytes per position; the LM head streamed by the last stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// IR fingerprint.
    pub fingerprint: String,
    /// Residual width.
    pub hidden: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Per layer: (tensor name, encoding, bytes).
    pub layers: Vec<Vec<(String, String, u64)>>,
    /// Per layer: f32 KV bytes per position.
    pub kv_per_token: Vec<u64>,
    /// The LM head: (name, encoding, bytes).
    pub head: (String, String, u64),
    /// The token embedding's bytes (read a row per token; resident as touched).
    pub embedding_bytes: u64,
}

/// The name of an encoding as profiles and plans spell it.
pub fn encoding_name(e: Encoding) -> String {
    match e {
        Encoding::Ggml(t) => t.name().to_string(),
        Encoding::Codec(id) => id.to_string(),
    }
}

impl ModelSpec {
    /// The shape of a loaded model.
    pub fn of(model: &Model) -> Self {
        let layers = model
            .layers
            .iter()
            .enumerate()
            .map(|(il, l)| {
                let mut v: Vec<(String, String, u64)> = l
                    .linears()
                    .iter()
                    .enumerate()
                    .map(|(j, x)| {
                        (
                            format!("blk.{il}.{j}"),
                            encoding_name(x.m.encoding()),
                            x.m.weight_bytes() as u64,
                        )
                    })
                    .collect();
                if let synapse_runtime::load::FfnW::Moe(m) = &l.ffn {
                    for (e, x) in m.experts.iter().enumerate() {
                        for (p, mm) in [&x.gate, &x.up, &x.down].into_iter().enumerate() {
                            v.push((
                                format!("blk.{il}.expert.{e}.{p}"),
                                encoding_name(mm.encoding()),
                                mm.weight_bytes() as u64,
                            ));
                        }
                    }
                }
                v
            })
            .collect();
        let kv_per_token = model
            .layers
            .iter()
            .map(|l| (2 * 4 * l.n_kv_heads * l.head_dim) as u64)
            .collect();
        ModelSpec {
            fingerprint: model.ir.fingerprint.clone(),
            hidden: model.hidden(),
            vocab: model.vocab(),
            layers,
            kv_per_token,
            head: (
                "output".into(),
                encoding_name(model.head.m.encoding()),
                model.head.m.weight_bytes() as u64,
            ),
            embedding_bytes: model.embd.weight_bytes() as u64,
        }
    }

    /// The shape of a model from its graph alone (no weight held): what [`ModelSpec::of`]
    /// gives for the model loaded in its source precision.
    pub fn of_ir(ir: &synapse_model::ModelIr) -> Self {
        let name_of = |id: synapse_model::WeightId| {
            let w = ir.weight(id);
            (
                encoding_name(Encoding::Ggml(w.encoding)),
                w.n_bytes,
                w.shape.len(),
            )
        };
        let layers = ir
            .layers
            .iter()
            .enumerate()
            .map(|(il, l)| {
                // The matrices (norms, biases and other vectors aside).
                l.weight_ids()
                    .into_iter()
                    .map(name_of)
                    .filter(|(_, _, dims)| *dims >= 2)
                    .enumerate()
                    .map(|(j, (enc, bytes, _))| (format!("blk.{il}.{j}"), enc, bytes))
                    .collect()
            })
            .collect();
        let head = name_of(ir.lm_head.linear.weight);
        ModelSpec {
            fingerprint: ir.fingerprint.clone(),
            hidden: ir.hparams.hidden as usize,
            vocab: ir.hparams.vocab_size as usize,
            layers,
            kv_per_token: ir
                .layers
                .iter()
                .map(|l| u64::from(2 * 4 * l.attention.n_kv_heads * l.attention.head_dim))
                .collect(),
            head: ("output".into(), head.0, head.1),
            embedding_bytes: ir.weight(ir.embedding.weight).n_bytes,
        }
    }

    /// Layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Weight bytes of layers `range` (the head with the last layer).
    pub fn weight_bytes(&self, range: std::ops::Range<usize>) -> u64 {
        let mut b: u64 = self.layers[range.clone()]
            .iter()
            .flatten()
            .map(|t| t.2)
            .sum();
        if range.end == self.layers.len() {
            b += self.head.2;
        }
        b
    }

    /// KV bytes per position of layers `range`.
    pub fn kv_bytes(&self, range: std::ops::Range<usize>) -> u64 {
        self.kv_per_token[range].iter().sum()
    }

    /// Every encoding the model's weights use.
    pub fn encodings(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .layers
            .iter()
            .flatten()
            .map(|t| t.1.clone())
            .chain(std::iter::once(self.head.1.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// The machine's available memory (`MemAvailable` of `/proc/meminfo`), bytes.
pub fn available_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// What a worker measures at start: for each encoding the model uses, the sustained
/// one-row (decode) streaming rate of the model's own matrices of that encoding on `threads`
/// threads — every matrix of it, over and over until at least `min_bytes` have streamed *and*
/// `min_secs` have passed, total bytes over total time (a CPU quota lets short bursts run at
/// full speed: only a sustained rate is what a share of the CPU gives); and the per-pass
/// overhead: one-row passes through the whole model for at least `min_secs / 2`, their mean
/// time minus what the weights' streaming predicts (never negative).
pub fn measure(
    model: &Arc<Model>,
    threads: usize,
    min_bytes: u64,
    min_secs: f64,
) -> Result<(BTreeMap<String, f64>, f64)> {
    let mut ctx = kernel_ctx(threads)?;
    let mut by_enc: BTreeMap<String, Vec<Arc<QuantMatrix>>> = BTreeMap::new();
    for l in &model.layers {
        for x in l.linears() {
            by_enc
                .entry(encoding_name(x.m.encoding()))
                .or_default()
                .push(x.m.clone());
        }
    }
    by_enc
        .entry(encoding_name(model.head.m.encoding()))
        .or_default()
        .push(model.head.m.clone());
    let rates = stream_rates(&by_enc, &mut ctx, min_bytes, min_secs)?;
    // One decode row through the whole model.
    let mut exec = synapse_runtime::Executor::new(model.clone(), threads)?;
    let mut kv = synapse_runtime::KvCache::new(model, synapse_runtime::KvDtype::F32, 1, 8, 1)?;
    // Passes at growing positions of an 8-position slot, reopened as it fills.
    let (mut passes, t0) = (0u32, Instant::now());
    while passes < 4 || t0.elapsed().as_secs_f64() < min_secs / 2.0 {
        let p = passes % 8;
        if p == 0 {
            kv.open(0)?;
        }
        exec.forward(&mut kv, &[synapse_runtime::Row::decode(0, p, 1)])?;
        passes += 1;
    }
    let mean = t0.elapsed().as_secs_f64() / passes as f64;
    let predicted: f64 = by_enc
        .iter()
        .map(|(enc, ms)| {
            ms.iter().map(|m| m.weight_bytes() as f64).sum::<f64>() / rates[enc].max(1.0)
        })
        .sum();
    Ok((rates, (mean - predicted).max(0.0)))
}

/// The best kernel path on `threads` threads.
fn kernel_ctx(threads: usize) -> Result<KernelCtx> {
    Ok(KernelCtx::with_path_and_threads(
        KernelPath::from_env().map_err(synapse_runtime::RuntimeError::from)?,
        threads,
    )
    .map_err(synapse_runtime::RuntimeError::from)?)
}

/// Sustained one-row streaming rate of each encoding's matrices (see [`measure`]).
fn stream_rates(
    by_enc: &BTreeMap<String, Vec<Arc<QuantMatrix>>>,
    ctx: &mut KernelCtx,
    min_bytes: u64,
    min_secs: f64,
) -> Result<BTreeMap<String, f64>> {
    let mut rates = BTreeMap::new();
    let mut x = Vec::new();
    let mut y = Vec::new();
    for (enc, ms) in by_enc {
        let bytes: u64 = ms.iter().map(|m| m.weight_bytes() as u64).sum();
        let (mut streamed, t0) = (0u64, Instant::now());
        while streamed < min_bytes || t0.elapsed().as_secs_f64() < min_secs {
            for m in ms {
                x.resize(m.cols(), 0.25f32);
                y.resize(m.rows(), 0.0f32);
                m.matmul_as(&x, 1, &mut y, 1, ctx)
                    .map_err(synapse_runtime::RuntimeError::from)?;
            }
            streamed += bytes;
        }
        rates.insert(
            enc.clone(),
            streamed as f64 / t0.elapsed().as_secs_f64().max(1e-9),
        );
    }
    Ok(rates)
}

/// Bytes of synthetic matrices per encoding [`measure_synthetic`] streams (more than the
/// last-level caches hold, so the rate is memory's).
pub const SYNTHETIC_WORKING_SET: u64 = 64 << 20;

/// [`measure`] for a worker that holds no weight yet (its stage's tensors come from peers
/// once a plan names its layers): the rates from synthetic matrices of the model's own
/// shapes and encodings ([`synapse_runtime::load::SYNTHETIC_FILL`]; up to
/// [`SYNTHETIC_WORKING_SET`] bytes of each encoding, or all of the model's bytes of it when
/// fewer), the per-pass overhead from one-row passes through one synthetic block (block 1, or
/// 0 when there is one), its mean time minus what its weights' streaming predicts, times the
/// number of blocks. Nothing of the model is read; the kernels' work does not depend on the
/// values.
pub fn measure_synthetic(
    ir: &synapse_model::ModelIr,
    threads: usize,
    min_bytes: u64,
    min_secs: f64,
) -> Result<(BTreeMap<String, f64>, f64)> {
    let mut ctx = kernel_ctx(threads)?;
    let n = ir.layers.len();
    let mut ids: Vec<synapse_model::WeightId> =
        ir.layers.iter().flat_map(|l| l.weight_ids()).collect();
    ids.push(ir.lm_head.linear.weight);
    let mut by_enc: BTreeMap<String, Vec<Arc<QuantMatrix>>> = BTreeMap::new();
    let mut held: BTreeMap<String, u64> = BTreeMap::new();
    for id in ids {
        let w = ir.weight(id);
        let (cols, rows) = match w.shape.as_slice() {
            [rows @ .., cols] if !rows.is_empty() => (*cols, rows.iter().product::<u64>()),
            _ => continue,
        };
        let enc = encoding_name(Encoding::Ggml(w.encoding));
        let have = held.entry(enc.clone()).or_default();
        if *have >= SYNTHETIC_WORKING_SET {
            continue;
        }
        // Rows up to what the working set still takes.
        let row_bytes = (w.n_bytes / rows.max(1)).max(1);
        let take = rows.min((SYNTHETIC_WORKING_SET - *have).div_ceil(row_bytes));
        let bytes = vec![synapse_runtime::load::SYNTHETIC_FILL; (take * row_bytes) as usize];
        let m = QuantMatrix::from_ggml(w.encoding, &bytes, take as usize, cols as usize)
            .map_err(synapse_runtime::RuntimeError::from)?;
        *have += take * row_bytes;
        by_enc.entry(enc).or_default().push(Arc::new(m));
    }
    let rates = stream_rates(&by_enc, &mut ctx, min_bytes, min_secs)?;
    // One decode row through one synthetic block.
    let layer = if n > 1 { 1..2 } else { 0..1 };
    let model = Arc::new(Model::synthetic_stage(ir, layer.clone())?);
    let mut exec = synapse_runtime::Executor::for_stage(model.clone(), threads, layer.clone())?;
    let mut kv = synapse_runtime::KvCache::for_layers(
        &model,
        synapse_runtime::KvDtype::F32,
        1,
        8,
        1,
        layer.clone(),
    )?;
    let hidden = vec![0.25f32; model.hidden()];
    let input = (layer.start > 0).then_some(hidden.as_slice());
    let (mut passes, t0) = (0u32, Instant::now());
    while passes < 4 || t0.elapsed().as_secs_f64() < min_secs / 2.0 {
        let p = passes % 8;
        if p == 0 {
            kv.open(0)?;
        }
        let mut row = synapse_runtime::Row::decode(0, p, 1);
        row.logits = layer.end == n;
        exec.forward_stage(&mut kv, &[row], input)?;
        passes += 1;
    }
    let mean = t0.elapsed().as_secs_f64() / passes as f64;
    let predicted: f64 = model
        .layers
        .get(layer.start)
        .map(|l| {
            l.linears()
                .iter()
                .map(|x| {
                    let enc = encoding_name(x.m.encoding());
                    x.m.weight_bytes() as f64 / rates.get(&enc).copied().unwrap_or(1.0).max(1.0)
                })
                .sum()
        })
        .unwrap_or(0.0);
    Ok((rates, (mean - predicted).max(0.0) * n as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(family: &str) -> Option<Model> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/tiny")
            .join(family)
            .join("model.q8_0.gguf");
        synapse_testdata::require(&path, "tiny-model fixture").then(|| Model::load(&path).unwrap())
    }

    /// Bytes per encoding, layer by layer.
    fn per_layer(s: &ModelSpec) -> Vec<BTreeMap<String, u64>> {
        s.layers
            .iter()
            .map(|l| {
                let mut m = BTreeMap::new();
                for (_, enc, b) in l {
                    *m.entry(enc.clone()).or_default() += b;
                }
                m
            })
            .collect()
    }

    /// The shape a worker without weights registers (from the graph) is the shape of the
    /// loaded model, dense and MoE; and it measures itself on synthetic weights of every
    /// encoding the model uses.
    #[test]
    fn the_graph_gives_the_loaded_models_shape_and_synthetic_weights_measure_it() {
        for family in ["llama", "mixtral"] {
            let Some(m) = tiny(family) else { return };
            let (a, b) = (ModelSpec::of(&m), ModelSpec::of_ir(&m.ir));
            assert_eq!(a.fingerprint, b.fingerprint);
            assert_eq!((a.hidden, a.vocab), (b.hidden, b.vocab));
            assert_eq!(a.kv_per_token, b.kv_per_token);
            assert_eq!((&a.head.1, a.head.2), (&b.head.1, b.head.2));
            assert_eq!(a.embedding_bytes, b.embedding_bytes);
            assert_eq!(per_layer(&a), per_layer(&b), "{family}");
            let n = a.n_layers();
            assert_eq!(a.weight_bytes(0..n), b.weight_bytes(0..n));
            let (rates, overhead) = measure_synthetic(&m.ir, 1, 1 << 16, 0.01).unwrap();
            let encs: Vec<String> = rates.keys().cloned().collect();
            assert_eq!(encs, b.encodings(), "{family}");
            assert!(rates.values().all(|r| r.is_finite() && *r > 0.0));
            assert!(overhead.is_finite() && overhead >= 0.0);
        }
    }
}
