#!/usr/bin/env python3
"""Dump every f32 intermediate tensor llama.cpp computes for one batch of token ids.

A diagnosis aid for parity work (not run by tests or CI): it is how Synapse's float order
was matched to ggml's op by op (docs/architecture.md, "ggml's float order, reproduced").
Run in the oracle venv (`cargo xtask oracle-env --llama`):

    python xtask/py/dump_llama_tensors.py MODEL.gguf OUT_DIR '[2, 818, 5279, 529, 7001, 563]'

Writes OUT_DIR/<tensor name>.npy (shape [ne3, ne2, ne1, ne0], names as llama.cpp's graph
gives them: attn_norm-0, Qcur-0, kq-0, kqv_out-0, ffn_out-0, l_out-0, ...; a repeated name
gets #1, #2) and OUT_DIR/index.json (shape, op, sources of each). The context matches the
parity fixtures: 1 thread, f32 KV cache, flash attention off, no extra buffer types.
Compare with Synapse's own intermediates in numpy; the first tensor that differs while its
inputs agree is the op to fix.
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


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` of the vendored ggml.h (GGML_MAX_DIMS 4, MAX_SRC 10, MAX_NAME 64)."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def main() -> None:
    model_path, out, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    index: dict = {}

    @ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
    def cb(tp, ask, _ud):
        t = GgmlTensor.from_address(tp)
        if ask:
            return True
        name = t.name.decode()
        ne, nb = list(t.ne), list(t.nb)
        srcs = []
        for sp in t.src:
            if sp:
                st = GgmlTensor.from_address(sp)
                srcs.append((st.name.decode(), st.type, list(st.ne)))
        if t.type != 0 or nb[0] != 4:  # f32, contiguous rows only
            index["skipped:" + name] = dict(type=t.type, src=srcs)
            return True
        span = sum((n - 1) * s for n, s in zip(ne, nb)) + 4
        raw = np.frombuffer((ctypes.c_char * span).from_address(t.data), dtype=np.uint8)
        arr = np.lib.stride_tricks.as_strided(
            raw, shape=(ne[3], ne[2], ne[1], ne[0] * 4), strides=(nb[3], nb[2], nb[1], 1))
        arr = np.ascontiguousarray(arr).view(np.float32).reshape(ne[3], ne[2], ne[1], ne[0])
        key, k = name, 0
        while key in index:
            k += 1
            key = f"{name}#{k}"
        np.save(os.path.join(out, key.replace("/", "_") + ".npy"), arr)
        index[key] = dict(shape=ne, op=t.op, src=srcs)
        return True

    P.quiet_logs()
    L.llama_backend_init()
    model = P.load(model_path, False)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = P.N_CTX, P.N_BATCH, P.N_BATCH, 1
    cp.n_threads = cp.n_threads_batch = 1
    cp.type_k = cp.type_v = 0  # f32
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.cb_eval = cb
    cp.cb_eval_user_data = None
    ctx = L.llama_init_from_model(model, cp)
    toks = (L.llama_token * len(ids))(*ids)  # keep alive during decode
    rc = L.llama_decode(ctx, L.llama_batch_get_one(toks, len(ids)))
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f)
    print(f"llama_decode rc {rc}; {sum(1 for k in index if not k.startswith('skipped:'))} tensors in {out}")


if __name__ == "__main__":
    main()
