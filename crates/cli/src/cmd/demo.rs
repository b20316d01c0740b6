//! `redrive demo`: the whole product in one command. Starts the PSP simulator in-process and an
//! SQLite queue in a temporary file, enqueues charges as `http` jobs (each with its own
//! idempotency key), runs the workers through a bad day at the PSP — 20% 5xx, a rate limit
//! with `Retry-After`, a 5-second outage, 5% of charges whose answer is lost after the charge
//! was made — shows progress with the live breaker state, then prints what happened and draws
//! the PSP's load over time with the open-breaker windows shaded.

use crate::out::outln;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redrive_http::HttpJob;
use redrive_policy::{BreakerConfig, Jitter, PolicySet, RetryPolicy, Window};
use redrive_psp_sim::{Faults, Outage, PspSim};
use redrive_runtime::Worker;
use redrive_sim::LoadChart;
use redrive_store::{JobState, ListParams, NewJob, Store};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::args::{DemoArgs, Global};
use crate::cmd::queue::block_on;

const QUEUE: &str = "payments";
const DEPENDENCY: &str = "psp";
const PROBES: u32 = 3;
const OUTAGE: (u64, u64) = (3, 5);
const RETRY_AFTER_S: u64 = 1;

/// The report, also printed with `--json`.
#[derive(Debug, Serialize)]
struct Report {
    charges_enqueued: u64,
    concurrency: usize,
    scenario: serde_json::Value,
    /// Whether the simulator's charges ran behind its idempotency layer (always on the bad
    /// day; with `--no-faults` only when `--sim-idempotency-layer` is given).
    sim_idempotency_layer: bool,
    seconds: f64,
    jobs_per_s: f64,
    succeeded: u64,
    dead_by_reason: BTreeMap<String, u64>,
    attempts_by_class: BTreeMap<String, u64>,
    retries_in_process: u64,
    defers: u64,
    breaker_transitions: Vec<Transition>,
    /// PSP requests that arrived while the breaker was open (100 ms slices wholly inside an
    /// open window).
    requests_while_open: u64,
    /// Attempts that followed a 429 sooner than its `Retry-After` (must be 0).
    retries_before_retry_after: u64,
    psp: Psp,
    /// Every charge made once: charges = succeeded = distinct keys, no duplicate effect.
    exactly_once: bool,
    charts: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Transition {
    t_s: f64,
    from: String,
    to: String,
    reason: String,
}

#[derive(Debug, Serialize)]
struct Psp {
    requests_total: u64,
    requests_by_status: BTreeMap<u16, u64>,
    charges: u64,
    distinct_keys: u64,
    duplicate_effects: u64,
    replays: u64,
}

fn policies() -> anyhow::Result<(PolicySet, RetryPolicy)> {
    // The payment preset, with demo-sized budgets: more attempts (every 429 is one) and a defer
    // phase in seconds instead of minutes, so the whole run fits in a minute.
    let policy = RetryPolicy::builder("demo")
        .with_max_attempts(25)
        .with_jitter(Jitter::Full)
        .with_window(Duration::from_secs(300))
        .with_defer(
            redrive_policy::Backoff::schedule(
                vec![
                    Duration::from_secs(2),
                    Duration::from_secs(5),
                    Duration::from_secs(10),
                ],
                Duration::from_secs(10),
            )?,
            Jitter::Proportional(0.2),
            3,
        )
        .with_max_exceptions(5)
        .with_blocked_jitter(Duration::from_millis(500))
        .build()?;
    let breaker = BreakerConfig::builder()
        .with_window(Window::Count { size: 40 })
        .with_minimum_calls(20)
        .with_failure_rate(0.5)
        .with_open_cooldown(Duration::from_secs(1))
        .with_half_open_probes(PROBES)
        .build()?;
    let mut set = PolicySet::builtin();
    set.insert(policy.clone());
    set.insert_breaker(DEPENDENCY, breaker);
    Ok((set, policy))
}

fn scenario(a: &DemoArgs) -> Faults {
    if a.no_faults {
        return Faults {
            seed: Some(a.seed),
            ..Faults::none()
        };
    }
    Faults {
        error_rate: 0.2,
        rate_limit: Some(80.0),
        retry_after: Some(Duration::from_secs(RETRY_AFTER_S)),
        outage: Some(Outage::new(
            Duration::from_secs(OUTAGE.0),
            Duration::from_secs(OUTAGE.1),
        )),
        latency: Duration::from_millis(10),
        timeout_after_commit: 0.05,
        timeout_delay: Duration::from_secs(2),
        seed: Some(a.seed),
        ..Faults::none()
    }
}

pub(crate) fn run(_global: &Global, a: DemoArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let dir = tempfile::tempdir().context("creating the demo's temporary folder")?;
        let db = format!("sqlite:{}", dir.path().join("demo.db").display());
        let store = Store::connect(&db).await?;
        let faults = scenario(&a);
        // The bad day needs the simulator's idempotency layer (a lost answer is replayed to
        // the retry). A healthy PSP never loses one, and its ledger still refuses a second
        // charge for a key, so `--no-faults` leaves the layer out and measures redrive, unless
        // `--sim-idempotency-layer` asks for it.
        let mut sim = PspSim::builder().faults(faults.clone());
        if !a.no_faults || a.sim_idempotency_layer {
            sim = sim.with_idempotency_layer();
        }
        let sim = sim
            .start("127.0.0.1:0")
            .await
            .context("starting the PSP simulator")?;
        let (set, policy) = policies()?;
        let url = format!("{}/v1/charges", sim.url());
        let n = a.charges;
        let jobs: Vec<NewJob> = (0..n)
            .map(|i| {
                NewJob::new(
                    QUEUE,
                    "http",
                    json!({
                        "method": "POST",
                        "url": url,
                        "headers": {"Authorization": "Bearer sk_test_demo_secret"},
                        "body": {"amount": 1000 + i, "currency": "EUR", "reference": format!("order-{i}")},
                        "timeout_ms": 1000,
                    }),
                )
                .key(format!("order-{i}"))
                .dependency(DEPENDENCY)
                .with_policy(&policy)
            })
            .collect();
        for chunk in jobs.chunks(5_000) {
            store.enqueue_many(chunk, Utc::now()).await?;
        }
        if !a.json {
            outln!(
                "redrive demo: {n} charges, {} workers, PSP simulator at {}",
                a.concurrency,
                sim.url()
            );
            if !a.no_faults {
                outln!(
                    "scenario: 20% 5xx, rate limit 80/s with Retry-After {RETRY_AFTER_S}s, outage {}s..{}s, 5% answers lost after the charge",
                    OUTAGE.0,
                    OUTAGE.0 + OUTAGE.1
                );
            }
        }

        let worker = Worker::builder(store.clone(), vec![QUEUE.into()])
            .handler("http", Arc::new(HttpJob::default()))
            .policies(set)
            .concurrency(a.concurrency)
            .gauge_interval(None)
            .poll_interval(Duration::from_millis(50))
            .seed(a.seed)
            .build();
        sim.reset();
        let t0 = Utc::now();
        let started = Instant::now();
        let stop = CancellationToken::new();
        let w = worker.clone();
        let s2 = stop.clone();
        let running = tokio::spawn(async move { w.run(s2).await });

        let bar = ProgressBar::with_draw_target(
            Some(n),
            if a.json {
                ProgressDrawTarget::hidden()
            } else {
                ProgressDrawTarget::stderr()
            },
        );
        bar.set_style(
            ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let limit = Duration::from_secs(a.timeout_s);
        let finished = loop {
            let counts = store.counts().await?;
            let done: u64 = counts
                .iter()
                .filter(|c| c.state.is_final())
                .map(|c| c.count)
                .sum();
            bar.set_position(done);
            let dep = store.dependency(DEPENDENCY).await?;
            let stats = sim.stats();
            let breaker = match &dep {
                Some(d) if d.state == "open" => {
                    let left = d
                        .open_until
                        .map(|u| (u - Utc::now()).num_milliseconds().max(0) as f64 / 1e3)
                        .unwrap_or(0.0);
                    format!("OPEN (probe in {left:.1}s)")
                }
                Some(d) if d.state == "half_open" => {
                    format!("half-open ({} probes left)", d.probe_permits)
                }
                _ => "closed".into(),
            };
            let paused = dep
                .and_then(|d| d.paused_until)
                .filter(|p| *p > Utc::now())
                .map(|_| ", paused (Retry-After)")
                .unwrap_or("");
            bar.set_message(format!(
                "breaker {breaker}{paused} | PSP {} requests, {} charges",
                stats.requests_total, stats.charges
            ));
            if done >= n {
                break true;
            }
            if started.elapsed() > limit {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let seconds = started.elapsed().as_secs_f64();
        stop.cancel();
        running.await.context("the worker task")??;
        bar.finish_and_clear();
        let stats = sim.stats();
        let report = report(&store, &a, &faults, t0, seconds, &stats).await?;
        sim.shutdown().await;

        if a.json {
            outln!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print_report(&report)?;
        }
        if !finished {
            anyhow::bail!("the demo did not finish within {}s", a.timeout_s);
        }
        if !report.exactly_once || report.succeeded != n {
            anyhow::bail!(
                "not every charge was made exactly once: {} succeeded, {} charges, {} duplicate effects",
                report.succeeded,
                report.psp.charges,
                report.psp.duplicate_effects
            );
        }
        if a.serve {
            // Keep the demo's queue on view: the dashboard over the same temporary database.
            let (set, _) = policies()?;
            let config = redrive_service::ServiceConfig {
                addr: a.addr,
                store: store.clone(),
                app: redrive_service::AppConfig {
                    token: None,
                    policies: set,
                    prometheus: None,
                },
            };
            eprintln!("dashboard: the demo's queue stays up until Ctrl-C");
            redrive_service::serve(config, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        }
        drop(dir);
        Ok(ExitCode::SUCCESS)
    })
}

async fn report(
    store: &Store,
    a: &DemoArgs,
    faults: &Faults,
    t0: chrono::DateTime<Utc>,
    seconds: f64,
    stats: &redrive_psp_sim::Stats,
) -> anyhow::Result<Report> {
    let mut succeeded = 0;
    let mut dead_by_reason = BTreeMap::new();
    let mut attempts_by_class: BTreeMap<String, u64> = BTreeMap::new();
    let (mut retries, mut defers, mut early) = (0, 0, 0);
    let mut after = None;
    loop {
        let page = store
            .list(&ListParams {
                after,
                limit: Some(1000),
                ..Default::default()
            })
            .await?;
        for j in &page.jobs {
            match j.state {
                JobState::Succeeded => succeeded += 1,
                JobState::Dead => {
                    *dead_by_reason
                        .entry(j.dead_reason.clone().unwrap_or_default())
                        .or_insert(0) += 1;
                }
                _ => {}
            }
            let atts = store.attempts(j.id).await?;
            for (i, at) in atts.iter().enumerate() {
                *attempts_by_class.entry(at.class.clone()).or_insert(0) += 1;
                match at.mode.as_deref() {
                    Some("retry") => retries += 1,
                    Some("defer") => defers += 1,
                    _ => {}
                }
                // A 429's answer came at started + duration; the next call of this job must not
                // start before that plus the Retry-After.
                if at.http_status == Some(429)
                    && let Some(next) = atts.get(i + 1)
                {
                    let answered =
                        at.started_at + chrono::Duration::milliseconds(at.duration_ms as i64);
                    let ra = chrono::Duration::seconds(RETRY_AFTER_S as i64);
                    if next.started_at + chrono::Duration::milliseconds(1) < answered + ra {
                        early += 1;
                    }
                }
            }
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let mut events = store.dependency_events(Some(DEPENDENCY), 1000).await?;
    events.reverse();
    let secs = |t: chrono::DateTime<Utc>| (t - t0).num_milliseconds() as f64 / 1e3;
    let transitions: Vec<Transition> = events
        .iter()
        .map(|e| Transition {
            t_s: secs(e.at),
            from: e.from.clone(),
            to: e.to.clone(),
            reason: e.reason.clone(),
        })
        .collect();
    let mut open = Vec::new();
    for (i, t) in transitions.iter().enumerate() {
        if t.to == "open" {
            let end = transitions.get(i + 1).map_or(seconds, |n| n.t_s);
            open.push((t.t_s, end));
        }
    }
    let mut chart = LoadChart {
        title: format!(
            "redrive demo: PSP load, {} charges, {} workers",
            a.charges, a.concurrency
        ),
        outage: faults
            .outage
            .map(|o| (o.start.as_secs_f64(), (o.start + o.length).as_secs_f64())),
        open: open.clone(),
        ..Default::default()
    };
    let mut requests_while_open = 0;
    for b in &stats.timeline {
        let by = |f: &dyn Fn(u16) -> bool| -> u64 {
            b.by_status
                .iter()
                .filter(|(s, _)| f(**s))
                .map(|(_, n)| n)
                .sum()
        };
        chart.ok.push(by(&|s| (200..300).contains(&s)));
        chart.limited.push(by(&|s| s == 429));
        chart.failed.push(by(&|s| s >= 500));
        let (lo, hi) = (b.t_ms as f64 / 1e3, (b.t_ms + 100) as f64 / 1e3);
        if open.iter().any(|(a, z)| lo >= *a && hi <= *z) {
            requests_while_open += b.requests;
        }
    }
    let mut charts = Vec::new();
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    for ext in ["svg", "png"] {
        let path: PathBuf = a.out.join(format!("demo-load.{ext}"));
        match redrive_sim::plot_load(&chart, &path) {
            Ok(()) => charts.push(path.display().to_string()),
            Err(e) => eprintln!("chart not drawn: {e}"),
        }
    }
    let psp = Psp {
        requests_total: stats.requests_total,
        requests_by_status: stats.requests_by_status.clone(),
        charges: stats.charges,
        distinct_keys: stats.distinct_keys,
        duplicate_effects: stats.duplicate_effects,
        replays: stats.replays,
    };
    let exactly_once =
        psp.charges == succeeded && psp.duplicate_effects == 0 && psp.distinct_keys == a.charges;
    Ok(Report {
        charges_enqueued: a.charges,
        concurrency: a.concurrency,
        scenario: faults.to_json(),
        sim_idempotency_layer: !a.no_faults || a.sim_idempotency_layer,
        seconds,
        jobs_per_s: succeeded as f64 / seconds.max(1e-9),
        succeeded,
        dead_by_reason,
        attempts_by_class,
        retries_in_process: retries,
        defers,
        breaker_transitions: transitions,
        requests_while_open,
        retries_before_retry_after: early,
        psp,
        exactly_once,
        charts,
    })
}

fn print_report(r: &Report) -> anyhow::Result<()> {
    outln!();
    outln!("finished in {:.1}s ({:.0} jobs/s)", r.seconds, r.jobs_per_s);
    outln!(
        "  succeeded          {}/{}",
        r.succeeded,
        r.charges_enqueued
    );
    let dead: u64 = r.dead_by_reason.values().sum();
    let reasons: Vec<String> = r
        .dead_by_reason
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    outln!(
        "  dead               {dead}{}",
        if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        }
    );
    let classes: Vec<String> = r
        .attempts_by_class
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    outln!(
        "  attempts           {} ({})",
        r.attempts_by_class.values().sum::<u64>(),
        classes.join(", ")
    );
    outln!(
        "  after a failure    {} retried in process, {} deferred",
        r.retries_in_process,
        r.defers
    );
    outln!(
        "  Retry-After        {} calls came back early",
        r.retries_before_retry_after
    );
    outln!(
        "  breaker            {} transitions, {} PSP requests while open",
        r.breaker_transitions.len(),
        r.requests_while_open
    );
    for t in &r.breaker_transitions {
        outln!(
            "    {:>6.2}s  {} -> {}  ({})",
            t.t_s,
            t.from,
            t.to,
            t.reason
        );
    }
    let statuses: Vec<String> = r
        .psp
        .requests_by_status
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    outln!(
        "  PSP                {} requests ({})",
        r.psp.requests_total,
        statuses.join(", ")
    );
    outln!(
        "  charges made       {} for {} distinct keys, {} duplicate effects, {} replays  => {}",
        r.psp.charges,
        r.psp.distinct_keys,
        r.psp.duplicate_effects,
        r.psp.replays,
        if r.exactly_once {
            "every charge exactly once"
        } else {
            "NOT exactly once"
        }
    );
    for c in &r.charts {
        outln!("  chart              {c}");
    }
    Ok(())
}
