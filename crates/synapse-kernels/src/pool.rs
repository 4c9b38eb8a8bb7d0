//! A small persistent thread pool whose workers spin briefly, then park (ggml's approach):
//! decode-sized matmuls take tens of microseconds, so waking a parked thread per call (or
//! rayon's scope machinery) costs a large fraction of the work.
//!
//! One job runs at a time (the pool is owned by a [`crate::KernelCtx`], used through `&mut`).
//! The caller publishes a job, bumps a generation counter, runs chunks itself, and waits for the
//! workers; chunks are claimed dynamically from an atomic counter.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

type JobFn = dyn Fn(usize, usize) + Sync;

fn noop(_: usize, _: usize) {}
static NOOP: fn(usize, usize) = noop;

#[derive(Clone, Copy)]
struct Job {
    f: *const JobFn,
    rows: usize,
    per: usize,
    chunks: usize,
}

struct Shared {
    generation: AtomicU64,
    job: UnsafeCell<Job>,
    next: AtomicUsize,
    pending: AtomicUsize,
    sleeping: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

// SAFETY: `job` is written only by the owner while every worker is idle (pending == 0 and
// before the generation bump that publishes it), and read by workers only after observing
// that bump (SeqCst), so accesses never overlap.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw job pointer is only dereferenced while the owner waits.
unsafe impl Send for Shared {}

impl Shared {
    fn run_chunks(&self, job: Job) {
        loop {
            let c = self.next.fetch_add(1, AcqRel);
            if c >= job.chunks {
                break;
            }
            let r0 = c * job.per;
            let r1 = (r0 + job.per).min(job.rows);
            // SAFETY: the owner keeps the closure alive until every worker has finished.
            unsafe { (*job.f)(r0, r1) };
        }
    }
}

/// The spin-then-park pool: `workers` threads plus the calling thread.
pub(crate) struct SpinPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl SpinPool {
    pub(crate) fn new(workers: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                f: &NOOP as &JobFn as *const JobFn,
                rows: 0,
                per: 1,
                chunks: 0,
            }),
            next: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        });
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let s = Arc::clone(&shared);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("synapse-kernels-{i}"))
                    .spawn(move || worker(&s))?,
            );
        }
        Ok(Self { shared, handles })
    }

    /// Runs `f(r0, r1)` over `chunks` chunks of `per` rows covering `0..rows`, on the workers
    /// and the calling thread; returns when all chunks are done.
    pub(crate) fn run<'a>(
        &self,
        rows: usize,
        per: usize,
        chunks: usize,
        f: &'a (dyn Fn(usize, usize) + Sync + 'a),
    ) {
        let s = &*self.shared;
        debug_assert_eq!(s.pending.load(Acquire), 0);
        // SAFETY: lifetime erasure; `run` does not return before every worker has finished with
        // the job (pending == 0 below), so the closure outlives all uses.
        let f: *const JobFn = unsafe {
            std::mem::transmute::<&'a (dyn Fn(usize, usize) + Sync + 'a), &'static JobFn>(f)
        };
        let job = Job {
            f,
            rows,
            per,
            chunks,
        };
        // SAFETY: all workers are idle (pending == 0), see `Shared`'s Sync impl.
        unsafe { *s.job.get() = job };
        s.next.store(0, SeqCst);
        s.pending.store(self.handles.len(), SeqCst);
        s.generation.fetch_add(1, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.cv.notify_all();
        }
        s.run_chunks(job);
        // Spin briefly, then yield: on an oversubscribed machine the worker we wait for may be
        // waiting for this very core.
        let mut spins = 0u32;
        while s.pending.load(Acquire) != 0 {
            if spins < 4096 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a synapse-kernels worker panicked");
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Spin, then park until the generation moves.
        let t0 = Instant::now();
        let mut spins = 0u32;
        while s.generation.load(SeqCst) == seen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && t0.elapsed() > SPIN {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_add(1, SeqCst);
                while s.generation.load(SeqCst) == seen {
                    g = s.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleeping.fetch_sub(1, SeqCst);
                break;
            }
        }
        seen = s.generation.load(SeqCst);
        if s.stop.load(SeqCst) {
            return;
        }
        // SAFETY: published before the generation bump we observed; see `Shared`.
        let job = unsafe { *s.job.get() };
        if catch_unwind(AssertUnwindSafe(|| s.run_chunks(job))).is_err() {
            s.panicked.store(true, SeqCst);
        }
        s.pending.fetch_sub(1, AcqRel);
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, SeqCst);
        s.generation.fetch_add(1, SeqCst);
        {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.cv.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
