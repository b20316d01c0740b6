//! The SQLite store: WAL, `synchronous=FULL`, claims in `BEGIN IMMEDIATE`.
//!
//! Times are integer unix milliseconds computed by SQLite itself
//! (`julianday('now')`, millisecond precision), so every lease and expiry decision uses one
//! clock: the database's.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::{
    Acquired, ClaimOutcome, ClaimRequest, Existing, ExistingRow, IdempotencyStore, InfoRow,
    ListRequest, ListRow, ListedRecord, LockToken, ReapReport, RecordId, RecordInfo, Recovery,
    StoreFuture, StoredResponse, attempts_u32, classify, filter_sql, headers_to_json,
    info_from_row, listed_from_row, millis,
};
use crate::idempotency::error::StoreError;

/// The oldest SQLite the store accepts (`RETURNING` and generalised upsert).
pub const MIN_SQLITE_VERSION: &str = "3.35.0";

macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idempotency_keys (
        id                 INTEGER PRIMARY KEY,
        scope              TEXT    NOT NULL,
        idem_key           TEXT    NOT NULL CHECK (length(CAST(idem_key AS BLOB)) BETWEEN 1 AND 255),
        request_method     TEXT    NOT NULL,
        request_path       TEXT    NOT NULL,
        fingerprint        BLOB    NOT NULL,
        state              TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
        recovery_point     TEXT    NOT NULL DEFAULT 'started',
        lock_token         TEXT    NULL,
        locked_until       INTEGER NULL,
        attempts           INTEGER NOT NULL DEFAULT 1,
        response_status    INTEGER NULL,
        response_headers   TEXT    NULL,
        response_body      BLOB    NULL,
        replay_unavailable INTEGER NOT NULL DEFAULT 0,
        created_at         INTEGER NOT NULL,
        last_run_at        INTEGER NOT NULL,
        completed_at       INTEGER NULL,
        expires_at         INTEGER NOT NULL,
        UNIQUE (scope, idem_key),
        CHECK (state <> 'completed' OR response_status IS NOT NULL)
    )",
    "CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at)",
    "CREATE INDEX IF NOT EXISTS idempotency_keys_stuck ON idempotency_keys (last_run_at) WHERE state = 'in_progress'",
];

const DELETE_EXPIRED_ONE: &str = concat!(
    "DELETE FROM idempotency_keys WHERE scope = ?1 AND idem_key = ?2 AND state = 'completed' AND expires_at <= ",
    now_ms!()
);
const INSERT: &str = concat!(
    "INSERT INTO idempotency_keys (scope, idem_key, request_method, request_path, fingerprint, state, lock_token, locked_until, created_at, last_run_at, expires_at) ",
    "VALUES (?1, ?2, ?3, ?4, ?5, 'in_progress', ?6, ",
    now_ms!(),
    " + ?7, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + ?8) ",
    "ON CONFLICT (scope, idem_key) DO NOTHING RETURNING id"
);
const SELECT_EXISTING: &str = concat!(
    "SELECT id, fingerprint, state, recovery_point, lock_token, ",
    "(locked_until IS NOT NULL AND locked_until > ",
    now_ms!(),
    "), ",
    "response_status, response_headers, response_body, replay_unavailable ",
    "FROM idempotency_keys WHERE scope = ?1 AND idem_key = ?2"
);
const TAKE_OVER: &str = concat!(
    "UPDATE idempotency_keys SET lock_token = ?2, locked_until = ",
    now_ms!(),
    " + ?3, last_run_at = ",
    now_ms!(),
    ", attempts = attempts + 1 ",
    "WHERE id = ?1 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= ",
    now_ms!(),
    ") ",
    "RETURNING recovery_point, attempts"
);
const HEARTBEAT: &str = concat!(
    "UPDATE idempotency_keys SET locked_until = ",
    now_ms!(),
    " + ?3 ",
    "WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'"
);
const ADVANCE: &str = "UPDATE idempotency_keys SET recovery_point = ?3 WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'";
const FINALISE: &str = concat!(
    "UPDATE idempotency_keys SET state = 'completed', recovery_point = 'finished', response_status = ?3, ",
    "response_headers = ?4, response_body = ?5, replay_unavailable = ?6, completed_at = ",
    now_ms!(),
    ", ",
    "lock_token = NULL, locked_until = NULL WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'"
);
const RELEASE: &str = "UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'";
const GET: &str = concat!(
    "SELECT id, state, request_method, request_path, recovery_point, attempts, ",
    "(locked_until IS NOT NULL AND locked_until > ",
    now_ms!(),
    "), lock_token IS NOT NULL, response_status ",
    "FROM idempotency_keys WHERE scope = ?1 AND idem_key = ?2"
);
const RECOVER_RELEASE: &str = concat!(
    "UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL ",
    "WHERE scope = ?1 AND idem_key = ?2 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= ",
    now_ms!(),
    ")"
);
const RECOVER_COMPLETE: &str = concat!(
    "UPDATE idempotency_keys SET state = 'completed', recovery_point = 'finished', response_status = ?3, ",
    "response_headers = ?4, response_body = ?5, replay_unavailable = ?6, completed_at = ",
    now_ms!(),
    ", lock_token = NULL, locked_until = NULL ",
    "WHERE scope = ?1 AND idem_key = ?2 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= ",
    now_ms!(),
    ")"
);
const RECOVER_DELETE: &str = concat!(
    "DELETE FROM idempotency_keys WHERE scope = ?1 AND idem_key = ?2 AND state = 'in_progress' ",
    "AND (locked_until IS NULL OR locked_until <= ",
    now_ms!(),
    ")"
);
const REAP: &str = concat!(
    "DELETE FROM idempotency_keys WHERE id IN (SELECT id FROM idempotency_keys ",
    "WHERE state = 'completed' AND expires_at <= ",
    now_ms!(),
    " LIMIT ?1)"
);
const STUCK: &str = concat!(
    "SELECT COALESCE(SUM(expires_at <= ",
    now_ms!(),
    "), 0), ",
    "COALESCE(SUM(lock_token IS NOT NULL AND locked_until <= ",
    now_ms!(),
    "), 0) ",
    "FROM idempotency_keys WHERE state = 'in_progress'"
);

/// The listing of `redrive idempotency list`, with the filter's condition in `{filter}`.
const LIST: &str = concat!(
    "SELECT id, scope, idem_key, state, request_method, request_path, recovery_point, attempts, ",
    "(locked_until IS NOT NULL AND locked_until > ",
    now_ms!(),
    "), lock_token IS NOT NULL, response_status, created_at, last_run_at ",
    "FROM idempotency_keys WHERE id > ?1 AND (?2 IS NULL OR scope = ?2) AND ({filter}) ",
    "ORDER BY id LIMIT ?3"
);
const LIVE: &str = concat!("locked_until IS NOT NULL AND locked_until > ", now_ms!());

/// Idempotency records in SQLite.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Wraps an existing pool (configure WAL, `synchronous` and `busy_timeout` on it).
    #[must_use]
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self { pool }
    }

    /// Opens (creating it when missing) the database at `url` (e.g. `sqlite://idem.db`)
    /// with WAL, `synchronous=FULL` and a 5 s busy timeout.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the URL is invalid or the file cannot be opened.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(StoreError::db("connect"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .after_release(|conn, _| Box::pin(redrive_store::release_if_clean(conn)))
            .connect_with(options)
            .await
            .map_err(StoreError::db("connect"))?;
        Ok(Self { pool })
    }

    /// The pool.
    #[must_use]
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes the pool; every later operation fails (used to test failing closed).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn claim_tx(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let op = "claim";
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::db(op))?;
        sqlx::query(DELETE_EXPIRED_ONE)
            .bind(&req.scope)
            .bind(&req.key)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::db(op))?;
        let token = req.token.0.to_string();
        let inserted: Option<i64> = sqlx::query_scalar(INSERT)
            .bind(&req.scope)
            .bind(&req.key)
            .bind(&req.method)
            .bind(&req.path)
            .bind(req.fingerprint.as_slice())
            .bind(&token)
            .bind(millis(req.lease))
            .bind(millis(req.retention))
            .fetch_optional(&mut *tx)
            .await
            .map_err(StoreError::db(op))?;
        let outcome = if let Some(id) = inserted {
            ClaimOutcome::Acquired(Acquired {
                id: RecordId(id),
                recovery_point: super::RECOVERY_POINT_STARTED.to_owned(),
                attempts: 1,
                resumed: false,
            })
        } else {
            let row: ExistingRow = sqlx::query_as(SELECT_EXISTING)
                .bind(&req.scope)
                .bind(&req.key)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::db(op))?;
            match classify(row, req)? {
                Existing::Outcome(outcome) => outcome,
                Existing::TakeOver(id) => {
                    let taken: Option<(String, i32)> = sqlx::query_as(TAKE_OVER)
                        .bind(id)
                        .bind(&token)
                        .bind(millis(req.lease))
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(StoreError::db(op))?;
                    match taken {
                        Some((recovery_point, attempts)) => ClaimOutcome::Acquired(Acquired {
                            id: RecordId(id),
                            recovery_point,
                            attempts: attempts_u32(attempts),
                            resumed: true,
                        }),
                        None => ClaimOutcome::InProgress,
                    }
                }
            }
        };
        tx.commit().await.map_err(StoreError::db(op))?;
        Ok(outcome)
    }

    async fn check_version(&self) -> Result<(), StoreError> {
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&self.pool)
            .await
            .map_err(StoreError::db("ensure_schema"))?;
        if version_at_least(&version, MIN_SQLITE_VERSION) {
            Ok(())
        } else {
            Err(StoreError::SqliteTooOld {
                found: version,
                required: MIN_SQLITE_VERSION,
            })
        }
    }
}

/// Whether dotted version `found` is at least `min`.
pub(crate) fn version_at_least(found: &str, min: &str) -> bool {
    let parse = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(found) >= parse(min)
}

fn bind_response<'q>(
    q: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    response: &'q StoredResponse,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    q.bind(i32::from(response.status))
        .bind(headers_to_json(&response.headers))
        .bind(response.body.as_slice())
        .bind(response.replay_unavailable)
}

impl IdempotencyStore for SqliteStore {
    fn ensure_schema(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.check_version().await?;
            for statement in SCHEMA {
                sqlx::query(*statement)
                    .execute(&self.pool)
                    .await
                    .map_err(StoreError::db("ensure_schema"))?;
            }
            Ok(())
        })
    }

    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(self.claim_tx(request))
    }

    fn heartbeat(&self, id: RecordId, token: LockToken, lease: Duration) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let done = sqlx::query(HEARTBEAT)
                .bind(id.0)
                .bind(token.0.to_string())
                .bind(millis(lease))
                .execute(&self.pool)
                .await
                .map_err(StoreError::db("heartbeat"))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn advance<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        recovery_point: &'a str,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query(ADVANCE)
                .bind(id.0)
                .bind(token.0.to_string())
                .bind(recovery_point)
                .execute(&self.pool)
                .await
                .map_err(StoreError::db("advance"))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn finalise<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        response: &'a StoredResponse,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let q = sqlx::query(FINALISE).bind(id.0).bind(token.0.to_string());
            let done = bind_response(q, response)
                .execute(&self.pool)
                .await
                .map_err(StoreError::db("finalise"))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn release(&self, id: RecordId, token: LockToken) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let done = sqlx::query(RELEASE)
                .bind(id.0)
                .bind(token.0.to_string())
                .execute(&self.pool)
                .await
                .map_err(StoreError::db("release"))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> StoreFuture<'a, Option<RecordInfo>> {
        Box::pin(async move {
            let row: Option<InfoRow> = sqlx::query_as(GET)
                .bind(scope)
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(StoreError::db("get"))?;
            row.map(info_from_row).transpose()
        })
    }

    fn recover<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        action: &'a Recovery,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let q = match action {
                Recovery::Release => sqlx::query(RECOVER_RELEASE).bind(scope).bind(key),
                Recovery::Delete => sqlx::query(RECOVER_DELETE).bind(scope).bind(key),
                Recovery::Complete(response) => bind_response(
                    sqlx::query(RECOVER_COMPLETE).bind(scope).bind(key),
                    response,
                ),
            };
            let done = q
                .execute(&self.pool)
                .await
                .map_err(StoreError::db("recover"))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn reap(&self, batch: u32) -> StoreFuture<'_, ReapReport> {
        Box::pin(async move {
            let deleted = sqlx::query(REAP)
                .bind(i64::from(batch))
                .execute(&self.pool)
                .await
                .map_err(StoreError::db("reap"))?
                .rows_affected();
            let (expired, abandoned): (i64, i64) = sqlx::query_as(STUCK)
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::db("reap"))?;
            Ok(ReapReport {
                deleted,
                expired_in_progress: u64::try_from(expired).unwrap_or(0),
                abandoned: u64::try_from(abandoned).unwrap_or(0),
            })
        })
    }

    fn list<'a>(&'a self, request: &'a ListRequest) -> StoreFuture<'a, Vec<ListedRecord>> {
        Box::pin(async move {
            let sql = LIST.replace("{filter}", &filter_sql(request.filter, LIVE));
            let rows: Vec<ListRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(request.after.map_or(0, |a| a.0))
                .bind(request.scope.as_deref())
                .bind(i64::from(request.effective_limit()))
                .fetch_all(&self.pool)
                .await
                .map_err(StoreError::db("list"))?;
            rows.into_iter().map(listed_from_row).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::version_at_least;

    #[test]
    fn version_comparison() {
        assert!(version_at_least("3.51.3", "3.35.0"));
        assert!(version_at_least("3.35.0", "3.35.0"));
        assert!(!version_at_least("3.34.9", "3.35.0"));
        assert!(!version_at_least("2.99", "3.35.0"));
    }
}
