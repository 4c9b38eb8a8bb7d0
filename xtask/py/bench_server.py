#!/usr/bin/env python3
"""Load driver of `cargo xtask bench-server`: the same streaming completion load against any
OpenAI-compatible server (Synapse's `synapse-cli serve`, llama.cpp's `llama-server`).

Usage: python bench_server.py BASE_URL --clients 8 --requests 2 --n-gen 128 [--model NAME]

Each of C client threads sends R streaming `POST /v1/completions` requests one after another
(distinct prompts, temperature 0, `max_tokens` = n_gen, `ignore_eos` so every request decodes
n_gen tokens), reading the SSE stream as it arrives. Per request: TTFT = time from sending to the
first chunk with text; inter-token latencies = gaps between consecutive text chunks. Prints one
JSON line: aggregate throughput (completion tokens from `usage` / wall time of the whole load),
TTFT and inter-token p50/p99 in ms, errors. Standard library only.
"""
from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
import urllib.parse

WORDS = ("river", "mountain", "city", "engine", "garden", "planet", "music", "history", "ocean",
         "forest", "machine", "language", "winter", "market", "library", "bridge")


def prompt(i: int) -> str:
    w = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(6)]
    return f"Write a short story about a {w[0]}, a {w[1]} and a {w[2]}. It begins in the {w[3]} near the {w[4]} where the {w[5]}"


def one(base, model, i, n_gen, out, lock):
    u = urllib.parse.urlparse(base)
    body = {"prompt": prompt(i), "max_tokens": n_gen, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    data = json.dumps(body).encode()
    rec = {"ttft": None, "itl": [], "tokens": 0, "error": None}
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
        else:
            last = None
            chunks = 0
            for raw in r:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                ev = json.loads(payload)
                usage = ev.get("usage")
                if usage and usage.get("completion_tokens"):
                    rec["tokens"] = usage["completion_tokens"]
                for ch in ev.get("choices") or []:
                    if ch.get("text"):
                        now = time.perf_counter()
                        chunks += 1
                        if rec["ttft"] is None:
                            rec["ttft"] = now - t0
                        elif last is not None:
                            rec["itl"].append(now - last)
                        last = now
            if not rec["tokens"]:
                rec["tokens"] = chunks
        c.close()
    except Exception as e:  # noqa: BLE001
        rec["error"] = repr(e)
    with lock:
        out.append(rec)


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--model", default="")
    a = ap.parse_args()
    out, lock = [], threading.Lock()

    def client(ci):
        for r in range(a.requests):
            one(a.base, a.model, ci * a.requests + r, a.n_gen, out, lock)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(ci,)) for ci in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in out if not r["error"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    toks = sum(r["tokens"] for r in ok)
    ms = lambda x: None if x is None else round(x * 1e3, 2)  # noqa: E731
    print(json.dumps(dict(clients=a.clients, requests=len(out), ok=len(ok),
                          errors=[r["error"] for r in out if r["error"]][:5],
                          completion_tokens=toks, wall_s=wall, throughput_tok_s=toks / wall,
                          ttft_p50_ms=ms(pct(ttft, 50)), ttft_p99_ms=ms(pct(ttft, 99)),
                          itl_p50_ms=ms(pct(itl, 50)), itl_p99_ms=ms(pct(itl, 99)))), flush=True)


if __name__ == "__main__":
    main()
