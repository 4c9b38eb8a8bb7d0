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
    if kv.slot(slot).is_err() {
        kv.open(slot)?;
    }
    // Prompt rows sum in llama.cpp's order for the `chunk`-row batch they fall in.
    let orders: Vec<_> = (0..prompt.len())
        .map(|p| prompt_order(p, prompt.len(), chunk))
        .collect();
    let reused = kv.reuse_prefix(slot, prompt, &orders)?;
    let mut timings = Timings::default();
    let mut logits = vec![0.0f32; vocab];
    let mut history: Vec<u32> = Vec::with_capacity(prompt.len() + params.max_tokens);
    history.extend_from_slice(prompt);

    // Prefill.
    let t0 = Instant::now();
    let todo = &prompt[reused..];
    let mut rows: Vec<Row> = Vec::with_capacity(chunk);
    let mut pos = reused as u32;
    for (ci, part) in todo.chunks(chunk).enumerate() {
        let last_chunk = (ci + 1) * chunk >= todo.len();
        rows.clear();
        for (i, &t) in part.iter().enumerate() {
            rows.push(Row {
                slot,
                pos,
                token: t,
                logits: last_chunk && i + 1 == part.len(),
                order: orders[pos as usize],
            });
            pos += 1;
        }
        let out = exec.forward(kv, &rows)?;
        if last_chunk {
            logits.copy_from_slice(&out[..vocab]);
        }
    }
    timings.prefill_tokens = todo.len();
    timings.prefill_s = t0.elapsed().as_secs_f64();

    // Decode.
    let t1 = Instant::now();
    let mut out_tokens = Vec::with_capacity(params.max_tokens);
    let mut stops = StopStrings::new(&params.stop);
    let stop = loop {
        if out_tokens.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        let tok = sampler.sample(&mut logits, &history);
        if params.stop_at_eog && eog.contains(&tok) {
            break StopReason::Eog;
        }
        out_tokens.push(tok);
        history.push(tok);
        let text = piece(tok);
        let (emit, hit) = stops.push(&text);
        if !emit.is_empty() {
            on_text(&emit);
        }
        if hit {
            break StopReason::StopString;
        }
        if out_tokens.len() >= params.max_tokens {
            break StopReason::MaxTokens;
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
    let rest = stops.flush();
    if stop != StopReason::StopString && !rest.is_empty() {
        on_text(&rest);
    }
    timings.decode_s = t1.elapsed().as_secs_f64();
    Ok(Generated {
        tokens: out_tokens,
        reused_prefix: reused,
        stop,
        timings,
    })
}
