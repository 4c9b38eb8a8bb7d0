#!/usr/bin/env python3
"""llama.cpp side of `cargo xtask bench-engine`: aggregate decode throughput of S sequences decoded
together (llama.cpp's batched decode, as its `batched` example and llama-server do), one JSON line
per stream count, the same schema as Synapse's `engine_bench` example.

Usage: python bench_llama_batched.py MODEL.gguf --streams 1,2,4,8,16 --n-gen 128 --threads 2
       --prompt-tokens 16

Prompts: for stream i, BOS (id 2) then ids 1000 + ((i*7919 + k*104729) mod (n_vocab - 2000))
(3 + (… mod (n_vocab - 3)) for vocabularies of at most 4000),
k = 1..prompt_tokens-1 (the engine_bench prompts, token for token). llama.cpp's default context
settings (f16 KV cache, flash attention auto, extra buffer types on; AMX declined as in
bench_llama.py), n_seq_max = S, n_ctx = S × (prompt + n_gen + 8) (at least 1024). Prefill: one
llama_decode of all S prompts (logits for each last position). Decode: n_gen − 1 steps, each one
llama_decode of S tokens (one per sequence, greedy argmax of its logits); timed from the first
decode step to the end: aggregate tok/s = S × (n_gen − 1) / that time.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import time

import numpy as np
import llama_cpp as L

from bench_llama import decline_amx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    a = ap.parse_args()
    if os.environ.get("BENCH_LLAMA_AMX") != "1":
        decline_amx()

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def _noop(level, text, user):  # noqa: ARG001
        pass
    L.llama_log_set(_noop, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp cannot load {a.model}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    for s in [int(x) for x in a.streams.split(",") if x]:
        def spread(i, k):
            v = i * 7919 + k * 104729
            # small vocabularies (the synthetic MoE's 512 pieces): 3 + v mod (n_vocab - 3)
            return 1000 + v % (n_vocab - 2000) if n_vocab > 4000 else 3 + v % (n_vocab - 3)
        prompts = [[2] + [spread(i, k) for k in range(1, a.prompt_tokens)]
                   for i in range(s)]
        cp = L.llama_context_default_params()
        cp.n_ctx = max(1024, s * (a.prompt_tokens + a.n_gen + 8))
        cp.n_batch = max(512, s * a.prompt_tokens)
        cp.n_ubatch = 512
        cp.n_seq_max = s
        cp.n_threads = a.threads
        cp.n_threads_batch = a.threads
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit("llama.cpp context creation failed")
        n_pre = s * a.prompt_tokens
        batch = L.llama_batch_init(max(n_pre, s), 0, 1)
        batch.n_tokens = n_pre
        j = 0
        last = []
        for i, p in enumerate(prompts):
            for k, t in enumerate(p):
                batch.token[j] = t; batch.pos[j] = k; batch.n_seq_id[j] = 1; batch.seq_id[j][0] = i
                batch.logits[j] = 1 if k == len(p) - 1 else 0
                if k == len(p) - 1:
                    last.append(j)
                j += 1
        t0 = time.perf_counter()
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode (prefill) failed")
        nxt = [int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, r), shape=(n_vocab,)))) for r in last]
        t1 = time.perf_counter()
        pos = a.prompt_tokens
        for _ in range(a.n_gen - 1):
            batch.n_tokens = s
            for i in range(s):
                batch.token[i] = nxt[i]; batch.pos[i] = pos; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = i
                batch.logits[i] = 1
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed")
            pos += 1
            nxt = [int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)))) for i in range(s)]
        t2 = time.perf_counter()
        dt = t2 - t1
        print(json.dumps(dict(streams=s, n_gen=a.n_gen, prompt_tokens=a.prompt_tokens, threads=a.threads,
                              decode_steps=a.n_gen - 1, decode_s=dt,
                              aggregate_decode_tok_s=s * (a.n_gen - 1) / dt,
                              per_stream_tok_s=(a.n_gen - 1) / dt, total_s=t2 - t0,
                              llama_cpp_python=L.__version__)), flush=True)
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
