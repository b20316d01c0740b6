//! The worker: a claim loop feeding a bounded set of job tasks, and the executor that runs one
//! claim through the decision table.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use redrive_policy::{Action, DeferReason, Outcome, PolicySet, RetryPolicy, Timestamp};
use redrive_store::{
    ClaimParams, Clock, Completion, Job, Kinds, NewAttempt, Store, StoreError, SystemClock,
    Transition, WorkerInfo,
};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::completer::{Completer, WriteError};
use crate::db::Db;
use crate::declines;
use crate::fleet::{Fleet, Gate};
use crate::handler::{Attempted, Handler, JobContext, StatusAnswer};
use crate::metrics;

/// What a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Jobs that went to the dead-letter table.
    pub dead: u64,
    /// Jobs deferred (back in the queue for later: a long backoff, a rate limit, an open
    /// breaker or a pause).
    pub deferred: u64,
    /// Jobs handed back at shutdown (the interrupted attempt not counted).
    pub released: u64,
    /// Claims whose lease was lost (nothing written).
    pub lease_lost: u64,
    /// Attempts made (calls to handlers).
    pub attempts: u64,
    /// Claims whose task failed (a store error that outlasted the lease, a panic in redrive's
    /// own code): logged with the job id and left to their lease, so they are rescued and run
    /// again. The pool goes on.
    pub failed: u64,
    /// Claim statements run against the store.
    pub claims: u64,
    /// Of those, the ones that found nothing to take (a wake-up another worker won, or an
    /// idle poll).
    pub empty_claims: u64,
}

impl Summary {
    /// Adds another run's counts to these.
    pub fn add(&mut self, o: Summary) {
        self.succeeded += o.succeeded;
        self.dead += o.dead;
        self.deferred += o.deferred;
        self.released += o.released;
        self.lease_lost += o.lease_lost;
        self.attempts += o.attempts;
        self.failed += o.failed;
        self.claims += o.claims;
        self.empty_claims += o.empty_claims;
    }

    /// Claims that ended (succeeded, dead, deferred, released, lost or failed).
    pub fn finished(&self) -> u64 {
        self.succeeded + self.dead + self.deferred + self.released + self.lease_lost + self.failed
    }
}

/// The runtime's errors.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A fenced write failed (other than a lost lease) and kept failing.
    #[error("recording job {job}: {detail}")]
    Write {
        /// The job.
        job: i64,
        /// The last error.
        detail: String,
    },
}

/// One refresh of credentials shared by every job of a kind that hit a 401 at the same time.
#[derive(Debug, Default)]
struct AuthGate {
    generation: AtomicU64,
    lock: tokio::sync::Mutex<()>,
}

/// Builds a [`Worker`].
#[derive(Debug)]
pub struct WorkerBuilder {
    store: Store,
    queues: Vec<String>,
    handlers: HashMap<String, Arc<dyn Handler>>,
    policies: PolicySet,
    queue_policies: HashMap<String, RetryPolicy>,
    kind_policies: HashMap<String, RetryPolicy>,
    concurrency: usize,
    claim_batch: Option<usize>,
    claim_linger: Duration,
    lease: Duration,
    heartbeat: Option<Duration>,
    poll: Duration,
    grace: Duration,
    rescue_every: Duration,
    gauges_every: Option<Duration>,
    dependency_refresh: Duration,
    seed: u64,
    name: String,
    max_jobs: Option<u64>,
    clock: Arc<dyn Clock>,
    store_runtime: Option<tokio::runtime::Handle>,
    // Retention and periodic jobs (crate::maintenance).
    retention: Option<crate::Retention>,
    scheduler: Option<Duration>,
    registry_heartbeat: Duration,
}

/// How often a running worker refreshes its row in the store's registry of live workers
/// (`redrive workers`); a row unrefreshed for [`redrive_store::WORKER_STALE_AFTER`] counts as
/// a worker gone.
pub const REGISTRY_HEARTBEAT: Duration = Duration::from_secs(10);

impl WorkerBuilder {
    /// Registers a handler for a job kind. The handlers are the kinds this worker claims:
    /// jobs of other kinds stay in the queue, untouched, for a worker that runs them.
    pub fn handler(mut self, kind: impl Into<String>, h: Arc<dyn Handler>) -> Self {
        self.handlers.insert(kind.into(), h);
        self
    }
    /// The policies jobs name and the breaker settings per dependency (default: the built-in
    /// presets and the default breaker).
    pub fn policies(mut self, p: PolicySet) -> Self {
        self.policies = p;
        self
    }
    /// The policy for every job of a queue (wins over the policy the job names).
    pub fn queue_policy(mut self, queue: impl Into<String>, p: RetryPolicy) -> Self {
        self.queue_policies.insert(queue.into(), p);
        self
    }
    /// The policy for every job of a kind (wins over the queue's and the job's).
    pub fn kind_policy(mut self, kind: impl Into<String>, p: RetryPolicy) -> Self {
        self.kind_policies.insert(kind.into(), p);
        self
    }
    /// Jobs run at once (default 8).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }
    /// Jobs claimed per store call (default: up to the free slots, at most 200).
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.claim_batch = Some(n.max(1));
        self
    }
    /// Lease length (default 30 s).
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d.max(Duration::from_millis(300));
        self
    }
    /// How long a busy worker waits for more free slots before claiming fewer than a quarter
    /// of `min(claim batch, concurrency)` (default 2 ms; zero claims as soon as one slot is
    /// free). An idle worker claims at once. Larger claims mean fewer store round trips.
    pub fn claim_linger(mut self, d: Duration) -> Self {
        self.claim_linger = d;
        self
    }

    /// Heartbeat interval (default a third of the lease).
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.heartbeat = Some(d.max(Duration::from_millis(10)));
        self
    }
    /// How often an idle worker looks for work when no wake-up arrives (default 250 ms).
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll = d.max(Duration::from_millis(1));
        self
    }
    /// How long running attempts may take to finish after shutdown begins before they are
    /// interrupted and their jobs released (default 30 s).
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.grace = d;
        self
    }
    /// How often expired leases are rescued (default 1 s).
    pub fn rescue_interval(mut self, d: Duration) -> Self {
        self.rescue_every = d.max(Duration::from_millis(10));
        self
    }
    /// How often to set the `redrive_jobs` gauges from the store's counts (default 5 s;
    /// `None`: never).
    pub fn gauge_interval(mut self, d: Option<Duration>) -> Self {
        self.gauges_every = d;
        self
    }
    /// How old a cached dependency row may be before it is read again (default 20 ms).
    pub fn dependency_refresh(mut self, d: Duration) -> Self {
        self.dependency_refresh = d;
        self
    }
    /// Seed of the jitter RNGs.
    pub fn seed(mut self, s: u64) -> Self {
        self.seed = s;
        self
    }
    /// The worker's name (stored as lease owner and on attempts).
    pub fn name(mut self, n: impl Into<String>) -> Self {
        self.name = n.into();
        self
    }
    /// Stop claiming after this many claims.
    pub fn max_jobs(mut self, n: Option<u64>) -> Self {
        self.max_jobs = n;
        self
    }
    /// The clock (default the system clock; tests use [`crate::TokioClock`]).
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = c;
        self
    }
    /// Runs every store call on this runtime, from a blocking thread. Only for tests under
    /// tokio's paused clock: a running blocking task stops the paused clock from jumping
    /// ahead while the database answers (connect the store on that runtime too).
    pub fn store_runtime(mut self, h: tokio::runtime::Handle) -> Self {
        self.store_runtime = Some(h);
        self
    }
    /// How often the worker refreshes its row in the registry of live workers (default
    /// [`REGISTRY_HEARTBEAT`]; keep it well below [`redrive_store::WORKER_STALE_AFTER`]).
    pub fn registry_heartbeat(mut self, d: Duration) -> Self {
        self.registry_heartbeat = d.max(Duration::from_millis(10));
        self
    }
    /// Prune finished jobs with these ages and pacing, one pruner per fleet (default: off;
    /// `redrive work` and `serve --workers` turn it on with [`crate::Retention::default`]).
    pub fn retention(mut self, r: Option<crate::Retention>) -> Self {
        self.retention = r;
        self
    }
    /// Fire the store's schedules, looking for new ones at least this often (default
    /// [`crate::SCHEDULER_CHECK`]; `None`: this worker runs no scheduler).
    pub fn scheduler(mut self, check: Option<Duration>) -> Self {
        self.scheduler = check;
        self
    }
    /// The worker.
    pub fn build(self) -> Worker {
        let db = Db::new(self.store.clone(), self.store_runtime.clone());
        let fleet = Fleet::new(
            db.clone(),
            self.policies.clone(),
            self.dependency_refresh,
            self.seed,
        );
        let auth = self
            .handlers
            .keys()
            .map(|k| (k.clone(), Arc::new(AuthGate::default())))
            .collect();
        Worker {
            inner: Arc::new(Inner {
                b: self,
                db,
                fleet,
                auth,
                health: PoolHealth::default(),
            }),
        }
    }
}

#[derive(Debug)]
struct Inner {
    b: WorkerBuilder,
    db: Db,
    fleet: Fleet,
    auth: HashMap<String, Arc<AuthGate>>,
    health: PoolHealth,
}

/// Whether a worker's pool is running, for readiness checks (`redrive serve --workers N`
/// answers `/readyz` 503 when it is not). Cheap to clone; every clone sees the same pool.
///
/// The pool counts as running from the start of [`Worker::run`] (or
/// [`Worker::run_until_idle`]) until that call returns, panics or is dropped. While it runs it
/// also counts the claims that failed in a row because the store failed, so a readiness check
/// can tell a pool that waits out a store outage from one that works.
#[derive(Debug, Clone, Default)]
pub struct PoolHealth {
    inner: Arc<HealthInner>,
}

#[derive(Debug, Default)]
struct HealthInner {
    runs: AtomicUsize,
    claim_failures: AtomicU64,
    failed_tasks: AtomicU64,
}

impl PoolHealth {
    /// Whether the pool is running (a run of the worker is in progress).
    pub fn is_running(&self) -> bool {
        self.inner.runs.load(Ordering::SeqCst) > 0
    }

    /// Claims that failed in a row because the store failed (0 after a claim that worked).
    pub fn claim_failures(&self) -> u64 {
        self.inner.claim_failures.load(Ordering::SeqCst)
    }

    /// Job tasks that failed since the worker was built (each left to its lease).
    pub fn failed_tasks(&self) -> u64 {
        self.inner.failed_tasks.load(Ordering::SeqCst)
    }

    /// Marks a run as started until the guard is dropped (also by a panic or an abort).
    fn running(&self) -> RunningGuard {
        self.inner.runs.fetch_add(1, Ordering::SeqCst);
        RunningGuard(self.clone())
    }
}

struct RunningGuard(PoolHealth);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.inner.runs.fetch_sub(1, Ordering::SeqCst);
        self.0.inner.claim_failures.store(0, Ordering::SeqCst);
    }
}

/// The claim loop's wait after a failed claim: 100 ms, doubling up to 5 s, back to 100 ms
/// after a claim that works.
#[derive(Debug)]
pub(crate) struct ClaimBackoff {
    next: Duration,
}

impl ClaimBackoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(100);
    pub(crate) const MAX: Duration = Duration::from_secs(5);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// The wait after one more failure.
    pub(crate) fn failed(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }

    /// A claim worked.
    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// A pool of job runners over some queues.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use redrive_runtime::{Noop, Worker};
/// use redrive_store::{NewJob, Store};
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display())).await.unwrap();
/// store.enqueue(&NewJob::new("q", "noop", serde_json::json!({})), chrono::Utc::now()).await.unwrap();
/// let summary = Worker::builder(store, vec!["q".into()]).handler("noop", Arc::new(Noop)).build()
///     .run_until_idle().await.unwrap();
/// assert_eq!(summary.succeeded, 1);
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

/// One run's shared parts.
struct Run {
    w: Arc<Inner>,
    completer: Completer,
    stop: CancellationToken,
    hard: CancellationToken,
}

impl Worker {
    /// A builder for a worker on `queues` (empty: every queue in the store, looked up again
    /// every few seconds).
    pub fn builder(store: Store, queues: Vec<String>) -> WorkerBuilder {
        WorkerBuilder {
            store,
            queues,
            handlers: HashMap::new(),
            policies: PolicySet::builtin(),
            queue_policies: HashMap::new(),
            kind_policies: HashMap::new(),
            concurrency: 8,
            claim_batch: None,
            claim_linger: Duration::from_millis(2),
            lease: Duration::from_secs(30),
            heartbeat: None,
            poll: Duration::from_millis(250),
            grace: Duration::from_secs(30),
            rescue_every: Duration::from_secs(1),
            gauges_every: Some(Duration::from_secs(5)),
            dependency_refresh: Duration::from_millis(20),
            seed: 0x5eed,
            name: format!(
                "worker-{}-{:04x}",
                std::process::id(),
                rand::random::<u16>()
            ),
            max_jobs: None,
            clock: Arc::new(SystemClock),
            store_runtime: None,
            retention: None,
            scheduler: Some(crate::SCHEDULER_CHECK),
            registry_heartbeat: REGISTRY_HEARTBEAT,
        }
    }

    /// The kinds this worker claims: those it has handlers for.
    pub fn kinds(&self) -> Kinds {
        Kinds::only(self.inner.b.handlers.keys().cloned())
    }

    /// This worker's row in the registry of live workers (`redrive workers`).
    fn info(&self, now: redrive_store::Timestamp) -> WorkerInfo {
        let b = &self.inner.b;
        WorkerInfo {
            name: b.name.clone(),
            host: host_name(),
            pid: std::process::id(),
            queues: b.queues.clone(),
            kinds: self.kinds(),
            concurrency: u32::try_from(b.concurrency).unwrap_or(u32::MAX),
            started_at: now,
            last_seen: now,
        }
    }

    /// Registers the worker and keeps its row fresh until `stop` (registering again if the
    /// row was deleted meanwhile, e.g. after the store was unreachable for long). Failures are
    /// logged: the registry is for operators, the jobs do not depend on it.
    fn spawn_registry(&self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let w = self.clone();
        tokio::spawn(async move {
            let b = &w.inner.b;
            let info = w.info(b.clock.now());
            let mut registered = false;
            loop {
                let now = b.clock.now();
                let r = if registered {
                    let name = info.name.clone();
                    w.inner
                        .db
                        .run(move |s| async move { s.worker_heartbeat(&name, now).await })
                        .await
                } else {
                    let info = info.clone();
                    w.inner
                        .db
                        .run(move |s| async move { s.register_worker(&info, now).await })
                        .await
                        .map(|()| true)
                };
                match r {
                    Ok(alive) => registered = alive,
                    Err(e) => tracing::warn!("refreshing the worker's registry row failed: {e}"),
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(b.registry_heartbeat) => {}
                }
            }
            let name = info.name.clone();
            if let Err(e) = w
                .inner
                .db
                .run(move |s| async move { s.unregister_worker(&name).await })
                .await
            {
                tracing::warn!("removing the worker's registry row failed: {e}");
            }
        })
    }

    /// Whether this worker's pool is running (see [`PoolHealth`]).
    pub fn health(&self) -> PoolHealth {
        self.inner.health.clone()
    }

    /// Runs until no job is due and none is running (jobs deferred to later are left for a
    /// later run), or `max_jobs` claims have ended.
    pub async fn run_until_idle(&self) -> Result<Summary, RuntimeError> {
        self.run_inner(CancellationToken::new(), true).await
    }

    /// Runs until `shutdown` is cancelled: then stops claiming, lets running attempts finish
    /// within the grace period, releases jobs waiting to retry in process (to their planned
    /// time) and, when the grace period ends, interrupts the rest and releases their jobs
    /// (the interrupted attempt not counted).
    ///
    /// Store faults do not end the run: a failed claim is retried after a backoff (100 ms
    /// doubling to 5 s), a job task that fails (its write failed for as long as its lease
    /// held, or redrive's own code panicked) is logged with the job id and its job left to
    /// its lease (rescued and run again), and the pool goes on ([`Summary::failed`]).
    pub async fn run(&self, shutdown: CancellationToken) -> Result<Summary, RuntimeError> {
        self.run_inner(shutdown, false).await
    }

    async fn run_inner(
        &self,
        stop: CancellationToken,
        until_idle: bool,
    ) -> Result<Summary, RuntimeError> {
        let registry_stop = CancellationToken::new();
        let registry = self.spawn_registry(registry_stop.clone());
        let r = self.run_loop(stop, until_idle).await;
        registry_stop.cancel();
        let _ = registry.await;
        r
    }

    async fn run_loop(
        &self,
        stop: CancellationToken,
        until_idle: bool,
    ) -> Result<Summary, RuntimeError> {
        let w = &self.inner;
        let b = &w.b;
        let _running = w.health.running();
        let kinds = self.kinds();
        let mut backoff = ClaimBackoff::new();
        let hard = CancellationToken::new();
        let run = Arc::new(Run {
            w: w.clone(),
            completer: Completer::spawn(w.db.clone(), redrive_store::MAX_BATCH),
            stop: stop.clone(),
            hard: hard.clone(),
        });
        let sem = Arc::new(Semaphore::new(b.concurrency));
        let mut tasks: JoinSet<(i64, std::thread::Result<Result<Summary, RuntimeError>>)> =
            JoinSet::new();
        let mut total = Summary::default();
        let mut claimed = 0u64;
        let mut wake = b.store.subscribe();
        let mut last_rescue: Option<tokio::time::Instant> = None;
        let mut last_gauges: Option<tokio::time::Instant> = None;
        let mut last_maintain: Option<tokio::time::Instant> = None;
        let batch = b.claim_batch.unwrap_or(200);
        let all_queues = b.queues.is_empty();
        let mut queues = b.queues.clone();
        metrics::start_queues(&queues);
        // Housekeeping beside the claim loop, ended with the run.
        let housekeeping = CancellationToken::new();
        let _end_housekeeping = housekeeping.clone().drop_guard();
        if let Some(r) = b.retention.clone() {
            tokio::spawn(crate::maintenance::pruner(
                w.db.clone(),
                r,
                b.name.clone(),
                b.clock.clone(),
                housekeeping.clone(),
            ));
        }
        if let Some(check) = b.scheduler {
            tokio::spawn(crate::maintenance::scheduler(
                w.db.clone(),
                check,
                b.clock.clone(),
                housekeeping.clone(),
            ));
        }

        loop {
            while let Some(r) = tasks.try_join_next() {
                absorb(r, &mut total, &w.health);
            }
            if stop.is_cancelled() {
                break;
            }
            let left = b.max_jobs.map(|m| m.saturating_sub(claimed));
            if left == Some(0) {
                break;
            }
            let now = b.clock.now();
            if due(&mut last_rescue, b.rescue_every) {
                match w
                    .db
                    .run(move |s| async move { s.rescue(now, 1000).await })
                    .await
                {
                    Ok(rescued) => {
                        for r in &rescued {
                            metrics::rescued(&r.queue);
                        }
                    }
                    Err(e) => tracing::warn!("rescuing expired leases failed: {e}"),
                }
            }
            if due(&mut last_maintain, b.poll)
                && let Err(e) = w.fleet.maintain(now).await
            {
                tracing::warn!("dependency housekeeping failed: {e}");
            }
            // The gauges, and in all-queues mode the list of queues, from the store's counts.
            let every = b.gauges_every.unwrap_or(Duration::from_secs(5));
            if (b.gauges_every.is_some() || all_queues) && due(&mut last_gauges, every) {
                let publish = b.gauges_every.is_some();
                let counts =
                    w.db.run(move |s| async move {
                        if publish {
                            metrics::publish_gauges(&s, now).await
                        } else {
                            s.counts().await
                        }
                    })
                    .await;
                match counts {
                    Ok(c) if all_queues => {
                        queues = c.into_iter().map(|c| c.queue).collect();
                        queues.sort();
                        queues.dedup();
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("reading queue counts failed: {e}"),
                }
            }
            if queues.is_empty() {
                // All-queues mode and no queue exists yet.
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = wake.changed() => { last_gauges = None; continue }
                    _ = tokio::time::sleep(b.poll) => { if until_idle { break } continue }
                }
            }

            let first = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                p = sem.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            };
            let want = (batch as u64).min(left.unwrap_or(u64::MAX)) as usize;
            let mut permits = vec![first];
            while permits.len() < want {
                match sem.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            // Busy: let a few more slots free up (briefly) so that one claim fills them.
            let enough = (want.min(b.concurrency) / 4).max(1);
            if permits.len() < enough && !tasks.is_empty() && !b.claim_linger.is_zero() {
                let until = tokio::time::Instant::now() + b.claim_linger;
                while permits.len() < enough {
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        p = sem.clone().acquire_owned() => match p {
                            Ok(p) => permits.push(p),
                            Err(_) => break,
                        },
                        _ = tokio::time::sleep_until(until) => break,
                    }
                }
                if stop.is_cancelled() {
                    // Shutdown arrived while lingering: claim nothing more.
                    break;
                }
            }
            wake.borrow_and_update();
            let p = ClaimParams {
                queues: queues.clone(),
                kinds: kinds.clone(),
                worker: b.name.clone(),
                limit: permits.len() as u32,
                lease: b.lease,
                now: b.clock.now(),
            };
            let jobs = match w.db.run(move |s| async move { s.claim(&p).await }).await {
                Ok(j) => {
                    backoff.reset();
                    w.health.inner.claim_failures.store(0, Ordering::SeqCst);
                    j
                }
                Err(e) => {
                    // The store is unavailable: wait longer each time (the running jobs go
                    // on, and end as their writes allow), and never give up.
                    let wait = backoff.failed();
                    let n = w.health.inner.claim_failures.fetch_add(1, Ordering::SeqCst) + 1;
                    tracing::warn!(failures = n, retry_in = ?wait, "claiming failed: {e}");
                    drop(permits);
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            total.claims += 1;
            if jobs.is_empty() {
                total.empty_claims += 1;
                drop(permits);
                if until_idle && tasks.is_empty() {
                    break;
                }
                let (q, k) = (queues.clone(), kinds.clone());
                let wait = match w
                    .db
                    .run(move |s| async move { s.next_due_for(&q, &k).await })
                    .await
                {
                    Ok(Some(t)) => (t - b.clock.now()).to_std().unwrap_or(Duration::ZERO),
                    _ => b.poll,
                }
                .clamp(Duration::from_millis(1), b.poll);
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    Some(r) = tasks.join_next(), if !tasks.is_empty() => absorb(r, &mut total, &w.health),
                    r = wake.changed() => if r.is_err() { tokio::time::sleep(wait).await },
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            tracing::trace!(asked = permits.len(), claimed = jobs.len(), "claim");
            claimed += jobs.len() as u64;
            let mut permits = permits.into_iter();
            for job in jobs {
                let permit = permits.next();
                let run = run.clone();
                let id = job.id;
                tasks.spawn(async move {
                    let r = AssertUnwindSafe(run.execute(job)).catch_unwind().await;
                    drop(permit);
                    (id, r)
                });
            }
        }

        // Shutdown or idle: let the running claims end (after the grace period, interrupt).
        let grace = tokio::time::sleep(b.grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                r = tasks.join_next() => match r {
                    None => break,
                    Some(r) => absorb(r, &mut total, &w.health),
                },
                _ = &mut grace, if stop.is_cancelled() && !hard.is_cancelled() => {
                    tracing::warn!(running = tasks.len(), "shutdown grace period over: interrupting and releasing");
                    hard.cancel();
                }
            }
        }
        Ok(total)
    }
}

/// The host's name, as the registry of live workers shows it: the kernel's (Linux), else
/// `$HOSTNAME`, else `/etc/hostname`, else `unknown`.
fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .chain(std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().chars().take(255).collect::<String>())
        .find(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn due(last: &mut Option<tokio::time::Instant>, every: Duration) -> bool {
    let now = tokio::time::Instant::now();
    if last.is_none_or(|t| now - t >= every) {
        *last = Some(now);
        return true;
    }
    false
}

/// Adds a job task's end to the run's: a failed task is logged with its job and counted, and
/// its job is left to its lease (the heartbeat stopped with the task, so the lease runs out
/// and the job is rescued); the pool goes on.
fn absorb(
    r: Result<(i64, std::thread::Result<Result<Summary, RuntimeError>>), tokio::task::JoinError>,
    total: &mut Summary,
    health: &PoolHealth,
) {
    let failed = match r {
        Ok((_, Ok(Ok(s)))) => {
            total.add(s);
            return;
        }
        Ok((job, Ok(Err(e)))) => {
            tracing::error!(
                job,
                "job task failed: {e}; the job is left to its lease and will be rescued"
            );
            true
        }
        Ok((job, Err(p))) => {
            tracing::error!(
                job,
                "job task panicked: {}; the job is left to its lease and will be rescued",
                panic_text(&p)
            );
            true
        }
        Err(e) => {
            tracing::error!("job task ended abnormally: {e}; its job is left to its lease");
            true
        }
    };
    if failed {
        total.failed += 1;
        health.inner.failed_tasks.fetch_add(1, Ordering::SeqCst);
    }
}

/// How one pass of the executor's loop ended.
enum Step {
    /// Call again after this wait (holding the lease).
    Again(Duration),
    /// Call again at once (after a credentials refresh).
    Refresh,
    /// The claim ended.
    Ended,
}

impl Run {
    fn policy(&self, job: &Job) -> RetryPolicy {
        let b = &self.w.b;
        if let Some(p) = b.kind_policies.get(&job.kind) {
            return p.clone();
        }
        if let Some(p) = b.queue_policies.get(&job.queue) {
            return p.clone();
        }
        match b.policies.get(&job.policy) {
            Ok(p) => p.clone(),
            Err(_) => {
                tracing::warn!(job = job.id, policy = %job.policy, "unknown policy; using payment");
                RetryPolicy::payment()
            }
        }
    }

    /// Writes a fenced completion, retrying a failing store while the lease holds (the
    /// heartbeat gives up on it shortly before it runs out) and the run is not interrupted:
    /// an outcome recorded late beats one lost, whose job would run again.
    async fn write(&self, c: Completion, lost: &CancellationToken) -> Result<(), WriteError> {
        let mut wait = Duration::from_millis(50);
        loop {
            match self.completer.complete(c.clone()).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_lease_lost() || matches!(e, WriteError::Stopped) => return Err(e),
                Err(e) => {
                    if lost.is_cancelled() || self.hard.is_cancelled() {
                        return Err(e);
                    }
                    tracing::warn!(
                        job = c.lease.job_id,
                        "recording the attempt failed, retrying: {e}"
                    );
                    tokio::select! {
                        _ = lost.cancelled() => {}
                        _ = self.hard.cancelled() => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// One claim: attempts until the job is done, dead, deferred, released or its lease is lost.
    async fn execute(&self, job: Job) -> Result<Summary, RuntimeError> {
        let lost = CancellationToken::new();
        // Stopped however the claim ends, a panic included: a heartbeat that outlived its
        // task would hold the lease for ever, and the job would never be rescued.
        let _heartbeat = AbortOnDrop(self.spawn_heartbeat(&job, lost.clone()));
        self.execute_inner(&job, &lost).await
    }

    async fn execute_inner(
        &self,
        job: &Job,
        lost: &CancellationToken,
    ) -> Result<Summary, RuntimeError> {
        let b = &self.w.b;
        let clock = &b.clock;
        let mut s = Summary::default();
        let policy = self.policy(job);
        let mut rng = SmallRng::seed_from_u64(
            b.seed ^ (job.id as u64).rotate_left(17) ^ u64::from(job.attempts),
        );
        let lease = job.lease();
        let mut counters = job.counters();
        let handler = b.handlers.get(&job.kind).cloned();
        let auth = self.w.auth.get(&job.kind).cloned();
        let cancel = lost.child_token();
        let write_err = |e: WriteError| RuntimeError::Write {
            job: job.id,
            detail: e.to_string(),
        };

        // The card networks' rules before a call that follows a decline (declines.rs).
        let (mut declines_seen, mut last_decline) = (0, None);
        if declines::may_follow_decline(job) {
            match declines::last_decline(&self.w.db, job.id).await {
                Ok((n, d)) => (declines_seen, last_decline) = (n, d),
                Err(e) => {
                    // Unknown whether this call would break a network rule: do not make it.
                    tracing::warn!(job = job.id, "reading the job's declines failed: {e}");
                    return self
                        .end_unattempted(job, counters, Transition::Released, lost, s)
                        .await;
                }
            }
        }
        // Queue latency: from the job's due time to this start.
        metrics::queue_latency(
            &job.queue,
            (clock.now() - job.run_at).to_std().unwrap_or_default(),
        );
        let mut waited_since = None;
        loop {
            // Is the dependency open or paused (fleet-wide)? Then defer: not an attempt.
            let mut probe = false;
            let mut inflight_permit = None;
            if let (Some(dep), Some(_)) = (&job.dependency, &handler) {
                let now = clock.now();
                let retry = counters.attempts > 0;
                // What is left of the wait in process, after a wait for the reservation horizon.
                let full = policy.retry.in_process_max_wait;
                let max_wait = waited_since.map_or(full, |t: Timestamp| {
                    full.saturating_sub((now - t).to_std().unwrap_or_default())
                });
                let gate = self
                    .w
                    .fleet
                    .admit(dep, retry, max_wait, waited_since.is_some(), now)
                    .await;
                if let Ok(Gate::At { at } | Gate::Wait { until: at }) = gate {
                    // A send slot of the dependency's rate limit, or the time to reserve one:
                    // wait for it, holding the lease (at most in_process_max_wait).
                    let wait = (at - now).to_std().unwrap_or_default();
                    tokio::select! {
                        biased;
                        _ = lost.cancelled() => {
                            lost_lease(&mut s);
                            return Ok(s);
                        }
                        _ = self.stop.cancelled() => {
                            return self
                                .end_unattempted(job, counters, Transition::Released, lost, s)
                                .await;
                        }
                        _ = tokio::time::sleep(wait) => {}
                    }
                    if matches!(gate, Ok(Gate::Wait { .. })) {
                        waited_since.get_or_insert(now);
                        continue;
                    }
                }
                waited_since = None;
                // After the wait for a send slot the breaker may have opened, or the
                // dependency been paused: look again before calling (after a store write,
                // `admit` has looked already).
                let (gate, now) = match gate {
                    Ok(Gate::At { at }) if at > now => {
                        let now = clock.now();
                        (self.w.fleet.at_slot(dep, false, now).await, now)
                    }
                    gate => (gate, now),
                };
                match gate {
                    Ok(Gate::Go { probe: p }) => probe = p,
                    Ok(Gate::At { .. } | Gate::Wait { .. }) => {}
                    Ok(Gate::Blocked { until, reason }) => {
                        let action = policy.decide_blocked(&counters, until, reason, now, &mut rng);
                        let (transition, _) = plan(action, &serde_json::Value::Null);
                        return self
                            .end_unattempted(job, counters, transition, lost, s)
                            .await;
                    }
                    Err(e) => {
                        // The store is unreachable: the breaker cannot be consulted, and the
                        // attempt could not be recorded either; call (fail open) and let the
                        // write below retry.
                        tracing::warn!(dependency = %dep, "reading the dependency failed: {e}");
                    }
                }
            }

            // The per-process cap on calls in flight to the dependency (bulkhead), if any.
            if let Some(sem) = job
                .dependency
                .as_deref()
                .and_then(|d| self.w.fleet.inflight(d))
            {
                inflight_permit = sem.acquire_owned().await.ok();
            }
            if let Some(last) = &last_decline {
                let quotas = b.policies.quotas();
                let gate = declines::gate(
                    &self.w.db,
                    job,
                    last,
                    &counters,
                    &policy,
                    quotas,
                    clock.now(),
                )
                .await;
                let transition = match gate {
                    Ok(None) => None,
                    Ok(Some(action)) => Some(plan(action, &serde_json::Value::Null).0),
                    Err(e) => {
                        tracing::warn!(job = job.id, "taking a card reattempt failed: {e}");
                        Some(Transition::Released)
                    }
                };
                if let Some(t) = transition {
                    drop(inflight_permit);
                    return self.end_unattempted(job, counters, t, lost, s).await;
                }
            }
            let generation = auth.as_ref().map(|a| a.generation.load(Ordering::SeqCst));
            let started = clock.now();
            let t0 = tokio::time::Instant::now();
            let ctx = JobContext {
                job_id: job.id,
                queue: job.queue.clone(),
                kind: job.kind.clone(),
                attempt: counters.attempts + 1,
                key: job.key.clone(),
                dependency: job.dependency.clone(),
                lease_token: lease.token,
                payload: job.payload.clone(),
                cancel: cancel.clone(),
                declines: declines_seen,
                traceparent: job.traceparent.clone(),
            };
            // One span per attempt, in the trace of the job's `traceparent` (with the `otel`
            // feature); the handler runs inside it, so its outbound call joins the trace.
            let span = tracing::info_span!("attempt", job = job.id, queue = %job.queue,
                kind = %job.kind, key = job.key.as_deref().unwrap_or(""),
                dependency = job.dependency.as_deref().unwrap_or(""), attempt = ctx.attempt,
                class = tracing::field::Empty, decision = tracing::field::Empty,
                why = tracing::field::Empty);
            crate::trace::set_parent(&span, job.traceparent.as_deref());
            let calling = job.dependency.as_deref().map(metrics::Inflight::start);
            let mut attempted = match &handler {
                None => Attempted::failure(
                    Outcome::Permanent,
                    format!("no handler for job kind {:?}", job.kind),
                ),
                Some(h) => {
                    let call = AssertUnwindSafe(h.run(ctx.clone()).instrument(span.clone()))
                        .catch_unwind();
                    tokio::select! {
                        biased;
                        _ = lost.cancelled() => {
                            lost_lease(&mut s);
                            tracing::warn!(job = job.id, "lease lost: attempt abandoned");
                            return Ok(s);
                        }
                        _ = self.hard.cancelled() => {
                            return self.end_unattempted(job, counters, Transition::Released, lost, s).await;
                        }
                        r = call => match r {
                            Ok(a) => a,
                            Err(p) => Attempted::failure(
                                Outcome::Exception,
                                format!("handler panicked: {}", panic_text(&p)),
                            ),
                        },
                    }
                }
            };
            // An ambiguous timeout with no safe repeat: ask the dependency first.
            if let (Outcome::Timeout { idempotent: false }, Some(h)) =
                (&attempted.outcome, &handler)
                && let Some(q) = h.query_status(ctx.clone())
            {
                {
                    match q.await {
                        StatusAnswer::Succeeded(v) => {
                            attempted = Attempted {
                                outcome: Outcome::Success,
                                result: v,
                                ..attempted
                            };
                        }
                        StatusAnswer::NotFound => {
                            attempted.outcome = Outcome::Timeout { idempotent: true };
                        }
                        StatusAnswer::Unknown(why) => {
                            let e = attempted.error.take().unwrap_or_default();
                            attempted.error = Some(format!("{e}; status query: {why}"));
                        }
                    }
                }
            }
            let took = t0.elapsed();
            drop(calling);
            drop(inflight_permit);
            let class = attempted.outcome.class();
            span.record("class", class.as_str());
            s.attempts += 1;
            metrics::attempt(&job.queue, &job.kind, class.as_str(), took);
            if lost.is_cancelled() {
                lost_lease(&mut s);
                return Ok(s);
            }

            let now = clock.now();
            let verdict = policy.decide(&counters, &attempted.outcome, now, &mut rng);
            if let Outcome::Declined(advice) = attempted.outcome {
                let n = counters.attempts + 1;
                if let Err(e) = declines::record(&self.w.db, job, n, advice, now).await {
                    tracing::warn!(job = job.id, "recording the decline failed: {e}");
                }
                last_decline = Some(declines::LastDecline::of(&advice, now));
                declines_seen += 1;
            }
            if let Some(dep) = &job.dependency
                && let Err(e) = self
                    .w
                    .fleet
                    .record(dep, probe, class, took, verdict.pause_until, now)
                    .await
            {
                tracing::warn!(dependency = %dep, "publishing the breaker/pause failed: {e}");
            }
            let mut action = verdict.action;
            // A wait in process that would end while the dependency is still open or paused
            // (this failure may just have opened it) holds a slot for nothing: defer instead.
            if let (Action::RetryInProcess { delay, .. }, Some(dep)) = (&action, &job.dependency)
                && let Ok(Some((until, reason))) = self.w.fleet.blocked_until(dep, now).await
                && until > now + chrono::Duration::from_std(*delay).unwrap_or_default()
            {
                action = policy.decide_blocked(&verdict.counters, until, reason, now, &mut rng);
            }
            let (transition, step) = plan(action, &attempted.result);
            let (decision, why) = decision(&transition, &step);
            span.record("decision", decision);
            span.record("why", why.as_str());
            tracing::info!(parent: &span, job = job.id, queue = %job.queue, kind = %job.kind,
                key = job.key.as_deref().unwrap_or(""),
                dependency = job.dependency.as_deref().unwrap_or(""), attempt = ctx.attempt,
                class = class.as_str(), duration_ms = took.as_millis() as u64,
                http_status = attempted.http_status, decision, why = %why,
                error = attempted.error.as_deref().unwrap_or(""), "attempt");
            let attempt = NewAttempt {
                worker: Some(b.name.clone()),
                started_at: started,
                duration: took,
                class,
                http_status: attempted.http_status,
                error: attempted.error.clone(),
                counted: verdict.counted,
            };
            let c = Completion::new(
                lease,
                Some(attempt),
                verdict.counters,
                transition.clone(),
                now,
            );
            // The attempt is recorded before any wait.
            match self.write(c, lost).await {
                Err(e) if e.is_lease_lost() => {
                    lost_lease(&mut s);
                    return Ok(s);
                }
                Err(e) => return Err(write_err(e)),
                Ok(()) => {}
            }
            counters = verdict.counters;
            match (&transition, step) {
                (_, Step::Refresh) => {
                    if let (Some(a), Some(h), Some(g)) = (&auth, &handler, generation) {
                        let _one = a.lock.lock().await;
                        // Someone refreshed since this call started: use theirs.
                        if a.generation.load(Ordering::SeqCst) == g {
                            if let Err(e) = h.refresh_credentials().await {
                                tracing::warn!(kind = %job.kind, "refreshing credentials failed: {e}");
                            }
                            a.generation.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                (_, Step::Again(delay)) => {
                    metrics::delay("retry", delay);
                    tokio::select! {
                        biased;
                        _ = lost.cancelled() => {
                            lost_lease(&mut s);
                            return Ok(s);
                        }
                        _ = self.stop.cancelled() => {
                            // Shutting down: hand the job back for its planned time.
                            let until = now + chrono::Duration::from_std(delay).unwrap_or_default();
                            let t = Transition::Deferred { until, reason: DeferReason::Released, delay };
                            return self.end_unattempted(job, counters, t, lost, s).await;
                        }
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                (Transition::Succeeded { .. }, Step::Ended) => {
                    s.succeeded += 1;
                    metrics::finished(&job.queue, &job.kind, "succeeded", "");
                    return Ok(s);
                }
                (Transition::Dead { reason }, Step::Ended) => {
                    s.dead += 1;
                    metrics::finished(&job.queue, &job.kind, "dead", reason.as_str());
                    tracing::warn!(job = job.id, reason = reason.as_str(), "job dead");
                    return Ok(s);
                }
                (Transition::Deferred { delay, .. }, Step::Ended) => {
                    s.deferred += 1;
                    metrics::delay("defer", *delay);
                    return Ok(s);
                }
                (_, Step::Ended) => return Ok(s),
            }
        }
    }

    /// Ends a claim without recording an attempt: a job deferred because its dependency is
    /// blocked, or handed back at shutdown (an interrupted attempt is not counted).
    async fn end_unattempted(
        &self,
        job: &Job,
        counters: redrive_policy::JobCounters,
        transition: Transition,
        lost: &CancellationToken,
        mut s: Summary,
    ) -> Result<Summary, RuntimeError> {
        let c = Completion::new(
            job.lease(),
            None,
            counters,
            transition.clone(),
            self.w.b.clock.now(),
        );
        match self.write(c, lost).await {
            Err(e) if e.is_lease_lost() => lost_lease(&mut s),
            Err(e) => {
                return Err(RuntimeError::Write {
                    job: job.id,
                    detail: e.to_string(),
                });
            }
            Ok(()) => match transition {
                Transition::Dead { reason } => {
                    s.dead += 1;
                    metrics::finished(&job.queue, &job.kind, "dead", reason.as_str());
                }
                Transition::Released
                | Transition::Deferred {
                    reason: DeferReason::Released,
                    ..
                } => s.released += 1,
                _ => s.deferred += 1,
            },
        }
        Ok(s)
    }

    fn spawn_heartbeat(&self, job: &Job, lost: CancellationToken) -> tokio::task::JoinHandle<()> {
        let b = &self.w.b;
        let db = self.w.db.clone();
        let clock = b.clock.clone();
        let lease = job.lease();
        let len = b.lease;
        let every = b.heartbeat.unwrap_or(len / 3).min(len / 2);
        let mut until: Timestamp = job
            .lease_expires_at
            .unwrap_or_else(|| clock.now() + chrono::Duration::from_std(len).unwrap_or_default());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let now = clock.now();
                match db
                    .run(move |s| async move { s.heartbeat(lease, len, now).await })
                    .await
                {
                    Ok(t) => until = t,
                    Err(e) if e.is_lease_lost() => {
                        lost.cancel();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!("heartbeat for job {} failed: {e}", lease.job_id);
                        // The store is unreachable: stop the handler before the lease runs out.
                        if clock.now() + chrono::Duration::from_std(every).unwrap_or_default()
                            >= until
                        {
                            lost.cancel();
                            return;
                        }
                    }
                }
            }
        })
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The stored transition and what the executor does next, for a decided action.
/// What was decided after an attempt, for its span and log line: `succeeded`, `retry` (in
/// process, after the delay), `refresh` (credentials), `defer` or `dead`, and why.
fn decision(t: &Transition, step: &Step) -> (&'static str, String) {
    match (t, step) {
        (_, Step::Refresh) => ("refresh", "401: refreshing credentials".into()),
        (Transition::RetryInProcess { delay }, _) => ("retry", format!("in {delay:?}")),
        (Transition::Succeeded { .. }, _) => ("succeeded", String::new()),
        (Transition::Deferred { reason, delay, .. }, _) => {
            ("defer", format!("{} for {delay:?}", reason.as_str()))
        }
        (Transition::Dead { reason }, _) => ("dead", reason.as_str().to_owned()),
        (Transition::Released, _) => ("released", String::new()),
    }
}

fn plan(action: Action, result: &serde_json::Value) -> (Transition, Step) {
    match action {
        Action::Done => (
            Transition::Succeeded {
                result: result.clone(),
            },
            Step::Ended,
        ),
        Action::RefreshCredentials => (
            Transition::RetryInProcess {
                delay: Duration::ZERO,
            },
            Step::Refresh,
        ),
        Action::RetryInProcess { delay, .. } => {
            (Transition::RetryInProcess { delay }, Step::Again(delay))
        }
        Action::Defer {
            until,
            delay,
            reason,
            ..
        } => (
            Transition::Deferred {
                until,
                reason,
                delay,
            },
            Step::Ended,
        ),
        Action::Dead { reason } => (Transition::Dead { reason }, Step::Ended),
    }
}

fn lost_lease(s: &mut Summary) {
    s.lease_lost += 1;
    metrics::lease_lost();
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_backoff_doubles_to_five_seconds_and_resets() {
        let mut b = ClaimBackoff::new();
        let waits: Vec<u64> = (0..9).map(|_| b.failed().as_millis() as u64).collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000],
            "100 ms doubling, capped at 5 s"
        );
        b.reset();
        assert_eq!(b.failed(), Duration::from_millis(100));
    }

    #[test]
    fn health_counts_runs_until_their_guards_drop() {
        let h = PoolHealth::default();
        assert!(!h.is_running());
        let a = h.running();
        let b = h.clone().running();
        assert!(h.is_running());
        drop(a);
        assert!(h.is_running(), "one run is left");
        drop(b);
        assert!(!h.is_running());
    }
}
