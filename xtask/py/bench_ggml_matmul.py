#!/usr/bin/env python3
"""ggml side of `cargo xtask bench-kernels-vs-ggml`: times ggml's own mul_mat on the weights and
activations the Synapse side (crates/synapse-kernels/examples/kbench_ggml.rs) wrote, and prints the
same JSON schema.

Usage: python bench_ggml_matmul.py TYPE ROWS K DIR [--threads 2] [--ns 1,4,8,128] [--check-ns ...]
       [--cold-mib 1024] [--budget-ms 200] [--min-calls 5] [--max-calls 2000] [--repack]
       python bench_ggml_matmul.py --probe

Loads libggml-base.so and libggml-cpu.so from llama-cpp-python's package (llama_cpp/lib) with
ctypes. Per n, one graph y = ggml_mul_mat(W[K, ROWS], X[K, n]) is planned once
(ggml_graph_plan(graph, threads, NULL): with this OpenMP build of ggml the threads are OpenMP's
persistent team, as in llama.cpp) and each timed call is one ggml_graph_compute with that plan.
(ggml_graph_compute_with_ctx does the same but allocates a fresh work buffer inside the context on
every call, so it cannot be called thousands of times on one context.) The tensors' data pointers
are set to numpy buffers; W's is switched before each call to the next of `copies` identical copies
that together exceed --cold-mib MiB, so each call streams its weights from DRAM, as on the Synapse
side. With --repack, the copies live in ggml's CPU_REPACK buffer type (the extra buffer type
llama.cpp uses by default: Q4_K is repacked to q4_K_8x8 on AVX2) and ggml's repacked kernels run.
AMX is declined as in bench_llama.py (its tile instructions SIGILL on this project's machines).
"""
from __future__ import annotations

import argparse
import ctypes as C
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10,
         "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23, "bf16": 30, "tq1_0": 34, "tq2_0": 35}
GGML_TYPE_F32 = 0


class InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


class CPlan(C.Structure):
    _fields_ = [("work_size", C.c_size_t), ("work_data", C.c_void_p), ("n_threads", C.c_int),
                ("threadpool", C.c_void_p), ("abort_callback", C.c_void_p),
                ("abort_callback_data", C.c_void_p), ("use_ref", C.c_bool)]


def decline_amx():
    """Same trick as bench_llama.decline_amx (a 4 KiB alternate signal stack makes the kernel refuse
    ggml's AMX permission request), without importing llama_cpp's Python bindings."""
    libc = C.CDLL(None, use_errno=True)

    class StackT(C.Structure):
        _fields_ = [("ss_sp", C.c_void_p), ("ss_flags", C.c_int), ("ss_size", C.c_size_t)]

    decline_amx.stack = C.create_string_buffer(4096)
    st = StackT(C.cast(decline_amx.stack, C.c_void_p), 0, 4096)
    if libc.sigaltstack(C.byref(st), None) != 0:
        raise SystemExit(f"sigaltstack failed: errno {C.get_errno()}")


def load_ggml():
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise SystemExit(f"llama_cpp is not installed in {sys.prefix}: run `cargo xtask oracle-env --llama`")
    lib = Path(spec.origin).parent / "lib"
    paths = [lib / "libggml-base.so", lib / "libggml-cpu.so"]
    for p in paths:
        if not p.exists():
            raise SystemExit(f"{p} missing (llama-cpp-python without its shared ggml libraries?)")
    base = C.CDLL(str(paths[0]), mode=C.RTLD_GLOBAL)
    cpu = C.CDLL(str(paths[1]), mode=C.RTLD_GLOBAL)
    vp, sz, i64 = C.c_void_p, C.c_size_t, C.c_int64
    sig = {
        (base, "ggml_init"): ([InitParams], vp),
        (base, "ggml_free"): ([vp], None),
        (base, "ggml_new_tensor_2d"): ([vp, C.c_int, i64, i64], vp),
        (base, "ggml_mul_mat"): ([vp, vp, vp], vp),
        (base, "ggml_new_graph_custom"): ([vp, sz, C.c_bool], vp),
        (base, "ggml_build_forward_expand"): ([vp, vp], None),
        (base, "ggml_get_data"): ([vp], vp),
        (base, "ggml_nbytes"): ([vp], sz),
        (base, "ggml_tensor_overhead"): ([], sz),
        (base, "ggml_graph_overhead_custom"): ([sz, C.c_bool], sz),
        (base, "ggml_backend_alloc_ctx_tensors_from_buft"): ([vp, vp], vp),
        (base, "ggml_backend_tensor_set"): ([vp, vp, sz, sz], None),
        (base, "ggml_backend_buft_name"): ([vp], C.c_char_p),
        (base, "ggml_backend_reg_dev_get"): ([vp, sz], vp),
        (base, "ggml_backend_reg_get_proc_address"): ([vp, C.c_char_p], vp),
        (cpu, "ggml_cpu_init"): ([], None),
        (cpu, "ggml_graph_plan"): ([vp, C.c_int, vp], CPlan),
        (cpu, "ggml_graph_compute"): ([vp, C.POINTER(CPlan)], C.c_int),
        (cpu, "ggml_backend_cpu_reg"): ([], vp),
        (cpu, "ggml_cpu_has_avx2"): ([], C.c_int),
        (cpu, "ggml_cpu_has_avx512"): ([], C.c_int),
        (cpu, "ggml_cpu_has_avx512_vnni"): ([], C.c_int),
        (cpu, "ggml_cpu_has_avx_vnni"): ([], C.c_int),
        (cpu, "ggml_cpu_has_llamafile"): ([], C.c_int),
    }
    for (lib_, name), (args, res) in sig.items():
        f = getattr(lib_, name)
        f.argtypes, f.restype = args, res
    cpu.ggml_cpu_init()
    return base, cpu


def data_offset(base) -> int:
    """Byte offset of `data` inside struct ggml_tensor, found by looking for a known data pointer."""
    ctx = base.ggml_init(InitParams(1 << 16, None, False))
    t = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 1)
    p = base.ggml_get_data(t)
    raw = C.string_at(t, base.ggml_tensor_overhead())
    words = np.frombuffer(raw[: len(raw) // 8 * 8], dtype=np.uint64)
    hits = np.nonzero(words == np.uint64(p))[0]
    base.ggml_free(ctx)
    if len(hits) != 1:
        raise SystemExit(f"cannot locate ggml_tensor.data ({len(hits)} candidates)")
    return int(hits[0]) * 8


def repack_buft(base, cpu):
    reg = cpu.ggml_backend_cpu_reg()
    dev = base.ggml_backend_reg_dev_get(reg, 0)
    fp = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not fp:
        raise SystemExit("ggml CPU backend exposes no extra buffer types")
    get = C.CFUNCTYPE(C.POINTER(C.c_void_p), C.c_void_p)(fp)
    arr = get(dev)
    i = 0
    while arr[i]:
        if base.ggml_backend_buft_name(arr[i]) == b"CPU_REPACK":
            return arr[i]
        i += 1
    raise SystemExit("no CPU_REPACK buffer type in this ggml build")


def ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    with open("/proc/self/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return busy, int(rest[11]) + int(rest[12])


def aligned(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off: off + nbytes]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("type", nargs="?")
    ap.add_argument("rows", type=int, nargs="?")
    ap.add_argument("k", type=int, nargs="?")
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ns", default="1,4,8,128")
    ap.add_argument("--check-ns", default="")
    ap.add_argument("--cold-mib", type=int, default=1024)
    ap.add_argument("--budget-ms", type=float, default=200)
    ap.add_argument("--min-calls", type=int, default=5)
    ap.add_argument("--max-calls", type=int, default=2000)
    ap.add_argument("--repack", action="store_true")
    ap.add_argument("--probe", action="store_true")
    a = ap.parse_args()
    if os.environ.get("BENCH_LLAMA_AMX") != "1":
        decline_amx()
    base, cpu = load_ggml()
    if a.probe:
        print(json.dumps(dict(avx2=cpu.ggml_cpu_has_avx2(), avx512=cpu.ggml_cpu_has_avx512(),
                              avx512_vnni=cpu.ggml_cpu_has_avx512_vnni(), avx_vnni=cpu.ggml_cpu_has_avx_vnni(),
                              llamafile=cpu.ggml_cpu_has_llamafile(), data_offset=data_offset(base))))
        return
    if a.dir is None:
        ap.error("TYPE ROWS K DIR are required")
    ty = TYPES.get(a.type.lower())
    if ty is None:
        raise SystemExit(f"unknown type {a.type}")
    d = Path(a.dir)
    w = np.fromfile(d / "w.bin", dtype=np.uint8)
    x = np.fromfile(d / "x.bin", dtype=np.float32)
    ns = [int(v) for v in a.ns.split(",") if v]
    check_ns = [int(v) for v in a.check_ns.split(",") if v]
    off = data_offset(base)
    nmax = max(ns + check_ns)
    if x.size < nmax * a.k:
        raise SystemExit(f"x.bin holds {x.size // a.k} rows, {nmax} needed")

    wbytes = w.size
    copies = max(1, min(1 << 16, -(-(a.cold_mib << 20) // wbytes)))
    stride = -(-wbytes // 64) * 64
    n_graphs = len(ns) + len(check_ns)
    meta = InitParams(base.ggml_tensor_overhead() * (4 + 2 * n_graphs)
                      + n_graphs * base.ggml_graph_overhead_custom(4, False) + (1 << 16), None, True)
    ctx = base.ggml_init(meta)
    wt = base.ggml_new_tensor_2d(ctx, ty, a.k, a.rows)
    if base.ggml_nbytes(wt) != wbytes:
        raise SystemExit(f"w.bin has {wbytes} bytes, ggml expects {base.ggml_nbytes(wt)} for {a.type} {a.rows}x{a.k}")
    wptr = C.c_void_p.from_address(wt + off)
    keep = []
    if a.repack:
        buft = repack_buft(base, cpu)
        wctx = base.ggml_init(InitParams(base.ggml_tensor_overhead() * (copies + 1), None, True))
        wts = [base.ggml_new_tensor_2d(wctx, ty, a.k, a.rows) for _ in range(copies)]
        buf = base.ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft)
        if not buf:
            raise SystemExit("allocating the CPU_REPACK buffer failed")
        saved = os.dup(2)  # ggml logs one line per repacked tensor: silence them
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        try:
            for t in wts:
                base.ggml_backend_tensor_set(t, w.ctypes.data, 0, wbytes)  # repacks
        finally:
            os.dup2(saved, 2)
        ptrs = [base.ggml_get_data(t) for t in wts]
        wt = wts[0]  # its buffer (CPU_REPACK) and extra (the repack traits) select ggml's repacked kernels
        wptr = C.c_void_p.from_address(wt + off)
    else:
        store = aligned(stride * copies)
        for i in range(copies):
            store[i * stride: i * stride + wbytes] = w
        keep.append(store)
        ptrs = [store.ctypes.data + i * stride for i in range(copies)]
        wptr.value = ptrs[0]
    del w

    def graph(n):
        xt = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, a.k, n)
        C.c_void_p.from_address(xt + off).value = x.ctypes.data
        y = aligned(4 * n * a.rows).view(np.float32)
        yt = base.ggml_mul_mat(ctx, wt, xt)
        C.c_void_p.from_address(yt + off).value = y.ctypes.data
        g = base.ggml_new_graph_custom(ctx, 4, False)
        base.ggml_build_forward_expand(g, yt)
        plan = cpu.ggml_graph_plan(g, a.threads, None)
        work = aligned(max(plan.work_size, 64))
        plan.work_data = work.ctypes.data
        keep.append(work)
        return g, plan, y

    for n in check_ns:
        wptr.value = ptrs[0]
        g, plan, y = graph(n)
        if cpu.ggml_graph_compute(g, C.byref(plan)) != 0:
            raise SystemExit("ggml_graph_compute failed")
        y.tofile(d / f"y_{'ggml-repack' if a.repack else 'ggml'}_n{n}.bin")

    compute = cpu.ggml_graph_compute
    perf = time.perf_counter_ns
    results = []
    nxt = 0
    for n in ns:
        g, plan, y = graph(n)
        pp = C.byref(plan)
        for _ in range(3):
            wptr.value = ptrs[nxt % copies]
            nxt += 1
            compute(g, pp)
        times = []
        b0, s0 = ticks()
        start = time.perf_counter()
        budget = a.budget_ms / 1e3
        while len(times) < a.max_calls and (len(times) < a.min_calls or time.perf_counter() - start < budget):
            wptr.value = ptrs[nxt % copies]
            nxt += 1
            t0 = perf()
            compute(g, pp)
            times.append(perf() - t0)
        b1, s1 = ticks()
        results.append(dict(n=n, ns=times, busy_ticks=b1 - b0, self_ticks=s1 - s0,
                            wall_s=time.perf_counter() - start))
    # the cost of one ctypes call around the timed region (included in every ggml time above)
    f = cpu.ggml_cpu_has_avx2
    oh = []
    for _ in range(2000):
        t0 = perf()
        f()
        oh.append(perf() - t0)
    print(json.dumps(dict(engine="ggml-repack" if a.repack else "ggml", threads=a.threads, weight_bytes=wbytes,
                          copies=copies, ctypes_call_ns=sorted(oh)[len(oh) // 2], results=results)))


if __name__ == "__main__":
    main()
