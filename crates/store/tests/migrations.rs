//! redrive's migrations keep their own bookkeeping table ([`MIGRATIONS_TABLE`]), so an
//! application's own sqlx migrations can live in the same schema (PostgreSQL's `public`,
//! or the same SQLite file), in either order; and a database migrated before redrive's
//! table had its own name is adopted in place.

use std::path::{Path, PathBuf};

use redrive_store::{MIGRATIONS_TABLE, PgStore, Store};
use redrive_testkit::PgSchema;
use sqlx::migrate::Migrator;

/// An application's migrations: version 1, like every sqlx project's first one, but with
/// other contents than redrive's version 1.
fn app_migrations() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("0001_app_orders.sql"),
        "CREATE TABLE app_orders (id BIGINT PRIMARY KEY, amount BIGINT NOT NULL);\n",
    )
    .unwrap();
    dir
}

fn redrive_migrations(dialect: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(dialect)
}

async fn pg_tables(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = current_schema() ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn count(pool: &sqlx::PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_application_migrations_share_the_schema_in_either_order() {
    let Some(schema) = PgSchema::fresh("mig_share").await else {
        return;
    };
    let pool = schema.pool(2).await;
    let app_dir = app_migrations();
    let app = Migrator::new(app_dir.path()).await.unwrap();
    let ours = Migrator::new(redrive_migrations("postgres")).await.unwrap();

    // The application first, then redrive, then the application again (its next deploy).
    app.run(&pool).await.expect("the application's migrations");
    let store = PgStore::connect(schema.server_url(), Some(schema.name()), 2)
        .await
        .expect("redrive migrates beside the application's sqlx migrations");
    drop(store);
    app.run(&pool)
        .await
        .expect("the application's migrator still sees only its own versions");
    // redrive again (a restart): nothing to apply, nothing refused.
    PgStore::connect(schema.server_url(), Some(schema.name()), 2)
        .await
        .expect("redrive restarts");

    let tables = pg_tables(&pool).await;
    assert!(tables.contains(&MIGRATIONS_TABLE.to_owned()), "{tables:?}");
    assert_eq!(
        count(&pool, "_sqlx_migrations").await,
        1,
        "the app's one row"
    );
    assert_eq!(
        count(&pool, MIGRATIONS_TABLE).await,
        ours.iter().count() as i64
    );
    pool.close().await;
    schema.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_database_migrated_into_sqlx_migrations_is_adopted_in_place() {
    let Some(schema) = PgSchema::fresh("mig_adopt").await else {
        return;
    };
    let pool = schema.pool(2).await;
    // How redrive migrated before: its versions in `_sqlx_migrations` …
    let legacy = Migrator::new(redrive_migrations("postgres")).await.unwrap();
    legacy.run(&pool).await.unwrap();
    let n = count(&pool, "_sqlx_migrations").await;
    assert_eq!(n, legacy.iter().count() as i64);
    // … and one foreign row that is not redrive's (another version number).
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (20260101000000, 'app', true, '\\x00', 1)",
    )
    .execute(&pool)
    .await
    .unwrap();

    let store = PgStore::connect(schema.server_url(), Some(schema.name()), 2)
        .await
        .expect("an old database upgrades in place");
    assert_eq!(
        count(&pool, MIGRATIONS_TABLE).await,
        n,
        "every redrive row moved"
    );
    assert_eq!(
        count(&pool, "_sqlx_migrations").await,
        1,
        "only the foreign row is left where it was"
    );
    // The jobs table was not made twice, and works.
    let s = Store::Postgres(store);
    s.enqueue(
        &redrive_store::NewJob::new("q", "noop", serde_json::json!({})),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    drop(s);

    // Without a foreign row the old table goes away altogether.
    sqlx::query("DELETE FROM _sqlx_migrations")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO _sqlx_migrations SELECT * FROM {MIGRATIONS_TABLE}"
    )))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {MIGRATIONS_TABLE}"
    )))
    .execute(&pool)
    .await
    .unwrap();
    PgStore::connect(schema.server_url(), Some(schema.name()), 2)
        .await
        .unwrap();
    let tables = pg_tables(&pool).await;
    assert!(
        !tables.contains(&"_sqlx_migrations".to_owned()),
        "{tables:?}"
    );
    assert_eq!(count(&pool, MIGRATIONS_TABLE).await, n);
    pool.close().await;
    schema.drop_now().await;
}

async fn sqlite_pool(path: &Path) -> sqlx::SqlitePool {
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true),
        )
        .await
        .unwrap()
}

async fn sqlite_count(pool: &sqlx::SqlitePool, table: &str) -> Option<i64> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_application_migrations_share_the_file_and_old_files_are_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let app_dir = app_migrations();
    let app = Migrator::new(app_dir.path()).await.unwrap();
    let ours = Migrator::new(redrive_migrations("sqlite")).await.unwrap();

    // Beside an application's migrations.
    let shared = dir.path().join("shared.db");
    let pool = sqlite_pool(&shared).await;
    app.run(&pool).await.unwrap();
    pool.close().await;
    let url = format!("sqlite:{}", shared.display());
    drop(
        Store::connect(&url)
            .await
            .expect("beside the app's migrations"),
    );
    let pool = sqlite_pool(&shared).await;
    app.run(&pool)
        .await
        .expect("the app still sees its own only");
    assert_eq!(sqlite_count(&pool, "_sqlx_migrations").await, Some(1));
    assert_eq!(
        sqlite_count(&pool, MIGRATIONS_TABLE).await,
        Some(ours.iter().count() as i64)
    );
    pool.close().await;

    // A file migrated the old way.
    let old = dir.path().join("old.db");
    let pool = sqlite_pool(&old).await;
    ours.run(&pool).await.unwrap();
    pool.close().await;
    let url = format!("sqlite:{}", old.display());
    drop(
        Store::connect(&url)
            .await
            .expect("an old file upgrades in place"),
    );
    let pool = sqlite_pool(&old).await;
    assert_eq!(
        sqlite_count(&pool, "_sqlx_migrations").await,
        None,
        "dropped"
    );
    assert_eq!(
        sqlite_count(&pool, MIGRATIONS_TABLE).await,
        Some(ours.iter().count() as i64)
    );
    pool.close().await;
}
