//! A typed `config.json` (Hugging Face transformers), enough for the families Synapse runs:
//! llama, qwen2, gemma3 (text; also the multimodal wrapper's nested `text_config`), olmoe,
//! granitemoe and bitnet.
//!
//! Fields a config omits take transformers' defaults for its `model_type` (the values of
//! `LlamaConfig()`, `Qwen2Config()`, `Gemma3TextConfig()`, `OlmoeConfig()`,
//! `GraniteMoeConfig()`, `BitNetConfig()` in transformers 4.57), so sparse configs such as
//! Gemma 3's nested `text_config` resolve to the same numbers transformers uses.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{FormatError, Result};

/// A token id field that may be one id or a list (`eos_token_id: [1, 106]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(i) => vec![*i],
            TokenIds::Many(v) => v.clone(),
        }
    }
}

/// `rope_scaling` (llama3, linear, dynamic, yarn ...).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RopeScaling {
    /// `rope_type` (or the older `type`).
    #[serde(alias = "type")]
    pub rope_type: Option<String>,
    /// Scaling factor.
    pub factor: Option<f64>,
    /// llama3: low-frequency factor.
    pub low_freq_factor: Option<f64>,
    /// llama3: high-frequency factor.
    pub high_freq_factor: Option<f64>,
    /// llama3 / yarn: the pre-scaling context length.
    pub original_max_position_embeddings: Option<u64>,
    /// Any other field.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A model's `config.json`, with per-family defaults applied (see the module docs).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ModelConfig {
    /// `architectures`, e.g. `["LlamaForCausalLM"]`.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// `model_type` of the text model (`gemma3_text` for a nested Gemma 3 config).
    pub model_type: String,
    /// The outer `model_type` when the text config was nested (`gemma3`).
    #[serde(skip)]
    pub outer_model_type: Option<String>,
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Model width.
    pub hidden_size: u64,
    /// FFN width (per expert for MoE families).
    pub intermediate_size: u64,
    /// Number of transformer blocks.
    pub num_hidden_layers: u64,
    /// Query heads.
    pub num_attention_heads: u64,
    /// Key/value heads (defaults to the query heads).
    pub num_key_value_heads: Option<u64>,
    /// Head dimension (defaults to `hidden_size / num_attention_heads`).
    pub head_dim: Option<u64>,
    /// Activation (`silu`, `relu2` ...).
    pub hidden_act: Option<String>,
    /// Gemma's activation field (`gelu_pytorch_tanh`).
    pub hidden_activation: Option<String>,
    /// Trained context length.
    pub max_position_embeddings: Option<u64>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: Option<f64>,
    /// RoPE base frequency (global layers for Gemma 3).
    pub rope_theta: Option<f64>,
    /// RoPE scaling.
    pub rope_scaling: Option<RopeScaling>,
    /// Whether the LM head shares the embedding.
    pub tie_word_embeddings: Option<bool>,
    /// Biases on q/k/v/o.
    pub attention_bias: Option<bool>,
    /// Biases on the MLP projections.
    pub mlp_bias: Option<bool>,
    /// Beginning-of-sequence id(s).
    pub bos_token_id: Option<TokenIds>,
    /// End-of-sequence id(s).
    pub eos_token_id: Option<TokenIds>,
    /// Padding id(s).
    pub pad_token_id: Option<TokenIds>,
    /// Storage dtype (`torch_dtype`, newer configs say `dtype`).
    #[serde(alias = "dtype")]
    pub torch_dtype: Option<String>,

    // ---- sliding-window attention (gemma3, qwen2) ----
    /// Window size of sliding-window layers.
    pub sliding_window: Option<u64>,
    /// Gemma 3: every n-th layer is global (older configs).
    pub sliding_window_pattern: Option<u64>,
    /// Per-layer attention kind (`sliding_attention` / `full_attention`).
    pub layer_types: Option<Vec<String>>,
    /// Qwen2: whether sliding windows are used at all.
    pub use_sliding_window: Option<bool>,
    /// Qwen2: layers below this use full attention.
    pub max_window_layers: Option<u64>,

    // ---- gemma3 ----
    /// Query scaling is `query_pre_attn_scalar^-0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    /// RoPE base of the local (sliding) layers.
    pub rope_local_base_freq: Option<f64>,
    /// Attention logit soft-capping.
    pub attn_logit_softcapping: Option<f64>,
    /// Final logit soft-capping.
    pub final_logit_softcapping: Option<f64>,

    // ---- mixture of experts (olmoe, granitemoe) ----
    /// OLMoE: number of experts.
    pub num_experts: Option<u64>,
    /// GraniteMoE / Mixtral: number of experts.
    pub num_local_experts: Option<u64>,
    /// Experts routed per token.
    pub num_experts_per_tok: Option<u64>,
    /// Renormalize the top-k router probabilities.
    pub norm_topk_prob: Option<bool>,
    /// OLMoE: clamp of q/k/v.
    pub clip_qkv: Option<f64>,

    // ---- granite scalings ----
    /// Embedding output multiplier.
    pub embedding_multiplier: Option<f64>,
    /// Residual branch multiplier.
    pub residual_multiplier: Option<f64>,
    /// Attention score multiplier (replaces `1/sqrt(head_dim)`).
    pub attention_multiplier: Option<f64>,
    /// Logits are divided by this.
    pub logits_scaling: Option<f64>,

    // ---- bitnet (1bitLLM-style llama configs) ----
    /// Weight bits (1bitLLM configs).
    pub weight_bits: Option<u64>,
    /// Activation bits (1bitLLM configs).
    pub input_bits: Option<u64>,

    /// Every field not modelled above.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl ModelConfig {
    /// Reads and parses `path` (a `config.json`, or a directory holding one).
    pub fn from_path(path: &Path) -> Result<Self> {
        let file = if path.is_dir() {
            path.join("config.json")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file).map_err(|source| FormatError::Io {
            path: file.display().to_string(),
            source,
        })?;
        Self::from_json_str(&text).map_err(|e| match e {
            FormatError::BadConfig { reason, .. } => FormatError::BadConfig {
                path: file.display().to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Parses a `config.json` text. A nested `text_config` is merged over the outer object
    /// (its fields win), then the family defaults fill what is still missing.
    pub fn from_json_str(text: &str) -> Result<Self> {
        let bad = |reason: String| FormatError::BadConfig {
            path: "<json>".into(),
            reason,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("JSON: {e}")))?;
        let Value::Object(mut outer) = v else {
            return Err(bad("not a JSON object".into()));
        };
        let mut outer_model_type = None;
        let mut obj = match outer.remove("text_config") {
            Some(Value::Object(text)) => {
                outer_model_type = outer
                    .get("model_type")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                outer.remove("vision_config");
                outer.remove("model_type");
                let mut merged = outer;
                merged.extend(text);
                if !merged.contains_key("model_type")
                    && let Some(t) = &outer_model_type
                {
                    merged.insert("model_type".into(), Value::String(format!("{t}_text")));
                }
                merged
            }
            Some(Value::Null) | None => outer,
            Some(_) => return Err(bad("`text_config` is not an object".into())),
        };
        let model_type = obj
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no string `model_type`".into()))?
            .to_string();
        for (k, d) in family_defaults(&model_type) {
            if obj.get(*k).is_none_or(Value::is_null) {
                obj.insert((*k).to_string(), d.clone());
            }
        }
        let mut cfg: ModelConfig =
            serde_json::from_value(Value::Object(obj)).map_err(|e| bad(e.to_string()))?;
        cfg.outer_model_type = outer_model_type;
        if cfg.num_attention_heads == 0 || cfg.hidden_size == 0 {
            return Err(bad(
                "hidden_size and num_attention_heads must be non-zero".into()
            ));
        }
        Ok(cfg)
    }

    /// Key/value heads (defaults to the query heads).
    pub fn n_kv_heads(&self) -> u64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Head dimension (defaults to `hidden_size / num_attention_heads`).
    pub fn head_dim(&self) -> u64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The activation name (`hidden_activation` for Gemma, else `hidden_act`).
    pub fn activation(&self) -> Option<&str> {
        self.hidden_activation
            .as_deref()
            .or(self.hidden_act.as_deref())
    }

    /// Number of experts for MoE families (`num_experts` or `num_local_experts`).
    pub fn n_experts(&self) -> Option<u64> {
        self.num_experts.or(self.num_local_experts)
    }
}

/// Field defaults of one family: (field, value).
type Defaults = Vec<(&'static str, Value)>;

/// transformers' defaults for the fields Synapse reads, per `model_type`.
fn family_defaults(model_type: &str) -> &'static [(&'static str, Value)] {
    use std::sync::OnceLock;
    static TABLE: OnceLock<Vec<(&'static str, Defaults)>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        use serde_json::json;
        vec![
            (
                "llama",
                vec![
                    ("vocab_size", json!(32000)),
                    ("hidden_size", json!(4096)),
                    ("intermediate_size", json!(11008)),
                    ("num_hidden_layers", json!(32)),
                    ("num_attention_heads", json!(32)),
                    ("hidden_act", json!("silu")),
                    ("max_position_embeddings", json!(2048)),
                    ("rms_norm_eps", json!(1e-6)),
                    ("rope_theta", json!(10000.0)),
                    ("tie_word_embeddings", json!(false)),
                    ("attention_bias", json!(false)),
                    ("mlp_bias", json!(false)),
                ],
            ),
            (
                "qwen2",
                vec![
                    ("vocab_size", json!(151936)),
                    ("hidden_size", json!(4096)),
                    ("intermediate_size", json!(22016)),
                    ("num_hidden_layers", json!(32)),
                    ("num_attention_heads", json!(32)),
                    ("hidden_act", json!("silu")),
                    ("max_position_embeddings", json!(32768)),
                    ("rms_norm_eps", json!(1e-6)),
                    ("rope_theta", json!(10000.0)),
                    ("tie_word_embeddings", json!(false)),
                    ("use_sliding_window", json!(false)),
                ],
            ),
            (
                "gemma3_text",
                vec![
                    ("vocab_size", json!(262208)),
                    ("hidden_size", json!(2304)),
                    ("intermediate_size", json!(9216)),
                    ("num_hidden_layers", json!(26)),
                    ("num_attention_heads", json!(8)),
                    ("num_key_value_heads", json!(4)),
                    ("head_dim", json!(256)),
                    ("hidden_activation", json!("gelu_pytorch_tanh")),
                    ("max_position_embeddings", json!(131072)),
                    ("rms_norm_eps", json!(1e-6)),
                    ("rope_theta", json!(1_000_000.0)),
                    ("tie_word_embeddings", json!(true)),
                    ("attention_bias", json!(false)),
                    ("bos_token_id", json!(2)),
                    ("eos_token_id", json!(1)),
                    ("sliding_window", json!(4096)),
                    ("query_pre_attn_scalar", json!(256)),
                    ("rope_local_base_freq", json!(10000.0)),
                ],
            ),
            (
                "olmoe",
                vec![
                    ("vocab_size", json!(50304)),
                    ("hidden_size", json!(2048)),
                    ("intermediate_size", json!(2048)),
                    ("num_hidden_layers", json!(16)),
                    ("num_attention_heads", json!(16)),
                    ("hidden_act", json!("silu")),
                    ("max_position_embeddings", json!(4096)),
                    ("rms_norm_eps", json!(1e-5)),
                    ("rope_theta", json!(10000.0)),
                    ("tie_word_embeddings", json!(false)),
                    ("attention_bias", json!(false)),
                    ("eos_token_id", json!(50279)),
                    ("num_experts", json!(64)),
                    ("num_experts_per_tok", json!(8)),
                    ("norm_topk_prob", json!(false)),
                ],
            ),
            (
                "granitemoe",
                vec![
                    ("vocab_size", json!(32000)),
                    ("hidden_size", json!(4096)),
                    ("intermediate_size", json!(11008)),
                    ("num_hidden_layers", json!(32)),
                    ("num_attention_heads", json!(32)),
                    ("hidden_act", json!("silu")),
                    ("max_position_embeddings", json!(2048)),
                    ("rms_norm_eps", json!(1e-6)),
                    ("rope_theta", json!(10000.0)),
                    ("tie_word_embeddings", json!(false)),
                    ("attention_bias", json!(false)),
                    ("bos_token_id", json!(1)),
                    ("eos_token_id", json!(2)),
                    ("num_local_experts", json!(8)),
                    ("num_experts_per_tok", json!(2)),
                    ("embedding_multiplier", json!(1.0)),
                    ("residual_multiplier", json!(1.0)),
                    ("attention_multiplier", json!(1.0)),
                    ("logits_scaling", json!(1.0)),
                ],
            ),
            (
                "bitnet",
                vec![
                    ("vocab_size", json!(128256)),
                    ("hidden_size", json!(2560)),
                    ("intermediate_size", json!(6912)),
                    ("num_hidden_layers", json!(30)),
                    ("num_attention_heads", json!(20)),
                    ("num_key_value_heads", json!(5)),
                    ("hidden_act", json!("relu2")),
                    ("max_position_embeddings", json!(2048)),
                    ("rms_norm_eps", json!(1e-5)),
                    ("rope_theta", json!(500000.0)),
                    ("tie_word_embeddings", json!(false)),
                    ("attention_bias", json!(false)),
                    ("bos_token_id", json!(128000)),
                    ("eos_token_id", json!(128001)),
                ],
            ),
        ]
    });
    table
        .iter()
        .find(|(t, _)| *t == model_type)
        .map(|(_, v)| v.as_slice())
        .unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_gemma3_text_config_takes_defaults() {
        // The shape of google/gemma-3-4b-it's config.json (text part is sparse).
        let j = r#"{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3",
            "eos_token_id":[1,106],"torch_dtype":"bfloat16",
            "text_config":{"hidden_size":2560,"intermediate_size":10240,"model_type":"gemma3_text",
              "num_hidden_layers":34,"sliding_window":1024,
              "rope_scaling":{"factor":8.0,"rope_type":"linear"}},
            "vision_config":{"hidden_size":1152}}"#;
        let c = ModelConfig::from_json_str(j).unwrap();
        assert_eq!(c.model_type, "gemma3_text");
        assert_eq!(c.outer_model_type.as_deref(), Some("gemma3"));
        assert_eq!((c.hidden_size, c.num_hidden_layers), (2560, 34));
        assert_eq!(
            (c.num_attention_heads, c.n_kv_heads(), c.head_dim()),
            (8, 4, 256)
        );
        assert_eq!(c.vocab_size, 262208);
        assert_eq!(c.eos_token_id.as_ref().unwrap().to_vec(), vec![1, 106]);
        assert_eq!(c.activation(), Some("gelu_pytorch_tanh"));
        let rs = c.rope_scaling.clone().unwrap();
        assert_eq!(
            (rs.rope_type.as_deref(), rs.factor),
            (Some("linear"), Some(8.0))
        );
        assert_eq!(c.sliding_window, Some(1024));
        assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
        assert!(!c.extra.contains_key("vision_config"));
    }

    #[test]
    fn missing_model_type_is_typed_error() {
        let e = ModelConfig::from_json_str(r#"{"hidden_size": 8}"#).unwrap_err();
        assert!(matches!(e, FormatError::BadConfig { .. }), "{e}");
        let e = ModelConfig::from_json_str("[1,2]").unwrap_err();
        assert!(matches!(e, FormatError::BadConfig { .. }), "{e}");
        let e = ModelConfig::from_json_str(r#"{"model_type":"mystery"}"#).unwrap_err();
        assert!(matches!(e, FormatError::BadConfig { .. }), "{e}");
    }
}
