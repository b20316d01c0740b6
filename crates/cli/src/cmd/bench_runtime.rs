//! The runtime half of `redrive bench`: the same drain of `noop` jobs, but through
//! `redrive_runtime::Worker` (claims, one task per job, heartbeats, the decision, group-
//! committed completions) instead of the store-level loop. The yardstick: at least
//! 85% of the store-level drain.

use std::sync::Arc;
use std::time::Instant;

use redrive_runtime::{Noop, Worker};
use redrive_store::{NewJob, Store};
use serde_json::json;

/// Enqueues `jobs` noop jobs on `queue` and drains them with a worker of `concurrency`;
/// returns jobs per second of the drain.
pub(crate) async fn drain(
    store: &Store,
    queue: &str,
    jobs: u64,
    concurrency: u32,
) -> anyhow::Result<f64> {
    let batch: Vec<NewJob> = (0..5_000u64.min(jobs))
        .map(|_| NewJob::new(queue, "noop", json!({})))
        .collect();
    let mut left = jobs;
    while left > 0 {
        let n = left.min(batch.len() as u64) as usize;
        store.enqueue_many(&batch[..n], chrono::Utc::now()).await?;
        left -= n as u64;
    }
    let worker = Worker::builder(store.clone(), vec![queue.into()])
        .handler("noop", Arc::new(Noop))
        .concurrency(concurrency as usize)
        .gauge_interval(None)
        .build();
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
