//! The store on either backend, one fresh database per test: an SQLite file in a temporary
//! directory, or a PostgreSQL schema of its own ([`redrive_testkit::PgSchema`]; skipped only
//! when the server is unreachable and `CI` is not set).
#![allow(dead_code, unreachable_pub)]

use redrive_store::{PgStore, Store};
use redrive_testkit::PgSchema;

/// One test's store and what it lives in.
pub struct Harness {
    pub store: Store,
    _dir: Option<tempfile::TempDir>,
    schema: Option<PgSchema>,
}

impl Harness {
    /// Drops the PostgreSQL schema (an SQLite directory goes with the value).
    pub async fn cleanup(self) {
        let Self { store, schema, .. } = self;
        drop(store);
        if let Some(schema) = schema {
            schema.drop_now().await;
        }
    }
}

/// A store on a fresh SQLite file.
pub async fn sqlite() -> Option<Harness> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    Some(Harness {
        store: Store::connect(&url).await.expect("sqlite store"),
        _dir: Some(dir),
        schema: None,
    })
}

/// A store of at most `connections` connections on a fresh PostgreSQL schema named after
/// `prefix`; `None` when the test skips.
pub async fn postgres(prefix: &str, connections: u32) -> Option<Harness> {
    let schema = PgSchema::fresh(prefix).await?;
    let pg = PgStore::connect(schema.server_url(), Some(schema.name()), connections)
        .await
        .expect("postgres store");
    Some(Harness {
        store: Store::Postgres(pg),
        _dir: None,
        schema: Some(schema),
    })
}

/// Declares every named case twice, as `sqlite::NAME` and `postgres::NAME`: each a test that
/// runs `cases::NAME(&store)` on a fresh store of that backend (from the `sqlite()` and
/// `postgres()` in scope where the macro is used) and cleans up after it.
#[allow(unused_macros)]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(h) = super::sqlite().await {
                        super::cases::$name(&h.store).await;
                        h.cleanup().await;
                    }
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(h) = super::postgres().await {
                        super::cases::$name(&h.store).await;
                        h.cleanup().await;
                    }
                }
            )*
        }
    };
}
