//! `redrive serve`: the HTTP API, the dashboard and `/metrics` over the `--db` store.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use redrive_http::HttpJob;
use redrive_policy::StatusTable;
use redrive_runtime::{DEFAULT_CLOCK_SYNC, DbClock, LivePolicies, Worker};
use redrive_service::{ApiToken, AppConfig, ConnLimits, ReadyCheck, ServiceConfig, ServiceError};
use redrive_store::Clock;
use tokio_util::sync::CancellationToken;

use crate::args::{Global, ServeArgs};
use crate::cmd::queue::{block_on, open_durable};
use crate::error::usage;
use crate::policies;

pub(crate) fn run(global: &Global, a: ServeArgs) -> anyhow::Result<ExitCode> {
    let addr: SocketAddr = a.addr.parse().map_err(|_| {
        usage(format!(
            "--addr: {:?} is not an address like 127.0.0.1:8080",
            a.addr
        ))
    })?;
    let tokens = tokens(&a)?;
    if tokens.is_empty() {
        redrive_service::check_exposure(&addr, None).map_err(|e| usage(e.to_string()))?;
    }
    for t in &tokens {
        redrive_service::check_exposure(&addr, Some(&t.secret))
            .map_err(|e| usage(format!("token {:?}: {e}", t.label)))?;
    }
    // A token on the command line is visible to every user of the machine (`ps`).
    if std::env::args_os()
        .filter_map(|arg| arg.into_string().ok())
        .any(|arg| arg == "--token" || arg.starts_with("--token="))
    {
        tracing::warn!(
            "--token is visible in the process list to every user of this machine; use --token-file or REDRIVE_API_TOKEN"
        );
    }
    let kinds = crate::cmd::work::chosen_kinds(&a.kinds)?;
    // A `--policies` file is checked before a database is opened; the policies run are
    // resolved once it is (the file, else the stored version, else built-in).
    policies::load_for_workers(global, &a.egress)?;
    let clock_setup = crate::clock::ClockSetup::from_env()?;
    redrive_store::labels::set_max_labels(a.metrics_max_labels);
    block_on(async move {
        let store = open_durable(global, "serve").await?;
        let (source, label, latest) = crate::policy_watch::start(global, &store).await?;
        let (set, egress) = source.for_workers(&a.egress)?;
        let http = HttpJob::with_egress(StatusTable::default(), egress)?;
        let alerts = source.alerts()?;
        let payload = source.payload()?;
        // The API and the worker pool read one set, replaced when a new version is stored.
        let live = LivePolicies::new(set.clone()).with_label(label);
        // One clock for the API's writes and the worker pool, in the database's time (R24),
        // measured before the first request and kept measured until shutdown.
        let stop = CancellationToken::new();
        let db_clock = Arc::new(DbClock::new(clock_setup.local.clone()));
        let clock: Arc<dyn Clock> = if clock_setup.sync {
            if let Err(e) = db_clock.sync(&store).await {
                tracing::warn!("measuring the clock's offset to the database failed: {e}");
            }
            db_clock
                .clone()
                .spawn_sync(store.clone(), DEFAULT_CLOCK_SYNC, stop.clone());
            db_clock.clone()
        } else {
            clock_setup.local.clone()
        };
        crate::cmd::schedule::upsert_file_schedules(&source, &store).await?;
        let policy_watch = crate::policy_watch::spawn(
            store.clone(),
            live.clone(),
            source.clone(),
            latest.map(|v| v.version),
            stop.clone(),
        );
        let prometheus = redrive_runtime::metrics::prometheus_builder()
            .context("configuring the Prometheus histograms")?
            .install_recorder()
            .context("installing the Prometheus recorder")?;
        redrive_runtime::metrics::describe();
        // `--workers N`: a worker pool in this process over the `--queue`s (default: every
        // queue) for the `--kind`s (default: the built-in ones); without it the service only
        // enqueues and shows, and workers run elsewhere (`redrive work`, your own).
        let mut ready_checks = Vec::new();
        // The gauges that need the database: one task, at `--metrics-refresh`; a scrape of
        // /metrics only renders (the worker pool below publishes none of its own).
        let gauges =
            redrive_runtime::metrics::spawn_gauges(store.clone(), a.metrics_refresh, stop.clone());
        let workers = if a.workers > 0 {
            policies::spawn_alerts(store.clone(), alerts, set.clone(), stop.clone());
            let w = crate::cmd::work::with_builtin_handlers(
                Worker::builder(store.clone(), a.queues.clone()),
                &kinds,
                http,
            )
            .live_policies(live.clone())
            .concurrency(a.workers as usize)
            .gauge_interval(None);
            let w = if clock_setup.sync {
                w.db_clock(db_clock.clone())
            } else {
                w.clock(clock_setup.local.clone())
            };
            let w = crate::cmd::schedule::housekeeping(w, &a.housekeeping).build()?;
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
                token: None,
                tokens,
                policies: set,
                live_policies: Some(live),
                prometheus: Some(prometheus),
                public_hosts: a.public_hosts.clone(),
                cookie_secure: a.cookie_secure,
                metrics_public: a.metrics_public,
                refuse_card_data: a.refuse_card_data || payload.refuse_card_data,
                connections: ConnLimits {
                    header_timeout: a.header_timeout,
                    idle_timeout: a.idle_timeout,
                    max_connections: a.max_connections as usize,
                },
                idempotency_recovery_window: Some(a.idempotency_recovery_window),
                ready_checks,
                clock: Some(clock),
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
        let _ = gauges.await;
        let _ = policy_watch.await;
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
                | ServiceError::TokenTooSimple { .. }
                | ServiceError::InvalidToken { .. }
                | ServiceError::InvalidPublicHost { .. }
                | ServiceError::InvalidLimit { .. }),
            ) => Err(usage(e.to_string())),
            Err(e) => Err(e.into()),
        }
    })
}

/// Every token: `--token` (repeatable) / `REDRIVE_API_TOKEN`, or the first line of
/// `--token-file` (trimmed), and the `--read-token`s; each `label:secret` or a plain secret.
fn tokens(a: &ServeArgs) -> anyhow::Result<Vec<ApiToken>> {
    let mut out: Vec<ApiToken> = token(a)?
        .iter()
        .map(|t| ApiToken::parse(t, false))
        .collect();
    out.extend(
        a.read_tokens
            .iter()
            .filter(|t| !t.is_empty())
            .map(|t| ApiToken::parse(t, true)),
    );
    Ok(out)
}

/// The writing tokens: `--token` / `REDRIVE_API_TOKEN`, or the first line of `--token-file`
/// (trimmed).
fn token(a: &ServeArgs) -> anyhow::Result<Vec<String>> {
    let given: Vec<String> = a.token.iter().filter(|t| !t.is_empty()).cloned().collect();
    let Some(path) = &a.token_file else {
        return Ok(given);
    };
    if !given.is_empty() {
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
    Ok(vec![first.to_owned()])
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
