//! Shared helpers for the integration tests: where test data lives and the skip/CI rule.
#![allow(dead_code)]

use std::path::PathBuf;

fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        })
        .join("synapse")
}

/// llama.cpp's vocab suite: `$SYNAPSE_VOCAB_SUITE_DIR`, else `$XDG_CACHE_HOME/synapse/vocab-suite`.
pub fn suite_dir() -> PathBuf {
    std::env::var_os("SYNAPSE_VOCAB_SUITE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("vocab-suite"))
}

/// The default model: `$SYNAPSE_MODEL_DIR/gemma-3-270m-q4_k_m.gguf`.
pub fn gemma_path() -> PathBuf {
    std::env::var_os("SYNAPSE_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("models"))
        .join("gemma-3-270m-q4_k_m.gguf")
}

/// Test data missing: skip with a printed reason, except under CI (then fail).
pub fn skip_or_fail(what: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{what} is missing under CI: .ci/fetch-test-data should have fetched it");
    }
    eprintln!("SKIPPED: {what} is missing (run .ci/fetch-test-data)");
}

/// The fixtures folder of this repository.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer")
}
