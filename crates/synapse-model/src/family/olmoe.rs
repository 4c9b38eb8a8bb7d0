//! OLMoE: the Llama graph with RMSNorms on q and k over the whole projection (before the
//! split into heads), NeoX RoPE in GGUF too (llama.cpp's converter does not permute OLMoE's
//! q/k), and a mixture of experts in every block (softmax, top-k; llama.cpp never
//! renormalises, transformers when `norm_topk_prob`).

use crate::error::Result;
use crate::family::llama::{LlamaLike, build_llama_like};
use crate::family::moe::{HfExperts, MoeSpec};
use crate::ir::*;
use crate::source::SourceDesc;

/// Builds the IR of an OLMoE model.
pub fn build(src: &SourceDesc) -> Result<ModelIr> {
    build_llama_like(
        src,
        LlamaLike {
            family: Family::Olmoe,
            name: "olmoe",
            qkv_bias_required: false,
            gguf_rope: RopeStyle::Neox,
            hf_tie_default: false,
            qk_norm: true,
            granite: false,
            bitnet: false,
            b158: false,
            moe: Some(MoeSpec {
                hf: HfExperts::Mlp,
                gguf_renormalize: false,
                shared: false,
            }),
        },
    )
}
