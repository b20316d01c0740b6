//! The idempotency table under the crate's own migrations: a database whose table was made
//! before (by `CREATE TABLE IF NOT EXISTS`) keeps working, and the job store's migrations and
//! these share one database in either order (their applied versions are kept in separate
//! tables: `_redrive_migrations` and [`MIGRATIONS_TABLE`]).

use std::sync::Arc;
use std::time::Duration;

use redrive_idempotency::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, LockToken, MIGRATIONS_TABLE,
    PostgresIdempotencyStore, SqliteIdempotencyStore,
};

/// The table as `ensure_schema` made it before the crate had migrations.
const OLD_SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS idempotency_keys (
    id INTEGER PRIMARY KEY, scope TEXT NOT NULL,
    idem_key TEXT NOT NULL CHECK (length(CAST(idem_key AS BLOB)) BETWEEN 1 AND 255),
    request_method TEXT NOT NULL, request_path TEXT NOT NULL, fingerprint BLOB NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('in_progress', 'completed')),
    recovery_point TEXT NOT NULL DEFAULT 'started', lock_token TEXT NULL,
    locked_until INTEGER NULL, attempts INTEGER NOT NULL DEFAULT 1,
    response_status INTEGER NULL, response_headers TEXT NULL, response_body BLOB NULL,
    replay_unavailable INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,
    last_run_at INTEGER NOT NULL, completed_at INTEGER NULL, expires_at INTEGER NOT NULL,
    UNIQUE (scope, idem_key), CHECK (state <> 'completed' OR response_status IS NOT NULL))";

fn claim(key: &str) -> ClaimRequest {
    ClaimRequest {
        scope: "s".into(),
        key: key.into(),
        method: "POST".into(),
        path: "/charges".into(),
        fingerprint: [7; 32],
        token: LockToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        take_over_abandoned: false,
    }
}

/// A claim, then a repeat of it that finds the key held: the table works.
async fn claims_work(store: &dyn IdempotencyStore, key: &str) {
    assert!(matches!(
        store.claim(&claim(key)).await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
    assert!(matches!(
        store.claim(&claim(key)).await.unwrap(),
        ClaimOutcome::InProgress
    ));
}

#[tokio::test]
async fn a_table_made_before_migrations_is_kept_and_its_records_stay() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    let store = SqliteIdempotencyStore::connect(&url).await.unwrap();
    sqlx::query(OLD_SQLITE_TABLE)
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO idempotency_keys (scope, idem_key, request_method, request_path, \
         fingerprint, state, created_at, last_run_at, expires_at, lock_token, locked_until) \
         VALUES ('s', 'old', 'POST', '/charges', x'07', 'in_progress', 0, 0, 9e15, 't', 9e15)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store.ensure_schema().await.unwrap();
    store.ensure_schema().await.unwrap();
    let applied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {MIGRATIONS_TABLE}"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(applied, 1, "the migration is recorded once");
    let old = store
        .get("s", "old")
        .await
        .unwrap()
        .expect("the old record");
    assert!(old.locked, "{old:?}");
    claims_work(&store, "new").await;
}

#[tokio::test]
async fn the_job_store_and_the_idempotency_table_migrate_one_sqlite_database_in_either_order() {
    for store_first in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("both.db").display());
        let idem = SqliteIdempotencyStore::connect(&url).await.unwrap();
        if !store_first {
            idem.ensure_schema().await.unwrap();
        }
        let jobs = redrive_store::Store::connect(&url).await.unwrap();
        jobs.migrate().await.unwrap();
        idem.ensure_schema().await.unwrap();
        // Both again, as a restarted process does.
        redrive_store::Store::connect(&url).await.unwrap();
        idem.ensure_schema().await.unwrap();
        claims_work(&idem, "k").await;
    }
}

#[tokio::test]
async fn the_job_store_and_the_idempotency_table_migrate_one_postgres_schema_in_either_order() {
    for store_first in [true, false] {
        let Some(schema) = redrive_testkit::PgSchema::fresh("idem_mig").await else {
            return;
        };
        let (url, name) = (schema.server_url(), schema.name());
        let idem: Arc<PostgresIdempotencyStore> = Arc::new(
            PostgresIdempotencyStore::connect_in_schema(url, name, 2)
                .await
                .unwrap(),
        );
        let result = async {
            if !store_first {
                idem.ensure_schema().await?;
            }
            let jobs = redrive_store::PgStore::connect(url, Some(name), 2).await?;
            jobs.migrate().await?;
            idem.ensure_schema().await?;
            claims_work(idem.as_ref(), "k").await;
            Ok::<_, Box<dyn std::error::Error>>(())
        }
        .await;
        idem.close().await;
        schema.drop_now().await;
        result.unwrap();
    }
}

/// A server error reads as its message and SQLSTATE, once, with no source chain repeating it
/// and no "at line N" of PostgreSQL's C source.
#[tokio::test]
async fn a_postgres_error_is_shown_by_its_message_and_sqlstate() {
    let Some(schema) = redrive_testkit::PgSchema::fresh("idem_err").await else {
        return;
    };
    let (url, name) = (schema.server_url(), schema.name());
    let idem = PostgresIdempotencyStore::connect_in_schema(url, name, 2)
        .await
        .unwrap();
    idem.ensure_schema().await.unwrap();
    let pool = schema.pool(1).await;
    sqlx::query("DROP TABLE idempotency_keys")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let e = match idem.claim(&claim("gone")).await {
        Err(e) => e,
        Ok(_) => panic!("a claim on a dropped table succeeded"),
    };
    let text = e.to_string();
    assert!(text.contains("SQLSTATE 42P01"), "{text}");
    assert!(!text.contains(" at line "), "{text}");
    assert!(std::error::Error::source(&e).is_none(), "{e:?}");
    idem.close().await;
    schema.drop_now().await;
}
