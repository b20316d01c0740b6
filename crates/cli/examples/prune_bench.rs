//! Benchmark of retention: pruning 1,000,000 finished jobs while workers drain, against the
//! same drain without pruning.
//!
//! 1. Seeds `--finished` (1,000,000) succeeded jobs, each with one attempt, finished 30 days
//!    ago (straight SQL, so that seeding takes seconds).
//! 2. **Without pruning:** enqueues `--jobs` (200,000) `noop` jobs and drains them with a
//!    runtime worker of `--concurrency` (32), no pruner: jobs per second.
//! 3. **With pruning:** enqueues as many again and drains them with the same worker, now
//!    with the worker's pruner on (the defaults: batches of 500, resting 4× each batch's
//!    time), which starts on the 1,000,000 old jobs as the drain starts. Reports the drain's
//!    jobs per second, its ratio to step 2 (the target is at least 0.8), and how many old
//!    jobs (and attempts) the pruner deleted during the drain; then lets the pruner finish
//!    and reports its total time.
//!
//! It never touches your data: SQLite runs in a temporary file, PostgreSQL (`--db
//! postgres://…`) in a temporary schema that is dropped afterwards.
//!
//! ```sh
//! cargo run --release -p redrive-cli --example prune_bench
//! cargo run --release -p redrive-cli --example prune_bench -- --db postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! Flags: `--db URL`, `--finished N`, `--jobs N`, `--concurrency N`, `--json`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use redrive_runtime::{Noop, Retention, Worker};
use redrive_store::{JobState, NewJob, PgStore, Store};
use serde_json::json;

struct Args {
    db: String,
    finished: u64,
    jobs: u64,
    concurrency: usize,
    json: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        db: "sqlite".into(),
        finished: 1_000_000,
        jobs: 200_000,
        concurrency: 32,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--db" => a.db = value()?,
            "--finished" => a.finished = value()?.parse().context("--finished")?,
            "--jobs" => a.jobs = value()?.parse().context("--jobs")?,
            "--concurrency" => a.concurrency = value()?.parse().context("--concurrency")?,
            "--json" => a.json = true,
            other => bail!("unknown flag {other:?}"),
        }
    }
    Ok(a)
}

const DAY_MS: i64 = 86_400_000;

async fn seed(store: &Store, n: u64, at: i64) -> anyhow::Result<()> {
    const CHUNK: u64 = 100_000;
    let mut done = 0;
    while done < n {
        let k = CHUNK.min(n - done) as i64;
        match store {
            Store::Sqlite(s) => {
                let mut tx = s.pool().begin().await?;
                sqlx::query(
                    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < $1) \
                     INSERT INTO redrive_jobs (queue, kind, payload, state, attempts, max_attempts, \
                     policy, run_at, created_at, updated_at, finished_at, result) \
                     SELECT 'old', 'noop', '{}', 'succeeded', 1, 15, 'payment', $2, $2, $2, $2 + x, 'null' FROM c",
                )
                .bind(k)
                .bind(at)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO redrive_attempts (job_id, number, replay, lease_token, worker, \
                     started_at, duration_ms, class, counted) \
                     SELECT id, 1, 0, 1, 'seed', run_at, 1, 'success', TRUE FROM redrive_jobs \
                     WHERE id > (SELECT COALESCE(MAX(job_id), 0) FROM redrive_attempts) AND queue = 'old'",
                )
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
            Store::Postgres(s) => {
                let mut tx = s.pool().begin().await?;
                sqlx::query(
                    "INSERT INTO redrive_jobs (queue, kind, payload, state, attempts, max_attempts, \
                     policy, run_at, created_at, updated_at, finished_at, result) \
                     SELECT 'old', 'noop', '{}', 'succeeded', 1, 15, 'payment', $2, $2, $2, $2 + x, 'null' \
                     FROM generate_series(1, $1) AS x",
                )
                .bind(k)
                .bind(at)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO redrive_attempts (job_id, number, replay, lease_token, worker, \
                     started_at, duration_ms, class, counted) \
                     SELECT id, 1, 0, 1, 'seed', run_at, 1, 'success', TRUE FROM redrive_jobs \
                     WHERE id > (SELECT COALESCE(MAX(job_id), 0) FROM redrive_attempts) AND queue = 'old'",
                )
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
        }
        done += k as u64;
    }
    if let Store::Postgres(s) = store {
        sqlx::query("ANALYZE").execute(s.pool()).await?;
    }
    Ok(())
}

async fn enqueue(store: &Store, n: u64) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    let mut left = n;
    while left > 0 {
        let k = left.min(5_000);
        let batch: Vec<NewJob> = (0..k)
            .map(|_| NewJob::new("bench", "noop", json!({})))
            .collect();
        store.enqueue_many(&batch, now).await?;
        left -= k;
    }
    Ok(())
}

/// Drains the queue with a worker; jobs per second.
async fn drain(
    store: &Store,
    n: u64,
    c: usize,
    retention: Option<Retention>,
) -> anyhow::Result<f64> {
    let w = Worker::builder(store.clone(), vec!["bench".into()])
        .handler("noop", Arc::new(Noop))
        .concurrency(c)
        .gauge_interval(None)
        .scheduler(None)
        .retention(retention)
        .name("bench-worker")
        .build()?;
    let t = Instant::now();
    let s = w.run_until_idle().await?;
    let secs = t.elapsed().as_secs_f64();
    if s.succeeded != n {
        bail!("drained {} of {n}", s.succeeded);
    }
    Ok(n as f64 / secs)
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let a = args()?;
    let dir = tempfile::tempdir()?;
    let (store, pg) = if a.db.starts_with("postgres") {
        let schema = format!("prune_bench_{}", std::process::id());
        let pg = PgStore::connect(&a.db, Some(&schema), 32).await?;
        (Store::Postgres(pg.clone()), Some(pg))
    } else {
        let url = format!("sqlite:{}", dir.path().join("bench.db").display());
        (Store::connect(&url).await?, None)
    };
    let now = chrono::Utc::now().timestamp_millis();
    let t = Instant::now();
    seed(&store, a.finished, now - 30 * DAY_MS).await?;
    let seed_s = t.elapsed().as_secs_f64();
    eprintln!("seeded {} finished jobs in {seed_s:.1}s", a.finished);

    enqueue(&store, a.jobs).await?;
    let base = drain(&store, a.jobs, a.concurrency, None).await?;
    eprintln!("drain without pruning: {base:.0} jobs/s");

    enqueue(&store, a.jobs).await?;
    let old = |s: Store| async move {
        s.prune_preview(
            JobState::Succeeded,
            chrono::Utc::now() - chrono::Duration::days(7),
        )
        .await
    };
    let before = old(store.clone()).await?;
    let retention = Retention::default();
    let with = drain(&store, a.jobs, a.concurrency, Some(retention.clone())).await?;
    let after = old(store.clone()).await?;
    let pruned_during = before.jobs - after.jobs;
    eprintln!(
        "drain while pruning: {with:.0} jobs/s ({:.2} of the drain without); {pruned_during} old jobs pruned meanwhile",
        with / base
    );
    // The rest of the pruning, alone, with the same pacing.
    let t = Instant::now();
    let cutoffs = retention.cutoffs(chrono::Utc::now());
    let rest = redrive_runtime::prune(
        &store,
        &retention,
        &cutoffs,
        None,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await?;
    let rest_s = t.elapsed().as_secs_f64();
    let rest_jobs: u64 = rest.iter().map(|(_, p)| p.jobs).sum();
    let left = old(store.clone()).await?;
    let report = json!({
        "backend": store.backend(),
        "finished_seeded": a.finished,
        "drain_jobs": a.jobs,
        "concurrency": a.concurrency,
        "drain_jobs_per_s_without_pruning": base.round(),
        "drain_jobs_per_s_while_pruning": with.round(),
        "ratio": (with / base * 1000.0).round() / 1000.0,
        "pruned_during_drain": pruned_during,
        "pruned_after_drain": rest_jobs,
        "pruning_after_drain_s": (rest_s * 10.0).round() / 10.0,
        "pruned_per_s_alone": (rest_jobs as f64 / rest_s).round(),
        "old_jobs_left": left.jobs,
        "old_attempts_left": left.attempts,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report:#}");
    }
    if let Some(pg) = pg {
        pg.drop_schema().await?;
    }
    Ok(ExitCode::SUCCESS)
}
