//! Mixture-of-experts FFN blocks: the router, expert grouping and the weighted sum, in
//! llama.cpp's float order (`build_moe_ffn`, ggml's `mul_mat_id`).
//!
//! One pass over a ragged batch: the router's logits for every row (one matrix product in
//! each row's own order class, like any projection), each row's picks, then the rows grouped
//! by expert — all rows of every session that route to expert `e` go through **one** kernel
//! call per projection of `e` — and each row's outputs summed in pick order.
//!
//! Facts this follows (llama.cpp `src/llama-graph.cpp`, ggml-cpu `mul_mat_id`):
//! - ggml's `mul_mat_id` takes a (row, expert) product through the type's `vec_dot` (the
//!   activation quantized to its `vec_dot_type`: the one-row order,
//!   [`OrderClass::One`](synapse_kernels::OrderClass)), except where an expert's encoding is
//!   one ggml tiles ([`OrderClass::ggml_tiles_experts`]: the K-quants, IQ4_XS, the IQ grids)
//!   and 8 or more rows of the batch route to it (`cne1 ≥ 8`, `ggml_tiled_min_batch`): those
//!   rows take the tiled order ([`OrderClass::Many`]). Here the batch is one session's
//!   prompt batch — its rows of class `Many` whose positions fall in one `ubatch`-row batch
//!   from position 0 (the cache's `max_chunk`, by which [`crate::prompt_order`] classes
//!   them); a decode row, or a verification row recomputed in the one-row order, is never
//!   tiled — so a row's expert outputs depend on its own session's routing alone, never on
//!   what else shares the pass, provided the whole batch is in the pass: a scheduler runs a
//!   model that tiles ([`crate::Model::tiles_experts`]) in whole prompt batches.
//! - Routing by softmax: [`ggml_f32::softmax_row`] over all experts, an argsort descending
//!   (picks in decreasing probability), the picked probabilities as weights; renormalised by
//!   their f64 sum rounded to f32 and clamped below at 2⁻¹⁴ (`ggml_sum_rows`, `ggml_clamp`,
//!   `ggml_div`).
//! - Each expert's output times its weight (rounded), then summed in pick order
//!   (`((o₀w₀ + o₁w₁) + o₂w₂) + …`, one rounding per add, no fused step).
//! - A shared expert (Qwen2-MoE) is a dense gated FFN over all rows, scaled per row by the
//!   sigmoid of a one-output projection (llama.cpp: `silu(x) / x`), added after the routed
//!   sum.

use synapse_kernels::ggml_f32;
use synapse_kernels::{KernelCtx, OrderClass, ops};
use synapse_model::{Activation, Routing};

use crate::error::{Result, RuntimeError};
use crate::executor::{Row, linear};
use crate::kv::SlotId;
use crate::load::MoeW;
use crate::residency::ExpertPager;
use crate::tap::{Stage, Tap};

/// Grow-only scratch of the MoE blocks (a pass allocates nothing once the largest pass has
/// been seen).
#[derive(Debug, Default)]
pub(crate) struct MoeScratch {
    /// `n × n_expert` router logits, then probabilities.
    logits: Vec<f32>,
    /// `n × n_used` picks: (expert, weight), in pick order.
    picks: Vec<(u32, f32)>,
    /// Argsort scratch (one row's expert indices).
    order: Vec<u32>,
    /// Top-k-then-softmax scratch (one row's picked logits).
    top: Vec<f32>,
    /// (row, pick slot) of every pick, grouped by expert.
    members: Vec<(u32, u32)>,
    /// Start of each expert's group in `members` (`n_expert + 1` values).
    starts: Vec<usize>,
    /// One group's members, those the tiled order takes first.
    grouped: Vec<(u32, u32)>,
    /// One group's prompt batches (slot, batch index) with their count of `Many`-class rows.
    sessions: Vec<((SlotId, u32), usize)>,
    xg: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    h: Vec<f32>,
    yg: Vec<f32>,
    /// `n × n_used × hidden` expert outputs, in pick order.
    out: Vec<f32>,
    /// Shared expert: gate, up, activation, output, and the per-row gate input.
    sg: Vec<f32>,
    su: Vec<f32>,
    sh: Vec<f32>,
    sy: Vec<f32>,
    sgate: Vec<f32>,
}

/// What the MoE blocks have done since the executor was made (or the counts were reset):
/// per layer (the model's MoE layers in order) and expert, the rows routed to it, and the
/// number of expert kernel groups run — one per (pass, layer, expert with rows), whatever
/// the number of rows and sessions in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpertStats {
    /// `rows[l][e]`: rows routed to expert `e` of MoE layer `l`.
    pub rows: Vec<Vec<u64>>,
    /// Expert groups run (each is one call per projection of one expert).
    pub groups: u64,
}

impl ExpertStats {
    /// Clears the counts (keeping their storage).
    pub fn reset(&mut self) {
        self.rows.iter_mut().for_each(|l| l.fill(0));
        self.groups = 0;
    }

    /// Rows routed in all, over layers and experts.
    pub fn routed_rows(&self) -> u64 {
        self.rows.iter().flatten().sum()
    }
}

fn ensure(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// `y = gate(act(g)) ⊙ u` row by row, in ggml's order for the activation.
pub(crate) fn gated(
    act: Activation,
    g: &[f32],
    u: &[f32],
    h: &mut [f32],
    ff: usize,
    gelu_table: bool,
) {
    for ((g, u), h) in g
        .chunks_exact(ff)
        .zip(u.chunks_exact(ff))
        .zip(h.chunks_exact_mut(ff))
    {
        match act {
            Activation::Silu => ggml_f32::swiglu(g, u, h),
            Activation::GeluTanh => ops::geglu(g, u, h, gelu_table),
            Activation::Relu2 => ops::reglu2(g, u, h),
        }
    }
}

/// Sorts expert indices by `r` descending (ggml's argsort); ties (measure zero for real
/// logits) go to the lower index.
fn sort_descending(order: &mut [u32], r: &[f32]) {
    order.sort_by(|&a, &b| {
        r[b as usize]
            .partial_cmp(&r[a as usize])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
}

/// One expert projection over its group's `me` rows `x`, the first `n_tiled` of them in the
/// tiled order where ggml tiles the encoding (see the module docs), the rest (all, for
/// another encoding) in the one-row order.
fn expert_matmul(
    w: &synapse_kernels::QuantMatrix,
    x: &[f32],
    me: usize,
    n_tiled: usize,
    y: &mut [f32],
    ctx: &mut KernelCtx,
) -> Result<()> {
    let (c, r) = (w.cols(), w.rows());
    if n_tiled > 0 && w.ggml_type().is_some_and(OrderClass::ggml_tiles_experts) {
        let (xt, xo) = x[..me * c].split_at(n_tiled * c);
        let (yt, yo) = y[..me * r].split_at_mut(n_tiled * r);
        w.matmul_as(xt, n_tiled, yt, OrderClass::Many.rows(), ctx)?;
        if me > n_tiled {
            w.matmul_as(xo, me - n_tiled, yo, 1, ctx)?;
        }
        Ok(())
    } else {
        Ok(w.matmul_as(&x[..me * c], me, &mut y[..me * r], 1, ctx)?)
    }
}

/// Runs a MoE block over `n` normed rows `xn` (`n × hidden`; `rows` the pass's rows, cut
/// into prompt batches of `ubatch` rows from position 0, `runs` their order classes)
/// into `y` (`n × hidden`), counting into `stats` (this layer's row counts per expert, and
/// the groups run); with a `pager` (and this layer's index among the MoE layers), each
/// expert is made resident right before its group runs; a `tap` sees each routed expert's
/// input and gated activation, and the shared expert's activation (`layer`: the block's index
/// among all layers). `ggml_numerics`: the shared expert's sigmoid as llama.cpp computes it
/// (GGUF sources) rather than `1 / (1 + e^-x)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    m: &MoeW,
    xn: &[f32],
    rows: &[Row],
    ubatch: usize,
    runs: &[(usize, OrderClass)],
    hd: usize,
    y: &mut [f32],
    s: &mut MoeScratch,
    ctx: &mut KernelCtx,
    ggml_numerics: bool,
    stats: (&mut [u64], &mut u64),
    mut pager: Option<(&mut ExpertPager, usize)>,
    (tap, layer): (&mut Option<Box<dyn Tap>>, usize),
) -> Result<()> {
    let n = xn.len() / hd;
    let ne = m.experts.len();
    let k = m.n_used;
    if n == 0 {
        return Ok(());
    }
    if k == 0 || k > ne {
        return Err(RuntimeError::InvalidParam {
            name: "n_used",
            reason: format!("{k} experts per token of {ne}"),
        });
    }
    // Router.
    let logits = ensure(&mut s.logits, n * ne);
    linear(&m.router, xn, runs, logits, ctx)?;
    // Picks.
    s.picks.clear();
    for row in logits.chunks_exact_mut(ne) {
        s.order.clear();
        s.order.extend(0..ne as u32);
        if let Routing::SoftmaxTopK { .. } = m.routing {
            ggml_f32::softmax_row(row);
        }
        let r: &[f32] = row;
        sort_descending(&mut s.order, r);
        let at = s.picks.len();
        s.picks
            .extend(s.order[..k].iter().map(|&e| (e, r[e as usize])));
        let picked = &mut s.picks[at..];
        match m.routing {
            Routing::SoftmaxTopK { renormalize: true } => {
                let sum = picked.iter().map(|p| p.1 as f64).sum::<f64>() as f32;
                let sum = sum.max(6.103_515_6e-5);
                for p in picked {
                    p.1 /= sum;
                }
            }
            Routing::SoftmaxTopK { renormalize: false } => {}
            // The softmax over the picked logits, in pick order.
            Routing::TopKSoftmax => {
                s.top.clear();
                s.top.extend(picked.iter().map(|p| p.1));
                ggml_f32::softmax_row(&mut s.top);
                for (p, &w) in picked.iter_mut().zip(&s.top) {
                    p.1 = w;
                }
            }
        }
    }
    // Group (row, slot) by expert: a counting sort, rows ascending within an expert.
    s.starts.clear();
    s.starts.resize(ne + 1, 0);
    for &(e, _) in &s.picks {
        s.starts[e as usize + 1] += 1;
    }
    for e in 0..ne {
        s.starts[e + 1] += s.starts[e];
    }
    s.members.clear();
    s.members.resize(n * k, (0, 0));
    {
        // Fill cursors live in `order` (reused; `ne` values).
        s.order.clear();
        s.order.extend(s.starts[..ne].iter().map(|&v| v as u32));
        for (i, &(e, _)) in s.picks.iter().enumerate() {
            let c = &mut s.order[e as usize];
            s.members[*c as usize] = ((i / k) as u32, (i % k) as u32);
            *c += 1;
        }
    }
    // Residency: the lookahead's predictions for this layer are scored, and the reads of
    // every routed expert not resident are advised at once (the kernel reads them all ahead
    // while the first groups run), before the first miss reads its own.
    if let Some((p, layer)) = pager.as_mut() {
        let starts = &s.starts;
        p.settle(*layer, |e| starts[e + 1] > starts[e]);
        for e in 0..ne {
            if starts[e + 1] > starts[e] {
                p.prefetch(*layer, e);
            }
        }
    }
    // Experts: one call per projection for all rows routed to it, in the one-row order. The
    // group buffers are sized for the largest group a pass can have (all its rows), so the
    // routing of later passes never makes them grow (steady decode allocates nothing).
    let ff_max = m.experts.iter().map(|e| e.gate.rows()).max().unwrap_or(0);
    ensure(&mut s.xg, n * hd);
    ensure(&mut s.yg, n * hd);
    ensure(&mut s.g, n * ff_max);
    ensure(&mut s.u, n * ff_max);
    ensure(&mut s.h, n * ff_max);
    let out = ensure(&mut s.out, n * k * hd);
    for (e, ex) in m.experts.iter().enumerate() {
        let group = &s.members[s.starts[e]..s.starts[e + 1]];
        let me = group.len();
        if me == 0 {
            continue;
        }
        // Where ggml tiles the expert's encoding: the rows it would tile (a session's prompt
        // batch routing 8 or more rows here) first, the others after, each part in row order.
        let (group, n_tiled) = if ex.ggml_tiles() {
            let batch = |row: &Row| (row.slot, row.pos / ubatch.max(1) as u32);
            s.sessions.clear();
            for &(r, _) in group {
                let row = &rows[r as usize];
                if row.order == OrderClass::Many {
                    let b = batch(row);
                    match s.sessions.iter_mut().find(|x| x.0 == b) {
                        Some(x) => x.1 += 1,
                        None => s.sessions.push((b, 1)),
                    }
                }
            }
            let tiled = |r: u32| {
                let row = &rows[r as usize];
                row.order == OrderClass::Many
                    && s.sessions
                        .iter()
                        .any(|x| x.0 == batch(row) && x.1 >= OrderClass::Many.rows())
            };
            s.grouped.clear();
            s.grouped.extend(group.iter().filter(|m| tiled(m.0)));
            let n = s.grouped.len();
            s.grouped.extend(group.iter().filter(|m| !tiled(m.0)));
            (&s.grouped[..], n)
        } else {
            (group, 0)
        };
        if let Some(c) = stats.0.get_mut(e) {
            *c += me as u64;
        }
        *stats.1 += 1;
        // A paged expert runs from its resident copy (the same bytes).
        let ex = match pager.as_mut() {
            Some((p, layer)) => p.acquire(*layer, e, ctx)?.unwrap_or(ex),
            None => ex,
        };
        let ff = ex.gate.rows();
        let xg = ensure(&mut s.xg, me * hd);
        for (j, &(r, _)) in group.iter().enumerate() {
            xg[j * hd..(j + 1) * hd].copy_from_slice(&xn[r as usize * hd..(r as usize + 1) * hd]);
        }
        if let Some(t) = tap.as_mut() {
            t.expert_tensor(Stage::FfnNorm, layer, e, me, xg);
        }
        let g = ensure(&mut s.g, me * ff);
        expert_matmul(&ex.gate, xg, me, n_tiled, g, ctx)?;
        let u = ensure(&mut s.u, me * ff);
        expert_matmul(&ex.up, xg, me, n_tiled, u, ctx)?;
        let h = ensure(&mut s.h, me * ff);
        gated(
            m.act,
            &s.g[..me * ff],
            &s.u[..me * ff],
            h,
            ff,
            ggml_numerics,
        );
        if let Some(t) = tap.as_mut() {
            t.expert_tensor(Stage::FfnAct, layer, e, me, &s.h[..me * ff]);
        }
        let yg = ensure(&mut s.yg, me * hd);
        expert_matmul(&ex.down, &s.h[..me * ff], me, n_tiled, yg, ctx)?;
        for (j, &(r, slot)) in group.iter().enumerate() {
            let at = (r as usize * k + slot as usize) * hd;
            out[at..at + hd].copy_from_slice(&yg[j * hd..(j + 1) * hd]);
        }
    }
    // Weighted sum in pick order: (o₀·w₀ + o₁·w₁) + …, each product and sum rounded.
    for r in 0..n {
        let yr = &mut y[r * hd..(r + 1) * hd];
        for slot in 0..k {
            let w = s.picks[r * k + slot].1;
            let o = &out[(r * k + slot) * hd..(r * k + slot + 1) * hd];
            if slot == 0 {
                for (y, &o) in yr.iter_mut().zip(o) {
                    *y = o * w;
                }
            } else {
                for (y, &o) in yr.iter_mut().zip(o) {
                    *y += o * w;
                }
            }
        }
    }
    // Shared expert.
    if let Some(sh) = &m.shared {
        let ff = sh.gate.m.rows();
        linear(&sh.gate, xn, runs, ensure(&mut s.sg, n * ff), ctx)?;
        linear(&sh.up, xn, runs, ensure(&mut s.su, n * ff), ctx)?;
        gated(
            m.act,
            &s.sg[..n * ff],
            &s.su[..n * ff],
            ensure(&mut s.sh, n * ff),
            ff,
            ggml_numerics,
        );
        if let Some(t) = tap.as_mut() {
            t.tensor(Stage::FfnAct, Some(layer), n, &s.sh[..n * ff]);
        }
        let sy = ensure(&mut s.sy, n * hd);
        linear(&sh.down, &s.sh[..n * ff], runs, sy, ctx)?;
        if let Some(gi) = &sh.gate_inp {
            let gate = ensure(&mut s.sgate, n);
            linear(gi, xn, runs, gate, ctx)?;
            for (row, &x) in sy.chunks_exact_mut(hd).zip(gate.iter()) {
                let sig = if ggml_numerics {
                    // ggml_silu_f32 (libm expf: a one-element row has no vector part), then
                    // ggml_div.
                    (x / (1.0 + (-x).exp())) / x
                } else {
                    1.0 / (1.0 + (-x).exp())
                };
                for v in row.iter_mut() {
                    *v *= sig;
                }
            }
        }
        for (y, &v) in y[..n * hd].iter_mut().zip(sy.iter()) {
            *y += v;
        }
    }
    Ok(())
}

/// Router lookahead: the experts MoE block `m` (MoE layer `layer`) would route the rows `xn`
/// to — `xn` the residual stream *before* the layers ahead of it have run, normed by its FFN
/// norm — are handed to `pager` as predictions, whose reads it advises ahead
/// ([`ExpertPager::predict`]). A prediction only: it changes no result, and nothing a result
/// depends on (the router logits go to scratch the block itself rewrites).
#[allow(clippy::too_many_arguments)]
pub(crate) fn predict(
    m: &MoeW,
    xn: &[f32],
    runs: &[(usize, OrderClass)],
    hd: usize,
    s: &mut MoeScratch,
    ctx: &mut KernelCtx,
    pager: &mut ExpertPager,
    layer: usize,
) -> Result<()> {
    let n = xn.len() / hd;
    let ne = m.experts.len();
    let k = m.n_used.min(ne);
    if n == 0 || k == 0 {
        return Ok(());
    }
    let logits = ensure(&mut s.logits, n * ne);
    linear(&m.router, xn, runs, logits, ctx)?;
    // Either routing picks the largest logits (a softmax keeps their order).
    for row in logits.chunks_exact(ne) {
        s.order.clear();
        s.order.extend(0..ne as u32);
        sort_descending(&mut s.order, row);
        for &e in &s.order[..k] {
            pager.predict(layer, e as usize);
        }
    }
    Ok(())
}
