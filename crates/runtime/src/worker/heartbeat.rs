//! The two background loops of a worker: the lease heartbeat of each claim and the worker's
//! row in the registry of live workers.

use redrive_store::{Job, Timestamp, WorkerInfo};
use tokio_util::sync::CancellationToken;

use super::{Run, Worker};

impl Worker {
    /// Registers the worker and keeps its row fresh until `stop` (registering again if the
    /// row was deleted meanwhile, e.g. after the store was unreachable for long). Failures are
    /// logged: the registry is for operators, the jobs do not depend on it.
    pub(super) fn spawn_registry(&self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let worker = self.clone();
        tokio::spawn(async move {
            let config = &worker.shared.config;
            let info = worker.info(config.clock.now());
            let mut registered = false;
            // A replacement of the policies refreshes the row at once (`redrive workers`
            // shows the version each process runs).
            let mut policies_changed = config.policies.subscribe();
            loop {
                let now = config.clock.now();
                let offset = worker.clock_offset_ms();
                let label = config.policies.label();
                let r = if registered {
                    let name = info.name.clone();
                    worker
                        .shared
                        .db
                        .run(move |s| async move {
                            s.worker_heartbeat_with(&name, now, offset, label.as_deref())
                                .await
                        })
                        .await
                } else {
                    let info = WorkerInfo {
                        clock_offset_ms: offset,
                        policy_version: label,
                        ..info.clone()
                    };
                    worker
                        .shared
                        .db
                        .run(move |s| async move { s.register_worker(&info, now).await })
                        .await
                        .map(|()| true)
                };
                match r {
                    Ok(alive) => registered = alive,
                    Err(e) => tracing::warn!("refreshing the worker's registry row failed: {e}"),
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(config.registry_heartbeat) => {}
                    Ok(()) = policies_changed.changed() => {}
                }
            }
            let name = info.name.clone();
            if let Err(e) = worker
                .shared
                .db
                .run(move |s| async move { s.unregister_worker(&name).await })
                .await
            {
                tracing::warn!("removing the worker's registry row failed: {e}");
            }
        })
    }
}

impl Run {
    /// How often a claim's lease is extended: every third of its length, or the configured
    /// interval (at most half the lease).
    pub(super) fn heartbeat_every(&self) -> std::time::Duration {
        let config = &self.shared.config;
        config
            .heartbeat
            .unwrap_or(config.lease / 3)
            .min(config.lease / 2)
    }

    /// Extends the claim's lease now and then every [`Run::heartbeat_every`] until aborted
    /// (the caller starts it once the first extension is due); cancels the `lost` tokens (the
    /// claim's and its handler's) when the lease is lost, or when the store has been
    /// unreachable for so long that the lease is about to run out.
    pub(super) fn spawn_heartbeat(
        &self,
        job: &Job,
        lost: [CancellationToken; 2],
    ) -> tokio::task::JoinHandle<()> {
        let config = &self.shared.config;
        let db = self.shared.db.clone();
        let clock = config.clock.clone();
        let lease = job.lease();
        let len = config.lease;
        let every = self.heartbeat_every();
        let mut until: Timestamp = job
            .lease_expires_at
            .unwrap_or_else(|| clock.now() + chrono::Duration::from_std(len).unwrap_or_default());
        tokio::spawn(async move {
            loop {
                let now = clock.now();
                match db
                    .run(move |s| async move { s.heartbeat(lease, len, now).await })
                    .await
                {
                    Ok(t) => until = t,
                    Err(e) if e.is_lease_lost() => {
                        lost.iter().for_each(CancellationToken::cancel);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!("heartbeat for job {} failed: {e}", lease.job_id);
                        // The store is unreachable: stop the handler before the lease runs out.
                        if clock.now() + chrono::Duration::from_std(every).unwrap_or_default()
                            >= until
                        {
                            lost.iter().for_each(CancellationToken::cancel);
                            return;
                        }
                    }
                }
                tokio::time::sleep(every).await;
            }
        })
    }
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
