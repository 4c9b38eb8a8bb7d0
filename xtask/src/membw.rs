//! `cargo xtask membw`: the machine's streaming read bandwidth with 1 and 2 threads (and more
//! if asked), the physical limit a bandwidth-bound decode GEMV is measured against.
//!
//! Each thread sums its own contiguous slice of a buffer much larger than the last-level cache
//! (u64 words, 8 independent accumulators, so the loop is load-bound); the best of `--reps`
//! passes is reported in GB/s (10^9 bytes). On a shared machine, compare runs, not single
//! numbers.
//!
//! The buffer is read twice: on 4 KiB pages (a plain vector) and on transparent huge pages
//! (an anonymous mapping on a 2 MiB boundary advised `MADV_HUGEPAGE`, as Synapse holds its KV
//! cache and resident weights). Huge pages stream faster (no TLB miss and no prefetcher stop
//! every 4 KiB), so the benches set decode's traffic against the huge-page pass
//! ([`stream_rate`]): the higher of the two limits.

use anyhow::Result;
use std::time::Instant;

/// Arguments of `cargo xtask membw`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Buffer size in MiB (should dwarf the last-level cache).
    #[arg(long, default_value_t = 512)]
    mib: usize,
    /// Passes per thread count; the best is reported.
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2])]
    threads: Vec<usize>,
}

const SEGMENT_WORDS: usize = 4 << 20 >> 3;

/// Sums `s` segment by segment; returns the checksum and each segment's rate in bytes/s.
fn walk(s: &[u64]) -> (u64, Vec<f64>) {
    let mut sum = 0u64;
    let mut rates = Vec::with_capacity(s.len() / SEGMENT_WORDS + 1);
    for seg in s.chunks(SEGMENT_WORDS) {
        let t0 = Instant::now();
        sum = sum.wrapping_add(std::hint::black_box(sum_words(seg)));
        rates.push((seg.len() * 8) as f64 / t0.elapsed().as_secs_f64());
    }
    (sum, rates)
}

fn sum_words(s: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*v);
        }
    }
    let tail: u64 = chunks.remainder().iter().fold(0, |a, v| a.wrapping_add(*v));
    acc.iter().fold(tail, |a, v| a.wrapping_add(*v))
}

/// `words` u64s `0, 1, 2, …` on transparent huge pages where the system allows (Linux: an
/// anonymous mapping on a 2 MiB boundary advised `MADV_HUGEPAGE`), else in a vector.
struct Words {
    /// The mapping (base, length) and where the words start in it.
    #[cfg(target_os = "linux")]
    map: Option<(*mut libc::c_void, usize, *mut u64)>,
    vec: Vec<u64>,
    words: usize,
}

impl Words {
    fn huge(words: usize) -> Self {
        #[cfg(target_os = "linux")]
        {
            const HUGE: usize = 2 << 20;
            let len = words * 8 + HUGE;
            // SAFETY: a fresh private anonymous mapping.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base != libc::MAP_FAILED {
                let skip = (HUGE - base as usize % HUGE) % HUGE;
                // SAFETY: `skip < HUGE`: the words lie inside the mapping; advice changes no
                // contents.
                let data = unsafe { base.cast::<u8>().add(skip) };
                // SAFETY: the range lies inside the mapping (above).
                unsafe { libc::madvise(data.cast(), words * 8, libc::MADV_HUGEPAGE) };
                let mut w = Self {
                    map: Some((base, len, data.cast())),
                    vec: Vec::new(),
                    words,
                };
                for (i, x) in w.as_mut().iter_mut().enumerate() {
                    *x = i as u64; // touches every page
                }
                return w;
            }
        }
        Self::small(words)
    }

    fn small(words: usize) -> Self {
        Self {
            #[cfg(target_os = "linux")]
            map: None,
            vec: (0..words as u64).collect(), // touches every page
            words,
        }
    }

    fn data(&self) -> *mut u64 {
        #[cfg(target_os = "linux")]
        if let Some((_, _, data)) = self.map {
            return data;
        }
        self.vec.as_ptr().cast_mut()
    }

    fn as_mut(&mut self) -> &mut [u64] {
        // SAFETY: `words` u64s at `data()`, owned by `self`, borrowed mutably through it.
        unsafe { std::slice::from_raw_parts_mut(self.data(), self.words) }
    }
}

impl std::ops::Deref for Words {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        // SAFETY: `words` initialised u64s at `data()`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.data(), self.words) }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some((base, len, _)) = self.map {
            // SAFETY: the mapping made in `huge`, unmapped once.
            unsafe { libc::munmap(base, len) };
        }
    }
}

// SAFETY: `Words` owns its memory alone (as a `Vec` does); shared access only reads.
unsafe impl Sync for Words {}

/// The best of `reps` streaming passes over `mib` MiB on huge pages with `threads` threads,
/// in bytes/s (what `bench-vs-llama` sets decode's traffic against, in the same run).
pub(crate) fn stream_rate(mib: usize, reps: usize, threads: usize) -> f64 {
    let words = mib * (1 << 20) / 8;
    let buf = Words::huge(words);
    let per = words.div_ceil(threads.max(1));
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        std::thread::scope(|sc| {
            let hs: Vec<_> = buf
                .chunks(per)
                .map(|c| sc.spawn(move || sum_words(c)))
                .collect();
            for h in hs {
                std::hint::black_box(h.join().unwrap_or_default());
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best
}

pub fn run(a: Args) -> Result<()> {
    let words = a.mib * (1 << 20) / 8;
    println!("streaming read of {} MiB, best of {} passes", a.mib, a.reps);
    for (name, buf) in [
        ("4 KiB pages", Words::small(words)),
        ("2 MiB pages", Words::huge(words)),
    ] {
        println!("{name}:");
        passes(&a, &buf);
    }
    Ok(())
}

fn passes(a: &Args, buf: &[u64]) {
    let words = buf.len();
    let bytes = (words * 8) as f64;
    for &t in &a.threads {
        let t = t.max(1);
        let per = words.div_ceil(t);
        let mut best = f64::INFINITY;
        let mut check = 0u64;
        let mut per_thread: Vec<Vec<f64>> = vec![Vec::new(); t];
        for _ in 0..a.reps.max(1) {
            let t0 = Instant::now();
            let results = std::thread::scope(|sc| {
                let hs: Vec<_> = buf.chunks(per).map(|c| sc.spawn(move || walk(c))).collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_default())
                    .collect::<Vec<_>>()
            });
            best = best.min(t0.elapsed().as_secs_f64());
            for (i, (s, rates)) in results.into_iter().enumerate() {
                check = check.wrapping_add(s);
                per_thread[i].extend(rates);
            }
        }
        let seg: f64 = per_thread
            .iter_mut()
            .map(|r| {
                r.sort_by(f64::total_cmp);
                r.get(r.len() * 9 / 10).copied().unwrap_or(0.0)
            })
            .sum();
        println!(
            "threads {t}: pass {:6.2} GB/s, segment p90 {:6.2} GB/s  (checksum {:x})",
            bytes / best / 1e9,
            seg / 1e9,
            std::hint::black_box(check)
        );
    }
}
