//! Sampling: greedy, temperature, top-k, top-p, min-p, repetition/presence/frequency
//! penalties, seeded ChaCha8 for reproducibility.
//!
//! Order (llama.cpp's default chain): penalties → top-k → top-p → min-p → temperature →
//! draw. `temperature <= 0` is pure greedy: the argmax after penalties, lowest id on ties.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Result, RuntimeError};

/// Sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens below `min_p × p(top token)` (0: none).
    pub min_p: f32,
    /// Multiplicative penalty on tokens seen in the last `penalty_last_n` (1: none).
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token seen (0: none).
    pub presence_penalty: f32,
    /// Subtracted once per occurrence (0: none).
    pub frequency_penalty: f32,
    /// How many recent tokens penalties look at (0: none).
    pub penalty_last_n: usize,
    /// RNG seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Rejects values outside their domains.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, reason: &str| {
            Err(RuntimeError::InvalidParam {
                name,
                reason: reason.to_string(),
            })
        };
        if !self.temperature.is_finite() {
            return bad("temperature", "must be finite");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be in [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty", "must be positive");
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return bad("presence/frequency penalty", "must be finite");
        }
        Ok(())
    }
}

/// Index of the largest value, lowest index on ties; NaNs never win (0 when nothing beats
/// −∞). One pass over the row: each block of [`ARGMAX_BLOCK`] values' maximum in 16
/// independent lanes (vectorizable), the first block whose maximum beats every earlier one
/// kept; then the first index of the maximum inside that block. (Two passes over a
/// 262,144-entry row, the second to find the index, were ~1% of an 8-stream decode step.)
pub fn argmax(logits: &[f32]) -> u32 {
    let (mut best, mut at) = (f32::NEG_INFINITY, 0usize);
    for (bi, block) in logits.chunks(ARGMAX_BLOCK).enumerate() {
        let mut lanes = [f32::NEG_INFINITY; 16];
        let chunks = block.chunks_exact(16);
        let rest = chunks.remainder();
        for c in chunks {
            for (m, &v) in lanes.iter_mut().zip(c) {
                *m = if v > *m { v } else { *m };
            }
        }
        let mut max = f32::NEG_INFINITY;
        for &v in lanes.iter().chain(rest) {
            if v > max {
                max = v;
            }
        }
        if max > best {
            (best, at) = (max, bi);
        }
    }
    if best == f32::NEG_INFINITY {
        return 0;
    }
    let base = at * ARGMAX_BLOCK;
    let block = &logits[base..(base + ARGMAX_BLOCK).min(logits.len())];
    (base + block.iter().position(|&v| v == best).unwrap_or(0)) as u32
}

/// Values per block of [`argmax`]'s pass (4 KB: the block is still in L1 when its maximum
/// is compared).
const ARGMAX_BLOCK: usize = 1024;

/// A sampler with its RNG and reusable candidate buffer.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    cand: Vec<(u32, f32)>,
    counts: Vec<(u32, u32)>,
}

impl Sampler {
    /// A sampler seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            params,
            cand: Vec::new(),
            counts: Vec::new(),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Applies the penalties to `logits` in place, given the tokens so far.
    pub fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        apply_penalties(&self.params, logits, history, &mut self.counts);
    }

    /// Whether [`Sampler::apply_penalties`] changes anything.
    pub fn penalizes(&self) -> bool {
        penalizes(&self.params)
    }

    /// Chooses the next token. `logits` is modified (penalties).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        self.choose(logits)
    }

    /// Chooses the next token from `logits` as they are (no penalties applied).
    pub fn choose(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        let Some(max) = self.filter(logits) else {
            return 0;
        };
        let u = self.rng.random::<f64>();
        pick(&self.cand, max, self.params.temperature, u)
    }

    /// The uniform variate the next sampled [`Sampler::choose`] will draw, without drawing
    /// it: with it a chooser elsewhere (a pipeline's last stage, [`SampleAt`]) picks the
    /// token this sampler would, and this sampler then chooses it again from that token's
    /// one-hot row (drawing the same variate, so its stream stays where one machine's is).
    pub fn peek_uniform(&self) -> f64 {
        self.rng.clone().random::<f64>()
    }

    /// The distribution [`Sampler::choose`] draws from for `logits` (penalties already
    /// applied): `(token, probability)` for every token it can draw, in its candidate order
    /// (descending logit, ascending id on ties). Greedy: the argmax with probability 1.
    pub fn distribution(&mut self, logits: &[f32], out: &mut Vec<(u32, f64)>) {
        out.clear();
        let t = self.params.temperature as f64;
        if t <= 0.0 {
            out.push((argmax(logits), 1.0));
            return;
        }
        let Some(max) = self.filter(logits) else {
            out.push((0, 1.0));
            return;
        };
        let ws: f64 = self
            .cand
            .iter()
            .map(|x| ((x.1 - max) as f64 / t).exp())
            .sum();
        out.extend(
            self.cand
                .iter()
                .map(|x| (x.0, ((x.1 - max) as f64 / t).exp() / ws)),
        );
    }

    /// Leaves in `self.cand` the tokens top-k, top-p and min-p keep, sorted by descending
    /// logit (ascending id on ties); returns the top logit (`None`: nothing to draw).
    fn filter(&mut self, logits: &[f32]) -> Option<f32> {
        filter(&self.params, logits, &mut self.cand)
    }
}

/// The temperature draw over `cand` (sorted, top logit `max`) at uniform variate `u`.
fn pick(cand: &[(u32, f32)], max: f32, temperature: f32, u: f64) -> u32 {
    let t = temperature as f64;
    let ws: f64 = cand.iter().map(|x| ((x.1 - max) as f64 / t).exp()).sum();
    let mut u = u * ws;
    for x in cand {
        u -= ((x.1 - max) as f64 / t).exp();
        if u <= 0.0 {
            return x.0;
        }
    }
    cand[cand.len() - 1].0
}

/// A sampled choice made away from its [`Sampler`]: the parameters that shape the
/// distribution and the uniform variate the sampler would draw ([`Sampler::peek_uniform`]).
/// For sessions whose logits nothing modifies (no penalties, bias or constraint).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleAt {
    /// Softmax temperature (> 0).
    pub temperature: f32,
    /// Top-k (0: all).
    pub top_k: u32,
    /// Top-p (1: all).
    pub top_p: f32,
    /// Min-p (0: none).
    pub min_p: f32,
    /// The uniform variate in [0, 1).
    pub u: f64,
}

impl SampleAt {
    /// The variate and distribution parameters of `sampler`'s next sampled choice.
    pub fn of(sampler: &Sampler) -> SampleAt {
        SampleAt::at(sampler.params(), sampler.peek_uniform())
    }

    /// The distribution parameters of `p` with variate `u`.
    pub fn at(p: &SamplingParams, u: f64) -> SampleAt {
        SampleAt {
            temperature: p.temperature,
            top_k: p.top_k.min(u32::MAX as usize) as u32,
            top_p: p.top_p,
            min_p: p.min_p,
            u,
        }
    }

    /// The token [`Sampler::choose`] draws from `logits` with these parameters and this
    /// variate (`cand`: scratch); `None` when there is nothing to draw (every logit NaN:
    /// the sampler then draws nothing either).
    pub fn choose(&self, logits: &[f32], cand: &mut Vec<(u32, f32)>) -> Option<u32> {
        if self.temperature <= 0.0 {
            return Some(argmax(logits));
        }
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k as usize,
            top_p: self.top_p,
            min_p: self.min_p,
            ..SamplingParams::default()
        };
        let max = filter(&p, logits, cand)?;
        Some(pick(cand, max, self.temperature, self.u))
    }
}

/// Whether `p`'s penalties change anything.
fn penalizes(p: &SamplingParams) -> bool {
    p.penalty_last_n > 0
        && (p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0)
}

/// Applies `p`'s penalties to `logits` in place, given the tokens so far (`counts`: scratch).
fn apply_penalties(
    p: &SamplingParams,
    logits: &mut [f32],
    history: &[u32],
    counts: &mut Vec<(u32, u32)>,
) {
    if !penalizes(p) {
        return;
    }
    let recent = &history[history.len().saturating_sub(p.penalty_last_n)..];
    counts.clear();
    for &t in recent {
        match counts.iter_mut().find(|c| c.0 == t) {
            Some(c) => c.1 += 1,
            None => counts.push((t, 1)),
        }
    }
    for &(t, c) in counts.iter() {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if *l <= 0.0 {
            *l *= p.repetition_penalty;
        } else {
            *l /= p.repetition_penalty;
        }
        *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
    }
}

/// Log-sum-exp of `logits` and the `k` most likely tokens with their log-probabilities
/// (most likely first, lowest id on ties).
pub(crate) fn log_softmax_top(logits: &[f32], k: usize) -> (f64, Vec<(u32, f32)>) {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| ((v - max) as f64).exp())
        .sum();
    let lse = max as f64 + sum.ln();
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k);
    if k > 0 {
        for (i, &v) in logits.iter().enumerate() {
            if v.is_nan() {
                continue;
            }
            if top.len() < k || v > top[top.len() - 1].1 {
                let at = top.partition_point(|&(_, w)| w >= v);
                top.insert(at, (i as u32, v));
                top.truncate(k);
            }
        }
    }
    for t in &mut top {
        t.1 = (t.1 as f64 - lse) as f32;
    }
    (lse, top)
}

/// Log-probability of `tok` in `logits` whose log-sum-exp is `lse`.
pub(crate) fn logits_at(logits: &[f32], tok: u32, lse: f64) -> f32 {
    logits
        .get(tok as usize)
        .map_or(f32::NEG_INFINITY, |&v| (v as f64 - lse) as f32)
}

/// A choice made away from its session (a pipeline's last stage) for a session whose
/// logits are changed before choosing or whose log-probabilities are reported: everything
/// the session's own choice reads besides the logits row — its logit bias, the tokens its
/// constraint bans at this step, its penalties with its recent tokens, its sampling
/// parameters and next variate (greedy: none), how many alternatives it reports. Applied in
/// the session's order (bias, ban, log-probabilities, penalties, choice), so the token and
/// log-probabilities are the session's own, bit for bit.
#[derive(Debug, Clone, PartialEq)]
pub struct ChooseAt {
    /// Added to these tokens' logits.
    pub bias: Vec<(u32, f32)>,
    /// Tokens the constraint bans (their logits become `-inf`), as a bitset (bit `t % 64` of
    /// word `t / 64`); empty: no constraint.
    pub banned: Vec<u64>,
    /// The session's sampling parameters (penalties and distribution; its seed unused).
    pub params: SamplingParams,
    /// The session's last `penalty_last_n` tokens (empty without penalties).
    pub recent: Vec<u32>,
    /// The session's next uniform variate (ignored when greedy).
    pub u: f64,
    /// Alternatives to report with the chosen token's log-probability (`None`: none).
    pub logprobs: Option<u32>,
}

/// What a [`ChooseAt`] chose: the token ([`crate::pipeline::NO_TOKEN`] when nothing could be
/// drawn) and, when asked, its log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chosen {
    /// The token.
    pub token: u32,
    /// Log-probability of the token and the alternatives (most likely first).
    pub logprob: Option<(f32, Vec<(u32, f32)>)>,
}

impl ChooseAt {
    /// Whether `token` is banned.
    pub fn is_banned(&self, token: u32) -> bool {
        self.banned
            .get(token as usize / 64)
            .is_some_and(|w| w >> (token % 64) & 1 == 1)
    }

    /// Chooses from `logits` as the session would (`scratch`, `pre`, `cand`: buffers).
    pub fn choose(
        &self,
        logits: &[f32],
        scratch: &mut Vec<f32>,
        pre: &mut Vec<f32>,
        cand: &mut Vec<(u32, f32)>,
    ) -> Result<Chosen> {
        scratch.clear();
        scratch.extend_from_slice(logits);
        for &(t, b) in &self.bias {
            if let Some(l) = scratch.get_mut(t as usize) {
                *l += b;
            }
        }
        if !self.banned.is_empty() {
            for (t, l) in scratch.iter_mut().enumerate() {
                if self.is_banned(t as u32) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let lp = self.logprobs.map(|k| log_softmax_top(scratch, k as usize));
        if lp.is_some() {
            pre.clear();
            pre.extend_from_slice(scratch);
        }
        self.params.validate()?;
        apply_penalties(&self.params, scratch, &self.recent, &mut Vec::new());
        let token = SampleAt::at(&self.params, self.u)
            .choose(scratch, cand)
            .unwrap_or(crate::pipeline::NO_TOKEN);
        Ok(Chosen {
            token,
            logprob: lp.map(|(lse, top)| (logits_at(pre, token, lse), top)),
        })
    }
}

/// Leaves in `c` the tokens top-k, top-p and min-p keep, sorted by descending logit
/// (ascending id on ties); returns the top logit (`None`: nothing to draw).
fn filter(p: &SamplingParams, logits: &[f32], c: &mut Vec<(u32, f32)>) -> Option<f32> {
    c.clear();
    c.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(i, &v)| (i as u32, v)),
    );
    if c.is_empty() {
        return None;
    }
    // Descending by logit, ascending id on ties.
    let by = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if p.top_k > 0 && p.top_k < c.len() {
        c.select_nth_unstable_by(p.top_k - 1, by);
        c.truncate(p.top_k);
    }
    c.sort_unstable_by(by);
    // Probabilities at temperature 1 for top-p / min-p.
    let max = c[0].1;
    let sum: f64 = c.iter().map(|x| ((x.1 - max) as f64).exp()).sum();
    if p.top_p < 1.0 {
        let mut acc = 0.0f64;
        let mut keep = c.len();
        for (i, x) in c.iter().enumerate() {
            acc += ((x.1 - max) as f64).exp() / sum;
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep.max(1));
    }
    if p.min_p > 0.0 {
        let thresh = max + (p.min_p as f64).ln() as f32;
        let keep = c.iter().take_while(|x| x.1 >= thresh).count();
        c.truncate(keep.max(1));
    }
    Some(max)
}

/// The token at uniform variate `u` ∈ [0, 1) of a distribution (inverse CDF in the list's
/// order; the last token when rounding leaves `u` past the end).
pub fn draw(dist: &[(u32, f64)], u: f64) -> u32 {
    let total: f64 = dist.iter().map(|x| x.1).sum();
    let mut u = u * total;
    for x in dist {
        u -= x.1;
        if u < 0.0 {
            return x.0;
        }
    }
    dist.last().map_or(0, |x| x.0)
}

/// A uniform variate in [0, 1) that depends only on (`seed`, `pos`, `purpose`): draws tied to
/// a position rather than to how many draws came before, so speculative sampling's output
/// does not depend on how rounds were cut.
pub fn position_uniform(seed: u64, pos: u64, purpose: u64) -> f64 {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(&pos.to_le_bytes());
    h.update(&purpose.to_le_bytes());
    let b = h.finalize();
    let mut r = ChaCha8Rng::from_seed(*b.as_bytes());
    r.random::<f64>()
}

/// Holds back text that could be the start of a stop string, and reports a completed stop.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    pending: String,
}

impl StopStrings {
    /// A matcher for the given stop strings (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        StopStrings {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Feeds newly generated text. Returns the text safe to emit now, and whether a stop
    /// string completed (the stop string and anything after it are not emitted).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for k in (1..s.len().min(self.pending.len() + 1)).rev() {
                if self.pending.is_char_boundary(self.pending.len() - k)
                    && s.is_char_boundary(k)
                    && self.pending.ends_with(&s[..k])
                {
                    hold = hold.max(k);
                    break;
                }
            }
        }
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Text still held back (emit it when generation ends for another reason).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        let mut l = vec![0.0, 3.0, 1.0, 3.0];
        assert_eq!(s.sample(&mut l, &[]), 1);
    }

    #[test]
    fn argmax_matches_a_plain_scan() {
        let scan = |x: &[f32]| {
            let (mut b, mut bv) = (0usize, f32::NEG_INFINITY);
            for (i, &v) in x.iter().enumerate() {
                if v > bv {
                    (b, bv) = (i, v);
                }
            }
            b as u32
        };
        let mut st = 7u64;
        for n in [0usize, 1, 5, 16, 17, 33, 1000, 262_145] {
            let mut x: Vec<f32> = (0..n)
                .map(|_| {
                    st = st
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((st >> 40) % 50) as f32 // many ties
                })
                .collect();
            assert_eq!(argmax(&x), scan(&x), "n {n}");
            if n > 3 {
                x[n - 1] = 1e9; // the winner in the tail
                x[1] = f32::NAN;
                assert_eq!(argmax(&x), scan(&x), "n {n} tail");
                x.iter_mut().for_each(|v| *v = f32::NAN);
                x[n / 2] = f32::NEG_INFINITY;
                assert_eq!(argmax(&x), 0);
            }
        }
    }

    #[test]
    fn same_seed_same_draws() {
        let p = SamplingParams {
            temperature: 1.0,
            seed: 42,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |p: SamplingParams| {
            let mut s = Sampler::new(p).unwrap();
            (0..20)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(p.clone()), draw(p.clone()));
        let other = draw(SamplingParams {
            seed: 43,
            ..p.clone()
        });
        assert_ne!(draw(p), other);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        for _ in 0..10 {
            let mut l = vec![0.5, 0.1, 2.0, 1.9];
            assert_eq!(s.sample(&mut l, &[]), 2);
        }
    }

    /// Token probabilities at temperature 1, the ids out of order: sorted they are
    /// 0.40 (id 1), 0.30 (id 3), 0.15 (id 4), 0.10 (id 0), 0.05 (id 2).
    const PROBS: [f64; 5] = [0.10, 0.40, 0.05, 0.30, 0.15];

    /// Draws `n` tokens from `ln(PROBS)` and checks that exactly `kept` are drawn, each with
    /// its probability renormalized over `kept` at the temperature (`p^(1/T)`), within 0.03
    /// (over 3.5 standard deviations at n = 4000).
    fn assert_draws(params: SamplingParams, kept: &[u32]) {
        let n = 4000;
        let logits: Vec<f32> = PROBS.iter().map(|&p| p.ln() as f32).collect();
        let t = f64::from(params.temperature);
        let mut s = Sampler::new(params.clone()).unwrap();
        let mut counts = [0usize; PROBS.len()];
        for _ in 0..n {
            counts[s.sample(&mut logits.clone(), &[]) as usize] += 1;
        }
        let drawn: Vec<u32> = (0..PROBS.len() as u32)
            .filter(|&i| counts[i as usize] > 0)
            .collect();
        let mut want = kept.to_vec();
        want.sort_unstable();
        assert_eq!(drawn, want, "{params:?}: counts {counts:?}");
        let total: f64 = kept.iter().map(|&i| PROBS[i as usize].powf(1.0 / t)).sum();
        for &i in kept {
            let expected = PROBS[i as usize].powf(1.0 / t) / total;
            let got = counts[i as usize] as f64 / n as f64;
            assert!(
                (got - expected).abs() < 0.03,
                "{params:?}: token {i} drawn {got}, expected {expected}"
            );
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        let p = |top_p, temperature| SamplingParams {
            temperature,
            top_p,
            seed: 3,
            ..Default::default()
        };
        // Cumulative 0.40, 0.70, 0.85, 0.95, 1.
        assert_draws(p(0.75, 1.0), &[1, 3, 4]);
        assert_draws(p(0.65, 1.0), &[1, 3]);
        assert_draws(p(0.35, 1.0), &[1]);
        assert_draws(p(0.9, 1.0), &[1, 3, 4, 0]);
        assert_draws(p(1.0, 1.0), &[1, 3, 4, 0, 2]);
        // The set is chosen at temperature 1; the temperature then reshapes the draw.
        assert_draws(p(0.75, 0.5), &[1, 3, 4]);
        assert_draws(p(0.75, 2.0), &[1, 3, 4]);
    }

    #[test]
    fn min_p_drops_tokens_below_min_p_times_the_top_probability() {
        let p = |min_p, temperature| SamplingParams {
            temperature,
            min_p,
            seed: 5,
            ..Default::default()
        };
        // Relative to the top (0.40): 1, 0.75, 0.375, 0.25, 0.125.
        assert_draws(p(0.6, 1.0), &[1, 3]);
        assert_draws(p(0.3, 1.0), &[1, 3, 4]);
        assert_draws(p(0.2, 1.0), &[1, 3, 4, 0]);
        assert_draws(p(0.8, 1.0), &[1]);
        assert_draws(p(0.0, 1.0), &[1, 3, 4, 0, 2]);
        assert_draws(p(0.3, 0.5), &[1, 3, 4]);
        assert_draws(p(0.3, 2.0), &[1, 3, 4]);
    }

    #[test]
    fn repetition_penalty_changes_greedy_choice() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        let mut l = vec![1.0, 3.0, 2.0];
        assert_eq!(s.sample(&mut l, &[1]), 2);
    }

    #[test]
    fn stop_strings_hold_back_partial_matches() {
        let mut st = StopStrings::new(&["END".to_string()]);
        assert_eq!(st.push("abc E"), ("abc ".to_string(), false));
        assert_eq!(st.push("N"), (String::new(), false));
        assert_eq!(st.push("Dxyz"), (String::new(), true));
        let mut st = StopStrings::new(&["END".to_string()]);
        assert_eq!(st.push("E"), (String::new(), false));
        assert_eq!(st.push("x"), ("Ex".to_string(), false));
    }
}
