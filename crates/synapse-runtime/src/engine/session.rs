//! One running session's state: its prompt and position, sampler, text assembly (complete
//! UTF-8 only, stop strings held back) and what it reports back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use synapse_kernels::OrderClass;
use tokio::sync::mpsc::UnboundedSender;

use super::api::{Constraint, Event, FinishReason, Finished, Logprob, TokenEvent, TokenPieces};
use crate::kv::SlotId;
use crate::pipeline::RowRead;
use crate::sampling::{SampleAt, Sampler, StopStrings};

/// A request waiting for a slot.
pub(crate) struct Waiting {
    pub id: u64,
    pub req: super::api::Request,
    pub tx: UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub since: Instant,
}

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Prompt rows still to run.
    Prefill,
    /// Feeding back `last` at position `pos`.
    Decode,
}

/// A session holding a slot.
pub(crate) struct Active {
    pub id: u64,
    pub slot: SlotId,
    /// The scheduler's executor (precision profile) this session runs on, start to end.
    pub exec: usize,
    pub tx: UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub prompt: Vec<u32>,
    pub orders: Vec<OrderClass>,
    /// Next position to run (= positions the slot holds).
    pub pos: usize,
    pub phase: Phase,
    pub cached: usize,
    pub sampler: Sampler,
    pub logit_bias: Vec<(u32, f32)>,
    pub constraint: Option<Box<dyn Constraint>>,
    pub logprobs: Option<usize>,
    pub max_tokens: usize,
    pub stop_at_eog: bool,
    /// Prompt and generated tokens (penalties look at them).
    pub history: Vec<u32>,
    pub generated: usize,
    /// The last sampled token, fed back at the next decode step.
    pub last: u32,
    /// Exact escalation: whether this session drafts, its drafts of the round (verified in
    /// the step's pass), and while its verify rows are read: rows taken, and whether the
    /// rest of them are discarded.
    pub escalate: bool,
    pub drafts: Vec<u32>,
    pub vseen: usize,
    pub vdone: bool,
    /// A sampled escalating session's speculative sampling this round: the draft's
    /// distribution at each drafted position and, after them, at the position after the
    /// last draft (the first `spec_len` entries; the vectors are reused), and how many drafts
    /// the round wants.
    pub spec_qs: Vec<Vec<(u32, f64)>>,
    pub spec_len: usize,
    pub draft_want: usize,
    /// Drafts of the round being verified that the source accepted.
    pub vacc: usize,
    /// Its round ran in this step's head-draft phase (it takes no row in the step's pass).
    pub head_stepped: bool,
    /// Its rows are in a pass sent down a pipeline whose logits have not come back yet
    /// (it takes no part in another pass and is not retired meanwhile).
    pub in_flight: bool,
    /// Tokens this session must choose first (a resumed run; [`super::api::Request::forced`]).
    forced: Vec<u32>,
    stops: StopStrings,
    bytes: Vec<u8>,
    /// The logits before sampling's penalties (only when log-probabilities are asked for).
    lp_buf: Vec<f32>,
    /// This step's log-sum-exp and top alternatives, and the chosen token's log-probability.
    lp_pending: Option<(f64, Vec<(u32, f32)>)>,
    lp_chosen: f32,
    /// The log-probabilities a pipeline's last stage computed for the row about to be
    /// taken (a [`RowRead::Choose`] row comes back as its token's one-hot row).
    pub lp_given: Option<crate::pipeline::RowLogprob>,
}

/// What processing a token decided.
pub(crate) enum After {
    /// Keep decoding.
    Continue,
    /// The session is over.
    Finish(FinishReason),
    /// The session failed (its error was sent; no `Done` follows).
    Failed,
}

impl Active {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        w: Waiting,
        slot: SlotId,
        exec: usize,
        orders: Vec<OrderClass>,
        cached: usize,
        sampler: Sampler,
    ) -> Self {
        let req = w.req;
        let escalate = req.escalation && req.constraint.is_none();
        let mut history = Vec::with_capacity(req.prompt.len() + req.max_tokens.min(1 << 16));
        history.extend_from_slice(&req.prompt);
        Active {
            id: w.id,
            slot,
            exec,
            tx: w.tx,
            cancel: w.cancel,
            pos: cached,
            phase: Phase::Prefill,
            cached,
            sampler,
            logit_bias: req.logit_bias,
            constraint: req.constraint,
            logprobs: req.logprobs,
            max_tokens: req.max_tokens,
            stop_at_eog: req.stop_at_eog,
            history,
            generated: 0,
            last: 0,
            escalate,
            drafts: Vec::with_capacity(if escalate {
                crate::escalation::MAX_DRAFT
            } else {
                0
            }),
            vseen: 0,
            vdone: false,
            spec_qs: Vec::new(),
            spec_len: 0,
            draft_want: 0,
            vacc: 0,
            head_stepped: false,
            in_flight: false,
            forced: req.forced,
            stops: StopStrings::new(&req.stop),
            bytes: Vec::with_capacity(64),
            lp_buf: Vec::new(),
            lp_pending: None,
            lp_chosen: 0.0,
            lp_given: None,
            prompt: req.prompt,
            orders,
        }
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Whether this session's greedy draft is the draft logits' plain argmax (no bias, no
    /// penalties change them).
    pub fn draft_is_argmax(&self) -> bool {
        self.logit_bias.is_empty() && !self.sampler.penalizes()
    }

    /// The next draft token from the draft's `logits` (greedy, with this session's bias and
    /// penalties over its history plus the drafts so far); `scratch` holds a copy when they
    /// change the logits.
    pub fn draft_choice(&mut self, logits: &[f32], scratch: &mut [f32]) -> u32 {
        if self.draft_is_argmax() {
            return crate::sampling::argmax(logits);
        }
        self.draft_logits(logits, scratch);
        crate::sampling::argmax(scratch)
    }

    /// The draft's `logits` as this session reads them, into `scratch`: its bias, then its
    /// penalties over its history plus the drafts so far.
    fn draft_logits(&mut self, logits: &[f32], scratch: &mut [f32]) {
        scratch.copy_from_slice(logits);
        self.add_bias(scratch);
        let base = self.history.len();
        self.history.extend_from_slice(&self.drafts);
        self.sampler.apply_penalties(scratch, &self.history);
        self.history.truncate(base);
    }

    /// Whether this session samples (temperature > 0): escalating, it drafts and verifies by
    /// speculative sampling ([`crate::escalation`]'s rule and draws, so its tokens are
    /// `generate_exact`'s for its seed).
    pub fn sampled(&self) -> bool {
        self.sampler.params().temperature > 0.0
    }

    /// Whether this session's rows in the step's pass are a round to verify (drafts, or a
    /// sampled session's one row decided by speculative sampling).
    pub fn verifying(&self) -> bool {
        !self.drafts.is_empty() || self.spec_len > 0
    }

    /// A sampled escalating session's draft at position `at` from the draft's `logits`: the
    /// draft's distribution there (this session's bias, then its penalties over its history
    /// plus the drafts so far) is kept, and its token drawn by the position's variate.
    /// `scratch` holds the modified copy.
    pub fn draft_sample(&mut self, logits: &[f32], scratch: &mut [f32], at: u64) -> u32 {
        self.draft_logits(logits, scratch);
        if self.spec_qs.len() <= self.spec_len {
            self.spec_qs.push(Vec::new());
        }
        let q = &mut self.spec_qs[self.spec_len];
        self.sampler.distribution(scratch, q);
        self.spec_len += 1;
        let seed = self.sampler.params().seed;
        crate::sampling::draw(
            q,
            crate::sampling::position_uniform(seed, at, crate::escalation::DRAW_DRAFT),
        )
    }

    /// Takes row `r` of a sampled session's verify round from the source's `logits`: the
    /// source's distribution `p` (bias, penalties over the history) against the draft's
    /// `q` at this position — its draft accepted with probability `min(1, p/q)`, else a
    /// token drawn from `(p − q)⁺` — so the token is distributed exactly as `p` and tied to
    /// its position and the seed. `scratch` holds the modified copy.
    #[allow(clippy::too_many_arguments)]
    pub fn take_speculative(
        &mut self,
        logits: &[f32],
        scratch: &mut [f32],
        spec: &mut crate::escalation::Speculative,
        r: usize,
        eog: &[u32],
        pieces: &dyn TokenPieces,
        ctx: usize,
    ) -> After {
        scratch.copy_from_slice(logits);
        self.add_bias(scratch);
        self.lp_pending = self
            .logprobs
            .map(|k| crate::sampling::log_softmax_top(scratch, k));
        if self.lp_pending.is_some() {
            self.lp_buf.clear();
            self.lp_buf.extend_from_slice(scratch);
        }
        self.sampler.apply_penalties(scratch, &self.history);
        self.sampler.distribution(scratch, &mut spec.p);
        let seed = self.sampler.params().seed;
        // The token's position (the row's successor): `pos` has moved past the row.
        let at = self.pos as u64;
        let q = &self.spec_qs[r];
        let x = match self.drafts.get(r) {
            Some(&d) => d,
            None => crate::sampling::draw(
                q,
                crate::sampling::position_uniform(seed, at, crate::escalation::DRAW_DRAFT),
            ),
        };
        let tok = spec.choose(q, x, seed, at);
        if let Some((lse, _)) = &self.lp_pending {
            self.lp_chosen = crate::sampling::logits_at(&self.lp_buf, tok, *lse);
        }
        if !self.resumes_as(tok) {
            return After::Failed;
        }
        self.commit(tok, eog, pieces, ctx)
    }

    /// Whether choosing this session's next token reads nothing of its logits row but the
    /// argmax: greedy, no bias, penalties, constraint or log-probabilities, no drafts.
    /// What a pipeline's last stage must send back of this session's next logits row: the
    /// token alone when choosing reads nothing else — the argmax (greedy) or the token its
    /// sampler's next variate draws (sampled) — else the row.
    ///
    /// A session whose logits its bias, constraint or penalties change, or that reports
    /// log-probabilities, reads its token as chosen there with everything its choice reads
    /// ([`RowRead::Choose`]: the constraint's banned tokens found by masking `scratch`, a
    /// row of `vocab` zeros); one verifying drafts reads the whole rows.
    pub fn row_read(&mut self, vocab: usize, scratch: &mut Vec<f32>) -> RowRead {
        if !self.drafts.is_empty() {
            return RowRead::Whole;
        }
        if self.modifies_logits() || self.logprobs.is_some() {
            let mut banned = Vec::new();
            if let Some(c) = self.constraint.as_mut() {
                scratch.clear();
                scratch.resize(vocab, 0.0);
                if c.mask(scratch).is_err() {
                    // The error is reported when the row is taken.
                    return RowRead::Whole;
                }
                banned.resize(vocab.div_ceil(64), 0u64);
                for (t, &l) in scratch.iter().enumerate() {
                    if l == f32::NEG_INFINITY {
                        banned[t / 64] |= 1 << (t % 64);
                    }
                }
            }
            let p = self.sampler.params();
            let recent = if self.sampler.penalizes() {
                self.history[self.history.len().saturating_sub(p.penalty_last_n)..].to_vec()
            } else {
                Vec::new()
            };
            return RowRead::Choose(Box::new(crate::sampling::ChooseAt {
                bias: self.logit_bias.clone(),
                banned,
                params: p.clone(),
                recent,
                u: if p.temperature > 0.0 {
                    self.sampler.peek_uniform()
                } else {
                    0.0
                },
                logprobs: self.logprobs.map(|k| k.min(u32::MAX as usize) as u32),
            }));
        }
        if self.sampler.params().temperature <= 0.0 {
            RowRead::Argmax
        } else {
            RowRead::Sample(SampleAt::of(&self.sampler))
        }
    }

    /// This session's logit bias added to `logits`.
    fn add_bias(&self, logits: &mut [f32]) {
        for &(t, b) in &self.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
    }

    /// Whether choosing a token changes the logits first (bias, constraint, penalties).
    pub fn modifies_logits(&self) -> bool {
        !self.logit_bias.is_empty() || self.constraint.is_some() || self.sampler.penalizes()
    }

    /// Chooses the next token from this session's logits and reports it. `logits` is
    /// modified in place when [`Active::modifies_logits`] (then pass a copy).
    pub fn take_logits(
        &mut self,
        logits: &mut [f32],
        eog: &[u32],
        pieces: &dyn TokenPieces,
        ctx: usize,
    ) -> After {
        let tok = match self.choose(logits) {
            Ok(t) => t,
            Err(e) => {
                let _ = self.tx.send(Event::Error(format!("constraint: {e}")));
                return After::Finish(FinishReason::Stop);
            }
        };
        if !self.resumes_as(tok) {
            return After::Failed;
        }
        self.commit(tok, eog, pieces, ctx)
    }

    /// Whether `tok`, chosen at this step, is the token a resumed run must choose here
    /// (always, past the known tokens); a divergence is reported as the session's error.
    fn resumes_as(&mut self, tok: u32) -> bool {
        match self.forced.get(self.generated) {
            Some(&f) if f != tok => {
                let _ = self.tx.send(Event::Error(format!(
                    "resumed generation diverged at output token {}: chose {tok}, the earlier                      run chose {f}",
                    self.generated
                )));
                false
            }
            _ => true,
        }
    }

    /// [`Active::take_logits`] for logits that need no modification: read in place.
    pub fn take_logits_ref(
        &mut self,
        logits: &[f32],
        eog: &[u32],
        pieces: &dyn TokenPieces,
        ctx: usize,
    ) -> After {
        debug_assert!(!self.modifies_logits());
        let given = self.lp_given.take();
        let tok = if let (Some(_), Some((chosen, top))) = (self.logprobs, given) {
            // The row is the chosen token's one-hot row: its log-probabilities came with it.
            self.lp_pending = Some((0.0, top));
            self.lp_chosen = chosen;
            self.sampler.choose(logits)
        } else {
            self.lp_pending = self
                .logprobs
                .map(|k| crate::sampling::log_softmax_top(logits, k));
            let tok = self.sampler.choose(logits);
            if let Some((lse, _)) = &self.lp_pending {
                self.lp_chosen = crate::sampling::logits_at(logits, tok, *lse);
            }
            tok
        };
        if !self.resumes_as(tok) {
            return After::Failed;
        }
        self.commit(tok, eog, pieces, ctx)
    }

    fn choose(&mut self, logits: &mut [f32]) -> Result<u32, String> {
        self.add_bias(logits);
        if let Some(c) = self.constraint.as_mut() {
            c.mask(logits)?;
        }
        if let (Some(_), Some((chosen, top))) = (self.logprobs, self.lp_given.take()) {
            // The row is the chosen token's one-hot row: its log-probabilities came with it.
            self.lp_pending = Some((0.0, top));
            let tok = self.sampler.sample(logits, &self.history);
            self.lp_chosen = chosen;
            return Ok(tok);
        }
        self.lp_pending = self
            .logprobs
            .map(|k| crate::sampling::log_softmax_top(logits, k));
        let tok = if let Some((lse, _)) = &self.lp_pending {
            // The chosen token's log-probability before the penalties change the logits.
            let lse = *lse;
            self.lp_buf.clear();
            self.lp_buf.extend_from_slice(logits);
            let tok = self.sampler.sample(logits, &self.history);
            self.lp_chosen = crate::sampling::logits_at(&self.lp_buf, tok, lse);
            tok
        } else {
            self.sampler.sample(logits, &self.history)
        };
        Ok(tok)
    }

    /// Reports the chosen token and decides whether the session goes on.
    fn commit(&mut self, tok: u32, eog: &[u32], pieces: &dyn TokenPieces, ctx: usize) -> After {
        if self.stop_at_eog && eog.contains(&tok) {
            return After::Finish(FinishReason::Stop);
        }
        let logprob = self.lp_pending.take().map(|(_, top)| Logprob {
            logprob: self.lp_chosen,
            top,
        });
        self.generated += 1;
        self.history.push(tok);
        self.last = tok;
        self.phase = Phase::Decode;
        pieces.piece_into(tok, &mut self.bytes);
        let text = drain_utf8(&mut self.bytes, false);
        let (emit, hit) = self.stops.push(&text);
        let done_constraint = match self.constraint.as_mut().map(|c| c.commit(tok)) {
            Some(Ok(done)) => done,
            Some(Err(e)) => {
                let _ = self.tx.send(Event::Error(format!("constraint: {e}")));
                return After::Finish(FinishReason::Stop);
            }
            None => false,
        };
        let _ = self.tx.send(Event::Token(TokenEvent {
            id: tok,
            text: emit,
            logprob,
        }));
        if hit {
            self.stops = StopStrings::new(&[]);
            self.bytes.clear();
            return After::Finish(FinishReason::Stop);
        }
        if done_constraint {
            return After::Finish(FinishReason::Stop);
        }
        if self.generated >= self.max_tokens || self.pos >= ctx {
            return After::Finish(FinishReason::Length);
        }
        After::Continue
    }

    /// Sends the final event.
    pub fn finish(&mut self, reason: FinishReason) {
        let mut tail = drain_utf8(&mut self.bytes, true);
        let (emit, _) = self.stops.push(&tail);
        tail = emit + &self.stops.flush();
        let _ = self.tx.send(Event::Done(Finished {
            reason,
            prompt_tokens: self.prompt.len(),
            cached_tokens: self.cached,
            completion_tokens: self.generated,
            tail,
        }));
    }
}

/// Takes the complete UTF-8 text from the front of `bytes` (all of it with `all`, invalid or
/// incomplete sequences as U+FFFD), leaving an incomplete character's bytes behind.
pub(crate) fn drain_utf8(bytes: &mut Vec<u8>, all: bool) -> String {
    let mut out = String::new();
    let mut start = 0usize;
    loop {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = bytes.len();
                break;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(&String::from_utf8_lossy(&bytes[start..start + valid]));
                start += valid;
                match e.error_len() {
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        start += bad;
                    }
                    None => {
                        if all {
                            out.push('\u{FFFD}');
                            start = bytes.len();
                        }
                        break;
                    }
                }
            }
        }
    }
    bytes.drain(..start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_held_until_complete() {
        let mut b = "é".as_bytes()[..1].to_vec();
        assert_eq!(drain_utf8(&mut b, false), "");
        b.push("é".as_bytes()[1]);
        b.extend_from_slice(b"x");
        assert_eq!(drain_utf8(&mut b, false), "éx");
        assert!(b.is_empty());
        let mut b = vec![0xE2, 0x82];
        assert_eq!(drain_utf8(&mut b, true), "\u{FFFD}");
        let mut b = vec![b'a', 0xFF, b'b'];
        assert_eq!(drain_utf8(&mut b, false), "a\u{FFFD}b");
    }

    #[test]
    fn top_logprobs_are_sorted_and_normalised() {
        let l = [0.0f32, 2.0, 1.0, 2.0, f32::NAN];
        let (lse, top) = crate::sampling::log_softmax_top(&l, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let total: f64 = l
            .iter()
            .filter(|v| !v.is_nan())
            .map(|&v| (v as f64 - lse).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!((top[0].1 - top[1].1).abs() == 0.0);
    }
}
