//! `redrive work`: run workers over the queues, with the built-in kinds `noop` and `http`
//! (`--kind` picks some of them). A worker claims only the kinds it runs: jobs of other kinds
//! wait for a worker that runs them (your own, built with `redrive-runtime`).
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
use redrive_runtime::{LivePolicies, Noop, Summary, Worker, WorkerBuilder};
use tokio_util::sync::CancellationToken;

use crate::args::{Global, WorkArgs};
use crate::cmd::queue::{block_on, open_durable};
use crate::error::usage;
use crate::policies;

/// The kinds `redrive work` and `redrive serve --workers` can run.
pub(crate) const BUILTIN_KINDS: [&str; 2] = ["noop", "http"];

/// The built-in kinds chosen by `--kind` (none given: all of them); a kind that is not
/// built in is a usage error naming it.
pub(crate) fn chosen_kinds(kinds: &[String]) -> anyhow::Result<Vec<&'static str>> {
    if kinds.is_empty() {
        return Ok(BUILTIN_KINDS.to_vec());
    }
    kinds
        .iter()
        .map(|k| {
            BUILTIN_KINDS.iter().copied().find(|b| b == k).ok_or_else(|| {
                usage(format!(
                    "--kind: {k:?} is not a kind this command runs (it runs {}); run your own kinds with a worker built on the redrive-runtime library",
                    BUILTIN_KINDS.join(", ")
                ))
            })
        })
        .collect()
}

/// Registers the handlers of the chosen built-in kinds: the worker claims only those.
pub(crate) fn with_builtin_handlers(
    mut b: WorkerBuilder,
    kinds: &[&str],
    http: HttpJob,
) -> WorkerBuilder {
    if kinds.contains(&"noop") {
        b = b.handler("noop", Arc::new(Noop));
    }
    if kinds.contains(&"http") {
        b = b.handler("http", Arc::new(http));
    }
    b
}

pub(crate) fn run(global: &Global, a: WorkArgs) -> anyhow::Result<ExitCode> {
    // The metrics listener has no token: beyond loopback only when asked for, as `serve`.
    if let Some(addr) = a.metrics_addr
        && !addr.ip().is_loopback()
    {
        if !a.metrics_public {
            return Err(usage(format!(
                "--metrics-addr: refusing to serve /metrics without authentication on {addr}; use a loopback address (127.0.0.1:9090) or add --metrics-public"
            )));
        }
        tracing::warn!(
            %addr,
            "serving /metrics without authentication beyond loopback (--metrics-public)"
        );
    }
    let kinds = chosen_kinds(&a.kinds)?;
    // A `--policies` file is checked before a database is opened; the policies run are
    // resolved once it is (the file, else the stored version, else built-in).
    policies::load_for_workers(global, &a.egress)?;
    let clock = crate::clock::ClockSetup::from_env()?;
    redrive_store::labels::set_max_labels(a.metrics_max_labels);
    block_on(async move {
        if let Some(addr) = a.metrics_addr {
            redrive_runtime::metrics::prometheus_builder()
                .context("configuring the Prometheus histograms")?
                .with_http_listener(addr)
                .install()
                .with_context(|| format!("serving metrics on {addr}"))?;
            redrive_runtime::metrics::describe();
            eprintln!("metrics on http://{addr}/metrics");
        }
        let store = open_durable(global, "work").await?;
        let (source, label, latest) = crate::policy_watch::start(global, &store).await?;
        let (set, egress) = source.for_workers(&a.egress)?;
        let http = HttpJob::with_egress(StatusTable::default(), egress)?;
        let alerts = source.alerts()?;
        let live = LivePolicies::new(set.clone()).with_label(label);
        // A new stored version reaches this process's workers while they run.
        let watch_stop = CancellationToken::new();
        let watch = crate::policy_watch::spawn(
            store.clone(),
            live.clone(),
            source.clone(),
            latest.map(|v| v.version),
            watch_stop.clone(),
        );
        let _stop_watch = watch_stop.clone().drop_guard();
        let store_for_schedules = store.clone();
        let alert_store = store.clone();
        let alert_set = set;
        let worker = with_builtin_handlers(Worker::builder(store, a.queues.clone()), &kinds, http)
            .live_policies(live)
            .concurrency(a.concurrency as usize)
            .shutdown_grace(a.shutdown_grace)
            .lease(a.lease)
            .fail_closed(a.fail_closed)
            .max_jobs(a.max_jobs)
            // Times written to shared rows in the database's clock (R24).
            .clock(clock.local)
            .sync_clock(clock.sync)
            // The gauges that need the database, from the pool's loop (one task).
            .gauge_interval(Some(a.metrics_refresh));
        let worker = crate::cmd::schedule::housekeeping(worker, &a.housekeeping).build()?;
        crate::cmd::schedule::upsert_file_schedules(&source, &store_for_schedules).await?;
        let total: Summary = if a.until_idle {
            let mut total = worker.run_until_idle().await?;
            if a.max_jobs.is_none() {
                wait_for_leased(
                    &worker,
                    &alert_store,
                    &a.queues,
                    &kinds,
                    a.until_idle_wait,
                    &mut total,
                )
                .await?;
            }
            // One look for alert events at the end (their jobs run at the next `work`).
            if !alerts.is_empty() {
                let mut alerter =
                    redrive_http::alerts::Alerter::new(alerts, alert_set, chrono::Utc::now());
                alerter.tick(&alert_store, chrono::Utc::now()).await?;
            }
            total
        } else {
            let stop = CancellationToken::new();
            tokio::spawn(signals(stop.clone()));
            policies::spawn_alerts(alert_store, alerts, alert_set, stop.clone());
            worker.run(stop).await?
        };
        watch_stop.cancel();
        let _ = watch.await;
        outln!(
            "succeeded {}, dead {}, deferred {}, released {}, lease lost {}, attempts {}, claims {} ({} empty)",
            total.succeeded,
            total.dead,
            total.deferred,
            total.released,
            total.lease_lost,
            total.attempts,
            total.claims,
            total.empty_claims
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// The jobs of these queues (all when empty) and kinds that are leased (running) by any
/// process: how many (of the first 1,000 running jobs), and the latest lease expiry.
async fn leased_jobs(
    store: &redrive_store::Store,
    queues: &[String],
    kinds: &[&str],
) -> anyhow::Result<(usize, Option<redrive_store::Timestamp>)> {
    let page = store
        .list(&redrive_store::ListParams {
            state: Some(redrive_store::JobState::Running),
            queue: (queues.len() == 1).then(|| queues[0].clone()),
            limit: Some(1000),
            ..Default::default()
        })
        .await?;
    let mine: Vec<_> = page
        .jobs
        .iter()
        .filter(|j| queues.is_empty() || queues.contains(&j.queue))
        .filter(|j| kinds.contains(&j.kind.as_str()))
        .collect();
    Ok((
        mine.len(),
        mine.iter().filter_map(|j| j.lease_expires_at).max(),
    ))
}

/// `--until-idle` after the queue looked idle: while jobs of these queues and kinds are
/// leased by another process (one still running them, or one that was killed), waits — at
/// most `bound` — and runs again, so that a killed worker's jobs are rescued when their
/// lease expires and run here. Says so on standard error when it waits, and when it gives
/// up with jobs still leased.
async fn wait_for_leased(
    worker: &Worker,
    store: &redrive_store::Store,
    queues: &[String],
    kinds: &[&str],
    bound: std::time::Duration,
    total: &mut Summary,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        let (n, last_expiry) = leased_jobs(store, queues, kinds).await?;
        if n == 0 {
            return Ok(());
        }
        let waited = started.elapsed();
        if waited >= bound {
            eprintln!(
                "redrive: {n} job(s) still leased by another process after waiting {} \
                 (--until-idle-wait); they go back to the queue when their lease expires",
                redrive_policy::format_duration(waited)
            );
            return Ok(());
        }
        if !said {
            let expiry = last_expiry
                .map(|t| format!(", the last lease expires at {}", t.to_rfc3339()))
                .unwrap_or_default();
            eprintln!(
                "redrive: waiting for {n} job(s) leased by another process{expiry} \
                 (at most {})",
                redrive_policy::format_duration(bound)
            );
            said = true;
        }
        tokio::time::sleep(LEASED_POLL.min(bound - waited)).await;
        total.add(worker.run_until_idle().await?);
    }
}

/// How often `--until-idle` looks again at jobs leased by another process.
const LEASED_POLL: std::time::Duration = std::time::Duration::from_millis(500);

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
