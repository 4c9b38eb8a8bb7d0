//! Counters and gauges the engine publishes (read by `/metrics` and tests).

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
}

impl SharedStats {
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
        }
    }
}
