#!/usr/bin/env python3
"""tokenizer.json files written by transformers, with transformers' own ids for a set of texts.

Run by `cargo xtask hf-tokenizer-fixtures` (see fixtures/README.md); never by the tests. Needs the
oracle venv with transformers==4.57.6 (the version of the other transformers fixtures), its
tokenizers (0.22.2), sentencepiece and protobuf; nothing is fetched.

Usage: python hf_tokenizer_fixtures.py OUT_DIR   (the repository is the one holding this script)

Writes, for each tokenizer below, OUT_DIR/<name>/: what `save_pretrained` writes (tokenizer.json,
tokenizer_config.json, special_tokens_map.json; not the slow tokenizers' files) and
expected.json: the versions, and per text `tokenizer(text, add_special_tokens=False).input_ids`
and `tokenizer(text).input_ids` of the saved folder loaded back with `AutoTokenizer` (added
tokens such as `<s>` in the text are matched, as transformers always does).

- `tiny-llama`: `AutoTokenizer.from_pretrained("fixtures/tiny/llama")`, the tiny llama model's
  tokenizer (`tokenizer.model`: SentencePiece BPE, 512 pieces with byte fallback, and its
  `tokenizer_config.json`: `LlamaTokenizer`, legacy, BOS added), which transformers converts to
  a tokenizers BPE model (`LlamaTokenizerFast`).
- `tiny-bytelevel`: a byte-level BPE (GPT-2 style: 256 byte tokens, `<|endoftext|>` and 143
  merges, 400 tokens) trained here with the `tokenizers` package on the tiny models' training
  text, wrapped in `GPT2TokenizerFast` and saved by it.
Deterministic: two runs give the same files byte for byte.
"""
from __future__ import annotations

import json
import os
import sys

import tokenizers
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, GPT2TokenizerFast

TRAIN = """The quick brown fox jumps over the lazy dog. A tiny model is a useful oracle.
Synapse loads GGUF and safetensors files, quantizes weights, and runs CPU kernels.
Continuous batching keeps the machine busy; speculative decoding uses a small draft model.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols + - * / = ( ) [ ] { } < > ! ? , . ; :
Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt.
"""

SLOW_FILES = ["tokenizer.model", "vocab.json", "merges.txt"]

TEXTS = [
    "", " ", "  ", "\n", "\n\n", "\t", " \n ", "a", " a", "a ", "Hello", " Hello", "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "The quick brown fox runs CPU kernels, 42 times.",
    "Synapse loads GGUF and safetensors files, quantizes weights, and runs CPU kernels.",
    "   leading and trailing spaces   ", "multiple   inner    spaces", "line1\nline2\r\nline3",
    "tab\tseparated\tvalues", "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 12345 3.14159",
    "symbols + - * / = ( ) [ ] { } < > ! ? , . ; :", "don't won't I'm you're they'll we've it's",
    "CamelCase snake_case kebab-case UPPER lower", "e-mail: test@example.com https://example.com/?q=1",
    "Café naïve résumé", "Ünïcödé ß", "Русский текст", "日本語のテキスト", "中文文本", "한국어",
    "😀 emoji 🦀 and 👍🏽", "▁ already a metaspace", "<0x41> is not a byte token in text",
    "def f(x):\n    return x * 2\n", "{\"key\": [1, 2, null]}", "<s>", "</s>", "<unk>",
    "<s>Hello</s>", "text <s> in the middle", "Hello</s><s>World", "<s> space after", "x</s> y",
    "zzzzzzzzzzzzzzzzzzzzzzzz", "qwertyuiop asdfghjkl", "Lorem ipsum dolor sit amet, consectetur",
]


def write(tok, name: str, out_root: str, source: str) -> None:
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    tok.save_pretrained(out)
    # What a user of the saved folder gets: load it back the way they would.
    back = AutoTokenizer.from_pretrained(out)
    assert len(back) == len(tok), (name, len(back), len(tok))
    cases = []
    for t in TEXTS:
        plain = back(t, add_special_tokens=False)["input_ids"]
        special = back(t)["input_ids"]
        assert plain == tok(t, add_special_tokens=False)["input_ids"], (name, t)
        cases.append({"text": t, "ids": plain, "ids_with_special": special})
    # The slow tokenizers' files that save_pretrained also writes (tokenizer.model, a copy of
    # fixtures/tiny/llama/tokenizer.model; vocab.json and merges.txt) are left out, after the
    # load-back above (which needs tokenizer.model: the config's legacy `add_prefix_space`
    # makes transformers rebuild from the slow tokenizer). The test reads tokenizer.json only.
    for f in SLOW_FILES:
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as fh:
        head = {
            "source": source,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "class": type(back).__name__,
            "regenerate": "cargo xtask hf-tokenizer-fixtures",
            "ids": "tokenizer(text, add_special_tokens=False).input_ids",
            "ids_with_special": "tokenizer(text).input_ids",
        }
        fh.write(json.dumps(head, ensure_ascii=False)[:-1] + ',\n"cases": [\n')
        fh.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        fh.write("\n]}\n")
    print(f"{name}: {len(cases)} texts -> {out} ({', '.join(sorted(os.listdir(out)))})")


def main() -> None:
    out_root = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    llama = AutoTokenizer.from_pretrained(os.path.join(root, "fixtures/tiny/llama"))
    assert len(llama) == 512, f"converted {len(llama)} tokens, not the model's 512"
    write(llama, "tiny-llama", out_root,
          'AutoTokenizer.from_pretrained("fixtures/tiny/llama").save_pretrained')

    bl = Tokenizer(models.BPE())
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bl.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bl.train_from_iterator([TRAIN] * 50, trainer=trainer)
    gpt2 = GPT2TokenizerFast(tokenizer_object=bl, bos_token="<|endoftext|>",
                             eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    assert len(gpt2) == 400, len(gpt2)
    write(gpt2, "tiny-bytelevel", out_root,
          "tokenizers BpeTrainer (ByteLevel, vocab_size 400) on the tiny models' text, "
          "GPT2TokenizerFast(tokenizer_object=...).save_pretrained")


if __name__ == "__main__":
    main()
