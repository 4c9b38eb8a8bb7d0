//! The executor: one forward pass over a ragged batch of rows.
//!
//! A row is `(session slot, position, token, wants logits, float order)`. Rows of several
//! sessions mix in one pass: the projections run as one matrix–matrix product over all rows of
//! one float order (weights stream once per order present in the pass, whatever the number of
//! sessions), attention runs per row against that row's session cache, and logits are
//! computed only for the rows that ask for them.
//!
//! Architecture invariant (batch invariance): a row's results depend on its own session's
//! cache, its token, position and [`OrderClass`], never on what else shares the pass. The
//! projections run per run of rows of one order class (`QuantMatrix::matmul_runs`),
//! attention's P·V in the row's own order, and the LM head in the order of as many rows as
//! the row's own session asks logits for in the pass, so a session's logits are
//! bit-identical alone or beside any other sessions.
//!
//! Architecture invariant: the executor knows operations and attributes from the IR (through
//! [`Model`]), never a family name; adding a family never touches this file.

use std::sync::Arc;

use synapse_kernels::ggml_f32::{self, PvAcc, PvOrder};
use synapse_kernels::{KernelCtx, KernelPath, OrderClass, QuantMatrix, ops};
use synapse_model::Activation;

use crate::error::{Result, RuntimeError};
use crate::kv::{Buf, KvCache, LayerGeom, SlotId};
use crate::load::{LinearW, Model, NormW};
use crate::tap::{Stage, Tap};

/// One row of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Session slot.
    pub slot: SlotId,
    /// Position in the session (must be the session's next position).
    pub pos: u32,
    /// Input token.
    pub token: u32,
    /// Whether to compute logits for this row.
    pub logits: bool,
    /// The float order the row's projections and attention sum in: llama.cpp's for a batch
    /// of this class's size. A decode step is [`OrderClass::One`]; a prompt row takes the
    /// class of the size of the prompt batch it falls in ([`prompt_order`]).
    pub order: OrderClass,
}

impl Row {
    /// A decode-step row (one-row order, logits wanted).
    pub fn decode(slot: SlotId, pos: u32, token: u32) -> Self {
        Row {
            slot,
            pos,
            token,
            logits: true,
            order: OrderClass::One,
        }
    }
}

/// The order class of prompt position `pos` of a session whose prompt has `len` tokens, run
/// in batches of `ubatch` rows from position 0 (llama.cpp's `n_ubatch` split): the class of
/// the size of the batch `pos` falls in. It depends only on the session's own prompt, so
/// the scheduler may cut the prompt into passes anywhere.
pub fn prompt_order(pos: usize, len: usize, ubatch: usize) -> OrderClass {
    let ubatch = ubatch.max(1);
    let start = pos / ubatch * ubatch;
    OrderClass::of(ubatch.min(len.saturating_sub(start)))
}

/// Grow-only scratch buffers: after the largest pass has been seen, a pass allocates nothing.
#[derive(Debug, Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    tmp: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    h: Vec<f32>,
    sel: Vec<f32>,
    logits: Vec<f32>,
    slots: Vec<(SlotId, u32, usize)>,
    /// Consecutive rows of one order class: `(rows, class)`.
    runs: Vec<(usize, OrderClass)>,
    /// Attention work items of the current layer.
    items: Vec<AttnItem>,
}

/// One attention work item: rows `r0..r1` of one session and order class, query heads
/// `h0..h1` of one KV head. Its queries share the keys (the union of the rows' causal
/// ranges), so each key and value row is read once for all of them.
#[derive(Debug, Clone, Copy)]
struct AttnItem {
    r0: usize,
    r1: usize,
    h0: usize,
    h1: usize,
}

/// Rows per attention item in a prompt pass (consecutive positions of one session).
const ATTN_ROWS: usize = 4;

fn ensure(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// Runs forward passes of one model.
pub struct Executor {
    model: Arc<Model>,
    /// The model's precision-profile hash (checked against the cache's identity each pass).
    profile_hash: String,
    ctx: KernelCtx,
    threads: usize,
    s: Scratch,
    tap: Option<Box<dyn Tap>>,
}

/// Hands `data` to the tap, if there is one.
fn tap(
    t: &mut Option<Box<dyn Tap>>,
    stage: Stage,
    layer: Option<usize>,
    rows: usize,
    data: &[f32],
) {
    if let Some(t) = t.as_mut() {
        t.tensor(stage, layer, rows, data);
    }
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("threads", &self.threads)
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl Executor {
    /// An executor using `threads` compute threads (the caller's included) on the best kernel
    /// path this CPU supports (capped by `SYNAPSE_KERNEL_PATH`).
    pub fn new(model: Arc<Model>, threads: usize) -> Result<Self> {
        let threads = threads.max(1);
        let ctx = KernelCtx::with_path_and_threads(KernelPath::from_env()?, threads)?;
        Ok(Executor {
            profile_hash: model.profile.hash(),
            model,
            ctx,
            threads,
            s: Scratch::default(),
            tap: None,
        })
    }

    /// Installs (or with `None` removes) a tap that sees every intermediate tensor of the
    /// following passes; returns the previous one. A tap never changes a pass's results.
    pub fn set_tap(&mut self, t: Option<Box<dyn Tap>>) -> Option<Box<dyn Tap>> {
        std::mem::replace(&mut self.tap, t)
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Kernel path in use.
    pub fn kernel_path(&self) -> KernelPath {
        self.ctx.path()
    }

    /// Runs one pass. Returns the logits of the rows with `logits = true`, in row order,
    /// `vocab` values each. Every row's K/V is appended to its session.
    pub fn forward(&mut self, kv: &mut KvCache, rows: &[Row]) -> Result<&[f32]> {
        let m = self.model.clone();
        let id = kv.identity();
        if id.model != m.ir.fingerprint || id.profile != self.profile_hash {
            return Err(RuntimeError::KvIdentity {
                cache: id.to_string(),
                executor: format!("{}/{}", &m.ir.fingerprint[..12], &self.profile_hash[..12]),
            });
        }
        self.validate(kv, rows)?;
        let n = rows.len();
        if n == 0 {
            return Ok(&[]);
        }
        let hd = m.hidden();
        let s = &mut self.s;
        s.runs.clear();
        for row in rows {
            match s.runs.last_mut() {
                Some(r) if r.1 == row.order => r.0 += 1,
                _ => s.runs.push((1, row.order)),
            }
        }

        // Embedding.
        let x = ensure(&mut s.x, n * hd);
        for (r, row) in rows.iter().enumerate() {
            let xr = &mut x[r * hd..(r + 1) * hd];
            m.embd.dequantize_row(row.token as usize, xr)?;
            if m.embd_scale != 1.0 {
                for v in xr.iter_mut() {
                    *v *= m.embd_scale;
                }
            }
        }
        tap(&mut self.tap, Stage::Embd, None, n, &s.x[..n * hd]);

        for (il, l) in m.layers.iter().enumerate() {
            let qd = l.n_heads * l.head_dim;
            let kvd = l.n_kv_heads * l.head_dim;
            // Attention norm and projections.
            norm_rows(
                &s.x[..n * hd],
                hd,
                &l.attn_norm,
                ensure(&mut s.xn, n * hd),
                &mut self.ctx,
            );
            tap(&mut self.tap, Stage::AttnNorm, Some(il), n, &s.xn[..n * hd]);
            linear(
                &l.q,
                &s.xn[..n * hd],
                &s.runs,
                ensure(&mut s.q, n * qd),
                &mut self.ctx,
            )?;
            linear(
                &l.k,
                &s.xn[..n * hd],
                &s.runs,
                ensure(&mut s.k, n * kvd),
                &mut self.ctx,
            )?;
            linear(
                &l.v,
                &s.xn[..n * hd],
                &s.runs,
                ensure(&mut s.v, n * kvd),
                &mut self.ctx,
            )?;
            tap(&mut self.tap, Stage::Q, Some(il), n, &s.q[..n * qd]);
            tap(&mut self.tap, Stage::K, Some(il), n, &s.k[..n * kvd]);
            tap(&mut self.tap, Stage::V, Some(il), n, &s.v[..n * kvd]);
            // Per-head norms and RoPE, rows in parallel.
            {
                let (qp, kp) = (OutPtr(s.q.as_mut_ptr()), OutPtr(s.k.as_mut_ptr()));
                let cost = 16 * n * (qd + kvd);
                self.ctx.parallel_for(n, cost, &|r0, r1| {
                    ROPE_CS.with(|cell| {
                        let mut cs = cell.borrow_mut();
                        if cs.len() < l.rope.n_rot / 2 {
                            cs.resize(l.rope.n_rot / 2, (0.0, 0.0));
                        }
                        let cs = &mut cs[..l.rope.n_rot / 2];
                        for (r, row) in rows.iter().enumerate().take(r1).skip(r0) {
                            // SAFETY: row r's q and k slices belong to this chunk alone
                            // (q holds n·qd values, k n·kvd).
                            let (q, k) = unsafe {
                                (
                                    std::slice::from_raw_parts_mut(qp.get().add(r * qd), qd),
                                    std::slice::from_raw_parts_mut(kp.get().add(r * kvd), kvd),
                                )
                            };
                            rope_row(l, row.pos, q, k, cs);
                        }
                    })
                });
            }
            tap(&mut self.tap, Stage::QRope, Some(il), n, &s.q[..n * qd]);
            tap(&mut self.tap, Stage::KRope, Some(il), n, &s.k[..n * kvd]);
            // Append K/V.
            let g = kv.geom[il];
            for (r, row) in rows.iter().enumerate() {
                let slot = kv.slots[row.slot as usize]
                    .as_mut()
                    .ok_or(RuntimeError::UnknownSlot(row.slot))?;
                let at = g.row_of(row.pos as usize);
                let kr = &s.k[r * kvd..(r + 1) * kvd];
                for (kvh, k) in kr.chunks_exact(l.head_dim).enumerate() {
                    slot.k[il].write(g.k_at(kvh, at), k);
                }
                slot.v[il].write_strided(g.v_row(0) + at, g.rows, &s.v[r * kvd..(r + 1) * kvd]);
            }
            // Attention.
            attention(
                kv,
                il,
                g,
                l,
                rows,
                &s.q[..n * qd],
                ensure(&mut s.att, n * qd),
                &mut s.items,
                &mut self.ctx,
            );
            tap(&mut self.tap, Stage::KqvOut, Some(il), n, &s.att[..n * qd]);
            linear(
                &l.o,
                &s.att[..n * qd],
                &s.runs,
                ensure(&mut s.tmp, n * hd),
                &mut self.ctx,
            )?;
            tap(&mut self.tap, Stage::AttnOut, Some(il), n, &s.tmp[..n * hd]);
            if let Some(pn) = &l.attn_post_norm {
                for t in s.tmp[..n * hd].chunks_exact_mut(hd) {
                    ops::rms_norm_inplace(t, &pn.w, pn.eps);
                }
            }
            for (x, t) in s.x[..n * hd].iter_mut().zip(&s.tmp[..n * hd]) {
                *x += *t;
            }
            tap(&mut self.tap, Stage::FfnInp, Some(il), n, &s.x[..n * hd]);
            // FFN.
            let ff = l.gate.m.rows();
            norm_rows(
                &s.x[..n * hd],
                hd,
                &l.ffn_norm,
                ensure(&mut s.xn, n * hd),
                &mut self.ctx,
            );
            tap(&mut self.tap, Stage::FfnNorm, Some(il), n, &s.xn[..n * hd]);
            linear(
                &l.gate,
                &s.xn[..n * hd],
                &s.runs,
                ensure(&mut s.g, n * ff),
                &mut self.ctx,
            )?;
            linear(
                &l.up,
                &s.xn[..n * hd],
                &s.runs,
                ensure(&mut s.u, n * ff),
                &mut self.ctx,
            )?;
            tap(&mut self.tap, Stage::FfnGate, Some(il), n, &s.g[..n * ff]);
            tap(&mut self.tap, Stage::FfnUp, Some(il), n, &s.u[..n * ff]);
            let hp = OutPtr(ensure(&mut s.h, n * ff).as_mut_ptr());
            let (gs, us) = (&s.g[..n * ff], &s.u[..n * ff]);
            let table = m.gelu_f16_table;
            self.ctx.parallel_for(n, 16 * n * ff, &|r0, r1| {
                let (g, u) = (&gs[r0 * ff..r1 * ff], &us[r0 * ff..r1 * ff]);
                // SAFETY: rows r0..r1 of h belong to this chunk alone (h holds n·ff values).
                let h = unsafe {
                    std::slice::from_raw_parts_mut(hp.get().add(r0 * ff), (r1 - r0) * ff)
                };
                match l.act {
                    Activation::GeluTanh => ops::geglu(g, u, h, table),
                    Activation::Silu => {
                        for ((g, u), h) in g
                            .chunks_exact(ff)
                            .zip(u.chunks_exact(ff))
                            .zip(h.chunks_exact_mut(ff))
                        {
                            ggml_f32::swiglu(g, u, h);
                        }
                    }
                }
            });
            tap(&mut self.tap, Stage::FfnAct, Some(il), n, &s.h[..n * ff]);
            linear(
                &l.down,
                &s.h[..n * ff],
                &s.runs,
                ensure(&mut s.tmp, n * hd),
                &mut self.ctx,
            )?;
            tap(&mut self.tap, Stage::FfnOut, Some(il), n, &s.tmp[..n * hd]);
            if let Some(pn) = &l.ffn_post_norm {
                for t in s.tmp[..n * hd].chunks_exact_mut(hd) {
                    ops::rms_norm_inplace(t, &pn.w, pn.eps);
                }
            }
            for (x, t) in s.x[..n * hd].iter_mut().zip(&s.tmp[..n * hd]) {
                *x += *t;
            }
            tap(&mut self.tap, Stage::LOut, Some(il), n, &s.x[..n * hd]);
        }

        // Session bookkeeping.
        for row in rows {
            if let Some(slot) = kv.slots[row.slot as usize].as_mut() {
                slot.tokens.push(row.token);
                slot.orders.push(row.order);
            }
        }

        // Logits for the rows that want them.
        let nl = rows.iter().filter(|r| r.logits).count();
        if nl == 0 {
            return Ok(&[]);
        }
        // The LM head sums a session's logits rows in the order of a call with as many rows
        // as that session asks logits for in this pass (llama.cpp's `n_outputs` of a batch: one
        // for a prompt's last row and for a decode step), whatever else shares the pass.
        let heads = &mut s.slots;
        heads.clear();
        for row in rows.iter().filter(|r| r.logits) {
            match heads.iter_mut().find(|e| e.0 == row.slot) {
                Some(e) => e.2 += 1,
                None => heads.push((row.slot, 0, 1)),
            }
        }
        s.runs.clear();
        let sel = ensure(&mut s.sel, nl * hd);
        let mut j = 0;
        for (r, row) in rows.iter().enumerate() {
            if row.logits {
                let count = heads.iter().find(|e| e.0 == row.slot).map_or(1, |e| e.2);
                let class = OrderClass::of(count);
                match s.runs.last_mut() {
                    Some(run) if run.1 == class => run.0 += 1,
                    _ => s.runs.push((1, class)),
                }
                ops::rms_norm(
                    &s.x[r * hd..(r + 1) * hd],
                    &m.final_norm.w,
                    m.final_norm.eps,
                    &mut sel[j * hd..(j + 1) * hd],
                );
                j += 1;
            }
        }
        tap(
            &mut self.tap,
            Stage::ResultNorm,
            None,
            nl,
            &s.sel[..nl * hd],
        );
        let vocab = m.vocab();
        let logits = ensure(&mut s.logits, nl * vocab);
        linear(&m.head, &s.sel[..nl * hd], &s.runs, logits, &mut self.ctx)?;
        if let Some(c) = m.softcap {
            for v in logits.iter_mut() {
                *v = c * (*v / c).tanh();
            }
        }
        tap(
            &mut self.tap,
            Stage::ResultOutput,
            None,
            nl,
            &s.logits[..nl * vocab],
        );
        Ok(&self.s.logits[..nl * vocab])
    }

    fn validate(&mut self, kv: &KvCache, rows: &[Row]) -> Result<()> {
        let vocab = self.model.ir.hparams.vocab_size;
        let seen = &mut self.s.slots;
        seen.clear();
        for row in rows {
            if row.token >= vocab {
                return Err(RuntimeError::TokenOutOfRange {
                    token: row.token,
                    vocab,
                });
            }
            let len = kv.slot(row.slot)?.tokens.len() as u32;
            let e = match seen.iter_mut().find(|e| e.0 == row.slot) {
                Some(e) => e,
                None => {
                    seen.push((row.slot, len, 0));
                    seen.last_mut().ok_or(RuntimeError::UnknownSlot(row.slot))?
                }
            };
            if row.pos != e.1 {
                return Err(RuntimeError::PositionGap {
                    slot: row.slot,
                    pos: row.pos,
                    expected: e.1,
                });
            }
            e.1 += 1;
            e.2 += 1;
            if e.1 as usize > kv.capacity() {
                return Err(RuntimeError::ContextFull {
                    slot: row.slot,
                    capacity: kv.capacity() as u32,
                });
            }
            if e.2 > kv.max_chunk() {
                return Err(RuntimeError::ChunkTooLarge {
                    slot: row.slot,
                    rows: e.2,
                    max: kv.max_chunk(),
                });
            }
        }
        Ok(())
    }
}

fn norm_rows(x: &[f32], hd: usize, n: &NormW, y: &mut [f32], ctx: &mut KernelCtx) {
    let rows = x.len() / hd;
    let yp = OutPtr(y.as_mut_ptr());
    ctx.parallel_for(rows, 8 * x.len(), &|r0, r1| {
        // SAFETY: rows r0..r1 of y belong to this chunk alone (y holds rows·hd values).
        let y = unsafe { std::slice::from_raw_parts_mut(yp.get().add(r0 * hd), (r1 - r0) * hd) };
        for (xr, yr) in x[r0 * hd..r1 * hd]
            .chunks_exact(hd)
            .zip(y.chunks_exact_mut(hd))
        {
            ops::rms_norm(xr, &n.w, n.eps, yr);
        }
    });
}

/// Row `pos`'s per-head q/k norms and RoPE (`cs`: scratch of `n_rot / 2` pairs).
fn rope_row(
    l: &crate::load::LayerW,
    pos: u32,
    q: &mut [f32],
    k: &mut [f32],
    cs: &mut [(f32, f32)],
) {
    if let Some(nq) = &l.q_norm {
        for h in q.chunks_exact_mut(l.head_dim) {
            ops::rms_norm_inplace(h, &nq.w, nq.eps);
        }
    }
    if let Some(nk) = &l.k_norm {
        for h in k.chunks_exact_mut(l.head_dim) {
            ops::rms_norm_inplace(h, &nk.w, nk.eps);
        }
    }
    ops::rope_cache(
        pos,
        l.rope.n_rot,
        l.rope.base,
        l.rope.freq_scale,
        l.rope.freq_factors.as_deref(),
        cs,
    );
    for h in q.chunks_exact_mut(l.head_dim) {
        ops::rope_apply(h, l.rope.n_rot, l.rope.style, cs);
    }
    for h in k.chunks_exact_mut(l.head_dim) {
        ops::rope_apply(h, l.rope.n_rot, l.rope.style, cs);
    }
}

thread_local! {
    /// Per-thread RoPE cos/sin scratch.
    static ROPE_CS: std::cell::RefCell<Vec<(f32, f32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn linear(
    l: &LinearW,
    x: &[f32],
    runs: &[(usize, OrderClass)],
    y: &mut [f32],
    ctx: &mut KernelCtx,
) -> Result<()> {
    let m: &QuantMatrix = &l.m;
    m.matmul_runs(x, runs, y, ctx)?;
    if let Some(b) = &l.bias {
        for yr in y.chunks_exact_mut(b.len()) {
            for (y, &b) in yr.iter_mut().zip(b) {
                *y += b;
            }
        }
    }
    Ok(())
}

/// Attention for every row. With an f32 cache, work items group queries that share keys
/// (up to [`ATTN_ROWS`] consecutive rows of one session, the query heads of one KV head,
/// split finer when there are few items for the threads); each query's scores, softmax and
/// P·V are bit-identical to computing it alone (`ggml_f32::scores_f32_multi`,
/// `pv_t_f32` over the transposed values). An f16 cache runs one item per (row, head).
#[allow(clippy::too_many_arguments)]
fn attention(
    kv: &KvCache,
    il: usize,
    g: LayerGeom,
    l: &crate::load::LayerW,
    rows: &[Row],
    q: &[f32],
    out: &mut [f32],
    items: &mut Vec<AttnItem>,
    ctx: &mut KernelCtx,
) {
    let hdim = l.head_dim;
    let qd = l.n_heads * hdim;
    let group = l.n_heads / l.n_kv_heads;
    let keys: usize = rows.iter().map(|r| r.pos as usize + 1).sum();
    let cost = 4 * keys * qd;
    let outp = OutPtr(out.as_mut_ptr());
    let f32_cache = rows.first().is_some_and(|r| {
        kv.slots[r.slot as usize]
            .as_ref()
            .is_some_and(|s| matches!((&s.k[il], &s.v[il]), (Buf::F32(_), Buf::F32(_))))
    });
    if !f32_cache {
        attention_per_head(kv, il, g, l, rows, q, outp, cost, ctx);
        return;
    }
    // Row blocks: consecutive rows of one slot and order class, at most ATTN_ROWS.
    items.clear();
    let mut r0 = 0;
    while r0 < rows.len() {
        let mut r1 = r0 + 1;
        while r1 < rows.len()
            && r1 - r0 < ATTN_ROWS
            && rows[r1].slot == rows[r0].slot
            && rows[r1].order == rows[r0].order
            && rows[r1].pos == rows[r1 - 1].pos + 1
        {
            r1 += 1;
        }
        items.push(AttnItem {
            r0,
            r1,
            h0: 0,
            h1: 0,
        });
        r0 = r1;
    }
    // Head chunks: all query heads of a KV head, split while there are fewer than two items
    // per thread.
    let base = items.len() * l.n_kv_heads;
    let per_kv = (2 * ctx.threads()).div_ceil(base).clamp(1, group);
    let chunk = group.div_ceil(per_kv);
    let blocks = items.len();
    for b in 0..blocks {
        let it = items[b];
        for kvh in 0..l.n_kv_heads {
            let mut h = kvh * group;
            while h < (kvh + 1) * group {
                let h1 = (h + chunk).min((kvh + 1) * group);
                items.push(AttnItem { h0: h, h1, ..it });
                h = h1;
            }
        }
    }
    items.drain(..blocks);
    let items: &[AttnItem] = items;
    ctx.parallel_for(items.len(), cost, &|i0, i1| {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            for it in &items[i0..i1] {
                attend_group(kv, il, g, l, rows, *it, q, outp, &mut scratch);
            }
        });
    });
}

/// ggml sums P·V with its f32 GEMM when the batch has two or more rows, else `vec_dot`: the
/// row's own order class says which.
fn pv_order(class: OrderClass) -> PvOrder {
    if class == OrderClass::One {
        PvOrder::VecDot
    } else {
        PvOrder::Gemm
    }
}

/// One item of [`attention`] over an f32 cache.
#[allow(clippy::too_many_arguments)]
fn attend_group(
    kv: &KvCache,
    il: usize,
    g: LayerGeom,
    l: &crate::load::LayerW,
    rows: &[Row],
    it: AttnItem,
    q: &[f32],
    outp: OutPtr,
    scratch: &mut AttnScratch,
) {
    let hdim = l.head_dim;
    let qd = l.n_heads * hdim;
    let group = l.n_heads / l.n_kv_heads;
    let kvh = it.h0 / group;
    let first = rows[it.r0];
    let Some(slot) = kv.slots[first.slot as usize].as_ref() else {
        return;
    };
    let (Buf::F32(kb), Buf::F32(vb)) = (&slot.k[il], &slot.v[il]) else {
        return;
    };
    let lo_of = |pos: usize| match l.window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    };
    let (lo, hi) = (lo_of(first.pos as usize), rows[it.r1 - 1].pos as usize + 1);
    let n_keys = hi - lo;
    let nq = (it.r1 - it.r0) * (it.h1 - it.h0);
    let AttnScratch {
        scores, pvt, offs, ..
    } = scratch;
    if scores.len() < nq * n_keys {
        scores.resize(nq * n_keys.max(g.rows), 0.0);
    }
    if offs.capacity() < n_keys.max(g.rows) {
        offs.reserve(n_keys.max(g.rows) - offs.len());
    }
    offs.clear();
    offs.extend((lo..hi).map(|p| g.k_at(kvh, g.row_of(p))));
    // The item's queries, row-major then head: query i = (row r0 + i / heads, head h0 + i % heads).
    let heads = it.h1 - it.h0;
    let mut qs: [&[f32]; 64] = [&[]; 64];
    let sc = &mut scores[..nq * n_keys];
    let mut done = 0;
    while done < nq {
        let m = (nq - done).min(64);
        for (k, qslot) in qs.iter_mut().enumerate().take(m) {
            let i = done + k;
            let (r, h) = (it.r0 + i / heads, it.h0 + i % heads);
            let at = r * qd + h * hdim;
            *qslot = &q[at..at + hdim];
        }
        ggml_f32::scores_f32_multi(
            kb,
            offs,
            &qs[..m],
            l.scale,
            &mut sc[done * n_keys..(done + m) * n_keys],
        );
        done += m;
    }
    // Each query's softmax over its own causal range; its other cells get p = 0 (llama.cpp's
    // masked cells: exp(−∞)), so every query sums over the item's cells.
    for i in 0..nq {
        let row = &rows[it.r0 + i / heads];
        let (a, b) = (lo_of(row.pos as usize) - lo, row.pos as usize + 1 - lo);
        let r = &mut sc[i * n_keys..(i + 1) * n_keys];
        ggml_f32::softmax_cells(&mut r[a..b], lo + a);
        r[..a].fill(0.0);
        r[b..].fill(0.0);
    }
    // One order class per item.
    let order = pv_order(first.order);
    let sc: &[f32] = sc;
    let (runs, nr) = g.runs(lo, hi);
    let head = &vb[g.v_row(kvh * hdim)..g.v_row((kvh + 1) * hdim)];
    let mut i = 0;
    while i < nq {
        let m = (nq - i).min(PV_QUERIES);
        let mut qs: [ggml_f32::PvtQuery<'_>; PV_QUERIES] = std::array::from_fn(|k| {
            let qi = i + k;
            if k >= m {
                return ggml_f32::PvtQuery {
                    p: &[],
                    out: &mut [],
                };
            }
            let r = it.r0 + qi / heads;
            let at = r * qd + (it.h0 + qi % heads) * hdim;
            // SAFETY: this item alone writes out[at .. at + hdim]: its (row, head) pairs are
            // its own (items partition rows × heads), and `out` is rows·qd long.
            let out = unsafe { std::slice::from_raw_parts_mut(outp.get().add(at), hdim) };
            ggml_f32::PvtQuery {
                p: &sc[qi * n_keys..(qi + 1) * n_keys],
                out,
            }
        });
        ggml_f32::pv_t_f32(order, head, g.rows, &runs[..nr], lo, &mut qs[..m], pvt);
        i += m;
    }
}

/// Queries per transposed `P·V` call (their probabilities and lane state stay in cache).
const PV_QUERIES: usize = 8;

/// One item per (row, head): the f16-cache path.
#[allow(clippy::too_many_arguments)]
fn attention_per_head(
    kv: &KvCache,
    il: usize,
    g: LayerGeom,
    l: &crate::load::LayerW,
    rows: &[Row],
    q: &[f32],
    outp: OutPtr,
    cost: usize,
    ctx: &mut KernelCtx,
) {
    let hdim = l.head_dim;
    let qd = l.n_heads * hdim;
    let items = rows.len() * l.n_heads;
    ctx.parallel_for(items, cost, &|i0, i1| {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            for i in i0..i1 {
                let (r, h) = (i / l.n_heads, i % l.n_heads);
                let Some(row) = rows.get(r) else { continue };
                let order = pv_order(row.order);
                let at = r * qd + h * hdim;
                // SAFETY: item i alone writes out[at .. at + hdim] (distinct (r, h) pairs
                // map to disjoint head slices inside `out`, which is rows·qd long).
                let o = unsafe { std::slice::from_raw_parts_mut(outp.get().add(at), hdim) };
                attend_one(
                    kv,
                    il,
                    g,
                    l,
                    row,
                    h,
                    &q[at..at + hdim],
                    o,
                    &mut scratch,
                    order,
                );
            }
        });
    });
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
impl OutPtr {
    /// By-value access, so closures capture the whole (Sync) wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: items write disjoint slices (see `attention`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

thread_local! {
    /// Attention scratch of the thread running an item (kernel pool workers and the caller),
    /// grown to the longest context seen and then reused.
    static SCRATCH: std::cell::RefCell<AttnScratch> = std::cell::RefCell::new(AttnScratch::default());
}

/// One query head of one row against its session's f16 cache, in ggml's order (an f32 cache
/// takes [`attend_group`]).
#[allow(clippy::too_many_arguments)]
fn attend_one(
    kv: &KvCache,
    il: usize,
    g: LayerGeom,
    l: &crate::load::LayerW,
    row: &Row,
    h: usize,
    qh: &[f32],
    o: &mut [f32],
    scratch: &mut AttnScratch,
    order: PvOrder,
) {
    let hdim = l.head_dim;
    let group = l.n_heads / l.n_kv_heads;
    let AttnScratch {
        scores, pv, buf, ..
    } = scratch;
    if buf.len() < hdim {
        buf.resize(hdim, 0.0);
    }
    let Some(slot) = kv.slots[row.slot as usize].as_ref() else {
        return;
    };
    let pos = row.pos as usize;
    let lo = match l.window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    };
    let n_keys = pos + 1 - lo;
    // Sized for the most keys this layer can hold at once, so a session whose context grows
    // does not reallocate step after step.
    if scores.len() < n_keys.max(g.rows) {
        scores.resize(n_keys.max(g.rows), 0.0);
    }
    let (kb, vb) = (&slot.k[il], &slot.v[il]);
    let kvh = h / group;
    let sc = &mut scores[..n_keys];
    for (j, p) in (lo..=pos).enumerate() {
        let at = g.k_at(kvh, g.row_of(p));
        sc[j] = match kb {
            Buf::F32(k) => ggml_f32::dot_f32(&k[at..at + hdim], qh),
            Buf::F16(k) => {
                let kk = &mut buf[..hdim];
                for (d, s) in kk.iter_mut().zip(&k[at..at + hdim]) {
                    *d = s.to_f32();
                }
                ggml_f32::dot_f32(kk, qh)
            }
        } * l.scale;
    }
    // Cells are positions (a session's cache holds position p in cell p).
    ggml_f32::softmax_cells(sc, lo);
    pv.reset(hdim, order);
    for (j, p) in (lo..=pos).enumerate() {
        // The cell's values, gathered from the transposed rows.
        let at = g.v_row(kvh * hdim) + g.row_of(p);
        let vv = &mut buf[..hdim];
        match vb {
            Buf::F32(v) => {
                for (d, x) in vv.iter_mut().enumerate() {
                    *x = v[at + d * g.rows];
                }
            }
            Buf::F16(v) => {
                for (d, x) in vv.iter_mut().enumerate() {
                    *x = v[at + d * g.rows].to_f32();
                }
            }
        }
        pv.add(p, sc[j], vv);
    }
    pv.finish(o);
}

/// Per-thread attention scratch: scores, the P·V accumulator, one converted head.
#[derive(Debug, Default)]
struct AttnScratch {
    scores: Vec<f32>,
    pv: PvAcc,
    /// Lane state of the transposed `P·V` (f32 caches).
    pvt: Vec<f32>,
    buf: Vec<f32>,
    /// Cache offsets of the head's rows, one per attended cell.
    offs: Vec<usize>,
}
