//! Retention: finished jobs (and their attempts) deleted after an age, in small batches, and
//! named leases so that one pruner of the fleet works at a time.
//!
//! A batch is one short transaction over at most [`MAX_BATCH`](crate::MAX_BATCH) jobs of one
//! finished state, oldest first, read through the `(state, finished_at)` index. It never
//! touches a job that is not finished: jobs waiting or running are not even read. On
//! PostgreSQL the batch locks its rows with `SKIP LOCKED` (a replay of the same dead job at
//! that moment is not waited for; that job is simply left for the next batch); on SQLite the
//! batch holds the one writer only for its own few milliseconds, and the caller paces the
//! batches (the runtime's pruner rests between them) so that claims get the writer in
//! between.
//!
//! Deleting finished jobs is idempotent, so two pruners at once would be harmless; the lease
//! only keeps a fleet of N processes from spending N times the work.

use std::time::Duration;

use serde::Serialize;

use crate::model::{JobState, dur_ms, millis};
use crate::ops::Backend as _;
use crate::{Result, Store, StoreError, Timestamp, check_batch};

/// The states a job can be pruned in: finished ones.
pub const FINISHED_STATES: [JobState; 3] =
    [JobState::Succeeded, JobState::Cancelled, JobState::Dead];

/// What one prune removed (or, for a preview, would remove).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Jobs deleted.
    pub jobs: u64,
    /// Their attempts deleted with them.
    pub attempts: u64,
}

impl Pruned {
    /// Adds another batch's counts.
    pub fn add(&mut self, o: Pruned) {
        self.jobs += o.jobs;
        self.attempts += o.attempts;
    }
}

fn finished_state(state: JobState) -> Result<&'static str> {
    if FINISHED_STATES.contains(&state) {
        Ok(state.as_str())
    } else {
        Err(StoreError::Invalid {
            field: "state",
            value: state.as_str().into(),
            reason: "only finished jobs are pruned: succeeded, cancelled or dead".into(),
        })
    }
}

#[cfg(feature = "sqlite")]
const PICK_SQLITE: &str = "SELECT id FROM redrive_jobs WHERE state = $1 AND finished_at < $2 \
    ORDER BY finished_at LIMIT $3";
#[cfg(feature = "postgres")]
const PICK_PG: &str = "SELECT id FROM redrive_jobs WHERE state = $1 AND finished_at < $2 \
    ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED";
#[cfg(feature = "sqlite")]
const DEL_ATTEMPTS_SQLITE: &str =
    "DELETE FROM redrive_attempts WHERE job_id IN (SELECT value FROM json_each($1))";
#[cfg(feature = "sqlite")]
const DEL_JOBS_SQLITE: &str =
    "DELETE FROM redrive_jobs WHERE id IN (SELECT value FROM json_each($1)) AND state = $2";
#[cfg(feature = "postgres")]
const DEL_ATTEMPTS_PG: &str = "DELETE FROM redrive_attempts WHERE job_id = ANY($1)";
#[cfg(feature = "postgres")]
const DEL_JOBS_PG: &str = "DELETE FROM redrive_jobs WHERE id = ANY($1) AND state = $2";
const COUNT_JOBS: &str = "SELECT COUNT(*) FROM redrive_jobs WHERE state = $1 AND finished_at < $2";
const COUNT_ATTEMPTS: &str = "SELECT COUNT(*) FROM redrive_attempts WHERE job_id IN \
    (SELECT id FROM redrive_jobs WHERE state = $1 AND finished_at < $2)";

const LEASE_SQL: &str = "INSERT INTO redrive_leases (name, holder, acquired_at, expires_at) \
    VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
    acquired_at = CASE WHEN redrive_leases.holder = excluded.holder \
      THEN redrive_leases.acquired_at ELSE excluded.acquired_at END, \
    expires_at = excluded.expires_at \
    WHERE redrive_leases.holder = excluded.holder OR redrive_leases.expires_at <= excluded.acquired_at \
    RETURNING holder";
const RELEASE_SQL: &str = "DELETE FROM redrive_leases WHERE name = $1 AND holder = $2";
const HOLDER_SQL: &str =
    "SELECT holder, expires_at FROM redrive_leases WHERE name = $1 AND expires_at > $2";

/// The lease the runtime's pruner takes: one pruner per fleet.
pub const PRUNER_LEASE: &str = "pruner";

impl Store {
    /// Deletes up to `limit` jobs in `state` (succeeded, cancelled or dead) that finished
    /// before `finished_before`, oldest first, and their attempts, in one short transaction.
    /// Returns what went; fewer than `limit` jobs means there are no more (for now).
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a state that is not finished or a `limit` of 0 or above
    /// [`MAX_BATCH`](crate::MAX_BATCH); the database's errors.
    pub async fn prune_batch(
        &self,
        state: JobState,
        finished_before: Timestamp,
        limit: u32,
    ) -> Result<Pruned> {
        let st = finished_state(state)?;
        check_batch("limit", limit as usize)?;
        if limit == 0 {
            return Err(StoreError::Invalid {
                field: "limit",
                value: "0".into(),
                reason: "at least 1".into(),
            });
        }
        let before = millis(finished_before);
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                let mut tx = s.tx().await?;
                let ids: Vec<i64> = sqlx::query_scalar(PICK_SQLITE)
                    .bind(st)
                    .bind(before)
                    .bind(i64::from(limit))
                    .fetch_all(&mut *tx)
                    .await?;
                if ids.is_empty() {
                    return Ok(Pruned::default());
                }
                let list = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into());
                let attempts = sqlx::query(DEL_ATTEMPTS_SQLITE)
                    .bind(&list)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                let jobs = sqlx::query(DEL_JOBS_SQLITE)
                    .bind(&list)
                    .bind(st)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(Pruned { jobs, attempts })
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let mut tx = s.tx().await?;
                let ids: Vec<i64> = sqlx::query_scalar(PICK_PG)
                    .bind(st)
                    .bind(before)
                    .bind(i64::from(limit))
                    .fetch_all(&mut *tx)
                    .await?;
                if ids.is_empty() {
                    return Ok(Pruned::default());
                }
                let attempts = sqlx::query(DEL_ATTEMPTS_PG)
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                let jobs = sqlx::query(DEL_JOBS_PG)
                    .bind(&ids)
                    .bind(st)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(Pruned { jobs, attempts })
            }
        }
    }

    /// What [`Store::prune_batch`] would delete in `state` before `finished_before`, in all
    /// (counts only; nothing changes).
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a state that is not finished; the database's errors.
    pub async fn prune_preview(
        &self,
        state: JobState,
        finished_before: Timestamp,
    ) -> Result<Pruned> {
        let st = finished_state(state)?;
        let before = millis(finished_before);
        let (jobs, attempts): (i64, i64) = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => (
                sqlx::query_scalar(COUNT_JOBS)
                    .bind(st)
                    .bind(before)
                    .fetch_one(&s.read)
                    .await?,
                sqlx::query_scalar(COUNT_ATTEMPTS)
                    .bind(st)
                    .bind(before)
                    .fetch_one(&s.read)
                    .await?,
            ),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => (
                sqlx::query_scalar(COUNT_JOBS)
                    .bind(st)
                    .bind(before)
                    .fetch_one(&s.read)
                    .await?,
                sqlx::query_scalar(COUNT_ATTEMPTS)
                    .bind(st)
                    .bind(before)
                    .fetch_one(&s.read)
                    .await?,
            ),
        };
        Ok(Pruned {
            jobs: u64::try_from(jobs).unwrap_or(0),
            attempts: u64::try_from(attempts).unwrap_or(0),
        })
    }

    /// Takes the lease `name` for `holder` until `now + ttl`, or renews it if `holder` has it.
    /// Returns whether `holder` holds it now: `false` while another holder's lease runs. An
    /// expired lease goes to whoever asks first (a crashed holder's lease just runs out).
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for an empty name or holder, or a zero `ttl`; the database's.
    pub async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<bool> {
        for (field, v) in [("name", name), ("holder", holder)] {
            if v.is_empty() || v.len() > crate::MAX_NAME_LEN {
                return Err(StoreError::Invalid {
                    field,
                    value: v.chars().take(80).collect(),
                    reason: "must be 1 to 255 bytes".into(),
                });
            }
        }
        if ttl.is_zero() {
            return Err(StoreError::Invalid {
                field: "ttl",
                value: "0s".into(),
                reason: "must be more than zero".into(),
            });
        }
        let now = millis(now);
        let until = now.saturating_add(dur_ms(ttl));
        let got: Option<String> = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                sqlx::query_scalar(LEASE_SQL)
                    .bind(name)
                    .bind(holder)
                    .bind(now)
                    .bind(until)
                    .fetch_optional(&s.pool)
                    .await?
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                sqlx::query_scalar(LEASE_SQL)
                    .bind(name)
                    .bind(holder)
                    .bind(now)
                    .bind(until)
                    .fetch_optional(&s.pool)
                    .await?
            }
        };
        Ok(got.is_some())
    }

    /// Gives the lease `name` up if `holder` has it (so another may take it at once). Returns
    /// whether it was held.
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<bool> {
        let n = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => sqlx::query(RELEASE_SQL)
                .bind(name)
                .bind(holder)
                .execute(&s.pool)
                .await?
                .rows_affected(),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => sqlx::query(RELEASE_SQL)
                .bind(name)
                .bind(holder)
                .execute(&s.pool)
                .await?
                .rows_affected(),
        };
        Ok(n > 0)
    }

    /// Who holds the lease `name` at `now`, and until when (`None`: nobody).
    pub async fn lease_holder(
        &self,
        name: &str,
        now: Timestamp,
    ) -> Result<Option<(String, Timestamp)>> {
        let row: Option<(String, i64)> = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                sqlx::query_as(HOLDER_SQL)
                    .bind(name)
                    .bind(millis(now))
                    .fetch_optional(&s.read)
                    .await?
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                sqlx::query_as(HOLDER_SQL)
                    .bind(name)
                    .bind(millis(now))
                    .fetch_optional(&s.read)
                    .await?
            }
        };
        Ok(row.map(|(h, t)| (h, crate::from_millis(t))))
    }
}
