//! Exact and heuristic search over device orders and split points.
//!
//! **Exact** (≤ [`EXACT_MAX_DEVICES`] devices): dynamic programming over states
//! `(set of devices used, last device, layers covered)`. A state's value is the best cost of
//! running layers `[0, j)` as stages on exactly those devices, ending on `last`; a transition
//! appends a stage `[j, j')` on an unused device reachable from `last` by a link. Every device
//! order and every split is a path, so the minimum over final states is optimal for both
//! objectives (sum for `Latency`; max — monotone, so optimal substructure holds — for
//! `Throughput`). Cost `O(n² 2ⁿ L²)` with `n` devices and `L` layers.
//!
//! **Heuristic** (more devices): fix one order — fastest device first (by its best measured
//! rate, then name) — and run the same DP over positions in that order, where any device may be
//! skipped: `O(n² L²)`. Bound: (a) when all layers are identical and all links equal, a plan's
//! cost depends only on which device holds how many layers, not on their order, so the
//! heuristic is exact; (b) in general its cost is never worse than the best single-device plan
//! or the best plan whose stages follow speed order, since those are among the plans it
//! searches. Property-tested against the exact search on small clusters.
//!
//! **Tie-break** (`Throughput`): many plans share the optimal bottleneck `b`; a second pass runs
//! the latency DP over stages and links no slower than `b` and returns the lowest-latency one.
//!
//! **Replicas** (`Throughput`, `max_replicas > 1`, exact regime): the devices are partitioned
//! into up to `max_replicas` disjoint pipelines each running the whole model, maximising
//! `Σ 1/bottleneck` (a DP over subsets).

use std::collections::BTreeSet;

use crate::error::{PlanError, Result};
use crate::fit::{LayerLadders, device_ladders, fit_stage};
use crate::types::{Device, Link, Objective, Pipeline, Plan, PlanRequest, Stage};

/// Largest cluster searched exactly.
pub const EXACT_MAX_DEVICES: usize = 8;

fn invalid(reason: impl Into<String>) -> PlanError {
    PlanError::InvalidRequest {
        reason: reason.into(),
    }
}

fn validate(req: &PlanRequest) -> Result<()> {
    if req.devices.is_empty() {
        return Err(invalid("no devices"));
    }
    if req.layers.is_empty() {
        return Err(invalid("no layers"));
    }
    if req.max_replicas == 0 {
        return Err(invalid("max_replicas must be at least 1"));
    }
    let mut names = BTreeSet::new();
    for d in &req.devices {
        if !names.insert(d.name.as_str()) {
            return Err(invalid(format!("duplicate device `{}`", d.name)));
        }
        if !(d.dispatch_overhead_s.is_finite() && d.dispatch_overhead_s >= 0.0) {
            return Err(invalid(format!(
                "device `{}`: bad dispatch overhead",
                d.name
            )));
        }
        for (e, r) in &d.stream_rate {
            if !(r.is_finite() && *r > 0.0) {
                return Err(invalid(format!(
                    "device `{}`: rate for `{e}` must be positive",
                    d.name
                )));
            }
        }
    }
    for l in &req.links {
        if !names.contains(l.a.as_str()) || !names.contains(l.b.as_str()) {
            return Err(invalid(format!(
                "link {}–{} names an unknown device",
                l.a, l.b
            )));
        }
        let k = l.link;
        if !(k.latency_s.is_finite()
            && k.latency_s >= 0.0
            && k.bandwidth_bytes_per_s.is_finite()
            && k.bandwidth_bytes_per_s > 0.0)
        {
            return Err(invalid(format!(
                "link {}–{}: bad latency or bandwidth",
                l.a, l.b
            )));
        }
    }
    let mut tensors = BTreeSet::new();
    for t in req.layers.iter().flat_map(|l| &l.tensors) {
        if !tensors.insert(t.name.as_str()) {
            return Err(invalid(format!("duplicate tensor `{}`", t.name)));
        }
        if t.options
            .iter()
            .any(|o| !(o.distortion.is_finite() && o.distortion >= 0.0))
        {
            return Err(invalid(format!("tensor `{}`: bad distortion", t.name)));
        }
        let supported = t.options.iter().any(|o| {
            req.devices
                .iter()
                .any(|d| d.stream_rate.contains_key(&o.encoding))
        });
        if !supported {
            return Err(PlanError::UnsupportedEverywhere {
                tensor: t.name.clone(),
            });
        }
    }
    Ok(())
}

/// Plans `req`: exact search up to [`EXACT_MAX_DEVICES`] devices, the heuristic past that.
pub fn plan(req: &PlanRequest) -> Result<Plan> {
    validate(req)?;
    let floor = if req.allow_approximation {
        None
    } else {
        req.quality_floor
    };
    let exact = req.devices.len() <= EXACT_MAX_DEVICES;
    if let Some(p) = Problem::new(req, floor).solve(exact) {
        return Ok(p);
    }
    if let Some(f) = floor
        && Problem::new(req, None).solve(exact).is_some()
    {
        return Err(PlanError::ApproximationNotAllowed { floor: f });
    }
    let weights: u64 = req
        .layers
        .iter()
        .flat_map(|l| &l.tensors)
        .map(|t| {
            t.options
                .iter()
                .filter(|o| {
                    req.devices
                        .iter()
                        .any(|d| d.stream_rate.contains_key(&o.encoding))
                })
                .map(|o| o.bytes)
                .min()
                .unwrap_or(0)
        })
        .sum();
    let kv: u64 = req
        .layers
        .iter()
        .map(|l| l.kv_bytes_per_token.saturating_mul(req.context_length))
        .fold(0u64, u64::saturating_add);
    Err(PlanError::InsufficientMemory {
        needed_bytes: weights.saturating_add(kv),
        cluster_bytes: req
            .devices
            .iter()
            .map(|d| d.memory_bytes)
            .fold(0, u64::saturating_add),
    })
}

/// Runs the exact search and the heuristic on the same request (for tests and diagnostics):
/// `(exact, heuristic)` plans, `None` where infeasible. Panics on nothing; exact search on more
/// than [`EXACT_MAX_DEVICES`] devices is refused with `None`.
pub fn compare_exact_and_heuristic(req: &PlanRequest) -> Result<(Option<Plan>, Option<Plan>)> {
    validate(req)?;
    let floor = if req.allow_approximation {
        None
    } else {
        req.quality_floor
    };
    let p = Problem::new(req, floor);
    let exact = (req.devices.len() <= EXACT_MAX_DEVICES)
        .then(|| p.solve(true))
        .flatten();
    Ok((exact, p.solve(false)))
}

struct Problem<'a> {
    req: &'a PlanRequest,
    n: usize,
    l: usize,
    /// `stage[(d·(L+1) + i)·(L+1) + j]`: time of layers `[i, j)` on device `d`, or INF.
    stage: Vec<f64>,
    ladders: Vec<Vec<LayerLadders>>,
    links: Vec<Option<Link>>,
}

const INF: f64 = f64::INFINITY;

impl<'a> Problem<'a> {
    fn new(req: &'a PlanRequest, floor: Option<f64>) -> Self {
        let n = req.devices.len();
        let l = req.layers.len();
        let ladders: Vec<Vec<LayerLadders>> = req
            .devices
            .iter()
            .map(|d| device_ladders(d, &req.layers, floor))
            .collect();
        let mut stage = vec![INF; n * (l + 1) * (l + 1)];
        for (d, dev) in req.devices.iter().enumerate() {
            for i in 0..l {
                for j in i + 1..=l {
                    if let Some(s) =
                        fit_stage(dev, &ladders[d], &req.layers, i..j, req.context_length)
                    {
                        stage[(d * (l + 1) + i) * (l + 1) + j] = s.time_s;
                    } else {
                        // A longer range holds every tensor and KV byte of this one: it cannot fit either.
                        break;
                    }
                }
            }
        }
        let mut links = vec![None; n * n];
        for spec in &req.links {
            let a = req.devices.iter().position(|d| d.name == spec.a);
            let b = req.devices.iter().position(|d| d.name == spec.b);
            if let (Some(a), Some(b)) = (a, b) {
                links[a * n + b] = Some(spec.link);
                links[b * n + a] = Some(spec.link);
            }
        }
        Problem {
            req,
            n,
            l,
            stage,
            ladders,
            links,
        }
    }

    fn stage_time(&self, d: usize, i: usize, j: usize) -> f64 {
        self.stage[(d * (self.l + 1) + i) * (self.l + 1) + j]
    }

    /// Time to send the activations after layer `j − 1` from `a` to `b`.
    fn link_time(&self, a: usize, b: usize, j: usize) -> f64 {
        match self.links[a * self.n + b] {
            Some(k) => {
                k.latency_s
                    + self.req.layers[j - 1].activation_bytes as f64 / k.bandwidth_bytes_per_s
            }
            None => INF,
        }
    }

    fn combine(mode: Objective, acc: f64, link: f64, stage: f64) -> f64 {
        match mode {
            Objective::Latency => acc + link + stage,
            Objective::Throughput => acc.max(link).max(stage),
        }
    }

    fn solve(&self, exact: bool) -> Option<Plan> {
        let run = |mode: Objective, cap: f64| {
            if exact {
                self.solve_exact(mode, cap)
            } else {
                self.solve_heuristic(mode, cap).map(|p| vec![p])
            }
        };
        let mut pipelines: Vec<Vec<(usize, usize, usize)>> = run(self.req.objective, INF)?;
        if self.req.objective == Objective::Throughput && pipelines.len() == 1 {
            // Many plans share the optimal bottleneck b; among them take the lowest latency: the
            // latency DP over stages and links no slower than b (the b-optimal plan is one).
            let b = self.materialise(&pipelines[0])?.bottleneck_s;
            if let Some(p) = run(Objective::Latency, b) {
                pipelines = p;
            }
        }
        let pipelines: Vec<Pipeline> = pipelines
            .iter()
            .map(|p| self.materialise(p))
            .collect::<Option<_>>()?;
        let latency_s = pipelines.iter().map(|p| p.latency_s).fold(INF, f64::min);
        let tokens_per_s = pipelines.iter().map(|p| 1.0 / p.bottleneck_s).sum();
        Some(Plan {
            objective: self.req.objective,
            pipelines,
            latency_s,
            tokens_per_s,
            exact,
        })
    }

    /// Rebuilds stages (device, start, end) into a pipeline with encodings and times.
    fn materialise(&self, stages: &[(usize, usize, usize)]) -> Option<Pipeline> {
        let mut out: Vec<Stage> = Vec::with_capacity(stages.len());
        let mut latency = 0.0;
        let mut bottleneck: f64 = 0.0;
        for (k, &(d, i, j)) in stages.iter().enumerate() {
            let s = fit_stage(
                &self.req.devices[d],
                &self.ladders[d],
                &self.req.layers,
                i..j,
                self.req.context_length,
            )?;
            if k > 0 {
                let lt = self.link_time(stages[k - 1].0, d, i);
                latency += lt;
                bottleneck = bottleneck.max(lt);
            }
            latency += s.time_s;
            bottleneck = bottleneck.max(s.time_s);
            out.push(s);
        }
        Some(Pipeline {
            stages: out,
            latency_s: latency,
            bottleneck_s: bottleneck,
        })
    }

    /// Subset DP under `mode`, ignoring stages and links slower than `cap`. Returns one
    /// pipeline, or several replicas for `Throughput`.
    fn solve_exact(&self, mode: Objective, cap: f64) -> Option<Vec<Vec<(usize, usize, usize)>>> {
        let capped = |t: f64| if t > cap { INF } else { t };
        let (n, l) = (self.n, self.l);
        let states = (1usize << n) * n * (l + 1);
        let idx = |mask: usize, last: usize, j: usize| (mask * n + last) * (l + 1) + j;
        let mut g = vec![INF; states];
        let mut back = vec![usize::MAX; states];
        for d in 0..n {
            for j in 1..=l {
                g[idx(1 << d, d, j)] = capped(self.stage_time(d, 0, j));
            }
        }
        for mask in 1usize..(1 << n) {
            for last in (0..n).filter(|&d| mask & (1 << d) != 0) {
                for j in 1..l {
                    let cur = g[idx(mask, last, j)];
                    if cur == INF {
                        continue;
                    }
                    for nd in (0..n).filter(|&d| mask & (1 << d) == 0) {
                        let lt = capped(self.link_time(last, nd, j));
                        if lt == INF {
                            continue;
                        }
                        for j2 in j + 1..=l {
                            let st = capped(self.stage_time(nd, j, j2));
                            if st == INF {
                                continue;
                            }
                            let c = Self::combine(mode, cur, lt, st);
                            let t = idx(mask | (1 << nd), nd, j2);
                            if c < g[t] {
                                g[t] = c;
                                back[t] = idx(mask, last, j);
                            }
                        }
                    }
                }
            }
        }
        // best pipeline using exactly `mask`
        let full = 1usize << n;
        let mut best = vec![(INF, usize::MAX); full];
        for (mask, b) in best.iter_mut().enumerate().skip(1) {
            for last in (0..n).filter(|&d| mask & (1 << d) != 0) {
                let v = g[idx(mask, last, l)];
                if v < b.0 {
                    *b = (v, idx(mask, last, l));
                }
            }
        }
        let trace = |mut s: usize| -> Vec<(usize, usize, usize)> {
            let mut stages = Vec::new();
            loop {
                let j = s % (l + 1);
                let last = (s / (l + 1)) % n;
                let p = back[s];
                let i = if p == usize::MAX { 0 } else { p % (l + 1) };
                stages.push((last, i, j));
                if p == usize::MAX {
                    break;
                }
                s = p;
            }
            stages.reverse();
            stages
        };
        let replicas = if mode == Objective::Throughput {
            self.req.max_replicas.min(n)
        } else {
            1
        };
        if replicas == 1 {
            let (v, s) = best
                .iter()
                .copied()
                .fold((INF, usize::MAX), |a, b| if b.0 < a.0 { b } else { a });
            return (v < INF).then(|| vec![trace(s)]);
        }
        // Replicas: best single pipeline within each subset, then the partition DP on Σ 1/bottleneck.
        let mut within = best.clone();
        for mask in 1..full {
            for d in 0..n {
                if mask & (1 << d) != 0 {
                    let sub = within[mask ^ (1 << d)];
                    if sub.0 < within[mask].0 {
                        within[mask] = sub;
                    }
                }
            }
        }
        let rate = |m: usize| {
            if within[m].0 < INF {
                1.0 / within[m].0
            } else {
                0.0
            }
        };
        // r[k][mask] = (best Σ rate with ≤ k pipelines inside mask, chosen block or 0)
        let mut r = vec![vec![(0.0f64, 0usize); full]; replicas + 1];
        for k in 1..=replicas {
            for mask in 1..full {
                let low = mask & mask.wrapping_neg();
                let mut bestv = (r[k][mask ^ low].0, 0usize); // lowest device unused
                let rest = mask ^ low;
                let mut sub = rest;
                loop {
                    let block = sub | low;
                    let v = rate(block) + r[k - 1][mask ^ block].0;
                    if v > bestv.0 {
                        bestv = (v, block);
                    }
                    if sub == 0 {
                        break;
                    }
                    sub = (sub - 1) & rest;
                }
                r[k][mask] = bestv;
            }
        }
        let mut out = Vec::new();
        let (mut k, mut mask) = (replicas, full - 1);
        while k > 0 && mask != 0 {
            let (_, block) = r[k][mask];
            if block == 0 {
                mask ^= mask & mask.wrapping_neg();
                continue;
            }
            if within[block].0 < INF {
                out.push(trace(within[block].1));
            }
            mask ^= block;
            k -= 1;
        }
        (!out.is_empty()).then_some(out)
    }

    /// Fixed order (fastest first), DP over positions with skipping.
    fn solve_heuristic(&self, mode: Objective, cap: f64) -> Option<Vec<(usize, usize, usize)>> {
        let capped = |t: f64| if t > cap { INF } else { t };
        let (n, l) = (self.n, self.l);
        let speed = |d: &Device| d.stream_rate.values().copied().fold(0.0f64, f64::max);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| {
            let (da, db) = (&self.req.devices[a], &self.req.devices[b]);
            speed(db)
                .total_cmp(&speed(da))
                .then_with(|| da.name.cmp(&db.name))
        });
        let idx = |k: usize, j: usize| k * (l + 1) + j;
        let mut g = vec![INF; n * (l + 1)];
        let mut back = vec![usize::MAX; n * (l + 1)];
        for (k, &d) in order.iter().enumerate() {
            for j in 1..=l {
                let mut bestv = capped(self.stage_time(d, 0, j));
                let mut bestp = usize::MAX;
                for (kp, &dp) in order.iter().enumerate().take(k) {
                    for i in 1..j {
                        let prev = g[idx(kp, i)];
                        if prev == INF {
                            continue;
                        }
                        let lt = capped(self.link_time(dp, d, i));
                        let st = capped(self.stage_time(d, i, j));
                        if lt == INF || st == INF {
                            continue;
                        }
                        let c = Self::combine(mode, prev, lt, st);
                        if c < bestv {
                            bestv = c;
                            bestp = idx(kp, i);
                        }
                    }
                }
                g[idx(k, j)] = bestv;
                back[idx(k, j)] = bestp;
            }
        }
        let (v, mut s) = (0..n)
            .map(|k| (g[idx(k, l)], idx(k, l)))
            .fold((INF, 0), |a, b| if b.0 < a.0 { b } else { a });
        if v == INF {
            return None;
        }
        let mut stages = Vec::new();
        loop {
            let (k, j) = (s / (l + 1), s % (l + 1));
            let p = back[s];
            let i = if p == usize::MAX { 0 } else { p % (l + 1) };
            stages.push((order[k], i, j));
            if p == usize::MAX {
                break;
            }
            s = p;
        }
        stages.reverse();
        Some(stages)
    }
}
