#!/usr/bin/env python3
"""ggml's own matmul outputs and activation quantizers: the kernel-level oracle.

Run by `cargo xtask ggml-kernel-fixtures` (see fixtures/README.md); never by the tests.

Usage: python ggml_kernel_fixtures.py OUT_DIR

Loads libggml-base.so / libggml-cpu.so from llama-cpp-python's package with ctypes (as
bench_ggml_matmul.py does). Seeded activations X (128 rows of K = 512) and, per weight type, W (24
rows of 512) quantized from seeded f32 by ggml's own `ggml_quantize_chunk`; then, for n in NS, one
graph y = ggml_mul_mat(W, X[:n]) computed on 1 thread by ggml's CPU backend (no repacked
buffers: the configuration of the parity fixtures). Also X quantized by ggml's CPU activation
quantizers (`type_traits_cpu[q8_0 / q8_1 / q8_K].from_float`, the ones `mul_mat` runs).

Writes OUT_DIR/x.f32, OUT_DIR/w.<type>.bin, OUT_DIR/y.<type>.f32 (for each n in NS: n x 24 f32,
row-major, concatenated), OUT_DIR/act.<q8_0|q8_1|q8_k>.bin (128 rows of ggml blocks) and
OUT_DIR/index.json. Deterministic; fails if two runs of a graph disagree.
"""
from __future__ import annotations

import ctypes as C
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ggml_matmul as B  # noqa: E402

ROWS, K, NMAX, SEED = 24, 512, 128, 11
NS = [1, 2, 4, 7, 8, 16, 32, 128]
TYPES = ["f32", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
         "iq4_nl", "iq4_xs", "f16", "tq1_0", "tq2_0", "bf16", "iq2_xxs", "iq3_xxs", "iq3_s", "iq2_xs", "iq2_s", "iq1_s", "iq1_m", "mxfp4", "nvfp4", "q1_0", "q2_0"]
IDS = dict(B.TYPES, iq4_xs=23, tq1_0=34, tq2_0=35, iq2_xxs=16, iq3_xxs=18, iq3_s=21, iq2_xs=17, iq2_s=22, iq1_s=19, iq1_m=29, mxfp4=39, nvfp4=40, q1_0=41, q2_0=42)
# Types whose quantizer needs an importance matrix (ggml_quantize_requires_imatrix): given a
# seeded positive one.
NEEDS_IMATRIX = {"iq2_xxs", "iq2_xs", "iq1_s", "iq1_m"}
ACTS = {"q8_0": (8, 34), "q8_1": (9, 36), "q8_k": (15, 292)}
QROWS = 8
QTYPES = ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "q6_k", "q5_k", "q4_k"]


class TraitsCpu(C.Structure):
    _fields_ = [("from_float", C.c_void_p), ("vec_dot", C.c_void_p), ("vec_dot_type", C.c_int),
                ("nrows", C.c_int64)]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    B.decline_amx()
    base, cpu = B.load_ggml()
    base.ggml_quantize_chunk.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64,
                                         C.c_void_p]
    base.ggml_quantize_chunk.restype = C.c_size_t
    base.ggml_row_size.argtypes = [C.c_int, C.c_int64]
    base.ggml_row_size.restype = C.c_size_t
    cpu.ggml_get_type_traits_cpu.argtypes = [C.c_int]
    cpu.ggml_get_type_traits_cpu.restype = C.POINTER(TraitsCpu)
    off = B.data_offset(base)
    rng = np.random.default_rng(SEED)
    x = rng.normal(0.0, 1.0, size=(NMAX, K)).astype(np.float32)
    x[3, :32] *= 100.0  # one block with a large scale
    x[5, 64:96] = 0.0  # one all-zero block
    x.tofile(out / "x.f32")
    index = dict(about="ggml's mul_mat outputs and activation quantizers; regenerate with `cargo xtask ggml-kernel-fixtures`",
                 rows=ROWS, k=K, n_max=NMAX, ns=NS, seed=SEED, threads=1, repack=False,
                 cpu=dict(avx2=cpu.ggml_cpu_has_avx2(), avx512=cpu.ggml_cpu_has_avx512(),
                          avx512_vnni=cpu.ggml_cpu_has_avx512_vnni(), llamafile=cpu.ggml_cpu_has_llamafile()),
                 types={}, acts={})
    for name, (tid, bsz) in ACTS.items():
        tr = cpu.ggml_get_type_traits_cpu(tid).contents
        f = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)(tr.from_float)
        rb = base.ggml_row_size(tid, K)
        assert rb == K // (256 if name == "q8_k" else 32) * bsz, (name, rb)
        buf = np.zeros(NMAX * rb, dtype=np.uint8)
        for t in range(NMAX):
            f(x[t].ctypes.data, buf[t * rb:].ctypes.data, K)
        buf.tofile(out / f"act.{name}.bin")
        index["acts"][name] = dict(file=f"act.{name}.bin", row_bytes=int(rb), block_bytes=bsz)
    for tname in TYPES:
        tid = IDS[tname]
        wf = rng.normal(0.0, 0.5, size=(ROWS, K)).astype(np.float32)
        rb = base.ggml_row_size(tid, K)
        w = np.zeros(ROWS * rb, dtype=np.uint8)
        if tname == "f32":
            w[:] = wf.view(np.uint8).reshape(-1)
        else:
            imat = None
            if tname in NEEDS_IMATRIX:
                im = np.random.default_rng(SEED + tid).uniform(0.5, 2.0, size=K).astype(np.float32)
                imat = im.ctypes.data
            n = base.ggml_quantize_chunk(tid, wf.ctypes.data, w.ctypes.data, 0, ROWS, K, imat)
            assert n == w.size, (tname, n, w.size)
        w.tofile(out / f"w.{tname}.bin")
        ys = []
        for n in NS:
            runs = []
            for _ in range(2):
                ctx = base.ggml_init(B.InitParams(1 << 20, None, True))
                wt = base.ggml_new_tensor_2d(ctx, tid, K, ROWS)
                C.c_void_p.from_address(wt + off).value = w.ctypes.data
                xt = base.ggml_new_tensor_2d(ctx, 0, K, n)
                C.c_void_p.from_address(xt + off).value = x.ctypes.data
                yt = base.ggml_mul_mat(ctx, wt, xt)
                y = B.aligned(4 * n * ROWS).view(np.float32)
                C.c_void_p.from_address(yt + off).value = y.ctypes.data
                g = base.ggml_new_graph_custom(ctx, 4, False)
                base.ggml_build_forward_expand(g, yt)
                plan = cpu.ggml_graph_plan(g, 1, None)
                work = B.aligned(max(plan.work_size, 64))
                plan.work_data = work.ctypes.data
                if cpu.ggml_graph_compute(g, C.byref(plan)) != 0:
                    raise SystemExit("ggml_graph_compute failed")
                runs.append(y.copy())
                base.ggml_free(ctx)
            if not np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32)):
                raise SystemExit(f"{tname} n={n}: two runs differ")
            ys.append(runs[0])
        np.concatenate(ys).astype("<f4").tofile(out / f"y.{tname}.f32")
        index["types"][tname] = dict(ggml_type=tid, w=f"w.{tname}.bin", y=f"y.{tname}.f32", row_bytes=int(rb))
        print(f"  {tname:7s} w {w.size:6d} B, y {sum(len(v) for v in ys)} values", flush=True)
    # ggml's reference quantizers of the legacy and K-quant types (`ggml_quantize_chunk` without an
    # importance matrix runs `quantize_row_<type>_ref`), on seeded rows with edge blocks: its
    # own rng, so the outputs above do not move.
    qr = np.random.default_rng(SEED + 1)
    qs = qr.normal(0.0, 1.0, size=(QROWS, K)).astype(np.float32)
    qs[0, :32] = 0.0                                     # all zero
    qs[0, 32:64] = 1.5                                   # constant
    qs[0, 64:96] = -np.abs(qs[0, 64:96]) * 3.0           # all negative (negative max)
    qs[0, 96:128] = np.abs(qs[0, 96:128]) * 3.0          # all positive
    qs[1, :32] *= 1e-6                                   # tiny
    qs[1, 32:64] *= 3e3                                  # large
    qs[1, 64:96] = np.round(qs[1, 64:96] * 4.0) / 4.0    # on a grid: ties at the half steps
    qs[1, 96] = 1e-30                                    # one subnormal-scale element
    qs[2] *= 0.02                                        # a typical weight row
    qs.tofile(out / "quant.src.f32")
    index["quant"] = dict(src="quant.src.f32", rows=QROWS, k=K, types={})
    for tname in QTYPES:
        tid = IDS[tname]
        rb = base.ggml_row_size(tid, K)
        w = np.zeros(QROWS * rb, dtype=np.uint8)
        n = base.ggml_quantize_chunk(tid, qs.ctypes.data, w.ctypes.data, 0, QROWS, K, None)
        assert n == w.size, (tname, n, w.size)
        w.tofile(out / f"quant.{tname}.bin")
        index["quant"]["types"][tname] = dict(file=f"quant.{tname}.bin", row_bytes=int(rb))
        print(f"  quant {tname:5s} {w.size:6d} B", flush=True)
    import llama_cpp
    index["llama_cpp_python"] = llama_cpp.__version__
    (out / "index.json").write_text(json.dumps(index, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
