#!/usr/bin/env python3
"""llama.cpp's perplexity of a text: the oracle side of the runtime's perplexity test.

Run by `cargo xtask perplexity-fixtures` (see fixtures/README.md); never by the tests.

Usage: python perplexity_oracle.py MODEL.gguf TEXT MANIFEST CTX CHUNKS OUT.json

Mirrors llama.cpp's tools/perplexity/perplexity.cpp (the vendored llama.cpp of llama-cpp-python)
through the low-level API in the project's exact configuration (f32 KV, flash attention off, no
repacked buffers, n_batch = n_ubatch = CTX): the text tokenized once with BOS, chunks of CTX
tokens, each in a cleared cache with its first token replaced by BOS, logits for the positions
from CTX/2 on, every token of the second half scored by log_softmax (max in f32, sum of expf in
f64), the nll summed in f64. Writes the token ids of the chunks, each chunk's running
perplexity, the final one, and the text's hash from the corpus manifest.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import llama_cpp as L

from parity_fixtures import load, quiet_logs


def main():
    model_path, text_path, manifest_path = sys.argv[1], sys.argv[2], sys.argv[3]
    n_ctx, n_chunks, out = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    quiet_logs()
    L.llama_backend_init()
    model = load(model_path, False)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_ctx
    cp.n_ubatch = n_ctx
    cp.n_seq_max = 1
    cp.n_threads = 2
    cp.n_threads_batch = 2
    cp.type_k = 0  # GGML_TYPE_F32
    cp.type_v = 0
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("context creation failed")

    text = open(text_path, encoding="utf-8").read()
    b = text.encode()
    buf = (L.llama_token * (len(b) + 16))()
    n = L.llama_tokenize(vocab, b, len(b), buf, len(buf), True, False)
    if n < 0:
        raise RuntimeError("tokenize failed")
    tokens = list(buf[:n])
    if len(tokens) < 2 * n_ctx:
        raise RuntimeError(f"{len(tokens)} tokens: need {2 * n_ctx}")
    add_bos = bool(L.llama_vocab_get_add_bos(vocab))
    bos = L.llama_vocab_bos(vocab)
    n_chunks = min(n_chunks, len(tokens) // n_ctx)
    first = n_ctx // 2
    batch = L.llama_batch_init(n_ctx, 0, 1)
    nll, nll2, count, running = 0.0, 0.0, 0, []
    try:
        for c in range(n_chunks):
            chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            batch.n_tokens = n_ctx
            for k in range(n_ctx):
                batch.token[k] = bos if (add_bos and k == 0) else chunk[k]
                batch.pos[k] = k
                batch.n_seq_id[k] = 1
                batch.seq_id[k][0] = 0
                batch.logits[k] = 1 if k >= first else 0
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            for i in range(n_ctx - 1 - first):
                lg = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, first + i), shape=(n_vocab,))
                mx = np.float32(lg.max())
                sum_exp = float(np.sum(np.exp((lg - mx).astype(np.float32)).astype(np.float64)))
                v = -(float(np.float32(lg[chunk[first + i + 1]] - mx)) - np.log(sum_exp))
                nll += v
                nll2 += v * v
            count += n_ctx - 1 - first
            running.append(float(np.exp(nll / count)))
            print(f"[{c + 1}]{running[-1]:.4f}", file=sys.stderr)
    finally:
        L.llama_batch_free(batch)
    manifest = json.load(open(manifest_path))
    doc = {
        "model": model_path.rsplit("/", 1)[-1],
        "text": "evaluation part of " + manifest["package"] + " " + manifest["version"],
        "text_blake3": manifest["evaluation"]["blake3"],
        "text_tokens": len(tokens),
        "ctx": n_ctx,
        "chunks": n_chunks,
        "add_bos": add_bos,
        "chunk_tokens": tokens[:n_chunks * n_ctx],
        "running_ppl": running,
        "ppl": float(np.exp(nll / count)),
        "count": count,
        "settings": dict(n_threads=2, n_batch=n_ctx, n_ubatch=n_ctx, type_k="f32", type_v="f32",
                         flash_attn="disabled", use_extra_bufts=False),
        "versions": {"llama_cpp_python": L.__version__, "numpy": np.__version__},
    }
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"ppl {doc['ppl']:.6f} over {count} tokens -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
