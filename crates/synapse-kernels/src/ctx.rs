//! [`KernelCtx`]: the kernel path, the thread pool and the reusable scratch of one executor.

use crate::buf::AlignedBuf;
use crate::dispatch::KernelPath;
use crate::error::{KernelError, Result};

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
    pool: Pool,
}

impl std::fmt::Debug for KernelCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCtx")
            .field("path", &self.path)
            .field("threads", &self.pool.threads)
            .finish()
    }
}

impl KernelCtx {
    /// The best path this CPU supports (capped by `SYNAPSE_KERNEL_PATH`) and one worker per
    /// available core.
    pub fn new() -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_path_and_threads(KernelPath::from_env()?, threads)
    }

    /// A context forced onto `path` (an error if the CPU cannot run it) with `threads` workers
    /// (at least 1; 1 means the calling thread only).
    pub fn with_path_and_threads(path: KernelPath, threads: usize) -> Result<Self> {
        if !path.is_supported() {
            return Err(KernelError::PathUnsupported(path));
        }
        Ok(Self {
            path,
            act: AlignedBuf::default(),
            pool: Pool::new(threads.max(1))?,
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

    pub(crate) fn parts(&mut self) -> (&mut AlignedBuf, &Pool) {
        (&mut self.act, &self.pool)
    }
}

/// Row-chunked parallel execution.
pub(crate) struct Pool {
    threads: usize,
    rayon: Option<rayon::ThreadPool>,
}

impl Pool {
    fn new(threads: usize) -> Result<Self> {
        let rayon = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("synapse-kernels-{i}"))
                    .build()
                    .map_err(|e| KernelError::BadArgument {
                        op: "thread pool",
                        msg: e.to_string(),
                    })?,
            )
        } else {
            None
        };
        Ok(Self { threads, rayon })
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
        let Some(pool) = self
            .rayon
            .as_ref()
            .filter(|_| flops >= PARALLEL_MIN_FLOPS && rows > 1)
        else {
            f(0, rows);
            return;
        };
        // A few chunks per thread so a thread slowed by a neighbour does not hold the others up.
        let g = granule.max(1);
        let chunks = (self.threads * 4).min(rows.div_ceil(g)).max(1);
        let per = rows.div_ceil(chunks).next_multiple_of(g);
        pool.scope(|s| {
            let mut r0 = 0;
            while r0 < rows {
                let r1 = (r0 + per).min(rows);
                s.spawn(move |_| f(r0, r1));
                r0 = r1;
            }
        });
    }
}
