//! Kernel timing that survives a shared, oversubscribed machine: each call is timed alone and
//! the *minimum* over many calls is reported (a call that was not preempted), with the median
//! beside it; with one thread, the on-CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`)
//! is reported too, which stays meaningful for calls longer than a scheduler time slice. `cargo run --release -p synapse-kernels --example kbench -- [path] [threads] [filter]`.
//! Reports weight GB/s and GFLOP/s at Gemma 3 270M's shapes (rows × K), for the activation-row
//! counts in `KBENCH_NS` (default `1,4,8,128`). `KBENCH_COLD=MB` times each call on the next
//! of enough copies of the matrix to fill MB megabytes (weights from memory, not cache).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;
use synapse_formats::GgmlType;
use synapse_kernels::{KernelCtx, KernelPath, QuantMatrix};

/// Nanoseconds the calling thread has run (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn thread_cpu_ns() -> f64 {
    let mut ts = [0i64; 2];
    // SAFETY: the clock_gettime syscall (228) writes one `struct timespec` to `ts`.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") 228i64 => _, in("rdi") 3i64, in("rsi") ts.as_mut_ptr(),
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ts[0] as f64 * 1e9 + ts[1] as f64
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn thread_cpu_ns() -> f64 {
    f64::NAN
}

fn weights(ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (ts, bs) = (ty.type_size(), ty.block_size());
    let mut out = vec![0u8; rows * k / bs * ts];
    rng.fill(&mut out[..]);
    let scales: &[usize] = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => &[],
        _ => &[0],
    };
    for b in out.chunks_exact_mut(ts) {
        for &o in scales {
            b[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    if ty == GgmlType::F16 {
        for c in out.chunks_exact_mut(2) {
            c.copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        }
    }
    out
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .map(|p| KernelPath::from_name(&p).expect("path"))
        .unwrap_or_else(KernelPath::best_supported);
    let threads: usize = std::env::args()
        .nth(2)
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let filter = std::env::args().nth(3).unwrap_or_default();
    // Activation-row counts, e.g. `KBENCH_NS=1,2,4,8,12` (default 1, 4, 8, 128).
    let ns: Vec<usize> = std::env::var("KBENCH_NS")
        .ok()
        .map(|v| {
            v.split(',')
                .map(|n| n.trim().parse().expect("KBENCH_NS"))
                .collect()
        })
        .unwrap_or_else(|| vec![1, 4, 8, 128]);
    let mut ctx = KernelCtx::with_path_and_threads(path, threads).expect("ctx");
    // `KBENCH_ORDER=one`: every row in the one-row float order (decode steps and verified
    // drafts) instead of the order of an n-row call.
    let one_order = std::env::var("KBENCH_ORDER").is_ok_and(|v| v == "one");
    println!(
        "path {path}, threads {threads}, pool {:?}; best-of-N call times",
        ctx.pool_kind()
    );
    // `KBENCH_TYPES=Q4_1,Q4_0` and `KBENCH_SHAPES=576x576,49152x576` (rows x K) override the
    // defaults (Gemma 3 270M's shapes; the 262144-row LM head only when the filter names it).
    let types: Vec<GgmlType> = match std::env::var("KBENCH_TYPES") {
        Ok(v) => v
            .split(',')
            .map(|n| {
                synapse_formats::ALL_TYPES
                    .iter()
                    .copied()
                    .find(|t| t.name().eq_ignore_ascii_case(n.trim()))
                    .expect("KBENCH_TYPES: a ggml type name")
            })
            .collect(),
        Err(_) => vec![
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::F16,
        ],
    };
    let custom = std::env::var("KBENCH_SHAPES").is_ok();
    let shapes: Vec<(usize, usize)> = match std::env::var("KBENCH_SHAPES") {
        Ok(v) => v
            .split(',')
            .map(|s| {
                let (r, k) = s.trim().split_once('x').expect("KBENCH_SHAPES: ROWSxK");
                (r.parse().expect("rows"), k.parse().expect("K"))
            })
            .collect(),
        Err(_) => vec![
            (1024, 640),
            (640, 1024),
            (2048, 640),
            (640, 2048),
            (256, 640),
            (262144, 640),
        ],
    };
    // `KBENCH_CODECS=syn.q4.symmetric.g64.v1,…`: Synapse codecs (random N(0,1) weights,
    // encoded) instead of the ggml types.
    let codecs: Vec<String> = std::env::var("KBENCH_CODECS")
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_default();
    let mut mats: Vec<(String, usize, usize, QuantMatrix)> = Vec::new();
    for id in &codecs {
        for &(rows, k) in &shapes {
            let mut rng = ChaCha8Rng::seed_from_u64(2);
            let w: Vec<f32> = (0..rows * k)
                .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                .collect();
            let c = synapse_codecs::resolve(id).expect("KBENCH_CODECS: an encoding ID");
            let bytes = c.encode_matrix(&w, rows, k).expect("encode");
            let short = id.split('.').take(3).collect::<Vec<_>>().join(".");
            mats.push((
                short,
                rows,
                k,
                QuantMatrix::from_codec(id, &bytes, rows, k).expect("m"),
            ));
            // The per-tensor ternary codec also as BitNet's W1.58A8 integer path.
            if id == "syn.ternary.absmean.tensor.v1" {
                mats.push((
                    "w158a8".into(),
                    rows,
                    k,
                    QuantMatrix::from_ternary_a8(&bytes, rows, k).expect("m"),
                ));
            }
        }
    }
    let types = if codecs.is_empty() { types } else { Vec::new() };
    for ty in types {
        for &(rows, k) in &shapes {
            let (rows, k): (usize, usize) = (rows, k);
            // The LM head (Q8_0 only) when the filter names it.
            if !k.is_multiple_of(ty.block_size())
                || !format!("{}/{rows}x{k}", ty.name()).contains(&filter)
                || (!custom
                    && rows == 262144
                    && (ty != GgmlType::Q8_0 || !filter.contains("262144")))
            {
                continue;
            }
            let m = QuantMatrix::from_ggml(ty, &weights(ty, rows, k), rows, k).expect("m");
            mats.push((ty.name().to_string(), rows, k, m));
        }
    }
    {
        for (name, rows, k, m) in &mats {
            let (rows, k) = (*rows, *k);
            let mut line = format!("{name:>5} {rows:>5}x{k:<5}");
            for &n in &ns {
                let x: Vec<f32> = (0..n * k)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let mut y = vec![0f32; n * rows];
                let trials = (2_000_000_000 / (rows * k * n)).clamp(5, 3000);
                // `KBENCH_COLD=MB`: copies of the matrix that fill MB megabytes, each call on
                // the next, so the weights come from memory as in a decode step (whose
                // hundreds of small matrices do not stay in cache between tokens).
                let copies: Vec<QuantMatrix> = std::env::var("KBENCH_COLD")
                    .ok()
                    .and_then(|v| v.parse::<usize>().ok())
                    .map(|mb| {
                        (0..(mb << 20).div_ceil(m.weight_bytes()).max(2))
                            .map(|_| m.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                let mut next = 0usize;
                let mut pick = || {
                    if copies.is_empty() {
                        m
                    } else {
                        next = (next + 1) % copies.len();
                        &copies[next]
                    }
                };
                let order_rows = if one_order { 1 } else { n };
                m.matmul_as(&x, n, &mut y, order_rows, &mut ctx)
                    .expect("warm");
                let c0 = thread_cpu_ns();
                let mut ts: Vec<f64> = (0..trials)
                    .map(|_| {
                        let m = pick();
                        let t0 = Instant::now();
                        m.matmul_as(&x, n, &mut y, order_rows, &mut ctx)
                            .expect("matmul");
                        t0.elapsed().as_nanos() as f64
                    })
                    .collect();
                let cpu = (thread_cpu_ns() - c0) / trials as f64;
                ts.sort_by(f64::total_cmp);
                let (best, med) = (ts[0], ts[ts.len() / 2]);
                let gbs = m.weight_bytes() as f64 / best;
                let gflops = (2 * rows * k * n) as f64 / best;
                line += &format!(
                    " | n{n}: {:7.1}us {gbs:6.2} GB/s {gflops:6.1} GF/s (med/min {:.1}, cpu {:6.1} GF/s)",
                    best / 1e3,
                    med / best,
                    (2 * rows * k * n) as f64 / cpu
                );
            }
            println!("{line}");
        }
    }
}
