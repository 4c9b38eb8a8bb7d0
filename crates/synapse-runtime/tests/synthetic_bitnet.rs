//! The synthetic BitNet model (`synapse_testdata::synthetic_bitnet`, what `cargo xtask
//! synthetic-bitnet` writes at the 2B4T shape for benchmarks) runs through Synapse's `bitnet`
//! adapter: its TQ2_0 and TQ1_0 files (the same trits) give the same greedy tokens and logits
//! bit for bit (both dots sum the same lanes).

mod common;

use std::sync::Arc;

use synapse_formats::GgmlType;
use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row, argmax};
use synapse_testdata::synthetic_bitnet::{BitnetShape, write};

/// Greedy decode of `steps` tokens after `prompt`: every step's logits.
fn run(m: Arc<Model>, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut ex = Executor::new(m.clone(), 2).unwrap();
    let mut kv = KvCache::new(&m, KvDtype::F32, 1, 128, 64).unwrap();
    kv.open(0).unwrap();
    let mut out = vec![
        ex.forward(&mut kv, &common::prompt_rows(prompt))
            .unwrap()
            .to_vec(),
    ];
    for s in 0..steps {
        let next = argmax(out.last().unwrap());
        let row = Row::decode(0, (prompt.len() + s) as u32, next);
        out.push(ex.forward(&mut kv, &[row]).unwrap().to_vec());
    }
    out
}

#[test]
fn synthetic_bitnet_runs_alike_in_both_packings() {
    let dir = tempfile::tempdir().unwrap();
    let tq2 = BitnetShape::small();
    let tq1 = BitnetShape {
        ternary: GgmlType::TQ1_0,
        ..tq2.clone()
    };
    let load = |s: &BitnetShape| {
        let p = dir.path().join(s.file_name());
        write(s, &p).unwrap();
        Arc::new(Model::load(&p).unwrap())
    };
    let (m2, m1) = (load(&tq2), load(&tq1));
    assert_eq!(m2.ir.family, synapse_model::Family::Bitnet);
    assert_eq!(m2.layers.len(), tq2.layers as usize);
    let prompt: Vec<u32> = (0..40u32).map(|i| 1 + (i * 37) % 500).collect();
    let (a, b) = (run(m2, &prompt, 12), run(m1, &prompt, 12));
    let mut worst = 0f32;
    for (s, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.len(), tq2.vocab as usize);
        assert!(
            x.iter().all(|v| v.is_finite()),
            "step {s}: non-finite logits"
        );
        assert_eq!(argmax(x), argmax(y), "step {s}: greedy tokens differ");
        let scale = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (u, v) in x.iter().zip(y) {
            worst = worst.max((u - v).abs() / scale);
        }
    }
    eprintln!("TQ2_0 vs TQ1_0: worst logit difference {worst:.3e} of the largest logit");
    // Both kernels sum each 32-element vector of codes in element order into the same lanes
    // (ggml's TQ1_0 and TQ2_0 dots): the same weights give the same bits.
    assert_eq!(worst, 0.0);
    // Not a constant model: the logits spread.
    let l = &a[0];
    let (lo, hi) = l
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    assert!(hi - lo > 1.0, "logits span {lo}..{hi}");
}
