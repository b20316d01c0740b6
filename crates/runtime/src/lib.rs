//! The redrive worker runtime: claims jobs, runs their handlers with a lease heartbeat, asks
//! the policy's one decision function what to do with each outcome, and writes the attempt and
//! the next state through one fenced store call *before* any wait.
//!
//! - **Retry or defer** (decision table, docs/design.md): a wait ≤ `in_process_max_wait` is slept
//!   by the same worker holding its lease (heartbeats continue); a longer one is a defer.
//! - **401**: one `refresh_credentials` per process for every job that hit it at once, not an
//!   attempt; the second 401 in a row is final. **Ambiguous timeout**: the `query_status` hook
//!   decides, else the job dies `ambiguous` (unless the handler says a repeat is safe).
//! - **Fleet-wide breakers and pauses** ([`fleet`](crate) module docs): openings, probes and
//!   `Retry-After` pauses are shared through the store; blocked jobs are deferred without an
//!   attempt, and the claim query does not even pick them.
//! - **Graceful shutdown**: [`Worker::run`] with a cancellation token.
//! - **Metrics** under stable names ([`metrics`]), a tracing span per attempt.
//! - **One clock** ([`DbClock`]): by default every time a worker writes to shared rows or
//!   compares with them (leases, pauses, cool-downs, ticks) is in the database's clock, through
//!   its measured offset, so a host whose clock is off steals no lease (R24).
//! - **Retention and periodic jobs**: with [`WorkerBuilder::retention`] the worker prunes
//!   finished jobs (one pruner per fleet, by a lease in the store, in small paced batches);
//!   it fires the store's schedules at each tick (on by default; [`WorkerBuilder::scheduler`]).
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::sync::Arc;
//! use redrive_runtime::{Attempted, JobContext, Worker, typed};
//! use redrive_store::{NewJob, Store};
//!
//! #[derive(serde::Deserialize)]
//! struct Charge { amount: u64 }
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display())).await.unwrap();
//! store.enqueue(&NewJob::new("payments", "charge", serde_json::json!({"amount": 500})),
//!     chrono::Utc::now()).await.unwrap();
//! let charge = typed(|c: Charge, _ctx: JobContext| async move {
//!     Attempted::success(serde_json::json!({ "charged": c.amount }))
//! });
//! let summary = Worker::builder(store, vec!["payments".into()]).handler("charge", charge).build().unwrap()
//!     .run_until_idle().await.unwrap();
//! assert_eq!(summary.succeeded, 1);
//! # });
//! ```

mod clock;
mod clock_sync;
mod completer;
mod db;
mod declines;
mod fleet;
mod handler;
mod live;
mod maintenance;
pub mod metrics;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;
mod worker;

pub use clock::TokioClock;
pub use clock_sync::{
    CLOCK_SAMPLES, CLOCK_WARN_CHANGE, CLOCK_WARN_OFFSET, DEFAULT_CLOCK_SYNC, DbClock,
};
pub use handler::{Attempted, Handler, JobContext, Noop, StatusAnswer, typed};
pub use live::LivePolicies;
pub use maintenance::{Retention, SCHEDULER_CHECK, prune};
pub use worker::{
    ConfigError, DEFAULT_CLAIM_BATCH, DEFAULT_CLAIM_LINGER, DEFAULT_CONCURRENCY,
    DEFAULT_DEPENDENCY_REFRESH, DEFAULT_GAUGE_INTERVAL, DEFAULT_LEASE, DEFAULT_POLL_INTERVAL,
    DEFAULT_RESCUE_INTERVAL, DEFAULT_SEED, DEFAULT_SHUTDOWN_GRACE, MAX_CONCURRENCY, MIN_CLOCK_SYNC,
    MIN_HEARTBEAT, MIN_LEASE, MIN_POLL_INTERVAL, MIN_REGISTRY_HEARTBEAT, MIN_RESCUE_INTERVAL,
    PoolHealth, REGISTRY_HEARTBEAT, RuntimeError, Summary, Worker, WorkerBuilder,
};
