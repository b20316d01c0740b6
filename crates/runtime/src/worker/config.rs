//! The worker's settings and their builder.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redrive_policy::{PolicySet, RetryPolicy};
use redrive_store::{Clock, Store, SystemClock};

use super::{AuthGate, PoolHealth, Shared, Worker};
use crate::clock_sync::{DEFAULT_CLOCK_SYNC, DbClock};
use crate::db::Db;
use crate::fleet::Fleet;
use crate::handler::Handler;

/// Builds a [`Worker`].
#[derive(Debug)]
pub struct WorkerBuilder {
    pub(super) store: Store,
    pub(super) queues: Vec<String>,
    pub(super) handlers: HashMap<String, Arc<dyn Handler>>,
    pub(super) policies: crate::LivePolicies,
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
    /// Whether this worker measures its clock's offset to the database (at start and every
    /// `clock_sync`): then `clock` is `db_clock` after `build`.
    pub(super) sync_clock: bool,
    pub(super) db_clock: Option<Arc<DbClock>>,
    pub(super) clock_sync: Duration,
    pub(super) store_runtime: Option<tokio::runtime::Handle>,
    // Retention and periodic jobs (crate::maintenance).
    pub(super) retention: Option<crate::Retention>,
    pub(super) scheduler: Option<Duration>,
    pub(super) registry_heartbeat: Duration,
    /// Fail closed when a dependency's breaker row cannot be read: defer this long.
    pub(super) fail_closed: Option<Duration>,
}

/// How often a running worker refreshes its row in the store's registry of live workers
/// (`redrive workers`); a row unrefreshed for [`redrive_store::WORKER_STALE_AFTER`] counts as
/// a worker gone.
pub const REGISTRY_HEARTBEAT: Duration = Duration::from_secs(10);
/// The shortest registry heartbeat ([`WorkerBuilder::registry_heartbeat`]).
pub const MIN_REGISTRY_HEARTBEAT: Duration = Duration::from_millis(10);
/// Jobs run at once by default ([`WorkerBuilder::concurrency`]).
pub const DEFAULT_CONCURRENCY: usize = 8;
/// The most jobs a worker runs at once ([`WorkerBuilder::concurrency`]).
pub const MAX_CONCURRENCY: usize = 10_000;
/// Jobs claimed per store call at most, by default ([`WorkerBuilder::claim_batch`]).
pub const DEFAULT_CLAIM_BATCH: usize = 200;
/// How long a busy worker waits for more free slots, by default
/// ([`WorkerBuilder::claim_linger`]).
pub const DEFAULT_CLAIM_LINGER: Duration = Duration::from_millis(2);
/// Lease length by default ([`WorkerBuilder::lease`]).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease ([`WorkerBuilder::lease`]).
pub const MIN_LEASE: Duration = Duration::from_millis(300);
/// The shortest heartbeat interval ([`WorkerBuilder::heartbeat`]).
pub const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
/// How often an idle worker looks for work, by default ([`WorkerBuilder::poll_interval`]).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// The shortest poll interval ([`WorkerBuilder::poll_interval`]).
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// The shutdown grace period by default ([`WorkerBuilder::shutdown_grace`]).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How often expired leases are rescued, by default ([`WorkerBuilder::rescue_interval`]).
pub const DEFAULT_RESCUE_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest rescue interval ([`WorkerBuilder::rescue_interval`]).
pub const MIN_RESCUE_INTERVAL: Duration = Duration::from_millis(10);
/// How often the `redrive_jobs` gauges are set, by default ([`WorkerBuilder::gauge_interval`]).
pub const DEFAULT_GAUGE_INTERVAL: Duration = Duration::from_secs(5);
/// How old a cached dependency row may be, by default ([`WorkerBuilder::dependency_refresh`]).
pub const DEFAULT_DEPENDENCY_REFRESH: Duration = Duration::from_millis(20);
/// The shortest interval between two measurements of the clock's offset
/// ([`WorkerBuilder::clock_sync_interval`]).
pub const MIN_CLOCK_SYNC: Duration = Duration::from_millis(100);
/// Seed of the jitter RNGs by default ([`WorkerBuilder::seed`]).
pub const DEFAULT_SEED: u64 = 0x5eed;

/// A worker setting out of its bounds ([`WorkerBuilder::build`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `concurrency` outside `1..=MAX_CONCURRENCY`.
    #[error("concurrency must be 1..={max}, got {value}")]
    Concurrency {
        /// The value given.
        value: usize,
        /// [`MAX_CONCURRENCY`].
        max: usize,
    },
    /// `claim_batch` of zero.
    #[error("claim_batch must be at least 1, got {value}")]
    ClaimBatch {
        /// The value given.
        value: usize,
    },
    /// A duration below its minimum.
    #[error("{field} must be at least {min:?}, got {value:?}")]
    TooShort {
        /// The setting.
        field: &'static str,
        /// The value given.
        value: Duration,
        /// The shortest allowed.
        min: Duration,
    },
}

impl WorkerBuilder {
    /// A builder with the defaults, for [`Worker::builder`].
    pub(super) fn new(store: Store, queues: Vec<String>) -> Self {
        Self {
            store,
            queues,
            handlers: HashMap::new(),
            policies: crate::LivePolicies::new(PolicySet::builtin()),
            queue_policies: HashMap::new(),
            kind_policies: HashMap::new(),
            concurrency: DEFAULT_CONCURRENCY,
            claim_batch: None,
            claim_linger: DEFAULT_CLAIM_LINGER,
            lease: DEFAULT_LEASE,
            heartbeat: None,
            poll: DEFAULT_POLL_INTERVAL,
            grace: DEFAULT_SHUTDOWN_GRACE,
            rescue_every: DEFAULT_RESCUE_INTERVAL,
            gauges_every: Some(DEFAULT_GAUGE_INTERVAL),
            dependency_refresh: DEFAULT_DEPENDENCY_REFRESH,
            seed: DEFAULT_SEED,
            name: format!(
                "worker-{}-{:04x}",
                std::process::id(),
                rand::random::<u16>()
            ),
            max_jobs: None,
            clock: Arc::new(SystemClock),
            sync_clock: true,
            db_clock: None,
            clock_sync: DEFAULT_CLOCK_SYNC,
            store_runtime: None,
            retention: None,
            scheduler: Some(crate::SCHEDULER_CHECK),
            registry_heartbeat: REGISTRY_HEARTBEAT,
            fail_closed: None,
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
        self.policies = crate::LivePolicies::new(p);
        self
    }
    /// Policies that may be replaced while the worker runs ([`crate::LivePolicies`]): each
    /// claim runs under the set in force when it starts; breakers and rate limits take a
    /// changed flow configuration at their next use. The set's label is shown in the
    /// worker's registry row (`redrive workers`), refreshed at once on a replacement.
    pub fn live_policies(mut self, p: crate::LivePolicies) -> Self {
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
    /// Jobs run at once, `1..=`[`MAX_CONCURRENCY`].
    ///
    /// # Default
    /// [`DEFAULT_CONCURRENCY`] (8).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }
    /// Jobs claimed per store call at most (at least 1).
    ///
    /// # Default
    /// Up to the free slots, at most [`DEFAULT_CLAIM_BATCH`] (200).
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.claim_batch = Some(n);
        self
    }
    /// Lease length (at least [`MIN_LEASE`], 300 ms).
    ///
    /// # Default
    /// [`DEFAULT_LEASE`] (30 s).
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }
    /// How long a busy worker waits for more free slots before claiming fewer than a quarter
    /// of `min(claim batch, concurrency)` (zero claims as soon as one slot is free). An idle
    /// worker claims at once. Larger claims mean fewer store round trips.
    ///
    /// # Default
    /// [`DEFAULT_CLAIM_LINGER`] (2 ms).
    pub fn claim_linger(mut self, d: Duration) -> Self {
        self.claim_linger = d;
        self
    }

    /// Heartbeat interval (at least [`MIN_HEARTBEAT`], 10 ms; at most half the lease).
    ///
    /// # Default
    /// A third of the lease.
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.heartbeat = Some(d);
        self
    }
    /// How often an idle worker looks for work when no wake-up arrives (at least
    /// [`MIN_POLL_INTERVAL`], 1 ms).
    ///
    /// # Default
    /// [`DEFAULT_POLL_INTERVAL`] (250 ms).
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll = d;
        self
    }
    /// How long running attempts may take to finish after shutdown begins before they are
    /// interrupted and their jobs released.
    ///
    /// # Default
    /// [`DEFAULT_SHUTDOWN_GRACE`] (30 s).
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.grace = d;
        self
    }
    /// How often expired leases are rescued (at least [`MIN_RESCUE_INTERVAL`], 10 ms).
    ///
    /// # Default
    /// [`DEFAULT_RESCUE_INTERVAL`] (1 s).
    pub fn rescue_interval(mut self, d: Duration) -> Self {
        self.rescue_every = d;
        self
    }
    /// How often to set the `redrive_jobs` gauges from the store's counts (`None`: never).
    ///
    /// # Default
    /// [`DEFAULT_GAUGE_INTERVAL`] (5 s).
    pub fn gauge_interval(mut self, d: Option<Duration>) -> Self {
        self.gauges_every = d;
        self
    }
    /// How old a cached dependency row may be before it is read again.
    ///
    /// # Default
    /// [`DEFAULT_DEPENDENCY_REFRESH`] (20 ms).
    pub fn dependency_refresh(mut self, d: Duration) -> Self {
        self.dependency_refresh = d;
        self
    }
    /// Seed of the jitter RNGs.
    ///
    /// # Default
    /// [`DEFAULT_SEED`].
    pub fn seed(mut self, s: u64) -> Self {
        self.seed = s;
        self
    }
    /// The worker's name (stored as lease owner and on attempts).
    ///
    /// # Default
    /// `worker-<pid>-<4 random hex digits>`.
    pub fn name(mut self, n: impl Into<String>) -> Self {
        self.name = n.into();
        self
    }
    /// Stop claiming after this many claims.
    ///
    /// # Default
    /// `None`: no limit.
    pub fn max_jobs(mut self, n: Option<u64>) -> Self {
        self.max_jobs = n;
        self
    }
    /// The local clock (tests use [`crate::TokioClock`]). A clock set here is used as it is,
    /// not synced to the database's: call [`WorkerBuilder::sync_clock`] after this to sync it.
    ///
    /// # Default
    /// The system clock, synced to the database's ([`WorkerBuilder::sync_clock`]).
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = c;
        self.sync_clock = false;
        self.db_clock = None;
        self
    }
    /// Whether the worker reads time in the database's clock (R24): a [`DbClock`] over the
    /// local clock, measured when the run starts and every
    /// [`WorkerBuilder::clock_sync_interval`]. Every lease, pause, cool-down, tick and rate
    /// limit it writes, and every expiry it judges, is then in the clock the whole fleet
    /// shares, so a host whose clock is off by seconds steals no live lease.
    ///
    /// # Default
    /// On with the default clock; off once [`WorkerBuilder::clock`] sets one.
    pub fn sync_clock(mut self, on: bool) -> Self {
        self.sync_clock = on;
        self
    }
    /// Reads time from a [`DbClock`] the process shares (the API of `redrive serve` and its
    /// workers use one). The worker measures it at start if it never was; keeping it measured
    /// is its owner's ([`DbClock::spawn_sync`]) unless [`WorkerBuilder::sync_clock`] is set
    /// after this.
    pub fn db_clock(mut self, c: Arc<DbClock>) -> Self {
        self.clock = c.clone();
        self.db_clock = Some(c);
        self.sync_clock = false;
        self
    }
    /// How often a synced clock measures its offset again (at least [`MIN_CLOCK_SYNC`]).
    ///
    /// # Default
    /// [`DEFAULT_CLOCK_SYNC`] (15 s).
    pub fn clock_sync_interval(mut self, d: Duration) -> Self {
        self.clock_sync = d;
        self
    }
    /// Runs every store call on this runtime, from a blocking thread. Only for tests under
    /// tokio's paused clock: a running blocking task stops the paused clock from jumping
    /// ahead while the database answers (connect the store on that runtime too). With the
    /// `test-util` feature only.
    #[cfg(feature = "test-util")]
    pub fn store_runtime(mut self, h: tokio::runtime::Handle) -> Self {
        self.store_runtime = Some(h);
        self
    }
    /// How often the worker refreshes its row in the registry of live workers (at least
    /// [`MIN_REGISTRY_HEARTBEAT`], 10 ms; keep it well below
    /// [`redrive_store::WORKER_STALE_AFTER`]).
    ///
    /// # Default
    /// [`REGISTRY_HEARTBEAT`] (10 s).
    pub fn registry_heartbeat(mut self, d: Duration) -> Self {
        self.registry_heartbeat = d;
        self
    }
    /// Prune finished jobs with these ages and pacing, one pruner per fleet (default: off;
    /// `redrive work` and `serve --workers` turn it on with [`crate::Retention::default`]).
    pub fn retention(mut self, r: Option<crate::Retention>) -> Self {
        self.retention = r;
        self
    }
    /// What a claim does when its dependency's breaker row cannot be read (the store is
    /// unreachable, or the row is corrupt): `None` calls anyway (fail open), `Some(d)` defers
    /// the job by `d` (reason `breaker_unreadable`, not an attempt) and makes no call (fail
    /// closed).
    ///
    /// # Default
    /// `None`, fail open. The trade-off: failing open keeps payments flowing through a store
    /// outage at a healthy PSP, at the price of calls the breaker might have refused (an open
    /// breaker, a `Retry-After` pause, the fleet's rate limit: all unknown meanwhile; the
    /// attempt's record waits for the store, retried while the lease holds). Failing closed
    /// never calls a dependency it cannot see, at the price of no payment at all while the
    /// store cannot be read; choose it when a call against an open breaker costs more (a PSP
    /// that fines or bans excess traffic) than a delay.
    pub fn fail_closed(mut self, defer: Option<Duration>) -> Self {
        self.fail_closed = defer;
        self
    }
    /// Fire the store's schedules, looking for new ones at least this often (default
    /// [`crate::SCHEDULER_CHECK`]; `None`: this worker runs no scheduler).
    pub fn scheduler(mut self, check: Option<Duration>) -> Self {
        self.scheduler = check;
        self
    }
    /// Checks every setting against its bounds: the first one out of them, named with its
    /// value and bound.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return Err(ConfigError::Concurrency {
                value: self.concurrency,
                max: MAX_CONCURRENCY,
            });
        }
        if self.claim_batch == Some(0) {
            return Err(ConfigError::ClaimBatch { value: 0 });
        }
        let durations = [
            ("lease", Some(self.lease), MIN_LEASE),
            ("heartbeat", self.heartbeat, MIN_HEARTBEAT),
            ("poll_interval", Some(self.poll), MIN_POLL_INTERVAL),
            (
                "rescue_interval",
                Some(self.rescue_every),
                MIN_RESCUE_INTERVAL,
            ),
            (
                "registry_heartbeat",
                Some(self.registry_heartbeat),
                MIN_REGISTRY_HEARTBEAT,
            ),
            ("clock_sync_interval", Some(self.clock_sync), MIN_CLOCK_SYNC),
            ("fail_closed", self.fail_closed, MIN_POLL_INTERVAL),
        ];
        for (field, value, min) in durations {
            if let Some(value) = value.filter(|v| *v < min) {
                return Err(ConfigError::TooShort { field, value, min });
            }
        }
        Ok(())
    }

    /// The worker, or the first setting out of its bounds ([`WorkerBuilder::validate`]): no
    /// setting is clamped; a concurrency of 0 or a lease of 100 ms is refused, naming it.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first setting out of its bounds, its value and the bound.
    pub fn build(mut self) -> Result<Worker, ConfigError> {
        self.validate()?;
        if self.sync_clock && self.db_clock.is_none() {
            let synced = Arc::new(DbClock::new(self.clock.clone()));
            self.clock = synced.clone();
            self.db_clock = Some(synced);
        }
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
        Ok(Worker {
            shared: Arc::new(Shared {
                config: self,
                db,
                fleet,
                auth,
                health: PoolHealth::default(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn builder() -> WorkerBuilder {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("q.db").display());
        let store = Store::connect(&url).await.unwrap();
        Worker::builder(store, vec!["q".into()])
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test]
    async fn defaults_are_valid() {
        assert_eq!(builder().await.validate(), Ok(()));
    }

    #[tokio::test]
    async fn concurrency_must_be_1_to_max() {
        let e = builder().await.concurrency(0).validate().unwrap_err();
        assert_eq!(e.to_string(), "concurrency must be 1..=10000, got 0");
        let over = builder().await.concurrency(MAX_CONCURRENCY + 1).validate();
        assert!(matches!(
            over,
            Err(ConfigError::Concurrency { value: 10_001, .. })
        ));
        assert_eq!(builder().await.concurrency(1).validate(), Ok(()));
        assert_eq!(
            builder().await.concurrency(MAX_CONCURRENCY).validate(),
            Ok(())
        );
    }

    #[tokio::test]
    async fn claim_batch_must_be_at_least_1() {
        let e = builder().await.claim_batch(0).validate().unwrap_err();
        assert_eq!(e.to_string(), "claim_batch must be at least 1, got 0");
        assert_eq!(builder().await.claim_batch(1).validate(), Ok(()));
    }

    #[tokio::test]
    async fn each_duration_has_its_minimum() {
        type Set = fn(WorkerBuilder, Duration) -> WorkerBuilder;
        let cases: [(&str, Set, Duration); 6] = [
            ("lease", WorkerBuilder::lease, MIN_LEASE),
            ("heartbeat", WorkerBuilder::heartbeat, MIN_HEARTBEAT),
            (
                "poll_interval",
                WorkerBuilder::poll_interval,
                MIN_POLL_INTERVAL,
            ),
            (
                "rescue_interval",
                WorkerBuilder::rescue_interval,
                MIN_RESCUE_INTERVAL,
            ),
            (
                "registry_heartbeat",
                WorkerBuilder::registry_heartbeat,
                MIN_REGISTRY_HEARTBEAT,
            ),
            (
                "clock_sync_interval",
                WorkerBuilder::clock_sync_interval,
                MIN_CLOCK_SYNC,
            ),
        ];
        for (field, set, min) in cases {
            let below = min - Duration::from_nanos(1);
            let e = set(builder().await, below).validate().unwrap_err();
            assert_eq!(
                e,
                ConfigError::TooShort {
                    field,
                    value: below,
                    min
                }
            );
            assert!(
                e.to_string()
                    .starts_with(&format!("{field} must be at least ")),
                "{e}"
            );
            assert_eq!(
                set(builder().await, min).validate(),
                Ok(()),
                "{field} at its minimum"
            );
        }
        let e = builder().await.lease(ms(100)).validate().unwrap_err();
        assert_eq!(e.to_string(), "lease must be at least 300ms, got 100ms");
    }

    #[tokio::test]
    async fn build_refuses_what_validate_refuses_and_clamps_nothing() {
        let e = builder().await.concurrency(0).build().err().unwrap();
        assert_eq!(e.to_string(), "concurrency must be 1..=10000, got 0");
        let e = builder().await.lease(ms(100)).build().err().unwrap();
        assert_eq!(e.to_string(), "lease must be at least 300ms, got 100ms");
        let e = builder().await.claim_batch(0).build().err().unwrap();
        assert_eq!(e, ConfigError::ClaimBatch { value: 0 });
        // At the bounds, the values are kept as given.
        let w = builder()
            .await
            .concurrency(1)
            .lease(MIN_LEASE)
            .build()
            .unwrap();
        assert_eq!(w.shared.config.concurrency, 1);
        assert_eq!(w.shared.config.lease, MIN_LEASE);
        let w = builder()
            .await
            .concurrency(MAX_CONCURRENCY)
            .build()
            .unwrap();
        assert_eq!(w.shared.config.concurrency, MAX_CONCURRENCY);
    }
}
