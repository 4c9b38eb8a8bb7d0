//! A BitNet b1.58 GGUF of realistic shape with random ternary weights (no BitNet weights are
//! on the package registries): the model `cargo xtask synthetic-bitnet` writes for end-to-end
//! benchmarks, and smaller ones tests write into a temp dir.
//!
//! The file is llama.cpp's `bitnet` layout — what its converter writes for the 1bitLLM models,
//! which llama.cpp's `bitnet` graph and Synapse's `bitnet` adapter both run: per layer
//! `attn_{q,k,v,output}` and `ffn_{gate,up,down}` in TQ2_0 (or TQ1_0), `attn_sub_norm` and
//! `ffn_sub_norm`, RMS norms of 1, the LM head tied to `token_embd` (F16 as the converter
//! writes it, or Q8_0). The default shape is microsoft/bitnet-b1.58-2B-4T's (hidden 2560, 30
//! layers, FFN 6912, 20 heads / 5 KV heads, vocabulary 128,256). The vocabulary is the tiny
//! BitNet fixture's SentencePiece one (512 pieces, from `fixtures/tiny/bitnet/model.f32.gguf`)
//! padded with unused pieces `<synthetic_N>` (token type 5, which neither tokenizer ever
//! produces from text) to the shape's size, so both engines tokenize prompts alike and the
//! embedding and head have the real shape. Ternary codes are uniform over {−1, 0, 1} per
//! weight, each 256-weight block scaled so a projection keeps activations of order one.
//! Seeded: the same shape gives the same bytes.

use std::path::{Path, PathBuf};

use synapse_formats::GgmlType;
use synapse_formats::gguf::{GgufArray, GgufFile, GgufStrings, GgufValue, GgufWriter};

use crate::synthetic_moe::{Rng, f32_bytes, write_atomically};

/// The shape of a synthetic BitNet model.
#[derive(Debug, Clone, PartialEq)]
pub struct BitnetShape {
    /// Model width (a multiple of 256 and of the head count).
    pub hidden: u32,
    /// Transformer blocks.
    pub layers: u32,
    /// FFN width (a multiple of 256).
    pub ff: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads (dividing `heads`).
    pub kv_heads: u32,
    /// Vocabulary size (at least the 512 pieces of the source vocabulary).
    pub vocab: u32,
    /// The projections' encoding: TQ2_0 or TQ1_0.
    pub ternary: GgmlType,
    /// The tied embedding / LM head's encoding: F16 or Q8_0.
    pub embedding: GgmlType,
    /// RNG seed.
    pub seed: u64,
}

impl Default for BitnetShape {
    /// microsoft/bitnet-b1.58-2B-4T's shape, TQ2_0 projections, F16 embedding.
    fn default() -> Self {
        BitnetShape {
            hidden: 2560,
            layers: 30,
            ff: 6912,
            heads: 20,
            kv_heads: 5,
            vocab: 128_256,
            ternary: GgmlType::TQ2_0,
            embedding: GgmlType::F16,
            seed: 1,
        }
    }
}

impl BitnetShape {
    /// The tests' model: 2 layers of hidden 512, FFN 1024, 8 / 2 heads, 2048 tokens (≈ 2.8 MB).
    pub fn small() -> Self {
        BitnetShape {
            hidden: 512,
            layers: 2,
            ff: 1024,
            heads: 8,
            kv_heads: 2,
            vocab: 2048,
            ..BitnetShape::default()
        }
    }

    /// A file name that names the shape.
    pub fn file_name(&self) -> String {
        format!(
            "bitnet-h{}-L{}-ff{}-H{}-kv{}-V{}-{}-{}-s{}.gguf",
            self.hidden,
            self.layers,
            self.ff,
            self.heads,
            self.kv_heads,
            self.vocab,
            self.ternary.name().to_ascii_lowercase(),
            self.embedding.name().to_ascii_lowercase(),
            self.seed
        )
    }

    /// Weight bytes of the projections (all layers) and of the tied embedding / head.
    pub fn weight_bytes(&self) -> (u64, u64) {
        let (h, ff) = (self.hidden as u64, self.ff as u64);
        let kv = h / self.heads as u64 * self.kv_heads as u64;
        let per_layer = 2 * h * h + 2 * h * kv + 3 * h * ff;
        let bytes = |ty: GgmlType, n: u64| n / ty.block_size() as u64 * ty.type_size() as u64;
        (
            bytes(self.ternary, per_layer) * self.layers as u64,
            bytes(self.embedding, h * self.vocab as u64),
        )
    }

    fn check(&self) -> Result<(), String> {
        if !matches!(self.ternary, GgmlType::TQ2_0 | GgmlType::TQ1_0) {
            return Err(format!("ternary encoding {}: TQ2_0 or TQ1_0", self.ternary));
        }
        if !matches!(self.embedding, GgmlType::F16 | GgmlType::Q8_0) {
            return Err(format!(
                "embedding encoding {}: F16 or Q8_0",
                self.embedding
            ));
        }
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "{} heads over {} KV heads",
                self.heads, self.kv_heads
            ));
        }
        if self.hidden == 0
            || !self.hidden.is_multiple_of(256)
            || !self.ff.is_multiple_of(256)
            || self.ff == 0
            || !self.hidden.is_multiple_of(self.heads)
            || !(self.hidden / self.heads).is_multiple_of(2)
        {
            return Err(format!(
                "hidden {} and FFN {} must be multiples of 256, hidden a multiple of the {} heads \
                 with an even head size",
                self.hidden, self.ff, self.heads
            ));
        }
        if self.layers == 0 {
            return Err("at least one layer".into());
        }
        // The head's rows × hidden must be addressable; the writer holds the file in memory.
        if (self.vocab as u64) * (self.hidden as u64) > 1 << 31 {
            return Err(format!(
                "vocabulary {} × hidden {} is too large",
                self.vocab, self.hidden
            ));
        }
        Ok(())
    }
}

/// The repository's tiny BitNet fixture whose vocabulary and tokenizer settings the synthetic
/// models carry.
pub fn vocabulary_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/bitnet/model.f32.gguf")
}

/// Random ternary blocks of `ty` for `rows × cols` weights of standard deviation about `std`:
/// per block 256 trits drawn in element order, then packed as ggml's quantizers pack them, so
/// TQ1_0 and TQ2_0 files of one seed hold the same weights.
fn ternary_blocks(rng: &mut Rng, ty: GgmlType, rows: u64, cols: u64, std: f32) -> Vec<u8> {
    let n_blocks = (rows * cols / 256) as usize;
    let mut out = Vec::with_capacity(n_blocks * ty.type_size());
    // Codes uniform over {0, 1, 2} (weights −1, 0, 1): standard deviation sqrt(2/3)·d.
    let d = half::f16::from_f32(std / 0.8165).to_le_bytes();
    for _ in 0..n_blocks {
        let t: [u32; 256] = std::array::from_fn(|_| (rng.next() % 3) as u32);
        if ty == GgmlType::TQ2_0 {
            // qs[32h + m], bits 2n: element 128h + 32n + m.
            for h in 0..2 {
                for m in 0..32 {
                    let q = (0..4).fold(0u32, |q, n| q | t[128 * h + 32 * n + m] << (2 * n));
                    out.push(q as u8);
                }
            }
        } else {
            // TQ1_0: base-3 digits, the first most significant, each byte scaled to
            // ⌈q·256 / 3ⁿ⌉: qs[m] (m < 32) elements m + 32n (n < 5), qs[32 + m] (m < 16)
            // elements 160 + m + 16n, qh[j] (j < 4) elements 240 + j + 4n (n < 4).
            let pack = |idx: &mut dyn Iterator<Item = usize>, pow: u32| {
                let q = idx.fold(0u32, |q, e| q * 3 + t[e]);
                (q * 256).div_ceil(pow) as u8
            };
            for m in 0..32 {
                out.push(pack(&mut (0..5).map(|n| m + 32 * n), 243));
            }
            for m in 0..16 {
                out.push(pack(&mut (0..5).map(|n| 160 + m + 16 * n), 243));
            }
            for j in 0..4 {
                out.push(pack(&mut (0..4).map(|n| 240 + j + 4 * n), 81));
            }
        }
        out.extend_from_slice(&d);
    }
    out
}

/// Random embedding rows of `ty` (standard deviation about 1).
fn embedding(rng: &mut Rng, ty: GgmlType, rows: u64, cols: u64) -> Vec<u8> {
    if ty == GgmlType::F16 {
        let n = (rows * cols) as usize;
        let mut out = Vec::with_capacity(2 * n);
        for _ in 0..n {
            out.extend_from_slice(&half::f16::from_f32(rng.unit() * 1.732).to_le_bytes());
        }
        return out;
    }
    let n_blocks = (rows * cols / 32) as usize;
    let mut out = Vec::with_capacity(n_blocks * 34);
    for _ in 0..n_blocks {
        out.extend_from_slice(&half::f16::from_f32(1.0 / 73.3).to_le_bytes());
        for _ in 0..4 {
            let r = rng.next();
            for b in 0..8 {
                out.push((((r >> (8 * b)) as u8 % 255) as i16 - 127) as i8 as u8);
            }
        }
    }
    out
}

/// Writes a synthetic BitNet model of `shape` to `out` (through a temp file and a rename).
pub fn write(shape: &BitnetShape, out: &Path) -> Result<(), String> {
    shape.check()?;
    let e_ = |e: synapse_formats::FormatError| e.to_string();
    let src = vocabulary_source();
    let tiny = GgufFile::open(&src)
        .map_err(|e| format!("reading the vocabulary from {}: {e}", src.display()))?;
    let meta = |k: &str| {
        tiny.metadata()
            .iter()
            .find(|(key, _)| key.as_str() == k)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| format!("{} has no {k}", src.display()))
    };
    let tokens = meta("tokenizer.ggml.tokens")?;
    let scores = meta("tokenizer.ggml.scores")?;
    let types = meta("tokenizer.ggml.token_type")?;
    let (Some(tokens), Some(scores), Some(types)) =
        (tokens.as_strings(), scores.as_f32s(), types.as_i32s())
    else {
        return Err(format!("{}: unexpected tokenizer arrays", src.display()));
    };
    let base = tokens.len();
    if (shape.vocab as usize) < base {
        return Err(format!(
            "vocabulary {} below the source's {base} pieces",
            shape.vocab
        ));
    }
    let pad = shape.vocab as usize - base;
    let tokens: GgufStrings = tokens
        .iter()
        .map(str::to_string)
        .chain((0..pad).map(|i| format!("<synthetic_{i}>")))
        .collect();
    let scores: Vec<f32> = scores
        .iter()
        .copied()
        .chain((0..pad).map(|_| 0.0))
        .collect();
    let types: Vec<i32> = types.iter().copied().chain((0..pad).map(|_| 5)).collect();

    let (h, ff, nl) = (shape.hidden as u64, shape.ff as u64, shape.layers);
    let head_dim = h / shape.heads as u64;
    let kv = head_dim * shape.kv_heads as u64;
    let mut w = GgufWriter::new();
    let s = |x: &str| GgufValue::String(x.into());
    let u = GgufValue::U32;
    let (pb, _) = shape.weight_bytes();
    for (k, v) in [
        ("general.architecture", s("bitnet")),
        (
            "general.name",
            s(&format!(
                "synapse synthetic BitNet b1.58 ({} projections)",
                shape.ternary
            )),
        ),
        ("bitnet.block_count", u(nl)),
        ("bitnet.context_length", u(4096)),
        ("bitnet.embedding_length", u(shape.hidden)),
        ("bitnet.feed_forward_length", u(shape.ff)),
        ("bitnet.attention.head_count", u(shape.heads)),
        ("bitnet.attention.head_count_kv", u(shape.kv_heads)),
        ("bitnet.rope.freq_base", GgufValue::F32(500_000.0)),
        (
            "bitnet.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-5),
        ),
        ("bitnet.vocab_size", u(shape.vocab)),
        (
            "general.file_type",
            u(if shape.ternary == GgmlType::TQ2_0 {
                37
            } else {
                36
            }),
        ),
        ("general.quantization_version", u(2)),
        ("synapse.synthetic.projection_bytes", GgufValue::U64(pb)),
    ] {
        w.add_metadata(k, v).map_err(e_)?;
    }
    for (k, v) in tiny.metadata() {
        if !k.starts_with("tokenizer.") {
            continue;
        }
        let v = match k.as_str() {
            "tokenizer.ggml.tokens" => GgufValue::Array(GgufArray::String(tokens.clone())),
            "tokenizer.ggml.scores" => GgufValue::Array(GgufArray::F32(scores.clone())),
            "tokenizer.ggml.token_type" => GgufValue::Array(GgufArray::I32(types.clone())),
            _ => v.clone(),
        };
        w.add_metadata(k.clone(), v).map_err(e_)?;
    }

    // Separate streams, so the projections do not depend on the embedding's encoding.
    let mut rng = Rng(shape.seed);
    let mut trits = Rng(shape.seed ^ 0x5eed_7e57_b17e_d00d);
    let std = |fan_in: u64| 1.0 / (fan_in as f32).sqrt();
    let ones = |n: u64| f32_bytes((0..n).map(|_| 1.0f32));
    let ty = shape.ternary;
    // ggml dims: [ne0 = columns, ne1 = rows].
    w.add_tensor(
        "token_embd.weight",
        &[h, shape.vocab as u64],
        shape.embedding,
        embedding(&mut rng, shape.embedding, shape.vocab as u64, h),
    )
    .map_err(e_)?;
    for il in 0..nl {
        let n = |t: &str| format!("blk.{il}.{t}.weight");
        for (name, len) in [
            ("attn_norm", h),
            ("attn_sub_norm", h),
            ("ffn_norm", h),
            ("ffn_sub_norm", ff),
        ] {
            w.add_tensor(n(name), &[len], GgmlType::F32, ones(len))
                .map_err(e_)?;
        }
        for (name, rows, cols) in [
            ("attn_q", h, h),
            ("attn_k", kv, h),
            ("attn_v", kv, h),
            ("attn_output", h, h),
            ("ffn_gate", ff, h),
            ("ffn_up", ff, h),
            ("ffn_down", h, ff),
        ] {
            let b = ternary_blocks(&mut trits, ty, rows, cols, std(cols));
            w.add_tensor(n(name), &[cols, rows], ty, b).map_err(e_)?;
        }
    }
    w.add_tensor("output_norm.weight", &[h], GgmlType::F32, ones(h))
        .map_err(e_)?;
    write_atomically(&w, out)
}
