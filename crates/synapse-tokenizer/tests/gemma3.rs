//! The real Gemma 3 vocabulary (262,144 tokens) against llama.cpp's tokenizations of 250+
//! varied strings (`fixtures/tokenizer/gemma3_llamacpp.json`, `cargo xtask tokenizer-fixtures`).

mod common;

use serde::Deserialize;
use synapse_formats::gguf::GgufFile;
use synapse_tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Case {
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
    detok_hex: String,
}

#[derive(Deserialize)]
struct Fixture {
    n_strings: usize,
    cases: Vec<Case>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn gemma3_matches_llama_cpp() {
    let path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    if !synapse_testdata::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let fx: Fixture = serde_json::from_str(
        &std::fs::read_to_string(common::fixtures().join("gemma3_llamacpp.json")).unwrap(),
    )
    .unwrap();
    assert!(fx.n_strings >= 200);
    let f = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!((tok.bos(), tok.eos()), (Some(2), Some(1)));
    let mut bad = Vec::new();
    let mut ok_ids = 0;
    let mut ok_detok = 0;
    for c in &fx.cases {
        let got = tok.encode(&c.text, c.add_special, c.parse_special).unwrap();
        if got == c.ids {
            ok_ids += 1;
        } else {
            bad.push(format!(
                "encode {:?} add={} special={}\n  want {:?}\n  got  {:?}",
                c.text, c.add_special, c.parse_special, c.ids, got
            ));
        }
        let d = hex(&tok.detokenize(&c.ids, false, c.parse_special).unwrap());
        if d == c.detok_hex {
            ok_detok += 1;
        } else {
            bad.push(format!(
                "detokenize {:?}: want {} got {d}",
                c.ids, c.detok_hex
            ));
        }
    }
    println!(
        "gemma3: {} cases, encode pass {ok_ids}, detokenize pass {ok_detok}",
        fx.cases.len()
    );
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn gemma3_streaming_decoder_never_splits_characters() {
    let path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    if !synapse_testdata::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    // Rare characters fall back to <0xXX> byte tokens: a character spans several tokens.
    let text = "𓀀 𝔘 ᚠ 👨‍👩‍👧‍👦 日本語 naïve";
    let ids = tok.encode(text, false, false).unwrap();
    assert!(
        ids.iter()
            .any(|&i| tok.token_text(i).is_some_and(|t| t.starts_with("<0x"))),
        "expected byte fallback"
    );
    let mut d = tok.decoder();
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&d.push(id).unwrap());
    }
    out.push_str(&d.flush());
    assert!(!out.contains('\u{FFFD}'), "{out:?}");
    assert_eq!(out.trim_start(), text);
    assert_eq!(out, tok.decode(&ids).unwrap());
}
