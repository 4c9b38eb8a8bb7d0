//! The importance map: measured options per tensor, with calibration provenance, as versioned JSON.
//!
//! JSON shape (format version 1):
//!
//! ```json
//! {
//!   "format_version": 1,
//!   "provenance": {
//!     "model_fingerprint": "…", "calibration_hash": "…", "sample_count": 128,
//!     "codec_versions": ["syn.q4.symmetric.g64.v1", "…"]
//!   },
//!   "tensors": {
//!     "blk.0.attn_q.weight": {
//!       "source_encoding": "bf16", "source_bytes": 2048,
//!       "options": [ { "encoding": "syn.q8.symmetric.g64.v1", "bytes": 1056, "distortion": 1.2e-5 } ]
//!     }
//!   }
//! }
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use synapse_codecs::EncodingId;

use crate::calibration::Calibration;
use crate::error::{Result, SensitivityError};

/// The JSON format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// One measured encoding of one tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncodingOption {
    /// Encoding ID (with its codec version).
    pub encoding: String,
    /// Exact encoded bytes.
    pub bytes: u64,
    /// Relative output distortion `‖(W − Q)X‖² / ‖WX‖²`.
    pub distortion: f64,
}

/// The measured options of one tensor, most precise (largest) first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorImportance {
    /// The tensor's encoding in the source model (distortion 0 by definition).
    pub source_encoding: String,
    /// Bytes in the source encoding.
    pub source_bytes: u64,
    /// Options strictly smaller than the source, sorted by bytes descending.
    pub options: Vec<EncodingOption>,
    /// What one unit of this tensor's relative distortion costs in next-token KL divergence,
    /// measured by ablation on calibration text ([`ImportanceMap::set_kl_weights`]); 1 (and
    /// absent from the JSON) until measured. The selector minimizes `Σ kl_weight · distortion`.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub kl_weight: f64,
}

fn one() -> f64 {
    1.0
}

fn is_one(v: &f64) -> bool {
    *v == 1.0
}

/// Where the measurements came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Fingerprint of the model measured (e.g. its content hash).
    pub model_fingerprint: String,
    /// Hash of the calibration data.
    pub calibration_hash: String,
    /// Number of calibration samples.
    pub sample_count: u64,
    /// Every encoding ID measured, sorted (IDs carry their codec version).
    pub codec_versions: Vec<String>,
    /// How the tensors' `kl_weight`s were measured (absent: not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_weights: Option<String>,
}

/// Per tensor, per candidate encoding: distortion and size, plus provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportanceMap {
    /// Always [`FORMAT_VERSION`] for maps this build writes.
    pub format_version: u32,
    /// Calibration provenance.
    pub provenance: Provenance,
    /// Tensor name → measured options.
    pub tensors: BTreeMap<String, TensorImportance>,
}

/// Collects tensors and fills in the provenance's codec versions.
#[derive(Debug, Clone)]
pub struct ImportanceMapBuilder {
    model_fingerprint: String,
    calibration_hash: String,
    sample_count: u64,
    tensors: BTreeMap<String, TensorImportance>,
}

impl ImportanceMapBuilder {
    /// Starts a map for a model and a calibration set.
    pub fn new(model_fingerprint: &str, calibration_hash: &str, sample_count: u64) -> Self {
        ImportanceMapBuilder {
            model_fingerprint: model_fingerprint.to_owned(),
            calibration_hash: calibration_hash.to_owned(),
            sample_count,
            tensors: BTreeMap::new(),
        }
    }

    /// Starts a map whose calibration provenance is that of `calib`.
    pub fn for_calibration(model_fingerprint: &str, calib: &Calibration) -> Self {
        Self::new(model_fingerprint, calib.hash(), calib.samples() as u64)
    }

    /// Adds one tensor's measurements.
    pub fn add(&mut self, name: &str, t: TensorImportance) -> Result<&mut Self> {
        if self.tensors.contains_key(name) {
            return Err(SensitivityError::DuplicateTensor {
                name: name.to_owned(),
            });
        }
        self.tensors.insert(name.to_owned(), t);
        Ok(self)
    }

    /// Finishes the map.
    pub fn finish(self) -> ImportanceMap {
        let mut codecs: Vec<String> = self
            .tensors
            .values()
            .flat_map(|t| t.options.iter().map(|o| o.encoding.clone()))
            .collect();
        codecs.sort();
        codecs.dedup();
        ImportanceMap {
            format_version: FORMAT_VERSION,
            provenance: Provenance {
                model_fingerprint: self.model_fingerprint,
                calibration_hash: self.calibration_hash,
                sample_count: self.sample_count,
                codec_versions: codecs,
                kl_weights: None,
            },
            tensors: self.tensors,
        }
    }
}

fn malformed(reason: impl Into<String>) -> SensitivityError {
    SensitivityError::Malformed {
        reason: reason.into(),
    }
}

impl ImportanceMap {
    /// Pretty JSON. Distortions round-trip exactly (`serde_json`'s `float_roundtrip`), so a map
    /// read back selects exactly the same profile.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| malformed(e.to_string()))
    }

    /// Parses JSON, refusing other format versions and structurally invalid maps (non-finite or
    /// negative distortions, options not smaller than the source or not sorted by size,
    /// encodings missing from the provenance's codec list).
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| malformed(e.to_string()))?;
        let version = value
            .get("format_version")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| malformed("missing integer `format_version`"))?;
        if version != u64::from(FORMAT_VERSION) {
            return Err(SensitivityError::UnsupportedFormatVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let map: ImportanceMap =
            serde_json::from_value(value).map_err(|e| malformed(e.to_string()))?;
        map.validate()?;
        Ok(map)
    }

    /// Sets each named tensor's `kl_weight` (finite and positive) and records how they were
    /// measured; tensors not named keep theirs.
    pub fn set_kl_weights(
        &mut self,
        weights: &BTreeMap<String, f64>,
        how: impl Into<String>,
    ) -> Result<()> {
        for (name, &w) in weights {
            if !(w.is_finite() && w > 0.0) {
                return Err(malformed(format!(
                    "{name}: kl_weight {w} is not finite and positive"
                )));
            }
            self.tensors
                .get_mut(name)
                .ok_or_else(|| malformed(format!("{name}: not in the map")))?
                .kl_weight = w;
        }
        self.provenance.kl_weights = Some(how.into());
        Ok(())
    }

    fn validate(&self) -> Result<()> {
        for (name, t) in &self.tensors {
            if !(t.kl_weight.is_finite() && t.kl_weight > 0.0) {
                return Err(malformed(format!("{name}: invalid kl_weight")));
            }
            let mut prev = t.source_bytes;
            for o in &t.options {
                if !(o.distortion.is_finite() && o.distortion >= 0.0) {
                    return Err(malformed(format!(
                        "{name}/{}: invalid distortion",
                        o.encoding
                    )));
                }
                if o.bytes >= prev {
                    return Err(malformed(format!(
                        "{name}/{}: options must be strictly smaller than the source and sorted by size descending",
                        o.encoding
                    )));
                }
                prev = o.bytes;
                if !self.provenance.codec_versions.contains(&o.encoding) {
                    return Err(malformed(format!(
                        "{name}/{}: encoding missing from provenance.codec_versions",
                        o.encoding
                    )));
                }
            }
        }
        Ok(())
    }

    /// Refuses the map unless it was measured on the model with `model_fingerprint` and every
    /// recorded codec version is one this build's codecs implement.
    pub fn check_applies_to(&self, model_fingerprint: &str) -> Result<()> {
        if self.provenance.model_fingerprint != model_fingerprint {
            return Err(SensitivityError::ProvenanceMismatch {
                field: "model_fingerprint",
                expected: model_fingerprint.to_owned(),
                found: self.provenance.model_fingerprint.clone(),
            });
        }
        for id in &self.provenance.codec_versions {
            if EncodingId::parse(id).is_err() {
                return Err(SensitivityError::ProvenanceMismatch {
                    field: "codec_versions",
                    expected: "an encoding ID implemented by this build".to_owned(),
                    found: id.clone(),
                });
            }
        }
        Ok(())
    }

    /// Refuses the map unless it was measured on exactly this calibration set.
    pub fn check_calibration(&self, calibration_hash: &str, sample_count: u64) -> Result<()> {
        if self.provenance.calibration_hash != calibration_hash {
            return Err(SensitivityError::ProvenanceMismatch {
                field: "calibration_hash",
                expected: calibration_hash.to_owned(),
                found: self.provenance.calibration_hash.clone(),
            });
        }
        if self.provenance.sample_count != sample_count {
            return Err(SensitivityError::ProvenanceMismatch {
                field: "sample_count",
                expected: sample_count.to_string(),
                found: self.provenance.sample_count.to_string(),
            });
        }
        Ok(())
    }
}
