//! The embedded SQLite backend: one file, WAL, one writer connection and a few readers.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};

use crate::sql::{Dialect, Sql};
use crate::{Result, StoreError};

/// The SQLite store. Writes go through one connection (SQLite has one writer anyway), reads
/// through a small pool, so the dashboard never waits behind the workers.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pub(crate) pool: SqlitePool,
    pub(crate) read: SqlitePool,
    pub(crate) sql: Arc<Sql>,
    pub(crate) wake: Arc<tokio::sync::watch::Sender<u64>>,
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the database at `url`
    /// (`sqlite:PATH`, `sqlite://PATH`; add `?synchronous=normal` to trade durability on power
    /// loss for speed — a process crash loses nothing either way).
    pub async fn connect(url: &str) -> Result<Self> {
        let (base, synchronous) = split_synchronous(url)?;
        let opts = SqliteConnectOptions::from_str(&base)
            .map_err(|e| StoreError::BadUrl {
                url: url.into(),
                reason: e.to_string(),
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .connect_with(opts.clone())
            .await?;
        let store = Self {
            read: SqlitePoolOptions::new()
                .max_connections(4)
                .connect_lazy_with(opts.read_only(false)),
            pool,
            sql: Arc::new(Sql::new(Dialect::Sqlite)),
            wake: Arc::new(tokio::sync::watch::channel(0).0),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Applies the embedded migrations (idempotent).
    pub async fn migrate(&self) -> Result<()> {
        sqlx::migrate!("./migrations/sqlite")
            .run(&self.pool)
            .await?;
        Ok(())
    }

    /// The writer pool (for callers that enqueue inside their own transaction on the same file).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub(crate) async fn tx(&self) -> Result<Transaction<'static, Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// One `INSERT … SELECT … FROM json_each($1)`: the whole chunk is one JSON text parameter
    /// (sqlx binds SQLite parameters in time that grows with the square of their number).
    pub(crate) async fn insert_chunk(
        &self,
        conn: &mut SqliteConnection,
        chunk: &[crate::NewJob],
        rows: &[crate::batch::InsertRow],
        now: redrive_policy::Timestamp,
    ) -> Result<Vec<crate::batch::InsertedKey>> {
        let data: Vec<_> = chunk
            .iter()
            .zip(rows)
            .map(|(j, r)| {
                serde_json::json!([
                    j.queue,
                    j.kind,
                    j.payload.to_string(),
                    j.key,
                    j.dependency,
                    j.priority,
                    r.state,
                    j.max_attempts,
                    j.policy,
                    r.run_at,
                    r.ttl,
                    r.deadline,
                ])
            })
            .collect();
        Ok(sqlx::query_as(INSERT_JSON)
            .bind(json_text(&data)?)
            .bind(crate::model::millis(now))
            .fetch_all(&mut *conn)
            .await?)
    }

    /// A batch of fenced completions in one transaction and two statements, each with the whole
    /// batch as one JSON parameter: the attempts of the completions whose lease still holds,
    /// then the jobs' update (same fence). Returns the ids that applied.
    pub(crate) async fn complete_batch(
        &self,
        cs: &[crate::Completion],
    ) -> Result<std::collections::HashSet<i64>> {
        let rows: Vec<crate::batch::CompletionRow> =
            cs.iter().map(crate::batch::CompletionRow::of).collect();
        let data = json_text(&rows)?;
        let mut tx = self.tx().await?;
        if rows.iter().any(|r| r.has_attempt) {
            sqlx::query(COMPLETE_ATTEMPTS_JSON)
                .bind(&data)
                .execute(&mut *tx)
                .await?;
        }
        let applied: Vec<i64> = sqlx::query_scalar(COMPLETE_JOBS_JSON)
            .bind(&data)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(applied.into_iter().collect())
    }

    /// Claims need no gate here: there is one writer connection.
    pub(crate) async fn claim_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        None
    }

    pub(crate) fn wake(&self) {
        self.wake.send_modify(|v| *v = v.wrapping_add(1));
    }
}

fn json_text(v: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Invalid {
        field: "batch",
        value: String::new(),
        reason: e.to_string(),
    })
}

/// Rows are `[queue, kind, payload, key, dependency, priority, state, max_attempts, policy,
/// run_at, ttl_ms, deadline]`, inserted in array order (so ids follow input order).
const INSERT_JSON: &str = "INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, \
    dependency, priority, state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, \
    updated_at) \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, \
    value ->> 6, value ->> 7, value ->> 8, value ->> 9, value ->> 10, value ->> 11, $2, $2 \
    FROM json_each($1) WHERE true ORDER BY key \
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
    RETURNING id, queue, idempotency_key";

/// The attempts of a batch of completions (objects as [`crate::batch::CompletionRow`]
/// serializes them), for the jobs whose lease (id, token, running) still holds. The CTEs read
/// each row's text out of `json_each` once and each field once: every `value` reference
/// re-renders the row as text, which made reading fields in place cost more than the writes.
const COMPLETE_ATTEMPTS_JSON: &str = "WITH r AS MATERIALIZED (SELECT value AS j FROM json_each($1)), v AS MATERIALIZED (SELECT \
    j ->> 'id' AS id, j ->> 'token' AS token, j ->> 'state' AS state, j ->> 'attempts' AS \
    attempts, j ->> 'exceptions' AS exceptions, j ->> 'defers' AS defers, j ->> \
    'consecutive_auth' AS consecutive_auth, j ->> 'prev_delay_ms' AS prev_delay_ms, j ->> \
    'first_attempt_at' AS first_attempt_at, j ->> 'run_at' AS run_at, j ->> 'defer_reason' \
    AS defer_reason, j ->> 'dead_reason' AS dead_reason, j ->> 'last_error' AS last_error, j \
    ->> 'result' AS result, j ->> 'finished_at' AS finished_at, j ->> 'updated_at' AS \
    updated_at, j ->> 'has_attempt' AS has_attempt, j ->> 'worker' AS worker, j ->> \
    'started_at' AS started_at, j ->> 'duration_ms' AS duration_ms, j ->> 'class' AS class, \
    j ->> 'http_status' AS http_status, j ->> 'error' AS error, j ->> 'delay_ms' AS \
    delay_ms, j ->> 'mode' AS mode, j ->> 'counted' AS counted FROM r) INSERT INTO \
    redrive_attempts (job_id, number, replay, lease_token, worker, started_at, duration_ms, \
    class, http_status, error, delay_ms, mode, counted) SELECT j.id, (SELECT COUNT(*) + 1 \
    FROM redrive_attempts a WHERE a.job_id = j.id AND a.replay = j.replays), j.replays, \
    j.lease_token, v.worker, v.started_at, v.duration_ms, v.class, v.http_status, v.error, \
    v.delay_ms, v.mode, v.counted FROM v JOIN redrive_jobs j ON j.id = v.id WHERE \
    j.lease_token = v.token AND +j.state = 'running' AND v.has_attempt";

/// The fenced update of a batch of completions; returns the ids that applied. (`+state`: not
/// through the state index, so that the plan walks the batch and looks each job up by id;
/// the same in the attempts' insert.)
const COMPLETE_JOBS_JSON: &str = "WITH r AS MATERIALIZED (SELECT value AS j FROM json_each($1)), v AS MATERIALIZED (SELECT \
    j ->> 'id' AS id, j ->> 'token' AS token, j ->> 'state' AS state, j ->> 'attempts' AS \
    attempts, j ->> 'exceptions' AS exceptions, j ->> 'defers' AS defers, j ->> \
    'consecutive_auth' AS consecutive_auth, j ->> 'prev_delay_ms' AS prev_delay_ms, j ->> \
    'first_attempt_at' AS first_attempt_at, j ->> 'run_at' AS run_at, j ->> 'defer_reason' \
    AS defer_reason, j ->> 'dead_reason' AS dead_reason, j ->> 'last_error' AS last_error, j \
    ->> 'result' AS result, j ->> 'finished_at' AS finished_at, j ->> 'updated_at' AS \
    updated_at, j ->> 'has_attempt' AS has_attempt, j ->> 'worker' AS worker, j ->> \
    'started_at' AS started_at, j ->> 'duration_ms' AS duration_ms, j ->> 'class' AS class, \
    j ->> 'http_status' AS http_status, j ->> 'error' AS error, j ->> 'delay_ms' AS \
    delay_ms, j ->> 'mode' AS mode, j ->> 'counted' AS counted FROM r) UPDATE redrive_jobs \
    SET state = v.state, attempts = v.attempts, exceptions = v.exceptions, defers = \
    v.defers, consecutive_auth = v.consecutive_auth, prev_delay_ms = v.prev_delay_ms, \
    first_attempt_at = v.first_attempt_at, run_at = COALESCE(v.run_at, redrive_jobs.run_at), \
    defer_reason = v.defer_reason, dead_reason = v.dead_reason, last_error = \
    COALESCE(v.last_error, redrive_jobs.last_error), result = COALESCE(v.result, \
    redrive_jobs.result), lease_owner = CASE WHEN v.state = 'running' THEN \
    redrive_jobs.lease_owner END, lease_expires_at = CASE WHEN v.state = 'running' THEN \
    redrive_jobs.lease_expires_at END, finished_at = v.finished_at, updated_at = \
    v.updated_at FROM v WHERE redrive_jobs.id = v.id AND redrive_jobs.lease_token = v.token \
    AND +redrive_jobs.state = 'running' RETURNING redrive_jobs.id";

fn split_synchronous(url: &str) -> Result<(String, SqliteSynchronous)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), SqliteSynchronous::Full));
    };
    let mut sync = SqliteSynchronous::Full;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("synchronous", v)) => {
                sync = SqliteSynchronous::from_str(v).map_err(|_| StoreError::BadUrl {
                    url: url.into(),
                    reason: format!("synchronous={v:?}: expected off, normal, full or extra"),
                })?;
            }
            _ => rest.push(pair),
        }
    }
    let base = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((base, sync))
}

crate::ops::shared_ops!(SqliteStore, Sqlite, SqliteConnection);
