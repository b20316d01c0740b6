//! The worker: a claim loop feeding a bounded set of job tasks, and the executor that runs one
//! claim through the decision table.
//!
//! - `config`: the settings and their builder;
//! - `run_loop`: the claim loop (housekeeping, slots, claim, spawn, drain);
//! - `execute`: one claim in phases (start, admit, card rules, call, classify, decide,
//!   record, wait);
//! - `heartbeat`: the lease heartbeat and the registry row;
//! - `health`: the pool's health and the claim backoff.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use redrive_store::{Kinds, Store, StoreError, WorkerInfo};
use tokio_util::sync::CancellationToken;

use crate::completer::Completer;
use crate::db::Db;
use crate::fleet::Fleet;
use crate::metrics;

mod config;
mod execute;
mod health;
mod heartbeat;
mod run_loop;

pub use config::*;
pub use health::PoolHealth;
use run_loop::TaskEnd;

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

/// What a worker's clones and its runs share: the settings, the store, the fleet view of the
/// dependencies, the credentials gates and the health.
#[derive(Debug)]
struct Shared {
    config: WorkerBuilder,
    db: Db,
    fleet: Fleet,
    auth: HashMap<String, Arc<AuthGate>>,
    health: PoolHealth,
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
/// let summary = Worker::builder(store, vec!["q".into()]).handler("noop", Arc::new(Noop)).build().unwrap()
///     .run_until_idle().await.unwrap();
/// assert_eq!(summary.succeeded, 1);
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct Worker {
    shared: Arc<Shared>,
}

/// One run's shared parts.
struct Run {
    shared: Arc<Shared>,
    completer: Completer,
    stop: CancellationToken,
    hard: CancellationToken,
}

impl Worker {
    /// A builder for a worker on `queues` (empty: every queue in the store, looked up again
    /// every few seconds).
    pub fn builder(store: Store, queues: Vec<String>) -> WorkerBuilder {
        WorkerBuilder::new(store, queues)
    }

    /// The kinds this worker claims: those it has handlers for.
    pub fn kinds(&self) -> Kinds {
        Kinds::only(self.shared.config.handlers.keys().cloned())
    }

    /// This worker's row in the registry of live workers (`redrive workers`).
    fn info(&self, now: redrive_store::Timestamp) -> WorkerInfo {
        let config = &self.shared.config;
        WorkerInfo {
            name: config.name.clone(),
            host: redrive_store::host_name(),
            pid: std::process::id(),
            queues: config.queues.clone(),
            kinds: self.kinds(),
            concurrency: u32::try_from(config.concurrency).unwrap_or(u32::MAX),
            started_at: now,
            last_seen: now,
            clock_offset_ms: self.clock_offset_ms(),
            policy_version: config.policies.label(),
        }
    }

    /// The measured offset of this worker's clock to the database's, in milliseconds (`None`
    /// when its clock is not synced, or not measured yet).
    fn clock_offset_ms(&self) -> Option<i64> {
        self.shared.config.db_clock.as_ref()?.offset_ms()
    }

    /// Whether this worker's pool is running (see [`PoolHealth`]).
    pub fn health(&self) -> PoolHealth {
        self.shared.health.clone()
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
        let sync = self.start_clock(&registry_stop).await;
        let registry = self.spawn_registry(registry_stop.clone());
        let r = self.run_loop(stop, until_idle).await;
        registry_stop.cancel();
        let _ = registry.await;
        if let Some(sync) = sync {
            let _ = sync.await;
        }
        r
    }

    /// Measures the synced clock's offset before the first claim (if this worker syncs it, or
    /// it never was), and with [`WorkerBuilder::sync_clock`] keeps measuring it until `stop`.
    /// A failure is logged: the clock reads the local time until a measurement succeeds.
    async fn start_clock(&self, stop: &CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
        let config = &self.shared.config;
        let clock = config.db_clock.clone()?;
        if (config.sync_clock || clock.offset().is_none())
            && let Err(e) = clock.sync_on(&self.shared.db).await
        {
            tracing::warn!("measuring the clock's offset to the database failed: {e}");
        }
        config
            .sync_clock
            .then(|| clock.spawn_sync_on(self.shared.db.clone(), config.clock_sync, stop.clone()))
    }
}

/// Adds a job task's end to the run's: a failed task is logged with its job and counted, and
/// its job is left to its lease (the heartbeat stopped with the task, so the lease runs out
/// and the job is rescued); the pool goes on.
fn absorb(
    r: Result<Vec<TaskEnd>, tokio::task::JoinError>,
    total: &mut Summary,
    health: &PoolHealth,
) {
    match r {
        Ok(ends) => ends
            .into_iter()
            .for_each(|e| absorb_one(Ok(e), total, health)),
        Err(e) => absorb_one(Err(e), total, health),
    }
}

/// [`absorb`] for one job.
fn absorb_one(
    r: Result<TaskEnd, tokio::task::JoinError>,
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
        health.task_failed();
    }
}

/// Counts a lost lease.
fn lost_lease(s: &mut Summary) {
    s.lease_lost += 1;
    metrics::lease_lost();
}

/// A panic's message.
fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".into())
}
