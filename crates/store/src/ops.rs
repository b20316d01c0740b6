//! The operations both backends share, written once: [`Backend`] is implemented by each store
//! (its pools, statements, transactions, wake-ups and the two operations whose SQL shape differs:
//! the multi-row insert and the completion batch), and its provided methods are the operations,
//! generic over the sqlx database and compiled once per backend.
//!
//! The `where` clauses of [`Backend`] name what the operations bind and decode; they are checked
//! where the trait is implemented (for `Sqlite` and `Postgres`), and hold inside every provided
//! method, so that no operation repeats them.

use std::collections::HashSet;
use std::sync::Arc;

use sqlx::query::{QueryAs, QueryScalar};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Transaction, Type};

use crate::operator::AuditRow;
use crate::rows::{AttemptRow, CountRow, DepRow, EventRow, JobRow};
use crate::sql::Sql;

/// A database row as the operations decode it.
type RowOf<B> = <<B as Backend>::Db as Database>::Row;

/// A store backend: what it must provide (the required methods), and the operations written
/// once over it (the provided methods, called by [`crate::Store`]).
pub(crate) trait Backend: Sync
where
    for<'c> &'c mut <Self::Db as Database>::Connection: Executor<'c, Database = Self::Db>,
    <Self::Db as Database>::Arguments: IntoArguments<Self::Db>,
    // What the operations bind.
    for<'q> i64: Encode<'q, Self::Db> + Type<Self::Db>,
    for<'q> Option<i64>: Encode<'q, Self::Db>,
    f64: Type<Self::Db>,
    for<'q> Option<f64>: Encode<'q, Self::Db>,
    for<'q> String: Encode<'q, Self::Db> + Type<Self::Db>,
    for<'q> Option<String>: Encode<'q, Self::Db>,
    for<'q> &'q str: Encode<'q, Self::Db> + Type<Self::Db>,
    for<'q> Option<&'q str>: Encode<'q, Self::Db>,
    // What they decode.
    for<'r> (i64,): FromRow<'r, RowOf<Self>>,
    for<'r> (Option<i64>,): FromRow<'r, RowOf<Self>>,
    for<'r> (String,): FromRow<'r, RowOf<Self>>,
    for<'r> (i64, String, i64, i64, String): FromRow<'r, RowOf<Self>>,
    for<'r> JobRow: FromRow<'r, RowOf<Self>>,
    for<'r> AttemptRow: FromRow<'r, RowOf<Self>>,
    for<'r> CountRow: FromRow<'r, RowOf<Self>>,
    for<'r> DepRow: FromRow<'r, RowOf<Self>>,
    for<'r> EventRow: FromRow<'r, RowOf<Self>>,
    for<'r> (i64, Option<String>): FromRow<'r, RowOf<Self>>,
    for<'r> (String, i64): FromRow<'r, RowOf<Self>>,
    for<'r> (String, i64, String): FromRow<'r, RowOf<Self>>,
    for<'r> AuditRow: FromRow<'r, RowOf<Self>>,
{
    /// The sqlx database.
    type Db: Database;

    /// The pool writes go through.
    fn pool(&self) -> &Pool<Self::Db>;

    /// The pool reads go through (on SQLite other connections than the writer's).
    fn read_pool(&self) -> &Pool<Self::Db>;

    /// The dialect's statements.
    fn sql(&self) -> &Sql;

    /// Begins a write transaction.
    async fn tx(&self) -> crate::Result<Transaction<'static, Self::Db>>;

    /// Tells this process's waiting workers (and on PostgreSQL the other processes') that
    /// work may have appeared.
    fn wake(&self);

    /// Rows a statement changed.
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// Waits, where the backend limits concurrent claims, for a permit held for the claim
    /// statement only.
    async fn claim_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>>;

    /// Runs a claim statement (from [`Sql`]) and returns the rows it claimed.
    async fn fetch_claimed(&self, st: &ClaimStatement) -> crate::Result<Vec<JobRow>> {
        let q = st.bind(sqlx::query_as(sqlx::AssertSqlSafe(st.sql.clone())));
        Ok(q.fetch_all(self.pool()).await?)
    }

    /// Inserts a chunk of validated jobs (`rows` their computed columns) in one statement;
    /// returns the rows it created (those the unique index refused are missing).
    async fn insert_chunk(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        chunk: &[crate::NewJob],
        rows: &[crate::batch::InsertRow],
        now: redrive_policy::Timestamp,
    ) -> crate::Result<Vec<crate::batch::InsertedKey>>;

    /// Applies a batch of fenced completions atomically; returns the ids that applied.
    async fn complete_batch(&self, cs: &[crate::Completion]) -> crate::Result<HashSet<i64>>;

    /// Enqueues one job on the caller's own connection or transaction, so that it commits
    /// (or rolls back) together with the caller's rows.
    async fn enqueue_in_impl(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        job: &crate::NewJob,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<crate::Enqueued> {
        job.validate()?;
        let mut out = self
            .enqueue_chunk_in(conn, std::slice::from_ref(job), now)
            .await?;
        Ok(out.remove(0))
    }

    /// One multi-row insert, then the jobs the unique index refused looked up by key;
    /// results in input order. The jobs are validated by the caller.
    async fn enqueue_chunk_in(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        chunk: &[crate::NewJob],
        now: redrive_policy::Timestamp,
    ) -> crate::Result<Vec<crate::Enqueued>> {
        let rows: Vec<crate::batch::InsertRow> = chunk
            .iter()
            .map(|j| crate::batch::InsertRow::of(j, now))
            .collect();
        let created = self.insert_chunk(conn, chunk, &rows, now).await?;
        let mut out = Vec::with_capacity(chunk.len());
        for (job, slot) in chunk
            .iter()
            .zip(crate::batch::match_inserted(chunk, &rows, created))
        {
            let e = match slot {
                Some(e) => e,
                // Refused by the unique index: the job with this key already existed.
                None => {
                    let existing: crate::rows::JobRow =
                        sqlx::query_as(sqlx::AssertSqlSafe(self.sql().find_by_key.clone()))
                            .bind(&job.queue)
                            .bind(&job.key)
                            .fetch_one(&mut *conn)
                            .await?;
                    crate::Enqueued {
                        job: existing.into_job()?,
                        created: false,
                    }
                }
            };
            out.push(e);
        }
        Ok(out)
    }

    async fn enqueue_many_impl(
        &self,
        jobs: &[crate::NewJob],
        now: redrive_policy::Timestamp,
    ) -> crate::Result<Vec<crate::Enqueued>> {
        crate::check_batch("jobs", jobs.len())?;
        for j in jobs {
            j.validate()?;
        }
        let mut tx = self.tx().await?;
        let mut out = Vec::with_capacity(jobs.len());
        for chunk in jobs.chunks(self.sql().enqueue_chunk) {
            out.extend(self.enqueue_chunk_in(&mut tx, chunk, now).await?);
        }
        tx.commit().await?;
        self.wake();
        Ok(out)
    }

    /// [`Self::enqueue_many_impl`], rolled back when a job's key is taken by another request
    /// ([`crate::batch::KeyTaken`]).
    async fn enqueue_many_exact_impl(
        &self,
        jobs: &[crate::NewJob],
        now: redrive_policy::Timestamp,
    ) -> crate::Result<Result<Vec<crate::Enqueued>, crate::batch::KeyTaken>> {
        crate::check_batch("jobs", jobs.len())?;
        for j in jobs {
            j.validate()?;
        }
        let mut tx = self.tx().await?;
        let mut out = Vec::with_capacity(jobs.len());
        for chunk in jobs.chunks(self.sql().enqueue_chunk) {
            out.extend(self.enqueue_chunk_in(&mut tx, chunk, now).await?);
        }
        if let Some(index) = crate::batch::first_key_taken(jobs, &out) {
            tx.rollback().await?;
            return Ok(Err(crate::batch::KeyTaken {
                index,
                existing: out.swap_remove(index).job,
            }));
        }
        tx.commit().await?;
        self.wake();
        Ok(Ok(out))
    }

    async fn get_impl(&self, id: crate::JobId) -> crate::Result<Option<crate::Job>> {
        let row: Option<crate::rows::JobRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql().get_job.clone()))
                .bind(id)
                .fetch_optional(self.read_pool())
                .await?;
        row.map(|r| r.into_job()).transpose()
    }

    async fn attempts_impl(&self, id: crate::JobId) -> crate::Result<Vec<crate::Attempt>> {
        let rows: Vec<crate::rows::AttemptRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql().attempts_of.clone()))
                .bind(id)
                .fetch_all(self.read_pool())
                .await?;
        rows.into_iter().map(|r| r.into_attempt()).collect()
    }

    /// The claim statement `p` runs and its parameters; `None` when it would claim
    /// nothing without asking the database.
    ///
    /// No queue listed: every queue, one walk of the pending jobs in claim order (the same
    /// statement whatever the number of queues). One: the queue's own claim index. A few (up
    /// to [`MAX_ARMS`](crate::sql::MAX_ARMS)): an arm per queue. More: the walk of every
    /// queue, filtered by the list.
    fn claim_statement(&self, p: &crate::ClaimParams) -> crate::Result<Option<ClaimStatement>> {
        if p.limit == 0 || p.kinds.as_list().is_some_and(|k| k.is_empty()) {
            return Ok(None);
        }
        crate::check_batch("limit", p.limit as usize)?;
        let kinds = p.kinds.as_list().map(crate::model::json_list);
        let sql = self.sql();
        let pick = |plain: &Arc<str>, filtered: &Arc<str>| match kinds {
            None => plain.clone(),
            Some(_) => filtered.clone(),
        };
        let list = || {
            serde_json::to_string(&p.queues).map_err(|e| crate::StoreError::Invalid {
                field: "queues",
                value: format!("{:?}", p.queues),
                reason: e.to_string(),
            })
        };
        let (sql, queues) = match p.queues.len() {
            // `$2` is not read; it is bound all the same, as every claim binds it.
            0 => (pick(&sql.claim_all, &sql.claim_all_kinds), String::new()),
            // One queue: an equality the claim index walks in order (no sort).
            1 => (
                pick(&sql.claim_one, &sql.claim_one_kinds),
                p.queues[0].clone(),
            ),
            n if n <= crate::sql::MAX_ARMS => (sql.claim_many(n, kinds.is_some()), list()?),
            _ => (pick(&sql.claim_set, &sql.claim_set_kinds), list()?),
        };
        let now = crate::model::millis(p.now);
        Ok(Some(ClaimStatement {
            sql,
            now,
            queues,
            limit: i64::from(p.limit),
            worker: p.worker.clone(),
            until: now.saturating_add(crate::model::dur_ms(p.lease)),
            kinds,
        }))
    }

    async fn claim_impl(&self, p: &crate::ClaimParams) -> crate::Result<Vec<crate::Job>> {
        let Some(st) = self.claim_statement(p)? else {
            return Ok(Vec::new());
        };
        let permit = self.claim_permit().await;
        let rows = self.fetch_claimed(&st).await?;
        drop(permit);
        let mut jobs = rows
            .into_iter()
            .map(|r| r.into_job())
            .collect::<crate::Result<Vec<_>>>()?;
        jobs.sort_by_key(|j| (j.priority, j.run_at, j.id));
        Ok(jobs)
    }

    async fn complete_impl(&self, c: &crate::Completion) -> crate::Result<()> {
        let mut results = self.complete_many_impl(std::slice::from_ref(c)).await?;
        results.remove(0)
    }

    async fn complete_many_impl(
        &self,
        cs: &[crate::Completion],
    ) -> crate::Result<Vec<crate::Result<()>>> {
        crate::check_batch("completions", cs.len())?;
        if cs.is_empty() {
            return Ok(Vec::new());
        }
        let applied = self.complete_batch(cs).await?;
        let out = cs
            .iter()
            .map(|c| {
                if applied.contains(&c.lease.job_id) {
                    Ok(())
                } else {
                    Err(crate::StoreError::LeaseLost {
                        id: c.lease.job_id,
                        token: c.lease.token,
                    })
                }
            })
            .collect();
        if cs
            .iter()
            .any(|c| matches!(c.transition, crate::Transition::Released))
        {
            self.wake();
        }
        Ok(out)
    }

    async fn heartbeat_impl(
        &self,
        lease: crate::Lease,
        extend: std::time::Duration,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<redrive_policy::Timestamp> {
        let until = now + chrono::Duration::milliseconds(crate::model::dur_ms(extend));
        let done = sqlx::query(sqlx::AssertSqlSafe(self.sql().heartbeat.clone()))
            .bind(lease.job_id)
            .bind(lease.token)
            .bind(crate::model::millis(until))
            .bind(crate::model::millis(now))
            .execute(self.pool())
            .await?;
        if Self::rows_affected(&done) == 1 {
            Ok(until)
        } else {
            Err(crate::StoreError::LeaseLost {
                id: lease.job_id,
                token: lease.token,
            })
        }
    }

    async fn cancel_impl(
        &self,
        id: crate::JobId,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<crate::Job> {
        let row: Option<crate::rows::JobRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql().cancel.clone()))
                .bind(id)
                .bind(crate::model::millis(now))
                .fetch_optional(self.pool())
                .await?;
        match row {
            Some(r) => r.into_job(),
            None => match self.get_impl(id).await? {
                None => Err(crate::StoreError::JobNotFound { id }),
                Some(j) => Err(crate::StoreError::WrongState {
                    id,
                    state: j.state,
                    operation: "cancel",
                }),
            },
        }
    }

    async fn replay_impl(
        &self,
        sel: &crate::Selection,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<u64> {
        let now = crate::model::millis(now);
        let done = match sel {
            crate::Selection::Ids(ids) => {
                crate::check_batch("ids", ids.len())?;
                sqlx::query(sqlx::AssertSqlSafe(self.sql().replay_ids.clone()))
                    .bind(now)
                    .bind(serde_json::to_string(ids).unwrap_or_else(|_| "[]".into()))
                    .execute(self.pool())
                    .await?
            }
            crate::Selection::All { queue } => {
                sqlx::query(sqlx::AssertSqlSafe(self.sql().replay_all.clone()))
                    .bind(now)
                    .bind(queue.as_deref())
                    .execute(self.pool())
                    .await?
            }
        };
        self.wake();
        Ok(Self::rows_affected(&done))
    }

    async fn purge_impl(&self, sel: &crate::Selection) -> crate::Result<u64> {
        let done = match sel {
            crate::Selection::Ids(ids) => {
                crate::check_batch("ids", ids.len())?;
                sqlx::query(sqlx::AssertSqlSafe(self.sql().purge_ids.clone()))
                    .bind(serde_json::to_string(ids).unwrap_or_else(|_| "[]".into()))
                    .execute(self.pool())
                    .await?
            }
            crate::Selection::All { queue } => {
                sqlx::query(sqlx::AssertSqlSafe(self.sql().purge_all.clone()))
                    .bind(queue.as_deref())
                    .execute(self.pool())
                    .await?
            }
        };
        Ok(Self::rows_affected(&done))
    }

    async fn rescue_impl(
        &self,
        now: redrive_policy::Timestamp,
        limit: u32,
    ) -> crate::Result<Vec<crate::Rescued>> {
        let now_ms = crate::model::millis(now);
        let mut tx = self.tx().await?;
        let rows: Vec<(i64, String, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql().rescue.clone()))
                .bind(now_ms)
                .bind(i64::from(limit.max(1)))
                .fetch_all(&mut *tx)
                .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (id, state, token, replay, queue) in rows {
            sqlx::query(sqlx::AssertSqlSafe(self.sql().rescue_attempt.clone()))
                .bind(id)
                .bind(replay)
                .bind(token - 1)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            out.push(crate::Rescued {
                id,
                queue,
                dead: state == "dead",
            });
        }
        tx.commit().await?;
        if out.iter().any(|r| !r.dead) {
            self.wake();
        }
        out.sort_by_key(|r| r.id);
        Ok(out)
    }

    async fn list_impl(&self, p: &crate::ListParams) -> crate::Result<crate::Page> {
        let limit = p.limit.unwrap_or(50).clamp(1, 1000);
        let sql = match (p.state, &p.key) {
            // A key: its index, whatever the state (bound as `$1`).
            (_, Some(_)) => self.sql().list_key.clone(),
            (None, None) => self.sql().list.clone(),
            (Some(st), None) => {
                let i = crate::JobState::ALL
                    .iter()
                    .position(|s| *s == st)
                    .unwrap_or_default();
                self.sql().list_state[i].clone()
            }
        };
        // Without a key the state is a literal of the statement (`$1` is NULL).
        let state = p.key.as_ref().and(p.state).map(|s| s.as_str());
        let q = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(state)
            .bind(p.queue.as_deref())
            .bind(p.dead_reason.as_deref())
            .bind(p.after.unwrap_or(0))
            .bind(i64::from(limit) + 1);
        let q = match &p.key {
            Some(k) => q.bind(k.as_str()),
            None => q,
        };
        let rows: Vec<crate::rows::JobRow> = q.fetch_all(self.read_pool()).await?;
        let more = rows.len() > limit as usize;
        let jobs = rows
            .into_iter()
            .take(limit as usize)
            .map(|r| r.into_job())
            .collect::<crate::Result<Vec<_>>>()?;
        let next = if more {
            jobs.last().map(|j| j.id)
        } else {
            None
        };
        Ok(crate::Page { jobs, next })
    }

    async fn counts_impl(&self) -> crate::Result<Vec<crate::QueueCount>> {
        let rows: Vec<crate::rows::CountRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql().counts.clone()))
                .fetch_all(self.read_pool())
                .await?;
        rows.into_iter()
            .map(|r| {
                Ok(crate::QueueCount {
                    state: crate::rows::state_of(&r.state)?,
                    queue: r.queue,
                    count: u64::try_from(r.n).unwrap_or(0),
                })
            })
            .collect()
    }

    /// When the next job of `queues` (every queue if empty) of `kinds` may run.
    async fn next_due_impl(
        &self,
        queues: &[String],
        kinds: &crate::Kinds,
    ) -> crate::Result<Option<redrive_policy::Timestamp>> {
        if queues.is_empty() {
            return self.next_due_all(kinds).await;
        }
        let queues = crate::model::json_list(queues);
        let t: Option<i64> = match kinds.as_list() {
            None => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(self.sql().next_due.clone()))
                    .bind(queues)
                    .fetch_one(self.read_pool())
                    .await?
            }
            Some([]) => None,
            Some(k) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(self.sql().next_due_kinds.clone()))
                    .bind(queues)
                    .bind(crate::model::json_list(k))
                    .fetch_one(self.read_pool())
                    .await?
            }
        };
        Ok(t.map(crate::model::from_millis))
    }

    /// When the next job of any queue of `kinds` may run: a statement with no list of
    /// queues, the same whatever their number.
    async fn next_due_all(
        &self,
        kinds: &crate::Kinds,
    ) -> crate::Result<Option<redrive_policy::Timestamp>> {
        let t: Option<i64> = match kinds.as_list() {
            None => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(self.sql().next_due_all.clone()))
                    .fetch_one(self.read_pool())
                    .await?
            }
            Some([]) => None,
            Some(k) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(self.sql().next_due_all_kinds.clone()))
                    .bind(crate::model::json_list(k))
                    .fetch_one(self.read_pool())
                    .await?
            }
        };
        Ok(t.map(crate::model::from_millis))
    }

    async fn dependency_impl(&self, name: &str) -> crate::Result<Option<crate::Dependency>> {
        let row: Option<crate::rows::DepRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql().get_dep.clone()))
                .bind(name)
                .fetch_optional(self.read_pool())
                .await?;
        row.map(|r| r.into_dep()).transpose()
    }

    async fn dependencies_impl(&self) -> crate::Result<Vec<crate::Dependency>> {
        let rows: Vec<crate::rows::DepRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql().list_deps.clone()))
                .fetch_all(self.read_pool())
                .await?;
        rows.into_iter().map(|r| r.into_dep()).collect()
    }

    async fn set_breaker_impl(&self, u: &crate::BreakerUpdate) -> crate::Result<bool> {
        let mut tx = self.tx().await?;
        let now = crate::model::millis(u.now);
        let before = match u.expect {
            Some(e) => Some(e),
            None => self
                .dependency_impl(&u.dependency)
                .await?
                .map(|d| d.flow.state),
        };
        let applied: Option<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(self.sql().upsert_breaker.clone()))
                .bind(&u.dependency)
                .bind(u.state.as_str())
                .bind(u.open_until.map(crate::model::millis))
                .bind(i64::from(u.probe_permits))
                .bind(now)
                .bind(u.expect.map(|e| e.as_str()))
                .fetch_optional(&mut *tx)
                .await?;
        let from = before.unwrap_or_default();
        if applied.is_some() && from != u.state {
            sqlx::query(sqlx::AssertSqlSafe(self.sql().insert_event.clone()))
                .bind(&u.dependency)
                .bind(now)
                .bind(from.as_str())
                .bind(u.state.as_str())
                .bind(&u.reason)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if applied.is_some() && u.state != redrive_policy::BreakerState::Open {
            self.wake();
        }
        Ok(applied.is_some())
    }

    async fn update_dependency_impl(
        &self,
        w: &crate::DependencyWrite,
    ) -> crate::Result<Option<i64>> {
        use crate::model::millis;
        let now = millis(w.now);
        let sql = match w.expect_version {
            None => self.sql().insert_dep.clone(),
            Some(_) => self.sql().update_dep.clone(),
        };
        let mut tx = self.tx().await?;
        let q = Self::bind_dep_row(
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql)),
            &w.dependency,
            &w.flow,
            now,
        );
        // The insert takes no version: the row must not exist yet.
        let q = match w.expect_version {
            Some(v) => q.bind(v),
            None => q,
        };
        let version: Option<i64> = q.fetch_optional(&mut *tx).await?;
        if version.is_some()
            && let Some((from, to, reason)) = &w.transition
        {
            sqlx::query(sqlx::AssertSqlSafe(self.sql().insert_event.clone()))
                .bind(&w.dependency)
                .bind(now)
                .bind(from.as_str())
                .bind(to.as_str())
                .bind(reason)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if version.is_some()
            && w.transition
                .as_ref()
                .is_some_and(|(_, to, _)| *to != redrive_policy::BreakerState::Open)
        {
            self.wake();
        }
        Ok(version)
    }

    async fn events_impl(
        &self,
        dependency: Option<&str>,
        limit: u32,
    ) -> crate::Result<Vec<crate::DependencyEvent>> {
        let rows: Vec<crate::rows::EventRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql().events.clone()))
                .bind(dependency)
                .bind(i64::from(limit.clamp(1, 10_000)))
                .fetch_all(self.read_pool())
                .await?;
        rows.into_iter().map(|r| r.into_event()).collect()
    }

    async fn pause_impl(
        &self,
        dependency: &str,
        until: redrive_policy::Timestamp,
        reason: redrive_policy::PauseReason,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.sql().pause.clone()))
            .bind(dependency)
            .bind(crate::model::millis(until))
            .bind(reason.as_str())
            .bind(crate::model::millis(now))
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn unpause_impl(
        &self,
        dependency: &str,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.sql().unpause.clone()))
            .bind(dependency)
            .bind(crate::model::millis(now))
            .execute(self.pool())
            .await?;
        self.wake();
        Ok(())
    }

    /// Binds a dependency's row to `insert_dep` or `update_dep`: `$1` the name, `$2`–`$24`
    /// the breaker's, pause's, rate's, meter's and send cycle's columns of `f` (`$7` the time
    /// written, `now` in milliseconds). The update's expected version (`$25`) is the caller's
    /// to bind.
    fn bind_dep_row<'q>(
        q: QueryScalar<'q, Self::Db, i64, <Self::Db as Database>::Arguments>,
        dependency: &'q str,
        f: &redrive_policy::FlowRow,
        now: i64,
    ) -> QueryScalar<'q, Self::Db, i64, <Self::Db as Database>::Arguments> {
        use crate::model::millis;
        q.bind(dependency)
            .bind(f.state.as_str())
            .bind(f.open_until.map(millis))
            .bind(i64::from(f.probe_permits))
            .bind(f.paused_until.map(millis))
            .bind(crate::model::pause_reason_str(f.pause_reason))
            .bind(now)
            .bind(f.mode.as_str())
            .bind(i64::from(f.openings))
            .bind(i64::from(f.probe_successes))
            .bind(i64::from(f.probe_failures))
            .bind(f.round_started.map(millis))
            .bind(f.rate)
            .bind(f.tat.map(|t| t.timestamp_micros()))
            .bind(f.rate_cut_at.map(millis))
            .bind(f.rate_cap)
            .bind(f.rate_raised_at.map(millis))
            .bind(i64::from(f.rate_lifted))
            .bind(f.meter_started.map(millis))
            .bind(i64::from(f.meter_slots))
            .bind(f.meter_rate)
            .bind(f.cycle_started.map(millis))
            .bind(i64::from(f.cycle_slots))
            .bind(
                f.rate_pause
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            )
    }

    // Operator controls (see [`crate::operator`]): each writes its audit row in the same
    // transaction as its change.

    /// The operator statements of this backend's dialect.
    fn op_sql(&self) -> &'static crate::operator::OpSql {
        crate::operator::OpSql::get(self.sql().dialect())
    }

    /// Writes an audit row on `conn` (for the store's own operator actions, the transaction of
    /// the change it records, so that the two commit together); returns its id.
    async fn audit_in(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        actor: &crate::Actor,
        action: &str,
        target: &serde_json::Value,
        rows: u64,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<i64> {
        let id: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(self.op_sql().insert_audit.clone()))
            .bind(crate::model::millis(now))
            .bind(&actor.name)
            .bind(&actor.via)
            .bind(action)
            .bind(target.to_string())
            .bind(i64::try_from(rows).unwrap_or(i64::MAX))
            .fetch_one(&mut *conn)
            .await?;
        Ok(id)
    }

    async fn record_audit_impl(
        &self,
        actor: &crate::Actor,
        action: &str,
        target: &serde_json::Value,
        rows: u64,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<i64> {
        crate::operator::check_actor(actor)?;
        crate::model::name("action", action)?;
        let mut conn = self.pool().acquire().await?;
        self.audit_in(&mut conn, actor, action, target, rows, now)
            .await
    }

    async fn audit_impl(
        &self,
        before: Option<i64>,
        limit: u32,
    ) -> crate::Result<Vec<crate::AuditEntry>> {
        let rows: Vec<crate::operator::AuditRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.op_sql().audit.clone()))
                .bind(before)
                .bind(i64::from(limit.clamp(1, crate::operator::MAX_AUDIT_PAGE)))
                .fetch_all(self.read_pool())
                .await?;
        Ok(rows.into_iter().map(|r| r.into_entry()).collect())
    }

    async fn bulk_impl(
        &self,
        action: crate::BulkAction,
        filter: &crate::JobFilter,
        actor: &crate::Actor,
        dry_run: bool,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<crate::BulkOutcome> {
        filter.validate()?;
        crate::operator::check_actor(actor)?;
        let now_ms = crate::model::millis(now);
        let mut tx = self.tx().await?;
        let ids_json = filter
            .ids
            .as_ref()
            .map(|ids| serde_json::to_string(ids).unwrap_or_else(|_| "[]".into()));
        let candidates: Vec<(i64, Option<String>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.op_sql().select(action)))
                .bind(filter.queue.as_deref())
                .bind(filter.kind.as_deref())
                .bind(filter.dependency.as_deref())
                .bind(filter.dead_reason.as_deref())
                .bind(ids_json)
                .bind((action == crate::BulkAction::RunNow).then_some(now_ms))
                .fetch_all(&mut *tx)
                .await?;
        let ids: Vec<i64> = candidates
            .into_iter()
            .filter(|(_, err)| match &filter.signature {
                None => true,
                Some(sig) => err
                    .as_deref()
                    .is_some_and(|e| crate::error_signature(e) == *sig),
            })
            .map(|(id, _)| id)
            .collect();
        if dry_run {
            tx.rollback().await?;
            return Ok(crate::BulkOutcome {
                action,
                count: ids.len() as u64,
                ids,
                dry_run: true,
            });
        }
        let mut done: Vec<i64> = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(5_000) {
            let changed: Vec<i64> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(self.op_sql().apply(action)))
                    .bind(now_ms)
                    .bind(serde_json::to_string(chunk).unwrap_or_else(|_| "[]".into()))
                    .fetch_all(&mut *tx)
                    .await?;
            done.extend(changed);
        }
        done.sort_unstable();
        let target = serde_json::to_value(filter).unwrap_or_default();
        self.audit_in(
            &mut *tx,
            actor,
            action.as_str(),
            &target,
            done.len() as u64,
            now,
        )
        .await?;
        tx.commit().await?;
        if matches!(
            action,
            crate::BulkAction::Replay | crate::BulkAction::RunNow
        ) && !done.is_empty()
        {
            self.wake();
        }
        Ok(crate::BulkOutcome {
            action,
            count: done.len() as u64,
            ids: done,
            dry_run: false,
        })
    }

    async fn pause_queue_impl(
        &self,
        queue: &str,
        actor: &crate::Actor,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<bool> {
        crate::model::name("queue", queue)?;
        crate::operator::check_actor(actor)?;
        let mut tx = self.tx().await?;
        let done = sqlx::query(sqlx::AssertSqlSafe(self.op_sql().pause_queue.clone()))
            .bind(queue)
            .bind(crate::model::millis(now))
            .bind(&actor.name)
            .execute(&mut *tx)
            .await?;
        let n = Self::rows_affected(&done);
        let target = serde_json::json!({ "queue": queue });
        self.audit_in(&mut *tx, actor, "queue_pause", &target, n, now)
            .await?;
        tx.commit().await?;
        Ok(n > 0)
    }

    async fn resume_queue_impl(
        &self,
        queue: &str,
        actor: &crate::Actor,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<bool> {
        crate::model::name("queue", queue)?;
        crate::operator::check_actor(actor)?;
        let mut tx = self.tx().await?;
        let done = sqlx::query(sqlx::AssertSqlSafe(self.op_sql().resume_queue.clone()))
            .bind(queue)
            .execute(&mut *tx)
            .await?;
        let n = Self::rows_affected(&done);
        let target = serde_json::json!({ "queue": queue });
        self.audit_in(&mut *tx, actor, "queue_resume", &target, n, now)
            .await?;
        tx.commit().await?;
        if n > 0 {
            self.wake();
        }
        Ok(n > 0)
    }

    async fn dead_since_impl(
        &self,
        since: redrive_policy::Timestamp,
        limit: u32,
    ) -> crate::Result<Vec<crate::Job>> {
        let rows: Vec<crate::rows::JobRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.op_sql().dead_since.clone()))
                .bind(crate::model::millis(since))
                .bind(i64::from(limit.clamp(1, 10_000)))
                .fetch_all(self.read_pool())
                .await?;
        rows.into_iter().map(|r| r.into_job()).collect()
    }

    async fn oldest_due_impl(
        &self,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<Vec<(String, redrive_policy::Timestamp)>> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.op_sql().oldest_due.clone()))
                .bind(crate::model::millis(now))
                .fetch_all(self.read_pool())
                .await?;
        Ok(rows
            .into_iter()
            .map(|(q, t)| (q, crate::from_millis(t)))
            .collect())
    }

    async fn paused_queues_impl(&self) -> crate::Result<Vec<crate::PausedQueue>> {
        let rows: Vec<(String, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.op_sql().paused_queues.clone()))
                .fetch_all(self.read_pool())
                .await?;
        Ok(rows
            .into_iter()
            .map(|(queue, at, by)| crate::PausedQueue {
                queue,
                paused_at: crate::from_millis(at),
                paused_by: by,
            })
            .collect())
    }

    async fn operate_dependency_impl(
        &self,
        dependency: &str,
        op: crate::DependencyOp,
        actor: &crate::Actor,
        now: redrive_policy::Timestamp,
    ) -> crate::Result<crate::Dependency> {
        use crate::model::millis;
        use rand::SeedableRng;
        crate::model::name("dependency", dependency)?;
        crate::operator::check_actor(actor)?;
        if let crate::DependencyOp::Pause { until: Some(u) } = op
            && u <= now
        {
            return Err(crate::StoreError::Invalid {
                field: "until",
                value: u.to_rfc3339(),
                reason: "must be in the future".into(),
            });
        }
        // Operator events use no configuration and no randomness: the defaults do.
        let cfg = redrive_policy::FlowConfig::default();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(millis(now) as u64);
        let (action, target) = op.audit_parts(dependency);
        for _ in 0..16 {
            let mut tx = self.tx().await?;
            let row: Option<crate::rows::DepRow> =
                sqlx::query_as(sqlx::AssertSqlSafe(self.op_sql().get_dep.clone()))
                    .bind(dependency)
                    .fetch_optional(&mut *tx)
                    .await?;
            let current = row.map(|r| r.into_dep()).transpose()?;
            let flow = current.as_ref().map(|d| d.flow.clone()).unwrap_or_default();
            let step = cfg.apply(&flow, op.event(), now, &mut rng);
            let sql = match current {
                None => self.sql().insert_dep.clone(),
                Some(_) => self.sql().update_dep.clone(),
            };
            let q = Self::bind_dep_row(
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql)),
                dependency,
                &step.row,
                millis(now),
            );
            let q = match &current {
                Some(d) => q.bind(d.version),
                None => q,
            };
            let version: Option<i64> = q.fetch_optional(&mut *tx).await?;
            let Some(version) = version else {
                // Another writer came first: read again and reapply.
                tx.rollback().await?;
                continue;
            };
            if let Some(t) = &step.transition {
                sqlx::query(sqlx::AssertSqlSafe(self.sql().insert_event.clone()))
                    .bind(dependency)
                    .bind(millis(now))
                    .bind(t.from.as_str())
                    .bind(t.to.as_str())
                    .bind(format!("{} ({} via {})", t.reason, actor.name, actor.via))
                    .execute(&mut *tx)
                    .await?;
            }
            let rows = u64::from(step.changed);
            self.audit_in(&mut *tx, actor, action, &target, rows, now)
                .await?;
            tx.commit().await?;
            self.wake();
            return Ok(crate::Dependency {
                name: dependency.to_owned(),
                flow: step.row,
                version,
                updated_at: now,
            });
        }
        Err(crate::StoreError::Contended {
            what: format!("dependency {dependency:?}"),
        })
    }

    // Card quotas (see [`crate::quota`]).

    async fn record_decline_impl(&self, d: &crate::NewDecline) -> crate::Result<()> {
        if let Some(k) = &d.quota_key {
            crate::model::check_quota_key(k)?;
        }
        let mut tx = self.tx().await?;
        self.record_decline_in(&mut tx, d).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records a decline on `conn` (the caller's transaction: a completion's, so that the
    /// attempt and its decline commit together), and the card stop it sets, if any.
    async fn record_decline_in(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        d: &crate::NewDecline,
    ) -> crate::Result<()> {
        let a = &d.advice;
        let at = crate::model::millis(d.at);
        sqlx::query(crate::quota::INSERT_DECLINE)
            .bind(d.job_id)
            .bind(i64::from(d.attempt))
            .bind(d.quota_key.clone())
            .bind(at)
            .bind(a.network().as_str())
            .bind(a.code().map(|c| c.as_str().to_owned()))
            .bind(a.category().map(i64::from))
            .bind(a.advice_code().map(i64::from))
            .bind(a.rule().to_string())
            .execute(&mut *conn)
            .await?;
        if let (Some(key), Some(window)) = (&d.quota_key, d.stop_for) {
            sqlx::query(crate::quota::UPSERT_CARD_STOP)
                .bind(key.as_str())
                .bind(d.job_id)
                .bind(i64::from(d.attempt))
                .bind(at)
                .bind(at.saturating_add(crate::quota::window_ms(window)))
                .bind(a.network().as_str())
                .bind(a.code().map(|c| c.as_str().to_owned()))
                .bind(a.category().map(i64::from))
                .bind(a.advice_code().map(i64::from))
                .bind(a.rule().as_str())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// The declines of the completions in `cs` that applied (`applied`), on `conn`, the
    /// completions' transaction.
    async fn record_declines_of(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        cs: &[crate::Completion],
        applied: &HashSet<i64>,
    ) -> crate::Result<()> {
        for c in cs {
            if let Some(d) = &c.decline
                && applied.contains(&c.lease.job_id)
            {
                self.record_decline_in(conn, d).await?;
            }
        }
        Ok(())
    }

    /// Takes one reattempt from `p`'s card key on `conn`, the caller's transaction, which
    /// holds the key's lock: counts the key's reattempts in each window and, if every window
    /// has room, records this one (`now` in milliseconds).
    async fn take_reattempt_in(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        p: &crate::ReattemptParams<'_>,
        now: i64,
    ) -> crate::Result<crate::QuotaTake> {
        use crate::quota::{COUNT_IN_WINDOW, INSERT_REATTEMPT, NTH_IN_WINDOW, window_ms};
        let mut full: Option<redrive_policy::QuotaExhausted> = None;
        for w in p.windows {
            let since = now.saturating_sub(window_ms(w.window()));
            let (n,): (i64,) = sqlx::query_as(COUNT_IN_WINDOW)
                .bind(p.quota_key)
                .bind(since)
                .fetch_one(&mut *conn)
                .await?;
            if n >= i64::from(w.max()) {
                // Room for one more once the (n - max + 1)th oldest has left the window.
                let (at,): (i64,) = sqlx::query_as(NTH_IN_WINDOW)
                    .bind(p.quota_key)
                    .bind(since)
                    .bind(n - i64::from(w.max()))
                    .fetch_one(&mut *conn)
                    .await?;
                let until = crate::model::from_millis(at.saturating_add(window_ms(w.window())));
                if full.is_none_or(|f| until > f.until) {
                    full = Some(redrive_policy::QuotaExhausted { until, window: *w });
                }
            }
        }
        Ok(match full {
            Some(f) => crate::QuotaTake::Full(f),
            None => {
                sqlx::query(INSERT_REATTEMPT)
                    .bind(p.quota_key)
                    .bind(p.network.as_str())
                    .bind(p.job_id)
                    .bind(now)
                    .execute(&mut *conn)
                    .await?;
                crate::QuotaTake::Taken
            }
        })
    }
}

/// A claim statement and its parameters (`$1` now, `$2` the queue, a JSON list of queues or
/// (every queue) empty and unread,
/// `$3` limit, `$4` worker, `$5` lease end, `$6` the kinds' JSON list when filtered).
pub(crate) struct ClaimStatement {
    pub(crate) sql: Arc<str>,
    pub(crate) now: i64,
    pub(crate) queues: String,
    pub(crate) limit: i64,
    pub(crate) worker: String,
    pub(crate) until: i64,
    pub(crate) kinds: Option<String>,
}

impl ClaimStatement {
    /// Binds the parameters to `q` (this statement, or a plan of it), whatever its rows.
    pub(crate) fn bind<'q, DB, O>(
        &self,
        q: QueryAs<'q, DB, O, <DB as Database>::Arguments>,
    ) -> QueryAs<'q, DB, O, <DB as Database>::Arguments>
    where
        DB: Database,
        i64: Encode<'q, DB> + Type<DB>,
        String: Encode<'q, DB> + Type<DB>,
    {
        let q = q
            .bind(self.now)
            .bind(self.queues.clone())
            .bind(self.limit)
            .bind(self.worker.clone())
            .bind(self.until);
        // The kinds' list is a parameter only of the statements that filter on it.
        match &self.kinds {
            Some(k) => q.bind(k.clone()),
            None => q,
        }
    }
}
