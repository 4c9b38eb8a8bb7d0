//! BitNet W1.58A8 GEMV timing from DRAM, both ternary packings side by side: `kbench_a8 ROWS K
//! [threads] [cold MiB] [rounds]` builds a random `syn.ternary.absmean.tensor.v1` matrix as
//! the 2-bit multiply-add packing (`QuantMatrix::from_ternary_a8`, "i2") and as the
//! table-lookup packing (`TernaryTlMatrix`, "tl", 1.67 bits a weight), enough copies of each
//! to exceed the cold size, and alternates them `rounds` times (default 3) for ~1.5 s of
//! one-row calls each. Each call is followed by a plain streaming read of another copy's bytes
//! through the same pool (`common/read.rs`: the paired reference of `cargo xtask
//! bench-kernels-vs-ggml`). Per round and packing it prints the median call time, weight GB/s,
//! GFLOP/s (the same weights: the comparable figure) and the median of the per-call fractions
//! of the paired read. `KPATH=scalar|avx2|avx512vnni` forces a path.

#[path = "common/read.rs"]
mod read;

use rand::{Rng, SeedableRng};
use read::read_all;
use std::time::{Duration, Instant};
use synapse_codecs::TernaryTensor;
use synapse_kernels::{KernelCtx, KernelPath, QuantMatrix, TernaryTlMatrix};

/// Either packing, as the loop times it.
enum Packed {
    I2(QuantMatrix),
    Tl(TernaryTlMatrix),
}

impl Packed {
    fn bytes(&self) -> &[u8] {
        match self {
            Packed::I2(m) => m.raw_bytes(),
            Packed::Tl(m) => m.as_bytes(),
        }
    }

    fn matvec(&self, x: &[f32], y: &mut [f32], ctx: &mut KernelCtx) {
        match self {
            Packed::I2(m) => m.matvec(x, y, ctx).expect("matvec"),
            Packed::Tl(m) => m.matmul(x, 1, y, ctx).expect("matmul"),
        }
    }
}

/// The bytes of `b` read once over the context's threads, in contiguous chunks.
fn stream(b: &[u8], ctx: &mut KernelCtx) -> u64 {
    let total = std::sync::atomic::AtomicU64::new(0);
    let pages = b.len().div_ceil(4096);
    ctx.parallel_for(pages, 2 * b.len(), &|p0, p1| {
        let s = &b[p0 * 4096..(p1 * 4096).min(b.len())];
        total.fetch_xor(read_all(s), std::sync::atomic::Ordering::Relaxed);
    });
    total.into_inner()
}

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (rows, k, threads, cold, rounds) = (
        arg(1, 2560),
        arg(2, 2560),
        arg(3, 2),
        arg(4, 1024),
        arg(5, 3),
    );
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let w: Vec<f32> = (0..rows * k)
        .map(|_| rng.random_range(-1f32..1.0))
        .collect();
    let bytes = TernaryTensor::encode_bitnet_weight_quant(&w).expect("encode");
    let i2 = QuantMatrix::from_ternary_a8(&bytes, rows, k).expect("matrix");
    let tl = TernaryTlMatrix::from_ternary_a8(&bytes, rows, k).expect("tl matrix");
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1f32..1.0)).collect();
    let path = std::env::var("KPATH")
        .ok()
        .and_then(|p| KernelPath::from_name(&p).ok())
        .unwrap_or_else(KernelPath::best_supported);
    let mut ctx = KernelCtx::with_path_and_threads(path, threads).unwrap();
    // Both give the same bits (tested in tests/ternary_a8.rs); checked once more here.
    let (mut ya, mut yb) = (vec![0f32; rows], vec![0f32; rows]);
    i2.matvec(&x, &mut ya, &mut ctx).expect("matvec");
    tl.matmul(&x, 1, &mut yb, &mut ctx).expect("matmul");
    assert!(ya.iter().zip(&yb).all(|(a, b)| a.to_bits() == b.to_bits()));
    let copies_of = |b: usize| ((cold << 20) / b).max(1) + 1;
    let sets: Vec<(&str, Vec<Packed>)> = vec![
        (
            "i2",
            (0..copies_of(i2.weight_bytes()))
                .map(|_| Packed::I2(i2.clone()))
                .collect(),
        ),
        (
            "tl",
            (0..copies_of(tl.weight_bytes()))
                .map(|_| Packed::Tl(tl.clone()))
                .collect(),
        ),
    ];
    let mut y = vec![0f32; rows];
    for round in 0..rounds {
        for (name, mats) in &sets {
            let copies = mats.len();
            let (mut ts, mut fr) = (Vec::new(), Vec::new());
            let end = Instant::now() + Duration::from_millis(1500);
            let mut i = 0;
            while Instant::now() < end || ts.len() < 20 {
                let t0 = Instant::now();
                mats[i % copies].matvec(&x, &mut y, &mut ctx);
                let t = t0.elapsed().as_secs_f64();
                let s0 = Instant::now();
                std::hint::black_box(stream(mats[(i + copies / 2) % copies].bytes(), &mut ctx));
                fr.push(s0.elapsed().as_secs_f64() / t);
                ts.push(t);
                i += 1;
            }
            ts.sort_by(f64::total_cmp);
            fr.sort_by(f64::total_cmp);
            let med = ts[ts.len() / 2];
            let wb = mats[0].bytes().len();
            println!(
                "round {round} {name} {rows}x{k} T={threads} {}: median {:.1} us, {:.2} GB/s, {:.1} GF/s, {:.0}% of the paired read ({} calls, {copies} copies)",
                path.name(),
                med * 1e6,
                wb as f64 / med / 1e9,
                2.0 * (rows * k) as f64 / med / 1e9,
                100.0 * fr[fr.len() / 2],
                ts.len()
            );
        }
    }
}
