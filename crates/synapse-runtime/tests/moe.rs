//! Mixture-of-experts blocks under batching: a session's logits are bit-identical alone or
//! beside other sessions whose rows route to the same or other experts (every expert call
//! runs in the one-row order, as ggml's `mul_mat_id` does, so grouping rows of many sessions
//! into one call per expert changes no bits), for all four MoE families in F32 and Q8_0.

mod common;

use std::sync::Arc;

use synapse_runtime::{Executor, KvCache, KvDtype, Model, OrderClass, Row, argmax, prompt_order};

const FAMILIES: [&str; 4] = synapse_testdata::TINY_MOE_FAMILIES;
const UB: usize = 8;
const STEPS: usize = 5;

/// Prefill in `UB`-row passes (llama.cpp's ubatch split), then greedy decode steps: the
/// logits of the prompt's last row and of each step.
fn alone(model: &Arc<Model>, p: &[u32]) -> Vec<Vec<f32>> {
    let mut kv = KvCache::new(model, KvDtype::F32, 1, 64, UB).unwrap();
    kv.open(0).unwrap();
    let mut ex = Executor::new(model.clone(), 2).unwrap();
    let mut out = Vec::new();
    for (c, part) in p.chunks(UB).enumerate() {
        let rows: Vec<Row> = part
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let pos = c * UB + i;
                Row {
                    slot: 0,
                    pos: pos as u32,
                    token: t,
                    logits: pos + 1 == p.len(),
                    order: prompt_order(pos, p.len(), UB),
                }
            })
            .collect();
        let l = ex.forward(&mut kv, &rows).unwrap();
        if !l.is_empty() {
            out.push(l.to_vec());
        }
    }
    for s in 0..STEPS {
        let next = argmax(out.last().unwrap());
        let l = ex
            .forward(&mut kv, &[Row::decode(0, (p.len() + s) as u32, next)])
            .unwrap();
        out.push(l.to_vec());
    }
    out
}

/// All sessions together: every pass takes up to 3 prompt rows of each session still in
/// its prompt (so passes never align with the ubatch split) and one decode row of each
/// session past it, in a session order that rotates pass by pass.
fn together(model: &Arc<Model>, prompts: &[Vec<u32>]) -> Vec<Vec<Vec<f32>>> {
    let n = prompts.len();
    let mut kv = KvCache::new(model, KvDtype::F32, n, 64, UB).unwrap();
    let mut ex = Executor::new(model.clone(), 2).unwrap();
    for s in 0..n {
        kv.open(s as u32).unwrap();
    }
    let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n];
    let mut next_pos = vec![0usize; n];
    let vocab = model.vocab();
    for pass in 0.. {
        let mut rows = Vec::new();
        for j in 0..n {
            let s = (j + pass) % n;
            let p = &prompts[s];
            let done = out[s].len().saturating_sub(1);
            if next_pos[s] < p.len() {
                let end = (next_pos[s] + 3).min(p.len());
                for pos in next_pos[s]..end {
                    rows.push(Row {
                        slot: s as u32,
                        pos: pos as u32,
                        token: p[pos],
                        logits: pos + 1 == p.len(),
                        order: prompt_order(pos, p.len(), UB),
                    });
                }
                next_pos[s] = end;
            } else if done < STEPS {
                let token = argmax(out[s].last().unwrap());
                rows.push(Row {
                    slot: s as u32,
                    pos: next_pos[s] as u32,
                    token,
                    logits: true,
                    order: OrderClass::One,
                });
                next_pos[s] += 1;
            }
        }
        if rows.is_empty() {
            break;
        }
        let logits = ex.forward(&mut kv, &rows).unwrap().to_vec();
        for (at, r) in rows.iter().filter(|r| r.logits).enumerate() {
            out[r.slot as usize].push(logits[at * vocab..(at + 1) * vocab].to_vec());
        }
    }
    out
}

#[test]
fn moe_ragged_batch_matches_independent() {
    for family in FAMILIES {
        let dir = common::workspace_root().join("fixtures/tiny").join(family);
        if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
            return;
        }
        let mut prompts = common::tiny_sequences(&dir);
        // A fourth session that starts like the first: the same experts, other positions.
        prompts.push(prompts[0][..11].to_vec());
        for file in ["model.f32.gguf", "model.q8_0.gguf"] {
            let model = Arc::new(Model::load(&dir.join(file)).unwrap());
            let want: Vec<_> = prompts.iter().map(|p| alone(&model, p)).collect();
            let got = together(&model, &prompts);
            for (s, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(w.len(), g.len(), "{family} {file} session {s}");
                for (i, (a, b)) in w.iter().zip(g).enumerate() {
                    let differ = a
                        .iter()
                        .zip(b)
                        .filter(|(x, y)| x.to_bits() != y.to_bits())
                        .count();
                    assert_eq!(
                        differ, 0,
                        "{family} {file} session {s} logits row {i}: {differ} values differ"
                    );
                }
            }
            eprintln!(
                "{family} {file}: {} sessions, {} logit rows, each bit-identical alone and together",
                prompts.len(),
                want.iter().map(Vec::len).sum::<usize>()
            );
        }
    }
}

/// All rows of all sessions routed to one expert go through one group (one call per
/// projection): per pass and MoE layer at most `n_expert` groups, whatever the rows, while
/// every row is counted `n_used` times.
#[test]
fn rows_of_all_sessions_share_one_call_per_expert() {
    for family in FAMILIES {
        let dir = common::workspace_root().join("fixtures/tiny").join(family);
        if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
            return;
        }
        let prompts = common::tiny_sequences(&dir);
        let model = Arc::new(Model::load(&dir.join("model.q8_0.gguf")).unwrap());
        let ir = &model.ir;
        let (n_expert, n_used) = match &ir.layers[0].ffn {
            synapse_model::FfnRegion::Moe(m) => (m.experts.len() as u64, m.n_used as u64),
            _ => unreachable!("{family} is a mixture of experts"),
        };
        let layers = ir.layers.len() as u64;
        let mut kv = KvCache::new(&model, KvDtype::F32, prompts.len(), 64, 64).unwrap();
        let mut ex = Executor::new(model.clone(), 2).unwrap();
        assert_eq!(ex.expert_stats().rows.len() as u64, layers);
        let mut rows = Vec::new();
        for (s, p) in prompts.iter().enumerate() {
            kv.open(s as u32).unwrap();
            rows.extend(p.iter().enumerate().map(|(i, &t)| Row {
                slot: s as u32,
                pos: i as u32,
                token: t,
                logits: i + 1 == p.len(),
                order: OrderClass::of(p.len()),
            }));
        }
        ex.forward(&mut kv, &rows).unwrap();
        let st = ex.expert_stats();
        let n = rows.len() as u64;
        assert_eq!(st.routed_rows(), n * n_used * layers, "{family}");
        assert!(
            st.groups <= n_expert * layers,
            "{family}: {} groups",
            st.groups
        );
        // One call per (row, pick) would be n · n_used per layer.
        assert!(st.groups < n * n_used * layers, "{family}");
        let prefill_groups = st.groups;
        // A decode step of every session: at most min(sessions · n_used, n_expert) per layer.
        ex.expert_stats_mut().reset();
        let step: Vec<Row> = prompts
            .iter()
            .enumerate()
            .map(|(s, p)| Row::decode(s as u32, p.len() as u32, 5))
            .collect();
        ex.forward(&mut kv, &step).unwrap();
        let st = ex.expert_stats();
        let s = prompts.len() as u64;
        assert_eq!(st.routed_rows(), s * n_used * layers, "{family}");
        assert!(
            st.groups <= (s * n_used).min(n_expert) * layers,
            "{family}: {} groups",
            st.groups
        );
        eprintln!(
            "{family}: {n} prompt rows of {s} sessions in {prefill_groups} expert groups over \
             {layers} layers, a decode step of each in {}",
            st.groups
        );
    }
}
