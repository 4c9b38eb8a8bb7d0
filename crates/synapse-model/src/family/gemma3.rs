//! Gemma 3 (text): per-layer sliding-window or global attention, each with its own RoPE base;
//! q/k norms; pre- and post-norms around attention and FFN; GELU-tanh gated FFN; embeddings
//! scaled by `sqrt(hidden)`; tied LM head.
//!
//! Facts (llama.cpp `src/models/gemma3.cpp`, transformers `Gemma3TextConfig`):
//! - the GGUF converter folds Gemma's `1 + w` into every `*norm.weight`; HF checkpoints do not,
//!   so HF norms get `weight_offset = 1`;
//! - without an explicit pattern, every 6th layer is global (llama.cpp fixes this in code;
//!   transformers reads `layer_types` or `sliding_window_pattern`);
//! - local layers use RoPE base `rope.freq_base_swa` (default 10 000) with no scaling; global
//!   layers use `rope.freq_base` (10⁶) and the linear scaling factor if any;
//! - attention scale is `query_pre_attn_scalar^-1/2` (HF), which llama.cpp takes as
//!   `head_dim^-1/2` (and `(hidden/heads)^-1/2` for the 62-layer 27B).

use crate::error::Result;
use crate::family::{Builder, CoreDims, HfRopeScaling, gguf_rope_freq_scale, hf_rope_scaling};
use crate::ir::*;
use crate::source::{MetaValue, SourceDesc};

/// Builds the IR of a Gemma 3 text model.
pub fn build(src: &SourceDesc) -> Result<ModelIr> {
    let mut b = Builder::new("gemma3", src);
    let gguf = b.is_gguf();
    let CoreDims {
        n_layers,
        hidden,
        ffn,
        n_heads,
        n_kv_heads,
        head_dim,
    } = b.core_dims()?;
    let v_dim = b
        .opt_u32("attention.value_length", "head_dim")?
        .unwrap_or(head_dim);
    if v_dim != head_dim {
        return Err(b.unsupported(format!("value head dim {v_dim} != key head dim {head_dim}")));
    }
    let eps = b
        .opt_f32("attention.layer_norm_rms_epsilon", "rms_norm_eps")?
        .unwrap_or(1e-6);
    let ctx = b
        .opt_u32("context_length", "max_position_embeddings")?
        .unwrap_or(32768);
    let window = b
        .opt_u32("attention.sliding_window", "sliding_window")?
        .filter(|&w| w > 0);

    // Which layers slide.
    let is_swa: Vec<bool> = match window {
        None => vec![false; n_layers as usize],
        Some(_) => swa_pattern(&b, n_layers)?,
    };

    let (base_global, base_local, scale_global) = if gguf {
        (
            b.opt_f32("rope.freq_base", "")?.unwrap_or(10_000.0),
            b.opt_f32("rope.freq_base_swa", "")?.unwrap_or(10_000.0),
            gguf_rope_freq_scale(&b)?,
        )
    } else {
        let scale = match hf_rope_scaling(&b)? {
            HfRopeScaling::None => 1.0,
            HfRopeScaling::Linear(f) => (1.0 / f) as f32,
            HfRopeScaling::Llama3 { .. } => return Err(b.unsupported("llama3 rope scaling")),
        };
        (
            b.opt_f32("", "rope_theta")?.unwrap_or(1_000_000.0),
            b.opt_f32("", "rope_local_base_freq")?.unwrap_or(10_000.0),
            scale,
        )
    };
    let n_rot = if gguf {
        b.opt_u32("rope.dimension_count", "")?.unwrap_or(head_dim)
    } else {
        head_dim
    };

    let scale = if gguf {
        if n_layers == 62 {
            1.0 / ((hidden / n_heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        }
    } else {
        let q = b
            .opt_f32("", "query_pre_attn_scalar")?
            .unwrap_or(head_dim as f32);
        if q <= 0.0 {
            return Err(b.invalid("query_pre_attn_scalar", "must be positive".into()));
        }
        1.0 / q.sqrt()
    };
    let softcap = b
        .opt_f32("final_logit_softcapping", "final_logit_softcapping")?
        .filter(|&c| c > 0.0);
    if !gguf {
        if let Some(c) = b
            .opt_f32("", "attn_logit_softcapping")?
            .filter(|&c| c > 0.0)
        {
            return Err(b.unsupported(format!("attention logit soft-capping {c}")));
        }
        if let Some(act) = b.opt("", "hidden_activation").and_then(|v| v.as_str())
            && act != "gelu_pytorch_tanh"
        {
            return Err(b.unsupported(format!("hidden_activation {act:?}")));
        }
    }
    let off = if gguf { 0.0 } else { 1.0 };

    let vocab_hint = b.opt_u32("vocab_size", "vocab_size")?;
    let (embd_name, head_name, final_norm_name) = if gguf {
        ("token_embd.weight", "output.weight", "output_norm.weight")
    } else {
        (
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.norm.weight",
        )
    };
    let vocab = match (vocab_hint, src.tensor(embd_name)) {
        (Some(v), _) => v as u64,
        (None, Some(t)) => t.shape.first().copied().unwrap_or(0),
        (None, None) => 0,
    };
    let embd = b.weight(embd_name, &[vocab, hidden as u64])?;

    let mut layers = Vec::with_capacity(n_layers as usize);
    let (h, hd, q_out, kv_out, f) = (
        hidden as u64,
        head_dim as u64,
        n_heads * head_dim,
        n_kv_heads * head_dim,
        ffn,
    );
    for il in 0..n_layers {
        let n = |g: &str, hf: &str| {
            if gguf {
                format!("blk.{il}.{g}.weight")
            } else {
                format!("model.layers.{il}.{hf}.weight")
            }
        };
        let swa = is_swa[il as usize];
        let attention = Attention {
            norm: b.norm(&n("attn_norm", "input_layernorm"), h, eps, off)?,
            q: b.linear(&n("attn_q", "self_attn.q_proj"), None, hidden, q_out)?,
            k: b.linear(&n("attn_k", "self_attn.k_proj"), None, hidden, kv_out)?,
            v: b.linear(&n("attn_v", "self_attn.v_proj"), None, hidden, kv_out)?,
            o: b.linear(&n("attn_output", "self_attn.o_proj"), None, q_out, hidden)?,
            q_norm: Some(b.norm(&n("attn_q_norm", "self_attn.q_norm"), hd, eps, off)?),
            k_norm: Some(b.norm(&n("attn_k_norm", "self_attn.k_norm"), hd, eps, off)?),
            sub_norm: None,
            post_norm: Some(b.norm(
                &n("post_attention_norm", "post_attention_layernorm"),
                h,
                eps,
                off,
            )?),
            n_heads,
            n_kv_heads,
            head_dim,
            rope: Rope {
                style: RopeStyle::Neox,
                n_rot,
                base: if swa { base_local } else { base_global },
                freq_scale: if swa { 1.0 } else { scale_global },
                freq_factors: None,
            },
            window: if swa { window } else { None },
            scale,
            clip_qkv: None,
        };
        let ffn = FfnRegion::Dense(Ffn {
            norm: b.norm(&n("ffn_norm", "pre_feedforward_layernorm"), h, eps, off)?,
            gate: b.linear(&n("ffn_gate", "mlp.gate_proj"), None, hidden, f)?,
            up: b.linear(&n("ffn_up", "mlp.up_proj"), None, hidden, f)?,
            down: b.linear(&n("ffn_down", "mlp.down_proj"), None, f, hidden)?,
            activation: Activation::GeluTanh,
            sub_norm: None,
            post_norm: Some(b.norm(
                &n("post_ffw_norm", "post_feedforward_layernorm"),
                h,
                eps,
                off,
            )?),
        });
        layers.push(LayerRegion {
            index: il,
            attention,
            ffn,
        });
    }
    let final_norm = b.norm(final_norm_name, h, eps, off)?;
    let tie = gguf
        || b.src
            .get("tie_word_embeddings")
            .and_then(|v| v.as_bool())
            .unwrap_or(true);
    let (head_w, tied) = match b.opt_weight(head_name, &[vocab, h])? {
        Some(w) if !tie || gguf => (w, false),
        Some(_) => (embd, true),
        None => (embd, true),
    };
    if tied {
        b.ignore(head_name);
    }
    let lm_head = LmHead {
        linear: Linear {
            weight: head_w,
            bias: None,
            in_features: hidden,
            out_features: vocab as u32,
            scale: None,
        },
        tied,
        softcap,
        logit_scale: None,
    };
    let special = b.special_tokens(true);
    let weights = b.finish()?;
    let aliases = if tied {
        vec![TiedAlias {
            alias: head_name.to_string(),
            target: embd,
        }]
    } else {
        vec![]
    };
    Ok(ModelIr {
        family: Family::Gemma3,
        source: src.kind,
        hparams: HyperParams {
            vocab_size: vocab as u32,
            hidden,
            n_layers,
            context_length: ctx,
        },
        weights,
        aliases,
        embedding: Embedding {
            weight: embd,
            scale: (hidden as f32).sqrt(),
        },
        layers,
        final_norm,
        residual_scale: None,
        projection_quant: None,
        lm_head,
        special,
        fingerprint: String::new(),
    })
}

/// Per-layer "slides?" flags.
fn swa_pattern(b: &Builder<'_>, n_layers: u32) -> Result<Vec<bool>> {
    let n = n_layers as usize;
    // Explicit per-layer lists first.
    if b.is_gguf() {
        match b.opt("attention.sliding_window_pattern", "") {
            Some(MetaValue::Numbers(v)) if v.len() == n => {
                return Ok(v.iter().map(|x| *x != 0.0).collect());
            }
            Some(MetaValue::Numbers(v)) => {
                return Err(b.invalid(
                    "attention.sliding_window_pattern",
                    format!("{} entries for {n} layers", v.len()),
                ));
            }
            Some(v) => {
                let p = v.as_i64().unwrap_or(0);
                return Ok(period_pattern(n, p));
            }
            None => return Ok(period_pattern(n, 6)),
        }
    }
    if let Some(MetaValue::Strings(types)) = b.src.get("layer_types") {
        if types.len() != n {
            return Err(b.invalid(
                "layer_types",
                format!("{} entries for {n} layers", types.len()),
            ));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(b.unsupported(format!("layer type {other:?}"))),
            })
            .collect();
    }
    let p = b
        .src
        .get("sliding_window_pattern")
        .and_then(|v| v.as_i64())
        .unwrap_or(6);
    Ok(period_pattern(n, p))
}

/// llama.cpp's rule: layer `il` slides when `il % period < period - 1` (period 0: all slide).
fn period_pattern(n: usize, period: i64) -> Vec<bool> {
    (0..n)
        .map(|il| {
            if period <= 0 {
                true
            } else {
                (il as i64 % period) < period - 1
            }
        })
        .collect()
}
