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

use synapse_kernels::ggml_f32;
use synapse_kernels::{KernelCtx, KernelPath, OrderClass, QuantMatrix, ops};
use synapse_model::Activation;

use crate::attention::{AttnState, attention};
use crate::error::{Result, RuntimeError};
use crate::kv::{KvCache, KvOp, SlotId};
use crate::load::{FfnW, LinearW, Model, NormW};
use crate::moe::{self, ExpertStats, MoeScratch};
use crate::pipeline::{RowRead, StageLink, StepPacket};
use crate::residency::{ExpertPager, LayerPager, PagingStats};
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
    /// Attention's work items and scores.
    attn: AttnState,
    /// Mixture-of-experts blocks.
    moe: MoeScratch,
}

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
    experts: ExpertStats,
    pager: Option<ExpertPager>,
    /// A dense model's blocks under a budget ([`Executor::page_layers`]).
    layer_pager: Option<LayerPager>,
    /// The layers this executor runs (a pipeline stage's range; all of them by default).
    span: std::ops::Range<usize>,
    /// Where a stage that is not the last sends its rows' hidden states on.
    downstream: Option<Box<dyn StageLink>>,
    /// The slot operations a pass ships downstream (reused).
    ops: Vec<KvOp>,
    /// Per logits row of the next pass: what the first stage reads of it (see
    /// [`StepPacket::reads`]); shipped downstream with the pass.
    row_reads: Vec<RowRead>,
    /// The log-probabilities the downstream reported with the last logits it answered.
    row_logprobs: Vec<Option<crate::pipeline::RowLogprob>>,
    /// Passes sent on by [`Executor::forward_send`] whose logits are still to come: the
    /// logits rows of each, oldest first.
    in_flight: std::collections::VecDeque<usize>,
    /// Set while [`Executor::forward_send`] runs a pass.
    defer: bool,
    /// Set while [`Executor::forward_normed`] runs a pass: it ends before the LM head.
    stop_at_norm: bool,
}

/// Checks that a downstream answered `nl` rows of `vocab` logits; their length.
fn downstream_logits(logits: &[f32], nl: usize, vocab: usize) -> Result<usize> {
    let want = nl * vocab;
    if logits.len() != want {
        return Err(RuntimeError::InvalidParam {
            name: "downstream logits",
            reason: format!("{} values for {nl} rows of {vocab}", logits.len()),
        });
    }
    Ok(want)
}

/// What a pass of a stage gives.
#[derive(Debug)]
pub enum StageOut<'a> {
    /// The logits of the rows that want them (the last stage's, or the downstream's).
    Logits(&'a [f32]),
    /// The rows' hidden states after the stage's last layer (a stage with no downstream).
    Hidden(&'a [f32]),
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
        let n = model.layers.len();
        Self::for_stage(model, threads, 0..n)
    }

    fn build(model: Arc<Model>, threads: usize) -> Result<Self> {
        let threads = threads.max(1);
        let ctx = KernelCtx::with_path_and_threads(KernelPath::from_env()?, threads)?;
        let experts = ExpertStats {
            rows: model
                .layers
                .iter()
                .filter_map(|l| match &l.ffn {
                    FfnW::Moe(m) => Some(vec![0; m.experts.len()]),
                    FfnW::Dense { .. } => None,
                })
                .collect(),
            groups: 0,
        };
        Ok(Executor {
            profile_hash: model.profile.hash(),
            span: 0..model.layers.len(),
            model,
            ctx,
            threads,
            s: Scratch::default(),
            tap: None,
            experts,
            pager: None,
            layer_pager: None,
            downstream: None,
            ops: Vec::new(),
            row_reads: Vec::new(),
            row_logprobs: Vec::new(),
            in_flight: Default::default(),
            defer: false,
            stop_at_norm: false,
        })
    }

    /// An executor of one pipeline stage: it runs `layers` only (the token embedding when
    /// they start at 0, the final norm and LM head when they end at the last layer).
    pub fn for_stage(
        model: Arc<Model>,
        threads: usize,
        layers: std::ops::Range<usize>,
    ) -> Result<Self> {
        crate::load::check_stage_layers(&layers, model.layers.len())?;
        if !model.holds(&layers) {
            return Err(RuntimeError::InvalidParam {
                name: "stage layers",
                reason: format!(
                    "the model holds the weights of layers {:?} only, not {layers:?}",
                    model.present
                ),
            });
        }
        let mut e = Self::build(model, threads)?;
        e.span = layers;
        Ok(e)
    }

    /// The layers this executor runs.
    pub fn layers(&self) -> std::ops::Range<usize> {
        self.span.clone()
    }

    /// Sends each pass's hidden states (with the pass's rows and the cache's recorded slot
    /// operations) to `link`, the next stage, and takes the logits it answers. Only for a
    /// stage that does not end at the last layer.
    pub fn set_downstream(&mut self, link: Box<dyn StageLink>) -> Result<()> {
        if self.span.end == self.model.layers.len() {
            return Err(RuntimeError::InvalidParam {
                name: "downstream",
                reason: "the last stage computes the logits itself".into(),
            });
        }
        self.downstream = Some(link);
        Ok(())
    }

    /// Marks, per logits row of the next pass, what its caller reads of it (a downstream
    /// may then send a token instead of the row; see [`StepPacket::reads`]). Kept until
    /// changed; empty: every row whole.
    pub fn set_row_reads(&mut self, rows: &[RowRead]) {
        self.row_reads.clear();
        self.row_reads.extend_from_slice(rows);
    }

    /// Whether passes go on to a downstream stage.
    pub fn has_downstream(&self) -> bool {
        self.downstream.is_some()
    }

    /// Runs one pass of a first stage that has a downstream ([`Executor::set_downstream`])
    /// and sends it on without waiting for its logits, so the next pass can run here while
    /// this one runs downstream; [`Executor::forward_recv`] takes the logits, in the order
    /// the passes were sent. Every row's K/V is appended here as by [`Executor::forward`].
    pub fn forward_send(&mut self, kv: &mut KvCache, rows: &[Row]) -> Result<()> {
        if self.downstream.is_none() {
            return Err(RuntimeError::InvalidParam {
                name: "forward_send",
                reason: "only a stage with a downstream sends passes on".into(),
            });
        }
        if rows.is_empty() {
            return Err(RuntimeError::InvalidParam {
                name: "forward_send",
                reason: "a pass with no rows".into(),
            });
        }
        self.defer = true;
        let r = self.forward_stage(kv, rows, None).map(|_| ());
        self.defer = false;
        r
    }

    /// The logits of the oldest pass sent by [`Executor::forward_send`] (in row order,
    /// `vocab` values per row that wants them).
    pub fn forward_recv(&mut self) -> Result<&[f32]> {
        let (Some(nl), Some(link)) = (self.in_flight.pop_front(), self.downstream.as_mut()) else {
            return Err(RuntimeError::InvalidParam {
                name: "forward_recv",
                reason: "no pass in flight".into(),
            });
        };
        link.recv(&mut self.s.logits)?;
        link.take_logprobs(&mut self.row_logprobs);
        let want = downstream_logits(&self.s.logits, nl, self.model.vocab())?;
        Ok(&self.s.logits[..want])
    }

    /// The first `n` logits of the last pass (what [`Executor::forward`] or
    /// [`Executor::forward_recv`] returned, `n` its length) and the log-probabilities a
    /// downstream reported with them, per logits row ([`StageLink::take_logprobs`]; empty
    /// when it reported none).
    pub fn last_output(&self, n: usize) -> (&[f32], &[Option<crate::pipeline::RowLogprob>]) {
        (
            &self.s.logits[..n.min(self.s.logits.len())],
            &self.row_logprobs,
        )
    }

    /// Passes sent on and not yet received.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
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

    /// What the mixture-of-experts blocks have done (empty for a dense model).
    pub fn expert_stats(&self) -> &ExpertStats {
        &self.experts
    }

    /// [`Executor::expert_stats`], to reset.
    pub fn expert_stats_mut(&mut self) -> &mut ExpertStats {
        &mut self.experts
    }

    /// Keeps the model's routed experts resident within `budget` bytes from now on (see
    /// [`crate::residency`]); `None` lifts the budget (experts then stay wherever the pager
    /// left them, paging in on use as any mapping does). Results never depend on it.
    pub fn page_experts(&mut self, budget: Option<u64>) -> Result<()> {
        self.pager = match budget {
            Some(b) => Some(ExpertPager::new(&self.model, b)?),
            None => None,
        };
        Ok(())
    }

    /// The expert pager, when a budget is set.
    pub fn expert_pager(&self) -> Option<&ExpertPager> {
        self.pager.as_ref()
    }

    /// The expert pager, mutable (its settings), when a budget is set.
    pub fn expert_pager_mut(&mut self) -> Option<&mut ExpertPager> {
        self.pager.as_mut()
    }

    /// The pager's counters, when a budget is set.
    pub fn paging_stats(&self) -> Option<PagingStats> {
        self.pager.as_ref().map(|p| p.stats())
    }

    /// Keeps a dense model's blocks (their projections) resident within `budget` bytes from
    /// now on (see [`crate::residency::LayerPager`]); `None` lifts the budget (the blocks then
    /// run from the model's mapping again). Results never depend on it.
    pub fn page_layers(&mut self, budget: Option<u64>) -> Result<()> {
        self.layer_pager = match budget {
            Some(b) => Some(LayerPager::new(&self.model, self.span.clone(), b)?),
            None => None,
        };
        Ok(())
    }

    /// The block pager, when a budget is set.
    pub fn layer_pager(&self) -> Option<&LayerPager> {
        self.layer_pager.as_ref()
    }

    /// The block pager, mutable (its settings), when a budget is set.
    pub fn layer_pager_mut(&mut self) -> Option<&mut LayerPager> {
        self.layer_pager.as_mut()
    }

    /// Compute threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The kernel path in use.
    pub fn kernel_path(&self) -> KernelPath {
        self.ctx.path()
    }

    /// Exchanges this executor's kernel context (path, thread pool, scratch) with `other`'s.
    /// Two executors that run one after the other (a draft and its verifier) can so share one
    /// pool: the idle one holds a one-thread context, and no idle pool spins beside the busy
    /// one. Results do not depend on which context runs a pass (the kernels' bits do not
    /// depend on the thread count).
    pub fn swap_kernels(&mut self, other: &mut Executor) {
        std::mem::swap(&mut self.ctx, &mut other.ctx);
        std::mem::swap(&mut self.threads, &mut other.threads);
    }

    /// Runs one pass. Returns the logits of the rows with `logits = true`, in row order,
    /// `vocab` values each. Every row's K/V is appended to its session. A first pipeline
    /// stage gets the logits from its downstream.
    pub fn forward(&mut self, kv: &mut KvCache, rows: &[Row]) -> Result<&[f32]> {
        let span = self.span.clone();
        match self.forward_stage(kv, rows, None)? {
            StageOut::Logits(l) => Ok(l),
            StageOut::Hidden(_) => Err(RuntimeError::InvalidParam {
                name: "stage",
                reason: format!(
                    "layers {}..{} end before the model's last layer and no downstream is set",
                    span.start, span.end
                ),
            }),
        }
    }

    /// Runs one pass of this executor's layers: from the rows' tokens (`hidden = None`, a
    /// stage starting at layer 0) or from the previous stage's hidden states (`hidden`:
    /// `rows × hidden` values). The last stage answers logits; another answers its
    /// downstream's logits, or its own hidden states when it has no downstream.
    pub fn forward_stage(
        &mut self,
        kv: &mut KvCache,
        rows: &[Row],
        hidden: Option<&[f32]>,
    ) -> Result<StageOut<'_>> {
        if !self.defer && !self.in_flight.is_empty() {
            return Err(RuntimeError::InvalidParam {
                name: "forward",
                reason: "a pass would wait for its logits while earlier passes are in flight"
                    .into(),
            });
        }
        let m = self.model.clone();
        let id = kv.identity();
        if id.model != m.ir.fingerprint {
            return Err(RuntimeError::KvIdentity {
                cache: id.to_string(),
                executor: format!("{}/{}", &m.ir.fingerprint[..12], &self.profile_hash[..12]),
            });
        }
        self.validate(kv, rows)?;
        let n = rows.len();
        let hd = m.hidden();
        let span = self.span.clone();
        match hidden {
            None if span.start != 0 => {
                return Err(RuntimeError::InvalidParam {
                    name: "stage input",
                    reason: format!(
                        "a stage starting at layer {} needs hidden states",
                        span.start
                    ),
                });
            }
            Some(h) if span.start == 0 || h.len() != n * hd => {
                return Err(RuntimeError::InvalidParam {
                    name: "stage input",
                    reason: format!(
                        "{} hidden values for {n} rows of width {hd} at layer {}",
                        h.len(),
                        span.start
                    ),
                });
            }
            _ => {}
        }
        if !kv.layers().contains(&span.start) || kv.layers().end < span.end {
            return Err(RuntimeError::InvalidParam {
                name: "stage cache",
                reason: format!(
                    "the cache holds layers {}..{}, the stage runs {}..{}",
                    kv.layers().start,
                    kv.layers().end,
                    span.start,
                    span.end
                ),
            });
        }
        if n == 0 {
            return Ok(StageOut::Logits(&[]));
        }
        let s = &mut self.s;
        s.runs.clear();
        for row in rows {
            match s.runs.last_mut() {
                Some(r) if r.1 == row.order => r.0 += 1,
                _ => s.runs.push((1, row.order)),
            }
        }

        // Embedding, or the previous stage's hidden states.
        let x = ensure(&mut s.x, n * hd);
        match hidden {
            Some(h) => x.copy_from_slice(h),
            None => {
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
            }
        }

        // Mixture-of-experts layers are counted over the whole model.
        let mut moe_layer = m.layers[..span.start]
            .iter()
            .filter(|l| matches!(l.ffn, FfnW::Moe(_)))
            .count();
        for il in span.clone() {
            let l = match self.layer_pager.as_mut() {
                Some(p) => p.acquire(il, &mut self.ctx)?,
                None => &m.layers[il],
            };
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
            {
                let (q, k, v) = (
                    ensure(&mut s.q, n * qd),
                    ensure(&mut s.k, n * kvd),
                    ensure(&mut s.v, n * kvd),
                );
                linear_shared(
                    [&l.q, &l.k, &l.v],
                    &s.xn[..n * hd],
                    &s.runs,
                    [q, k, v],
                    &mut self.ctx,
                )?;
            }
            if let Some(c) = l.clip_qkv {
                // (q and k are clamped after their norms, in `rope_row`.)
                for x in &mut s.v[..n * kvd] {
                    *x = x.clamp(-c, c);
                }
            }
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
                        // SAFETY: rows r0..r1 of q and k belong to this chunk alone.
                        let (qs, ks) = unsafe {
                            (
                                std::slice::from_raw_parts_mut(
                                    qp.get().add(r0 * qd),
                                    (r1 - r0) * qd,
                                ),
                                std::slice::from_raw_parts_mut(
                                    kp.get().add(r0 * kvd),
                                    (r1 - r0) * kvd,
                                ),
                            )
                        };
                        norm_heads(l, qs, qd, ks, kvd);
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
                slot.v[il].write_strided(g.v_row(0) + at, g.stride, &s.v[r * kvd..(r + 1) * kvd]);
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
                &mut s.attn,
                &mut self.ctx,
            );
            tap(&mut self.tap, Stage::KqvOut, Some(il), n, &s.att[..n * qd]);
            let att = match &l.attn_sub_norm {
                Some(sn) => {
                    norm_rows(
                        &s.att[..n * qd],
                        qd,
                        sn,
                        ensure(&mut s.xn, n * qd),
                        &mut self.ctx,
                    );
                    &s.xn[..n * qd]
                }
                None => &s.att[..n * qd],
            };
            linear(
                &l.o,
                att,
                &s.runs,
                ensure(&mut s.tmp, n * hd),
                &mut self.ctx,
            )?;
            tap(&mut self.tap, Stage::AttnOut, Some(il), n, &s.tmp[..n * hd]);
            if let Some(pn) = &l.attn_post_norm {
                ops::rms_norm_rows_inplace(&mut s.tmp[..n * hd], hd, &pn.w, pn.eps);
            }
            if let Some(rs) = m.residual_scale {
                for t in &mut s.tmp[..n * hd] {
                    *t *= rs;
                }
            }
            for (x, t) in s.x[..n * hd].iter_mut().zip(&s.tmp[..n * hd]) {
                *x += *t;
            }
            tap(&mut self.tap, Stage::FfnInp, Some(il), n, &s.x[..n * hd]);
            // FFN.
            norm_rows(
                &s.x[..n * hd],
                hd,
                &l.ffn_norm,
                ensure(&mut s.xn, n * hd),
                &mut self.ctx,
            );
            tap(&mut self.tap, Stage::FfnNorm, Some(il), n, &s.xn[..n * hd]);
            match &l.ffn {
                FfnW::Dense {
                    gate,
                    up,
                    down,
                    act,
                    sub_norm,
                } => {
                    let ff = gate.m.rows();
                    {
                        let (g, u) = (ensure(&mut s.g, n * ff), ensure(&mut s.u, n * ff));
                        linear_shared([gate, up], &s.xn[..n * hd], &s.runs, [g, u], &mut self.ctx)?;
                    }
                    tap(&mut self.tap, Stage::FfnGate, Some(il), n, &s.g[..n * ff]);
                    tap(&mut self.tap, Stage::FfnUp, Some(il), n, &s.u[..n * ff]);
                    let hp = OutPtr(ensure(&mut s.h, n * ff).as_mut_ptr());
                    let (gs, us) = (&s.g[..n * ff], &s.u[..n * ff]);
                    let table = m.gelu_f16_table;
                    let act = *act;
                    self.ctx.parallel_for(n, 16 * n * ff, &|r0, r1| {
                        let (g, u) = (&gs[r0 * ff..r1 * ff], &us[r0 * ff..r1 * ff]);
                        // SAFETY: rows r0..r1 of h belong to this chunk alone (h holds n·ff
                        // values).
                        let h = unsafe {
                            std::slice::from_raw_parts_mut(hp.get().add(r0 * ff), (r1 - r0) * ff)
                        };
                        match act {
                            Activation::GeluTanh => ops::geglu(g, u, h, table),
                            Activation::Relu2 => ops::reglu2(g, u, h),
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
                    let h = match sub_norm {
                        Some(sn) => {
                            norm_rows(&s.h[..n * ff], ff, sn, &mut s.g[..n * ff], &mut self.ctx);
                            &s.g[..n * ff]
                        }
                        None => &s.h[..n * ff],
                    };
                    linear(down, h, &s.runs, ensure(&mut s.tmp, n * hd), &mut self.ctx)?;
                }
                FfnW::Moe(moe) => {
                    let counts = match self.experts.rows.get_mut(moe_layer) {
                        Some(c) => &mut c[..],
                        None => &mut [],
                    };
                    moe_layer += 1;
                    moe::forward(
                        moe,
                        &s.xn[..n * hd],
                        rows,
                        kv.max_chunk(),
                        &s.runs,
                        hd,
                        ensure(&mut s.tmp, n * hd),
                        &mut s.moe,
                        &mut self.ctx,
                        m.gelu_f16_table,
                        (counts, &mut self.experts.groups),
                        self.pager.as_mut().map(|p| (p, moe_layer - 1)),
                        (&mut self.tap, il),
                    )?
                }
            }
            tap(&mut self.tap, Stage::FfnOut, Some(il), n, &s.tmp[..n * hd]);
            if let Some(pn) = &l.ffn_post_norm {
                ops::rms_norm_rows_inplace(&mut s.tmp[..n * hd], hd, &pn.w, pn.eps);
            }
            if let Some(rs) = m.residual_scale {
                for t in &mut s.tmp[..n * hd] {
                    *t *= rs;
                }
            }
            for (x, t) in s.x[..n * hd].iter_mut().zip(&s.tmp[..n * hd]) {
                *x += *t;
            }
            tap(&mut self.tap, Stage::LOut, Some(il), n, &s.x[..n * hd]);
            // Paged experts: the next layer's router over this layer's output predicts the
            // experts it will use, and their reads start now (a prediction: no result
            // depends on it).
            if let (Some(p), Some(next)) = (self.pager.as_mut(), m.layers.get(il + 1))
                && il + 1 < span.end
                && p.prefetching()
                && let FfnW::Moe(nm) = &next.ffn
            {
                norm_rows(
                    &s.x[..n * hd],
                    hd,
                    &next.ffn_norm,
                    ensure(&mut s.xn, n * hd),
                    &mut self.ctx,
                );
                moe::predict(
                    nm,
                    &s.xn[..n * hd],
                    &s.runs,
                    hd,
                    &mut s.moe,
                    &mut self.ctx,
                    p,
                    moe_layer,
                )?;
            }
        }

        // Session bookkeeping.
        for row in rows {
            if let Some(slot) = kv.slots[row.slot as usize].as_mut() {
                slot.tokens.push(row.token);
                slot.orders.push(row.order);
            }
        }

        let nl = rows.iter().filter(|r| r.logits).count();
        if span.end < m.layers.len() {
            // Not the last stage: the next one goes on from these hidden states.
            let Some(link) = self.downstream.as_mut() else {
                return Ok(StageOut::Hidden(&self.s.x[..n * hd]));
            };
            kv.take_journal(&mut self.ops);
            let packet = StepPacket {
                ops: &self.ops,
                rows,
                hidden: &self.s.x[..n * hd],
                reads: if self.row_reads.len() == nl {
                    &self.row_reads
                } else {
                    &[]
                },
            };
            if self.defer {
                link.send(&packet)?;
                self.in_flight.push_back(nl);
                return Ok(StageOut::Logits(&[]));
            }
            link.step(&packet, &mut self.s.logits)?;
            link.take_logprobs(&mut self.row_logprobs);
            let want = downstream_logits(&self.s.logits, nl, m.vocab())?;
            return Ok(StageOut::Logits(&self.s.logits[..want]));
        }

        // Logits for the rows that want them.
        if nl == 0 {
            return Ok(StageOut::Logits(&[]));
        }
        // The LM head sums a session's prompt rows in the order of a call with as many rows
        // as that session asks prompt logits for in this pass (llama.cpp's `n_outputs` of a
        // batch: one for a prompt's last row), whatever else shares the pass; a one-row-order
        // row (a decode step, or a verified draft position) always in the one-row order, so
        // k + 1 verified positions give the bits of k + 1 decode steps.
        let heads = &mut s.slots;
        heads.clear();
        for row in rows
            .iter()
            .filter(|r| r.logits && r.order != OrderClass::One)
        {
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
                let class = if row.order == OrderClass::One {
                    OrderClass::One
                } else {
                    let count = heads.iter().find(|e| e.0 == row.slot).map_or(1, |e| e.2);
                    OrderClass::of(count)
                };
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
        if self.stop_at_norm {
            return Ok(StageOut::Hidden(&self.s.sel[..nl * hd]));
        }
        let vocab = m.vocab();
        let logits = ensure(&mut s.logits, nl * vocab);
        linear(&m.head, &s.sel[..nl * hd], &s.runs, logits, &mut self.ctx)?;
        finish_logits(&m, logits);
        tap(
            &mut self.tap,
            Stage::ResultOutput,
            None,
            nl,
            &s.logits[..nl * vocab],
        );
        Ok(StageOut::Logits(&self.s.logits[..nl * vocab]))
    }

    /// Runs one pass as [`Executor::forward`] does (every row's K/V appended), but stops
    /// before the LM head: returns the final-normed hidden states of the rows with `logits =
    /// true`, `hidden` values each, in row order — the LM head's inputs, for
    /// [`Executor::head_logits`] or a vocabulary shortlist ([`Executor::shortlist_logits`]).
    /// Only an executor that runs the model's last layer and has no downstream.
    pub fn forward_normed(&mut self, kv: &mut KvCache, rows: &[Row]) -> Result<&[f32]> {
        if self.span.end < self.model.layers.len() || self.downstream.is_some() {
            return Err(RuntimeError::InvalidParam {
                name: "forward_normed",
                reason: "only the executor of the model's last layers computes the head inputs"
                    .into(),
            });
        }
        self.stop_at_norm = true;
        let r = self.forward_stage(kv, rows, None).map(|o| match o {
            StageOut::Hidden(h) => h.len(),
            // No row wanted logits.
            StageOut::Logits(_) => 0,
        });
        self.stop_at_norm = false;
        Ok(&self.s.sel[..r?])
    }

    /// The full LM head over `normed` (rows of [`Executor::forward_normed`]'s output), every
    /// row in the one-row float order: row `i`'s logits are, bit for bit, those a decode step
    /// ([`Row::decode`]) of that position returns from [`Executor::forward`].
    pub fn head_logits(&mut self, normed: &[f32]) -> Result<&[f32]> {
        let m = self.model.clone();
        let hd = m.hidden();
        if normed.is_empty() || !normed.len().is_multiple_of(hd) {
            return Err(RuntimeError::InvalidParam {
                name: "head_logits",
                reason: format!("{} values are not whole rows of {hd}", normed.len()),
            });
        }
        let n = normed.len() / hd;
        let vocab = m.vocab();
        let logits = ensure(&mut self.s.logits, n * vocab);
        linear(
            &m.head,
            normed,
            &[(n, OrderClass::One)],
            logits,
            &mut self.ctx,
        )?;
        finish_logits(&m, logits);
        Ok(&self.s.logits[..n * vocab])
    }

    /// The logits of the vocabulary entries of `head` (rows of this model's LM head, as
    /// [`QuantMatrix::gather_rows`] and its bias gathered make them) for one normed row, in
    /// the one-row order: `out[i]` is bit for bit [`Executor::head_logits`]'s value for the
    /// `i`-th gathered token.
    pub fn shortlist_logits(
        &mut self,
        head: &LinearW,
        normed: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let m = self.model.clone();
        if normed.len() != m.hidden() || out.len() != head.m.rows() || head.m.cols() != m.hidden() {
            return Err(RuntimeError::InvalidParam {
                name: "shortlist_logits",
                reason: format!(
                    "a {}×{} shortlist over {} inputs into {} outputs (hidden {})",
                    head.m.rows(),
                    head.m.cols(),
                    normed.len(),
                    out.len(),
                    m.hidden()
                ),
            });
        }
        linear(head, normed, &[(1, OrderClass::One)], out, &mut self.ctx)?;
        finish_logits(&m, out);
        Ok(())
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
            let e = match seen.iter_mut().find(|e| e.0 == row.slot) {
                Some(e) => e,
                None => {
                    let slot = kv.slot(row.slot)?;
                    // Only slots of this executor's precision profile.
                    if slot.profile != self.profile_hash {
                        return Err(RuntimeError::KvIdentity {
                            cache: format!(
                                "{} slot {} (profile {})",
                                kv.identity(),
                                row.slot,
                                &slot.profile[..slot.profile.len().min(12)]
                            ),
                            executor: format!(
                                "{}/{}",
                                &self.model.ir.fingerprint[..12],
                                &self.profile_hash[..12]
                            ),
                        });
                    }
                    seen.push((row.slot, slot.tokens.len() as u32, 0));
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
        ops::rms_norm_rows(&x[r0 * hd..r1 * hd], hd, &n.w, n.eps, y);
    });
}

/// The per-head q/k norms of consecutive rows (`q`: rows of `qd` values, `k`: of `kvd`), all
/// heads of all rows in one call each, so that their sums advance together
/// ([`ops::rms_norm_rows_inplace`]).
fn norm_heads(l: &crate::load::LayerW, q: &mut [f32], qd: usize, k: &mut [f32], kvd: usize) {
    // Per head (a `head_dim` weight), or over the whole projection (OLMoE).
    fn slab(x: &mut [f32], width: usize, n: &NormW) {
        let hd = n.w.len();
        if hd == 0 || width == 0 {
            return;
        }
        if width.is_multiple_of(hd) {
            ops::rms_norm_rows_inplace(x, hd, &n.w, n.eps);
        } else {
            for row in x.chunks_exact_mut(width) {
                ops::rms_norm_rows_inplace(&mut row[..width / hd * hd], hd, &n.w, n.eps);
            }
        }
    }
    if let Some(nq) = &l.q_norm {
        slab(q, qd, nq);
    }
    if let Some(nk) = &l.k_norm {
        slab(k, kvd, nk);
    }
}

/// Row `pos`'s clamp (`clip_qkv`) and RoPE (`cs`: scratch of `n_rot / 2` pairs), after its
/// per-head norms ([`norm_heads`]).
fn rope_row(
    l: &crate::load::LayerW,
    pos: u32,
    q: &mut [f32],
    k: &mut [f32],
    cs: &mut [(f32, f32)],
) {
    if let Some(c) = l.clip_qkv {
        for x in q.iter_mut().chain(k.iter_mut()) {
            *x = x.clamp(-c, c);
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

thread_local! {
    /// A W1.58A8 projection's quantised inputs (grow-only: no allocation in steady steps).
    static ACT_A8: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One token's activations quantised to 8 bits by absmax and back, as transformers' BitNet
/// `ActQuant` does in f32: `a = 127 / max(max|x|, 1e-5)`, `clamp(round(x·a), −128, 127) / a`.
fn act_quant_absmax8(x: &[f32], out: &mut [f32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let a = 127.0 / amax.max(1e-5);
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v * a).round_ties_even().clamp(-128.0, 127.0) / a;
    }
}

/// The head's elementwise tail: soft-capping, then the logit scale.
fn finish_logits(m: &Model, logits: &mut [f32]) {
    if let Some(c) = m.softcap {
        for v in logits.iter_mut() {
            *v = c * (*v / c).tanh();
        }
    }
    if let Some(ls) = m.logit_scale {
        for v in logits.iter_mut() {
            *v *= ls;
        }
    }
}

/// `y = W·x (+ b)` over `runs` of rows, each run in its own order class.
/// A W1.58A8 projection quantises each row of `x` first.
pub(crate) fn linear(
    l: &LinearW,
    x: &[f32],
    runs: &[(usize, OrderClass)],
    y: &mut [f32],
    ctx: &mut KernelCtx,
) -> Result<()> {
    let m: &QuantMatrix = &l.m;
    if l.act_a8 {
        ACT_A8.with(|cell| -> Result<()> {
            let mut q = cell.borrow_mut();
            if q.len() < x.len() {
                q.resize(x.len(), 0.0);
            }
            let q = &mut q[..x.len()];
            for (xr, qr) in x.chunks_exact(m.cols()).zip(q.chunks_exact_mut(m.cols())) {
                act_quant_absmax8(xr, qr);
            }
            m.matmul_runs(q, runs, y, ctx)?;
            Ok(())
        })?;
    } else {
        m.matmul_runs(x, runs, y, ctx)?;
    }
    add_bias(l, y);
    Ok(())
}

/// `y += b` per output row when the projection has a bias.
fn add_bias(l: &LinearW, y: &mut [f32]) {
    if let Some(b) = &l.bias {
        for yr in y.chunks_exact_mut(b.len()) {
            for (y, &b) in yr.iter_mut().zip(b) {
                *y += b;
            }
        }
    }
}

/// [`linear`] of several projections over the same input rows (q/k/v, gate/up): one
/// parallel region for all of them where the kernels allow
/// (`QuantMatrix::matmul_runs_shared`, same bits), then each bias. W1.58A8 projections
/// (which quantise their input first) run through [`linear`].
pub(crate) fn linear_shared<const N: usize>(
    ls: [&LinearW; N],
    x: &[f32],
    runs: &[(usize, OrderClass)],
    mut ys: [&mut [f32]; N],
    ctx: &mut KernelCtx,
) -> Result<()> {
    if ls.iter().any(|l| l.act_a8) {
        for (l, y) in ls.iter().zip(ys) {
            linear(l, x, runs, y, ctx)?;
        }
        return Ok(());
    }
    QuantMatrix::matmul_runs_shared(&ls.map(|l| &*l.m), x, runs, &mut ys, ctx)?;
    for (l, y) in ls.iter().zip(ys) {
        add_bias(l, y);
    }
    Ok(())
}

#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
impl OutPtr {
    /// By-value access, so closures capture the whole (Sync) wrapper.
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: users write disjoint slices through it (attention items, RoPE rows).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}
