//! `ModelConfig` on config.json texts emitted by transformers 4.57.6
//! (`XConfig(...).to_json_string(use_diff=True)` for tiny llama, qwen2, gemma3_text, olmoe,
//! granitemoe and bitnet models; regenerate with the oracle venv if transformers changes).

use synapse_formats::config::ModelConfig;

const CONFIGS: &str = r#"{
 "bitnet": {
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "relu2",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 128,
  "max_position_embeddings": 2048,
  "model_type": "bitnet",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "transformers_version": "4.57.6",
  "use_cache": true,
  "vocab_size": 256
 },
 "gemma3_text": {
  "_sliding_window_pattern": 6,
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": null,
  "bos_token_id": 2,
  "eos_token_id": 1,
  "final_logit_softcapping": null,
  "head_dim": 16,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 128,
  "layer_types": [
   "sliding_attention",
   "sliding_attention"
  ],
  "max_position_embeddings": 131072,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 1,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000.0,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "sliding_window": 512,
  "transformers_version": "4.57.6",
  "use_bidirectional_attention": false,
  "use_cache": true,
  "vocab_size": 256
 },
 "granitemoe": {
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attention_multiplier": 0.015625,
  "bos_token_id": 1,
  "embedding_multiplier": 12.0,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 32,
  "logits_scaling": 8.0,
  "max_position_embeddings": 2048,
  "model_type": "granitemoe",
  "num_attention_heads": 4,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 2,
  "num_key_value_heads": 4,
  "num_local_experts": 4,
  "output_router_logits": false,
  "position_embedding_type": "rope",
  "residual_multiplier": 0.22,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "router_aux_loss_coef": 0.001,
  "tie_word_embeddings": false,
  "transformers_version": "4.57.6",
  "use_cache": true,
  "vocab_size": 256
 },
 "llama": {
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "head_dim": 16,
  "hidden_act": "silu",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 128,
  "max_position_embeddings": 2048,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
   "factor": 32.0,
   "high_freq_factor": 4.0,
   "low_freq_factor": 1.0,
   "original_max_position_embeddings": 8192,
   "rope_type": "llama3"
  },
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "transformers_version": "4.57.6",
  "use_cache": true,
  "vocab_size": 256
 },
 "olmoe": {
  "attention_bias": false,
  "attention_dropout": 0.0,
  "clip_qkv": null,
  "eos_token_id": 50279,
  "hidden_act": "silu",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 32,
  "max_position_embeddings": 4096,
  "model_type": "olmoe",
  "norm_topk_prob": false,
  "num_attention_heads": 4,
  "num_experts": 8,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 2,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "pad_token_id": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "router_aux_loss_coef": 0.01,
  "tie_word_embeddings": false,
  "transformers_version": "4.57.6",
  "use_cache": true,
  "vocab_size": 256
 },
 "qwen2": {
  "attention_dropout": 0.0,
  "hidden_act": "silu",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 128,
  "layer_types": [
   "full_attention",
   "full_attention"
  ],
  "max_position_embeddings": 32768,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "transformers_version": "4.57.6",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 256
 }
}"#;

fn cfg(family: &str) -> ModelConfig {
    let all: serde_json::Value = serde_json::from_str(CONFIGS).unwrap();
    ModelConfig::from_json_str(&all[family].to_string()).unwrap()
}

#[test]
fn llama() {
    let c = cfg("llama");
    assert_eq!(c.model_type, "llama");
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.vocab_size),
        (64, 2, 256)
    );
    assert_eq!(
        (c.num_attention_heads, c.n_kv_heads(), c.head_dim()),
        (4, 2, 16)
    );
    assert_eq!(c.activation(), Some("silu"));
    let rs = c.rope_scaling.unwrap();
    assert_eq!(rs.rope_type.as_deref(), Some("llama3"));
    assert_eq!(
        (rs.factor, rs.low_freq_factor, rs.high_freq_factor),
        (Some(32.0), Some(1.0), Some(4.0))
    );
    assert_eq!(rs.original_max_position_embeddings, Some(8192));
    assert_eq!(c.tie_word_embeddings, Some(false));
}

#[test]
fn qwen2() {
    let c = cfg("qwen2");
    assert_eq!(c.model_type, "qwen2");
    assert_eq!(
        (c.num_attention_heads, c.n_kv_heads(), c.head_dim()),
        (4, 2, 16)
    );
    assert_eq!(c.tie_word_embeddings, Some(true));
    assert_eq!(c.use_sliding_window, Some(false));
    assert_eq!(c.rope_theta, Some(10000.0));
}

#[test]
fn gemma3_text() {
    let c = cfg("gemma3_text");
    assert_eq!(c.model_type, "gemma3_text");
    assert_eq!(
        (c.num_attention_heads, c.n_kv_heads(), c.head_dim()),
        (4, 1, 16)
    );
    assert_eq!(c.activation(), Some("gelu_pytorch_tanh"));
    assert_eq!(c.sliding_window, Some(512));
    assert_eq!(c.query_pre_attn_scalar, Some(256.0));
    assert_eq!(c.rope_local_base_freq, Some(10000.0));
    assert_eq!(c.rope_theta, Some(1_000_000.0));
    assert_eq!(c.layer_types.as_ref().map(Vec::len), Some(2));
    assert_eq!(c.eos_token_id.unwrap().to_vec(), vec![1]);
}

#[test]
fn olmoe() {
    let c = cfg("olmoe");
    assert_eq!(c.model_type, "olmoe");
    assert_eq!(c.n_experts(), Some(8));
    assert_eq!(c.num_experts_per_tok, Some(2));
    assert_eq!(c.norm_topk_prob, Some(false));
    assert_eq!(c.rms_norm_eps, Some(1e-5));
}

#[test]
fn granitemoe() {
    let c = cfg("granitemoe");
    assert_eq!(c.model_type, "granitemoe");
    assert_eq!(c.n_experts(), Some(4));
    assert_eq!(c.embedding_multiplier, Some(12.0));
    assert_eq!(c.logits_scaling, Some(8.0));
    assert_eq!(c.attention_multiplier, Some(0.015625));
    assert_eq!(c.residual_multiplier, Some(0.22));
}

#[test]
fn bitnet() {
    let c = cfg("bitnet");
    assert_eq!(c.model_type, "bitnet");
    assert_eq!(c.activation(), Some("relu2"));
    assert_eq!((c.num_attention_heads, c.n_kv_heads()), (4, 2));
    assert_eq!(c.rope_theta, Some(500000.0));
}
