//! Choosing exact escalation's draft by measurement, not by a fixed default.
//!
//! Which draft profile pays depends on the machine (on an AVX2-only core a `q4` draft step can
//! cost as much as the source's ggml-type step), on the model and on the text. So the choice
//! is measured on a probe prompt before generation:
//!
//! 1. [`probe_source`]: the source prefills the probe and decodes a greedy continuation one row
//!    at a time (the median step is the plain decode cost `t1`), then times verify passes of
//!    `2..=max_k + 1` one-row-order rows at the continuation's end.
//! 2. [`try_draft`], per candidate: the draft reads the probe and the source's continuation
//!    (teacher-forced, one pass per chunk) and its greedy choice at each continuation position
//!    is compared with the source's — the fraction that agree is the per-token acceptance
//!    `a`; then it decodes one row at a time (the median step is `td`).
//! 3. [`best_k`] turns `(a, td, t1, verify)` into the best draft count and its expected
//!    committed tokens per second; [`pick`] takes the candidate with the highest expected
//!    speed-up over plain decoding, or none when no candidate beats plain decoding by
//!    [`MIN_GAIN`] (drafting is then off: plain source decoding is already the exact output).
//!
//! The probe only measures: it leaves nothing in the slots it used that a later generation
//! could read (both are truncated to empty), and no committed output depends on it.

use std::time::Instant;

use synapse_kernels::OrderClass;

use crate::error::{Result, RuntimeError};
use crate::escalation::{MAX_DRAFT, best_k};
use crate::executor::{Executor, Row};
use crate::generate::prefill;
use crate::kv::{KvCache, SlotId};
use crate::sampling::argmax;

/// A draft is chosen only when its expected speed beats plain decoding by this factor
/// (below it the measurement's noise decides).
pub const MIN_GAIN: f64 = 1.05;

/// How much a probe measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeParams {
    /// Greedy continuation tokens the source decodes (the acceptance sample).
    pub steps: usize,
    /// Most draft tokens per round considered (verify passes of up to `max_k + 1` rows are
    /// timed).
    pub max_k: usize,
    /// Timed repetitions of each verify pass and draft-step run (medians are taken).
    pub repeats: usize,
}

impl Default for ProbeParams {
    fn default() -> Self {
        ProbeParams {
            steps: 24,
            max_k: 8,
            repeats: 3,
        }
    }
}

/// What the source measured on the probe.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceProbe {
    /// The probe prompt.
    pub prompt: Vec<u32>,
    /// The source's greedy continuation of it.
    pub continuation: Vec<u32>,
    /// Median seconds of a one-row decode step.
    pub step_s: f64,
    /// Median seconds of a verify pass, by rows (index = rows; `None` where not measured).
    pub verify_s: Vec<Option<f64>>,
    /// The `max_k` the verify passes were measured for.
    pub max_k: usize,
}

/// One candidate draft, measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftTrial {
    /// Fraction of the continuation's positions where the draft's greedy token is the
    /// source's.
    pub acceptance: f64,
    /// Median seconds of one draft step.
    pub step_s: f64,
    /// The draft count per round with the best expected rate (0: drafting does not pay).
    pub k: usize,
    /// Expected committed tokens per second at that `k`.
    pub tok_s: f64,
    /// `tok_s` over plain decoding's rate.
    pub speedup: f64,
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn bad(reason: String) -> RuntimeError {
    RuntimeError::InvalidParam {
        name: "draft probe",
        reason,
    }
}

/// Measures the source on `prompt` in `slot` (see the module docs). The cache must hold
/// `prompt.len() + steps + max_k + 1` positions and passes of `max_k + 1` rows (a draft's
/// timed steps run on past the continuation: `prompt.len() + 2·steps` positions time them
/// all). The slot is left empty.
pub fn probe_source(
    exec: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    prompt: &[u32],
    p: &ProbeParams,
) -> Result<SourceProbe> {
    if prompt.is_empty() || p.steps < 2 || p.repeats == 0 {
        return Err(bad(
            "a probe needs a prompt, ≥ 2 steps and ≥ 1 repeat".into()
        ));
    }
    if !(1..=MAX_DRAFT).contains(&p.max_k) {
        return Err(bad(format!("max_k {} is outside 1..={MAX_DRAFT}", p.max_k)));
    }
    let max_k = p.max_k.min(kv.max_chunk().saturating_sub(1));
    if max_k == 0 {
        return Err(bad(
            "the cache's passes hold one row: nothing to verify".into()
        ));
    }
    let need = prompt.len() + p.steps + max_k + 1;
    if need > kv.capacity() {
        return Err(bad(format!(
            "the probe needs {need} positions, the cache holds {}",
            kv.capacity()
        )));
    }
    let vocab = exec.model().vocab();
    if kv.is_open(slot) {
        kv.truncate(slot, 0)?;
    }
    let mut logits = vec![0f32; vocab];
    prefill(exec, kv, slot, prompt, kv.max_chunk(), Some(&mut logits))?;
    let mut tok = argmax(&logits);
    let mut continuation = Vec::with_capacity(p.steps);
    let mut times = Vec::with_capacity(p.steps);
    let mut pos = prompt.len();
    for _ in 0..p.steps {
        continuation.push(tok);
        let t = Instant::now();
        let out = exec.forward(kv, &[Row::decode(slot, pos as u32, tok)])?;
        times.push(t.elapsed().as_secs_f64());
        tok = argmax(&out[..vocab]);
        pos += 1;
    }
    // The first step warms caches and pools.
    let step_s = median(&mut times[1..]);
    let mut verify_s = vec![None; max_k + 2];
    verify_s[1] = Some(step_s);
    let mut rows = Vec::with_capacity(max_k + 1);
    let mut t_rows = Vec::with_capacity(p.repeats);
    for (r, v) in verify_s.iter_mut().enumerate().skip(2) {
        t_rows.clear();
        for _ in 0..p.repeats {
            rows.clear();
            rows.extend((0..r).map(|i| {
                Row::decode(slot, (pos + i) as u32, continuation[i % continuation.len()])
            }));
            let t = Instant::now();
            exec.forward(kv, &rows)?;
            t_rows.push(t.elapsed().as_secs_f64());
            kv.truncate(slot, pos)?;
        }
        *v = Some(median(&mut t_rows));
    }
    kv.truncate(slot, 0)?;
    Ok(SourceProbe {
        prompt: prompt.to_vec(),
        continuation,
        step_s,
        verify_s,
        max_k,
    })
}

/// Measures `draft` (an executor of the same model at another profile) against the source's
/// probe, in `dslot`; the draft runs on `source`'s kernel context (thread pool), which it
/// returns. The slot is left empty.
pub fn try_draft(
    source: &mut Executor,
    draft: &mut Executor,
    kv: &mut KvCache,
    dslot: SlotId,
    probe: &SourceProbe,
    p: &ProbeParams,
) -> Result<DraftTrial> {
    if source.model().ir.fingerprint != draft.model().ir.fingerprint {
        return Err(bad("the draft runs another model than the source".into()));
    }
    source.swap_kernels(draft);
    let r = measure_draft(draft, kv, dslot, probe, p);
    source.swap_kernels(draft);
    let (acceptance, step_s) = r?;
    let t1 = probe.step_s;
    let (k, tok_s) = best_k(acceptance, step_s, t1, probe.max_k, |rows| {
        probe.verify_s.get(rows).copied().flatten()
    });
    Ok(DraftTrial {
        acceptance,
        step_s,
        k,
        tok_s,
        speedup: tok_s * t1,
    })
}

fn measure_draft(
    draft: &mut Executor,
    kv: &mut KvCache,
    dslot: SlotId,
    probe: &SourceProbe,
    p: &ProbeParams,
) -> Result<(f64, f64)> {
    let vocab = draft.model().vocab();
    if !kv.is_open(dslot) {
        kv.open(dslot)?;
    }
    kv.truncate(dslot, 0)?;
    kv.set_profile(dslot, &draft.model().profile.hash())?;
    // Teacher-forced: the prompt and the source's continuation but its last token; the rows
    // from the prompt's last position on predict the continuation.
    let n_prompt = probe.prompt.len();
    let cont = &probe.continuation;
    let seq: Vec<u32> = probe
        .prompt
        .iter()
        .chain(&cont[..cont.len() - 1])
        .copied()
        .collect();
    let first = n_prompt - 1;
    let mut agree = 0usize;
    let mut rows = Vec::with_capacity(kv.max_chunk());
    let mut p0 = 0;
    while p0 < seq.len() {
        let end = (p0 + kv.max_chunk()).min(seq.len());
        let order = OrderClass::of(end - p0);
        rows.clear();
        rows.extend((p0..end).map(|q| Row {
            slot: dslot,
            pos: q as u32,
            token: seq[q],
            logits: q >= first,
            order,
        }));
        let out = draft.forward(kv, &rows)?;
        for (i, q) in (p0.max(first)..end).enumerate() {
            if argmax(&out[i * vocab..(i + 1) * vocab]) == cont[q - first] {
                agree += 1;
            }
        }
        p0 = end;
    }
    let acceptance = agree as f64 / cont.len() as f64;
    // Draft steps, one row each, continuing the continuation greedily.
    let steps = (probe.max_k * p.repeats).clamp(4, p.steps);
    let mut tok = cont[cont.len() - 1];
    let mut times = Vec::with_capacity(steps);
    for pos in seq.len()..(seq.len() + steps).min(kv.capacity()) {
        let t = Instant::now();
        let out = draft.forward(kv, &[Row::decode(dslot, pos as u32, tok)])?;
        times.push(t.elapsed().as_secs_f64());
        tok = argmax(&out[..vocab]);
    }
    kv.truncate(dslot, 0)?;
    let skip = 1.min(times.len());
    let step_s = median(&mut times[skip..]);
    Ok((acceptance, step_s))
}

/// The index of the trial with the highest expected speed-up, when that speed-up is at least
/// [`MIN_GAIN`] (else `None`: plain decoding).
pub fn pick(trials: &[DraftTrial]) -> Option<usize> {
    let (i, t) = trials
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.speedup.total_cmp(&b.1.speedup))?;
    (t.k > 0 && t.speedup >= MIN_GAIN).then_some(i)
}
