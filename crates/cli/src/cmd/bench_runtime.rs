//! The runtime half of `redrive bench`: the same drain of `noop` jobs, but through
//! `redrive_runtime::Worker` (claims, one task per job, heartbeats, the decision, group-
//! committed completions) instead of the store-level loop. The yardstick: at least
//! 85% of the store-level drain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redrive_runtime::{Attempted, Handler, JobContext, MAX_CONCURRENCY, Noop, Worker};
use redrive_store::{NewJob, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Drains `jobs` noop jobs of `queue` (already there) with a worker of `concurrency` (at most
/// [`MAX_CONCURRENCY`], the worker's bound), which stops after claiming that many (a backlog
/// below them stays); returns jobs per second.
pub(crate) async fn drain(
    store: &Store,
    queue: &str,
    jobs: u64,
    concurrency: u32,
) -> anyhow::Result<f64> {
    let worker = Worker::builder(store.clone(), vec![queue.into()])
        .handler("noop", Arc::new(Noop))
        .concurrency((concurrency as usize).min(MAX_CONCURRENCY))
        .gauge_interval(None)
        .max_jobs(Some(jobs))
        .build()?;
    let t = Instant::now();
    let s = worker.run_until_idle().await?;
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        s.succeeded == jobs,
        "runtime drain: {} of {jobs} jobs succeeded",
        s.succeeded
    );
    Ok(jobs as f64 / secs.max(1e-9))
}

/// Records, for each job it runs, milliseconds from the job's `due_us` (its run_at, in the
/// payload) to the handler starting.
#[derive(Debug)]
struct Stamp(Arc<std::sync::Mutex<Vec<f64>>>);

impl Handler for Stamp {
    fn run(
        &self,
        ctx: JobContext,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Attempted> + Send>> {
        let late =
            chrono::Utc::now().timestamp_micros() - ctx.payload["due_us"].as_i64().unwrap_or(0);
        if let Ok(mut v) = self.0.lock() {
            v.push(late as f64 / 1000.0);
        }
        Box::pin(async { Attempted::success(serde_json::Value::Null) })
    }
}

/// How far ahead of now the scheduled jobs of [`scheduled_pickup`] are enqueued.
const SCHEDULED_AHEAD: Duration = Duration::from_millis(100);

/// An idle runtime worker (polling only every 5 s, so only its own due-time timer and the
/// store's wake-up can start a job sooner) and `samples` jobs enqueued one every 10 ms, each
/// due [`SCHEDULED_AHEAD`] later: milliseconds from each job's run_at to its handler starting.
pub(crate) async fn scheduled_pickup(
    store: &Store,
    queue: &str,
    samples: usize,
) -> anyhow::Result<Vec<f64>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::with_capacity(samples)));
    let worker = Worker::builder(store.clone(), vec![queue.into()])
        .handler("stamp", Arc::new(Stamp(seen.clone())))
        .concurrency(8)
        .poll_interval(Duration::from_secs(5))
        .gauge_interval(None)
        .build()?;
    let stop = CancellationToken::new();
    let run = {
        let stop = stop.clone();
        tokio::spawn(async move { worker.run(stop).await })
    };
    let produced = async {
        for _ in 0..samples {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = chrono::Utc::now();
            let due = now + SCHEDULED_AHEAD;
            store
                .enqueue(
                    &NewJob::new(queue, "stamp", json!({"due_us": due.timestamp_micros()}))
                        .run_at(due),
                    now,
                )
                .await?;
        }
        // The last job is due SCHEDULED_AHEAD after its enqueue; allow the poll interval and more.
        let deadline = Instant::now() + Duration::from_secs(30);
        while seen.lock().map_or(0, |v| v.len()) < samples {
            anyhow::ensure!(
                Instant::now() < deadline,
                "scheduled pickup: {} of {samples} jobs ran within 30 s",
                seen.lock().map_or(0, |v| v.len())
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::Ok(())
    }
    .await;
    stop.cancel();
    run.await??;
    produced?;
    let v = seen.lock().map(|v| v.clone()).unwrap_or_default();
    Ok(v)
}
