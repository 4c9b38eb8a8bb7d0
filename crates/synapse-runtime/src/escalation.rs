//! Exact escalation: a low-precision draft proposes tokens and the source precision verifies
//! them, so the output is the source model's own greedy output, token for token.
//!
//! A round: the draft executor (an approximate profile, in its own KV slot) catches up with
//! the committed tokens and proposes `k` tokens by `k` one-row greedy steps; the source
//! executor then runs the pending token and the `k` drafts as `k + 1` rows of one pass, every
//! row in the one-row float order ([`OrderClass::One`]), so row `i`'s logits are bit for bit
//! those of the `i`-th plain decode step (the executor's batch-invariance rule). The source's
//! choices are taken in order while they equal the drafts; the first that differs (or, with
//! every draft accepted, the one after the last) ends the round. The source slot then keeps
//! exactly the positions plain decoding would hold (the rejected drafts' rows are dropped),
//! so committed K/V only ever comes from the verifier; the draft slot is a working branch,
//! re-synchronised from the committed tokens at the start of the next round.
//!
//! `k` follows a cost model fitted to this run's own measurements: the per-token acceptance
//! rate (decayed counts), the draft step's time and the verify pass's time as a function of
//! its rows. Each round takes the `k` with the most expected committed tokens per second,
//! `k = 0` (a plain decode step) when drafting does not pay, re-probing now and then (less
//! often while probes keep failing; never again once a draft step is measured no faster than
//! a plain step, since then no acceptance rate can make drafting pay).
//!
//! Architecture invariant: the committed tokens never depend on `k`, on timing, or on the
//! draft — only the speed does.

use std::time::Instant;

use synapse_kernels::OrderClass;

use crate::error::{Result, RuntimeError};
use crate::executor::{Executor, Row};
use crate::generate::{Commit, GenerateParams, Generated, StopReason, Timings, prefill};
use crate::kv::{KvCache, SlotId};
use crate::sampling::{Sampler, draw, position_uniform};

/// Draw purposes of [`position_uniform`] (one independent variate per position each).
pub(crate) const DRAW_DRAFT: u64 = 1;
const DRAW_ACCEPT: u64 = 2;
const DRAW_RESIDUAL: u64 = 3;

/// Sparse distributions, one per draft position: `(token, probability)`.
type Dists = Vec<Vec<(u32, f64)>>;

/// Speculative sampling's working state: the draft distributions of a round and scratch.
/// (The engine keeps one for all its sessions and each session's draft distributions.)
pub(crate) struct Speculative {
    /// The draft's distribution at each draft position of the round.
    pub(crate) qs: Dists,
    /// The source's distribution at the position being decided, and a draft distribution.
    pub(crate) p: Vec<(u32, f64)>,
    q: Vec<(u32, f64)>,
    /// A dense copy of q (zero outside its support between calls).
    qd: Vec<f64>,
    resid: Vec<(u32, f64)>,
}

impl Speculative {
    pub(crate) fn new(vocab: usize) -> Self {
        Speculative {
            qs: Vec::new(),
            p: Vec::new(),
            q: Vec::new(),
            qd: vec![0.0; vocab],
            resid: Vec::new(),
        }
    }

    /// The token at position `at`, given the source's distribution `self.p`, the draft's
    /// `q` and its draw `x ~ q`: `x` with probability `min(1, p(x)/q(x))`, else a draw from
    /// the normalised `(p − q)⁺` (never `x` then). Marginally, exactly `p`.
    pub(crate) fn choose(&mut self, q: &[(u32, f64)], x: u32, seed: u64, at: u64) -> u32 {
        let px = self.p.iter().find(|e| e.0 == x).map_or(0.0, |e| e.1);
        let qx = q.iter().find(|e| e.0 == x).map_or(0.0, |e| e.1);
        if qx > 0.0 && position_uniform(seed, at, DRAW_ACCEPT) * qx < px {
            return x;
        }
        for &(t, v) in q {
            self.qd[t as usize] = v;
        }
        self.resid.clear();
        self.resid.extend(
            self.p
                .iter()
                .map(|&(t, v)| (t, (v - self.qd[t as usize]).max(0.0)))
                .filter(|e| e.1 > 0.0),
        );
        for &(t, _) in q {
            self.qd[t as usize] = 0.0;
        }
        let u = position_uniform(seed, at, DRAW_RESIDUAL);
        if self.resid.is_empty() {
            // p ≤ q everywhere p is positive: p = q up to rounding.
            return draw(&self.p, u);
        }
        draw(&self.resid, u)
    }
}

/// Most drafts per round (a verify pass holds at most this many rows plus one).
pub const MAX_DRAFT: usize = 16;

/// How drafting is run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftParams {
    /// Most draft tokens per round (1..=[`MAX_DRAFT`]).
    pub max_k: usize,
    /// Choose `k` per round from the measured acceptance and costs (else always `max_k`).
    pub adaptive: bool,
}

impl Default for DraftParams {
    fn default() -> Self {
        DraftParams {
            max_k: 8,
            adaptive: true,
        }
    }
}

/// What drafting did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EscalationStats {
    /// Verify passes (rounds), plain steps included.
    pub rounds: usize,
    /// Rounds that ran without drafts (the cost model's choice).
    pub plain_rounds: usize,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens the source accepted.
    pub accepted: usize,
    /// Seconds in draft passes (catch-up included).
    pub draft_s: f64,
    /// Seconds in verify passes.
    pub verify_s: f64,
}

impl EscalationStats {
    /// Accepted / drafted (0 without drafts).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// The cost model: decayed acceptance counts and per-pass times.
#[derive(Debug, Clone)]
pub(crate) struct CostModel {
    max_k: usize,
    /// Never stop probing for good (an engine runs for ever; one generation does not).
    persistent: bool,
    /// Decayed accepted / rejected draft counts.
    acc: f64,
    rej: f64,
    /// EWMA of one draft step's seconds.
    pub(crate) draft: Option<f64>,
    /// EWMA of a verify pass's seconds, by rows (index = rows).
    pub(crate) verify: [Option<f64>; MAX_DRAFT + 2],
    /// Plain rounds since the last drafted one.
    plain_run: usize,
    /// Plain rounds before the next probe (doubles while probes keep failing).
    reprobe: usize,
    /// Whether the last drafted round was a probe, and probes in a row that found drafting
    /// not paying; after [`MAX_FAILED_PROBES`] the draft is not run again.
    probing: bool,
    failed_probes: usize,
    last_k: usize,
}

const DECAY: f64 = 0.85;
const EWMA: f64 = 0.3;
/// After this many plain rounds, one drafted round re-measures acceptance; the interval
/// doubles (up to [`REPROBE_MAX`]) while probes keep finding that drafting does not pay.
const REPROBE: usize = 16;
const REPROBE_MAX: usize = 512;
/// Probes in a row that found drafting not paying before drafting stops for the generation
/// (each probe first runs the draft over every token since the last one).
const MAX_FAILED_PROBES: usize = 2;

pub(crate) fn ewma(v: &mut Option<f64>, x: f64) {
    *v = Some(match *v {
        Some(o) => o + EWMA * (x - o),
        None => x,
    });
}

impl CostModel {
    pub(crate) fn new(max_k: usize, persistent: bool) -> Self {
        CostModel {
            max_k,
            persistent,
            acc: 0.0,
            rej: 0.0,
            draft: None,
            verify: [None; MAX_DRAFT + 2],
            plain_run: 0,
            reprobe: REPROBE,
            probing: false,
            failed_probes: 0,
            last_k: max_k.div_ceil(2),
        }
    }

    pub(crate) fn observe_round(&mut self, k: usize, accepted: usize) {
        if k == 0 {
            return;
        }
        self.acc = self.acc * DECAY + accepted as f64;
        self.rej = self.rej * DECAY + if accepted < k { 1.0 } else { 0.0 };
    }

    /// Estimated seconds of a verify pass of `rows` rows: the measured value, else a line
    /// through the two nearest measured row counts (or proportional to one).
    pub(crate) fn verify_time(&self, rows: usize) -> Option<f64> {
        if let Some(t) = self.verify[rows] {
            return Some(t);
        }
        // (No allocation: the engine calls this every step.)
        let seen = || (1..self.verify.len()).filter_map(|r| self.verify[r].map(|t| (r as f64, t)));
        let n = seen().count() as f64;
        match n as usize {
            0 => None,
            1 => seen()
                .next()
                .map(|(r, t)| t * (1.0 + 0.1 * (rows as f64 - r)).max(0.5)),
            _ => {
                // Least-squares line through the measured points.
                let mx = seen().map(|p| p.0).sum::<f64>() / n;
                let my = seen().map(|p| p.1).sum::<f64>() / n;
                let sxx: f64 = seen().map(|p| (p.0 - mx).powi(2)).sum();
                let sxy: f64 = seen().map(|p| (p.0 - mx) * (p.1 - my)).sum();
                let b = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
                Some((my + b * (rows as f64 - mx)).max(1e-6))
            }
        }
    }

    /// The per-token acceptance rate the decayed counts estimate (½ before any round).
    pub(crate) fn acceptance_estimate(&self) -> f64 {
        (self.acc + 0.5) / (self.acc + self.rej + 1.0)
    }

    /// No round drafts from now on (a draft known beforehand not to pay).
    pub(crate) fn never_draft(&mut self) {
        self.probing = false;
        self.failed_probes = usize::MAX;
    }

    /// The next round's draft count (≤ `cap`).
    pub(crate) fn choose(&mut self, cap: usize) -> usize {
        let cap = cap.min(self.max_k);
        if cap == 0 || self.failed_probes == usize::MAX {
            return 0;
        }
        // Measure the plain step first, then a drafted round, before trusting the model.
        let (Some(td), Some(t1)) = (self.draft, self.verify[1]) else {
            return if self.verify[1].is_none() {
                0
            } else {
                self.probing = true;
                self.last_k.clamp(1, cap)
            };
        };
        // A draft step as slow as a plain step can never pay, whatever the acceptance
        // ((k + 1) tokens at best for k draft steps and a verify pass ≥ a plain step).
        if td >= t1 {
            self.probing = false;
            self.failed_probes = usize::MAX;
            return 0;
        }
        let a = self.acceptance_estimate();
        let best = best_k(a, td, t1, cap, |rows| self.verify_time(rows));
        if best.0 == 0 {
            if std::mem::take(&mut self.probing) {
                self.failed_probes = self.failed_probes.saturating_add(1).min(usize::MAX - 1);
            }
            self.plain_run += 1;
            if self.plain_run >= self.reprobe
                && self.failed_probes != usize::MAX
                && (self.persistent || self.failed_probes < MAX_FAILED_PROBES)
            {
                self.plain_run = 0;
                self.reprobe = (self.reprobe * 2).min(REPROBE_MAX);
                self.probing = true;
                return self.last_k.clamp(1, cap);
            }
            return 0;
        }
        self.plain_run = 0;
        self.reprobe = REPROBE;
        self.probing = false;
        self.failed_probes = 0;
        self.last_k = best.0;
        best.0
    }
}

/// The draft count with the most expected committed tokens per second, and that rate:
/// `k = 0` (a plain step of `t1` seconds, one token) unless some `k ≤ cap` does better with
/// per-token acceptance `a`, draft steps of `td` seconds and verify passes of
/// `verify(rows)` seconds (`None`: not known, that `k` is skipped). A round of `k` drafts
/// commits `1 + a + … + a^k` tokens in expectation and costs `k·td + verify(k + 1)`.
pub fn best_k(
    a: f64,
    td: f64,
    t1: f64,
    cap: usize,
    verify: impl Fn(usize) -> Option<f64>,
) -> (usize, f64) {
    let mut best = (0usize, 1.0 / t1);
    for k in 1..=cap {
        let Some(tv) = verify(k + 1) else {
            continue;
        };
        let e = if a < 1.0 {
            (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
        } else {
            k as f64 + 1.0
        };
        let rate = e / (k as f64 * td + tv);
        if rate > best.1 {
            best = (k, rate);
        }
    }
    best
}

/// Generation of `prompt` at the source precision (`source`, slot `slot`) with drafts from
/// `draft` (slot `draft_slot` of the same cache). Greedy (`temperature <= 0`): the same
/// tokens, stop and K/V as [`crate::generate`] with `source` alone. Sampled: speculative
/// sampling — at every position the draft's token `x ~ q` is accepted with probability
/// `min(1, p(x)/q(x))`, else a token is drawn from `(p − q)⁺`, so each token is distributed
/// exactly as the source sampler's `p` (penalties, top-k, top-p, min-p and temperature
/// included); every draw is tied to its position and the seed
/// ([`crate::sampling::position_uniform`]) and the draft runs at every position, so the output
/// is a function of the seed alone, not of how rounds were cut (it is not plain sampling's
/// sequence for the same seed, which draws from one stream).
///
/// Errors (before anything runs): two executors of different models, one slot for both, or a
/// verify pass the cache cannot hold.
#[allow(clippy::too_many_arguments)]
pub fn generate_exact(
    source: &mut Executor,
    draft: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    draft_slot: SlotId,
    prompt: &[u32],
    params: &GenerateParams,
    dp: &DraftParams,
    piece: &mut dyn FnMut(u32) -> String,
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generated, EscalationStats)> {
    let bad = |name: &'static str, reason: String| RuntimeError::InvalidParam { name, reason };
    check_pair(source, draft, slot, draft_slot, prompt, params)?;
    if !(1..=MAX_DRAFT).contains(&dp.max_k) {
        return Err(bad(
            "draft k",
            format!("{} is outside 1..={MAX_DRAFT}", dp.max_k),
        ));
    }
    if kv.max_chunk() < 2 {
        return Err(bad(
            "draft",
            "the cache's max_chunk is 1: a verify pass needs at least 2 rows".into(),
        ));
    }
    let max_k = dp.max_k.min(kv.max_chunk() - 1);
    let mut sampler = Sampler::new(params.sampling.clone())?;
    let mut dsampler = Sampler::new(params.sampling.clone())?;
    let eog = source.model().ir.special.eos.clone();
    let vocab = source.model().vocab();
    let chunk = params.prefill_chunk.min(kv.max_chunk());
    let draft_profile = draft.model().profile.hash();
    let mut timings = Timings::default();
    let mut stats = EscalationStats::default();
    let mut logits = vec![0.0f32; vocab];

    // Prefill: the source as plain generation does it. The draft slot (its own working
    // copy, reused across turns like the source's) takes the prompt in the first round's
    // catch-up, in chunks of the cache's `max_chunk` with the pending token — as the engine's
    // draft does, so a sampled session's draft distributions, and so its tokens, are the
    // same bits here and there.
    let t0 = Instant::now();
    let reused = prefill(source, kv, slot, prompt, chunk, Some(&mut logits))?;
    if !kv.is_open(draft_slot) {
        kv.open(draft_slot)?;
    }
    kv.set_profile(draft_slot, &draft_profile)?;
    timings.prefill_tokens = prompt.len() - reused;
    timings.prefill_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut c = Commit::new(params, eog, prompt);
    let mut model = CostModel::new(max_k, false);
    let mut rows: Vec<Row> = Vec::with_capacity(MAX_DRAFT + 1);
    let mut drafts: Vec<u32> = Vec::with_capacity(MAX_DRAFT);
    let mut dlogits = vec![0.0f32; vocab];
    // The verify pass's logits, copied out of the executor (the draft may run in between).
    let mut vlogits: Vec<f32> = Vec::new();
    let seed = params.sampling.seed;
    let mut spec = (params.sampling.temperature > 0.0).then(|| Speculative::new(vocab));
    let mut pos = prompt.len();
    // The first token, from the prefill's logits.
    if c.out.len() >= params.max_tokens {
        return Ok((
            finish(&mut c, StopReason::MaxTokens, reused, timings, t1, on_text),
            stats,
        ));
    }
    let first = sampler.sample(&mut logits, &c.history);
    if let Some(r) = c.take(first, piece, on_text) {
        return Ok((finish(&mut c, r, reused, timings, t1, on_text), stats));
    }
    let mut pending = first;
    let stop = loop {
        if pos >= kv.capacity() {
            break StopReason::ContextFull;
        }
        // Drafts this round: no more than the tokens still allowed after the pending one's
        // successor, the context and the pass can hold.
        let room = (params.max_tokens - c.out.len())
            .saturating_sub(1)
            .min(kv.capacity() - 1 - pos);
        let k = if dp.adaptive {
            model.choose(room)
        } else {
            max_k.min(room)
        };

        // Draft: catch the draft slot up with the committed tokens plus the pending one,
        // then k − 1 more one-row steps.
        drafts.clear();
        if k > 0 || spec.is_some() {
            let td = Instant::now();
            source.swap_kernels(draft);
            let r = draft_round(
                draft,
                kv,
                draft_slot,
                slot,
                pending,
                pos,
                k,
                &mut dsampler,
                &mut c.history,
                &mut drafts,
                &mut dlogits,
                &mut rows,
                spec.as_mut().map(|sp| (seed, &mut sp.qs)),
            );
            source.swap_kernels(draft);
            let steps = r?;
            let dt = td.elapsed().as_secs_f64();
            stats.draft_s += dt;
            ewma(&mut model.draft, dt / steps.max(1) as f64);
        }
        let k = drafts.len();

        // Verify: the pending token and the drafts, k + 1 one-row-order rows of one pass.
        let tv = Instant::now();
        rows.clear();
        rows.push(Row::decode(slot, pos as u32, pending));
        for (i, &d) in drafts.iter().enumerate() {
            rows.push(Row::decode(slot, (pos + 1 + i) as u32, d));
        }
        let n_out = (k + 1) * vocab;
        if vlogits.len() < n_out {
            vlogits.resize(n_out, 0.0);
        }
        vlogits[..n_out].copy_from_slice(&source.forward(kv, &rows)?[..n_out]);
        let out = &vlogits[..n_out];
        let dt = tv.elapsed().as_secs_f64();
        stats.verify_s += dt;
        ewma(&mut model.verify[k + 1], dt);
        stats.rounds += 1;
        if k == 0 {
            stats.plain_rounds += 1;
        }
        stats.drafted += k;

        // Take the source's choices while they agree with the drafts.
        let mut ended = None;
        let mut used = 0;
        let mut accepted = 0;
        for i in 0..=k {
            used = i + 1;
            let l = &mut logits[..];
            l.copy_from_slice(&out[i * vocab..(i + 1) * vocab]);
            sampler.apply_penalties(l, &c.history);
            let tok = match spec.as_mut() {
                None => sampler.choose(l),
                Some(sp) => {
                    sampler.distribution(l, &mut sp.p);
                    // The token's position: the pending one is at `pos`.
                    let at = (pos + 1 + i) as u64;
                    if i == k {
                        // Every draft accepted (or none drafted): the draft's distribution
                        // for the next position, from one more draft step on the last token
                        // (a round without drafts already has it from the catch-up).
                        if k > 0 {
                            let td = Instant::now();
                            source.swap_kernels(draft);
                            let last = drafts[k - 1];
                            let r = draft
                                .forward(kv, &[Row::decode(draft_slot, (pos + k) as u32, last)])
                                .map(|o| dlogits.copy_from_slice(&o[..vocab]));
                            source.swap_kernels(draft);
                            r?;
                            stats.draft_s += td.elapsed().as_secs_f64();
                        }
                        dsampler.apply_penalties(&mut dlogits, &c.history);
                        dsampler.distribution(&dlogits, &mut sp.q);
                        let x = draw(&sp.q, position_uniform(seed, at, DRAW_DRAFT));
                        stats.drafted += 1;
                        let q = std::mem::take(&mut sp.q);
                        let t = sp.choose(&q, x, seed, at);
                        sp.q = q;
                        if t == x {
                            accepted += 1;
                        }
                        t
                    } else {
                        let q = std::mem::take(&mut sp.qs[i]);
                        let t = sp.choose(&q, drafts[i], seed, at);
                        sp.qs[i] = q;
                        t
                    }
                }
            };
            timings.decode_tokens += 1;
            if let Some(r) = c.take(tok, piece, on_text) {
                ended = Some(r);
                if i < k && drafts[i] == tok {
                    accepted += 1;
                }
                break;
            }
            pending = tok;
            if i < k && drafts[i] == tok {
                accepted += 1;
                continue;
            }
            break;
        }
        stats.accepted += accepted;
        model.observe_round(k, accepted);
        // Positions pos..pos+used hold the pending token and the accepted drafts: exactly
        // what plain decoding would have fed. Drop the rest.
        kv.truncate(slot, pos + used)?;
        pos += used;
        if let Some(r) = ended {
            break r;
        }
    };
    Ok((finish(&mut c, stop, reused, timings, t1, on_text), stats))
}

/// The checks a source/draft generation makes before anything runs: a prompt, a prefill
/// chunk, one model for both executors, a slot each.
pub(crate) fn check_pair(
    source: &Executor,
    draft: &Executor,
    slot: SlotId,
    draft_slot: SlotId,
    prompt: &[u32],
    params: &GenerateParams,
) -> Result<()> {
    let bad = |name: &'static str, reason: String| RuntimeError::InvalidParam { name, reason };
    if prompt.is_empty() {
        return Err(bad("prompt", "empty prompt".into()));
    }
    if params.prefill_chunk == 0 {
        return Err(bad("prefill_chunk", "must be positive".into()));
    }
    if source.model().ir.fingerprint != draft.model().ir.fingerprint {
        return Err(bad(
            "draft",
            "the draft executor runs another model than the source".into(),
        ));
    }
    if slot == draft_slot {
        return Err(bad(
            "draft slot",
            "the draft needs a slot of its own".into(),
        ));
    }
    Ok(())
}

pub(crate) fn finish(
    c: &mut Commit<'_>,
    stop: StopReason,
    reused: usize,
    mut timings: Timings,
    t1: Instant,
    on_text: &mut dyn FnMut(&str),
) -> Generated {
    c.finish(stop, on_text);
    timings.decode_s = t1.elapsed().as_secs_f64();
    Generated {
        tokens: std::mem::take(&mut c.out),
        reused_prefix: reused,
        stop,
        timings,
    }
}

/// One draft round: syncs `dslot` with `slot`'s committed tokens plus `pending` (at
/// position `pos`), then proposes `k` tokens into `drafts` — greedy, or with `sampled`
/// (seed, distributions) drawn from the draft's distribution at their positions, which are
/// kept. `logits` then holds the draft's logits after the catch-up (`k = 0`) or for the last
/// draft's position. `history` is restored on return. Returns the number of draft passes
/// run.
#[allow(clippy::too_many_arguments)]
fn draft_round(
    draft: &mut Executor,
    kv: &mut KvCache,
    dslot: SlotId,
    slot: SlotId,
    pending: u32,
    pos: usize,
    k: usize,
    sampler: &mut Sampler,
    history: &mut Vec<u32>,
    drafts: &mut Vec<u32>,
    logits: &mut [f32],
    rows: &mut Vec<Row>,
    mut sampled: Option<(u64, &mut Dists)>,
) -> Result<usize> {
    let vocab = logits.len();
    // The longest prefix the draft slot shares with the committed tokens (pending last).
    let mut same = {
        let committed = kv.tokens(slot)?;
        debug_assert_eq!(committed.len(), pos);
        kv.tokens(dslot)?
            .iter()
            .zip(committed.iter().chain(std::iter::once(&pending)))
            .take_while(|(a, b)| a == b)
            .count()
    };
    // At least the pending token is run, so its draft logits are fresh.
    same = same.min(pos);
    if kv.truncate(dslot, same).is_err() {
        same = 0;
        kv.truncate(dslot, 0)?;
    }
    let mut passes = 0;
    let max_chunk = kv.max_chunk();
    let mut p = same;
    while p <= pos {
        let end = (p + max_chunk).min(pos + 1);
        rows.clear();
        // A draft's float order is free (it only proposes): a catch-up of many rows takes
        // the many-row kernels.
        let order = OrderClass::of(end - p);
        for q in p..end {
            let t = if q == pos {
                pending
            } else {
                kv.tokens(slot)?[q]
            };
            rows.push(Row {
                slot: dslot,
                pos: q as u32,
                token: t,
                logits: q == pos,
                order,
            });
        }
        let out = draft.forward(kv, rows)?;
        passes += 1;
        if end == pos + 1 {
            logits.copy_from_slice(&out[..vocab]);
        }
        p = end;
    }
    let base = history.len();
    for i in 0..k {
        let d = match sampled.as_mut() {
            None => sampler.sample(logits, history),
            Some((seed, qs)) => {
                sampler.apply_penalties(logits, history);
                if qs.len() <= i {
                    qs.push(Vec::new());
                }
                sampler.distribution(logits, &mut qs[i]);
                draw(
                    &qs[i],
                    position_uniform(*seed, (pos + 1 + i) as u64, DRAW_DRAFT),
                )
            }
        };
        drafts.push(d);
        history.push(d);
        if i + 1 == k {
            break;
        }
        let row = [Row::decode(dslot, (pos + 1 + i) as u32, d)];
        let out = draft.forward(kv, &row)?;
        passes += 1;
        logits.copy_from_slice(&out[..vocab]);
    }
    history.truncate(base);
    Ok(passes)
}
