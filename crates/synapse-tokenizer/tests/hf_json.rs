//! The `tokenizer.json` path.
//!
//! - Files written by transformers itself (`fixtures/tokenizer/hf/*/`, by `save_pretrained`; see
//!   `cargo xtask hf-tokenizer-fixtures`) must encode a set of texts to transformers' own ids.
//! - A HF tokenizer file written by this test from a suite vocabulary (tokens, merges, added
//!   tokens, pre-tokenizer as transformers serializes it) must tokenize llama.cpp's test cases
//!   exactly as llama.cpp does for the same vocabulary.

mod common;

use serde_json::{Value, json};
use synapse_formats::gguf::GgufFile;
use synapse_tokenizer::{Tokenizer, vocab::token_type, vocab_from_gguf};

const LLAMA3_HF: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn hf_json(gguf: &GgufFile, pre: Value) -> Value {
    let (v, _) = vocab_from_gguf(gguf).unwrap();
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, t) in v.tokens.iter().enumerate() {
        match v.token_types.get(i).copied() {
            Some(token_type::CONTROL) => {
                added.push(json!({"id": i, "content": t, "special": true}))
            }
            Some(token_type::USER_DEFINED) => {
                added.push(json!({"id": i, "content": t, "special": false}))
            }
            _ => {}
        }
        vocab.insert(t.clone(), json!(i));
    }
    json!({
        "added_tokens": added,
        "pre_tokenizer": pre,
        "model": {"type": "BPE", "vocab": vocab, "merges": v.merges},
    })
}

fn check(name: &str, pre: Value) {
    let dir = synapse_testdata::vocab_suite_dir();
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    if !synapse_testdata::require(&path, "the llama.cpp vocab suite") {
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let json_path = tmp.path().join("tokenizer.json");
    std::fs::write(
        &json_path,
        serde_json::to_string(&hf_json(&f, pre)).unwrap(),
    )
    .unwrap();
    let hf = Tokenizer::from_hf_tokenizer_json(&json_path).unwrap();
    let inp = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(path.with_extension("gguf.out")).unwrap();
    let texts: Vec<&str> = inp
        .split("\n__ggml_vocab_test__\n")
        .map(|t| t.strip_suffix("\n__ggml_vocab_test__").unwrap_or(t))
        .collect();
    let mut n = 0;
    for (text, want) in texts.iter().zip(out.lines()) {
        let want: Vec<u32> = want
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(
            hf.encode(text, false, false).unwrap(),
            want,
            "{name}: {text:?}"
        );
        n += 1;
    }
    assert!(n >= 40, "{name}: only {n} cases");
    println!("{name} via tokenizer.json: {n} cases pass");
}

#[test]
fn llama3_tokenizer_json_matches_llama_cpp() {
    check(
        "llama-bpe",
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_HF}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]}),
    );
}

#[test]
fn gpt2_tokenizer_json_matches_llama_cpp() {
    check(
        "gpt-2",
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}),
    );
}

/// A `fixtures/tokenizer/hf/<name>/` folder: `tokenizer.json` and `tokenizer_config.json` as
/// transformers' `save_pretrained` wrote them, and `expected.json` with transformers' ids.
fn check_transformers_fixture(name: &str, pre: &str) {
    let dir = common::fixtures().join("hf").join(name);
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let tok = Tokenizer::from_hf_tokenizer_json(&dir.join("tokenizer.json")).unwrap();
    assert_eq!(tok.pre_name(), pre, "{name}");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let cases = expected["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        // transformers always matches added tokens (`<s>`) in the text: `parse_special`.
        for (add_special, key) in [(false, "ids"), (true, "ids_with_special")] {
            let want = ids(&c[key]);
            let got = tok.encode(text, add_special, true).unwrap();
            if got != want {
                failures.push(format!(
                    "{text:?} (add_special {add_special})\n  transformers {want:?}\n  synapse      {got:?}"
                ));
            }
        }
    }
    assert!(cases.len() >= 40, "{name}: only {} cases", cases.len());
    assert!(
        failures.is_empty(),
        "{name} (transformers {}): {} of {} encodings differ:\n{}",
        expected["transformers"].as_str().unwrap(),
        failures.len(),
        2 * cases.len(),
        failures.join("\n")
    );
    println!(
        "{name}: {} texts encode to transformers {}' ids, with and without special tokens",
        cases.len(),
        expected["transformers"].as_str().unwrap()
    );
}

#[test]
fn transformers_sentencepiece_tokenizer_json_matches_transformers() {
    check_transformers_fixture("tiny-llama", "default");
}

#[test]
fn transformers_byte_level_tokenizer_json_matches_transformers() {
    check_transformers_fixture("tiny-bytelevel", "gpt-2");
}
