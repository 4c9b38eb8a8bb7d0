//! Head-only drafting (`head_draft::generate_head_draft`): a vocabulary shortlist of the
//! source's own LM head drafts, the full head verifies the stored hidden states, the body
//! runs once per position. Greedy output, stop and committed K/V equal plain decoding on the
//! three real models over many prompts, shortlist sizes and `k`; sampled output is a
//! function of the seed alone and distributed as plain sampling's.

mod common;

use std::path::Path;
use std::sync::Arc;

use synapse_runtime::escalation::DraftParams;
use synapse_runtime::head_draft::{HeadDraftStats, Shortlist, generate_head_draft};
use synapse_runtime::{
    Executor, GenerateParams, Generated, KvCache, KvDtype, Model, Row, StopReason, generate,
};
use synapse_tokenizer::Tokenizer;

fn plain(
    model: &Arc<Model>,
    prompt: &[u32],
    params: &GenerateParams,
    ctx: usize,
) -> (Generated, Vec<u32>) {
    let mut kv = KvCache::new(model, KvDtype::F32, 1, ctx, 64).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let g = generate(
        &mut exec,
        &mut kv,
        0,
        prompt,
        params,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    (g, kv.tokens(0).unwrap().to_vec())
}

fn head_drafted(
    model: &Arc<Model>,
    prompt: &[u32],
    params: &GenerateParams,
    dp: &DraftParams,
    shortlist: &mut Shortlist,
    ctx: usize,
) -> (Generated, Vec<u32>, HeadDraftStats) {
    let mut kv = KvCache::new(model, KvDtype::F32, 1, ctx, 64).unwrap();
    let mut exec = Executor::new(model.clone(), 2).unwrap();
    let (g, st) = generate_head_draft(
        &mut exec,
        &mut kv,
        0,
        prompt,
        params,
        dp,
        shortlist,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    (g, kv.tokens(0).unwrap().to_vec(), st)
}

const PROMPTS: [&str; 12] = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old \
     woodcutter and his three daughters. Every morning the woodcutter",
    "def fibonacci(n):",
    "Hi",
    "import numpy as np\n\ndef softmax(x):\n",
    "Q: What is the boiling point of water at sea level?\nA:",
    "In 1969, the first humans",
    "SELECT name, COUNT(*) FROM users",
    "Dear Sir or Madam,\n\nI am writing to",
    "fn main() {\n    let v: Vec<u32> =",
    "Die Hauptstadt von Deutschland ist",
];

/// The final-normed rows and the full head give `forward`'s logits bit for bit, and a
/// shortlist gives the full head's bits for its tokens (tied and untied heads, a bias-free
/// and a soft-capped family among the tiny models).
#[test]
fn split_head_and_shortlist_give_the_forward_pass_bits() {
    for family in ["llama", "qwen2", "gemma3"] {
        let Some((model, toks)) = common::tiny_q8_model(family) else {
            return;
        };
        let vocab = model.vocab();
        let seq = &toks[..9];
        // One decode step at a time: each position's logits.
        let mut ex = Executor::new(model.clone(), 2).unwrap();
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
        kv.open(0).unwrap();
        let mut want = Vec::new();
        for (p, &t) in seq.iter().enumerate() {
            want.extend_from_slice(ex.forward(&mut kv, &[Row::decode(0, p as u32, t)]).unwrap());
        }
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
        kv.open(0).unwrap();
        let mut sl = Shortlist::new(&model, [3u32, 0, 17, (vocab - 1) as u32, 3]).unwrap();
        assert_eq!(sl.len(), 4);
        for (p, &t) in seq.iter().enumerate() {
            let h = ex
                .forward_normed(&mut kv, &[Row::decode(0, p as u32, t)])
                .unwrap()
                .to_vec();
            assert_eq!(h.len(), model.hidden());
            let got = ex.head_logits(&h).unwrap().to_vec();
            let w = &want[p * vocab..(p + 1) * vocab];
            assert!(
                got.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{family} position {p}"
            );
            // The shortlist, with one more token added along the way.
            sl.add(&model, (p * 5 % vocab) as u32).unwrap();
            let mut full = vec![f32::NAN; vocab];
            sl.scatter_logits(&mut ex, &h, &mut full).unwrap();
            let mut on = 0;
            for t in 0..vocab {
                if sl.contains(t as u32) {
                    on += 1;
                    assert_eq!(full[t].to_bits(), w[t].to_bits(), "{family} token {t}");
                } else {
                    assert!(full[t].is_nan(), "{family}: token {t} is not on the list");
                }
            }
            assert_eq!(on, sl.len());
            // The list's argmax: the full logits' argmax over the listed tokens.
            let mut masked = w.to_vec();
            for (t, v) in masked.iter_mut().enumerate() {
                if !sl.contains(t as u32) {
                    *v = f32::NEG_INFINITY;
                }
            }
            assert_eq!(
                sl.argmax(&mut ex, &h).unwrap(),
                synapse_runtime::argmax(&masked)
            );
        }
        // All rows in one head call: each the one-row bits.
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
        kv.open(0).unwrap();
        let mut hs = Vec::new();
        for (p, &t) in seq.iter().enumerate() {
            hs.extend_from_slice(
                ex.forward_normed(&mut kv, &[Row::decode(0, p as u32, t)])
                    .unwrap(),
            );
        }
        let got = ex.head_logits(&hs).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{family}: {} rows in one head call",
            seq.len()
        );
    }
}

/// Every prompt, greedy, 24 tokens: tokens, stop and committed K/V positions equal plain
/// decoding, with shortlists from 64 tokens (most drafts miss and the list learns) to 32768
/// (most hit), fixed and adaptive `k`.
fn check_model(path: &Path) -> HeadDraftStats {
    let model = Arc::new(Model::load(path).unwrap());
    let f = synapse_formats::gguf::GgufFile::open(path).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let params = GenerateParams {
        max_tokens: 24,
        ..GenerateParams::default()
    };
    let mut total = HeadDraftStats::default();
    for (i, text) in PROMPTS.iter().enumerate() {
        let prompt = tok.encode(text, true, false).unwrap();
        let (want, want_kv) = plain(&model, &prompt, &params, 512);
        let size = [64, 4096, 32768][i % 3];
        let mut sl = Shortlist::lowest_ids(&model, size, &prompt).unwrap();
        let dp = DraftParams {
            max_k: 1 + (i * 3) % 8,
            adaptive: i % 2 == 1,
        };
        let (got, got_kv, st) = head_drafted(&model, &prompt, &params, &dp, &mut sl, 512);
        assert_eq!(
            got.tokens, want.tokens,
            "{path:?} prompt {i} {text:?} {dp:?} shortlist {size}"
        );
        assert_eq!(got.stop, want.stop, "prompt {i}");
        assert_eq!(got_kv, want_kv, "committed K/V positions, prompt {i}");
        let e = st.escalation;
        assert!(e.accepted <= e.drafted);
        total.escalation.drafted += e.drafted;
        total.escalation.accepted += e.accepted;
        total.misses += st.misses;
    }
    eprintln!(
        "{path:?}: {}/{} drafts accepted, {} tokens off the shortlist, over {} prompts",
        total.escalation.accepted,
        total.escalation.drafted,
        total.misses,
        PROMPTS.len()
    );
    total
}

#[test]
fn head_draft_greedy_equivalent() {
    for path in [
        common::default_model(),
        common::known_model("qwen2.5-coder-0.5b-instruct"),
        common::known_model("smollm2-135m-instruct"),
    ] {
        if !common::require(&path, "a real model") {
            continue;
        }
        let st = check_model(&path);
        // Drafts were accepted and rejected, and some tokens came from off the list.
        assert!(st.escalation.accepted > 0, "{path:?}");
        assert!(st.escalation.accepted < st.escalation.drafted, "{path:?}");
        assert!(st.misses > 0, "{path:?}");
    }
}

/// The context end and stop strings end where plain decoding ends, with any `k`.
#[test]
fn stops_and_context_end_where_plain_decoding_ends() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let prompt = &toks[..7];
    let params = GenerateParams {
        max_tokens: 100,
        stop_at_eog: false,
        ..GenerateParams::default()
    };
    let (want, want_kv) = plain(&model, prompt, &params, 24);
    assert_eq!(want.stop, StopReason::ContextFull);
    let quarter = model.vocab() / 4;
    for k in [1, 3, 7, 16] {
        let mut sl = Shortlist::lowest_ids(&model, quarter, &[]).unwrap();
        let dp = DraftParams {
            max_k: k,
            adaptive: false,
        };
        let (got, got_kv, _) = head_drafted(&model, prompt, &params, &dp, &mut sl, 24);
        assert_eq!(got.tokens, want.tokens, "k {k}");
        assert_eq!(got.stop, StopReason::ContextFull);
        assert_eq!(got_kv, want_kv);
    }
    // Stop strings on the token ids' text: stop at the 6th and 7th tokens' text.
    let piece = |t: u32| format!("<{t}>");
    let full = plain(&model, prompt, &params, 64).0.tokens;
    let params = GenerateParams {
        max_tokens: 30,
        stop: vec![format!("<{}><{}>", full[5], full[6])],
        stop_at_eog: false,
        ..GenerateParams::default()
    };
    let mut ex = Executor::new(model.clone(), 1).unwrap();
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
    let mut text_plain = String::new();
    let want = generate(
        &mut ex,
        &mut kv,
        0,
        prompt,
        &params,
        &mut { piece },
        &mut |s| text_plain.push_str(s),
    )
    .unwrap();
    assert_eq!(want.stop, StopReason::StopString);
    for k in [2, 8] {
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
        let mut sl = Shortlist::lowest_ids(&model, quarter, &[]).unwrap();
        let mut text = String::new();
        let (got, _) = generate_head_draft(
            &mut ex,
            &mut kv,
            0,
            prompt,
            &params,
            &DraftParams {
                max_k: k,
                adaptive: false,
            },
            &mut sl,
            &mut { piece },
            &mut |s| text.push_str(s),
        )
        .unwrap();
        assert_eq!(got.tokens, want.tokens);
        assert_eq!(got.stop, StopReason::StopString);
        assert_eq!(text, text_plain);
    }
}

/// A shortlist of another model, a `k` out of range, an empty prompt or an empty list are
/// refused before anything runs.
#[test]
fn what_head_drafting_cannot_do_is_refused() {
    let (Some((model, toks)), Some((other, _))) = (
        common::tiny_q8_model("llama"),
        common::tiny_q8_model("qwen2"),
    ) else {
        return;
    };
    let params = GenerateParams::default();
    let mut ex = Executor::new(model.clone(), 1).unwrap();
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
    let run = |ex: &mut Executor, kv: &mut KvCache, sl: &mut Shortlist, k: usize, p: &[u32]| {
        generate_head_draft(
            ex,
            kv,
            0,
            p,
            &params,
            &DraftParams {
                max_k: k,
                adaptive: false,
            },
            sl,
            &mut |_| String::new(),
            &mut |_| {},
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let mut foreign = Shortlist::lowest_ids(&other, 100, &[]).unwrap();
    assert!(run(&mut ex, &mut kv, &mut foreign, 4, &toks[..4]).contains("another model"));
    let mut sl = Shortlist::lowest_ids(&model, 100, &[]).unwrap();
    assert!(run(&mut ex, &mut kv, &mut sl, 0, &toks[..4]).contains("outside"));
    assert!(run(&mut ex, &mut kv, &mut sl, 17, &toks[..4]).contains("outside"));
    assert!(run(&mut ex, &mut kv, &mut sl, 4, &[]).contains("empty prompt"));
    assert_eq!(kv.tokens(0).map(|t| t.len()).unwrap_or(0), 0);
    assert!(Shortlist::new(&model, []).is_err());
    assert!(Shortlist::new(&model, [model.vocab() as u32]).is_err());
}

/// Sampled: the output is a function of the seed alone (any `k`, adaptive or fixed).
#[test]
fn head_draft_sampling_is_reproducible_and_independent_of_k() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let prompt = &toks[..6];
    let mut params = common::sampled_params(7, 24);
    params.sampling.repetition_penalty = 1.3;
    let half = model.vocab() / 2;
    let runs: Vec<Vec<u32>> = [(1, false), (4, false), (16, false), (8, true)]
        .into_iter()
        .map(|(k, adaptive)| {
            let mut sl = Shortlist::lowest_ids(&model, half, &[]).unwrap();
            head_drafted(
                &model,
                prompt,
                &params,
                &DraftParams { max_k: k, adaptive },
                &mut sl,
                64,
            )
            .0
            .tokens
        })
        .collect();
    for r in &runs[1..] {
        assert_eq!(r, &runs[0]);
    }
    let mut sl = Shortlist::lowest_ids(&model, half, &[]).unwrap();
    let other = head_drafted(
        &model,
        prompt,
        &common::sampled_params(8, 24),
        &DraftParams::default(),
        &mut sl,
        64,
    )
    .0
    .tokens;
    assert_ne!(other, runs[0]);
}

/// Sampled: over 1500 seeds, the tokens at output positions 1 and 2 are distributed as plain
/// sampling's (z < 4), while sampling from the shortlist alone — the draft distribution — is
/// told apart by the same test.
#[test]
fn head_draft_sampling_preserves_the_source_distribution() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let prompt = &toks[..6];
    let n = 1500;
    let size = model.vocab() / 3;
    let plain_src = common::token_counts(n, |s| {
        plain(&model, prompt, &common::sampled_params(s, 3), 64)
            .0
            .tokens
    });
    let mut acc = (0, 0);
    let spec = common::token_counts(n, |s| {
        let mut sl = Shortlist::lowest_ids(&model, size, &[]).unwrap();
        let (g, _, st) = head_drafted(
            &model,
            prompt,
            &common::sampled_params(2_000_000 + s, 3),
            &DraftParams {
                max_k: 2,
                adaptive: false,
            },
            &mut sl,
            64,
        );
        acc = (
            acc.0 + st.escalation.accepted,
            acc.1 + st.escalation.drafted,
        );
        g.tokens
    });
    // The draft's own distribution: the source with every off-list logit removed, which a
    // k = 1 round with the list's tokens never rejected would give. Sampled here from the
    // source's logits restricted to the list.
    let restricted = common::token_counts(n, |s| {
        let params = common::sampled_params(1_000_000 + s, 3);
        let mut sampler = synapse_runtime::Sampler::new(params.sampling.clone()).unwrap();
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
        kv.open(0).unwrap();
        let mut ex = Executor::new(model.clone(), 1).unwrap();
        let mut out = Vec::new();
        let mut rows: Vec<Row> = common::prompt_rows(prompt);
        let mut history = prompt.to_vec();
        for pos in prompt.len() as u32..prompt.len() as u32 + 3 {
            let l = ex.forward(&mut kv, &rows).unwrap();
            let mut last = l[l.len() - model.vocab()..].to_vec();
            for v in &mut last[size..] {
                *v = f32::NEG_INFINITY;
            }
            let t = sampler.sample(&mut last, &history);
            out.push(t);
            history.push(t);
            rows = vec![Row::decode(0, pos, t)];
        }
        out
    });
    for at in [1, 2] {
        let z_spec = common::homogeneity_z(&plain_src, &spec, at);
        let z_draft = common::homogeneity_z(&plain_src, &restricted, at);
        eprintln!(
            "position {at}: z(head draft vs plain) {z_spec:.2}, z(shortlist alone vs plain) {z_draft:.2}"
        );
        assert!(z_spec < 4.0, "position {at}: z {z_spec}");
        assert!(
            z_draft > 4.0,
            "position {at}: the shortlist's own distribution was not told apart (z {z_draft})"
        );
    }
    assert!(acc.0 > 0 && acc.0 < acc.1, "{acc:?}");
}
