//! The registry of live workers (`redrive_workers`), and the jobs no live worker can run.
//!
//! Each worker process registers itself when it starts ([`Store::register_worker`]), refreshes
//! its row while it runs ([`Store::worker_heartbeat`]) and removes it when it stops cleanly
//! ([`Store::unregister_worker`]). A row not refreshed for [`WORKER_STALE_AFTER`] belongs to a
//! worker that vanished (killed, crashed, cut off): reads ignore it and delete it.

use std::time::Duration;

use redrive_policy::Timestamp;
use serde::Serialize;

use crate::model::{Kinds, from_millis, json_list, millis};
use crate::{Result, Store, StoreError};

/// How long a worker's row lives without a heartbeat before the worker counts as gone (and
/// its row is deleted by the next read). Workers of `redrive-runtime` beat every 10 s.
pub const WORKER_STALE_AFTER: Duration = Duration::from_secs(60);

/// A live worker, as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerInfo {
    /// The worker's name, unique in the fleet (the lease owner of the jobs it claims).
    pub name: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The queues it claims from (empty: every queue).
    pub queues: Vec<String>,
    /// The kinds it runs (`"any"`, or `{"only": [...]}`).
    pub kinds: Kinds,
    /// Jobs it runs at once.
    pub concurrency: u32,
    /// When it started.
    pub started_at: Timestamp,
    /// Its last heartbeat.
    pub last_seen: Timestamp,
    /// The offset of its clock to the database's (database − local) in milliseconds, as it
    /// last measured it; `None` when it does not measure it (its clock is not synced).
    pub clock_offset_ms: Option<i64>,
    /// The policies it runs, as it says them: `v3` (the stored version 3), `file (differs
    /// from v3)`, `built-in`…; `None` when it does not say (set by the binary's workers,
    /// refreshed by each heartbeat).
    pub policy_version: Option<String>,
}

impl WorkerInfo {
    /// Whether this worker claims jobs of `kind` from `queue`.
    pub fn handles(&self, queue: &str, kind: &str) -> bool {
        (self.queues.is_empty() || self.queues.iter().any(|q| q == queue))
            && self.kinds.contains(kind)
    }
}

/// Jobs waiting (scheduled, available or deferred) for a queue and kind that no live worker
/// claims: they will not run until such a worker starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unhandled {
    /// Queue.
    pub queue: String,
    /// Kind.
    pub kind: String,
    /// Jobs waiting.
    pub jobs: u64,
    /// The earliest `run_at` among them.
    pub oldest_run_at: Timestamp,
}

#[derive(sqlx::FromRow)]
struct WorkerRow {
    name: String,
    host: String,
    pid: i64,
    queues: String,
    kinds: Option<String>,
    concurrency: i64,
    started_at: i64,
    last_seen: i64,
    clock_offset_ms: Option<i64>,
    policy_version: Option<String>,
}

impl WorkerRow {
    fn into_info(self) -> Result<WorkerInfo> {
        let corrupt = |what: &'static str, e: String| StoreError::Corrupt { what, detail: e };
        let list = |what: &'static str, s: &str| {
            serde_json::from_str::<Vec<String>>(s).map_err(|e| corrupt(what, e.to_string()))
        };
        Ok(WorkerInfo {
            queues: list("worker queues", &self.queues)?,
            kinds: match &self.kinds {
                None => Kinds::Any,
                Some(k) => Kinds::Only(list("worker kinds", k)?),
            },
            name: self.name,
            host: self.host,
            pid: u32::try_from(self.pid).map_err(|e| corrupt("worker pid", e.to_string()))?,
            concurrency: u32::try_from(self.concurrency)
                .map_err(|e| corrupt("worker concurrency", e.to_string()))?,
            started_at: from_millis(self.started_at),
            last_seen: from_millis(self.last_seen),
            clock_offset_ms: self.clock_offset_ms,
            policy_version: self.policy_version,
        })
    }
}

const WORKER_COLS: &str = "name, host, pid, queues, kinds, concurrency, started_at, last_seen, \
    clock_offset_ms, policy_version";

const UPSERT: &str = "INSERT INTO redrive_workers \
    (name, host, pid, queues, kinds, concurrency, started_at, last_seen, clock_offset_ms, \
    policy_version) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (name) DO UPDATE SET \
    host = excluded.host, pid = excluded.pid, queues = excluded.queues, kinds = excluded.kinds, \
    concurrency = excluded.concurrency, started_at = excluded.started_at, \
    last_seen = excluded.last_seen, clock_offset_ms = excluded.clock_offset_ms, \
    policy_version = excluded.policy_version";

const BEAT: &str = "UPDATE redrive_workers SET last_seen = $2, \
    clock_offset_ms = COALESCE($3, clock_offset_ms), \
    policy_version = COALESCE($4, policy_version) WHERE name = $1";
const REMOVE: &str = "DELETE FROM redrive_workers WHERE name = $1";
const EXPIRE: &str = "DELETE FROM redrive_workers WHERE last_seen < $1";
const WAITING: &str = "SELECT queue, kind, COUNT(*) AS n, MIN(run_at) AS oldest FROM redrive_jobs \
    WHERE state IN ('scheduled', 'available', 'deferred') GROUP BY queue, kind ORDER BY queue, kind";

macro_rules! on_pool {
    ($store:expr, $pool:ident => $e:expr) => {
        match $store {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                let $pool = &s.pool;
                $e
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let $pool = &s.pool;
                $e
            }
        }
    };
}

fn check_worker(w: &WorkerInfo) -> Result<()> {
    let bad = |field: &'static str, value: &str, reason: &str| StoreError::Invalid {
        field,
        value: value.chars().take(80).collect(),
        reason: reason.into(),
    };
    if w.name.is_empty() || w.name.len() > crate::MAX_NAME_LEN {
        return Err(bad("name", &w.name, "must be 1..=255 bytes"));
    }
    if w.host.len() > crate::MAX_NAME_LEN {
        return Err(bad("host", &w.host, "longer than 255 bytes"));
    }
    if let Some(v) = &w.policy_version {
        crate::model::name("policy_version", v)?;
    }
    Ok(())
}

impl Store {
    /// Registers a worker (or replaces the row of the same name), seen at `now`.
    pub async fn register_worker(&self, w: &WorkerInfo, now: Timestamp) -> Result<()> {
        check_worker(w)?;
        let kinds = w.kinds.as_list().map(json_list);
        on_pool!(self, pool => {
            sqlx::query(UPSERT)
                .bind(&w.name)
                .bind(&w.host)
                .bind(i64::from(w.pid))
                .bind(json_list(&w.queues))
                .bind(kinds)
                .bind(i64::from(w.concurrency))
                .bind(millis(w.started_at))
                .bind(millis(now))
                .bind(w.clock_offset_ms)
                .bind(w.policy_version.as_deref())
                .execute(pool)
                .await?;
        });
        Ok(())
    }

    /// A worker's heartbeat: its row is seen at `now`. `false` when the row is gone (it was
    /// deleted as stale, or never registered): register again.
    pub async fn worker_heartbeat(&self, name: &str, now: Timestamp) -> Result<bool> {
        self.worker_heartbeat_offset(name, now, None).await
    }

    /// [`Store::worker_heartbeat`] that also stores the worker's latest measured clock
    /// offset ([`WorkerInfo::clock_offset_ms`]; `None` keeps the stored one).
    pub async fn worker_heartbeat_offset(
        &self,
        name: &str,
        now: Timestamp,
        clock_offset_ms: Option<i64>,
    ) -> Result<bool> {
        self.worker_heartbeat_with(name, now, clock_offset_ms, None)
            .await
    }

    /// [`Store::worker_heartbeat_offset`] that also stores the policies the worker runs now
    /// ([`WorkerInfo::policy_version`]; `None` keeps the stored one).
    pub async fn worker_heartbeat_with(
        &self,
        name: &str,
        now: Timestamp,
        clock_offset_ms: Option<i64>,
        policy_version: Option<&str>,
    ) -> Result<bool> {
        if let Some(v) = policy_version {
            crate::model::name("policy_version", v)?;
        }
        let n = on_pool!(self, pool => {
            sqlx::query(BEAT)
                .bind(name)
                .bind(millis(now))
                .bind(clock_offset_ms)
                .bind(policy_version)
                .execute(pool)
                .await?
                .rows_affected()
        });
        Ok(n == 1)
    }

    /// Removes a worker's row (on a clean stop). Returns whether there was one.
    pub async fn unregister_worker(&self, name: &str) -> Result<bool> {
        let n = on_pool!(self, pool => {
            sqlx::query(REMOVE).bind(name).execute(pool).await?.rows_affected()
        });
        Ok(n == 1)
    }

    /// The live workers, by name. Rows not seen for [`WORKER_STALE_AFTER`] before `now` are
    /// left out and deleted. Workers write `last_seen` in the database's clock (R24): pass
    /// `now` in that clock too ([`Store::db_time`]), or a host whose clock is off would see
    /// live workers as gone. The stale rows are deleted with a write only when there are
    /// such rows: the dashboard reads this every few seconds.
    pub async fn workers(&self, now: Timestamp) -> Result<Vec<WorkerInfo>> {
        let cutoff = millis(now).saturating_sub(crate::model::dur_ms(WORKER_STALE_AFTER));
        let q = format!("SELECT {WORKER_COLS} FROM redrive_workers ORDER BY name");
        let rows: Vec<WorkerRow> = on_pool!(self, pool => {
            sqlx::query_as(sqlx::AssertSqlSafe(q)).fetch_all(pool).await?
        });
        let (live, stale): (Vec<WorkerRow>, Vec<WorkerRow>) =
            rows.into_iter().partition(|r| r.last_seen >= cutoff);
        if !stale.is_empty() {
            // A worker that beat meanwhile has a newer last_seen: the cutoff spares it.
            on_pool!(self, pool => {
                sqlx::query(EXPIRE).bind(cutoff).execute(pool).await?;
            });
        }
        live.into_iter().map(WorkerRow::into_info).collect()
    }

    /// Waiting jobs (scheduled, available, deferred) per queue and kind that no live worker
    /// claims (see [`Store::workers`]), by queue and kind.
    pub async fn unhandled(&self, now: Timestamp) -> Result<Vec<Unhandled>> {
        let workers = self.workers(now).await?;
        let rows: Vec<(String, String, i64, i64)> = on_pool!(self, pool => {
            sqlx::query_as(WAITING).fetch_all(pool).await?
        });
        Ok(rows
            .into_iter()
            .filter(|(q, k, _, _)| !workers.iter().any(|w| w.handles(q, k)))
            .map(|(queue, kind, n, oldest)| Unhandled {
                queue,
                kind,
                jobs: u64::try_from(n).unwrap_or(0),
                oldest_run_at: from_millis(oldest),
            })
            .collect())
    }
}
