//! Plans for 2–64 workers, on paper: a 7B-class model (32 layers of 4096 wide, Q4_K-sized
//! weights, 32k vocabulary) over workers of mixed speed and memory (three machine classes),
//! with measured-looking links. For each cluster size: which rule the leader takes
//! (replicas or a pipeline), the stages, predicted tokens/s, the planner's search (exact up
//! to 8 workers, the speed-order heuristic past that) and its time, and the bytes that cross
//! links per generated token.
//!
//! `cargo run --release -p synapse-cluster --example simulate`

use std::collections::BTreeMap;
use std::time::Instant;

use synapse_cluster::plan::{EngineShape, make_plan, memory_share_plan, stage_time};
use synapse_cluster::profile::{LinkMeasure, ModelSpec, WorkerProfile};

fn spec() -> ModelSpec {
    let layers = 32;
    // Per layer: q, k, v, o (4096×4096 each at 4.5 bits) and gate, up, down (4096×11008).
    let q4k = |rows: u64, cols: u64| rows * cols * 9 / 16;
    let layer = [
        ("q".to_string(), "q4_K".to_string(), q4k(4096, 4096)),
        ("k".to_string(), "q4_K".to_string(), q4k(4096, 4096)),
        ("v".to_string(), "q4_K".to_string(), q4k(4096, 4096)),
        ("o".to_string(), "q4_K".to_string(), q4k(4096, 4096)),
        ("gate".to_string(), "q4_K".to_string(), q4k(11008, 4096)),
        ("up".to_string(), "q4_K".to_string(), q4k(11008, 4096)),
        (
            "down".to_string(),
            "q6_K".to_string(),
            4096 * 11008 * 13 / 16,
        ),
    ];
    ModelSpec {
        fingerprint: "sim-7b".into(),
        hidden: 4096,
        vocab: 32000,
        layers: (0..layers)
            .map(|i| {
                layer
                    .iter()
                    .map(|(n, e, b)| (format!("blk.{i}.{n}"), e.clone(), *b))
                    .collect()
            })
            .collect(),
        // Grouped-query attention: 8 KV heads of 128.
        kv_per_token: vec![2 * 4 * 1024; layers],
        head: ("output".into(), "q6_K".into(), 32000 * 4096 * 13 / 16),
        embedding_bytes: 32000 * 4096 * 9 / 16,
    }
}

/// Three machine classes: (memory GiB, q4_K GB/s, q6_K GB/s, overhead ms). None holds the
/// model and its KV alone, so every plan is made of pipelines.
const CLASSES: [(u64, f64, f64, f64); 3] = [
    (6, 20.0, 16.0, 0.4),
    (4, 10.0, 8.0, 0.6),
    (2, 5.0, 4.0, 1.0),
];

fn workers(n: usize) -> Vec<WorkerProfile> {
    (0..n)
        .map(|i| {
            let (mem, a, b, o) = CLASSES[i % 3];
            let mut links = BTreeMap::new();
            for j in 0..n {
                if j != i {
                    // Same rack: 0.1 ms, 1 GB/s; every 8th machine further away.
                    let far = (i / 8) != (j / 8);
                    links.insert(
                        format!("w{j:02}"),
                        LinkMeasure {
                            latency_s: if far { 5e-4 } else { 1e-4 },
                            bandwidth_bytes_per_s: if far { 2e8 } else { 1e9 },
                        },
                    );
                }
            }
            WorkerProfile {
                id: format!("w{i:02}"),
                addr: format!("http://10.0.0.{i}:7000"),
                model: "sim-7b".into(),
                memory_bytes: mem << 30,
                threads: 8,
                stream_rate: [("q4_K".to_string(), a * 1e9), ("q6_K".to_string(), b * 1e9)].into(),
                dispatch_overhead_s: o * 1e-3,
                links,
                started_s: 0,
            }
        })
        .collect()
}

fn main() {
    let spec = spec();
    let shape = EngineShape {
        slots: 8,
        ctx: 2048,
        ubatch: 512,
        link: synapse_cluster::plan::LinkDtype::F32,
        in_flight: 1,
    };
    let total = spec.weight_bytes(0..spec.n_layers());
    println!(
        "model: {} layers, {:.2} GB of weights, KV {:.2} GB for {} slots × {} positions",
        spec.n_layers(),
        total as f64 / 1e9,
        (spec.kv_bytes(0..spec.n_layers()) * (shape.slots * shape.ctx) as u64) as f64 / 1e9,
        shape.slots,
        shape.ctx
    );
    println!(
        "| workers | search | plan time | pipelines | stages of the first (worker:layers) | first pipeline tok/s (1 stream) | Σ pipelines tok/s | memory-share, one pipeline over all, tok/s | link bytes / token (first) |"
    );
    println!("|---:|---|---:|---:|---|---:|---:|---:|---:|");
    for n in [2usize, 4, 8, 16, 32, 64] {
        let ws = workers(n);
        let t0 = Instant::now();
        let plan = match make_plan(&spec, &ws, shape) {
            Ok(p) => p,
            Err(e) => {
                println!("| {n} | — | — | — | {e} | — | — | — | — |");
                continue;
            }
        };
        let dt = t0.elapsed();
        let p = &plan.pipelines[0];
        let by_id: BTreeMap<&str, &WorkerProfile> = ws.iter().map(|w| (w.id.as_str(), w)).collect();
        let layers: Vec<String> = p
            .stages
            .iter()
            .map(|s| format!("{}:{}", &s.worker, s.layers.len()))
            .collect();
        // One row's hidden state per hop forward, its logits back along the hops.
        let hops = p.stages.len().saturating_sub(1) as u64;
        let link = hops * (spec.hidden as u64 * 4 + spec.vocab as u64 * 4);
        let ms = memory_share_plan(&spec, &ws, shape)
            .ok()
            .map(|m| {
                let t: f64 = m.pipelines[0]
                    .stages
                    .iter()
                    .map(|s| stage_time(&spec, by_id[s.worker.as_str()], s.layers.clone()))
                    .sum();
                format!("{:.1}", 1.0 / t)
            })
            .unwrap_or_else(|| "—".into());
        let total: f64 = plan.pipelines.iter().map(|x| x.tokens_per_s).sum();
        println!(
            "| {n} | {} | {:.1} ms | {} | {} | {:.1} | {total:.1} | {ms} | {link} |",
            if n <= synapse_planner::EXACT_MAX_DEVICES {
                "exact"
            } else {
                "heuristic"
            },
            dt.as_secs_f64() * 1e3,
            plan.pipelines.len(),
            layers.join(" "),
            p.tokens_per_s,
        );
    }
}
