//! Selective escalation (opt-in, approximate): the draft decodes alone, and a step whose
//! draft logits look uncertain — the top-1 / top-2 logit margin below a threshold, or the
//! entropy of their softmax above one ([`SelectiveParams::fires`], the online monitor) — is
//! recomputed at the source precision, whose choice is taken instead.
//!
//! Two drafts: a low-precision profile of the model ([`generate_selective`]), or the model's
//! own body with its LM head cut to a vocabulary shortlist ([`generate_selective_head`],
//! [`crate::head_draft::Shortlist`]). With the shortlist the body runs at the source
//! precision, so the slot always holds the source's K/V and an escalated step is one call
//! of the full head over that step's row (the source's logits, bit for bit); the only
//! approximation is a step that does not escalate while the source's choice is off the list.
//!
//! The source slot is brought up to date only when a step escalates (the prompt in
//! llama.cpp's batch order, as plain generation runs it; generated tokens as one-row-order
//! rows, the bits of decode steps), so an escalated step's logits are exactly the source's
//! for the tokens committed so far. With an infinite threshold every step escalates and the
//! output is plain source decoding's; with 0 none does and it is the draft's own. In between
//! it is neither: unlike [`crate::escalation`], this mode does not promise the source's
//! output, so it is never a default, and a response says that it produced it.

use std::time::Instant;

use crate::error::{Result, RuntimeError};
use crate::escalation::finish;
use crate::executor::{Executor, Row};
use crate::generate::{Commit, GenerateParams, Generated, StopReason, Timings, prefill};
use crate::head_draft::Shortlist;
use crate::kv::{KvCache, SlotId};
use crate::sampling::Sampler;

/// When a step escalates (the online monitor): either signal fires it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectiveParams {
    /// A step whose draft top-1 minus top-2 logit is below this is recomputed at the source
    /// precision (≥ 0; `f32::INFINITY`: every step).
    pub margin: f32,
    /// A step whose draft distribution (the softmax of its logits) has more entropy than
    /// this, in nats, is recomputed at the source precision (≥ 0; `f32::INFINITY`: the
    /// entropy never fires).
    pub max_entropy: f32,
}

impl SelectiveParams {
    /// Escalation by the margin alone.
    pub fn margin(margin: f32) -> Self {
        SelectiveParams {
            margin,
            max_entropy: f32::INFINITY,
        }
    }

    /// Both thresholds are numbers ≥ 0 (∞ allowed).
    pub fn check(&self) -> Result<()> {
        if self.margin.is_nan() || self.margin < 0.0 {
            return Err(RuntimeError::InvalidParam {
                name: "margin",
                reason: format!("{} must be ≥ 0 (inf: every step)", self.margin),
            });
        }
        if self.max_entropy.is_nan() || self.max_entropy < 0.0 {
            return Err(RuntimeError::InvalidParam {
                name: "max entropy",
                reason: format!("{} must be ≥ 0 (inf: never by entropy)", self.max_entropy),
            });
        }
        Ok(())
    }

    /// Whether a step whose draft logits are `logits` (−∞ entries are not candidates)
    /// escalates.
    pub fn fires(&self, logits: &[f32]) -> bool {
        self.fires_on(top2_margin(logits), || entropy(logits))
    }

    /// [`Self::fires`] from a step's margin and (computed only when the entropy threshold
    /// is finite and the margin did not fire) its entropy.
    pub fn fires_on(&self, margin: f32, entropy: impl FnOnce() -> f32) -> bool {
        margin < self.margin || (self.max_entropy.is_finite() && entropy() > self.max_entropy)
    }
}

/// The entropy, in nats, of the softmax of `logits` (−∞ entries have probability 0; 0 when
/// no entry is finite), summed in f64.
pub fn entropy(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return 0.0;
    }
    // H = log Z − Σ p·x' with x' = x − max, Z = Σ e^x'.
    let (mut z, mut zx) = (0.0f64, 0.0f64);
    for &v in logits {
        if v > f32::NEG_INFINITY {
            let x = (v - max) as f64;
            let e = x.exp();
            z += e;
            zx += e * x;
        }
    }
    (z.ln() - zx / z).max(0.0) as f32
}

/// What selective escalation did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SelectiveStats {
    /// Tokens chosen (decode steps).
    pub steps: usize,
    /// Steps recomputed at the source precision.
    pub escalated: usize,
    /// Source rows run to bring its slot up to date (prompt included).
    pub source_rows: usize,
    /// Seconds in draft passes (with a head-only draft: the body passes and the shortlist).
    pub draft_s: f64,
    /// Seconds in source passes (with a head-only draft: the full head of escalated steps).
    pub source_s: f64,
    /// With a head-only draft: tokens the source chose off the shortlist at escalated steps
    /// (each then joined it).
    pub off_shortlist: usize,
}

/// Top-1 minus top-2 of `logits` (∞ with fewer than two finite values).
pub fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in logits {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    if b == f32::NEG_INFINITY {
        f32::INFINITY
    } else {
        a - b
    }
}

/// Generates `prompt` with the draft executor (`draft`, slot `draft_slot`), escalating to the
/// source (`source`, slot `slot` of the same cache) the steps whose draft margin is below
/// `sp.margin`.
#[allow(clippy::too_many_arguments)]
pub fn generate_selective(
    source: &mut Executor,
    draft: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    draft_slot: SlotId,
    prompt: &[u32],
    params: &GenerateParams,
    sp: &SelectiveParams,
    piece: &mut dyn FnMut(u32) -> String,
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generated, SelectiveStats)> {
    crate::escalation::check_pair(source, draft, slot, draft_slot, prompt, params)?;
    sp.check()?;
    let mut sampler = Sampler::new(params.sampling.clone())?;
    let eog = source.model().ir.special.eos.clone();
    let vocab = source.model().vocab();
    let chunk = params.prefill_chunk.min(kv.max_chunk());
    let mut timings = Timings::default();
    let mut stats = SelectiveStats::default();
    let mut dlogits = vec![0.0f32; vocab];
    let mut slogits = vec![0.0f32; vocab];
    let mut rows: Vec<Row> = Vec::with_capacity(chunk);

    // The draft runs the prompt; the source's slot starts from what it can reuse.
    let t0 = Instant::now();
    if !kv.is_open(draft_slot) {
        kv.open(draft_slot)?;
    }
    kv.set_profile(draft_slot, &draft.model().profile.hash())?;
    // The draft borrows the source's thread pool for its passes (`Executor::swap_kernels`).
    source.swap_kernels(draft);
    let r = prefill(draft, kv, draft_slot, prompt, chunk, Some(&mut dlogits));
    source.swap_kernels(draft);
    let reused = r?;
    if !kv.is_open(slot) {
        kv.open(slot)?;
    }
    timings.prefill_tokens = prompt.len() - reused;
    timings.prefill_s = t0.elapsed().as_secs_f64();
    stats.draft_s += timings.prefill_s;

    let t1 = Instant::now();
    let mut c = Commit::new(params, eog, prompt);
    let mut pos = prompt.len();
    let stop = loop {
        if c.out.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        let tok = if sp.fires(&dlogits) {
            // Escalate: the source catches up with every committed token, then chooses.
            let ts = Instant::now();
            source_logits(
                source,
                kv,
                slot,
                prompt,
                &c.out,
                chunk,
                &mut rows,
                &mut slogits,
                &mut stats,
            )?;
            stats.source_s += ts.elapsed().as_secs_f64();
            stats.escalated += 1;
            sampler.sample(&mut slogits, &c.history)
        } else {
            sampler.sample(&mut dlogits, &c.history)
        };
        stats.steps += 1;
        if let Some(r) = c.take(tok, piece, on_text) {
            break r;
        }
        if pos >= kv.capacity() {
            break StopReason::ContextFull;
        }
        let td = Instant::now();
        source.swap_kernels(draft);
        let r = draft
            .forward(kv, &[Row::decode(draft_slot, pos as u32, tok)])
            .map(|o| dlogits.copy_from_slice(&o[..vocab]));
        source.swap_kernels(draft);
        r?;
        stats.draft_s += td.elapsed().as_secs_f64();
        pos += 1;
        timings.decode_tokens += 1;
    };
    Ok((finish(&mut c, stop, reused, timings, t1, on_text), stats))
}

/// The source's logits for the next position after `prompt` + `out`: its slot is brought up
/// to date first (the prompt as plain generation runs it, generated tokens as one-row-order
/// rows).
#[allow(clippy::too_many_arguments)]
fn source_logits(
    source: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    prompt: &[u32],
    out: &[u32],
    chunk: usize,
    rows: &mut Vec<Row>,
    logits: &mut [f32],
    stats: &mut SelectiveStats,
) -> Result<()> {
    let vocab = logits.len();
    // The committed positions the slot already holds (prompt, then generated tokens).
    let same = kv
        .tokens(slot)?
        .iter()
        .zip(prompt.iter().chain(out))
        .take_while(|(a, b)| a == b)
        .count();
    if same < prompt.len() {
        // The prompt as plain generation runs it (reusing what the slot holds of it).
        let want = if out.is_empty() {
            Some(&mut *logits)
        } else {
            None
        };
        let reused = prefill(source, kv, slot, prompt, chunk, want)?;
        stats.source_rows += prompt.len() - reused;
        if out.is_empty() {
            return Ok(());
        }
    } else {
        // Held positions past the committed ones are not this generation's; the last
        // committed one is rerun when its logits are not at hand.
        let end = prompt.len() + out.len();
        if kv.truncate(slot, same.min(end - 1)).is_err() {
            // A sliding-window ring cannot rewind that far: start the slot afresh.
            kv.truncate(slot, 0)?;
            return source_logits(source, kv, slot, prompt, out, chunk, rows, logits, stats);
        }
    }
    // Generated tokens the slot lacks, the last one with logits.
    let mut p = kv.len(slot)?;
    let end = prompt.len() + out.len();
    while p < end {
        let stop = (p + kv.max_chunk()).min(end);
        rows.clear();
        for q in p..stop {
            let t = if q < prompt.len() {
                prompt[q]
            } else {
                out[q - prompt.len()]
            };
            rows.push(Row {
                logits: q + 1 == end,
                ..Row::decode(slot, q as u32, t)
            });
        }
        let o = source.forward(kv, rows)?;
        stats.source_rows += stop - p;
        if stop == end {
            logits.copy_from_slice(&o[..vocab]);
        }
        p = stop;
    }
    Ok(())
}

/// Selective escalation with a head-only draft: `exec` runs the model's body once per
/// position at its own precision (slot `slot` holds exactly the K/V plain decoding holds),
/// `shortlist` chooses each token from its listed logits, and a step where the monitor
/// (`sp`, on the listed logits) fires runs the full head over that step's row — the
/// source's logits, bit for bit — and takes the source's choice; a token the source chose
/// off the list joins it. The first token comes from the prompt pass's own (full) logits.
/// With an infinite margin the output is plain decoding's; with both thresholds off
/// (margin 0, entropy ∞) it is the shortlist's own.
///
/// Sampled or penalized sessions draw a non-escalated step from the listed logits
/// scattered over the vocabulary (−∞ off the list), penalties applied; the monitor looks at
/// the raw listed logits.
///
/// Errors (before anything runs): an empty prompt, a zero prefill chunk, thresholds that
/// are not ≥ 0, a shortlist gathered from another head than `exec`'s model's.
#[allow(clippy::too_many_arguments)]
pub fn generate_selective_head(
    exec: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    prompt: &[u32],
    params: &GenerateParams,
    sp: &SelectiveParams,
    shortlist: &mut Shortlist,
    piece: &mut dyn FnMut(u32) -> String,
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generated, SelectiveStats)> {
    let bad = |name: &'static str, reason: &str| RuntimeError::InvalidParam {
        name,
        reason: reason.into(),
    };
    if prompt.is_empty() {
        return Err(bad("prompt", "empty prompt"));
    }
    if params.prefill_chunk == 0 {
        return Err(bad("prefill_chunk", "must be positive"));
    }
    sp.check()?;
    let model = exec.model().clone();
    shortlist.check(&model)?;
    let mut sampler = Sampler::new(params.sampling.clone())?;
    let eog = model.ir.special.eos.clone();
    let vocab = model.vocab();
    let hd = model.hidden();
    let chunk = params.prefill_chunk.min(kv.max_chunk());
    let mut timings = Timings::default();
    let mut stats = SelectiveStats::default();
    let mut logits = vec![0.0f32; vocab];
    // The listed logits scattered over the vocabulary (−∞ off the list).
    let mut dfull = vec![f32::NEG_INFINITY; vocab];
    let mut hidden = vec![0.0f32; hd];
    // Greedy with no penalty: the list's argmax is the draft's choice as it comes.
    let plain_greedy = params.sampling.temperature <= 0.0 && !sampler.penalizes();

    let t0 = Instant::now();
    let reused = prefill(exec, kv, slot, prompt, chunk, Some(&mut logits))?;
    timings.prefill_tokens = prompt.len() - reused;
    timings.prefill_s = t0.elapsed().as_secs_f64();
    stats.source_rows = timings.prefill_tokens;

    let t1 = Instant::now();
    let mut c = Commit::new(params, eog, prompt);
    let mut pos = prompt.len();
    // The prompt pass computed the full head: the first token is the source's.
    let mut have_source = true;
    let stop = loop {
        if c.out.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        let tok = if have_source {
            sampler.sample(&mut logits, &c.history)
        } else {
            let ch = shortlist.choice(exec, &hidden)?;
            if sp.fires_on(ch.margin, || ch.entropy) {
                let ts = Instant::now();
                logits.copy_from_slice(&exec.head_logits(&hidden)?[..vocab]);
                let t = sampler.sample(&mut logits, &c.history);
                stats.source_s += ts.elapsed().as_secs_f64();
                stats.escalated += 1;
                if !shortlist.contains(t) {
                    stats.off_shortlist += 1;
                    shortlist.add(&model, t)?;
                }
                t
            } else if plain_greedy {
                ch.token
            } else {
                shortlist.scatter_computed(&mut dfull)?;
                sampler.sample(&mut dfull, &c.history)
            }
        };
        stats.steps += 1;
        if let Some(r) = c.take(tok, piece, on_text) {
            break r;
        }
        if pos >= kv.capacity() {
            break StopReason::ContextFull;
        }
        let td = Instant::now();
        let h = exec.forward_normed(kv, &[Row::decode(slot, pos as u32, tok)])?;
        hidden.copy_from_slice(&h[..hd]);
        stats.draft_s += td.elapsed().as_secs_f64();
        have_source = false;
        pos += 1;
        timings.decode_tokens += 1;
    };
    Ok((finish(&mut c, stop, reused, timings, t1, on_text), stats))
}
