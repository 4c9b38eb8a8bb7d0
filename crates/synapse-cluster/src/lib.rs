//! `synapse-cluster`: one model over several machines — the cluster adapter.
//!
//! - [`membership`]: workers register on etcd under a lease (the lease is the worker's
//!   identity), elect a leader, and the leader publishes the plan with a compare-and-swap.
//! - [`plan`]: replicate before splitting — a worker that holds the model and its KV runs it
//!   alone; otherwise `synapse-planner` splits the layers over workers by their measured
//!   speed, memory and links.
//! - [`worker`]: the worker process (its gRPC service, roles, link measurement).
//! - [`link`]: a pipeline hop, the runtime's `StageLink` over a gRPC stream.
//! - [`router`]: the OpenAI front end's backend: each session goes to a replica or pipeline
//!   head; a session whose worker is lost resumes elsewhere from its prompt and the tokens it
//!   already streamed ([`synapse_runtime::engine::Request::forced`]).
//! - [`profile`]: what a worker measures and publishes about itself.
//!
//! Architecture invariant: this crate (and the CLI that starts it) is the only place that
//! knows etcd, gRPC or sockets between workers; the runtime sees a `StageLink` and a
//! `Backend`. A row's hidden state crosses a link as exact `f32`, so tokens are bit-identical
//! to one machine's.
#![deny(missing_docs)]

pub mod error;
pub mod fetch;
pub mod link;
pub mod membership;
pub mod plan;
pub mod profile;
pub mod router;
pub mod wire;
pub mod worker;

pub use error::{ClusterError, Result};

/// The worker protocol (generated from `proto/cluster.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("synapse.cluster.v1");
}
