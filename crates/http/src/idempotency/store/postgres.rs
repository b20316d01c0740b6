//! The PostgreSQL store: every time is `now()` of the server, claims are one transaction
//! (`INSERT … ON CONFLICT DO NOTHING`, then `SELECT … FOR UPDATE` of the existing row).

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgPool};

use super::{
    Acquired, ClaimOutcome, ClaimRequest, Existing, ExistingRow, IdempotencyStore, InfoRow,
    ListRequest, ListRow, ListedRecord, LockToken, ReapReport, RecordId, RecordInfo, Recovery,
    StoreFuture, StoredResponse, attempts_u32, classify, filter_sql, headers_to_json,
    info_from_row, listed_from_row, millis,
};
use crate::idempotency::error::StoreError;

const SCHEMA_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtext('redrive.idempotency_keys.schema'))";
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idempotency_keys (
        id                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        scope              TEXT        NOT NULL,
        idem_key           TEXT        NOT NULL CHECK (octet_length(idem_key) BETWEEN 1 AND 255),
        request_method     TEXT        NOT NULL,
        request_path       TEXT        NOT NULL,
        fingerprint        BYTEA       NOT NULL,
        state              TEXT        NOT NULL CHECK (state IN ('in_progress', 'completed')),
        recovery_point     TEXT        NOT NULL DEFAULT 'started',
        lock_token         TEXT        NULL,
        locked_until       TIMESTAMPTZ NULL,
        attempts           INT         NOT NULL DEFAULT 1,
        response_status    INT         NULL,
        response_headers   JSONB       NULL,
        response_body      BYTEA       NULL,
        replay_unavailable BOOLEAN     NOT NULL DEFAULT FALSE,
        created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
        last_run_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
        completed_at       TIMESTAMPTZ NULL,
        expires_at         TIMESTAMPTZ NOT NULL,
        CONSTRAINT idempotency_keys_scope_key UNIQUE (scope, idem_key),
        CONSTRAINT idempotency_keys_completed_has_response CHECK (state <> 'completed' OR response_status IS NOT NULL)
    )",
    "CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at)",
    "CREATE INDEX IF NOT EXISTS idempotency_keys_stuck ON idempotency_keys (last_run_at) WHERE state = 'in_progress'",
];

const DELETE_EXPIRED_ONE: &str = "DELETE FROM idempotency_keys WHERE scope = $1 AND idem_key = $2 AND state = 'completed' AND expires_at <= now()";
const INSERT: &str = "INSERT INTO idempotency_keys (scope, idem_key, request_method, request_path, fingerprint, state, lock_token, locked_until, expires_at) \
     VALUES ($1, $2, $3, $4, $5, 'in_progress', $6, now() + $7::bigint * interval '1 millisecond', now() + $8::bigint * interval '1 millisecond') \
     ON CONFLICT (scope, idem_key) DO NOTHING RETURNING id";
const SELECT_EXISTING: &str = "SELECT id, fingerprint, state, recovery_point, lock_token, \
     (locked_until IS NOT NULL AND locked_until > now()), \
     response_status, response_headers::text, response_body, replay_unavailable \
     FROM idempotency_keys WHERE scope = $1 AND idem_key = $2 FOR UPDATE";
const TAKE_OVER: &str = "UPDATE idempotency_keys SET lock_token = $2, locked_until = now() + $3::bigint * interval '1 millisecond', \
     last_run_at = now(), attempts = attempts + 1 \
     WHERE id = $1 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= now()) \
     RETURNING recovery_point, attempts";
const HEARTBEAT: &str = "UPDATE idempotency_keys SET locked_until = now() + $3::bigint * interval '1 millisecond' \
     WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'";
const ADVANCE: &str = "UPDATE idempotency_keys SET recovery_point = $3 WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'";
const FINALISE: &str = "UPDATE idempotency_keys SET state = 'completed', recovery_point = 'finished', response_status = $3, \
     response_headers = $4::jsonb, response_body = $5, replay_unavailable = $6, completed_at = now(), \
     lock_token = NULL, locked_until = NULL WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'";
const RELEASE: &str = "UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'";
const GET: &str = "SELECT id, state, request_method, request_path, recovery_point, attempts, \
     (locked_until IS NOT NULL AND locked_until > now()), lock_token IS NOT NULL, response_status \
     FROM idempotency_keys WHERE scope = $1 AND idem_key = $2";
const RECOVER_RELEASE: &str = "UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL \
     WHERE scope = $1 AND idem_key = $2 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= now())";
const RECOVER_COMPLETE: &str = "UPDATE idempotency_keys SET state = 'completed', recovery_point = 'finished', response_status = $3, \
     response_headers = $4::jsonb, response_body = $5, replay_unavailable = $6, completed_at = now(), lock_token = NULL, locked_until = NULL \
     WHERE scope = $1 AND idem_key = $2 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= now())";
const RECOVER_DELETE: &str = "DELETE FROM idempotency_keys WHERE scope = $1 AND idem_key = $2 AND state = 'in_progress' \
     AND (locked_until IS NULL OR locked_until <= now())";
const REAP: &str = "DELETE FROM idempotency_keys WHERE id IN (SELECT id FROM idempotency_keys \
     WHERE state = 'completed' AND expires_at <= now() LIMIT $1)";
const STUCK: &str = "SELECT COUNT(*) FILTER (WHERE expires_at <= now()), \
     COUNT(*) FILTER (WHERE lock_token IS NOT NULL AND locked_until <= now()) \
     FROM idempotency_keys WHERE state = 'in_progress'";

/// The listing of `redrive idempotency list`, with the filter's condition in `{filter}`.
const LIST: &str = "SELECT id, scope, idem_key, state, request_method, request_path, recovery_point, attempts, \
     (locked_until IS NOT NULL AND locked_until > now()), lock_token IS NOT NULL, response_status, \
     (EXTRACT(EPOCH FROM created_at) * 1000)::bigint, (EXTRACT(EPOCH FROM last_run_at) * 1000)::bigint \
     FROM idempotency_keys WHERE id > $1 AND ($2::text IS NULL OR scope = $2) AND ({filter}) \
     ORDER BY id LIMIT $3";
const LIVE: &str = "locked_until IS NOT NULL AND locked_until > now()";

/// Opens and closes one connection: a pool that cannot connect only reports, after its
/// acquire timeout, that it timed out; this reports why (refused, unknown host, no such
/// role or database), at once.
async fn first_connection(url: &str) -> Result<(), StoreError> {
    let connect = <sqlx::PgConnection as sqlx::Connection>::connect(url);
    let conn = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(conn) => conn.map_err(StoreError::db("connect"))?,
        Err(_) => {
            return Err(StoreError::db("connect")(sqlx::Error::Io(
                std::io::Error::new(std::io::ErrorKind::TimedOut, "no connection within 10 s"),
            )));
        }
    };
    let _ = sqlx::Connection::close(conn).await;
    Ok(())
}

/// Idempotency records in PostgreSQL (shared by every process of the fleet).
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Wraps an existing pool (its `search_path` decides the schema of the table).
    #[must_use]
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Connects to `url`.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        first_connection(url).await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .after_release(|conn, _| Box::pin(redrive_store::release_if_clean(conn)))
            .connect(url)
            .await
            .map_err(StoreError::db("connect"))?;
        Ok(Self { pool })
    }

    /// Connects to `url` with a pool of `max_connections` whose connections all work in
    /// `schema` (it must exist; [`IdempotencyStore::ensure_schema`] then creates the table
    /// there). For tests and benchmarks that need a database of their own, and for putting
    /// the table outside `public`.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), redrive_http::idempotency::StoreError> {
    /// use redrive_http::idempotency::{IdempotencyStore, PostgresStore};
    /// let store =
    ///     PostgresStore::connect_in_schema("postgres://postgres@127.0.0.1/test", "payments", 8)
    ///         .await?;
    /// store.ensure_schema().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::BadSchema`] when `schema` is not a plain identifier;
    /// [`StoreError::Database`] when the server cannot be reached.
    pub async fn connect_in_schema(
        url: &str,
        schema: &str,
        max_connections: u32,
    ) -> Result<Self, StoreError> {
        let plain = !schema.is_empty()
            && schema.len() <= 63
            && !schema.starts_with(|c: char| c.is_ascii_digit())
            && schema
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain {
            return Err(StoreError::BadSchema {
                schema: schema.to_owned(),
            });
        }
        first_connection(url).await?;
        let set = format!("SET search_path TO {schema}");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .after_release(|conn, _| Box::pin(redrive_store::release_if_clean(conn)))
            .after_connect(move |conn, _meta| {
                let set = set.clone();
                Box::pin(async move {
                    use sqlx::Executor;
                    conn.execute(sqlx::AssertSqlSafe(set)).await?;
                    Ok(())
                })
            })
            .connect(url)
            .await
            .map_err(StoreError::db("connect"))?;
        Ok(Self { pool })
    }

    /// The pool.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes the pool; every later operation fails (used to test failing closed).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn claim_tx(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let op = "claim";
        let mut tx = self.pool.begin().await.map_err(StoreError::db(op))?;
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
            let row: Option<ExistingRow> = sqlx::query_as(SELECT_EXISTING)
                .bind(&req.scope)
                .bind(&req.key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::db(op))?;
            match row {
                // The conflicting row was deleted between our insert and select (recovery
                // `Delete`): report in progress, the client retries.
                None => ClaimOutcome::InProgress,
                Some(row) => match classify(row, req)? {
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
                },
            }
        };
        tx.commit().await.map_err(StoreError::db(op))?;
        Ok(outcome)
    }
}

fn bind_response<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, PgArguments>,
    response: &'q StoredResponse,
) -> sqlx::query::Query<'q, sqlx::Postgres, PgArguments> {
    q.bind(i32::from(response.status))
        .bind(headers_to_json(&response.headers))
        .bind(response.body.as_slice())
        .bind(response.replay_unavailable)
}

impl IdempotencyStore for PostgresStore {
    fn ensure_schema(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let op = "ensure_schema";
            let mut tx = self.pool.begin().await.map_err(StoreError::db(op))?;
            sqlx::query(SCHEMA_LOCK)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::db(op))?;
            for statement in SCHEMA {
                sqlx::query(*statement)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::db(op))?;
            }
            tx.commit().await.map_err(StoreError::db(op))
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
    use super::*;

    #[tokio::test]
    async fn a_schema_that_is_not_a_plain_identifier_is_refused_before_connecting() {
        for bad in [
            "",
            "1abc",
            "a;DROP TABLE x",
            "a b",
            "\"q\"",
            &"x".repeat(64),
        ] {
            // Port 1: nothing listens, so only the name check can answer.
            let e = PostgresStore::connect_in_schema("postgres://nobody@127.0.0.1:1/x", bad, 1)
                .await
                .unwrap_err();
            assert!(
                matches!(&e, StoreError::BadSchema { schema } if schema == bad),
                "{bad:?}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn an_unreachable_server_is_reported_with_its_cause_not_as_a_pool_timeout() {
        for e in [
            PostgresStore::connect("postgres://nobody@127.0.0.1:1/x")
                .await
                .unwrap_err(),
            PostgresStore::connect_in_schema("postgres://nobody@127.0.0.1:1/x", "s", 1)
                .await
                .unwrap_err(),
        ] {
            let text = format!("{e}: {:?}", std::error::Error::source(&e));
            assert!(text.contains("refused"), "{text}");
        }
    }
}
