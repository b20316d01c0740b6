//! `redrive demo`: the whole product in one command. Starts the PSP simulator in-process and an
//! SQLite queue in a temporary file, enqueues charges as `http` jobs (each with its own
//! idempotency key), runs the workers through a bad day at the PSP — 20% 5xx, a rate limit
//! with `Retry-After`, a 5-second outage, 5% of charges whose answer is lost after the charge
//! was made — shows progress with the live breaker state, then prints what happened and draws
//! the PSP's load over time with the open-breaker windows shaded and the rate limit drawn.
//!
//! The simulator's ledger runs with its own dedupe off, as a real PSP's would: only the
//! idempotency layer in front of it (and the stable key of each job) keeps a repeated charge
//! from being made twice, so "every charge exactly once" is read from the ledger's effects per
//! key and can fail (`--no-sim-idempotency-layer` shows it failing). The claims are computed
//! in [`measure`] from the simulator's request log and the store's breaker transitions.

mod measure;
mod published;

use crate::out::outln;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redrive_http::{EgressPolicy, HttpJob};
use redrive_policy::{BreakerState, RetryMode, StatusTable};
use redrive_psp_sim::{Faults, PspSim};
use redrive_runtime::Worker;
use redrive_sim::LoadChart;
use redrive_store::{JobState, ListParams, NewJob, Store};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::args::{DemoArgs, Global};
use crate::cmd::queue::block_on;

use crate::cmd::demo_scenario::{
    CALL_TIMEOUT, DEPENDENCY, OUTAGE, POLL_INTERVAL, QUEUE, RETRY_AFTER_S, policies, scenario,
};

/// The report, also printed with `--json`.
#[derive(Debug, Serialize)]
struct Report {
    charges_enqueued: u64,
    concurrency: usize,
    scenario: serde_json::Value,
    /// Whether the simulator's charges ran behind its idempotency layer (on the bad day unless
    /// `--no-sim-idempotency-layer`; with `--no-faults` only when `--sim-idempotency-layer`).
    sim_idempotency_layer: bool,
    seconds: f64,
    jobs_per_s: f64,
    succeeded: u64,
    dead_by_reason: BTreeMap<String, u64>,
    attempts_by_class: BTreeMap<String, u64>,
    retries_in_process: u64,
    defers: u64,
    breaker_transitions: Vec<Transition>,
    /// PSP requests let through while the breaker was open (must be 0): every request of the
    /// simulator's log, by the attempt that sent it, against the transitions from the moment
    /// each was written (see [`measure::breaker_counts`] for the boundary).
    requests_while_open: u64,
    /// PSP requests let through while the breaker was half-open: the probes.
    probes_sent: u64,
    /// Of the probes, those answered 429: their permits went back to the round, so another
    /// probe was sent in their place.
    probes_rate_limited: u64,
    /// The probes not answered 429, per half-open round (in the order of the transitions to
    /// half-open): each at most the half-open group's size.
    probes_judged_per_round: Vec<u64>,
    /// Attempts that followed a 429 sooner than its `Retry-After` (must be 0).
    retries_before_retry_after: u64,
    psp: Psp,
    /// How hard the PSP was pushed against its rate limit.
    psp_load: measure::PspLoad,
    /// Every charge made once, read from the ledger with its own dedupe off (see
    /// [`measure::exactly_once`]).
    exactly_once: bool,
    /// Why not, when `exactly_once` is false.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_exactly_once: Vec<String>,
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
    /// Charges made more than once for one key, from the ledger's effects per key.
    duplicate_effects: u64,
    /// The most charges made for one key.
    effects_max_per_key: u64,
    /// The most times the charge handler ran for one key.
    executions_max_per_key: u64,
    /// Answers replayed by the ledger's own dedupe (0: it is off).
    replays: u64,
    /// Answers replayed by the idempotency layer in front of the ledger.
    layer_replays: u64,
    /// Whether the ledger's own dedupe was on (never in the demo).
    ledger_dedupe: bool,
}

/// Whether the simulator runs its idempotency layer in front of the charges.
fn layer_on(a: &DemoArgs) -> bool {
    if a.no_faults {
        a.sim_idempotency_layer
    } else {
        !a.no_sim_idempotency_layer
    }
}

pub(crate) fn run(_global: &Global, a: DemoArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let dir = tempfile::tempdir().context("creating the demo's temporary folder")?;
        let db = format!("sqlite:{}", dir.path().join("demo.db").display());
        let store = Store::connect(&db).await?;
        let faults = scenario(&a);
        // The ledger's own dedupe is off, as at a real PSP: only the idempotency layer in
        // front of it stops a repeat from charging again, and a double charge shows in its
        // effects per key. The bad day needs the layer (a lost answer is replayed to the
        // retry). A healthy PSP never loses an answer, so `--no-faults` leaves the layer out
        // and measures redrive alone, unless `--sim-idempotency-layer` asks for it. The
        // request log keeps every request of the run (the checks read all of them).
        let mut sim = PspSim::builder()
            .faults(faults.clone())
            .ledger_dedupe(false)
            .request_log_capacity(usize::MAX);
        if layer_on(&a) {
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
                        "timeout_ms": CALL_TIMEOUT.as_millis() as u64,
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

        // When each breaker transition was written (the store keeps when it was decided).
        let transitions = published::Log::install();
        if transitions.is_none() {
            eprintln!(
                "note: a metrics recorder is already installed; breaker transitions are taken at their stored times"
            );
        }
        // When each call was let through, to the microsecond: the handler's start.
        // Egress: exactly the simulator's address is allowed (the default policy refuses
        // loopback, where the simulator listens).
        let egress = EgressPolicy::default()
            .with_allow("the demo's simulator", &sim.addr().ip().to_string())
            .context("allowing the PSP simulator's address")?;
        let http = HttpJob::with_egress(StatusTable::default(), egress)
            .context("building the http job kind")?;
        let stamps = Arc::new(Stamped::new(http));
        let worker = Worker::builder(store.clone(), vec![QUEUE.into()])
            .handler("http", stamps.clone())
            .policies(set)
            .concurrency(a.concurrency)
            .gauge_interval(None)
            .poll_interval(POLL_INTERVAL)
            .seed(a.seed)
            .build()?;
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
                Some(d) if d.flow.state == BreakerState::Open => {
                    let left = d
                        .flow
                        .open_until
                        .map(|u| (u - Utc::now()).num_milliseconds().max(0) as f64 / 1e3)
                        .unwrap_or(0.0);
                    format!("OPEN (probe in {left:.1}s)")
                }
                Some(d) if d.flow.state == BreakerState::HalfOpen => {
                    format!("half-open ({} probes left)", d.flow.probe_permits)
                }
                _ => "closed".into(),
            };
            let paused = dep
                .as_ref()
                .and_then(|d| d.flow.paused_until)
                .filter(|p| *p > Utc::now())
                .map(|_| ", paused (Retry-After)")
                .unwrap_or("");
            let rate = dep
                .and_then(|d| d.flow.rate)
                .map(|r| format!(", rate {r:.0}/s"))
                .unwrap_or_default();
            bar.set_message(format!(
                "breaker {breaker}{paused}{rate} | PSP {} requests, {} charges",
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
        let log = sim.request_log();
        let published = transitions
            .as_ref()
            .map(published::Log::snapshot)
            .unwrap_or_default();
        let handler_starts = stamps.snapshot();
        let run = Run {
            t0,
            seconds,
            stats: &stats,
            log: &log,
            published: &published,
            handler_starts: &handler_starts,
        };
        let report = report(&store, &a, &faults, &run).await?;
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
                "not every charge was made exactly once: {}",
                report.not_exactly_once.join("; ")
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
                    ..Default::default()
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

/// What the run left to measure, besides the store.
struct Run<'a> {
    /// When the simulator's clock (re)started.
    t0: chrono::DateTime<Utc>,
    /// The run's length.
    seconds: f64,
    stats: &'a redrive_psp_sim::Stats,
    /// Every request the simulator saw.
    log: &'a [redrive_psp_sim::RequestRecord],
    /// The breaker transitions as the workers published them.
    published: &'a [published::Published],
    /// When each attempt's handler started, per idempotency key (exact).
    handler_starts: &'a measure::Starts,
}

/// The demo's `http` handler, stamping when each call starts: right after the breaker let it
/// through, to the microsecond (the store keeps attempts' starts in whole milliseconds, too
/// coarse to tell a call from an opening written in the same millisecond).
#[derive(Debug)]
struct Stamped {
    inner: HttpJob,
    starts: std::sync::Mutex<measure::Starts>,
}

impl Stamped {
    fn new(inner: HttpJob) -> Self {
        Self {
            inner,
            starts: Default::default(),
        }
    }

    /// The starts so far, each key's in order.
    fn snapshot(&self) -> measure::Starts {
        let mut s = self
            .starts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for v in s.values_mut() {
            v.sort();
        }
        s
    }
}

/// A handler's boxed future.
type Boxed<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

impl redrive_runtime::Handler for Stamped {
    fn run(&self, ctx: redrive_runtime::JobContext) -> Boxed<redrive_runtime::Attempted> {
        if let Some(k) = &ctx.key {
            self.starts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(k.clone())
                .or_default()
                .push(Utc::now());
        }
        self.inner.run(ctx)
    }

    fn refresh_credentials(&self) -> Boxed<Result<(), String>> {
        self.inner.refresh_credentials()
    }

    fn query_status(
        &self,
        ctx: redrive_runtime::JobContext,
    ) -> Option<Boxed<redrive_runtime::StatusAnswer>> {
        self.inner.query_status(ctx)
    }
}

async fn report(
    store: &Store,
    a: &DemoArgs,
    faults: &Faults,
    run: &Run<'_>,
) -> anyhow::Result<Report> {
    let Run {
        t0,
        seconds,
        stats,
        log,
        published,
        handler_starts,
    } = *run;
    let mut succeeded = 0;
    let mut dead_by_reason = BTreeMap::new();
    let mut attempts_by_class: BTreeMap<String, u64> = BTreeMap::new();
    let (mut retries, mut defers, mut early) = (0, 0, 0);
    let mut starts = measure::Starts::new();
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
                        .entry(
                            j.dead_reason
                                .map(|r| r.as_str().to_owned())
                                .unwrap_or_default(),
                        )
                        .or_insert(0) += 1;
                }
                _ => {}
            }
            let atts = store.attempts(j.id).await?;
            if let Some(k) = &j.key {
                starts
                    .entry(k.clone())
                    .or_default()
                    .extend(atts.iter().map(|at| at.started_at));
            }
            for (i, at) in atts.iter().enumerate() {
                *attempts_by_class
                    .entry(at.class.as_str().to_owned())
                    .or_insert(0) += 1;
                match at.mode {
                    Some(RetryMode::Retry) => retries += 1,
                    Some(RetryMode::Defer) => defers += 1,
                    None => {}
                }
                // A 429's answer came at started + duration; the next call of this job must not
                // start before that plus the Retry-After.
                if at.http_status == Some(429)
                    && let Some(next) = atts.get(i + 1)
                {
                    let answered = at.started_at
                        + chrono::Duration::milliseconds(at.duration.as_millis() as i64);
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
            from: e.from.as_str().to_owned(),
            to: e.to.as_str().to_owned(),
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
    let stored: Vec<measure::Stored> = events
        .iter()
        .map(|e| measure::Stored {
            at: e.at,
            from: e.from,
            to: e.to,
        })
        .collect();
    let published: Vec<_> = published
        .iter()
        .filter(|p| p.dependency == DEPENDENCY)
        .map(|p| (p.at, p.from, p.to))
        .collect();
    let in_force = measure::in_force(&stored, &published);
    for v in starts.values_mut() {
        v.sort();
    }
    // The handler's exact starts where the demo has them (every run here), else the store's.
    let breaker = if handler_starts.is_empty() {
        measure::breaker_counts(log, &starts, measure::STORED_MS, &in_force)
    } else {
        measure::breaker_counts(log, handler_starts, chrono::Duration::zero(), &in_force)
    };
    let psp_load = measure::psp_load(log, faults, seconds);
    let mut chart = LoadChart {
        title: format!(
            "redrive demo: PSP load, {} charges, {} workers",
            a.charges, a.concurrency
        ),
        outage: faults
            .outage
            .map(|o| (o.start.as_secs_f64(), (o.start + o.length).as_secs_f64())),
        open: open.clone(),
        limit: faults.rate_limit.map(|l| l * measure::SLICE.as_secs_f64()),
        ..Default::default()
    };
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
        effects_max_per_key: stats.effects_max_per_key,
        executions_max_per_key: stats.executions_max_per_key,
        replays: stats.replays,
        layer_replays: stats.layer_replays,
        ledger_dedupe: stats.ledger_dedupe,
    };
    let not_exactly_once = measure::exactly_once(a.charges, succeeded, stats)
        .err()
        .unwrap_or_default();
    Ok(Report {
        charges_enqueued: a.charges,
        concurrency: a.concurrency,
        scenario: faults.to_json(),
        sim_idempotency_layer: layer_on(a),
        seconds,
        jobs_per_s: succeeded as f64 / seconds.max(1e-9),
        succeeded,
        dead_by_reason,
        attempts_by_class,
        retries_in_process: retries,
        defers,
        breaker_transitions: transitions,
        requests_while_open: breaker.requests_while_open,
        probes_sent: breaker.probes_sent,
        probes_rate_limited: breaker.probes_rate_limited,
        probes_judged_per_round: breaker.probes_judged_per_round,
        retries_before_retry_after: early,
        psp,
        psp_load,
        exactly_once: not_exactly_once.is_empty(),
        not_exactly_once,
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
        "  breaker            {} transitions, {} PSP requests while open, {} probes while half-open ({} answered 429; the others per round: {:?})",
        r.breaker_transitions.len(),
        r.requests_while_open,
        r.probes_sent,
        r.probes_rate_limited,
        r.probes_judged_per_round
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
    let l = &r.psp_load;
    let num = |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |x| format!("{x:.digits$}"));
    match l.limit_rps {
        Some(limit) => outln!(
            "  PSP load           limit {limit}/s: peak {}x the limit after 10s, {}% answered 429; {:.1}s = {}x the minimum of {}s (outage + requests at the limit)",
            num(l.peak_ratio, 1),
            num(l.share_429.map(|s| s * 100.0), 1),
            r.seconds,
            num(l.vs_minimum, 2),
            num(l.minimum_seconds, 1),
        ),
        None => outln!("  PSP load           no rate limit"),
    }
    if let Some(back) = l.back_after_outage_s {
        outln!("  after the outage   first 2xx answer {back:.2}s after it ended");
    }
    outln!(
        "  charges made       {} for {} distinct keys (the ledger's own dedupe {}): {} duplicate effects (at most {} per key)",
        r.psp.charges,
        r.psp.distinct_keys,
        if r.psp.ledger_dedupe { "on" } else { "off" },
        r.psp.duplicate_effects,
        r.psp.effects_max_per_key,
    );
    let runs = match r.psp.executions_max_per_key {
        1 => "once".to_owned(),
        n => format!("{n} times"),
    };
    outln!(
        "  replayed answers   {} by the idempotency layer, {} by the ledger; the charge ran at most {runs} for one key",
        r.psp.layer_replays,
        r.psp.replays
    );
    if r.exactly_once {
        outln!("  => every charge exactly once");
    } else {
        outln!("  => NOT exactly once: {}", r.not_exactly_once.join("; "));
    }
    for c in &r.charts {
        outln!("  chart              {c}");
    }
    Ok(())
}
