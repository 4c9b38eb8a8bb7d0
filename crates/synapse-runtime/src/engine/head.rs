//! Head-only drafting inside the engine ([`crate::head_draft`] for many sessions at once).
//!
//! A step with head drafting runs, for the greedy escalating sessions in decode, `k` body
//! passes over their own slots (one row per session and pass, the one-row order — the rows
//! plain decode steps would run, whatever else shares them), each session proposing after
//! each pass its shortlist's choice; then the full LM head over every stored hidden state of
//! every session in one call (each row in the one-row order: the bits of that session's
//! plain decode step). Each session takes its rows in order while the source's choice equals
//! its draft; its slot is truncated after the first disagreement, so it holds what plain
//! decoding holds. Plain decodes and prompt chunks of the other sessions run in the step's
//! ordinary pass.
//!
//! `k` (0: the drafting sessions decode plainly in the ordinary pass) comes from
//! [`HeadCost`]: measured seconds of a body pass by its rows, of the full head by its rows,
//! and of a plain pass by its decode rows, and the measured acceptance. A round of `k` drafts
//! over `S` sessions costs `k` body passes of `S` rows and the head over `k·S` rows and
//! commits `S·(1 + a + … + a^(k−1))` tokens; the plain step costs a pass of `S` decode rows
//! and commits `S`. On a compute-bound head many rows cost nearly in proportion, so drafting
//! pays for one or two sessions and stops paying beyond: the model then keeps `k = 0` and
//! re-measures now and then.
//!
//! Invariants: committed tokens never depend on `k`, the shortlist or other sessions (only
//! the speed does); sampled sessions do not head-draft (speculative sampling's output
//! depends on the draft's distribution, and a shortlist shared by sessions would make one
//! session's tokens depend on another's); the shortlist is bounded (it grows by the tokens
//! the source chose off it and by the prompts' tokens, and is rebuilt from its base once it
//! has grown by [`GROWTH`]).

use crate::error::Result;
use crate::escalation::{CostModel, MAX_DRAFT};
use crate::head_draft::Shortlist;
use crate::load::Model;

/// Tokens the shared shortlist may gain beyond its base before it is rebuilt from the base.
pub const GROWTH: usize = 4096;

/// Every this many head-drafting steps, one tries a `k` the model does not pick (one more
/// than its best, or 2 when its best is plain decoding), so the times it has not measured
/// get measured and a stale estimate does not stick. While plain decoding stays best the
/// interval doubles, up to [`EXPLORE_MAX`].
const EXPLORE: usize = 8;
const EXPLORE_MAX: usize = 256;

/// Plain decoding must be beaten by this factor before a step drafts: a round costs
/// bookkeeping the model does not count (taking and truncating, the list's growth), and its
/// estimates come from a shared machine's noisy timings — on SmolLM2-135M, whose head is a
/// small share of a step, a 2% margin (with one-draft rounds allowed) let noise pick rounds
/// that ran at 0.8× plain; 10% kept Qwen2.5-Coder-0.5B from its ~1.1×.
const MIN_GAIN: f64 = 1.05;

/// Measured costs and acceptance of head-only drafting in the engine.
#[derive(Debug)]
pub(crate) struct HeadCost {
    /// Seconds of a body pass (with its shortlist choices) by rows (index = rows).
    body: Vec<Option<f64>>,
    /// Seconds of a plain pass by decode rows (no prompt rows in it).
    plain: Vec<Option<f64>>,
    /// Seconds of the full head by rows.
    head: Vec<Option<f64>>,
    /// Decayed acceptance counts.
    acc: CostModel,
    /// Steps since the last exploration, and the current interval.
    since: usize,
    gap: usize,
}

/// A time estimate that follows a faster sample at once and a slower one slowly (a slow
/// sample on a shared machine is mostly another process's doing).
fn settle(v: &mut Option<f64>, x: f64) {
    *v = Some(match *v {
        Some(o) if x < o => x,
        Some(o) => o + 0.1 * (x - o),
        None => x,
    });
}

impl HeadCost {
    pub(crate) fn new(slots: usize, head_rows: usize) -> Self {
        HeadCost {
            body: vec![None; slots + 1],
            plain: vec![None; slots + 1],
            head: vec![None; head_rows + 1],
            acc: CostModel::new(MAX_DRAFT, true),
            since: 0,
            gap: EXPLORE,
        }
    }

    pub(crate) fn observe_body(&mut self, rows: usize, s: f64) {
        if let Some(v) = self.body.get_mut(rows) {
            settle(v, s);
        }
    }

    pub(crate) fn observe_plain(&mut self, rows: usize, s: f64) {
        if let Some(v) = self.plain.get_mut(rows) {
            settle(v, s);
        }
    }

    pub(crate) fn observe_head(&mut self, rows: usize, s: f64) {
        if let Some(v) = self.head.get_mut(rows) {
            settle(v, s);
        }
    }

    pub(crate) fn observe_round(&mut self, k: usize, accepted: usize) {
        self.acc.observe_round(k, accepted);
    }

    /// The per-token acceptance estimate.
    pub(crate) fn acceptance(&self) -> f64 {
        self.acc.acceptance_estimate()
    }

    /// The head's seconds over `rows` rows: measured, else the nearest measured larger row
    /// count's (the head's time grows with its rows), else the largest measured one's scaled
    /// in proportion (pessimistic: many rows cost less than that).
    fn head_time(&self, rows: usize) -> Option<f64> {
        if let Some(Some(t)) = self.head.get(rows) {
            return Some(*t);
        }
        if let Some(t) = self.head.iter().skip(rows + 1).find_map(|t| *t) {
            return Some(t);
        }
        let (r, t) = self
            .head
            .iter()
            .enumerate()
            .take(rows.min(self.head.len()))
            .filter_map(|(r, t)| t.map(|t| (r, t)))
            .next_back()?;
        Some(t * rows as f64 / r as f64)
    }

    /// Committed tokens per second of a round of `k` drafts over `s` sessions, by the
    /// measurements (`None` while one it needs is missing).
    fn rate(&self, s: usize, k: usize, a: f64) -> Option<f64> {
        let body = self.body.get(s).copied().flatten()?;
        let head = self.head_time(s * k)?;
        let e = if a < 1.0 {
            (1.0 - a.powi(k as i32)) / (1.0 - a)
        } else {
            k as f64
        };
        Some(s as f64 * e / (k as f64 * body + head))
    }

    /// This step's draft count for `s` sessions (at most `max_k`, and at most `rows` head
    /// rows in all); 0: they decode plainly. Never 1: a greedy round of one draft commits
    /// exactly one token, for a plain step's body pass and head plus the list's choice.
    pub(crate) fn choose(&mut self, s: usize, max_k: usize, rows: usize) -> usize {
        let cap = max_k.min(rows / s.max(1)).min(MAX_DRAFT);
        if cap < 2 || s == 0 {
            return 0;
        }
        self.since += 1;
        // A plain step of this many sessions is measured first, then a drafted one.
        let Some(plain) = self.plain.get(s).copied().flatten() else {
            return 0;
        };
        let plain_rate = s as f64 / plain;
        let a = self.acceptance();
        let mut best = (0usize, plain_rate * MIN_GAIN);
        let mut unknown = false;
        for k in 2..=cap {
            match self.rate(s, k, a) {
                Some(r) if r > best.1 => best = (k, r),
                Some(_) => {}
                None => unknown = true,
            }
        }
        if unknown && self.body.get(s).copied().flatten().is_none() {
            // Never drafted at this many sessions: measure the cheapest round (explorations
            // then try one more draft at a time while drafting wins).
            return 2;
        }
        if self.since >= self.gap {
            self.since = 0;
            self.gap = if best.0 == 0 {
                (self.gap * 2).min(EXPLORE_MAX)
            } else {
                EXPLORE
            };
            let k = if best.0 == 0 { 2 } else { best.0 + 1 };
            return k.min(cap);
        }
        if best.0 > 0 {
            self.gap = EXPLORE;
        }
        best.0
    }
}

/// The engine's head-only draft: the shared shortlist, its base, the cost model and the
/// step's buffers.
pub(crate) struct HeadDrafter {
    pub list: Shortlist,
    base: Vec<u32>,
    pub cost: HeadCost,
    /// Most head rows of a step (all sessions' drafts together).
    pub max_rows: usize,
    /// The step's drafting sessions (indices in `active`), their rows' offsets in `hidden`
    /// and their draft counts.
    pub sessions: Vec<usize>,
    pub offsets: Vec<usize>,
    pub want: Vec<usize>,
    /// Final-normed hidden states of the step's drafted positions, by session then position.
    pub hidden: Vec<f32>,
    /// A vocabulary-sized row for sessions whose bias or penalties change the draft's logits:
    /// the list's logits scattered over −∞ (only listed entries are ever written, so it is
    /// reset only when the list is rebuilt).
    pub full: Vec<f32>,
    pub rows: Vec<crate::executor::Row>,
    /// Tokens the source chose off the list (each joined it), and list rebuilds.
    pub misses: u64,
    pub rebuilds: u64,
}

impl std::fmt::Debug for HeadDrafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadDrafter")
            .field("list", &self.list)
            .field("base", &self.base.len())
            .field("max_rows", &self.max_rows)
            .finish()
    }
}

impl HeadDrafter {
    /// A drafter for `model` whose shortlist starts as `base` (plus the end-of-generation
    /// tokens), for `slots` sessions, at most `max_rows` head rows a step.
    pub(crate) fn new(model: &Model, base: &[u32], slots: usize, max_rows: usize) -> Result<Self> {
        let eog = model.ir.special.eos.clone();
        let mut base: Vec<u32> = base.iter().copied().chain(eog).collect();
        base.sort_unstable();
        base.dedup();
        let list = Shortlist::new(model, base.iter().copied())?;
        let hd = model.hidden();
        Ok(HeadDrafter {
            list,
            base,
            cost: HeadCost::new(slots, max_rows),
            max_rows,
            sessions: Vec::with_capacity(slots),
            offsets: Vec::with_capacity(slots),
            want: Vec::with_capacity(slots),
            hidden: vec![0.0; max_rows * hd],
            full: vec![f32::NEG_INFINITY; model.vocab()],
            rows: Vec::with_capacity(slots),
            misses: 0,
            rebuilds: 0,
        })
    }

    /// The most bytes the drafter holds: the shortlist of `base` tokens and the
    /// end-of-generation tokens grown by [`GROWTH`], the hidden states of `max_rows` rows and
    /// the vocabulary-sized row.
    pub(crate) fn bytes_bound(model: &Model, base: usize, max_rows: usize) -> u64 {
        Shortlist::list_bytes_bound(model, base + model.ir.special.eos.len() + GROWTH)
            + 4 * model.vocab() as u64
            + 4 * (max_rows * model.hidden()) as u64
    }

    /// Puts `tokens` on the list; once the list has grown by [`GROWTH`] it is rebuilt from
    /// its base first (so it stays bounded over an engine's life).
    pub(crate) fn add(&mut self, model: &Model, tokens: &[u32]) -> Result<()> {
        if tokens.iter().all(|&t| self.list.contains(t)) {
            return Ok(());
        }
        if self.list.len() + tokens.len() > self.base.len() + GROWTH {
            self.list = Shortlist::new(model, self.base.iter().copied())?;
            self.rebuilds += 1;
            // Tokens that left the list must read −∞ in the scattered row again.
            self.full.fill(f32::NEG_INFINITY);
        }
        let room = (self.base.len() + GROWTH).saturating_sub(self.list.len());
        self.list.extend(model, tokens.iter().copied().take(room))
    }

    /// Tokens of the list's base.
    pub(crate) fn base_len(&self) -> usize {
        self.base.len()
    }

    /// Whether the list serves `model` (its head is the matrix the list was gathered from).
    pub(crate) fn serves(&self, model: &Model) -> bool {
        self.list.serves(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One session's costs measured: a plain pass, a body pass, the head by rows (1..=16),
    /// and 20 rounds of (drafts, accepted).
    fn measured(
        plain: f64,
        body: f64,
        head: impl Fn(usize) -> f64,
        round: (usize, usize),
    ) -> HeadCost {
        let mut c = HeadCost::new(4, 16);
        c.observe_plain(1, plain);
        c.observe_body(1, body);
        for r in 1..=16 {
            c.observe_head(r, head(r));
        }
        for _ in 0..20 {
            c.observe_round(round.0, round.1);
        }
        c
    }

    #[test]
    fn plain_first_then_a_measured_round_then_the_faster() {
        let mut c = HeadCost::new(4, 16);
        // Nothing measured: plain.
        assert_eq!(c.choose(1, 8, 16), 0);
        c.observe_plain(1, 0.010);
        // Plain measured, a draft round not: the cheapest round.
        assert_eq!(c.choose(1, 8, 16), 2);
        // A cheap body, a head whose rows cost little more than one: drafting pays at a
        // high acceptance.
        c.observe_body(1, 0.004);
        for r in 1..=16 {
            c.observe_head(r, 0.006 + 0.0005 * r as f64);
        }
        for _ in 0..20 {
            c.observe_round(4, 4);
        }
        let k = c.choose(1, 8, 16);
        assert!(k >= 3, "k {k}");
        // A promised gain within the margin: plain (apart from exploration steps).
        let mut c3 = measured(0.0076, 0.0065, |r| 0.0014 + 0.00007 * r as f64, (2, 2));
        let ks: Vec<usize> = (0..40).map(|_| c3.choose(1, 8, 16)).collect();
        // Explorations after 8, then 16 more steps (the interval doubles while plain wins).
        assert_eq!(ks.iter().filter(|&&k| k == 0).count(), 38, "{ks:?}");
        assert!(ks.iter().all(|&k| k != 1), "{ks:?}");
        // Nothing accepted: plain (apart from exploration steps).
        let mut c2 = measured(0.010, 0.004, |r| 0.006 + 0.0005 * r as f64, (4, 0));
        let ks: Vec<usize> = (0..16).map(|_| c2.choose(1, 8, 16)).collect();
        assert_eq!(ks.iter().filter(|&&k| k == 0).count(), 15, "{ks:?}");
    }

    #[test]
    fn a_head_in_proportion_to_its_rows_never_pays_at_many_sessions() {
        let mut c = HeadCost::new(8, 16);
        // Eight sessions: a plain pass = body + head over 8 rows; the head costs per row.
        c.observe_plain(8, 0.010 + 8.0 * 0.002);
        c.observe_body(8, 0.010);
        for r in 1..=16 {
            c.observe_head(r, 0.002 * r as f64);
        }
        for _ in 0..20 {
            c.observe_round(2, 2);
        }
        // Perfect acceptance still cannot beat plain: k body passes and k·8 head rows for
        // k·8 tokens is the plain step's cost exactly.
        let ks: Vec<usize> = (0..7).map(|_| c.choose(8, 8, 16)).collect();
        assert!(ks.iter().all(|&k| k == 0), "{ks:?}");
        // The head rows bound the draft count.
        assert!(c.choose(8, 8, 16) <= 2);
        // Fewer than two drafts a round fit: never a round.
        let ks: Vec<usize> = (0..16).map(|_| c.choose(8, 8, 15)).collect();
        assert!(ks.iter().all(|&k| k == 0), "{ks:?}");
    }

    #[test]
    fn unmeasured_head_rows_are_estimated_from_measured_ones() {
        let mut c = HeadCost::new(2, 16);
        c.observe_head(4, 0.008);
        assert_eq!(c.head_time(4), Some(0.008));
        assert_eq!(c.head_time(2), Some(0.008));
        assert_eq!(c.head_time(8), Some(0.016));
        c.observe_head(4, 0.004);
        assert_eq!(c.head_time(4), Some(0.004));
        // A slower sample moves the estimate a tenth of the way.
        c.observe_head(4, 0.014);
        assert!((c.head_time(4).unwrap() - 0.005).abs() < 1e-12);
    }
}
