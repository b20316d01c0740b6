//! The one implementation of the SQL stores: every operation written once, generic over the
//! database; each dialect ([`sqlite`](super::sqlite), [`postgres`](super::postgres)) gives
//! only its statements ([`Statements`]), its migrations and how it opens a pool.
//!
//! Times are the database's own (`now()` in PostgreSQL, `julianday('now')` in SQLite), so
//! every lease and expiry decision uses one clock.

use std::future::Future;
use std::time::Duration;

use sqlx::migrate::{Migrate, Migrator};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::rows::{
    Existing, ExistingRow, InfoRow, ListRow, attempts_u32, classify, filter_sql, headers_to_json,
    info_from_row, listed_from_row, millis,
};
use super::{
    Acquired, ClaimOutcome, ClaimRequest, IdempotencyStore, ListRequest, ListedRecord, LockToken,
    RECOVERY_POINT_STARTED, ReapReport, RecordId, RecordInfo, Recovery, StoreFuture,
    StoredResponse,
};
use crate::error::IdempotencyStoreError;

/// The table of applied migrations of this crate, apart from `_redrive_migrations` (the job
/// store's), so that both migrators can share one database without seeing each other's
/// versions as unknown.
pub const MIGRATIONS_TABLE: &str = "_redrive_idempotency_migrations";

/// The SQL of one dialect. Parameters are positional, in the order the store binds them.
#[derive(Debug)]
pub struct Statements {
    /// Starts the claim's transaction (`BEGIN IMMEDIATE` in SQLite: take the write lock first).
    pub(crate) begin_claim: &'static str,
    /// Deletes the completed, expired record of `(scope, key)`.
    pub(crate) delete_expired_one: &'static str,
    /// Inserts a claim, returning its id, or nothing when the key exists.
    pub(crate) insert: &'static str,
    /// Reads an existing record as an [`ExistingRow`] (locked, where the dialect can).
    pub(crate) select_existing: &'static str,
    /// Takes over an in-progress record whose lease ran out.
    pub(crate) take_over: &'static str,
    /// Extends a held lease.
    pub(crate) heartbeat: &'static str,
    /// Moves a held record's recovery point.
    pub(crate) advance: &'static str,
    /// Stores the response of a held record.
    pub(crate) finalise: &'static str,
    /// Gives a held record's key back.
    pub(crate) release: &'static str,
    /// Deletes a held record without a response.
    pub(crate) forget: &'static str,
    /// Reads an [`InfoRow`].
    pub(crate) get: &'static str,
    /// Recovery: releases an in-progress record whose lease is not live.
    pub(crate) recover_release: &'static str,
    /// Recovery: completes it with a response.
    pub(crate) recover_complete: &'static str,
    /// Recovery: deletes it.
    pub(crate) recover_delete: &'static str,
    /// Deletes a batch of completed, expired records.
    pub(crate) reap: &'static str,
    /// Counts expired and abandoned in-progress records.
    pub(crate) stuck: &'static str,
    /// A page of [`ListRow`]s, with the filter's condition in `{filter}`.
    pub(crate) list: &'static str,
    /// The condition "the lease is live".
    pub(crate) live: &'static str,
}

mod sealed {
    pub trait Sealed {}
}

/// A database the SQL store runs on: [`sqlx::Sqlite`] and [`sqlx::Postgres`]
/// (sealed; implemented by this crate only).
pub trait Dialect: Database + sealed::Sealed {
    /// Its statements.
    #[doc(hidden)]
    const SQL: Statements;

    /// Its migrations (the table and its indexes).
    #[doc(hidden)]
    fn migrator() -> Migrator;

    /// The rows a statement changed.
    #[doc(hidden)]
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// Checks the server before migrating (SQLite: its version).
    #[doc(hidden)]
    fn check_server(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<(), IdempotencyStoreError>> + Send;
}

#[cfg(feature = "sqlite")]
impl sealed::Sealed for sqlx::Sqlite {}
#[cfg(feature = "postgres")]
impl sealed::Sealed for sqlx::Postgres {}

/// Idempotency records in a SQL database: [`SqliteIdempotencyStore`](super::SqliteIdempotencyStore)
/// or [`PostgresIdempotencyStore`](super::PostgresIdempotencyStore).
#[derive(Debug)]
pub struct SqlIdempotencyStore<D: Dialect> {
    pub(crate) pool: Pool<D>,
}

impl<D: Dialect> Clone for SqlIdempotencyStore<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
        }
    }
}

impl<D: Dialect> SqlIdempotencyStore<D> {
    /// Wraps an existing pool. SQLite: configure WAL, `synchronous` and `busy_timeout` on
    /// it; PostgreSQL: its `search_path` decides the schema of the table.
    #[must_use]
    pub fn from_pool(pool: Pool<D>) -> Self {
        Self { pool }
    }

    /// The pool.
    #[must_use]
    pub fn pool(&self) -> &Pool<D> {
        &self.pool
    }

    /// Closes the pool; every later operation fails (used to test failing closed).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// A query of dialect `D` before it runs.
type Query<D> = sqlx::query::Query<'static, D, <D as Database>::Arguments>;

/// Binds a stored response as the statement's parameters 3 to 6.
fn bind_response<D>(q: Query<D>, response: &StoredResponse) -> Query<D>
where
    D: Database,
    for<'q> i32: Encode<'q, D> + Type<D>,
    for<'q> bool: Encode<'q, D> + Type<D>,
    for<'q> String: Encode<'q, D> + Type<D>,
    for<'q> Vec<u8>: Encode<'q, D> + Type<D>,
{
    q.bind(i32::from(response.status))
        .bind(headers_to_json(&response.headers))
        .bind(response.body.clone())
        .bind(response.replay_unavailable)
}

/// Runs a write on a held record: `statement` with `(id, token)` and then what `extra`
/// binds; whether exactly one row changed (the token still held).
async fn held_write<D>(
    pool: &Pool<D>,
    op: &'static str,
    statement: &'static str,
    (id, token): (RecordId, LockToken),
    extra: impl FnOnce(Query<D>) -> Query<D>,
) -> Result<bool, IdempotencyStoreError>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'q> String: Encode<'q, D> + Type<D>,
{
    let q = sqlx::query(statement).bind(id.0).bind(token.0.to_string());
    let done = extra(q)
        .execute(pool)
        .await
        .map_err(IdempotencyStoreError::db(op))?;
    Ok(D::rows_affected(&done) == 1)
}

impl<D> IdempotencyStore for SqlIdempotencyStore<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    D::Connection: Migrate,
    D::Arguments: IntoArguments<D>,
    for<'q> i64: Encode<'q, D> + Type<D>,
    for<'q> i32: Encode<'q, D> + Type<D>,
    for<'q> bool: Encode<'q, D> + Type<D>,
    for<'q> String: Encode<'q, D> + Type<D>,
    for<'q> Option<String>: Encode<'q, D> + Type<D>,
    for<'q> Vec<u8>: Encode<'q, D> + Type<D>,
    for<'r> (i64,): FromRow<'r, D::Row>,
    for<'r> (i64, i64): FromRow<'r, D::Row>,
    for<'r> (String, i32): FromRow<'r, D::Row>,
    for<'r> ExistingRow: FromRow<'r, D::Row>,
    for<'r> InfoRow: FromRow<'r, D::Row>,
    for<'r> ListRow: FromRow<'r, D::Row>,
{
    fn ensure_schema(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let op = "ensure_schema";
            D::check_server(&self.pool).await?;
            let mut migrator = D::migrator();
            migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
            migrator
                .run(&self.pool)
                .await
                .map_err(|e| IdempotencyStoreError::db(op)(sqlx::Error::from(e)))
        })
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move {
            let op = "claim";
            let sql = &D::SQL;
            let db = IdempotencyStoreError::db;
            let mut tx = self
                .pool
                .begin_with(sql.begin_claim)
                .await
                .map_err(db(op))?;
            sqlx::query(sql.delete_expired_one)
                .bind(req.scope.clone())
                .bind(req.key.clone())
                .execute(&mut *tx)
                .await
                .map_err(db(op))?;
            let token = req.token.0.to_string();
            let inserted: Option<(i64,)> = sqlx::query_as(sql.insert)
                .bind(req.scope.clone())
                .bind(req.key.clone())
                .bind(req.method.clone())
                .bind(req.path.clone())
                .bind(req.fingerprint.to_vec())
                .bind(token.clone())
                .bind(millis(req.lease))
                .bind(millis(req.retention))
                .fetch_optional(&mut *tx)
                .await
                .map_err(db(op))?;
            let outcome = if let Some((id,)) = inserted {
                ClaimOutcome::Acquired(Acquired {
                    id: RecordId(id),
                    recovery_point: RECOVERY_POINT_STARTED.to_owned(),
                    attempts: 1,
                    resumed: false,
                })
            } else {
                let row: Option<ExistingRow> = sqlx::query_as(sql.select_existing)
                    .bind(req.scope.clone())
                    .bind(req.key.clone())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db(op))?;
                let existing = match row {
                    // The conflicting row was deleted between the insert and the select (a
                    // recovery's `Delete`; PostgreSQL only): in progress, the client retries.
                    None => Existing::Outcome(ClaimOutcome::InProgress),
                    Some(row) => classify(row, req)?,
                };
                match existing {
                    Existing::Outcome(outcome) => outcome,
                    Existing::TakeOver(id) => {
                        let taken: Option<(String, i32)> = sqlx::query_as(sql.take_over)
                            .bind(id)
                            .bind(token)
                            .bind(millis(req.lease))
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(db(op))?;
                        match taken {
                            Some((recovery_point, attempts)) => ClaimOutcome::Acquired(Acquired {
                                id: RecordId(id),
                                recovery_point,
                                attempts: attempts_u32(attempts),
                                resumed: true,
                            }),
                            None => ClaimOutcome::InProgress,
                        }
                    }
                }
            };
            tx.commit().await.map_err(db(op))?;
            Ok(outcome)
        })
    }

    fn heartbeat(&self, id: RecordId, token: LockToken, lease: Duration) -> StoreFuture<'_, bool> {
        let sql = D::SQL.heartbeat;
        Box::pin(held_write(
            &self.pool,
            "heartbeat",
            sql,
            (id, token),
            move |q| q.bind(millis(lease)),
        ))
    }

    fn advance<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        recovery_point: &'a str,
    ) -> StoreFuture<'a, bool> {
        let sql = D::SQL.advance;
        Box::pin(held_write(
            &self.pool,
            "advance",
            sql,
            (id, token),
            move |q| q.bind(recovery_point.to_owned()),
        ))
    }

    fn finalise<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        response: &'a StoredResponse,
    ) -> StoreFuture<'a, bool> {
        let sql = D::SQL.finalise;
        Box::pin(held_write(
            &self.pool,
            "finalise",
            sql,
            (id, token),
            move |q| bind_response(q, response),
        ))
    }

    fn release(&self, id: RecordId, token: LockToken) -> StoreFuture<'_, bool> {
        let sql = D::SQL.release;
        Box::pin(held_write(&self.pool, "release", sql, (id, token), |q| q))
    }

    fn forget(&self, id: RecordId, token: LockToken) -> StoreFuture<'_, bool> {
        let sql = D::SQL.forget;
        Box::pin(held_write(&self.pool, "forget", sql, (id, token), |q| q))
    }

    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> StoreFuture<'a, Option<RecordInfo>> {
        Box::pin(async move {
            let row: Option<InfoRow> = sqlx::query_as(D::SQL.get)
                .bind(scope.to_owned())
                .bind(key.to_owned())
                .fetch_optional(&self.pool)
                .await
                .map_err(IdempotencyStoreError::db("get"))?;
            row.map(info_from_row).transpose()
        })
    }

    fn recover<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        action: &'a Recovery,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let sql = &D::SQL;
            let statement = match action {
                Recovery::Release => sql.recover_release,
                Recovery::Delete => sql.recover_delete,
                Recovery::Complete(_) => sql.recover_complete,
            };
            let mut q: Query<D> = sqlx::query(statement)
                .bind(scope.to_owned())
                .bind(key.to_owned());
            if let Recovery::Complete(response) = action {
                q = bind_response(q, response);
            }
            let done = q
                .execute(&self.pool)
                .await
                .map_err(IdempotencyStoreError::db("recover"))?;
            Ok(D::rows_affected(&done) == 1)
        })
    }

    fn reap(&self, batch: u32) -> StoreFuture<'_, ReapReport> {
        Box::pin(async move {
            let db = IdempotencyStoreError::db;
            let done = sqlx::query(D::SQL.reap)
                .bind(i64::from(batch))
                .execute(&self.pool)
                .await
                .map_err(db("reap"))?;
            let (expired, abandoned): (i64, i64) = sqlx::query_as(D::SQL.stuck)
                .fetch_one(&self.pool)
                .await
                .map_err(db("reap"))?;
            Ok(ReapReport {
                deleted: D::rows_affected(&done),
                expired_in_progress: u64::try_from(expired).unwrap_or(0),
                abandoned: u64::try_from(abandoned).unwrap_or(0),
            })
        })
    }

    fn list<'a>(&'a self, request: &'a ListRequest) -> StoreFuture<'a, Vec<ListedRecord>> {
        Box::pin(async move {
            let sql = &D::SQL;
            let text = sql
                .list
                .replace("{filter}", &filter_sql(request.filter, sql.live));
            let rows: Vec<ListRow> = sqlx::query_as(sqlx::AssertSqlSafe(text))
                .bind(request.after.map_or(0, |a| a.0))
                .bind(request.scope.clone())
                .bind(i64::from(request.effective_limit()))
                .fetch_all(&self.pool)
                .await
                .map_err(IdempotencyStoreError::db("list"))?;
            rows.into_iter().map(listed_from_row).collect()
        })
    }
}

/// Hands a connection back to the pool only when it is healthy and outside a transaction
/// (a future dropped mid-transaction leaves one open); otherwise the pool closes it. Only a
/// connection counted inside a transaction is pinged first (see `redrive_store::release_if_clean`).
pub(crate) async fn release_if_clean<C: sqlx::Connection>(
    conn: &mut C,
) -> Result<bool, sqlx::Error> {
    if !conn.is_in_transaction() {
        return Ok(true);
    }
    conn.ping().await?;
    if conn.is_in_transaction() {
        tracing::warn!("a database connection was left inside a failed transaction: closing it");
        return Ok(false);
    }
    Ok(true)
}
