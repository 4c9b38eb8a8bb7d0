//! Ablation on the tiny fixtures: every group demoted alone, its KL from the source measured,
//! the prediction taken from the map, and the rank correlation computed from the rows.

mod common;

use synapse_codecs::EncodingId;
use synapse_runtime::ablation::{ablate, layer_groups};
use synapse_runtime::perplexity::PerplexityParams;

#[test]
fn each_group_is_measured_against_its_prediction() {
    let Some((m, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let map = common::tiny_importance_map(&m, &toks);
    let groups = layer_groups(&m);
    let n_layers = m.ir.layers.len();
    assert_eq!(groups.len(), 2 * n_layers + 1, "{groups:?}");
    let all: usize = groups.iter().map(|g| g.tensors.len()).sum();
    assert_eq!(all, synapse_runtime::importance::linears(&m).len());
    let p = PerplexityParams {
        ctx: 16,
        batch: 16,
        max_chunks: Some(2),
        bos: None,
    };
    let run = |enc: &str| {
        let id = EncodingId::parse(enc).unwrap();
        ablate(&m, &map, id, &groups, &toks, &p, 2, |_, _, _| {}).unwrap()
    };
    let q3 = run("syn.q3.symmetric.g64.v1");
    let q8 = run("syn.q8.symmetric.g64.v1");
    assert_eq!(q3.rows.len(), groups.len());
    // llama.cpp scores positions ctx/2 .. ctx − 1 of each chunk.
    assert_eq!(q3.tokens, 2 * (16 - 8 - 1));
    for (a, b) in q3.rows.iter().zip(&q8.rows) {
        assert_eq!(a.group, b.group);
        assert!(a.kl.is_finite() && a.kl > 0.0, "{a:?}");
        assert!(b.kl.is_finite() && b.kl >= 0.0, "{b:?}");
        // Three bits hurt more than eight, in prediction and in measurement.
        assert!(a.predicted > b.predicted, "{a:?} vs {b:?}");
        assert!(a.kl > b.kl, "{a:?} vs {b:?}");
        assert!(a.saved_bytes > b.saved_bytes);
        // The prediction is the map's own numbers.
        let g = groups.iter().find(|g| g.name == a.group).unwrap();
        let sum: f64 = g
            .tensors
            .iter()
            .map(|t| {
                map.tensors[t]
                    .options
                    .iter()
                    .find(|o| o.encoding == "syn.q3.symmetric.g64.v1")
                    .unwrap()
                    .distortion
            })
            .sum();
        assert_eq!(a.predicted, sum);
    }
    let (x, y): (Vec<f64>, Vec<f64>) = q3.rows.iter().map(|r| (r.predicted, r.kl)).unzip();
    assert_eq!(q3.spearman, synapse_sensitivity::rank::spearman(&x, &y));
    assert!(q3.spearman.is_some());
    // A map of another model is refused before anything runs.
    if let Some((q, qt)) = common::tiny_q8_model("qwen2") {
        let other = common::tiny_importance_map(&q, &qt);
        let id = EncodingId::parse("syn.q4.symmetric.g64.v1").unwrap();
        assert!(ablate(&m, &other, id, &groups, &toks, &p, 2, |_, _, _| {}).is_err());
    }
}

/// KL weights from an ablation on calibration tokens: positive, one per tensor, equal within a
/// group, and with them the map predicts exactly the KL each group's demotion measured there.
#[test]
fn kl_weights_make_the_map_predict_the_measured_kl() {
    let Some((m, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let mut map = common::tiny_importance_map(&m, &toks);
    let groups = layer_groups(&m);
    let p = PerplexityParams {
        ctx: 16,
        batch: 16,
        max_chunks: Some(2),
        bos: None,
    };
    let enc = EncodingId::parse("syn.q4.symmetric.g64.v1").unwrap();
    let mut rows = Vec::new();
    let w =
        synapse_runtime::ablation::kl_weights(&m, &map, enc, &groups, &toks, &p, 2, |_, _, r| {
            rows.push(r.clone())
        })
        .unwrap();
    assert_eq!(w.len(), synapse_runtime::importance::linears(&m).len());
    map.set_kl_weights(&w, "tiny").unwrap();
    for (g, row) in groups.iter().zip(&rows) {
        let ws: Vec<f64> = g.tensors.iter().map(|t| w[t]).collect();
        assert!(ws.iter().all(|&x| x > 0.0 && x == ws[0]), "{g:?} {ws:?}");
        let predicted: f64 = g
            .tensors
            .iter()
            .map(|t| {
                let ti = &map.tensors[t];
                ti.kl_weight
                    * ti.options
                        .iter()
                        .find(|o| o.encoding == enc.to_string())
                        .unwrap()
                        .distortion
            })
            .sum();
        if row.kl > 0.0 {
            assert!(
                (predicted - row.kl).abs() <= 1e-12 * row.kl.max(1.0),
                "{g:?}: {predicted} vs {}",
                row.kl
            );
        }
    }
}
