//! Mixture-of-experts blocks under batching: a session's logits are bit-identical alone or
//! beside other sessions whose rows route to the same or other experts (every expert call
//! runs in the one-row order, as ggml's `mul_mat_id` does, so grouping rows of many sessions
//! into one call per expert changes no bits), for all four MoE families in F32 and Q8_0; and
//! for K-quant experts (`olmoe-k`, Q4_K_M), which ggml tiles where 8 or more rows of one
//! prompt batch route to an expert, with every prompt batch whole in a pass — through the
//! executor and through the engine's scheduler.

mod common;

use std::sync::Arc;

use synapse_runtime::{Executor, KvCache, KvDtype, Model, OrderClass, Row, argmax, prompt_order};

const FAMILIES: [&str; 4] = synapse_testdata::TINY_MOE_FAMILIES;
const UB: usize = 8;
const STEPS: usize = 5;

/// Prefill in `ub`-row passes (llama.cpp's ubatch split), then greedy decode steps: the
/// logits of the prompt's last row and of each step.
fn alone(model: &Arc<Model>, p: &[u32], ub: usize) -> Vec<Vec<f32>> {
    let mut kv = KvCache::new(model, KvDtype::F32, 1, 64, ub).unwrap();
    kv.open(0).unwrap();
    let mut ex = Executor::new(model.clone(), 2).unwrap();
    let mut out = Vec::new();
    for (c, part) in p.chunks(ub).enumerate() {
        let rows: Vec<Row> = part
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let pos = c * ub + i;
                Row {
                    slot: 0,
                    pos: pos as u32,
                    token: t,
                    logits: pos + 1 == p.len(),
                    order: prompt_order(pos, p.len(), ub),
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
/// its prompt (so passes never align with the ubatch split; with `whole`, the rest of its
/// `ub`-row prompt batch instead) and one decode row of each
/// session past it, in a session order that rotates pass by pass.
fn together(
    model: &Arc<Model>,
    prompts: &[Vec<u32>],
    ub: usize,
    whole: bool,
) -> Vec<Vec<Vec<f32>>> {
    let n = prompts.len();
    let mut kv = KvCache::new(model, KvDtype::F32, n, 64, ub).unwrap();
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
                // 3 rows, or (`whole`) the rest of the prompt batch.
                let end = if whole {
                    ((next_pos[s] / ub + 1) * ub).min(p.len())
                } else {
                    (next_pos[s] + 3).min(p.len())
                };
                for pos in next_pos[s]..end {
                    rows.push(Row {
                        slot: s as u32,
                        pos: pos as u32,
                        token: p[pos],
                        logits: pos + 1 == p.len(),
                        order: prompt_order(pos, p.len(), ub),
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
            let want: Vec<_> = prompts.iter().map(|p| alone(&model, p, UB)).collect();
            let got = together(&model, &prompts, UB, false);
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

/// K-quant experts (Q4_K, Q6_K): a row's expert outputs depend on how many rows of its own
/// prompt batch route to the expert (ggml tiles 8 or more), never on the other sessions in the
/// pass — each session's logits bit-identical alone and beside the others, every prompt batch
/// whole in its pass (16-row batches: some expert groups of 8+ rows, some fewer).
#[test]
fn k_quant_experts_match_independent_with_whole_prompt_batches() {
    let dir = common::workspace_root().join("fixtures/tiny/olmoe-k");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let mut prompts = common::tiny_sequences(&dir);
    prompts.push(prompts[0][..11].to_vec());
    let model = Arc::new(Model::load(&dir.join("model.q4_k_m.gguf")).unwrap());
    assert!(model.tiles_experts());
    let want: Vec<_> = prompts.iter().map(|p| alone(&model, p, 16)).collect();
    let got = together(&model, &prompts, 16, true);
    assert_eq!(
        want, got,
        "olmoe-k Q4_K_M: a session's logits differ beside others"
    );
    // Why whole: prompt batches cut into 3-row pieces (as the F32/Q8_0 families may be) count
    // fewer rows per expert than ggml does, and other bits come out.
    let split = together(&model, &prompts, 16, false);
    let differ = want
        .iter()
        .flatten()
        .flatten()
        .zip(split.iter().flatten().flatten())
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    eprintln!("olmoe-k Q4_K_M: cut into 3-row pieces, {differ} logits differ");
    assert!(differ > 0, "cutting the prompt batches changed nothing");
    eprintln!(
        "olmoe-k Q4_K_M: {} sessions, {} logit rows, each bit-identical alone and together",
        prompts.len(),
        want.iter().map(Vec::len).sum::<usize>()
    );
}

/// The engine runs a mixture of experts' prompt batches whole (`Model::tiles_experts`): 4
/// concurrent sessions on K-quant experts with a step budget that would split them give each
/// session the tokens and log-probability bits it has alone.
#[test]
fn the_engine_keeps_k_quant_experts_batch_invariant() {
    use synapse_runtime::engine::{EngineConfig, Request};
    let dir = common::workspace_root().join("fixtures/tiny/olmoe-k");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    // A 12-row prompt first: the ramp (whose 16-row batch routes 8+ rows to some experts)
    // gets the 8 rows the first step's budget leaves, and its other 8 a step later, unless
    // the scheduler keeps its batch whole.
    let seqs = common::tiny_sequences(&dir);
    let prompts = [
        seqs[0][..12].to_vec(),
        seqs[0].clone(),
        seqs[2].clone(),
        seqs[1].clone(),
    ];
    let model = Arc::new(Model::load(&dir.join("model.q4_k_m.gguf")).unwrap());
    let cfg = EngineConfig {
        slots: 4,
        ctx: 64,
        ubatch: 16,
        step_tokens: 20,
        ..EngineConfig::default()
    };
    let req = |p: &Vec<u32>| {
        let mut r = Request::greedy(p.clone(), 6);
        r.stop_at_eog = false;
        r.logprobs = Some(5);
        r
    };
    let refs: Vec<_> = prompts
        .iter()
        .map(|p| common::solo(&model, &cfg, req(p)))
        .collect();
    let reqs: Vec<Request> = prompts.iter().map(req).collect();
    let (got, _) = common::run_replacing(&model, &cfg, reqs, &[]);
    common::assert_sessions_match(&got, &refs, &[]);
}

/// A K-quant MoE reuses a cached prefix only in whole prompt batches: a second session whose
/// prompt shares 26 positions with a finished one (its second 16-row batch differing after
/// position 25) gets exactly what it gets alone.
#[test]
fn k_quant_experts_reuse_prefixes_in_whole_batches() {
    use synapse_runtime::engine::{EngineConfig, Request};
    let dir = common::workspace_root().join("fixtures/tiny/olmoe-k");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let seqs = common::tiny_sequences(&dir);
    let model = Arc::new(Model::load(&dir.join("model.q4_k_m.gguf")).unwrap());
    let cfg = EngineConfig {
        slots: 1,
        ctx: 64,
        ubatch: 16,
        step_tokens: 20,
        ..EngineConfig::default()
    };
    let a: Vec<u32> = seqs[0].iter().chain(&seqs[0]).copied().collect();
    let mut b = a[..26].to_vec();
    b.extend(seqs[1][1..7].iter());
    let req = |p: &Vec<u32>| {
        let mut r = Request::greedy(p.clone(), 6);
        r.stop_at_eog = false;
        r.logprobs = Some(5);
        r
    };
    let want = common::solo(&model, &cfg, req(&b));
    let (got, s) = common::run_replacing(&model, &cfg, vec![req(&a), req(&b)], &[]);
    assert_eq!(common::tokens(&got[1]).0, want, "the second session");
    let hits = s.stats().prefix_hit_tokens;
    eprintln!("olmoe-k: the second session reused {hits} positions (shared 26)");
    assert_eq!(hits, 16, "a whole batch reused");
}

/// A uniform profile re-encodes the routed experts too (every expert's slice of a stacked
/// tensor, the profile naming the stacked tensor): the experts shrink, the logits move a
/// little off the source, and a session's logits stay bit-identical alone and beside others.
#[test]
fn a_uniform_profile_re_encodes_the_experts() {
    use synapse_runtime::precision::{Precision, apply};
    let dir = common::workspace_root().join("fixtures/tiny/olmoe");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let src = Arc::new(Model::load(&dir.join("model.f32.gguf")).unwrap());
    let p = Precision::parse_profile("uniform:syn.q8.symmetric.g64.v1").unwrap();
    let q8 = apply(&src, &p, None).unwrap().model;
    let experts = synapse_runtime::importance::expert_tensors(&src);
    assert_eq!(experts.len(), 2 * 3, "{experts:?}");
    for n in &experts {
        assert_eq!(
            q8.profile.encoding(n),
            Some("syn.q8.symmetric.g64.v1"),
            "{n}"
        );
    }
    assert!(
        q8.expert_bytes() * 3 < src.expert_bytes(),
        "experts did not shrink"
    );
    let mut prompts = common::tiny_sequences(&dir);
    prompts.push(prompts[0][..11].to_vec());
    let want: Vec<_> = prompts.iter().map(|p| alone(&q8, p, UB)).collect();
    let got = together(&q8, &prompts, UB, false);
    assert_eq!(
        want, got,
        "uniform q8 experts: a session's logits differ beside others"
    );
    let base = alone(&src, &prompts[0], UB);
    let (mut diff, mut scale) = (0f32, 0f32);
    for (a, b) in want[0].iter().flatten().zip(base.iter().flatten()) {
        diff = diff.max((a - b).abs());
        scale = scale.max(b.abs());
    }
    eprintln!(
        "olmoe uniform q8: experts {} -> {} B, logits max |d| {diff:.3e} of {scale:.3}",
        src.expert_bytes(),
        q8.expert_bytes()
    );
    assert!(diff > 0.0 && diff < 0.05 * scale, "{diff} of {scale}");
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
