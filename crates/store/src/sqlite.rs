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
        let data = json_text(&rows.iter().map(positional).collect::<Vec<_>>())?;
        let mut tx = self.tx().await?;
        if rows.iter().any(|r| r.has_attempt) {
            sqlx::query(sqlx::AssertSqlSafe(COMPLETE_ATTEMPTS.as_str()))
                .bind(&data)
                .execute(&mut *tx)
                .await?;
        }
        let applied: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(COMPLETE_JOBS.as_str()))
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

/// One completion as a JSON array in [`COMPLETION_FIELDS`] order.
fn positional(r: &crate::batch::CompletionRow) -> serde_json::Value {
    serde_json::json!([
        r.id,
        r.token,
        r.state,
        r.attempts,
        r.exceptions,
        r.defers,
        r.consecutive_auth,
        r.prev_delay_ms,
        r.first_attempt_at,
        r.run_at,
        r.defer_reason,
        r.dead_reason,
        r.last_error,
        r.result,
        r.finished_at,
        r.updated_at,
        r.has_attempt,
        r.worker,
        r.started_at,
        r.duration_ms,
        r.class,
        r.http_status,
        r.error,
        r.delay_ms,
        r.mode,
        r.counted
    ])
}

/// The two completion statements, each prefixed with the batch's rows.
static COMPLETE_ATTEMPTS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{COMPLETION_ROWS}{COMPLETE_ATTEMPTS_SQL}"));
static COMPLETE_JOBS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{COMPLETION_ROWS}{COMPLETE_JOBS_SQL}"));

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

/// The batch's rows, read once each from `json_each` and each field once (every `value`
/// reference re-renders the row as text, which made reading fields in place cost more than
/// the writes). Rows are positional arrays in [`COMPLETION_FIELDS`] order: `->> n` is a
/// step, not a key search.
const COMPLETION_ROWS: &str = "WITH r AS MATERIALIZED (SELECT value AS j FROM json_each($1)), \
    v AS MATERIALIZED (SELECT j ->> 0 AS id, j ->> 1 AS token, j ->> 2 AS state, j ->> 3 AS attempts, j ->> 4 AS exceptions, j ->> 5 AS defers, j ->> 6 AS consecutive_auth, j ->> 7 AS prev_delay_ms, j ->> 8 AS first_attempt_at, j ->> 9 AS run_at, j ->> 10 AS defer_reason, j ->> 11 AS dead_reason, j ->> 12 AS last_error, j ->> 13 AS result, j ->> 14 AS finished_at, j ->> 15 AS updated_at, j ->> 16 AS has_attempt, j ->> 17 AS worker, j ->> 18 AS started_at, j ->> 19 AS duration_ms, j ->> 20 AS class, j ->> 21 AS http_status, j ->> 22 AS error, j ->> 23 AS delay_ms, j ->> 24 AS mode, j ->> 25 AS counted FROM r) ";

/// The field order of a completion row as [`complete_batch`](SqliteStore::complete_batch) sends it.
#[cfg(test)]
const COMPLETION_FIELDS: [&str; 26] = [
    "id",
    "token",
    "state",
    "attempts",
    "exceptions",
    "defers",
    "consecutive_auth",
    "prev_delay_ms",
    "first_attempt_at",
    "run_at",
    "defer_reason",
    "dead_reason",
    "last_error",
    "result",
    "finished_at",
    "updated_at",
    "has_attempt",
    "worker",
    "started_at",
    "duration_ms",
    "class",
    "http_status",
    "error",
    "delay_ms",
    "mode",
    "counted",
];

/// The attempts of a batch of completions, for the jobs whose lease (id, token, running)
/// still holds.
const COMPLETE_ATTEMPTS_SQL: &str = "INSERT INTO \
    redrive_attempts (job_id, number, replay, lease_token, worker, started_at, duration_ms, \
    class, http_status, error, delay_ms, mode, counted) SELECT j.id, (SELECT COUNT(*) + 1 \
    FROM redrive_attempts a WHERE a.job_id = j.id AND a.replay = j.replays), j.replays, \
    j.lease_token, v.worker, v.started_at, v.duration_ms, v.class, v.http_status, v.error, \
    v.delay_ms, v.mode, v.counted FROM v JOIN redrive_jobs j ON j.id = v.id WHERE \
    j.lease_token = v.token AND +j.state = 'running' AND v.has_attempt";

/// The fenced update of a batch of completions; returns the ids that applied. (`+state`: not
/// through a state index, so that the plan walks the batch and looks each job up by id;
/// the same in the attempts' insert.)
const COMPLETE_JOBS_SQL: &str = "UPDATE redrive_jobs \
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

#[cfg(test)]
mod tests {
    /// The SQL reads `->> n` by [`super::COMPLETION_FIELDS`]; `positional` must send the fields
    /// in that order, which is the struct's declaration order.
    #[test]
    fn completion_fields_follow_the_row_struct() {
        let src = include_str!("batch.rs");
        let body = &src[src.find("pub(crate) struct CompletionRow {").unwrap()..];
        let body = &body[..body.find('}').unwrap()];
        let names: Vec<&str> = body
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub(crate) "))
            .filter_map(|l| l.split(':').next())
            .filter(|n| !n.starts_with("struct"))
            .collect();
        assert_eq!(names, super::COMPLETION_FIELDS);
    }
}
