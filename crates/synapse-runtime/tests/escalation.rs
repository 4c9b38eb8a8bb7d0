//! Exact escalation (`escalation::generate_exact`): drafts from an approximate profile,
//! verified by the source precision, give the source's own greedy tokens — on the three real
//! models over many prompts, and on the tiny models over random draft profiles and `k`.
//! The verify pass's rows are the one-row decode's bits, logits included.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use synapse_codecs::EncodingId;
use synapse_runtime::escalation::{DraftParams, generate_exact};
use synapse_runtime::importance::linears;
use synapse_runtime::precision::{Precision, apply};
use synapse_runtime::{
    Executor, GenerateParams, Generated, KvCache, KvDtype, Model, Row, RuntimeError, StopReason,
    generate,
};
use synapse_tokenizer::Tokenizer;

fn tokenizer(path: &Path) -> Tokenizer {
    let f = synapse_formats::gguf::GgufFile::open(path).unwrap();
    Tokenizer::from_gguf(&f).unwrap()
}

fn variant(model: &Arc<Model>, spec: &str) -> Arc<Model> {
    apply(model, &Precision::parse_profile(spec).unwrap(), None)
        .unwrap()
        .model
}

/// Plain source greedy generation in a fresh cache: tokens, stop, and the slot's tokens after.
fn plain(model: &Arc<Model>, prompt: &[u32], params: &GenerateParams) -> (Generated, Vec<u32>) {
    let mut kv = KvCache::new(model, KvDtype::F32, 1, 512, 64).unwrap();
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
    let held = kv.tokens(0).unwrap().to_vec();
    (g, held)
}

/// The same with drafts from `draft`.
fn drafted(
    model: &Arc<Model>,
    draft: &Arc<Model>,
    prompt: &[u32],
    params: &GenerateParams,
    dp: &DraftParams,
) -> (
    Generated,
    Vec<u32>,
    synapse_runtime::escalation::EscalationStats,
) {
    let mut kv = KvCache::new(model, KvDtype::F32, 2, 512, 64).unwrap();
    let mut src = Executor::new(model.clone(), 2).unwrap();
    let mut dra = Executor::new(draft.clone(), 1).unwrap();
    let (g, st) = generate_exact(
        &mut src,
        &mut dra,
        &mut kv,
        0,
        1,
        prompt,
        params,
        dp,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    let held = kv.tokens(0).unwrap().to_vec();
    (g, held, st)
}

const PROMPTS: [&str; 18] = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old \
     woodcutter and his three daughters. Every morning the woodcutter",
    "def fibonacci(n):",
    "Hi",
    "The three primary colors are red, blue and",
    "Write a haiku about the sea.",
    "import numpy as np\n\ndef softmax(x):\n",
    "Q: What is the boiling point of water at sea level?\nA:",
    "The quick brown fox",
    "In 1969, the first humans",
    "SELECT name, COUNT(*) FROM users",
    "Dear Sir or Madam,\n\nI am writing to",
    "The mitochondria is",
    "fn main() {\n    let v: Vec<u32> =",
    "Photosynthesis converts light energy into",
    "A list of prime numbers: 2, 3, 5, 7,",
    "The meaning of life is",
];

/// Every prompt, greedy, 20 tokens: the drafted run's tokens, stop and committed K/V
/// positions equal plain source decoding. Adaptive and fixed `k` alternate.
fn check_model(path: &Path, draft_spec: &str) -> (usize, usize) {
    let model = Arc::new(Model::load(path).unwrap());
    let draft = variant(&model, draft_spec);
    assert_ne!(draft.profile.hash(), model.profile.hash());
    let tok = tokenizer(path);
    let params = GenerateParams {
        max_tokens: 20,
        ..GenerateParams::default()
    };
    let (mut drafted_n, mut accepted_n) = (0, 0);
    for (i, text) in PROMPTS.iter().enumerate() {
        let prompt = tok.encode(text, true, false).unwrap();
        let (want, want_kv) = plain(&model, &prompt, &params);
        let dp = DraftParams {
            max_k: 1 + i % 8,
            adaptive: i % 2 == 0,
        };
        let (got, got_kv, st) = drafted(&model, &draft, &prompt, &params, &dp);
        assert_eq!(
            got.tokens, want.tokens,
            "{path:?} prompt {i} {text:?} {dp:?}"
        );
        assert_eq!(got.stop, want.stop, "prompt {i}");
        assert_eq!(got_kv, want_kv, "committed K/V positions, prompt {i}");
        assert!(st.accepted <= st.drafted);
        drafted_n += st.drafted;
        accepted_n += st.accepted;
    }
    eprintln!(
        "{path:?} draft {draft_spec}: {accepted_n}/{drafted_n} drafts accepted over {} prompts",
        PROMPTS.len()
    );
    (drafted_n, accepted_n)
}

#[test]
fn quantized_draft_greedy_equivalent() {
    let models = [
        (common::default_model(), "uniform:syn.q4.symmetric.g64.v1"),
        (
            common::known_model("qwen2.5-coder-0.5b-instruct"),
            "uniform:syn.q3.symmetric.g64.v1",
        ),
        (
            common::known_model("smollm2-135m-instruct"),
            "uniform:syn.q8.symmetric.g64.v1",
        ),
    ];
    for (path, spec) in models {
        if !common::require(&path, "a real model") {
            continue;
        }
        let (drafted, accepted) = check_model(&path, spec);
        // Drafting ran, and was neither always right nor always wrong enough to skip paths.
        assert!(drafted > 0 && accepted > 0, "{path:?}");
    }
}

/// k + 1 rows of one session in one pass, each in the one-row order, give the logits of
/// k + 1 one-row decode steps bit for bit (the LM head included).
#[test]
fn verify_rows_are_one_row_decode_steps() {
    for family in ["llama", "qwen2", "gemma3"] {
        let Some((model, toks)) = common::tiny_q8_model(family) else {
            return;
        };
        let vocab = model.vocab();
        let (prompt, tail) = toks.split_at(5);
        let tail = &tail[..9];
        let run = |steps: &[&[u32]]| -> Vec<f32> {
            let mut kv = KvCache::new(&model, KvDtype::F32, 1, 64, 16).unwrap();
            kv.open(0).unwrap();
            let mut ex = Executor::new(model.clone(), 2).unwrap();
            ex.forward(&mut kv, &common::all_logit_rows(prompt))
                .unwrap();
            let mut pos = prompt.len() as u32;
            let mut out = Vec::new();
            for s in steps {
                let rows: Vec<Row> = s
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| Row::decode(0, pos + i as u32, t))
                    .collect();
                out.extend_from_slice(ex.forward(&mut kv, &rows).unwrap());
                pos += s.len() as u32;
            }
            out
        };
        let one: Vec<&[u32]> = tail.chunks(1).collect();
        let want = run(&one);
        for cut in [&[9usize][..], &[4, 5], &[2, 3, 4], &[1, 8]] {
            let mut steps = Vec::new();
            let mut at = 0;
            for &c in cut {
                steps.push(&tail[at..at + c]);
                at += c;
            }
            let got = run(&steps);
            assert_eq!(got.len(), tail.len() * vocab);
            let diff = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(diff, 0, "{family} cut {cut:?}");
        }
    }
}

#[test]
fn stops_and_context_end_where_plain_decoding_ends() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let draft = variant(&model, "uniform:syn.q3.symmetric.g64.v1");
    let prompt = &toks[..7];
    // Context end: a 24-position cache.
    let params = GenerateParams {
        max_tokens: 100,
        stop_at_eog: false,
        ..GenerateParams::default()
    };
    let mut kv = KvCache::new(&model, KvDtype::F32, 1, 24, 8).unwrap();
    let mut ex = Executor::new(model.clone(), 1).unwrap();
    let want = generate(
        &mut ex,
        &mut kv,
        0,
        prompt,
        &params,
        &mut |_| String::new(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(want.stop, StopReason::ContextFull);
    let want_kv = kv.tokens(0).unwrap().to_vec();
    for k in [1, 3, 7] {
        let mut kv = KvCache::new(&model, KvDtype::F32, 2, 24, 8).unwrap();
        let mut dr = Executor::new(draft.clone(), 1).unwrap();
        let (got, _) = generate_exact(
            &mut ex,
            &mut dr,
            &mut kv,
            0,
            1,
            prompt,
            &params,
            &DraftParams {
                max_k: k,
                adaptive: false,
            },
            &mut |_| String::new(),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(got.tokens, want.tokens, "k {k}");
        assert_eq!(got.stop, StopReason::ContextFull);
        assert_eq!(kv.tokens(0).unwrap(), &want_kv[..]);
    }
    // Stop strings on the token ids' text: stop at the 6th token's text.
    let piece = |t: u32| format!("<{t}>");
    let full = plain(&model, prompt, &params).0.tokens;
    let params = GenerateParams {
        max_tokens: 30,
        stop: vec![format!("<{}><{}>", full[5], full[6])],
        stop_at_eog: false,
        ..GenerateParams::default()
    };
    let mut kv = KvCache::new(&model, KvDtype::F32, 2, 64, 16).unwrap();
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
        let mut kv = KvCache::new(&model, KvDtype::F32, 2, 64, 16).unwrap();
        let mut dr = Executor::new(draft.clone(), 1).unwrap();
        let mut text = String::new();
        let (got, _) = generate_exact(
            &mut ex,
            &mut dr,
            &mut kv,
            0,
            1,
            prompt,
            &params,
            &DraftParams {
                max_k: k,
                adaptive: false,
            },
            &mut { piece },
            &mut |s| text.push_str(s),
        )
        .unwrap();
        assert_eq!(got.tokens, want.tokens);
        assert_eq!(got.stop, StopReason::StopString);
        assert_eq!(text, text_plain);
    }
}

#[test]
fn what_exact_escalation_cannot_do_is_refused_before_it_runs() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let Some((other, _)) = common::tiny_q8_model("qwen2") else {
        return;
    };
    let mut kv = KvCache::new(&model, KvDtype::F32, 2, 64, 16).unwrap();
    let mut src = Executor::new(model.clone(), 1).unwrap();
    let mut dr = Executor::new(model.clone(), 1).unwrap();
    let mut run = |dr: &mut Executor, slot2, params: &GenerateParams, k| {
        generate_exact(
            &mut src,
            dr,
            &mut kv,
            0,
            slot2,
            &toks[..4],
            params,
            &DraftParams {
                max_k: k,
                adaptive: true,
            },
            &mut |_| String::new(),
            &mut |_| {},
        )
        .map(|_| ())
    };
    let greedy = GenerateParams::default();
    let msg = |r: Result<(), RuntimeError>| r.unwrap_err().to_string();
    assert!(msg(run(&mut dr, 0, &greedy, 4)).contains("slot of its own"));
    assert!(msg(run(&mut dr, 1, &greedy, 0)).contains("outside 1..=16"));
    assert!(msg(run(&mut dr, 1, &greedy, 17)).contains("outside 1..=16"));
    let mut wrong = Executor::new(other, 1).unwrap();
    assert!(msg(run(&mut wrong, 1, &greedy, 4)).contains("another model"));
    // The same executor twice as its own draft is fine: every draft is accepted.
    run(&mut dr, 1, &greedy, 4).unwrap();
}

/// A random draft profile: each linear keeps its source encoding or takes a random Synapse
/// codec.
fn random_profile(model: &Model, picks: &[u8]) -> BTreeMap<String, EncodingId> {
    let ladder = [
        EncodingId::Symmetric { bits: 8, group: 64 },
        EncodingId::Symmetric { bits: 5, group: 64 },
        EncodingId::Symmetric { bits: 4, group: 64 },
        EncodingId::Symmetric { bits: 3, group: 64 },
        EncodingId::Symmetric { bits: 2, group: 64 },
        EncodingId::TernaryGroup { group: 64 },
    ];
    linears(model)
        .into_iter()
        .zip(picks.iter().cycle())
        .filter_map(|((n, _), &p)| ladder.get(p as usize % (ladder.len() + 2)).map(|e| (n, *e)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn any_draft_profile_and_k_give_the_source_tokens(
        family in 0usize..3,
        picks in proptest::collection::vec(any::<u8>(), 1..40),
        k in 1usize..=16,
        adaptive in any::<bool>(),
        start in 0usize..40,
        len in 1usize..12,
        max_tokens in 1usize..40,
    ) {
        let fam = ["llama", "qwen2", "gemma3"][family];
        let Some((model, toks)) = common::tiny_q8_model(fam) else { return Ok(()); };
        let changes = random_profile(&model, &picks);
        let draft = if changes.is_empty() {
            model.clone()
        } else {
            Arc::new(model.with_encodings(&changes).unwrap())
        };
        let start = start % (toks.len() - len);
        let prompt = &toks[start..start + len];
        let params = GenerateParams { max_tokens, stop_at_eog: false, ..GenerateParams::default() };
        let (want, want_kv) = plain(&model, prompt, &params);
        let (got, got_kv, st) =
            drafted(&model, &draft, prompt, &params, &DraftParams { max_k: k, adaptive });
        prop_assert_eq!(&got.tokens, &want.tokens);
        prop_assert_eq!(got.stop, want.stop);
        prop_assert_eq!(got_kv, want_kv);
        prop_assert!(st.accepted <= st.drafted);
    }
}

/// Speculative sampling's output is a function of the seed alone: the same with any `k`,
/// adaptive or fixed, run twice; a different seed gives other tokens.
#[test]
fn speculative_sampling_is_reproducible_and_independent_of_k() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let draft = variant(&model, "uniform:syn.q3.symmetric.g64.v1");
    let prompt = &toks[..6];
    let mut params = common::sampled_params(7, 24);
    params.sampling.repetition_penalty = 1.3;
    let runs: Vec<Vec<u32>> = [(1, false), (4, false), (16, false), (8, true), (8, true)]
        .into_iter()
        .map(|(k, adaptive)| {
            drafted(
                &model,
                &draft,
                prompt,
                &params,
                &DraftParams { max_k: k, adaptive },
            )
            .0
            .tokens
        })
        .collect();
    for r in &runs[1..] {
        assert_eq!(r, &runs[0]);
    }
    let other = drafted(
        &model,
        &draft,
        prompt,
        &common::sampled_params(8, 24),
        &DraftParams::default(),
    )
    .0
    .tokens;
    assert_ne!(other, runs[0]);
}

/// Speculative sampling draws from the source's distribution: over 1500 seeds, the tokens at
/// output positions 1 and 2 are distributed as plain sampling's (a chi-square homogeneity
/// test, z < 4, i.e. p > 3·10⁻⁵), while plain sampling of the draft model itself is told
/// apart by the same test (so the test has the power to see a wrong distribution).
#[test]
fn speculative_sampling_preserves_the_source_distribution() {
    let Some((model, toks)) = common::tiny_q8_model("llama") else {
        return;
    };
    let draft = variant(&model, "uniform:syn.q2.symmetric.g64.v1");
    let prompt = &toks[..6];
    let n = 1500;
    let plain_src = common::token_counts(n, |s| {
        plain(&model, prompt, &common::sampled_params(s, 3))
            .0
            .tokens
    });
    let plain_draft = common::token_counts(n, |s| {
        plain(&draft, prompt, &common::sampled_params(1_000_000 + s, 3))
            .0
            .tokens
    });
    let mut acc = (0, 0);
    let spec = common::token_counts(n, |s| {
        let (g, _, st) = drafted(
            &model,
            &draft,
            prompt,
            &common::sampled_params(2_000_000 + s, 3),
            &DraftParams {
                max_k: 4,
                adaptive: false,
            },
        );
        acc = (acc.0 + st.accepted, acc.1 + st.drafted);
        g.tokens
    });
    for at in [1, 2] {
        let z_spec = common::homogeneity_z(&plain_src, &spec, at);
        let z_draft = common::homogeneity_z(&plain_src, &plain_draft, at);
        eprintln!(
            "position {at}: z(speculative vs plain) {z_spec:.2}, z(draft vs plain) {z_draft:.2}"
        );
        assert!(z_spec < 4.0, "position {at}: z {z_spec}");
        assert!(
            z_draft > 4.0,
            "position {at}: the draft's own distribution was not told apart (z {z_draft})"
        );
    }
    // Drafts were both accepted and rejected.
    assert!(acc.0 > 0 && acc.0 < acc.1, "{acc:?}");
}
