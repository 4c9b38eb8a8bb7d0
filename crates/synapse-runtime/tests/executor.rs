//! Executor properties on the tiny Gemma 3 fixture (Q8_0 GGUF: sliding window 4, GQA, one
//! global layer): a ragged batch of several sessions gives each session the logits it gets
//! alone, chunked prefill gives one pass's logits, a second turn reuses the cached prefix and
//! generates what a fresh session generates, and a cache made for another model is refused.

mod common;

use std::sync::Arc;

use synapse_runtime::{
    Executor, GenerateParams, KvCache, KvDtype, Model, Row, RuntimeError, generate,
};

fn fixture(family: &str) -> Option<(Arc<Model>, Vec<Vec<u32>>)> {
    let dir = common::workspace_root().join("fixtures/tiny").join(family);
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return None;
    }
    let seqs = common::tiny_sequences(&dir);
    let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
    Some((model, seqs))
}

/// Logits of every position of `seq`, run alone in slot 0 of a fresh cache in one pass.
fn alone(model: &Arc<Model>, seq: &[u32]) -> Vec<f32> {
    let mut kv = KvCache::new(model, KvDtype::F32, 1, 64, 64).unwrap();
    kv.open(0).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    exec.forward(&mut kv, &common::all_logit_rows(seq))
        .unwrap()
        .to_vec()
}

fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-9);
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - *y as f64).abs()))
        / scale
}

#[test]
fn ragged_batch_of_sessions_matches_each_session_alone() {
    let Some((model, seqs)) = fixture("gemma3") else {
        return;
    };
    let vocab = model.vocab();
    let (a, b) = (&seqs[0], &seqs[1]);
    let (want_a, want_b) = (alone(&model, a), alone(&model, b));

    // Both sessions in one pass, rows interleaved, slot 1 before slot 0 where both exist.
    let mut kv = KvCache::new(&model, KvDtype::F32, 2, 64, 64).unwrap();
    kv.open(0).unwrap();
    kv.open(1).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let mut rows = Vec::new();
    for i in 0..a.len().max(b.len()) {
        if let Some(&t) = b.get(i) {
            rows.push(Row {
                slot: 1,
                pos: i as u32,
                token: t,
                logits: true,
            });
        }
        if let Some(&t) = a.get(i) {
            rows.push(Row {
                slot: 0,
                pos: i as u32,
                token: t,
                logits: true,
            });
        }
    }
    let out = exec.forward(&mut kv, &rows).unwrap().to_vec();
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    for (r, row) in rows.iter().enumerate() {
        let l = &out[r * vocab..(r + 1) * vocab];
        if row.slot == 0 {
            got_a.extend_from_slice(l);
        } else {
            got_b.extend_from_slice(l);
        }
    }
    // Both runs have ≥ 8 rows, so every kernel sums in the same order: equal bits expected;
    // 1e-6 relative leaves room for nothing but a reordering bug's absence.
    assert!(
        max_rel(&got_a, &want_a) <= 1e-6,
        "{}",
        max_rel(&got_a, &want_a)
    );
    assert!(
        max_rel(&got_b, &want_b) <= 1e-6,
        "{}",
        max_rel(&got_b, &want_b)
    );
    assert_eq!(kv.tokens(0).unwrap(), &a[..]);
    assert_eq!(kv.tokens(1).unwrap(), &b[..]);
}

#[test]
fn chunked_prefill_matches_one_pass() {
    let Some((model, seqs)) = fixture("gemma3") else {
        return;
    };
    let vocab = model.vocab();
    let seq = &seqs[1];
    let want = alone(&model, seq);
    let last = &want[(seq.len() - 1) * vocab..];
    for chunk in [1usize, 3, 8] {
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, chunk).unwrap();
        kv.open(0).unwrap();
        let mut exec = Executor::new(model.clone(), 2).unwrap();
        let mut got = Vec::new();
        for (ci, part) in seq.chunks(chunk).enumerate() {
            let rows: Vec<Row> = part
                .iter()
                .enumerate()
                .map(|(i, &t)| Row {
                    slot: 0,
                    pos: (ci * chunk + i) as u32,
                    token: t,
                    logits: ci * chunk + i + 1 == seq.len(),
                })
                .collect();
            let out = exec.forward(&mut kv, &rows).unwrap();
            if !out.is_empty() {
                got = out.to_vec();
            }
        }
        // Chunks of fewer rows sum P·V and F32 products in ggml's one-row order, so only the
        // last bits may differ.
        assert!(
            max_rel(&got, last) <= 1e-5,
            "chunk {chunk}: {}",
            max_rel(&got, last)
        );
        // A chunk larger than the cache allows is a typed error, not a wrong answer.
        if chunk == 1 {
            let rows: Vec<Row> = (0..2)
                .map(|i| Row {
                    slot: 0,
                    pos: seq.len() as u32 + i,
                    token: 1,
                    logits: false,
                })
                .collect();
            assert!(matches!(
                exec.forward(&mut kv, &rows),
                Err(RuntimeError::ChunkTooLarge { .. })
            ));
        }
    }
}

#[test]
fn second_turn_reuses_the_prefix_and_matches_a_fresh_session() {
    let Some((model, seqs)) = fixture("gemma3") else {
        return;
    };
    let params = GenerateParams {
        max_tokens: 6,
        stop_at_eog: false,
        ..GenerateParams::default()
    };
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, 128, 16).unwrap();
    let turn1 = generate(
        &mut exec,
        &mut kv,
        0,
        &seqs[2],
        &params,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(turn1.reused_prefix, 0);
    let mut prompt2 = seqs[2].clone();
    prompt2.extend_from_slice(&turn1.tokens);
    prompt2.extend_from_slice(&seqs[0][1..6]);
    let turn2 = generate(
        &mut exec,
        &mut kv,
        0,
        &prompt2,
        &params,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    // The cache holds the first prompt and the tokens fed back while generating (all but the
    // last generated token, which was never run through the model).
    assert!(
        turn2.reused_prefix >= seqs[2].len() + turn1.tokens.len() - 1,
        "reused {} of {}",
        turn2.reused_prefix,
        prompt2.len()
    );
    assert_eq!(
        turn2.timings.prefill_tokens,
        prompt2.len() - turn2.reused_prefix
    );

    let mut fresh_kv = KvCache::new(&model, KvDtype::F32, 1, 128, 16).unwrap();
    let fresh = generate(
        &mut exec,
        &mut fresh_kv,
        0,
        &prompt2,
        &params,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(fresh.reused_prefix, 0);
    assert_eq!(turn2.tokens, fresh.tokens);
}

#[test]
fn a_cache_made_for_another_model_is_refused() {
    let (Some((gemma, seqs)), Some((llama, _))) = (fixture("gemma3"), fixture("llama")) else {
        return;
    };
    let mut kv = KvCache::new(&llama, KvDtype::F32, 1, 16, 16).unwrap();
    kv.open(0).unwrap();
    let mut exec = Executor::new(gemma, 1).unwrap();
    let rows = [Row {
        slot: 0,
        pos: 0,
        token: seqs[0][0],
        logits: true,
    }];
    assert!(matches!(
        exec.forward(&mut kv, &rows),
        Err(RuntimeError::KvIdentity { .. })
    ));
}
