#!/usr/bin/env python3
"""llama.cpp's greedy outputs on a real model: the oracle side of the runtime parity tests.

Run by `cargo xtask parity-fixtures` (see fixtures/README.md); never by the tests.

Usage: python parity_fixtures.py MODEL.gguf OUT_DIR STEM

STEM names the model and picks its prompt set (see MODELS). Writes OUT_DIR/STEM.json (settings,
versions, and per prompt: text, prompt ids, 64 greedy ids, top1-top2 margin of every step, the
top-256 (id, logit) of the last prompt position and the top-8 (id, logit) of every decode step)
and OUT_DIR/STEM.pNN.logits.f32 (the full last-prompt-position logits, little-endian f32, for the
prompts listed in FULL_LOGITS). Deterministic: greedy, no sampling, fixed prompts. Fails (exit 1)
when a model's own check does not hold (Gemma's reference continuation, a chat prompt llama.cpp
tokenizes without its control tokens).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys

import numpy as np
import llama_cpp as L

N_GEN = 64
TOP_K = 256
STEP_TOP_K = 8  # logits stored per decode step (the one-row path's check)
N_THREADS = 1  # see THREAD_CHECK
THREAD_CHECK = 2  # the reference prompt's logits are recomputed with this many threads and compared
N_CTX = 2048
N_BATCH = 512  # llama.cpp's default n_batch/n_ubatch: longer prompts are decoded in 512-token chunks
FULL_LOGITS = (0, 13)  # the reference prompt and the long one (beyond the 512-token sliding window)

LONG = (
    "Chapter one. The river valley had been farmed for nine centuries before the first railway reached it, "
    "and the families who lived there kept careful records of every harvest, flood and wedding. "
    "In 1874 the parish clerk wrote that the spring had come three weeks early, that the apple trees "
    "had flowered in March, and that a frost on the twelfth of April had destroyed almost all of the fruit. "
    "His successor, a schoolteacher named Margaret Ellison, continued the ledger for forty-one years. "
    "She measured rainfall with a copper gauge in the churchyard, counted the swallows that returned each "
    "May, and noted the price of wheat, wool and coal at the market in the neighbouring town. "
    "Chapter two. When the engineers arrived to survey the line, they found her notebooks more useful "
    "than any official map. The river, she had written, rose by four feet after two days of heavy rain, "
    "and the meadow below the mill flooded once every seven years on average. The engineers raised the "
    "embankment accordingly, and the bridge they built in 1881 still carries trains today. "
    "Chapter three. The coming of the railway changed the valley quickly. Milk could now reach the city "
    "before noon; the mill switched from flour to paper; young people left for factories and offices, "
    "and a few of them came back with new ideas about schools, sanitation and the vote. Ellison's ledger "
    "records the first telegraph message received at the station, the first bicycle seen on the high "
    "street, and the first motor car, which frightened a horse and ended up in the duck pond. "
    "Chapter four. By the time of her retirement the ledger filled eleven volumes. Historians who have "
    "studied it since describe it as one of the most complete records of rural life in the period, "
    "not because any single entry is remarkable but because the entries never stop: births and deaths, "
    "prices and wages, weather and crops, arguments at the parish council and the scores of the cricket "
    "matches against the village across the river. Chapter five. Today the volumes are kept in the county "
    "archive, where they are consulted by climate scientists studying the timing of spring, by economists "
    "interested in the history of prices, and by the descendants of the families she wrote about. "
    "Each year, on the anniversary of her first entry, the local school reads a page aloud, and the "
    "children are asked to write one line of their own about the weather, the harvest and the news. "
    "Chapter six. The tradition has spread: three other villages in the valley now keep ledgers of their "
    "own, and a small museum near the station displays the copper rain gauge, her spectacles, and the pen "
    "she used for the last entry, dated the thirtieth of September 1915, which reads simply: "
    "\"Rain in the morning, clearing later. Swallows gone. Wheat at forty-two shillings.\" "
    "Chapter seven. What happened next in the valley is the subject of this chapter."
)

PROMPTS: list[dict] = [
    dict(name="reference", text="The capital of France is"),
    dict(name="single_word", text="Hello"),
    dict(name="arithmetic", text="1 + 1 = 2. 2 + 2 = 4. 3 + 3 = 6. 4 + 4 ="),
    dict(name="numbers", text="In 1969, 3,141,592 people paid $2.71 each; 0x1F = 31, 1e-5 < 0.001, and -42 is negative."),
    dict(name="code_python", text="def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"),
    dict(name="code_rust", text="fn main() {\n    let v: Vec<u32> = (1..=10).collect();\n    let sum: u32 = v.iter().sum();\n    println!(\"{}\", "),
    dict(name="french", text="La tour Eiffel, construite pour l'Exposition universelle de 1889, est"),
    dict(name="german", text="Die Straßenbahn fährt über die Brücke, während die Kinder im Park"),
    dict(name="chinese", text="中国的首都是北京。日本的首都是"),
    dict(name="japanese_korean", text="富士山は日本で一番高い山です。한국의 수도는"),
    dict(name="russian_arabic_emoji", text="Привет, мир! مرحبا بالعالم 🌍🚀 — and in English:"),
    dict(name="chat_gemma", chat=[("user", "Write a haiku about the sea.")]),
    dict(name="whitespace", text="  two  spaces,\ttab,\n\nnewlines\n    - indented item\n    - another item\n"),
    dict(name="long_beyond_window", text=LONG),
    dict(name="json", text="{\"name\": \"Synapse\", \"version\": [0, 1, 0], \"features\": [\"gguf\", \"kv-cache\""),
    dict(name="qa_list", text="Q: List three primary colors.\nA: 1."),
]

# The instruct models: the same raw prompts, and chats rendered with the model's own
# `tokenizer.chat_template` as transformers renders it (jinja2, trim_blocks, lstrip_blocks).
CHAT_PROMPTS: list[dict] = [
    dict(name="chat_user", chat=[("user", "Write a haiku about the sea.")]),
    dict(name="chat_multi_turn", chat=[("system", "You are a helpful assistant that answers briefly."),
                                       ("user", "What is the capital of France?"),
                                       ("assistant", "Paris."),
                                       ("user", "And of Italy?")]),
    dict(name="chat_code", chat=[("system", "You are a careful programmer."),
                                 ("user", "Write a Python function that checks whether a string is a palindrome.")]),
]
INSTRUCT_PROMPTS = [p if p["name"] != "chat_gemma" else CHAT_PROMPTS[0] for p in PROMPTS] + CHAT_PROMPTS[1:]

# stem -> prompt set, how chats are rendered, and the model's own check.
MODELS = {
    "gemma3-270m-q4_k_m": dict(prompts=PROMPTS, chat="llama.cpp built-in 'gemma' (the GGUF has no tokenizer.chat_template)",
                               check=[506, 5279, 529, 506, 2891]),
    "qwen2.5-coder-0.5b-instruct-q4_k_m": dict(prompts=INSTRUCT_PROMPTS, chat="jinja", check=None),
    "smollm2-135m-instruct-q4_1": dict(prompts=INSTRUCT_PROMPTS, chat="jinja", check=None),
}


def quiet_logs():
    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def _noop(level, text, user):  # noqa: ARG001
        pass
    quiet_logs.cb = _noop  # keep alive
    L.llama_log_set(_noop, None)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load(path: str, extra_bufts: bool):
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = extra_bufts
    m = L.llama_model_load_from_file(path.encode(), mp)
    if not m:
        raise RuntimeError(f"cannot load {path}")
    return m


def new_ctx(model, n_threads=N_THREADS):
    cp = L.llama_context_default_params()
    cp.n_ctx = N_CTX
    cp.n_batch = N_BATCH
    cp.n_ubatch = N_BATCH
    cp.n_seq_max = 1
    cp.n_threads = n_threads
    cp.n_threads_batch = n_threads
    cp.type_k = 0  # GGML_TYPE_F32
    cp.type_v = 0
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("context creation failed")
    return ctx, cp


def tokenize(vocab, text: str, parse_special: bool) -> list[int]:
    b = text.encode()
    buf = (L.llama_token * (len(b) + 16))()
    n = L.llama_tokenize(vocab, b, len(b), buf, len(buf), True, parse_special)
    if n < 0:
        raise RuntimeError("tokenize failed")
    return list(buf[:n])


def piece(vocab, tok: int) -> bytes:
    buf = (ctypes.c_char * 256)()
    n = L.llama_token_to_piece(vocab, tok, buf, len(buf), 0, False)
    return bytes(buf[:n])


def apply_gemma_template(messages) -> str:
    arr = (L.llama_chat_message * len(messages))()
    keep = []
    for i, (role, content) in enumerate(messages):
        r, c = role.encode(), content.encode()
        keep += [r, c]
        arr[i].role = r
        arr[i].content = c
    buf = ctypes.create_string_buffer(4096)
    n = L.llama_chat_apply_template(b"gemma", arr, len(messages), True, buf, len(buf))
    if n < 0 or n > len(buf):
        raise RuntimeError("llama_chat_apply_template failed")
    return buf.raw[:n].decode()


def meta_str(model, key: str):
    buf = ctypes.create_string_buffer(1 << 16)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode()


def apply_jinja_template(model, vocab, messages) -> str:
    """The GGUF's `tokenizer.chat_template` rendered as transformers' `apply_chat_template` does."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    src = meta_str(model, "tokenizer.chat_template")
    if src is None:
        raise RuntimeError("the model has no tokenizer.chat_template")

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, sort_keys=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    bos = piece(vocab, L.llama_vocab_bos(vocab)).decode() if L.llama_vocab_bos(vocab) >= 0 else ""
    eos = piece(vocab, L.llama_vocab_eos(vocab)).decode() if L.llama_vocab_eos(vocab) >= 0 else ""
    return env.from_string(src).render(messages=[dict(role=r, content=c) for r, c in messages],
                                       add_generation_prompt=True, bos_token=bos, eos_token=eos)


def top(lg, k):
    order = np.argsort(-lg, kind="stable")[:k]
    return [int(i) for i in order], [float(lg[i]) for i in order]


def run_prompt(ctx, vocab, n_vocab, toks):
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    batch = L.llama_batch_init(N_BATCH, 0, 1)
    try:
        last = None
        for start in range(0, len(toks), N_BATCH):
            chunk = toks[start:start + N_BATCH]
            batch.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                batch.token[i] = t
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if start + i == len(toks) - 1 else 0
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            last = len(chunk) - 1
        prompt_logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, last), shape=(n_vocab,)).copy()
        gen, margins, runner_up, step_top = [], [], [], []
        lg = prompt_logits
        pos = len(toks)
        eog = False
        for _ in range(N_GEN):
            t1 = int(np.argmax(lg))  # ties: lowest id first
            rest = lg.copy()
            rest[t1] = -np.inf
            t2 = int(np.argmax(rest))
            gen.append(t1)
            margins.append(float(lg[t1] - lg[t2]))
            runner_up.append(t2)
            if L.llama_vocab_is_eog(vocab, t1):
                eog = True
                break
            batch.n_tokens = 1
            batch.token[0] = t1
            batch.pos[0] = pos
            batch.n_seq_id[0] = 1
            batch.seq_id[0][0] = 0
            batch.logits[0] = 1
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            pos += 1
            lg = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,)).copy()
            step_top.append(top(lg, STEP_TOP_K))
        return prompt_logits, gen, margins, runner_up, eog, step_top
    finally:
        L.llama_batch_free(batch)


def main():
    model_path, out_dir, stem = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = MODELS[stem]
    os.makedirs(out_dir, exist_ok=True)
    quiet_logs()
    L.llama_backend_init()
    # ggml's plain CPU kernels: no extra buffer types. llama.cpp's default extra buffer types on this
    # CPU (AMX repacking) die with SIGILL here (the VM lists AMX but does not grant its tiles).
    model = load(model_path, False)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    ctx, cp = new_ctx(model)
    plain = []
    for idx, p in enumerate(spec["prompts"]):
        if "chat" in p:
            if spec["chat"] == "jinja":
                text = apply_jinja_template(model, vocab, p["chat"])
            else:
                text = apply_gemma_template(p["chat"])
            special = True
        else:
            text, special = p["text"], False
        toks = tokenize(vocab, text, special)
        if special and toks == tokenize(vocab, text, False):
            sys.exit(f"{p['name']}: the chat text tokenizes the same without special tokens: no control tokens?")
        lg, gen, margins, runner_up, eog, step_top = run_prompt(ctx, vocab, n_vocab, toks)
        plain.append(dict(idx=idx, name=p["name"], text=text, parse_special=special, lg=lg, toks=toks,
                          gen=gen, margins=margins, runner_up=runner_up, eog=eog, chat=p.get("chat"),
                          step_top=step_top))
        print(f"  {idx:2d} {p['name']:22s} prompt {len(toks):4d} tok, gen {len(gen):2d}, "
              f"min margin {min(margins):.4f}, steps with margin < 0.1: {sum(m < 0.1 for m in margins)}",
              flush=True)
    sysinfo = L.llama_print_system_info().decode()
    L.llama_free(ctx)
    # ggml splits every op by rows over threads, so the thread count does not change results; the
    # generation runs on 1 thread because 2 spinning ggml threads crawl on a shared 2-core machine.
    # Check the claim on the reference prompt (its last-prompt logits and first greedy steps).
    ctx2, _ = new_ctx(model, THREAD_CHECK)
    r0 = plain[0]
    global N_GEN
    n_gen_saved, N_GEN = N_GEN, 4
    lg2, gen2, _, _, _, _ = run_prompt(ctx2, vocab, n_vocab, r0["toks"])
    N_GEN = n_gen_saved
    thread_check = dict(n_threads=THREAD_CHECK, prompt=r0["name"],
                        last_logits_max_abs_diff=float(np.abs(lg2 - r0["lg"]).max()),
                        first_greedy_ids=gen2, equal_to_n_threads_1=gen2 == r0["gen"][:len(gen2)])
    print(f"  thread check: {thread_check}", flush=True)
    L.llama_free(ctx2)
    L.llama_model_free(model)

    prompts_out = []
    for r in plain:
        lg = r["lg"]
        order = np.argsort(-lg, kind="stable")[:TOP_K]
        entry = dict(
            name=r["name"], text=r["text"], parse_special=r["parse_special"],
            prompt_ids=r["toks"], greedy_ids=r["gen"],
            greedy_text=None,  # filled below from a vocab-only load
            stopped_at_eog=r["eog"], margins=[round(m, 6) for m in r["margins"]],
            runner_up_ids=r["runner_up"],
            last_logits_top_ids=[int(i) for i in order],
            last_logits_top_values=[float(lg[i]) for i in order],
            last_logits_stats=dict(max=float(lg.max()), min=float(lg.min()), mean=float(lg.mean()),
                                   std=float(lg.std())),
            step_top_ids=[t[0] for t in r["step_top"]],
            step_top_values=[t[1] for t in r["step_top"]],
        )
        if r["chat"]:
            entry["chat_messages"] = [dict(role=a, content=b) for a, b in r["chat"]]
            entry["chat_template"] = (spec["chat"] if spec["chat"] != "jinja" else
                                      "the GGUF's tokenizer.chat_template, rendered as transformers does "
                                      "(jinja2, trim_blocks, lstrip_blocks, add_generation_prompt)")
        if r["idx"] in FULL_LOGITS:
            fn = f"{stem}.p{r['idx']:02d}.logits.f32"
            lg.astype("<f4").tofile(os.path.join(out_dir, fn))
            entry["full_logits_file"] = fn
        prompts_out.append(entry)

    # decode the greedy text once more with a vocab-only load for the human-readable field
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    vm = L.llama_model_load_from_file(model_path.encode(), mp)
    vv = L.llama_model_get_vocab(vm)
    for e in prompts_out:
        e["greedy_text"] = b"".join(piece(vv, t) for t in e["greedy_ids"]).decode("utf-8", "replace")
    L.llama_model_free(vm)

    doc = dict(
        about="llama.cpp greedy oracle for the runtime parity tests; regenerate with `cargo xtask parity-fixtures`",
        model=dict(file=os.path.basename(model_path), sha256=sha256(model_path),
                   bytes=os.path.getsize(model_path), n_vocab=len(plain[0]["lg"])),
        llama_cpp=dict(llama_cpp_python=L.__version__, system_info=sysinfo),
        thread_check=thread_check,
        settings=dict(n_threads=N_THREADS, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH,
                      type_k="f32", type_v="f32", flash_attn="disabled", use_extra_bufts=False,
                      add_special=True, n_gen=N_GEN, top_k_stored=TOP_K, step_top_k_stored=STEP_TOP_K, sampling="greedy argmax, ties -> lowest id",
                      stop="after an end-of-generation token (llama_vocab_is_eog), which is included",
                      margin="logit[top1] - logit[top2] of the logits that chose greedy_ids[i]; "
                             "step 0 is the last prompt position",
                      step_top="step_top_*[i]: the top-8 logits after decoding greedy_ids[i] (one-row batch)"),
        prompts=prompts_out,
    )
    out = os.path.join(out_dir, f"{stem}.json")
    with open(out, "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    for e in prompts_out:
        if "full_logits_file" in e:
            p = os.path.join(out_dir, e["full_logits_file"])
            print(f"wrote {p} ({os.path.getsize(p)} bytes)")
    n_close = sum(any(m < 0.1 for m in e["margins"]) for e in prompts_out)
    print(f"{n_close}/{len(prompts_out)} prompts have a step with a top1-top2 margin below 0.1")
    if spec["check"] is not None:
        ref = prompts_out[0]["greedy_ids"][:len(spec["check"])]
        if ref != spec["check"]:
            sys.exit(f"reference check {prompts_out[0]['text']!r} -> {ref}, expected {spec['check']}: MISMATCH")
        print(f"reference check {prompts_out[0]['text']!r} -> {ref}: OK")
    if not thread_check["equal_to_n_threads_1"] or thread_check["last_logits_max_abs_diff"] != 0:
        sys.exit("the thread check failed: results depend on the thread count")


if __name__ == "__main__":
    main()
