//! Llama 2/3 (and SmolLM2 and relatives): RMSNorm, SiLU-gated FFN, GQA, optional biases,
//! RoPE with linear or Llama-3 frequency scaling, tied or untied head.
//!
//! Facts: llama.cpp's GGUF converter permutes the rows of `q`/`k` so that ggml's interleaved
//! ("normal") RoPE reproduces HF's `rotate_half`; so a GGUF Llama uses [`RopeStyle::Interleaved`]
//! and an HF checkpoint [`RopeStyle::Neox`]. Llama 3 scaling is a stored `rope_freqs.weight`
//! in GGUF and `rope_scaling: {rope_type: llama3, …}` in `config.json`.

use crate::error::Result;
use crate::family::moe::{self, HfExperts, MoeSpec};
use crate::family::{
    Builder, CoreDims, HfRopeScaling, gguf_rope_freq_scale, hf_rope_scaling, llama3_freq_factors,
};
use crate::ir::*;
use crate::source::{MetaValue, SourceDesc};

/// Options that distinguish llama-like families sharing this graph.
pub(crate) struct LlamaLike {
    pub family: Family,
    pub name: &'static str,
    /// q/k/v biases are required (Qwen2).
    pub qkv_bias_required: bool,
    /// RoPE style for GGUF sources.
    pub gguf_rope: RopeStyle,
    /// Default for `tie_word_embeddings` when `config.json` does not say.
    pub hf_tie_default: bool,
    /// q/k RMSNorms over the whole projection (OLMoE).
    pub qk_norm: bool,
    /// Granite's embedding, residual, attention and logit multipliers.
    pub granite: bool,
    /// BitNet's sub-norms (attention output, FFN product), its activation (`relu2` or
    /// `silu` from `config.json`; SiLU in GGUF, as llama.cpp's graph hard-codes it) and a
    /// GGUF head that is always the embedding.
    pub bitnet: bool,
    /// bitnet.cpp's `bitnet-b1.58` GGUF (microsoft/bitnet-b1.58-2B-4T): ReLU², its own head
    /// when it stores `output.weight`, projections in I2_S (W1.58A8).
    pub b158: bool,
    /// The family's mixture-of-experts blocks (a GGUF `llama` is Mixtral exactly when it
    /// stores experts, so it needs none).
    pub moe: Option<MoeSpec>,
}

/// Builds the IR of a Llama model.
pub fn build(src: &SourceDesc) -> Result<ModelIr> {
    build_llama_like(
        src,
        LlamaLike {
            family: Family::Llama,
            name: "llama",
            qkv_bias_required: false,
            gguf_rope: RopeStyle::Interleaved,
            hf_tie_default: false,
            qk_norm: false,
            granite: false,
            bitnet: false,
            b158: false,
            moe: None,
        },
    )
}

/// Builds the IR of a Mixtral checkpoint (transformers' `mixtral`; its GGUFs are `llama`).
pub fn build_mixtral(src: &SourceDesc) -> Result<ModelIr> {
    build_llama_like(
        src,
        LlamaLike {
            family: Family::Llama,
            name: "mixtral",
            qkv_bias_required: false,
            gguf_rope: RopeStyle::Interleaved,
            hf_tie_default: false,
            qk_norm: false,
            granite: false,
            bitnet: false,
            b158: false,
            moe: Some(MoeSpec {
                hf: HfExperts::Mixtral,
                gguf_renormalize: true,
                shared: false,
            }),
        },
    )
}

/// A `quantization_config` this engine runs: BitNet's W1.58A8, online (transformers'
/// `AutoBitLinear` over full-precision masters) or offline (its `BitLinear` over packed
/// `uint8` weights with `weight_scale`). Everything else is refused: `use_rms_norm`, and any
/// other method (GPTQ/AWQ packings change what the stored tensors mean).
fn bitnet_quant(b: &Builder<'_>, bitnet: bool, q: &MetaValue) -> Result<ProjectionQuant> {
    let json = match q {
        MetaValue::Json(j) => Some(j),
        _ => None,
    };
    let get = |k: &str| json.and_then(|j| j.get(k));
    let field = |k: &str| get(k).and_then(|v| v.as_str());
    let bitnet = bitnet
        && field("quant_method") == Some("bitnet")
        && get("use_rms_norm").and_then(|v| v.as_bool()) != Some(true);
    // transformers' defaults: linear_class bitlinear, quantization_mode offline.
    let class = field("linear_class").unwrap_or("bitlinear");
    let mode = field("quantization_mode").unwrap_or("offline");
    match (bitnet, class, mode) {
        (true, "autobitlinear", "online") => Ok(ProjectionQuant::BitnetW158A8),
        (true, "bitlinear", "offline") => Ok(ProjectionQuant::BitnetW158A8Packed),
        _ => Err(b.unsupported(format!(
            "quantization_config {q:?} (supported: BitNet's quant_method bitnet with \
             linear_class autobitlinear, quantization_mode online over BF16/F32 masters, or \
             linear_class bitlinear, quantization_mode offline over packed uint8 weights)"
        ))),
    }
}

pub(crate) fn build_llama_like(src: &SourceDesc, o: LlamaLike) -> Result<ModelIr> {
    let mut b = Builder::new(o.name, src);
    let gguf = b.is_gguf();
    let CoreDims {
        n_layers,
        hidden,
        ffn,
        n_heads,
        n_kv_heads,
        head_dim,
    } = b.core_dims()?;
    let eps = b
        .opt_f32("attention.layer_norm_rms_epsilon", "rms_norm_eps")?
        .unwrap_or(1e-6);
    let ctx = b
        .opt_u32("context_length", "max_position_embeddings")?
        .unwrap_or(4096);
    let base = b
        .opt_f32("rope.freq_base", "rope_theta")?
        .unwrap_or(10_000.0);
    let n_rot = if gguf {
        b.opt_u32("rope.dimension_count", "")?.unwrap_or(head_dim)
    } else {
        head_dim
    };
    if n_rot > head_dim || n_rot % 2 != 0 {
        return Err(b.invalid(
            "rope.dimension_count",
            format!("{n_rot} for head dim {head_dim}"),
        ));
    }
    let mut activation = Activation::Silu;
    let mut projection_quant = None;
    if gguf && o.b158 {
        // bitnet.cpp's `build_bitnet_158`: ReLU² (microsoft/bitnet-b1.58-2B-4T), I2_S weights.
        activation = Activation::Relu2;
        projection_quant = Some(ProjectionQuant::BitnetI2S);
    }
    if !gguf {
        match b.opt("", "hidden_act").and_then(|v| v.as_str()) {
            // transformers' BitNetConfig defaults to relu2.
            None if o.bitnet => activation = Activation::Relu2,
            None | Some("silu") => {}
            Some("relu2") if o.bitnet => activation = Activation::Relu2,
            Some(act) => return Err(b.unsupported(format!("hidden_act {act:?}"))),
        }
        if b.src.get("use_sliding_window").and_then(|v| v.as_bool()) == Some(true) {
            return Err(b.unsupported("use_sliding_window = true"));
        }
        if let Some(w) = b.src.get("sliding_window")
            && o.moe.is_some_and(|m| m.hf == HfExperts::Mixtral)
        {
            return Err(b.unsupported(format!("Mixtral sliding_window {w:?}")));
        }
        // A quantization_config changes what the stored weights mean (BitNet's W1.58A8:
        // ternarised weights and 8-bit activations at run time; GPTQ/AWQ packings): reading
        // the tensors as plain weights would run another model.
        if let Some(q) = b.src.get("quantization_config") {
            projection_quant = Some(bitnet_quant(&b, o.bitnet, q)?);
        }
    }
    // OLMoE's clip_qkv (transformers clamps q and k after their norms, and v). llama.cpp's
    // converter drops it and its OLMoE graph never clamps, so a GGUF carries none.
    let clip_qkv = if gguf {
        None
    } else {
        match b.opt_f32("", "clip_qkv")? {
            None => None,
            Some(c) if o.family == Family::Olmoe && c > 0.0 => Some(c),
            Some(c) if o.family == Family::Olmoe => {
                return Err(b.invalid("clip_qkv", format!("{c} is not positive")));
            }
            Some(c) => return Err(b.unsupported(format!("clip_qkv {c}"))),
        }
    };
    // Granite's multipliers (1 = absent).
    let granite = |gguf_key: &str, hf_key: &str| -> Result<Option<f32>> {
        if !o.granite {
            return Ok(None);
        }
        Ok(b.opt_f32(gguf_key, hf_key)?
            .filter(|&x| x != 1.0 && x != 0.0))
    };
    let embedding_scale = granite("embedding_scale", "embedding_multiplier")?;
    let residual_scale = granite("residual_scale", "residual_multiplier")?;
    let attention_scale = granite("attention.scale", "attention_multiplier")?;
    let logit_divisor = granite("logit_scale", "logits_scaling")?;

    let (embd_name, head_name, final_norm_name) = if gguf {
        ("token_embd.weight", "output.weight", "output_norm.weight")
    } else {
        (
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.norm.weight",
        )
    };
    let vocab = match (
        b.opt_u32("vocab_size", "vocab_size")?,
        src.tensor(embd_name),
    ) {
        (Some(v), _) => v as u64,
        (None, Some(t)) => t.shape.first().copied().unwrap_or(0),
        (None, None) => 0,
    };
    let embd = b.weight(embd_name, &[vocab, hidden as u64])?;

    // RoPE scaling.
    let (freq_scale, freq_factors) = if gguf {
        let fs = gguf_rope_freq_scale(&b)?;
        let ff = b.opt_weight("rope_freqs.weight", &[(n_rot / 2) as u64])?;
        (fs, ff.map(FreqFactors::Weight))
    } else {
        match hf_rope_scaling(&b)? {
            HfRopeScaling::None => (1.0, None),
            HfRopeScaling::Linear(f) => ((1.0 / f) as f32, None),
            HfRopeScaling::Llama3 {
                factor,
                low,
                high,
                original_max,
            } => (
                1.0,
                Some(FreqFactors::Values(llama3_freq_factors(
                    base,
                    n_rot,
                    factor,
                    low,
                    high,
                    original_max,
                ))),
            ),
        }
    };
    let style = if gguf { o.gguf_rope } else { RopeStyle::Neox };

    let h = hidden as u64;
    let q_out = n_heads * head_dim;
    let kv_out = n_kv_heads * head_dim;
    let mut layers = Vec::with_capacity(n_layers as usize);
    for il in 0..n_layers {
        let n = |g: &str, hf: &str, suffix: &str| {
            if gguf {
                format!("blk.{il}.{g}.{suffix}")
            } else {
                format!("model.layers.{il}.{hf}.{suffix}")
            }
        };
        let packed = projection_quant == Some(ProjectionQuant::BitnetW158A8Packed);
        let i2s = projection_quant == Some(ProjectionQuant::BitnetI2S);
        let lin = |b: &mut Builder<'_>, g: &str, hf: &str, i: u32, out: u32| {
            let bias = n(g, hf, "bias");
            if packed {
                b.packed_linear(
                    &n(g, hf, "weight"),
                    &n(g, hf, "weight_scale"),
                    &bias,
                    i,
                    out,
                )
            } else if i2s {
                b.i2s_linear(&n(g, hf, "weight"), &bias, i, out)
            } else {
                b.linear(&n(g, hf, "weight"), Some(&bias), i, out)
            }
        };
        let q = lin(&mut b, "attn_q", "self_attn.q_proj", hidden, q_out)?;
        let k = lin(&mut b, "attn_k", "self_attn.k_proj", hidden, kv_out)?;
        let v = lin(&mut b, "attn_v", "self_attn.v_proj", hidden, kv_out)?;
        if o.qkv_bias_required {
            b.require_bias(&q, &n("attn_q", "self_attn.q_proj", "bias"))?;
            b.require_bias(&k, &n("attn_k", "self_attn.k_proj", "bias"))?;
            b.require_bias(&v, &n("attn_v", "self_attn.v_proj", "bias"))?;
        }
        let (q_norm, k_norm) = if o.qk_norm {
            (
                Some(b.norm(
                    &n("attn_q_norm", "self_attn.q_norm", "weight"),
                    q_out as u64,
                    eps,
                    0.0,
                )?),
                Some(b.norm(
                    &n("attn_k_norm", "self_attn.k_norm", "weight"),
                    kv_out as u64,
                    eps,
                    0.0,
                )?),
            )
        } else {
            (None, None)
        };
        // BitNet's sub-norms: 2B4T's names, or 1bitLLM's (`inner_attn_ln`, `ffn_layernorm`).
        let sub_norm = |b: &mut Builder<'_>, g: &str, hf: [&str; 2], len: u32| -> Result<_> {
            if !o.bitnet {
                return Ok(None);
            }
            let name = if gguf || src.tensor(&n(g, hf[0], "weight")).is_some() {
                n(g, hf[0], "weight")
            } else {
                n(g, hf[1], "weight")
            };
            Ok(Some(b.norm(&name, len as u64, eps, 0.0)?))
        };
        let attn_sub_norm = sub_norm(
            &mut b,
            "attn_sub_norm",
            ["self_attn.attn_sub_norm", "self_attn.inner_attn_ln"],
            q_out,
        )?;
        let attention = Attention {
            norm: b.norm(&n("attn_norm", "input_layernorm", "weight"), h, eps, 0.0)?,
            q,
            k,
            v,
            o: lin(&mut b, "attn_output", "self_attn.o_proj", q_out, hidden)?,
            q_norm,
            k_norm,
            sub_norm: attn_sub_norm,
            post_norm: None,
            n_heads,
            n_kv_heads,
            head_dim,
            rope: Rope {
                style,
                n_rot,
                base,
                freq_scale,
                freq_factors: freq_factors.clone(),
            },
            window: None,
            scale: attention_scale.unwrap_or(1.0 / (head_dim as f32).sqrt()),
            clip_qkv,
        };
        let norm = b.norm(
            &n("ffn_norm", "post_attention_layernorm", "weight"),
            h,
            eps,
            0.0,
        )?;
        let ffn_region = if moe::layer_is_moe(&b, o.moe.as_ref(), il)? {
            FfnRegion::Moe(moe::build_moe(&mut b, o.moe.as_ref(), il, hidden, norm)?)
        } else {
            FfnRegion::Dense(Ffn {
                norm,
                gate: lin(&mut b, "ffn_gate", "mlp.gate_proj", hidden, ffn)?,
                up: lin(&mut b, "ffn_up", "mlp.up_proj", hidden, ffn)?,
                down: lin(&mut b, "ffn_down", "mlp.down_proj", ffn, hidden)?,
                activation,
                sub_norm: sub_norm(
                    &mut b,
                    "ffn_sub_norm",
                    ["mlp.ffn_sub_norm", "mlp.ffn_layernorm"],
                    ffn,
                )?,
                post_norm: None,
            })
        };
        layers.push(LayerRegion {
            index: il,
            attention,
            ffn: ffn_region,
        });
    }
    let final_norm = b.norm(final_norm_name, h, eps, 0.0)?;
    let tie = if gguf {
        // llama.cpp's bitnet graph always multiplies by `token_embd`; bitnet.cpp's
        // `bitnet-b1.58` one by `output` when the file has it.
        o.bitnet && !o.b158
    } else {
        b.src
            .get("tie_word_embeddings")
            .and_then(|v| v.as_bool())
            .unwrap_or(o.hf_tie_default)
    };
    let (head_w, tied) = match b.opt_weight(head_name, &[vocab, h])? {
        Some(w) if !tie => (w, false),
        _ => (embd, true),
    };
    if tied {
        b.ignore(head_name);
    }
    let special = b.special_tokens(o.family == Family::Llama);
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
        family: o.family,
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
            scale: embedding_scale.unwrap_or(1.0),
        },
        layers,
        final_norm,
        residual_scale,
        projection_quant,
        lm_head: LmHead {
            linear: Linear {
                weight: head_w,
                bias: None,
                in_features: hidden,
                out_features: vocab as u32,
                scale: None,
            },
            tied,
            softcap: None,
            logit_scale: logit_divisor.map(|d| 1.0 / d),
        },
        special,
        fingerprint: String::new(),
    })
}
