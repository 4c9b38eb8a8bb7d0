//! Shared helpers for the integration tests. Downloaded test data (the default model, the
//! vocab suite) and the skip/CI rule come from `synapse-testdata`.
#![allow(dead_code)]

use std::path::PathBuf;

/// The fixtures folder of this repository.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer")
}
