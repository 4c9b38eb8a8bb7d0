//! Loading: a path (GGUF file, safetensors checkpoint or Synapse package directory) → IR →
//! executable weights.
//!
//! Weights stay in their profile encoding (no f32 copy of the model): each linear weight
//! becomes a [`QuantMatrix`] of the kernels ring; only norm weights, biases and RoPE factors
//! (vectors) are decoded to f32.

use std::path::Path;
use std::sync::Arc;

use synapse_formats::GgmlType;
use synapse_formats::gguf::GgufFile;
use synapse_formats::safetensors::SafetensorsModel;
use synapse_import::PackageModel;
use synapse_kernels::{QuantMatrix, RopeStyle};
use synapse_model::{
    Activation, ExpertLinear, FfnRegion, FreqFactors, Linear, ModelIr, RmsNorm, Routing,
    SourceDesc, SourceKind, WeightId,
};

use crate::error::{Result, RuntimeError};
use crate::pages::Pages;
use crate::profile::PrecisionProfile;

/// Byte access to the source files while loading.
enum Source<'a> {
    /// Shared so weight matrices can borrow the mapping instead of copying it; with an
    /// image ([`gguf_image`]), they borrow that instead and the mapping is never read.
    Gguf(Arc<GgufFile>, Option<Arc<Pages<u8>>>),
    /// Shared so weight matrices can borrow the mapping (when a tensor's bytes are the
    /// encoding's and aligned for it) instead of copying it.
    Safetensors(Arc<SafetensorsModel>),
    /// A Synapse package: verified, memory-mapped objects; tied aliases resolve to their
    /// stored target.
    Package(&'a PackageModel),
    /// No weights: every tensor reads as the first `n_bytes` of this buffer (a fill byte
    /// that decodes to normal numbers in every encoding), for measuring speed before any
    /// weight is held.
    Synthetic(Vec<u8>),
}

/// One tensor of a memory-mapped GGUF (or the byte range `range` of it: one expert of a
/// stacked expert tensor), lent to a [`QuantMatrix`] without a copy.
struct GgufTensor {
    file: Arc<GgufFile>,
    index: usize,
    range: Option<std::ops::Range<usize>>,
    /// The file's tensor data held in this process's memory, at the file's offsets.
    image: Option<Arc<Pages<u8>>>,
}

impl synapse_kernels::WeightSource for GgufTensor {
    fn bytes(&self) -> &[u8] {
        let all = match self.file.tensors().get(self.index) {
            Some(t) => tensor_bytes(&self.file, self.image.as_deref(), t),
            None => &[],
        };
        match &self.range {
            Some(r) => all.get(r.clone()).unwrap_or(&[]),
            None => all,
        }
    }

    fn mapping(&self) -> Option<&[u8]> {
        // A held image is not a mapping: nothing may be advised away from it.
        match self.image {
            Some(_) => None,
            None => self.file.mapped_bytes(),
        }
    }

    fn read_at(&self, at: usize, dst: &mut [u8]) -> Option<std::io::Result<()>> {
        if self.image.is_some() {
            return None;
        }
        let t = self.file.tensors().get(self.index)?;
        let base = self.range.as_ref().map_or(0, |r| r.start);
        let end = self.range.as_ref().map_or(t.n_bytes as usize, |r| r.end);
        if at.checked_add(dst.len()).is_none_or(|e| base + e > end) {
            return None;
        }
        match self.file.read_tensor_at(t, (base + at) as u64, dst) {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// A GGUF tensor's bytes: from the held image when there is one, else from the mapping.
fn tensor_bytes<'a>(
    f: &'a GgufFile,
    image: Option<&'a Pages<u8>>,
    t: &synapse_formats::gguf::TensorInfo,
) -> &'a [u8] {
    match image {
        Some(img) => {
            let (Ok(start), Ok(len)) = (usize::try_from(t.offset), usize::try_from(t.n_bytes))
            else {
                return &[];
            };
            start
                .checked_add(len)
                .and_then(|end| img.get(start..end))
                .unwrap_or(&[])
        }
        None => f.tensor_data(t),
    }
}

/// Every tensor's bytes of `f` copied into one buffer of this process's own memory (on huge
/// pages where the system allows: [`Pages`]), each at its offset in the file, read through
/// the file (positional reads: no page of the mapping is touched) or, for an in-memory
/// file, copied.
fn gguf_image(f: &GgufFile) -> Result<Pages<u8>> {
    let len = usize::try_from(f.file_len()).map_err(|_| RuntimeError::WeightData {
        name: "(file)".into(),
        reason: format!(
            "{} bytes do not fit this machine's address space",
            f.file_len()
        ),
    })?;
    let t0 = std::time::Instant::now();
    let mut img = Pages::<u8>::zeroed(len);
    let mut copied = 0u64;
    for t in f.tensors() {
        let src = f.tensor_data(t);
        let start = usize::try_from(t.offset).unwrap_or(usize::MAX);
        // Bounds were checked at open: a tensor's data lies inside the file.
        let Some(dst) = start
            .checked_add(src.len())
            .and_then(|end| img.get_mut(start..end))
        else {
            return Err(RuntimeError::WeightData {
                name: t.name.clone(),
                reason: format!("its {} bytes at {start} lie outside the file", src.len()),
            });
        };
        let read = f
            .read_tensor_at(t, 0, dst)
            .map_err(|e| RuntimeError::WeightData {
                name: t.name.clone(),
                reason: format!("reading it: {e}"),
            })?;
        if !read {
            dst.copy_from_slice(src);
        }
        copied += src.len() as u64;
    }
    tracing::info!(
        bytes = copied,
        ms = t0.elapsed().as_secs_f64() * 1e3,
        "weights read into memory"
    );
    Ok(img)
}

/// One tensor of a memory-mapped safetensors checkpoint (or the byte range `range` of it),
/// lent to a [`QuantMatrix`] without a copy.
struct SafetensorsTensor {
    model: Arc<SafetensorsModel>,
    shard: usize,
    entry: synapse_formats::safetensors::SafetensorsEntry,
    range: Option<std::ops::Range<usize>>,
}

impl synapse_kernels::WeightSource for SafetensorsTensor {
    fn bytes(&self) -> &[u8] {
        let all = self.model.shards()[self.shard].data(&self.entry);
        match &self.range {
            Some(r) => all.get(r.clone()).unwrap_or(&[]),
            None => all,
        }
    }

    fn mapping(&self) -> Option<&[u8]> {
        self.model.shards()[self.shard].mapped_bytes()
    }

    fn read_at(&self, at: usize, dst: &mut [u8]) -> Option<std::io::Result<()>> {
        let base = self.range.as_ref().map_or(0, |r| r.start);
        let end = self
            .range
            .as_ref()
            .map_or(self.entry.n_bytes as usize, |r| r.end);
        if at.checked_add(dst.len()).is_none_or(|e| base + e > end) {
            return None;
        }
        match self.model.shards()[self.shard].read_entry_at(&self.entry, (base + at) as u64, dst) {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// One tensor of a Synapse package (or the byte range `range` of it: one expert of a stacked
/// expert tensor): its object's mapping, lent to a [`QuantMatrix`] without a copy.
struct PackageTensor {
    obj: Arc<synapse_cas::Object>,
    range: Option<std::ops::Range<usize>>,
}

impl synapse_kernels::WeightSource for PackageTensor {
    fn bytes(&self) -> &[u8] {
        match &self.range {
            Some(r) => self.obj.get(r.clone()).unwrap_or(&[]),
            None => &self.obj,
        }
    }

    fn mapping(&self) -> Option<&[u8]> {
        // One object, one mapping of its whole file.
        Some(&self.obj[..]).filter(|b| !b.is_empty())
    }

    fn read_at(&self, at: usize, dst: &mut [u8]) -> Option<std::io::Result<()>> {
        let base = self.range.as_ref().map_or(0, |r| r.start);
        let end = self.range.as_ref().map_or(self.obj.len(), |r| r.end);
        if at.checked_add(dst.len()).is_none_or(|e| base + e > end) {
            return None;
        }
        Some(self.obj.read_at((base + at) as u64, dst))
    }
}

impl Source<'_> {
    /// A ggml weight as a matrix: borrowed from a GGUF's or a package's mapping (resident
    /// once, as file pages), copied from the other sources.
    fn matrix(&self, ir: &ModelIr, id: WeightId, rows: usize, cols: usize) -> Result<QuantMatrix> {
        self.matrix_of(ir, id, None, rows, cols)
    }

    /// The bytes `range` of weight `id` (all of it for `None`) as a `rows × cols` matrix:
    /// borrowed from a GGUF's or a package's mapping, copied from the other sources. A GGUF's
    /// BF16 tensors sum in ggml's order (as llama.cpp runs them); a checkpoint's meet f32
    /// activations (as transformers runs a BF16 master in float32).
    fn matrix_of(
        &self,
        ir: &ModelIr,
        id: WeightId,
        range: Option<std::ops::Range<usize>>,
        rows: usize,
        cols: usize,
    ) -> Result<QuantMatrix> {
        Ok(self
            .matrix_bytes_of(ir, id, range, rows, cols)?
            .with_ggml_bf16(ir.source == SourceKind::Gguf))
    }

    /// [`Self::matrix_of`]'s matrix, before the numerics of its source are set.
    fn matrix_bytes_of(
        &self,
        ir: &ModelIr,
        id: WeightId,
        range: Option<std::ops::Range<usize>>,
        rows: usize,
        cols: usize,
    ) -> Result<QuantMatrix> {
        let w = ir.weight(id);
        let bytes = self.bytes(ir, id)?;
        let part = match &range {
            Some(r) => bytes
                .get(r.clone())
                .ok_or_else(|| RuntimeError::WeightData {
                    name: w.name.clone(),
                    reason: format!("{} bytes, the range needs {r:?}", bytes.len()),
                })?,
            None => bytes,
        };
        if let Source::Gguf(f, image) = self
            && let Some(index) = f.tensors().iter().position(|t| t.name == w.name)
        {
            let src = Arc::new(GgufTensor {
                file: f.clone(),
                index,
                range,
                image: image.clone(),
            });
            return Ok(QuantMatrix::from_ggml_shared(w.encoding, src, rows, cols)?);
        }
        if let Source::Package(p) = self {
            let src = Arc::new(PackageTensor {
                obj: p.tensor_object(&w.name)?,
                range,
            });
            return Ok(QuantMatrix::from_ggml_shared(w.encoding, src, rows, cols)?);
        }
        // A safetensors tensor whose stored type is the encoding, from a file's mapping and
        // aligned for its elements (the kernels read weights as slices of them): borrowed.
        if let Source::Safetensors(m) = self
            && let Some((shard, e)) = m.locate(&w.name)
            && e.dtype.ggml() == Some(w.encoding)
            && m.shards()[shard].mapped_bytes().is_some()
            && (part.as_ptr() as usize).is_multiple_of(e.dtype.size().max(1))
        {
            let src = Arc::new(SafetensorsTensor {
                model: m.clone(),
                shard,
                entry: e.clone(),
                range,
            });
            return Ok(QuantMatrix::from_ggml_shared(w.encoding, src, rows, cols)?);
        }
        Ok(QuantMatrix::from_ggml(w.encoding, part, rows, cols)?)
    }

    /// One expert's projection as a matrix: its rows of a stacked expert tensor (borrowed
    /// from a GGUF's mapping, copied from the other sources).
    fn expert_matrix(&self, ir: &ModelIr, e: &ExpertLinear) -> Result<QuantMatrix> {
        let w = ir.weight(e.weight);
        let bad = |reason: String| RuntimeError::WeightData {
            name: w.name.clone(),
            reason,
        };
        let (rows, cols) = (e.out_features as usize, e.in_features as usize);
        let block = w.encoding.block_size();
        if cols == 0 || !cols.is_multiple_of(block) {
            return Err(bad(format!(
                "{cols} columns are not a multiple of {}'s block of {block}",
                w.encoding.name()
            )));
        }
        let row_bytes = cols / block * w.encoding.type_size();
        // Rows of one expert's slice: the middle dimension of [n_expert, rows, cols].
        let (slice_rows, expert) = match (e.expert, w.shape.as_slice()) {
            (Some(x), [ne, r, c]) if *c as usize == cols && u64::from(x) < *ne => (*r, x as u64),
            (None, [r, c]) if *c as usize == cols => (*r, 0),
            _ => {
                return Err(bad(format!(
                    "shape {:?} has no expert {:?}",
                    w.shape, e.expert
                )));
            }
        };
        if u64::from(e.row_offset) + rows as u64 > slice_rows {
            return Err(bad(format!(
                "rows {}..{} outside the expert's {slice_rows}",
                e.row_offset,
                e.row_offset as usize + rows
            )));
        }
        let first = (expert * slice_rows + u64::from(e.row_offset)) as usize;
        let range = first * row_bytes..(first + rows) * row_bytes;
        self.matrix_of(ir, e.weight, Some(range), rows, cols)
    }

    /// A projection a package stores ternary (`syn.ternary.absmean.tensor.v1`: BitNet's,
    /// ternarised or repacked at import): its codec bytes. `None` for every other source and
    /// tensor.
    fn stored_ternary(&self, ir: &ModelIr, id: WeightId) -> Result<Option<&[u8]>> {
        let Source::Package(p) = self else {
            return Ok(None);
        };
        let w = ir.weight(id);
        match p.transcoded(&w.name)? {
            None => Ok(None),
            Some((synapse_import::TERNARY_ENCODING, bytes)) => Ok(Some(bytes)),
            Some((other, _)) => Err(RuntimeError::WeightData {
                name: w.name.clone(),
                reason: format!("stored as {other}, which this build does not run"),
            }),
        }
    }

    fn bytes(&self, ir: &ModelIr, id: WeightId) -> Result<&[u8]> {
        let w = ir.weight(id);
        let data = match self {
            Source::Gguf(f, image) => f
                .tensor(&w.name)
                .map(|t| tensor_bytes(f, image.as_deref(), t)),
            Source::Safetensors(m) => m.tensor(&w.name).map(|t| t.bytes),
            Source::Package(p) => Some(p.tensor_bytes(&w.name)?),
            Source::Synthetic(b) => b.get(..w.n_bytes as usize),
        };
        let data = data.ok_or_else(|| RuntimeError::WeightData {
            name: w.name.clone(),
            reason: "not in the source file".into(),
        })?;
        if data.len() as u64 != w.n_bytes {
            return Err(RuntimeError::WeightData {
                name: w.name.clone(),
                reason: format!("{} bytes, descriptor says {}", data.len(), w.n_bytes),
            });
        }
        Ok(data)
    }
}

/// A norm ready to run: weight (with any offset folded in) and epsilon.
#[derive(Debug, Clone)]
pub struct NormW {
    /// Per-channel multiplier.
    pub w: Vec<f32>,
    /// Epsilon.
    pub eps: f32,
}

/// A linear layer ready to run.
#[derive(Debug, Clone)]
pub struct LinearW {
    /// The weight in its profile encoding.
    pub m: Arc<QuantMatrix>,
    /// Optional bias.
    pub bias: Option<Vec<f32>>,
    /// Inputs quantised per token to 8 bits by absmax before the product (BitNet's W1.58A8;
    /// the weights are then ternary).
    pub act_a8: bool,
}

/// RoPE tables inputs for one layer.
#[derive(Debug, Clone)]
pub struct RopeW {
    /// Pairing style, in the kernels' terms.
    pub style: RopeStyle,
    /// Rotated dims.
    pub n_rot: usize,
    /// Base θ.
    pub base: f32,
    /// Linear position scale.
    pub freq_scale: f32,
    /// Per-pair divisors.
    pub freq_factors: Option<Vec<f32>>,
}

/// One layer ready to run.
#[derive(Debug, Clone)]
pub struct LayerW {
    /// Pre-attention norm.
    pub attn_norm: NormW,
    /// q, k, v, o projections.
    pub q: LinearW,
    /// Key projection.
    pub k: LinearW,
    /// Value projection.
    pub v: LinearW,
    /// Output projection.
    pub o: LinearW,
    /// Per-head q norm.
    pub q_norm: Option<NormW>,
    /// Per-head k norm.
    pub k_norm: Option<NormW>,
    /// RMSNorm over the heads' output, before `o` (BitNet).
    pub attn_sub_norm: Option<NormW>,
    /// Post-attention norm.
    pub attn_post_norm: Option<NormW>,
    /// Heads.
    pub n_heads: usize,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// RoPE.
    pub rope: RopeW,
    /// Sliding window.
    pub window: Option<usize>,
    /// q·k scale.
    pub scale: f32,
    /// q (after its norm), k (after its norm) and v clamped to `[-c, c]` (OLMoE's `clip_qkv`).
    pub clip_qkv: Option<f32>,
    /// Pre-FFN norm.
    pub ffn_norm: NormW,
    /// The FFN: dense, or a mixture of experts.
    pub ffn: FfnW,
    /// Post-FFN norm.
    pub ffn_post_norm: Option<NormW>,
}

/// A layer's FFN ready to run.
#[derive(Debug, Clone)]
pub enum FfnW {
    /// A dense gated FFN.
    Dense {
        /// Gate projection.
        gate: LinearW,
        /// Up projection.
        up: LinearW,
        /// Down projection.
        down: LinearW,
        /// Activation on the gate.
        act: Activation,
        /// RMSNorm over the gated product, before `down` (BitNet).
        sub_norm: Option<NormW>,
    },
    /// A mixture of experts.
    Moe(Box<MoeW>),
}

/// One routed expert's projections.
#[derive(Debug, Clone)]
pub struct ExpertW {
    /// Gate projection (`ff × hidden`).
    pub gate: Arc<QuantMatrix>,
    /// Up projection (`ff × hidden`).
    pub up: Arc<QuantMatrix>,
    /// Down projection (`hidden × ff`).
    pub down: Arc<QuantMatrix>,
}

impl ExpertW {
    /// Whether a projection has an encoding ggml's `mul_mat_id` tiles where 8 or more rows
    /// of one prompt batch route to the expert
    /// ([`synapse_kernels::OrderClass::ggml_tiles_experts`]).
    pub fn ggml_tiles(&self) -> bool {
        [&self.gate, &self.up, &self.down].iter().any(|w| {
            w.ggml_type()
                .is_some_and(synapse_kernels::OrderClass::ggml_tiles_experts)
        })
    }
}

/// A shared expert (every token runs it), optionally scaled by a sigmoid gate.
#[derive(Debug, Clone)]
pub struct SharedW {
    /// Gate projection.
    pub gate: LinearW,
    /// Up projection.
    pub up: LinearW,
    /// Down projection.
    pub down: LinearW,
    /// `1 × hidden` gate whose sigmoid scales the output.
    pub gate_inp: Option<LinearW>,
}

/// A mixture-of-experts FFN ready to run.
#[derive(Debug, Clone)]
pub struct MoeW {
    /// `n_expert × hidden` router.
    pub router: LinearW,
    /// Routing rule.
    pub routing: Routing,
    /// Experts each token runs.
    pub n_used: usize,
    /// The experts.
    pub experts: Vec<ExpertW>,
    /// Activation on each expert's gate.
    pub act: Activation,
    /// The shared expert.
    pub shared: Option<SharedW>,
}

impl MoeW {
    /// Bytes of one expert's three projections (the experts of a block are alike).
    pub fn expert_bytes(&self) -> usize {
        self.experts.first().map_or(0, |e| {
            e.gate.weight_bytes() + e.up.weight_bytes() + e.down.weight_bytes()
        })
    }
}

impl LayerW {
    /// The layer's dense linears in IR order: q, k, v, o, then gate, up, down of a dense FFN
    /// or a mixture's router and shared expert (gate, up, down, gate input). Routed experts
    /// are not among them (see [`FfnW::Moe`]).
    pub fn linears(&self) -> Vec<&LinearW> {
        let mut v = vec![&self.q, &self.k, &self.v, &self.o];
        match &self.ffn {
            FfnW::Dense { gate, up, down, .. } => v.extend([gate, up, down]),
            FfnW::Moe(m) => {
                v.push(&m.router);
                if let Some(s) = &m.shared {
                    v.extend([&s.gate, &s.up, &s.down]);
                    v.extend(s.gate_inp.as_ref());
                }
            }
        }
        v
    }

    /// [`LayerW::linears`], mutably.
    pub(crate) fn linears_mut(&mut self) -> Vec<&mut LinearW> {
        let mut v = vec![&mut self.q, &mut self.k, &mut self.v, &mut self.o];
        match &mut self.ffn {
            FfnW::Dense { gate, up, down, .. } => v.extend([gate, up, down]),
            FfnW::Moe(m) => {
                let m = &mut **m;
                v.push(&mut m.router);
                if let Some(s) = &mut m.shared {
                    v.extend([&mut s.gate, &mut s.up, &mut s.down]);
                    v.extend(s.gate_inp.as_mut());
                }
            }
        }
        v
    }
}

/// The IR weight ids of a layer's linears, in [`LayerW::linears`]' order.
pub(crate) fn layer_weight_ids(r: &synapse_model::LayerRegion) -> Vec<synapse_model::WeightId> {
    let a = &r.attention;
    let mut v = vec![a.q.weight, a.k.weight, a.v.weight, a.o.weight];
    match &r.ffn {
        FfnRegion::Dense(f) => v.extend([f.gate.weight, f.up.weight, f.down.weight]),
        FfnRegion::Moe(m) => {
            v.push(m.router.weight);
            if let Some(s) = &m.shared {
                v.extend([s.gate.weight, s.up.weight, s.down.weight]);
                v.extend(s.gate_inp.as_ref().map(|g| g.weight));
            }
        }
    }
    v
}

/// A loaded model: the IR, its profile and executable weights.
#[derive(Debug)]
pub struct Model {
    /// The IR.
    pub ir: ModelIr,
    /// The precision profile the weights were loaded in.
    pub profile: PrecisionProfile,
    /// Embedding table (shared with the head when tied).
    pub embd: Arc<QuantMatrix>,
    /// Embedding scale.
    pub embd_scale: f32,
    /// Layers.
    pub layers: Vec<LayerW>,
    /// Final norm.
    pub final_norm: NormW,
    /// LM head.
    pub head: LinearW,
    /// Final logit soft-cap.
    pub softcap: Option<f32>,
    /// Run GELU through ggml's fp16 table (GGUF sources, to match llama.cpp bit for bit)
    /// instead of the exact tanh formula (HF sources, to match transformers); likewise a
    /// shared expert's sigmoid gate as llama.cpp's `silu(x) / x` instead of `1 / (1 + e^-x)`.
    pub gelu_f16_table: bool,
    /// Multiplier on each block's attention and FFN outputs before the residual adds.
    pub residual_scale: Option<f32>,
    /// Multiplier on the logits.
    pub logit_scale: Option<f32>,
    /// The blocks whose weights are held (all of them, except in a model loaded for one
    /// pipeline stage: [`Model::load_package_stage`]). Blocks outside it hold empty
    /// matrices and are never run; the token embedding is held when it starts at 0 (or
    /// serves as the tied LM head), the final norm and LM head when it ends at the last.
    pub present: std::ops::Range<usize>,
    /// The weights were read into this process's own memory at load
    /// ([`Model::load_resident`]) instead of borrowed from the file's mapping: the pagers
    /// refuse such a model (its weights are resident whatever a budget says).
    pub resident: bool,
}

impl Model {
    /// Loads a GGUF file, a safetensors file, or a checkpoint directory (`config.json` +
    /// safetensors), in its source precision.
    ///
    /// A directory holding a `manifest.toml` is opened as a self-contained Synapse package
    /// ([`Model::load_package`]).
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_from(path, false)
    }

    /// [`Model::load`], with a GGUF's tensors read into this process's own memory (on
    /// transparent huge pages where the system allows them) instead of borrowed from the
    /// file's mapping: every weight is resident from the start and read without a page fault,
    /// a TLB miss every 4 KiB or a prefetcher stop at every page boundary. Decode streams the
    /// weights once per token; on Zen 4 with 2 threads (`decode_bench`, 16-token prompt, 128
    /// tokens, median step of 4–6 runs alternated with the mapped model) SmolLM2-135M went
    /// 208.9 → 235.7 tok/s, Gemma 3 270M 115.2 → 131, Qwen2.5-Coder-0.5B 71.0 → 78.7. The
    /// memory is the file's size, held for the model's life, so this is for running without
    /// a memory budget: the budgeted pagers need the mapping and refuse a model without one.
    /// Other sources load as [`Model::load`] does.
    pub fn load_resident(path: &Path) -> Result<Self> {
        Self::load_from(path, true)
    }

    /// [`Model::load`], or [`Model::load_resident`] with `resident`.
    fn load_from(path: &Path, resident: bool) -> Result<Self> {
        if synapse_import::is_package_dir(path) {
            return Self::load_package(&PackageModel::open_dir(path)?);
        }
        let (source, desc) = open_source(path)?;
        let source = match source {
            Source::Gguf(f, _) if resident => {
                let image = Arc::new(gguf_image(&f)?);
                Source::Gguf(f, Some(image))
            }
            other => other,
        };
        let ir = synapse_model::build_ir(&desc)?;
        let profile = PrecisionProfile::source(&ir);
        Self::from_source(&source, ir, profile)
    }

    /// Loads an opened Synapse package in its source precision: the graph the family adapter
    /// built at import, weights from the package's verified objects (tied aliases resolve to
    /// the one stored tensor). Gives the same model as loading the source file.
    pub fn load_package(package: &PackageModel) -> Result<Self> {
        let ir = package.ir().clone();
        let profile = PrecisionProfile::source(&ir);
        Self::from_source(&Source::Package(package), ir, profile)
    }

    /// Loads blocks `layers` of an opened Synapse package for one pipeline stage (the token
    /// embedding when they start at 0, the final norm and LM head when they end at the
    /// last block): only the tensors [`ModelIr::stage_weights`] names are read, so the
    /// package may hold only those objects ([`PackageModel::from_package_only`]). The other
    /// blocks are placeholders an executor refuses to run ([`Model::present`]).
    pub fn load_package_stage(
        package: &PackageModel,
        layers: std::ops::Range<usize>,
    ) -> Result<Self> {
        let ir = package.ir().clone();
        check_stage_layers(&layers, ir.layers.len())?;
        let profile = PrecisionProfile::source(&ir);
        Self::from_source_part(&Source::Package(package), ir, profile, layers)
    }

    /// A model of `ir`'s shape holding blocks `layers` (as [`Model::load_package_stage`])
    /// whose every weight is synthetic: bytes of one fill value that decode to normal
    /// numbers in every encoding. Its results mean nothing; its speed is the real model's
    /// (the kernels' work does not depend on the values), so a worker measures itself on it
    /// before it holds any weight.
    pub fn synthetic_stage(ir: &ModelIr, layers: std::ops::Range<usize>) -> Result<Self> {
        check_stage_layers(&layers, ir.layers.len())?;
        let largest = ir
            .stage_weights(layers.clone())
            .into_iter()
            .map(|id| ir.weight(id).n_bytes)
            .max()
            .unwrap_or(0);
        let buf = vec![SYNTHETIC_FILL; usize::try_from(largest).unwrap_or(usize::MAX)];
        let profile = PrecisionProfile::source(ir);
        Self::from_source_part(&Source::Synthetic(buf), ir.clone(), profile, layers)
    }

    /// The names of the tensors a stage running blocks `layers` of `ir` reads.
    pub fn stage_tensor_names(
        ir: &ModelIr,
        layers: std::ops::Range<usize>,
    ) -> std::collections::BTreeSet<String> {
        ir.stage_weights(layers)
            .into_iter()
            .map(|id| ir.weight(id).name.clone())
            .collect()
    }

    /// Whether this model holds every block of `layers` (and the embedding or head a stage
    /// over them needs).
    pub fn holds(&self, layers: &std::ops::Range<usize>) -> bool {
        self.present.start <= layers.start && layers.end <= self.present.end
    }

    fn from_source(src: &Source, ir: ModelIr, profile: PrecisionProfile) -> Result<Self> {
        let n = ir.layers.len();
        Self::from_source_part(src, ir, profile, 0..n)
    }

    fn from_source_part(
        src: &Source,
        ir: ModelIr,
        profile: PrecisionProfile,
        present: std::ops::Range<usize>,
    ) -> Result<Self> {
        let n_layers = ir.layers.len();
        let first = present.start == 0;
        let last = present.end == n_layers;
        let tied = ir.lm_head.tied || ir.lm_head.linear.weight == ir.embedding.weight;
        let linear = |l: &Linear| -> Result<LinearW> {
            let w = ir.weight(l.weight);
            check_profile(&profile, &w.name, w.encoding)?;
            let m = src.matrix(
                &ir,
                l.weight,
                l.out_features as usize,
                l.in_features as usize,
            )?;
            let bias = match l.bias {
                Some(b) => Some(vector(src, &ir, b)?),
                None => None,
            };
            Ok(LinearW {
                m: Arc::new(m),
                bias,
                act_a8: false,
            })
        };
        // A projection: as stored, or BitNet's W1.58A8 (weights ternarised here from the
        // master, inputs quantised per token at run time).
        // A projection: as stored, or BitNet's W1.58A8 (weights ternary, inputs quantised per
        // token at run time): from a package already ternary, else made ternary here from the
        // source's masters, packed bytes or I2_S by the importer's own conversion.
        let proj = |l: &Linear| -> Result<LinearW> {
            if ir.projection_quant.is_none() {
                return linear(l);
            }
            let w = ir.weight(l.weight);
            check_profile(&profile, &w.name, w.encoding)?;
            let made;
            let bytes = match src.stored_ternary(&ir, l.weight)? {
                Some(b) => b,
                None => {
                    let scale = l.scale.map(|s| src.bytes(&ir, s)).transpose()?;
                    made = synapse_import::ternary::ternary_projection(
                        &ir,
                        l,
                        src.bytes(&ir, l.weight)?,
                        scale,
                    )?;
                    &made
                }
            };
            // The integer path (inputs quantised inside the matrix) where the rows are whole
            // 256-blocks; otherwise the codec's with the inputs quantised by the executor.
            let m = QuantMatrix::from_ternary_a8(
                bytes,
                l.out_features as usize,
                l.in_features as usize,
            )?;
            Ok(LinearW {
                act_a8: !m.quantizes_inputs(),
                m: Arc::new(m),
                bias: match l.bias {
                    Some(b) => Some(vector(src, &ir, b)?),
                    None => None,
                },
            })
        };
        let norm = |n: &RmsNorm| -> Result<NormW> {
            let mut w = vector(src, &ir, n.weight)?;
            if n.weight_offset != 0.0 {
                for x in &mut w {
                    *x += n.weight_offset;
                }
            }
            Ok(NormW { w, eps: n.eps })
        };
        let embd_desc = ir.weight(ir.embedding.weight);
        check_profile(&profile, &embd_desc.name, embd_desc.encoding)?;
        let hidden = ir.hparams.hidden as usize;
        let embd = Arc::new(if first || (last && tied) {
            src.matrix(
                &ir,
                ir.embedding.weight,
                ir.hparams.vocab_size as usize,
                hidden,
            )?
        } else {
            absent_matrix(hidden)?
        });
        let head = if !last {
            absent_linear(&ir.lm_head.linear)?
        } else if tied {
            LinearW {
                m: embd.clone(),
                bias: None,
                act_a8: false,
            }
        } else {
            linear(&ir.lm_head.linear)?
        };
        let mut layers = Vec::with_capacity(ir.layers.len());
        for (il, l) in ir.layers.iter().enumerate() {
            if !present.contains(&il) {
                layers.push(absent_layer(l)?);
                continue;
            }
            let a = &l.attention;
            let ffn = match &l.ffn {
                FfnRegion::Dense(f) => FfnW::Dense {
                    gate: proj(&f.gate)?,
                    up: proj(&f.up)?,
                    down: proj(&f.down)?,
                    act: f.activation,
                    sub_norm: f.sub_norm.as_ref().map(norm).transpose()?,
                },
                FfnRegion::Moe(m) => {
                    let mut experts = Vec::with_capacity(m.experts.len());
                    for e in &m.experts {
                        let mat = |el: &ExpertLinear| -> Result<Arc<QuantMatrix>> {
                            let w = ir.weight(el.weight);
                            check_profile(&profile, &w.name, w.encoding)?;
                            Ok(Arc::new(src.expert_matrix(&ir, el)?))
                        };
                        experts.push(ExpertW {
                            gate: mat(&e.gate)?,
                            up: mat(&e.up)?,
                            down: mat(&e.down)?,
                        });
                    }
                    let shared = match &m.shared {
                        Some(s) => Some(SharedW {
                            gate: linear(&s.gate)?,
                            up: linear(&s.up)?,
                            down: linear(&s.down)?,
                            gate_inp: s.gate_inp.as_ref().map(linear).transpose()?,
                        }),
                        None => None,
                    };
                    FfnW::Moe(Box::new(MoeW {
                        router: linear(&m.router)?,
                        routing: m.routing,
                        n_used: m.n_used as usize,
                        experts,
                        act: m.activation,
                        shared,
                    }))
                }
            };
            let (ffn_norm, ffn_post_norm) = match &l.ffn {
                FfnRegion::Dense(f) => (&f.norm, &f.post_norm),
                FfnRegion::Moe(m) => (&m.norm, &m.post_norm),
            };
            let freq_factors = match &a.rope.freq_factors {
                None => None,
                Some(FreqFactors::Values(v)) => Some(v.clone()),
                Some(FreqFactors::Weight(id)) => Some(vector(src, &ir, *id)?),
            };
            layers.push(LayerW {
                attn_norm: norm(&a.norm)?,
                q: proj(&a.q)?,
                k: proj(&a.k)?,
                v: proj(&a.v)?,
                o: proj(&a.o)?,
                q_norm: a.q_norm.as_ref().map(norm).transpose()?,
                k_norm: a.k_norm.as_ref().map(norm).transpose()?,
                attn_sub_norm: a.sub_norm.as_ref().map(norm).transpose()?,
                attn_post_norm: a.post_norm.as_ref().map(norm).transpose()?,
                n_heads: a.n_heads as usize,
                n_kv_heads: a.n_kv_heads as usize,
                head_dim: a.head_dim as usize,
                rope: rope_w(&a.rope, freq_factors),
                window: a.window.map(|w| w as usize),
                scale: a.scale,
                clip_qkv: a.clip_qkv,
                ffn_norm: norm(ffn_norm)?,
                ffn,
                ffn_post_norm: ffn_post_norm.as_ref().map(norm).transpose()?,
            });
        }
        let final_norm = if last {
            norm(&ir.final_norm)?
        } else {
            NormW {
                w: Vec::new(),
                eps: ir.final_norm.eps,
            }
        };
        Ok(Model {
            present,
            resident: matches!(src, Source::Gguf(_, Some(_))),
            embd_scale: ir.embedding.scale,
            softcap: ir.lm_head.softcap,
            gelu_f16_table: ir.source == SourceKind::Gguf,
            residual_scale: ir.residual_scale,
            logit_scale: ir.lm_head.logit_scale,
            embd,
            layers,
            final_norm,
            head,
            profile,
            ir,
        })
    }

    /// Whether a routed expert is one ggml's `mul_mat_id` tiles ([`ExpertW::ggml_tiles`]):
    /// then a prompt row's expert outputs depend on the routing of its whole batch, which a
    /// scheduler must therefore run in one pass.
    pub fn tiles_experts(&self) -> bool {
        self.layers.iter().any(|l| match &l.ffn {
            FfnW::Moe(m) => m.experts.iter().any(ExpertW::ggml_tiles),
            FfnW::Dense { .. } => false,
        })
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.ir.hparams.vocab_size as usize
    }

    /// Residual width.
    pub fn hidden(&self) -> usize {
        self.ir.hparams.hidden as usize
    }

    /// Weight bytes one decode step reads: every layer's linears (of a mixture of experts,
    /// the router, the shared expert and `n_used` routed experts) and the LM head (the token
    /// embedding only as the tied LM head: a lookup reads one row of it).
    pub fn decode_read_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let experts = match &l.ffn {
                    FfnW::Moe(m) => m.n_used * m.expert_bytes(),
                    FfnW::Dense { .. } => 0,
                };
                experts
                    + l.linears()
                        .iter()
                        .map(|l| l.m.weight_bytes())
                        .sum::<usize>()
            })
            .sum();
        self.head.m.weight_bytes() + layers
    }

    /// Bytes of an f32 KV cache one decode step reads at context `ctx` (keys and values of
    /// every layer's attended cells: a sliding-window layer at most its window).
    pub fn kv_read_bytes_f32(&self, ctx: usize) -> usize {
        self.layers
            .iter()
            .map(|l| 2 * 4 * l.n_kv_heads * l.head_dim * l.window.map_or(ctx, |w| w.min(ctx)))
            .sum()
    }

    /// Bytes of the routed experts (0 for a dense model).
    pub fn expert_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match &l.ffn {
                FfnW::Moe(m) => m.experts.len() * m.expert_bytes(),
                FfnW::Dense { .. } => 0,
            })
            .sum()
    }

    /// An upper bound of the scratch memory an executor of `threads` threads holds after
    /// passes of up to `rows` rows (`logit_rows` of them asking logits) over contexts of up to
    /// `ctx` positions: the per-row activations of every stage (the largest layer's widths),
    /// the MoE blocks' routing and group buffers, the logits, the kernels' quantized
    /// activations, and attention's scores (the split path's 16 MiB, each thread's row
    /// block). What a memory budget reserves for computing.
    pub fn pass_scratch_bytes(
        &self,
        rows: usize,
        logit_rows: usize,
        ctx: usize,
        threads: usize,
    ) -> u64 {
        let hd = self.hidden();
        let mut per_row = 0usize;
        let mut attn = 0usize;
        for l in &self.layers {
            let qd = l.n_heads * l.head_dim;
            let kvd = l.n_kv_heads * l.head_dim;
            let ffn = match &l.ffn {
                FfnW::Dense { gate, .. } => 3 * gate.m.rows(),
                FfnW::Moe(m) => {
                    let ff = m.experts.iter().map(|e| e.gate.rows()).max().unwrap_or(0);
                    let sh = m
                        .shared
                        .as_ref()
                        .map_or(0, |s| 3 * s.gate.m.rows() + hd + 1);
                    m.experts.len() + m.n_used * hd + 2 * hd + 3 * ff + sh
                }
            };
            per_row = per_row.max(5 * hd + 2 * qd + 2 * kvd + ffn);
            let group = l.n_heads / l.n_kv_heads.max(1);
            attn = attn.max(threads.max(1) * 4 * group.max(1) * ctx.max(1));
        }
        let act = rows * (hd.max(self.max_cols())) * 4;
        let floats = rows * per_row + logit_rows * self.vocab() + attn + (4 << 20);
        (floats * 4 + act) as u64
    }

    /// The widest input of any projection.
    fn max_cols(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.linears())
            .map(|l| l.m.cols())
            .chain(self.layers.iter().filter_map(|l| match &l.ffn {
                FfnW::Moe(m) => m.experts.first().map(|e| e.down.cols()),
                FfnW::Dense { .. } => None,
            }))
            .max()
            .unwrap_or(0)
    }

    /// Bytes of weights a pipeline stage running `layers` holds: those layers' linears and
    /// experts, the token embedding when they start at 0, the LM head when they end at the
    /// last layer (once when tied and both).
    pub fn stage_weight_bytes(&self, layers: std::ops::Range<usize>) -> usize {
        let lin = |l: &LinearW| l.m.weight_bytes();
        let end = layers.end.min(self.layers.len());
        let first = layers.start == 0;
        let last = end == self.layers.len();
        let mut n = 0;
        if first {
            n += self.embd.weight_bytes();
        }
        if last && !(first && Arc::ptr_eq(&self.embd, &self.head.m)) {
            n += lin(&self.head);
        }
        n + self.layers[layers.start.min(end)..end]
            .iter()
            .map(|l| {
                let experts = match &l.ffn {
                    FfnW::Moe(m) => m.experts.len() * m.expert_bytes(),
                    FfnW::Dense { .. } => 0,
                };
                experts + l.linears().iter().map(|x| lin(x)).sum::<usize>()
            })
            .sum::<usize>()
    }

    /// Bytes of weights held (encoded).
    pub fn weight_bytes(&self) -> usize {
        self.stage_weight_bytes(0..self.layers.len())
    }
}

/// The IR's RoPE pairing in the kernels' terms: interleaved pairs are ggml's "normal" mode.
fn rope_style(s: synapse_model::RopeStyle) -> RopeStyle {
    match s {
        synapse_model::RopeStyle::Interleaved => RopeStyle::Normal,
        synapse_model::RopeStyle::Neox => RopeStyle::Neox,
    }
}

fn check_profile(p: &PrecisionProfile, name: &str, enc: GgmlType) -> Result<()> {
    match p.encoding(name) {
        Some(e) if e == enc.name() => Ok(()),
        Some(e) => Err(RuntimeError::UnsupportedConversion {
            name: name.to_string(),
            source_encoding: enc.name().to_string(),
            wanted: e.to_string(),
        }),
        None => Ok(()),
    }
}

/// Decodes a (small, float-typed) weight to f32: norms, biases, RoPE factors. The model
/// adapters guarantee these are F32, F16 or BF16.
/// A pipeline stage's blocks must be a non-empty range inside the model's `n`.
pub(crate) fn check_stage_layers(layers: &std::ops::Range<usize>, n: usize) -> Result<()> {
    if layers.start >= layers.end || layers.end > n {
        return Err(RuntimeError::InvalidParam {
            name: "stage layers",
            reason: format!(
                "layer range {}..{} is empty or outside the model's {n} layers",
                layers.start, layers.end
            ),
        });
    }
    Ok(())
}

/// RoPE of an attention block as the kernels take it.
fn rope_w(r: &synapse_model::Rope, freq_factors: Option<Vec<f32>>) -> RopeW {
    RopeW {
        style: rope_style(r.style),
        n_rot: r.n_rot as usize,
        base: r.base,
        freq_scale: r.freq_scale,
        freq_factors,
    }
}

/// The byte synthetic weights are made of: as f32 0.0115, f16 1.06, bf16 0.0115 (normal
/// numbers, so no denormal slow path), and a valid quant value or scale in every block type.
pub const SYNTHETIC_FILL: u8 = 0x3C;

/// An empty matrix of `cols` columns: what a block outside a stage's model holds.
fn absent_matrix(cols: usize) -> Result<QuantMatrix> {
    Ok(QuantMatrix::from_ggml(GgmlType::F32, &[], 0, cols.max(1))?)
}

fn absent_linear(l: &Linear) -> Result<LinearW> {
    Ok(LinearW {
        m: Arc::new(absent_matrix(l.in_features as usize)?),
        bias: None,
        act_a8: false,
    })
}

/// A block outside a stage's model: its shape (heads, RoPE, FFN kind) as the IR says, no
/// weights. Never run (executors check [`Model::present`]).
fn absent_layer(l: &synapse_model::LayerRegion) -> Result<LayerW> {
    let a = &l.attention;
    let empty = |n: &RmsNorm| NormW {
        w: Vec::new(),
        eps: n.eps,
    };
    let ffn = match &l.ffn {
        FfnRegion::Dense(f) => FfnW::Dense {
            gate: absent_linear(&f.gate)?,
            up: absent_linear(&f.up)?,
            down: absent_linear(&f.down)?,
            act: f.activation,
            sub_norm: None,
        },
        FfnRegion::Moe(m) => FfnW::Moe(Box::new(MoeW {
            router: absent_linear(&m.router)?,
            routing: m.routing,
            n_used: m.n_used as usize,
            experts: Vec::new(),
            act: m.activation,
            shared: None,
        })),
    };
    Ok(LayerW {
        attn_norm: empty(&a.norm),
        q: absent_linear(&a.q)?,
        k: absent_linear(&a.k)?,
        v: absent_linear(&a.v)?,
        o: absent_linear(&a.o)?,
        q_norm: None,
        k_norm: None,
        attn_sub_norm: None,
        attn_post_norm: None,
        n_heads: a.n_heads as usize,
        n_kv_heads: a.n_kv_heads as usize,
        head_dim: a.head_dim as usize,
        rope: rope_w(&a.rope, None),
        window: a.window.map(|w| w as usize),
        scale: a.scale,
        clip_qkv: a.clip_qkv,
        ffn_norm: empty(l.ffn.norm()),
        ffn,
        ffn_post_norm: None,
    })
}

fn vector(src: &Source, ir: &ModelIr, id: WeightId) -> Result<Vec<f32>> {
    let w = ir.weight(id);
    let bytes = src.bytes(ir, id)?;
    let bad = |reason: String| RuntimeError::WeightData {
        name: w.name.clone(),
        reason,
    };
    let n = w.n_elements() as usize;
    let el = match w.encoding {
        GgmlType::F32 => 4,
        GgmlType::F16 | GgmlType::BF16 => 2,
        other => return Err(bad(format!("{} is not a float encoding", other.name()))),
    };
    if bytes.len() != n * el {
        return Err(bad(format!("{} bytes for {n} elements", bytes.len())));
    }
    Ok(match w.encoding {
        GgmlType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GgmlType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    })
}

/// Opens a model path and describes it.
fn open_source(path: &Path) -> Result<(Source<'static>, SourceDesc)> {
    let not_model = |reason: String| RuntimeError::NotAModel {
        path: path.display().to_string(),
        reason,
    };
    if path.is_dir() {
        let cfg = std::fs::read_to_string(path.join("config.json"))
            .map_err(|e| not_model(format!("config.json: {e}")))?;
        let m = SafetensorsModel::open(path)?;
        let desc = SourceDesc::from_safetensors(&cfg, &m)?;
        return Ok((Source::Safetensors(Arc::new(m)), desc));
    }
    let mut magic = [0u8; 4];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| not_model(e.to_string()))?;
        f.read_exact(&mut magic)
            .map_err(|e| not_model(format!("reading magic: {e}")))?;
    }
    if &magic == b"GGUF" {
        let f = GgufFile::open(path)?;
        let desc = SourceDesc::from_gguf(&f)?;
        return Ok((Source::Gguf(Arc::new(f), None), desc));
    }
    // A lone .safetensors file: config.json beside it.
    let dir = path.parent().unwrap_or(Path::new("."));
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| not_model(format!("not GGUF, and no config.json beside it: {e}")))?;
    let m = SafetensorsModel::open(path)?;
    let desc = SourceDesc::from_safetensors(&cfg, &m)?;
    Ok((Source::Safetensors(Arc::new(m)), desc))
}
