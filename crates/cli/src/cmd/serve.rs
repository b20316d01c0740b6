//! `redrive serve`: the HTTP API, the dashboard and `/metrics` over the `--db` store.

use std::net::SocketAddr;
use std::process::ExitCode;

use std::sync::Arc;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusBuilder;
use redrive_http::HttpJob;
use redrive_policy::StatusTable;
use redrive_runtime::{Noop, Worker};
use redrive_service::{AppConfig, ConnLimits, ReadyCheck, ServiceConfig, ServiceError};
use tokio_util::sync::CancellationToken;

use crate::args::{Global, ServeArgs};
use crate::cmd::queue::{block_on, open};
use crate::error::usage;
use crate::policies;

pub(crate) fn run(global: &Global, a: ServeArgs) -> anyhow::Result<ExitCode> {
    let addr: SocketAddr = a.addr.parse().map_err(|_| {
        usage(format!(
            "--addr: {:?} is not an address like 127.0.0.1:8080",
            a.addr
        ))
    })?;
    let token = token(&a)?;
    redrive_service::check_exposure(&addr, token.as_deref()).map_err(|e| usage(e.to_string()))?;
    let (set, egress) = policies::load_for_workers(global, &a.egress)?;
    let http = HttpJob::with_egress(StatusTable::default(), egress)?;
    block_on(async move {
        let store = open(global).await?;
        crate::cmd::schedule::upsert_file_schedules(global, &store).await?;
        let prometheus = PrometheusBuilder::new()
            .install_recorder()
            .context("installing the Prometheus recorder")?;
        // `--workers N`: a worker pool over every queue in this process; without it the
        // service only enqueues and shows, and workers run elsewhere (`redrive work`).
        let stop = CancellationToken::new();
        let mut ready_checks = Vec::new();
        let workers = if a.workers > 0 {
            let w = Worker::builder(store.clone(), Vec::new())
                .handler("noop", Arc::new(Noop))
                .handler("http", Arc::new(http))
                .policies(set.clone())
                .concurrency(a.workers as usize);
            let w = crate::cmd::schedule::housekeeping(w, &a.housekeeping).build();
            let health = w.health();
            let run = {
                let stop = stop.clone();
                tokio::spawn(async move { w.run(stop).await })
            };
            // Ready only once the pool runs (it starts at once).
            while !health.is_running() && !run.is_finished() {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            ready_checks.push(ReadyCheck::new("workers-stopped", move || {
                if health.is_running() {
                    Ok(())
                } else {
                    Err("the in-process worker pool (--workers) is not running: accepted jobs are not run by this process".into())
                }
            }));
            Some(watch(run, stop.clone()))
        } else {
            None
        };
        let config = ServiceConfig {
            addr,
            store,
            app: AppConfig {
                token,
                policies: set,
                prometheus: Some(prometheus),
                public_hosts: a.public_hosts.clone(),
                cookie_secure: a.cookie_secure,
                metrics_public: a.metrics_public,
                connections: ConnLimits {
                    header_timeout: a.header_timeout,
                    idle_timeout: a.idle_timeout,
                    max_connections: a.max_connections as usize,
                },
                idempotency_recovery_window: Some(a.idempotency_recovery_window),
                ready_checks,
                ..AppConfig::default()
            },
        };
        let s2 = stop.clone();
        let shutdown = async move {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                },
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
            s2.cancel();
        };
        let served = redrive_service::serve(config, shutdown).await;
        stop.cancel();
        if let Some(w) = workers {
            w.await
                .context("the worker pool's watch")?
                .context("the worker pool")??;
        }
        match served {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(
                e @ (ServiceError::TokenRequired { .. }
                | ServiceError::TokenTooShort { .. }
                | ServiceError::InvalidToken { .. }
                | ServiceError::InvalidPublicHost { .. }
                | ServiceError::InvalidLimit { .. }),
            ) => Err(usage(e.to_string())),
            Err(e) => Err(e.into()),
        }
    })
}

/// The token: `--token` / `REDRIVE_API_TOKEN`, or the first line of `--token-file` (trimmed).
fn token(a: &ServeArgs) -> anyhow::Result<Option<String>> {
    let given = a.token.clone().filter(|t| !t.is_empty());
    let Some(path) = &a.token_file else {
        return Ok(given);
    };
    if given.is_some() {
        return Err(usage(
            "--token-file: give the token once, either --token-file, --token or REDRIVE_API_TOKEN",
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("--token-file: cannot read {}: {e}", path.display())))?;
    let first = text.lines().next().unwrap_or("").trim();
    if first.is_empty() {
        return Err(usage(format!(
            "--token-file: the first line of {} is empty",
            path.display()
        )));
    }
    Ok(Some(first.to_owned()))
}

type PoolRun =
    tokio::task::JoinHandle<Result<redrive_runtime::Summary, redrive_runtime::RuntimeError>>;

/// Waits for the worker pool; if it ends before shutdown was asked for (it does not end on
/// store faults, so this is a bug), says so loudly at once: the API still accepts jobs that
/// this process no longer runs, and `/readyz` answers 503 from now on.
fn watch(
    run: PoolRun,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<
    Result<Result<redrive_runtime::Summary, redrive_runtime::RuntimeError>, tokio::task::JoinError>,
> {
    tokio::spawn(async move {
        let r = run.await;
        if !stop.is_cancelled() {
            let why = match &r {
                Ok(Ok(s)) => format!("it ended after {} claims", s.finished()),
                Ok(Err(e)) => format!("it failed: {e}"),
                Err(e) => format!("it crashed: {e}"),
            };
            eprintln!(
                "redrive: the worker pool stopped while serving ({why}); jobs are no longer run by this process and /readyz answers 503"
            );
        }
        r
    })
}
