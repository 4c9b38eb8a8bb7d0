//! `cargo xtask membw`: the machine's streaming read bandwidth with 1 and 2 threads (and more
//! if asked), the physical limit a bandwidth-bound decode GEMV is measured against.
//!
//! Each thread sums its own contiguous slice of a buffer much larger than the last-level cache
//! (u64 words, 8 independent accumulators, so the loop is load-bound); the best of `--reps`
//! passes is reported in GB/s (10^9 bytes). On a shared machine, compare runs, not single
//! numbers.

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

/// The best of `reps` streaming passes over `mib` MiB with `threads` threads, in bytes/s
/// (what `bench-vs-llama` sets decode's weight traffic against, in the same run).
pub(crate) fn stream_rate(mib: usize, reps: usize, threads: usize) -> f64 {
    let words = mib * (1 << 20) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
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
    let buf: Vec<u64> = (0..words as u64).collect(); // touches every page
    let bytes = (words * 8) as f64;
    println!("streaming read of {} MiB, best of {} passes", a.mib, a.reps);
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
    Ok(())
}
