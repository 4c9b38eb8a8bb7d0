"""llama.cpp's own re-quantization of a GGUF (`llama-quantize --allow-requantize`, through
llama-cpp-python's `llama_model_quantize`), optionally with an importance matrix.

usage: requant.py SRC.gguf DST.gguf FTYPE [IMATRIX.json]

With SYNAPSE_REQUANT_PURE=1, llama-quantize's `--pure`: every weight tensor in FTYPE's type,
no per-tensor mixture (embeddings and output included).

FTYPE is a llama_ftype suffix (Q4_K_M, Q3_K_M, Q2_K, ...). IMATRIX.json maps tensor names to
the per-column mean of x^2 (`synapse-cli importance --imatrix-out`), the data llama.cpp's
imatrix tool would hand to the quantizer. Writes DST and prints one JSON line
{"dst", "ftype", "imatrix_tensors", "bytes"}.
"""
import ctypes
import json
import os
import sys

import llama_cpp.llama_cpp as L


def main() -> None:
    src, dst, ftype = sys.argv[1], sys.argv[2], sys.argv[3]
    im_path = sys.argv[4] if len(sys.argv) > 4 else None
    qp = L.llama_model_quantize_default_params()
    qp.ftype = getattr(L, "LLAMA_FTYPE_MOSTLY_" + ftype)
    qp.allow_requantize = True
    qp.pure = os.environ.get("SYNAPSE_REQUANT_PURE") == "1"
    qp.nthread = 2
    keep = []
    n_im = 0
    if im_path:
        data = json.load(open(im_path))
        arr = (L.llama_model_imatrix_data * (len(data) + 1))()
        for i, (name, vals) in enumerate(sorted(data.items())):
            buf = (ctypes.c_float * len(vals))(*vals)
            nm = name.encode()
            keep.append((buf, nm))
            arr[i].name = nm
            arr[i].data = ctypes.cast(buf, ctypes.POINTER(ctypes.c_float))
            arr[i].size = len(vals)
        arr[len(data)].name = None
        keep.append(arr)
        qp.imatrix = ctypes.cast(arr, ctypes.POINTER(L.llama_model_imatrix_data))
        n_im = len(data)
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(qp))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize {dst}: rc {rc}")
    print(json.dumps({"dst": dst, "ftype": ftype, "imatrix_tensors": n_im,
                      "bytes": os.path.getsize(dst)}))


if __name__ == "__main__":
    main()
