//! Qwen2-MoE: the Qwen2 graph (q/k/v biases, NeoX RoPE) whose sparse blocks (every one unless
//! `decoder_sparse_step` / `mlp_only_layers` say otherwise) run routed experts (softmax, top-k;
//! llama.cpp never renormalises, transformers when `norm_topk_prob`) plus a shared expert
//! scaled by the sigmoid of a per-token gate. llama.cpp computes that sigmoid as
//! `silu(x) / x`; Synapse does the same for GGUF sources.

use crate::error::Result;
use crate::family::llama::{LlamaLike, build_llama_like};
use crate::family::moe::{HfExperts, MoeSpec};
use crate::ir::*;
use crate::source::SourceDesc;

/// Builds the IR of a Qwen2-MoE model.
pub fn build(src: &SourceDesc) -> Result<ModelIr> {
    build_llama_like(
        src,
        LlamaLike {
            family: Family::Qwen2moe,
            name: "qwen2moe",
            qkv_bias_required: true,
            gguf_rope: RopeStyle::Neox,
            hf_tie_default: false,
            qk_norm: false,
            granite: false,
            bitnet: false,
            b158: false,
            moe: Some(MoeSpec {
                hf: HfExperts::Mlp,
                gguf_renormalize: false,
                shared: true,
            }),
        },
    )
}
