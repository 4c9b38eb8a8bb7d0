//! A model with tensors re-encoded by Synapse codecs (`Model::with_encodings`) runs in the
//! executor: logits near the source's for 8 bits, farther for 2, a new profile hash that the
//! source model's caches do not match, and unknown names refused.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use synapse_codecs::EncodingId;
use synapse_runtime::importance::linears;
use synapse_runtime::{Executor, KvCache, KvDtype, Model};

/// Mean KL(p_source ‖ p_variant) over the rows.
fn mean_kl(src: &[f32], var: &[f32], vocab: usize) -> f64 {
    let soft = |r: &[f32]| {
        let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = r.iter().map(|&x| (x as f64 - m).exp()).sum();
        r.iter()
            .map(|&x| (x as f64 - m).exp() / z)
            .collect::<Vec<f64>>()
    };
    let rows = src.len() / vocab;
    let mut kl = 0.0;
    for i in 0..rows {
        let (p, q) = (
            soft(&src[i * vocab..][..vocab]),
            soft(&var[i * vocab..][..vocab]),
        );
        kl += p
            .iter()
            .zip(&q)
            .map(|(a, b)| if *a > 0.0 { a * (a / b).ln() } else { 0.0 })
            .sum::<f64>();
    }
    kl / rows as f64
}

#[test]
fn re_encoded_tensors_run_and_cost_what_their_bits_say() {
    let dir = common::workspace_root().join("fixtures/tiny/llama");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
    let seq = &common::tiny_sequences(&dir)[0];
    let vocab = model.vocab();
    let src = common::alone_logits(&model, seq);
    let all: Vec<String> = linears(&model).into_iter().map(|(n, _)| n).collect();
    let mut kls = Vec::new();
    for bits in [8u32, 4, 2] {
        let id = EncodingId::Symmetric { bits, group: 64 };
        let changes: BTreeMap<String, EncodingId> = all.iter().map(|n| (n.clone(), id)).collect();
        let v = Arc::new(model.with_encodings(&changes).unwrap());
        assert_ne!(v.profile.hash(), model.profile.hash());
        for n in &all {
            assert_eq!(v.profile.encoding(n), Some(id.to_string().as_str()));
        }
        let got = common::alone_logits(&v, seq);
        assert!(got.iter().all(|x| x.is_finite()));
        kls.push(mean_kl(&src, &got, vocab));
        // A cache made for the source precision is refused by the variant's executor.
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 64).unwrap();
        kv.open(0).unwrap();
        let mut exec = Executor::new(v.clone(), 2).unwrap();
        assert!(exec.forward(&mut kv, &common::all_logit_rows(seq)).is_err());
    }
    eprintln!("mean KL vs source, q8 / q4 / q2 everywhere: {kls:?}");
    // 8 bits is close; fewer bits, more divergence.
    assert!(kls[0] < 1e-3, "{kls:?}");
    assert!(kls[0] < kls[1] && kls[1] < kls[2], "{kls:?}");
    // One tensor only: only that name changes.
    let one: BTreeMap<String, EncodingId> =
        [(all[0].clone(), EncodingId::Symmetric { bits: 4, group: 64 })].into();
    let v = model.with_encodings(&one).unwrap();
    let changed: Vec<&String> = model
        .profile
        .encodings
        .iter()
        .filter(|(k, e)| v.profile.encoding(k) != Some(e.as_str()))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(changed, vec![&all[0]]);
    // Unknown names and empty sets are refused.
    let bad: BTreeMap<String, EncodingId> = [(
        "no.such.weight".to_string(),
        EncodingId::Symmetric { bits: 4, group: 64 },
    )]
    .into();
    assert!(model.with_encodings(&bad).is_err());
    assert!(model.with_encodings(&BTreeMap::new()).is_err());
}

#[test]
fn perplexity_reports_kl_against_the_source() {
    use synapse_runtime::perplexity::{PerplexityParams, kl_divergence, perplexity_against};
    let dir = common::workspace_root().join("fixtures/tiny/llama");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
    let toks: Vec<u32> = (0..96u32).map(|i| 1 + (i * 53) % 450).collect();
    let p = PerplexityParams {
        ctx: 32,
        batch: 32,
        max_chunks: None,
        bos: None,
    };
    let all: Vec<String> = linears(&model).into_iter().map(|(n, _)| n).collect();
    let run = |bits: u32| {
        let id = EncodingId::Symmetric { bits, group: 64 };
        let v = Arc::new(
            model
                .with_encodings(&all.iter().map(|n| (n.clone(), id)).collect())
                .unwrap(),
        );
        let mut exec = Executor::new(v, 2).unwrap();
        let mut reference = Executor::new(model.clone(), 2).unwrap();
        perplexity_against(&mut exec, Some(&mut reference), &toks, &p, |_, _| {}).unwrap()
    };
    let (q8, q2) = (run(8), run(2));
    let (k8, k2) = (q8.kl.unwrap(), q2.kl.unwrap());
    assert!(k8 > 0.0 && k8 < 1e-3 && k2 > 10.0 * k8, "{k8} {k2}");
    // The source against itself: KL exactly 0, the same perplexity as without a reference.
    let mut a = Executor::new(model.clone(), 2).unwrap();
    let mut b = Executor::new(model.clone(), 2).unwrap();
    let same = perplexity_against(&mut a, Some(&mut b), &toks, &p, |_, _| {}).unwrap();
    assert_eq!(same.kl, Some(0.0));
    let alone = synapse_runtime::perplexity::perplexity(&mut a, &toks, &p, |_, _| {}).unwrap();
    assert_eq!(alone.ppl.to_bits(), same.ppl.to_bits());
    assert_eq!(alone.kl, None);
    assert!(kl_divergence(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]).abs() < 1e-15);
    assert!(kl_divergence(&[5.0, 0.0], &[0.0, 5.0]) > 4.0);
}
