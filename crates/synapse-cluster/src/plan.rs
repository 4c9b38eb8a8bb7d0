//! The cluster's plan: which worker runs which layers, as replicas or pipelines.
//!
//! Replicate before splitting ([`make_plan`]): every worker that holds the whole model and
//! the KV of its slots runs it alone, as a replica; only when none can does the planner
//! (`synapse-planner`, measured stream rates, memory and links) split the layers into a
//! pipeline over the workers. [`memory_share_plan`] is the rule llama.cpp's RPC backend and
//! exo use — layers in proportion to memory — kept for comparison.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use synapse_planner::{
    Device, EncodingCost, Layer, Link, LinkSpec, Objective, PlanRequest, TensorSpec,
};

use crate::error::{ClusterError, Result};
use crate::profile::{ModelSpec, WorkerProfile};

/// How every engine of the plan is shaped (each stage of a pipeline must agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineShape {
    /// Session slots per pipeline.
    pub slots: usize,
    /// Positions per session.
    pub ctx: usize,
    /// Prompt batch (llama.cpp's `n_ubatch`).
    pub ubatch: usize,
    /// How hidden states cross pipeline links (`f32`: exact; `f16`/`bf16`: half the bytes,
    /// an opt-in with a measured error).
    #[serde(default)]
    pub link: LinkDtype,
    /// Passes a pipeline's first stage keeps in flight: 1, or 2 (a second batch of sessions
    /// runs on one stage while the first runs on the next). With 2 the planner balances
    /// stages (throughput objective: the slowest stage per token), with 1 it minimises
    /// their sum (latency objective).
    #[serde(default = "one")]
    pub in_flight: usize,
}

fn one() -> usize {
    1
}

/// The element type of hidden states on a pipeline link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LinkDtype {
    /// Exact: results bit-identical to one machine.
    #[default]
    F32,
    /// IEEE half precision (rounded to nearest even).
    F16,
    /// bfloat16 (rounded to nearest even).
    Bf16,
}

impl std::str::FromStr for LinkDtype {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(LinkDtype::F32),
            "f16" => Ok(LinkDtype::F16),
            "bf16" => Ok(LinkDtype::Bf16),
            other => Err(ClusterError::Invalid {
                what: "link dtype",
                reason: format!("{other:?} (f32, f16 or bf16)"),
            }),
        }
    }
}

/// One stage: a worker and its layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagePlan {
    /// Worker id.
    pub worker: String,
    /// Its gRPC address.
    pub addr: String,
    /// Layers `[start, end)`.
    pub layers: Range<usize>,
}

/// A pipeline (one stage: a replica).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelinePlan {
    /// Stages in layer order.
    pub stages: Vec<StagePlan>,
    /// Predicted decode tokens/s on it (the planner's model: one over the sum of stage and
    /// link times with one pass in flight, over the slowest of them with two).
    pub tokens_per_s: f64,
}

/// The plan every worker loads from etcd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterPlan {
    /// Incremented by each publication.
    pub epoch: u64,
    /// BLAKE3 of the placement (model, shape, pipelines): equal plans hash equal.
    pub hash: String,
    /// The model's fingerprint.
    pub model: String,
    /// Engine shape.
    pub shape: EngineShape,
    /// Replicas and pipelines.
    pub pipelines: Vec<PipelinePlan>,
    /// How it was made (`replicas`, `pipeline`, `memory-share`).
    pub rule: String,
}

impl ClusterPlan {
    /// A plan of `pipelines` (hash computed; epoch 0 until published).
    pub fn new(model: &str, shape: EngineShape, pipelines: Vec<PipelinePlan>, rule: &str) -> Self {
        let hash = {
            let canon = serde_json::json!({
                "model": model,
                "shape": shape,
                "pipelines": pipelines.iter().map(|p| p.stages.clone()).collect::<Vec<_>>(),
            });
            blake3::hash(canon.to_string().as_bytes()).to_hex()[..16].to_string()
        };
        ClusterPlan {
            epoch: 0,
            hash,
            model: model.to_string(),
            shape,
            pipelines,
            rule: rule.to_string(),
        }
    }

    /// The stage `worker` runs, with its pipeline's index and its position in it.
    pub fn stage_of(&self, worker: &str) -> Option<(usize, usize, &StagePlan)> {
        self.pipelines.iter().enumerate().find_map(|(p, pl)| {
            pl.stages
                .iter()
                .enumerate()
                .find(|(_, s)| s.worker == worker)
                .map(|(i, s)| (p, i, s))
        })
    }

    /// Workers the plan uses.
    pub fn workers(&self) -> Vec<&str> {
        self.pipelines
            .iter()
            .flat_map(|p| p.stages.iter().map(|s| s.worker.as_str()))
            .collect()
    }
}

/// Bytes a stage running `layers` needs: their weights (the head with the last layer) and
/// the KV of those layers for every slot's whole context.
pub fn stage_bytes(spec: &ModelSpec, layers: Range<usize>, shape: EngineShape) -> u64 {
    spec.weight_bytes(layers.clone()) + spec.kv_bytes(layers) * (shape.slots * shape.ctx) as u64
}

/// Predicted seconds of one decode row through `layers` on `w` (streaming their weights at
/// its measured rates, plus its per-pass overhead).
pub fn stage_time(spec: &ModelSpec, w: &WorkerProfile, layers: Range<usize>) -> f64 {
    let rate = |enc: &str| w.stream_rate.get(enc).copied().unwrap_or(1e9).max(1.0);
    let mut t: f64 = spec.layers[layers.clone()]
        .iter()
        .flatten()
        .map(|(_, e, b)| *b as f64 / rate(e))
        .sum();
    if layers.end == spec.n_layers() {
        t += spec.head.2 as f64 / rate(&spec.head.1);
    }
    t + w.dispatch_overhead_s
}

fn link_between(a: &WorkerProfile, b: &WorkerProfile) -> Link {
    let m = a.links.get(&b.id).or_else(|| b.links.get(&a.id));
    match m {
        Some(l) => Link {
            latency_s: l.latency_s.max(1e-6),
            bandwidth_bytes_per_s: l.bandwidth_bytes_per_s.max(1.0),
        },
        // Not measured yet: a loopback-like default (it only ranks plans).
        None => Link {
            latency_s: 1e-4,
            bandwidth_bytes_per_s: 1e9,
        },
    }
}

/// How the leader places layers when the model must be split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Placement {
    /// By measured speed, memory and links (`synapse-planner`).
    #[default]
    Speed,
    /// In proportion to memory alone (llama.cpp RPC's and exo's rule), for comparison.
    MemoryShare,
}

impl std::str::FromStr for Placement {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "speed" => Ok(Placement::Speed),
            "memory-share" => Ok(Placement::MemoryShare),
            other => Err(ClusterError::Invalid {
                what: "placement",
                reason: format!("{other:?} (speed or memory-share)"),
            }),
        }
    }
}

/// The plan for `workers` under `placement`: replicas when a worker holds the model, else a
/// pipeline placed by `placement`.
pub fn plan_for(
    spec: &ModelSpec,
    workers: &[WorkerProfile],
    shape: EngineShape,
    placement: Placement,
) -> Result<ClusterPlan> {
    let p = make_plan(spec, workers, shape);
    match (placement, &p) {
        (Placement::MemoryShare, Ok(x)) if x.rule != "replicas" => {
            memory_share_plan(spec, workers, shape)
        }
        (Placement::MemoryShare, Err(_)) => memory_share_plan(spec, workers, shape),
        _ => p,
    }
}

/// The plan for `workers` (those of `spec`'s model; ids sorted for determinism).
pub fn make_plan(
    spec: &ModelSpec,
    workers: &[WorkerProfile],
    shape: EngineShape,
) -> Result<ClusterPlan> {
    let mut ws: Vec<&WorkerProfile> = workers
        .iter()
        .filter(|w| w.model == spec.fingerprint)
        .collect();
    ws.sort_by(|a, b| a.id.cmp(&b.id));
    if ws.is_empty() {
        return Err(ClusterError::NoWorker(
            "no worker of this model has joined".into(),
        ));
    }
    let n = spec.n_layers();
    let whole = stage_bytes(spec, 0..n, shape);
    let mut replicas: Vec<PipelinePlan> = ws
        .iter()
        .filter(|w| w.memory_bytes >= whole)
        .map(|w| PipelinePlan {
            stages: vec![StagePlan {
                worker: w.id.clone(),
                addr: w.addr.clone(),
                layers: 0..n,
            }],
            tokens_per_s: 1.0 / stage_time(spec, w, 0..n).max(1e-9),
        })
        .collect();
    if !replicas.is_empty() {
        replicas.sort_by(|a, b| b.tokens_per_s.total_cmp(&a.tokens_per_s));
        return Ok(ClusterPlan::new(
            &spec.fingerprint,
            shape,
            replicas,
            "replicas",
        ));
    }
    pipeline_plan(spec, &ws, shape)
}

/// A layer pipeline over `ws` by the planner: measured speed, memory and links.
pub fn pipeline_plan(
    spec: &ModelSpec,
    ws: &[&WorkerProfile],
    shape: EngineShape,
) -> Result<ClusterPlan> {
    // The fastest pipeline over all workers, then again over the workers it left unused, as
    // long as they can hold the model: pipelines side by side, each serving its own sessions.
    let mut left: Vec<&WorkerProfile> = ws.to_vec();
    let mut pipelines: Vec<PipelinePlan> = Vec::new();
    loop {
        match one_pipeline(spec, &left, shape) {
            Ok(p) => {
                left.retain(|w| !p.stages.iter().any(|s| s.worker == w.id));
                pipelines.push(p);
                if left.is_empty() {
                    break;
                }
            }
            Err(e) if pipelines.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(ClusterPlan::new(
        &spec.fingerprint,
        shape,
        pipelines,
        "pipeline",
    ))
}

/// The single fastest pipeline over `ws` (the planner, latency objective).
fn one_pipeline(
    spec: &ModelSpec,
    ws: &[&WorkerProfile],
    shape: EngineShape,
) -> Result<PipelinePlan> {
    let n = spec.n_layers();
    let devices = ws
        .iter()
        .map(|w| Device {
            name: w.id.clone(),
            memory_bytes: w.memory_bytes,
            stream_rate: spec
                .encodings()
                .into_iter()
                .map(|e| {
                    let r = w.stream_rate.get(&e).copied().unwrap_or(1e9);
                    (e, r)
                })
                .collect(),
            dispatch_overhead_s: w.dispatch_overhead_s,
        })
        .collect();
    let mut links = Vec::new();
    for (i, a) in ws.iter().enumerate() {
        for b in &ws[i + 1..] {
            links.push(LinkSpec {
                a: a.id.clone(),
                b: b.id.clone(),
                link: link_between(a, b),
            });
        }
    }
    let layers = (0..n)
        .map(|il| {
            let mut tensors: Vec<TensorSpec> = spec.layers[il]
                .iter()
                .map(|(name, enc, bytes)| TensorSpec {
                    name: name.clone(),
                    options: vec![EncodingCost {
                        encoding: enc.clone(),
                        bytes: *bytes,
                        distortion: 0.0,
                    }],
                })
                .collect();
            if il + 1 == n {
                tensors.push(TensorSpec {
                    name: spec.head.0.clone(),
                    options: vec![EncodingCost {
                        encoding: spec.head.1.clone(),
                        bytes: spec.head.2,
                        distortion: 0.0,
                    }],
                });
            }
            Layer {
                tensors,
                activation_bytes: (spec.hidden * 4) as u64,
                kv_bytes_per_token: spec.kv_per_token[il],
            }
        })
        .collect();
    let req = PlanRequest {
        devices,
        links,
        layers,
        context_length: (shape.slots * shape.ctx) as u64,
        // One pass at a time: a token costs the sum of the stages' times. Two in flight
        // keep both ends of each hop busy: the slowest stage (or link) sets the rate.
        objective: if shape.in_flight >= 2 {
            Objective::Throughput
        } else {
            Objective::Latency
        },
        quality_floor: None,
        allow_approximation: false,
        max_replicas: 1,
    };
    let plan = synapse_planner::plan(&req)?;
    let by_id: BTreeMap<&str, &WorkerProfile> = ws.iter().map(|w| (w.id.as_str(), *w)).collect();
    let p = plan
        .pipelines
        .first()
        .ok_or_else(|| ClusterError::NoWorker("the planner returned no pipeline".into()))?;
    Ok(PipelinePlan {
        stages: p
            .stages
            .iter()
            .map(|s| StagePlan {
                worker: s.device.clone(),
                addr: by_id
                    .get(s.device.as_str())
                    .map_or(String::new(), |w| w.addr.clone()),
                layers: s.layers.clone(),
            })
            .collect(),
        tokens_per_s: if shape.in_flight >= 2 {
            1.0 / p.bottleneck_s.max(1e-9)
        } else {
            1.0 / p.latency_s.max(1e-9)
        },
    })
}

/// One pipeline over all of `ws` (in id order) with layers in proportion to each worker's
/// memory — llama.cpp RPC's and exo's rule — for comparison with [`make_plan`].
pub fn memory_share_plan(
    spec: &ModelSpec,
    ws: &[WorkerProfile],
    shape: EngineShape,
) -> Result<ClusterPlan> {
    let mut ws: Vec<&WorkerProfile> = ws.iter().filter(|w| w.model == spec.fingerprint).collect();
    ws.sort_by(|a, b| a.id.cmp(&b.id));
    let n = spec.n_layers();
    if ws.is_empty() || ws.len() > n {
        return Err(ClusterError::NoWorker(format!(
            "{} workers for {n} layers",
            ws.len()
        )));
    }
    let total: f64 = ws.iter().map(|w| w.memory_bytes as f64).sum();
    let mut stages = Vec::new();
    let mut start = 0usize;
    let mut acc = 0f64;
    for (i, w) in ws.iter().enumerate() {
        acc += w.memory_bytes as f64;
        let left = ws.len() - i - 1;
        let end = if left == 0 {
            n
        } else {
            ((acc / total * n as f64).round() as usize).clamp(start + 1, n - left)
        };
        stages.push(StagePlan {
            worker: w.id.clone(),
            addr: w.addr.clone(),
            layers: start..end,
        });
        start = end;
    }
    let times = stages
        .iter()
        .zip(&ws)
        .map(|(s, w)| stage_time(spec, w, s.layers.clone()));
    let t: f64 = if shape.in_flight >= 2 {
        times.fold(0.0, f64::max)
    } else {
        times.sum()
    };
    Ok(ClusterPlan::new(
        &spec.fingerprint,
        shape,
        vec![PipelinePlan {
            stages,
            tokens_per_s: 1.0 / t.max(1e-9),
        }],
        "memory-share",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: usize) -> ModelSpec {
        ModelSpec {
            fingerprint: "m".into(),
            hidden: 64,
            vocab: 100,
            layers: (0..n)
                .map(|i| vec![(format!("blk.{i}.0"), "q8_0".into(), 1000)])
                .collect(),
            kv_per_token: vec![10; n],
            head: ("output".into(), "q8_0".into(), 2000),
            embedding_bytes: 500,
        }
    }

    fn worker(id: &str, mem: u64, rate: f64) -> WorkerProfile {
        WorkerProfile {
            id: id.into(),
            addr: format!("http://{id}"),
            model: "m".into(),
            memory_bytes: mem,
            threads: 1,
            stream_rate: [("q8_0".to_string(), rate)].into(),
            dispatch_overhead_s: 0.0,
            links: BTreeMap::new(),
            started_s: 0,
        }
    }

    const SHAPE: EngineShape = EngineShape {
        slots: 1,
        ctx: 10,
        ubatch: 8,
        link: LinkDtype::F32,
        in_flight: 1,
    };

    #[test]
    fn replicas_when_the_model_fits_a_worker() {
        let s = spec(8);
        let p = make_plan(
            &s,
            &[worker("b", 1 << 20, 1e9), worker("a", 1 << 20, 2e9)],
            SHAPE,
        )
        .unwrap();
        assert_eq!(p.rule, "replicas");
        assert_eq!(p.pipelines.len(), 2);
        assert_eq!(p.pipelines[0].stages[0].worker, "a", "fastest first");
        assert!(p.pipelines.iter().all(|x| x.stages[0].layers == (0..8)));
        // Same inputs, same hash; another shape, another.
        let q = make_plan(
            &s,
            &[worker("a", 1 << 20, 2e9), worker("b", 1 << 20, 1e9)],
            SHAPE,
        )
        .unwrap();
        assert_eq!(p.hash, q.hash);
        let r = make_plan(&s, &[worker("a", 1 << 20, 2e9)], SHAPE).unwrap();
        assert_ne!(p.hash, r.hash);
    }

    #[test]
    fn a_pipeline_when_no_worker_holds_the_model() {
        let s = spec(8);
        // The model needs 8·1000 + 2000 + 8·10·10 = 10,800 bytes; each holds ~7,000.
        let ws = [worker("fast", 7000, 2e9), worker("slow", 7000, 1e9)];
        let p = make_plan(&s, &ws, SHAPE).unwrap();
        assert_eq!(p.rule, "pipeline");
        assert_eq!(p.pipelines.len(), 1);
        let st = &p.pipelines[0].stages;
        assert_eq!(st.len(), 2);
        assert_eq!(st[0].layers.start, 0);
        assert_eq!(st[1].layers.end, 8);
        assert_eq!(st[0].layers.end, st[1].layers.start);
        for x in st {
            let w = ws.iter().find(|w| w.id == x.worker).unwrap();
            assert!(
                stage_bytes(&s, x.layers.clone(), SHAPE) <= w.memory_bytes,
                "{x:?}"
            );
        }
        // Nobody fits even split: an error, not a plan.
        assert!(make_plan(&s, &[worker("a", 3000, 1e9), worker("b", 3000, 1e9)], SHAPE).is_err());
    }

    #[test]
    fn memory_share_splits_by_memory_alone() {
        let s = spec(9);
        let p = memory_share_plan(&s, &[worker("a", 2000, 1e9), worker("b", 1000, 5e9)], SHAPE)
            .unwrap();
        let st = &p.pipelines[0].stages;
        assert_eq!(st[0].layers, 0..6);
        assert_eq!(st[1].layers, 6..9);
    }
}
