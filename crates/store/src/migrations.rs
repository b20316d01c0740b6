//! redrive's migrations live in their own bookkeeping table, [`MIGRATIONS_TABLE`], not in
//! sqlx's default `_sqlx_migrations`: an application that keeps its own sqlx migrations in the
//! same schema (`public`, when no `?schema=` is given) would otherwise share one table with
//! redrive, and each side's migrator refuses the other's versions as "applied but missing".
//!
//! Databases migrated before the table had its own name are adopted in place: the rows of
//! `_sqlx_migrations` that are redrive's (same version *and* checksum as one of its embedded
//! migrations) move to [`MIGRATIONS_TABLE`] in one transaction, and the old table is dropped
//! only if nothing else is left in it.

use sqlx::migrate::Migrator;

/// The table that records which of redrive's migrations a database has.
pub const MIGRATIONS_TABLE: &str = "_redrive_migrations";

/// sqlx's default bookkeeping table, where redrive's rows were kept before.
const LEGACY_TABLE: &str = "_sqlx_migrations";

/// `migrator` with redrive's own table name.
pub(crate) fn named(mut migrator: Migrator) -> Migrator {
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The `(version, checksum)` pairs of `migrator`'s migrations, as SQL tuples to match the
/// legacy rows against; checksums are hex (the backends compare them as text).
fn ours(migrator: &Migrator) -> Vec<(i64, String)> {
    migrator
        .iter()
        .map(|m| {
            let hex: String = m.checksum.iter().map(|b| format!("{b:02x}")).collect();
            (m.version, hex)
        })
        .collect()
}

#[cfg(feature = "postgres")]
pub(crate) async fn adopt_postgres(pool: &sqlx::PgPool, migrator: &Migrator) -> crate::Result<()> {
    use sqlx::migrate::Migrate;
    let legacy: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !legacy {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    // One adopter at a time (several processes start together); the migrator's own lock is
    // per database and taken later, by `run`.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('redrive_migrations_adopt'))")
        .execute(&mut *tx)
        .await?;
    tx.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    let (versions, checksums): (Vec<i64>, Vec<String>) = ours(migrator).into_iter().unzip();
    let moved = sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH ours AS (SELECT * FROM unnest($1::bigint[], $2::text[]) AS o(version, checksum)), \
              gone AS (DELETE FROM {LEGACY_TABLE} l USING ours \
                       WHERE l.version = ours.version AND encode(l.checksum, 'hex') = ours.checksum \
                       RETURNING l.*) \
         INSERT INTO {MIGRATIONS_TABLE} (version, description, installed_on, success, checksum, execution_time) \
         SELECT version, description, installed_on, success, checksum, execution_time FROM gone \
         ON CONFLICT (version) DO NOTHING"
    )))
    .bind(&versions)
    .bind(&checksums)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {LEGACY_TABLE}"
    )))
    .fetch_one(&mut *tx)
    .await?;
    if left == 0 {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {LEGACY_TABLE}")))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    if moved > 0 {
        tracing::info!(
            moved,
            left,
            "moved redrive's migration records from {LEGACY_TABLE} to {MIGRATIONS_TABLE}"
        );
    }
    Ok(())
}

#[cfg(feature = "sqlite")]
pub(crate) async fn adopt_sqlite(
    pool: &sqlx::SqlitePool,
    migrator: &Migrator,
) -> crate::Result<()> {
    use sqlx::migrate::Migrate;
    let legacy: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_one(pool)
    .await?;
    if legacy == 0 {
        return Ok(());
    }
    // BEGIN IMMEDIATE: the write lock first, so two processes opening one file adopt in turn.
    let mut conn = pool.acquire().await?;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let result = async {
        conn.ensure_migrations_table(MIGRATIONS_TABLE)
            .await
            .map_err(sqlx::Error::from)?;
        let mut moved = 0;
        for (version, checksum) in ours(migrator) {
            let matches = format!(
                "FROM {LEGACY_TABLE} WHERE version = ?1 AND lower(hex(checksum)) = ?2"
            );
            moved += sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT OR IGNORE INTO {MIGRATIONS_TABLE} \
                 (version, description, installed_on, success, checksum, execution_time) \
                 SELECT version, description, installed_on, success, checksum, execution_time {matches}"
            )))
            .bind(version)
            .bind(&checksum)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE {matches}")))
                .bind(version)
                .bind(&checksum)
                .execute(&mut *conn)
                .await?;
        }
        let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {LEGACY_TABLE}"
        )))
        .fetch_one(&mut *conn)
        .await?;
        if left == 0 {
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {LEGACY_TABLE}")))
                .execute(&mut *conn)
                .await?;
        }
        Ok::<_, sqlx::Error>(moved)
    }
    .await;
    match result {
        Ok(moved) => {
            sqlx::query("COMMIT").execute(&mut *conn).await?;
            if moved > 0 {
                tracing::info!(
                    moved,
                    "moved redrive's migration records from {LEGACY_TABLE} to {MIGRATIONS_TABLE}"
                );
            }
            Ok(())
        }
        Err(e) => {
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            Err(e.into())
        }
    }
}
