//! Counters and gauges the engine publishes (read by `/metrics` and tests).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::api::EngineStats;

/// The engine's live counters, updated by the scheduler thread, read by anyone.
#[derive(Debug, Default)]
pub(crate) struct SharedStats {
    /// Submitted, not yet admitted or dropped (in the channel or the wait queue).
    pub pending: AtomicU64,
    pub waiting: AtomicU64,
    pub active: AtomicU64,
    pub slots: AtomicU64,
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub steps: AtomicU64,
    pub kv_bytes: AtomicU64,
    pub kv_budget_bytes: AtomicU64,
    /// The precision profile new sessions get, and its resident weight bytes.
    pub profile: Mutex<String>,
    pub weight_bytes: AtomicU64,
    pub profile_changes: AtomicU64,
    /// Profiles left that sessions still run on.
    pub retired_profiles: AtomicU64,
    pub drafted: AtomicU64,
    pub draft_accepted: AtomicU64,
    pub draft_acceptance_ppm: AtomicU64,
    pub draft_shortlist: AtomicU64,
    pub expert_hits: AtomicU64,
    pub expert_misses: AtomicU64,
    pub expert_evictions: AtomicU64,
    pub expert_bytes_in: AtomicU64,
    pub expert_prefetches: AtomicU64,
    pub expert_predicted: AtomicU64,
    pub expert_predicted_used: AtomicU64,
    pub expert_bypassed: AtomicU64,
    pub block_hits: AtomicU64,
    pub block_misses: AtomicU64,
    pub block_evictions: AtomicU64,
    pub block_bytes_in: AtomicU64,
}

impl SharedStats {
    /// Publishes the profile new sessions run on.
    pub fn set_profile(&self, hash: &str, weight_bytes: u64) {
        if let Ok(mut p) = self.profile.lock() {
            hash.clone_into(&mut p);
        }
        self.weight_bytes.store(weight_bytes, Ordering::Relaxed);
    }

    /// The profile new sessions run on, and its weight bytes.
    pub fn profile(&self) -> (String, u64) {
        let p = self.profile.lock().map(|p| p.clone()).unwrap_or_default();
        (p, self.weight_bytes.load(Ordering::Relaxed))
    }

    pub fn snapshot(&self) -> EngineStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EngineStats {
            queued: g(&self.pending) as usize,
            active: g(&self.active) as usize,
            slots: g(&self.slots) as usize,
            requests: g(&self.requests),
            rejected: g(&self.rejected),
            cancelled: g(&self.cancelled),
            prompt_tokens: g(&self.prompt_tokens),
            prefix_hit_tokens: g(&self.prefix_hit_tokens),
            generated_tokens: g(&self.generated_tokens),
            steps: g(&self.steps),
            kv_bytes: g(&self.kv_bytes),
            kv_budget_bytes: g(&self.kv_budget_bytes),
            profile_changes: g(&self.profile_changes),
            retired_profiles: g(&self.retired_profiles),
            drafted: g(&self.drafted),
            draft_accepted: g(&self.draft_accepted),
            draft_acceptance_ppm: g(&self.draft_acceptance_ppm),
            draft_shortlist: g(&self.draft_shortlist),
            expert_hits: g(&self.expert_hits),
            expert_misses: g(&self.expert_misses),
            expert_evictions: g(&self.expert_evictions),
            expert_bytes_in: g(&self.expert_bytes_in),
            expert_prefetches: g(&self.expert_prefetches),
            expert_predicted: g(&self.expert_predicted),
            expert_predicted_used: g(&self.expert_predicted_used),
            expert_bypassed: g(&self.expert_bypassed),
            block_hits: g(&self.block_hits),
            block_misses: g(&self.block_misses),
            block_evictions: g(&self.block_evictions),
            block_bytes_in: g(&self.block_bytes_in),
        }
    }
}
