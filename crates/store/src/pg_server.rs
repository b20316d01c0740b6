//! Finding the PostgreSQL server to use among a URL's hosts, and moving to another when it
//! goes away (a failover): the pool's new connections go to the host found; connections opened
//! before the move are discarded when next taken from the pool.
//!
//! A [`Watch`] task checks the server every [`CHECK_EVERY`] through the pool itself (one short
//! query on an idle connection, no connection of its own). When the check fails or the server
//! no longer has the attributes asked for (a primary demoted to standby), it tries the hosts
//! again in order.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::pg_url::{PgUrl, SessionAttrs};
use crate::{Result, StoreError};

/// How often a multi-host store checks its server.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long one check (or one host's connection attempt, when there are several) may take.
const HOST_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether a connected server has `target`'s attributes; `Ok(None)` when it has, else what it is.
pub(crate) async fn check(conn: &mut PgConnection, target: SessionAttrs) -> Result<Option<String>> {
    if target == SessionAttrs::Any {
        return Ok(None);
    }
    let (in_recovery, read_only): (bool, bool) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(if target.accepts(in_recovery, read_only) {
        None
    } else if in_recovery {
        Some("a standby (in recovery)".into())
    } else {
        Some("read-only".into())
    })
}

/// The server a store uses now, among its URL's hosts.
#[derive(Debug)]
pub(crate) struct Servers {
    url: PgUrl,
    options: Vec<PgConnectOptions>,
    current: AtomicUsize,
    /// Whether a host has been chosen yet (the first choice is no move).
    chosen: AtomicBool,
    /// When the pool last moved to another host: connections older than this go.
    moved_at: std::sync::Mutex<Option<Instant>>,
}

impl Servers {
    /// Parses each host's options.
    pub(crate) fn new(url: PgUrl) -> Result<Self> {
        let named = url.has_param("application_name");
        let options = (0..url.hosts().len())
            .map(|i| {
                let one = url.host_url(i);
                let opts = PgConnectOptions::from_str(&one).map_err(|e| StoreError::BadUrl {
                    url: one,
                    reason: e.to_string(),
                })?;
                // Each connection says which process holds it (see `Store::connections`),
                // unless the URL names its own application.
                Ok(if named {
                    opts
                } else {
                    opts.application_name(&crate::connections::application_name())
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            url,
            options,
            current: AtomicUsize::new(0),
            chosen: AtomicBool::new(false),
            moved_at: std::sync::Mutex::new(None),
        })
    }

    pub(crate) fn url(&self) -> &PgUrl {
        &self.url
    }

    /// The options of the host in use.
    pub(crate) fn current(&self) -> PgConnectOptions {
        self.options[self.current.load(Ordering::Acquire)].clone()
    }

    /// The host in use, as `host:port`.
    pub(crate) fn current_host(&self) -> String {
        self.url.hosts()[self.current.load(Ordering::Acquire)].to_string()
    }

    /// Whether a connection of age `age` was opened before the last move (and so may be on
    /// the old server).
    pub(crate) fn is_stale(&self, age: Duration) -> bool {
        self.moved_at
            .lock()
            .ok()
            .and_then(|m| *m)
            .is_some_and(|at| age > at.elapsed())
    }

    /// Tries the hosts in order and returns an open connection to the first that has the
    /// URL's attributes (only writable ones are accepted, [`PgUrl::parse`]), recording it as
    /// the one in use.
    ///
    /// # Errors
    /// With one host, that host's own error (refused, bad password…); with several,
    /// [`StoreError::NoServer`] listing what each host was.
    pub(crate) async fn find(&self) -> Result<PgConnection> {
        let hosts = self.url.hosts();
        let mut tried = Vec::new();
        for i in 0..hosts.len() {
            match self.try_host(i).await {
                Ok(conn) => {
                    self.use_host(i);
                    return Ok(conn);
                }
                Err(e) if hosts.len() == 1 => return Err(e),
                Err(e) => tried.push(format!("{}: {e}", hosts[i])),
            }
        }
        Err(StoreError::NoServer {
            target: self.url.target().to_string(),
            tried: tried.join("; "),
        })
    }

    /// A connection to host `i` if it answers in time and has the URL's attributes.
    async fn try_host(&self, i: usize) -> Result<PgConnection> {
        let timeout = if self.options.len() == 1 {
            crate::postgres::CONNECT_TIMEOUT
        } else {
            HOST_TIMEOUT
        };
        let mut conn = tokio::time::timeout(timeout, PgConnection::connect_with(&self.options[i]))
            .await
            .map_err(|_| {
                StoreError::Database(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {} s", timeout.as_secs()),
                )))
            })??;
        let target = self.url.target();
        match check(&mut conn, target).await? {
            None => Ok(conn),
            Some(what) => {
                let _ = conn.close().await;
                Err(StoreError::Invalid {
                    field: "target_session_attrs",
                    value: target.to_string(),
                    reason: format!("{} is {what}", self.url.hosts()[i]),
                })
            }
        }
    }

    fn use_host(&self, i: usize) {
        let before = self.current.swap(i, Ordering::AcqRel);
        if !self.chosen.swap(true, Ordering::AcqRel) {
            // The first choice, at connect: nothing moved.
            if self.url.hosts().len() > 1 {
                tracing::info!(host = %self.url.hosts()[i], "PostgreSQL: using this host");
            }
            return;
        }
        if before != i {
            if let Ok(mut m) = self.moved_at.lock() {
                *m = Some(Instant::now());
            }
            tracing::warn!(
                host = %self.url.hosts()[i],
                was = %self.url.hosts()[before],
                "PostgreSQL: now using another host"
            );
        }
    }
}

/// Checks the pool's server every [`CHECK_EVERY`]; on a failure tries the hosts again and
/// points the pool's new connections at the one found. Ends when the pool is closed or the
/// store is dropped (`alive` has no strong count left).
pub(crate) fn spawn_watch(pool: PgPool, servers: Arc<Servers>, alive: std::sync::Weak<()>) {
    tokio::spawn(async move {
        let mut failing_since: Option<Instant> = None;
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            if alive.strong_count() == 0 || pool.is_closed() {
                return;
            }
            // While the server is failing, look for a usable one every second rather than
            // wait for the pool to time out again: the promotion is seen within a second.
            if failing_since.is_none() {
                let healthy = tokio::time::timeout(HOST_TIMEOUT, async {
                    let mut conn = pool.acquire().await?;
                    check(&mut conn, servers.url().target()).await
                })
                .await;
                match healthy {
                    Ok(Ok(None)) => continue,
                    Ok(Ok(Some(what))) => {
                        tracing::warn!(host = %servers.current_host(), "PostgreSQL: the server is now {what}");
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(host = %servers.current_host(), error = %e, "PostgreSQL: check failed");
                    }
                    Err(_) => {
                        tracing::warn!(host = %servers.current_host(), "PostgreSQL: check timed out");
                    }
                }
            }
            let since = *failing_since.get_or_insert_with(Instant::now);
            match servers.find().await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    pool.set_connect_options(servers.current());
                    failing_since = None;
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    for_s = since.elapsed().as_secs(),
                    "PostgreSQL: no usable server yet"
                ),
            }
        }
    });
}
