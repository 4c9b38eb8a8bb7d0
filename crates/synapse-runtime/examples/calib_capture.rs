//! The cost of calibration capture: `calib_capture MODEL [TOKENS] [MAX_ROWS] [THREADS]` runs
//! TOKENS pseudo-text token ids through the model in 512-row passes, alternately without and
//! with a `CalibrationRecorder` (3 rounds each; every 8th row asks for logits, so the LM
//! head's input is sampled too), and prints the median pass times, the
//! overhead and what was kept.

use std::sync::Arc;
use std::time::Instant;

use synapse_runtime::calib::CalibrationRecorder;
use synapse_runtime::{Executor, KvCache, KvDtype, Model, OrderClass, Row};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let path = std::path::PathBuf::from(a.get(1).cloned().unwrap_or_default());
    let n: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let max_rows: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(512);
    let threads: usize = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(2);
    let model = Arc::new(Model::load(&path)?);
    let ids: Vec<u32> = std::iter::once(2)
        .chain((1..n as u32).map(|i| 1000 + (i * 7919) % 20000))
        .collect();
    let mut exec = Executor::new(model.clone(), threads)?;
    let pass = |exec: &mut Executor| -> anyhow::Result<f64> {
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, n + 1, 512)?;
        kv.open(0)?;
        let t = Instant::now();
        for (ci, part) in ids.chunks(512).enumerate() {
            let rows: Vec<Row> = part
                .iter()
                .enumerate()
                .map(|(i, &tok)| Row {
                    slot: 0,
                    pos: (ci * 512 + i) as u32,
                    token: tok,
                    // Every 8th row through the LM head (its input is a site too).
                    logits: i % 8 == 7,
                    order: OrderClass::of(part.len()),
                })
                .collect();
            exec.forward(&mut kv, &rows)?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let (mut plain, mut taped) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..3 {
        exec.set_tap(None);
        plain.push(pass(&mut exec)?);
        let rec = CalibrationRecorder::new(&model, max_rows, n as u64);
        exec.set_tap(Some(Box::new(rec.clone())));
        taped.push(pass(&mut exec)?);
        last = Some(rec);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, t) = (med(&mut plain), med(&mut taped));
    let rec = last.expect("three rounds");
    let sites = rec.sites();
    println!(
        "{n} tokens, {threads} threads: plain {:.3} s, with capture {:.3} s ({:+.1}%), {} sites, {:.1} MB kept, rows per site {}..{}",
        p,
        t,
        100.0 * (t / p - 1.0),
        sites.len(),
        rec.bytes() as f64 / 1e6,
        sites.iter().map(|(_, s)| s.rows()).min().unwrap_or(0),
        sites.iter().map(|(_, s)| s.rows()).max().unwrap_or(0),
    );
    Ok(())
}
