//! llama.cpp's own tokenizer test suite (`models/ggml-vocab-*.gguf` + `.inp`/`.out`), run the way
//! `tests/test-tokenizer-0.cpp` runs it: `add_special = false`, `parse_special = false`.
//! Fetch it with `cargo xtask vocab-suite`.

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
    let mut in_scope = 0;
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let f = GgufFile::open(path).unwrap();
        let tok = match Tokenizer::from_gguf(&f) {
            Ok(t) => t,
            Err(e @ TokenizerError::UnsupportedModel { .. }) => {
                println!("{name:34} out of scope: {e}");
                continue;
            }
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        in_scope += 1;
        let cases = cases(path);
        let mut ok = 0;
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
            // Round trip through the detokenizer must not panic, and must reproduce the input
            // for lossless vocabularies where llama.cpp does (checked loosely: no error).
            tok.detokenize(&got, false, false).unwrap();
        }
        println!(
            "{name:34} pre={:16} cases={:3} pass={ok:3}",
            tok.pre_name(),
            cases.len()
        );
    }
    assert!(
        in_scope >= 14,
        "expected at least 14 in-scope vocabularies, found {in_scope}"
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
