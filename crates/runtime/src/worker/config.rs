//! The worker's settings and their builder.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redrive_policy::{PolicySet, RetryPolicy};
use redrive_store::{Clock, Store, SystemClock};

use super::{AuthGate, PoolHealth, Shared, Worker};
use crate::db::Db;
use crate::fleet::Fleet;
use crate::handler::Handler;

/// Builds a [`Worker`].
#[derive(Debug)]
pub struct WorkerBuilder {
    pub(super) store: Store,
    pub(super) queues: Vec<String>,
    pub(super) handlers: HashMap<String, Arc<dyn Handler>>,
    pub(super) policies: PolicySet,
    pub(super) queue_policies: HashMap<String, RetryPolicy>,
    pub(super) kind_policies: HashMap<String, RetryPolicy>,
    pub(super) concurrency: usize,
    pub(super) claim_batch: Option<usize>,
    pub(super) claim_linger: Duration,
    pub(super) lease: Duration,
    pub(super) heartbeat: Option<Duration>,
    pub(super) poll: Duration,
    pub(super) grace: Duration,
    pub(super) rescue_every: Duration,
    pub(super) gauges_every: Option<Duration>,
    pub(super) dependency_refresh: Duration,
    pub(super) seed: u64,
    pub(super) name: String,
    pub(super) max_jobs: Option<u64>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) store_runtime: Option<tokio::runtime::Handle>,
    // Retention and periodic jobs (crate::maintenance).
    pub(super) retention: Option<crate::Retention>,
    pub(super) scheduler: Option<Duration>,
    pub(super) registry_heartbeat: Duration,
}

/// How often a running worker refreshes its row in the store's registry of live workers
/// (`redrive workers`); a row unrefreshed for [`redrive_store::WORKER_STALE_AFTER`] counts as
/// a worker gone.
pub const REGISTRY_HEARTBEAT: Duration = Duration::from_secs(10);

impl WorkerBuilder {
    /// A builder with the defaults, for [`Worker::builder`].
    pub(super) fn new(store: Store, queues: Vec<String>) -> Self {
        Self {
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
            shared: Arc::new(Shared {
                config: self,
                db,
                fleet,
                auth,
                health: PoolHealth::default(),
            }),
        }
    }
}
