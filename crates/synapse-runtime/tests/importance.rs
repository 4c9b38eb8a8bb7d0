//! Importance maps of the tiny fixtures built end to end (capture in the executor → decode →
//! every codec of the ladder → activation-aware distortion): every linear measured, sizes
//! below the source, distortion falling as bits rise, provenance that refuses another model,
//! and the same map from the same text.

mod common;

use synapse_runtime::importance::linears;
use synapse_sensitivity::ImportanceMap;

use common::{tiny_importance_map as build, tiny_q8_model as tiny};

#[test]
fn every_linear_is_measured_under_the_ladder() {
    for family in ["llama", "qwen2", "gemma3"] {
        let Some((m, toks)) = tiny(family) else {
            return;
        };
        let map = build(&m, &toks);
        let names: Vec<String> = linears(&m).into_iter().map(|(n, _)| n).collect();
        assert_eq!(map.tensors.len(), names.len(), "{family}");
        for n in &names {
            let t = &map.tensors[n];
            assert_eq!(t.source_encoding, "q8_0", "{family} {n}");
            assert!(
                !t.options.is_empty(),
                "{family} {n}: no option below the source"
            );
            for o in &t.options {
                assert!(o.bytes < t.source_bytes, "{family} {n} {}", o.encoding);
                assert!(o.distortion.is_finite() && o.distortion >= 0.0);
            }
            // The symmetric ladder: fewer bits, more distortion.
            let sym: Vec<&synapse_sensitivity::EncodingOption> = t
                .options
                .iter()
                .filter(|o| o.encoding.contains(".symmetric."))
                .collect();
            assert!(sym.len() >= 4, "{family} {n}: {:?}", t.options);
            for w in sym.windows(2) {
                assert!(w[0].bytes > w[1].bytes);
                assert!(
                    w[0].distortion < w[1].distortion,
                    "{family} {n}: {} {} vs {} {}",
                    w[0].encoding,
                    w[0].distortion,
                    w[1].encoding,
                    w[1].distortion
                );
            }
        }
        assert_eq!(map.provenance.model_fingerprint, m.ir.fingerprint);
        map.check_applies_to(&m.ir.fingerprint).unwrap();
        assert!(map.check_applies_to("another model").is_err());
        // Serialized and back, the same map.
        let back = ImportanceMap::from_json(&map.to_json().unwrap()).unwrap();
        assert_eq!(back, map);
    }
}

#[test]
fn the_same_text_gives_the_same_map() {
    let Some((m, toks)) = tiny("llama") else {
        return;
    };
    let (a, b) = (build(&m, &toks), build(&m, &toks));
    assert_eq!(a, b);
    let c = build(&m, &toks[..toks.len() / 2]);
    assert_ne!(
        a.provenance.calibration_hash, c.provenance.calibration_hash,
        "another text, another calibration hash"
    );
}

/// A head tied to the token embedding pays for both uses: each option's distortion is the
/// head's output distortion plus the lookup's relative error under the calibration tokens'
/// frequencies (computed here independently); an untied head only the former.
#[test]
fn a_tied_table_carries_the_lookup_distortion_too() {
    let (Some((g, gt)), Some((l, lt))) = (tiny("gemma3"), tiny("llama")) else {
        return;
    };
    assert!(
        std::sync::Arc::ptr_eq(&g.embd, &g.head.m),
        "tiny gemma3 ties its head"
    );
    assert!(
        !std::sync::Arc::ptr_eq(&l.embd, &l.head.m),
        "tiny llama does not"
    );
    let map = build(&g, &gt);
    let head = g.ir.weight(g.ir.lm_head.linear.weight).name.clone();
    let (rows, cols) = (g.head.m.rows(), g.head.m.cols());
    let mut w = vec![0f32; rows * cols];
    for (r, out) in w.chunks_exact_mut(cols).enumerate() {
        g.head.m.dequantize_row(r, out).unwrap();
    }
    let (mut num_by, mut den) = (std::collections::BTreeMap::new(), 0f64);
    for &t in &gt {
        let row = &w[t as usize * cols..(t as usize + 1) * cols];
        den += row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>();
        for o in &map.tensors[&head].options {
            let c = synapse_codecs::resolve(&o.encoding).unwrap();
            let q = c
                .decode(&c.encode_matrix(row, 1, cols).unwrap(), cols)
                .unwrap();
            let e: f64 = row
                .iter()
                .zip(&q)
                .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
                .sum();
            *num_by.entry(o.encoding.clone()).or_insert(0f64) += e;
        }
    }
    for o in &map.tensors[&head].options {
        let lookup = num_by[&o.encoding] / den;
        assert!(lookup > 0.0);
        // The output part is positive too, so the sum is strictly above the lookup part.
        assert!(
            o.distortion > lookup,
            "{}: {} vs lookup {lookup}",
            o.encoding,
            o.distortion
        );
    }
    // Untied: the head is measured as a linear like any other.
    let lm = build(&l, &lt);
    let lh = l.ir.weight(l.ir.lm_head.linear.weight).name.clone();
    assert!(!lm.tensors[&lh].options.is_empty());
}
