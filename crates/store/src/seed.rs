//! Bulk synthetic rows for benchmarks and query-plan checks, written by the database itself
//! (`generate_series` on PostgreSQL, a recursive CTE on SQLite) instead of one enqueue at a
//! time, and the plan of the claim statement.
//!
//! Not for production data: seeded rows skip validation, idempotency keys and wake-ups.

use std::sync::Arc;

use crate::model::millis;
use crate::ops::Backend as _;
use crate::{ClaimParams, Result, Store, StoreError, Timestamp};

/// Rows written per statement: big enough that a million rows are a few statements, small
/// enough that one statement's work (and an SQLite write lock) stays short.
const SEED_CHUNK: u64 = 250_000;

/// What [`Store::seed`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedRows {
    /// Jobs waiting to be claimed (`available`, due at the seed's time): a backlog.
    Available,
    /// Jobs finished (`succeeded`) at the seed's time, each with one successful attempt: the
    /// history a retention window keeps.
    Succeeded,
}

/// A bulk seed: `count` jobs of `kind` on `queue` (or spread over `queues` queues named
/// after it), each with the same payload.
#[derive(Debug, Clone)]
pub struct Seed {
    /// The queue (with `queues` above 1, the prefix of the queues' names).
    pub queue: String,
    /// Queues the jobs are spread over, round robin: 0 or 1, all on `queue`; `n` above 1,
    /// on `{queue}-0` … `{queue}-{n-1}` (row `i` of a statement on `{queue}-{i % n}`).
    pub queues: u64,
    /// The kind.
    pub kind: String,
    /// How many jobs.
    pub count: u64,
    /// Their state.
    pub rows: SeedRows,
    /// The payload of every job (a JSON document).
    pub payload: serde_json::Value,
    /// Their creation (and due, and finish) time.
    pub at: Timestamp,
}

impl Seed {
    fn check(&self) -> Result<()> {
        for (field, v) in [("queue", &self.queue), ("kind", &self.kind)] {
            if v.is_empty() || v.len() > crate::MAX_NAME_LEN {
                return Err(StoreError::Invalid {
                    field,
                    value: v.clone(),
                    reason: format!("1 to {} characters", crate::MAX_NAME_LEN),
                });
            }
        }
        if self.queues > 1 {
            let last = format!("{}-{}", self.queue, self.queues - 1);
            if last.len() > crate::MAX_NAME_LEN {
                return Err(StoreError::Invalid {
                    field: "queue",
                    value: last,
                    reason: format!("1 to {} characters", crate::MAX_NAME_LEN),
                });
            }
        }
        Ok(())
    }
}

/// The payload `{"pad": "xxx…"}` whose JSON text is `bytes` long (at least the 11 bytes of
/// `{"pad": ""}`'s compact form, `{"pad":""}`).
pub fn padded_payload(bytes: usize) -> serde_json::Value {
    let pad = bytes.saturating_sub(r#"{"pad":""}"#.len());
    serde_json::json!({ "pad": "x".repeat(pad) })
}

const JOB_INSERT: &str = "INSERT INTO redrive_jobs (queue, kind, payload, state, attempts, \
    max_attempts, policy, run_at, first_attempt_at, result, created_at, updated_at, finished_at)";

/// The values of one seeded job: `$1` queue, `$2` kind, `$3` payload, `$4` time, `$5`
/// `succeeded` or `available`, `$7` the queues to spread over (`n` the row's number).
const JOB_VALUES: &str = "CASE WHEN $7 > 1 THEN $1 || '-' || CAST(n % $7 AS TEXT) ELSE $1 END, \
    $2, $3, $5, CASE WHEN $5 = 'succeeded' THEN 1 ELSE 0 END, 15, \
    'payment', $4, CASE WHEN $5 = 'succeeded' THEN $4 END, \
    CASE WHEN $5 = 'succeeded' THEN 'null' END, $4, $4, CASE WHEN $5 = 'succeeded' THEN $4 END";

const ATTEMPT_INSERT: &str = "INSERT INTO redrive_attempts (job_id, number, replay, \
    lease_token, worker, started_at, duration_ms, class, counted)";

impl Store {
    /// Writes `seed.count` synthetic jobs in bulk, in statements of at most 250,000 rows,
    /// each statement its own transaction; returns how many were written. For benchmarks and
    /// plan tests: the rows skip validation, carry no idempotency key and wake no worker.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for an empty or too long queue or kind, or the database's.
    pub async fn seed(&self, seed: &Seed) -> Result<u64> {
        seed.check()?;
        let payload = seed.payload.to_string();
        let state = match seed.rows {
            SeedRows::Available => "available",
            SeedRows::Succeeded => "succeeded",
        };
        let at = millis(seed.at);
        let spread = i64::try_from(seed.queues).unwrap_or(i64::MAX);
        let mut left = seed.count;
        while left > 0 {
            let n = left.min(SEED_CHUNK) as i64;
            match self {
                #[cfg(feature = "postgres")]
                Store::Postgres(s) => {
                    let sql = format!(
                        "WITH j AS ({JOB_INSERT} SELECT {JOB_VALUES} FROM generate_series(1, $6) AS g(n) \
                         RETURNING id, state) \
                         {ATTEMPT_INSERT} SELECT id, 1, 0, 1, 'seed', $4, 0, 'success', TRUE \
                         FROM j WHERE state = 'succeeded'"
                    );
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(&seed.queue)
                        .bind(&seed.kind)
                        .bind(&payload)
                        .bind(at)
                        .bind(state)
                        .bind(n)
                        .bind(spread)
                        .execute(&s.pool)
                        .await?;
                }
                #[cfg(feature = "sqlite")]
                Store::Sqlite(s) => {
                    let mut tx = s.tx().await?;
                    let before: i64 =
                        sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM redrive_jobs")
                            .fetch_one(&mut *tx)
                            .await?;
                    let sql = format!(
                        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s \
                         WHERE n < $6) {JOB_INSERT} SELECT {JOB_VALUES} FROM s"
                    );
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(&seed.queue)
                        .bind(&seed.kind)
                        .bind(&payload)
                        .bind(at)
                        .bind(state)
                        .bind(n)
                        .bind(spread)
                        .execute(&mut *tx)
                        .await?;
                    if seed.rows == SeedRows::Succeeded {
                        let sql = format!(
                            "{ATTEMPT_INSERT} SELECT id, 1, 0, 1, 'seed', $2, 0, 'success', TRUE \
                             FROM redrive_jobs WHERE id > $1"
                        );
                        sqlx::query(sqlx::AssertSqlSafe(sql))
                            .bind(before)
                            .bind(at)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                }
            }
            left -= n as u64;
        }
        // Fresh statistics, as autovacuum would have gathered for a table grown this much.
        match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                sqlx::query("ANALYZE redrive_jobs").execute(&s.pool).await?;
                sqlx::query("ANALYZE redrive_attempts")
                    .execute(&s.pool)
                    .await?;
            }
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                sqlx::query("ANALYZE").execute(&s.pool).await?;
            }
        }
        Ok(seed.count)
    }

    /// The plan the database chooses for the claim statement `p` would run (PostgreSQL's
    /// `EXPLAIN`, SQLite's `EXPLAIN QUERY PLAN`, each node indented two spaces per level below its parent), one line
    /// per plan node; nothing is claimed.
    /// Empty when the claim would not reach the database (no queues, no kinds, limit 0).
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a limit above [`crate::MAX_BATCH`], or the database's.
    pub async fn claim_plan(&self, p: &ClaimParams) -> Result<Vec<String>> {
        match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let Some(st) = s.claim_statement(p)? else {
                    return Ok(Vec::new());
                };
                let sql: Arc<str> = Arc::from(format!("EXPLAIN {}", st.sql));
                let q = st.bind(sqlx::query_as::<_, (String,)>(sqlx::AssertSqlSafe(sql)));
                let rows = q.fetch_all(&s.pool).await?;
                Ok(rows.into_iter().map(|(line,)| line).collect())
            }
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                let Some(st) = s.claim_statement(p)? else {
                    return Ok(Vec::new());
                };
                let sql: Arc<str> = Arc::from(format!("EXPLAIN QUERY PLAN {}", st.sql));
                let q = st.bind(sqlx::query_as::<_, (i64, i64, i64, String)>(
                    sqlx::AssertSqlSafe(sql),
                ));
                // Rows come parent first; each is indented two spaces per level, as the
                // sqlite3 shell shows them.
                let mut depth = std::collections::HashMap::new();
                let mut out = Vec::new();
                for (id, parent, _, detail) in q.fetch_all(&s.pool).await? {
                    let d = depth.get(&parent).map_or(0, |d| d + 1);
                    depth.insert(id, d);
                    out.push(format!("{}{detail}", "  ".repeat(d)));
                }
                Ok(out)
            }
        }
    }
}
