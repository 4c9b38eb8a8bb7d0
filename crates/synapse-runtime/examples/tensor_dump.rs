//! Writes every intermediate tensor of one prefill pass over a prompt given as token ids:
//! `tensor_dump MODEL OUT_DIR [--ubatch N] ID...` → `OUT_DIR/<stage>-<layer>.f32`
//! (little-endian f32, rows × width; `embd`, `result_norm`, `result_output` without a layer)
//! and `OUT_DIR/index.json` (`{file: [rows, width, llama.cpp name]}`). The counterpart of
//! `xtask/py/dump_llama_tensors.py`; `xtask/py/diff_tensors.py` compares the two. The prompt
//! runs as llama.cpp runs it: passes of `--ubatch` rows (default 512), each in its own
//! order class, logits for the last row only; a tensor of several passes is concatenated.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row, Stage, Tap, prompt_order};

type Store = Arc<Mutex<BTreeMap<String, (usize, usize, String, Vec<u8>)>>>;

struct Dump(Store);

impl Tap for Dump {
    fn tensor(&mut self, stage: Stage, layer: Option<usize>, rows: usize, data: &[f32]) {
        let (file, llama) = match layer {
            Some(l) => (
                format!("{}-{l}", stage.name()),
                format!("{}-{l}", stage.llama_name()),
            ),
            None => (stage.name().to_string(), stage.llama_name().to_string()),
        };
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let e = m
            .entry(file)
            .or_insert_with(|| (0, data.len() / rows.max(1), llama, Vec::new()));
        e.0 += rows;
        e.3.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    }
}

fn main() -> anyhow::Result<()> {
    let mut a: Vec<String> = std::env::args().skip(1).collect();
    let mut ubatch = 512usize;
    if let Some(i) = a.iter().position(|s| s == "--ubatch") {
        anyhow::ensure!(i + 1 < a.len(), "--ubatch needs a value");
        ubatch = a[i + 1].parse()?;
        a.drain(i..i + 2);
    }
    anyhow::ensure!(
        a.len() >= 3,
        "usage: tensor_dump MODEL OUT_DIR [--ubatch N] ID..."
    );
    let model = Arc::new(Model::load(std::path::Path::new(&a[0]))?);
    let out = PathBuf::from(&a[1]);
    std::fs::create_dir_all(&out)?;
    let ids: Vec<u32> = a[2..].iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let n = ids.len();
    let chunk = ubatch.min(n).max(1);
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, n.max(1), chunk)?;
    kv.open(0)?;
    let mut exec = Executor::new(model, 1)?;
    let store: Store = Arc::default();
    exec.set_tap(Some(Box::new(Dump(store.clone()))));
    for start in (0..n).step_by(chunk) {
        let rows: Vec<Row> = (start..(start + chunk).min(n))
            .map(|i| Row {
                slot: 0,
                pos: i as u32,
                token: ids[i],
                logits: i + 1 == n,
                order: prompt_order(i, n, ubatch),
            })
            .collect();
        exec.forward(&mut kv, &rows)?;
    }
    let m = store.lock().unwrap_or_else(|e| e.into_inner());
    let mut index = serde_json::Map::new();
    for (file, (rows, width, llama, bytes)) in m.iter() {
        std::fs::File::create(out.join(format!("{file}.f32")))?.write_all(bytes)?;
        index.insert(file.clone(), serde_json::json!([rows, width, llama]));
    }
    std::fs::write(out.join("index.json"), serde_json::to_vec_pretty(&index)?)?;
    println!("{} tensors in {}", m.len(), out.display());
    Ok(())
}
