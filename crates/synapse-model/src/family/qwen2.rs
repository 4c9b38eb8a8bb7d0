//! Qwen2: the Llama graph with q/k/v biases and NeoX RoPE in GGUF too (llama.cpp's converter
//! does not permute Qwen2's q/k). `tie_word_embeddings` defaults to false in `config.json`.

use crate::error::Result;
use crate::family::llama::{LlamaLike, build_llama_like};
use crate::ir::*;
use crate::source::SourceDesc;

/// Builds the IR of a Qwen2 model.
pub fn build(src: &SourceDesc) -> Result<ModelIr> {
    build_llama_like(
        src,
        LlamaLike {
            family: Family::Qwen2,
            name: "qwen2",
            qkv_bias_required: true,
            gguf_rope: RopeStyle::Neox,
            hf_tie_default: false,
            qk_norm: false,
            granite: false,
            bitnet: false,
            b158: false,
            moe: None,
        },
    )
}
