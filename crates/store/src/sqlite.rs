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

    /// One multi-row `INSERT … VALUES` (chunks stay small: sqlx binds SQLite parameters in
    /// time that grows with their square).
    pub(crate) async fn insert_chunk(
        &self,
        conn: &mut SqliteConnection,
        chunk: &[crate::NewJob],
        now: redrive_policy::Timestamp,
    ) -> Result<Vec<crate::rows::JobRow>> {
        let sql = crate::batch::insert_sql(chunk.len());
        let mut q = sqlx::query_as::<_, crate::rows::JobRow>(sqlx::AssertSqlSafe(sql));
        for job in chunk {
            let r = crate::batch::InsertRow::of(job, now);
            q = q
                .bind(job.queue.clone())
                .bind(job.kind.clone())
                .bind(job.payload.to_string())
                .bind(job.key.clone())
                .bind(job.dependency.clone())
                .bind(i64::from(job.priority))
                .bind(r.state)
                .bind(i64::from(job.max_attempts))
                .bind(job.policy.clone())
                .bind(r.run_at)
                .bind(r.ttl)
                .bind(r.deadline)
                .bind(r.now);
        }
        Ok(q.fetch_all(&mut *conn).await?)
    }

    pub(crate) fn wake(&self) {
        self.wake.send_modify(|v| *v = v.wrapping_add(1));
    }
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

crate::ops::shared_ops!(SqliteStore, Sqlite, SqliteConnection);
