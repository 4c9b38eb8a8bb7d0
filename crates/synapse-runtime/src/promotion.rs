//! Precision that follows the memory it is given: a [`PrecisionController`] holds a model's
//! current profile under a weight budget that changes while the engine runs, and answers each
//! new budget with a [`Transition`] or nothing.
//!
//! - It selects with the selector's monotone rule (`Selector::select`: the shortest prefix of
//!   one budget-independent demotion order), so a larger budget only ever promotes and a
//!   smaller one only demotes; a transition's changes come most important first (the demotion
//!   steps undone from the end of the order: the costliest per byte first).
//! - A budget the current profile no longer fits demotes at once (memory is not there to
//!   keep). A promotion waits until the profile chosen for `budget − hysteresis` (or the whole
//!   source, once the budget holds it) is larger than the current one and `cooldown` has
//!   passed since the last change, so a budget oscillating
//!   within the hysteresis band changes nothing and a wider oscillation changes the profile at
//!   most twice per cooldown (a forced demotion, then one promotion).
//! - [`PrecisionController::model`] builds a transition's model from the source model
//!   (promoted tensors come back from the source or the variant cache, never from a lower
//!   precision), with a new profile hash, so KV made under the old profile is never reused
//!   under the new one.
//!
//! Time is passed in (`Instant`), so the policy is tested without sleeping.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use synapse_selector::{Change, ChangeKind, Constraints, Profile, ProfileHash, Selector, diff};
use synapse_sensitivity::ImportanceMap;

use crate::error::{Result, RuntimeError};
use crate::load::Model;
use crate::variant::{VariantCache, VariantStats};

mod follow;
pub use follow::{
    Demand, FollowOutcome, FollowPolicy, FollowStatus, MemoryFollower, MemoryReading, cgroup_room,
    follow_budget, meminfo_field,
};

/// When a larger budget may promote.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromotionPolicy {
    /// Headroom a promotion leaves below the budget, in bytes: the budget may fall this much
    /// again without forcing a demotion.
    pub hysteresis_bytes: u64,
    /// Least time between a change and the next promotion.
    pub cooldown: Duration,
}

impl PromotionPolicy {
    /// 2% of `source_bytes` of headroom and a 30 s cooldown.
    pub fn for_source_bytes(source_bytes: u64) -> Self {
        PromotionPolicy {
            hysteresis_bytes: source_bytes / 50,
            cooldown: Duration::from_secs(30),
        }
    }
}

/// Whether a transition gives precision back or takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Tensors move to larger, more precise encodings.
    Promote,
    /// Tensors move to smaller encodings (the budget fell below the resident bytes).
    Demote,
}

/// One profile change the controller decided.
#[derive(Debug, Clone)]
pub struct Transition {
    /// Promotion or demotion.
    pub direction: Direction,
    /// The profile left.
    pub from: ProfileHash,
    /// The profile taken.
    pub profile: Profile,
    /// The tensors that change: for a promotion the most important first, for a demotion the
    /// least important first.
    pub changes: Vec<Change>,
    /// Resident weight bytes under the new profile (mapped linears and fixed weights).
    pub resident_bytes: u64,
}

/// A model's precision under a changing budget (see the module docs).
#[derive(Debug)]
pub struct PrecisionController {
    source: Arc<Model>,
    selector: Selector,
    /// Source encoding per mapped tensor (an assignment to it is no re-encoding).
    source_encodings: BTreeMap<String, String>,
    /// (tensor, encoding reached) → position of that demotion step in the order.
    rank: BTreeMap<(String, String), usize>,
    fixed: u64,
    policy: PromotionPolicy,
    current: Profile,
    last_change: Instant,
}

impl PrecisionController {
    /// The controller of `source` under `budget` bytes, from `map` (checked against the model as
    /// `--budget` checks it); its first profile is the selector's prefix for the budget, and the
    /// cooldown runs from `now`.
    pub fn new(
        source: &Arc<Model>,
        map: &ImportanceMap,
        budget: u64,
        policy: PromotionPolicy,
        now: Instant,
    ) -> Result<Self> {
        let mapped = crate::precision::mapped_bytes(source, map)?;
        let all = source.weight_bytes() as u64;
        let fixed = all - mapped.min(all);
        let selector = Selector::new(map, &Constraints::default())?;
        let rank = selector
            .demotion_order()
            .into_iter()
            .enumerate()
            .map(|(k, s)| ((s.item, s.to), k))
            .collect();
        let source_encodings = map
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.source_encoding.clone()))
            .collect();
        let mut c = PrecisionController {
            source: source.clone(),
            selector,
            source_encodings,
            rank,
            fixed,
            policy,
            current: Profile {
                assignments: BTreeMap::new(),
                total_bytes: 0,
                total_distortion: 0.0,
            },
            last_change: now,
        };
        c.current = c.select(budget)?;
        Ok(c)
    }

    /// The selector's profile for a whole-model budget (fixed weights taken off first).
    fn select(&self, budget: u64) -> Result<Profile> {
        let too_small = |minimum: u64| {
            RuntimeError::Selector(synapse_selector::SelectorError::BudgetTooSmall {
                budget,
                minimum,
            })
        };
        let linear = budget
            .checked_sub(self.fixed)
            .ok_or_else(|| too_small(self.fixed + self.selector.minimum_bytes()))?;
        self.selector.select(linear).map_err(|e| match e {
            synapse_selector::SelectorError::BudgetTooSmall { minimum, .. } => {
                too_small(minimum + self.fixed)
            }
            e => e.into(),
        })
    }

    /// The current profile.
    pub fn profile(&self) -> &Profile {
        &self.current
    }

    /// Resident weight bytes under the current profile.
    pub fn resident_bytes(&self) -> u64 {
        self.fixed + self.current.total_bytes
    }

    /// Resident weight bytes of the smallest profile the map allows (the least budget).
    pub fn minimum_bytes(&self) -> u64 {
        self.fixed + self.selector.minimum_bytes()
    }

    /// Resident weight bytes of the source (every tensor in its source encoding).
    pub fn maximum_bytes(&self) -> u64 {
        self.fixed + self.selector.maximum_bytes()
    }

    /// The policy.
    pub fn policy(&self) -> PromotionPolicy {
        self.policy
    }

    /// Answers a new budget at time `now`: a demotion at once when the current profile no
    /// longer fits, a promotion when the hysteresis and the cooldown allow one, else `None`.
    /// A budget below the smallest profile is an error and changes nothing.
    pub fn update(&mut self, budget: u64, now: Instant) -> Result<Option<Transition>> {
        if self.resident_bytes() > budget {
            let next = self.select(budget)?;
            return Ok(Some(self.take(next, Direction::Demote, now)));
        }
        if now.saturating_duration_since(self.last_change) < self.policy.cooldown {
            return Ok(None);
        }
        // The whole source fits: nothing to keep headroom for.
        let all = self.fixed + self.selector.maximum_bytes();
        let room = if budget >= all {
            all
        } else {
            budget.saturating_sub(self.policy.hysteresis_bytes)
        };
        let Ok(next) = self.select(room) else {
            return Ok(None);
        };
        if next.total_bytes <= self.current.total_bytes {
            return Ok(None);
        }
        Ok(Some(self.take(next, Direction::Promote, now)))
    }

    /// Makes `next` current and describes the change.
    fn take(&mut self, next: Profile, direction: Direction, now: Instant) -> Transition {
        let rank_of = |c: &Change, p: &Profile| {
            // A promotion undoes the step that brought the tensor to its old encoding; a
            // demotion applies the step that brings it to its new one.
            let enc = match direction {
                Direction::Promote => &self.current.assignments[&c.tensor].encoding,
                Direction::Demote => &p.assignments[&c.tensor].encoding,
            };
            self.rank
                .get(&(c.tensor.clone(), enc.clone()))
                .copied()
                .unwrap_or(0)
        };
        let mut changes = diff(&self.current, &next);
        changes.sort_by_key(|c| {
            let k = rank_of(c, &next) as i64;
            match direction {
                Direction::Promote => -k,
                Direction::Demote => k,
            }
        });
        debug_assert!(changes.iter().all(|c| match direction {
            Direction::Promote => c.kind == ChangeKind::Promotion,
            Direction::Demote => c.kind == ChangeKind::Demotion,
        }));
        let t = Transition {
            direction,
            from: self.current.hash(),
            resident_bytes: self.fixed + next.total_bytes,
            profile: next.clone(),
            changes,
        };
        self.current = next;
        self.last_change = now;
        t
    }

    /// [`PrecisionController::update`], and the transition's model (built through `cache`)
    /// installed in `engine` for the sessions admitted from now on. If building or installing
    /// fails, the controller keeps its profile and the error is returned.
    pub fn drive(
        &mut self,
        engine: &crate::engine::Engine,
        budget: u64,
        now: Instant,
        cache: Option<&VariantCache>,
    ) -> Result<Option<Transition>> {
        let saved = (self.current.clone(), self.last_change);
        let Some(t) = self.update(budget, now)? else {
            return Ok(None);
        };
        let installed = self
            .model(&t.profile, cache)
            .and_then(|(m, _)| engine.install(m));
        match installed {
            Ok(()) => Ok(Some(t)),
            Err(e) => {
                (self.current, self.last_change) = saved;
                Err(e)
            }
        }
    }

    /// The model that runs `profile` (a controller's current profile or a transition's):
    /// built from the source model, re-encoded tensors from `cache` when it holds them.
    pub fn model(
        &self,
        profile: &Profile,
        cache: Option<&VariantCache>,
    ) -> Result<(Arc<Model>, VariantStats)> {
        crate::precision::model_for_profile(
            &self.source,
            profile,
            |n| self.source_encodings.get(n),
            cache,
        )
    }
}

/// A running engine's precision under budgets that arrive while it serves (from an operator,
/// or a residency manager): the controller, the engine it installs into, the variant cache.
/// Shareable (`Send + Sync`); budgets are applied one at a time.
#[derive(Debug)]
pub struct BudgetDriver {
    controller: std::sync::Mutex<PrecisionController>,
    engine: Arc<crate::engine::Engine>,
    cache: Option<VariantCache>,
    source_bytes: u64,
    /// Set while a [`MemoryFollower`] drives the budget.
    follow: std::sync::Mutex<Option<FollowStatus>>,
}

impl BudgetDriver {
    /// Drives `engine` (started on `controller`'s current profile) with `controller`.
    pub fn new(
        controller: PrecisionController,
        engine: Arc<crate::engine::Engine>,
        cache: Option<VariantCache>,
    ) -> Self {
        let source_bytes = controller.source.weight_bytes() as u64;
        BudgetDriver {
            controller: std::sync::Mutex::new(controller),
            engine,
            cache,
            source_bytes,
            follow: std::sync::Mutex::new(None),
        }
    }

    /// The controller, locked.
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, PrecisionController>> {
        self.controller
            .lock()
            .map_err(|_| RuntimeError::InvalidParam {
                name: "budget",
                reason: "a previous budget change panicked".into(),
            })
    }

    /// Resident weight bytes of the smallest profile and of the source.
    pub fn bounds(&self) -> Result<(u64, u64)> {
        let c = self.lock()?;
        Ok((c.minimum_bytes(), c.maximum_bytes()))
    }

    /// What the memory follower last saw and did; `None` when no follower drives the budget.
    pub fn following(&self) -> Option<FollowStatus> {
        self.follow.lock().ok().and_then(|f| f.clone())
    }

    fn follow_status(&self) -> FollowStatus {
        self.following().unwrap_or_default()
    }

    fn set_follow_status(&self, st: FollowStatus) {
        if let Ok(mut f) = self.follow.lock() {
            *f = Some(st);
        }
    }

    /// The source model's weight bytes (what a percentage budget is a share of).
    pub fn source_bytes(&self) -> u64 {
        self.source_bytes
    }

    /// Applies a new budget now (see [`PrecisionController::drive`]); blocks while a new
    /// profile is built (seconds when its tensors are not in the variant cache).
    pub fn set_budget(&self, budget: crate::precision::Budget) -> Result<Option<Transition>> {
        let bytes = budget.bytes(self.source_bytes);
        let mut c = self.lock()?;
        c.drive(&self.engine, bytes, Instant::now(), self.cache.as_ref())
    }
}
