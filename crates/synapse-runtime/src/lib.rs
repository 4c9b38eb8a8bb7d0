//! `synapse-runtime`: the core that wires the rings together.
//!
//! - [`Model::load`]: a model path → IR (through `synapse-model`'s family adapters) → weights
//!   in their [`PrecisionProfile`] encodings as `synapse-kernels` matrices (no f32 copy);
//!   [`Model::load_package`]: the same from a Synapse package (`synapse-import`'s
//!   `PackageModel`: its stored graph and verified objects).
//! - [`Executor::forward`]: one pass over a ragged batch of [`Row`]s (session, position,
//!   token), several sessions per pass, logits only where asked.
//! - Mixture-of-experts blocks (`moe`, private): router, expert grouping (all rows routed to
//!   one expert share one kernel call per projection) and the weighted sum in llama.cpp's
//!   order.
//! - [`residency`]: weights resident under a byte budget: routed experts (LRU-2 paging;
//!   [`Executor::page_experts`]) or a dense model's blocks (a few kept, the rest streamed
//!   through one slot; [`Executor::page_layers`]).
//! - [`KvCache`]: per-session slots, f32 or f16, sliding-window rings, prefix reuse, an
//!   identity that includes the precision-profile hash.
//! - [`Sampler`] and [`generate`]: sampling and the generation loop for one session (chunked
//!   prefill, stop rules, timings).
//! - [`escalation::generate_exact`]: greedy generation at the source precision with drafts
//!   from an approximate profile, verified in one pass per round (the source's own tokens);
//!   [`selective::generate_selective`]: the approximate profile alone, uncertain steps
//!   recomputed at the source precision (opt-in, approximate).
//! - [`engine`]: continuous batching of many sessions ([`engine::Engine`] on its own thread,
//!   [`engine::Scheduler`] the step logic), bounded admission, cancellation, prefix cache.
//!
//! Architecture invariant: the runtime never names a model family; everything
//! family-specific is an attribute in the IR.
#![deny(missing_docs)]

pub mod ablation;
mod attention;
pub mod calib;
pub mod draft_choice;
pub mod engine;
pub mod error;
pub mod escalation;
pub mod executor;
pub mod generate;
pub mod head_draft;
pub mod importance;
pub mod kv;
pub mod load;
mod moe;
mod pages;
pub mod perplexity;
pub mod pipeline;
pub mod precision;
pub mod profile;
pub mod promotion;
pub mod refine;
pub mod residency;
pub mod sampling;
pub mod selective;
pub mod tap;
pub mod variant;

pub use error::{Result, RuntimeError};
pub use executor::{Executor, Row, StageOut, prompt_order};
pub use generate::{GenerateParams, Generated, StopReason, Timings, generate};
pub use kv::{KvCache, KvDtype, KvIdentity, KvOp, SlotId};
pub use load::Model;
pub use moe::ExpertStats;
pub use profile::PrecisionProfile;
pub use sampling::{SampleAt, Sampler, SamplingParams, StopStrings, argmax};
pub use synapse_kernels::OrderClass;
pub use tap::{Stage, Tap};
pub use variant::{VariantCache, VariantStats};
