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
    let mut ctx = KernelCtx::with_path_and_threads(
        KernelPath::from_env().map_err(synapse_runtime::RuntimeError::from)?,
        threads,
    )
    .map_err(synapse_runtime::RuntimeError::from)?;
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
    let mut rates = BTreeMap::new();
    let mut x = Vec::new();
    let mut y = Vec::new();
    for (enc, ms) in &by_enc {
        let bytes: u64 = ms.iter().map(|m| m.weight_bytes() as u64).sum();
        let (mut streamed, t0) = (0u64, Instant::now());
        while streamed < min_bytes || t0.elapsed().as_secs_f64() < min_secs {
            for m in ms {
                x.resize(m.cols(), 0.25f32);
                y.resize(m.rows(), 0.0f32);
                m.matmul_as(&x, 1, &mut y, 1, &mut ctx)
                    .map_err(synapse_runtime::RuntimeError::from)?;
            }
            streamed += bytes;
        }
        rates.insert(
            enc.clone(),
            streamed as f64 / t0.elapsed().as_secs_f64().max(1e-9),
        );
    }
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
