#!/usr/bin/env python3
"""llama.cpp's own re-quantization of a real model to each ggml type Synapse encodes (the legacy
types and the K-quants with SIMD kernels), as digests: the oracle of Synapse's `--profile
uniform:ggml.<type>.v1`.

Run by `cargo xtask requant-digests` (see fixtures/README.md); never by the tests.

Usage: python requant_digests.py SRC.gguf OUT.json

For each of q8_0, q5_1, q5_0, q4_1, q4_0, q6_k, q5_k, q4_k: `llama_model_quantize` with `allow_requantize` and
`pure` (llama-quantize --allow-requantize --pure: every weight matrix, the embeddings and the
head in the one type; ggml_quantize_chunk without an importance matrix, on the source dequantized
to f32 by ggml), then every tensor of the result read back with gguf-py: its type and the
sha256 of its bytes. Writes OUT.json {"source": {"file", "bytes", "sha256"}, "types": {type:
{"tensors": {name: {"type", "sha256", "bytes"}}}}, "llama_cpp_python"}. Fails if llama.cpp left
a matrix in another type (a silent fallback) — except a K-quant's matrix whose rows are not whole
256-element super-blocks, which llama.cpp stores in a legacy type instead (recorded as such).

For each legacy type (whose re-quantization is, tensor for tensor, what Synapse's uniform profile
holds) llama.cpp then runs the re-quantized file in the parity fixtures' exact configuration (f32
KV cache, flash attention off, no repacked buffers, 2 threads) on PROMPTS: the sha256 of the
prompt's last-position logits (f32 little-endian, the whole vocabulary), its top 8 (id, value),
and GEN greedy tokens — {"runs": [{"prompt", "logits_sha256", "top", "tokens"}]} per type.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import tempfile

import gguf
import llama_cpp
import llama_cpp.llama_cpp as L
import numpy as np

TYPES = ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "q6_k", "q5_k", "q4_k"]
# The llama_ftype whose pure form is each type.
FTYPES = {"q6_k": "Q6_K", "q5_k": "Q5_K_S", "q4_k": "Q4_K_S"}


LEGACY = ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0"]
# Token ids of SmolLM2's vocabulary (BOS first), as the runtime test feeds them.
PROMPTS = [[1, 504, 3458, 282, 260, 3287], [1, 9690, 28, 355]]
GEN = 16


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def greedy_runs(path: str) -> list:
    """llama.cpp's logits and greedy tokens on PROMPTS, exact configuration."""
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = False
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise SystemExit(f"cannot load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 128, 128, 128, 1
    cp.n_threads = cp.n_threads_batch = 2
    cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    runs = []
    batch = L.llama_batch_init(128, 0, 1)
    try:
        for toks in PROMPTS:
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            gen, lg, first = [], None, None
            feed, pos = toks, 0
            while len(gen) < GEN:
                batch.n_tokens = len(feed)
                for i, t in enumerate(feed):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos + i, 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1 if i == len(feed) - 1 else 0
                if L.llama_decode(ctx, batch) != 0:
                    raise SystemExit("llama_decode failed")
                lg = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, len(feed) - 1),
                                           shape=(n_vocab,)).copy()
                if first is None:
                    first = lg
                pos += len(feed)
                t = int(np.argmax(lg))
                gen.append(t)
                feed = [t]
            order = np.argsort(-first, kind="stable")[:8]
            runs.append({"prompt": toks, "logits_sha256": sha(first.astype("<f4").tobytes()),
                         "top": [[int(i), float(first[i])] for i in order], "tokens": gen})
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return runs


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    doc = {
        "about": "llama.cpp's pure re-quantization of the source to each ggml type Synapse encodes; "
                 "regenerate with `cargo xtask requant-digests`",
        "source": {"file": os.path.basename(src), "bytes": os.path.getsize(src),
                   "sha256": sha(open(src, "rb").read())},
        "types": {},
        "llama_cpp_python": llama_cpp.__version__,
    }
    L.llama_backend_init()
    with tempfile.TemporaryDirectory() as tmp:
        for t in TYPES:
            dst = os.path.join(tmp, f"{t}.gguf")
            qp = L.llama_model_quantize_default_params()
            qp.ftype = getattr(L, "LLAMA_FTYPE_MOSTLY_" + FTYPES.get(t, t.upper()))
            qp.allow_requantize = True
            qp.pure = True
            qp.nthread = 2
            rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(qp))
            if rc != 0:
                raise SystemExit(f"llama_model_quantize {t}: rc {rc}")
            r = gguf.GGUFReader(dst)
            tensors = {}
            for ten in r.tensors:
                ty = ten.tensor_type.name.lower()
                partial = t.endswith("_k") and int(ten.shape[0]) % 256 != 0
                if len(ten.shape) >= 2 and ty != t and not partial:
                    raise SystemExit(f"{t}: {ten.name} left in {ty}")
                data = bytes(ten.data.tobytes())
                tensors[ten.name] = {"type": ty, "sha256": sha(data), "bytes": len(data)}
            doc["types"][t] = {"tensors": tensors}
            if t in LEGACY:
                doc["types"][t]["runs"] = greedy_runs(dst)
            print(f"  {t}: {len(tensors)} tensors, {os.path.getsize(dst)} B", flush=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
