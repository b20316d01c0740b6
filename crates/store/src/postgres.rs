//! The PostgreSQL backend: `FOR UPDATE SKIP LOCKED` claims and LISTEN/NOTIFY wake-ups.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Executor, PgConnection, PgPool, Postgres, Transaction};

use crate::sql::{Dialect, Sql};
use crate::{Result, StoreError};

/// The PostgreSQL store, optionally inside its own schema.
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(crate) pool: PgPool,
    pub(crate) read: PgPool,
    pub(crate) sql: Arc<Sql>,
    pub(crate) wake: Arc<tokio::sync::watch::Sender<u64>>,
    schema: String,
}

impl PgStore {
    /// Connects to `url` (`postgres://…`), in schema `schema` (created if missing; default
    /// `public`), and migrates.
    pub async fn connect(url: &str, schema: Option<&str>, max_connections: u32) -> Result<Self> {
        let opts = PgConnectOptions::from_str(url).map_err(|e| StoreError::BadUrl {
            url: url.into(),
            reason: e.to_string(),
        })?;
        let schema = schema.unwrap_or("public").to_owned();
        if !schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
            || schema.len() > 40
        {
            return Err(StoreError::Invalid {
                field: "schema",
                value: schema,
                reason: "use letters, digits and _ (at most 40)".into(),
            });
        }
        if schema != "public" {
            let mut conn = <PgConnection as sqlx::Connection>::connect_with(&opts).await?;
            conn.execute(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS \"{schema}\""
            )))
            .await?;
        }
        let search_path = schema.clone();
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(2))
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                let sp = search_path.clone();
                Box::pin(async move {
                    conn.execute(sqlx::AssertSqlSafe(format!("SET search_path TO \"{sp}\"")))
                        .await?;
                    Ok(())
                })
            })
            .connect_with(opts)
            .await?;
        let store = Self {
            read: pool.clone(),
            pool,
            sql: Arc::new(Sql::new(Dialect::Postgres)),
            wake: Arc::new(tokio::sync::watch::channel(0).0),
            schema,
        };
        store.migrate().await?;
        store.spawn_listener();
        Ok(store)
    }

    /// Applies the embedded migrations (idempotent; safe to run from several processes).
    pub async fn migrate(&self) -> Result<()> {
        sqlx::migrate!("./migrations/postgres")
            .run(&self.pool)
            .await?;
        Ok(())
    }

    /// The pool (for callers that enqueue inside their own transaction).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema the store lives in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Drops the store's schema and everything in it (tests; refuses `public`).
    pub async fn drop_schema(&self) -> Result<()> {
        if self.schema == "public" {
            return Err(StoreError::Invalid {
                field: "schema",
                value: self.schema.clone(),
                reason: "refusing to drop public".into(),
            });
        }
        self.pool
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.schema
            )))
            .await?;
        Ok(())
    }

    pub(crate) async fn tx(&self) -> Result<Transaction<'static, Postgres>> {
        Ok(self.pool.begin().await?)
    }

    /// One `INSERT … SELECT FROM UNNEST(arrays)`: thirteen parameters whatever the chunk size.
    pub(crate) async fn insert_chunk(
        &self,
        conn: &mut PgConnection,
        chunk: &[crate::NewJob],
        now: redrive_policy::Timestamp,
    ) -> Result<Vec<crate::rows::JobRow>> {
        let rows: Vec<crate::batch::InsertRow> = chunk
            .iter()
            .map(|j| crate::batch::InsertRow::of(j, now))
            .collect();
        let col = |f: fn(&crate::NewJob) -> String| chunk.iter().map(f).collect::<Vec<_>>();
        let opt = |f: fn(&crate::NewJob) -> Option<String>| chunk.iter().map(f).collect::<Vec<_>>();
        let sql = format!(
            "INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, \
             state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at) \
             SELECT q, k, p, ik, dep, pri, st, ma, pol, ra, ttl, dl, $13, $13 FROM UNNEST( \
               CAST($1 AS TEXT[]), CAST($2 AS TEXT[]), CAST($3 AS TEXT[]), CAST($4 AS TEXT[]), \
               CAST($5 AS TEXT[]), CAST($6 AS INT8[]), CAST($7 AS TEXT[]), CAST($8 AS INT8[]), \
               CAST($9 AS TEXT[]), CAST($10 AS INT8[]), CAST($11 AS INT8[]), CAST($12 AS INT8[])) \
             WITH ORDINALITY AS u(q, k, p, ik, dep, pri, st, ma, pol, ra, ttl, dl, ord) ORDER BY ord \
             ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
             RETURNING {}",
            crate::rows::JOB_COLS
        );
        Ok(
            sqlx::query_as::<_, crate::rows::JobRow>(sqlx::AssertSqlSafe(sql))
                .bind(col(|j| j.queue.clone()))
                .bind(col(|j| j.kind.clone()))
                .bind(col(|j| j.payload.to_string()))
                .bind(opt(|j| j.key.clone()))
                .bind(opt(|j| j.dependency.clone()))
                .bind(
                    chunk
                        .iter()
                        .map(|j| i64::from(j.priority))
                        .collect::<Vec<_>>(),
                )
                .bind(rows.iter().map(|r| r.state.to_owned()).collect::<Vec<_>>())
                .bind(
                    chunk
                        .iter()
                        .map(|j| i64::from(j.max_attempts))
                        .collect::<Vec<_>>(),
                )
                .bind(col(|j| j.policy.clone()))
                .bind(rows.iter().map(|r| r.run_at).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.ttl).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.deadline).collect::<Vec<_>>())
                .bind(crate::model::millis(now))
                .fetch_all(&mut *conn)
                .await?,
        )
    }

    pub(crate) fn wake(&self) {
        self.wake.send_modify(|v| *v = v.wrapping_add(1));
        let pool = self.pool.clone();
        let channel = format!("redrive_jobs_{}", self.schema);
        tokio::spawn(async move {
            let _ = sqlx::query("SELECT pg_notify($1, '')")
                .bind(channel)
                .execute(&pool)
                .await;
        });
    }

    /// Turns NOTIFYs from any process into local wake-ups; reconnects with a pause on errors.
    fn spawn_listener(&self) {
        let pool = self.pool.clone();
        let wake = Arc::downgrade(&self.wake);
        let channel = format!("redrive_jobs_{}", self.schema);
        tokio::spawn(async move {
            loop {
                if wake.strong_count() == 0 {
                    return;
                }
                if let Ok(mut listener) = PgListener::connect_with(&pool).await
                    && listener.listen(&channel).await.is_ok()
                {
                    {
                        loop {
                            let got =
                                tokio::time::timeout(Duration::from_secs(1), listener.recv()).await;
                            let Some(w) = wake.upgrade() else { return };
                            match got {
                                Ok(Ok(_)) => w.send_modify(|v| *v = v.wrapping_add(1)),
                                Ok(Err(_)) => break,
                                Err(_) => {}
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
}

crate::ops::shared_ops!(PgStore, Postgres, PgConnection);
