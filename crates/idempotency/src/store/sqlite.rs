//! The SQLite dialect: WAL, `synchronous=FULL`, claims in `BEGIN IMMEDIATE`.
//!
//! Times are integer unix milliseconds computed by SQLite itself
//! (`julianday('now')`, millisecond precision), so every lease and expiry decision uses one
//! clock: the database's.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Sqlite;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteQueryResult,
    SqliteSynchronous,
};

use super::sql::{Dialect, SqlIdempotencyStore, Statements};
use crate::error::IdempotencyStoreError;

/// The oldest SQLite the store accepts (`RETURNING` and generalised upsert).
pub const MIN_SQLITE_VERSION: &str = "3.35.0";

/// Idempotency records in SQLite.
pub type SqliteIdempotencyStore = SqlIdempotencyStore<Sqlite>;

macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}

const STATEMENTS: Statements = Statements {
    begin_claim: "BEGIN IMMEDIATE",
    delete_expired_one: concat!(
        "DELETE FROM idempotency_keys WHERE scope = ?1 AND idem_key = ?2 AND state = 'completed' AND expires_at <= ",
        now_ms!()
    ),
    insert: concat!(
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
    ),
    select_existing: concat!(
        "SELECT id, fingerprint, state, recovery_point, lock_token, ",
        "(locked_until IS NOT NULL AND locked_until > ",
        now_ms!(),
        "), ",
        "response_status, response_headers, response_body, replay_unavailable ",
        "FROM idempotency_keys WHERE scope = ?1 AND idem_key = ?2"
    ),
    take_over: concat!(
        "UPDATE idempotency_keys SET lock_token = ?2, locked_until = ",
        now_ms!(),
        " + ?3, last_run_at = ",
        now_ms!(),
        ", attempts = attempts + 1 ",
        "WHERE id = ?1 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= ",
        now_ms!(),
        ") ",
        "RETURNING recovery_point, attempts"
    ),
    heartbeat: concat!(
        "UPDATE idempotency_keys SET locked_until = ",
        now_ms!(),
        " + ?3 ",
        "WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'"
    ),
    advance: "UPDATE idempotency_keys SET recovery_point = ?3 WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'",
    finalise: concat!(
        "UPDATE idempotency_keys SET state = 'completed', recovery_point = 'finished', response_status = ?3, ",
        "response_headers = ?4, response_body = ?5, replay_unavailable = ?6, completed_at = ",
        now_ms!(),
        ", ",
        "lock_token = NULL, locked_until = NULL WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'"
    ),
    release: "UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'",
    forget: "DELETE FROM idempotency_keys WHERE id = ?1 AND lock_token = ?2 AND state = 'in_progress'",
    get: concat!(
        "SELECT id, state, request_method, request_path, recovery_point, attempts, ",
        "(locked_until IS NOT NULL AND locked_until > ",
        now_ms!(),
        "), lock_token IS NOT NULL, response_status ",
        "FROM idempotency_keys WHERE scope = ?1 AND idem_key = ?2"
    ),
    recover_release: concat!(
        "UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL ",
        "WHERE scope = ?1 AND idem_key = ?2 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= ",
        now_ms!(),
        ")"
    ),
    recover_complete: concat!(
        "UPDATE idempotency_keys SET state = 'completed', recovery_point = 'finished', response_status = ?3, ",
        "response_headers = ?4, response_body = ?5, replay_unavailable = ?6, completed_at = ",
        now_ms!(),
        ", lock_token = NULL, locked_until = NULL ",
        "WHERE scope = ?1 AND idem_key = ?2 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= ",
        now_ms!(),
        ")"
    ),
    recover_delete: concat!(
        "DELETE FROM idempotency_keys WHERE scope = ?1 AND idem_key = ?2 AND state = 'in_progress' ",
        "AND (locked_until IS NULL OR locked_until <= ",
        now_ms!(),
        ")"
    ),
    reap: concat!(
        "DELETE FROM idempotency_keys WHERE id IN (SELECT id FROM idempotency_keys ",
        "WHERE state = 'completed' AND expires_at <= ",
        now_ms!(),
        " LIMIT ?1)"
    ),
    stuck: concat!(
        "SELECT COALESCE(SUM(expires_at <= ",
        now_ms!(),
        "), 0), ",
        "COALESCE(SUM(lock_token IS NOT NULL AND locked_until <= ",
        now_ms!(),
        "), 0) ",
        "FROM idempotency_keys WHERE state = 'in_progress'"
    ),
    list: concat!(
        "SELECT id, scope, idem_key, state, request_method, request_path, recovery_point, attempts, ",
        "(locked_until IS NOT NULL AND locked_until > ",
        now_ms!(),
        "), lock_token IS NOT NULL, response_status, created_at, last_run_at ",
        "FROM idempotency_keys WHERE id > ?1 AND (?2 IS NULL OR scope = ?2) AND ({filter}) ",
        "ORDER BY id LIMIT ?3"
    ),
    live: concat!("locked_until IS NOT NULL AND locked_until > ", now_ms!()),
};

impl Dialect for Sqlite {
    const SQL: Statements = STATEMENTS;

    fn migrator() -> Migrator {
        sqlx::migrate!("./migrations/sqlite")
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn check_server(pool: &SqlitePool) -> Result<(), IdempotencyStoreError> {
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(pool)
            .await
            .map_err(IdempotencyStoreError::db("ensure_schema"))?;
        if version_at_least(&version, MIN_SQLITE_VERSION) {
            Ok(())
        } else {
            Err(IdempotencyStoreError::SqliteTooOld {
                found: version,
                required: MIN_SQLITE_VERSION,
            })
        }
    }
}

impl SqlIdempotencyStore<Sqlite> {
    /// Opens (creating it when missing) the database at `url` (e.g. `sqlite://idem.db`)
    /// with WAL, `synchronous=FULL` and a 5 s busy timeout.
    ///
    /// # Errors
    /// [`IdempotencyStoreError::Database`] when the URL is invalid or the file cannot be opened.
    pub async fn connect(url: &str) -> Result<Self, IdempotencyStoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(IdempotencyStoreError::db("connect"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .after_release(|conn, _| Box::pin(super::sql::release_if_clean(conn)))
            .connect_with(options)
            .await
            .map_err(IdempotencyStoreError::db("connect"))?;
        Ok(Self::from_pool(pool))
    }
}

/// Whether dotted version `found` is at least `min`.
pub(crate) fn version_at_least(found: &str, min: &str) -> bool {
    let parse = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(found) >= parse(min)
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
