//! `synapse-kernels`: Synapse's compute ring.
//!
//! Quantized matrix-vector and matrix-matrix products for every weight encoding the engine
//! runs, with runtime CPU-feature dispatch, plus the elementwise ops ([`ops`]) and attention
//! primitives ([`ggml_f32`]) the executor needs, in ggml's float order.
//!
//! # Design
//! - **One port**: [`QuantMatrix`] (encoding, bytes, rows, cols) with [`QuantMatrix::matvec`]
//!   and [`QuantMatrix::matmul`]; a [`KernelCtx`] holds the path, threads and scratch.
//! - **ggml's technique**: activations are quantized once per call to 8-bit blocks carrying
//!   their sums (32-blocks for the legacy quants, 256-blocks with 16-sums for k-quants); inner
//!   loops are integer (`maddubs`/`madd`, VNNI `dpbusd`), with one float multiply-add per block.
//! - **Dispatch**: [`KernelPath`] is detected at run time; every SIMD function is compiled with
//!   `#[target_feature]`, so one binary runs everywhere. `SYNAPSE_KERNEL_PATH` caps the path.
//! - **Invariant**: every SIMD path is tested against the scalar path and against f32
//!   decode-then-dot with ggml's published tolerances (tests/parity.rs).
#![deny(missing_docs)]

mod act;
mod blocks;
mod buf;
mod ctx;
pub mod dispatch;
pub mod error;
pub mod ggml_f32;
mod kernels;
mod matrix;
pub mod ops;
mod pool;
mod tl;

pub use ctx::{KernelCtx, POOL_ENV, PoolKind};
pub use dispatch::KernelPath;
pub use error::{KernelError, Result};
pub use matrix::{Encoding, OrderClass, QuantMatrix, WeightSource};
pub use ops::RopeStyle;
pub use tl::TernaryTlMatrix;
