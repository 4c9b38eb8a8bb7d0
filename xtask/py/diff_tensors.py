#!/usr/bin/env python3
"""Compare Synapse's intermediate tensors with llama.cpp's, stage by stage, layer by layer.

A diagnosis aid for parity work (not run by tests or CI):

    python xtask/py/dump_llama_tensors.py MODEL.gguf LLAMA_DIR '[ids]'
    cargo run --release -p synapse-runtime --example tensor_dump -- MODEL.gguf SYN_DIR ids...
    python xtask/py/diff_tensors.py LLAMA_DIR SYN_DIR [--all]

Prints, in pass order, each stage's number of differing values and the largest |difference|;
stops after the first layer with a difference unless --all. The first stage that differs while
its inputs agree is the op to fix.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np


def llama_tensor(ldir: str, index: dict, name: str, stage: str, rows: int, width: int):
    """llama.cpp's tensor for a Synapse stage as rows x width, or None."""
    cands = [k for k in index if k == name or k.startswith(name + "#")]
    if not cands:
        return None
    # Q/K: the first form is the projection, the last the roped one.
    key = cands[-1] if stage in ("q_rope", "k_rope") else cands[0]
    if stage in ("q", "k", "v") and len(cands) > 2:
        key = cands[1] if stage != "v" else cands[-1]  # after the bias add (qwen2: 3-4 forms)
    a = np.load(os.path.join(ldir, key.replace("/", "_") + ".npy"))
    a = a.reshape(-1)
    if a.size != rows * width:
        return None
    return a.reshape(rows, width), key


def main() -> None:
    ldir, sdir = sys.argv[1], sys.argv[2]
    show_all = "--all" in sys.argv
    lidx = json.load(open(os.path.join(ldir, "index.json")))
    sidx = json.load(open(os.path.join(sdir, "index.json")))
    order = ["embd"]
    nl = 1 + max(int(k.rsplit("-", 1)[1]) for k in sidx if "-" in k)
    stages = ["attn_norm", "q", "k", "v", "q_rope", "k_rope", "kqv_out", "attn_out", "ffn_inp",
              "ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_out", "l_out"]
    for layer in range(nl):
        order += [f"{s}-{layer}" for s in stages]
    order += ["result_norm", "result_output"]
    bad_layer = None
    same = 0
    for f in order:
        if f not in sidx:
            continue
        rows, width, lname = sidx[f]
        layer = int(f.rsplit("-", 1)[1]) if "-" in f else None
        if bad_layer is not None and layer != bad_layer and not show_all:
            break
        s = np.fromfile(os.path.join(sdir, f + ".f32"), dtype="<f4").reshape(rows, width)
        stage = f.rsplit("-", 1)[0] if "-" in f else f
        if stage == "ffn_act" and lname not in lidx:
            lname = lname.replace("swiglu", "geglu")
        got = llama_tensor(ldir, lidx, lname, stage, rows, width)
        if got is None:
            if lname == "result_output" or lname == "result_norm":
                got = llama_tensor(ldir, lidx, lname, stage, 1, rows * width)
            if got is None:
                if show_all:
                    print(f"{f:16} no llama.cpp tensor {lname} of {rows}x{width}")
                continue
        ref, key = got
        ref = ref.reshape(rows, width)
        d = s != ref
        nd = int(d.sum())
        mx = float(np.abs(s.astype(np.float64) - ref).max())
        rows_bad = sorted(set(np.nonzero(d)[0].tolist()))
        same += nd == 0
        if nd or show_all or layer is None:
            print(f"{f:16} {key:14} {nd:8d} of {d.size:8d} differ, max |d| {mx:.3e}"
                  + (f", rows {rows_bad[:8]}{'...' if len(rows_bad) > 8 else ''}" if nd else ""))
        if nd and bad_layer is None:
            bad_layer = layer
    print(f"{same} tensors bit-identical")


if __name__ == "__main__":
    main()
