//! Executor properties on the tiny Gemma 3 fixture (Q8_0 GGUF: sliding window 4, GQA, one
//! global layer): a ragged batch of several sessions gives each session the logits it gets
//! alone, chunked prefill gives one pass's logits, a second turn reuses the cached prefix and
//! generates what a fresh session generates, and a cache made for another model is refused.

mod common;

use std::sync::Arc;

use synapse_runtime::{
    Executor, GenerateParams, KvCache, KvDtype, Model, OrderClass, Row, RuntimeError, generate,
    prompt_order,
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
    let (want_a, want_b) = (
        common::alone_logits(&model, a),
        common::alone_logits(&model, b),
    );

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
                order: OrderClass::of(b.len()),
            });
        }
        if let Some(&t) = a.get(i) {
            rows.push(Row {
                slot: 0,
                pos: i as u32,
                token: t,
                logits: true,
                order: OrderClass::of(a.len()),
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
    let want = common::alone_logits(&model, seq);
    let last = &want[(seq.len() - 1) * vocab..];
    for chunk in [1usize, 3, 8] {
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, chunk).unwrap();
        kv.open(0).unwrap();
        let mut exec = Executor::new(model.clone(), 2).unwrap();
        let got = prefill_chunks(&mut exec, &mut kv, seq, chunk);
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
                    order: OrderClass::Few,
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
    // A first prompt of ≥ 8 tokens (its rows sum in the many-row order).
    let prompt1: Vec<u32> = seqs[2]
        .iter()
        .chain(&seqs[2][1..])
        .chain(&seqs[2][1..])
        .copied()
        .collect();
    let turn1 = generate(
        &mut exec,
        &mut kv,
        0,
        &prompt1,
        &params,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(turn1.reused_prefix, 0);
    let mut prompt2 = prompt1.clone();
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
    // The cache holds the first prompt and the tokens fed back while generating; only the
    // positions computed in the order a fresh run of the second prompt uses are reused: the
    // first prompt (≥ 8 rows, the many-row order in both runs), not the decoded tokens (one-row
    // order, where a fresh prefill sums them as a batch).
    let (l1, l2) = (prompt1.len(), prompt2.len());
    let same_order = (0..l1)
        .take_while(|&p| prompt_order(p, l1, 16) == prompt_order(p, l2, 16))
        .count();
    assert!(
        same_order > 0,
        "fixture: prompts {l1} and {l2} share no order"
    );
    assert_eq!(
        turn2.reused_prefix,
        same_order,
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
    let rows = [Row::decode(0, 0, seqs[0][0])];
    assert!(matches!(
        exec.forward(&mut kv, &rows),
        Err(RuntimeError::KvIdentity { .. })
    ));
}

/// Prefills `seq` into slot 0 `chunk` rows a pass; the last position's logits.
fn prefill_chunks(exec: &mut Executor, kv: &mut KvCache, seq: &[u32], chunk: usize) -> Vec<f32> {
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
                order: OrderClass::of(part.len()),
            })
            .collect();
        let out = exec.forward(kv, &rows).unwrap();
        if !out.is_empty() {
            got = out.to_vec();
        }
    }
    got
}

/// Logits of the last position of `seq` with a `dtype` cache, prefilled `chunk` rows a pass.
fn last_logits(model: &Arc<Model>, seq: &[u32], dtype: KvDtype, chunk: usize) -> Vec<f32> {
    let mut kv = KvCache::new(model, dtype, 1, 64, chunk).unwrap();
    kv.open(0).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    prefill_chunks(&mut exec, &mut kv, seq, chunk)
}

#[test]
fn f16_cache_tracks_the_f32_cache_in_one_pass_and_through_the_ring() {
    let Some((model, seqs)) = fixture("gemma3") else {
        return;
    };
    for seq in &seqs[..2] {
        let f32_one = last_logits(&model, seq, KvDtype::F32, 64);
        let f16_one = last_logits(&model, seq, KvDtype::F16, 64);
        // K and V rounded to 11 significant bits: close, not equal (2.4e-2 on this random
        // tiny model, the same before and after the transposed layout).
        let d = max_rel(&f16_one, &f32_one);
        assert!(d > 0.0 && d <= 5e-2, "f16 vs f32 cache: {d}");
        let am = |v: &[f32]| {
            v.iter()
                .enumerate()
                .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
                .0
        };
        assert_eq!(
            am(&f16_one),
            am(&f32_one),
            "f16 cache changes the greedy token"
        );
        // Chunks of 3 wrap the window-4 layers' ring (4 + 3 rows): the same cached values,
        // only P·V's order class differs from the one pass.
        let f16_ring = last_logits(&model, seq, KvDtype::F16, 3);
        let d = max_rel(&f16_ring, &f16_one);
        assert!(d <= 1e-5, "f16 ring vs one pass: {d}");
    }
}

/// Keeps the first row of every layer's attention output (`kqv_out`).
#[derive(Clone, Default)]
struct KqvTap(std::sync::Arc<std::sync::Mutex<Vec<Vec<f32>>>>);

impl synapse_runtime::Tap for KqvTap {
    fn tensor(&mut self, stage: synapse_runtime::Stage, _: Option<usize>, rows: usize, d: &[f32]) {
        if stage == synapse_runtime::Stage::KqvOut {
            self.0.lock().unwrap().push(d[..d.len() / rows].to_vec());
        }
    }
}

/// A decode row at a long context computed alone (few row blocks: attention's split path,
/// keys and values chunked across threads) and beside three other sessions (enough blocks
/// for the per-item path) gives the same logits, bit for bit.
#[test]
fn long_context_decode_is_the_same_alone_and_beside_other_sessions() {
    let dir = common::workspace_root().join("fixtures/tiny/llama");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
    let vocab = model.vocab();
    let n = 700usize;
    let seq: Vec<u32> = (0..n as u32).map(|i| 1 + (i * 7919) % 500).collect();
    let prefill = |kv: &mut KvCache, exec: &mut Executor, slot: u32, seq: &[u32]| {
        for (ci, part) in seq.chunks(64).enumerate() {
            let rows: Vec<Row> = part
                .iter()
                .enumerate()
                .map(|(i, &t)| Row {
                    slot,
                    pos: (ci * 64 + i) as u32,
                    token: t,
                    logits: false,
                    order: OrderClass::of(part.len()),
                })
                .collect();
            exec.forward(kv, &rows).unwrap();
        }
    };
    let step = |slot: u32, pos: usize, token: u32| Row {
        slot,
        pos: pos as u32,
        token,
        logits: true,
        order: OrderClass::One,
    };
    // Alone: one session in its own cache.
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, n + 8, 64).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    kv.open(0).unwrap();
    prefill(&mut kv, &mut exec, 0, &seq[..n - 1]);
    let tap_alone = KqvTap::default();
    exec.set_tap(Some(Box::new(tap_alone.clone())));
    let alone = exec
        .forward(&mut kv, &[step(0, n - 1, seq[n - 1])])
        .unwrap()
        .to_vec();
    // Beside three other sessions, the same prefill in a cache of four slots.
    let mut kv = KvCache::new(&model, KvDtype::F32, 4, n + 8, 64).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    for s in 0..4 {
        kv.open(s).unwrap();
    }
    prefill(&mut kv, &mut exec, 0, &seq[..n - 1]);
    let others: Vec<Vec<u32>> = (1..4u32)
        .map(|s| (0..40 * s).map(|i| 3 + (i * 31 + s) % 400).collect())
        .collect();
    for (s, o) in others.iter().enumerate() {
        prefill(&mut kv, &mut exec, s as u32 + 1, o);
    }
    let mut rows = vec![step(0, n - 1, seq[n - 1])];
    for (s, o) in others.iter().enumerate() {
        rows.push(step(s as u32 + 1, o.len(), 5));
    }
    let tap_beside = KqvTap::default();
    exec.set_tap(Some(Box::new(tap_beside.clone())));
    let out = exec.forward(&mut kv, &rows).unwrap();
    let beside = &out[..vocab];
    // The attention outputs themselves (the logits alone could hide a difference below the
    // next projection's activation quantization).
    let (a, b) = (tap_alone.0.lock().unwrap(), tap_beside.0.lock().unwrap());
    assert_eq!(a.len(), model.layers.len());
    for (il, (x, y)) in a.iter().zip(b.iter()).enumerate() {
        let d = x
            .iter()
            .zip(y)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        assert_eq!(
            d,
            0,
            "layer {il}: {d} of {} attention outputs differ",
            x.len()
        );
    }
    let diff = alone
        .iter()
        .zip(beside)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(diff, 0, "{diff} of {vocab} logits differ");
}

/// A closed slot's buffers go to the next session opened (committed up front by
/// `KvCache::commit_slots`, as the engine does): the second session reads none of the first's
/// rows — its logits equal a fresh cache's bit for bit, on the sliding-window ring layers too,
/// whether it is shorter or longer than the first.
#[test]
fn a_reused_slot_reads_nothing_of_its_last_session() {
    let Some((model, seqs)) = fixture("gemma3") else {
        return;
    };
    let (a, b) = (&seqs[0], &seqs[1]);
    for (first, second) in [(a, b), (b, a)] {
        let want = common::alone_logits(&model, second);
        // Passes of at most 8 rows, so the window-4 layers keep rings of 12 rows (which the
        // sequences wrap) instead of the whole capacity.
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 8).unwrap();
        kv.commit_slots();
        let mut exec = Executor::new(model.clone(), 2).unwrap();
        let mut run = |kv: &mut KvCache, seq: &[u32]| {
            let rows = common::all_logit_rows(seq);
            let mut out = Vec::new();
            for c in rows.chunks(8) {
                out.extend_from_slice(exec.forward(kv, c).unwrap());
            }
            out
        };
        kv.open(0).unwrap();
        run(&mut kv, first);
        kv.close(0);
        kv.open(0).unwrap();
        let got = run(&mut kv, second);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "logit {i} after a session of {} tokens",
                first.len()
            );
        }
    }
}
