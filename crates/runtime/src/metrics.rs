//! redrive's Prometheus metrics (a contract), recorded through the `metrics` facade. Install a
//! recorder (e.g. `metrics_exporter_prometheus`) to see them; without one they cost next to
//! nothing.
//!
//! For a Prometheus that aggregates a fleet, build the exporter with [`prometheus_builder`]
//! (every duration is a histogram with explicit buckets, never a summary) and call
//! [`describe`] once the recorder is installed (a `# HELP` line for every metric). The gauges
//! that need the database ([`JOBS`], [`OLDEST_AVAILABLE_SECONDS`]) are set by one background
//! task ([`spawn_gauges`], or the worker's own loop), never by a scrape.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
use redrive_policy::{FailureClass, Timestamp};
use tokio_util::sync::CancellationToken;

use redrive_policy::BreakerState;
use redrive_store::labels::{dependency_label, queue_label};
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

/// `redrive_queue_latency_seconds{queue}` (histogram): how long a job waited from its due
/// time (`run_at`) until a worker started it.
pub const QUEUE_LATENCY_SECONDS: &str = "redrive_queue_latency_seconds";
/// `redrive_oldest_available_seconds{queue}`: the age of the oldest job due and not yet
/// started, per queue that is not paused (0: none waiting), from the store.
pub const OLDEST_AVAILABLE_SECONDS: &str = "redrive_oldest_available_seconds";
/// `redrive_dependency_inflight{dependency}`: calls to the dependency running now in this
/// process (sum over the fleet in Prometheus).
pub const DEPENDENCY_INFLIGHT: &str = "redrive_dependency_inflight";
/// `redrive_jobs_rescued_total{queue}`: jobs whose lease expired and that this process handed
/// back to the queue (or ended as `lease_expired`).
pub const JOBS_RESCUED_TOTAL: &str = "redrive_jobs_rescued_total";
/// `redrive_enqueued_total{queue,kind}`: jobs created by this process's enqueues (a repeat of
/// an idempotency key that returns the existing job is not counted). Counted by the store.
pub const ENQUEUED_TOTAL: &str = redrive_store::ENQUEUED_TOTAL;

/// Buckets of [`JOB_DURATION_SECONDS`]: an attempt's handler, 5 ms to a minute.
pub const ATTEMPT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets of [`RETRY_DELAY_SECONDS`]: a retry in process (under a second) to a defer of a day.
pub const RETRY_DELAY_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0,
];
/// Buckets of [`QUEUE_LATENCY_SECONDS`]: a few milliseconds (idle workers) to an hour (backlog).
pub const QUEUE_LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Every metric of the contract: name, kind and help text ([`describe`] registers them).
pub const ALL: &[(&str, Kind, &str)] = &[
    (
        ATTEMPTS_TOTAL,
        Kind::Counter,
        "Handler calls (attempts) by queue, kind and outcome class.",
    ),
    (
        JOBS_FINISHED_TOTAL,
        Kind::Counter,
        "Jobs that succeeded or died, by queue, kind, state and dead reason.",
    ),
    (
        RETRY_DELAY_SECONDS,
        Kind::Histogram,
        "Delays chosen after a failure: mode=retry (waited in process) or mode=defer (handed back to the queue).",
    ),
    (
        BREAKER_STATE,
        Kind::Gauge,
        "Circuit breaker state per dependency: 0 closed, 1 open, 2 half-open.",
    ),
    (
        BREAKER_TRANSITIONS_TOTAL,
        Kind::Counter,
        "Circuit breaker transitions per dependency, from one state to another.",
    ),
    (
        JOBS,
        Kind::Gauge,
        "Jobs per queue and state, fleet-wide, read from the store by one background task.",
    ),
    (
        JOB_DURATION_SECONDS,
        Kind::Histogram,
        "How long one attempt's handler ran, by queue and kind.",
    ),
    (
        DEPENDENCY_RATE_LIMIT,
        Kind::Gauge,
        "Rate limit in force toward a dependency in requests per second, configured or learned from 429s (0: none).",
    ),
    (
        LEASE_LOST_TOTAL,
        Kind::Counter,
        "Claims whose lease was lost before their result was written (nothing written).",
    ),
    (
        PRUNED_TOTAL,
        Kind::Counter,
        "Finished jobs deleted by retention, by state.",
    ),
    (
        SCHEDULED_JOBS_TOTAL,
        Kind::Counter,
        "Jobs enqueued by a schedule's ticks.",
    ),
    (
        QUEUE_LATENCY_SECONDS,
        Kind::Histogram,
        "How long a job waited from its due time until a worker started it, by queue.",
    ),
    (
        OLDEST_AVAILABLE_SECONDS,
        Kind::Gauge,
        "Age in seconds of the oldest job due and not yet started, per queue (0: none waiting).",
    ),
    (
        DEPENDENCY_INFLIGHT,
        Kind::Gauge,
        "Calls to a dependency running now in this process.",
    ),
    (
        JOBS_RESCUED_TOTAL,
        Kind::Counter,
        "Jobs whose lease expired (their worker stopped heartbeating) handed back by this process, by queue.",
    ),
    (
        ENQUEUED_TOTAL,
        Kind::Counter,
        "Jobs created by this process's enqueues, by queue and kind.",
    ),
    (
        DECLINES_TOTAL,
        Kind::Counter,
        "Card declines returned by handlers, by dependency, network and category (Visa 1-4, mac_NN, none).",
    ),
    (
        REATTEMPTS_BLOCKED_TOTAL,
        Kind::Counter,
        "Authorisations not sent because the card networks' rules forbid them now, by reason (quota, advice_wait, do_not_retry, card_stop).",
    ),
];

/// What kind of metric a contract name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// Set to a value.
    Gauge,
    /// Observations in buckets (`_bucket`, `_sum`, `_count`).
    Histogram,
}

/// A Prometheus exporter builder with redrive's histogram buckets ([`ATTEMPT_BUCKETS`],
/// [`RETRY_DELAY_BUCKETS`], [`QUEUE_LATENCY_BUCKETS`]): histograms aggregate over a fleet,
/// summaries do not. Add a listener or install it as you need, then call [`describe`].
pub fn prometheus_builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(JOB_DURATION_SECONDS.into()), ATTEMPT_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(RETRY_DELAY_SECONDS.into()),
            RETRY_DELAY_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(QUEUE_LATENCY_SECONDS.into()),
            QUEUE_LATENCY_BUCKETS,
        )
}

/// Registers the help text of every metric with the installed recorder (a `# HELP` line each
/// once it has a value), and starts the counters without labels at 0.
pub fn describe() {
    for &(name, kind, help) in ALL {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => metrics::describe_histogram!(name, help),
        }
    }
    metrics::counter!(LEASE_LOST_TOTAL).increment(0);
}

/// Starts the per-queue counters of `queues` at 0, so that a rate over them is defined before
/// their first event (Prometheus cannot tell a missing series from a quiet one).
pub fn start_queues(queues: &[String]) {
    for q in queues {
        metrics::counter!(JOBS_RESCUED_TOTAL, "queue" => queue_label(q)).increment(0);
    }
}

/// The metric handles of one queue and kind, taken from the recorder once per run (each at
/// its first use, so that a series appears when it has a value, as before) and shared by
/// the run's jobs of that queue and kind: a job's metrics then cost no label strings and no
/// lookup in the recorder's registry (they were both, on every job). A recorder installed
/// after a run started is seen by the next run.
#[derive(Debug)]
pub(crate) struct JobMetrics {
    queue: String,
    /// The queue's label ([`queue_label`]: itself, or `other` beyond the cap).
    label: String,
    kind: String,
    queue_latency: OnceLock<metrics::Histogram>,
    duration: OnceLock<metrics::Histogram>,
    succeeded: OnceLock<metrics::Counter>,
    /// `redrive_attempts_total` by failure class.
    attempts: [OnceLock<metrics::Counter>; FailureClass::ALL.len()],
}

impl JobMetrics {
    /// The handles of `queue` and `kind`, none taken yet.
    pub(crate) fn new(queue: &str, kind: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            label: queue_label(queue),
            kind: kind.to_owned(),
            queue_latency: OnceLock::new(),
            duration: OnceLock::new(),
            succeeded: OnceLock::new(),
            attempts: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Whether these are the handles of `queue` and `kind`.
    pub(crate) fn is_for(&self, queue: &str, kind: &str) -> bool {
        self.queue == queue && self.kind == kind
    }

    /// From the job's due time to its start.
    pub(crate) fn queue_latency(&self, waited: Duration) {
        (self.queue_latency)
            .get_or_init(
                || metrics::histogram!(QUEUE_LATENCY_SECONDS, "queue" => self.label.clone()),
            )
            .record(waited.as_secs_f64());
    }

    /// An attempt of `class` that took `took`.
    pub(crate) fn attempt(&self, class: FailureClass, took: Duration) {
        let (q, k) = (&self.label, &self.kind);
        let i = FailureClass::ALL
            .iter()
            .position(|c| *c == class)
            .unwrap_or(0);
        self.attempts[i]
            .get_or_init(|| {
                metrics::counter!(ATTEMPTS_TOTAL, "queue" => q.clone(), "kind" => k.clone(),
                    "class" => class.as_str())
            })
            .increment(1);
        (self.duration)
            .get_or_init(|| metrics::histogram!(JOB_DURATION_SECONDS, "queue" => q.clone(), "kind" => k.clone()))
            .record(took.as_secs_f64());
    }

    /// A job that succeeded.
    pub(crate) fn succeeded(&self) {
        let (q, k) = (&self.label, &self.kind);
        (self.succeeded)
            .get_or_init(|| {
                metrics::counter!(JOBS_FINISHED_TOTAL, "queue" => q.clone(), "kind" => k.clone(),
                    "state" => "succeeded", "reason" => "")
            })
            .increment(1);
    }

    /// A job that died for `reason` (rare: no handle kept).
    pub(crate) fn dead(&self, reason: &str) {
        finished(&self.queue, &self.kind, "dead", reason);
    }
}

/// The [`JobMetrics`] of the queues and kinds a run has claimed so far (the last one looked
/// up comes back without a lookup: a claim's jobs are mostly of one queue and kind).
#[derive(Debug, Default)]
pub(crate) struct JobMetricsCache {
    by_queue: HashMap<String, HashMap<String, Arc<JobMetrics>>>,
    last: Option<Arc<JobMetrics>>,
}

impl JobMetricsCache {
    /// The handles of `queue` and `kind`, taken from the recorder the first time.
    pub(crate) fn get(&mut self, queue: &str, kind: &str) -> Arc<JobMetrics> {
        if let Some(m) = self.last.as_ref().filter(|m| m.is_for(queue, kind)) {
            return m.clone();
        }
        let kinds = match self.by_queue.get_mut(queue) {
            Some(k) => k,
            None => self.by_queue.entry(queue.to_owned()).or_default(),
        };
        let m = match kinds.get(kind) {
            Some(m) => m.clone(),
            None => {
                let m = Arc::new(JobMetrics::new(queue, kind));
                kinds.insert(kind.to_owned(), m.clone());
                m
            }
        };
        self.last = Some(m.clone());
        m
    }
}

pub(crate) fn rescued(queue: &str) {
    metrics::counter!(JOBS_RESCUED_TOTAL, "queue" => queue_label(queue)).increment(1);
}

/// Counts a call to `dependency` in flight while it lives.
#[derive(Debug)]
pub(crate) struct Inflight(metrics::Gauge);

impl Inflight {
    pub(crate) fn start(dependency: &str) -> Self {
        let g = metrics::gauge!(DEPENDENCY_INFLIGHT, "dependency" => dependency_label(dependency));
        g.increment(1.0);
        Self(g)
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

pub(crate) fn pruned(state: &'static str, jobs: u64) {
    metrics::counter!(PRUNED_TOTAL, "state" => state).increment(jobs);
}

pub(crate) fn scheduled(schedule: &str) {
    metrics::counter!(SCHEDULED_JOBS_TOTAL, "schedule" => schedule.to_owned()).increment(1);
}

pub(crate) fn finished(queue: &str, kind: &str, state: &str, reason: &str) {
    metrics::counter!(JOBS_FINISHED_TOTAL, "queue" => queue_label(queue), "kind" => kind.to_owned(),
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
    metrics::counter!(BREAKER_TRANSITIONS_TOTAL, "dependency" => dependency_label(dependency),
        "from" => from.as_str(), "to" => to.as_str())
    .increment(1);
    breaker_state(dependency, to);
}

pub(crate) fn rate_limit(dependency: &str, rps: Option<f64>) {
    metrics::gauge!(DEPENDENCY_RATE_LIMIT, "dependency" => dependency_label(dependency))
        .set(rps.unwrap_or(0.0));
}

pub(crate) fn breaker_state(dependency: &str, state: BreakerState) {
    metrics::gauge!(BREAKER_STATE, "dependency" => dependency_label(dependency)).set(state.gauge());
}

/// The queue labels this process has published gauges for: a queue that emptied (or was
/// pruned away) is set to 0 rather than left at its last value. Bounded by the label cap.
static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The store's counts by queue label: the busiest queues are offered a label of their own
/// first ([`queue_label`]), and every queue beyond the cap is summed into `other`.
fn counts_by_label(counts: &[QueueCount]) -> BTreeMap<String, BTreeMap<&'static str, u64>> {
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for c in counts {
        *totals.entry(c.queue.as_str()).or_default() += c.count;
    }
    let mut busiest: Vec<(&str, u64)> = totals.into_iter().collect();
    busiest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let labels: BTreeMap<&str, String> =
        busiest.iter().map(|(q, _)| (*q, queue_label(q))).collect();
    let mut out: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    for c in counts {
        let label = labels[c.queue.as_str()].clone();
        *out.entry(label)
            .or_default()
            .entry(c.state.as_str())
            .or_default() += c.count;
    }
    out
}

/// Sets `redrive_jobs{queue,state}` from the store's counts (every state of every queue label
/// seen so far; states and queues that emptied are set to 0; queues beyond the label cap are
/// summed under `other`).
pub async fn publish_counts(store: &Store) -> Result<Vec<QueueCount>, redrive_store::StoreError> {
    let counts = store.counts().await?;
    let by_label = counts_by_label(&counts);
    let queues: Vec<String> = {
        let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        seen.extend(by_label.keys().cloned());
        seen.iter().cloned().collect()
    };
    for q in &queues {
        let states = by_label.get(q);
        for state in redrive_store::JobState::ALL {
            let n = states
                .and_then(|s| s.get(state.as_str()))
                .copied()
                .unwrap_or(0);
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
/// that must never be reattempted), `card_stop` (another job's decline stopped the card key).
pub const REATTEMPTS_BLOCKED_TOTAL: &str = "redrive_reattempts_blocked_total";

pub(crate) fn declined(dependency: &str, network: &str, category: String) {
    metrics::counter!(DECLINES_TOTAL, "dependency" => dependency_label(dependency),
        "network" => network.to_owned(), "category" => category)
    .increment(1);
}

pub(crate) fn reattempt_blocked(reason: &'static str) {
    metrics::counter!(REATTEMPTS_BLOCKED_TOTAL, "reason" => reason).increment(1);
}
/// Every gauge that needs the database: [`publish_counts`], then
/// `redrive_oldest_available_seconds{queue}` (0 for a queue seen with nothing waiting). Two
/// queries; call it from one task at an interval ([`spawn_gauges`]), never per scrape.
pub async fn publish_gauges(
    store: &Store,
    now: Timestamp,
) -> Result<Vec<QueueCount>, redrive_store::StoreError> {
    let counts = publish_counts(store).await?;
    let oldest = store.oldest_due(now).await?;
    let queues: Vec<String> = SEEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    // The oldest of a label's queues (`other`: of every queue beyond the cap).
    let mut ages: BTreeMap<String, f64> = BTreeMap::new();
    for (name, t) in &oldest {
        let age = (now - *t).num_milliseconds().max(0) as f64 / 1000.0;
        let e = ages.entry(queue_label(name)).or_default();
        *e = e.max(age);
    }
    for q in queues {
        let age = ages.get(&q).copied().unwrap_or(0.0);
        metrics::gauge!(OLDEST_AVAILABLE_SECONDS, "queue" => q).set(age);
    }
    Ok(counts)
}

/// The one background task that refreshes the database gauges ([`publish_gauges`]) every
/// `every` until `stop`; a failed refresh is logged and tried again at the next tick.
pub fn spawn_gauges(
    store: Store,
    every: Duration,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let every = every.max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = publish_gauges(&store, chrono::Utc::now()).await {
                tracing::warn!("refreshing the database gauges failed: {e}");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use metrics_exporter_prometheus::PrometheusRecorder;

    use super::*;

    /// A Prometheus recorder that counts the handles asked of it.
    struct Counting(PrometheusRecorder, AtomicUsize);

    impl Recorder for Counting {
        fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
            self.0.describe_counter(k, u, d);
        }
        fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
            self.0.describe_gauge(k, u, d);
        }
        fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
            self.0.describe_histogram(k, u, d);
        }
        fn register_counter(&self, k: &Key, m: &Metadata<'_>) -> Counter {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.register_counter(k, m)
        }
        fn register_gauge(&self, k: &Key, m: &Metadata<'_>) -> Gauge {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.register_gauge(k, m)
        }
        fn register_histogram(&self, k: &Key, m: &Metadata<'_>) -> Histogram {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.register_histogram(k, m)
        }
    }

    /// A run's jobs of one queue and kind share their handles: 300 jobs ask the recorder for
    /// five (one per series), and every job still counts, under its own labels.
    #[test]
    fn a_runs_jobs_take_their_metric_handles_once_per_series() {
        let prom = prometheus_builder().unwrap().build_recorder();
        let handle = prom.handle();
        let rec = Counting(prom, AtomicUsize::new(0));
        metrics::with_local_recorder(&rec, || {
            let mut cache = JobMetricsCache::default();
            for i in 0..300 {
                let (queue, kind) = if i % 3 == 0 {
                    ("payouts", "refund")
                } else {
                    ("payments", "charge")
                };
                let m = cache.get(queue, kind);
                m.queue_latency(Duration::from_millis(5));
                let class = if i == 7 {
                    FailureClass::Timeout
                } else {
                    FailureClass::Success
                };
                m.attempt(class, Duration::from_millis(2));
                m.succeeded();
            }
            assert!(Arc::ptr_eq(
                &cache.get("payments", "charge"),
                &cache.get("payments", "charge")
            ));
            assert!(!Arc::ptr_eq(
                &cache.get("payments", "charge"),
                &cache.get("payments", "refund")
            ));
        });
        // Per queue and kind: latency, duration, attempts(success), finished; and one
        // attempts(timeout) for payments/charge.
        assert_eq!(rec.1.load(Ordering::SeqCst), 9, "handles taken");
        let text = handle.render();
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .to_owned()
        };
        assert!(line(r#"redrive_jobs_finished_total{queue="payments",kind="charge",state="succeeded",reason=""}"#).ends_with(" 200"));
        assert!(line(r#"redrive_jobs_finished_total{queue="payouts",kind="refund",state="succeeded",reason=""}"#).ends_with(" 100"));
        assert!(
            line(r#"redrive_attempts_total{queue="payments",kind="charge",class="success"}"#)
                .ends_with(" 199")
        );
        assert!(
            line(r#"redrive_attempts_total{queue="payments",kind="charge",class="timeout"}"#)
                .ends_with(" 1")
        );
        assert!(line(r#"redrive_queue_latency_seconds_count{queue="payouts"}"#).ends_with(" 100"));
        assert!(
            line(r#"redrive_job_duration_seconds_count{queue="payments",kind="charge"}"#)
                .ends_with(" 200")
        );
    }
}
