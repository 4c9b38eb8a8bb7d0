//! A small persistent thread pool whose workers spin briefly, then park (ggml's approach):
//! decode-sized matmuls take tens of microseconds, so waking a parked thread per call (or
//! rayon's scope machinery) costs a large fraction of the work.
//!
//! One job runs at a time (the pool is owned by a [`crate::KernelCtx`], used through `&mut`).
//! The caller publishes a job, runs chunks itself, and returns when every chunk is *done* — not
//! when every worker has checked in: a worker the OS has descheduled (another process on its
//! core) simply claims nothing, instead of holding the caller for a scheduler time slice.
//! Chunks are claimed from one atomic word `generation << 32 | chunks << 16 | next`, so a
//! claim succeeds only for the job that is current, and the job (on the caller's stack) is
//! dereferenced only by a thread holding an unfinished chunk of it, while the caller waits.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

/// Most chunks one job may have (the claim word holds 16 bits of each counter).
pub(crate) const MAX_CHUNKS: usize = u16::MAX as usize;

type JobFn = dyn Fn(usize, usize) + Sync;

struct Job {
    f: *const JobFn,
    rows: usize,
    per: usize,
}

struct Shared {
    /// One worker: chunks claimed as two contiguous halves ([`claim_half`]).
    halves: bool,
    /// `generation << 32 | chunks << 16 | next chunk`, or with `halves` `generation << 32`
    /// and [`claim_half`]'s counters.
    state: AtomicU64,
    /// The current job (on the caller's stack while it runs).
    job: AtomicPtr<Job>,
    /// Chunks of the current job finished.
    done: AtomicUsize,
    sleeping: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Workers that have started running (their thread set up).
    started: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Shared {
    /// Claims and runs chunks of generation `generation` until none is left (`caller`: the
    /// thread that published the job).
    fn run_chunks(&self, generation: u64, caller: bool) {
        loop {
            let st = self.state.load(Acquire);
            if st >> 32 != generation {
                return;
            }
            let (new, next) = if self.halves {
                match claim_half(st, caller) {
                    Some(c) => c,
                    None => return,
                }
            } else {
                let (chunks, next) = ((st >> 16) & 0xffff, st & 0xffff);
                if next >= chunks {
                    return;
                }
                (st + 1, next)
            };
            if self
                .state
                .compare_exchange_weak(st, new, AcqRel, Acquire)
                .is_err()
            {
                continue;
            }
            // SAFETY: chunk `next` of the current generation is claimed and not yet done, so
            // the caller is still inside `run` and its job (and closure) are alive.
            let job = unsafe { &*self.job.load(Acquire) };
            let r0 = next as usize * job.per;
            let r1 = (r0 + job.per).min(job.rows);
            // SAFETY: as above.
            let f = unsafe { &*job.f };
            if catch_unwind(AssertUnwindSafe(|| f(r0, r1))).is_err() {
                self.panicked.store(true, SeqCst);
            }
            // After this the caller may return: nothing of the job is touched again.
            self.done.fetch_add(1, Release);
        }
    }
}

/// One worker beside the caller: the claim word's low 32 bits are four 8-bit counters
/// `a | m | w | e` (from the top): the caller owns chunks `a..m` and claims them upwards from
/// `a`, the worker owns `w..e` and claims upwards from `w`; a thread whose own range is empty
/// takes the other's last chunk (`m − 1` or `e − 1`). Each thread so streams one contiguous
/// run of rows — consecutive chunks continue the weights' memory stream, where chunks dealt
/// alternately restarted it at every chunk (kbench, 2 threads, Q4_1 decode GEMVs with the
/// weights out of cache: 576 × 576 9.5 → 6.9 µs with two contiguous chunks) — and a slow
/// thread still loses its range's end to the other.
fn claim_half(st: u64, caller: bool) -> Option<(u64, u64)> {
    let (a, m, w, e) = (
        (st >> 24) & 0xff,
        (st >> 16) & 0xff,
        (st >> 8) & 0xff,
        st & 0xff,
    );
    let high = st & !0xffff_ffff;
    let pack = |a: u64, m: u64, w: u64, e: u64| high | a << 24 | m << 16 | w << 8 | e;
    match (caller, a < m, w < e) {
        (true, true, _) => Some((pack(a + 1, m, w, e), a)),
        (true, false, true) => Some((pack(a, m, w, e - 1), e - 1)),
        (false, _, true) => Some((pack(a, m, w + 1, e), w)),
        (false, true, false) => Some((pack(a, m - 1, w, e), m - 1)),
        _ => None,
    }
}

/// Most chunks a job of a one-worker pool may have ([`claim_half`]'s 8-bit counters).
const MAX_HALF_CHUNKS: usize = u8::MAX as usize;

/// The spin-then-park pool: `workers` threads plus the calling thread.
pub(crate) struct SpinPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl SpinPool {
    pub(crate) fn new(workers: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            halves: workers == 1,
            state: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            started: AtomicUsize::new(0),
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
        // Wait until every worker runs: a thread's start-up allocates (the standard
        // library's per-thread records), and a worker the OS schedules late would otherwise
        // do so inside some later, steady call (seen under CPU contention: one allocation in
        // a steady decode step).
        while shared.started.load(SeqCst) < workers {
            std::thread::yield_now();
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
        if chunks > MAX_CHUNKS || (s.halves && chunks > MAX_HALF_CHUNKS) {
            // Not reachable from `Pool::run_rows` (a few chunks per thread); stay correct.
            for c in 0..chunks {
                f(c * per, ((c + 1) * per).min(rows));
            }
            return;
        }
        // SAFETY: lifetime erasure; `run` does not return before every chunk is done, and
        // the closure is only called for claimed, unfinished chunks (see `run_chunks`).
        let f: *const JobFn = unsafe {
            std::mem::transmute::<&'a (dyn Fn(usize, usize) + Sync + 'a), &'static JobFn>(f)
        };
        let job = Job { f, rows, per };
        s.job.store(&job as *const Job as *mut Job, Release);
        s.done.store(0, Relaxed);
        let generation = (s.state.load(Relaxed) >> 32) + 1;
        let counters = if s.halves {
            // The caller's half first (it starts while the worker wakes).
            let (m, c) = (chunks.div_ceil(2) as u64, chunks as u64);
            m << 16 | m << 8 | c
        } else {
            (chunks as u64) << 16
        };
        s.state.store(generation << 32 | counters, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.cv.notify_all();
        }
        s.run_chunks(generation, true);
        // Only chunks a worker is running remain: spin, then yield (that worker may be
        // waiting for this very core).
        let mut spins = 0u32;
        while s.done.load(Acquire) < chunks {
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
    s.started.fetch_add(1, SeqCst);
    let mut seen = 0u64;
    loop {
        // Spin, then park until the generation moves.
        let t0 = Instant::now();
        let mut spins = 0u32;
        while s.state.load(SeqCst) >> 32 == seen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && t0.elapsed() > SPIN {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_add(1, SeqCst);
                while s.state.load(SeqCst) >> 32 == seen {
                    g = s.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleeping.fetch_sub(1, SeqCst);
                break;
            }
        }
        seen = s.state.load(SeqCst) >> 32;
        if s.stop.load(SeqCst) {
            return;
        }
        s.run_chunks(seen, false);
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, SeqCst);
        s.state.fetch_add(1 << 32, SeqCst);
        {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.cv.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_runs_exactly_once_over_many_jobs() {
        every_row_once(&SpinPool::new(2).unwrap(), 97, 7);
    }

    /// 20,000 jobs of `1 + job % rows` rows in chunks of `1 + job % per`: every row runs
    /// exactly once.
    fn every_row_once(pool: &SpinPool, rows: usize, per: usize) {
        for job in 0..20_000usize {
            let rows = 1 + job % rows;
            let per = 1 + job % per;
            let chunks = rows.div_ceil(per);
            let hits: Vec<AtomicUsize> = (0..rows).map(|_| AtomicUsize::new(0)).collect();
            pool.run(rows, per, chunks, &|r0, r1| {
                for h in &hits[r0..r1] {
                    h.fetch_add(1, Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "job {job}");
        }
    }

    #[test]
    fn one_worker_claims_two_contiguous_halves_and_every_chunk_once() {
        // The claims alone: every chunk exactly once whichever thread claims when, each
        // thread's own claims ascending until it steals.
        for chunks in 1..=40u64 {
            for pattern in 0..64u32 {
                let m = chunks.div_ceil(2);
                let mut st = 7u64 << 32 | m << 16 | m << 8 | chunks;
                let mut seen = vec![0; chunks as usize];
                let mut i = 0;
                loop {
                    let caller = (pattern >> (i % 6)) & 1 == 0;
                    i += 1;
                    let Some((new, c)) = claim_half(st, caller).or_else(|| claim_half(st, !caller))
                    else {
                        break;
                    };
                    assert_eq!(new >> 32, 7);
                    seen[c as usize] += 1;
                    st = new;
                }
                assert!(seen.iter().all(|&n| n == 1), "{chunks} chunks: {seen:?}");
            }
        }
        // Up to 300 chunks: past 255 a one-worker job runs on the caller alone.
        every_row_once(&SpinPool::new(1).unwrap(), 300, 3);
    }

    #[test]
    fn a_panicking_chunk_is_reported_and_the_pool_survives() {
        let pool = SpinPool::new(1).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, 1, 64, &|r0, _| {
                if r0 == 17 {
                    panic!("chunk 17");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.run(10, 2, 5, &|r0, r1| {
            n.fetch_add(r1 - r0, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 10);
    }
}
