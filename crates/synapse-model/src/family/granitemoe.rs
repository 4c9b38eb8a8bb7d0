//! Granite MoE: the Llama graph (interleaved RoPE in GGUF: the converter permutes q/k as for
//! Llama) with Granite's multipliers — embeddings × `embedding_multiplier`, each attention and
//! FFN output × `residual_multiplier` before its residual add, attention scores ×
//! `attention_multiplier` (instead of `1/sqrt(head_dim)`), logits ÷ `logits_scaling` (GGUF:
//! `embedding_scale`, `residual_scale`, `attention.scale`, `logit_scale`) — and a mixture of
//! experts in every block: llama.cpp routes by softmax, top-k and renormalisation,
//! transformers by top-k of the logits then softmax.

use crate::error::Result;
use crate::family::llama::{LlamaLike, build_llama_like};
use crate::family::moe::{HfExperts, MoeSpec};
use crate::ir::*;
use crate::source::SourceDesc;

/// Builds the IR of a Granite MoE model.
pub fn build(src: &SourceDesc) -> Result<ModelIr> {
    build_llama_like(
        src,
        LlamaLike {
            family: Family::Granitemoe,
            name: "granitemoe",
            qkv_bias_required: false,
            gguf_rope: RopeStyle::Interleaved,
            hf_tie_default: false,
            qk_norm: false,
            granite: true,
            bitnet: false,
            b158: false,
            moe: Some(MoeSpec {
                hf: HfExperts::Granite,
                gguf_renormalize: true,
                shared: false,
            }),
        },
    )
}
