//! `/metrics`: Prometheus text.
//!
//! Gauges and engine-wide counters are read from [`Engine::stats`] at scrape time (the
//! engine is the truth for queue depth, active sessions, token counts, KV use and prefix-cache
//! hits); the server itself records what only it sees: time to first token, inter-token
//! latency, HTTP responses and the requests it refused. One recorder per process (the
//! `metrics` facade is global); every server in the process shares it.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use synapse_runtime::engine::{EngineInfo, EngineStats};

/// Time from request to first generated token, seconds.
pub const TTFT: &str = "synapse_time_to_first_token_seconds";
/// Time between consecutive generated tokens of one session, seconds.
pub const ITL: &str = "synapse_inter_token_latency_seconds";
/// End-to-end request latency, seconds.
pub const REQUEST_LATENCY: &str = "synapse_request_duration_seconds";
/// Requests refused by the server (label `reason`).
pub const REJECTED: &str = "synapse_server_rejected_requests_total";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's Prometheus handle (installs the recorder on first use).
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let ttft = [
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ];
            let itl = [
                0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
            ];
            let latency = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
            let builder = PrometheusBuilder::new();
            let builder = builder
                .set_buckets_for_metric(Matcher::Full(TTFT.into()), &ttft)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(ITL.into()), &itl))
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(REQUEST_LATENCY.into()), &latency)
                })
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics stays empty");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    metrics::describe_histogram!(TTFT, metrics::Unit::Seconds, "Time to first token");
    metrics::describe_histogram!(ITL, metrics::Unit::Seconds, "Inter-token latency");
    metrics::describe_histogram!(
        REQUEST_LATENCY,
        metrics::Unit::Seconds,
        "Generation request latency"
    );
    metrics::describe_counter!(REJECTED, "Requests the server refused");
}

/// Records the time to a session's first token.
pub fn first_token(d: Duration) {
    metrics::histogram!(TTFT).record(d.as_secs_f64());
}

/// Records the gap between two tokens of a session.
pub fn inter_token(d: Duration) {
    metrics::histogram!(ITL).record(d.as_secs_f64());
}

/// Records a finished generation request.
pub fn request_done(route: &'static str, d: Duration) {
    metrics::histogram!(REQUEST_LATENCY, "route" => route).record(d.as_secs_f64());
}

/// Counts a refused request.
pub fn rejected(reason: &'static str) {
    metrics::counter!(REJECTED, "reason" => reason).increment(1);
}

/// Renders the Prometheus text with the engine's current numbers and its precision (resident
/// weight bytes, and the profile hash as an info-style gauge: `…{profile="<hash>"} 1`), and
/// under `--budget free` what the memory follower last read and set.
pub fn render(
    stats: &EngineStats,
    info: &EngineInfo,
    follow: Option<&synapse_runtime::promotion::FollowStatus>,
) -> String {
    use metrics::{counter, gauge};
    gauge!("synapse_weight_bytes").set(info.weight_bytes as f64);
    if let Some(f) = follow {
        gauge!("synapse_memory_free_bytes").set(f.free as f64);
        gauge!("synapse_precision_budget_bytes").set(f.budget as f64);
        gauge!("synapse_precision_budget_pressed").set(u8::from(f.pressed) as f64);
        counter!("synapse_memory_readings_total").absolute(f.readings);
        counter!("synapse_precision_follow_changes_total").absolute(f.changes);
    }
    gauge!("synapse_precision_profile_info", "profile" => info.profile.clone()).set(1.0);
    gauge!("synapse_queue_depth").set(stats.queued as f64);
    gauge!("synapse_active_sessions").set(stats.active as f64);
    gauge!("synapse_slots").set(stats.slots as f64);
    gauge!("synapse_kv_bytes").set(stats.kv_bytes as f64);
    gauge!("synapse_kv_budget_bytes").set(stats.kv_budget_bytes as f64);
    let kv_use = if stats.kv_budget_bytes > 0 {
        stats.kv_bytes as f64 / stats.kv_budget_bytes as f64
    } else {
        0.0
    };
    gauge!("synapse_kv_usage_ratio").set(kv_use);
    counter!("synapse_requests_total").absolute(stats.requests);
    counter!("synapse_rejected_requests_total").absolute(stats.rejected);
    counter!("synapse_cancelled_sessions_total").absolute(stats.cancelled);
    counter!("synapse_prompt_tokens_total").absolute(stats.prompt_tokens);
    counter!("synapse_prefix_cache_hit_tokens_total").absolute(stats.prefix_hit_tokens);
    counter!("synapse_generated_tokens_total").absolute(stats.generated_tokens);
    counter!("synapse_engine_steps_total").absolute(stats.steps);
    counter!("synapse_draft_tokens_total").absolute(stats.drafted);
    counter!("synapse_draft_accepted_tokens_total").absolute(stats.draft_accepted);
    if stats.drafted > 0 {
        gauge!("synapse_draft_acceptance").set(stats.draft_acceptance_ppm as f64 / 1e6);
    }
    gauge!("synapse_draft_shortlist_tokens").set(stats.draft_shortlist as f64);
    counter!("synapse_expert_hits_total").absolute(stats.expert_hits);
    counter!("synapse_expert_misses_total").absolute(stats.expert_misses);
    counter!("synapse_expert_evictions_total").absolute(stats.expert_evictions);
    counter!("synapse_expert_paged_in_bytes_total").absolute(stats.expert_bytes_in);
    counter!("synapse_expert_prefetches_total").absolute(stats.expert_prefetches);
    counter!("synapse_expert_predicted_total").absolute(stats.expert_predicted);
    counter!("synapse_expert_predicted_used_total").absolute(stats.expert_predicted_used);
    counter!("synapse_expert_bypassed_total").absolute(stats.expert_bypassed);
    counter!("synapse_block_hits_total").absolute(stats.block_hits);
    counter!("synapse_block_misses_total").absolute(stats.block_misses);
    counter!("synapse_block_evictions_total").absolute(stats.block_evictions);
    counter!("synapse_block_paged_in_bytes_total").absolute(stats.block_bytes_in);
    gauge!("synapse_process_resident_bytes").set(proc_status_bytes("VmRSS:") as f64);
    gauge!("synapse_process_peak_resident_bytes").set(proc_status_bytes("VmHWM:") as f64);
    let h = handle();
    h.run_upkeep();
    h.render()
}

/// A byte count of this process's `/proc/self/status` (`VmRSS:`, `VmHWM:`, …); 0 where the
/// file or the field is absent (not Linux).
pub fn proc_status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}
