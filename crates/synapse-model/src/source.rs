//! What a family adapter reads: metadata and a tensor table, independent of the file format.
//!
//! A [`SourceDesc`] is built from a GGUF file (its metadata keys, e.g. `gemma3.block_count`)
//! or from a Hugging Face `config.json` plus safetensors (its keys, e.g. `num_hidden_layers`).
//! Adapters know both spellings; nothing else in the crate knows about file formats.

use std::collections::HashMap;

use synapse_formats::GgmlType;

use crate::error::{ModelError, Result};
use crate::ir::SourceKind;

/// One metadata value, reduced to what adapters need.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Any integer.
    Int(i64),
    /// Any float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
    /// An array of numbers (integers widened to f64 exactly for |x| < 2⁵³).
    Numbers(Vec<f64>),
    /// An array of strings.
    Strings(Vec<String>),
    /// A structured value (HF `rope_scaling`, …) kept as JSON.
    Json(serde_json::Value),
    /// Explicitly null / absent-but-present.
    Null,
}

impl MetaValue {
    /// Integer view (floats with an exact integer value are accepted).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            MetaValue::Int(v) => Some(*v),
            MetaValue::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(*f as i64),
            MetaValue::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }
    /// Float view.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            MetaValue::Int(v) => Some(*v as f64),
            MetaValue::Float(f) => Some(*f),
            _ => None,
        }
    }
    /// Boolean view.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            MetaValue::Bool(b) => Some(*b),
            MetaValue::Int(v) => Some(*v != 0),
            _ => None,
        }
    }
    /// String view.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    fn from_json(v: &serde_json::Value) -> MetaValue {
        use serde_json::Value as J;
        match v {
            J::Null => MetaValue::Null,
            J::Bool(b) => MetaValue::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => MetaValue::Int(i),
                None => MetaValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => MetaValue::Str(s.clone()),
            J::Array(a) if a.iter().all(|x| x.is_number()) => {
                MetaValue::Numbers(a.iter().filter_map(|x| x.as_f64()).collect())
            }
            J::Array(a) if a.iter().all(|x| x.is_string()) => MetaValue::Strings(
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect(),
            ),
            other => MetaValue::Json(other.clone()),
        }
    }
}

/// One tensor of the source.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceTensor {
    /// Name in the file.
    pub name: String,
    /// Row-major shape, outermost first.
    pub shape: Vec<u64>,
    /// Encoding.
    pub encoding: GgmlType,
    /// File index (safetensors shard; 0 for GGUF).
    pub file: u32,
    /// Absolute byte offset in that file.
    pub offset: u64,
    /// Data length in bytes.
    pub n_bytes: u64,
}

/// Metadata and tensors of one model source.
#[derive(Debug, Clone)]
pub struct SourceDesc {
    /// The container kind.
    pub kind: SourceKind,
    /// The architecture string (`general.architecture`, or HF `model_type`).
    pub arch: String,
    /// Metadata in the source's own key naming.
    pub meta: HashMap<String, MetaValue>,
    /// Tensors in file order.
    pub tensors: Vec<SourceTensor>,
    /// Ids of vocabulary entries whose text is a known end-of-generation marker
    /// (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>`, …), as llama.cpp's vocabulary marks them.
    pub eog_tokens: Vec<u32>,
}

/// Vocabulary texts llama.cpp treats as end-of-generation in addition to the EOS id.
pub const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
];

impl SourceDesc {
    /// Builds a description from a Hugging Face `config.json` text and a tensor table.
    ///
    /// Vision-language configs with a nested `text_config` use that nested object.
    pub fn from_hf_config(config_json: &str, tensors: Vec<SourceTensor>) -> Result<Self> {
        let v: serde_json::Value =
            serde_json::from_str(config_json).map_err(|e| ModelError::Config(e.to_string()))?;
        let obj = match v.get("text_config") {
            Some(t) if t.is_object() => t,
            _ => &v,
        };
        let map = obj
            .as_object()
            .ok_or_else(|| ModelError::Config("top level is not an object".into()))?;
        let meta: HashMap<String, MetaValue> = map
            .iter()
            .map(|(k, v)| (k.clone(), MetaValue::from_json(v)))
            .collect();
        let arch = meta
            .get("model_type")
            .and_then(|m| m.as_str())
            .or_else(|| v.get("model_type").and_then(|m| m.as_str()))
            .ok_or_else(|| ModelError::Config("no model_type".into()))?
            .to_string();
        // 1bitLLM's BitNet checkpoints call themselves `llama` and name their class.
        let bitnet_class = v
            .get("architectures")
            .and_then(|a| a.as_array())
            .is_some_and(|a| a.iter().any(|c| c.as_str() == Some("BitnetForCausalLM")));
        let arch = if arch == "llama" && bitnet_class {
            "bitnet".to_string()
        } else {
            arch
        };
        let mut meta = meta;
        // Keys that only the top level carries (tie_word_embeddings for VLM wrappers).
        if let Some(top) = v.as_object() {
            for (k, val) in top {
                meta.entry(k.clone())
                    .or_insert_with(|| MetaValue::from_json(val));
            }
        }
        Ok(SourceDesc {
            kind: SourceKind::Safetensors,
            arch,
            meta,
            tensors,
            eog_tokens: Vec::new(),
        })
    }

    /// Looks up a metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        match self.meta.get(key) {
            Some(MetaValue::Null) | None => None,
            Some(v) => Some(v),
        }
    }

    /// Finds a tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&SourceTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Metadata arrays longer than this are not copied (vocabularies, merges); adapters never need
/// them except through [`SourceDesc::eog_tokens`].
const MAX_META_ARRAY: usize = 4096;

fn meta_from_gguf(v: &synapse_formats::gguf::GgufValue) -> Option<MetaValue> {
    use synapse_formats::gguf::{GgufArray as A, GgufValue as V};
    Some(match v {
        V::F32(x) => MetaValue::Float(*x as f64),
        V::F64(x) => MetaValue::Float(*x),
        V::Bool(b) => MetaValue::Bool(*b),
        V::String(s) => MetaValue::Str(s.clone()),
        V::Array(a) => {
            if a.len() > MAX_META_ARRAY {
                return None;
            }
            match a {
                A::String(s) => MetaValue::Strings(s.to_vec()),
                A::Bool(b) => MetaValue::Numbers(b.iter().map(|&x| x as u8 as f64).collect()),
                A::F32(f) => MetaValue::Numbers(f.iter().map(|&x| x as f64).collect()),
                A::F64(f) => MetaValue::Numbers(f.clone()),
                A::Array(_) => return None,
                other => {
                    MetaValue::Numbers(other.to_i64_vec()?.into_iter().map(|x| x as f64).collect())
                }
            }
        }
        other => MetaValue::Int(other.as_i64()?),
    })
}

impl SourceDesc {
    /// Describes an open GGUF file.
    pub fn from_gguf(f: &synapse_formats::gguf::GgufFile) -> Result<Self> {
        let arch = f
            .architecture()
            .ok_or_else(|| ModelError::Config("GGUF has no general.architecture".into()))?
            .to_string();
        let meta = f
            .metadata()
            .iter()
            .filter_map(|(k, v)| meta_from_gguf(v).map(|m| (k.clone(), m)))
            .collect();
        // bitnet.cpp's I2_S (its fork's type 36, only in `bitnet*` files): described as its
        // bytes, `I8` of shape `[bytes]` (2-bit codes, then the f32 scale and padding; the
        // bitnet adapter's `i2s_linear` reads them). A genuine ggml `I8` tensor in such a file
        // would be indistinguishable, so it is refused there.
        let bitnet_file = arch.to_ascii_lowercase().starts_with("bitnet");
        let mut tensors = Vec::with_capacity(f.tensors().len());
        for t in f.tensors() {
            let (shape, encoding) = match t.ty {
                synapse_formats::gguf::TensorType::Bitnet(
                    synapse_formats::gguf::BitnetType::I2_S,
                ) => (vec![t.n_bytes], GgmlType::I8),
                ty => {
                    let g = ty.ggml()?;
                    if bitnet_file && g == GgmlType::I8 {
                        return Err(ModelError::UnsupportedEncoding {
                            name: t.name.clone(),
                            encoding: "i8".into(),
                            role: "a tensor of a BitNet GGUF (read as I2_S bytes there)".into(),
                        });
                    }
                    (t.shape_row_major(), g)
                }
            };
            tensors.push(SourceTensor {
                name: t.name.clone(),
                shape,
                encoding,
                file: 0,
                offset: t.offset,
                n_bytes: t.n_bytes,
            });
        }
        let eog_tokens = f
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_strings())
            .map(|toks| {
                toks.iter()
                    .enumerate()
                    .filter(|(_, t)| EOG_TEXTS.contains(t))
                    .map(|(i, _)| i as u32)
                    .collect()
            })
            .unwrap_or_default();
        Ok(SourceDesc {
            kind: SourceKind::Gguf,
            arch,
            meta,
            tensors,
            eog_tokens,
        })
    }

    /// Describes a safetensors checkpoint with its `config.json` text.
    pub fn from_safetensors(
        config_json: &str,
        m: &synapse_formats::safetensors::SafetensorsModel,
    ) -> Result<Self> {
        // BitNet's offline checkpoints store their projections as packed `uint8`: those bytes
        // are described as `I8` (ggml has no unsigned byte type) and only the bitnet adapter's
        // packed projections accept them; every other checkpoint refuses `U8`.
        let packed_bitnet = serde_json::from_str::<serde_json::Value>(config_json)
            .ok()
            .and_then(|v| v.get("quantization_config").cloned())
            .is_some_and(|q| {
                let f = |k: &str, d: &str| {
                    q.get(k)
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                        .unwrap_or_else(|| d.to_string())
                };
                q.get("quant_method").and_then(|v| v.as_str()) == Some("bitnet")
                    && f("linear_class", "bitlinear") == "bitlinear"
                    && f("quantization_mode", "offline") == "offline"
            });
        let mut tensors = Vec::with_capacity(m.len());
        for (k, shard) in m.shards().iter().enumerate() {
            for e in shard.entries() {
                let encoding = match e.dtype {
                    synapse_formats::safetensors::Dtype::U8 if packed_bitnet => Some(GgmlType::I8),
                    d => d.ggml(),
                };
                let encoding = encoding.ok_or_else(|| ModelError::UnsupportedEncoding {
                    name: e.name.clone(),
                    encoding: e.dtype.as_str().to_string(),
                    role: "any tensor".into(),
                })?;
                tensors.push(SourceTensor {
                    name: e.name.clone(),
                    shape: e.shape.clone(),
                    encoding,
                    file: k as u32,
                    offset: e.offset,
                    n_bytes: e.n_bytes,
                });
            }
        }
        Self::from_hf_config(config_json, tensors)
    }
}
