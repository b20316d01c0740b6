//! What the multi-process PostgreSQL tests share (`fleet.rs`, `fleet_psp.rs`): a fresh schema
//! with a store on it, and the wait for every job to succeed.

use std::time::{Duration, Instant};

use redrive_store::{JobState, PgStore, Store};
use redrive_testkit::PgSchema;
use redrive_testkit::cli::block;

/// A fresh schema named after `prefix` and a store on it with a pool of `pool` connections;
/// `None` (skip) only when PostgreSQL is unreachable (refused or timed out) and CI is not set;
/// any other connection error fails.
pub(crate) fn schema(prefix: &str, pool: u32) -> Option<(PgSchema, PgStore)> {
    let schema = block(PgSchema::fresh(prefix))?;
    let pg = block(PgStore::connect(
        schema.server_url(),
        Some(schema.name()),
        pool,
    ))
    .expect("postgres store");
    Some((schema, pg))
}

/// Waits until `n` jobs have succeeded; fails after `limit`.
pub(crate) fn all_succeeded(pg: &PgStore, n: u64, limit: Duration) {
    let store = Store::Postgres(pg.clone());
    let t = Instant::now();
    loop {
        // The workers' pools may hold every connection the server allows for a moment: a
        // refused read is asked again (the limit still bounds the wait).
        let done: u64 = block(store.counts())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.state == JobState::Succeeded)
            .map(|c| c.count)
            .sum();
        if done == n {
            return;
        }
        assert!(t.elapsed() < limit, "only {done} of {n} jobs succeeded");
        std::thread::sleep(Duration::from_millis(50));
    }
}
