//! Selective escalation (opt-in, approximate): the draft profile decodes alone, and a step
//! whose draft logits look uncertain — the top-1 / top-2 logit margin below a threshold — is
//! recomputed at the source precision, whose choice is taken instead.
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
use crate::executor::{Executor, Row};
use crate::generate::{Commit, GenerateParams, Generated, StopReason, Timings, prefill};
use crate::kv::{KvCache, SlotId};
use crate::sampling::Sampler;

/// When a step escalates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectiveParams {
    /// A step whose draft top-1 minus top-2 logit is below this is recomputed at the source
    /// precision (≥ 0; `f32::INFINITY`: every step).
    pub margin: f32,
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
    /// Seconds in draft passes and in source passes.
    pub draft_s: f64,
    /// Seconds in source passes.
    pub source_s: f64,
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
    if sp.margin.is_nan() || sp.margin < 0.0 {
        return Err(RuntimeError::InvalidParam {
            name: "margin",
            reason: format!("{} must be ≥ 0 (inf: every step)", sp.margin),
        });
    }
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
        let tok = if top2_margin(&dlogits) < sp.margin {
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
    c.finish(stop, on_text);
    timings.decode_s = t1.elapsed().as_secs_f64();
    Ok((
        Generated {
            tokens: std::mem::take(&mut c.out),
            reused_prefix: reused,
            stop,
            timings,
        },
        stats,
    ))
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
