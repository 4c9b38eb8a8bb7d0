//! `synapse-testdata`: where the integration tests find the test data that only package
//! registries carry (the published real models and llama.cpp's vocab suite, fetched by
//! `.ci/fetch-test-data`), and the one rule for when it is absent: skip with a printed reason
//! locally, fail when `CI` is set.
//!
//! Paths are resolved the way the fetchers store them: models through `synapse-source`
//! ([`synapse_source::models_dir`]: `$SYNAPSE_MODEL_DIR`, else `$XDG_CACHE_HOME/synapse/models`,
//! else `~/.cache/synapse/models`), the vocab suite as `cargo xtask vocab-suite` does.
//!
//! Dev-only: crates use it as a dev-dependency, never from their library code.
//!
//! ```no_run
//! let path = synapse_testdata::model("smollm2-135m-instruct");
//! if !synapse_testdata::require(&path, "SmolLM2-135M-Instruct") {
//!     return; // skipped (printed `SKIPPED: …`); under `CI` this panicked instead
//! }
//! // … open `path` …
//! ```
#![deny(missing_docs)]

pub mod synthetic_bitnet;
pub mod synthetic_moe;

use std::path::{Path, PathBuf};

/// The name (in [`synapse_source::KNOWN_MODELS`]) of the default model, Gemma 3 270M Q4_K_M.
pub const DEFAULT_MODEL: &str = "gemma-3-270m";

/// Environment variable naming a model file that [`default_model`] returns instead of the cached
/// default model.
pub const MODEL_ENV: &str = "SYNAPSE_MODEL";

/// The mixture-of-experts families among the committed tiny-model fixtures
/// (`fixtures/tiny/<family>/`, made by `cargo xtask tiny-models`).
pub const TINY_MOE_FAMILIES: [&str; 4] = ["olmoe", "granitemoe", "qwen2moe", "mixtral"];

/// The BitNet b1.58 tiny-model fixtures: `bitnet` (SiLU, tied: llama.cpp's `bitnet` graph,
/// GGUFs in F32, TQ1_0 and TQ2_0) and `bitnet-relu2` (microsoft/bitnet-b1.58-2B-4T's graph:
/// ReLU², untied; transformers only, so no GGUF) and `bitnet-w158a8` (that graph with its
/// `quantization_config`: W1.58A8 over the masters, as transformers' `AutoBitLinear` runs it;
/// transformers only) and `bitnet-packed` (the same numerics over the projections stored packed
/// as microsoft/bitnet-b1.58-2B-4T ships them: transformers' offline `BitLinear`, `uint8` four
/// rows a byte with a BF16 `weight_scale`). All store BF16 safetensors (but the packed bytes).
pub const TINY_BITNET_FAMILIES: [&str; 4] =
    ["bitnet", "bitnet-relu2", "bitnet-w158a8", "bitnet-packed"];

/// Every committed tiny-model fixture family: the dense ones, then [`TINY_MOE_FAMILIES`],
/// then [`TINY_BITNET_FAMILIES`].
pub const TINY_FAMILIES: [&str; 11] = [
    "llama",
    "qwen2",
    "gemma3",
    TINY_MOE_FAMILIES[0],
    TINY_MOE_FAMILIES[1],
    TINY_MOE_FAMILIES[2],
    TINY_MOE_FAMILIES[3],
    TINY_BITNET_FAMILIES[0],
    TINY_BITNET_FAMILIES[1],
    TINY_BITNET_FAMILIES[2],
    TINY_BITNET_FAMILIES[3],
];

/// The GGUF files of tiny fixture `family` (`model.<type>.gguf` in its folder), the F32 one
/// first: F32 and Q8_0, BitNet's F32, TQ1_0 and TQ2_0, bitnet.cpp's I2_S conversion of
/// `bitnet-packed`'s checkpoint (its `bitnet-b1.58` architecture; F32 embedding and head), none
/// for `bitnet-relu2` and `bitnet-w158a8`.
pub fn tiny_ggufs(family: &str) -> &'static [&'static str] {
    match family {
        "bitnet" => &["model.f32.gguf", "model.tq1_0.gguf", "model.tq2_0.gguf"],
        "bitnet-packed" => &["model.i2_s.gguf"],
        "bitnet-relu2" | "bitnet-w158a8" => &[],
        _ => &["model.f32.gguf", "model.q8_0.gguf"],
    }
}

/// Environment variable overriding [`vocab_suite_dir`].
pub const VOCAB_SUITE_DIR_ENV: &str = "SYNAPSE_VOCAB_SUITE_DIR";

/// Where `synapse-source` keeps (or will fetch) the published model `name` — a name of
/// [`synapse_source::KNOWN_MODELS`] (`gemma-3-270m`, `qwen2.5-coder-0.5b-instruct`,
/// `smollm2-135m-instruct`) or its file name. `$SYNAPSE_MODEL` is not consulted: this is always
/// that exact file.
///
/// # Panics
/// If `name` is not a known model, or no cache directory can be found (neither
/// `SYNAPSE_MODEL_DIR`, `XDG_CACHE_HOME` nor `HOME` is set).
#[track_caller]
pub fn model(name: &str) -> PathBuf {
    let m = synapse_source::known_model(name)
        .unwrap_or_else(|| panic!("{name:?} is not a model of synapse_source::KNOWN_MODELS"));
    synapse_source::models_dir()
        .expect("a model cache directory (set SYNAPSE_MODEL_DIR, XDG_CACHE_HOME or HOME)")
        .join(m.file_name)
}

/// The default real model: `$SYNAPSE_MODEL` if set (any model file), else
/// [`model`]`(`[`DEFAULT_MODEL`]`)`. Tests that check facts of Gemma 3 270M's own file (tensor
/// count, vocabulary) use [`model`] instead.
pub fn default_model() -> PathBuf {
    match std::env::var_os(MODEL_ENV).filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => model(DEFAULT_MODEL),
    }
}

/// The calibration / evaluation text (`cargo xtask text-corpus`): `$XDG_CACHE_HOME/synapse/
/// text/python3.11-doc`, else `~/.cache/synapse/text/python3.11-doc` (`calibration.txt`,
/// `evaluation.txt`, `manifest.json`).
pub fn text_corpus_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("synapse").join("text").join("python3.11-doc")
}

/// llama.cpp's tokenizer test suite (`ggml-vocab-*.gguf` + `.inp`/`.out`, `templates/`):
/// `$SYNAPSE_VOCAB_SUITE_DIR`, else `$XDG_CACHE_HOME/synapse/vocab-suite`, else
/// `~/.cache/synapse/vocab-suite` (where `cargo xtask vocab-suite` puts it).
pub fn vocab_suite_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(VOCAB_SUITE_DIR_ENV) {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("synapse").join("vocab-suite")
}

/// Whether the test data `what` (a short description, e.g. "the default model") is at `path`.
///
/// Present: `true`. Absent: when the `CI` environment variable is set this panics (CI runs
/// `.ci/fetch-test-data` first, so every test must run); otherwise it prints
/// `SKIPPED: <what> not found at <path> …` to stderr and returns `false`, and the caller
/// returns early.
///
/// # Panics
/// If `path` does not exist and `CI` is set.
#[track_caller]
pub fn require(path: &Path, what: &str) -> bool {
    if path.exists() {
        return true;
    }
    let msg = format!("{what} not found at {}", path.display());
    if std::env::var_os("CI").is_some() {
        panic!("{msg}: CI is set, so this test must run (.ci/fetch-test-data fetches it)");
    }
    eprintln!("SKIPPED: {msg} (run .ci/fetch-test-data)");
    false
}

/// The token sequences of a tiny-model fixture directory (`oracle.json`'s `sequences`).
/// Panics on a malformed fixture (committed data).
pub fn tiny_sequences(dir: &Path) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(dir.join("oracle.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("oracle.json").display()));
    let oracle: serde_json::Value = serde_json::from_str(&text).expect("oracle.json is JSON");
    oracle["sequences"]
        .as_array()
        .expect("oracle.json has sequences")
        .iter()
        .map(|s| {
            s.as_array()
                .expect("a sequence is an array")
                .iter()
                .map(|x| x.as_u64().expect("token ids are integers") as u32)
                .collect()
        })
        .collect()
}
