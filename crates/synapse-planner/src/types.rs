//! Inputs and outputs of the planner.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

/// A device and what was measured on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// Unique name.
    pub name: String,
    /// Memory available for weights, KV and activations, bytes.
    pub memory_bytes: u64,
    /// Measured weight-streaming rate per encoding, bytes/s. An encoding absent here has no
    /// kernel on this device and is never placed on it.
    pub stream_rate: BTreeMap<String, f64>,
    /// Fixed time per stage per token (dispatch, synchronisation), seconds.
    pub dispatch_overhead_s: f64,
}

/// A link's cost: `latency_s + bytes / bandwidth_bytes_per_s`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// One-way latency, seconds.
    pub latency_s: f64,
    /// Bandwidth, bytes/s.
    pub bandwidth_bytes_per_s: f64,
}

/// A (symmetric) link between two named devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkSpec {
    /// One end.
    pub a: String,
    /// The other end.
    pub b: String,
    /// Its cost.
    pub link: Link,
}

/// One encoding of one tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncodingCost {
    /// Encoding ID.
    pub encoding: String,
    /// Bytes of the tensor in it.
    pub bytes: u64,
    /// Its measured distortion (0 for the source encoding).
    pub distortion: f64,
}

/// A tensor and its possible encodings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// Tensor name (unique across the model).
    pub name: String,
    /// Its encodings (any order).
    pub options: Vec<EncodingCost>,
}

/// A model layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layer {
    /// Its tensors.
    pub tensors: Vec<TensorSpec>,
    /// Bytes of this layer's output per token (what crosses a link after it).
    pub activation_bytes: u64,
    /// KV-cache bytes per token of context for this layer.
    pub kv_bytes_per_token: u64,
}

/// What to optimise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Objective {
    /// One sequence: minimise Σ stage times + Σ link times per token.
    Latency,
    /// Many sessions: minimise the bottleneck (slowest stage or link) per token.
    Throughput,
}

/// A planning problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// Devices (unique names).
    pub devices: Vec<Device>,
    /// Links; a pair without a link cannot hold adjacent stages.
    pub links: Vec<LinkSpec>,
    /// Layers in model order.
    pub layers: Vec<Layer>,
    /// Tokens of KV reserved on every stage (context length × concurrent sequences).
    pub context_length: u64,
    /// What to optimise.
    pub objective: Objective,
    /// Largest per-tensor distortion accepted without opting into approximation.
    pub quality_floor: Option<f64>,
    /// Opt-in to go below the quality floor.
    pub allow_approximation: bool,
    /// Most data-parallel pipelines (`Throughput` only; 1 = a single pipeline).
    pub max_replicas: usize,
}

/// One stage of a pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// Device name.
    pub device: String,
    /// Layer range `[start, end)`.
    pub layers: Range<usize>,
    /// Tensor name → encoding on this stage.
    pub encodings: BTreeMap<String, String>,
    /// Σ weight bytes.
    pub weight_bytes: u64,
    /// KV bytes reserved.
    pub kv_bytes: u64,
    /// Predicted time per token, seconds.
    pub time_s: f64,
}

/// A pipeline: stages in layer order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pipeline {
    /// Stages.
    pub stages: Vec<Stage>,
    /// Σ stage + link times per token.
    pub latency_s: f64,
    /// Slowest stage or link per token.
    pub bottleneck_s: f64,
}

/// The plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The objective planned for.
    pub objective: Objective,
    /// One pipeline, or several data-parallel replicas (`Throughput`).
    pub pipelines: Vec<Pipeline>,
    /// Predicted seconds per token of one sequence (the best pipeline's latency).
    pub latency_s: f64,
    /// Predicted tokens/s of the whole cluster (Σ 1 / bottleneck).
    pub tokens_per_s: f64,
    /// Whether the exact search was used (else the heuristic).
    pub exact: bool,
}
