//! A PostgreSQL schema of its own per test.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Connection, Executor};

use crate::{CONNECT_TIMEOUT, postgres_url, skip_or_fail};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh PostgreSQL schema for one test: created by [`PgSchema::fresh`], dropped (with
/// everything in it) by [`PgSchema::drop_now`] or, failing that, when the value is dropped —
/// also when the test panics.
///
/// ```no_run
/// # async fn t() {
/// let Some(schema) = redrive_testkit::PgSchema::fresh("rdt").await else {
///     return; // skipped: PostgreSQL is unreachable and CI is not set
/// };
/// let pool = schema.pool(4).await; // its connections use the schema
/// # drop(pool);
/// schema.drop_now().await;
/// # }
/// ```
#[derive(Debug)]
pub struct PgSchema {
    server: String,
    name: String,
    dropped: bool,
}

impl PgSchema {
    /// A new schema named `{prefix}_{pid}_{n}_{micros}` on the server at [`postgres_url`].
    /// `prefix` is lower-case letters, digits and `_`, at most 12 characters (the stores take
    /// schema names of at most 40).
    ///
    /// Returns `None` (the caller skips) only when the server is unreachable and CI is not set.
    ///
    /// # Panics
    /// As [`skip_or_fail`] for any other connection error, when the schema cannot be created,
    /// or when `prefix` is not as above.
    pub async fn fresh(prefix: &str) -> Option<Self> {
        Self::fresh_at(&postgres_url(), prefix).await
    }

    /// [`PgSchema::fresh`] on the server at `server` (a URL without a schema).
    ///
    /// # Panics
    /// As [`PgSchema::fresh`].
    pub async fn fresh_at(server: &str, prefix: &str) -> Option<Self> {
        assert!(
            prefix.len() <= 12
                && prefix
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "schema prefix {prefix:?}: use at most 12 lower-case letters, digits and _"
        );
        let mut conn = match tokio::time::timeout(
            CONNECT_TIMEOUT,
            sqlx::PgConnection::connect(server),
        )
        .await
        {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                skip_or_fail(server, &e);
                return None;
            }
            Err(_) => {
                let e = sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
                ));
                skip_or_fail(server, &e);
                return None;
            }
        };
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() % 1_000_000);
        let name = format!(
            "{prefix}_{}_{}_{micros}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        conn.execute(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{name}\"")))
            .await
            .unwrap_or_else(|e| panic!("CREATE SCHEMA {name} at {server}: {e}"));
        let _ = conn.close().await;
        Some(Self {
            server: server.to_owned(),
            name,
            dropped: false,
        })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's URL, without the schema.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The server's URL with `schema=NAME` added: what `redrive --db` and
    /// `redrive_store::Store::connect` take.
    pub fn url(&self) -> String {
        let sep = if self.server.contains('?') { '&' } else { '?' };
        format!("{}{sep}schema={}", self.server, self.name)
    }

    /// A pool of at most `max` connections whose `search_path` is the schema.
    ///
    /// # Panics
    /// When the pool cannot connect.
    pub async fn pool(&self, max: u32) -> sqlx::PgPool {
        let name = self.name.clone();
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(CONNECT_TIMEOUT)
            .after_connect(move |conn, _| {
                let sql = format!("SET search_path TO \"{name}\"");
                Box::pin(async move {
                    conn.execute(sqlx::AssertSqlSafe(sql)).await?;
                    Ok(())
                })
            })
            .connect(&self.server)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {}: {e}", self.server))
    }

    /// Drops the schema and everything in it now.
    ///
    /// # Panics
    /// When the schema cannot be dropped.
    pub async fn drop_now(mut self) {
        self.dropped = true;
        drop_schema(&self.server, &self.name)
            .await
            .unwrap_or_else(|e| panic!("DROP SCHEMA {} at {}: {e}", self.name, self.server));
    }
}

async fn drop_schema(server: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut conn = sqlx::PgConnection::connect(server).await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{name}\" CASCADE"
    )))
    .await?;
    let _ = conn.close().await;
    Ok(())
}

impl Drop for PgSchema {
    /// Drops the schema on a thread of its own (drop cannot wait for the database inside the
    /// test's runtime); a failure is printed, not raised.
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (server, name) = (self.server.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return eprintln!("cleanup of schema {name}: {e}"),
            };
            if let Err(e) = rt.block_on(drop_schema(&server, &name)) {
                eprintln!("cleanup of schema {name}: {e}");
            }
        })
        .join();
    }
}
