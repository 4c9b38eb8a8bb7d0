//! BitNet W1.58A8 GEMV timing from DRAM: `kbench_a8 ROWS K [threads] [cold MiB]` builds enough
//! copies of a random `QuantMatrix::from_ternary_a8` matrix to exceed the cold size, cycles
//! through them for ~1.5 s of one-row calls and prints the median call time, weight GB/s and
//! GFLOP/s (the line format of bitnet.cpp's harness in the session notes, for side-by-side runs).

use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use synapse_codecs::TernaryTensor;
use synapse_kernels::{KernelCtx, KernelPath, QuantMatrix};

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (rows, k, threads, cold) = (arg(1, 2560), arg(2, 2560), arg(3, 2), arg(4, 1024));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let w: Vec<f32> = (0..rows * k)
        .map(|_| rng.random_range(-1f32..1.0))
        .collect();
    let bytes = TernaryTensor::encode_bitnet_weight_quant(&w).expect("encode");
    let m = QuantMatrix::from_ternary_a8(&bytes, rows, k).expect("matrix");
    let copies = ((cold << 20) / m.weight_bytes()).max(1) + 1;
    let mats: Vec<QuantMatrix> = (0..copies).map(|_| m.clone()).collect();
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1f32..1.0)).collect();
    let mut y = vec![0f32; rows];
    let path = std::env::var("KPATH")
        .ok()
        .and_then(|p| KernelPath::from_name(&p).ok())
        .unwrap_or_else(KernelPath::best_supported);
    let mut ctx = KernelCtx::with_path_and_threads(path, threads).unwrap();
    let mut ts = Vec::new();
    let end = Instant::now() + Duration::from_millis(1500);
    let mut i = 0;
    while Instant::now() < end || ts.len() < 20 {
        let t0 = Instant::now();
        mats[i % copies]
            .matvec(&x, &mut y, &mut ctx)
            .expect("matvec");
        ts.push(t0.elapsed().as_secs_f64());
        i += 1;
    }
    ts.sort_by(f64::total_cmp);
    let med = ts[ts.len() / 2];
    println!(
        "synapse w158a8 {rows}x{k} T={threads}: median {:.1} us, {:.2} GB/s, {:.1} GF/s ({} calls, {copies} copies)",
        med * 1e6,
        m.weight_bytes() as f64 / med / 1e9,
        2.0 * (rows * k) as f64 / med / 1e9,
        ts.len()
    );
}
