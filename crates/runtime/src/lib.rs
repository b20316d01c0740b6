//! The redrive worker runtime (first slice): claims jobs, runs their handlers with a lease
//! heartbeat, asks the policy's one decision function what to do with each outcome, and
//! writes the attempt and the next state through one fenced store call *before* any wait.
//!
//! Not in this slice yet: fleet-wide breakers and pauses, the 401 refresh and status-query
//! hooks, metrics, graceful shutdown with a grace period.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::sync::Arc;
//! use redrive_runtime::{Noop, Worker};
//! use redrive_store::{NewJob, Store};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display())).await.unwrap();
//! store.enqueue(&NewJob::new("q", "noop", serde_json::json!({})), chrono::Utc::now()).await.unwrap();
//! let summary = Worker::builder(store, vec!["q".into()]).handler("noop", Arc::new(Noop)).build()
//!     .run_until_idle().await.unwrap();
//! assert_eq!(summary.succeeded, 1);
//! # });
//! ```

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use redrive_policy::{Action, Outcome, PolicySet, RetryPolicy};
use redrive_store::{
    ClaimParams, Completion, Job, NewAttempt, Store, StoreError, Timestamp, Transition,
};
use tokio_util::sync::CancellationToken;

/// What a handler gets for one attempt.
#[derive(Debug, Clone)]
pub struct JobContext {
    /// The job's id.
    pub job_id: i64,
    /// This attempt's number (1-based, within the job's current run).
    pub attempt: u32,
    /// The job's idempotency key (send it with every call).
    pub key: Option<String>,
    /// The lease's fencing token.
    pub lease_token: i64,
    /// The payload.
    pub payload: serde_json::Value,
    /// Cancelled when the lease is lost: stop and return.
    pub cancel: CancellationToken,
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempted {
    /// The classified outcome.
    pub outcome: Outcome,
    /// The result to store on success.
    pub result: serde_json::Value,
    /// The HTTP status, if the handler made an HTTP call.
    pub http_status: Option<u16>,
    /// Error text (redact secrets before returning it).
    pub error: Option<String>,
}

impl Attempted {
    /// Success with a result.
    pub fn success(result: serde_json::Value) -> Self {
        Self {
            outcome: Outcome::Success,
            result,
            http_status: None,
            error: None,
        }
    }
    /// A failure of the given outcome with an error text.
    pub fn failure(outcome: Outcome, error: impl Into<String>) -> Self {
        Self {
            outcome,
            result: serde_json::Value::Null,
            http_status: None,
            error: Some(error.into()),
        }
    }
}

/// A job kind's code.
pub trait Handler: Send + Sync + std::fmt::Debug {
    /// Runs one attempt.
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted>;
}

/// The built-in `noop` kind: succeeds at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

impl Handler for Noop {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        Box::pin(async { Attempted::success(serde_json::Value::Null) })
    }
}

/// What a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Jobs that went to the dead-letter table.
    pub dead: u64,
    /// Jobs deferred (back in the queue for later).
    pub deferred: u64,
    /// Claims whose lease was lost (nothing written).
    pub lease_lost: u64,
    /// Attempts made.
    pub attempts: u64,
}

impl Summary {
    /// Adds another run's counts to these.
    pub fn add(&mut self, o: Summary) {
        self.succeeded += o.succeeded;
        self.dead += o.dead;
        self.deferred += o.deferred;
        self.lease_lost += o.lease_lost;
        self.attempts += o.attempts;
    }

    /// Claims that ended (succeeded, dead, deferred or lost).
    pub fn finished(&self) -> u64 {
        self.succeeded + self.dead + self.deferred + self.lease_lost
    }
}

/// The runtime's errors.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Builds a [`Worker`].
#[derive(Debug)]
pub struct WorkerBuilder {
    store: Store,
    queues: Vec<String>,
    handlers: HashMap<String, Arc<dyn Handler>>,
    policies: PolicySet,
    concurrency: usize,
    lease: Duration,
    seed: u64,
    name: String,
    max_jobs: Option<u64>,
}

impl WorkerBuilder {
    /// Registers a handler for a job kind.
    pub fn handler(mut self, kind: impl Into<String>, h: Arc<dyn Handler>) -> Self {
        self.handlers.insert(kind.into(), h);
        self
    }
    /// The policies jobs name (default: the built-in presets).
    pub fn policies(mut self, p: PolicySet) -> Self {
        self.policies = p;
        self
    }
    /// Jobs run at once (default 8).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }
    /// Lease length (default 30 s; heartbeats every third of it).
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d.max(Duration::from_millis(300));
        self
    }
    /// Seed of the jitter RNG.
    pub fn seed(mut self, s: u64) -> Self {
        self.seed = s;
        self
    }
    /// Stop after this many jobs.
    pub fn max_jobs(mut self, n: Option<u64>) -> Self {
        self.max_jobs = n;
        self
    }
    /// The worker.
    pub fn build(self) -> Worker {
        Worker {
            inner: Arc::new(self),
        }
    }
}

/// A pool of job runners over some queues.
#[derive(Debug, Clone)]
pub struct Worker {
    inner: Arc<WorkerBuilder>,
}

impl Worker {
    /// A builder for a worker on `queues`.
    pub fn builder(store: Store, queues: Vec<String>) -> WorkerBuilder {
        WorkerBuilder {
            store,
            queues,
            handlers: HashMap::new(),
            policies: PolicySet::builtin(),
            concurrency: 8,
            lease: Duration::from_secs(30),
            seed: 0x5eed,
            name: format!("worker-{}", std::process::id()),
            max_jobs: None,
        }
    }

    /// Runs until no job is due (jobs deferred to later are left for a later run) or
    /// `max_jobs` have finished their claim.
    pub async fn run_until_idle(&self) -> Result<Summary, RuntimeError> {
        let w = &self.inner;
        let mut total = Summary::default();
        let mut claimed_total = 0u64;
        loop {
            let now = chrono::Utc::now();
            w.store.rescue(now, 1000).await?;
            let mut limit = w.concurrency as u64;
            if let Some(m) = w.max_jobs {
                limit = limit.min(m.saturating_sub(claimed_total));
            }
            if limit == 0 {
                return Ok(total);
            }
            let jobs = w
                .store
                .claim(&ClaimParams {
                    queues: w.queues.clone(),
                    worker: w.name.clone(),
                    limit: limit as u32,
                    lease: w.lease,
                    now,
                })
                .await?;
            if jobs.is_empty() {
                return Ok(total);
            }
            claimed_total += jobs.len() as u64;
            let mut tasks = Vec::new();
            for job in jobs {
                let me = self.clone();
                tasks.push(tokio::spawn(async move { me.execute(job).await }));
            }
            for t in tasks {
                match t.await {
                    Ok(Ok(s)) => total.add(s),
                    Ok(Err(e)) => return Err(e),
                    Err(e) => tracing::error!("job task failed: {e}"),
                }
            }
        }
    }

    fn policy(&self, job: &Job) -> RetryPolicy {
        self.inner
            .policies
            .get(&job.policy)
            .cloned()
            .unwrap_or_else(|_| RetryPolicy::payment())
    }

    /// One claim: attempts until the job is done, dead, deferred or its lease is lost.
    async fn execute(&self, job: Job) -> Result<Summary, RuntimeError> {
        let w = &self.inner;
        let mut s = Summary::default();
        let policy = self.policy(&job);
        let mut rng = SmallRng::seed_from_u64(
            w.seed ^ (job.id as u64).rotate_left(17) ^ u64::from(job.attempts),
        );
        let cancel = CancellationToken::new();
        let heartbeat = self.spawn_heartbeat(&job, cancel.clone());
        let lease = job.lease();
        let mut counters = job.counters();
        let handler = w.handlers.get(&job.kind).cloned();
        let result = loop {
            let started = chrono::Utc::now();
            let attempted = match &handler {
                None => Attempted::failure(
                    Outcome::Permanent,
                    format!("no handler for job kind {:?}", job.kind),
                ),
                Some(h) => {
                    let ctx = JobContext {
                        job_id: job.id,
                        attempt: counters.attempts + 1,
                        key: job.key.clone(),
                        lease_token: lease.token,
                        payload: job.payload.clone(),
                        cancel: cancel.clone(),
                    };
                    match AssertUnwindSafe(h.run(ctx)).catch_unwind().await {
                        Ok(a) => a,
                        Err(p) => Attempted::failure(
                            Outcome::Exception,
                            format!("handler panicked: {}", panic_text(&p)),
                        ),
                    }
                }
            };
            s.attempts += 1;
            if cancel.is_cancelled() {
                s.lease_lost += 1;
                break Ok(());
            }
            let now = chrono::Utc::now();
            let verdict = policy.decide(&counters, &attempted.outcome, now, &mut rng);
            let (transition, again) = match verdict.action {
                Action::Done => (
                    Transition::Succeeded {
                        result: attempted.result.clone(),
                    },
                    None,
                ),
                Action::RefreshCredentials => (
                    Transition::RetryInProcess {
                        delay: Duration::ZERO,
                    },
                    Some(Duration::ZERO),
                ),
                Action::RetryInProcess { delay, .. } => {
                    (Transition::RetryInProcess { delay }, Some(delay))
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
                    None,
                ),
                Action::Dead { reason } => (Transition::Dead { reason }, None),
            };
            let c = Completion {
                lease,
                attempt: Some(NewAttempt {
                    worker: Some(w.name.clone()),
                    started_at: started,
                    duration: (now - started).to_std().unwrap_or_default(),
                    class: attempted.outcome.class(),
                    http_status: attempted.http_status,
                    error: attempted.error.clone(),
                    counted: verdict.counted,
                }),
                counters: verdict.counters,
                transition: transition.clone(),
                error: attempted.error.clone(),
                now,
            };
            // The attempt is recorded before any wait.
            match w.store.complete(&c).await {
                Err(e) if e.is_lease_lost() => {
                    s.lease_lost += 1;
                    break Ok(());
                }
                Err(e) => break Err(e.into()),
                Ok(()) => {}
            }
            counters = verdict.counters;
            match (transition, again) {
                (_, Some(delay)) => {
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = cancel.cancelled() => { s.lease_lost += 1; break Ok(()); }
                    }
                }
                (Transition::Succeeded { .. }, None) => {
                    s.succeeded += 1;
                    break Ok(());
                }
                (Transition::Dead { .. }, None) => {
                    s.dead += 1;
                    break Ok(());
                }
                (_, None) => {
                    s.deferred += 1;
                    break Ok(());
                }
            }
        };
        heartbeat.abort();
        result.map(|()| s)
    }

    fn spawn_heartbeat(&self, job: &Job, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        let store = self.inner.store.clone();
        let lease = job.lease();
        let len = self.inner.lease;
        tokio::spawn(async move {
            let mut until: Timestamp = job_until(len);
            loop {
                tokio::time::sleep(len / 3).await;
                match store.heartbeat(lease, len, chrono::Utc::now()).await {
                    Ok(t) => until = t,
                    Err(e) if e.is_lease_lost() => {
                        cancel.cancel();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!("heartbeat for job {} failed: {e}", lease.job_id);
                        // The store is unreachable: stop the handler before the lease runs out.
                        if chrono::Utc::now()
                            + chrono::Duration::from_std(len / 3).unwrap_or_default()
                            >= until
                        {
                            cancel.cancel();
                            return;
                        }
                    }
                }
            }
        })
    }
}

fn job_until(len: Duration) -> Timestamp {
    chrono::Utc::now() + chrono::Duration::from_std(len).unwrap_or_default()
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".into())
}
