#!/usr/bin/env python3
"""A small llama-architecture model of real row widths in every commonly used ggml weight type,
quantized by llama.cpp itself, with llama.cpp's logits: the end-to-end oracle for the encodings no
real model in the parity suite holds.

Run by `cargo xtask quant-models` (see fixtures/README.md); never by the tests.

Usage: python quant_models.py OUT_DIR

The tiny-model fixtures have rows of 64 values, too narrow for the 256-value super-blocks of the
K-quants and IQ4_XS (llama.cpp falls back to other types there). This model: llama architecture,
hidden 256, 4 query heads and 2 KV heads of 64 (2:1 GQA, normal RoPE), FFN 256 (SwiGLU), 2 layers,
untied output head, the tiny llama fixture's 512-piece tokenizer; seeded weights ~ N(0, 0.05),
norm weights ~ 1 + N(0, 0.1). Written as an F32 GGUF with gguf-py, then `llama_model_quantize`
with `pure` (every matrix, the embeddings and the head in the one type) to each of TYPES.

Writes OUT_DIR/:
  model.<type>.gguf        the quantized models (no F32 master is kept)
  logits.<type>.f32        llama.cpp's logits at every position of each sequence (one batch per
                           sequence), then after each of NGEN greedy decode steps (one-row batches),
                           little-endian f32 rows of n_vocab: [positions..., steps...] per sequence
  oracle.json              the sequences, per type: file, tensor types, greedy ids, row counts
Settings as the parity fixtures: 1 thread, f32 KV cache, flash attention off, no extra buffers.
Fails if a quantized file holds a matrix of another type than asked (a silent fallback).
"""
from __future__ import annotations

import ctypes
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_fixtures as P  # noqa: E402
import llama_cpp as L  # noqa: E402
import gguf  # noqa: E402

H, NH, NKV, FF, LAYERS, SEED, NGEN = 256, 4, 2, 256, 2, 7, 8
# ggml types no real parity model holds, as llama.cpp's ftype ids (llama.h) and ggml type names.
TYPES = [
    ("q4_0", 2, "Q4_0"), ("q5_1", 9, "Q5_1"), ("q2_k", 10, "Q2_K"), ("q3_k", 11, "Q3_K"),
    ("q5_k", 16, "Q5_K"), ("iq4_nl", 25, "IQ4_NL"), ("iq4_xs", 30, "IQ4_XS"), ("bf16", 32, "BF16"),
    ("f16", 1, "F16"),
    # The i-quant grids (llama.cpp's quantizer wants an importance matrix for these: a seeded
    # positive one per tensor, see `imatrix`).
    ("iq2_xxs", 19, "IQ2_XXS"), ("iq2_xs", 20, "IQ2_XS"), ("iq2_s", 29, "IQ2_S"),
    ("iq3_xxs", 23, "IQ3_XXS"), ("iq3_s", 26, "IQ3_S"), ("iq1_s", 24, "IQ1_S"), ("iq1_m", 31, "IQ1_M"),
]
IMATRIX_TYPES = {"iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"}


def write_f32(tiny_llama: str, out: str) -> None:
    src = gguf.GGUFReader(tiny_llama)
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("synapse-quant-oracle")
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(H // NH)
    w.add_file_type(0)
    # The tokenizer of the tiny llama fixture, field for field.
    for name, field in src.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vt = field.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            et = field.types[1]
            if et == gguf.GGUFValueType.STRING:
                val = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                val = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(name, val)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            w.add_key_value(name, field.parts[field.data[0]].tolist()[0], vt)
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)

    def mat(rows, cols):
        return rng.normal(0.0, 0.05, size=(rows, cols)).astype(np.float32)

    def norm():
        return (1.0 + rng.normal(0.0, 0.1, size=(H,))).astype(np.float32)

    kv = NKV * (H // NH)
    w.add_tensor("token_embd.weight", mat(vocab, H))
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(H, H))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(kv, H))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(kv, H))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(H, H))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(FF, H))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(FF, H))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(H, FF))
    w.add_tensor("output_norm.weight", norm())
    w.add_tensor("output.weight", mat(vocab, H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def imatrix(src: str):
    """A seeded importance matrix for every matrix of `src` (per column, in 0.5..2): what
    llama.cpp's imatrix tool would hand the quantizer, made up. Returns the ctypes array and what
    keeps its buffers alive."""
    r = gguf.GGUFReader(src)
    mats = sorted((t.name, int(t.shape[0])) for t in r.tensors if len(t.shape) == 2)
    rng = np.random.default_rng(SEED + 1)
    arr = (L.llama_model_imatrix_data * (len(mats) + 1))()
    keep = [arr]
    for i, (name, cols) in enumerate(mats):
        buf = (ctypes.c_float * cols)(*rng.uniform(0.5, 2.0, size=cols).astype(np.float32))
        nm = name.encode()
        keep.append((buf, nm))
        arr[i].name = nm
        arr[i].data = ctypes.cast(buf, ctypes.POINTER(ctypes.c_float))
        arr[i].size = cols
    arr[len(mats)].name = None
    return arr, keep


def quantize(src: str, dst: str, ftype: int, with_imatrix: bool = False) -> None:
    qp = L.llama_model_quantize_default_params()
    qp.ftype = ftype
    qp.pure = True
    qp.nthread = 1
    if with_imatrix:
        arr, keep = imatrix(src)
        qp.imatrix = ctypes.cast(arr, ctypes.POINTER(L.llama_model_imatrix_data))
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(qp))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {dst}: rc {rc}")


def tensor_types(path: str) -> dict[str, str]:
    r = gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name for t in r.tensors}


def run(path: str, seqs: list[list[int]]):
    model = P.load(path, False)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 128, 128, 128, 1
    cp.n_threads = cp.n_threads_batch = 1
    cp.type_k = cp.type_v = 0
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    b = L.llama_batch_init(128, 0, 1)
    rows, greedy = [], []
    try:
        for s in seqs:
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            b.n_tokens = len(s)
            for i, t in enumerate(s):
                b.token[i] = t; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1
            if L.llama_decode(ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            for i in range(len(s)):
                rows.append(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy())
            lg, pos, gen = rows[-1], len(s), []
            for _ in range(NGEN):
                nxt = int(np.argmax(lg))
                gen.append(nxt)
                b.n_tokens = 1
                b.token[0] = nxt; b.pos[0] = pos; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1
                if L.llama_decode(ctx, b) != 0:
                    raise RuntimeError("llama_decode failed")
                pos += 1
                lg = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,)).copy()
                rows.append(lg)
            greedy.append(gen)
    finally:
        L.llama_batch_free(b)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return np.stack(rows).astype("<f4"), greedy, n_vocab


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tiny = os.path.join(root, "fixtures/tiny/llama")
    seqs = json.load(open(os.path.join(tiny, "oracle.json")))["sequences"]
    P.quiet_logs()
    L.llama_backend_init()
    f32 = os.path.join(out, "model.f32.gguf.tmp")
    write_f32(os.path.join(tiny, "model.f32.gguf"), f32)
    doc = dict(
        about="llama.cpp's logits for one llama-architecture model in the ggml types no real parity model "
              "holds; regenerate with `cargo xtask quant-models`",
        shape=dict(hidden=H, heads=NH, kv_heads=NKV, ffn=FF, layers=LAYERS, seed=SEED, untied_output=True),
        sequences=seqs, n_gen=NGEN,
        logits_layout="per sequence: its positions (one batch), then NGEN one-row greedy decode steps; "
                      "rows of n_vocab little-endian f32",
        llama_cpp=dict(llama_cpp_python=L.__version__, n_threads=1, type_k="f32", type_v="f32",
                       flash_attn="disabled", use_extra_bufts=False, n_ubatch=128, quantize="pure"),
        types={},
    )
    try:
        for stem, ftype, ggml_name in TYPES:
            path = os.path.join(out, f"model.{stem}.gguf")
            quantize(f32, path, ftype, stem in IMATRIX_TYPES)
            types = tensor_types(path)
            wrong = {n: t for n, t in types.items() if n.endswith(".weight") and "norm" not in n and t != ggml_name}
            if wrong:
                sys.exit(f"{stem}: llama.cpp fell back to other types: {wrong}")
            lg, greedy, n_vocab = run(path, seqs)
            lg.tofile(os.path.join(out, f"logits.{stem}.f32"))
            doc["types"][stem] = dict(ggml_type=ggml_name, file=f"model.{stem}.gguf", bytes=os.path.getsize(path),
                                      logits=f"logits.{stem}.f32", rows=int(lg.shape[0]), n_vocab=n_vocab,
                                      greedy=greedy)
            print(f"  {stem:7s} {os.path.getsize(path):8d} bytes, greedy {greedy[0]}", flush=True)
    finally:
        os.remove(f32)
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out}/oracle.json")


if __name__ == "__main__":
    main()
