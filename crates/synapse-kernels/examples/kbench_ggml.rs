//! Synapse side of `cargo xtask bench-kernels-vs-ggml` (ggml's side is
//! `xtask/py/bench_ggml_matmul.py`); both read the same files and print the same JSON schema.
//!
//! `kbench_ggml gen TYPE ROWS K NMAX DIR` writes `DIR/w.bin` (random `TYPE` blocks with f16
//! scales in [0.005, 0.015), `ROWS × K`) and `DIR/x.bin` (`NMAX × K` f32 activations in [-1, 1)).
//!
//! `kbench_ggml run TYPE ROWS K DIR [--threads T] [--ns 1,4,8,128] [--check-ns 1,2,..] [--cold-mib M]
//! [--budget-ms B] [--min-calls A] [--max-calls Z]` builds enough distinct copies of the matrix
//! (`QuantMatrix::from_ggml` + clone) that together they exceed `M` MiB, so that cycling through
//! them makes every call stream its weights from DRAM rather than from cache (`--cold-mib 0`: one
//! copy, cache-resident), then for each `n` times single `matmul` calls (after 3 warm-up calls)
//! until `B` ms have passed and at least `A` calls ran (at most `Z`). It writes
//! `DIR/y_synapse_n{n}.bin` for every check `n` (copy 0) and prints one JSON line:
//! `{"engine", "weight_bytes", "copies", "results": [{"n", "ns": [per-call ns...], "busy_ticks",
//! "self_ticks"}]}`, where the tick counts are the system-wide busy and this process's CPU ticks
//! (`/proc/stat`, `/proc/self/stat`) over the timed loop, from which the driver computes how much
//! CPU other processes took meanwhile.

use anyhow::{Context, Result, anyhow, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use synapse_formats::{ALL_TYPES, GgmlType};
use synapse_kernels::{KernelCtx, KernelPath, QuantMatrix};

fn parse_type(s: &str) -> Result<GgmlType> {
    ALL_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| anyhow!("unknown ggml type {s}"))
}

/// Offsets of the f16 scale fields in one block of `ty` (those set to sane values).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q2_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => &[0],
        _ => &[],
    }
}

fn gen_weights(ty: GgmlType, rows: usize, k: usize, seed: u64) -> Result<Vec<u8>> {
    let (ts, bs) = (ty.type_size(), ty.block_size());
    if scale_offsets(ty).is_empty() {
        bail!(
            "kbench_ggml gen supports block types with f16 scales, not {}",
            ty.name()
        );
    }
    if !k.is_multiple_of(bs) {
        bail!(
            "K = {k} is not a multiple of {}'s block size {bs}",
            ty.name()
        );
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = vec![0u8; rows * k / bs * ts];
    rng.fill(&mut out[..]);
    for b in out.chunks_exact_mut(ts) {
        for &o in scale_offsets(ty) {
            let d = 0.005 + 0.01 * rng.random::<f32>();
            b[o..o + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        }
    }
    Ok(out)
}

fn write_f32(path: &Path, v: &[f32]) -> Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn read_f32(path: &Path) -> Result<Vec<f32>> {
    let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// System-wide busy ticks (user+nice+system+irq+softirq+steal), as `bench-vs-llama` counts them.
fn busy_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    if v.len() < 8 {
        return 0;
    }
    v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
}

/// This process's CPU ticks (utime + stime of `/proc/self/stat`).
fn self_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // after the command name: state(3) ... utime(14) stime(15) => indices 11 and 12
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

fn list(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| t.trim().parse().with_context(|| format!("bad number {t}")))
        .collect()
}

fn run(
    ty: GgmlType,
    rows: usize,
    k: usize,
    dir: &Path,
    opt: &HashMap<String, String>,
) -> Result<()> {
    let get = |key: &str, def: &str| opt.get(key).cloned().unwrap_or_else(|| def.to_string());
    let threads: usize = get("threads", "2").parse()?;
    let ns = list(&get("ns", "1,4,8,128"))?;
    let check_ns = list(&get("check-ns", ""))?;
    let cold_mib: usize = get("cold-mib", "1024").parse()?;
    let budget_ms: f64 = get("budget-ms", "200").parse()?;
    let min_calls: usize = get("min-calls", "5").parse()?;
    let max_calls: usize = get("max-calls", "2000").parse()?;

    let w = std::fs::read(dir.join("w.bin")).context("reading w.bin")?;
    let x = read_f32(&dir.join("x.bin"))?;
    let m0 = QuantMatrix::from_ggml(ty, &w, rows, k)?;
    drop(w);
    let wbytes = m0.weight_bytes();
    let copies = (cold_mib << 20).div_ceil(wbytes).clamp(1, 1 << 16);
    let mats: Vec<QuantMatrix> = (0..copies).map(|_| m0.clone()).collect();
    drop(m0);
    let path = KernelPath::best_supported();
    let mut ctx = KernelCtx::with_path_and_threads(path, threads)?;
    let nmax = ns.iter().chain(&check_ns).copied().max().unwrap_or(1);
    if x.len() < nmax * k {
        bail!("x.bin holds {} rows, {nmax} needed", x.len() / k);
    }
    for &n in &check_ns {
        let mut y = vec![0f32; n * rows];
        mats[0].matmul(&x[..n * k], n, &mut y, &mut ctx)?;
        write_f32(&dir.join(format!("y_synapse_n{n}.bin")), &y)?;
    }
    let mut results = Vec::new();
    let mut next = 0usize;
    for &n in &ns {
        let xs = &x[..n * k];
        let mut y = vec![0f32; n * rows];
        for _ in 0..3 {
            mats[next % copies].matmul(xs, n, &mut y, &mut ctx)?;
            next += 1;
        }
        let (b0, s0) = (busy_ticks(), self_ticks());
        let start = Instant::now();
        let mut times = Vec::new();
        while times.len() < max_calls
            && (times.len() < min_calls || start.elapsed().as_secs_f64() * 1e3 < budget_ms)
        {
            let m = &mats[next % copies];
            next += 1;
            let t0 = Instant::now();
            m.matmul(xs, n, &mut y, &mut ctx)?;
            times.push(t0.elapsed().as_nanos() as u64);
        }
        let (b1, s1) = (busy_ticks(), self_ticks());
        std::hint::black_box(&y);
        let ts: Vec<String> = times.iter().map(|t| t.to_string()).collect();
        results.push(format!(
            "{{\"n\":{n},\"ns\":[{}],\"busy_ticks\":{},\"self_ticks\":{},\"wall_s\":{}}}",
            ts.join(","),
            b1.saturating_sub(b0),
            s1.saturating_sub(s0),
            start.elapsed().as_secs_f64()
        ));
    }
    println!(
        "{{\"engine\":\"synapse\",\"path\":\"{}\",\"pool\":\"{:?}\",\"threads\":{},\"weight_bytes\":{wbytes},\"copies\":{copies},\"results\":[{}]}}",
        path.name(),
        ctx.pool_kind(),
        ctx.threads(),
        results.join(",")
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: kbench_ggml gen TYPE ROWS K NMAX DIR | run TYPE ROWS K DIR [--key value]...";
    let (mode, rest) = args.split_first().ok_or_else(|| anyhow!(usage))?;
    if rest.len() < 4 {
        bail!(usage);
    }
    let ty = parse_type(&rest[0])?;
    let rows: usize = rest[1].parse().context("ROWS")?;
    let k: usize = rest[2].parse().context("K")?;
    match mode.as_str() {
        "gen" => {
            let nmax: usize = rest[3].parse().context("NMAX")?;
            let dir = PathBuf::from(rest.get(4).ok_or_else(|| anyhow!(usage))?);
            std::fs::create_dir_all(&dir)?;
            let w = gen_weights(
                ty,
                rows,
                k,
                0x5EED ^ (ty.id() as u64) << 32 ^ (rows * k) as u64,
            )?;
            std::fs::write(dir.join("w.bin"), &w).context("writing w.bin")?;
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let x: Vec<f32> = (0..nmax * k)
                .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                .collect();
            write_f32(&dir.join("x.bin"), &x)
        }
        "run" => {
            let dir = PathBuf::from(&rest[3]);
            let mut opt = HashMap::new();
            let mut it = rest[4..].iter();
            while let Some(key) = it.next() {
                let key = key
                    .strip_prefix("--")
                    .ok_or_else(|| anyhow!("expected --key, got {key}"))?;
                let v = it.next().ok_or_else(|| anyhow!("--{key} needs a value"))?;
                opt.insert(key.to_string(), v.clone());
            }
            run(ty, rows, k, &dir, &opt)
        }
        _ => bail!(usage),
    }
}
