//! llama.cpp's own tokenizer test suite (`models/ggml-vocab-*.gguf` + `.inp`/`.out`), run the way
//! `tests/test-tokenizer-0.cpp` runs it: `add_special = false`, `parse_special = false`.
//! Fetch it with `cargo xtask vocab-suite`.
//!
//! Every vocabulary of the suite is named below: either in [`UNSUPPORTED`] (it must fail to load
//! with the typed error given there) or in [`ROUND_TRIP`] (it must load, encode every case to
//! llama.cpp's ids, and detokenize back as llama.cpp does). A vocabulary that breaks, one that
//! starts loading, one missing from the download, or a new one in the suite fails the test.

use std::path::Path;
use synapse_formats::gguf::GgufFile;
use synapse_tokenizer::{Tokenizer, TokenizerError};

/// Parses a `.inp`/`.out` pair into (text, expected ids) cases.
fn cases(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let mut inputs: Vec<String> = inp
        .split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect();
    if let Some(last) = inputs.last_mut()
        && let Some(s) = last.strip_suffix("\n__ggml_vocab_test__")
    {
        *last = s.to_string();
    }
    let mut outputs: Vec<&str> = out.split('\n').collect();
    if outputs.last() == Some(&"") {
        outputs.pop();
    }
    if inputs.len() == outputs.len() + 1
        && matches!(inputs.last().map(String::as_str), Some("") | Some("\n"))
    {
        inputs.pop();
    }
    assert_eq!(inputs.len(), outputs.len(), "{}", gguf.display());
    inputs
        .into_iter()
        .zip(outputs)
        .map(|(i, o)| {
            (
                i,
                o.split_whitespace().map(|x| x.parse().unwrap()).collect(),
            )
        })
        .collect()
}

/// The suite's vocabularies that Synapse does not implement, each with the `tokenizer.ggml.model`
/// that [`Tokenizer::from_gguf`] must reject as [`TokenizerError::UnsupportedModel`], and why.
const UNSUPPORTED: &[(&str, &str, &str)] = &[(
    "bert-bge",
    "bert",
    "WordPiece (BERT) vocabulary of an encoder-only embedding model (BGE): no generative model \
     Synapse runs uses it, and llama.cpp's WordPiece (lowercasing, accent stripping, `##` \
     continuations) is not implemented",
)];

/// How llama.cpp's `llama_detokenize(ids, remove_special = false, unparse_special = false)` of
/// the suite's ids compares with the input text.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RoundTrip {
    /// Every case comes back byte for byte (SentencePiece vocabularies included: the leading
    /// space the encoder adds is removed again by the detokenizer).
    Exact,
    /// `tokenizer.ggml.clean_spaces` (transformers' `clean_up_tokenization_spaces`) is set: the
    /// detokenizer removes a space before `?!.,` and before some contractions. In this suite
    /// that changes exactly the two cases with `😁 ?` (to `😁?`); every other case comes back
    /// byte for byte.
    CleanSpaces,
}

/// Every vocabulary of the suite that Synapse implements, with how llama.cpp round-trips it.
/// Measured with llama.cpp itself (llama-cpp-python 0.3.36, `vocab_only`: `llama_tokenize` of
/// each `.inp` case with `add_special = parse_special = false`, then `llama_detokenize`).
const ROUND_TRIP: &[(&str, RoundTrip)] = &[
    ("command-r", RoundTrip::Exact),
    ("deepseek-coder", RoundTrip::Exact),
    ("deepseek-llm", RoundTrip::Exact),
    ("falcon", RoundTrip::CleanSpaces),
    ("gemma-4", RoundTrip::CleanSpaces),
    ("gpt-2", RoundTrip::CleanSpaces),
    ("llama-bpe", RoundTrip::CleanSpaces),
    ("llama-spm", RoundTrip::Exact),
    ("mpt", RoundTrip::CleanSpaces),
    ("phi-3", RoundTrip::Exact),
    ("qwen2", RoundTrip::Exact),
    ("qwen35", RoundTrip::Exact),
    ("refact", RoundTrip::CleanSpaces),
    ("starcoder", RoundTrip::CleanSpaces),
];

/// What llama.cpp's detokenizer gives back for `text` (see [`RoundTrip`]). For
/// [`RoundTrip::CleanSpaces`] the only clean-up rule this suite's texts trigger is ` ?` → `?`
/// (llama.cpp's output for all 7 such vocabularies shows no other change), so that is all this
/// applies; the caller checks that it applies to exactly two cases.
fn llama_cpp_detokenized(text: &str, rt: RoundTrip) -> String {
    match rt {
        RoundTrip::Exact => text.to_string(),
        RoundTrip::CleanSpaces => text.replace(" ?", "?"),
    }
}

#[test]
fn llama_cpp_vocab_suite() {
    let dir = synapse_testdata::vocab_suite_dir();
    if !synapse_testdata::require(
        &dir.join("ggml-vocab-llama-spm.gguf.inp"),
        "the llama.cpp vocab suite",
    ) {
        return;
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "gguf") && p.with_extension("gguf.inp").exists()
        })
        .collect();
    files.sort();
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let name = file
            .strip_prefix("ggml-vocab-")
            .and_then(|n| n.strip_suffix(".gguf"))
            .unwrap()
            .to_string();
        seen.push(name.clone());
        let unsupported = UNSUPPORTED.iter().find(|u| u.0 == name);
        let round_trip = ROUND_TRIP.iter().find(|r| r.0 == name).map(|r| r.1);
        let f = GgufFile::open(path).unwrap();
        let loaded = Tokenizer::from_gguf(&f);
        let (tok, rt) = match (loaded, unsupported, round_trip) {
            (Err(TokenizerError::UnsupportedModel { model }), Some(&(_, want, why)), _) => {
                if model == want {
                    println!("{name:16} unsupported as expected (model `{model}`): {why}");
                } else {
                    failures.push(format!(
                        "{name}: expected UnsupportedModel {{ model: {want:?} }}, got model {model:?}"
                    ));
                }
                continue;
            }
            (Err(e), Some(&(_, want, _)), _) => {
                failures.push(format!(
                    "{name}: expected UnsupportedModel {{ model: {want:?} }}, got error {e:?}"
                ));
                continue;
            }
            (Ok(_), Some(_), _) => {
                failures.push(format!(
                    "{name}: listed in UNSUPPORTED but now loads: test it (move it to ROUND_TRIP)"
                ));
                continue;
            }
            (Err(e), None, _) => {
                failures.push(format!("{name}: failed to load: {e}"));
                continue;
            }
            (Ok(_), None, None) => {
                failures.push(format!(
                    "{name}: a vocabulary this test does not know: add it to ROUND_TRIP (or UNSUPPORTED)"
                ));
                continue;
            }
            (Ok(t), None, Some(rt)) => (t, rt),
        };
        let cases = cases(path);
        let (mut ok, mut rt_ok, mut cleaned) = (0, 0, 0);
        for (text, want) in &cases {
            let got = tok.encode(text, false, false).unwrap();
            if &got == want {
                ok += 1;
            } else {
                let msg = format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}");
                if std::env::var_os("SYNAPSE_SUITE_VERBOSE").is_some() {
                    println!("{msg}");
                }
                failures.push(msg);
            }
            let back = tok.detokenize(&got, false, false).unwrap();
            let expected = llama_cpp_detokenized(text, rt);
            if expected != *text {
                cleaned += 1;
            }
            if back == expected.as_bytes() {
                rt_ok += 1;
            } else {
                failures.push(format!(
                    "{name}: detokenize(encode(text)) is not what llama.cpp gives ({rt:?})\n  text {text:?}\n  want {expected:?}\n  got  {:?}",
                    String::from_utf8_lossy(&back)
                ));
            }
        }
        let want_cleaned = match rt {
            RoundTrip::Exact => 0,
            RoundTrip::CleanSpaces => 2,
        };
        if cleaned != want_cleaned {
            failures.push(format!(
                "{name}: {cleaned} cases changed by the clean-up, expected {want_cleaned}: the suite's texts changed"
            ));
        }
        println!(
            "{name:16} pre={:16} cases={:3} pass={ok:3} round-trip={rt_ok:3} ({rt:?})",
            tok.pre_name(),
            cases.len()
        );
    }
    for name in UNSUPPORTED
        .iter()
        .map(|u| u.0)
        .chain(ROUND_TRIP.iter().map(|r| r.0))
    {
        if !seen.iter().any(|s| s == name) {
            failures.push(format!(
                "{name}: named by this test but not in the suite at {}",
                dir.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
