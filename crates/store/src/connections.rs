//! The fleet's database connections, per process: each PostgreSQL connection of a redrive
//! process carries `application_name = "redrive PID HOST"` (unless the URL sets its own), so
//! `pg_stat_activity` tells how many each process holds against the server's
//! `max_connections` (`redrive workers`, docs/scaling.md's budget).

use serde::Serialize;

use crate::{Result, Store};

/// The `application_name` of this process's connections.
pub(crate) fn application_name() -> String {
    let name = format!("redrive {} {}", std::process::id(), host_name());
    // PostgreSQL keeps 63 bytes of it; the pid comes first so that it survives.
    name.char_indices()
        .take_while(|(i, c)| i + c.len_utf8() <= 63)
        .map(|(_, c)| c)
        .collect()
}

/// The host's name, as the registry of live workers shows it: the kernel's (Linux), else
/// `$HOSTNAME`, else `/etc/hostname`, else `unknown`.
pub fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .chain(std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().chars().take(255).collect::<String>())
        .find(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// One redrive process's connections to the database, as the server counts them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessConnections {
    /// The process id.
    pub pid: u32,
    /// Its host (as much of the name as PostgreSQL kept).
    pub host: String,
    /// Its open connections (LISTEN included).
    pub connections: u32,
}

/// The server's connections: redrive's per process, and the totals.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Connections {
    /// Each redrive process's, by pid.
    pub processes: Vec<ProcessConnections>,
    /// Every connection to the server (any database, any client).
    pub total: u32,
    /// The server's `max_connections`.
    pub max_connections: u32,
    /// Connections set aside for superusers (`superuser_reserved_connections`).
    pub reserved: u32,
}

impl Store {
    /// The database's connections per redrive process; `None` on SQLite (no server).
    ///
    /// # Errors
    /// The database's.
    pub async fn connections(&self) -> Result<Option<Connections>> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => Ok(None),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let rows: Vec<(String, i64)> = sqlx::query_as(
                    "SELECT application_name, count(*) FROM pg_stat_activity \
                     WHERE application_name LIKE 'redrive %' GROUP BY application_name",
                )
                .fetch_all(&s.pool)
                .await?;
                let (total, max, reserved): (i64, String, String) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), \
                            current_setting('max_connections'), \
                            current_setting('superuser_reserved_connections')",
                )
                .fetch_one(&s.pool)
                .await?;
                let mut processes: Vec<ProcessConnections> = rows
                    .into_iter()
                    .filter_map(|(name, n)| {
                        let rest = name.strip_prefix("redrive ")?;
                        let (pid, host) = rest.split_once(' ').unwrap_or((rest, ""));
                        Some(ProcessConnections {
                            pid: pid.parse().ok()?,
                            host: host.to_owned(),
                            connections: u32::try_from(n).unwrap_or(u32::MAX),
                        })
                    })
                    .collect();
                processes.sort_by(|a, b| (&a.host, a.pid).cmp(&(&b.host, b.pid)));
                Ok(Some(Connections {
                    processes,
                    total: u32::try_from(total).unwrap_or(u32::MAX),
                    max_connections: max.parse().unwrap_or(0),
                    reserved: reserved.parse().unwrap_or(0),
                }))
            }
        }
    }
}
