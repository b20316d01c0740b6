//! The PostgreSQL dialect: every time is `now()` of the server, claims are one transaction
//! (`INSERT … ON CONFLICT DO NOTHING`, then `SELECT … FOR UPDATE` of the existing row).

use std::time::Duration;

use sqlx::Postgres;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgQueryResult};

use super::sql::{Dialect, SqlIdempotencyStore, Statements};
use crate::error::IdempotencyStoreError;

/// Idempotency records in PostgreSQL (shared by every process of the fleet).
pub type PostgresIdempotencyStore = SqlIdempotencyStore<Postgres>;

const STATEMENTS: Statements = Statements {
    begin_claim: "BEGIN",
    delete_expired_one: "DELETE FROM idempotency_keys WHERE scope = $1 AND idem_key = $2 AND state = 'completed' AND expires_at <= now()",
    insert: "INSERT INTO idempotency_keys (scope, idem_key, request_method, request_path, fingerprint, state, lock_token, locked_until, expires_at) \
     VALUES ($1, $2, $3, $4, $5, 'in_progress', $6, now() + $7::bigint * interval '1 millisecond', now() + $8::bigint * interval '1 millisecond') \
     ON CONFLICT (scope, idem_key) DO NOTHING RETURNING id",
    select_existing: "SELECT id, fingerprint, state, recovery_point, lock_token, \
     (locked_until IS NOT NULL AND locked_until > now()), \
     response_status, response_headers::text, response_body, replay_unavailable \
     FROM idempotency_keys WHERE scope = $1 AND idem_key = $2 FOR UPDATE",
    take_over: "UPDATE idempotency_keys SET lock_token = $2, locked_until = now() + $3::bigint * interval '1 millisecond', \
     last_run_at = now(), attempts = attempts + 1 \
     WHERE id = $1 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= now()) \
     RETURNING recovery_point, attempts",
    heartbeat: "UPDATE idempotency_keys SET locked_until = now() + $3::bigint * interval '1 millisecond' \
     WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'",
    advance: "UPDATE idempotency_keys SET recovery_point = $3 WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'",
    finalise: "UPDATE idempotency_keys SET state = 'completed', recovery_point = 'finished', response_status = $3, \
     response_headers = $4::jsonb, response_body = $5, replay_unavailable = $6, completed_at = now(), \
     lock_token = NULL, locked_until = NULL WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'",
    release: "UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'",
    forget: "DELETE FROM idempotency_keys WHERE id = $1 AND lock_token = $2 AND state = 'in_progress'",
    get: "SELECT id, state, request_method, request_path, recovery_point, attempts, \
     (locked_until IS NOT NULL AND locked_until > now()), lock_token IS NOT NULL, response_status \
     FROM idempotency_keys WHERE scope = $1 AND idem_key = $2",
    recover_release: "UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL \
     WHERE scope = $1 AND idem_key = $2 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= now())",
    recover_complete: "UPDATE idempotency_keys SET state = 'completed', recovery_point = 'finished', response_status = $3, \
     response_headers = $4::jsonb, response_body = $5, replay_unavailable = $6, completed_at = now(), lock_token = NULL, locked_until = NULL \
     WHERE scope = $1 AND idem_key = $2 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= now())",
    recover_delete: "DELETE FROM idempotency_keys WHERE scope = $1 AND idem_key = $2 AND state = 'in_progress' \
     AND (locked_until IS NULL OR locked_until <= now())",
    reap: "DELETE FROM idempotency_keys WHERE id IN (SELECT id FROM idempotency_keys \
     WHERE state = 'completed' AND expires_at <= now() LIMIT $1)",
    stuck: "SELECT COUNT(*) FILTER (WHERE expires_at <= now()), \
     COUNT(*) FILTER (WHERE lock_token IS NOT NULL AND locked_until <= now()) \
     FROM idempotency_keys WHERE state = 'in_progress'",
    list: "SELECT id, scope, idem_key, state, request_method, request_path, recovery_point, attempts, \
     (locked_until IS NOT NULL AND locked_until > now()), lock_token IS NOT NULL, response_status, \
     (EXTRACT(EPOCH FROM created_at) * 1000)::bigint, (EXTRACT(EPOCH FROM last_run_at) * 1000)::bigint \
     FROM idempotency_keys WHERE id > $1 AND ($2::text IS NULL OR scope = $2) AND ({filter}) \
     ORDER BY id LIMIT $3",
    live: "locked_until IS NOT NULL AND locked_until > now()",
};

impl Dialect for Postgres {
    const SQL: Statements = STATEMENTS;

    fn migrator() -> Migrator {
        sqlx::migrate!("./migrations/postgres")
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn check_server(_pool: &PgPool) -> Result<(), IdempotencyStoreError> {
        Ok(())
    }
}

/// Opens and closes one connection: a pool that cannot connect only reports, after its
/// acquire timeout, that it timed out; this reports why (refused, unknown host, no such
/// role or database), at once.
async fn first_connection(url: &str) -> Result<(), IdempotencyStoreError> {
    let connect = <sqlx::PgConnection as sqlx::Connection>::connect(url);
    let conn = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(conn) => conn.map_err(IdempotencyStoreError::db("connect"))?,
        Err(_) => {
            return Err(IdempotencyStoreError::db("connect")(sqlx::Error::Io(
                std::io::Error::new(std::io::ErrorKind::TimedOut, "no connection within 10 s"),
            )));
        }
    };
    let _ = sqlx::Connection::close(conn).await;
    Ok(())
}

impl SqlIdempotencyStore<Postgres> {
    /// Connects to `url`.
    ///
    /// # Errors
    /// [`IdempotencyStoreError::Database`] when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, IdempotencyStoreError> {
        first_connection(url).await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .after_release(|conn, _| Box::pin(super::sql::release_if_clean(conn)))
            .connect(url)
            .await
            .map_err(IdempotencyStoreError::db("connect"))?;
        Ok(Self::from_pool(pool))
    }

    /// Connects to `url` with a pool of `max_connections` whose connections all work in
    /// `schema` (it must exist; [`IdempotencyStore::ensure_schema`](crate::IdempotencyStore::ensure_schema) then creates the table
    /// there). For tests and benchmarks that need a database of their own, and for putting
    /// the table outside `public`.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), redrive_idempotency::IdempotencyStoreError> {
    /// use redrive_idempotency::{IdempotencyStore, PostgresIdempotencyStore};
    /// let store =
    ///     PostgresIdempotencyStore::connect_in_schema("postgres://postgres@127.0.0.1/test", "payments", 8)
    ///         .await?;
    /// store.ensure_schema().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`IdempotencyStoreError::BadSchema`] when `schema` is not a plain identifier;
    /// [`IdempotencyStoreError::Database`] when the server cannot be reached.
    pub async fn connect_in_schema(
        url: &str,
        schema: &str,
        max_connections: u32,
    ) -> Result<Self, IdempotencyStoreError> {
        let plain = !schema.is_empty()
            && schema.len() <= 63
            && !schema.starts_with(|c: char| c.is_ascii_digit())
            && schema
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain {
            return Err(IdempotencyStoreError::BadSchema {
                schema: schema.to_owned(),
            });
        }
        first_connection(url).await?;
        let set = format!("SET search_path TO {schema}");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .after_release(|conn, _| Box::pin(super::sql::release_if_clean(conn)))
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
            .map_err(IdempotencyStoreError::db("connect"))?;
        Ok(Self::from_pool(pool))
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
            let e = PostgresIdempotencyStore::connect_in_schema(
                "postgres://nobody@127.0.0.1:1/x",
                bad,
                1,
            )
            .await
            .unwrap_err();
            assert!(
                matches!(&e, IdempotencyStoreError::BadSchema { schema } if schema == bad),
                "{bad:?}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn an_unreachable_server_is_reported_with_its_cause_not_as_a_pool_timeout() {
        for e in [
            PostgresIdempotencyStore::connect("postgres://nobody@127.0.0.1:1/x")
                .await
                .unwrap_err(),
            PostgresIdempotencyStore::connect_in_schema("postgres://nobody@127.0.0.1:1/x", "s", 1)
                .await
                .unwrap_err(),
        ] {
            let text = format!("{e}: {:?}", std::error::Error::source(&e));
            assert!(text.contains("refused"), "{text}");
        }
    }
}
