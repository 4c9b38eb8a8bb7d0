#!/usr/bin/env python3
"""Tiny random-weight models of every family, with transformers' and llama.cpp's logits.

Run by `cargo xtask tiny-models` (see fixtures/README.md); never by the tests.

Usage: python tiny_models.py LLAMA_CPP_DIR OUT_DIR [FAMILY ...]
  LLAMA_CPP_DIR: the llama.cpp vendored in the llama-cpp-python sdist (convert_hf_to_gguf.py, gguf-py/)
  FAMILY in: llama qwen2 gemma3 olmoe granitemoe qwen2moe mixtral bitnet bitnet-relu2
  bitnet-w158a8 olmoe-clip bitnet-packed olmoe-k olmoe-norm qwen2moe-norm (default: all)

For each FAMILY writes OUT_DIR/<family>/:
  config.json, generation_config.json, model.safetensors    (transformers save_pretrained, fp32)
  tokenizer.model, tokenizer_config.json, special_tokens_map.json
      (SentencePiece BPE, 512 pieces, byte fallback, identity normalizer; trained here on a fixed text)
  model.f32.gguf, model.q8_0.gguf       (llama.cpp's convert_hf_to_gguf.py --outtype f32 / q8_0,
                                         through convert_tiny.py: see there for the two adaptations)
  logits.hf.f32                          transformers' fp32 logits (eager attention), every position
  logits.llama-f32.f32, logits.llama-q8_0.f32   llama.cpp's logits for the two GGUFs (f32 KV cache,
                                         flash attention off, 1 thread), every position
  oracle.json                            the sequences, shapes, greedy continuations, agreement figures
olmoe-k is OLMoE 256 wide (K-quant blocks hold 256 weights of a row) quantized by llama.cpp's own
quantizer to Q4_K_M (model.q4_k_m.gguf, logits.llama-q4_k_m.f32): the K-quant experts whose rows
llama.cpp's mul_mat_id tiles where 8 or more of a batch route to one. Its safetensors and F32 GGUF
(8 MB each) are checked against transformers and then not kept (oracle.json `pruned`).
olmoe-norm and qwen2moe-norm are olmoe and qwen2moe (the same weights) with norm_topk_prob=True:
the top-k routing weights renormalised to sum 1, which llama.cpp's graphs for these architectures
never do, so transformers is their only oracle (no GGUFs).
Logits files are little-endian f32, the sequences' rows concatenated: [sum(len(seq)), n_vocab].
Everything is seeded; weights ~ N(0, 0.1), norm weights ~ 1 + N(0, 0.1) (Gemma: N(0, 0.1), since its
RMSNorm multiplies by 1 + w).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

H, NH, NKV, FF, FF_MOE, SEED, NGEN = 64, 4, 2, 128, 64, 0, 8
VOCAB = 512

TEXT = """The quick brown fox jumps over the lazy dog. A tiny model is a useful oracle.
Synapse loads GGUF and safetensors files, quantizes weights, and runs CPU kernels.
Continuous batching keeps the machine busy; speculative decoding uses a small draft model.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols + - * / = ( ) [ ] { } < > ! ? , . ; :
Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt.
"""

SENTENCE = "The quick brown fox runs CPU kernels, 42 times."

FAMILIES = ["llama", "qwen2", "gemma3", "olmoe", "granitemoe", "qwen2moe", "mixtral", "bitnet",
            "bitnet-relu2", "bitnet-w158a8", "olmoe-clip", "bitnet-packed", "olmoe-k",
            "olmoe-norm", "qwen2moe-norm"]
# Quantized by llama.cpp's quantizer (`llama_model_quantize`) from the F32 GGUF, not converted.
QUANTIZED = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
# Families whose large files are dropped once checked (see the module docs).
PRUNE = {"olmoe-k": ("model.safetensors", "model.f32.gguf")}
# Families llama.cpp has no graph for: transformers is their only oracle (no GGUFs). OLMoE with
# clip_qkv: llama.cpp's converter drops the clamp and its OLMoE graph has none. OLMoE and Qwen2-MoE
# with norm_topk_prob: llama.cpp's olmoe and qwen2moe graphs never renormalise the top-k weights.
HF_ONLY = {"bitnet-relu2", "bitnet-w158a8", "olmoe-clip", "bitnet-packed", "olmoe-norm",
           "qwen2moe-norm"}
# BitNet b1.58's W1.58A8 as transformers runs it over full-precision masters (AutoBitLinear,
# online: weights ternarised per tensor, activations quantised per token to 8 bits).
W158A8 = {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"}
# The same numerics over weights stored already ternary, as microsoft/bitnet-b1.58-2B-4T ships
# them (transformers' BitLinear, offline: uint8 packed four rows a byte, a BF16 weight_scale).
W158A8_PACKED = {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# BitNet: 256-wide (TQ1_0/TQ2_0 blocks hold 256 weights of a row), weights stored as BF16 as the
# published masters are (every value is BF16-exact, so transformers' fp32 run sees the same numbers).
BITNET_DIMS = dict(hidden_size=256, intermediate_size=512)


def gguf_types(family: str) -> tuple[str, ...]:
    if family in HF_ONLY:
        return ()
    if family.startswith("bitnet"):
        return ("f32", "tq1_0", "tq2_0")
    if family == "olmoe-k":
        return ("f32", "q4_k_m")
    return ("f32", "q8_0")


def train_tokenizer(work: str) -> str:
    import sentencepiece as spm
    os.makedirs(work, exist_ok=True)
    txt = os.path.join(work, "spm_train.txt")
    with open(txt, "w") as f:
        for i in range(200):
            f.write(TEXT)
            f.write(" ".join(str((i * 7919 + j * 104729) % 100000) for j in range(20)) + "\n")
    # relative paths: the trainer records them in the model file, which must not depend on the checkout
    cwd = os.getcwd()
    os.chdir(work)
    try:
        spm.SentencePieceTrainer.train(
            input="spm_train.txt", model_prefix="tiny_spm", vocab_size=VOCAB, model_type="bpe",
            byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            num_threads=1, normalization_rule_name="identity", minloglevel=2)
    finally:
        os.chdir(cwd)
    return os.path.join(work, "tiny_spm.model")


def base_kwargs(vocab: int, layers: int = 2):
    return dict(vocab_size=vocab, hidden_size=H, intermediate_size=FF, num_hidden_layers=layers,
                num_attention_heads=NH, num_key_value_heads=NKV, max_position_embeddings=256,
                bos_token_id=1, eos_token_id=2, pad_token_id=0, rms_norm_eps=1e-5,
                torch_dtype="float32")


def make_config(family: str, vocab: int):
    k = base_kwargs(vocab)
    if family == "llama":  # GQA 4/2, untied head, no rope scaling
        return "LlamaForCausalLM", transformers.LlamaConfig(
            **k, tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None)
    if family == "qwen2":  # q/k/v biases (always on in Qwen2), untied head
        return "Qwen2ForCausalLM", transformers.Qwen2Config(
            **k, tie_word_embeddings=False, rope_theta=1000000.0, use_sliding_window=False)
    if family == "gemma3":
        # 6 layers so that the pattern llama.cpp hard-codes (every 6th layer global) has one global
        # layer (layer 5, RoPE base 1e6) besides 5 sliding-window layers (window 4, RoPE base 1e4);
        # transformers' default layer_types give the same pattern.
        k = dict(base_kwargs(vocab, layers=6), rms_norm_eps=1e-6)
        return "Gemma3ForCausalLM", transformers.Gemma3TextConfig(
            **k, head_dim=H // NH, query_pre_attn_scalar=H // NH, sliding_window=4,
            tie_word_embeddings=True, rope_theta=1000000.0, rope_local_base_freq=10000.0,
            hidden_activation="gelu_pytorch_tanh")
    if family == "olmoe-k":
        # 256 wide (hidden and expert FFN), 64-wide heads, no GQA (as olmoe)
        k = dict(k, hidden_size=256, num_key_value_heads=NH, intermediate_size=256)
        return "OlmoeForCausalLM", transformers.OlmoeConfig(
            **k, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, tie_word_embeddings=False)
    if family in ("olmoe", "olmoe-clip", "olmoe-norm"):
        # no GQA: llama.cpp's OLMoE expects attn_k_norm of size n_embd (real OLMoE has no GQA);
        # olmoe-clip clamps q and k (after their norms) and v to [-1, 1], which cuts a good part
        # of these random models' values (their q/k have unit RMS); olmoe-norm renormalises the
        # top-k routing weights (norm_topk_prob), with the same weights as olmoe
        k = dict(k, num_key_value_heads=NH, intermediate_size=FF_MOE)
        clip = dict(clip_qkv=1.0) if family == "olmoe-clip" else {}
        return "OlmoeForCausalLM", transformers.OlmoeConfig(
            **k, num_experts=4, num_experts_per_tok=2, norm_topk_prob=family == "olmoe-norm",
            tie_word_embeddings=False, **clip)
    if family == "granitemoe":
        k = dict(k, intermediate_size=FF_MOE)
        return "GraniteMoeForCausalLM", transformers.GraniteMoeConfig(
            **k, num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=12.0,
            logits_scaling=4.0, residual_multiplier=0.22, attention_multiplier=0.0625,
            tie_word_embeddings=True)
    if family in ("qwen2moe", "qwen2moe-norm"):
        # every layer sparse, a shared expert with its sigmoid gate, no top-k renormalisation
        # (llama.cpp's qwen2moe graph never renormalises), q/k/v biases; qwen2moe-norm
        # renormalises the top-k routing weights (norm_topk_prob), with the same weights
        return "Qwen2MoeForCausalLM", transformers.Qwen2MoeConfig(
            **k, moe_intermediate_size=FF_MOE, shared_expert_intermediate_size=96, num_experts=4,
            num_experts_per_tok=2, norm_topk_prob=family == "qwen2moe-norm", decoder_sparse_step=1, mlp_only_layers=[],
            use_sliding_window=False, tie_word_embeddings=False, rope_theta=1000000.0)
    if family == "mixtral":
        # 8 experts, top-2, renormalised top-k weights; llama.cpp reads it as `llama` with ffn_*_exps
        k = dict(k, intermediate_size=FF_MOE)
        return "MixtralForCausalLM", transformers.MixtralConfig(
            **k, num_local_experts=8, num_experts_per_tok=2, sliding_window=None,
            tie_word_embeddings=False, rope_theta=1000000.0)
    if family == "bitnet":
        # hidden_act silu: llama.cpp's BITNET graph hard-codes SiLU (transformers' default relu2 is
        # not implemented there); tied, as llama.cpp's graph always uses token_embd as the head
        return "BitNetForCausalLM", transformers.BitNetConfig(
            **dict(k, **BITNET_DIMS), hidden_act="silu", tie_word_embeddings=True,
            rope_theta=500000.0)
    if family in ("bitnet-relu2", "bitnet-w158a8", "bitnet-packed"):
        # microsoft/bitnet-b1.58-2B-4T's graph: transformers' defaults (relu2, untied head)
        return "BitNetForCausalLM", transformers.BitNetConfig(
            **dict(k, **BITNET_DIMS), rope_theta=500000.0)
    raise ValueError(family)


def randomize(model, family: str, g: torch.Generator):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                base = 0.0 if family == "gemma3" else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        if family.startswith("bitnet"):
            # every value BF16-exact (the masters are BF16)
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        if family in ("bitnet", "bitnet-relu2"):
            # +-s per tensor (no zeros): the converter's ternarisation round(w / mean|w|) * mean|w|
            # leaves such weights unchanged
            for name, p in model.named_parameters():
                if p.ndim == 2 and any(s in name for s in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                            "gate_proj", "up_proj", "down_proj")):
                    s = float(p.abs().mean().to(torch.bfloat16).float())
                    p.copy_(torch.where(p >= 0, s, -s))


def write_packed(model, d: str):
    """Rewrites the checkpoint in `d` as BitNet's offline release does: every projection
    ternarised as transformers' WeightQuant (s = 1 / mean|W|, t = clamp(round(W·s), -1, 1)),
    packed by transformers' own pack_weights, with s as a BF16 `weight_scale`; the rest BF16."""
    from safetensors.torch import save_file
    from transformers.integrations.bitnet import pack_weights
    sd = {}
    for name, p in model.state_dict().items():
        if p.ndim == 2 and any(f".{x}." in name for x in PROJECTIONS):
            w = p.float()
            s = 1.0 / w.abs().mean().clamp(min=1e-5)
            t = (w * s).round().clamp(-1, 1)
            sd[name] = pack_weights(t.clone()).contiguous()
            sd[name.replace(".weight", ".weight_scale")] = s.reshape(1).to(torch.bfloat16)
        else:
            sd[name] = p.to(torch.bfloat16).contiguous()
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(d, f))
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = W158A8_PACKED
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def sequences(sp) -> list[list[int]]:
    ramp = [1] + [(i * 37 + 11) % (VOCAB - 3) + 3 for i in range(15)]  # BOS + 15 spread ids
    sentence = [1] + sp.encode(SENTENCE)  # BOS + tokenized text
    short = [1, 5, 300, 7]
    return [ramp, sentence, short]


def quiet_llama():
    import llama_cpp as L

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def _noop(level, text, user):  # noqa: ARG001
        pass
    quiet_llama.cb = _noop
    L.llama_log_set(_noop, None)
    L.llama_backend_init()


def llama_run(gguf: str, seqs: list[list[int]], n_gen: int):
    """All-position logits of each sequence (fresh KV per sequence) and greedy of the first."""
    import llama_cpp as L
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = False
    model = L.llama_model_load_from_file(gguf.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp cannot load {gguf}")
    cp = L.llama_context_default_params()
    cp.n_ctx = 128
    cp.n_batch = 128
    cp.n_ubatch = 128
    cp.n_threads = 1
    cp.n_threads_batch = 1
    cp.type_k = 0
    cp.type_v = 0
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    b = L.llama_batch_init(128, 0, 1)
    rows, greedy = [], []
    for si, ids in enumerate(seqs):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        b.n_tokens = len(ids)
        for i, t in enumerate(ids):
            b.token[i] = t; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1
        if L.llama_decode(ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        lg = np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(nv,)).copy()
                       for i in range(len(ids))])
        rows.append(lg)
        if si == 0:
            nxt, pos = int(np.argmax(lg[-1])), len(ids)
            for _ in range(n_gen):
                greedy.append(nxt)
                b.n_tokens = 1
                b.token[0] = nxt; b.pos[0] = pos; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1
                if L.llama_decode(ctx, b) != 0:
                    raise RuntimeError("llama_decode failed")
                pos += 1
                nxt = int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(nv,))))
    L.llama_batch_free(b)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return np.concatenate(rows).astype(np.float32), greedy


def agreement(got: np.ndarray, ref: np.ndarray) -> dict:
    d = np.abs(got - ref)
    return dict(max_abs=float(d.max()), mean_abs=float(d.mean()),
                max_rel=float(d.max() / np.abs(ref).max()),
                argmax_equal=int((got.argmax(1) == ref.argmax(1)).sum()), positions=int(len(ref)))


def convert(llama_dir: str, model_dir: str, outtype: str, out: str):
    env = dict(os.environ, PYTHONHASHSEED="0")
    wrapper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "convert_tiny.py")
    r = subprocess.run([sys.executable, wrapper, llama_dir, model_dir, "--outfile", out, "--outtype", outtype],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py {outtype} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")


def quantize(src: str, out: str, ftype: str):
    """llama.cpp's own quantizer over a GGUF (`llama_model_quantize`, one thread)."""
    import llama_cpp as L
    qp = L.llama_model_quantize_default_params()
    qp.ftype = getattr(L, ftype)
    qp.nthread = 1
    if L.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(qp)) != 0:
        raise RuntimeError(f"llama_model_quantize {ftype} failed")


def main():
    llama_dir, out = sys.argv[1], sys.argv[2]
    fams = sys.argv[3:] or FAMILIES
    os.makedirs(out, exist_ok=True)
    work = os.path.join(out, ".work")
    spm_model = train_tokenizer(work)
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=spm_model)
    vocab = sp.get_piece_size()
    seqs = sequences(sp)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # llama-cpp-python only when a family has GGUFs (transformers-only runs need none)
    L = None
    if any(gguf_types(f) for f in fams):
        quiet_llama()
        import llama_cpp as L
    summary = []
    for fam in fams:
        d = os.path.join(out, fam)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        torch.manual_seed(SEED)
        g = torch.Generator().manual_seed(SEED)
        arch, cfg = make_config(fam, vocab)
        cfg.architectures = [arch]
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation="eager")
        randomize(model, fam, g)
        model.eval()
        if fam.startswith("bitnet"):
            # BF16 on disk (exact: randomize made every value BF16); the oracle runs in fp32
            # and the oracle is the saved file read back in fp32 (casting the module back would
            # leave its RoPE inv_freq buffer rounded to BF16)
            model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
            if fam == "bitnet-packed":
                write_packed(model, d)
            if fam == "bitnet-w158a8":
                # the masters with the quantization config: transformers then swaps every
                # projection for AutoBitLinear when it loads them
                with open(os.path.join(d, "config.json")) as f:
                    c = json.load(f)
                c["quantization_config"] = W158A8
                with open(os.path.join(d, "config.json"), "w") as f:
                    json.dump(c, f, indent=2, sort_keys=True)
                    f.write("\n")
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                         attn_implementation="eager")
            if fam == "bitnet-w158a8":
                q = model.model.layers[0].self_attn.q_proj
                assert type(q).__name__ == "AutoBitLinear" and q.online_quant, type(q)
            if fam == "bitnet-packed":
                q = model.model.layers[0].self_attn.q_proj
                assert type(q).__name__ == "BitLinear", type(q)
            model.eval()
        else:
            model.save_pretrained(d, safe_serialization=True)
        # legacy=True: legacy=False needs sentencepiece_model_pb2, which fails with protobuf < 5
        tok = transformers.LlamaTokenizer(vocab_file=spm_model, legacy=True, add_bos_token=True)
        tok.save_pretrained(d)
        with torch.no_grad():
            hf = np.concatenate([model(torch.tensor([s], dtype=torch.long)).logits[0].float().numpy()
                                 for s in seqs]).astype(np.float32)
            gen = model.generate(torch.tensor([seqs[0]], dtype=torch.long), max_new_tokens=NGEN,
                                 min_new_tokens=NGEN, do_sample=False, pad_token_id=0)
        hf_greedy = gen[0, len(seqs[0]):].tolist()
        hf.astype("<f4").tofile(os.path.join(d, "logits.hf.f32"))
        info = dict(
            family=fam, architecture=arch, model_type=cfg.model_type, n_vocab=vocab,
            n_params=int(sum(p.numel() for p in model.parameters())),
            sequences=seqs, sequence_lengths=[len(s) for s in seqs],
            sentence_text=SENTENCE, sentence_note="sequences[1] = [BOS] + SentencePiece encoding of sentence_text",
            logits_layout="little-endian f32, rows of all sequences concatenated: [sum(sequence_lengths), n_vocab]",
            hf=dict(file="logits.hf.f32", greedy_after_seq0=hf_greedy,
                    attn_implementation="eager", dtype="float32"),
            versions=dict(transformers=transformers.__version__, torch=torch.__version__,
                          llama_cpp_python=L.__version__ if L else None),
            llama_cpp_settings=dict(type_k="f32", type_v="f32", flash_attn="disabled", n_threads=1,
                                    use_extra_bufts=False, n_ctx=128, kv_cleared_between_sequences=True),
            gguf={},
        )
        types = gguf_types(fam)
        for ot in types:
            gg = os.path.join(d, f"model.{ot}.gguf")
            if ot in QUANTIZED:
                quantize(os.path.join(d, "model.f32.gguf"), gg, QUANTIZED[ot])
            else:
                convert(llama_dir, d, ot, gg)
            lg, greedy = llama_run(gg, seqs, NGEN)
            fn = f"logits.llama-{ot}.f32"
            lg.tofile(os.path.join(d, fn))
            if lg.shape != hf.shape:
                raise RuntimeError(f"{fam} {ot}: llama.cpp logits {lg.shape} vs transformers {hf.shape}")
            info["gguf"][ot] = dict(file=os.path.basename(gg), bytes=os.path.getsize(gg), logits_file=fn,
                                   greedy_after_seq0=greedy, vs_hf=agreement(lg, hf))
        for ot in types[1:]:
            info["gguf"][ot]["vs_llama_f32"] = agreement(
                np.fromfile(os.path.join(d, f"logits.llama-{ot}.f32"), dtype="<f4").reshape(hf.shape),
                np.fromfile(os.path.join(d, "logits.llama-f32.f32"), dtype="<f4").reshape(hf.shape))
        with open(os.path.join(d, "oracle.json"), "w") as f:
            json.dump(info, f, indent=1)
        if not types:
            print(f"{fam:10s} {arch:22s} params={info['n_params']:7d}  transformers only; greedy "
                  f"hf={hf_greedy}", flush=True)
            summary.append(dict(family=fam))
            for fn in sorted(os.listdir(d)):
                print(f"  wrote {os.path.join(d, fn)} ({os.path.getsize(os.path.join(d, fn))} bytes)")
            continue
        a32, a8 = info["gguf"]["f32"]["vs_hf"], info["gguf"][types[1]]["vs_hf"]
        line = (f"{fam:10s} {arch:22s} params={info['n_params']:7d}  llama.cpp F32 vs transformers "
                f"max|d|={a32['max_abs']:.3g} (rel {a32['max_rel']:.3g}, argmax {a32['argmax_equal']}/{a32['positions']})"
                f"  {types[1].upper()} max|d|={a8['max_abs']:.3g} (argmax {a8['argmax_equal']}/{a8['positions']})"
                f"  greedy hf={hf_greedy} f32={info['gguf']['f32']['greedy_after_seq0']}")
        print(line, flush=True)
        # The two references must agree before they become fixtures: llama.cpp's F32 GGUF and
        # transformers on the same weights pick the same argmax at every position and the same
        # greedy continuation, within 1e-4 relative (1e-3 for GELU families: ggml's f16 GELU
        # table); otherwise the conversion or a reference is wrong and nothing is written on.
        rel_tol = 1e-3 if fam == "gemma3" else 1e-4
        if (a32["argmax_equal"] != a32["positions"] or a32["max_rel"] > rel_tol
                or hf_greedy != info["gguf"]["f32"]["greedy_after_seq0"]):
            sys.exit(f"{fam}: llama.cpp F32 and transformers disagree ({a32}, greedy hf={hf_greedy} "
                     f"f32={info['gguf']['f32']['greedy_after_seq0']}): not a fixture")
        summary.append(dict(family=fam, f32_vs_hf=a32, quantized_vs_hf=a8))
        if fam in PRUNE:
            for fn in PRUNE[fam]:
                os.remove(os.path.join(d, fn))
            info["pruned"] = list(PRUNE[fam])
            with open(os.path.join(d, "oracle.json"), "w") as f:
                json.dump(info, f, indent=1)
        for fn in sorted(os.listdir(d)):
            print(f"  wrote {os.path.join(d, fn)} ({os.path.getsize(os.path.join(d, fn))} bytes)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
