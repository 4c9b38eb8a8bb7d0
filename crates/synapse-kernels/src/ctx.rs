//! [`KernelCtx`]: the kernel path, the thread pool and the reusable scratch of one executor.

use crate::buf::AlignedBuf;
use crate::dispatch::KernelPath;
use crate::error::{KernelError, Result};
use crate::pool::SpinPool;

/// Below this many flops a matmul runs on the calling thread (waking a worker costs more).
const PARALLEL_MIN_FLOPS: usize = 1 << 18;

/// Per-executor kernel state: the instruction-set path, the worker threads, and scratch that
/// is reused across calls (activation quantization buffers), so the hot path does not allocate
/// once the largest shape has been seen.
///
/// A context is used by one thread at a time (`&mut self`); create one per executor.
pub struct KernelCtx {
    path: KernelPath,
    act: AlignedBuf,
    /// Second scratch: activations re-laid out for the tiled GEMM (x86 only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pack: AlignedBuf,
    /// Third scratch: the per-matrix lane starts of a shared-input call (x86 only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    shared: AlignedBuf,
    pool: Pool,
}

impl std::fmt::Debug for KernelCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCtx")
            .field("path", &self.path)
            .field("threads", &self.pool.threads)
            .field("pool", &self.pool.kind)
            .finish()
    }
}

impl KernelCtx {
    /// The best path this CPU supports (capped by `SYNAPSE_KERNEL_PATH`) and one thread per
    /// available core.
    pub fn new() -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_path_and_threads(KernelPath::from_env()?, threads)
    }

    /// A context forced onto `path` (an error if the CPU cannot run it) with `threads` threads
    /// (at least 1; 1 means the calling thread only) in the default pool kind.
    pub fn with_path_and_threads(path: KernelPath, threads: usize) -> Result<Self> {
        Self::with_options(path, threads, PoolKind::from_env())
    }

    /// A context with every option explicit.
    pub fn with_options(path: KernelPath, threads: usize, pool: PoolKind) -> Result<Self> {
        if !path.is_supported() {
            return Err(KernelError::PathUnsupported(path));
        }
        Ok(Self {
            path,
            act: AlignedBuf::default(),
            pack: AlignedBuf::default(),
            shared: AlignedBuf::default(),
            pool: Pool::new(threads.max(1), pool)?,
        })
    }

    /// The kernel path in use.
    pub fn path(&self) -> KernelPath {
        self.path
    }

    /// Number of threads a matmul uses (including the caller).
    pub fn threads(&self) -> usize {
        self.pool.threads
    }

    /// The thread pool kind in use.
    pub fn pool_kind(&self) -> PoolKind {
        self.pool.kind
    }

    /// Runs `f(i0, i1)` over chunks covering `0..items` on this context's threads, in
    /// parallel when `cost` (≈ flops) makes it worth it; for work outside the matrix kernels
    /// (attention over heads and rows). `f` must only write disjoint data per item.
    pub fn parallel_for(&mut self, items: usize, cost: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        self.pool.run_rows(items, 1, cost, f);
    }

    pub(crate) fn parts(&mut self) -> (&mut AlignedBuf, &Pool) {
        (&mut self.act, &self.pool)
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn parts2(&mut self) -> (&mut AlignedBuf, &mut AlignedBuf, &Pool) {
        (&mut self.act, &mut self.pack, &self.pool)
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn parts3(&mut self) -> (&mut AlignedBuf, &mut AlignedBuf, &mut AlignedBuf, &Pool) {
        (&mut self.act, &mut self.pack, &mut self.shared, &self.pool)
    }
}

/// Which thread pool runs the row chunks.
///
/// Measured on the 2-core development machine when quiet (2026-11-30, `decode_bench` on the
/// default model, 2 threads): the spin pool decodes 26.8–30.0 tok/s after a 512-token prompt
/// against rayon's 21.9–22.0 (prefill 112 vs 101–104 tok/s), and 30.8 vs 19.4 tok/s after a
/// 16-token prompt, so spin is the default. Under heavy oversubscription (load ≈ 17 from other
/// builds) rayon was faster for decode-sized calls, because a spinning caller waits for a
/// worker the scheduler has parked; `SYNAPSE_KERNEL_POOL=rayon` selects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Persistent workers that spin ~200 µs, then park (ggml's approach); the default.
    Spin,
    /// A dedicated rayon pool (`scope` + `spawn` per chunk).
    Rayon,
}

/// The environment variable choosing the pool kind (`spin` or `rayon`).
pub const POOL_ENV: &str = "SYNAPSE_KERNEL_POOL";

impl PoolKind {
    /// `SYNAPSE_KERNEL_POOL` if set to `rayon`, else [`PoolKind::Spin`].
    pub fn from_env() -> Self {
        match std::env::var(POOL_ENV) {
            Ok(v) if v.trim().eq_ignore_ascii_case("rayon") => PoolKind::Rayon,
            _ => PoolKind::Spin,
        }
    }
}

enum Backend {
    Inline,
    Rayon(rayon::ThreadPool),
    Spin(SpinPool),
}

/// Row-chunked parallel execution.
pub(crate) struct Pool {
    threads: usize,
    kind: PoolKind,
    backend: Backend,
}

impl Pool {
    fn new(threads: usize, kind: PoolKind) -> Result<Self> {
        let err = |e: String| KernelError::BadArgument {
            op: "thread pool",
            msg: e,
        };
        let backend = match (threads, kind) {
            (1, _) => Backend::Inline,
            (_, PoolKind::Rayon) => Backend::Rayon(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("synapse-kernels-rayon-{i}"))
                    .build()
                    .map_err(|e| err(e.to_string()))?,
            ),
            (_, PoolKind::Spin) => {
                Backend::Spin(SpinPool::new(threads - 1).map_err(|e| err(e.to_string()))?)
            }
        };
        Ok(Self {
            threads,
            kind,
            backend,
        })
    }

    /// Runs `f(r0, r1)` over chunks covering `0..rows` (chunk sizes multiples of `granule`),
    /// in parallel when the work is worth it.
    pub(crate) fn run_rows(
        &self,
        rows: usize,
        granule: usize,
        flops: usize,
        f: &(dyn Fn(usize, usize) + Sync),
    ) {
        if matches!(self.backend, Backend::Inline) || flops < PARALLEL_MIN_FLOPS || rows <= 1 {
            f(0, rows);
            return;
        }
        // A few chunks per thread so a thread slowed by a neighbour does not hold the others up.
        let g = granule.max(1);
        let chunks = (self.threads * 4).min(rows.div_ceil(g)).max(1);
        let per = rows.div_ceil(chunks).next_multiple_of(g);
        let chunks = rows.div_ceil(per);
        match &self.backend {
            Backend::Inline => f(0, rows),
            Backend::Spin(p) => p.run(rows, per, chunks, f),
            Backend::Rayon(pool) => pool.scope(|s| {
                for c in 0..chunks {
                    let r0 = c * per;
                    let r1 = (r0 + per).min(rows);
                    s.spawn(move |_| f(r0, r1));
                }
            }),
        }
    }
}
