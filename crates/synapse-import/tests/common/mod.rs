//! Synthetic tiny Llama models, written deterministically: a GGUF file (ggml names, tied
//! head) and a sharded safetensors checkpoint (HF names, `config.json`, index). Shared with
//! `synapse-cli`'s tests through `#[path]`.
#![allow(dead_code)]

use std::path::Path;
use synapse_formats::GgmlType;
use synapse_formats::gguf::{GgufArray, GgufValue, GgufWriter};

/// Sizes of a synthetic model.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub vocab: u64,
    pub hidden: u64,
    pub ffn: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
}

pub const TINY: Dims = Dims {
    vocab: 64,
    hidden: 32,
    ffn: 64,
    layers: 2,
    heads: 2,
    kv_heads: 1,
};

/// Deterministic pseudo-random f32 values in [-0.5, 0.5).
pub fn values(n: u64, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect()
}

/// Q8_0 blocks (f16 scale + 32 int8), ggml's layout.
fn q8_0_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in v.chunks(32) {
        let amax = block.iter().fold(0f32, |a, x| a.max(x.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|x| (x * id).round() as i8 as u8));
    }
    out
}

/// (ggml name, HF name, row-major shape, is a matrix) for every tensor of the model.
pub fn inventory(d: Dims) -> Vec<(String, String, Vec<u64>, bool)> {
    let hd = d.hidden / d.heads;
    let kv = d.kv_heads * hd;
    let mut t = vec![(
        "token_embd.weight".to_string(),
        "model.embed_tokens.weight".to_string(),
        vec![d.vocab, d.hidden],
        true,
    )];
    for l in 0..d.layers {
        let g = |s: &str| format!("blk.{l}.{s}");
        let h = |s: &str| format!("model.layers.{l}.{s}");
        t.push((
            g("attn_norm.weight"),
            h("input_layernorm.weight"),
            vec![d.hidden],
            false,
        ));
        t.push((
            g("attn_q.weight"),
            h("self_attn.q_proj.weight"),
            vec![d.hidden, d.hidden],
            true,
        ));
        t.push((
            g("attn_k.weight"),
            h("self_attn.k_proj.weight"),
            vec![kv, d.hidden],
            true,
        ));
        t.push((
            g("attn_v.weight"),
            h("self_attn.v_proj.weight"),
            vec![kv, d.hidden],
            true,
        ));
        t.push((
            g("attn_output.weight"),
            h("self_attn.o_proj.weight"),
            vec![d.hidden, d.hidden],
            true,
        ));
        t.push((
            g("ffn_norm.weight"),
            h("post_attention_layernorm.weight"),
            vec![d.hidden],
            false,
        ));
        t.push((
            g("ffn_gate.weight"),
            h("mlp.gate_proj.weight"),
            vec![d.ffn, d.hidden],
            true,
        ));
        t.push((
            g("ffn_up.weight"),
            h("mlp.up_proj.weight"),
            vec![d.ffn, d.hidden],
            true,
        ));
        t.push((
            g("ffn_down.weight"),
            h("mlp.down_proj.weight"),
            vec![d.hidden, d.ffn],
            true,
        ));
    }
    t.push((
        "output_norm.weight".into(),
        "model.norm.weight".into(),
        vec![d.hidden],
        false,
    ));
    t
}

/// A tiny Llama GGUF: F16 embedding, Q8_0 matrices, F32 norms, tied head, a SPM vocabulary.
/// `extra` adds tensors no operation uses (to test refusal).
pub fn write_gguf(path: &Path, d: Dims, extra: &[&str]) {
    let mut w = GgufWriter::new();
    let s = |x: &str| GgufValue::String(x.into());
    w.add_metadata("general.architecture", s("llama")).unwrap();
    w.add_metadata("general.name", s("synthetic tiny llama"))
        .unwrap();
    w.add_metadata("general.license", s("mit")).unwrap();
    w.add_metadata("llama.block_count", GgufValue::U32(d.layers as u32))
        .unwrap();
    w.add_metadata("llama.context_length", GgufValue::U32(128))
        .unwrap();
    w.add_metadata("llama.embedding_length", GgufValue::U32(d.hidden as u32))
        .unwrap();
    w.add_metadata("llama.feed_forward_length", GgufValue::U32(d.ffn as u32))
        .unwrap();
    w.add_metadata("llama.attention.head_count", GgufValue::U32(d.heads as u32))
        .unwrap();
    w.add_metadata(
        "llama.attention.head_count_kv",
        GgufValue::U32(d.kv_heads as u32),
    )
    .unwrap();
    w.add_metadata(
        "llama.attention.layer_norm_rms_epsilon",
        GgufValue::F32(1e-5),
    )
    .unwrap();
    w.add_metadata("llama.rope.freq_base", GgufValue::F32(10000.0))
        .unwrap();
    w.add_metadata("tokenizer.ggml.model", s("llama")).unwrap();
    let tokens: Vec<String> = (0..d.vocab)
        .map(|i| match i {
            0 => "<unk>".into(),
            1 => "<s>".into(),
            2 => "</s>".into(),
            i => format!("▁t{i}"),
        })
        .collect();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        GgufValue::Array(GgufArray::String(tokens.into())),
    )
    .unwrap();
    w.add_metadata(
        "tokenizer.ggml.scores",
        GgufValue::Array(GgufArray::F32((0..d.vocab).map(|i| -(i as f32)).collect())),
    )
    .unwrap();
    w.add_metadata(
        "tokenizer.ggml.token_type",
        GgufValue::Array(GgufArray::I32(
            (0..d.vocab).map(|i| if i < 3 { 3 } else { 1 }).collect(),
        )),
    )
    .unwrap();
    w.add_metadata("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
        .unwrap();
    w.add_metadata("tokenizer.ggml.eos_token_id", GgufValue::U32(2))
        .unwrap();
    w.add_metadata(
        "tokenizer.chat_template",
        s("{% for m in messages %}{{ m.content }}{% endfor %}"),
    )
    .unwrap();
    for (i, (name, _, shape, matrix)) in inventory(d).into_iter().enumerate() {
        let n: u64 = shape.iter().product();
        let v = values(n, i as u64 + 1);
        let dims: Vec<u64> = shape.iter().rev().copied().collect();
        let (ty, bytes) = if name == "token_embd.weight" {
            (GgmlType::F16, f16_bytes(&v))
        } else if matrix {
            (GgmlType::Q8_0, q8_0_bytes(&v))
        } else {
            (
                GgmlType::F32,
                f32_bytes(&v.iter().map(|x| 1.0 + x).collect::<Vec<_>>()),
            )
        };
        w.add_tensor(name, &dims, ty, bytes).unwrap();
    }
    for e in extra {
        w.add_tensor(*e, &[4], GgmlType::F32, f32_bytes(&[0.0; 4]))
            .unwrap();
    }
    w.write_file(path).unwrap();
}

/// Writes one safetensors file holding `tensors` (name, shape, bf16 bytes) in order.
fn write_safetensors(path: &Path, tensors: &[(String, Vec<u64>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut off = 0u64;
    for (name, shape, bytes) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [off, off + bytes.len() as u64]}),
        );
        off += bytes.len() as u64;
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for (_, _, b) in tensors {
        out.extend_from_slice(b);
    }
    std::fs::write(path, out).unwrap();
}

/// A tiny Llama checkpoint in BF16, split over two shards with `model.safetensors.index.json`,
/// tied embeddings, plus `config.json`, a BPE `tokenizer.json` and `tokenizer_config.json`.
pub fn write_sharded_safetensors(dir: &Path, d: Dims) {
    std::fs::create_dir_all(dir).unwrap();
    let all: Vec<(String, Vec<u64>, Vec<u8>)> = inventory(d)
        .into_iter()
        .enumerate()
        .map(|(i, (_, hf, shape, matrix))| {
            let n: u64 = shape.iter().product();
            let mut v = values(n, i as u64 + 101);
            if !matrix {
                v.iter_mut().for_each(|x| *x += 1.0);
            }
            (hf, shape, bf16_bytes(&v))
        })
        .collect();
    let half = all.len() / 2;
    let shards = [
        ("model-00001-of-00002.safetensors", &all[..half]),
        ("model-00002-of-00002.safetensors", &all[half..]),
    ];
    let mut weight_map = serde_json::Map::new();
    for (file, ts) in shards {
        write_safetensors(&dir.join(file), ts);
        for (name, _, _) in ts {
            weight_map.insert(name.clone(), file.into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": all.iter().map(|t| t.2.len()).sum::<usize>()}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d.hidden,
        "intermediate_size": d.ffn,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "vocab_size": d.vocab,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": true,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16"
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(&config).unwrap(),
    )
    .unwrap();
    let mut vocab = serde_json::Map::new();
    for i in 0..d.vocab {
        let tok = match i {
            0 => "<unk>".to_string(),
            1 => "<s>".to_string(),
            2 => "</s>".to_string(),
            i => char::from_u32(0x61 + (i as u32 % 26))
                .map(|c| format!("{c}{}", i / 26))
                .unwrap_or_default(),
        };
        vocab.insert(tok, i.into());
    }
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "added_tokens": [
            {"id": 1, "content": "<s>", "special": true},
            {"id": 2, "content": "</s>", "special": true}
        ],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    });
    std::fs::write(
        dir.join("tokenizer.json"),
        serde_json::to_vec_pretty(&tokenizer).unwrap(),
    )
    .unwrap();
    let tok_cfg = serde_json::json!({"chat_template": "{% for m in messages %}<s>{{ m.content }}</s>{% endfor %}", "bos_token": "<s>"});
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_vec_pretty(&tok_cfg).unwrap(),
    )
    .unwrap();
}
