//! The generation loop for one session: prefix reuse, chunked prefill, decode, stop rules.

use std::time::Instant;

use crate::error::{Result, RuntimeError};
use crate::executor::{Executor, Row, prompt_order};
use crate::kv::{KvCache, SlotId};
use crate::sampling::{Sampler, SamplingParams, StopStrings};

/// Parameters of one generation.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings (matched on the decoded text).
    pub stop: Vec<String>,
    /// Rows per prefill pass (at most the cache's `max_chunk`).
    pub prefill_chunk: usize,
    /// Stop at the model's end-of-generation tokens.
    pub stop_at_eog: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 64,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            prefill_chunk: 512,
            stop_at_eog: true,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token.
    Eog,
    /// `max_tokens` reached.
    MaxTokens,
    /// A stop string matched.
    StopString,
    /// The session's context is full.
    ContextFull,
}

/// Wall-clock timings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens actually run (after prefix reuse).
    pub prefill_tokens: usize,
    /// Seconds spent in prefill.
    pub prefill_s: f64,
    /// Tokens decoded (forward passes after the prefill).
    pub decode_tokens: usize,
    /// Seconds spent decoding.
    pub decode_s: f64,
}

impl Timings {
    /// Prefill tokens per second.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_s)
    }
    /// Decode tokens per second.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode_s)
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// What a generation produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// Generated token ids (end-of-generation token excluded).
    pub tokens: Vec<u32>,
    /// Prompt tokens served from the session's cache.
    pub reused_prefix: usize,
    /// Why it stopped.
    pub stop: StopReason,
    /// Timings.
    pub timings: Timings,
}

/// Runs `prompt` (the whole conversation so far) in `slot` and generates.
///
/// `piece` turns a token into its text (used for stop strings; return an empty string when
/// text is not needed), `on_text` receives text as it becomes safe to show.
pub fn generate(
    exec: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    prompt: &[u32],
    params: &GenerateParams,
    piece: &mut dyn FnMut(u32) -> String,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generated> {
    if prompt.is_empty() {
        return Err(RuntimeError::InvalidParam {
            name: "prompt",
            reason: "empty prompt".into(),
        });
    }
    if params.prefill_chunk == 0 {
        return Err(RuntimeError::InvalidParam {
            name: "prefill_chunk",
            reason: "must be positive".into(),
        });
    }
    let mut sampler = Sampler::new(params.sampling.clone())?;
    let eog = exec.model().ir.special.eos.clone();
    let vocab = exec.model().vocab();
    let chunk = params.prefill_chunk.min(kv.max_chunk());
    let mut timings = Timings::default();
    let mut logits = vec![0.0f32; vocab];

    // Prefill.
    let t0 = Instant::now();
    let reused = prefill(exec, kv, slot, prompt, chunk, Some(&mut logits))?;
    let todo = &prompt[reused..];
    let mut pos = prompt.len() as u32;
    timings.prefill_tokens = todo.len();
    timings.prefill_s = t0.elapsed().as_secs_f64();

    // Decode.
    let t1 = Instant::now();
    let mut c = Commit::new(params, eog, prompt);
    let stop = loop {
        if c.out.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        let tok = sampler.sample(&mut logits, &c.history);
        if let Some(r) = c.take(tok, piece, on_text) {
            break r;
        }
        if pos as usize >= kv.capacity() {
            break StopReason::ContextFull;
        }
        let row = [Row::decode(slot, pos, tok)];
        pos += 1;
        let out = exec.forward(kv, &row)?;
        logits.copy_from_slice(&out[..vocab]);
        timings.decode_tokens += 1;
    };
    c.finish(stop, on_text);
    timings.decode_s = t1.elapsed().as_secs_f64();
    Ok(Generated {
        tokens: c.out,
        reused_prefix: reused,
        stop,
        timings,
    })
}

/// Runs `prompt` into `slot` (opened if needed), reusing the longest prefix the slot already
/// holds, in passes of `chunk` rows whose float order is llama.cpp's for the `chunk`-row
/// batch each position falls in. With `logits`, the last position's logits are written
/// there. Returns the number of positions reused.
pub(crate) fn prefill(
    exec: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    prompt: &[u32],
    chunk: usize,
    mut logits: Option<&mut [f32]>,
) -> Result<usize> {
    if kv.slot(slot).is_err() {
        kv.open(slot)?;
    }
    let orders: Vec<_> = (0..prompt.len())
        .map(|p| prompt_order(p, prompt.len(), chunk))
        .collect();
    let reused = kv.reuse_prefix(slot, prompt, &orders)?;
    let todo = &prompt[reused..];
    let mut rows: Vec<Row> = Vec::with_capacity(chunk);
    let mut pos = reused as u32;
    let want = logits.is_some();
    for (ci, part) in todo.chunks(chunk).enumerate() {
        let last_chunk = (ci + 1) * chunk >= todo.len();
        rows.clear();
        for (i, &t) in part.iter().enumerate() {
            rows.push(Row {
                slot,
                pos,
                token: t,
                logits: want && last_chunk && i + 1 == part.len(),
                order: orders[pos as usize],
            });
            pos += 1;
        }
        let out = exec.forward(kv, &rows)?;
        if last_chunk && let Some(l) = logits.as_deref_mut() {
            l.copy_from_slice(&out[..l.len()]);
        }
    }
    Ok(reused)
}

/// The output side of a generation: takes chosen tokens one at a time and applies the stop
/// rules (end-of-generation, stop strings, `max_tokens`), so the plain loop and exact
/// escalation end at the same token for the same reason.
pub(crate) struct Commit<'a> {
    params: &'a GenerateParams,
    eog: Vec<u32>,
    stops: StopStrings,
    /// Tokens generated so far.
    pub(crate) out: Vec<u32>,
    /// The prompt and the generated tokens (what penalties look at).
    pub(crate) history: Vec<u32>,
}

impl<'a> Commit<'a> {
    pub(crate) fn new(params: &'a GenerateParams, eog: Vec<u32>, prompt: &[u32]) -> Self {
        let mut history = Vec::with_capacity(prompt.len() + params.max_tokens + 1);
        history.extend_from_slice(prompt);
        Commit {
            params,
            eog,
            stops: StopStrings::new(&params.stop),
            out: Vec::with_capacity(params.max_tokens),
            history,
        }
    }

    /// Takes `tok` as the next token; `Some(reason)` when generation ends with it (an
    /// end-of-generation token is not taken).
    pub(crate) fn take(
        &mut self,
        tok: u32,
        piece: &mut dyn FnMut(u32) -> String,
        on_text: &mut dyn FnMut(&str),
    ) -> Option<StopReason> {
        if self.params.stop_at_eog && self.eog.contains(&tok) {
            return Some(StopReason::Eog);
        }
        self.out.push(tok);
        self.history.push(tok);
        let text = piece(tok);
        let (emit, hit) = self.stops.push(&text);
        if !emit.is_empty() {
            on_text(&emit);
        }
        if hit {
            return Some(StopReason::StopString);
        }
        if self.out.len() >= self.params.max_tokens {
            return Some(StopReason::MaxTokens);
        }
        None
    }

    /// Flushes held-back text unless a stop string ended the generation.
    pub(crate) fn finish(&mut self, stop: StopReason, on_text: &mut dyn FnMut(&str)) {
        let rest = self.stops.flush();
        if stop != StopReason::StopString && !rest.is_empty() {
            on_text(&rest);
        }
    }
}
