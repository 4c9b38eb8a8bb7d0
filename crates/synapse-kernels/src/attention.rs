//! Attention over a KV cache: `softmax(q·Kᵀ·scale + mask)·V` for one or many query rows, with
//! grouped-query heads, causal and sliding-window masks, and an f32 or f16 cache.

use crate::ctx::KernelCtx;
use crate::error::{KernelError, Result};
use crate::kernels::{self, DotFn};
use crate::matrix::check_len;
use crate::ops::softmax;
use half::f16;
use half::slice::HalfFloatSliceExt;
use std::cell::RefCell;
use synapse_formats::GgmlType;

/// One layer's K or V cache: `len` positions back to back, each `n_kv_heads × head_dim`
/// values; the entry at index `j` holds position `j`.
#[derive(Debug, Clone, Copy)]
pub enum KvView<'a> {
    /// f32 cache.
    F32(&'a [f32]),
    /// f16 cache.
    F16(&'a [f16]),
}

impl KvView<'_> {
    fn len(&self) -> usize {
        match self {
            KvView::F32(s) => s.len(),
            KvView::F16(s) => s.len(),
        }
    }
}

/// Shape and masking of an attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionParams {
    /// Query heads.
    pub n_heads: usize,
    /// KV heads (divides `n_heads`; query head `h` reads KV head `h / (n_heads / n_kv_heads)`).
    pub n_kv_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// Score scale (usually `1/√head_dim`; Gemma 3 uses `query_pre_attn_scalar^-½`).
    pub scale: f32,
    /// Sliding window: a query at position `p` sees positions `j` with `p − j < window`.
    pub window: Option<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[i, h] = Σ_j softmax_j(scale·q[i,h]·K[j,kvh])·V[j,kvh]` over the positions `j` that query
/// `i` (at position `q_pos[i]`) may see: `j ≤ q_pos[i]`, `j < kv_len`, and inside the window.
///
/// `q` and `out` are `n_q × n_heads × head_dim` with `n_q = q_pos.len()`; `k` and `v` hold at
/// least `kv_len` positions.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    p: &AttentionParams,
    q: &[f32],
    q_pos: &[usize],
    k: KvView<'_>,
    v: KvView<'_>,
    kv_len: usize,
    out: &mut [f32],
    ctx: &mut KernelCtx,
) -> Result<()> {
    if p.n_heads == 0
        || p.n_kv_heads == 0
        || p.head_dim == 0
        || !p.n_heads.is_multiple_of(p.n_kv_heads)
    {
        return Err(KernelError::BadArgument {
            op: "attention",
            msg: format!(
                "{} query heads over {} KV heads of dim {}",
                p.n_heads, p.n_kv_heads, p.head_dim
            ),
        });
    }
    let n_q = q_pos.len();
    let (hd, qrow) = (p.head_dim, p.n_heads * p.head_dim);
    let kvrow = p.n_kv_heads * hd;
    check_len("attention", "q", n_q * qrow, q.len())?;
    check_len("attention", "out", n_q * qrow, out.len())?;
    for (what, kv) in [("k", &k), ("v", &v)] {
        if kv.len() < kv_len * kvrow {
            return Err(KernelError::Shape {
                op: "attention",
                what,
                expected: kv_len * kvrow,
                got: kv.len(),
            });
        }
    }
    let ty = match k {
        KvView::F32(_) => GgmlType::F32,
        KvView::F16(_) => GgmlType::F16,
    };
    let dot = kernels::select(ty, ctx.path())
        .ok_or_else(|| KernelError::UnsupportedEncoding(ty.name().to_string()))?
        .dot;
    let group = p.n_heads / p.n_kv_heads;
    let outp = SyncPtr(out.as_mut_ptr());
    let tasks = n_q * p.n_heads;
    let flops = 4 * tasks * kv_len.max(1) * hd;
    let task = |t0: usize, t1: usize| {
        SCRATCH.with_borrow_mut(|scratch| {
            for t in t0..t1 {
                let (i, h) = (t / p.n_heads, t % p.n_heads);
                let kvh = h / group;
                let qh = &q[i * qrow + h * hd..i * qrow + (h + 1) * hd];
                // SAFETY: task t owns out[t·hd .. (t+1)·hd] (t = i·n_heads + h).
                let o = unsafe { std::slice::from_raw_parts_mut(outp.get().add(t * hd), hd) };
                one_head(p, qh, q_pos[i], kvh, k, v, kv_len, dot, scratch, o);
            }
        })
    };
    let (_, pool) = ctx.parts();
    pool.run_rows(tasks, 1, flops, &task);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn one_head(
    p: &AttentionParams,
    qh: &[f32],
    pos: usize,
    kvh: usize,
    k: KvView<'_>,
    v: KvView<'_>,
    kv_len: usize,
    dot: DotFn,
    scratch: &mut Vec<f32>,
    o: &mut [f32],
) {
    let hd = p.head_dim;
    let kvrow = p.n_kv_heads * hd;
    o.iter_mut().for_each(|x| *x = 0.0);
    if kv_len == 0 {
        return;
    }
    let hi = pos.min(kv_len - 1);
    let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    if lo > hi {
        return;
    }
    let n = hi - lo + 1;
    scratch.resize(n + hd, 0.0);
    let (scores, vbuf) = scratch.split_at_mut(n);
    for (s, j) in scores.iter_mut().zip(lo..=hi) {
        let off = j * kvrow + kvh * hd;
        let kp: *const u8 = match k {
            KvView::F32(k) => k[off..off + hd].as_ptr().cast(),
            KvView::F16(k) => k[off..off + hd].as_ptr().cast(),
        };
        // SAFETY: `kp` points to `hd` elements of the kernel's float type, `qh` to `hd` f32, and
        // the kernel was selected for the context's (supported) path.
        *s = unsafe { dot(kp, qh.as_ptr().cast(), hd) } * p.scale;
    }
    softmax(scores);
    for (&w, j) in scores.iter().zip(lo..=hi) {
        let off = j * kvrow + kvh * hd;
        let vr: &[f32] = match v {
            KvView::F32(v) => &v[off..off + hd],
            KvView::F16(v) => {
                v[off..off + hd].convert_to_f32_slice(&mut vbuf[..hd]);
                &vbuf[..hd]
            }
        };
        o.iter_mut().zip(vr).for_each(|(a, &b)| *a += w * b);
    }
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
impl SyncPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: tasks write disjoint head slices of the output.
unsafe impl Send for SyncPtr {}
// SAFETY: as above.
unsafe impl Sync for SyncPtr {}
