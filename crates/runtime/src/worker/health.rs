//! The pool's health for readiness checks, and the claim loop's backoff after a failed claim.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Whether a worker's pool is running, for readiness checks (`redrive serve --workers N`
/// answers `/readyz` 503 when it is not). Cheap to clone; every clone sees the same pool.
///
/// The pool counts as running from the start of [`Worker::run`](crate::Worker::run) (or
/// [`Worker::run_until_idle`](crate::Worker::run_until_idle)) until that call returns, panics or is dropped. While it runs it
/// also counts the claims that failed in a row because the store failed, so a readiness check
/// can tell a pool that waits out a store outage from one that works.
#[derive(Debug, Clone, Default)]
pub struct PoolHealth {
    inner: Arc<HealthInner>,
}

#[derive(Debug, Default)]
struct HealthInner {
    runs: AtomicUsize,
    claim_failures: AtomicU64,
    failed_tasks: AtomicU64,
}

impl PoolHealth {
    /// Whether the pool is running (a run of the worker is in progress).
    pub fn is_running(&self) -> bool {
        self.inner.runs.load(Ordering::SeqCst) > 0
    }

    /// Claims that failed in a row because the store failed (0 after a claim that worked).
    pub fn claim_failures(&self) -> u64 {
        self.inner.claim_failures.load(Ordering::SeqCst)
    }

    /// Job tasks that failed since the worker was built (each left to its lease).
    pub fn failed_tasks(&self) -> u64 {
        self.inner.failed_tasks.load(Ordering::SeqCst)
    }

    /// A claim worked: the count of failed claims in a row starts again.
    pub(super) fn claim_worked(&self) {
        self.inner.claim_failures.store(0, Ordering::SeqCst);
    }

    /// A claim failed because the store failed: the failures in a row, this one included.
    pub(super) fn claim_failed(&self) -> u64 {
        self.inner.claim_failures.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A job task failed (its job is left to its lease).
    pub(super) fn task_failed(&self) {
        self.inner.failed_tasks.fetch_add(1, Ordering::SeqCst);
    }

    /// Marks a run as started until the guard is dropped (also by a panic or an abort).
    pub(super) fn running(&self) -> RunningGuard {
        self.inner.runs.fetch_add(1, Ordering::SeqCst);
        RunningGuard(self.clone())
    }
}

/// A run in progress; its drop ends it.
pub(super) struct RunningGuard(PoolHealth);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.inner.runs.fetch_sub(1, Ordering::SeqCst);
        self.0.inner.claim_failures.store(0, Ordering::SeqCst);
    }
}

/// The claim loop's wait after a failed claim: 100 ms, doubling up to 5 s, back to 100 ms
/// after a claim that works.
#[derive(Debug)]
pub(crate) struct ClaimBackoff {
    next: Duration,
}

impl ClaimBackoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(100);
    pub(crate) const MAX: Duration = Duration::from_secs(5);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// The wait after one more failure.
    pub(crate) fn failed(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }

    /// A claim worked.
    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_backoff_doubles_to_five_seconds_and_resets() {
        let mut b = ClaimBackoff::new();
        let waits: Vec<u64> = (0..9).map(|_| b.failed().as_millis() as u64).collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000],
            "100 ms doubling, capped at 5 s"
        );
        b.reset();
        assert_eq!(b.failed(), Duration::from_millis(100));
    }

    #[test]
    fn health_counts_runs_until_their_guards_drop() {
        let h = PoolHealth::default();
        assert!(!h.is_running());
        let a = h.running();
        let b = h.clone().running();
        assert!(h.is_running());
        drop(a);
        assert!(h.is_running(), "one run is left");
        drop(b);
        assert!(!h.is_running());
    }
}
