//! Encode and `linear` throughput of the q4/g64 symmetric and ternary codecs.
//!
//! Matrix: 256 rows × 2048 columns (512 Ki weights), deterministic pseudo-random data.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use synapse_codecs::resolve;

const ROWS: usize = 256;
const COLS: usize = 2048;

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let w = data(ROWS * COLS, 1);
    let x = data(COLS, 2);
    for id in [
        "syn.q4.symmetric.g64.v1",
        "syn.ternary.absmean.g64.v1",
        "syn.ternary.absmean.tensor.v1",
    ] {
        let codec = resolve(id).expect("valid id");
        let mut g = c.benchmark_group(id);
        g.throughput(Throughput::Elements((ROWS * COLS) as u64));
        g.bench_function("encode", |b| {
            b.iter(|| {
                codec
                    .encode_matrix(black_box(&w), ROWS, COLS)
                    .expect("encode")
            })
        });
        let enc = codec.encode_matrix(&w, ROWS, COLS).expect("encode");
        let mut y = vec![0.0f32; ROWS];
        g.bench_function("linear", |b| {
            b.iter(|| {
                codec
                    .linear(black_box(&enc), ROWS, black_box(&x), &mut y)
                    .expect("linear")
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
