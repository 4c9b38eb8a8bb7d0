#!/usr/bin/env python3
"""llama.cpp side of `cargo xtask bench-vs-llama`: one timed run, printed as one JSON line with the
same schema as `synapse-cli generate --json`.

Usage: python bench_llama.py MODEL.gguf PROMPT_FILE --threads 2 --n-gen 128

Drives llama.cpp through llama-cpp-python's low-level API with llama.cpp's default context settings
(as a user gets them: f16 KV cache, flash attention auto, extra buffer types on) except n_threads
and AMX, which is declined (see decline_amx; BENCH_LLAMA_AMX=1 allows it). Prints {"prompt_tokens", "tokens", "text", "timings": {"load_s", "prefill_tok_s",
"decode_tok_s"}, "baseline_rss_kb"}: load_s covers model load + context creation; prefill is one
llama_decode of the whole prompt (logits for the last position only); decode is n_gen greedy
tokens, one llama_decode each, regardless of end-of-generation tokens; baseline_rss_kb is this
Python process's RSS before llama.cpp loads anything (the interpreter's own share of the peak RSS).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import time

import numpy as np
import llama_cpp as L


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def decline_amx():
    """Make ggml's AMX initialisation fail, as on a CPU without AMX.

    On this project's machines the CPU flags list AMX and the kernel grants the permission, but
    AMX tile instructions die with SIGILL (llama.cpp's default AMX buffer type crashes on the first
    multi-token batch). ggml asks for AMX with arch_prctl(ARCH_REQ_XCOMP_PERM), which the kernel
    refuses (ENOSPC) while a thread has an alternate signal stack too small for the AMX state; so
    install a 4 KiB one on this (the only) thread first. llama.cpp then uses its remaining default
    extra buffer type, CPU_REPACK (Q4_K -> q4_K_8x8), exactly as on an AVX-512 CPU without AMX.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    class StackT(ctypes.Structure):
        _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]

    decline_amx.stack = ctypes.create_string_buffer(4096)  # kept alive for the process lifetime
    st = StackT(ctypes.cast(decline_amx.stack, ctypes.c_void_p), 0, 4096)
    if libc.sigaltstack(ctypes.byref(st), None) != 0:
        raise SystemExit(f"sigaltstack failed: errno {ctypes.get_errno()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompt_file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=128)
    a = ap.parse_args()
    amx = os.environ.get("BENCH_LLAMA_AMX") == "1"
    if not amx:
        decline_amx()
    prompt = open(a.prompt_file, encoding="utf-8").read()

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def _noop(level, text, user):  # noqa: ARG001
        pass
    L.llama_log_set(_noop, None)
    baseline = rss_kb()

    t0 = time.perf_counter()
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp cannot load {a.model}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    b = prompt.encode()
    buf = (L.llama_token * (len(b) + 16))()
    n = L.llama_tokenize(vocab, b, len(b), buf, len(buf), True, False)
    toks = list(buf[:n])
    cp = L.llama_context_default_params()
    cp.n_ctx = max(1024, len(toks) + a.n_gen + 8)
    cp.n_batch = max(512, len(toks))
    cp.n_ubatch = 512
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp context creation failed")
    t1 = time.perf_counter()

    batch = L.llama_batch_init(len(toks), 0, 1)
    batch.n_tokens = len(toks)
    for i, t in enumerate(toks):
        batch.token[i] = t; batch.pos[i] = i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0
        batch.logits[i] = 1 if i == len(toks) - 1 else 0
    t2 = time.perf_counter()
    if L.llama_decode(ctx, batch) != 0:
        raise SystemExit("llama_decode failed")
    L.llama_synchronize(ctx)
    nxt = int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, len(toks) - 1), shape=(n_vocab,))))
    t3 = time.perf_counter()
    out = []
    pos = len(toks)
    for _ in range(a.n_gen):
        out.append(nxt)
        batch.n_tokens = 1
        batch.token[0] = nxt; batch.pos[0] = pos; batch.n_seq_id[0] = 1; batch.seq_id[0][0] = 0
        batch.logits[0] = 1
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        pos += 1
        nxt = int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,))))
    t4 = time.perf_counter()

    pbuf = (ctypes.c_char * 256)()
    text = b"".join(bytes(pbuf[:L.llama_token_to_piece(vocab, t, pbuf, 256, 0, False)]) for t in out)
    print(json.dumps(dict(
        prompt_tokens=toks, tokens=out, text=text.decode("utf-8", "replace"),
        timings=dict(load_s=t1 - t0, prefill_tok_s=len(toks) / (t3 - t2), decode_tok_s=a.n_gen / (t4 - t3)),
        baseline_rss_kb=baseline, llama_cpp_python=L.__version__, amx=amx)))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
