//! Family adapters: one file per family turns a [`SourceDesc`] into a [`ModelIr`].
//!
//! The adapter boundary is the function `fn build(&SourceDesc) -> Result<ModelIr>`: a new
//! family is a new file plus one line in [`build_ir`]; the executor only sees the IR.
//! [`Builder`] is the shared plumbing: typed metadata access, tensor lookup with shape
//! checks, and the final check that every source tensor was used.

use std::collections::{HashMap, HashSet};

use synapse_formats::GgmlType;

use crate::error::{ModelError, Result};
use crate::ir::*;
use crate::source::{MetaValue, SourceDesc};

pub mod bitnet;
pub mod gemma3;
pub mod granitemoe;
pub mod llama;
pub(crate) mod moe;
pub mod olmoe;
pub mod qwen2;
pub mod qwen2moe;

/// An adapter: a source description to its IR.
type Adapter = fn(&SourceDesc) -> Result<ModelIr>;

/// Architecture names each family accepts (GGUF `general.architecture` and HF `model_type`)
/// and the adapter that builds them.
const ADAPTERS: &[(&str, Family, Adapter)] = &[
    ("bitnet", Family::Bitnet, bitnet::build),
    ("bitnet-b1.58", Family::Bitnet, bitnet::build_b158),
    ("gemma3", Family::Gemma3, gemma3::build),
    ("gemma3_text", Family::Gemma3, gemma3::build),
    ("granitemoe", Family::Granitemoe, granitemoe::build),
    ("llama", Family::Llama, llama::build),
    ("mixtral", Family::Llama, llama::build_mixtral),
    ("olmoe", Family::Olmoe, olmoe::build),
    ("qwen2", Family::Qwen2, qwen2::build),
    ("qwen2_moe", Family::Qwen2moe, qwen2moe::build),
    ("qwen2moe", Family::Qwen2moe, qwen2moe::build),
];

/// Architecture names each family accepts (GGUF `general.architecture` and HF `model_type`).
pub const SUPPORTED: &[(&str, Family)] = &[
    ("bitnet", Family::Bitnet),
    ("bitnet-b1.58", Family::Bitnet),
    ("gemma3", Family::Gemma3),
    ("gemma3_text", Family::Gemma3),
    ("granitemoe", Family::Granitemoe),
    ("llama", Family::Llama),
    ("mixtral", Family::Llama),
    ("olmoe", Family::Olmoe),
    ("qwen2", Family::Qwen2),
    ("qwen2_moe", Family::Qwen2moe),
    ("qwen2moe", Family::Qwen2moe),
];

/// Builds the IR for a source, choosing the family adapter by architecture.
pub fn build_ir(src: &SourceDesc) -> Result<ModelIr> {
    let build = ADAPTERS
        .iter()
        .find(|(a, _, _)| *a == src.arch)
        .map(|(_, _, f)| *f)
        .ok_or_else(|| ModelError::UnsupportedArchitecture {
            arch: src.arch.clone(),
            supported: SUPPORTED
                .iter()
                .map(|(a, _)| *a)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let mut ir = build(src)?;
    ir.fingerprint = ir.compute_fingerprint();
    Ok(ir)
}

/// Dimensions shared by every family (see [`Builder::core_dims`]).
pub(crate) struct CoreDims {
    pub n_layers: u32,
    pub hidden: u32,
    pub ffn: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
}

/// Shared adapter plumbing.
pub(crate) struct Builder<'a> {
    pub family: &'static str,
    pub src: &'a SourceDesc,
    weights: Vec<WeightDesc>,
    by_name: HashMap<String, WeightId>,
    used: HashSet<String>,
}

impl<'a> Builder<'a> {
    pub fn new(family: &'static str, src: &'a SourceDesc) -> Self {
        Builder {
            family,
            src,
            weights: Vec::new(),
            by_name: HashMap::new(),
            used: HashSet::new(),
        }
    }

    pub fn is_gguf(&self) -> bool {
        self.src.kind == SourceKind::Gguf
    }

    /// GGUF keys are `<arch>.<key>`; HF keys are used as given.
    fn key(&self, gguf_key: &str, hf_key: &str) -> String {
        if self.is_gguf() {
            format!("{}.{}", self.src.arch, gguf_key)
        } else {
            hf_key.to_string()
        }
    }

    pub fn opt(&self, gguf_key: &str, hf_key: &str) -> Option<&'a MetaValue> {
        self.src.get(&self.key(gguf_key, hf_key))
    }

    pub fn opt_u32(&self, gguf_key: &str, hf_key: &str) -> Result<Option<u32>> {
        let key = self.key(gguf_key, hf_key);
        match self.src.get(&key) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) if (0..=u32::MAX as i64).contains(&x) => Ok(Some(x as u32)),
                _ => Err(self.invalid(&key, format!("expected an unsigned integer, got {v:?}"))),
            },
        }
    }

    pub fn u32(&self, gguf_key: &str, hf_key: &str) -> Result<u32> {
        self.opt_u32(gguf_key, hf_key)?
            .ok_or_else(|| ModelError::MissingKey {
                family: self.family,
                key: self.key(gguf_key, hf_key),
            })
    }

    /// A positive u32 (dimensions).
    pub fn dim(&self, gguf_key: &str, hf_key: &str) -> Result<u32> {
        let v = self.u32(gguf_key, hf_key)?;
        if v == 0 {
            return Err(self.invalid(&self.key(gguf_key, hf_key), "must be positive".into()));
        }
        Ok(v)
    }

    /// The dimensions every transformer family reads the same way: layers, hidden, FFN, query
    /// and KV heads (KV heads must divide query heads) and the key head dim.
    pub fn core_dims(&self) -> Result<CoreDims> {
        let n_layers = self.dim("block_count", "num_hidden_layers")?;
        let hidden = self.dim("embedding_length", "hidden_size")?;
        let ffn = self.dim("feed_forward_length", "intermediate_size")?;
        let n_heads = self.dim("attention.head_count", "num_attention_heads")?;
        let n_kv_heads = self
            .opt_u32("attention.head_count_kv", "num_key_value_heads")?
            .unwrap_or(n_heads);
        if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(self.invalid(
                "head_count_kv",
                format!("{n_kv_heads} does not divide {n_heads}"),
            ));
        }
        let head_dim = self
            .opt_u32("attention.key_length", "head_dim")?
            .unwrap_or(hidden / n_heads);
        Ok(CoreDims {
            n_layers,
            hidden,
            ffn,
            n_heads,
            n_kv_heads,
            head_dim,
        })
    }

    pub fn opt_f32(&self, gguf_key: &str, hf_key: &str) -> Result<Option<f32>> {
        let key = self.key(gguf_key, hf_key);
        match self.src.get(&key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x as f32)),
                _ => Err(self.invalid(&key, format!("expected a finite number, got {v:?}"))),
            },
        }
    }

    pub fn invalid(&self, key: &str, reason: String) -> ModelError {
        ModelError::InvalidValue {
            family: self.family,
            key: key.to_string(),
            reason,
        }
    }

    pub fn unsupported(&self, what: impl Into<String>) -> ModelError {
        ModelError::UnsupportedFeature {
            family: self.family,
            what: what.into(),
        }
    }

    /// Registers a tensor; `shape` is the expected row-major shape.
    pub fn weight(&mut self, name: &str, shape: &[u64]) -> Result<WeightId> {
        self.opt_weight(name, shape)?
            .ok_or_else(|| ModelError::MissingTensor {
                family: self.family,
                name: name.to_string(),
            })
    }

    pub fn opt_weight(&mut self, name: &str, shape: &[u64]) -> Result<Option<WeightId>> {
        if let Some(id) = self.by_name.get(name) {
            return Ok(Some(*id));
        }
        let Some(t) = self.src.tensor(name) else {
            return Ok(None);
        };
        // A 1-D tensor stored as [1, n] (or similar) is accepted when the element count matches.
        let squeeze = |s: &[u64]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        if t.shape != shape && squeeze(&t.shape) != squeeze(shape) {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                found: t.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        let id = WeightId(self.weights.len() as u32);
        self.weights.push(WeightDesc {
            name: t.name.clone(),
            shape: shape.to_vec(),
            encoding: t.encoding,
            file: t.file,
            offset: t.offset,
            n_bytes: t.n_bytes,
            content_hash: None,
        });
        self.by_name.insert(name.to_string(), id);
        self.used.insert(name.to_string());
        Ok(Some(id))
    }

    /// Marks a tensor as deliberately unused (e.g. a stored copy of a tied head).
    pub fn ignore(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }

    /// A norm weight of width `n` that must be a float type.
    pub fn norm(&mut self, name: &str, n: u64, eps: f32, weight_offset: f32) -> Result<RmsNorm> {
        let weight = self.weight(name, &[n])?;
        self.require_float(weight, "a norm weight")?;
        Ok(RmsNorm {
            weight,
            eps,
            weight_offset,
        })
    }

    fn require_float(&self, id: WeightId, role: &str) -> Result<()> {
        let w = &self.weights[id.0 as usize];
        if !matches!(w.encoding, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(ModelError::UnsupportedEncoding {
                name: w.name.clone(),
                encoding: w.encoding.name().to_string(),
                role: role.to_string(),
            });
        }
        Ok(())
    }

    pub fn linear(
        &mut self,
        weight: &str,
        bias: Option<&str>,
        in_features: u32,
        out_features: u32,
    ) -> Result<Linear> {
        let w = self.weight(weight, &[out_features as u64, in_features as u64])?;
        let b = match bias {
            Some(b) => {
                let id = self.opt_weight(b, &[out_features as u64])?;
                if let Some(id) = id {
                    self.require_float(id, "a bias")?;
                }
                id
            }
            None => None,
        };
        Ok(Linear {
            weight: w,
            bias: b,
            in_features,
            out_features,
            scale: None,
        })
    }

    /// A projection stored as bitnet.cpp's I2_S
    /// ([`ProjectionQuant::BitnetI2S`](crate::ProjectionQuant)): the tensor's bytes, `I8` of
    /// shape `[bytes]` as the source description gives them, at least the `out·in/4` code
    /// bytes and the f32 scale after them (`in` a multiple of 128); no bias.
    pub fn i2s_linear(
        &mut self,
        weight: &str,
        bias: &str,
        in_features: u32,
        out_features: u32,
    ) -> Result<Linear> {
        let Some(t) = self.src.tensor(weight) else {
            return Err(ModelError::MissingTensor {
                family: self.family,
                name: weight.to_string(),
            });
        };
        let codes = out_features as u64 * in_features as u64 / 4;
        if t.encoding != GgmlType::I8
            || t.shape.len() != 1
            || t.n_bytes < codes + 4
            || !in_features.is_multiple_of(128)
        {
            return Err(ModelError::ShapeMismatch {
                name: weight.to_string(),
                found: t.shape.clone(),
                expected: vec![codes + 32],
            });
        }
        let shape = t.shape.clone();
        let w = self.weight(weight, &shape)?;
        if self.src.tensor(bias).is_some() {
            return Err(self.unsupported(format!("{bias} beside I2_S weights")));
        }
        Ok(Linear {
            weight: w,
            bias: None,
            in_features,
            out_features,
            scale: None,
        })
    }

    /// A projection stored as BitNet's offline packed weights
    /// ([`ProjectionQuant::BitnetW158A8Packed`](crate::ProjectionQuant)): `weight` bytes
    /// `[⌈out/4⌉, in]` (safetensors `U8`, read as `I8` bytes) and a one-element float
    /// `scale`; no bias (transformers' `BitLinear` of these checkpoints has none).
    pub fn packed_linear(
        &mut self,
        weight: &str,
        scale: &str,
        bias: &str,
        in_features: u32,
        out_features: u32,
    ) -> Result<Linear> {
        let w = self.weight(
            weight,
            &[out_features.div_ceil(4) as u64, in_features as u64],
        )?;
        if self.weights[w.0 as usize].encoding != GgmlType::I8 {
            let e = &self.weights[w.0 as usize];
            return Err(ModelError::UnsupportedEncoding {
                name: e.name.clone(),
                encoding: e.encoding.name().to_string(),
                role: "a packed ternary projection (uint8)".into(),
            });
        }
        let s = self.weight(scale, &[1])?;
        self.require_float(s, "a weight scale")?;
        if self.src.tensor(bias).is_some() {
            return Err(self.unsupported(format!("{bias} beside packed ternary weights")));
        }
        Ok(Linear {
            weight: w,
            bias: None,
            in_features,
            out_features,
            scale: Some(s),
        })
    }

    /// A bias that must be present.
    pub fn require_bias(&self, l: &Linear, name: &str) -> Result<()> {
        if l.bias.is_none() {
            return Err(ModelError::MissingTensor {
                family: self.family,
                name: name.to_string(),
            });
        }
        Ok(())
    }

    /// Special tokens from metadata.
    pub fn special_tokens(&self, default_add_bos: bool) -> SpecialTokens {
        let src = self.src;
        let int = |k: &str| src.get(k).and_then(|v| v.as_i64()).filter(|&x| x >= 0);
        let (bos, mut eos, add_bos) = if self.is_gguf() {
            let bos = int("tokenizer.ggml.bos_token_id").map(|x| x as u32);
            let eos: Vec<u32> = int("tokenizer.ggml.eos_token_id")
                .map(|x| vec![x as u32])
                .unwrap_or_default();
            let add_bos = src
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.as_bool())
                .unwrap_or(default_add_bos);
            let mut eos = eos;
            if let Some(e) = int("tokenizer.ggml.eot_token_id") {
                eos.push(e as u32);
            }
            if let Some(e) = int("tokenizer.ggml.eom_token_id") {
                eos.push(e as u32);
            }
            (bos, eos, add_bos)
        } else {
            let bos = int("bos_token_id").map(|x| x as u32);
            let eos = match src.get("eos_token_id") {
                Some(MetaValue::Numbers(v)) => v
                    .iter()
                    .filter(|x| **x >= 0.0 && **x <= u32::MAX as f64)
                    .map(|x| *x as u32)
                    .collect(),
                Some(v) => v.as_i64().map(|x| vec![x as u32]).unwrap_or_default(),
                None => Vec::new(),
            };
            (bos, eos, default_add_bos)
        };
        eos.extend(src.eog_tokens.iter().copied());
        eos.sort_unstable();
        eos.dedup();
        SpecialTokens { bos, eos, add_bos }
    }

    /// Fails on any source tensor the graph does not use (before any generation).
    pub fn finish(self) -> Result<Vec<WeightDesc>> {
        for t in &self.src.tensors {
            if !self.used.contains(&t.name) && !t.name.ends_with("rotary_emb.inv_freq") {
                return Err(ModelError::UnexpectedTensor {
                    family: self.family,
                    name: t.name.clone(),
                });
            }
        }
        Ok(self.weights)
    }
}

/// Per-pair RoPE divisors for HF `rope_scaling` of type `llama3` (as transformers and
/// llama.cpp's converter compute them): `n_rot / 2` values.
pub(crate) fn llama3_freq_factors(
    base: f32,
    n_rot: u32,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max: f64,
) -> Vec<f32> {
    let low_freq_wavelen = original_max / low_freq_factor;
    let high_freq_wavelen = original_max / high_freq_factor;
    (0..n_rot / 2)
        .map(|i| {
            let freq = 1.0 / (base as f64).powf(2.0 * i as f64 / n_rot as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                factor as f32
            } else {
                let smooth = (original_max / wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// Parsed HF `rope_scaling` (or `rope_parameters`) object.
pub(crate) enum HfRopeScaling {
    None,
    Linear(f64),
    Llama3 {
        factor: f64,
        low: f64,
        high: f64,
        original_max: f64,
    },
}

pub(crate) fn hf_rope_scaling(b: &Builder<'_>) -> Result<HfRopeScaling> {
    let Some(v) = b.src.get("rope_scaling") else {
        return Ok(HfRopeScaling::None);
    };
    let MetaValue::Json(j) = v else {
        return Err(b.invalid("rope_scaling", format!("expected an object, got {v:?}")));
    };
    let ty = j
        .get("rope_type")
        .or_else(|| j.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("default");
    let num = |k: &str| j.get(k).and_then(|x| x.as_f64());
    match ty {
        "default" => Ok(HfRopeScaling::None),
        "linear" => {
            let f =
                num("factor").ok_or_else(|| b.invalid("rope_scaling.factor", "missing".into()))?;
            if f <= 0.0 {
                return Err(b.invalid("rope_scaling.factor", "must be positive".into()));
            }
            Ok(HfRopeScaling::Linear(f))
        }
        "llama3" => {
            let get = |k: &str| {
                num(k).ok_or_else(|| b.invalid(&format!("rope_scaling.{k}"), "missing".into()))
            };
            Ok(HfRopeScaling::Llama3 {
                factor: get("factor")?,
                low: get("low_freq_factor")?,
                high: get("high_freq_factor")?,
                original_max: get("original_max_position_embeddings")?,
            })
        }
        other => Err(b.unsupported(format!("rope_scaling type {other:?}"))),
    }
}

/// GGUF `<arch>.rope.scaling.*` as llama.cpp reads it: `freq_scale = 1 / factor` when a
/// factor is present (types `none`/`linear`), otherwise 1; other types are unsupported.
pub(crate) fn gguf_rope_freq_scale(b: &Builder<'_>) -> Result<f32> {
    let ty = b.opt("rope.scaling.type", "").and_then(|v| v.as_str());
    if let Some(t) = ty
        && t != "none"
        && t != "linear"
    {
        return Err(b.unsupported(format!("rope scaling type {t:?}")));
    }
    let factor = match b.opt_f32("rope.scaling.factor", "")? {
        Some(f) => Some(f),
        None => b.opt_f32("rope.scale_linear", "")?,
    };
    Ok(match factor {
        Some(f) if f > 0.0 => 1.0 / f,
        _ => 1.0,
    })
}
