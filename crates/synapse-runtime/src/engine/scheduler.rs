//! The continuous-batching scheduler: which rows of which sessions run in the next forward
//! pass, and what their logits become.
//!
//! Invariants (tested in `tests/engine.rs`):
//! - Every step: each decoding session's next row first, then prompt chunks in admission
//!   order up to the step's token budget (at most the cache's `max_chunk` rows of one
//!   session). A prompt therefore never starves running decodes: while it prefills, every
//!   decoding session still gets one token per step.
//! - Batch invariance: a row's float order is its own session's ([`prompt_order`] for prompt
//!   rows, the one-row order for decode steps), so a session's logits and tokens are
//!   bit-identical whatever shares the pass and wherever the budget cuts its prompt.
//! - A cancelled session (queued, mid-prefill or mid-decode) leaves at the next step; its
//!   slot keeps its K/V as a prefix-cache entry and is handed to the next session.
//! - Prefix cache: a new session takes the free slot whose held (token, order) sequence
//!   shares the longest prefix with its prompt (or copies a running session's prefix when
//!   that one is longer); reused positions are exactly what a fresh run would compute, so
//!   results equal a fresh run bit for bit.
//! - Steady decode allocates nothing in the scheduler or the executor (buffers are reused).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::mpsc::unbounded_channel;

use super::api::{EngineConfig, Event, FinishReason, Request, Session, SubmitError, TokenPieces};
use super::head::HeadDrafter;
use super::session::{Active, After, Phase, Waiting};
use super::stats::SharedStats;
use crate::error::{Result, RuntimeError};
use crate::escalation::{CostModel, MAX_DRAFT, ewma};
use crate::executor::{Executor, Row, prompt_order};
use crate::kv::{KvCache, SlotId};
use crate::load::{FfnW, Model};
use crate::pipeline::{RowRead, StageLink};
use crate::residency::PagingStats;
use crate::sampling::Sampler;
use synapse_kernels::OrderClass;

/// A running session's prefix is copied into a new session's slot when it serves at least
/// this many more positions than the best free slot (copying K/V rows is cheap next to
/// recomputing them, but not free).
const COPY_MIN_GAIN: usize = 16;

/// Most log-probability alternatives a request may ask for per token.
pub const MAX_TOP_LOGPROBS: usize = 64;

/// What makes a scheduler the first stage of a layer pipeline.
pub struct PipelineHead {
    /// It runs layers `0..layers` (at least one, fewer than the model's).
    pub layers: usize,
    /// The rest of the pipeline.
    pub link: Box<dyn StageLink>,
    /// Passes in flight at once (1: each pass waits for its logits; 2: a second batch of
    /// sessions runs here while the first runs downstream, so both ends of a hop work).
    pub in_flight: usize,
}

impl std::fmt::Debug for PipelineHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineHead")
            .field("layers", &self.layers)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// The scheduler core: owns the executor, the KV cache and the sessions. [`super::Engine`]
/// runs it on its own thread; tests may drive it step by step.
pub struct Scheduler {
    /// How the memory budget was divided.
    ledger: Option<super::api::MemoryLedger>,
    /// One executor per precision profile still in use; new sessions run on `current`
    /// (a profile installed by [`Scheduler::install`]), running ones keep theirs to the end.
    execs: Vec<Option<Executor>>,
    current: usize,
    /// The current executor's profile hash.
    current_profile: String,
    kv: KvCache,
    pieces: Arc<dyn TokenPieces>,
    cfg: EngineConfig,
    eog: Vec<u32>,
    vocab: usize,
    waiting: VecDeque<Waiting>,
    active: Vec<Active>,
    /// Per slot: busy, and when it was last used (LRU among cached prefixes).
    slot_busy: Vec<bool>,
    slot_used: Vec<u64>,
    tick: u64,
    rows: Vec<Row>,
    /// Per logits row of the pass: the index of its session in `active`.
    owners: Vec<usize>,
    /// Per session of the pass: (index in `active`, rows run).
    ran: Vec<(usize, usize)>,
    logits: Vec<f32>,
    done: Vec<(usize, FinishReason)>,
    /// Of `done`: sessions whose pass failed (their error was sent; no `Done`).
    failed: Vec<usize>,
    retired: Vec<(Active, FinishReason, bool)>,
    next_id: u64,
    pub(crate) stats: Arc<SharedStats>,
    /// Exact escalation: the draft executor (its slots are `slots..2·slots`, session slot
    /// `s` drafting in `slots + s`), the cost model choosing each step's `k`, this step's
    /// `k`, and the draft passes' rows and logits owners.
    draft: Option<Executor>,
    draft_profile: String,
    dcost: CostModel,
    step_k: usize,
    /// Speculative sampling's scratch (the source's distribution, the residual), for the
    /// sampled escalating sessions.
    spec: Option<crate::escalation::Speculative>,
    drows: Vec<Row>,
    downers: Vec<usize>,
    /// Whether the pass being run holds prompt rows (its time then says nothing of drafting).
    pass_has_prompt: bool,
    /// Exact escalation by a head-only draft ([`EngineConfig::head_draft`]).
    head: Option<HeadDrafter>,
    /// The rounds verified by the last rows taken: (drafts, accepted) per session.
    rounds: Vec<(usize, usize)>,
    /// The first stage of a layer pipeline (no profile changes).
    pipelined: bool,
    /// A mixture of experts: each prompt batch (`max_chunk` rows from position 0) runs whole
    /// in one pass, so that the experts ggml tiles for 8+ rows of a batch see all of them.
    whole_batches: bool,
    /// Per logits row of a pipelined pass: what its session reads of it.
    row_reads: Vec<RowRead>,
    /// Passes a pipeline's first stage keeps in flight (1 everywhere else), the passes sent
    /// and not yet answered (oldest first), and the most decode rows the next pass takes.
    depth: usize,
    flights: VecDeque<Flight>,
    max_decodes: usize,
    /// The paging counters (experts, blocks) of executors already dropped.
    paged_before: (PagingStats, PagingStats),
}

/// A pass sent down a pipeline, as its logits will be read: the sessions by id (indices in
/// `active` move as sessions retire meanwhile).
#[derive(Debug, Default)]
struct Flight {
    /// Per logits row: its session.
    owners: Vec<u64>,
    /// Per session: rows run.
    ran: Vec<(u64, usize)>,
    has_prompt: bool,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("waiting", &self.waiting.len())
            .field("active", &self.active.len())
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// Checks a request against an engine's limits (`ctx` positions per session, `vocab`
/// tokens) before it is queued; what [`super::Engine::submit`] checks first.
pub fn validate(req: &Request, ctx: usize, vocab: usize) -> std::result::Result<(), SubmitError> {
    if req.prompt.is_empty() {
        return Err(SubmitError::Invalid {
            param: "prompt",
            reason: "the prompt is empty".into(),
        });
    }
    if req.prompt.len() >= ctx {
        return Err(SubmitError::PromptTooLong {
            tokens: req.prompt.len(),
            limit: ctx.saturating_sub(1),
        });
    }
    if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(SubmitError::Invalid {
            param: "prompt",
            reason: format!("token id {t} is outside the vocabulary of {vocab}"),
        });
    }
    if let Some(k) = req.logprobs
        && k > MAX_TOP_LOGPROBS
    {
        return Err(SubmitError::Invalid {
            param: "top_logprobs",
            reason: format!("at most {MAX_TOP_LOGPROBS} alternatives, not {k}"),
        });
    }
    if req.max_tokens == 0 {
        return Err(SubmitError::Invalid {
            param: "max_tokens",
            reason: "must be at least 1".into(),
        });
    }
    if req.forced.len() >= req.max_tokens || req.prompt.len() + req.forced.len() >= ctx {
        return Err(SubmitError::Invalid {
            param: "forced",
            reason: format!(
                "{} known tokens leave nothing to generate (max_tokens {}, context {ctx})",
                req.forced.len(),
                req.max_tokens
            ),
        });
    }
    if let Some(&t) = req.forced.iter().find(|&&t| t as usize >= vocab) {
        return Err(SubmitError::Invalid {
            param: "forced",
            reason: format!("token id {t} is outside the vocabulary of {vocab}"),
        });
    }
    if let Some(&(t, b)) = req
        .logit_bias
        .iter()
        .find(|&&(t, b)| t as usize >= vocab || b.is_nan())
    {
        return Err(SubmitError::Invalid {
            param: "logit_bias",
            reason: format!("token {t} (bias {b}) is not a vocabulary id with a number"),
        });
    }
    if let Err(e) = req.sampling.validate() {
        return Err(SubmitError::Invalid {
            param: "sampling",
            reason: e.to_string(),
        });
    }
    Ok(())
}

impl Scheduler {
    /// A scheduler over `model` with `cfg.slots` sessions of `cfg.ctx` positions.
    pub fn new(model: Arc<Model>, pieces: Arc<dyn TokenPieces>, cfg: EngineConfig) -> Result<Self> {
        Self::build(model, pieces, cfg, None)
    }

    /// A scheduler that is the first stage of a layer pipeline: it runs the embedding and
    /// layers `0..head.layers` itself, holds the K/V of those layers, and hands each pass on
    /// through `head.link` (see [`crate::pipeline`]). Exact escalation, expert paging and
    /// profile changes are not available on a pipeline.
    pub fn new_pipeline(
        model: Arc<Model>,
        pieces: Arc<dyn TokenPieces>,
        cfg: EngineConfig,
        head: PipelineHead,
    ) -> Result<Self> {
        Self::build(model, pieces, cfg, Some(head))
    }

    fn build(
        model: Arc<Model>,
        pieces: Arc<dyn TokenPieces>,
        cfg: EngineConfig,
        head: Option<PipelineHead>,
    ) -> Result<Self> {
        let invalid = |reason: String| RuntimeError::InvalidParam {
            name: "engine config",
            reason,
        };
        if cfg.slots == 0 || cfg.ctx < 2 || cfg.ubatch == 0 {
            return Err(invalid("slots, ctx ≥ 2 and ubatch must be positive".into()));
        }
        if cfg.step_tokens <= cfg.slots {
            return Err(invalid(format!(
                "step_tokens ({}) must exceed slots ({}): decodes take one row each per step",
                cfg.step_tokens, cfg.slots
            )));
        }
        // A mixture of experts runs each prompt batch whole in one pass ([`pass_chunk`]).
        let whole_batches = model.layers.iter().any(|l| matches!(l.ffn, FfnW::Moe(_)));
        let chunk = pass_chunk(&model, &cfg);
        if let Some(d) = &cfg.draft {
            if d.ir.fingerprint != model.ir.fingerprint {
                return Err(invalid(
                    "the draft is another model (fingerprint differs): a draft must be a \
                     precision profile of the served model"
                        .into(),
                ));
            }
            if !(1..=MAX_DRAFT).contains(&cfg.draft_k) {
                return Err(invalid(format!(
                    "draft_k {} is outside 1..={MAX_DRAFT}",
                    cfg.draft_k
                )));
            }
            if chunk < 2 {
                return Err(invalid("a verify pass needs ubatch ≥ 2".into()));
            }
        }
        if cfg.head_draft.is_some() {
            if cfg.draft.is_some() {
                return Err(invalid(
                    "a draft profile and a head-only draft exclude each other".into(),
                ));
            }
            if !(1..=MAX_DRAFT).contains(&cfg.draft_k) {
                return Err(invalid(format!(
                    "draft_k {} is outside 1..={MAX_DRAFT}",
                    cfg.draft_k
                )));
            }
        }
        if let Some(h) = &head
            && (cfg.draft.is_some()
                || cfg.head_draft.is_some()
                || h.layers == 0
                || h.layers >= model.layers.len())
        {
            return Err(invalid(format!(
                "a pipeline's first stage runs layers 0..{} of {} and takes no draft",
                h.layers,
                model.layers.len()
            )));
        }
        let layers = head.as_ref().map_or(model.layers.len(), |h| h.layers);
        // With a draft, each session slot has a draft slot beside it.
        let kv_slots = if cfg.draft.is_some() {
            2 * cfg.slots
        } else {
            cfg.slots
        };
        let mut kv =
            KvCache::for_layers(&model, cfg.kv_dtype, kv_slots, cfg.ctx, chunk, 0..layers)?;
        kv.commit_slots();
        kv.set_prefix_batches(whole_batches);
        // Weights counted once; a draft's are counted whole (conservative: it shares the
        // tensors it does not re-encode). A pipeline's first stage counts its own layers.
        let weights = if head.is_some() {
            model.stage_weight_bytes(0..layers) as u64
        } else {
            model.weight_bytes() as u64
        } + cfg.draft.as_ref().map_or(0, |d| d.weight_bytes() as u64);
        // A head-only draft: its shortlist (bounded), and the head over at most `head_rows`
        // rows a step.
        let head_rows = (2 * cfg.draft_k).max(cfg.slots + 1);
        let (weights, head_drafter) = match &cfg.head_draft {
            Some(base) => (
                weights + HeadDrafter::bytes_bound(&model, base.len(), head_rows),
                Some(HeadDrafter::new(&model, base, cfg.slots, head_rows)?),
            ),
            None => (weights, None),
        };
        let (kv_total, scratch) = kv_and_scratch_bytes(&model, &cfg, layers)?;
        debug_assert_eq!(kv_total, (kv.slot_bytes() * kv_slots) as u64);
        let need = weights + kv_total + scratch;
        // A mixture of experts that does not fit whole pages its routed experts within what
        // the weights outside them, the KV and the compute scratch leave.
        // A dense model likewise pages its blocks' projections (the embedding and head stay
        // mapped, each with the folios its ends may drag in).
        let experts = model.expert_bytes() as u64;
        let layer_bytes = crate::residency::LayerPager::pageable_bytes(&model, 0..layers);
        let mut expert_budget = None;
        let mut layer_budget = None;
        if let Some(budget) = cfg.memory
            && need > budget
        {
            let alone = cfg.draft.is_none() && head.is_none();
            match paging_budgets(&model, layers, weights, kv_total + scratch, budget, alone) {
                Some((e, l)) => (expert_budget, layer_budget) = (e, l),
                None => {
                    let per = kv.slot_bytes() as u64;
                    let fit = budget.saturating_sub(weights + scratch) / per.max(1);
                    return Err(RuntimeError::MemoryBudget {
                        budget,
                        reason: format!(
                            "weights take {weights} B, compute scratch {scratch} B and each of \
                             {} slots {per} B of KV ({} positions); {fit} slots fit (lower \
                             --parallel or --ctx-size)",
                            cfg.slots, cfg.ctx
                        ),
                    });
                }
            }
        }
        let eog = model.ir.special.eos.clone();
        let vocab = model.vocab();
        let mut exec = Executor::for_stage(model, cfg.threads, 0..layers)?;
        let pipelined = head.is_some();
        let depth = head.as_ref().map_or(1, |h| h.in_flight.clamp(1, 2));
        if let Some(h) = head {
            kv.set_journal(true);
            exec.set_downstream(h.link)?;
        }
        if let Some(b) = expert_budget {
            exec.page_experts(Some(b))
                .map_err(|e| RuntimeError::MemoryBudget {
                    budget: cfg.memory.unwrap_or(0),
                    reason: format!(
                        "the weights outside the routed experts, the KV and scratch leave {b} B \
                         for {experts} B of experts ({e})"
                    ),
                })?;
        }
        if let Some(b) = layer_budget {
            exec.page_layers(Some(b))
                .map_err(|e| RuntimeError::MemoryBudget {
                    budget: cfg.memory.unwrap_or(0),
                    reason: format!(
                        "the embedding and head, the KV and scratch leave {b} B for \
                         {layer_bytes} B of block weights ({e})"
                    ),
                })?;
        }
        let ledger = cfg.memory.map(|budget| super::api::MemoryLedger {
            budget,
            weights,
            experts,
            kv: kv_total,
            scratch,
            experts_budget: expert_budget,
            layers: if experts == 0 { layer_bytes } else { 0 },
            layers_budget: layer_budget,
        });
        let profile = exec.model().profile.hash();
        // The draft runs on the verifier's thread pool (lent for its passes).
        let draft = match &cfg.draft {
            Some(d) => Some(Executor::new(d.clone(), 1)?),
            None => None,
        };
        let draft_profile = draft
            .as_ref()
            .map_or(String::new(), |d| d.model().profile.hash());
        // A draft that reads no fewer weight bytes than the model cannot make a step faster
        // where decoding streams its weights (and on compute-bound kernels even less): with
        // the cost model on, it never drafts (no probe round pays for finding that out).
        let mut dcost = CostModel::new(cfg.draft_k.clamp(1, MAX_DRAFT), true);
        if let (Some(d), true) = (&cfg.draft, cfg.draft_adaptive)
            && d.weight_bytes() >= exec.model().weight_bytes()
        {
            tracing::warn!(
                draft_bytes = d.weight_bytes(),
                model_bytes = exec.model().weight_bytes(),
                "the draft reads no fewer weight bytes than the model: drafting is off"
            );
            dcost.never_draft();
        }
        let stats = Arc::new(SharedStats::default());
        stats.slots.store(cfg.slots as u64, Ordering::Relaxed);
        stats
            .kv_budget_bytes
            .store((kv.slot_bytes() * kv_slots) as u64, Ordering::Relaxed);
        stats.set_profile(&profile, weights);
        if let Some(h) = &head_drafter {
            stats
                .draft_shortlist
                .store(h.list.len() as u64, Ordering::Relaxed);
        }
        Ok(Scheduler {
            execs: vec![Some(exec)],
            current: 0,
            current_profile: profile,
            kv,
            pieces,
            eog,
            vocab,
            waiting: VecDeque::new(),
            active: Vec::with_capacity(cfg.slots),
            slot_busy: vec![false; cfg.slots],
            slot_used: vec![0; cfg.slots],
            tick: 0,
            rows: Vec::with_capacity(cfg.step_tokens),
            owners: Vec::with_capacity(cfg.step_tokens),
            ran: Vec::with_capacity(cfg.slots),
            logits: vec![0.0; vocab],
            done: Vec::with_capacity(cfg.slots),
            failed: Vec::new(),
            retired: Vec::with_capacity(cfg.slots),
            next_id: 0,
            stats,
            dcost,
            draft,
            draft_profile,
            step_k: 0,
            spec: None,
            drows: Vec::with_capacity(cfg.slots * chunk),
            downers: Vec::with_capacity(cfg.slots),
            pass_has_prompt: false,
            head: head_drafter,
            rounds: Vec::with_capacity(cfg.slots),
            pipelined,
            whole_batches,
            row_reads: Vec::with_capacity(cfg.step_tokens),
            depth,
            flights: VecDeque::with_capacity(depth),
            max_decodes: usize::MAX,
            paged_before: Default::default(),
            ledger,
            cfg,
        })
    }

    /// The length of a head-only draft's initial shortlist (`None`: no head-only draft).
    pub fn head_shortlist_base(&self) -> Option<usize> {
        self.head.as_ref().map(|h| h.base_len())
    }

    /// A head-only draft's shortlist now: (tokens on it, tokens the source chose off it,
    /// rebuilds from its base).
    pub fn head_shortlist(&self) -> Option<(usize, u64, u64)> {
        self.head
            .as_ref()
            .map(|h| (h.list.len(), h.misses, h.rebuilds))
    }

    /// How `EngineConfig::memory` was divided (`None` without a budget).
    pub fn ledger(&self) -> Option<super::api::MemoryLedger> {
        self.ledger
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The executor.
    pub fn executor(&self) -> &Executor {
        self.execs[self.current]
            .as_ref()
            .expect("the current executor is always present")
    }

    /// The engine's counters and gauges now.
    pub fn stats(&self) -> super::api::EngineStats {
        self.stats.snapshot()
    }

    /// The KV cache (slots hold running sessions and cached prefixes).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Queues a request (no queue bound here: [`super::Engine::submit`] applies it).
    pub fn submit(&mut self, req: Request) -> std::result::Result<Session, SubmitError> {
        validate(&req, self.cfg.ctx, self.vocab)?;
        self.next_id += 1;
        let (tx, rx) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let session = Session {
            id: self.next_id,
            events: rx,
            cancel: cancel.clone(),
        };
        self.stats.pending.fetch_add(1, Ordering::Relaxed);
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        self.enqueue(Waiting {
            id: self.next_id,
            req,
            tx,
            cancel,
            since: Instant::now(),
        });
        Ok(session)
    }

    pub(crate) fn enqueue(&mut self, w: Waiting) {
        self.waiting.push_back(w);
        self.publish();
    }

    /// One pass over a two-token prompt (BOS and EOS, as llama-server's warm-up) and one
    /// decode row, on slot 0, then forgotten: the weights those passes read are faulted in
    /// from the model's mapping — or paged in within the memory budget, through the same
    /// pagers as any pass — and the executor's scratch and kernel setup exist before the
    /// first request, which would otherwise pay for them in its time to first token.
    ///
    /// Leaves no trace a session can see: call it before anything is submitted; slot 0 is
    /// closed again and no request, token or step is counted (the pagers' counters do count
    /// what it paged). A pipeline's first stage does not warm up (its rows would go
    /// downstream); it answers `Ok(None)`. Returns how long the passes took.
    pub fn warm_up(&mut self) -> Result<Option<std::time::Duration>> {
        if self.pipelined {
            return Ok(None);
        }
        if !self.is_idle() || self.slot_busy.iter().any(|&b| b) {
            return Err(RuntimeError::InvalidParam {
                name: "warm-up",
                reason: "the engine already has sessions".into(),
            });
        }
        let Some(exec) = self.execs[self.current].as_mut() else {
            return Ok(None);
        };
        let t0 = Instant::now();
        let special = &exec.model().ir.special;
        let vocab = self.vocab as u32;
        let valid = |t: Option<u32>| t.filter(|&t| t < vocab).unwrap_or(0);
        let prompt = [valid(special.bos), valid(special.eos.first().copied())];
        let chunk = self.kv.max_chunk();
        let mut rows: Vec<Row> = prompt
            .iter()
            .enumerate()
            .map(|(i, &token)| Row {
                slot: 0,
                pos: i as u32,
                token,
                logits: i + 1 == prompt.len(),
                order: prompt_order(i, prompt.len(), chunk),
            })
            .collect();
        let mut result = self.kv.open(0).and_then(|_| {
            self.kv.set_profile(0, &self.current_profile)?;
            exec.forward(&mut self.kv, &rows).map(|_| ())
        });
        if result.is_ok() && self.cfg.ctx > prompt.len() {
            rows.clear();
            rows.push(Row::decode(0, prompt.len() as u32, prompt[1]));
            result = exec.forward(&mut self.kv, &rows).map(|_| ());
        }
        self.kv.close(0);
        result?;
        let dt = t0.elapsed();
        tracing::info!(ms = dt.as_secs_f64() * 1e3, "warm-up pass");
        self.publish();
        Ok(Some(dt))
    }

    /// Whether nothing is queued or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty()
    }

    /// Sessions holding a slot.
    pub fn active(&self) -> usize {
        self.active.len()
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Installs `model` (the same model at another precision profile) as the profile new
    /// sessions get from the next admission on; running sessions finish on the profile they
    /// started with (their K/V belongs to it), and an executor no session uses any more is
    /// dropped. With `EngineConfig::memory` set, the new profile's weights plus the KV must fit
    /// it, or else its routed experts (a dense model's blocks) page within what the rest
    /// leaves, as the first profile's would; and two profiles never run at once: while
    /// sessions of an earlier profile run, admission waits (requests stay queued) until they
    /// have finished and its executor is dropped, so the new profile's weights, pager slots
    /// and scratch become resident only in what the old one's left (an executor not yet run
    /// holds none of them).
    pub fn install(&mut self, model: Arc<Model>) -> Result<()> {
        if self.pipelined {
            return Err(RuntimeError::InvalidParam {
                name: "install",
                reason: "a pipeline's precision profile is fixed by its plan".into(),
            });
        }
        let cur = self.executor().model().clone();
        if model.ir.fingerprint != cur.ir.fingerprint {
            return Err(RuntimeError::InvalidParam {
                name: "install",
                reason: "another model (fingerprint differs): only a precision profile of the \
                         running model can be installed"
                    .into(),
            });
        }
        let profile = model.profile.hash();
        if profile == cur.profile.hash() {
            return Ok(());
        }
        let weights = model.weight_bytes() as u64;
        // Every slot of the cache (draft slots included), and a draft's weights.
        let kv = (self.kv.slot_bytes() * self.kv.n_slots()) as u64;
        let draft = self
            .draft
            .as_ref()
            .map_or(0, |d| d.model().weight_bytes() as u64);
        let scratch = self.ledger.map_or(0, |l| l.scratch);
        // A profile that does not fit whole pages as the engine's first one would: its routed
        // experts, or a dense model's blocks, within what the rest leaves.
        let mut paging = (None, None);
        if let Some(budget) = self.cfg.memory
            && weights + draft + kv + scratch > budget
        {
            let layers = model.layers.len();
            let alone = self.draft.is_none();
            paging = paging_budgets(&model, layers, weights, kv + scratch, budget, alone)
                .ok_or_else(|| RuntimeError::MemoryBudget {
                    budget,
                    reason: format!(
                        "the profile's weights take {weights} B, a draft's {draft} B, the KV \
                         {kv} B and compute scratch {scratch} B"
                    ),
                })?;
        }
        // A profile installed before and still running sessions is reused as it is.
        let existing = self.execs.iter().position(|e| {
            e.as_ref()
                .is_some_and(|e| e.model().profile.hash() == profile)
        });
        self.current = match existing {
            Some(i) => i,
            None => {
                let (experts, layers) = (model.expert_bytes() as u64, model.layers.len());
                let mut exec = Executor::new(model.clone(), self.cfg.threads)?;
                exec.page_experts(paging.0)?;
                exec.page_layers(paging.1)?;
                if let Some(l) = self.ledger.as_mut() {
                    l.weights = weights + draft;
                    l.experts = experts;
                    l.experts_budget = paging.0;
                    l.layers = if experts == 0 {
                        crate::residency::LayerPager::pageable_bytes(&model, 0..layers)
                    } else {
                        0
                    };
                    l.layers_budget = paging.1;
                }
                self.execs.push(Some(exec));
                self.execs.len() - 1
            }
        };
        self.stats.set_profile(&profile, weights);
        self.current_profile = profile.clone();
        self.stats.profile_changes.fetch_add(1, Ordering::Relaxed);
        tracing::info!(profile = %&profile[..12], weight_bytes = weights, "precision profile installed");
        self.drop_unused_execs();
        Ok(())
    }

    /// Drops the executors of profiles no session runs on (never the current one).
    fn drop_unused_execs(&mut self) {
        for (i, e) in self.execs.iter_mut().enumerate() {
            if i != self.current
                && !self.active.iter().any(|a| a.exec == i)
                && let Some(gone) = e.take()
            {
                let (p, b) = pager_stats(&gone);
                self.paged_before.0 += p;
                self.paged_before.1 += b;
            }
        }
        let retired = self
            .execs
            .iter()
            .enumerate()
            .filter(|(i, e)| *i != self.current && e.is_some())
            .count();
        self.stats
            .retired_profiles
            .store(retired as u64, Ordering::Relaxed);
    }

    /// One scheduling step: drop cancelled sessions, admit waiting ones into free slots, run
    /// one forward pass per precision profile in use over the step's rows and turn their
    /// logits into tokens. Returns whether a pass ran.
    pub fn step(&mut self) -> bool {
        if self.depth > 1 {
            return self.step_in_flight();
        }
        self.reap_cancelled();
        self.admit();
        if self.active.is_empty() {
            self.publish();
            return false;
        }
        // Head-drafted rounds (their own passes), then drafts of the escalating sessions
        // (verified in their profile's pass below).
        let head_ran = self.head_phase();
        self.draft_phase();
        // Every decode first (whatever its profile), then prompt chunks up to the budget.
        let decodes: usize = self
            .active
            .iter()
            .filter(|a| a.phase == Phase::Decode && !a.head_stepped)
            .map(|a| 1 + a.drafts.len())
            .sum();
        let mut prefill_budget = self.cfg.step_tokens - decodes.min(self.cfg.step_tokens);
        let mut ran_any = head_ran;
        for e in 0..self.execs.len() {
            if self.execs[e].is_none() || !self.active.iter().any(|a| a.exec == e) {
                continue;
            }
            self.build_rows(e, &mut prefill_budget);
            if self.rows.is_empty() {
                continue;
            }
            ran_any = true;
            self.run_pass(e);
        }
        self.retire(true);
        self.drop_unused_execs();
        ran_any
    }

    /// A step of a pipeline's first stage with several passes in flight: send the next pass
    /// (the idle sessions' rows: decodes shared out evenly over the passes still to send,
    /// then prompt chunks) while fewer than `depth` are in flight; once `depth` are (or
    /// nothing else can be sent), take the oldest pass's logits and turn them into tokens.
    /// A session is in at most one pass in flight; its rows' float order is its own, so the
    /// way sessions are shared out over the passes changes no bit.
    fn step_in_flight(&mut self) -> bool {
        self.reap_cancelled();
        self.admit();
        if self.active.is_empty() && self.flights.is_empty() {
            self.publish();
            return false;
        }
        let mut sent = false;
        if self.flights.len() < self.depth {
            let idle = self
                .active
                .iter()
                .filter(|a| !a.in_flight && a.phase == Phase::Decode)
                .count();
            self.max_decodes = idle.div_ceil(self.depth - self.flights.len());
            let mut budget = self.cfg.step_tokens - self.max_decodes.min(self.cfg.step_tokens);
            self.build_rows(0, &mut budget);
            self.max_decodes = usize::MAX;
            if !self.rows.is_empty() {
                sent = self.send_pass();
            }
        }
        if self.flights.len() >= self.depth || (!sent && !self.flights.is_empty()) {
            self.finish_flight();
        }
        self.retire(true);
        true
    }

    /// What each logits row's session reads of it: sessions that read nothing but the
    /// argmax or a plain sampled token let a pipeline's last stage send the token back
    /// instead of the row (one-hot: the same choice).
    fn mark_row_reads(&mut self) {
        self.row_reads.clear();
        for &i in &self.owners {
            let read = self.active[i].row_read(self.vocab, &mut self.logits);
            self.row_reads.push(read);
        }
    }

    /// Sends the built rows down the pipeline (executor 0, the only one a pipeline has).
    fn send_pass(&mut self) -> bool {
        self.mark_row_reads();
        let Some(exec) = self.execs[0].as_mut() else {
            return false;
        };
        exec.set_row_reads(&self.row_reads);
        if let Err(err) = exec.forward_send(&mut self.kv, &self.rows) {
            self.fail_pass(&err.to_string());
            return false;
        }
        let mut f = Flight {
            owners: self.owners.iter().map(|&i| self.active[i].id).collect(),
            ran: Vec::with_capacity(self.ran.len()),
            has_prompt: self.pass_has_prompt,
        };
        for &(i, n) in &self.ran {
            let a = &mut self.active[i];
            a.in_flight = true;
            f.ran.push((a.id, n));
        }
        self.flights.push_back(f);
        true
    }

    /// Takes the oldest pass in flight's logits and turns them into tokens.
    fn finish_flight(&mut self) {
        let Some(f) = self.flights.pop_front() else {
            return;
        };
        let index = |active: &[Active], id: u64| active.iter().position(|a| a.id == id);
        self.owners.clear();
        self.ran.clear();
        for &id in &f.owners {
            if let Some(i) = index(&self.active, id) {
                self.owners.push(i);
            }
        }
        for &(id, n) in &f.ran {
            if let Some(i) = index(&self.active, id) {
                self.active[i].in_flight = false;
                self.ran.push((i, n));
            }
        }
        self.pass_has_prompt = f.has_prompt;
        if self.owners.len() != f.owners.len() || self.ran.len() != f.ran.len() {
            // Sessions in flight are never retired, so this cannot happen; if it did, the
            // rows would be read by the wrong sessions.
            self.fail_pass("a session of a pass in flight is gone");
            return;
        }
        self.pass(0, true);
    }

    /// Fails the sessions of the pass in `ran` (their error is sent, their slots reset):
    /// an executor error fails a pass, never the engine.
    fn fail_pass(&mut self, msg: &str) {
        tracing::error!(error = %msg, "forward pass failed");
        for &(i, _) in &self.ran {
            let a = &mut self.active[i];
            let _ = a.tx.send(Event::Error(format!("engine error: {msg}")));
            self.done.push((i, FinishReason::Stop));
            self.failed.push(i);
        }
        for &(i, _) in &self.ran {
            let slot = self.active[i].slot;
            let _ = self.kv.open(slot);
            self.active[i].drafts.clear();
        }
    }

    /// One forward pass of executor `e` over the built rows; its logits become tokens.
    fn run_pass(&mut self, e: usize) {
        self.pass(e, false);
    }

    /// The logits of a pass become tokens: a pass run now over the built rows (`recv`
    /// false), or the oldest pass sent down the pipeline (`recv`: `owners` and `ran` are
    /// that pass's).
    fn pass(&mut self, e: usize, recv: bool) {
        if !recv && self.pipelined {
            self.mark_row_reads();
        }
        let one_exec = self.execs.iter().filter(|e| e.is_some()).count() == 1;
        // (Taken out for the pass: its logits are read while the sessions change.)
        let Some(mut exec) = self.execs[e].take() else {
            return;
        };
        self.pass_on(&mut exec, recv, one_exec);
        self.execs[e] = Some(exec);
    }

    fn pass_on(&mut self, exec: &mut Executor, recv: bool, one_exec: bool) {
        if exec.has_downstream() && !recv {
            exec.set_row_reads(&self.row_reads);
        }
        let t0 = Instant::now();
        let out = if recv {
            exec.forward_recv()
        } else {
            exec.forward(&mut self.kv, &self.rows)
        };
        let n_out = match out {
            Ok(out) => out.len(),
            Err(err) => {
                let msg = err.to_string();
                self.fail_pass(&msg);
                return;
            }
        };
        let (out, logprobs) = exec.last_output(n_out);
        if !self.pass_has_prompt && one_exec {
            let dt = t0.elapsed().as_secs_f64();
            let rows = self.step_k + 1;
            ewma(&mut self.dcost.verify[rows], dt);
            // A pass of plain decode rows: what a head-drafted round is weighed against.
            if let Some(h) = self.head.as_mut() {
                h.cost.observe_plain(self.rows.len(), dt);
            }
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.take_rows(out, logprobs);
        if !self.rounds.is_empty() {
            for (k, acc) in self.rounds.drain(..) {
                self.dcost.observe_round(k, acc);
            }
            self.stats.draft_acceptance_ppm.store(
                (self.dcost.acceptance_estimate() * 1e6) as u64,
                Ordering::Relaxed,
            );
        }
    }

    /// The sessions of `ran` take their logits rows of `out` (`owners` names each row's
    /// session): a plain session its one row, a verifying one its rows in order up to the
    /// first that disagrees with its draft (its slot is then cut back to what plain decoding
    /// holds). The verified rounds go to `rounds`.
    fn take_rows(&mut self, out: &[f32], logprobs: &[Option<crate::pipeline::RowLogprob>]) {
        for &(i, n) in &self.ran {
            let a = &mut self.active[i];
            if !a.verifying() {
                a.pos += n;
            } else {
                // A verifying session's position moves row by row as its rows are taken.
                a.vseen = 0;
                a.vacc = 0;
                a.vdone = false;
            }
        }
        let mut accepted = 0u64;
        let vocab = self.vocab;
        let ctx = self.cfg.ctx;
        let mut generated = 0u64;
        for (j, &i) in self.owners.iter().enumerate() {
            let row = &out[j * vocab..(j + 1) * vocab];
            let a = &mut self.active[i];
            let verifying = a.verifying();
            if verifying {
                // Rows after the first disagreement (or the end) are discarded.
                if a.vdone {
                    continue;
                }
                a.pos += 1;
                a.vseen += 1;
            }
            let before = a.generated;
            a.lp_given = logprobs.get(j).cloned().flatten();
            // Logits that choosing does not change are read where the executor left them.
            // (A sampled round whose draft fell short of this row's distribution takes it
            // plainly.)
            let r = a.vseen.saturating_sub(1);
            let after = if verifying
                && r < a.spec_len
                && let Some(spec) = self.spec.as_mut()
            {
                a.take_speculative(
                    row,
                    &mut self.logits,
                    spec,
                    r,
                    &self.eog,
                    &*self.pieces,
                    ctx,
                )
            } else if a.modifies_logits() {
                self.logits.copy_from_slice(row);
                a.take_logits(&mut self.logits, &self.eog, &*self.pieces, ctx)
            } else {
                a.take_logits_ref(row, &self.eog, &*self.pieces, ctx)
            };
            generated += (a.generated - before) as u64;
            match after {
                After::Finish(r) => {
                    self.done.push((i, r));
                    a.vdone = true;
                }
                After::Failed => {
                    self.done.push((i, FinishReason::Stop));
                    self.failed.push(i);
                    a.vdone = true;
                }
                After::Continue if verifying => {
                    let r = a.vseen - 1;
                    if r < a.drafts.len() && a.last == a.drafts[r] {
                        accepted += 1;
                        a.vacc += 1;
                    } else {
                        a.vdone = true;
                    }
                }
                After::Continue => {}
            }
        }
        // Verified sessions keep exactly the positions plain decoding would hold.
        let mut drafted = 0u64;
        for &(i, _) in &self.ran {
            let a = &mut self.active[i];
            if !a.verifying() {
                continue;
            }
            let k = a.drafts.len();
            drafted += k as u64;
            if k > 0 {
                self.rounds.push((k, a.vacc.min(k)));
            }
            a.spec_len = 0;
            if let Err(err) = self.kv.truncate(a.slot, a.pos) {
                let _ = a.tx.send(Event::Error(format!("engine error: {err}")));
                self.done.push((i, FinishReason::Stop));
                self.failed.push(i);
            }
            a.drafts.clear();
        }
        self.stats.drafted.fetch_add(drafted, Ordering::Relaxed);
        self.stats
            .draft_accepted
            .fetch_add(accepted, Ordering::Relaxed);
        self.stats
            .generated_tokens
            .fetch_add(generated, Ordering::Relaxed);
    }

    /// Head-drafted rounds ([`EngineConfig::head_draft`]; see `engine::head`): on every
    /// executor whose LM head the shortlist was gathered from, its greedy escalating
    /// decoding sessions run `k` body passes in their own slots, a shortlist choice after
    /// each, then the full head over all their stored rows in one call; each takes its rows
    /// as a verify round. They take no row in the step's ordinary pass.
    /// Returns whether a round ran.
    fn head_phase(&mut self) -> bool {
        for a in self.active.iter_mut() {
            a.head_stepped = false;
        }
        let Some(mut h) = self.head.take() else {
            return false;
        };
        let mut ran = false;
        for e in 0..self.execs.len() {
            let Some(mut exec) = self.execs[e].take() else {
                continue;
            };
            if h.serves(exec.model()) {
                ran |= self.head_round(&mut h, &mut exec, e);
            }
            self.execs[e] = Some(exec);
        }
        self.head = Some(h);
        ran
    }

    fn head_round(&mut self, h: &mut HeadDrafter, exec: &mut Executor, e: usize) -> bool {
        h.sessions.clear();
        for (i, a) in self.active.iter().enumerate() {
            if a.exec == e
                && a.escalate
                && a.phase == Phase::Decode
                && !a.sampled()
                && !a.in_flight
                && a.generated < a.max_tokens
                && a.pos < self.cfg.ctx
            {
                h.sessions.push(i);
            }
        }
        let s = h.sessions.len();
        if s == 0 {
            return false;
        }
        let k = if self.cfg.draft_adaptive {
            h.cost.choose(s, self.cfg.draft_k, h.max_rows)
        } else {
            self.cfg.draft_k.min(h.max_rows / s)
        };
        if k == 0 {
            return false;
        }
        // Each session drafts at most the tokens it may still commit and the context holds.
        h.offsets.clear();
        h.want.clear();
        let mut total = 0;
        for &i in &h.sessions {
            let a = &mut self.active[i];
            let w = k.min(a.max_tokens - a.generated).min(self.cfg.ctx - a.pos);
            h.offsets.push(total);
            h.want.push(w);
            total += w;
            a.drafts.clear();
            a.spec_len = 0;
        }
        let hd = exec.model().hidden();
        let mut passes = 0u64;
        for p in 0..k {
            let t0 = Instant::now();
            h.rows.clear();
            for (j, &i) in h.sessions.iter().enumerate() {
                if h.want[j] > p {
                    let a = &self.active[i];
                    let tok = if p == 0 { a.last } else { a.drafts[p - 1] };
                    h.rows.push(Row::decode(a.slot, (a.pos + p) as u32, tok));
                }
            }
            if h.rows.is_empty() {
                break;
            }
            passes += 1;
            let out = match exec.forward_normed(&mut self.kv, &h.rows) {
                Ok(o) => o,
                Err(err) => return self.fail_head_round(h, &err.to_string()),
            };
            let mut r = 0;
            for j in 0..h.sessions.len() {
                if h.want[j] > p {
                    let at = (h.offsets[j] + p) * hd;
                    h.hidden[at..at + hd].copy_from_slice(&out[r * hd..(r + 1) * hd]);
                    r += 1;
                }
            }
            for (j, &i) in h.sessions.iter().enumerate() {
                if h.want[j] <= p {
                    continue;
                }
                let at = (h.offsets[j] + p) * hd;
                let row = &h.hidden[at..at + hd];
                let a = &mut self.active[i];
                // Greedy without bias or penalties: the list's own argmax; else the list's
                // logits over the vocabulary (−∞ off it) as this session reads them.
                let d = if a.draft_is_argmax() {
                    h.list.argmax(exec, row)
                } else {
                    h.list
                        .scatter_logits(exec, row, &mut h.full)
                        .map(|()| a.draft_choice(&h.full, &mut self.logits))
                };
                match d {
                    Ok(d) => a.drafts.push(d),
                    Err(err) => return self.fail_head_round(h, &err.to_string()),
                }
            }
            h.cost
                .observe_body(h.rows.len(), t0.elapsed().as_secs_f64());
        }
        // Verify: the full head over every drafted position, each row in the one-row order.
        self.owners.clear();
        self.ran.clear();
        for (j, &i) in h.sessions.iter().enumerate() {
            self.owners.extend(std::iter::repeat_n(i, h.want[j]));
            self.ran.push((i, h.want[j]));
            self.active[i].head_stepped = true;
        }
        let t0 = Instant::now();
        let out = match exec.head_logits(&h.hidden[..total * hd]) {
            Ok(o) => o,
            Err(err) => return self.fail_head_round(h, &err.to_string()),
        };
        h.cost.observe_head(total, t0.elapsed().as_secs_f64());
        self.stats.steps.fetch_add(passes, Ordering::Relaxed);
        self.take_rows(out, &[]);
        for (k, acc) in self.rounds.drain(..) {
            h.cost.observe_round(k, acc);
        }
        self.stats
            .draft_acceptance_ppm
            .store((h.cost.acceptance() * 1e6) as u64, Ordering::Relaxed);
        // Every committed token but a round's last was a draft (on the list); a last one
        // chosen off the list joins it.
        let model = exec.model().clone();
        for j in 0..h.sessions.len() {
            let t = self.active[h.sessions[j]].last;
            if !h.list.contains(t) {
                h.misses += 1;
                if let Err(err) = h.add(&model, &[t]) {
                    tracing::warn!(error = %err, "the head draft's shortlist could not grow");
                }
            }
        }
        self.stats
            .draft_shortlist
            .store(h.list.len() as u64, Ordering::Relaxed);
        true
    }

    /// A head-drafted round failed: its sessions fail (error sent, slots reset), as a pass.
    fn fail_head_round(&mut self, h: &HeadDrafter, msg: &str) -> bool {
        self.ran.clear();
        for &i in &h.sessions {
            self.ran.push((i, 0));
            self.active[i].head_stepped = true;
        }
        self.fail_pass(msg);
        true
    }

    /// The draft passes of a step: every escalating decoding session's draft slot catches up
    /// with its committed tokens plus its pending one, then proposes this step's `k` tokens
    /// (fewer near its token limit or the context end), all sessions in the same passes.
    fn draft_phase(&mut self) {
        self.step_k = 0;
        let Some(dexec) = self.draft.as_mut() else {
            return;
        };
        let any = self
            .active
            .iter()
            .any(|a| a.escalate && a.phase == Phase::Decode);
        if !any {
            return;
        }
        let k = if self.cfg.draft_adaptive {
            self.dcost.choose(self.cfg.draft_k)
        } else {
            self.cfg.draft_k
        };
        // A sampled session drafts at every position, even in a round without drafts (its
        // tokens are then a function of its seed alone, not of how rounds were cut).
        let sampled = self
            .active
            .iter()
            .any(|a| a.escalate && a.phase == Phase::Decode && a.sampled());
        if k == 0 && !sampled {
            return;
        }
        if sampled && self.spec.is_none() {
            self.spec = Some(crate::escalation::Speculative::new(self.vocab));
        }
        let t0 = Instant::now();
        let n = self.cfg.slots as SlotId;
        let ctx = self.cfg.ctx;
        let max_chunk = self.kv.max_chunk();
        // Each draft slot cut back to what it shares with its session.
        for a in self.active.iter_mut() {
            a.drafts.clear();
            a.spec_len = 0;
            if !a.escalate || a.phase != Phase::Decode {
                continue;
            }
            // Drafts no more than the tokens still allowed after the pending one's successor,
            // and the context holds.
            let room = (a.max_tokens - a.generated)
                .saturating_sub(1)
                .min(ctx.saturating_sub(1 + a.pos));
            a.draft_want = k.min(room);
            let ds = n + a.slot;
            if !self.kv.is_open(ds) && self.kv.open(ds).is_err() {
                continue;
            }
            if self.kv.set_profile(ds, &self.draft_profile).is_err() {
                continue;
            }
            let same = match (self.kv.tokens(a.slot), self.kv.tokens(ds)) {
                (Ok(c), Ok(d)) => d
                    .iter()
                    .zip(c.iter().chain(std::iter::once(&a.last)))
                    .take_while(|(x, y)| x == y)
                    .count()
                    .min(a.pos),
                _ => continue,
            };
            if self.kv.truncate(ds, same).is_err() && self.kv.truncate(ds, 0).is_err() {
                continue;
            }
        }
        let Some(cur) = self.execs[self.current].as_mut() else {
            return;
        };
        cur.swap_kernels(dexec);
        let mut passes = 0usize;
        loop {
            self.drows.clear();
            self.downers.clear();
            for (i, a) in self.active.iter().enumerate() {
                if !a.escalate || a.phase != Phase::Decode {
                    continue;
                }
                // Drafts wanted; a sampled session also takes the draft's distribution at
                // the position after its last draft.
                let (have, need) = if a.sampled() {
                    (a.spec_len, a.draft_want + 1)
                } else {
                    (a.drafts.len(), a.draft_want)
                };
                if have >= need {
                    continue;
                }
                let ds = n + a.slot;
                if let Some(&d) = a.drafts.last() {
                    self.drows
                        .push(Row::decode(ds, (a.pos + a.drafts.len()) as u32, d));
                    self.downers.push(i);
                    continue;
                }
                // Catching up: positions the draft slot lacks, the pending token last.
                let Ok(dlen) = self.kv.len(ds) else {
                    continue;
                };
                let end = a.pos.min(dlen + max_chunk - 1);
                let Ok(committed) = self.kv.tokens(a.slot) else {
                    continue;
                };
                // A draft's float order is free (it only proposes): many rows take the
                // many-row kernels.
                let order = OrderClass::of(end + 1 - dlen);
                for (q, &held) in committed
                    .iter()
                    .chain(std::iter::once(&a.last))
                    .enumerate()
                    .take(end + 1)
                    .skip(dlen)
                {
                    // (Position `a.pos` is the pending token, the chain's last element.)
                    self.drows.push(Row {
                        slot: ds,
                        pos: q as u32,
                        token: held,
                        logits: q == a.pos,
                        order,
                    });
                }
                if end == a.pos {
                    self.downers.push(i);
                }
            }
            if self.drows.is_empty() {
                break;
            }
            passes += 1;
            let out = match dexec.forward(&mut self.kv, &self.drows) {
                Ok(o) => o,
                Err(err) => {
                    // A failed draft pass only stops drafting: the sessions decode plainly.
                    tracing::warn!(error = %err, "draft pass failed; drafting stops");
                    for a in self.active.iter_mut() {
                        a.drafts.clear();
                        a.spec_len = 0;
                        a.escalate = false;
                    }
                    break;
                }
            };
            let vocab = self.vocab;
            for (j, &i) in self.downers.iter().enumerate() {
                let a = &mut self.active[i];
                let row = &out[j * vocab..(j + 1) * vocab];
                if a.sampled() {
                    let at = (a.pos + 1 + a.spec_len) as u64;
                    let d = a.draft_sample(row, &mut self.logits, at);
                    if a.drafts.len() < a.draft_want {
                        a.drafts.push(d);
                    }
                } else {
                    let d = a.draft_choice(row, &mut self.logits);
                    a.drafts.push(d);
                }
            }
        }
        cur.swap_kernels(dexec);
        self.step_k = self
            .active
            .iter()
            .map(|a| a.drafts.len())
            .max()
            .unwrap_or(0);
        if passes > 0 && self.step_k > 0 {
            ewma(
                &mut self.dcost.draft,
                t0.elapsed().as_secs_f64() / passes as f64,
            );
        }
    }

    /// The rows of the sessions on executor `e`: each decoding session's next row, then
    /// prompt chunks in admission order while `prefill_budget` lasts.
    fn build_rows(&mut self, e: usize, prefill_budget: &mut usize) {
        self.rows.clear();
        self.owners.clear();
        self.ran.clear();
        self.pass_has_prompt = false;
        let mut decodes = 0;
        for (i, a) in self.active.iter().enumerate() {
            if a.exec == e && a.phase == Phase::Decode && !a.in_flight && !a.head_stepped {
                if decodes == self.max_decodes {
                    continue;
                }
                decodes += 1;
                // The pending token, then the drafts to verify (one-row order each: the bits
                // of as many decode steps).
                self.rows.push(Row::decode(a.slot, a.pos as u32, a.last));
                self.owners.push(i);
                for (j, &d) in a.drafts.iter().enumerate() {
                    self.rows
                        .push(Row::decode(a.slot, (a.pos + 1 + j) as u32, d));
                    self.owners.push(i);
                }
                self.ran.push((i, 1 + a.drafts.len()));
            }
        }
        let max_chunk = self.kv.max_chunk();
        for (i, a) in self.active.iter().enumerate() {
            if a.exec != e || a.phase != Phase::Prefill || a.in_flight || *prefill_budget == 0 {
                continue;
            }
            let mut n = (*prefill_budget).min(a.prompt.len() - a.pos).min(max_chunk);
            if self.whole_batches {
                // The rest of the prompt batch `a.pos` is in (all of it: batches start where
                // the previous one ended), or nothing this step.
                let end = ((a.pos / max_chunk + 1) * max_chunk).min(a.prompt.len());
                if end - a.pos > *prefill_budget {
                    continue;
                }
                n = end - a.pos;
            }
            for p in a.pos..a.pos + n {
                let last = p + 1 == a.prompt.len();
                self.rows.push(Row {
                    slot: a.slot,
                    pos: p as u32,
                    token: a.prompt[p],
                    logits: last,
                    order: a.orders[p],
                });
                if last {
                    self.owners.push(i);
                }
            }
            self.ran.push((i, n));
            self.pass_has_prompt = true;
            *prefill_budget -= n;
        }
    }

    /// Finishes the sessions in `done` (sending their last event when `report`), frees their
    /// slots and keeps their K/V as cached prefixes.
    fn retire(&mut self, report: bool) {
        if self.done.is_empty() {
            self.publish();
            return;
        }
        self.done.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        self.done.dedup_by_key(|d| d.0);
        let mut done = std::mem::take(&mut self.done);
        for &(i, reason) in done.iter() {
            let a = self.active.remove(i);
            let failed = self.failed.contains(&i);
            tracing::debug!(session = a.id, ?reason, generated = a.generated, "finished");
            self.free_slot(a.slot);
            self.retired.push((a, reason, failed));
        }
        self.failed.clear();
        done.clear();
        self.done = done;
        // Gauges first: a client that sees its `Done` may submit again at once, and must find
        // the slot counted free.
        self.publish();
        for (mut a, reason, failed) in self.retired.drain(..) {
            if report && !failed {
                a.finish(reason);
            }
        }
    }

    fn free_slot(&mut self, slot: SlotId) {
        self.tick += 1;
        self.slot_busy[slot as usize] = false;
        self.slot_used[slot as usize] = self.tick;
    }

    fn reap_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|w| {
            let c = w.cancel.load(Ordering::Relaxed);
            if c {
                let _ = w.tx.send(Event::Done(super::api::Finished {
                    reason: FinishReason::Cancelled,
                    prompt_tokens: w.req.prompt.len(),
                    cached_tokens: 0,
                    completion_tokens: 0,
                    tail: String::new(),
                }));
            }
            !c
        });
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.stats.pending.fetch_sub(gone as u64, Ordering::Relaxed);
            self.stats
                .cancelled
                .fetch_add(gone as u64, Ordering::Relaxed);
        }
        for (i, a) in self.active.iter().enumerate() {
            // A session in flight is reaped once its pass is back.
            if a.cancelled() && !a.in_flight {
                self.done.push((i, FinishReason::Cancelled));
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
        if !self.done.is_empty() {
            self.retire(true);
        }
    }

    fn admit(&mut self) {
        // Under a memory budget, a newly installed profile waits for the last session of an
        // earlier one (see [`Scheduler::install`]).
        if self.cfg.memory.is_some() && self.active.iter().any(|a| a.exec != self.current) {
            return;
        }
        while let Some(front) = self.waiting.front() {
            let Some(_) = self.slot_busy.iter().position(|b| !b) else {
                break;
            };
            let len = front.req.prompt.len();
            let orders: Vec<_> = (0..len)
                .map(|p| prompt_order(p, len, self.kv.max_chunk()))
                .collect();
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            // `pending` drops only once the session counts as active (or has failed), so
            // that a concurrent submit never sees it in neither gauge (it would take the slot
            // this session holds).
            let prompt = &w.req.prompt;
            // The free slot holding the longest reusable prefix; among equals the least
            // recently used (never-used slots first).
            let mut best: Option<(SlotId, usize, u64)> = None;
            for s in 0..self.slot_busy.len() {
                if self.slot_busy[s] {
                    continue;
                }
                let slot = s as SlotId;
                // Positions of another profile are not this session's K/V.
                let score = if self.kv.slot_profile(slot) == Some(self.current_profile.as_str()) {
                    self.kv.common_prefix(slot, prompt, &orders)
                } else {
                    0
                };
                let used = self.slot_used[s];
                let better = match best {
                    None => true,
                    Some((_, bs, bu)) => score > bs || (score == bs && used < bu),
                };
                if better {
                    best = Some((slot, score, used));
                }
            }
            let Some((slot, free_score, _)) = best else {
                self.waiting.push_front(w);
                break;
            };
            // A running session sharing a longer prefix (a common system prompt).
            let donor = self
                .active
                .iter()
                .filter(|a| a.exec == self.current)
                .map(|a| (a.slot, self.kv.common_prefix(a.slot, prompt, &orders)))
                .max_by_key(|&(_, n)| n);
            let mut result = Ok(());
            if let Some((src, n)) = donor
                && n >= free_score + COPY_MIN_GAIN
            {
                result = self.kv.copy_prefix(src, slot, n).map(|_| ());
            }
            if result.is_ok() && !self.kv.is_open(slot) {
                result = self.kv.open(slot);
            }
            if result.is_ok() {
                result = self.kv.set_profile(slot, &self.current_profile);
            }
            let reused = result.and_then(|_| self.kv.reuse_prefix(slot, prompt, &orders));
            let reused = match reused {
                Ok(r) => r,
                Err(e) => {
                    let _ = w.tx.send(Event::Error(format!("admission failed: {e}")));
                    self.stats.pending.fetch_sub(1, Ordering::Relaxed);
                    continue;
                }
            };
            let sampler = match Sampler::new(w.req.sampling.clone()) {
                Ok(s) => s,
                Err(e) => {
                    let _ = w.tx.send(Event::Error(e.to_string()));
                    self.stats.pending.fetch_sub(1, Ordering::Relaxed);
                    continue;
                }
            };
            self.slot_busy[slot as usize] = true;
            self.stats
                .prompt_tokens
                .fetch_add(len as u64, Ordering::Relaxed);
            self.stats
                .prefix_hit_tokens
                .fetch_add(reused as u64, Ordering::Relaxed);
            tracing::debug!(
                session = w.id,
                slot,
                prompt = len,
                reused,
                waited_ms = w.since.elapsed().as_millis() as u64,
                "admitted"
            );
            // A greedy escalating session's prompt joins the head draft's shortlist (text
            // it quotes can then be drafted).
            if let (Some(h), Some(exec)) = (self.head.as_mut(), self.execs[self.current].as_ref())
                && w.req.escalation
                && w.req.sampling.temperature <= 0.0
                && h.serves(exec.model())
                && let Err(e) = h.add(exec.model(), &w.req.prompt)
            {
                tracing::warn!(error = %e, "the head draft's shortlist could not take a prompt");
            }
            let _ = w.tx.send(Event::Admitted {
                cached_tokens: reused,
            });
            self.active
                .push(Active::new(w, slot, self.current, orders, reused, sampler));
            self.stats
                .active
                .store(self.active.len() as u64, Ordering::SeqCst);
            self.stats.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The paging counters of every executor the engine has run (the live ones, and those
    /// of dropped profiles kept in `paged_before`): they only grow.
    fn paging_totals(&self) -> (PagingStats, PagingStats) {
        let (mut experts, mut blocks) = self.paged_before;
        for e in self.execs.iter().flatten() {
            let (p, b) = pager_stats(e);
            experts += p;
            blocks += b;
        }
        (experts, blocks)
    }

    fn publish(&self) {
        let s = &self.stats;
        // Raised, never lowered: an executor taken out for its pass is missing from the sum
        // until the publication after it.
        let (p, b) = self.paging_totals();
        let up = |a: &std::sync::atomic::AtomicU64, v: u64| {
            a.fetch_max(v, Ordering::Relaxed);
        };
        up(&s.expert_hits, p.hits);
        up(&s.expert_misses, p.misses);
        up(&s.expert_evictions, p.evictions);
        up(&s.expert_bytes_in, p.bytes_in);
        up(&s.expert_prefetches, p.prefetches);
        up(&s.expert_predicted, p.predicted);
        up(&s.expert_predicted_used, p.predicted_used);
        up(&s.expert_bypassed, p.bypassed);
        up(&s.block_hits, b.hits);
        up(&s.block_misses, b.misses);
        up(&s.block_evictions, b.evictions);
        up(&s.block_bytes_in, b.bytes_in);
        s.active.store(self.active.len() as u64, Ordering::SeqCst);
        s.waiting
            .store(self.waiting.len() as u64, Ordering::Relaxed);
        let open = (0..self.kv.n_slots())
            .filter(|&i| self.kv.is_open(i as SlotId))
            .count();
        s.kv_bytes
            .store((open * self.kv.slot_bytes()) as u64, Ordering::Relaxed);
        // The list also grows at admission (a prompt's tokens), with no drafted round after
        // it when the cost model decodes plainly.
        if let Some(h) = &self.head {
            s.draft_shortlist
                .store(h.list.len() as u64, Ordering::Relaxed);
        }
    }
}

/// An executor's paging counters: its expert pager's and its block pager's (zero without).
fn pager_stats(e: &Executor) -> (PagingStats, PagingStats) {
    (
        e.paging_stats().unwrap_or_default(),
        e.layer_pager().map(|p| p.stats()).unwrap_or_default(),
    )
}

/// Where `model`'s `weights` (a draft's and a shortlist's included) and `rest` (the KV and
/// compute scratch) do not fit `budget`: what its routed experts — or a dense model's block
/// projections, with the embedding and head's mapped folios kept — page within, the rest of
/// the budget: `(experts, blocks)`, one of them set. `None` when neither can page (`alone`
/// false: a draft or a pipeline shares the weights) or the rest alone does not fit.
fn paging_budgets(
    model: &Model,
    layers: usize,
    weights: u64,
    rest: u64,
    budget: u64,
    alone: bool,
) -> Option<(Option<u64>, Option<u64>)> {
    let experts = model.expert_bytes() as u64;
    let layer_bytes = crate::residency::LayerPager::pageable_bytes(model, 0..layers);
    let fixed = weights - experts.min(weights) + rest;
    let dense_fixed = (weights - layer_bytes.min(weights))
        + crate::residency::LayerPager::mapped_slack(model)
        + rest;
    if experts > 0 && alone && budget > fixed {
        Some((Some(budget - fixed), None))
    } else if experts == 0 && layer_bytes > 0 && alone && budget > dense_fixed {
        Some((None, Some(budget - dense_fixed)))
    } else {
        None
    }
}

/// What an engine of `cfg` over `model`'s layers `0..layers` holds beside its weights, in
/// bytes: the KV cache of every slot (a draft profile's slots too) and an upper bound of one
/// pass's compute scratch — what `EngineConfig::memory` must hold besides the weights.
pub fn kv_and_scratch_bytes(
    model: &Model,
    cfg: &EngineConfig,
    layers: usize,
) -> Result<(u64, u64)> {
    let kv_slots = if cfg.draft.is_some() {
        2 * cfg.slots
    } else {
        cfg.slots
    };
    let kv = KvCache::for_layers(
        model,
        cfg.kv_dtype,
        kv_slots,
        cfg.ctx,
        pass_chunk(model, cfg),
        0..layers,
    )?;
    let logit_rows = if cfg.head_draft.is_some() {
        (2 * cfg.draft_k).max(cfg.slots + 1)
    } else {
        cfg.slots + 1
    };
    Ok((
        (kv.slot_bytes() * kv_slots) as u64,
        model.pass_scratch_bytes(cfg.step_tokens, logit_rows, cfg.ctx, cfg.threads),
    ))
}

/// The most prompt rows of one session a pass takes (the KV cache's `max_chunk`): `ubatch`,
/// and for a mixture of experts — whose prompt batches run whole in one pass (see `moe`: an
/// expert ggml tiles for 8+ rows of a batch needs all of them) — no more than fit beside the
/// most decode rows a step holds (every slot decoding, with its drafts).
fn pass_chunk(model: &Model, cfg: &EngineConfig) -> usize {
    let chunk = cfg.ubatch.min(cfg.ctx);
    if model.layers.iter().any(|l| matches!(l.ffn, FfnW::Moe(_))) {
        let per = 1 + if cfg.draft.is_some() || cfg.head_draft.is_some() {
            cfg.draft_k
        } else {
            0
        };
        chunk
            .min(cfg.step_tokens.saturating_sub(cfg.slots * per))
            .max(1)
    } else {
        chunk
    }
}
