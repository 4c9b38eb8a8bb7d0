//! GEMV/GEMM at Gemma 3 270M's shapes (hidden 640, 4×256 query heads, 1×256 KV head, FFN 2048,
//! vocab 262144) for 1, 4, 8 and 128 activation rows.
//!
//! Shapes are `rows × K` (K = the dot length = `cols`): q 1024×640, o 640×1024, gate/up
//! 2048×640, down 640×2048, k/v 256×640, and the tied Q8_0 head 262144×640.
//! Throughput: decimal bytes of weights for n ≤ 8 (GB/s: decode is bandwidth-bound), and
//! `elements = flops` (2·rows·K·n) for n = 128 (GFLOP/s: prefill is compute-bound).
//!
//! `SYNAPSE_KERNEL_PATH` caps the path; `SYNAPSE_BENCH_THREADS` sets threads (default: all).
//! Run: `cargo bench -p synapse-kernels --bench matmul -- 'q4_K/2048x640'`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;
use synapse_formats::GgmlType;
use synapse_kernels::{KernelCtx, KernelPath, QuantMatrix};

fn random_weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (ts, bs) = (ty.type_size(), ty.block_size());
    let mut out = vec![0u8; rows * cols / bs * ts];
    rng.fill(&mut out[..]);
    let scales: &[usize] = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => &[],
        _ => &[0],
    };
    if ty == GgmlType::F32 {
        for c in out.chunks_exact_mut(4) {
            c.copy_from_slice(&rng.random_range(-1f32..1.0).to_le_bytes());
        }
    } else if ty == GgmlType::F16 {
        for c in out.chunks_exact_mut(2) {
            c.copy_from_slice(&half::f16::from_f32(rng.random_range(-1f32..1.0)).to_le_bytes());
        }
    }
    for b in out.chunks_exact_mut(ts) {
        for &o in scales {
            b[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    out
}

fn ctx() -> KernelCtx {
    let threads = std::env::var("SYNAPSE_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    KernelCtx::with_path_and_threads(
        KernelPath::from_env().expect("SYNAPSE_KERNEL_PATH"),
        threads,
    )
    .expect("kernel context")
}

fn bench(c: &mut Criterion) {
    let mut ctx = ctx();
    eprintln!("kernel path {}, {} threads", ctx.path(), ctx.threads());
    let layers: &[(usize, usize)] = &[
        (1024, 640),
        (640, 1024),
        (2048, 640),
        (640, 2048),
        (256, 640),
    ];
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
    ];
    let mut cases: Vec<(GgmlType, usize, usize)> = types
        .iter()
        .flat_map(|&t| layers.iter().map(move |&(r, k)| (t, r, k)))
        .collect();
    cases.push((GgmlType::Q8_0, 262_144, 640));
    for (ty, rows, k) in cases {
        if !k.is_multiple_of(ty.block_size()) {
            continue; // k-quants need K % 256 == 0 (the model stores those tensors as Q5_0)
        }
        let m = QuantMatrix::from_ggml(ty, &random_weights(ty, rows, k), rows, k).expect("weights");
        let mut g = c.benchmark_group(format!("{}/{rows}x{k}", ty.name()));
        g.warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
            .sample_size(10);
        for n in [1usize, 4, 8, 128] {
            if rows > 100_000 && n == 128 {
                continue; // the head runs on the last token only
            }
            let x: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut y = vec![0f32; n * rows];
            g.throughput(if n <= 8 {
                Throughput::BytesDecimal(m.weight_bytes() as u64)
            } else {
                Throughput::Elements((2 * rows * k * n) as u64)
            });
            g.bench_with_input(BenchmarkId::from_parameter(format!("n{n}")), &n, |b, &n| {
                b.iter(|| m.matmul(&x, n, &mut y, &mut ctx).expect("matmul"))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
