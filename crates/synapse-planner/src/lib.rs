//! `synapse-planner`: one model over unequal devices.
//!
//! Input ([`PlanRequest`]): devices (memory, *measured* weight-streaming bytes/s per encoding —
//! which is also the device's kernel support — and a per-stage dispatch overhead), links
//! between devices (latency, bandwidth), the model's layers (per tensor, its encodings with
//! bytes and distortion; activation bytes crossing a stage boundary; KV bytes per token), the
//! context length, and an [`Objective`]:
//!
//! * `Latency` — one sequence: a token's time is the sum of its stage and link times.
//! * `Throughput` — many sessions in a pipeline: the bottleneck stage (or link) sets the pace.
//!
//! Output ([`Plan`]): contiguous layer ranges per stage, the encoding of every tensor on every
//! stage (importance-aware: the most precise assignment that fits the device's memory after
//! its KV reservation, demoting the least important bytes first), optional data-parallel
//! replicas for `Throughput`, and the predicted cost.
//!
//! Search ([`search`]): exact — a DP over (set of devices used, last device, split point), which
//! covers every device order and every split — for up to [`EXACT_MAX_DEVICES`] devices; past
//! that a heuristic that fixes the device order (fastest first) and runs the same DP over
//! split points with skipping. The heuristic is exact when all layers are identical and links
//! uniform (a plan's cost then depends only on which device holds how many layers), and it is
//! never worse than the best single-device plan or the best plan in speed order.
//!
//! Where this sits in prior art: llama.cpp RPC and exo split layers by memory alone; Petals
//! places blocks by measured throughput. This planner uses measured speed *and* memory together,
//! and also chooses the encodings that make a split fit.
//!
//! Pure library: independent of the codecs' internals (encodings are IDs with sizes and measured
//! rates), no files, no executor, no network.
#![deny(missing_docs)]

pub mod error;
pub mod fit;
pub mod search;
pub mod types;

pub use error::{PlanError, Result};
pub use search::{EXACT_MAX_DEVICES, compare_exact_and_heuristic, plan};
pub use types::{
    Device, EncodingCost, Layer, Link, LinkSpec, Objective, Pipeline, Plan, PlanRequest, Stage,
    TensorSpec,
};
