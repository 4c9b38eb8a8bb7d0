//! Shared helpers of the runtime's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Skips (printing why) when a needed file is absent, unless `CI` is set, where it fails.
pub fn require(path: &Path, what: &str) -> bool {
    if path.exists() {
        return true;
    }
    let msg = format!("{what} not found at {}", path.display());
    if std::env::var_os("CI").is_some() {
        panic!("{msg} (CI is set: this test must run)");
    }
    eprintln!("SKIPPED: {msg}");
    false
}

/// The default real model: `$SYNAPSE_MODEL`, else its place in the model cache (the path
/// `synapse-source` fetches it to: `$SYNAPSE_MODEL_DIR`, `$XDG_CACHE_HOME/synapse/models`,
/// `~/.cache/synapse/models`).
pub fn default_model() -> PathBuf {
    if let Some(p) = std::env::var_os("SYNAPSE_MODEL") {
        return PathBuf::from(p);
    }
    known_model("gemma-3-270m")
}

/// Where `synapse-source` keeps (or will fetch) the published model `name`.
pub fn known_model(name: &str) -> PathBuf {
    let m = synapse_source::known_model(name).expect("a known model name");
    synapse_source::models_dir()
        .expect("a model cache directory")
        .join(m.file_name)
}

/// The token sequences of a tiny-model fixture (`oracle.json`'s `sequences`).
pub fn tiny_sequences(dir: &Path) -> Vec<Vec<u32>> {
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    oracle["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// One prefill pass over `seq` in slot 0 from position 0, logits for every row.
pub fn all_logit_rows(seq: &[u32]) -> Vec<synapse_runtime::Row> {
    seq.iter()
        .enumerate()
        .map(|(i, &t)| synapse_runtime::Row {
            slot: 0,
            pos: i as u32,
            token: t,
            logits: true,
            order: synapse_runtime::OrderClass::of(seq.len()),
        })
        .collect()
}
