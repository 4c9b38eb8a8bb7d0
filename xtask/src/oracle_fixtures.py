#!/usr/bin/env python3
"""Decoder oracle fixtures for Synapse (run by `cargo xtask oracle-fixtures`; do not run by hand).

For every ggml type: seeded blocks (ggml-quantized, random with sane scales, fully random bytes,
and edge cases: zero / negative-zero / subnormal / max / infinite / NaN scales, min and max codes)
and the f32 values ggml itself decodes them to (`ggml_get_type_traits(t)->to_float` from
llama-cpp-python's libggml-base.so). Where ggml has no to_float the reference is named per file.
Also samples blocks of every tensor of the real model (Gemma 3 270M Q4_K_M) read with gguf-py.

Output (little-endian): <name>.bin (raw blocks), <name>.f32 (expected f32), index.json.
usage: oracle_fixtures.py OUT_DIR [MODEL_GGUF]
"""
from __future__ import annotations

import ctypes as C
import glob
import importlib.metadata as md
import json
import os
import sys

import numpy as np

SEED = 20261130

# name, id, block_size, type_size (checked against ggml's traits below)
TYPES = [
    ("f32", 0, 1, 4), ("f16", 1, 1, 2), ("q4_0", 2, 32, 18), ("q4_1", 3, 32, 20),
    ("q5_0", 6, 32, 22), ("q5_1", 7, 32, 24), ("q8_0", 8, 32, 34), ("q8_1", 9, 32, 36),
    ("q2_K", 10, 256, 84), ("q3_K", 11, 256, 110), ("q4_K", 12, 256, 144), ("q5_K", 13, 256, 176),
    ("q6_K", 14, 256, 210), ("q8_K", 15, 256, 292), ("iq2_xxs", 16, 256, 66), ("iq2_xs", 17, 256, 74),
    ("iq3_xxs", 18, 256, 98), ("iq1_s", 19, 256, 50), ("iq4_nl", 20, 32, 18), ("iq3_s", 21, 256, 110),
    ("iq2_s", 22, 256, 82), ("iq4_xs", 23, 256, 136), ("i8", 24, 1, 1), ("i16", 25, 1, 2),
    ("i32", 26, 1, 4), ("i64", 27, 1, 8), ("f64", 28, 1, 8), ("iq1_m", 29, 256, 56),
    ("bf16", 30, 1, 2), ("tq1_0", 34, 256, 54), ("tq2_0", 35, 256, 66), ("mxfp4", 39, 32, 17),
    ("nvfp4", 40, 64, 36), ("q1_0", 41, 128, 18), ("q2_0", 42, 64, 18),
]

# byte offsets of the f16 scale fields of each block type ("d" first, then "m"/"dmin")
F16_SCALES = {
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q8_1": [0, 2],
    "q1_0": [0], "q2_0": [0], "q2_K": [80, 82], "q3_K": [108], "q4_K": [0, 2], "q5_K": [0, 2],
    "q6_K": [208], "iq2_xxs": [0], "iq2_xs": [0], "iq2_s": [0], "iq3_xxs": [0], "iq3_s": [0],
    "iq1_s": [0], "iq4_nl": [0], "iq4_xs": [0], "tq1_0": [52], "tq2_0": [64],
}

# f16 scale edge cases: (d, second scale) bit patterns
F16_EDGES = [
    ("scale_zero", 0x0000, 0x0000), ("scale_neg_zero", 0x8000, 0x8000),
    ("scale_subnormal", 0x0001, 0x03FF), ("scale_max", 0x7BFF, 0xFBFF),
    ("scale_inf", 0x7C00, 0x3C00), ("scale_neg_inf", 0xFC00, 0xFC00),
    ("scale_nan", 0x7E00, 0x3C00), ("scale_nan_second", 0x3C00, 0x7C01),
]


def lib_dir() -> str:
    import importlib.util
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llama_cpp (llama-cpp-python) is not installed in this venv")
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


LIB = lib_dir()
BASE_PATH = sorted(glob.glob(os.path.join(LIB, "libggml-base.so.*.*")))[-1]
base = C.CDLL(os.path.join(LIB, "libggml-base.so"), mode=C.RTLD_GLOBAL)
cpu = C.CDLL(os.path.join(LIB, "libggml-cpu.so"), mode=C.RTLD_GLOBAL)
GGML = f"ggml {os.path.basename(BASE_PATH).split('.so.')[-1]} (libggml-base.so from llama-cpp-python {md.version('llama_cpp_python')})"

TO_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.POINTER(C.c_float), C.c_int64)
FROM_FLOAT = C.CFUNCTYPE(None, C.POINTER(C.c_float), C.c_void_p, C.c_int64)


class Traits(C.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", C.c_char_p), ("blck_size", C.c_int64),
                ("blck_size_interleave", C.c_int64), ("type_size", C.c_size_t),
                ("is_quantized", C.c_bool), ("to_float", C.c_void_p),
                ("from_float_ref", C.c_void_p)]


class CpuTraits(C.Structure):  # struct ggml_type_traits_cpu (ggml-cpu.h)
    _fields_ = [("from_float", C.c_void_p), ("vec_dot", C.c_void_p),
                ("vec_dot_type", C.c_int), ("nrows", C.c_int64)]


base.ggml_get_type_traits.restype = C.POINTER(Traits)
base.ggml_get_type_traits.argtypes = [C.c_int]
base.ggml_quantize_chunk.restype = C.c_size_t
base.ggml_quantize_chunk.argtypes = [C.c_int, C.POINTER(C.c_float), C.c_void_p, C.c_int64,
                                     C.c_int64, C.c_int64, C.POINTER(C.c_float)]
base.ggml_quantize_requires_imatrix.restype = C.c_bool
base.ggml_quantize_requires_imatrix.argtypes = [C.c_int]
base.dequantize_row_q8_K.restype = None
base.dequantize_row_q8_K.argtypes = [C.c_void_p, C.POINTER(C.c_float), C.c_int64]
cpu.ggml_get_type_traits_cpu.restype = C.POINTER(CpuTraits)
cpu.ggml_get_type_traits_cpu.argtypes = [C.c_int]
cpu.ggml_cpu_init.restype = None
cpu.ggml_cpu_init()


def traits(t: int) -> Traits:
    return base.ggml_get_type_traits(t).contents


def ggml_to_float(t: int, raw: np.ndarray, bs: int, ts: int) -> np.ndarray:
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    k = raw.size // ts * bs
    out = np.empty(k, dtype=np.float32)
    fp = C.POINTER(C.c_float)
    if t == 15:  # Q8_K: ggml's dequantize_row_q8_K (exported, but not registered as to_float)
        base.dequantize_row_q8_K(raw.ctypes.data, out.ctypes.data_as(fp), k)
    else:
        TO_FLOAT(traits(t).to_float)(raw.ctypes.data, out.ctypes.data_as(fp), k)
    return out


def reference(name: str, t: int, raw: np.ndarray, bs: int, ts: int) -> tuple[np.ndarray, str]:
    """Expected f32 for raw blocks, and which reference produced it."""
    if traits(t).to_float:
        return ggml_to_float(t, raw, bs, ts), f"ggml to_float: {GGML}"
    if t == 15:
        return ggml_to_float(t, raw, bs, ts), f"ggml dequantize_row_q8_K (not Q8_K's to_float): {GGML}"
    with np.errstate(all="ignore"):
        if name == "q8_1":
            blk = raw.reshape(-1, ts)
            d = blk[:, 0:2].copy().view("<f2").astype(np.float32)
            q = blk[:, 4:].view(np.int8).astype(np.float32)
            return (q * d).reshape(-1), "definition d*q (numpy float32; ggml has no Q8_1 dequantizer)"
        np_ty = {"f32": "<f4", "f64": "<f8", "i8": "i1", "i16": "<i2", "i32": "<i4", "i64": "<i8"}[name]
        return raw.view(np_ty).astype(np.float32), f"numpy {np.__version__} astype(float32) (ggml has no to_float for {name})"


def quantize(t: int, x: np.ndarray) -> np.ndarray:
    tr = traits(t)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.size
    fp = C.POINTER(C.c_float)
    if t in (9, 15):  # Q8_1 from_float_ref; Q8_K via ggml-cpu's from_float
        out = np.zeros(n // tr.blck_size * tr.type_size, dtype=np.uint8)
        fn = tr.from_float_ref if t == 9 else cpu.ggml_get_type_traits_cpu(t).contents.from_float
        FROM_FLOAT(fn)(x.ctypes.data_as(fp), out.ctypes.data, n)
        return out
    imat = None
    if base.ggml_quantize_requires_imatrix(t):
        w = np.ascontiguousarray(np.abs(x[: tr.blck_size]) + 0.1, dtype=np.float32)
        imat = w.ctypes.data_as(fp)
    out = np.zeros(n // tr.blck_size * tr.type_size, dtype=np.uint8)
    got = base.ggml_quantize_chunk(t, x.ctypes.data_as(fp), out.ctypes.data, 0, n // tr.blck_size,
                                   tr.blck_size, imat)
    assert got == out.size, (t, got, out.size)
    return out


def set_f16(blk: np.ndarray, off: int, bits: int) -> None:
    blk[off] = bits & 0xFF
    blk[off + 1] = bits >> 8


def set_iq1m_scale(blk: np.ndarray, bits: int) -> None:
    for k in range(4):
        o = 48 + 2 * k
        w = int(blk[o]) | (int(blk[o + 1]) << 8)
        w = (w & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
        set_f16(blk, o, w)


def sane_f16(rng) -> int:
    v = np.float16(rng.standard_normal() * 0.05)
    return int(np.array([v], dtype="<f2").view("<u2")[0])


def set_scales(name: str, blk: np.ndarray, d: int, m: int) -> None:
    if name == "iq1_m":
        set_iq1m_scale(blk, d)
    else:
        offs = F16_SCALES[name]
        set_f16(blk, offs[0], d)
        if len(offs) > 1:
            set_f16(blk, offs[1], m)


def scale_offsets(name: str) -> set[int]:
    if name == "iq1_m":
        return set()
    return {o + i for o in F16_SCALES.get(name, []) for i in (0, 1)}


def block_cases(name: str, t: int, bs: int, ts: int, rng) -> list[tuple[str, np.ndarray]]:
    """Seeded cases for a block type: list of (case name, raw blocks)."""
    cases = []
    nq = 1 if bs >= 256 else 8
    x = (rng.standard_normal(nq * bs) * rng.uniform(0.1, 4)).astype(np.float32)
    if traits(t).from_float_ref or t in (9, 15) or base.ggml_quantize_requires_imatrix(t) or name in ("iq2_xxs", "iq2_xs", "iq1_s", "iq1_m"):
        cases.append(("quantized", quantize(t, x)))
    nr = 1 if bs >= 256 else 8
    rnd = rng.integers(0, 256, size=(nr, ts), dtype=np.uint8)
    for b in rnd:
        if name == "q8_K":
            b[0:4] = np.array([rng.standard_normal() * 0.01], dtype="<f4").view(np.uint8)
        elif name == "mxfp4":
            b[0] = rng.integers(100, 140)
        elif name == "nvfp4":
            b[0:4] = rng.integers(0x20, 0x60, size=4)
        else:
            set_scales(name, b, sane_f16(rng), sane_f16(rng))
    cases.append(("random_sane_scales", rnd.reshape(-1)))
    cases.append(("random_bytes", rng.integers(0, 256, size=(1 if bs >= 256 else 4) * ts, dtype=np.uint8)))

    def with_codes(fill: int | None) -> np.ndarray:
        b = rng.integers(0, 256, size=ts, dtype=np.uint8) if fill is None else np.full(ts, fill, np.uint8)
        return b

    # scale edge cases (codes random)
    if name == "q8_K":
        for label, v in [("scale_zero", 0.0), ("scale_neg_zero", -0.0), ("scale_subnormal", 1e-45),
                         ("scale_max", 3.4e38), ("scale_inf", np.inf), ("scale_nan", np.nan)]:
            b = with_codes(None)
            b[0:4] = np.array([v], dtype="<f4").view(np.uint8)
            cases.append((label, b))
    elif name == "mxfp4":
        b = np.stack([with_codes(None) for _ in range(7)])
        b[:, 0] = [0, 1, 2, 127, 128, 254, 255]
        cases.append(("e8m0_edges_0_1_2_127_128_254_255", b.reshape(-1)))
    elif name == "nvfp4":
        b = np.stack([with_codes(None) for _ in range(3)])
        b[0, 0:4] = [0x00, 0x7F, 0x80, 0xFF]
        b[1, 0:4] = [0x01, 0x07, 0x08, 0x7E]
        b[2, 0:4] = [0xFE, 0x77, 0x78, 0x38]
        cases.append(("ue4m3_edges", b.reshape(-1)))
    else:
        for label, d, m in F16_EDGES:
            if len(F16_SCALES.get(name, [0])) == 1 and label == "scale_nan_second":
                continue
            if bs >= 256 and label in ("scale_max", "scale_neg_inf"):
                continue  # keeps the fixtures small; covered by the 32-element types
            b = with_codes(None)
            set_scales(name, b, d, m)
            cases.append((label, b))
    # code edge cases with a normal scale: every code byte 0x00 / 0xFF
    keep = scale_offsets(name)
    for label, fill in [("codes_min_0x00", 0x00), ("codes_max_0xff", 0xFF)]:
        b = with_codes(fill)
        if name == "q8_K":
            b[0:4] = np.array([0.5], dtype="<f4").view(np.uint8)
        elif name == "mxfp4":
            b[0] = 127
        elif name == "nvfp4":
            b[0:4] = 0x38
        elif name == "iq1_m":
            set_iq1m_scale(b, 0x3C00)
        else:
            for o in sorted(keep)[::2]:
                set_f16(b, o, 0x3C00)
        cases.append((label, b))
    return cases


def element_cases(name: str, rng) -> list[tuple[str, np.ndarray]]:
    if name == "f16" or name == "bf16":
        special = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF,
                            0xFBFF, 0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFE00, 0x7FFF, 0xFFFF,
                            0x007F, 0x0080, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0x3F80], dtype="<u2")
        rnd = rng.integers(0, 65536, size=1000, dtype=np.uint32).astype("<u2")
        return [("special_codes", special.view(np.uint8)), ("random_codes", rnd.view(np.uint8))]
    if name == "f32":
        special = np.array([0, 0x80000000, 1, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000,
                            0xFF800000, 0x7FC00000, 0xFFC00001, 0x3F800000], dtype="<u4")
        rnd = rng.integers(0, 2**32, size=128, dtype=np.uint64).astype("<u4")
        return [("special_codes", special.view(np.uint8)), ("random_codes", rnd.view(np.uint8))]
    if name == "f64":
        special = np.array([0.0, -0.0, 5e-324, 1e-40, 1e-46, 3.4028235677973366e38, 1e39, -1e300,
                            np.inf, -np.inf, np.nan, 1.0 + 2.0**-24, 1.0 + 3 * 2.0**-24, np.pi], dtype="<f8")
        rnd = (rng.standard_normal(64) * 10.0 ** rng.integers(-30, 30, size=64)).astype("<f8")
        return [("special_values", special.view(np.uint8)), ("random_values", rnd.view(np.uint8))]
    if name == "i8":
        return [("all_codes", np.arange(256, dtype=np.uint8))]
    info = np.iinfo({"i16": np.int16, "i32": np.int32, "i64": np.int64}[name])
    dt = {"i16": "<i2", "i32": "<i4", "i64": "<i8"}[name]
    special = np.array([0, 1, -1, info.min, info.max, 2**24 + 1 if info.bits > 16 else 12345,
                        -(2**24) - 3 if info.bits > 16 else -12345], dtype=dt)
    rnd = rng.integers(info.min, info.max, size=64, dtype=dt, endpoint=True)
    return [("special_values", special.view(np.uint8)), ("random_values", rnd.view(np.uint8))]


def write(out: str, stem: str, raw: np.ndarray, f32: np.ndarray) -> None:
    with open(os.path.join(out, stem + ".bin"), "wb") as f:
        f.write(np.ascontiguousarray(raw, dtype=np.uint8).tobytes())
    with open(os.path.join(out, stem + ".f32"), "wb") as f:
        f.write(np.ascontiguousarray(f32, dtype="<f4").tobytes())


def gen_types(out: str) -> list[dict]:
    entries = []
    for name, t, bs, ts in TYPES:
        tr = traits(t)
        assert tr.blck_size == bs and tr.type_size == ts, (name, tr.blck_size, tr.type_size)
        rng = np.random.default_rng([SEED, t])
        cases = element_cases(name, rng) if bs == 1 else block_cases(name, t, bs, ts, rng)
        raws, refs, idx, ref_name = [], [], [], None
        for label, raw in cases:
            assert raw.size % ts == 0, (name, label)
            f, ref_name = reference(name, t, raw, bs, ts)
            assert f.size == raw.size // ts * bs
            raws.append(raw)
            refs.append(f)
            idx.append({"case": label, "blocks": raw.size // ts})
        raw = np.concatenate(raws)
        write(out, name, raw, np.concatenate(refs))
        entries.append({"type": name, "id": t, "block_size": bs, "type_size": ts,
                        "n_blocks": raw.size // ts, "reference": ref_name, "cases": idx})
        print(f"{name:8s} {raw.size // ts:5d} blocks  {ref_name}")
    return entries


def gen_fp8(out: str) -> list[dict]:
    import ml_dtypes
    entries = []
    codes = np.arange(256, dtype=np.uint8)
    for stem, dt in [("f8_e4m3fn", ml_dtypes.float8_e4m3fn), ("f8_e5m2", ml_dtypes.float8_e5m2)]:
        f = codes.view(dt).astype(np.float32)
        write(out, stem, codes, f)
        entries.append({"dtype": stem, "n": 256, "cases": [{"case": "all_codes", "blocks": 256}],
                        "reference": f"ml_dtypes {ml_dtypes.__version__} {dt.__name__} -> float32"})
        print(f"{stem:9s} 256 codes  ml_dtypes {ml_dtypes.__version__}")
    return entries


def gen_model(out: str, path: str) -> None:
    import gguf
    r = gguf.GGUFReader(path)
    rng = np.random.default_rng([SEED, 1])
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    tensors, raws, refs = [], [], []
    bin_off = 0
    f32_off = 0
    sizes = {t[1]: (t[2], t[3], t[0]) for t in TYPES}
    for ti in r.tensors:
        t = int(ti.tensor_type)
        bs, ts, name = sizes[t]
        n_el = int(ti.n_elements)
        nbytes = n_el // bs * ts
        assert int(ti.n_bytes) == nbytes, (ti.name, ti.n_bytes, nbytes)
        start = int(ti.data_offset)
        n_blocks = n_el // bs
        run = 16 if bs == 1 else 1  # element-wise tensors: a run of 16 values
        b0 = int(rng.integers(0, max(1, n_blocks - run + 1)))
        raw = np.array(mm[start + b0 * ts: start + (b0 + run) * ts])
        f, _ = reference(name, t, raw, bs, ts)
        tensors.append({"name": ti.name, "type": name, "offset": start, "n_elements": n_el,
                        "n_bytes": nbytes, "shape": [int(x) for x in ti.shape],
                        "sample_block": b0, "sample_blocks": run,
                        "bin_offset": bin_off, "f32_offset": f32_off})
        raws.append(raw)
        refs.append(f)
        bin_off += raw.size
        f32_off += f.size
    sub = os.path.join(out, "gemma3_270m_q4_k_m")
    os.makedirs(sub, exist_ok=True)
    write(sub, "samples", np.concatenate(raws), np.concatenate(refs))
    index = {"generator": "cargo xtask oracle-fixtures", "model": os.path.basename(path),
             "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
             "file_len": int(mm.size), "reader": f"gguf-py {md.version('gguf')}",
             "reference": f"ggml to_float: {GGML}; f32 tensors: raw little-endian copy",
             "tensors": tensors}
    with open(os.path.join(sub, "index.json"), "w") as f:
        f.write(dump_compact(index))
    print(f"model: {len(tensors)} tensors sampled, {bin_off} raw bytes")


def dump_compact(obj: dict) -> str:
    """JSON with one line per top-level key and one line per list item (small, diffable)."""
    parts = []
    for k, v in obj.items():
        if isinstance(v, list):
            items = ",\n  ".join(json.dumps(x, separators=(",", ":")) for x in v)
            parts.append(f"{json.dumps(k)}: [\n  {items}\n ]")
        else:
            parts.append(f"{json.dumps(k)}: {json.dumps(v)}")
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    index = {"generator": "cargo xtask oracle-fixtures", "seed": SEED, "ggml": GGML,
             "numpy": np.__version__,
             "format": "<name>.bin: raw blocks back to back; <name>.f32: expected values, "
                       "little-endian f32; cases in order",
             "types": gen_types(out), "fp8": gen_fp8(out)}
    with open(os.path.join(out, "index.json"), "w") as f:
        f.write(dump_compact(index))
    if len(sys.argv) > 2 and sys.argv[2]:
        gen_model(out, sys.argv[2])


if __name__ == "__main__":
    main()
