//! The embedded SQLite backend: one file, WAL, one writer connection and a few readers.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteQueryResult,
    SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};

use crate::ops::Backend;
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
    /// The database file as opened (`None`: in memory).
    pub(crate) file: Option<Arc<FileIdentity>>,
}

/// Which files were opened: the database, its write-ahead log (`-wal`) and its shared-memory
/// index (`-shm`), by path and, on Unix, device and inode. A file deleted or replaced under a
/// running process is not the one it writes to any more: the process goes on writing to the
/// unlinked (or old) inode, and everything written is gone at the next start. The log holds
/// every commit not yet checkpointed, so losing it loses acknowledged jobs just as losing the
/// database does.
///
/// The identity holds a connection of its own for the store's lifetime: SQLite deletes the log
/// and the index when the last connection to the file closes, and a pool that recycles its
/// connections would otherwise make new ones that a check would take for a replacement.
#[derive(Debug)]
pub(crate) struct FileIdentity {
    path: std::path::PathBuf,
    #[cfg(unix)]
    id: (u64, u64),
    /// The log and the index, each with its identity when the store was opened (`None`: it
    /// did not exist then, so it is not checked).
    companions: Vec<(std::path::PathBuf, Option<(u64, u64)>)>,
    /// Set once a broken identity has been logged (the error is logged once, returned always).
    reported: std::sync::atomic::AtomicBool,
    /// Keeps the log and the index in place while the store lives.
    _anchor: std::sync::Mutex<Option<SqliteConnection>>,
}

/// A file's device and inode (`(0, 0)` on other systems, where only existence is checked).
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (meta.dev(), meta.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        (0, 0)
    }
}

impl FileIdentity {
    /// The identity of the file at `path` and of its log and index now (`None` when there is
    /// no file: an in-memory database).
    fn of(path: &std::path::Path, anchor: Option<SqliteConnection>) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let companions = ["-wal", "-shm"]
            .iter()
            .map(|suffix| {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                let p = std::path::PathBuf::from(p);
                let id = std::fs::metadata(&p).ok().map(|m| file_id(&m));
                (p, id)
            })
            .collect();
        #[cfg(not(unix))]
        let _ = &meta;
        Some(Self {
            #[cfg(unix)]
            id: file_id(&meta),
            path,
            companions,
            reported: std::sync::atomic::AtomicBool::new(false),
            _anchor: std::sync::Mutex::new(anchor),
        })
    }

    /// `Ok` while the path still names the file opened, and its log and index are the ones
    /// opened. The first failure is also logged (an error line): a worker that stops
    /// claiming says why.
    pub(crate) fn check(&self) -> Result<()> {
        let out = self.compare();
        if let Err(e) = &out
            && !self
                .reported
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!(
                "{e}; enqueues are refused and workers stop claiming until redrive is restarted"
            );
        }
        out
    }

    fn compare(&self) -> Result<()> {
        let changed = |reason: String| StoreError::FileChanged {
            path: self.path.display().to_string(),
            reason,
        };
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(changed("it was deleted".into()));
            }
            Err(e) => return Err(changed(format!("it cannot be read: {e}"))),
        };
        #[cfg(unix)]
        if file_id(&meta) != self.id {
            return Err(changed("another file was put in its place".into()));
        }
        #[cfg(not(unix))]
        let _ = meta;
        for (path, id) in &self.companions {
            let Some(id) = id else { continue };
            let name = path.display();
            match std::fs::metadata(path) {
                // SQLite maps the index into memory and grows it by writing: one it cannot
                // write (a read-only mode) ends the process with SIGBUS, which leaves no log
                // line, so the check says it first. Only the mode is read: opening the file to
                // try a write, then closing it, would drop every POSIX lock this process holds
                // on it (SQLite's among them), and the next process to open the database would
                // truncate the index under this one's mapping: SIGBUS. For the same reason an
                // immutable attribute (`chattr +i`), which only an open or an ioctl shows, is
                // not checked.
                Ok(m) if file_id(&m) == *id => {
                    if m.permissions().readonly() {
                        return Err(changed(format!(
                            "{name} cannot be written (read-only); SQLite would crash on it"
                        )));
                    }
                }
                Ok(_) => {
                    return Err(changed(format!(
                        "another file was put in the place of {name}"
                    )));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(changed(format!("{name} was deleted")));
                }
                Err(e) => return Err(changed(format!("{name} cannot be read: {e}"))),
            }
        }
        Ok(())
    }
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
            .busy_timeout(Duration::from_secs(10))
            // A claim or completion returns up to a batch of rows; with sqlx's default of 50
            // the connection thread stops every 50 rows until the caller has read them.
            .row_buffer_size(crate::MAX_BATCH);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .after_release(|conn, _| Box::pin(crate::release_if_clean(conn)))
            .connect_with(opts.clone())
            .await?;
        let store = Self {
            file: None,
            read: SqlitePoolOptions::new()
                .max_connections(4)
                .after_release(|conn, _| Box::pin(crate::release_if_clean(conn)))
                .connect_lazy_with(opts.clone().read_only(false)),
            pool,
            sql: Arc::new(Sql::new(Dialect::Sqlite)),
            wake: Arc::new(tokio::sync::watch::channel(0).0),
        };
        store.migrate().await?;
        let file = if opts.get_filename().as_os_str() == ":memory:" {
            None
        } else {
            // A read, so that the log and the index exist before their identity is taken.
            let mut anchor = sqlx::ConnectOptions::connect(&opts).await?;
            sqlx::query("SELECT count(*) FROM sqlite_master")
                .execute(&mut anchor)
                .await?;
            FileIdentity::of(opts.get_filename(), Some(anchor)).map(Arc::new)
        };
        Ok(Self { file, ..store })
    }

    /// Applies the embedded migrations (idempotent).
    pub async fn migrate(&self) -> Result<()> {
        let migrator = crate::migrations::named(sqlx::migrate!("./migrations/sqlite"));
        crate::migrations::adopt_sqlite(&self.pool, &migrator).await?;
        migrator.run(&self.pool).await?;
        Ok(())
    }

    /// `Ok` while the database file is still the one opened (not deleted or replaced since);
    /// always `Ok` for an in-memory database.
    ///
    /// # Errors
    /// [`StoreError::FileChanged`] naming the path and what happened to it.
    pub fn check_file(&self) -> Result<()> {
        match &self.file {
            Some(f) => f.check(),
            None => Ok(()),
        }
    }

    /// The writer pool (for callers that enqueue inside their own transaction on the same file).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Enqueues one job on the caller's own connection or transaction, so that it commits
    /// (or rolls back) together with the caller's rows.
    pub async fn enqueue_in(
        &self,
        conn: &mut SqliteConnection,
        job: &crate::NewJob,
        now: redrive_policy::Timestamp,
    ) -> Result<crate::Enqueued> {
        self.enqueue_in_impl(conn, job, now).await
    }
}

impl Backend for SqliteStore {
    type Db = Sqlite;

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn read_pool(&self) -> &SqlitePool {
        &self.read
    }

    fn sql(&self) -> &Sql {
        &self.sql
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn tx(&self) -> Result<Transaction<'static, Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// One `INSERT … SELECT … FROM json_each($1)`: the whole chunk is one JSON text parameter
    /// (sqlx binds SQLite parameters in time that grows with the square of their number).
    async fn insert_chunk(
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
                    j.quota_key,
                    j.traceparent,
                ])
            })
            .collect();
        Ok(sqlx::query_as(INSERT_JSON)
            .bind(json_text(&data)?)
            .bind(crate::model::millis(now))
            .fetch_all(&mut *conn)
            .await?)
    }

    /// A batch of fenced completions in one transaction: the attempts of the completions whose
    /// lease still holds, then the jobs' update (same fence), each as statements over a
    /// `VALUES` list of bound parameters, in chunks of [`COMPLETION_CHUNKS`] rows so that a
    /// few prepared statements serve every batch size. Returns the ids that applied.
    async fn complete_batch(
        &self,
        cs: &[crate::Completion],
    ) -> Result<std::collections::HashSet<i64>> {
        let rows: Vec<crate::batch::CompletionRow> =
            cs.iter().map(crate::batch::CompletionRow::of).collect();
        let with_attempt: Vec<&crate::batch::CompletionRow> =
            rows.iter().filter(|r| r.has_attempt).collect();
        let mut tx = self.tx().await?;
        for (chunk, sql) in chunked(&with_attempt, &COMPLETE_ATTEMPTS) {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for r in chunk {
                q = q
                    .bind(r.id)
                    .bind(r.token)
                    .bind(r.worker.as_deref())
                    .bind(r.started_at)
                    .bind(r.duration_ms)
                    .bind(r.class)
                    .bind(r.http_status)
                    .bind(r.error.as_deref())
                    .bind(r.delay_ms)
                    .bind(r.mode)
                    .bind(r.counted)
                    .bind(r.response.as_deref());
            }
            q.execute(&mut *tx).await?;
        }
        let all: Vec<&crate::batch::CompletionRow> = rows.iter().collect();
        let mut applied = std::collections::HashSet::with_capacity(rows.len());
        for (chunk, sql) in chunked(&all, &COMPLETE_JOBS) {
            let mut q = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
            for r in chunk {
                q = q
                    .bind(r.id)
                    .bind(r.token)
                    .bind(r.state)
                    .bind(r.attempts)
                    .bind(r.exceptions)
                    .bind(r.defers)
                    .bind(r.consecutive_auth)
                    .bind(r.prev_delay_ms)
                    .bind(r.first_attempt_at)
                    .bind(r.run_at)
                    .bind(r.defer_reason)
                    .bind(r.dead_reason)
                    .bind(r.last_error.as_deref())
                    .bind(r.result.as_deref())
                    .bind(r.finished_at)
                    .bind(r.updated_at);
            }
            applied.extend(q.fetch_all(&mut *tx).await?);
        }
        // The attempts' declines (and card stops) commit with them.
        self.record_declines_of(&mut tx, cs, &applied).await?;
        tx.commit().await?;
        Ok(applied)
    }

    /// Claims need no gate here: there is one writer connection.
    async fn claim_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        None
    }

    /// The claim returns each row as one JSON array (see `sql::sqlite::claim`).
    async fn fetch_claimed(
        &self,
        st: &crate::ops::ClaimStatement,
    ) -> Result<Vec<crate::rows::JobRow>> {
        let q = st.bind(sqlx::query_as::<_, (String,)>(sqlx::AssertSqlSafe(
            st.sql.clone(),
        )));
        // A worker must not take jobs from a file that the next start will not see: it would
        // run them (and call their PSP) with every write lost.
        self.check_file()?;
        let rows = q.fetch_all(self.pool()).await?;
        rows.iter()
            .map(|(r,)| crate::rows::JobRow::from_json(r))
            .collect()
    }

    fn wake(&self) {
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
/// run_at, ttl_ms, deadline, quota_key, traceparent]`, inserted in array order (so ids follow input order).
const INSERT_JSON: &str = "INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, \
    dependency, priority, state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, \
    updated_at, quota_key, traceparent) \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, \
    value ->> 6, value ->> 7, value ->> 8, value ->> 9, value ->> 10, value ->> 11, $2, $2, \
    value ->> 12, value ->> 13 \
    FROM json_each($1) WHERE true ORDER BY key \
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
    RETURNING id, queue, idempotency_key";

/// Chunk sizes of a completion batch, largest first, the powers of two: a batch of 200 runs
/// as 128 + 64 + 8 rows, and the runtime's group commits (whatever completions are ready, so
/// any size) take at most one statement per set bit. Parameters are anonymous (`?`): sqlx
/// looks each named one up in a list, which makes binding cost grow with the square of their
/// number.
const COMPLETION_CHUNKS: [usize; CHUNK_SIZES] = [128, 64, 32, 16, 8, 4, 2, 1];

/// How many chunk sizes (prepared statements per completion statement).
const CHUNK_SIZES: usize = 8;

/// Columns of the attempts' rows, in bind order.
const ATTEMPT_COLUMNS: &str = "id, token, worker, started_at, duration_ms, class, http_status, \
    error, delay_ms, mode, counted, response";

/// Columns of the jobs' rows, in bind order.
const JOB_COLUMNS: &str = "id, token, state, attempts, exceptions, defers, consecutive_auth, \
    prev_delay_ms, first_attempt_at, run_at, defer_reason, dead_reason, last_error, result, \
    finished_at, updated_at";

/// The attempts of a batch of completions, for the jobs whose lease (id, token, running)
/// still holds. (`+state`: not through a state index, so that the plan walks the batch and
/// looks each job up by id; the same in the jobs' update.)
const COMPLETE_ATTEMPTS_SQL: &str = "INSERT INTO \
    redrive_attempts (job_id, number, replay, lease_token, worker, started_at, duration_ms, \
    class, http_status, error, delay_ms, mode, counted, response) SELECT j.id, (SELECT \
    COUNT(*) + 1 FROM redrive_attempts a WHERE a.job_id = j.id AND a.replay = j.replays), \
    j.replays, j.lease_token, v.worker, v.started_at, v.duration_ms, v.class, v.http_status, \
    v.error, v.delay_ms, v.mode, v.counted, v.response FROM v JOIN redrive_jobs j ON j.id = v.id WHERE \
    j.lease_token = v.token AND +j.state = 'running'";

/// The fenced update of a batch of completions; returns the ids that applied.
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

/// One statement per chunk size: `WITH v(columns) AS (VALUES (?, …), …)` and the body.
fn completion_statements(columns: &str, body: &str) -> [String; CHUNK_SIZES] {
    let width = columns.split(',').count();
    COMPLETION_CHUNKS.map(|rows| {
        let row = format!("({})", vec!["?"; width].join(", "));
        let values = vec![row; rows].join(", ");
        format!("WITH v({columns}) AS MATERIALIZED (VALUES {values}) {body}")
    })
}

static COMPLETE_ATTEMPTS: std::sync::LazyLock<[String; CHUNK_SIZES]> =
    std::sync::LazyLock::new(|| completion_statements(ATTEMPT_COLUMNS, COMPLETE_ATTEMPTS_SQL));
static COMPLETE_JOBS: std::sync::LazyLock<[String; CHUNK_SIZES]> =
    std::sync::LazyLock::new(|| completion_statements(JOB_COLUMNS, COMPLETE_JOBS_SQL));

/// Splits `rows` greedily into chunks of the sizes in [`COMPLETION_CHUNKS`], each with the
/// statement for its size.
fn chunked<'a, T>(
    mut rows: &'a [T],
    statements: &'a [String; CHUNK_SIZES],
) -> Vec<(&'a [T], &'a str)> {
    let mut out = Vec::new();
    for (size, sql) in COMPLETION_CHUNKS.iter().zip(statements) {
        while rows.len() >= *size {
            let (head, rest) = rows.split_at(*size);
            out.push((head, sql.as_str()));
            rows = rest;
        }
    }
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_once_in_order() {
        let statements = completion_statements(ATTEMPT_COLUMNS, COMPLETE_ATTEMPTS_SQL);
        for n in [0usize, 1, 7, 8, 9, 41, 128, 200, 333] {
            let rows: Vec<usize> = (0..n).collect();
            let chunks = chunked(&rows, &statements);
            let flat: Vec<usize> = chunks.iter().flat_map(|(c, _)| c.iter().copied()).collect();
            assert_eq!(flat, rows, "n = {n}");
            // The fewest statements: one per 128 rows, then one per set bit of the rest.
            assert_eq!(
                chunks.len(),
                n / 128 + (n % 128).count_ones() as usize,
                "n = {n}"
            );
            for (c, sql) in &chunks {
                // Each statement has exactly one placeholder per bound value.
                let width = ATTEMPT_COLUMNS.split(',').count();
                assert_eq!(sql.matches('?').count(), c.len() * width, "n = {n}");
            }
        }
    }
}
