//! The PostgreSQL backend: `FOR UPDATE SKIP LOCKED` claims and LISTEN/NOTIFY wake-ups.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgListener, PgPoolOptions, PgQueryResult};
use sqlx::query::QueryScalar;
use sqlx::{Executor, PgConnection, PgPool, Postgres, Transaction};

use crate::batch::CompletionRow;
use crate::ops::Backend;
use crate::pg_server::Servers;
use crate::pg_url::{Listen, PgUrl};
use crate::sql::{Dialect, Sql};
use crate::{Result, StoreError};

/// Binds a batch of completion rows to [`COMPLETE_SQL`] (or an `EXPLAIN` of it): one array
/// per column.
fn bind_completions<'q, O>(
    q: QueryScalar<'q, Postgres, O, PgArguments>,
    rows: &[CompletionRow],
) -> QueryScalar<'q, Postgres, O, PgArguments> {
    fn col<T>(rows: &[CompletionRow], f: impl Fn(&CompletionRow) -> T) -> Vec<T> {
        rows.iter().map(f).collect()
    }
    q.bind(col(rows, |r| r.id))
        .bind(col(rows, |r| r.token))
        .bind(col(rows, |r| r.state))
        .bind(col(rows, |r| r.attempts))
        .bind(col(rows, |r| r.exceptions))
        .bind(col(rows, |r| r.defers))
        .bind(col(rows, |r| r.consecutive_auth))
        .bind(col(rows, |r| r.prev_delay_ms))
        .bind(col(rows, |r| r.first_attempt_at))
        .bind(col(rows, |r| r.run_at))
        .bind(col(rows, |r| r.defer_reason))
        .bind(col(rows, |r| r.dead_reason))
        .bind(col(rows, |r| r.last_error.clone()))
        .bind(col(rows, |r| r.result.clone()))
        .bind(col(rows, |r| r.finished_at))
        .bind(col(rows, |r| r.updated_at))
        .bind(col(rows, |r| r.has_attempt))
        .bind(col(rows, |r| r.worker.clone()))
        .bind(col(rows, |r| r.started_at))
        .bind(col(rows, |r| r.duration_ms))
        .bind(col(rows, |r| r.class))
        .bind(col(rows, |r| r.http_status))
        .bind(col(rows, |r| r.error.clone()))
        .bind(col(rows, |r| r.delay_ms))
        .bind(col(rows, |r| r.mode))
        .bind(col(rows, |r| r.counted))
        .bind(col(rows, |r| r.response.clone()))
}

/// The PostgreSQL store, optionally inside its own schema.
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(crate) pool: PgPool,
    pub(crate) read: PgPool,
    pub(crate) sql: Arc<Sql>,
    pub(crate) wake: Arc<tokio::sync::watch::Sender<u64>>,
    /// At most [`CLAIM_CONCURRENCY`] claims of this process run at once (see there).
    claims: Arc<tokio::sync::Semaphore>,
    schema: String,
    /// The URL's hosts and the one in use.
    servers: Arc<Servers>,
    /// Held by every clone: the failover watch ends once the last one is dropped.
    alive: Arc<()>,
}

/// How many claim statements one process runs at the same time. Concurrent
/// `FOR UPDATE SKIP LOCKED` claims all start at the head of the same index and step over each
/// other's locked and just-claimed rows, so their cost grows with their number: with 64
/// workers claiming at once, drain throughput fell below that of 8. Workers beyond this wait
/// for a permit (a claim takes a few milliseconds); completions are not limited.
pub(crate) const CLAIM_CONCURRENCY: usize = 4;

/// How long [`PgStore::connect`] waits for the server (and the pool for a connection).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl PgStore {
    /// Connects to `url` (`postgres://…`, one host or libpq's host list with
    /// `target_session_attrs`), in schema `schema` (created if missing; default `public`), with
    /// a pool of `max_connections` (and one more connection that LISTENs), and migrates.
    pub async fn connect(url: &str, schema: Option<&str>, max_connections: u32) -> Result<Self> {
        let parsed = PgUrl::parse(url)?;
        let schema = schema.or(parsed.schema()).unwrap_or("public").to_owned();
        Self::open(parsed, schema, max_connections).await
    }

    /// Connects as the URL says: its hosts, `schema=`, `listen=`, and `pool_size=` (the
    /// process's connections, the LISTEN one included: the pool gets one less, unless
    /// `listen=off`).
    pub async fn connect_url(url: &PgUrl) -> Result<Self> {
        let schema = url.schema().unwrap_or("public").to_owned();
        let listener = u32::from(*url.listen() != Listen::Off);
        Self::open(url.clone(), schema, url.pool_size() - listener).await
    }

    async fn open(url: PgUrl, schema: String, max_connections: u32) -> Result<Self> {
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
        let target = url.target();
        let servers = Arc::new(Servers::new(url)?);
        // One connection first, on its own: a pool that cannot connect only reports that it
        // timed out, while this reports why (refused, unknown host, bad password, no such
        // database, a standby), and at once.
        let mut conn = servers.find().await?;
        if schema != "public" {
            conn.execute(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS \"{schema}\""
            )))
            .await?;
        }
        let _ = sqlx::Connection::close(conn).await;
        let search_path = schema.clone();
        let stale = Arc::clone(&servers);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(2))
            .acquire_timeout(CONNECT_TIMEOUT)
            .after_release(|conn, _| Box::pin(crate::release_if_clean(conn)))
            .before_acquire(move |_, meta| {
                let fresh = !stale.is_stale(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .after_connect(move |conn, _| {
                let sp = search_path.clone();
                Box::pin(async move {
                    // A server that is no longer what the URL asks for (a demoted primary
                    // behind a name that has not moved yet) is refused, never written to.
                    if let Some(what) = crate::pg_server::check(conn, target)
                        .await
                        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?
                    {
                        return Err(sqlx::Error::Protocol(format!(
                            "the server is {what}, not {target}"
                        )));
                    }
                    conn.execute(sqlx::AssertSqlSafe(format!("SET search_path TO \"{sp}\"")))
                        .await?;
                    Ok(())
                })
            })
            .connect_with(servers.current())
            .await?;
        let store = Self {
            read: pool.clone(),
            pool,
            sql: Arc::new(Sql::new(Dialect::Postgres)),
            wake: Arc::new(tokio::sync::watch::channel(0).0),
            claims: Arc::new(tokio::sync::Semaphore::new(CLAIM_CONCURRENCY)),
            schema,
            servers: Arc::clone(&servers),
            alive: Arc::new(()),
        };
        store.migrate().await?;
        store.spawn_listener();
        if servers.url().hosts().len() > 1 {
            crate::pg_server::spawn_watch(
                store.pool.clone(),
                servers,
                Arc::downgrade(&store.alive),
            );
        }
        Ok(store)
    }

    /// The host this store's new connections go to (`host:port`): with a host list, the one
    /// found to suit `target_session_attrs`.
    pub fn current_host(&self) -> String {
        self.servers.current_host()
    }

    /// The most connections this store opens: the pool's, and the one that LISTENs (unless
    /// `listen=off`).
    pub fn connection_budget(&self) -> u32 {
        self.pool.options().get_max_connections()
            + u32::from(*self.servers.url().listen() != Listen::Off)
    }

    /// Applies the embedded migrations (idempotent; safe to run from several processes).
    pub async fn migrate(&self) -> Result<()> {
        let migrator = crate::migrations::named(sqlx::migrate!("./migrations/postgres"));
        crate::migrations::adopt_postgres(&self.pool, &migrator).await?;
        migrator.run(&self.pool).await?;
        Ok(())
    }

    /// The pool (for callers that enqueue inside their own transaction).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Enqueues one job on the caller's own connection or transaction, so that it commits
    /// (or rolls back) together with the caller's rows.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        job: &crate::NewJob,
        now: redrive_policy::Timestamp,
    ) -> Result<crate::Enqueued> {
        self.enqueue_in_impl(conn, job, now).await
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

    /// The plan PostgreSQL chooses (`EXPLAIN`, one line per row; nothing is written) for the
    /// statement that completes the batch `cs`: for checks that it reaches the jobs by
    /// primary key whatever the statistics say.
    ///
    /// # Errors
    /// The database's.
    pub async fn complete_plan(&self, cs: &[crate::Completion]) -> Result<Vec<String>> {
        let rows: Vec<crate::batch::CompletionRow> =
            cs.iter().map(crate::batch::CompletionRow::of).collect();
        let sql = format!("EXPLAIN {COMPLETE_SQL}");
        Ok(bind_completions(
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql)),
            &rows,
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Turns NOTIFYs from any process into local wake-ups; reconnects with a pause on errors.
    ///
    /// The connection is one like the pool's, or one to the URL's `listen=` (a direct URL
    /// past a pooler); none with `listen=off` (idle workers then poll).
    fn spawn_listener(&self) {
        let listen = self.servers.url().listen().clone();
        if listen == Listen::Off {
            return;
        }
        let pool = self.pool.clone();
        let wake = Arc::downgrade(&self.wake);
        let channel = format!("redrive_jobs_{}", self.schema);
        tokio::spawn(async move {
            loop {
                if wake.strong_count() == 0 {
                    return;
                }
                let listener = match &listen {
                    Listen::Url(direct) => PgListener::connect(direct).await,
                    _ => PgListener::connect_with(&pool).await,
                };
                if let Ok(mut listener) = listener
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

impl Backend for PgStore {
    type Db = Postgres;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn read_pool(&self) -> &PgPool {
        &self.read
    }

    fn sql(&self) -> &Sql {
        &self.sql
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn tx(&self) -> Result<Transaction<'static, Postgres>> {
        Ok(self.pool.begin().await?)
    }

    /// One `INSERT … SELECT FROM UNNEST(arrays)`: fourteen parameters whatever the chunk size.
    async fn insert_chunk(
        &self,
        conn: &mut PgConnection,
        chunk: &[crate::NewJob],
        rows: &[crate::batch::InsertRow],
        now: redrive_policy::Timestamp,
    ) -> Result<Vec<crate::batch::InsertedKey>> {
        let col = |f: fn(&crate::NewJob) -> String| chunk.iter().map(f).collect::<Vec<_>>();
        let opt = |f: fn(&crate::NewJob) -> Option<String>| chunk.iter().map(f).collect::<Vec<_>>();
        let sql = "INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, \
             state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at, \
             quota_key, traceparent) \
             SELECT q, k, p, ik, dep, pri, st, ma, pol, ra, ttl, dl, $13, $13, qk, tp FROM UNNEST( \
               CAST($1 AS TEXT[]), CAST($2 AS TEXT[]), CAST($3 AS TEXT[]), CAST($4 AS TEXT[]), \
               CAST($5 AS TEXT[]), CAST($6 AS INT8[]), CAST($7 AS TEXT[]), CAST($8 AS INT8[]), \
               CAST($9 AS TEXT[]), CAST($10 AS INT8[]), CAST($11 AS INT8[]), CAST($12 AS INT8[]), \
               CAST($14 AS TEXT[]), CAST($15 AS TEXT[])) \
             WITH ORDINALITY AS u(q, k, p, ik, dep, pri, st, ma, pol, ra, ttl, dl, qk, tp, ord) \
             ORDER BY ord \
             ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
             RETURNING id, queue, idempotency_key";
        Ok(
            sqlx::query_as::<_, crate::batch::InsertedKey>(sqlx::AssertSqlSafe(sql))
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
                .bind(opt(|j| j.quota_key.clone()))
                .bind(opt(|j| j.traceparent.clone()))
                .fetch_all(&mut *conn)
                .await?,
        )
    }

    /// A batch of fenced completions as one statement (so no explicit transaction): the rows
    /// go in as one array per column; the update is fenced on id, token and `running`, and the
    /// attempts are inserted for exactly the rows it updated. Returns the ids that applied.
    /// A batch with a decline runs in a transaction with the declines (and card stops) of the
    /// completions that applied.
    async fn complete_batch(
        &self,
        cs: &[crate::Completion],
    ) -> Result<std::collections::HashSet<i64>> {
        let rows: Vec<crate::batch::CompletionRow> =
            cs.iter().map(crate::batch::CompletionRow::of).collect();
        if cs.iter().all(|c| c.decline.is_none()) {
            let applied: Vec<i64> = bind_completions(sqlx::query_scalar(COMPLETE_SQL), &rows)
                .fetch_all(&self.pool)
                .await?;
            return Ok(applied.into_iter().collect());
        }
        let mut tx = self.tx().await?;
        let applied: std::collections::HashSet<i64> =
            bind_completions(sqlx::query_scalar(COMPLETE_SQL), &rows)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
        self.record_declines_of(&mut tx, cs, &applied).await?;
        tx.commit().await?;
        Ok(applied)
    }

    /// Waits for one of the process's claim permits (held for the claim statement only).
    async fn claim_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.claims.acquire().await.ok()
    }

    fn wake(&self) {
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
}

/// One completion batch: the fenced update and the attempts of the rows it updated, in one
/// statement (atomic without an explicit transaction; one round trip).
///
/// The jobs are found by primary key only: `t.id = ANY($1)` gives the planner an indexed,
/// well-estimated restriction (the batch's ids), and the fence on `running` is written as a
/// `CASE` (as SQLite's `+state`) so that it cannot be answered from the partial lease index.
/// Statistics gathered while few jobs ran (an `ANALYZE` after a bulk enqueue) put one row in
/// that index; the planner then walked every running job and compared each with every row of
/// the batch (3.4 s for 200 completions with 20,000 jobs running, against 5 ms by primary
/// key), or, without the lease index, scanned the whole table.
///
/// The `CASE` also keeps the estimate sane: an equality on an expression (the earlier
/// `(t.state || '') = 'running'`) is taken to keep 0.5% of the rows, so the batch's jobs
/// looked like one row and the planner joined them to the batch's arrays by a nested loop
/// that unnested all 26 arrays again for every job: the time grew with the square of the
/// batch (55–90 ms for 200, against 1 ms joined by hash). A boolean `CASE` is taken to keep
/// half. The batch's rows are read once, in the update's `FROM`, and the attempt rows come
/// from its `RETURNING`.
const COMPLETE_SQL: &str = "WITH upd AS (UPDATE redrive_jobs t SET state = v.state, \
      attempts = v.attempts, exceptions = v.exceptions, defers = v.defers, \
      consecutive_auth = v.consecutive_auth, prev_delay_ms = v.prev_delay_ms, \
      first_attempt_at = v.first_attempt_at, run_at = COALESCE(v.run_at, t.run_at), \
      defer_reason = v.defer_reason, dead_reason = v.dead_reason, \
      last_error = COALESCE(v.last_error, t.last_error), \
      result = COALESCE(v.result, t.result), \
      lease_owner = CASE WHEN v.state = 'running' THEN t.lease_owner END, \
      lease_expires_at = CASE WHEN v.state = 'running' THEN t.lease_expires_at END, \
      finished_at = v.finished_at, updated_at = v.updated_at \
    FROM UNNEST(CAST($1 AS INT8[]), \
      CAST($2 AS INT8[]), CAST($3 AS TEXT[]), CAST($4 AS INT8[]), CAST($5 AS INT8[]), \
      CAST($6 AS INT8[]), CAST($7 AS INT8[]), CAST($8 AS INT8[]), CAST($9 AS INT8[]), \
      CAST($10 AS INT8[]), CAST($11 AS TEXT[]), CAST($12 AS TEXT[]), CAST($13 AS TEXT[]), \
      CAST($14 AS TEXT[]), CAST($15 AS INT8[]), CAST($16 AS INT8[]), CAST($17 AS BOOL[]), \
      CAST($18 AS TEXT[]), CAST($19 AS INT8[]), CAST($20 AS INT8[]), CAST($21 AS TEXT[]), \
      CAST($22 AS INT8[]), CAST($23 AS TEXT[]), CAST($24 AS INT8[]), CAST($25 AS TEXT[]), \
      CAST($26 AS BOOL[]), CAST($27 AS TEXT[])) \
    AS v(id, token, state, attempts, exceptions, defers, consecutive_auth, prev_delay_ms, \
      first_attempt_at, run_at, defer_reason, dead_reason, last_error, result, finished_at, \
      updated_at, has_attempt, worker, started_at, duration_ms, class, http_status, error, \
      delay_ms, mode, counted, response) \
    WHERE t.id = ANY(CAST($1 AS INT8[])) AND t.id = v.id AND t.lease_token = v.token \
    AND CASE t.state WHEN 'running' THEN TRUE ELSE FALSE END \
    RETURNING t.id, t.replays, v.token, v.has_attempt, v.worker, v.started_at, \
      v.duration_ms, v.class, v.http_status, v.error, v.delay_ms, v.mode, v.counted, \
      v.response), \
  ins AS (INSERT INTO redrive_attempts (job_id, number, replay, lease_token, worker, \
      started_at, duration_ms, class, http_status, error, delay_ms, mode, counted, \
      response) \
    SELECT u.id, (SELECT COUNT(*) + 1 FROM redrive_attempts a \
        WHERE a.job_id = u.id AND a.replay = u.replays), u.replays, u.token, u.worker, \
      u.started_at, u.duration_ms, u.class, u.http_status, u.error, u.delay_ms, u.mode, \
      u.counted, u.response \
    FROM upd u WHERE u.has_attempt) \
  SELECT id FROM upd";
