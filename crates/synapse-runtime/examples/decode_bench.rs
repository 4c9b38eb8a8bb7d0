//! Times prefill and greedy decode on token ids (no tokenizer): `decode_bench MODEL [PROMPT_LEN]
//! [N_DECODE] [THREADS]`. Prints wall-clock rates and the process CPU time per token, which
//! stays meaningful on a shared machine. The weights are read into memory as `generate` reads
//! them (`Model::load_resident`); `SYNAPSE_MMAP=1` borrows them from the file's mapping.

use std::sync::Arc;
use std::time::Instant;

use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row, argmax};

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 Hz on Linux).
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let path = std::path::PathBuf::from(a.get(1).cloned().unwrap_or_default());
    let plen: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(512);
    let ndec: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let threads: usize = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(2);
    let t0 = Instant::now();
    let model = Arc::new(if std::env::var("SYNAPSE_MMAP").is_ok_and(|v| v == "1") {
        Model::load(&path)?
    } else {
        Model::load_resident(&path)?
    });
    let load_s = t0.elapsed().as_secs_f64();
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, plen + ndec + 1, 512)?;
    kv.open(0)?;
    let mut exec = Executor::new(model.clone(), threads)?;
    // Deterministic pseudo-text ids.
    let prompt: Vec<u32> = std::iter::once(2)
        .chain((1..plen as u32).map(|i| 1000 + (i * 7919) % 20000))
        .collect();
    let (c0, w0) = (cpu_seconds(), Instant::now());
    let mut pos = 0u32;
    let mut next = 0u32;
    for (ci, part) in prompt.chunks(512).enumerate() {
        let last = (ci + 1) * 512 >= prompt.len();
        let rows: Vec<Row> = part
            .iter()
            .enumerate()
            .map(|(i, &t)| Row {
                slot: 0,
                pos: pos + i as u32,
                token: t,
                logits: last && i + 1 == part.len(),
                order: synapse_runtime::OrderClass::of(part.len()),
            })
            .collect();
        pos += part.len() as u32;
        let out = exec.forward(&mut kv, &rows)?;
        if last {
            next = argmax(out);
        }
    }
    let (pc, pw) = (cpu_seconds() - c0, w0.elapsed().as_secs_f64());
    let (c1, w1) = (cpu_seconds(), Instant::now());
    let mut steps = Vec::with_capacity(ndec);
    for _ in 0..ndec {
        let ts = Instant::now();
        let out = exec.forward(&mut kv, &[Row::decode(0, pos, next)])?;
        next = argmax(out);
        steps.push(ts.elapsed().as_secs_f64());
        pos += 1;
    }
    // Per-token latencies: the median and the 10th percentile stay meaningful when another
    // process takes the CPU for part of the run.
    steps.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        steps
            .get(((steps.len() as f64 * p) as usize).min(steps.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let (med, p10) = (pct(0.5), pct(0.1));
    let (dc, dw) = (cpu_seconds() - c1, w1.elapsed().as_secs_f64());
    println!(
        "{{\"load_s\": {load_s:.3}, \"prefill_tokens\": {plen}, \"prefill_tok_s\": {:.2}, \"prefill_cpu_s_per_tok\": {:.5}, \"decode_tokens\": {ndec}, \"decode_tok_s\": {:.2}, \"decode_cpu_s_per_tok\": {:.5}, \"decode_tok_s_median_step\": {:.2}, \"decode_tok_s_p10_step\": {:.2}, \"threads\": {threads}, \"kernels\": \"{}\"}}",
        plen as f64 / pw,
        pc / plen as f64,
        ndec as f64 / dw,
        dc / ndec as f64,
        1.0 / med,
        1.0 / p10,
        exec.kernel_path().name()
    );
    Ok(())
}
