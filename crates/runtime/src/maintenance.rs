//! The worker's housekeeping beside the claim loop: the pruner (retention of finished jobs)
//! and the scheduler (periodic jobs). Both run as tasks of their own, so neither ever delays
//! a claim of this process; both read time from the worker's clock.
//!
//! - **Pruner**: one per fleet at a time, by the store's lease [`PRUNER_LEASE`]. Every
//!   [`Retention::every`] the worker that holds (or takes) the lease deletes finished jobs
//!   older than their state's age, in batches of [`Retention::batch`], oldest first, renewing
//!   the lease before each batch. After each batch it rests [`Retention::rest_factor`] times
//!   as long as the batch took (at least [`Retention::rest_min`]), so that pruning takes at
//!   most about 1 / (1 + factor) of the store's time and claims of every process get the
//!   database in between. A pruner that crashes leaves its lease to run out.
//! - **Scheduler**: every worker runs one; they may all fire the same tick, and the store
//!   makes that one job ([`Store::fire_schedules`]). It wakes at the next tick of any schedule,
//!   and at least every [`SCHEDULER_CHECK`] to see schedules added by other processes.

use std::time::Duration;

use redrive_policy::Timestamp;
use redrive_store::{
    Clock, FINISHED_STATES, JobState, PRUNE_BATCH, PRUNER_LEASE, Pruned, Store, StoreError,
};
use tokio_util::sync::CancellationToken;

use crate::db::Db;
use crate::metrics;

/// How long finished jobs are kept, and how the pruner paces itself.
///
/// ```
/// use std::time::Duration;
/// let r = redrive_runtime::Retention::default();
/// assert_eq!(r.succeeded, Some(Duration::from_secs(7 * 86_400)));
/// assert_eq!(r.dead, Some(Duration::from_secs(30 * 86_400)));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Retention {
    /// Age after which succeeded jobs go (`None`: kept for ever). Default 7 days.
    pub succeeded: Option<Duration>,
    /// Age after which cancelled jobs go. Default 7 days.
    pub cancelled: Option<Duration>,
    /// Age after which dead jobs go. Default 30 days.
    pub dead: Option<Duration>,
    /// How often a round of pruning starts. Default 1 minute.
    pub every: Duration,
    /// Jobs per batch (one short transaction each). Default [`PRUNE_BATCH`].
    pub batch: u32,
    /// The rest after a batch, as a multiple of the time it took. Default 4 (pruning takes at
    /// most about a fifth of the store's time).
    pub rest_factor: u32,
    /// The shortest rest after a batch. Default 5 ms.
    pub rest_min: Duration,
    /// How long the pruner's lease lasts without renewal. Default 2 minutes.
    pub lease: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 86_400;
        Self {
            succeeded: Some(Duration::from_secs(7 * DAY)),
            cancelled: Some(Duration::from_secs(7 * DAY)),
            dead: Some(Duration::from_secs(30 * DAY)),
            every: Duration::from_secs(60),
            batch: PRUNE_BATCH,
            rest_factor: 4,
            rest_min: Duration::from_millis(5),
            lease: Duration::from_secs(120),
        }
    }
}

impl Retention {
    /// The age of one finished state (`None` for a state that is kept, or not finished).
    pub fn age(&self, state: JobState) -> Option<Duration> {
        match state {
            JobState::Succeeded => self.succeeded,
            JobState::Cancelled => self.cancelled,
            JobState::Dead => self.dead,
            _ => None,
        }
    }

    /// The states to prune at `now` and the finish time before which each goes.
    pub fn cutoffs(&self, now: Timestamp) -> Vec<(JobState, Timestamp)> {
        FINISHED_STATES
            .iter()
            .filter_map(|&st| {
                let age = chrono::Duration::from_std(self.age(st)?).ok()?;
                Some((st, now.checked_sub_signed(age)?))
            })
            .collect()
    }
}

/// How often at least a scheduler looks at the store's schedules.
pub const SCHEDULER_CHECK: Duration = Duration::from_secs(1);

/// Deletes every finished job older than its cutoff, in batches of `r.batch` resting between
/// them as `r` says, until none is left, `stop` is cancelled, or (with a `holder`) the lease
/// [`PRUNER_LEASE`] cannot be renewed before a batch. Returns what went per state (states
/// with nothing pruned included). Counts `redrive_pruned_total{state}`.
///
/// # Errors
/// The store's.
pub async fn prune(
    store: &Store,
    r: &Retention,
    cutoffs: &[(JobState, Timestamp)],
    holder: Option<(&str, &dyn Clock)>,
    stop: &CancellationToken,
) -> Result<Vec<(JobState, Pruned)>, StoreError> {
    let db = Db::new(store.clone(), None);
    prune_on(&db, r, cutoffs, holder, stop).await
}

async fn prune_on(
    db: &Db,
    r: &Retention,
    cutoffs: &[(JobState, Timestamp)],
    holder: Option<(&str, &dyn Clock)>,
    stop: &CancellationToken,
) -> Result<Vec<(JobState, Pruned)>, StoreError> {
    let mut out = Vec::new();
    let batch = r.batch.clamp(1, redrive_store::MAX_BATCH as u32);
    'states: for &(state, before) in cutoffs {
        let mut total = Pruned::default();
        loop {
            if stop.is_cancelled() {
                out.push((state, total));
                break 'states;
            }
            if let Some((name, clock)) = holder {
                let (name, now, ttl) = (name.to_owned(), clock.now(), r.lease);
                let held = db
                    .run(move |s| async move {
                        s.acquire_lease(PRUNER_LEASE, &name, ttl, now).await
                    })
                    .await?;
                if !held {
                    tracing::info!("the pruner's lease went to another process; stopping");
                    out.push((state, total));
                    break 'states;
                }
            }
            let started = tokio::time::Instant::now();
            let p = db
                .run(move |s| async move { s.prune_batch(state, before, batch).await })
                .await?;
            metrics::pruned(state.as_str(), p.jobs);
            total.add(p);
            if p.jobs < u64::from(batch) {
                break;
            }
            let rest = (started.elapsed() * r.rest_factor).max(r.rest_min);
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(rest) => {}
            }
        }
        out.push((state, total));
    }
    Ok(out)
}

/// The pruner task of a worker: a round every `r.every` while it holds the fleet's lease.
pub(crate) async fn pruner(
    db: Db,
    r: Retention,
    holder: String,
    clock: std::sync::Arc<dyn Clock>,
    stop: CancellationToken,
) {
    loop {
        let now = clock.now();
        let (name, ttl) = (holder.clone(), r.lease);
        match db
            .run(move |s| async move { s.acquire_lease(PRUNER_LEASE, &name, ttl, now).await })
            .await
        {
            Ok(true) => {
                let cutoffs = r.cutoffs(now);
                match prune_on(&db, &r, &cutoffs, Some((&holder, &*clock)), &stop).await {
                    Ok(done) => {
                        let jobs: u64 = done.iter().map(|(_, p)| p.jobs).sum();
                        if jobs > 0 {
                            tracing::info!(jobs, "pruned finished jobs");
                        }
                    }
                    Err(e) => tracing::warn!("pruning failed: {e}"),
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("taking the pruner's lease failed: {e}"),
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(r.every) => {}
        }
    }
    let name = holder.clone();
    let _ = db
        .run(move |s| async move { s.release_lease(PRUNER_LEASE, &name).await })
        .await;
}

/// The scheduler task of a worker: fires due schedules at each tick (see the module docs).
pub(crate) async fn scheduler(
    db: Db,
    check: Duration,
    clock: std::sync::Arc<dyn Clock>,
    stop: CancellationToken,
) {
    let check = check.max(Duration::from_millis(1));
    loop {
        let now = clock.now();
        match db
            .run(move |s| async move { s.fire_schedules(now).await })
            .await
        {
            Ok(fired) => {
                for f in fired.iter().filter(|f| f.created) {
                    metrics::scheduled(&f.schedule);
                    tracing::debug!(schedule = %f.schedule, tick = %f.tick, job = f.job_id, "scheduled job");
                }
            }
            Err(e) => tracing::warn!("firing schedules failed: {e}"),
        }
        let next = db
            .run(|s| async move { s.next_schedule_tick().await })
            .await
            .ok()
            .flatten();
        // Sleep until the next tick; a tick still due after firing (a schedule that cannot
        // fire, a store error) is looked at again after `check`, not in a busy loop.
        let wait = next
            .and_then(|t| (t - clock.now()).to_std().ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(check)
            .clamp(Duration::from_millis(1), check);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoffs_follow_the_ages_and_skip_kept_states() {
        let now = redrive_store::from_millis(40 * 86_400_000);
        let day = |d: i64| redrive_store::from_millis(d * 86_400_000);
        let r = Retention::default();
        assert_eq!(
            r.cutoffs(now),
            [
                (JobState::Succeeded, day(33)),
                (JobState::Cancelled, day(33)),
                (JobState::Dead, day(10)),
            ]
        );
        let r = Retention {
            cancelled: None,
            dead: Some(Duration::from_secs(3600)),
            ..Retention::default()
        };
        assert_eq!(
            r.cutoffs(now),
            [
                (JobState::Succeeded, day(33)),
                (
                    JobState::Dead,
                    redrive_store::from_millis(40 * 86_400_000 - 3_600_000)
                ),
            ]
        );
        assert_eq!(r.age(JobState::Running), None);
    }
}
