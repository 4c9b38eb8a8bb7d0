//! Mixture-of-experts FFN blocks, shared by the llama-like families that have them (OLMoE,
//! Granite MoE, Qwen2-MoE, Mixtral).
//!
//! Facts (llama.cpp `build_moe_ffn` and its per-arch graphs; transformers 4.57):
//! - GGUF stores every layer's experts stacked: `ffn_gate_inp` `[n_expert, hidden]` (the
//!   router), `ffn_{gate,up}_exps` `[n_expert, ff, hidden]`, `ffn_down_exps`
//!   `[n_expert, hidden, ff]`; Qwen2-MoE's shared expert as `ffn_{gate,up,down}_shexp` with
//!   the `[hidden]` sigmoid gate `ffn_gate_inp_shexp`. llama.cpp routes every one of these
//!   families by softmax then top-k; it renormalises the chosen weights for `llama`
//!   (Mixtral) and `granitemoe`, never for `olmoe` and `qwen2moe` (whatever the checkpoint's
//!   `norm_topk_prob` said).
//! - transformers keeps one module per expert (`mlp.experts.E.{gate,up,down}_proj` for OLMoE
//!   and Qwen2-MoE, `block_sparse_moe.experts.E.{w1,w3,w2}` for Mixtral) except GraniteMoE,
//!   whose `input_linear` `[n_expert, 2·ff, hidden]` holds each expert's gate rows then its
//!   up rows, and `output_linear` `[n_expert, hidden, ff]` its down projection. It routes
//!   OLMoE/Qwen2-MoE by softmax, top-k and (with `norm_topk_prob`) renormalisation, Mixtral
//!   the same with renormalisation always, GraniteMoE by top-k of the logits then softmax.

use crate::error::Result;
use crate::family::Builder;
use crate::ir::*;

/// How a family names and routes its experts in a transformers checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HfExperts {
    /// `mlp.gate` and `mlp.experts.E.{gate,up,down}_proj` (OLMoE, Qwen2-MoE); softmax,
    /// top-k, renormalised when `norm_topk_prob`.
    Mlp,
    /// `block_sparse_moe.gate` and `block_sparse_moe.experts.E.{w1,w3,w2}` (Mixtral);
    /// softmax, top-k, always renormalised.
    Mixtral,
    /// `block_sparse_moe.router.layer` and the fused `input_linear` / `output_linear`
    /// (GraniteMoE); top-k of the logits, then softmax.
    Granite,
}

/// What a family's MoE blocks look like.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MoeSpec {
    /// The transformers layout.
    pub hf: HfExperts,
    /// Whether llama.cpp's graph for this architecture renormalises the top-k weights.
    pub gguf_renormalize: bool,
    /// Whether the block has a (Qwen2-MoE) shared expert.
    pub shared: bool,
}

/// Whether layer `il` of a source is a MoE block. GGUF: its router tensor is present (so a
/// `llama` GGUF is Mixtral exactly when it stores experts). transformers: the family has
/// experts and the layer is sparse (Qwen2-MoE's `decoder_sparse_step` / `mlp_only_layers`).
pub(crate) fn layer_is_moe(b: &Builder<'_>, spec: Option<&MoeSpec>, il: u32) -> Result<bool> {
    if b.is_gguf() {
        return Ok(b
            .src
            .tensor(&format!("blk.{il}.ffn_gate_inp.weight"))
            .is_some());
    }
    if spec.is_none() {
        return Ok(false);
    }
    if let Some(only) = b.src.get("mlp_only_layers").and_then(|v| match v {
        crate::source::MetaValue::Numbers(n) => Some(n.clone()),
        _ => None,
    }) && only.contains(&(il as f64))
    {
        return Ok(false);
    }
    let step = b.opt_u32("", "decoder_sparse_step")?.unwrap_or(1).max(1);
    Ok((il + 1).is_multiple_of(step))
}

/// Shape of a tensor the source holds, or the typed missing-tensor error.
fn shape_of(b: &Builder<'_>, name: &str) -> Result<Vec<u64>> {
    b.src.tensor(name).map(|t| t.shape.clone()).ok_or_else(|| {
        crate::error::ModelError::MissingTensor {
            family: b.family,
            name: name.to_string(),
        }
    })
}

/// Builds layer `il`'s MoE block (the caller has checked [`layer_is_moe`]). `spec` is the
/// family's (for a GGUF `llama`, Mixtral's defaults apply when it is `None`).
pub(crate) fn build_moe(
    b: &mut Builder<'_>,
    spec: Option<&MoeSpec>,
    il: u32,
    hidden: u32,
    norm: RmsNorm,
) -> Result<Moe> {
    let spec = spec.copied().unwrap_or(MoeSpec {
        hf: HfExperts::Mixtral,
        gguf_renormalize: true,
        shared: false,
    });
    let h = hidden as u64;
    let n_expert = b.dim("expert_count", "num_experts").or_else(|e| {
        if b.is_gguf() {
            Err(e)
        } else {
            b.dim("", "num_local_experts")
        }
    })?;
    let n_used = b.dim("expert_used_count", "num_experts_per_tok")?;
    if n_used > n_expert {
        return Err(b.invalid(
            "expert_used_count",
            format!("{n_used} experts per token of {n_expert}"),
        ));
    }
    let e = n_expert as u64;
    let gguf = b.is_gguf();
    let hl = |g: &str| format!("model.layers.{il}.{g}");
    let (router_name, routing) = if gguf {
        (
            format!("blk.{il}.ffn_gate_inp.weight"),
            Routing::SoftmaxTopK {
                renormalize: spec.gguf_renormalize,
            },
        )
    } else {
        match spec.hf {
            HfExperts::Mlp => (
                hl("mlp.gate.weight"),
                Routing::SoftmaxTopK {
                    renormalize: b
                        .src
                        .get("norm_topk_prob")
                        .and_then(|v| v.as_bool())
                        .unwrap_or(false),
                },
            ),
            HfExperts::Mixtral => (
                hl("block_sparse_moe.gate.weight"),
                Routing::SoftmaxTopK { renormalize: true },
            ),
            HfExperts::Granite => (
                hl("block_sparse_moe.router.layer.weight"),
                Routing::TopKSoftmax,
            ),
        }
    };
    let router = b.linear(&router_name, None, hidden, n_expert)?;

    let mut experts = Vec::with_capacity(n_expert as usize);
    if gguf || spec.hf == HfExperts::Granite {
        // Stacked experts.
        let (gate_up, down_name) = if gguf {
            (None, format!("blk.{il}.ffn_down_exps.weight"))
        } else {
            (
                Some(hl("block_sparse_moe.input_linear.weight")),
                hl("block_sparse_moe.output_linear.weight"),
            )
        };
        let down_shape = shape_of(b, &down_name)?;
        let ff = match down_shape.as_slice() {
            [_, _, ff] if *ff > 0 && *ff <= u32::MAX as u64 => *ff,
            _ => {
                return Err(b.invalid(
                    &down_name,
                    format!("shape {down_shape:?} is not [n_expert, hidden, ff]"),
                ));
            }
        };
        let down = b.weight(&down_name, &[e, h, ff])?;
        let ff32 = ff as u32;
        let (gate, up, up_offset) = match gate_up {
            Some(fused) => {
                let w = b.weight(&fused, &[e, 2 * ff, h])?;
                (w, w, ff32)
            }
            None => {
                let g = b.weight(&format!("blk.{il}.ffn_gate_exps.weight"), &[e, ff, h])?;
                let u = b.weight(&format!("blk.{il}.ffn_up_exps.weight"), &[e, ff, h])?;
                (g, u, 0)
            }
        };
        for x in 0..n_expert {
            let el = |weight, row_offset, in_features, out_features| ExpertLinear {
                weight,
                expert: Some(x),
                row_offset,
                in_features,
                out_features,
            };
            experts.push(Expert {
                gate: el(gate, 0, hidden, ff32),
                up: el(up, up_offset, hidden, ff32),
                down: el(down, 0, ff32, hidden),
            });
        }
    } else {
        let (g, u, d, prefix) = match spec.hf {
            HfExperts::Mixtral => ("w1", "w3", "w2", "block_sparse_moe.experts"),
            _ => ("gate_proj", "up_proj", "down_proj", "mlp.experts"),
        };
        let gate0 = hl(&format!("{prefix}.0.{g}.weight"));
        let ff = match shape_of(b, &gate0)?.as_slice() {
            [ff, _] if *ff > 0 && *ff <= u32::MAX as u64 => *ff as u32,
            s => return Err(b.invalid(&gate0, format!("shape {s:?} is not [ff, hidden]"))),
        };
        for x in 0..n_expert {
            let mut el = |proj: &str, i: u32, o: u32| -> Result<ExpertLinear> {
                let name = hl(&format!("{prefix}.{x}.{proj}.weight"));
                Ok(ExpertLinear {
                    weight: b.weight(&name, &[o as u64, i as u64])?,
                    expert: None,
                    row_offset: 0,
                    in_features: i,
                    out_features: o,
                })
            };
            experts.push(Expert {
                gate: el(g, hidden, ff)?,
                up: el(u, hidden, ff)?,
                down: el(d, ff, hidden)?,
            });
        }
    }

    let shared = if spec.shared {
        let nm = |g: &str, hf: &str| {
            if gguf {
                format!("blk.{il}.{g}.weight")
            } else {
                hl(&format!("{hf}.weight"))
            }
        };
        let gate_name = nm("ffn_gate_shexp", "mlp.shared_expert.gate_proj");
        let ffs = match shape_of(b, &gate_name)?.as_slice() {
            [ff, _] if *ff > 0 && *ff <= u32::MAX as u64 => *ff as u32,
            s => return Err(b.invalid(&gate_name, format!("shape {s:?} is not [ff, hidden]"))),
        };
        let gate = b.linear(&gate_name, None, hidden, ffs)?;
        let up = b.linear(
            &nm("ffn_up_shexp", "mlp.shared_expert.up_proj"),
            None,
            hidden,
            ffs,
        )?;
        let down = b.linear(
            &nm("ffn_down_shexp", "mlp.shared_expert.down_proj"),
            None,
            ffs,
            hidden,
        )?;
        let gi_name = nm("ffn_gate_inp_shexp", "mlp.shared_expert_gate");
        let gate_inp = if b.src.tensor(&gi_name).is_some() {
            Some(b.linear(&gi_name, None, hidden, 1)?)
        } else {
            None
        };
        Some(SharedExpert {
            gate,
            up,
            down,
            gate_inp,
        })
    } else {
        None
    };
    Ok(Moe {
        norm,
        router,
        routing,
        n_used,
        experts,
        activation: Activation::Silu,
        shared,
        post_norm: None,
    })
}
