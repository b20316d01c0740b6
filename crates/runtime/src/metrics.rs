//! redrive's Prometheus metrics (a contract), recorded through the `metrics` facade. Install a
//! recorder (e.g. `metrics_exporter_prometheus`) to see them; without one they cost next to
//! nothing.

use std::time::Duration;

use redrive_policy::BreakerState;
use redrive_store::{QueueCount, Store};

/// `redrive_attempts_total{queue,kind,class}`: every call to a handler.
pub const ATTEMPTS_TOTAL: &str = "redrive_attempts_total";
/// `redrive_jobs_finished_total{queue,kind,state,reason}`: jobs that succeeded or died.
pub const JOBS_FINISHED_TOTAL: &str = "redrive_jobs_finished_total";
/// `redrive_retry_delay_seconds{mode}`: delays chosen after a failure (`retry` or `defer`).
pub const RETRY_DELAY_SECONDS: &str = "redrive_retry_delay_seconds";
/// `redrive_breaker_state{dependency}`: 0 closed, 1 open, 2 half-open.
pub const BREAKER_STATE: &str = "redrive_breaker_state";
/// `redrive_breaker_transitions_total{dependency,from,to}`.
pub const BREAKER_TRANSITIONS_TOTAL: &str = "redrive_breaker_transitions_total";
/// `redrive_jobs{queue,state}`: jobs per queue and state, fleet-wide (from the store).
pub const JOBS: &str = "redrive_jobs";
/// `redrive_job_duration_seconds{queue,kind}`: how long one attempt's handler ran.
pub const JOB_DURATION_SECONDS: &str = "redrive_job_duration_seconds";
/// `redrive_dependency_rate_limit{dependency}`: the rate limit in force toward a dependency,
/// requests per second, configured or learned from 429s (0: none in force).
pub const DEPENDENCY_RATE_LIMIT: &str = "redrive_dependency_rate_limit";
/// `redrive_lease_lost_total`: claims whose lease was lost (nothing written).
pub const LEASE_LOST_TOTAL: &str = "redrive_lease_lost_total";
/// `redrive_pruned_total{state}`: finished jobs deleted by retention (`succeeded`,
/// `cancelled`, `dead`), their attempts with them.
pub const PRUNED_TOTAL: &str = "redrive_pruned_total";
/// `redrive_scheduled_jobs_total{schedule}`: jobs enqueued by a schedule's ticks (one per
/// tick fleet-wide; counted by the process that made it).
pub const SCHEDULED_JOBS_TOTAL: &str = "redrive_scheduled_jobs_total";

pub(crate) fn pruned(state: &'static str, jobs: u64) {
    metrics::counter!(PRUNED_TOTAL, "state" => state).increment(jobs);
}

pub(crate) fn scheduled(schedule: &str) {
    metrics::counter!(SCHEDULED_JOBS_TOTAL, "schedule" => schedule.to_owned()).increment(1);
}

pub(crate) fn attempt(queue: &str, kind: &str, class: &str, took: Duration) {
    metrics::counter!(ATTEMPTS_TOTAL, "queue" => queue.to_owned(), "kind" => kind.to_owned(),
        "class" => class.to_owned())
    .increment(1);
    metrics::histogram!(JOB_DURATION_SECONDS, "queue" => queue.to_owned(), "kind" => kind.to_owned())
        .record(took.as_secs_f64());
}

pub(crate) fn finished(queue: &str, kind: &str, state: &str, reason: &str) {
    metrics::counter!(JOBS_FINISHED_TOTAL, "queue" => queue.to_owned(), "kind" => kind.to_owned(),
        "state" => state.to_owned(), "reason" => reason.to_owned())
    .increment(1);
}

pub(crate) fn delay(mode: &'static str, d: Duration) {
    metrics::histogram!(RETRY_DELAY_SECONDS, "mode" => mode).record(d.as_secs_f64());
}

pub(crate) fn lease_lost() {
    metrics::counter!(LEASE_LOST_TOTAL).increment(1);
}

pub(crate) fn breaker(dependency: &str, from: BreakerState, to: BreakerState) {
    metrics::counter!(BREAKER_TRANSITIONS_TOTAL, "dependency" => dependency.to_owned(),
        "from" => from.as_str(), "to" => to.as_str())
    .increment(1);
    breaker_state(dependency, to);
}

pub(crate) fn rate_limit(dependency: &str, rps: Option<f64>) {
    metrics::gauge!(DEPENDENCY_RATE_LIMIT, "dependency" => dependency.to_owned())
        .set(rps.unwrap_or(0.0));
}

pub(crate) fn breaker_state(dependency: &str, state: BreakerState) {
    metrics::gauge!(BREAKER_STATE, "dependency" => dependency.to_owned()).set(state.gauge());
}

/// Sets `redrive_jobs{queue,state}` from the store's counts (every state of every queue that
/// has jobs; states that emptied are set to 0).
pub async fn publish_counts(store: &Store) -> Result<Vec<QueueCount>, redrive_store::StoreError> {
    let counts = store.counts().await?;
    let mut queues: Vec<&str> = counts.iter().map(|c| c.queue.as_str()).collect();
    queues.dedup();
    for q in queues {
        for state in redrive_store::JobState::ALL {
            let n = counts
                .iter()
                .find(|c| c.queue == q && c.state == state)
                .map_or(0, |c| c.count);
            metrics::gauge!(JOBS, "queue" => q.to_owned(), "state" => state.as_str()).set(n as f64);
        }
    }
    Ok(counts)
}

// ----- card declines (issue 18) -----

/// `redrive_declines_total{dependency,network,category}`: card declines returned by handlers;
/// `category` is Visa's decline category (`1`–`4`), else `mac_NN` for a Mastercard Merchant
/// Advice Code, else `none`.
pub const DECLINES_TOTAL: &str = "redrive_declines_total";
/// `redrive_reattempts_blocked_total{reason}`: authorisations not sent because the card
/// networks' rules forbid them now: `quota` (the card's reattempt quota is used up),
/// `advice_wait` (a Merchant Advice Code's wait has not passed), `do_not_retry` (a decline
/// that must never be reattempted).
pub const REATTEMPTS_BLOCKED_TOTAL: &str = "redrive_reattempts_blocked_total";

pub(crate) fn declined(dependency: &str, network: &str, category: String) {
    metrics::counter!(DECLINES_TOTAL, "dependency" => dependency.to_owned(),
        "network" => network.to_owned(), "category" => category)
    .increment(1);
}

pub(crate) fn reattempt_blocked(reason: &'static str) {
    metrics::counter!(REATTEMPTS_BLOCKED_TOTAL, "reason" => reason).increment(1);
}
