//! The model IR: what a model computes, independent of where its bytes come from.
//!
//! A [`ModelIr`] is a list of regions (embedding, one [`LayerRegion`] per block with its
//! attention and FFN parts, final norm, LM head) whose operations carry their attributes
//! (epsilons, RoPE parameters, windows, activation) and point into one table of
//! [`WeightDesc`]s by [`WeightId`]. Tied weights appear once in the table plus a
//! [`TiedAlias`]. The IR derives serde so that the CAS can store it; the fingerprint is the
//! BLAKE3 hash of its canonical JSON form without the fingerprint field.

use serde::{Deserialize, Serialize};
use synapse_formats::GgmlType;

/// Index of a weight in [`ModelIr::weights`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WeightId(pub u32);

/// The model family an adapter recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Llama 2/3, SmolLM2 and relatives.
    Llama,
    /// Qwen2 (q/k/v biases).
    Qwen2,
    /// Gemma 3 text models.
    Gemma3,
    /// OLMoE: routed experts, q/k norms over the whole projection.
    Olmoe,
    /// Granite MoE: routed experts, embedding/residual/attention/logit multipliers.
    Granitemoe,
    /// Qwen2-MoE: routed experts plus a sigmoid-gated shared expert, q/k/v biases.
    Qwen2moe,
    /// BitNet b1.58: the Llama graph with RMSNorms on the attention output and the gated
    /// FFN product (microsoft/bitnet-b1.58-2B-4T: ReLU²; 1bitLLM / llama.cpp: SiLU).
    Bitnet,
}

impl Family {
    /// The family's name as used in file names and reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Gemma3 => "gemma3",
            Family::Olmoe => "olmoe",
            Family::Granitemoe => "granitemoe",
            Family::Bitnet => "bitnet",
            Family::Qwen2moe => "qwen2moe",
        }
    }
}

/// Which kind of file the weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// One GGUF file.
    Gguf,
    /// `config.json` plus one or more safetensors files.
    Safetensors,
}

/// Where one weight lives and how it is encoded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightDesc {
    /// The tensor's name in its source file.
    pub name: String,
    /// Row-major shape, outermost first: a linear weight is `[out_features, in_features]`.
    pub shape: Vec<u64>,
    /// The source encoding.
    #[serde(with = "ggml_type_name")]
    pub encoding: GgmlType,
    /// Index of the source file (0 for GGUF; the shard for safetensors).
    pub file: u32,
    /// Absolute byte offset of the data in that file.
    pub offset: u64,
    /// Length of the data in bytes.
    pub n_bytes: u64,
    /// BLAKE3 of the bytes, hex, when known (the CAS fills it in).
    pub content_hash: Option<String>,
}

impl WeightDesc {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A second name under which a weight is used (for example a tied LM head).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TiedAlias {
    /// The role or name that is not stored separately (e.g. `output.weight`).
    pub alias: String,
    /// The stored weight it refers to.
    pub target: WeightId,
}

/// Architecture hyperparameters shared by all layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HyperParams {
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: u32,
    /// Model (residual stream) width.
    pub hidden: u32,
    /// Number of transformer blocks.
    pub n_layers: u32,
    /// Training context length.
    pub context_length: u32,
}

/// Root-mean-square normalisation: `y = x / sqrt(mean(x²) + eps) * (w + weight_offset)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RmsNorm {
    /// The per-channel weight.
    pub weight: WeightId,
    /// Epsilon added to the mean square.
    pub eps: f32,
    /// Added to the weight before use (Gemma's `1 + w` when reading HF checkpoints; 0 when the
    /// GGUF converter already folded it in).
    pub weight_offset: f32,
}

/// A linear projection `y = W x (+ b)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Linear {
    /// `[out_features, in_features]` weight.
    pub weight: WeightId,
    /// Optional `[out_features]` bias.
    pub bias: Option<WeightId>,
    /// Input width.
    pub in_features: u32,
    /// Output width.
    pub out_features: u32,
    /// A per-tensor scale stored beside a packed weight (BitNet's offline `weight_scale`,
    /// under [`ProjectionQuant::BitnetW158A8Packed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<WeightId>,
}

/// How RoPE pairs dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (ggml "normal"; GGUF Llama after the converter's permute).
    Interleaved,
    /// Halves `(i, i + n/2)` (ggml NeoX; HF `rotate_half`).
    Neox,
}

/// Rotary position embedding attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rope {
    /// Pairing style.
    pub style: RopeStyle,
    /// Number of rotated dimensions per head.
    pub n_rot: u32,
    /// Base θ.
    pub base: f32,
    /// Linear position scale (1 / linear scaling factor).
    pub freq_scale: f32,
    /// Per-pair frequency divisors (Llama 3 scaling), `n_rot / 2` values, when present.
    pub freq_factors: Option<FreqFactors>,
}

/// Where RoPE frequency divisors come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FreqFactors {
    /// A stored F32 tensor of `n_rot / 2` values (GGUF `rope_freqs.weight`).
    Weight(WeightId),
    /// Values computed by the adapter from the config (HF `rope_scaling`).
    Values(Vec<f32>),
}

/// Self-attention with optional per-head q/k norms and post-norm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attention {
    /// Pre-attention norm.
    pub norm: RmsNorm,
    /// Query projection.
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub o: Linear,
    /// RMSNorm on queries: per head when its weight has `head_dim` values (Gemma 3), over the
    /// whole projection when it has `n_heads × head_dim` (OLMoE).
    pub q_norm: Option<RmsNorm>,
    /// RMSNorm on keys: per head (`head_dim` values) or over the whole projection
    /// (`n_kv_heads × head_dim`).
    pub k_norm: Option<RmsNorm>,
    /// Norm applied to the attention output before the residual add.
    pub post_norm: Option<RmsNorm>,
    /// RMSNorm over the heads' concatenated output, before the output projection
    /// (BitNet's `attn_sub_norm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_norm: Option<RmsNorm>,
    /// Query heads.
    pub n_heads: u32,
    /// Key/value heads (GQA when fewer than `n_heads`).
    pub n_kv_heads: u32,
    /// Per-head width of queries and keys.
    pub head_dim: u32,
    /// RoPE applied to q and k.
    pub rope: Rope,
    /// Sliding window: a query at `p` sees keys at `p - window < k <= p`; `None` is global.
    pub window: Option<u32>,
    /// Scale applied to `q·k`.
    pub scale: f32,
    /// OLMoE's `clip_qkv`: queries and keys after their norms, and values, clamped to
    /// `[-c, c]` before RoPE and the cache (transformers' order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_qkv: Option<f32>,
}

/// A checkpoint's declared numerics for its projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProjectionQuant {
    /// BitNet b1.58's W1.58A8 (transformers' `AutoBitLinear`, as trained): each projection's
    /// weights ternarised per tensor by absmean (`s = 1 / max(mean|W|, 1e-5)`,
    /// `W' = clamp(round(W·s), −1, 1) / s`) and its input quantised per token to 8 bits by
    /// absmax (`a = 127 / max(max|x|, 1e-5)`, `x' = clamp(round(x·a), −128, 127) / a`).
    BitnetW158A8,
    /// The same W1.58A8 over weights stored already ternary (transformers' offline
    /// `BitLinear`, microsoft/bitnet-b1.58-2B-4T's release): each projection's weight is
    /// `uint8 [⌈out/4⌉, in]` as transformers' `pack_weights` writes it (output row `i·R + r`,
    /// `R = ⌈out/4⌉`, in bits `2i` of packed row `r`, as the code `t + 1`), with a one-element
    /// `weight_scale` `s`: the weights are `t / s`.
    BitnetW158A8Packed,
    /// The same W1.58A8 over bitnet.cpp's I2_S tensors (GGUF, its fork's type 36, x86
    /// layout): per 128 elements of the row-major `[out, in]` tensor 32 bytes, byte `m`
    /// holding element `32·g + m` in bits `6 − 2g` as the code `t + 1`; after the `out·in/4`
    /// code bytes one f32 scale `s`: the weights are `t · s`.
    BitnetI2S,
}

/// FFN activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `x·σ(x)`.
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// `max(x, 0)²` (transformers' `relu2`, BitNet b1.58 2B4T).
    Relu2,
}

/// Gated feed-forward block: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ffn {
    /// Pre-FFN norm.
    pub norm: RmsNorm,
    /// Gate projection.
    pub gate: Linear,
    /// Up projection.
    pub up: Linear,
    /// Down projection.
    pub down: Linear,
    /// Activation on the gate.
    pub activation: Activation,
    /// RMSNorm over `act(gate(x)) * up(x)`, before the down projection (BitNet's
    /// `ffn_sub_norm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_norm: Option<RmsNorm>,
    /// Norm applied to the FFN output before the residual add.
    pub post_norm: Option<RmsNorm>,
}

/// How a mixture of experts turns router logits into the experts it runs and their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Softmax over all experts, then the `n_used` largest probabilities; with `renormalize`
    /// those are divided by their sum (Mixtral; OLMoE and Qwen2-MoE `norm_topk_prob`; every
    /// llama.cpp MoE graph that renormalises, Granite's included).
    SoftmaxTopK {
        /// Divide the chosen probabilities by their sum.
        renormalize: bool,
    },
    /// The `n_used` largest logits, then a softmax over them (transformers' GraniteMoE).
    TopKSoftmax,
}

/// One expert's projection: `out_features` rows starting at row `row_offset` of expert
/// `expert`'s slice of a stacked `[n_experts, rows, in_features]` tensor (GGUF's
/// `ffn_*_exps`, GraniteMoE's fused `input_linear`), or of a tensor of its own
/// (`expert: None`: transformers' per-expert `experts.E.*_proj`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertLinear {
    /// The tensor.
    pub weight: WeightId,
    /// Index into the tensor's outermost (expert) dimension, when stacked.
    pub expert: Option<u32>,
    /// First row of the projection inside the expert's slice.
    pub row_offset: u32,
    /// Input width.
    pub in_features: u32,
    /// Output width.
    pub out_features: u32,
}

/// One routed expert: a gated FFN `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Expert {
    /// Gate projection.
    pub gate: ExpertLinear,
    /// Up projection.
    pub up: ExpertLinear,
    /// Down projection.
    pub down: ExpertLinear,
}

/// An expert every token runs beside the routed ones (Qwen2-MoE), optionally scaled by a
/// per-token sigmoid gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedExpert {
    /// Gate projection.
    pub gate: Linear,
    /// Up projection.
    pub up: Linear,
    /// Down projection.
    pub down: Linear,
    /// `[1, hidden]` projection whose sigmoid scales the shared expert's output.
    pub gate_inp: Option<Linear>,
}

/// A routed mixture-of-experts FFN block: `Σ_i w_i · expert_{e_i}(x)` over the `n_used`
/// experts the router picks for each token (summed in pick order), plus a shared expert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Moe {
    /// Pre-FFN norm.
    pub norm: RmsNorm,
    /// `[n_experts, hidden]` router.
    pub router: Linear,
    /// Routing rule.
    pub routing: Routing,
    /// Experts each token runs.
    pub n_used: u32,
    /// The experts, by index.
    pub experts: Vec<Expert>,
    /// Activation on each expert's gate.
    pub activation: Activation,
    /// The shared expert, when present.
    pub shared: Option<SharedExpert>,
    /// Norm applied to the block's output before the residual add.
    pub post_norm: Option<RmsNorm>,
}

/// The FFN part of a block. Serialized without a tag (a dense block as a plain [`Ffn`]), so
/// dense models keep the fingerprints they had before mixtures of experts existed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FfnRegion {
    /// A dense gated FFN.
    Dense(Ffn),
    /// A mixture of experts.
    Moe(Moe),
}

impl FfnRegion {
    /// The pre-FFN norm.
    pub fn norm(&self) -> &RmsNorm {
        match self {
            FfnRegion::Dense(f) => &f.norm,
            FfnRegion::Moe(m) => &m.norm,
        }
    }

    /// The dense FFN, when the block is dense.
    pub fn dense(&self) -> Option<&Ffn> {
        match self {
            FfnRegion::Dense(f) => Some(f),
            FfnRegion::Moe(_) => None,
        }
    }
}

/// One transformer block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerRegion {
    /// Block index.
    pub index: u32,
    /// Attention part.
    pub attention: Attention,
    /// FFN part.
    pub ffn: FfnRegion,
}

impl LayerRegion {
    /// Every weight this block reads (norms, projections and their biases, RoPE frequency
    /// factors stored as a tensor, a mixture's router, experts and shared expert).
    pub fn weight_ids(&self) -> Vec<WeightId> {
        let a = &self.attention;
        let mut ids = vec![a.norm.weight];
        for l in [&a.q, &a.k, &a.v, &a.o] {
            ids.extend(linear_ids(l));
        }
        for n in [&a.q_norm, &a.k_norm, &a.post_norm, &a.sub_norm]
            .into_iter()
            .flatten()
        {
            ids.push(n.weight);
        }
        if let Some(FreqFactors::Weight(w)) = &a.rope.freq_factors {
            ids.push(*w);
        }
        match &self.ffn {
            FfnRegion::Dense(f) => {
                ids.push(f.norm.weight);
                for l in [&f.gate, &f.up, &f.down] {
                    ids.extend(linear_ids(l));
                }
                ids.extend(
                    [&f.sub_norm, &f.post_norm]
                        .into_iter()
                        .flatten()
                        .map(|n| n.weight),
                );
            }
            FfnRegion::Moe(m) => {
                ids.push(m.norm.weight);
                ids.extend(linear_ids(&m.router));
                for e in &m.experts {
                    ids.extend([e.gate.weight, e.up.weight, e.down.weight]);
                }
                if let Some(s) = &m.shared {
                    for l in [&s.gate, &s.up, &s.down].into_iter().chain(&s.gate_inp) {
                        ids.extend(linear_ids(l));
                    }
                }
                ids.extend(m.post_norm.iter().map(|n| n.weight));
            }
        }
        ids.sort_by_key(|w| w.0);
        ids.dedup();
        ids
    }
}

/// A linear's weight, bias and scale.
fn linear_ids(l: &Linear) -> impl Iterator<Item = WeightId> {
    std::iter::once(l.weight).chain(l.bias).chain(l.scale)
}

/// Token embedding lookup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    /// `[vocab, hidden]` table.
    pub weight: WeightId,
    /// Multiplier applied after lookup (Gemma: `sqrt(hidden)`).
    pub scale: f32,
}

/// Final projection to vocabulary logits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LmHead {
    /// The `[vocab, hidden]` projection (the embedding's id when tied).
    pub linear: Linear,
    /// Whether the head is the embedding table.
    pub tied: bool,
    /// Final logit soft-capping `c·tanh(x/c)`, when present.
    pub softcap: Option<f32>,
    /// Multiplier applied to the logits (Granite: `1 / logits_scaling`), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_scale: Option<f32>,
}

/// Special token ids that drive generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// Every id that ends generation (EOS and end-of-turn tokens).
    pub eos: Vec<u32>,
    /// Whether prompts start with BOS.
    pub add_bos: bool,
}

/// The whole model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelIr {
    /// The family adapter that built this IR.
    pub family: Family,
    /// Where the weights come from.
    pub source: SourceKind,
    /// Global hyperparameters.
    pub hparams: HyperParams,
    /// Every stored weight the graph uses.
    pub weights: Vec<WeightDesc>,
    /// Tied-weight aliases.
    pub aliases: Vec<TiedAlias>,
    /// Embedding region.
    pub embedding: Embedding,
    /// Transformer blocks, in order.
    pub layers: Vec<LayerRegion>,
    /// Final norm.
    pub final_norm: RmsNorm,
    /// Multiplier on each block's attention and FFN outputs before their residual adds
    /// (Granite's `residual_multiplier`), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual_scale: Option<f32>,
    /// How the attention and dense-FFN projections compute, when not as plain weights
    /// (BitNet's `quantization_config`); the embedding and the head are never affected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projection_quant: Option<ProjectionQuant>,
    /// LM head.
    pub lm_head: LmHead,
    /// Special tokens.
    pub special: SpecialTokens,
    /// BLAKE3 (hex) of the canonical JSON of everything above.
    pub fingerprint: String,
}

impl ModelIr {
    /// The weight descriptor for an id. Ids come from this IR, so they are in range.
    pub fn weight(&self, id: WeightId) -> &WeightDesc {
        &self.weights[id.0 as usize]
    }

    /// Finds a weight by source name.
    pub fn weight_by_name(&self, name: &str) -> Option<(WeightId, &WeightDesc)> {
        self.weights
            .iter()
            .enumerate()
            .find(|(_, w)| w.name == name)
            .map(|(i, w)| (WeightId(i as u32), w))
    }

    /// Computes the fingerprint of the IR's content (everything but `fingerprint`).
    pub fn compute_fingerprint(&self) -> String {
        let mut copy = self.clone();
        copy.fingerprint.clear();
        // Serialising plain data with derived impls cannot fail.
        let json = serde_json::to_vec(&copy).unwrap_or_default();
        blake3::hash(&json).to_hex().to_string()
    }

    /// The projections a [`ProjectionQuant`] governs, block by block: attention `q`, `k`,
    /// `v`, `o`, then a dense FFN's `gate`, `up`, `down` (a mixture's experts are not
    /// projections here).
    pub fn projections(&self) -> Vec<&Linear> {
        let mut out = Vec::with_capacity(self.layers.len() * 7);
        for l in &self.layers {
            let a = &l.attention;
            out.extend([&a.q, &a.k, &a.v, &a.o]);
            if let FfnRegion::Dense(f) = &l.ffn {
                out.extend([&f.gate, &f.up, &f.down]);
            }
        }
        out
    }

    /// The weights a pipeline stage running blocks `layers` reads: those blocks' weights,
    /// the token embedding when they start at block 0, the final norm and the LM head (with
    /// its bias) when they end at the last block. Sorted, each once.
    pub fn stage_weights(&self, layers: std::ops::Range<usize>) -> Vec<WeightId> {
        let n = self.layers.len();
        let mut ids: Vec<WeightId> = self
            .layers
            .iter()
            .take(layers.end.min(n))
            .skip(layers.start)
            .flat_map(LayerRegion::weight_ids)
            .collect();
        if layers.start == 0 {
            ids.push(self.embedding.weight);
        }
        if layers.end >= n {
            ids.push(self.final_norm.weight);
            ids.extend(linear_ids(&self.lm_head.linear));
        }
        ids.sort_by_key(|w| w.0);
        ids.dedup();
        ids
    }

    /// Whether any block is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l.ffn, FfnRegion::Moe(_)))
    }

    /// Largest `head_dim × n_kv_heads` over layers (the KV row width).
    pub fn max_kv_width(&self) -> u32 {
        self.layers
            .iter()
            .map(|l| l.attention.head_dim * l.attention.n_kv_heads)
            .max()
            .unwrap_or(0)
    }
}

mod ggml_type_name {
    use serde::{Deserialize, Deserializer, Serializer};
    use synapse_formats::{ALL_TYPES, GgmlType};

    pub fn serialize<S: Serializer>(t: &GgmlType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(t.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<GgmlType, D::Error> {
        let name = String::deserialize(d)?;
        ALL_TYPES
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(&name))
            .ok_or_else(|| serde::de::Error::custom(format!("unknown ggml type {name:?}")))
    }
}
