//! The budget-independent demotion order and budget selection.

use std::collections::{BTreeMap, BTreeSet};

use synapse_sensitivity::ImportanceMap;

use crate::error::{Result, SelectorError};
use crate::profile::{Assignment, Profile};

/// What limits the choice, besides the budget.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Constraints {
    /// Encodings the target device has kernels for (`None`: every encoding). The source
    /// encoding is an option only if it is listed here too.
    pub supported: Option<BTreeSet<String>>,
    /// Tensors kept at their most precise supported option (norms, embeddings …).
    pub pinned: BTreeSet<String>,
    /// Largest per-tensor distortion accepted without opting into approximation.
    pub quality_floor: Option<f64>,
    /// Opt-in to go below the quality floor when the budget requires it.
    pub allow_approximation: bool,
    /// Tensors that must share one encoding (e.g. q/k/v, gate/up), each group a joint item.
    pub fused: Vec<Vec<String>>,
}

/// One option of one item: an encoding applied to every member.
#[derive(Debug, Clone)]
struct Opt {
    encoding: String,
    bytes: u64,
    distortion: f64,
    /// Per member (same order as the item's members): (bytes, distortion).
    members: Vec<(u64, f64)>,
}

#[derive(Debug, Clone)]
struct Item {
    name: String,
    members: Vec<String>,
    /// Most precise first; bytes strictly decreasing, marginal cost strictly increasing.
    ladder: Vec<Opt>,
}

/// One step of the demotion order.
#[derive(Debug, Clone, PartialEq)]
pub struct DemotionStep {
    /// The item demoted (a tensor name, or the members of a fused group joined by `+`).
    pub item: String,
    /// Encoding before the step.
    pub from: String,
    /// Encoding after the step.
    pub to: String,
    /// Bytes saved by the step.
    pub saved_bytes: u64,
    /// Distortion added by the step.
    pub added_distortion: f64,
}

/// A selector: items with convex ladders and the budget-independent demotion order.
#[derive(Debug, Clone)]
pub struct Selector {
    items: Vec<Item>,
    /// (item index, level reached), ascending Δdistortion per saved byte.
    order: Vec<(usize, usize)>,
    /// Smallest total achievable ignoring the quality floor (for error reports).
    unfloored_minimum: u64,
}

/// Keeps the Pareto front, then its lower convex hull, most precise first.
fn convex_ladder(mut opts: Vec<Opt>) -> Vec<Opt> {
    // Ascending distortion, then ascending bytes, then ID: the first is the most precise.
    opts.sort_by(|a, b| {
        a.distortion
            .total_cmp(&b.distortion)
            .then(a.bytes.cmp(&b.bytes))
            .then_with(|| a.encoding.cmp(&b.encoding))
    });
    // Pareto front: each kept option is strictly smaller than every more precise kept one.
    let mut front: Vec<Opt> = Vec::new();
    for o in opts {
        if front.last().is_none_or(|l| o.bytes < l.bytes) {
            front.push(o);
        }
    }
    // Lower convex hull: marginal cost (Δd / Δbytes) strictly increasing along the ladder.
    let slope = |a: &Opt, b: &Opt| (b.distortion - a.distortion) / (a.bytes - b.bytes) as f64;
    let mut hull: Vec<Opt> = Vec::new();
    for o in front {
        while hull.len() >= 2 {
            let n = hull.len();
            if slope(&hull[n - 2], &hull[n - 1]) >= slope(&hull[n - 1], &o) {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(o);
    }
    hull
}

impl Selector {
    /// Checks that `map` was measured on the model with `model_fingerprint` (and with codec
    /// versions this build implements), then builds the selector.
    pub fn for_model(
        map: &ImportanceMap,
        model_fingerprint: &str,
        c: &Constraints,
    ) -> Result<Self> {
        map.check_applies_to(model_fingerprint)?;
        Self::new(map, c)
    }

    /// Builds items and the demotion order from a map and constraints (no budget involved).
    pub fn new(map: &ImportanceMap, c: &Constraints) -> Result<Self> {
        let unknown = |name: &String| SelectorError::UnknownTensor { name: name.clone() };
        for name in &c.pinned {
            if !map.tensors.contains_key(name) {
                return Err(unknown(name));
            }
        }
        let mut grouped: BTreeMap<String, usize> = BTreeMap::new();
        let mut groups: Vec<Vec<String>> = Vec::new();
        for g in &c.fused {
            let mut members = g.clone();
            members.sort();
            members.dedup();
            for m in &members {
                if !map.tensors.contains_key(m) {
                    return Err(unknown(m));
                }
                if grouped.insert(m.clone(), groups.len()).is_some() {
                    return Err(SelectorError::TensorInTwoGroups { name: m.clone() });
                }
            }
            groups.push(members);
        }
        for name in map.tensors.keys() {
            if !grouped.contains_key(name) {
                groups.push(vec![name.clone()]);
            }
        }
        groups.sort();

        let supported = |e: &str| c.supported.as_ref().is_none_or(|s| s.contains(e));
        let floor = if c.allow_approximation {
            None
        } else {
            c.quality_floor
        };
        let mut items = Vec::with_capacity(groups.len());
        let mut unfloored_minimum = 0u64;
        for members in groups {
            let name = members.join("+");
            // candidate encodings: per member, encoding → (bytes, distortion)
            let per: Vec<BTreeMap<&str, (u64, f64)>> = members
                .iter()
                .map(|m| {
                    let t = &map.tensors[m];
                    let mut e: BTreeMap<&str, (u64, f64)> = t
                        .options
                        .iter()
                        .map(|o| (o.encoding.as_str(), (o.bytes, t.kl_weight * o.distortion)))
                        .collect();
                    e.insert(t.source_encoding.as_str(), (t.source_bytes, 0.0));
                    e
                })
                .collect();
            let mut all = Vec::new();
            for (&enc, _) in per[0].iter() {
                if !supported(enc) {
                    continue;
                }
                let Some(ms) = per
                    .iter()
                    .map(|p| p.get(enc).copied())
                    .collect::<Option<Vec<_>>>()
                else {
                    continue;
                };
                all.push(Opt {
                    encoding: enc.to_owned(),
                    bytes: ms.iter().map(|m| m.0).sum(),
                    distortion: ms.iter().map(|m| m.1).sum(),
                    members: ms,
                });
            }
            if all.is_empty() {
                return Err(SelectorError::NoSupportedEncoding { item: name });
            }
            let pinned = members.iter().any(|m| c.pinned.contains(m));
            let unfloored = convex_ladder(all.clone());
            unfloored_minimum += if pinned {
                unfloored[0].bytes
            } else {
                unfloored[unfloored.len() - 1].bytes
            };
            if let Some(f) = floor {
                all.retain(|o| o.members.iter().all(|m| m.1 <= f));
                if all.is_empty() {
                    return Err(SelectorError::FloorUnreachable { item: name });
                }
            }
            let mut ladder = convex_ladder(all);
            if pinned {
                ladder.truncate(1);
            }
            items.push(Item {
                name,
                members,
                ladder,
            });
        }

        let mut steps: Vec<(f64, usize, usize)> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            for l in 1..it.ladder.len() {
                let (a, b) = (&it.ladder[l - 1], &it.ladder[l]);
                let ratio = (b.distortion - a.distortion) / (a.bytes - b.bytes) as f64;
                steps.push((ratio, i, l));
            }
        }
        steps.sort_by(|x, y| {
            x.0.total_cmp(&y.0)
                .then_with(|| items[x.1].name.cmp(&items[y.1].name))
                .then(x.2.cmp(&y.2))
        });
        Ok(Selector {
            order: steps.into_iter().map(|(_, i, l)| (i, l)).collect(),
            items,
            unfloored_minimum,
        })
    }

    /// The demotion order, cheapest (least distortion per saved byte) first. A budget applies
    /// the shortest prefix that fits; promotion undoes it from the end.
    pub fn demotion_order(&self) -> Vec<DemotionStep> {
        self.order
            .iter()
            .map(|&(i, l)| {
                let it = &self.items[i];
                let (a, b) = (&it.ladder[l - 1], &it.ladder[l]);
                DemotionStep {
                    item: it.name.clone(),
                    from: a.encoding.clone(),
                    to: b.encoding.clone(),
                    saved_bytes: a.bytes - b.bytes,
                    added_distortion: b.distortion - a.distortion,
                }
            })
            .collect()
    }

    /// Total bytes with every item at its most precise allowed option.
    pub fn maximum_bytes(&self) -> u64 {
        self.items.iter().map(|it| it.ladder[0].bytes).sum()
    }

    /// Total bytes with every item at its cheapest allowed option.
    pub fn minimum_bytes(&self) -> u64 {
        self.items
            .iter()
            .map(|it| it.ladder[it.ladder.len() - 1].bytes)
            .sum()
    }

    /// [`select`](Self::select), then the slack the prefix's last (large) step left filled:
    /// applied steps are undone, most costly per byte first, whenever an item's latest step fits
    /// in what is left of the budget, until none does. The total never exceeds `budget` and the
    /// distortion never exceeds the prefix's; unlike `select`, a larger budget is not
    /// guaranteed to only promote (a one-shot choice, not a residency policy).
    pub fn select_filled(&self, budget: u64) -> Result<Profile> {
        let (mut level, mut total) = self.prefix(budget)?;
        loop {
            let mut changed = false;
            for &(i, l) in self.order.iter().rev() {
                if level[i] != l {
                    continue;
                }
                let it = &self.items[i];
                let back = it.ladder[l - 1].bytes - it.ladder[l].bytes;
                if total + back <= budget {
                    total += back;
                    level[i] = l - 1;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        Ok(self.profile_at(&level, total))
    }

    /// The least-cost profile that fits `budget` as an exact multiple-choice knapsack over the
    /// items' ladders (dynamic programming over the budget in at most 16,384 units, every
    /// option's bytes rounded *up* to whole units, so the result always fits), or
    /// [`select_filled`](Self::select_filled)'s profile when that one costs less (the rounding
    /// can hide a solution). A one-shot choice like `select_filled`: not monotone in the budget.
    pub fn select_best(&self, budget: u64) -> Result<Profile> {
        let filled = self.select_filled(budget)?;
        const UNITS: u64 = 16_384;
        let unit = budget.div_ceil(UNITS).max(1);
        let cap = (budget / unit) as usize;
        let cost = |b: u64| b.div_ceil(unit) as usize;
        // best[c]: least cost of the items so far within c units; choice[i][c]: item i's level.
        let mut best = vec![0f64; cap + 1];
        let mut choice: Vec<Vec<u8>> = Vec::with_capacity(self.items.len());
        for it in &self.items {
            let mut next = vec![f64::INFINITY; cap + 1];
            let mut ch = vec![u8::MAX; cap + 1];
            for (l, o) in it.ladder.iter().enumerate() {
                let w = cost(o.bytes);
                if w > cap {
                    continue;
                }
                for c in w..=cap {
                    let v = best[c - w] + o.distortion;
                    if v < next[c] {
                        next[c] = v;
                        ch[c] = l as u8;
                    }
                }
            }
            best = next;
            choice.push(ch);
        }
        if !best[cap].is_finite() || best[cap] >= filled.total_distortion {
            return Ok(filled);
        }
        let mut level = vec![0usize; self.items.len()];
        let mut c = cap;
        for i in (0..self.items.len()).rev() {
            let l = choice[i][c] as usize;
            level[i] = l;
            c -= cost(self.items[i].ladder[l].bytes);
        }
        let total = self
            .items
            .iter()
            .zip(&level)
            .map(|(it, &l)| it.ladder[l].bytes)
            .sum();
        Ok(self.profile_at(&level, total))
    }

    /// The profile for `budget` bytes: the shortest prefix of the demotion order that fits.
    pub fn select(&self, budget: u64) -> Result<Profile> {
        let (level, total) = self.prefix(budget)?;
        Ok(self.profile_at(&level, total))
    }

    /// Each item's level and the total after the shortest prefix that fits `budget`.
    fn prefix(&self, budget: u64) -> Result<(Vec<usize>, u64)> {
        let mut level = vec![0usize; self.items.len()];
        let mut total = self.maximum_bytes();
        let mut steps = self.order.iter();
        while total > budget {
            let Some(&(i, l)) = steps.next() else {
                let minimum = total;
                return Err(
                    if self.unfloored_minimum < minimum && self.unfloored_minimum <= budget {
                        SelectorError::ApproximationNotAllowed {
                            budget,
                            min_within_floor: minimum,
                        }
                    } else {
                        SelectorError::BudgetTooSmall {
                            budget,
                            minimum: self.unfloored_minimum.min(minimum),
                        }
                    },
                );
            };
            let it = &self.items[i];
            total -= it.ladder[l - 1].bytes - it.ladder[l].bytes;
            level[i] = l;
        }
        Ok((level, total))
    }

    /// The profile with each item at `level` (`total` its bytes).
    fn profile_at(&self, level: &[usize], total: u64) -> Profile {
        let mut assignments = BTreeMap::new();
        let mut total_distortion = 0.0;
        for (it, &l) in self.items.iter().zip(level) {
            let o = &it.ladder[l];
            total_distortion += o.distortion;
            for (m, &(bytes, distortion)) in it.members.iter().zip(&o.members) {
                assignments.insert(
                    m.clone(),
                    Assignment {
                        encoding: o.encoding.clone(),
                        bytes,
                        distortion,
                    },
                );
            }
        }
        Profile {
            assignments,
            total_bytes: total,
            total_distortion,
        }
    }
}
