#!/usr/bin/env python3
"""llama.cpp's convert_hf_to_gguf.py, with two adaptations for the tiny test models only.

Usage: python convert_tiny.py LLAMA_CPP_DIR MODEL_DIR --outfile OUT.gguf --outtype f32|q8_0

- OLMoE and Qwen2-MoE: the converter reads their vocabularies as GPT-2 BPE through transformers'
  fast tokenizer (the real models ship tokenizer.json); the tiny models carry a SentencePiece
  tokenizer.model, so set_vocab takes the converter's own SentencePiece path instead.
- BitNet: transformers' BitNetForCausalLM names the sub-norms `self_attn.attn_sub_norm` and
  `mlp.ffn_sub_norm`; the converter's table knows only the 1bitLLM names (`inner_attn_ln`,
  `ffn_layernorm`), so the transformers names are added to the same GGUF tensors.
Everything else (tensor layouts, quantization, metadata) is the converter's own.
"""
import sys
from pathlib import Path

llama_dir = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(llama_dir / "gguf-py"))
sys.path.insert(0, str(llama_dir))

import gguf  # noqa: E402
from gguf.tensor_mapping import TensorNameMap  # noqa: E402

T = gguf.MODEL_TENSOR
TensorNameMap.block_mappings_cfg[T.ATTN_SUB_NORM] = (
    TensorNameMap.block_mappings_cfg[T.ATTN_SUB_NORM] + ("model.layers.{bid}.self_attn.attn_sub_norm",))
TensorNameMap.block_mappings_cfg[T.FFN_SUB_NORM] = (
    TensorNameMap.block_mappings_cfg[T.FFN_SUB_NORM] + ("model.layers.{bid}.mlp.ffn_sub_norm",))

import conversion.olmo  # noqa: E402

conversion.olmo.OlmoeModel.set_vocab = lambda self: self._set_vocab_sentencepiece()

import conversion.qwen  # noqa: E402

conversion.qwen.Qwen2MoeModel.set_vocab = lambda self: self._set_vocab_sentencepiece()

import convert_hf_to_gguf  # noqa: E402

sys.argv = [str(llama_dir / "convert_hf_to_gguf.py")] + sys.argv[2:]
convert_hf_to_gguf.main()
