"""The tiny BitNet model of fixtures/tiny/bitnet-packed as bitnet.cpp's `bitnet-b1.58` GGUF with
I2_S projections: fixtures/tiny/bitnet-packed/model.i2_s.gguf.

usage: i2s_fixture.py BITNET_CONVERTER PACKED_DIR

BITNET_CONVERTER is microsoft/BitNet's utils/convert-hf-to-gguf-bitnet.py. Its
`quantize_to_i2_s` (numpy only) packs every projection: the function is taken from that file's
source and run as it is (the rest of the converter needs bitnet.cpp's own gguf-py), so the I2_S
bytes are bitnet.cpp's. Each projection's trits are the packed checkpoint's (transformers'
`unpack_weights`) and its I2_S scale `1 / weight_scale` (f32), so the weights are the ones
transformers' `BitLinear` runs: the oracle is the folder's own logits.hf.f32. The container is
written with gguf-py (type id 36 given raw: gguf-py does not know the fork's types). Embedding,
head and norms F32 (the converter writes the embedding and head F16, whose f16-rounded
activations would put the head ~2e-4 off transformers' and hide what this fixture checks).
"""
import ast
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file
import sentencepiece as spm
import gguf

I2_S = 36
PROJ = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down"}
NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.attn_sub_norm": "attn_sub_norm", "mlp.ffn_sub_norm": "ffn_sub_norm"}


def bitnet_quantize_to_i2_s(converter: str):
    src = open(converter).read()
    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "quantize_to_i2_s")
    ns = {"np": np}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), converter, "exec"), ns)
    return ns["quantize_to_i2_s"]


def main():
    converter, d = sys.argv[1], sys.argv[2]
    quantize_to_i2_s = bitnet_quantize_to_i2_s(converter)
    from transformers.integrations.bitnet import unpack_weights
    cfg = json.load(open(os.path.join(d, "config.json")))
    sd = load_file(os.path.join(d, "model.safetensors"))
    out = os.path.join(d, "model.i2_s.gguf")
    w = gguf.GGUFWriter(out, "bitnet-b1.58")
    h, nl = cfg["hidden_size"], cfg["num_hidden_layers"]
    w.add_name("tiny bitnet-packed as I2_S")
    w.add_block_count(nl)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(h // cfg["num_attention_heads"])
    w.add_vocab_size(cfg["vocab_size"])
    sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
    toks, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        toks.append(sp.id_to_piece(i).encode())
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    f32 = lambda t: t.float().numpy().astype(np.float32)
    w.add_tensor("token_embd.weight", f32(sd["model.embed_tokens.weight"]))
    w.add_tensor("output.weight", f32(sd["lm_head.weight"]))
    w.add_tensor("output_norm.weight", f32(sd["model.norm.weight"]))
    for il in range(nl):
        for hf, g in NORMS.items():
            w.add_tensor(f"blk.{il}.{g}.weight", f32(sd[f"model.layers.{il}.{hf}.weight"]))
        for hf, g in PROJ.items():
            packed = sd[f"model.layers.{il}.{hf}.weight"]
            ws = float(sd[f"model.layers.{il}.{hf}.weight_scale"].float()[0])
            t = unpack_weights(packed, dtype=torch.float32).numpy()
            b = quantize_to_i2_s(t, override_scale=np.float32(1.0) / np.float32(ws))
            assert b.dtype == np.uint8 and b.size == t.size // 4 + 32, (b.dtype, b.size)
            w.add_tensor(f"blk.{il}.{g}.weight", b.view(np.int8), raw_shape=list(t.shape),
                         raw_dtype=I2_S)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"  wrote {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    torch._dynamo.config.disable = True  # unpack_weights is @torch.compile'd: run it eagerly
    main()
