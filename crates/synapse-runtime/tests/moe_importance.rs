//! Routed experts in the importance map and in budgeted profiles, on the tiny MoE fixtures of
//! every family, stacked (GGUF `ffn_*_exps`) and per expert (safetensors): the executor hands
//! each expert's own rows to the calibration tap (every routed row counted once per pick), the
//! map measures every expert tensor on them (bytes exactly what the executor's re-encoding
//! takes; an expert the text never routes to measured on the layer's whole input), and a
//! budget that the linears alone could not meet demotes experts, fits, and runs batch-invariant.

mod common;

use std::sync::Arc;

use synapse_runtime::calib::CalibrationRecorder;
use synapse_runtime::importance::expert_tensors;
use synapse_runtime::precision::{Budget, Precision, apply, assignable};
use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row, Stage, prompt_order};
use synapse_sensitivity::ImportanceMap;

const FAMILIES: [&str; 4] = synapse_testdata::TINY_MOE_FAMILIES;
const Q4: &str = "syn.q4.symmetric.g64.v1";

/// The family's model from `file` (a GGUF, or `model.safetensors` with its config) and its
/// token sequences, concatenated.
fn tiny(family: &str, file: &str) -> Option<(Arc<Model>, Vec<u32>)> {
    let dir = common::workspace_root().join("fixtures/tiny").join(family);
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return None;
    }
    let path = if file.ends_with(".safetensors") {
        dir.clone()
    } else {
        dir.join(file)
    };
    let m = Arc::new(Model::load(&path).unwrap());
    Some((m, common::tiny_sequences(&dir).concat()))
}

/// The MoE layers' (layer, n_expert, n_used).
fn moe_layers(m: &Model) -> Vec<(usize, usize, usize)> {
    m.ir.layers
        .iter()
        .enumerate()
        .filter_map(|(l, r)| match &r.ffn {
            synapse_model::FfnRegion::Moe(x) => Some((l, x.experts.len(), x.n_used as usize)),
            _ => None,
        })
        .collect()
}

/// `toks` as one prefill of one session (one pass of every row, logits for the last).
fn prefill_rows(toks: &[u32]) -> Vec<Row> {
    toks.iter()
        .enumerate()
        .map(|(i, &t)| Row {
            slot: 0,
            pos: i as u32,
            token: t,
            logits: i + 1 == toks.len(),
            order: prompt_order(i, toks.len(), toks.len()),
        })
        .collect()
}

#[test]
fn the_executor_hands_each_expert_its_own_rows() {
    for family in FAMILIES {
        let Some((m, toks)) = tiny(family, "model.f32.gguf") else {
            return;
        };
        let toks = &toks[..toks.len().min(40)];
        let rec = CalibrationRecorder::new(&m, 1 << 20, toks.len() as u64);
        let mut exec = Executor::new(m.clone(), 2).unwrap();
        let mut kv = KvCache::new(&m, KvDtype::F32, 1, 64, 64).unwrap();
        kv.open(0).unwrap();
        let plain = exec.forward(&mut kv, &prefill_rows(toks)).unwrap().to_vec();
        exec.set_tap(Some(Box::new(rec.clone())));
        exec.expert_stats_mut().reset();
        kv.open(0).unwrap();
        let tapped = exec.forward(&mut kv, &prefill_rows(toks)).unwrap().to_vec();
        assert_eq!(plain, tapped, "{family}: the tap changed the logits");
        let stats = exec.expert_stats().clone();
        let sites = rec.sites();
        let layers = moe_layers(&m);
        assert!(!layers.is_empty(), "{family}");
        for (k, &(l, ne, used)) in layers.iter().enumerate() {
            let of = |stage: Stage, e: usize| {
                sites
                    .iter()
                    .find(|(s, _)| {
                        s.layer == Some(l) && s.stage == stage && s.expert == Some(e as u32)
                    })
                    .map(|(_, x)| x)
                    .unwrap_or_else(|| panic!("{family}: no site for layer {l} expert {e}"))
            };
            let mut routed = 0;
            for e in 0..ne {
                let (x, h) = (of(Stage::FfnNorm, e), of(Stage::FfnAct, e));
                // Every row the router sent here, each once, kept whole (the bound is large).
                assert_eq!(x.seen, stats.rows[k][e], "{family} layer {l} expert {e}");
                assert_eq!(h.seen, x.seen);
                assert_eq!(x.rows() as u64, x.seen);
                assert_eq!(h.rows(), x.rows());
                routed += x.seen;
            }
            assert_eq!(routed, (toks.len() * used) as u64, "{family} layer {l}");
        }
    }
}

#[test]
fn the_map_measures_every_routed_expert_tensor() {
    for family in FAMILIES {
        for file in ["model.q8_0.gguf", "model.safetensors"] {
            let Some((m, toks)) = tiny(family, file) else {
                return;
            };
            let map = common::tiny_importance_map(&m, &toks);
            let names = expert_tensors(&m);
            let bytes = assignable(&m);
            assert!(!names.is_empty());
            // Re-encoded by the executor, each expert tensor takes the bytes the map says.
            let q4 = apply(
                &m,
                &Precision::parse_profile(&format!("uniform:{Q4}")).unwrap(),
                None,
            )
            .unwrap()
            .model;
            let q4_bytes = assignable(&q4);
            for n in &names {
                let t = map
                    .tensors
                    .get(n)
                    .unwrap_or_else(|| panic!("{family} {file}: {n} not measured"));
                assert_eq!(t.source_bytes, bytes[n], "{family} {file} {n}");
                let sym: Vec<_> = t
                    .options
                    .iter()
                    .filter(|o| o.encoding.contains(".symmetric."))
                    .collect();
                assert!(sym.len() >= 4, "{family} {file} {n}: {:?}", t.options);
                for w in sym.windows(2) {
                    assert!(w[0].bytes > w[1].bytes);
                    assert!(
                        w[0].distortion < w[1].distortion,
                        "{family} {file} {n}: {:?}",
                        t.options
                    );
                }
                for o in &t.options {
                    assert!(
                        o.distortion > 0.0 && o.distortion < 1e3,
                        "{family} {n} {o:?}"
                    );
                }
                let o = t.options.iter().find(|o| o.encoding == Q4).unwrap();
                assert_eq!(o.bytes, q4_bytes[n], "{family} {file} {n}");
            }
        }
    }
}

#[test]
fn an_expert_the_text_never_routes_to_is_still_measured() {
    // Two tokens: each layer routes them to at most 2·n_used experts, and the others see no
    // row; they are measured on the layer's whole input instead of counting as free.
    let Some((m, toks)) = tiny("olmoe", "model.safetensors") else {
        return;
    };
    let toks = &toks[..2];
    let map = common::tiny_importance_map(&m, toks);
    // The routing of those two tokens (one pass, as the map's capture ran them).
    let mut exec = Executor::new(m.clone(), 2).unwrap();
    let mut kv = KvCache::new(&m, KvDtype::F32, 1, 64, 256).unwrap();
    kv.open(0).unwrap();
    exec.forward(&mut kv, &prefill_rows(toks)).unwrap();
    let stats = exec.expert_stats().clone();
    let mut unrouted = 0;
    for (k, &(l, ne, _)) in moe_layers(&m).iter().enumerate() {
        for e in 0..ne {
            if stats.rows[k][e] > 0 {
                continue;
            }
            unrouted += 1;
            let r = &m.ir.layers[l].ffn;
            let synapse_model::FfnRegion::Moe(x) = r else {
                unreachable!()
            };
            let ex = &x.experts[e];
            for el in [&ex.gate, &ex.up, &ex.down] {
                let n = &m.ir.weight(el.weight).name;
                let t = &map.tensors[n];
                for o in &t.options {
                    assert!(
                        o.distortion > 1e-9 && o.distortion < 1e3,
                        "unrouted {n}: {o:?}"
                    );
                }
            }
        }
    }
    assert!(
        unrouted > 0,
        "every expert was routed: the test needs fewer tokens"
    );
}

/// `map` without its routed experts' entries (a map measured before experts were).
fn without_experts(m: &Model, map: &ImportanceMap) -> ImportanceMap {
    let mut old = map.clone();
    for n in expert_tensors(m) {
        old.tensors.remove(&n);
    }
    old
}

#[test]
fn a_budget_demotes_routed_experts_where_the_linears_alone_cannot_meet_it() {
    let Some((m, toks)) = tiny("olmoe", "model.f32.gguf") else {
        return;
    };
    let map = common::tiny_importance_map(&m, &toks);
    let all = m.weight_bytes() as u64;
    let experts = m.expert_bytes() as u64;
    // The weights no map covers (the token embedding of an untied head) and the routed
    // experts at their source: with the linears at no bytes at all it would not fit, so only
    // demoted experts can meet it.
    let want = m.embd.weight_bytes() as u64 + experts;
    let budget = Precision::Budget {
        budget: Budget::Bytes(want),
        map: Box::new(map.clone()),
    };
    let a = apply(&m, &budget, None).unwrap();
    assert!(
        a.model.weight_bytes() as u64 <= want,
        "{} > {want}",
        a.model.weight_bytes()
    );
    let profile = a.profile.clone().unwrap();
    let names = expert_tensors(&m);
    let demoted: Vec<&String> = names
        .iter()
        .filter(|n| a.model.profile.encoding(n) != m.profile.encoding(n))
        .collect();
    for n in &demoted {
        assert_eq!(
            a.model.profile.encoding(n),
            Some(profile.assignments[*n].encoding.as_str())
        );
    }
    assert!(!demoted.is_empty(), "{:?}", profile.assignments);
    assert!(a.model.expert_bytes() < m.expert_bytes());
    // The same budget from a map without the experts: they stay at the source, it cannot fit.
    let old = without_experts(&m, &map);
    let e = apply(
        &m,
        &Precision::Budget {
            budget: Budget::Bytes(want),
            map: Box::new(old.clone()),
        },
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("budget") || e.contains("minimum"), "{e}");
    // ... while a budget above the experts' source bytes runs it, experts untouched.
    let b = apply(
        &m,
        &Precision::Budget {
            budget: Budget::Bytes(all * 95 / 100),
            map: Box::new(old),
        },
        None,
    )
    .unwrap();
    assert_eq!(b.model.expert_bytes(), m.expert_bytes());
    assert!(
        names
            .iter()
            .all(|n| !b.profile.as_ref().unwrap().assignments.contains_key(n))
    );
    // A map with some expert tensors but not all is refused.
    let mut partial = map.clone();
    partial.tensors.remove(&names[0]);
    let e = apply(
        &m,
        &Precision::Budget {
            budget: Budget::Bytes(want),
            map: Box::new(partial),
        },
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("expert tensor"), "{e}");

    // The budgeted model: each session's logits bit-identical alone and beside the others.
    let model = a.model.clone();
    let dir = common::workspace_root().join("fixtures/tiny/olmoe");
    let prompts = common::tiny_sequences(&dir);
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 256).unwrap();
            kv.open(0).unwrap();
            let mut x = Executor::new(model.clone(), 2).unwrap();
            x.forward(&mut kv, &prefill_rows(p)).unwrap().to_vec()
        })
        .collect();
    let mut kv = KvCache::new(&model, KvDtype::F32, prompts.len(), 64, 256).unwrap();
    let mut rows = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        kv.open(s as u32).unwrap();
        rows.extend(prefill_rows(p).into_iter().map(|r| Row {
            slot: s as u32,
            ..r
        }));
    }
    let mut x = Executor::new(model.clone(), 2).unwrap();
    let together = x.forward(&mut kv, &rows).unwrap().to_vec();
    let v = m.vocab();
    for (s, a) in alone.iter().enumerate() {
        assert_eq!(a[..], together[s * v..(s + 1) * v], "session {s}");
    }
}
