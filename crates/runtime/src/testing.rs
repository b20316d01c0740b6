//! Test helpers for programs that embed redrive (feature `testing`): a queue in a temporary
//! SQLite file, a clock that moves only when the test moves it, a worker run to idle with the
//! clock jumping to each retry, and assertions on what was enqueued.
//!
//! ```toml
//! [dev-dependencies]
//! redrive-runtime = { version = "0.1.0", features = ["testing"] }
//! ```
//!
//! - [`TestStore`]: a fresh, migrated SQLite store in a temporary directory (removed on drop),
//!   with its [`TestClock`]. Enqueue through [`TestStore::enqueue`] (at the clock's time) or
//!   through [`TestStore::store`] from the code under test.
//! - [`TestStore::worker`]: a [`WorkerBuilder`] on that store and clock; add your handlers.
//! - [`TestStore::drain`]: runs the worker until nothing of its kinds is left to do, moving the
//!   clock to each deferred job's time instead of waiting for it. Backoffs of an hour take no
//!   time. Retries the policy sleeps in process (waits up to its `in_process_max_wait`) are
//!   real sleeps: give test policies `with_in_process_max_wait(Duration::ZERO)` to make every
//!   retry a defer.
//! - [`TestStore::assert_enqueued`], [`TestStore::assert_not_enqueued`] and
//!   [`TestStore::jobs`]: what is in the queue, by queue, kind, key, state and payload
//!   ([`JobMatch`]).
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::time::Duration;
//! use redrive_policy::{Outcome, RetryPolicy};
//! use redrive_runtime::{Attempted, JobContext, typed};
//! use redrive_runtime::testing::{JobMatch, TestStore};
//! use redrive_store::{JobState, NewJob};
//! use serde_json::json;
//!
//! let t = TestStore::new().await.unwrap();
//! // The code under test enqueues a receipt...
//! t.enqueue(NewJob::new("emails", "receipt", json!({"order": 42, "to": "a@example.com"}))
//!     .key("receipt-42")).await.unwrap();
//! // ...and the test checks it, by any of queue, kind, key, state and (part of) the payload.
//! t.assert_enqueued(&JobMatch::new().kind("receipt").key("receipt-42")
//!     .payload_includes(json!({"order": 42}))).await;
//! t.assert_not_enqueued(&JobMatch::new().kind("receipt").key("receipt-43")).await;
//!
//! // A handler that fails twice, then succeeds: its retries are deferred an hour each, and
//! // drain moves the clock instead of waiting.
//! let policy = RetryPolicy::builder("charge").with_max_attempts(5).with_window(Duration::from_secs(86_400))
//!     .with_in_process_max_wait(Duration::ZERO).build().unwrap();
//! let charge = typed(|_: serde_json::Value, ctx: JobContext| async move {
//!     if ctx.attempt < 3 {
//!         Attempted::failure(Outcome::Infrastructure { retry_after: Some(Duration::from_secs(3600)) }, "503")
//!     } else {
//!         Attempted::success(json!({"charged": true}))
//!     }
//! });
//! let mut policies = redrive_policy::PolicySet::builtin();
//! policies.insert(policy.clone());
//! t.enqueue(NewJob::new("payments", "charge", json!({})).key("order-43").with_policy(&policy))
//!     .await.unwrap();
//! let worker = t.worker(vec!["payments".into()]).handler("charge", charge).policies(policies)
//!     .build().unwrap();
//! let before = t.clock().now();
//! let summary = t.drain(&worker).await.unwrap();
//! assert_eq!((summary.succeeded, summary.attempts), (1, 3));
//! assert!(t.clock().now() - before >= chrono::Duration::hours(2), "{}", t.clock().now());
//! let done = t.assert_enqueued(&JobMatch::new().key("order-43").state(JobState::Succeeded)).await;
//! assert_eq!(done.attempts, 3);
//! # });
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redrive_policy::Timestamp;
use redrive_store::{
    Clock, Enqueued, Job, JobState, ListParams, ManualClock, NewJob, Store, StoreError,
};

use crate::{RuntimeError, Summary, Worker, WorkerBuilder};

/// Where a [`TestClock::new`] starts: 2026-01-01T00:00:00Z, in milliseconds since the Unix
/// epoch. A fixed start, so that a test's times are the same on every run.
pub const TEST_CLOCK_START_MILLIS: i64 = 1_767_225_600_000;

/// How far [`TestStore::drain`] moves the clock when jobs are waiting but none could run and
/// none is due later (a paused dependency, an open breaker cooling down).
pub const DRAIN_IDLE_STEP: Duration = Duration::from_secs(10);

/// How much test-clock time [`TestStore::drain`] lets pass without any claim ending before it
/// gives up ([`TestingError::NotDrained`]): jobs that no run of the worker can take (another
/// queue, a dependency paused until resumed).
pub const DRAIN_STALL_LIMIT: Duration = Duration::from_secs(600);

/// How many runs [`TestStore::drain`] makes at most before it gives up.
pub const DRAIN_MAX_RUNS: u32 = 10_000;

/// A clock that moves only when the test moves it. Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use redrive_runtime::testing::TestClock;
/// use redrive_store::Clock;
///
/// let clock = TestClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(90));
/// let shared = clock.clone();
/// assert_eq!((shared.now() - start).num_seconds(), 90);
/// ```
#[derive(Debug, Clone)]
pub struct TestClock(Arc<ManualClock>);

impl TestClock {
    /// A clock stopped at 2026-01-01T00:00:00Z ([`TEST_CLOCK_START_MILLIS`]).
    pub fn new() -> Self {
        Self(Arc::new(ManualClock::at_millis(TEST_CLOCK_START_MILLIS)))
    }

    /// A clock stopped at `t`.
    pub fn at(t: Timestamp) -> Self {
        Self(Arc::new(ManualClock::new(t)))
    }

    /// The clock's time.
    pub fn now(&self) -> Timestamp {
        self.0.now()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.advance(by);
    }

    /// Sets the clock to `to` (also backwards: a host whose clock was stepped back).
    pub fn set(&self, to: Timestamp) {
        self.0.set(to);
    }

    /// The clock as the store's and the worker's [`Clock`] (for
    /// [`WorkerBuilder::clock`]); it shares its time with `self`.
    pub fn shared(&self) -> Arc<dyn Clock> {
        Arc::new(self.clone())
    }
}

impl Default for TestClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        self.0.now()
    }
}

/// What the helpers can fail with (the assertions panic instead, as test assertions do).
#[derive(Debug, thiserror::Error)]
pub enum TestingError {
    /// The temporary directory for the SQLite file could not be made.
    #[error("creating a temporary directory for the test store: {0}")]
    TempDir(#[source] std::io::Error),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The worker failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// [`TestStore::drain`] gave up: jobs of the worker's kinds were still waiting, and no
    /// claim had ended while the clock moved [`DRAIN_STALL_LIMIT`] (or after
    /// [`DRAIN_MAX_RUNS`] runs).
    #[error("drain gave up after {runs} runs, the clock at {now}: jobs still waiting: {waiting}")]
    NotDrained {
        /// Runs made.
        runs: u32,
        /// The clock's time when it gave up.
        now: Timestamp,
        /// The waiting jobs (id, queue, kind, key, state, run_at, defer reason).
        waiting: String,
    },
}

/// Which jobs an assertion is about: every condition set must hold (none set: every job).
///
/// ```
/// use redrive_runtime::testing::JobMatch;
/// use redrive_store::JobState;
/// use serde_json::json;
///
/// let m = JobMatch::new().queue("payments").kind("charge").key("order-42")
///     .state(JobState::Available).payload_includes(json!({"amount": 500}));
/// assert_eq!(m.to_string(),
///     r#"queue=payments kind=charge key=order-42 state=available payload includes {"amount":500}"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobMatch {
    queue: Option<String>,
    kind: Option<String>,
    key: Option<String>,
    state: Option<JobState>,
    payload: Option<PayloadMatch>,
}

#[derive(Debug, Clone, PartialEq)]
enum PayloadMatch {
    Exactly(serde_json::Value),
    Includes(serde_json::Value),
}

impl JobMatch {
    /// Every job.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only jobs on this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Only jobs of this kind.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Only the job with this idempotency key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Only jobs in this state.
    pub fn state(mut self, state: JobState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only jobs whose payload equals `payload`.
    pub fn payload(mut self, payload: serde_json::Value) -> Self {
        self.payload = Some(PayloadMatch::Exactly(payload));
        self
    }

    /// Only jobs whose payload includes `part`: every member of an object in `part` is in the
    /// payload with a value that includes it in turn (objects recursively); any other value
    /// (a number, a string, an array) must be equal.
    ///
    /// ```
    /// use redrive_runtime::testing::JobMatch;
    /// use serde_json::json;
    /// let payload = json!({"amount": 500, "card": {"brand": "visa", "last4": "4242"}});
    /// assert!(JobMatch::includes(&payload, &json!({"card": {"brand": "visa"}})));
    /// assert!(!JobMatch::includes(&payload, &json!({"card": {"brand": "amex"}})));
    /// assert!(!JobMatch::includes(&payload, &json!({"currency": "EUR"})));
    /// ```
    pub fn payload_includes(mut self, part: serde_json::Value) -> Self {
        self.payload = Some(PayloadMatch::Includes(part));
        self
    }

    /// Whether `value` includes `part` (see [`JobMatch::payload_includes`]).
    pub fn includes(value: &serde_json::Value, part: &serde_json::Value) -> bool {
        match (value, part) {
            (serde_json::Value::Object(v), serde_json::Value::Object(p)) => p
                .iter()
                .all(|(k, pv)| v.get(k).is_some_and(|vv| Self::includes(vv, pv))),
            _ => value == part,
        }
    }

    /// Whether `job` meets every condition.
    pub fn matches(&self, job: &Job) -> bool {
        self.queue.as_ref().is_none_or(|q| *q == job.queue)
            && self.kind.as_ref().is_none_or(|k| *k == job.kind)
            && self
                .key
                .as_ref()
                .is_none_or(|k| job.key.as_deref() == Some(k.as_str()))
            && self.state.is_none_or(|s| s == job.state)
            && match &self.payload {
                None => true,
                Some(PayloadMatch::Exactly(p)) => *p == job.payload,
                Some(PayloadMatch::Includes(p)) => Self::includes(&job.payload, p),
            }
    }
}

impl fmt::Display for JobMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(q) = &self.queue {
            parts.push(format!("queue={q}"));
        }
        if let Some(k) = &self.kind {
            parts.push(format!("kind={k}"));
        }
        if let Some(k) = &self.key {
            parts.push(format!("key={k}"));
        }
        if let Some(s) = self.state {
            parts.push(format!("state={}", s.as_str()));
        }
        match &self.payload {
            None => {}
            Some(PayloadMatch::Exactly(p)) => parts.push(format!("payload = {p}")),
            Some(PayloadMatch::Includes(p)) => parts.push(format!("payload includes {p}")),
        }
        if parts.is_empty() {
            f.write_str("any job")
        } else {
            f.write_str(&parts.join(" "))
        }
    }
}

/// A queue for one test: a migrated SQLite file in a temporary directory (deleted when this is
/// dropped) and the [`TestClock`] every helper reads.
#[derive(Debug)]
pub struct TestStore {
    store: Store,
    clock: TestClock,
    url: String,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestStore {
    /// A fresh store with a [`TestClock::new`].
    ///
    /// # Errors
    /// [`TestingError::TempDir`], or the store's error opening the file.
    pub async fn new() -> Result<Self, TestingError> {
        Self::with_clock(TestClock::new()).await
    }

    /// A fresh store read with `clock`.
    ///
    /// # Errors
    /// [`TestingError::TempDir`], or the store's error opening the file.
    pub async fn with_clock(clock: TestClock) -> Result<Self, TestingError> {
        let dir = tempfile::Builder::new()
            .prefix("redrive-test-")
            .tempdir()
            .map_err(TestingError::TempDir)?;
        let path = dir.path().join("queue.db");
        let url = format!("sqlite:{}", path.display());
        let store = Store::connect(&url).await?;
        Ok(Self {
            store,
            clock,
            url,
            path,
            _dir: dir,
        })
    }

    /// The store (a cheap clone of it is a handle on the same database).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The clock the helpers and the workers of [`TestStore::worker`] read.
    pub fn clock(&self) -> &TestClock {
        &self.clock
    }

    /// The store's URL (`sqlite:…`), for code under test that connects by itself, or for the
    /// `redrive` binary (`--db`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The SQLite file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Enqueues `job` at the clock's time.
    ///
    /// # Errors
    /// The store's (a refused job names its field).
    pub async fn enqueue(&self, job: NewJob) -> Result<Enqueued, StoreError> {
        self.store.enqueue(&job, self.clock.now()).await
    }

    /// A worker on `queues` (empty: every queue) of this store, on this store's clock (not
    /// synced to the database's), running no scheduler. Add handlers (and policies) and
    /// build it.
    pub fn worker(&self, queues: Vec<String>) -> WorkerBuilder {
        Worker::builder(self.store.clone(), queues)
            .clock(self.clock.shared())
            .scheduler(None)
    }

    /// Runs `worker` to idle ([`Worker::run_until_idle`]) again and again until no job of its
    /// kinds is waiting in any queue, moving the clock between runs to the next job's time
    /// (or by [`DRAIN_IDLE_STEP`] when the next job is already due but could not run: a
    /// paused dependency, an open breaker). Returns the runs' counts added up.
    ///
    /// # Errors
    /// The worker's; [`TestingError::NotDrained`] naming the waiting jobs when no claim
    /// ended while the clock moved [`DRAIN_STALL_LIMIT`], or after [`DRAIN_MAX_RUNS`] runs.
    pub async fn drain(&self, worker: &Worker) -> Result<Summary, TestingError> {
        let kinds = worker.kinds();
        let mut total = Summary::default();
        let mut progress_at = self.clock.now();
        for runs in 1..=DRAIN_MAX_RUNS {
            let run = worker.run_until_idle().await?;
            total.add(run);
            let now = self.clock.now();
            if run.finished() > 0 {
                progress_at = now;
            }
            let Some(next) = self.store.next_due_for(&[], &kinds).await? else {
                return Ok(total);
            };
            let stalled = (now - progress_at).to_std().unwrap_or_default();
            if stalled >= DRAIN_STALL_LIMIT || runs == DRAIN_MAX_RUNS {
                return Err(TestingError::NotDrained {
                    runs,
                    now,
                    waiting: self.describe_waiting(&kinds).await?,
                });
            }
            if next > now {
                self.clock.set(next);
            } else {
                self.clock.advance(DRAIN_IDLE_STEP);
            }
        }
        unreachable!("the last run returns")
    }

    /// The waiting jobs of `kinds`, one line each, for [`TestingError::NotDrained`].
    async fn describe_waiting(&self, kinds: &redrive_store::Kinds) -> Result<String, StoreError> {
        let jobs = self.all_jobs().await?;
        let lines: Vec<String> = jobs
            .iter()
            .filter(|j| !j.state.is_final() && kinds.contains(&j.kind))
            .map(|j| {
                format!(
                    "#{} {}/{} key={} {} run_at={}{}",
                    j.id,
                    j.queue,
                    j.kind,
                    j.key.as_deref().unwrap_or("-"),
                    j.state.as_str(),
                    j.run_at.to_rfc3339(),
                    j.defer_reason
                        .map(|r| format!(" ({})", r.as_str()))
                        .unwrap_or_default(),
                )
            })
            .collect();
        Ok(lines.join("; "))
    }

    /// Every job in the store, by id.
    async fn all_jobs(&self) -> Result<Vec<Job>, StoreError> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .store
                .list(&ListParams {
                    after,
                    limit: Some(1000),
                    ..Default::default()
                })
                .await?;
            out.extend(page.jobs);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(out),
            }
        }
    }

    /// The jobs that match `m`, by id.
    ///
    /// # Errors
    /// The store's.
    pub async fn jobs(&self, m: &JobMatch) -> Result<Vec<Job>, StoreError> {
        let mut jobs = self.all_jobs().await?;
        jobs.retain(|j| m.matches(j));
        Ok(jobs)
    }

    /// The one job that matches `m`.
    ///
    /// # Panics
    /// When no job or more than one matches (the message lists every job in the store), or
    /// the store fails.
    pub async fn assert_enqueued(&self, m: &JobMatch) -> Job {
        let all = self.all_jobs().await.expect("reading the test store");
        let mut found: Vec<Job> = all.iter().filter(|j| m.matches(j)).cloned().collect();
        match found.len() {
            1 => found.remove(0),
            0 => panic!(
                "expected one job with {m}, found none; the store holds: {}",
                listing(&all)
            ),
            n => panic!("expected one job with {m}, found {n}: {}", listing(&found)),
        }
    }

    /// That no job matches `m`.
    ///
    /// # Panics
    /// When one does (the message lists them), or the store fails.
    pub async fn assert_not_enqueued(&self, m: &JobMatch) {
        let found = self.jobs(m).await.expect("reading the test store");
        assert!(
            found.is_empty(),
            "expected no job with {m}, found {}: {}",
            found.len(),
            listing(&found)
        );
    }
}

/// Jobs, one per line, as the assertions' messages show them.
fn listing(jobs: &[Job]) -> String {
    if jobs.is_empty() {
        return "no jobs".into();
    }
    jobs.iter()
        .map(|j| {
            format!(
                "\n  #{} queue={} kind={} key={} state={} payload={}",
                j.id,
                j.queue,
                j.kind,
                j.key.as_deref().unwrap_or("-"),
                j.state.as_str(),
                j.payload
            )
        })
        .collect()
}
