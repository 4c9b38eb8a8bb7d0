//! BitNet b1.58: the Llama graph plus an RMSNorm on the attention output (before `o`) and
//! on the gated FFN product (before `down`), NeoX RoPE in GGUF and `config.json` alike
//! (llama.cpp's converter does not permute BitNet's q/k), a head tied to the embedding in
//! GGUF (llama.cpp's graph always uses `token_embd`).
//!
//! Both published layouts: microsoft/bitnet-b1.58-2B-4T (transformers' `BitNetForCausalLM`:
//! `attn_sub_norm` / `ffn_sub_norm`, `hidden_act: relu2`) and 1bitLLM's `bitnet_b1_58`
//! (`inner_attn_ln` / `ffn_layernorm`, SiLU), which is what llama.cpp's `bitnet` graph
//! implements (SiLU hard-coded, so a GGUF is always SiLU). A 1bitLLM `config.json` says
//! `model_type: llama` with `architectures: [BitnetForCausalLM]`; the source description
//! maps it here. transformers' `BitNetConfig` defaults: `hidden_act` relu2, untied head.

use crate::error::Result;
use crate::family::llama::{LlamaLike, build_llama_like};
use crate::ir::*;
use crate::source::SourceDesc;

/// The adapter's options: llama.cpp's `bitnet` graph (`b158: false`) or bitnet.cpp's
/// `bitnet-b1.58` one.
fn options(name: &'static str, b158: bool) -> LlamaLike {
    LlamaLike {
        family: Family::Bitnet,
        name,
        qkv_bias_required: false,
        gguf_rope: RopeStyle::Neox,
        hf_tie_default: false,
        qk_norm: false,
        granite: false,
        bitnet: true,
        b158,
        moe: None,
    }
}

/// Builds the IR of a BitNet b1.58 model.
pub fn build(src: &SourceDesc) -> Result<ModelIr> {
    build_llama_like(src, options("bitnet", false))
}

/// Builds the IR of a bitnet.cpp `bitnet-b1.58` GGUF (its conversion of
/// microsoft/bitnet-b1.58-2B-4T): the 2B4T graph (sub-norms, ReLU², NeoX RoPE), projections in
/// I2_S run as W1.58A8, the head `output.weight` when present (else the embedding).
pub fn build_b158(src: &SourceDesc) -> Result<ModelIr> {
    build_llama_like(src, options("bitnet-b1.58", true))
}
