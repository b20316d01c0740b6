//! Durable job storage for redrive: an embedded SQLite file (the default) or a shared
//! PostgreSQL database, with leases, fencing tokens and fleet-wide dependency state.
//!
//! Every write by a worker carries its lease's fencing token and is refused once the token is
//! stale ([`StoreError::LeaseLost`]): a worker whose lease expired and was rescued can no longer
//! change the job. Time is always passed in (`now`), so every operation is testable exactly.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::time::Duration;
//! use redrive_store::{ClaimParams, Completion, Kinds, NewJob, Store, Transition};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display())).await.unwrap();
//! let now = chrono::Utc::now();
//! let e = store.enqueue(&NewJob::new("payments", "noop", serde_json::json!({})).key("k1"), now).await.unwrap();
//! assert!(e.created);
//! // The same key again: the same job.
//! let again = store.enqueue(&NewJob::new("payments", "noop", serde_json::json!({})).key("k1"), now).await.unwrap();
//! assert_eq!((again.job.id, again.created), (e.job.id, false));
//!
//! let jobs = store.claim(&ClaimParams { queues: vec!["payments".into()],
//!     kinds: Kinds::only(["noop"]), worker: "w1".into(), limit: 10, lease: Duration::from_secs(30), now }).await.unwrap();
//! let job = &jobs[0];
//! store.complete(&Completion { lease: job.lease(), attempt: None, counters: job.counters(),
//!     transition: Transition::Succeeded { result: serde_json::json!({"ok": true}) },
//!     error: None, now, decline: None }).await.unwrap();
//! # });
//! ```

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("redrive-store needs a backend: enable the feature `sqlite`, `postgres` or both");

/// Runs `$e` with `$s` bound to the [`Store`]'s backend (enum dispatch; defined before the
/// modules so that they can use it too).
macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            $crate::Store::Sqlite($s) => $e,
            #[cfg(feature = "postgres")]
            $crate::Store::Postgres($s) => $e,
        }
    };
}

mod batch;
mod clock;
mod connections;
mod error;
mod insights;
mod json_ms;
pub mod labels;
mod migrations;
mod model;
mod operator;
mod ops;
#[cfg(feature = "postgres")]
mod pg_server;
#[cfg(feature = "postgres")]
mod pg_url;
mod policies;
#[cfg(feature = "postgres")]
mod postgres;
mod quota;
mod retention;
mod rows;
mod schedule;
mod seed;
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod traceparent;
mod waiting;
mod workers;

use std::time::Duration;

use ops::Backend as _;

pub use batch::KeyTaken;
pub use clock::{Clock, ClockSample, ManualClock, OffsetClock, SystemClock, best_offset};
pub use connections::{Connections, ProcessConnections, host_name};
pub use error::{Result, StoreError};
pub use insights::{
    ANSWER_PREFIX_CHARS, AttemptBucket, DeadGroup, DeadReasonCount, MAX_DEAD_SCAN, error_signature,
};
pub use migrations::MIGRATIONS_TABLE;
pub use model::{
    Attempt, BreakerUpdate, ClaimParams, Completion, Dependency, DependencyEvent, DependencyWrite,
    Enqueued, Job, JobId, JobState, Kinds, Lease, ListParams, MAX_BATCH, MAX_MAX_ATTEMPTS,
    MAX_NAME_LEN, MAX_PRIORITY, MAX_RESPONSE_EXCERPT, MIN_PRIORITY, NewAttempt, NewJob, Page,
    QueueCount, Rescued, Selection, Transition, check_quota_key, excerpt, from_millis,
};
pub use operator::{
    Actor, AuditEntry, BulkAction, BulkOutcome, DependencyOp, JobFilter, MAX_AUDIT_PAGE,
    PausedQueue,
};
#[cfg(feature = "postgres")]
pub use pg_url::{DEFAULT_POOL_SIZE, Listen, PgHost, PgUrl, SessionAttrs, percent_encode};
pub use policies::{
    MAX_POLICY_BODY, MAX_POLICY_COMMENT, PolicyApplied, PolicyVersion, policy_digest,
};
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
pub use quota::{CardStop, Decline, NewDecline, QuotaTake, Reattempt, ReattemptParams, WindowUse};
pub use redrive_policy::Timestamp;
pub use retention::{FINISHED_STATES, PRUNER_LEASE, Pruned};
pub use schedule::{
    Cron, Fired, MAX_CATCH_UP, MAX_SCHEDULE_NAME, MISFIRE_GRACE, Missed, Schedule, ScheduleSpec,
    due_ticks, tick_key,
};
pub use seed::{Seed, SeedRows, padded_payload};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use traceparent::{TraceParent, TraceParentError};
pub use waiting::{Waiting, waiting_because};
pub use workers::{Unhandled, WORKER_STALE_AFTER, WorkerInfo};

/// `redrive_enqueued_total{queue,kind}`: jobs created by this process's enqueues (through
/// [`Store::enqueue`] and [`Store::enqueue_many`]; a repeat of an idempotency key that returns
/// the existing job is not counted). Recorded through the `metrics` facade.
pub const ENQUEUED_TOTAL: &str = "redrive_enqueued_total";

fn count_enqueued(job: &NewJob) {
    metrics::counter!(ENQUEUED_TOTAL, "queue" => labels::queue_label(&job.queue), "kind" => job.kind.clone())
        .increment(1);
}

/// Jobs per batch of [`Store::prune`] (and the runtime's pruner by default): a few
/// milliseconds of the writer each.
pub const PRUNE_BATCH: u32 = 500;

/// The default database: an SQLite file in the working directory.
pub const DEFAULT_URL: &str = "sqlite:redrive.db";

pub(crate) fn check_batch(field: &'static str, n: usize) -> Result<()> {
    if n > MAX_BATCH {
        return Err(StoreError::Invalid {
            field,
            value: n.to_string(),
            reason: format!("at most {MAX_BATCH} per call"),
        });
    }
    Ok(())
}

/// Whether a connection going back to its pool may be reused (`after_release`): not when it
/// is still counted as inside a transaction. That happens when a commit fails and the
/// database has already ended the transaction itself (SQLite does on a disk I/O error), so
/// the rollback that follows fails too: reused, the connection would refuse every later
/// transaction ("begin_with at non-zero transaction depth" on the single SQLite writer, until
/// a restart). Such a connection is closed, which ends any transaction still open, and the
/// pool opens a fresh one.
///
/// Only a connection counted inside a transaction is pinged first, which lets a rollback
/// queued by a dropped transaction run (SQLite counts it down on its worker thread); the
/// count never rises by itself, so a connection at zero goes back at once. sqlx pings every
/// connection after this check anyway: a second ping was a round trip per statement.
///
/// Every pool of the store uses it; give it to pools of your own on the same database:
/// `SqlitePoolOptions::new().after_release(|c, _| Box::pin(release_if_clean(c)))`.
///
/// # Errors
/// The ping's: the connection is broken (the pool then closes it).
pub async fn release_if_clean<C: sqlx::Connection>(
    conn: &mut C,
) -> std::result::Result<bool, sqlx::Error> {
    if !conn.is_in_transaction() {
        return Ok(true);
    }
    conn.ping().await?;
    if conn.is_in_transaction() {
        tracing::warn!("a database connection was left inside a failed transaction: closing it");
        return Ok(false);
    }
    Ok(true)
}

/// The queue: one of the two backends behind one API.
#[derive(Debug, Clone)]
pub enum Store {
    /// Embedded SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    /// Shared PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(PgStore),
}

impl Store {
    /// Connects by URL: `sqlite:PATH` (created and migrated on first use) or
    /// `postgres://…` (add `?schema=NAME` — read by redrive, not sent — to use a schema).
    pub async fn connect(url: &str) -> Result<Self> {
        if url.starts_with("sqlite:") {
            #[cfg(feature = "sqlite")]
            return Ok(Store::Sqlite(SqliteStore::connect(url).await?));
            #[cfg(not(feature = "sqlite"))]
            return Err(StoreError::BadUrl {
                url: url.into(),
                reason: "this build has no SQLite backend (the crate's `sqlite` feature)".into(),
            });
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            {
                return Ok(Store::Postgres(
                    PgStore::connect_url(&PgUrl::parse(url)?).await?,
                ));
            }
            #[cfg(not(feature = "postgres"))]
            return Err(StoreError::BadUrl {
                url: url.into(),
                reason: "this build has no PostgreSQL backend (the crate's `postgres` feature)"
                    .into(),
            });
        }
        Err(StoreError::BadUrl {
            url: url.into(),
            reason: "expected sqlite:PATH or postgres://…".into(),
        })
    }

    /// The backend's name: `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => "postgres",
        }
    }

    /// Applies the embedded migrations (also done on connect).
    pub async fn migrate(&self) -> Result<()> {
        dispatch!(self, s => s.migrate().await)
    }

    /// Enqueues one job. A repeat with the same queue and key returns the existing job with
    /// `created: false`, also under concurrent enqueues (the unique index decides).
    ///
    /// On SQLite the result is returned only if the database file is still the one opened
    /// once the job is committed ([`Store::check_file`]): a job written to a deleted or
    /// replaced file would be gone at the next start, so it is not acknowledged
    /// ([`StoreError::FileChanged`]).
    pub async fn enqueue(&self, job: &NewJob, now: Timestamp) -> Result<Enqueued> {
        let out = dispatch!(self, s => {
            let mut conn = s.pool.acquire().await?;
            s.enqueue_in(&mut conn, job, now).await?
        });
        self.check_file()?;
        if out.created {
            count_enqueued(job);
            dispatch!(self, s => s.wake());
        }
        Ok(out)
    }

    /// Enqueues many jobs in one transaction; results in input order. On SQLite, as
    /// [`Store::enqueue`], only acknowledged while the file is the one opened.
    pub async fn enqueue_many(&self, jobs: &[NewJob], now: Timestamp) -> Result<Vec<Enqueued>> {
        let out = dispatch!(self, s => s.enqueue_many_impl(jobs, now).await)?;
        self.check_file()?;
        for (job, e) in jobs.iter().zip(&out) {
            if e.created {
                count_enqueued(job);
            }
        }
        Ok(out)
    }

    /// [`Store::enqueue_many`] for requests that must not be confused: when a job's queue and
    /// key are already taken by a job of another kind or payload (stored before, or earlier in
    /// `jobs`), the transaction is rolled back and nothing is written: `Ok(Err(KeyTaken))`
    /// names the first such job. A job whose key is taken by the same request is a repeat
    /// (`created: false`), as with [`Store::enqueue_many`].
    ///
    /// # Errors
    /// As [`Store::enqueue_many`]: [`StoreError::Invalid`] for a bad job or more than
    /// [`MAX_BATCH`] jobs, [`StoreError::FileChanged`], the database's.
    pub async fn enqueue_many_exact(
        &self,
        jobs: &[NewJob],
        now: Timestamp,
    ) -> Result<std::result::Result<Vec<Enqueued>, KeyTaken>> {
        let out = dispatch!(self, s => s.enqueue_many_exact_impl(jobs, now).await)?;
        let Ok(out) = out else {
            return Ok(out);
        };
        self.check_file()?;
        for (job, e) in jobs.iter().zip(&out) {
            if e.created {
                count_enqueued(job);
            }
        }
        Ok(Ok(out))
    }

    /// `Ok` while the store's database is the one it opened: on SQLite, the file at the path
    /// opened still has the device and inode it had (on other systems: still exists); always
    /// `Ok` on PostgreSQL and for an in-memory database. A stat, cheap enough for every
    /// acknowledgement.
    ///
    /// # Errors
    /// [`StoreError::FileChanged`] naming the path and what happened to it.
    pub fn check_file(&self) -> Result<()> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => s.check_file(),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => Ok(()),
        }
    }

    /// A real write, for readiness checks: upserts the row `name` of the probe table (its time
    /// and a count of probes, so that every probe changes it) and commits it (on SQLite after checking the file, [`Store::check_file`]). Fails while the
    /// database cannot take writes (a full or failing disk, a read-only file, PostgreSQL down
    /// or read-only), not only when it cannot be read.
    ///
    /// # Errors
    /// [`StoreError::FileChanged`], or the database's error.
    pub async fn check_writable(&self, name: &str, now: Timestamp) -> Result<()> {
        self.check_file()?;
        const UPSERT: &str = "INSERT INTO redrive_probe (name, checked_at) VALUES ($1, $2) \
            ON CONFLICT (name) DO UPDATE SET checked_at = excluded.checked_at, \
            writes = redrive_probe.writes + 1";
        dispatch!(self, s => {
            sqlx::query(UPSERT)
                .bind(name)
                .bind(model::millis(now))
                .execute(&s.pool)
                .await?;
        });
        Ok(())
    }

    /// One job.
    pub async fn get(&self, id: JobId) -> Result<Option<Job>> {
        dispatch!(self, s => s.get_impl(id).await)
    }

    /// A job's attempts, oldest first (every run, including before replays).
    pub async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        dispatch!(self, s => s.attempts_impl(id).await)
    }

    /// Claims up to `limit` due jobs (priority, then run_at, then id) of the given queues
    /// (every queue if none is given) and kinds, leasing each with a fresh fencing token, skipping jobs whose dependency is open
    /// or paused. Jobs of other kinds are left as they are (not leased, no attempt).
    pub async fn claim(&self, p: &ClaimParams) -> Result<Vec<Job>> {
        dispatch!(self, s => s.claim_impl(p).await)
    }

    /// A fenced write: records the attempt (if any) and moves the job on, atomically.
    /// [`StoreError::LeaseLost`] when the token is stale; nothing is written then.
    pub async fn complete(&self, c: &Completion) -> Result<()> {
        dispatch!(self, s => s.complete_impl(c).await)
    }

    /// Many fenced writes in one transaction; a stale lease fails only its own item.
    pub async fn complete_many(&self, cs: &[Completion]) -> Result<Vec<Result<()>>> {
        dispatch!(self, s => s.complete_many_impl(cs).await)
    }

    /// Extends a lease to `now + extend`; [`StoreError::LeaseLost`] if it is no longer held.
    pub async fn heartbeat(
        &self,
        lease: Lease,
        extend: Duration,
        now: Timestamp,
    ) -> Result<Timestamp> {
        dispatch!(self, s => s.heartbeat_impl(lease, extend, now).await)
    }

    /// Cancels a job that has not finished; a running job's lease is revoked (its worker's
    /// next write fails and it stops).
    pub async fn cancel(&self, id: JobId, now: Timestamp) -> Result<Job> {
        dispatch!(self, s => s.cancel_impl(id, now).await)
    }

    /// Puts dead jobs back in the queue with fresh budgets; their history is kept.
    pub async fn replay(&self, sel: &Selection, now: Timestamp) -> Result<u64> {
        dispatch!(self, s => s.replay_impl(sel, now).await)
    }

    /// Deletes dead jobs (and their attempts).
    pub async fn purge(&self, sel: &Selection) -> Result<u64> {
        dispatch!(self, s => s.purge_impl(sel).await)
    }

    /// Returns jobs whose lease expired to the queue (at most `limit`). The lost attempt counts;
    /// a job with no attempts left dies with reason `lease_expired`. Each expired lease is
    /// rescued exactly once, however many rescuers run.
    pub async fn rescue(&self, now: Timestamp, limit: u32) -> Result<Vec<Rescued>> {
        dispatch!(self, s => s.rescue_impl(now, limit).await)
    }

    /// Deletes succeeded and cancelled jobs (and dead ones if asked) finished before a time,
    /// with their attempts, in batches of [`PRUNE_BATCH`] ([`Store::prune_batch`]); returns
    /// the jobs deleted.
    pub async fn prune(&self, finished_before: Timestamp, include_dead: bool) -> Result<u64> {
        let mut total = 0;
        for state in FINISHED_STATES {
            if state == JobState::Dead && !include_dead {
                continue;
            }
            loop {
                let n = self
                    .prune_batch(state, finished_before, PRUNE_BATCH)
                    .await?;
                total += n.jobs;
                if n.jobs < u64::from(PRUNE_BATCH) {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// Lists jobs by id with keyset pagination (`after`).
    pub async fn list(&self, p: &ListParams) -> Result<Page> {
        dispatch!(self, s => s.list_impl(p).await)
    }

    /// Jobs per queue and state.
    pub async fn counts(&self) -> Result<Vec<QueueCount>> {
        dispatch!(self, s => s.counts_impl().await)
    }

    /// When the next job on these queues (every queue if empty) becomes claimable (`None`:
    /// none waiting).
    pub async fn next_due(&self, queues: &[String]) -> Result<Option<Timestamp>> {
        dispatch!(self, s => s.next_due_impl(queues, &Kinds::Any).await)
    }

    /// When the next job of these kinds on these queues (every queue if empty) becomes
    /// claimable (`None`: none waiting): what a worker with those handlers waits for.
    pub async fn next_due_for(
        &self,
        queues: &[String],
        kinds: &Kinds,
    ) -> Result<Option<Timestamp>> {
        dispatch!(self, s => s.next_due_impl(queues, kinds).await)
    }

    /// A dependency's shared state.
    pub async fn dependency(&self, name: &str) -> Result<Option<Dependency>> {
        dispatch!(self, s => s.dependency_impl(name).await)
    }

    /// Every dependency's shared state.
    pub async fn dependencies(&self) -> Result<Vec<Dependency>> {
        dispatch!(self, s => s.dependencies_impl().await)
    }

    /// Publishes a breaker state to the fleet (compare-and-set on `expect`); records the
    /// transition. Returns whether it applied.
    pub async fn set_breaker(&self, u: &BreakerUpdate) -> Result<bool> {
        dispatch!(self, s => s.set_breaker_impl(u).await)
    }

    /// Recent breaker transitions, newest first.
    pub async fn dependency_events(
        &self,
        dependency: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DependencyEvent>> {
        dispatch!(self, s => s.events_impl(dependency, limit).await)
    }

    /// Writes a dependency's whole row if it is still at the version read (compare-and-set),
    /// and records the breaker transition it makes. Returns the new version, or `None` when
    /// another writer came first (read the row again and reapply the event).
    pub async fn update_dependency(&self, w: &DependencyWrite) -> Result<Option<i64>> {
        dispatch!(self, s => s.update_dependency_impl(w).await)
    }

    /// Pauses a dependency fleet-wide until `until` (never shortens a longer pause).
    pub async fn pause(
        &self,
        dependency: &str,
        until: Timestamp,
        reason: redrive_policy::PauseReason,
        now: Timestamp,
    ) -> Result<()> {
        dispatch!(self, s => s.pause_impl(dependency, until, reason, now).await)
    }

    /// Lifts a pause.
    pub async fn unpause(&self, dependency: &str, now: Timestamp) -> Result<()> {
        dispatch!(self, s => s.unpause_impl(dependency, now).await)
    }

    /// Pauses a queue fleet-wide: workers claim nothing from it (running jobs finish) until
    /// [`Store::resume_queue`]. Audited in the same transaction. Returns whether it was not
    /// paused before.
    pub async fn pause_queue(&self, queue: &str, actor: &Actor, now: Timestamp) -> Result<bool> {
        dispatch!(self, s => s.pause_queue_impl(queue, actor, now).await)
    }

    /// Resumes a paused queue (audited). Returns whether it was paused.
    pub async fn resume_queue(&self, queue: &str, actor: &Actor, now: Timestamp) -> Result<bool> {
        dispatch!(self, s => s.resume_queue_impl(queue, actor, now).await)
    }

    /// Dead jobs that died at or after `since`, by the time they died (then id): at most
    /// `limit` (1..=10000). What alerts watch.
    pub async fn dead_since(&self, since: Timestamp, limit: u32) -> Result<Vec<Job>> {
        dispatch!(self, s => s.dead_since_impl(since, limit).await)
    }

    /// Per queue that is not paused, the `run_at` of its oldest job due by `now` and not yet
    /// claimed (how long its backlog has waited), by queue name.
    pub async fn oldest_due(&self, now: Timestamp) -> Result<Vec<(String, Timestamp)>> {
        dispatch!(self, s => s.oldest_due_impl(now).await)
    }

    /// The paused queues, by name.
    pub async fn paused_queues(&self) -> Result<Vec<PausedQueue>> {
        dispatch!(self, s => s.paused_queues_impl().await)
    }

    /// A bulk operator action on every job the filter takes that the action applies to (its
    /// states: [`BulkAction::states`]), in one transaction with its audit row. A dry run
    /// returns the jobs it would change, and changes (and audits) nothing.
    pub async fn bulk(
        &self,
        action: BulkAction,
        filter: &JobFilter,
        actor: &Actor,
        dry_run: bool,
        now: Timestamp,
    ) -> Result<BulkOutcome> {
        dispatch!(self, s => s.bulk_impl(action, filter, actor, dry_run, now).await)
    }

    /// An operator's override of a dependency (pause, resume, forced breaker), applied by the
    /// flow core to its shared row with a compare-and-set, with its transition (if any) and
    /// its audit row in the same transaction. Returns the row after it.
    pub async fn operate_dependency(
        &self,
        dependency: &str,
        op: DependencyOp,
        actor: &Actor,
        now: Timestamp,
    ) -> Result<Dependency> {
        dispatch!(self, s => s.operate_dependency_impl(dependency, op, actor, now).await)
    }

    /// Writes one audit row (for operator actions that are not the store's own).
    pub async fn record_audit(
        &self,
        actor: &Actor,
        action: &str,
        target: &serde_json::Value,
        rows: u64,
        now: Timestamp,
    ) -> Result<i64> {
        dispatch!(self, s => s.record_audit_impl(actor, action, target, rows, now).await)
    }

    /// The audit trail, newest first: at most `limit` rows (1..=[`MAX_AUDIT_PAGE`]) with ids
    /// below `before` (keyset pagination).
    pub async fn audit(&self, before: Option<i64>, limit: u32) -> Result<Vec<AuditEntry>> {
        dispatch!(self, s => s.audit_impl(before, limit).await)
    }

    /// A receiver that changes whenever work may have appeared (enqueue, replay, rescue,
    /// release; on PostgreSQL also from other processes). Wait on it between polls.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        dispatch!(self, s => s.wake.subscribe())
    }
}

/// Splits redrive's own `schema=NAME` parameter off a PostgreSQL URL (see
/// [`Store::connect`]): the URL with its other parameters, which go to the server, and the
/// schema if one was given.
#[cfg(feature = "postgres")]
pub fn split_schema(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|p| match p.strip_prefix("schema=") {
            Some(s) => {
                schema = Some(s.to_owned());
                false
            }
            None => true,
        })
        .collect();
    if rest.is_empty() {
        (base.to_owned(), schema)
    } else {
        (format!("{base}?{}", rest.join("&")), schema)
    }
}

/// The operations' futures are `Send` (the service runs them in spawned tasks and axum
/// handlers): a compile-time check, since a generic executor in a provided method of
/// [`ops::Backend`] makes them not `Send` without any test in this crate failing.
#[cfg(test)]
#[allow(dead_code)]
mod send_check {
    use crate::{Actor, BulkAction, DependencyOp, JobFilter, Store, Timestamp};

    fn send<T: Send>(_: T) {}

    fn operator_futures_are_send(
        s: &Store,
        f: &JobFilter,
        a: &Actor,
        v: &serde_json::Value,
        now: Timestamp,
    ) {
        send(s.bulk(BulkAction::Replay, f, a, false, now));
        send(s.operate_dependency("x", DependencyOp::Resume, a, now));
        send(s.record_audit(a, "x", v, 1, now));
        send(s.audit(None, 1));
        send(s.pause_queue("q", a, now));
        send(s.resume_queue("q", a, now));
        send(s.dead_since(now, 1));
        send(s.oldest_due(now));
        send(s.paused_queues());
    }

    fn quota_futures_are_send(s: &Store, d: &crate::NewDecline, p: &crate::ReattemptParams<'_>) {
        send(s.record_decline(d));
        send(s.take_reattempt(p));
    }
}

#[cfg(test)]
mod release_tests {
    use sqlx::Connection;

    /// What `release_if_clean` answers for a connection that is clean, one whose dropped
    /// transaction queued its rollback, and one still counted inside a transaction (its
    /// `Transaction` forgotten, so no rollback will ever run).
    async fn answers<C: Connection>(conn: &mut C) -> [bool; 3] {
        let clean = super::release_if_clean(conn).await.unwrap();
        drop(conn.begin().await.unwrap());
        let rolled_back = super::release_if_clean(conn).await.unwrap();
        std::mem::forget(conn.begin().await.unwrap());
        let stuck = super::release_if_clean(conn).await.unwrap();
        [clean, rolled_back, stuck]
    }

    #[tokio::test]
    async fn only_a_connection_left_inside_a_transaction_is_refused_sqlite() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        assert_eq!(answers(&mut conn).await, [true, true, false]);
    }

    #[tokio::test]
    async fn only_a_connection_left_inside_a_transaction_is_refused_postgres() {
        let url = redrive_testkit::postgres_url();
        if !redrive_testkit::postgres_available(&url).await {
            return;
        }
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        assert_eq!(answers(&mut conn).await, [true, true, false]);
    }
}
