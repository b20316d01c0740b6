//! Retention: deleting completed records past their expiry.
//!
//! In-progress records are never deleted by the reaper, even past their expiry: one of them
//! may stand for a payment that was made and whose response was never stored. They are
//! counted and logged at `warn` so that a human (or a reconciliation job) finds them and calls
//! [`IdempotencyStore::recover`].

use std::sync::Arc;
use std::time::Duration;

use super::error::IdempotencyStoreError;
use super::store::{IdempotencyStore, ReapReport};

/// Default rows deleted per statement.
pub const DEFAULT_REAP_BATCH: u32 = 1000;

/// Default pause between reaper passes.
pub const DEFAULT_REAP_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// One full pass: deletes expired completed records in batches of `batch` until none is
/// left, and reports the stuck in-progress ones (from the last batch).
///
/// # Errors
/// The store's error; the records deleted before it stay deleted.
pub async fn reap_expired(
    store: &dyn IdempotencyStore,
    batch: u32,
) -> Result<ReapReport, IdempotencyStoreError> {
    let batch = batch.max(1);
    let mut total = ReapReport::default();
    loop {
        let report = store.reap(batch).await?;
        total.deleted += report.deleted;
        total.expired_in_progress = report.expired_in_progress;
        total.abandoned = report.abandoned;
        if report.deleted < u64::from(batch) {
            break;
        }
    }
    if total.expired_in_progress > 0 || total.abandoned > 0 {
        tracing::warn!(
            expired_in_progress = total.expired_in_progress,
            abandoned = total.abandoned,
            "idempotency records need explicit recovery"
        );
    }
    Ok(total)
}

/// Runs [`reap_expired`] every `interval` until the task is aborted; failures are logged and
/// retried at the next tick.
pub fn spawn_reaper(
    store: Arc<dyn IdempotencyStore>,
    interval: Duration,
    batch: u32,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match reap_expired(store.as_ref(), batch).await {
                Ok(report) => tracing::debug!(deleted = report.deleted, "idempotency reaper pass"),
                Err(e) => tracing::warn!(error = %e, "idempotency reaper pass failed"),
            }
        }
    })
}
