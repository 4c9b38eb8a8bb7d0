//! [`QuantMatrix`]: a weight matrix in any supported encoding, and the GEMV/GEMM drivers.

use crate::act::{ActKind, quantize_rows};
use crate::buf::AlignedBuf;
use crate::ctx::KernelCtx;
use crate::error::{KernelError, Result};
use crate::kernels::{self, Kernel};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use synapse_codecs::{Codec, EncodingId, GgmlBlock};
use synapse_formats::GgmlType;

/// A weight encoding: a ggml type or one of Synapse's own codecs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// A GGUF / ggml tensor type.
    Ggml(GgmlType),
    /// A Synapse codec (`syn.q4.symmetric.g64.v1`, `syn.ternary.absmean.g64.v1`, ...).
    Codec(EncodingId),
}

#[derive(Clone)]
enum Store {
    Ggml(GgmlType),
    /// BitNet b1.58's W1.58A8 (a `syn.ternary.absmean.tensor.v1` matrix run as trained):
    /// the trits in TQ2_0's code layout without its scales (64 bytes per 256), inputs
    /// quantised per row to 8 bits by absmax with one scale for the whole row, each output
    /// an exact integer sum times `d_a · gamma` (`kernels::ternary_i8`).
    TernaryA8 {
        gamma: f32,
    },
    /// Rows are encoded independently (`row_separable`) except for per-tensor codecs.
    Codec {
        id: EncodingId,
        codec: Arc<dyn Codec>,
        row_separable: bool,
    },
}

/// Weight bytes a matrix can borrow instead of copying (a memory-mapped model file's tensor):
/// `bytes` must return the same slice on every call for the source's lifetime.
pub trait WeightSource: Send + Sync {
    /// The tensor's bytes.
    fn bytes(&self) -> &[u8];

    /// Reads `dst.len()` of the bytes from byte `at` into `dst` without touching `bytes`'
    /// memory (a file-backed source reads the file, so no page of it becomes mapped):
    /// `None` when the source has no such path or the range lies outside it.
    fn read_at(&self, at: usize, dst: &mut [u8]) -> Option<std::io::Result<()>> {
        let _ = (at, dst);
        None
    }

    /// The whole read-only file mapping `bytes` lies in, for a memory-mapped source: the
    /// extent a caller dropping this tensor's mapped pages (`MADV_DONTNEED`) may round out
    /// to without touching other memory. `None` when the source is not a file mapping.
    fn mapping(&self) -> Option<&[u8]> {
        None
    }
}

/// Where a matrix's bytes live.
#[derive(Clone)]
enum Data {
    /// Copied into a 64-byte-aligned buffer.
    Owned(AlignedBuf),
    /// Borrowed from a shared source (zero-copy; the source stays alive with the matrix).
    Shared(Arc<dyn WeightSource>),
}

impl Data {
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            Data::Owned(b) => b.as_bytes(),
            Data::Shared(s) => s.bytes(),
        }
    }

    fn len(&self) -> usize {
        self.as_bytes().len()
    }
}

/// A `rows × cols` weight matrix (row-major, each row `cols` elements in the encoding: a GGUF
/// tensor with `ne0 = cols`, `ne1 = rows`), owned in a 64-byte-aligned buffer or borrowed
/// from a shared source such as a memory-mapped file ([`QuantMatrix::from_ggml_shared`]).
///
/// `y = W·x`: [`QuantMatrix::matvec`] for one activation row, [`QuantMatrix::matmul`] for many.
#[derive(Clone)]
pub struct QuantMatrix {
    store: Store,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: Data,
    /// BF16 weights summed in ggml's order ([`QuantMatrix::with_ggml_bf16`]).
    ggml_bf16: bool,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("encoding", &self.encoding())
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl QuantMatrix {
    /// Builds a matrix from the raw bytes of a ggml-encoded tensor (copied).
    pub fn from_ggml(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let row_bytes = Self::check_ggml(ty, bytes.len(), rows, cols)?;
        Ok(Self {
            store: Store::Ggml(ty),
            rows,
            cols,
            row_bytes,
            data: Data::Owned(AlignedBuf::from_bytes(bytes)),
            ggml_bf16: false,
        })
    }

    /// Builds a matrix over a ggml-encoded tensor's bytes without copying them: the matrix
    /// keeps `src` alive and reads `src.bytes()` (e.g. a memory-mapped GGUF, so the weights
    /// are resident once, as the file's pages).
    pub fn from_ggml_shared(
        ty: GgmlType,
        src: Arc<dyn WeightSource>,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let row_bytes = Self::check_ggml(ty, src.bytes().len(), rows, cols)?;
        Ok(Self {
            store: Store::Ggml(ty),
            rows,
            cols,
            row_bytes,
            data: Data::Shared(src),
            ggml_bf16: false,
        })
    }

    /// Validates a ggml tensor's shape and byte count; returns the bytes per row.
    fn check_ggml(ty: GgmlType, len: usize, rows: usize, cols: usize) -> Result<usize> {
        if kernels::scalar::select(ty).is_none() {
            return Err(KernelError::UnsupportedEncoding(ty.name().to_string()));
        }
        let block = ty.block_size();
        if cols == 0 || !cols.is_multiple_of(block) {
            return Err(KernelError::ColsNotBlockMultiple { ty, cols, block });
        }
        let row_bytes = cols / block * ty.type_size();
        let expected = row_bytes
            .checked_mul(rows)
            .ok_or(KernelError::ShapeOverflow { rows, cols })?;
        if len != expected {
            return Err(KernelError::WeightBytes {
                ty,
                rows,
                cols,
                expected,
                got: len,
            });
        }
        Ok(row_bytes)
    }

    /// Builds a matrix from the bytes of a Synapse codec encoding (`id` such as
    /// `syn.q4.symmetric.g64.v1`) of a row-major `rows × cols` matrix. Every row is decoded once
    /// here, so malformed bytes (reserved codes, bad scales) are refused at load, not mid-matmul.
    pub fn from_codec(id: &str, bytes: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let (store, row_bytes) = Self::check_codec(id, bytes, rows, cols)?;
        Ok(Self {
            store,
            rows,
            cols,
            row_bytes,
            data: Data::Owned(AlignedBuf::from_bytes(bytes)),
            ggml_bf16: false,
        })
    }

    /// [`QuantMatrix::from_codec`] over shared bytes without copying them (e.g. a cached
    /// variant memory-mapped from the object store); the same validation.
    pub fn from_codec_shared(
        id: &str,
        src: Arc<dyn WeightSource>,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let (store, row_bytes) = Self::check_codec(id, src.bytes(), rows, cols)?;
        Ok(Self {
            store,
            rows,
            cols,
            row_bytes,
            data: Data::Shared(src),
            ggml_bf16: false,
        })
    }

    /// This matrix's encoding and shape over `src`, which holds a copy of this matrix's own
    /// bytes (a paged copy, read back from the file this matrix borrows from): only the
    /// length is checked, as for [`QuantMatrix::from_ggml_shared`] — a codec's content was
    /// validated when this matrix was made, and the caller vouches that `src` holds the same
    /// bytes. The W1.58A8 form holds converted codes, not its source's bytes, and has no
    /// copy: an error.
    pub fn over_copy(&self, src: Arc<dyn WeightSource>) -> Result<Self> {
        if matches!(self.store, Store::TernaryA8 { .. }) || src.bytes().len() != self.data.len() {
            return Err(KernelError::BadArgument {
                op: "over_copy",
                msg: format!(
                    "{} bytes for a {}×{} {:?} matrix of {} bytes",
                    src.bytes().len(),
                    self.rows,
                    self.cols,
                    self.encoding(),
                    self.data.len()
                ),
            });
        }
        Ok(Self {
            store: self.store.clone(),
            rows: self.rows,
            cols: self.cols,
            row_bytes: self.row_bytes,
            data: Data::Shared(src),
            ggml_bf16: self.ggml_bf16,
        })
    }

    /// Validates a codec matrix's bytes (length, and every row decodes); returns its store
    /// and bytes per row (0 when rows are not separable).
    fn check_codec(id: &str, bytes: &[u8], rows: usize, cols: usize) -> Result<(Store, usize)> {
        let eid = EncodingId::parse(id)?;
        let codec: Arc<dyn Codec> = Arc::from(synapse_codecs::codec_for(eid));
        let expected = codec.matrix_size(rows, cols)?;
        if bytes.len() != expected {
            return Err(KernelError::BadArgument {
                op: "from_codec",
                msg: format!(
                    "{rows}×{cols} {id} needs {expected} bytes, got {}",
                    bytes.len()
                ),
            });
        }
        if rows == 0 || cols == 0 {
            return Err(KernelError::BadArgument {
                op: "from_codec",
                msg: "empty matrix".into(),
            });
        }
        let one = codec.matrix_size(1, cols)?;
        let row_separable = rows.checked_mul(one) == Some(expected);
        if row_separable {
            for r in bytes.chunks_exact(one) {
                codec.decode(r, cols)?;
            }
        } else {
            codec.decode_matrix(bytes, rows, cols)?;
        }
        // ggml's own blocks (`ggml.q4_0.v1` …) run as the ggml type they are, on its kernels.
        if let EncodingId::Ggml(b) = eid {
            let ty = match b {
                GgmlBlock::Q8_0 => GgmlType::Q8_0,
                GgmlBlock::Q5_1 => GgmlType::Q5_1,
                GgmlBlock::Q5_0 => GgmlType::Q5_0,
                GgmlBlock::Q4_1 => GgmlType::Q4_1,
                GgmlBlock::Q4_0 => GgmlType::Q4_0,
                GgmlBlock::Q6K => GgmlType::Q6_K,
                GgmlBlock::Q5K => GgmlType::Q5_K,
                GgmlBlock::Q4K => GgmlType::Q4_K,
            };
            return Ok((
                Store::Ggml(ty),
                Self::check_ggml(ty, bytes.len(), rows, cols)?,
            ));
        }
        Ok((
            Store::Codec {
                id: eid,
                codec,
                row_separable,
            },
            if row_separable { one } else { 0 },
        ))
    }

    /// A `syn.ternary.absmean.tensor.v1` matrix (`bytes` in that codec's layout, validated as
    /// [`QuantMatrix::from_codec`] does) run as BitNet b1.58's W1.58A8: each input row
    /// quantised to 8 bits by absmax as transformers' `ActQuant` (`a = 127 / max(max|x|,
    /// 1e-5)`, `q = clamp(round_half_even(x·a), −128, 127)`), each output the exact integer
    /// `Σ t·q` times `(1/a) · γ` — the same bits on every kernel path. Where `cols` is not a
    /// multiple of 256 the codec's own path runs (inputs as given). [`QuantMatrix::encoding`]
    /// stays the codec; the bytes held are the codes in TQ2_0's layout without scales, 64
    /// per 256 weights ([`QuantMatrix::raw_bytes`]).
    pub fn from_ternary_a8(bytes: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let id = EncodingId::TernaryTensor.to_string();
        if !cols.is_multiple_of(256) {
            return Self::from_codec(&id, bytes, rows, cols);
        }
        // `check_codec` decodes every code (none may be the reserved 0), so the codes are then
        // read straight from the codec's layout: element `k` in bits `2(k mod 4)` of byte
        // `4 + k/4` as `t + 2`.
        Self::check_codec(&id, bytes, rows, cols)?;
        let gamma = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let code = |k: usize| (bytes[4 + k / 4] >> (2 * (k % 4))) & 3;
        let nb = cols / 256;
        let wbb = kernels::ternary_i8::WB;
        let mut out = vec![0u8; rows * nb * wbb];
        for (blk, ob) in out.chunks_exact_mut(wbb).enumerate() {
            // The trit of element 128h + 32l + m in bits 2l of byte 32h + m (TQ2_0's layout)
            // as the code `t + 1`.
            let base = blk * 256;
            for h in 0..2 {
                for m in 0..32 {
                    let mut q = 0u8;
                    for l in 0..4 {
                        q |= (code(base + 128 * h + 32 * l + m) - 1) << (2 * l);
                    }
                    ob[32 * h + m] = q;
                }
            }
        }
        Ok(Self {
            store: Store::TernaryA8 { gamma },
            rows,
            cols,
            row_bytes: nb * wbb,
            data: Data::Owned(AlignedBuf::from_bytes(&out)),
            ggml_bf16: false,
        })
    }

    /// Builds an f32 matrix from values (row-major `rows × cols`).
    pub fn from_f32(values: &[f32], rows: usize, cols: usize) -> Result<Self> {
        Self::from_ggml(GgmlType::F32, bytemuck::cast_slice(values), rows, cols)
    }

    /// The encoding.
    pub fn encoding(&self) -> Encoding {
        match &self.store {
            Store::Ggml(t) => Encoding::Ggml(*t),
            Store::Codec { id, .. } => Encoding::Codec(*id),
            Store::TernaryA8 { .. } => Encoding::Codec(EncodingId::TernaryTensor),
        }
    }

    /// With `on`, BF16 weights (only those) are summed in ggml's order — the activations
    /// rounded to bf16 as ggml's `fp32_to_bf16` rounds them, `vec_dot_bf16`'s two `vdpbf16ps`
    /// accumulators for one row, tinyBLAS's one for two or more (row count a multiple of 4,
    /// length of 32) — as llama.cpp computes a GGUF's BF16 tensors; without, they meet f32
    /// activations (the checkpoint's own numbers, as transformers runs a BF16 master in
    /// float32).
    pub fn with_ggml_bf16(mut self, on: bool) -> Self {
        self.ggml_bf16 = on && matches!(self.store, Store::Ggml(GgmlType::BF16));
        self
    }

    /// The ggml type, for ggml-encoded matrices.
    pub fn ggml_type(&self) -> Option<GgmlType> {
        match &self.store {
            Store::Ggml(t) => Some(*t),
            Store::Codec { .. } | Store::TernaryA8 { .. } => None,
        }
    }

    /// Whether the matrix quantises its inputs itself (BitNet's W1.58A8 through
    /// [`QuantMatrix::from_ternary_a8`]).
    pub fn quantizes_inputs(&self) -> bool {
        matches!(self.store, Store::TernaryA8 { .. })
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns, the dot-product length K).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Whether the bytes are borrowed from a shared source (a memory map) rather than owned.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.data, Data::Shared(_))
    }

    /// Reads `dst.len()` of the encoded bytes from byte `at` into `dst` through the
    /// borrowed source's own read path (a file read that maps nothing): `None` for an owned
    /// matrix or a source without one.
    pub fn read_raw_at(&self, at: usize, dst: &mut [u8]) -> Option<std::io::Result<()>> {
        match &self.data {
            Data::Shared(s) => s.read_at(at, dst),
            Data::Owned(_) => None,
        }
    }

    /// Bytes of the encoded weights.
    pub fn weight_bytes(&self) -> usize {
        self.data.len()
    }

    /// The whole file mapping a borrowed matrix's bytes lie in ([`WeightSource::mapping`]):
    /// `None` for an owned matrix or a source that is not a file mapping.
    pub fn mapping(&self) -> Option<&[u8]> {
        match &self.data {
            Data::Shared(s) => s.mapping(),
            Data::Owned(_) => None,
        }
    }

    /// All the matrix's bytes in its encoding (what a content hash of the tensor covers).
    pub fn raw_bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    /// The encoded bytes of row `r` (`None` past the end, or for per-tensor codecs whose rows
    /// are not stored separately).
    pub fn row_bytes(&self, r: usize) -> Option<&[u8]> {
        (r < self.rows && self.row_bytes > 0)
            .then(|| &self.data.as_bytes()[r * self.row_bytes..(r + 1) * self.row_bytes])
    }

    /// A matrix of the rows `which` of this one, in that order (copied; an index may repeat),
    /// in the same encoding: row `i` of the result gives, in any float order, the bits row
    /// `which[i]` gives here (a row's dot product never depends on the rows beside it). For
    /// encodings whose rows are stored separately (every ggml type, row-separable codecs,
    /// W1.58A8); others are refused.
    pub fn gather_rows(&self, which: &[u32]) -> Result<Self> {
        if self.row_bytes == 0 {
            return Err(KernelError::BadArgument {
                op: "gather_rows",
                msg: format!("{:?} does not store its rows separately", self.encoding()),
            });
        }
        if which.is_empty() {
            return Err(KernelError::BadArgument {
                op: "gather_rows",
                msg: "no rows".into(),
            });
        }
        let mut out = Vec::with_capacity(which.len() * self.row_bytes);
        for &r in which {
            let row = self.row_bytes(r as usize).ok_or(KernelError::Shape {
                op: "gather_rows",
                what: "row index",
                expected: self.rows,
                got: r as usize,
            })?;
            out.extend_from_slice(row);
        }
        Ok(Self {
            store: self.store.clone(),
            rows: which.len(),
            cols: self.cols,
            row_bytes: self.row_bytes,
            data: Data::Owned(AlignedBuf::from_bytes(&out)),
            ggml_bf16: self.ggml_bf16,
        })
    }

    /// Decodes row `r` to f32 (an embedding lookup). `out.len()` must be `cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        check_len("dequantize_row", "out", self.cols, out.len())?;
        if r >= self.rows {
            return Err(KernelError::Shape {
                op: "dequantize_row",
                what: "row index",
                expected: self.rows,
                got: r,
            });
        }
        let ty = match &self.store {
            Store::Ggml(t) => *t,
            Store::TernaryA8 { gamma } => {
                let row = &self.data.as_bytes()[r * self.row_bytes..(r + 1) * self.row_bytes];
                for (b, ob) in row.chunks_exact(64).zip(out.chunks_exact_mut(256)) {
                    for (j, &byte) in b.iter().enumerate() {
                        for l in 0..4 {
                            let t = ((byte >> (2 * l)) & 3) as i32 - 1;
                            ob[128 * (j / 32) + 32 * l + j % 32] = t as f32 * gamma;
                        }
                    }
                }
                return Ok(());
            }
            Store::Codec {
                codec,
                row_separable: true,
                ..
            } => {
                codec.decode_matrix_into(
                    self.row_bytes(r).unwrap_or_default(),
                    1,
                    self.cols,
                    out,
                )?;
                return Ok(());
            }
            Store::Codec { codec, .. } => {
                let all = codec.decode_matrix(self.data.as_bytes(), self.rows, self.cols)?;
                out.copy_from_slice(&all[r * self.cols..(r + 1) * self.cols]);
                return Ok(());
            }
        };
        let row = self.row_bytes(r).ok_or(KernelError::Shape {
            op: "dequantize_row",
            what: "row index",
            expected: self.rows,
            got: r,
        })?;
        if kernels::decode::decode_row(ty, row, out) {
            Ok(())
        } else {
            Err(KernelError::UnsupportedEncoding(ty.name().to_string()))
        }
    }

    /// `y = W·x` for one activation row: `x.len() == cols`, `y.len() == rows`.
    pub fn matvec(&self, x: &[f32], y: &mut [f32], ctx: &mut KernelCtx) -> Result<()> {
        self.matmul(x, 1, y, ctx)
    }

    /// `Y = X·Wᵀ` for `n` activation rows: `x` is `n × cols` row-major, `y` is `n × rows`
    /// row-major (`y[t·rows + r] = W[r]·x[t]`).
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32], ctx: &mut KernelCtx) -> Result<()> {
        self.matmul_as(x, n, y, n, ctx)
    }

    /// [`Self::matmul_as`] over consecutive runs of rows, each run `(rows, order)` in its own
    /// order: `x` and `y` hold the runs' rows one after another. Adjacent runs whose orders
    /// coincide for this encoding go through one call, so the weights stream once for them.
    pub fn matmul_runs(
        &self,
        x: &[f32],
        runs: &[(usize, OrderClass)],
        y: &mut [f32],
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        let n: usize = runs.iter().map(|r| r.0).sum();
        check_len("matmul_runs", "x", n * self.cols, x.len())?;
        check_len("matmul_runs", "y", n * self.rows, y.len())?;
        let (mut at, mut i) = (0usize, 0usize);
        while i < runs.len() {
            let (mut len, class) = runs[i];
            let key = self.order_key(class);
            let mut j = i + 1;
            while j < runs.len() && self.order_key(runs[j].1) == key {
                len += runs[j].0;
                j += 1;
            }
            self.matmul_as(
                &x[at * self.cols..(at + len) * self.cols],
                len,
                &mut y[at * self.rows..(at + len) * self.rows],
                class.rows(),
                ctx,
            )?;
            at += len;
            i = j;
        }
        Ok(())
    }

    /// [`Self::matmul_runs`] of several matrices over the same input rows (a layer's q, k and
    /// v; an FFN's gate and up): `ys[i]` gets `x·W_iᵀ`. When every matrix takes the few-row
    /// integer kernels for these rows (the 32-block types' `gemv32`, Q4_K/Q6_K's `gemvk`, on
    /// AVX-512 VNNI; 1–5 rows of the 32-block types' `gemv32_avx2` on AVX2), the activations are quantized once per kind and all the matrices' rows
    /// run in one parallel region — one wake-up and one join instead of one per matrix (the
    /// pool's waits were 13% of a SmolLM2 decode step's profile samples). Otherwise one
    /// [`Self::matmul_runs`] per matrix. The same kernel runs each row on the same operands
    /// either way, so the bits are the same (tested).
    pub fn matmul_runs_shared(
        ms: &[&QuantMatrix],
        x: &[f32],
        runs: &[(usize, OrderClass)],
        ys: &mut [&mut [f32]],
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        check_len("matmul_runs_shared", "outputs", ms.len(), ys.len())?;
        // One order class for all the rows (`matmul_runs` then makes one call per matrix).
        #[cfg(target_arch = "x86_64")]
        if let Some(&(_, class)) = runs.first()
            && runs.iter().all(|r| r.1 == class)
            && let n = runs.iter().map(|r| r.0).sum()
            && let Some(plan) = SharedPlan::of(ms, n, class.rows(), ctx.path())
        {
            for (m, y) in ms.iter().zip(ys.iter()) {
                check_len("matmul_runs_shared", "x", n * m.cols, x.len())?;
                check_len("matmul_runs_shared", "y", n * m.rows, y.len())?;
            }
            Self::shared_region(ms, &plan, x, n, ys, ctx);
            return Ok(());
        }
        for (m, y) in ms.iter().zip(ys.iter_mut()) {
            m.matmul_runs(x, runs, y, ctx)?;
        }
        Ok(())
    }

    /// The one parallel region of [`Self::matmul_runs_shared`] (and of [`Self::matmul_as`]'s
    /// few-row kernels, a region of one matrix): matrix `i`'s rows at global rows `start_i..`
    /// (starts on multiples of 8, the chunks' granule, so each matrix's row ranges begin where
    /// its own call's would).
    #[cfg(target_arch = "x86_64")]
    fn shared_region(
        ms: &[&QuantMatrix],
        plan: &SharedPlan,
        x: &[f32],
        n: usize,
        ys: &mut [&mut [f32]],
        ctx: &mut KernelCtx,
    ) {
        use crate::act::BlockQ8x32;
        use kernels::{gemv32, gemv32_avx2, gemvk};
        let cols = ms[0].cols;
        let nb32 = cols / 32;
        let (act32_buf, actk_buf, init_buf, pool) = ctx.parts3();
        // Quantized activations, once per kind.
        if plan.any32 {
            act32_buf.set_len(n * ActKind::Q8x32.row_bytes(cols));
            quantize_rows(ActKind::Q8x32, x, cols, act32_buf.as_bytes_mut());
        }
        if plan.anyk {
            let q8k = n * ActKind::Q8K.row_bytes(cols);
            actk_buf.set_len(if plan.tq2 {
                kernels::prepared_len(q8k, n * cols / 256)
            } else {
                q8k
            });
            quantize_rows(ActKind::Q8K, x, cols, &mut actk_buf.as_bytes_mut()[..q8k]);
            if plan.tq2 {
                kernels::prepare_tq2(actk_buf.as_bytes_mut(), n * cols / 256);
            }
        }
        let act32: &[BlockQ8x32] = if plan.any32 {
            bytemuck::cast_slice(act32_buf.as_bytes())
        } else {
            &[]
        };
        let actk: &[u8] = if plan.anyk { actk_buf.as_bytes() } else { &[] };
        // The activation blocks as the gemv32 kernel reads them (any of its types).
        let (recs, svs, inits): (&[gemv32::ActRec], &[f32], &[i32]) =
            if plan.kinds[..ms.len()].contains(&FewRowKernel::Gemv32) {
                let (nr, ns, ni) = gemv32::prepared_len(n, nb32);
                let rb = nr * std::mem::size_of::<gemv32::ActRec>();
                init_buf.set_len(rb + 4 * ns + 4 * ni);
                let (r, rest) = init_buf.as_bytes_mut().split_at_mut(rb);
                let (sv, i) = rest.split_at_mut(4 * ns);
                let (r, sv, i): (&mut [gemv32::ActRec], &mut [f32], &mut [i32]) = (
                    bytemuck::cast_slice_mut(r),
                    bytemuck::cast_slice_mut(sv),
                    bytemuck::cast_slice_mut(i),
                );
                // SAFETY: the plan takes Gemv32 only on AVX-512 VNNI (see below); the
                // slices as prepared_len says.
                unsafe { gemv32::prepare(act32, nb32, r, sv, i) };
                (r, sv, i)
            } else if plan.kinds[..ms.len()].contains(&FewRowKernel::Gemv32Avx2) {
                // The lane starts of the biased types (Q5_0, Q4_0) among the matrices.
                init_buf.set_len(4 * gemv32_avx2::init_len(n * nb32));
                let i: &mut [i32] = bytemuck::cast_slice_mut(init_buf.as_bytes_mut());
                gemv32_avx2::prepare(act32, &plan.tys[..ms.len()], i);
                (&[], &[], i)
            } else {
                (&[], &[], &[])
            };
        let mut starts = [0usize; MAX_SHARED];
        let mut total = 0usize;
        for (i, m) in ms.iter().enumerate() {
            starts[i] = total.next_multiple_of(8);
            total = starts[i] + m.rows;
        }
        let yps: [SyncPtr; MAX_SHARED] = std::array::from_fn(|i| {
            SyncPtr(
                ys.get_mut(i)
                    .map_or(std::ptr::null_mut(), |y| y.as_mut_ptr()),
            )
        });
        let flops: usize = ms.iter().map(|m| 2 * m.rows * cols * n).sum();
        let tiled_order = plan.order_rows >= kernels::MANY_ROWS;
        pool.run_rows(total, 8, flops, &|r0, r1| {
            for (i, m) in ms.iter().enumerate() {
                let (a, b) = (r0.max(starts[i]), r1.min(starts[i] + m.rows));
                if a >= b {
                    continue;
                }
                let (a, b) = (a - starts[i], b - starts[i]);
                let (w, rb, rows) = (m.data.as_bytes(), m.row_bytes, m.rows);
                let yp = yps[i];
                // SAFETY: the plan admits each kernel only on its path (Gemv32/Gemvk on
                // AVX-512 VNNI, Gemv32Avx2 on AVX2 and AVX-VNNI), which KernelCtx holds only
                // when the CPU supports it; the activations hold n rows of this kind;
                // chunks write disjoint rows of each matrix's outputs.
                unsafe {
                    match plan.kinds[i] {
                        FewRowKernel::Gemv32 => gemv32::rows(
                            plan.tys[i],
                            plan.order_rows < 2,
                            w,
                            rb,
                            nb32,
                            act32,
                            recs,
                            svs,
                            inits,
                            yp.get(),
                            rows,
                            a,
                            b,
                        ),
                        FewRowKernel::Gemv32Avx2 => gemv32_avx2::rows(
                            plan.tys[i],
                            w,
                            rb,
                            nb32,
                            act32,
                            inits,
                            yp.get(),
                            rows,
                            a,
                            b,
                        ),
                        FewRowKernel::Gemvk => gemvk::rows(
                            plan.tys[i],
                            w,
                            rb,
                            cols / 256,
                            actk,
                            n,
                            tiled_order,
                            yp.get(),
                            rows,
                            a,
                            b,
                        ),
                    }
                }
            }
        });
    }

    /// Order classes that sum this encoding's outputs alike map to the same key.
    fn order_key(&self, class: OrderClass) -> usize {
        let ty = match &self.store {
            Store::Ggml(t) => *t,
            Store::Codec { .. } | Store::TernaryA8 { .. } => return 0,
        };
        match ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::IQ4_NL => (class != OrderClass::One) as usize,
            GgmlType::BF16 if self.ggml_bf16 => (class != OrderClass::One) as usize,
            GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::IQ4_XS
            | GgmlType::IQ2_XXS
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ1_S
            | GgmlType::IQ1_M => (class == OrderClass::Many) as usize,
            _ => 0,
        }
    }

    /// [`Self::matmul`] with every output summed in the float order ggml uses for a call of
    /// `order_rows` activation rows, whatever `n` is: each row's bits then equal those of the
    /// row inside an `order_rows`-row call. This is how a batch of several sessions keeps each
    /// session's own order (batch invariance). See [`order_class`] for which counts share an
    /// order.
    pub fn matmul_as(
        &self,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        order_rows: usize,
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        let order_rows = order_rows.max(1);
        check_len("matmul", "x", n * self.cols, x.len())?;
        check_len("matmul", "y", n * self.rows, y.len())?;
        if n == 0 || self.rows == 0 {
            return Ok(());
        }
        let ty = match &self.store {
            Store::Ggml(t) => *t,
            Store::TernaryA8 { gamma } => return self.ternary_a8(*gamma, x, n, y, ctx),
            Store::Codec {
                id: EncodingId::Symmetric { bits, group: 64 },
                ..
            } if self.cols.is_multiple_of(kernels::codec_sym::GROUP) => {
                return self.codec_sym(*bits, false, x, n, y, ctx);
            }
            Store::Codec {
                id: EncodingId::Asymmetric { bits, group: 64 },
                ..
            } if (2..=8).contains(bits) && self.cols.is_multiple_of(kernels::codec_sym::GROUP) => {
                return self.codec_sym(*bits, true, x, n, y, ctx);
            }
            // Ternary g64 groups are laid out exactly as 2-bit symmetric ones (`u = q + 2`).
            Store::Codec {
                id: EncodingId::TernaryGroup { group: 64 },
                ..
            } if self.cols.is_multiple_of(kernels::codec_sym::GROUP) => {
                return self.codec_sym(2, false, x, n, y, ctx);
            }
            Store::Codec {
                codec,
                row_separable,
                ..
            } => return self.codec_matmul(&**codec, *row_separable, x, n, y, ctx),
        };
        let mut k = if self.ggml_bf16 {
            kernels::bf16_kernel()
        } else {
            kernels::select(ty, ctx.path())
                .ok_or_else(|| KernelError::UnsupportedEncoding(ty.name().to_string()))?
        };
        // llamafile's f32 GEMM takes only weights whose row count is a multiple of 4
        // (`tinyBLAS::matmul`); ggml runs the others (a one-row gate such as Qwen2-MoE's
        // shared-expert gate) through `vec_dot` whatever the number of activation rows.
        let many = k.many.filter(|&(from, _)| {
            order_rows >= from
                && (!matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
                    || self.rows.is_multiple_of(4))
        });
        if let Some((_, dot)) = many {
            k.dot = dot;
            k.dot4 = k.many4;
            k.dot2 = None;
        }
        // Float weights with two or more activation rows: register tiles (512-bit on the
        // AVX-512 path, 256-bit on AVX2), each output in the order `k.dot` sums it.
        #[cfg(target_arch = "x86_64")]
        if n >= 2
            && ctx.path() >= crate::dispatch::KernelPath::Avx2
            && (!self.ggml_bf16 || ctx.path() == crate::dispatch::KernelPath::Avx512Vnni)
            && let Some(order) =
                kernels::ftile::Order::of(ty, many.is_some(), self.cols, self.ggml_bf16)
        {
            return self.ftile_matmul(ty, order, k.act, x, n, y, ctx);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(plan) = SharedPlan::of(&[self], n, order_rows, ctx.path()) {
            Self::shared_region(&[self], &plan, x, n, &mut [y], ctx);
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        let tiled_order = order_rows >= kernels::MANY_ROWS;
        #[cfg(target_arch = "x86_64")]
        // The tiled GEMM from 8 rows for Q5_K (half a 16-row group; Q4_K/Q6_K below 32 rows
        // took the few-row kernel above), from a full group for the 32-block types (at 8 rows
        // their per-row kernels were as fast or faster); same bits either way. IQ4_NL's
        // one-row order is not its many-row one: only calls in the latter tile.
        if ctx.path() == crate::dispatch::KernelPath::Avx512Vnni
            && ((n >= kernels::tiled::min_rows(ty) && tiled_order && kernels::tiled::supports(ty))
                || (n >= kernels::tiled::G
                    && kernels::tiled::supports32(ty)
                    && (ty != GgmlType::IQ4_NL || order_rows >= 2)))
        {
            return self.tiled_matmul(ty, x, n, y, ctx);
        }
        #[cfg(target_arch = "x86_64")]
        // The 32-block types' many-row GEMM off AVX-512 (same bits as the per-row kernels;
        // IQ4_NL only for calls in its many-row order).
        if kernels::tile32::on(ctx.path())
            && kernels::tile32::takes(ty, n)
            && kernels::tile32::Codes::of(ty).is_some()
            && (ty != GgmlType::IQ4_NL || order_rows >= 2)
        {
            return self.tile32_matmul(ty, x, n, y, ctx);
        }
        let (act_scratch, pool) = ctx.parts();
        let act: &[u8] = if k.act == ActKind::F32 {
            bytemuck::cast_slice(x)
        } else {
            let arb = k.act.row_bytes(self.cols);
            act_scratch.set_len(n * arb);
            quantize_rows(k.act, x, self.cols, act_scratch.as_bytes_mut());
            act_scratch.as_bytes()
        };
        let job = Job {
            m: self,
            ty,
            k,
            act,
            arb: k.act.row_bytes(self.cols),
            n,
            y: SyncPtr(y.as_mut_ptr()),
        };
        let flops = 2 * self.rows * self.cols * n;
        pool.run_rows(self.rows, 8, flops, &|r0, r1| job.rows(r0, r1));
        Ok(())
    }

    /// F32/F16/BF16 weights with several activation rows on x86 (`kernels::ftile`).
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn ftile_matmul(
        &self,
        ty: GgmlType,
        order: kernels::ftile::Order,
        act: ActKind,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        let path = ctx.path();
        let (act_scratch, pool) = ctx.parts();
        // F16 weights: the activations rounded to f16 values, kept as f32 (see `ftile`);
        // BF16 in ggml's order: bf16 rows.
        let a: &[u8] = if act == ActKind::F32 {
            bytemuck::cast_slice(x)
        } else if act == ActKind::Bf16 {
            act_scratch.set_len(n * act.row_bytes(self.cols));
            quantize_rows(act, x, self.cols, act_scratch.as_bytes_mut());
            act_scratch.as_bytes()
        } else {
            act_scratch.set_len(n * self.cols * 4);
            kernels::ftile::round_f16(x, bytemuck::cast_slice_mut(act_scratch.as_bytes_mut()));
            act_scratch.as_bytes()
        };
        let w = self.data.as_bytes();
        let (rows, cols) = (self.rows, self.cols);
        let yp = SyncPtr(y.as_mut_ptr());
        let zmm = path == crate::dispatch::KernelPath::Avx512Vnni;
        pool.run_rows(rows, 8, 2 * rows * cols * n, &|r0, r1| {
            // SAFETY: the context holds an x86 path only when the CPU has it (AVX2, FMA and
            // F16C from the AVX2 path up; AVX-512 F, BW, VL, VNNI on its own); `w` holds the
            // rows, `a` the `n` activation rows in the kernel's format; chunks write disjoint
            // outputs.
            unsafe { kernels::ftile::rows(zmm, ty, order, w, cols, a, n, yp.get(), rows, r0, r1) };
        });
        Ok(())
    }

    /// BitNet's W1.58A8 ([`Self::from_ternary_a8`]): the rows quantised to 8 bits with one
    /// scale each, re-laid out once, then `kernels::ternary_i8` over chunks of weight rows.
    fn ternary_a8(
        &self,
        gamma: f32,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        let path = ctx.path();
        let (act_scratch, pool) = ctx.parts();
        let nb = self.cols / 256;
        let q8k = n * ActKind::Q8KRow.row_bytes(self.cols);
        act_scratch.set_len(kernels::prepared_len(q8k, n * nb));
        quantize_rows(
            ActKind::Q8KRow,
            x,
            self.cols,
            &mut act_scratch.as_bytes_mut()[..q8k],
        );
        kernels::prepare_tq2(act_scratch.as_bytes_mut(), n * nb);
        let a = act_scratch.as_bytes();
        let w = self.data.as_bytes();
        let yp = SyncPtr(y.as_mut_ptr());
        let rows = self.rows;
        pool.run_rows(rows, 8, 2 * rows * self.cols * n, &|r0, r1| {
            // SAFETY: `path` is the context's, which it holds only when the CPU supports it;
            // `a` holds n·nb prepared blocks, `w` the rows; chunks write disjoint outputs.
            unsafe { kernels::ternary_i8::rows(path, w, nb, a, n, gamma, yp.get(), rows, r0, r1) };
        });
        Ok(())
    }
}

/// Packs one group of quantized activation rows: `(rows' bytes, row count, out)`.
#[cfg(target_arch = "x86_64")]
type PackGroup<'a> = dyn Fn(&[u8], usize, &mut [u8]) + Sync + 'a;

/// Quantizes `n` activation rows of `x` to `kind` (into `act`) and packs them `group` rows
/// at a time with `pack_group(quantized rows, row count, out)` (into `pack`, `group_bytes` a
/// group), the groups spread over the pool (they are independent).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn quantize_packed(
    kind: ActKind,
    x: &[f32],
    n: usize,
    cols: usize,
    group: usize,
    group_bytes: usize,
    act: &mut AlignedBuf,
    pack: &mut AlignedBuf,
    pool: &crate::ctx::Pool,
    pack_group: &PackGroup<'_>,
) {
    let (arb, groups) = (kind.row_bytes(cols), n.div_ceil(group));
    act.set_len(n * arb);
    pack.set_len(groups * group_bytes);
    let (ap, pp) = (
        SyncBytes(act.as_bytes_mut().as_mut_ptr()),
        SyncBytes(pack.as_bytes_mut().as_mut_ptr()),
    );
    pool.run_rows(groups, 1, 64 * n * cols, &|g0, g1| {
        let (t0, t1) = (g0 * group, (g1 * group).min(n));
        // SAFETY: chunks own disjoint groups: activation rows t0..t1 and packed groups g0..g1
        // of the buffers sized above.
        let (a, p) = unsafe {
            (
                std::slice::from_raw_parts_mut(ap.get().add(t0 * arb), (t1 - t0) * arb),
                std::slice::from_raw_parts_mut(
                    pp.get().add(g0 * group_bytes),
                    (g1 - g0) * group_bytes,
                ),
            )
        };
        quantize_rows(kind, &x[t0 * cols..t1 * cols], cols, a);
        pack_group(a, t1 - t0, p);
    });
}

impl QuantMatrix {
    /// The 32-block types with many activation rows on AVX2 and AVX-VNNI: a tile of weight
    /// rows unpacked once per call against groups of eight packed activation rows (see
    /// `kernels::tile32`).
    #[cfg(target_arch = "x86_64")]
    fn tile32_matmul(
        &self,
        ty: GgmlType,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        use crate::act::BlockQ8x32;
        use kernels::tile32;
        let path = ctx.path();
        let (act_scratch, pack, pool) = ctx.parts2();
        let (cols, nb) = (self.cols, self.cols / 32);
        let pk = nb * tile32::PACK8;
        quantize_packed(
            ActKind::Q8x32,
            x,
            n,
            cols,
            8,
            pk,
            act_scratch,
            pack,
            pool,
            &|a, t, p| tile32::pack(bytemuck::cast_slice::<u8, BlockQ8x32>(a), t, nb, p),
        );
        let packed = pack.as_bytes();
        let yp = SyncPtr(y.as_mut_ptr());
        let (w, rb, rows) = (self.data.as_bytes(), self.row_bytes, self.rows);
        pool.run_rows(rows, 8, 2 * rows * cols * n, &|r0, r1| {
            // SAFETY: `path` is the context's (held only when the CPU supports it) and
            // `tile32::on` it; `ty` is a tile32 type (checked by the caller); `packed` holds
            // the n packed rows; chunks write disjoint rows of `y`.
            unsafe { tile32::rows(path, ty, w, rb, nb, packed, n, rows, yp.get(), r0, r1) };
        });
        Ok(())
    }

    /// K-quants with many activation rows on AVX-512 VNNI: ggml's tiled order, 16 rows per
    /// register (see `kernels::tiled`).
    #[cfg(target_arch = "x86_64")]
    fn tiled_matmul(
        &self,
        ty: GgmlType,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        use crate::act::{BlockQ8K, BlockQ8x32};
        use kernels::tiled;
        let k32 = tiled::supports32(ty);
        let (kind, nb, pk) = if k32 {
            (ActKind::Q8x32, self.cols / 32, tiled::PACK32)
        } else {
            (ActKind::Q8K, self.cols / 256, tiled::PACK)
        };
        let (act_scratch, pack, pool) = ctx.parts2();
        let cols = self.cols;
        quantize_packed(
            kind,
            x,
            n,
            cols,
            tiled::G,
            nb * pk,
            act_scratch,
            pack,
            pool,
            &|a, t, p| {
                if k32 {
                    let blocks: &[BlockQ8x32] = bytemuck::cast_slice(a);
                    tiled::pack32(blocks, t, nb, tiled::bias32(ty), p);
                } else {
                    let blocks: &[BlockQ8K] = bytemuck::cast_slice(a);
                    tiled::pack(blocks, t, nb, p);
                }
            },
        );
        let packed = pack.as_bytes();
        let yp = SyncPtr(y.as_mut_ptr());
        let (w, rb, rows) = (self.data.as_bytes(), self.row_bytes, self.rows);
        pool.run_rows(rows, 4, 2 * rows * self.cols * n, &|r0, r1| {
            // SAFETY: this path is taken only on Avx512Vnni, which KernelCtx holds only when
            // the CPU supports it; buffers are sized above; chunks write disjoint rows.
            unsafe {
                if k32 {
                    tiled::rows32(ty, w, rb, nb, packed, n, rows, yp.get(), r0, r1)
                } else {
                    tiled::rows(ty, w, rb, nb, packed, n, rows, yp.get(), r0, r1)
                }
            };
        });
        Ok(())
    }

    /// A symmetric (or, `asym`, asymmetric) g64 codec matrix through the integer path
    /// (`kernels::codec_sym`): the activations quantized once as Q8_0 blocks, AVX-512
    /// VBMI/VNNI, AVX2 or NEON where the CPU has them, the bit-identical scalar path elsewhere.
    fn codec_sym(
        &self,
        bits: u32,
        asym: bool,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        use crate::act::BlockQ8x32;
        use kernels::codec_sym;
        let (rows, cols) = (self.rows, self.cols);
        let ng = cols / codec_sym::GROUP;
        // By the context's path (the forced reference path runs the scalar kernel; every path
        // computes the same bits).
        // AVX2 (and AVX-VNNI, and AVX-512 without VBMI) run `rows_avx2`, or for 2- to 4-bit
        // codes `codec_lanes_avx2` (below).
        #[cfg(target_arch = "x86_64")]
        let on_avx2 = {
            use crate::dispatch::KernelPath;
            match ctx.path() {
                KernelPath::Avx512Vnni => !codec_sym::has_avx512(),
                p => matches!(p, KernelPath::AvxVnni | KernelPath::Avx2),
            }
        };
        #[cfg(target_arch = "x86_64")]
        let kernel: codec_sym::RowsFn = {
            use crate::dispatch::KernelPath;
            match (ctx.path(), asym) {
                (KernelPath::Avx512Vnni, false) if codec_sym::has_avx512() => {
                    codec_sym::rows_avx512::<false>
                }
                (KernelPath::Avx512Vnni, true) if codec_sym::has_avx512() => {
                    codec_sym::rows_avx512::<true>
                }
                (_, false) if on_avx2 => codec_sym::rows_avx2::<false>,
                (_, true) if on_avx2 => codec_sym::rows_avx2::<true>,
                (_, false) => codec_sym::rows_scalar::<false>,
                (_, true) => codec_sym::rows_scalar::<true>,
            }
        };
        #[cfg(target_arch = "aarch64")]
        let kernel: codec_sym::RowsFn = match (ctx.path(), asym) {
            (crate::dispatch::KernelPath::Neon, false) => codec_sym::rows_neon::<false>,
            (crate::dispatch::KernelPath::Neon, true) => codec_sym::rows_neon::<true>,
            (_, false) => codec_sym::rows_scalar::<false>,
            (_, true) => codec_sym::rows_scalar::<true>,
        };
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let kernel: codec_sym::RowsFn = if asym {
            codec_sym::rows_scalar::<true>
        } else {
            codec_sym::rows_scalar::<false>
        };
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
        let path = ctx.path();
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
        let (act_scratch, pack, recs_buf, pool) = ctx.parts3();
        act_scratch.set_len(n * ActKind::Q8x32.row_bytes(cols));
        quantize_rows(ActKind::Q8x32, x, cols, act_scratch.as_bytes_mut());
        let act: &[BlockQ8x32] = bytemuck::cast_slice(act_scratch.as_bytes());
        // 2-, 3- and 4-bit codes on AVX2 (and AVX-512 CPUs without VBMI): each lane's codes in i16
        // pairs against activations prepared in the same order, the same bits in fewer
        // instructions (`kernels::codec_lanes_avx2`).
        #[cfg(target_arch = "x86_64")]
        if on_avx2 && kernels::codec_lanes_avx2::supports(bits) {
            use kernels::codec_lanes_avx2::{Rec, records, rows as lane_rows};
            recs_buf.set_len(n * ng * std::mem::size_of::<Rec>());
            let recs: &mut [Rec] = bytemuck::cast_slice_mut(recs_buf.as_bytes_mut());
            records(bits, act, asym, recs);
            let recs: &[Rec] = recs;
            // The records hold the lane starts and scales; the asymmetric codes' minimum
            // sums apart.
            pack.set_len(if asym { n * ng * 4 } else { 0 });
            let msum: &mut [f32] = bytemuck::cast_slice_mut(pack.as_bytes_mut());
            codec_sym::minimum_sums(act, msum);
            let msum: &[f32] = msum;
            let (w, rb) = (self.data.as_bytes(), self.row_bytes);
            let yp = SyncPtr(y.as_mut_ptr());
            let run = match (bits, asym) {
                (4, false) => lane_rows::<4, false>,
                (4, true) => lane_rows::<4, true>,
                (3, false) => lane_rows::<3, false>,
                (3, true) => lane_rows::<3, true>,
                (_, false) => lane_rows::<2, false>,
                (_, true) => lane_rows::<2, true>,
            };
            pool.run_rows(rows, 8, 2 * rows * cols * n, &|r0, r1| {
                // SAFETY: rows were validated as `ng` groups of this codec at construction;
                // the records cover the n rows; chunks write disjoint rows; AVX2, FMA and
                // F16C are there (the AVX2 path was chosen for this CPU).
                unsafe { run(w, rb, ng, recs, msum, n, yp.get(), rows, r0, r1) };
            });
            return Ok(());
        }
        let lanes = n * ng * 16;
        let msums = if asym { n * ng } else { 0 };
        pack.set_len((2 * lanes + msums) * 4);
        let (init, rest) =
            bytemuck::cast_slice_mut::<u8, i32>(pack.as_bytes_mut()).split_at_mut(lanes);
        let (da, msum) = bytemuck::cast_slice_mut::<i32, f32>(rest).split_at_mut(lanes);
        codec_sym::prepare(bits, asym, act, init, da, msum);
        let (init, da, msum): (&[i32], &[f32], &[f32]) = (init, da, msum);
        let yp = SyncPtr(y.as_mut_ptr());
        let (w, rb) = (self.data.as_bytes(), self.row_bytes);
        // Several activation rows on AVX-512: the records kernel (a pair of weight rows per
        // pass over up to 8 activation rows, the same bits; kbench, one thread, 2048 × 2048:
        // 8 rows `q4` 662 → 476 µs, `q8` 708 → 493 µs, 2 rows `q4` 183 → 138 µs against four
        // activation rows per weight row; the asymmetric codes joined on 2026-12-06).
        #[cfg(target_arch = "x86_64")]
        if n >= 2 && path == crate::dispatch::KernelPath::Avx512Vnni && codec_sym::has_avx512() {
            let rec_bytes = n * ng * std::mem::size_of::<kernels::gemv32::ActRec>();
            recs_buf.set_len(rec_bytes + if asym { n * ng * 4 } else { 0 });
            let (recs, sums) = recs_buf.as_bytes_mut().split_at_mut(rec_bytes);
            let recs: &mut [kernels::gemv32::ActRec] = bytemuck::cast_slice_mut(recs);
            let sums: &mut [f32] = bytemuck::cast_slice_mut(sums);
            codec_sym::records(act, ng, init, da, msum, asym, recs, sums);
            let (recs, msum): (&[kernels::gemv32::ActRec], &[f32]) = (recs, sums);
            let run = if asym {
                codec_sym::rows_records::<true>
            } else {
                codec_sym::rows_records::<false>
            };
            pool.run_rows(rows, 8, 2 * rows * cols * n, &|r0, r1| {
                // SAFETY: as below; the records (and sums) cover the n rows.
                unsafe { run(bits, w, rb, ng, recs, msum, n, yp.get(), rows, r0, r1) };
            });
            return Ok(());
        }
        pool.run_rows(rows, 8, 2 * rows * cols * n, &|r0, r1| {
            // SAFETY: rows were validated as `ng` groups of this codec at construction; the
            // lane arrays hold n·ng·16 entries; chunks write disjoint rows; the SIMD path only
            // where the CPU has its features.
            unsafe { kernel(bits, w, rb, ng, act, init, da, msum, yp.get(), rows, r0, r1) };
        });
        Ok(())
    }

    /// Synapse codecs run through the codec's own `linear` (its scalar, allocation-free dot),
    /// row-chunked over the pool when rows are encoded independently.
    fn codec_matmul(
        &self,
        codec: &dyn Codec,
        row_separable: bool,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        ctx: &mut KernelCtx,
    ) -> Result<()> {
        let (rows, cols) = (self.rows, self.cols);
        if !row_separable {
            for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
                codec.linear(self.data.as_bytes(), rows, xt, yt)?;
            }
            return Ok(());
        }
        let (_, pool) = ctx.parts();
        let yp = SyncPtr(y.as_mut_ptr());
        let failed = AtomicBool::new(false);
        let rb = self.row_bytes;
        let data = self.data.as_bytes();
        pool.run_rows(rows, 8, 2 * rows * cols * n, &|r0, r1| {
            for t in 0..n {
                // SAFETY: this chunk alone writes y[t·rows + r0 .. t·rows + r1].
                let yt =
                    unsafe { std::slice::from_raw_parts_mut(yp.get().add(t * rows + r0), r1 - r0) };
                if codec
                    .linear(
                        &data[r0 * rb..r1 * rb],
                        r1 - r0,
                        &x[t * cols..(t + 1) * cols],
                        yt,
                    )
                    .is_err()
                {
                    failed.store(true, Ordering::Relaxed);
                }
            }
        });
        if failed.load(Ordering::Relaxed) {
            // Rows were validated at construction; report rather than return garbage.
            return Err(KernelError::BadArgument {
                op: "matmul",
                msg: "codec rejected validated rows".into(),
            });
        }
        Ok(())
    }
}

/// A byte buffer's base pointer, shared by chunks that write disjoint ranges of it.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct SyncBytes(*mut u8);
#[cfg(target_arch = "x86_64")]
impl SyncBytes {
    /// By-value access, so closures capture the whole (Sync) wrapper, not the raw field.
    fn get(self) -> *mut u8 {
        self.0
    }
}
// SAFETY: chunks write disjoint byte ranges (one range per group of activation rows).
#[cfg(target_arch = "x86_64")]
unsafe impl Send for SyncBytes {}
// SAFETY: as above.
#[cfg(target_arch = "x86_64")]
unsafe impl Sync for SyncBytes {}

/// Most matrices one [`QuantMatrix::shared_region`] takes.
#[cfg(target_arch = "x86_64")]
const MAX_SHARED: usize = 4;

/// The few-row integer kernels (AVX-512 VNNI's, and AVX2's for the 32-block types), run
/// through [`QuantMatrix::shared_region`].
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FewRowKernel {
    /// `kernels::gemv32`: the 32-block types below the tiled GEMM's row counts.
    Gemv32,
    /// `kernels::gemvk`: Q4_K/Q6_K below 32 rows or outside the tiled order; TQ2_0 always.
    Gemvk,
    /// `kernels::gemv32_avx2`: the 32-block types at 1–5 rows on AVX2 and AVX-VNNI.
    Gemv32Avx2,
}

#[cfg(target_arch = "x86_64")]
impl FewRowKernel {
    /// The few-row kernel `ty` runs on for `n` rows of `cols` (a matrix of `bytes`) summed in the
    /// order of an `order_rows`-row call, if any: [`QuantMatrix::matmul_as`]'s one choice.
    fn of(
        ty: GgmlType,
        n: usize,
        cols: usize,
        order_rows: usize,
        bytes: usize,
        path: crate::dispatch::KernelPath,
    ) -> Option<Self> {
        use kernels::{gemv32, gemv32_avx2, gemvk};
        if matches!(
            path,
            crate::dispatch::KernelPath::Avx2 | crate::dispatch::KernelPath::AvxVnni
        ) {
            return gemv32_avx2::takes(ty, n, bytes).then_some(Self::Gemv32Avx2);
        }
        if path != crate::dispatch::KernelPath::Avx512Vnni {
            return None;
        }
        if gemv32::takes(n, cols) && gemv32::supports(ty) {
            return Some(Self::Gemv32);
        }
        // TQ2_0 at every row count: ggml has one order for it, and the row-pair kernel
        // measured 1.5–1.9× the per-row tiles at 32 and 128 rows (kbench, 2 threads).
        let tiled_order = order_rows >= kernels::MANY_ROWS;
        ((n < gemvk::UNTIL || !tiled_order || ty == GgmlType::TQ2_0) && gemvk::supports(ty))
            .then_some(Self::Gemvk)
    }
}

/// A region's plan: each matrix's type and few-row kernel ([`FewRowKernel::of`]).
#[cfg(target_arch = "x86_64")]
struct SharedPlan {
    tys: [GgmlType; MAX_SHARED],
    kinds: [FewRowKernel; MAX_SHARED],
    any32: bool,
    anyk: bool,
    /// A TQ2_0 matrix (alone in its region: its Q8_K activations are re-laid out for it).
    tq2: bool,
    order_rows: usize,
}

#[cfg(target_arch = "x86_64")]
impl SharedPlan {
    /// The plan for `n` rows in the order of `order_rows`-row calls, or None when some
    /// matrix takes another path (then each runs its own call).
    fn of(
        ms: &[&QuantMatrix],
        n: usize,
        order_rows: usize,
        path: crate::dispatch::KernelPath,
    ) -> Option<Self> {
        let cols = ms.first()?.cols;
        if ms.len() > MAX_SHARED || n == 0 {
            return None;
        }
        let order_rows = order_rows.max(1);
        let mut plan = SharedPlan {
            tys: [GgmlType::F32; MAX_SHARED],
            kinds: [FewRowKernel::Gemv32; MAX_SHARED],
            any32: false,
            anyk: false,
            tq2: false,
            order_rows,
        };
        for (i, m) in ms.iter().enumerate() {
            let Store::Ggml(ty) = m.store else {
                return None;
            };
            if m.cols != cols || m.rows == 0 || (ty == GgmlType::TQ2_0 && ms.len() > 1) {
                return None;
            }
            let kind = FewRowKernel::of(ty, n, cols, order_rows, m.data.as_bytes().len(), path)?;
            plan.any32 |= matches!(kind, FewRowKernel::Gemv32 | FewRowKernel::Gemv32Avx2);
            plan.anyk |= kind == FewRowKernel::Gemvk;
            plan.tq2 |= ty == GgmlType::TQ2_0;
            plan.tys[i] = ty;
            plan.kinds[i] = kind;
        }
        Some(plan)
    }
}

/// An output pointer the pool's workers share; each writes only its own chunk's elements.
pub(crate) struct SyncPtr<T = f32>(pub(crate) *mut T);
impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}
impl<T> SyncPtr<T> {
    /// By-value access, so closures capture the whole (Sync) wrapper, not the raw field.
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: workers write disjoint output elements (each output row index belongs to one chunk).
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SyncPtr<T> {}

struct Job<'a> {
    m: &'a QuantMatrix,
    ty: GgmlType,
    k: Kernel,
    act: &'a [u8],
    arb: usize,
    n: usize,
    y: SyncPtr,
}

impl Job<'_> {
    /// Output rows `r0..r1` for every activation row.
    fn rows(&self, r0: usize, r1: usize) {
        let m = self.m;
        let nb = m.cols / self.ty.block_size();
        let w = m.data.as_bytes();
        debug_assert!(r1 <= m.rows && self.act.len() >= self.n * self.arb);
        // Activation rows in blocks of ~32 KB (a multiple of four rows), each block swept by
        // every weight row of the chunk while it is in L1: otherwise every weight row streamed
        // all of a prompt's activations from L2 again. Each output is one kernel call's either
        // way (the same bits).
        let tb = if self.n > 4 {
            (((32 << 10) / self.arb.max(1)) / 4 * 4).max(4)
        } else {
            self.n
        };
        for tb0 in (0..self.n).step_by(tb.max(1)) {
            let tb1 = (tb0 + tb).min(self.n);
            self.rows_block(w, nb, r0, r1, tb0, tb1);
        }
    }

    /// [`Job::rows`] for the activation rows `t0..t1`.
    fn rows_block(&self, w: &[u8], nb: usize, r0: usize, r1: usize, t0: usize, t1: usize) {
        let m = self.m;
        for r in r0..r1 {
            let wr = &w[r * m.row_bytes..(r + 1) * m.row_bytes];
            let mut t = t0;
            if let Some(dot4) = self.k.dot4 {
                while t + 4 <= t1 {
                    let a = &self.act[t * self.arb..(t + 4) * self.arb];
                    // SAFETY: as below, for the four activation rows t..t+4 (all inside `a`).
                    unsafe {
                        let v = dot4(wr.as_ptr(), a.as_ptr(), self.arb, nb);
                        for (k, v) in v.into_iter().enumerate() {
                            *self.y.0.add((t + k) * m.rows + r) = v;
                        }
                    }
                    t += 4;
                }
            }
            if let Some(dot2) = self.k.dot2 {
                while t + 2 <= t1 {
                    let a = &self.act[t * self.arb..(t + 2) * self.arb];
                    // SAFETY: as below, for the two activation rows t..t+2 (both inside `a`).
                    unsafe {
                        let v = dot2(wr.as_ptr(), a.as_ptr(), self.arb, nb);
                        for (k, v) in v.into_iter().enumerate() {
                            *self.y.0.add((t + k) * m.rows + r) = v;
                        }
                    }
                    t += 2;
                }
            }
            for t in t..t1 {
                let a = &self.act[t * self.arb..(t + 1) * self.arb];
                // SAFETY: `wr` holds `nb` blocks, `a` one activation row of the kernel's
                // format, the kernel was selected for a path this CPU supports (KernelCtx
                // only holds supported paths), and `t·rows + r` < n·rows is written by this
                // chunk only.
                unsafe {
                    *self.y.0.add(t * m.rows + r) = (self.k.dot)(wr.as_ptr(), a.as_ptr(), nb);
                }
            }
        }
    }
}

pub(crate) fn check_len(
    op: &'static str,
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Shape {
            op,
            what,
            expected,
            got,
        })
    }
}

/// The float-order classes of an activation-row count, over every encoding and operation of
/// this crate: two calls whose row counts share a class sum every output in the same order
/// (ggml switches order at 2 rows for f32/f16 weights and attention's P·V, and at
/// [`kernels::MANY_ROWS`] for the K-quants; the 32-block types never do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OrderClass {
    /// One row: ggml's `vec_dot` orders.
    One,
    /// 2 to 7 rows: batched f32 GEMM and P·V orders, K-quant `vec_dot`.
    Few,
    /// 8 rows or more: also the K-quants' tiled order.
    Many,
}

impl OrderClass {
    /// The class of a call with `rows` activation rows.
    pub fn of(rows: usize) -> Self {
        if rows <= 1 {
            OrderClass::One
        } else if rows < kernels::MANY_ROWS {
            OrderClass::Few
        } else {
            OrderClass::Many
        }
    }

    /// Whether ggml's CPU backend runs a `mul_mat_id` expert of encoding `ty` through its
    /// tiled matmul when [`MANY_ROWS`](Self::rows) or more rows of one batch route to it
    /// (`ggml_tiled_supported`'s type list: the K-quants, IQ4_XS and the IQ1–IQ3 grids);
    /// every other expert product, and these below that count, take `vec_dot`'s one-row
    /// order. [`QuantMatrix::matmul_as`] with [`OrderClass::Many`]'s row count gives that
    /// tiled order where this crate has it.
    pub fn ggml_tiles_experts(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q6_K
                | GgmlType::Q5_K
                | GgmlType::Q4_K
                | GgmlType::Q3_K
                | GgmlType::Q2_K
                | GgmlType::IQ4_XS
                | GgmlType::IQ2_XXS
                | GgmlType::IQ2_XS
                | GgmlType::IQ2_S
                | GgmlType::IQ3_XXS
                | GgmlType::IQ3_S
                | GgmlType::IQ1_S
                | GgmlType::IQ1_M
        )
    }

    /// A row count of this class (pass it as `order_rows` to [`QuantMatrix::matmul_as`]).
    pub fn rows(self) -> usize {
        match self {
            OrderClass::One => 1,
            OrderClass::Few => 2,
            OrderClass::Many => kernels::MANY_ROWS,
        }
    }
}
