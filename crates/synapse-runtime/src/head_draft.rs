//! Head-only drafting: exact escalation whose draft differs from the source only in the LM
//! head, so the draft's K/V *is* the verifier's and verification is one pass of the source
//! head over the drafted positions' stored hidden states — no second body pass.
//!
//! The draft head is a vocabulary shortlist: the rows of the source head for a set of token
//! ids ([`Shortlist`]), gathered in the source encoding, so a shortlisted token's draft logit
//! is bit for bit its source logit ([`Executor::shortlist_logits`]). A round of `k` drafts
//! runs `k` one-row body passes ([`Executor::forward_normed`]; each appends its position's
//! K/V in the one-row order, as a plain decode step does), proposing after each the
//! shortlist's choice, then the full head over the `k` hidden states in one call
//! ([`Executor::head_logits`], every row in the one-row order, so row `i` holds the bits of
//! the `i`-th plain decode step's logits). The source's choices are taken in order while they
//! equal the drafts; the first that differs ends the round, and the positions after it are
//! truncated away, so the slot holds exactly what plain decoding would. A greedy draft is
//! accepted exactly when the source's argmax is on the shortlist; a token the source chose
//! off the list joins it ([`Shortlist::add`]), so the list learns the text's vocabulary.
//!
//! Sampled generation (temperature > 0) is speculative sampling as in
//! [`crate::escalation::generate_exact`]: the draft distribution is the sampler's over the
//! shortlist's logits, every draw tied to its position and the seed, so the output is a
//! function of the seed alone and each token is distributed exactly as the source's.
//!
//! Cost: a plain step is a body pass plus the full head over one row. A round of `k` drafts
//! costs `k` body passes, `k` shortlist heads and one full head over `k` rows — which on a
//! compute-bound head costs far less than `k` one-row heads (a 262144-row head: 4 rows ≈ 1.3×
//! one row on AVX-512) — and commits `1 + a + … + a^(k−1)` tokens for a per-token
//! acceptance `a`. `k` follows that model with this run's measured times and acceptance.
//!
//! Architecture invariant: the committed tokens never depend on `k`, the shortlist, or
//! timing — only the speed does.

use std::sync::Arc;
use std::time::Instant;

use synapse_kernels::QuantMatrix;

use crate::draft_choice::median;
use crate::error::{Result, RuntimeError};
use crate::escalation::{CostModel, DRAW_DRAFT, EscalationStats, MAX_DRAFT, Speculative, finish};
use crate::executor::{Executor, Row};
use crate::generate::{Commit, GenerateParams, Generated, StopReason, Timings, prefill};
use crate::kv::{KvCache, SlotId};
use crate::load::{LinearW, Model};
use crate::sampling::{Sampler, argmax, draw, position_uniform};

/// Gathered tokens are merged into the main list once this many wait in the extra part.
const EXTRA_MAX: usize = 256;

/// A vocabulary shortlist of a model's LM head: the head's rows for a set of tokens, in the
/// head's own encoding (so each token's logit is its full-head logit, bit for bit).
pub struct Shortlist {
    /// The head the rows were gathered from (the list serves the models sharing it).
    source: Arc<QuantMatrix>,
    vocab: usize,
    member: Vec<bool>,
    /// The main part: tokens and their rows.
    tokens: Vec<u32>,
    head: LinearW,
    /// Tokens added since the main part was built, and their rows.
    extra_tokens: Vec<u32>,
    extra: Option<LinearW>,
    /// Scratch: one logit per shortlisted token.
    out: Vec<f32>,
}

impl std::fmt::Debug for Shortlist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shortlist")
            .field("len", &self.len())
            .field("vocab", &self.vocab)
            .finish()
    }
}

fn gather(head: &LinearW, tokens: &[u32]) -> Result<LinearW> {
    Ok(LinearW {
        m: Arc::new(head.m.gather_rows(tokens)?),
        bias: head
            .bias
            .as_ref()
            .map(|b| tokens.iter().map(|&t| b[t as usize]).collect()),
        act_a8: head.act_a8,
    })
}

impl Shortlist {
    /// The shortlist of `tokens` (deduplicated; each must be a vocabulary id) for `model`'s
    /// head. Errors: an empty list, an id outside the vocabulary, or a head whose encoding
    /// does not store rows separately.
    pub fn new(model: &Model, tokens: impl IntoIterator<Item = u32>) -> Result<Self> {
        let vocab = model.vocab();
        let mut member = vec![false; vocab];
        let mut list = Vec::new();
        for t in tokens {
            let Some(m) = member.get_mut(t as usize) else {
                return Err(RuntimeError::InvalidParam {
                    name: "shortlist",
                    reason: format!("token {t} is outside the vocabulary of {vocab}"),
                });
            };
            if !*m {
                *m = true;
                list.push(t);
            }
        }
        if list.is_empty() {
            return Err(RuntimeError::InvalidParam {
                name: "shortlist",
                reason: "no tokens".into(),
            });
        }
        list.sort_unstable();
        let head = gather(&model.head, &list)?;
        Ok(Shortlist {
            source: model.head.m.clone(),
            vocab,
            member,
            out: vec![0.0; list.len()],
            tokens: list,
            head,
            extra_tokens: Vec::new(),
            extra: None,
        })
    }

    /// The `size` lowest token ids (BPE and SentencePiece vocabularies put their most common
    /// pieces first), the model's end-of-generation tokens, and the tokens of `also` (a
    /// prompt, so text it quotes can be drafted; the vocabulary's short pieces, which some
    /// vocabularies put last).
    pub fn lowest_ids(model: &Model, size: usize, also: &[u32]) -> Result<Self> {
        let n = size.min(model.vocab()) as u32;
        let eog = model.ir.special.eos.clone();
        Self::new(model, (0..n).chain(eog).chain(also.iter().copied()))
    }

    /// Tokens on the list.
    pub fn len(&self) -> usize {
        self.tokens.len() + self.extra_tokens.len()
    }

    /// Whether the list is empty (never, once built).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the list holds now (its rows, membership and scratch).
    pub fn bytes(&self) -> u64 {
        let rows = |h: &LinearW| h.m.weight_bytes() + h.bias.as_ref().map_or(0, |b| 4 * b.len());
        (rows(&self.head)
            + self.extra.as_ref().map_or(0, rows)
            + self.member.len()
            + 8 * self.len()) as u64
    }

    /// The most bytes a head-drafted generation of `tokens` tokens holds for its draft: the
    /// list grown by one row per generated token (each could be a miss), the transient copy
    /// of a merge (old and new main rows together), and the generation's vocabulary-sized
    /// and hidden-state scratch.
    pub fn bytes_bound(&self, model: &Model, tokens: usize) -> u64 {
        Self::list_bytes_bound(model, self.len() + tokens)
            + 4 * model.vocab() as u64
            + 4 * (MAX_DRAFT * model.hidden()) as u64
    }

    /// The most bytes a list of `tokens` tokens of `model`'s head holds: its rows twice (a
    /// merge's transient copy), its membership and its token and logit scratch.
    pub fn list_bytes_bound(model: &Model, tokens: usize) -> u64 {
        let head = &model.head;
        let row = (head.m.weight_bytes() / head.m.rows().max(1)) as u64
            + if head.bias.is_some() { 4 } else { 0 };
        let n = tokens as u64;
        2 * n * row + model.vocab() as u64 + 8 * n
    }

    /// Whether `token` is on the list.
    pub fn contains(&self, token: u32) -> bool {
        self.member.get(token as usize).copied().unwrap_or(false)
    }

    /// Puts `token` on the list (nothing if it is there already or not a vocabulary id).
    pub fn add(&mut self, model: &Model, token: u32) -> Result<()> {
        self.extend(model, [token])
    }

    /// Puts every token of `tokens` on the list (one gather for them all; ids outside the
    /// vocabulary are skipped).
    pub fn extend(&mut self, model: &Model, tokens: impl IntoIterator<Item = u32>) -> Result<()> {
        self.check(model)?;
        let before = self.extra_tokens.len();
        for t in tokens {
            if (t as usize) < self.vocab && !self.member[t as usize] {
                self.member[t as usize] = true;
                self.extra_tokens.push(t);
            }
        }
        if self.extra_tokens.len() == before {
            return Ok(());
        }
        if self.extra_tokens.len() >= EXTRA_MAX {
            self.tokens.append(&mut self.extra_tokens);
            self.tokens.sort_unstable();
            self.head = gather(&model.head, &self.tokens)?;
            self.extra = None;
        } else {
            self.extra = Some(gather(&model.head, &self.extra_tokens)?);
        }
        self.out.resize(self.len(), 0.0);
        Ok(())
    }

    /// Whether the list serves `model`: its head is the very matrix the list was gathered
    /// from.
    pub fn serves(&self, model: &Model) -> bool {
        Arc::ptr_eq(&model.head.m, &self.source)
    }

    /// The list serves a model whose head is the very matrix it was gathered from (another
    /// model, or a profile that re-encoded the head, is refused).
    pub(crate) fn check(&self, model: &Model) -> Result<()> {
        if !self.serves(model) {
            return Err(RuntimeError::InvalidParam {
                name: "shortlist",
                reason: "the shortlist was gathered from another model's head (or another \
                         encoding of it)"
                    .into(),
            });
        }
        Ok(())
    }

    /// Computes the listed tokens' logits for one final-normed row into `self.out`, in the
    /// order of `tokens` then `extra_tokens`.
    fn compute(&mut self, exec: &mut Executor, normed: &[f32]) -> Result<()> {
        self.check(exec.model())?;
        let n = self.tokens.len();
        exec.shortlist_logits(&self.head, normed, &mut self.out[..n])?;
        if let Some(x) = &self.extra {
            exec.shortlist_logits(x, normed, &mut self.out[n..])?;
        }
        Ok(())
    }

    /// The listed token with the largest logit for one final-normed row (the lowest id on
    /// ties): the full head's argmax whenever that is on the list.
    pub fn argmax(&mut self, exec: &mut Executor, normed: &[f32]) -> Result<u32> {
        self.compute(exec, normed)?;
        Ok(self.top2().0)
    }

    /// The list's choice for one final-normed row and how sure the list is of it: its
    /// argmax ([`Self::argmax`]), that logit's margin over the runner-up, and the entropy
    /// of the softmax over the listed logits. The logits stay for [`Self::scatter_computed`].
    pub fn choice(&mut self, exec: &mut Executor, normed: &[f32]) -> Result<ListChoice> {
        self.compute(exec, normed)?;
        let (token, margin) = self.top2();
        Ok(ListChoice {
            token,
            margin,
            entropy: crate::selective::entropy(&self.out[..self.len()]),
        })
    }

    /// The argmax of the last computed logits (the lowest id on ties; token 0 when every
    /// logit is NaN, as the full argmax gives) and its margin over the runner-up (∞ with
    /// one listed token).
    fn top2(&self) -> (u32, f32) {
        let mut best = (f32::NEG_INFINITY, u32::MAX);
        let mut second = f32::NEG_INFINITY;
        for (&t, &v) in self.tokens.iter().chain(&self.extra_tokens).zip(&self.out) {
            if v > best.0 || (v == best.0 && t < best.1) {
                if best.1 != u32::MAX {
                    second = second.max(best.0);
                }
                best = (v, t);
            } else if v > second {
                second = v;
            }
        }
        if best.1 == u32::MAX {
            return (0, f32::INFINITY);
        }
        let margin = if second == f32::NEG_INFINITY {
            f32::INFINITY
        } else {
            best.0 - second
        };
        (best.1, margin)
    }

    /// Writes the logits the last [`Self::choice`] computed into `full` (vocabulary sized;
    /// the other entries are left as they are), as [`Self::scatter_logits`] does.
    pub fn scatter_computed(&self, full: &mut [f32]) -> Result<()> {
        if full.len() != self.vocab {
            return Err(RuntimeError::InvalidParam {
                name: "shortlist",
                reason: format!("{} logits for a vocabulary of {}", full.len(), self.vocab),
            });
        }
        for (&t, &v) in self.tokens.iter().chain(&self.extra_tokens).zip(&self.out) {
            full[t as usize] = v;
        }
        Ok(())
    }

    /// Writes the shortlisted tokens' logits for one final-normed row
    /// ([`Executor::forward_normed`]) into `full` (vocabulary sized; the other entries are
    /// left as they are): each the full head's value, bit for bit.
    pub fn scatter_logits(
        &mut self,
        exec: &mut Executor,
        normed: &[f32],
        full: &mut [f32],
    ) -> Result<()> {
        if full.len() != self.vocab {
            return Err(RuntimeError::InvalidParam {
                name: "shortlist",
                reason: format!("{} logits for a vocabulary of {}", full.len(), self.vocab),
            });
        }
        self.compute(exec, normed)?;
        self.scatter_computed(full)
    }
}

/// A shortlist's choice for one row ([`Shortlist::choice`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ListChoice {
    /// The listed token with the largest logit (the lowest id on ties).
    pub token: u32,
    /// Its logit minus the runner-up's (∞ with one listed token).
    pub margin: f32,
    /// The entropy (nats) of the softmax over the listed logits.
    pub entropy: f32,
}

/// What a head-drafted generation did: [`EscalationStats`] (`draft_s` the body passes and
/// shortlist heads, `verify_s` the full-head calls) and the shortlist's growth.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HeadDraftStats {
    /// Rounds, drafts, acceptance and times.
    pub escalation: EscalationStats,
    /// Tokens the source chose off the shortlist (each then joined it).
    pub misses: usize,
    /// The shortlist's length at the end.
    pub shortlist: usize,
}

/// Generation of `prompt` with `exec` (slot `slot`), drafted by `shortlist` and verified by
/// the full head: the same tokens, stop and K/V as [`crate::generate`] (greedy), or
/// speculative sampling's seed-tied output (sampled; see the module docs). `dp.max_k` bounds
/// the drafts of a round; `dp.adaptive` picks `k` from the measured costs and acceptance
/// (else always `max_k`).
///
/// Errors (before anything runs): an empty prompt, a zero prefill chunk, `max_k` outside
/// `1..=`[`MAX_DRAFT`], a shortlist gathered from another head than `exec`'s model's.
#[allow(clippy::too_many_arguments)]
pub fn generate_head_draft(
    exec: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    prompt: &[u32],
    params: &GenerateParams,
    dp: &crate::escalation::DraftParams,
    shortlist: &mut Shortlist,
    piece: &mut dyn FnMut(u32) -> String,
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generated, HeadDraftStats)> {
    let bad = |name: &'static str, reason: String| RuntimeError::InvalidParam { name, reason };
    if prompt.is_empty() {
        return Err(bad("prompt", "empty prompt".into()));
    }
    if params.prefill_chunk == 0 {
        return Err(bad("prefill_chunk", "must be positive".into()));
    }
    if !(1..=MAX_DRAFT).contains(&dp.max_k) {
        return Err(bad(
            "draft k",
            format!("{} is outside 1..={MAX_DRAFT}", dp.max_k),
        ));
    }
    let model = exec.model().clone();
    shortlist.check(&model)?;
    let mut sampler = Sampler::new(params.sampling.clone())?;
    let mut dsampler = Sampler::new(params.sampling.clone())?;
    let eog = model.ir.special.eos.clone();
    let vocab = model.vocab();
    let hd = model.hidden();
    let chunk = params.prefill_chunk.min(kv.max_chunk());
    let mut timings = Timings::default();
    let mut stats = HeadDraftStats::default();
    let mut logits = vec![0.0f32; vocab];

    let t0 = Instant::now();
    let reused = prefill(exec, kv, slot, prompt, chunk, Some(&mut logits))?;
    timings.prefill_tokens = prompt.len() - reused;
    timings.prefill_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut c = Commit::new(params, eog, prompt);
    let mut model_cost = CostModel::new(dp.max_k, false);
    // The shortlist's logits scattered over the vocabulary (−∞ off the list).
    let mut dfull = vec![f32::NEG_INFINITY; vocab];
    let mut hidden = vec![0.0f32; MAX_DRAFT * hd];
    let mut drafts: Vec<u32> = Vec::with_capacity(MAX_DRAFT);
    let seed = params.sampling.seed;
    let mut spec = (params.sampling.temperature > 0.0).then(|| Speculative::new(vocab));
    let mut pos = prompt.len();
    let mut round_no = 0usize;
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
    // Greedy with no penalty: the logits are chosen from as they come.
    let plain_greedy = spec.is_none() && !sampler.penalizes();
    let stop = loop {
        if pos >= kv.capacity() {
            break StopReason::ContextFull;
        }
        // Tokens this round may commit: the budget left and the context's room.
        let room = (params.max_tokens - c.out.len()).min(kv.capacity() - pos);
        let k = if dp.adaptive {
            round_no += 1;
            let best = choose_k(&model_cost, dp.max_k.min(room));
            // Now and then one more draft than the model's best, so the head's time at the
            // next row count is measured (and an unlucky sample there does not stick).
            if round_no.is_multiple_of(EXPLORE) && best < dp.max_k.min(room) {
                best + 1
            } else {
                best
            }
        } else {
            dp.max_k.min(room)
        };
        // Draft: k body passes (committed K/V, one-row order), a shortlist choice after each.
        let td = Instant::now();
        drafts.clear();
        let base = c.history.len();
        let mut tok = pending;
        for i in 0..k {
            let h = exec.forward_normed(kv, &[Row::decode(slot, (pos + i) as u32, tok)])?;
            hidden[i * hd..(i + 1) * hd].copy_from_slice(&h[..hd]);
            let row = &hidden[i * hd..(i + 1) * hd];
            let d = match spec.as_mut() {
                // Greedy without penalties: the list's own argmax (no vocabulary-wide pass).
                None if !plain_greedy => {
                    shortlist.scatter_logits(exec, row, &mut dfull)?;
                    dsampler.apply_penalties(&mut dfull, &c.history);
                    argmax(&dfull)
                }
                None => shortlist.argmax(exec, row)?,
                Some(sp) => {
                    shortlist.scatter_logits(exec, row, &mut dfull)?;
                    dsampler.apply_penalties(&mut dfull, &c.history);
                    if sp.qs.len() <= i {
                        sp.qs.push(Vec::new());
                    }
                    dsampler.distribution(&dfull, &mut sp.qs[i]);
                    let at = (pos + 1 + i) as u64;
                    draw(&sp.qs[i], position_uniform(seed, at, DRAW_DRAFT))
                }
            };
            drafts.push(d);
            c.history.push(d);
            tok = d;
        }
        c.history.truncate(base);
        let dt = td.elapsed().as_secs_f64();
        stats.escalation.draft_s += dt;
        settle(&mut model_cost.draft, dt / k as f64);

        // Verify: the full head over the k hidden states, each row in the one-row order.
        let tv = Instant::now();
        let mut ended = None;
        let mut used = 0;
        let mut accepted = 0;
        {
            let out = exec.head_logits(&hidden[..k * hd])?;
            let dt = tv.elapsed().as_secs_f64();
            stats.escalation.verify_s += dt;
            settle(&mut model_cost.verify[k], dt);
            for i in 0..k {
                used = i + 1;
                let row = &out[i * vocab..(i + 1) * vocab];
                let l: &[f32] = if plain_greedy {
                    row
                } else {
                    logits.copy_from_slice(row);
                    sampler.apply_penalties(&mut logits, &c.history);
                    &logits
                };
                let t = match spec.as_mut() {
                    None => sampler.choose(l),
                    Some(sp) => {
                        sampler.distribution(l, &mut sp.p);
                        let q = std::mem::take(&mut sp.qs[i]);
                        let t = sp.choose(&q, drafts[i], seed, (pos + 1 + i) as u64);
                        sp.qs[i] = q;
                        t
                    }
                };
                timings.decode_tokens += 1;
                let hit = drafts[i] == t;
                if hit {
                    accepted += 1;
                } else if !shortlist.contains(t) {
                    stats.misses += 1;
                }
                if let Some(r) = c.take(t, piece, on_text) {
                    ended = Some(r);
                    break;
                }
                pending = t;
                if !hit {
                    break;
                }
            }
        }
        if !shortlist.contains(pending) {
            shortlist.add(&model, pending)?;
        }
        stats.escalation.rounds += 1;
        stats.escalation.drafted += k;
        stats.escalation.accepted += accepted;
        model_cost.observe_round(k, accepted);
        // Positions pos..pos+used hold the pending token and the accepted drafts — what
        // plain decoding feeds; the rest go.
        kv.truncate(slot, pos + used)?;
        pos += used;
        if let Some(r) = ended {
            break r;
        }
    };
    stats.shortlist = shortlist.len();
    Ok((finish(&mut c, stop, reused, timings, t1, on_text), stats))
}

/// Every this many adaptive rounds, one round drafts one more than the cost model's best.
const EXPLORE: usize = 6;

/// A time estimate that follows a faster sample at once and a slower one slowly: on a shared
/// machine a slow sample is mostly another process's doing, not the work's cost.
fn settle(v: &mut Option<f64>, x: f64) {
    *v = Some(match *v {
        Some(o) if x < o => x,
        Some(o) => o + 0.1 * (x - o),
        None => x,
    });
}

/// The draft count with the most expected committed tokens per second from the cost
/// model's measurements. Before a draft step is measured, a middle `k` measures one.
fn choose_k(m: &CostModel, cap: usize) -> usize {
    let cap = cap.max(1);
    let Some(td) = m.draft else {
        return cap.min(4);
    };
    best_head_k(m.acceptance_estimate(), td, cap, |k| m.verify_time(k)).0
}

/// The draft count `k ≤ cap` with the most expected committed tokens per second, and that
/// rate: a round of `k` commits `1 + a + … + a^(k−1)` tokens for a per-token acceptance `a`
/// and costs `k` draft steps of `td` seconds (a body pass and the shortlist) plus the full
/// head over `k` rows (`head(k)` seconds; `None`: not known, that `k` is skipped).
pub fn best_head_k(
    a: f64,
    td: f64,
    cap: usize,
    head: impl Fn(usize) -> Option<f64>,
) -> (usize, f64) {
    let mut best = (1usize, 0.0f64);
    for k in 1..=cap.max(1) {
        let Some(th) = head(k) else {
            continue;
        };
        let e = if a < 1.0 {
            (1.0 - a.powi(k as i32)) / (1.0 - a)
        } else {
            k as f64
        };
        let rate = e / (k as f64 * td + th);
        if rate > best.1 {
            best = (k, rate);
        }
    }
    best
}

/// Measures a head-only draft with `shortlist` against the source's probe
/// ([`crate::draft_choice::probe_source`]) for `--draft-profile auto`: the acceptance is the
/// share of the source's greedy continuation on the list (a greedy shortlist draft is the
/// source's choice exactly then), a draft step is timed as one-row body passes and the
/// shortlist in `slot` (left empty), the full head over `1..=max_k` stored rows as measured.
/// `k = 0` (and plain decoding's rate) when no draft count beats plain decoding.
pub fn try_head_draft(
    exec: &mut Executor,
    kv: &mut KvCache,
    slot: SlotId,
    probe: &crate::draft_choice::SourceProbe,
    shortlist: &mut Shortlist,
    p: &crate::draft_choice::ProbeParams,
) -> Result<crate::draft_choice::DraftTrial> {
    let model = exec.model().clone();
    shortlist.check(&model)?;
    let cont = &probe.continuation;
    if cont.is_empty() || p.repeats == 0 {
        return Err(RuntimeError::InvalidParam {
            name: "draft probe",
            reason: "no continuation to measure on".into(),
        });
    }
    let on = cont.iter().filter(|&&t| shortlist.contains(t)).count();
    let acceptance = on as f64 / cont.len() as f64;
    let hd = model.hidden();
    if !kv.is_open(slot) {
        kv.open(slot)?;
    }
    kv.truncate(slot, 0)?;
    kv.set_profile(slot, &model.profile.hash())?;
    let max_k = probe.max_k.clamp(1, MAX_DRAFT);
    let steps = (max_k * p.repeats)
        .clamp(4, cont.len().max(4))
        .min(kv.capacity());
    let mut hidden = vec![0.0f32; max_k * hd];
    let mut times = Vec::with_capacity(steps);
    for pos in 0..steps {
        let t = Instant::now();
        let tok = cont[pos % cont.len()];
        let h = exec.forward_normed(kv, &[Row::decode(slot, pos as u32, tok)])?;
        let i = pos % max_k;
        hidden[i * hd..(i + 1) * hd].copy_from_slice(&h[..hd]);
        std::hint::black_box(shortlist.argmax(exec, &hidden[i * hd..(i + 1) * hd])?);
        times.push(t.elapsed().as_secs_f64());
    }
    kv.truncate(slot, 0)?;
    let skip = 1.min(times.len());
    let step_s = median(&mut times[skip..]);
    let mut head = vec![None; max_k + 1];
    for (k, v) in head.iter_mut().enumerate().skip(1) {
        times.clear();
        for _ in 0..p.repeats {
            let t = Instant::now();
            exec.head_logits(&hidden[..k * hd])?;
            times.push(t.elapsed().as_secs_f64());
        }
        *v = Some(median(&mut times));
    }
    let (mut k, mut tok_s) = best_head_k(acceptance, step_s, max_k, |k| {
        head.get(k).copied().flatten()
    });
    // As for the other candidates, `k = 0` (plain decoding) when no round pays.
    if tok_s * probe.step_s < 1.0 {
        (k, tok_s) = (0, 1.0 / probe.step_s);
    }
    Ok(crate::draft_choice::DraftTrial {
        acceptance,
        step_s,
        k,
        tok_s,
        speedup: tok_s * probe.step_s,
    })
}
