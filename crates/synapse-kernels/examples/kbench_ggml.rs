//! Synapse side of `cargo xtask bench-kernels-vs-ggml` (ggml's side is
//! `xtask/py/bench_ggml_matmul.py`); both read the same files and print the same JSON schema.
//!
//! `kbench_ggml gen TYPE ROWS K NMAX DIR` writes `DIR/w.bin` (random `TYPE` blocks with f16
//! scales in [0.005, 0.015), `ROWS × K`) and `DIR/x.bin` (`NMAX × K` f32 activations in [-1, 1)).
//! `TYPE` may also be a Synapse codec id (`syn.q4.symmetric.g64.v1`): then `w.bin` is random
//! weights in [-0.05, 0.05) encoded by that codec, and `run` times the matrix a precision
//! profile runs (`QuantMatrix::from_codec`); ggml has no such encoding, so only Synapse runs it.
//! `TYPE` `w158a8`: random ternary weights in `syn.ternary.absmean.tensor.v1`, timed as BitNet's
//! W1.58A8 matrix (`QuantMatrix::from_ternary_a8`), Synapse only too.
//!
//! `kbench_ggml run TYPE ROWS K DIR [--threads T] [--ns 1,4,8,128] [--check-ns 1,2,..] [--cold-mib M]
//! [--budget-ms B] [--min-calls A] [--max-calls Z] [--stream-ns 1]` builds enough distinct copies of the matrix
//! (`QuantMatrix::from_ggml` + clone) that together they exceed `M` MiB, so that cycling through
//! them makes every call stream its weights from DRAM rather than from cache (`--cold-mib 0`: one
//! copy, cache-resident), then for each `n` times single `matmul` calls (after 3 warm-up calls)
//! until `B` ms have passed and at least `A` calls ran (at most `Z`); for the `n` in
//! `--stream-ns`, each call is followed by a timed plain streaming read of another copy's
//! weight bytes through the same pool (`stream_ns`: the paired bandwidth reference). It writes
//! `DIR/y_synapse_n{n}.bin` for every check `n` (copy 0) and prints one JSON line:
//! `{"engine", "weight_bytes", "copies", "results": [{"n", "ns": [per-call ns...], "busy_ticks",
//! "self_ticks"}]}`, where the tick counts are the system-wide busy and this process's CPU ticks
//! (`/proc/stat`, `/proc/self/stat`) over the timed loop, from which the driver computes how much
//! CPU other processes took meanwhile.

#[path = "common/read.rs"]
mod read;

use anyhow::{Context, Result, anyhow, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use read::read_all;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use synapse_formats::{ALL_TYPES, GgmlType};
use synapse_kernels::{KernelCtx, KernelPath, QuantMatrix};

/// A weight type: a ggml type, or a Synapse codec (by id).
#[derive(Clone, Copy)]
enum WType {
    Ggml(GgmlType),
    Codec(synapse_codecs::EncodingId),
    /// BitNet's W1.58A8: a ternary tensor run with 8-bit activations.
    TernaryA8,
}

impl WType {
    fn parse(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("w158a8") {
            return Ok(WType::TernaryA8);
        }
        if s.starts_with("syn.") {
            return Ok(WType::Codec(synapse_codecs::EncodingId::parse(s)?));
        }
        Ok(WType::Ggml(parse_type(s)?))
    }

    fn seed(&self) -> u64 {
        match self {
            WType::Ggml(t) => t.id() as u64,
            WType::TernaryA8 => 0x158a8,
            WType::Codec(id) => id
                .to_string()
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31) ^ b as u64),
        }
    }

    fn generate(&self, rows: usize, k: usize, seed: u64) -> Result<Vec<u8>> {
        match *self {
            WType::Ggml(t) => gen_weights(t, rows, k, seed),
            WType::Codec(id) => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let w: Vec<f32> = (0..rows * k)
                    .map(|_| rng.random::<f32>() * 0.1 - 0.05)
                    .collect();
                Ok(synapse_codecs::codec_for(id).encode_matrix(&w, rows, k)?)
            }
            WType::TernaryA8 => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let w: Vec<f32> = (0..rows * k)
                    .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                    .collect();
                Ok(synapse_codecs::TernaryTensor::encode_bitnet_weight_quant(
                    &w,
                )?)
            }
        }
    }

    fn matrix(&self, w: &[u8], rows: usize, k: usize) -> Result<QuantMatrix> {
        Ok(match self {
            WType::Ggml(t) => QuantMatrix::from_ggml(*t, w, rows, k)?,
            WType::Codec(id) => QuantMatrix::from_codec(&id.to_string(), w, rows, k)?,
            WType::TernaryA8 => QuantMatrix::from_ternary_a8(w, rows, k)?,
        })
    }
}

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
        // Random code bytes: TQ2_0's unused code 3 and TQ1_0's bytes past 242 cost the same to run.
        GgmlType::TQ2_0 => &[64],
        GgmlType::TQ1_0 => &[52],
        GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => &[0],
        // IQ4_XS: `d` first; its random 6-bit sub-block scales (±32) are fine to run.
        GgmlType::IQ4_XS => &[0],
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

fn run(ty: WType, rows: usize, k: usize, dir: &Path, opt: &HashMap<String, String>) -> Result<()> {
    let get = |key: &str, def: &str| opt.get(key).cloned().unwrap_or_else(|| def.to_string());
    let threads: usize = get("threads", "2").parse()?;
    let ns = list(&get("ns", "1,4,8,128"))?;
    let check_ns = list(&get("check-ns", ""))?;
    let cold_mib: usize = get("cold-mib", "1024").parse()?;
    let budget_ms: f64 = get("budget-ms", "200").parse()?;
    let min_calls: usize = get("min-calls", "5").parse()?;
    let max_calls: usize = get("max-calls", "2000").parse()?;
    let stream_ns = list(&get("stream-ns", ""))?;

    let w = std::fs::read(dir.join("w.bin")).context("reading w.bin")?;
    let x = read_f32(&dir.join("x.bin"))?;
    let m0 = ty.matrix(&w, rows, k)?;
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
        let mut stream_times: Vec<u64> = Vec::new();
        while times.len() < max_calls
            && (times.len() < min_calls || start.elapsed().as_secs_f64() * 1e3 < budget_ms)
        {
            let m = &mats[next % copies];
            let t0 = Instant::now();
            m.matmul(xs, n, &mut y, &mut ctx)?;
            times.push(t0.elapsed().as_nanos() as u64);
            if stream_ns.contains(&n) {
                // The paired reference: a plain streaming read of as many bytes, through the
                // same pool, from the copy furthest from the ones just used (as cold).
                let s = &mats[(next + copies / 2) % copies];
                let t0 = Instant::now();
                let sum = stream(s, &mut ctx);
                stream_times.push(t0.elapsed().as_nanos() as u64);
                std::hint::black_box(sum);
            }
            next += 1;
        }
        let (b1, s1) = (busy_ticks(), self_ticks());
        std::hint::black_box(&y);
        let ts: Vec<String> = times.iter().map(|t| t.to_string()).collect();
        let ss: Vec<String> = stream_times.iter().map(|t| t.to_string()).collect();
        results.push(format!(
            "{{\"n\":{n},\"ns\":[{}],\"stream_ns\":[{}],\"busy_ticks\":{},\"self_ticks\":{},\"wall_s\":{}}}",
            ts.join(","),
            ss.join(","),
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

/// Reads every weight byte of `m` once, split over `ctx`'s pool by rows like a GEMV (each chunk
/// of rows is one contiguous range): 512-bit loads into 4 independent XOR chains, software
/// prefetch 1.5 KB ahead as the GEMVs do — no arithmetic to speak of, so the rate a
/// bandwidth-bound GEMV of this size and access pattern can at best reach here.
fn stream(m: &QuantMatrix, ctx: &mut KernelCtx) -> u64 {
    let total = std::sync::atomic::AtomicU64::new(0);
    ctx.parallel_for(m.rows(), 2 * m.rows() * m.cols(), &|r0, r1| {
        let (Some(first), Some(last)) = (m.row_bytes(r0), m.row_bytes(r1 - 1)) else {
            return;
        };
        // SAFETY: rows r0..r1 of one matrix are one contiguous allocation.
        let bytes = unsafe {
            let len = last.as_ptr().offset_from(first.as_ptr()) as usize + last.len();
            std::slice::from_raw_parts(first.as_ptr(), len)
        };
        total.fetch_add(read_all(bytes), std::sync::atomic::Ordering::Relaxed);
    });
    total.into_inner()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: kbench_ggml gen TYPE ROWS K NMAX DIR | run TYPE ROWS K DIR [--key value]...";
    let (mode, rest) = args.split_first().ok_or_else(|| anyhow!(usage))?;
    if rest.len() < 4 {
        bail!(usage);
    }
    let ty = WType::parse(&rest[0])?;
    let rows: usize = rest[1].parse().context("ROWS")?;
    let k: usize = rest[2].parse().context("K")?;
    match mode.as_str() {
        "gen" => {
            let nmax: usize = rest[3].parse().context("NMAX")?;
            let dir = PathBuf::from(rest.get(4).ok_or_else(|| anyhow!(usage))?);
            std::fs::create_dir_all(&dir)?;
            let w = ty.generate(rows, k, 0x5EED ^ ty.seed() << 32 ^ (rows * k) as u64)?;
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
