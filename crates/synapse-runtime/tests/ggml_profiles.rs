//! `--profile uniform:ggml.<type>.v1` is llama.cpp's own re-quantization: SmolLM2-135M-Instruct
//! (Q4_1) re-encoded to each ggml type Synapse encodes (legacy and K-quants) holds, tensor for
//! tensor, the bytes of llama.cpp's `llama-quantize --allow-requantize --pure` of the same file
//! (per-tensor sha256 from `cargo xtask requant-digests`, `fixtures/requant/`), and runs as that
//! type's matrices; the profile's sessions are bit-identical alone and beside each other like
//! any model's; and for the legacy types they compute llama.cpp's own logits and greedy tokens
//! on that re-quantized file, bit for bit. A K-quant takes only matrices whose rows are whole
//! 256-element super-blocks
//! (SmolLM2's `ffn_down`): llama.cpp stores the rest in a legacy type instead, the profile leaves
//! them at the source.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};
use synapse_codecs::{EncodingId, GgmlBlock};
use synapse_kernels::Encoding;
use synapse_runtime::precision::{Precision, apply};
use synapse_runtime::{Executor, KvCache, KvDtype, Model, Row};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// SmolLM2-135M-Instruct's path and its re-quantization fixture (`None`: the model is absent
/// outside CI).
fn model_and_fixture() -> Option<(std::path::PathBuf, Value)> {
    let path = common::known_model("smollm2-135m-instruct");
    if !common::require(&path, "SmolLM2-135M-Instruct") {
        return None;
    }
    let fx = common::workspace_root().join("fixtures/requant/smollm2-135m-instruct-q4_1.json");
    let doc = serde_json::from_slice(&std::fs::read(&fx).unwrap()).unwrap();
    Some((path, doc))
}

#[test]
fn uniform_ggml_profiles_are_llama_cpps_requantization() {
    let Some((path, doc)) = model_and_fixture() else {
        return;
    };
    let src_sha = hex(&Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        doc["source"]["sha256"].as_str().unwrap(),
        src_sha,
        "the fixture was made from another file"
    );
    let model = Arc::new(Model::load(&path).unwrap());
    let mut model_mats: BTreeMap<String, Arc<synapse_kernels::QuantMatrix>> =
        synapse_runtime::importance::linears(&model)
            .into_iter()
            .collect();
    if let Some(h) = model_mats.remove("output.weight") {
        model_mats.entry("token_embd.weight".into()).or_insert(h);
    }
    for b in GgmlBlock::ALL {
        let want = &doc["types"][b.name()]["tensors"];
        let id = EncodingId::Ggml(b);
        let applied = apply(&model, &Precision::Uniform(id), None).unwrap();
        let m = &applied.model;
        let mut seen = 0;
        let mut mats: BTreeMap<String, Arc<synapse_kernels::QuantMatrix>> =
            synapse_runtime::importance::linears(m)
                .into_iter()
                .collect();
        // The tied head is the embedding table too: llama.cpp stores it as `token_embd`.
        if let Some(h) = mats.remove("output.weight") {
            mats.entry("token_embd.weight".into()).or_insert(h);
        }
        for (name, mat) in &mats {
            let w = &want[name.as_str()];
            assert!(w.is_object(), "{}: llama.cpp has no {name}", b.name());
            if mat.cols() % b.block_elems() != 0 {
                // llama.cpp's fallback type; the profile leaves the source's matrix.
                assert_ne!(w["type"].as_str().unwrap(), b.name(), "{name}");
                let src = &model_mats[name];
                assert!(
                    mat.encoding() == src.encoding() && mat.raw_bytes() == src.raw_bytes(),
                    "{}: {name} re-encoded",
                    b.name()
                );
                continue;
            }
            assert_eq!(w["type"].as_str().unwrap(), b.name(), "{name}");
            assert!(
                matches!(mat.encoding(), Encoding::Ggml(_)),
                "{name} runs as {:?}",
                mat.encoding()
            );
            assert_eq!(
                hex(&Sha256::digest(mat.raw_bytes())),
                w["sha256"].as_str().unwrap(),
                "{}: {name}: other bytes than llama.cpp's",
                b.name()
            );
            seen += 1;
        }
        // Every matrix llama.cpp re-quantized is one the profile re-encoded.
        let matrices = want
            .as_object()
            .unwrap()
            .values()
            .filter(|t| t["type"].as_str() == Some(b.name()))
            .count();
        assert_eq!(seen, matrices, "{}", b.name());
        eprintln!(
            "uniform:{id}: {seen} tensors, every one llama.cpp's bytes ({} weight bytes)",
            m.weight_bytes()
        );
    }
    // The profile's sessions: the same logits alone and in one pass together.
    let m = apply(
        &model,
        &Precision::Uniform(EncodingId::Ggml(GgmlBlock::Q4_0)),
        None,
    )
    .unwrap()
    .model;
    let prompts: [&[u32]; 2] = [&[1, 504, 3458, 282, 260, 3287], &[1, 9690, 28, 355]];
    let mut ex = Executor::new(m.clone(), 2).unwrap();
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut kv = KvCache::new(&m, KvDtype::F32, 1, 64, 64).unwrap();
            kv.open(0).unwrap();
            ex.forward(&mut kv, &common::prompt_rows(p))
                .unwrap()
                .to_vec()
        })
        .collect();
    let mut kv = KvCache::new(&m, KvDtype::F32, 2, 64, 64).unwrap();
    kv.open(0).unwrap();
    kv.open(1).unwrap();
    let mut rows: Vec<Row> = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        rows.extend(common::prompt_rows(p).into_iter().map(|mut r| {
            r.slot = s as _;
            r
        }));
    }
    let together = ex.forward(&mut kv, &rows).unwrap().to_vec();
    let v = m.vocab();
    for (s, a) in alone.iter().enumerate() {
        assert_eq!(&together[s * v..(s + 1) * v], &a[..], "session {s}");
    }
}

/// A uniform profile of a legacy type runs as llama.cpp runs its own re-quantization: on two
/// prompts the last position's logits (all of them, by sha256 of their bytes) and 16 greedy
/// tokens equal what llama.cpp computed on the `llama-quantize --pure` file in its exact
/// configuration (`cargo xtask requant-digests`).
#[test]
fn uniform_ggml_profiles_compute_llama_cpps_logits_on_its_requantization() {
    let Some((path, doc)) = model_and_fixture() else {
        return;
    };
    let model = Arc::new(Model::load(&path).unwrap());
    let mut checked = 0;
    for b in GgmlBlock::ALL {
        let Some(runs) = doc["types"][b.name()]["runs"].as_array() else {
            continue;
        };
        let m = apply(&model, &Precision::Uniform(EncodingId::Ggml(b)), None)
            .unwrap()
            .model;
        let mut ex = Executor::new(m.clone(), 2).unwrap();
        for run in runs {
            let prompt: Vec<u32> = run["prompt"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let want: Vec<u32> = run["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let mut kv = KvCache::new(&m, KvDtype::F32, 1, 64, 64).unwrap();
            kv.open(0).unwrap();
            let first = ex
                .forward(&mut kv, &common::prompt_rows(&prompt))
                .unwrap()
                .to_vec();
            let bytes: Vec<u8> = first.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(
                hex(&Sha256::digest(&bytes)),
                run["logits_sha256"].as_str().unwrap(),
                "{}: {prompt:?}: the prompt's logits are not llama.cpp's",
                b.name()
            );
            let argmax = |l: &[f32]| {
                l.iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |a, (i, &v)| if v > a.1 { (i, v) } else { a },
                    )
                    .0 as u32
            };
            let mut got = vec![argmax(&first)];
            while got.len() < want.len() {
                let pos = (prompt.len() + got.len() - 1) as u32;
                let l = ex
                    .forward(&mut kv, &[Row::decode(0, pos, *got.last().unwrap())])
                    .unwrap()
                    .to_vec();
                got.push(argmax(&l));
            }
            assert_eq!(got, want, "{}: {prompt:?}", b.name());
            checked += 1;
        }
        eprintln!(
            "uniform:ggml.{}.v1: llama.cpp's logits and tokens",
            b.name()
        );
    }
    assert_eq!(checked, 10, "two prompts for each of the five legacy types");
}
