//! `redrive work`: run workers over the queues, with the built-in kinds `noop` and `http`.
//!
//! SIGINT or SIGTERM starts a graceful shutdown: no more claims, running attempts get the
//! grace period to finish, jobs waiting to retry are handed back for their planned time, and
//! whatever still runs after the grace period is interrupted and released (the attempt not
//! counted). A second signal exits at once; the leases then expire and are rescued.

use crate::out::outln;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use redrive_http::HttpJob;
use redrive_policy::StatusTable;
use redrive_runtime::{Noop, Summary, Worker};
use tokio_util::sync::CancellationToken;

use crate::args::{Global, WorkArgs};
use crate::cmd::queue::{block_on, open};
use crate::policies;

pub(crate) fn run(global: &Global, a: WorkArgs) -> anyhow::Result<ExitCode> {
    let (set, egress) = policies::load_for_workers(global, &a.egress)?;
    let http = HttpJob::with_egress(StatusTable::default(), egress)?;
    block_on(async move {
        if let Some(addr) = a.metrics_addr {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .with_http_listener(addr)
                .install()
                .with_context(|| format!("serving metrics on {addr}"))?;
            eprintln!("metrics on http://{addr}/metrics");
        }
        let store = open(global).await?;
        let store_for_schedules = store.clone();
        let worker = Worker::builder(store, a.queues.clone())
            .handler("noop", Arc::new(Noop))
            .handler("http", Arc::new(http))
            .policies(set)
            .concurrency(a.concurrency as usize)
            .shutdown_grace(a.shutdown_grace)
            .lease(a.lease)
            .max_jobs(a.max_jobs);
        let worker = crate::cmd::schedule::housekeeping(worker, &a.housekeeping).build();
        crate::cmd::schedule::upsert_file_schedules(global, &store_for_schedules).await?;
        let total: Summary = if a.until_idle {
            worker.run_until_idle().await?
        } else {
            let stop = CancellationToken::new();
            tokio::spawn(signals(stop.clone()));
            worker.run(stop).await?
        };
        outln!(
            "succeeded {}, dead {}, deferred {}, released {}, lease lost {}, attempts {}",
            total.succeeded,
            total.dead,
            total.deferred,
            total.released,
            total.lease_lost,
            total.attempts
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// First SIGINT/SIGTERM: graceful shutdown. Second: exit now.
async fn signals(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    eprintln!("shutting down: finishing running jobs (signal again to exit at once)");
    stop.cancel();
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    eprintln!("exiting at once; leases will expire and be rescued");
    std::process::exit(130);
}
