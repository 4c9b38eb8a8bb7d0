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

TYPES = ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "q6_k", "q5_k", "q4_k"]
# The llama_ftype whose pure form is each type.
FTYPES = {"q6_k": "Q6_K", "q5_k": "Q5_K_S", "q4_k": "Q4_K_S"}


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


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
            print(f"  {t}: {len(tensors)} tensors, {os.path.getsize(dst)} B", flush=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
