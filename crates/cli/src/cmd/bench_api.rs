//! `redrive bench --api-batch`: enqueue throughput through the HTTP API, the way a billing run
//! would send it. The service runs in this process (the same router and connection handling as
//! `redrive serve`) on a temporary database of `--db`'s backend, listening on 127.0.0.1; the
//! clients send keyed `noop` jobs as `POST /v1/jobs/batch` requests of
//! [`MAX_BATCH_JOBS`] over real HTTP/1.1 connections. The bodies are built before the clock
//! starts (the figure is the service's, not the client's JSON encoder); every answer must be
//! 201, and the database must hold every job at the end.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use redrive_service::{AppConfig, AppState, MAX_BATCH_JOBS};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cmd::bench::{cleanup, scratch};
use crate::out::outln;

/// Clients sending at once unless `--producers` says: one request is parsed and validated
/// while the other's transaction commits.
pub(crate) const DEFAULT_CLIENTS: u32 = 2;

/// Timed runs, each on a fresh database; the median is reported.
const RUNS: u32 = 5;

/// What `redrive bench --api-batch` measured.
#[derive(Debug, Serialize)]
struct ApiBatchReport {
    backend: &'static str,
    jobs: u64,
    batch_size: usize,
    clients: u32,
    payload_bytes: usize,
    /// Jobs per second of each run, in order.
    runs_jobs_per_s: Vec<f64>,
    median_jobs_per_s: f64,
}

/// The request bodies of one run: `jobs` keyed noop jobs in batches of [`MAX_BATCH_JOBS`].
fn bodies(jobs: u64, payload: &Value) -> Vec<Vec<u8>> {
    let jobs = usize::try_from(jobs).unwrap_or(usize::MAX);
    (0..jobs)
        .step_by(MAX_BATCH_JOBS)
        .map(|start| {
            let end = (start + MAX_BATCH_JOBS).min(jobs);
            let batch: Vec<Value> = (start..end)
                .map(|i| {
                    json!({"queue": "bench", "kind": "noop", "key": format!("bench-{i}"),
                           "payload": payload})
                })
                .collect();
            serde_json::to_vec(&json!({ "jobs": batch })).unwrap_or_default()
        })
        .collect()
}

/// One run: a fresh database and service, `bodies` sent by `clients` tasks; jobs/s.
async fn one_run(
    db: &str,
    n: u32,
    bodies: Arc<Vec<Vec<u8>>>,
    jobs: u64,
    clients: u32,
) -> anyhow::Result<(f64, &'static str)> {
    let s = scratch(db, n).await?;
    let store = s.store.clone();
    let backend = store.backend();
    let state = AppState::new(store.clone(), AppConfig::default()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/jobs/batch", listener.local_addr()?);
    let stop = CancellationToken::new();
    let server = tokio::spawn(redrive_service::serve_listener_quietly(
        listener,
        state,
        stop.clone().cancelled_owned(),
    ));
    let client = reqwest::Client::builder().no_proxy().build()?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, bodies, next) =
            (client.clone(), url.clone(), bodies.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(body) = bodies.get(i) else {
                    return anyhow::Ok(());
                };
                let res = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await?;
                let status = res.status();
                let text = res.bytes().await?;
                anyhow::ensure!(
                    status == reqwest::StatusCode::CREATED,
                    "POST /v1/jobs/batch answered {status}: {}",
                    String::from_utf8_lossy(&text)
                );
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let secs = t.elapsed().as_secs_f64();
    stop.cancel();
    server.await??;
    let stored: u64 = store
        .counts()
        .await?
        .iter()
        .filter(|c| c.queue == "bench")
        .map(|c| c.count)
        .sum();
    anyhow::ensure!(
        stored == jobs,
        "the database holds {stored} of the {jobs} jobs sent"
    );
    cleanup(s).await;
    Ok((jobs as f64 / secs.max(1e-9), backend))
}

/// `redrive bench --api-batch`: see the module's doc.
pub(crate) async fn run(
    db: &str,
    jobs: u64,
    clients: u32,
    payload: Value,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let payload_bytes = payload.to_string().len();
    let bodies = Arc::new(bodies(jobs, &payload));
    let mut rates = Vec::new();
    let mut backend = "sqlite";
    for n in 0..RUNS {
        let (rate, b) = one_run(db, n, bodies.clone(), jobs, clients).await?;
        backend = b;
        if !json {
            eprintln!("run {}: {rate:.0} jobs/s", n + 1);
        }
        rates.push(rate);
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let report = ApiBatchReport {
        backend,
        jobs,
        batch_size: MAX_BATCH_JOBS,
        clients,
        payload_bytes,
        median_jobs_per_s: sorted[sorted.len() / 2],
        runs_jobs_per_s: rates,
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let runs: Vec<String> = report
            .runs_jobs_per_s
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect();
        outln!(
            "api-batch ({}): {} keyed noop jobs as POST /v1/jobs/batch of {}, {} client(s), over HTTP on 127.0.0.1",
            report.backend,
            report.jobs,
            report.batch_size,
            report.clients
        );
        outln!(
            "  enqueue jobs/s: {} · median {:.0}",
            runs.join(" · "),
            report.median_jobs_per_s
        );
    }
    Ok(ExitCode::SUCCESS)
}
