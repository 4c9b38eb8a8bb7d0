//! Attention over the KV cache, in ggml's float order (`synapse_kernels::ggml_f32`): for
//! every row of a pass, its query heads against its own session's keys and values.
//!
//! Work items group queries that share keys: up to [`ATTN_ROWS`] consecutive rows of one
//! session and order class × the query heads of one KV head (split finer when there are
//! few items for the threads). Each query's scores, softmax and P·V are bit-identical to
//! computing it alone, so grouping never changes a result (batch invariance). An f16 cache
//! runs one item per (row, head).

use synapse_kernels::KernelCtx;
use synapse_kernels::OrderClass;
use synapse_kernels::ggml_f32::{self, PvAcc, PvOrder};

use crate::executor::{OutPtr, Row};
use crate::kv::{Buf, KvCache, LayerGeom};

/// One attention work item: rows `r0..r1` of one session and order class, query heads
/// `h0..h1` of one KV head. Its queries share the keys (the union of the rows' causal
/// ranges), so each key and value row is read once for all of them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnItem {
    r0: usize,
    r1: usize,
    h0: usize,
    h1: usize,
}

/// Rows per attention item in a prompt pass (consecutive positions of one session).
const ATTN_ROWS: usize = 4;

/// Grow-only attention state of an executor (reused pass after pass).
#[derive(Debug, Default)]
pub(crate) struct AttnState {
    /// Work items of the current layer (row blocks first, then their head chunks).
    items: Vec<AttnItem>,
    /// The split path's scores of every query (see [`split`]).
    scores: Vec<f32>,
    /// The split path's blocks: `(item, first score index)`.
    blocks: Vec<(AttnItem, usize)>,
}

/// The split path runs when the row blocks × KV heads are fewer than this many per thread
/// (a decode step of few sessions) …
const SPLIT_UNITS_PER_THREAD: usize = 2;
/// … some block attends at least this many cells …
const SPLIT_MIN_KEYS: usize = 512;
/// … and every query's scores fit in this many floats (16 MiB).
const SPLIT_MAX_SCORES: usize = 4 << 20;

/// Attention for every row. With an f32 cache, work items group queries that share keys
/// (up to [`ATTN_ROWS`] consecutive rows of one session, the query heads of one KV head,
/// split finer when there are few items for the threads); each query's scores, softmax and
/// P·V are bit-identical to computing it alone (`ggml_f32::scores_f32_multi`,
/// `pv_t_f32` over the transposed values). An f16 cache runs one item per (row, head).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    kv: &KvCache,
    il: usize,
    g: LayerGeom,
    l: &crate::load::LayerW,
    rows: &[Row],
    q: &[f32],
    out: &mut [f32],
    st: &mut AttnState,
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
    let items = &mut st.items;
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
    let lo_of = |pos: usize| window_lo(l, pos);
    let span = |it: &AttnItem| rows[it.r1 - 1].pos as usize + 1 - lo_of(rows[it.r0].pos as usize);
    let n_scores: usize = items
        .iter()
        .map(|it| (it.r1 - it.r0) * l.n_heads * span(it))
        .sum();
    if items.len() * l.n_kv_heads < SPLIT_UNITS_PER_THREAD * ctx.threads()
        && items.iter().any(|it| span(it) >= SPLIT_MIN_KEYS)
        && n_scores <= SPLIT_MAX_SCORES
    {
        split(kv, il, g, l, rows, q, outp, st, n_scores, ctx);
        return;
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

/// Attention of few row blocks over long contexts, in three parallel phases so that both
/// threads stream distinct keys and values and each is read once: the scores of every query
/// of a KV head over chunks of its cells (phase 1, into `st.scores`), each query's softmax
/// (phase 2), P·V over chunks of the value dimensions (phase 3, every dimension a dot over
/// the cells of its own value row). The per-item path would give the KV heads' query heads
/// to separate items, each reading the head's keys and values again. Each score, softmax
/// and output value is computed by the same call on the same operands as on that path, so
/// the bits are the same.
#[allow(clippy::too_many_arguments)]
fn split(
    kv: &KvCache,
    il: usize,
    g: LayerGeom,
    l: &crate::load::LayerW,
    rows: &[Row],
    q: &[f32],
    outp: OutPtr,
    st: &mut AttnState,
    n_scores: usize,
    ctx: &mut KernelCtx,
) {
    let hdim = l.head_dim;
    let qd = l.n_heads * hdim;
    let group = l.n_heads / l.n_kv_heads;
    let lo_of = |pos: usize| window_lo(l, pos);
    // Blocks with their score offsets: query (row r0 + i / n_heads, head i % n_heads) of a
    // block at `base + i · n_keys`.
    st.blocks.clear();
    let mut at = 0;
    for it in &st.items {
        st.blocks.push((*it, at));
        let n_keys = rows[it.r1 - 1].pos as usize + 1 - lo_of(rows[it.r0].pos as usize);
        at += (it.r1 - it.r0) * l.n_heads * n_keys;
    }
    if st.scores.len() < n_scores {
        st.scores.resize(n_scores, 0.0);
    }
    let blocks: &[(AttnItem, usize)] = &st.blocks;
    let sp = OutPtr(st.scores.as_mut_ptr());
    let geom = |it: &AttnItem| {
        let lo = lo_of(rows[it.r0].pos as usize);
        (lo, rows[it.r1 - 1].pos as usize + 1)
    };
    let threads = ctx.threads().max(1);
    // Phase 1: (block, KV head, cell chunk) units, ~4 per thread, chunks of >= 256 cells.
    let per_head = |n_keys: usize| {
        let want = (4 * threads).div_ceil(blocks.len() * l.n_kv_heads);
        n_keys.div_ceil(want).max(256).next_multiple_of(16)
    };
    let mut units1 = 0;
    for (it, _) in blocks {
        let (lo, hi) = geom(it);
        units1 += l.n_kv_heads * (hi - lo).div_ceil(per_head(hi - lo));
    }
    let cost = 4 * n_scores * hdim;
    ctx.parallel_for(units1, cost, &|u0, u1| {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let AttnScratch { offs, .. } = &mut *scratch;
            let mut u = 0;
            for (it, base) in blocks {
                let Some(slot) = kv.slots[rows[it.r0].slot as usize].as_ref() else {
                    continue;
                };
                let Buf::F32(kb) = &slot.k[il] else { continue };
                let (lo, hi) = geom(it);
                let n_keys = hi - lo;
                let c = per_head(n_keys);
                let chunks = n_keys.div_ceil(c);
                for kvh in 0..l.n_kv_heads {
                    for ch in 0..chunks {
                        if u >= u0 && u < u1 {
                            let (c0, c1) = (ch * c, ((ch + 1) * c).min(n_keys));
                            offs.clear();
                            offs.extend((lo + c0..lo + c1).map(|p| g.k_at(kvh, g.row_of(p))));
                            let nq = (it.r1 - it.r0) * group;
                            let w = c1 - c0;
                            let mut qs: [&[f32]; 16] = [&[]; 16];
                            let mut outs: [&mut [f32]; 16] = Default::default();
                            let mut done = 0;
                            while done < nq {
                                let m = (nq - done).min(16);
                                for k in 0..m {
                                    let i = done + k;
                                    let (ri, h) = (i / group, kvh * group + i % group);
                                    let a = (it.r0 + ri) * qd + h * hdim;
                                    qs[k] = &q[a..a + hdim];
                                    let dst = base + (ri * l.n_heads + h) * n_keys + c0;
                                    // SAFETY: unit (block, kvh, chunk) alone writes these
                                    // cells of its queries' score rows, inside n_scores.
                                    outs[k] = unsafe {
                                        std::slice::from_raw_parts_mut(sp.get().add(dst), w)
                                    };
                                }
                                // Straight into the score rows (no staging copy).
                                ggml_f32::scores_f32_into(
                                    kb,
                                    offs,
                                    &qs[..m],
                                    l.scale,
                                    &mut outs[..m],
                                );
                                done += m;
                            }
                        }
                        u += 1;
                    }
                }
            }
        });
    });
    // Phase 2: each query's softmax over its own causal range, zeros elsewhere.
    let n_queries: usize = blocks
        .iter()
        .map(|(it, _)| (it.r1 - it.r0) * l.n_heads)
        .sum();
    ctx.parallel_for(n_queries, n_scores * 16, &|q0, q1| {
        let mut i = 0;
        for (it, base) in blocks {
            let (lo, hi) = geom(it);
            let n_keys = hi - lo;
            for qi in 0..(it.r1 - it.r0) * l.n_heads {
                if i >= q0 && i < q1 {
                    let pos = rows[it.r0 + qi / l.n_heads].pos as usize;
                    let (a, b) = (lo_of(pos) - lo, pos + 1 - lo);
                    // SAFETY: query i alone owns its score row.
                    let r = unsafe {
                        std::slice::from_raw_parts_mut(sp.get().add(base + qi * n_keys), n_keys)
                    };
                    ggml_f32::softmax_cells(&mut r[a..b], lo + a);
                    r[..a].fill(0.0);
                    r[b..].fill(0.0);
                }
                i += 1;
            }
        }
    });
    // Phase 3: (block, KV head, dimension chunk) units.
    let dchunk = {
        let want = (4 * threads).div_ceil(blocks.len() * l.n_kv_heads);
        hdim.div_ceil(want).next_multiple_of(4).min(hdim)
    };
    let dchunks = hdim.div_ceil(dchunk);
    let units3 = blocks.len() * l.n_kv_heads * dchunks;
    let scores: &[f32] = &st.scores;
    ctx.parallel_for(units3, cost, &|u0, u1| {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let pvt = &mut scratch.pvt;
            for u in u0..u1 {
                let (bi, rest) = (u / (l.n_kv_heads * dchunks), u % (l.n_kv_heads * dchunks));
                let (kvh, dc) = (rest / dchunks, rest % dchunks);
                let (it, base) = &blocks[bi];
                let Some(slot) = kv.slots[rows[it.r0].slot as usize].as_ref() else {
                    continue;
                };
                let Buf::F32(vb) = &slot.v[il] else { continue };
                let (lo, hi) = geom(it);
                let n_keys = hi - lo;
                let (d0, d1) = (dc * dchunk, ((dc + 1) * dchunk).min(hdim));
                let (runs, nr) = g.runs(lo, hi);
                let rows_v = &vb[g.v_row(kvh * hdim + d0)..g.v_row(kvh * hdim + d1)];
                let order = pv_order(rows[it.r0].order);
                let nq = (it.r1 - it.r0) * group;
                let mut i = 0;
                while i < nq {
                    let m = (nq - i).min(PV_QUERIES);
                    let mut qs: [ggml_f32::PvtQuery<'_>; PV_QUERIES] = std::array::from_fn(|k| {
                        if k >= m {
                            return ggml_f32::PvtQuery {
                                p: &[],
                                out: &mut [],
                            };
                        }
                        let qi = i + k;
                        let (ri, h) = (qi / group, kvh * group + qi % group);
                        let a = (it.r0 + ri) * qd + h * hdim + d0;
                        // SAFETY: unit (block, kvh, dim chunk) alone writes dims d0..d1 of
                        // its queries' output heads (`out` is rows·qd long).
                        let out =
                            unsafe { std::slice::from_raw_parts_mut(outp.get().add(a), d1 - d0) };
                        let sr = base + (ri * l.n_heads + h) * n_keys;
                        ggml_f32::PvtQuery {
                            p: &scores[sr..sr + n_keys],
                            out,
                        }
                    });
                    ggml_f32::pv_t_f32(order, rows_v, g.stride, &runs[..nr], lo, &mut qs[..m], pvt);
                    i += m;
                }
            }
        });
    });
}

/// The first position a query at `pos` attends (its sliding window's start, or 0).
fn window_lo(l: &crate::load::LayerW, pos: usize) -> usize {
    match l.window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    }
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
    let lo_of = |pos: usize| window_lo(l, pos);
    let (lo, hi) = (lo_of(first.pos as usize), rows[it.r1 - 1].pos as usize + 1);
    let n_keys = hi - lo;
    let nq = (it.r1 - it.r0) * (it.h1 - it.h0);
    let AttnScratch {
        scores, pvt, offs, ..
    } = scratch;
    if scores.len() < nq * n_keys {
        // Sized at once for the largest item this layer can give any thread (every row
        // count up to ATTN_ROWS, every head of the group, the whole cache), so which
        // thread claims which item never makes a later step allocate.
        scores.resize(nq.max(ATTN_ROWS * group) * n_keys.max(g.rows), 0.0);
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
        ggml_f32::pv_t_f32(order, head, g.stride, &runs[..nr], lo, &mut qs[..m], pvt);
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
    let lo = window_lo(l, pos);
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
                    *x = v[at + d * g.stride];
                }
            }
            Buf::F16(v) => {
                for (d, x) in vv.iter_mut().enumerate() {
                    *x = v[at + d * g.stride].to_f32();
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
