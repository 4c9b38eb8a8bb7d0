//! A mixture-of-experts GGUF of realistic shape with random weights (no real MoE weights are
//! on the package registries): the model `cargo xtask synthetic-moe` writes for benchmarks,
//! and smaller ones the residency tests write into a temp dir.
//!
//! The file is a Mixtral-layout `llama` GGUF — llama.cpp loads it as Mixtral, Synapse through
//! its `llama` adapter — with every layer's experts stacked in `ffn_{gate,up,down}_exps`, an
//! F32 router `ffn_gate_inp`, and the tiny fixtures' SentencePiece vocabulary (512 pieces,
//! copied from `fixtures/tiny/llama/model.f32.gguf`), so both engines tokenize and run it.
//! Weights are random but well-formed blocks (Q8_0: an f16 scale and 32 uniform int8 quants;
//! Q4_0: an f16 scale and 32 uniform nibbles), scaled so each projection keeps activations of
//! order one; norms are 1, router logits of standard deviation ≈ 2, so tokens spread over
//! the experts. Seeded: the same parameters give the same bytes.

use std::path::{Path, PathBuf};

use synapse_formats::GgmlType;
use synapse_formats::gguf::{GgufFile, GgufValue, GgufWriter};

/// The shape of a synthetic MoE.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeShape {
    /// Experts per layer.
    pub experts: u32,
    /// Experts each token runs.
    pub top_k: u32,
    /// Model width (a multiple of 64: heads of 64).
    pub hidden: u32,
    /// Each expert's FFN width (a multiple of 32).
    pub expert_ff: u32,
    /// Transformer blocks.
    pub layers: u32,
    /// `Q8_0` or `Q4_0` (projections, experts, embedding and head).
    pub encoding: GgmlType,
    /// RNG seed.
    pub seed: u64,
}

impl Default for MoeShape {
    /// The benchmark model: 32 experts of 1024×1024, top-4, hidden 1024, 12 layers, Q8_0.
    fn default() -> Self {
        MoeShape {
            experts: 32,
            top_k: 4,
            hidden: 1024,
            expert_ff: 1024,
            layers: 12,
            encoding: GgmlType::Q8_0,
            seed: 1,
        }
    }
}

impl MoeShape {
    /// The tests' model: 4 layers × 16 experts of 512×512 (Q8_0, ≈ 0.84 MB each, 53 MB in
    /// all), top-2.
    pub fn small() -> Self {
        MoeShape {
            experts: 16,
            top_k: 2,
            hidden: 512,
            expert_ff: 512,
            layers: 4,
            ..MoeShape::default()
        }
    }

    /// A file name that names the shape.
    pub fn file_name(&self) -> String {
        format!(
            "moe-E{}x{}-h{}-L{}-k{}-{}-s{}.gguf",
            self.experts,
            self.expert_ff,
            self.hidden,
            self.layers,
            self.top_k,
            self.encoding.name().to_ascii_lowercase(),
            self.seed
        )
    }
}

/// SplitMix64.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random blocks of `ty` for `rows × cols` values whose standard deviation is about `std`.
fn random_blocks(rng: &mut Rng, ty: GgmlType, rows: u64, cols: u64, std: f32) -> Vec<u8> {
    let n_blocks = (rows * cols / 32) as usize;
    let mut out = Vec::with_capacity(n_blocks * ty.type_size());
    for _ in 0..n_blocks {
        match ty {
            GgmlType::Q8_0 => {
                // q uniform in [-127, 127]: std ≈ 73·d.
                let d = half::f16::from_f32(std / 73.3 * (1.0 + 0.25 * rng.unit()));
                out.extend_from_slice(&d.to_le_bytes());
                for _ in 0..4 {
                    let r = rng.next();
                    for b in 0..8 {
                        let q = ((r >> (8 * b)) as u8 % 255) as i16 - 127;
                        out.push(q as i8 as u8);
                    }
                }
            }
            _ => {
                // Q4_0: (nibble − 8)·d, nibbles uniform: std ≈ 4.6·d.
                let d = half::f16::from_f32(std / 4.61 * (1.0 + 0.25 * rng.unit()));
                out.extend_from_slice(&d.to_le_bytes());
                let (a, b) = (rng.next(), rng.next());
                out.extend_from_slice(&a.to_le_bytes());
                out.extend_from_slice(&b.to_le_bytes());
            }
        }
    }
    out
}

pub(crate) fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The repository's tiny-fixture GGUF whose vocabulary the synthetic models carry.
pub fn vocabulary_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama/model.f32.gguf")
}

/// Writes a synthetic MoE of `shape` to `out` (through a temp file and a rename).
pub fn write(shape: &MoeShape, out: &Path) -> Result<(), String> {
    let args = shape;
    let ty = args.encoding;
    if !matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0) {
        return Err(format!("encoding {ty}: Q8_0 or Q4_0"));
    }
    if args.top_k == 0 || args.top_k > args.experts {
        return Err(format!("top-k {} of {} experts", args.top_k, args.experts));
    }
    if !args.hidden.is_multiple_of(64) || !args.expert_ff.is_multiple_of(32) || args.hidden == 0 {
        return Err("hidden must be a multiple of 64 and expert_ff of 32".into());
    }
    let e_ = |e: synapse_formats::FormatError| e.to_string();
    let vocab_src = vocabulary_source();
    let tiny = GgufFile::open(&vocab_src)
        .map_err(|e| format!("reading the vocabulary from {}: {e}", vocab_src.display()))?;
    let mut w = GgufWriter::new();
    let (h, e, ff, nl) = (
        args.hidden as u64,
        args.experts as u64,
        args.expert_ff as u64,
        args.layers,
    );
    let head_dim = 64u64;
    let n_head = h / head_dim;
    let n_kv = (n_head / 4).max(1);
    let s = |x: &str| GgufValue::String(x.into());
    let u = GgufValue::U32;
    w.add_metadata("general.architecture", s("llama"))
        .map_err(e_)?;
    w.add_metadata(
        "general.name",
        s(&format!(
            "synapse synthetic MoE {}x{} top-{} ({})",
            args.experts, args.expert_ff, args.top_k, ty
        )),
    )
    .map_err(e_)?;
    w.add_metadata("llama.block_count", u(nl)).map_err(e_)?;
    w.add_metadata("llama.context_length", u(4096))
        .map_err(e_)?;
    w.add_metadata("llama.embedding_length", u(args.hidden))
        .map_err(e_)?;
    w.add_metadata("llama.feed_forward_length", u(args.expert_ff))
        .map_err(e_)?;
    w.add_metadata("llama.attention.head_count", u(n_head as u32))
        .map_err(e_)?;
    w.add_metadata("llama.attention.head_count_kv", u(n_kv as u32))
        .map_err(e_)?;
    w.add_metadata(
        "llama.attention.layer_norm_rms_epsilon",
        GgufValue::F32(1e-5),
    )
    .map_err(e_)?;
    w.add_metadata("llama.rope.freq_base", GgufValue::F32(10000.0))
        .map_err(e_)?;
    w.add_metadata("llama.rope.dimension_count", u(head_dim as u32))
        .map_err(e_)?;
    w.add_metadata("llama.expert_count", u(args.experts))
        .map_err(e_)?;
    w.add_metadata("llama.expert_used_count", u(args.top_k))
        .map_err(e_)?;
    w.add_metadata(
        "general.file_type",
        u(if ty == GgmlType::Q8_0 { 7 } else { 2 }),
    )
    .map_err(e_)?;
    let mut vocab = 0u64;
    for (k, v) in tiny.metadata() {
        if k.starts_with("tokenizer.") {
            if k == "tokenizer.ggml.tokens"
                && let GgufValue::Array(a) = v
            {
                vocab = a.len() as u64;
            }
            w.add_metadata(k.clone(), v.clone()).map_err(e_)?;
        }
    }
    if vocab == 0 {
        return Err(format!(
            "{} has no tokenizer.ggml.tokens",
            vocab_src.display()
        ));
    }
    w.add_metadata("llama.vocab_size", u(vocab as u32))
        .map_err(e_)?;

    let mut rng = Rng(args.seed);
    let proj_std = |fan_in: u64| 1.0 / (fan_in as f32).sqrt();
    let ones = |n: u64| f32_bytes((0..n).map(|_| 1.0f32));
    // ggml dims: [ne0 = columns, ne1 = rows, ne2 = experts].
    w.add_tensor(
        "token_embd.weight",
        &[h, vocab],
        ty,
        random_blocks(&mut rng, ty, vocab, h, 1.0),
    )
    .map_err(e_)?;
    for il in 0..nl {
        let n = |t: &str| format!("blk.{il}.{t}.weight");
        w.add_tensor(n("attn_norm"), &[h], GgmlType::F32, ones(h))
            .map_err(e_)?;
        w.add_tensor(n("ffn_norm"), &[h], GgmlType::F32, ones(h))
            .map_err(e_)?;
        let qo = n_head * head_dim;
        let kvo = n_kv * head_dim;
        for (name, rows, cols) in [
            ("attn_q", qo, h),
            ("attn_k", kvo, h),
            ("attn_v", kvo, h),
            ("attn_output", h, qo),
        ] {
            let b = random_blocks(&mut rng, ty, rows, cols, proj_std(cols));
            w.add_tensor(n(name), &[cols, rows], ty, b).map_err(e_)?;
        }
        // Logits of standard deviation ≈ 2 on unit-RMS inputs.
        let router = f32_bytes((0..e * h).map(|_| rng.unit() * 3.5 / (h as f32).sqrt()));
        w.add_tensor(n("ffn_gate_inp"), &[h, e], GgmlType::F32, router)
            .map_err(e_)?;
        for (name, rows, cols) in [
            ("ffn_gate_exps", ff, h),
            ("ffn_up_exps", ff, h),
            ("ffn_down_exps", h, ff),
        ] {
            let b = random_blocks(&mut rng, ty, e * rows, cols, proj_std(cols));
            w.add_tensor(n(name), &[cols, rows, e], ty, b).map_err(e_)?;
        }
    }
    w.add_tensor("output_norm.weight", &[h], GgmlType::F32, ones(h))
        .map_err(e_)?;
    w.add_tensor(
        "output.weight",
        &[h, vocab],
        ty,
        random_blocks(&mut rng, ty, vocab, h, proj_std(h)),
    )
    .map_err(e_)?;
    write_atomically(&w, out)
}

/// Writes `w` to `out` through a temp file beside it and a rename (the directory created).
pub(crate) fn write_atomically(w: &GgufWriter, out: &Path) -> Result<(), String> {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let tmp = out.with_extension("gguf.partial");
    w.write_file(&tmp).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, out).map_err(|e| e.to_string())
}
