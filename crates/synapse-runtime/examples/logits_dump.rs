//! Writes the last-position logits of a prompt given as token ids (little-endian f32):
//! `logits_dump MODEL OUT.f32 ID...`. A diagnosis aid for parity work.

use std::sync::Arc;

use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(a.len() >= 4, "usage: logits_dump MODEL OUT.f32 ID...");
    let model = Arc::new(Model::load(std::path::Path::new(&a[1]))?);
    let ids: Vec<u32> = a[3..].iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, ids.len().max(1), ids.len().max(1))?;
    kv.open(0)?;
    let mut exec = Executor::new(model, 1)?;
    let rows: Vec<Row> = ids
        .iter()
        .enumerate()
        .map(|(i, &t)| Row {
            slot: 0,
            pos: i as u32,
            token: t,
            logits: i + 1 == ids.len(),
            order: synapse_runtime::OrderClass::of(ids.len()),
        })
        .collect();
    let out = exec.forward(&mut kv, &rows)?;
    let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&a[2], bytes)?;
    Ok(())
}
