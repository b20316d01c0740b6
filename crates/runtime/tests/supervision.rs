//! The worker pool under store faults (finding 1 of the hardening issue): a store that fails
//! for a while must not end the pool. Before the fix, one job whose completion could not be
//! written within about 1.5 s failed its task, the task's error ended the whole pool, and the
//! jobs accepted afterwards never ran.
//!
//! The SQLite fault ([`redrive_testkit::DiskFault`]) is process-wide: the tests of this file
//! that engage it run one at a time (`FAULT`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use redrive_runtime::{Attempted, Handler, JobContext, PoolHealth, Summary, Worker};
use redrive_store::{JobState, NewJob, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;

static FAULT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const JOBS: usize = 40;

/// Succeeds after a while; counts its calls per job.
#[derive(Debug, Default)]
struct Counting {
    calls: Mutex<HashMap<i64, u32>>,
}

impl Counting {
    fn total(&self) -> u32 {
        self.calls.lock().unwrap().values().sum()
    }
}

impl Handler for Counting {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        *self.calls.lock().unwrap().entry(ctx.job_id).or_default() += 1;
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Attempted::success(json!({"ok": true}))
        })
    }
}

async fn until(what: &str, limit: Duration, mut ok: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + limit;
    while !ok().await {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn succeeded(store: &Store) -> u64 {
    match store.counts().await {
        Ok(c) => c
            .iter()
            .filter(|c| c.state == JobState::Succeeded)
            .map(|c| c.count)
            .sum(),
        Err(_) => 0,
    }
}

struct Running {
    handler: Arc<Counting>,
    health: PoolHealth,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<Result<Summary, redrive_runtime::RuntimeError>>,
}

async fn start(store: &Store) -> Running {
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|i| NewJob::new("q", "count", json!({})).key(format!("j{i}")))
        .collect();
    store.enqueue_many(&jobs, chrono::Utc::now()).await.unwrap();
    let handler = Arc::new(Counting::default());
    let worker = Worker::builder(store.clone(), vec!["q".into()])
        .handler("count", handler.clone())
        .concurrency(4)
        .lease(Duration::from_secs(20))
        .poll_interval(Duration::from_millis(50))
        .rescue_interval(Duration::from_millis(100))
        .gauge_interval(None)
        .build()
        .unwrap();
    let health = worker.health();
    assert!(!health.is_running());
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    until("the pool runs jobs", Duration::from_secs(20), async || {
        handler.total() >= 4
    })
    .await;
    assert!(health.is_running());
    Running {
        handler,
        health,
        stop,
        run,
    }
}

/// After the outage: the pool still runs, finishes every job, and no job ran twice (each
/// outcome was recorded within its lease, however long the store failed).
async fn finish(store: &Store, r: Running) {
    assert!(
        !r.run.is_finished(),
        "the pool ended during the outage: {:?}",
        r.run.await
    );
    assert!(r.health.is_running());
    until("every job succeeded", Duration::from_secs(60), async || {
        succeeded(store).await == JOBS as u64
    })
    .await;
    assert!(r.health.is_running());
    assert_eq!(r.health.claim_failures(), 0, "claims work again");
    r.stop.cancel();
    let summary = r.run.await.unwrap().unwrap();
    assert!(!r.health.is_running(), "the pool reports that it stopped");
    let calls = r.handler.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), JOBS);
    assert!(
        calls.values().all(|n| *n == 1),
        "a job ran twice: {calls:?}"
    );
    assert_eq!(summary.succeeded, JOBS as u64, "{summary:?}");
}

/// SQLite on a disk that fails every write for 3 s: claims, completions and heartbeats fail
/// meanwhile (and the writer connection is reopened after the failed commits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_outlives_a_failing_disk_and_finishes_every_job() {
    let _one = FAULT.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display()))
        .await
        .unwrap();
    let r = start(&store).await;
    let fault = redrive_testkit::DiskFault::engage();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = succeeded(&store).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        succeeded(&store).await,
        before,
        "nothing could be written meanwhile"
    );
    assert!(before < JOBS as u64);
    assert!(!r.run.is_finished(), "the pool ended during the outage");
    fault.lift();
    finish(&store, r).await;
}

/// Drops the test's role and schema, also when the test fails (on a thread of its own: drop
/// cannot wait for the database).
struct DropRole {
    url: String,
    name: String,
}

impl Drop for DropRole {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            use sqlx::Executor;
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let admin = sqlx::PgPool::connect(&url).await.unwrap();
                for sql in [
                    format!("ALTER ROLE {name} NOLOGIN"),
                    format!(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = '{name}'"
                    ),
                    format!("DROP SCHEMA IF EXISTS {name} CASCADE"),
                    format!("DROP OWNED BY {name}"),
                    format!("DROP ROLE {name}"),
                ] {
                    if let Err(e) = admin.execute(sqlx::AssertSqlSafe(sql.clone())).await {
                        eprintln!("cleanup: {sql}: {e}");
                    }
                }
            });
        })
        .join();
    }
}

/// PostgreSQL that refuses this worker for 3 s: its role may not log in and its connections
/// are terminated (as in a failover or a restart of the server), then it is let in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_outlives_a_postgres_outage_and_finishes_every_job() {
    use sqlx::Executor;
    let _one = FAULT.lock().await;
    let url = redrive_testkit::postgres_url();
    if !redrive_testkit::postgres_available(&url).await {
        return;
    }
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let name = format!(
        "rdt_outage_{}_{}",
        std::process::id(),
        chrono::Utc::now().timestamp_micros() % 1_000_000
    );
    admin
        .execute(sqlx::AssertSqlSafe(format!("CREATE ROLE {name} LOGIN")))
        .await
        .unwrap();
    let _cleanup = DropRole {
        url: url.clone(),
        name: name.clone(),
    };
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO {name}', current_database()); END $$"
        )))
        .await
        .unwrap();
    // The same server and database, as the role of its own.
    let (scheme_host, db) = url.rsplit_once('/').unwrap();
    let host = scheme_host
        .rsplit_once('@')
        .map_or(scheme_host.trim_start_matches("postgres://"), |(_, h)| h);
    let role_url = format!("postgres://{name}@{host}/{db}");
    let pg = redrive_store::PgStore::connect(&role_url, Some(&name), 8)
        .await
        .unwrap();
    let store = Store::Postgres(pg.clone());

    let r = start(&store).await;
    let kill = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = '{name}'"
    );
    admin
        .execute(sqlx::AssertSqlSafe(format!("ALTER ROLE {name} NOLOGIN")))
        .await
        .unwrap();
    let done = format!("SELECT count(*) FROM {name}.redrive_jobs WHERE state = 'succeeded'");
    let mut counts = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < end {
        admin
            .execute(sqlx::AssertSqlSafe(kill.clone()))
            .await
            .unwrap();
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(done.clone()))
            .fetch_one(&admin)
            .await
            .unwrap();
        counts.push(n);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        counts.first(),
        counts.last(),
        "nothing could be written meanwhile"
    );
    assert!(counts[0] < JOBS as i64);
    assert!(!r.run.is_finished(), "the pool ended during the outage");
    admin
        .execute(sqlx::AssertSqlSafe(format!("ALTER ROLE {name} LOGIN")))
        .await
        .unwrap();
    finish(&store, r).await;
    drop(store);
    pg.pool().close().await;
}
