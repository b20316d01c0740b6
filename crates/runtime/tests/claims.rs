//! The claim loop with several claims in flight (pipelined claims), against SQLite and
//! PostgreSQL (`CI=true` makes the PostgreSQL cases fail rather than skip without a server):
//! `max_jobs` stays exact, and a shutdown while claims are in flight leaves no job leased.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use redrive_runtime::{Attempted, Handler, JobContext, Noop, Worker};
use redrive_store::{JobState, NewJob, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Jobs in `state`, over every queue.
async fn count(store: &Store, state: JobState) -> u64 {
    store
        .counts()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.state == state)
        .map(|c| c.count)
        .sum()
}

async fn seed(store: &Store, n: usize) {
    let jobs: Vec<NewJob> = (0..n)
        .map(|_| NewJob::new("q", "work", json!({})))
        .collect();
    store.enqueue_many(&jobs, chrono::Utc::now()).await.unwrap();
}

/// Runs `case` on a fresh SQLite store, then on a fresh PostgreSQL schema (skipped without a
/// server unless CI is set).
async fn on_both(case: impl AsyncFn(Store)) {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display()))
        .await
        .unwrap();
    case(sqlite).await;
    let Some(schema) = redrive_testkit::PgSchema::fresh("rdclaims").await else {
        return;
    };
    let pg = Store::connect(&schema.url()).await.unwrap();
    case(pg.clone()).await;
    drop(pg);
    schema.drop_now().await;
}

/// Small claims into many free slots: several claims are in flight at once, and each asks
/// for what `max_jobs` leaves after the others. Exactly `max_jobs` jobs are claimed and
/// run; the rest stay available, none leased.
async fn max_jobs_exact(store: Store) {
    seed(&store, 100).await;
    for (max, batch) in [(10, 3), (7, 1), (13, 4)] {
        let before = count(&store, JobState::Succeeded).await;
        let sum = Worker::builder(store.clone(), vec!["q".into()])
            .handler("work", Arc::new(Noop))
            .concurrency(64)
            .claim_batch(batch)
            .max_jobs(Some(max))
            .gauge_interval(None)
            .build()
            .run_until_idle()
            .await
            .unwrap();
        let backend = store.backend();
        assert_eq!(
            sum.succeeded, max,
            "{backend}: max_jobs {max}, batch {batch}"
        );
        assert_eq!(
            count(&store, JobState::Succeeded).await - before,
            max,
            "{backend}: max_jobs {max}, batch {batch}"
        );
        assert_eq!(count(&store, JobState::Running).await, 0, "{backend}");
    }
    assert_eq!(count(&store, JobState::Available).await, 100 - 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_jobs_is_exact_with_claims_in_flight() {
    on_both(max_jobs_exact).await;
}

/// Stops the worker at its first call, then takes a while: claims are in flight (small
/// batches into many free slots) when the shutdown comes.
#[derive(Debug)]
struct StopAtFirst {
    stop: CancellationToken,
    calls: AtomicU64,
}

impl Handler for StopAtFirst {
    fn run(&self, _: JobContext) -> BoxFuture<'static, Attempted> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.stop.cancel();
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Attempted::success(json!(null))
        })
    }
}

/// A shutdown while claims are in flight: every job the worker claimed is finished or
/// released by the time `run` returns (none left leased to a stopped worker), and none ran
/// twice.
async fn shutdown_with_claims_in_flight(store: Store) {
    seed(&store, 300).await;
    let stop = CancellationToken::new();
    let h = Arc::new(StopAtFirst {
        stop: stop.clone(),
        calls: AtomicU64::new(0),
    });
    let worker = Worker::builder(store.clone(), vec!["q".into()])
        .handler("work", h.clone())
        .concurrency(64)
        .claim_batch(2)
        .gauge_interval(None)
        .shutdown_grace(Duration::from_secs(10))
        .build();
    let sum = tokio::time::timeout(Duration::from_secs(30), worker.run(stop))
        .await
        .expect("the worker stops")
        .unwrap();
    let backend = store.backend();
    assert_eq!(count(&store, JobState::Running).await, 0, "{backend}");
    let succeeded = count(&store, JobState::Succeeded).await;
    assert_eq!(sum.succeeded, succeeded, "{backend}: {sum:?}");
    assert_eq!(h.calls.load(Ordering::SeqCst), succeeded, "{backend}");
    assert_eq!(
        count(&store, JobState::Available).await + succeeded,
        300,
        "{backend}: {sum:?}"
    );
    assert!(sum.claims >= 1, "{backend}: {sum:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shutdown_with_claims_in_flight_leaves_no_job_leased() {
    on_both(shutdown_with_claims_in_flight).await;
}
