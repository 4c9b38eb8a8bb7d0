//! Precision profiles: which encoding each weight runs in.
//!
//! The executor never decides encodings itself: it asks the profile. Today the loader builds
//! the profile of the source encodings ([`PrecisionProfile::source`]); the selector ring will
//! supply others (mixed precision, escalation) through the same type. The profile's hash is
//! part of the KV identity, because a different precision gives different keys and values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use synapse_model::ModelIr;

/// Tensor name → encoding name (ggml type names for GGUF encodings, e.g. `Q4_K`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecisionProfile {
    /// Encoding per tensor name.
    pub encodings: BTreeMap<String, String>,
}

impl PrecisionProfile {
    /// Every weight in its source encoding.
    pub fn source(ir: &ModelIr) -> Self {
        PrecisionProfile {
            encodings: ir
                .weights
                .iter()
                .map(|w| (w.name.clone(), w.encoding.name().to_string()))
                .collect(),
        }
    }

    /// The encoding assigned to a tensor.
    pub fn encoding(&self, name: &str) -> Option<&str> {
        self.encodings.get(name).map(String::as_str)
    }

    /// Stable BLAKE3 hash (hex) of the assignment (a `BTreeMap`, so order-independent).
    pub fn hash(&self) -> String {
        let mut h = blake3::Hasher::new();
        for (k, v) in &self.encodings {
            h.update(&(k.len() as u64).to_le_bytes());
            h.update(k.as_bytes());
            h.update(&(v.len() as u64).to_le_bytes());
            h.update(v.as_bytes());
        }
        h.finalize().to_hex().to_string()
    }
}
