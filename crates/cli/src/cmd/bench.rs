//! `redrive bench`: store-level throughput with `noop` jobs — bulk enqueue, then drain
//! (claim a batch → complete the batch) at several concurrencies, and idle pickup latency.
//!
//! It never touches your queue: SQLite runs in a temporary file (keeping the URL's
//! `?synchronous=` setting), PostgreSQL in a temporary schema that is dropped afterwards.

use crate::out::outln;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redrive_policy::{FailureClass, JobCounters};
use redrive_store::{ClaimParams, Completion, NewAttempt, NewJob, PgStore, SeedRows, Store};
use serde::Serialize;
use serde_json::json;

use crate::args::{BenchArgs, Global};
use crate::cmd::bench_scale;
use crate::cmd::queue::block_on;
use crate::error::usage;

const QUEUE: &str = "bench";
const ENQUEUE_BATCH: usize = 5_000;
const CLAIM_BATCH: u32 = 200;
/// Producers on PostgreSQL unless `--producers` says: one client waiting for each 5,000-row
/// transaction keeps one server process busy; bulk loads come from several clients.
const DEFAULT_PG_PRODUCERS: u32 = 4;

#[derive(Debug, Serialize)]
struct Run {
    concurrency: u32,
    jobs: u64,
    /// Producers that enqueued at once (`--producers`), each in batches of 5,000 jobs.
    enqueue_producers: u32,
    enqueue_jobs_per_s: f64,
    drain_jobs_per_s: f64,
    drain_seconds: f64,
    /// The same drain through the worker runtime, with as many jobs in flight
    /// (concurrency × claim batch).
    runtime_drain_jobs_per_s: f64,
    /// runtime / store drain.
    runtime_vs_store: f64,
    /// The same drain as plain SQL (`--ceiling`): batched claim and fenced completion, no
    /// attempt rows, no runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    ceiling_drain_jobs_per_s: Option<f64>,
    /// store drain / ceiling.
    #[serde(skip_serializing_if = "Option::is_none")]
    store_vs_ceiling: Option<f64>,
    /// The bench process's CPU time (user and system) per job during each drain, µs: what
    /// the client costs beside the database (on one machine they share the cores). Absent
    /// where `/proc` is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    drain_cpu_us_per_job: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_cpu_us_per_job: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ceiling_cpu_us_per_job: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    backend: &'static str,
    /// Jobs waiting below each drain (`--backlog`).
    backlog: u64,
    /// Finished jobs with attempts in the tables (`--history`).
    history: u64,
    /// Each job's payload, bytes of JSON text.
    payload_bytes: u64,
    /// Seconds the bulk seeding of backlog and history took.
    seed_seconds: f64,
    /// Each drain of a level ran on a fresh store of its own (no backlog or history), not
    /// on the tables of the drain before it.
    fresh_stores: bool,
    /// Why a drain could not start after a checkpoint (the first failure), if one could not.
    checkpoint_error: Option<String>,
    runs: Vec<Run>,
    /// `--processes` runs (then there are no in-process runs and no pickup figures).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    processes: Vec<crate::cmd::bench_scale::ProcessRun>,
    /// This process's peak resident memory, MiB.
    peak_rss_mib: f64,
    pickup_latency_ms_p50: f64,
    pickup_latency_ms_p99: f64,
    pickup_samples: usize,
    /// The runtime worker, idle, and jobs enqueued to become due 100 ms later: from run_at to
    /// the handler starting.
    scheduled_pickup_latency_ms_p50: f64,
    scheduled_pickup_latency_ms_p99: f64,
    scheduled_pickup_samples: usize,
}

/// A throwaway store of the same backend as `--db`.
pub(crate) struct Scratch {
    pub(crate) store: Store,
    /// The URL another process opens it with.
    url: String,
    _dir: Option<tempfile::TempDir>,
}

pub(crate) async fn scratch(db: &str, n: u32) -> anyhow::Result<Scratch> {
    if let Some(rest) = db.strip_prefix("sqlite:") {
        let dir = tempfile::tempdir()?;
        let query = rest
            .split_once('?')
            .map(|(_, q)| format!("?{q}"))
            .unwrap_or_default();
        let url = format!(
            "sqlite:{}{query}",
            dir.path().join(format!("bench{n}.db")).display()
        );
        return Ok(Scratch {
            store: Store::connect(&url).await?,
            url,
            _dir: Some(dir),
        });
    }
    if db.starts_with("postgres://") || db.starts_with("postgresql://") {
        let schema = format!("redrive_bench_{}_{n}", std::process::id());
        // The bench's own schema replaces any `schema=`; the other parameters (`sslmode`,
        // `options=-c …`) reach the server.
        let (url, _) = redrive_store::split_schema(db);
        let pg = PgStore::connect(&url, Some(&schema), 80).await?;
        let sep = if url.contains('?') { '&' } else { '?' };
        return Ok(Scratch {
            store: Store::Postgres(pg),
            url: format!("{url}{sep}schema={schema}"),
            _dir: None,
        });
    }
    Err(usage(format!(
        "--db: {db:?} is neither sqlite:PATH nor postgres://…"
    )))
}

pub(crate) async fn cleanup(s: Scratch) {
    if let Store::Postgres(pg) = &s.store {
        let _ = pg.drop_schema().await;
    }
}

fn bar(len: u64, msg: String) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg);
    pb
}

pub(crate) fn run(global: &Global, a: BenchArgs) -> anyhow::Result<ExitCode> {
    let levels = if a.concurrency.is_empty() {
        vec![1, 8, 64]
    } else {
        a.concurrency.clone()
    };
    if let Some(bad) = levels.iter().find(|c| **c == 0 || **c > 1024) {
        return Err(usage(format!(
            "--concurrency: {bad} is out of range 1..=1024"
        )));
    }
    let producers = a.producers.unwrap_or(if global.db.starts_with("sqlite:") {
        1
    } else {
        DEFAULT_PG_PRODUCERS
    });
    if !a.processes.is_empty() && global.db.starts_with("sqlite:") {
        return Err(usage(
            "--processes: needs a PostgreSQL --db (SQLite has one writer per file)",
        ));
    }
    let payload = match a.payload_bytes {
        Some(b) => redrive_store::padded_payload(b as usize),
        None => json!({}),
    };
    let payload_bytes = payload.to_string().len() as u64;
    if a.api_batch {
        let clients = a
            .producers
            .unwrap_or(crate::cmd::bench_api::DEFAULT_CLIENTS);
        return block_on(crate::cmd::bench_api::run(
            &global.db, a.jobs, clients, payload, a.json,
        ));
    }
    if let Some(queues) = a.queues {
        return block_on(bench_queues(&global.db, a.jobs, queues, a.json));
    }
    block_on(async move {
        let mut runs = Vec::new();
        let mut procs = Vec::new();
        let mut backend = "sqlite";
        let seeded = a.backlog > 0 || a.history > 0;
        let mut seed_seconds = 0.0;
        // With a backlog or history, one store seeded once serves every run (each drains
        // exactly --jobs, so the backlog stays as deep); otherwise a fresh one per run.
        let mut shared: Option<Scratch> = None;
        let prepare = async |n: u32| -> anyhow::Result<(Scratch, f64)> {
            let s = scratch(&global.db, n).await?;
            let mut secs = 0.0;
            let pb = bar(0, "seeding history".into());
            secs += bench_scale::seed(
                &s.store,
                QUEUE,
                SeedRows::Succeeded,
                a.history,
                &payload,
                Duration::from_secs(3_600),
            )
            .await?;
            pb.set_message("seeding backlog");
            secs += bench_scale::seed(
                &s.store,
                QUEUE,
                SeedRows::Available,
                a.backlog,
                &payload,
                Duration::from_secs(60),
            )
            .await?;
            pb.finish_and_clear();
            Ok((s, secs))
        };
        if !a.processes.is_empty() {
            let c = a.concurrency.first().copied().unwrap_or(64);
            for (i, &p) in a.processes.iter().enumerate() {
                let (s, secs) = prepare(i as u32).await?;
                seed_seconds += secs;
                backend = s.store.backend();
                let pb = bar(0, format!("{p} processes (c={c})"));
                let run = bench_scale::Processes {
                    jobs: a.jobs,
                    backlog: a.backlog,
                    processes: p,
                    concurrency: c,
                };
                let r = bench_scale::processes(&s.store, &s.url, QUEUE, run, &payload).await;
                pb.finish_and_clear();
                cleanup(s).await;
                procs.push(r?);
            }
        } else {
            for (i, &c) in levels.iter().enumerate() {
                let run = Level {
                    jobs: a.jobs,
                    concurrency: c,
                    producers,
                    ceiling: a.ceiling,
                };
                let r = if seeded {
                    let s = match shared.take() {
                        Some(s) => s,
                        None => {
                            let (s, secs) = prepare(i as u32).await?;
                            seed_seconds += secs;
                            s
                        }
                    };
                    backend = s.store.backend();
                    let r = level(Stores::Seeded(&s.store), run, &payload).await;
                    if r.is_ok() {
                        shared = Some(s);
                    } else {
                        cleanup(s).await;
                    }
                    r
                } else {
                    // Each drain of the level on a fresh store of its own.
                    let n = 100 * (i as u32 + 1);
                    let r = level(Stores::Fresh { db: &global.db, n }, run, &payload).await;
                    if global.db.starts_with("postgres") {
                        backend = "postgres";
                    }
                    r
                };
                runs.push(r?);
            }
            if let Some(s) = shared.take() {
                cleanup(s).await;
            }
        }
        let (lat, due) = if a.processes.is_empty() {
            let s = scratch(&global.db, 9_999).await?;
            let lat = pickup(&s.store, 200).await;
            cleanup(s).await;
            let lat = lat?;
            let s = scratch(&global.db, 10_000).await?;
            let due =
                crate::cmd::bench_runtime::scheduled_pickup(&s.store, "bench-scheduled", 200).await;
            cleanup(s).await;
            (lat, due?)
        } else {
            (Vec::new(), Vec::new())
        };
        let report = Report {
            backend,
            backlog: a.backlog,
            history: a.history,
            payload_bytes,
            seed_seconds,
            fresh_stores: !seeded && a.processes.is_empty(),
            checkpoint_error: CHECKPOINT_ERROR.get().cloned(),
            runs,
            processes: procs,
            peak_rss_mib: bench_scale::own_peak_rss_mib(),
            pickup_latency_ms_p50: pct(&lat, 0.50),
            pickup_latency_ms_p99: pct(&lat, 0.99),
            pickup_samples: lat.len(),
            scheduled_pickup_latency_ms_p50: pct(&due, 0.50),
            scheduled_pickup_latency_ms_p99: pct(&due, 0.99),
            scheduled_pickup_samples: due.len(),
        };
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            outln!(
                "backend {}, {} noop jobs per run of {} B payloads, enqueued by {} producer(s) in transactions of up to {ENQUEUE_BATCH}",
                report.backend,
                a.jobs,
                report.payload_bytes,
                producers
            );
            outln!(
                "backlog {} jobs waiting, history {} finished jobs (seeded in {:.1} s)",
                report.backlog,
                report.history,
                report.seed_seconds
            );
            if !report.runs.is_empty() {
                outln!(
                    "{:>11} {:>16} {:>16} {:>22} {:>9} {:>16} {:>9}",
                    "concurrency",
                    "enqueue jobs/s",
                    "drain jobs/s",
                    "runtime drain jobs/s",
                    "runtime",
                    "ceiling jobs/s",
                    "store"
                );
            }
            for r in &report.runs {
                let (ceiling, of) = match (r.ceiling_drain_jobs_per_s, r.store_vs_ceiling) {
                    (Some(c), Some(f)) => (format!("{c:.0}"), format!("{:.0}%", f * 100.0)),
                    _ => ("-".into(), "-".into()),
                };
                outln!(
                    "{:>11} {:>16.0} {:>16.0} {:>22.0} {:>8.0}% {:>16} {:>9}",
                    r.concurrency,
                    r.enqueue_jobs_per_s,
                    r.drain_jobs_per_s,
                    r.runtime_drain_jobs_per_s,
                    r.runtime_vs_store * 100.0,
                    ceiling,
                    of
                );
            }
            for p in &report.processes {
                outln!(
                    "{} process(es) x c={}: {} jobs, total drain {:.0} jobs/s ({:.0} per process) over {:.2} s (wall {:.2} s), peak RSS {:.1} MiB",
                    p.processes,
                    p.concurrency,
                    p.jobs,
                    p.drain_jobs_per_s,
                    p.per_process_jobs_per_s,
                    p.drain_seconds,
                    p.wall_seconds,
                    p.peak_rss_mib
                );
                let shares: Vec<String> = p
                    .per_process
                    .iter()
                    .map(|s| {
                        format!(
                            "{:.0}% ({:.0} MiB, {} of {} claims empty)",
                            s.share * 100.0,
                            s.peak_rss_mib,
                            s.empty_claims,
                            s.claims
                        )
                    })
                    .collect();
                outln!("  shares: {}", shares.join(", "));
            }
            if report.processes.is_empty() {
                outln!(
                    "pickup latency (idle worker, job due now): p50 {:.1} ms, p99 {:.1} ms over {} jobs",
                    report.pickup_latency_ms_p50,
                    report.pickup_latency_ms_p99,
                    report.pickup_samples
                );
                outln!(
                    "pickup latency (idle runtime worker, job due 100 ms after enqueue, from its run_at): p50 {:.1} ms, p99 {:.1} ms over {} jobs",
                    report.scheduled_pickup_latency_ms_p50,
                    report.scheduled_pickup_latency_ms_p99,
                    report.scheduled_pickup_samples
                );
            }
            if let Some(e) = &report.checkpoint_error {
                outln!("no checkpoint before the drains ({e}): a drain may include one");
            }
            outln!("bench peak RSS {:.1} MiB", report.peak_rss_mib);
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Where a level's drains run.
#[derive(Clone, Copy)]
enum Stores<'a> {
    /// Each drain on a fresh store of its own (scratch number `n` and up), filled the same
    /// way: the runtime drain that followed the store-level one on the same tables started
    /// on its finished rows and their dead versions (autovacuum free to start on them),
    /// while the store-level drain never did.
    Fresh { db: &'a str, n: u32 },
    /// All on one store seeded with a backlog or history (too costly to seed for each).
    Seeded(&'a Store),
}

impl Stores<'_> {
    /// The `k`th drain's store (fresh, or the seeded one) and, when fresh, the scratch to
    /// clean up after it.
    async fn get(self, k: u32) -> anyhow::Result<(Store, Option<Scratch>)> {
        match self {
            Stores::Fresh { db, n } => {
                let s = scratch(db, n + k).await?;
                Ok((s.store.clone(), Some(s)))
            }
            Stores::Seeded(store) => Ok((store.clone(), None)),
        }
    }
}

/// One concurrency level's parameters.
#[derive(Clone, Copy)]
struct Level {
    jobs: u64,
    concurrency: u32,
    producers: u32,
    ceiling: bool,
}

/// One concurrency level: the store-level drain (after a timed enqueue), the ceiling if
/// asked, and the runtime drain, each of exactly `jobs` claims from the top of the queue.
async fn level(at: Stores<'_>, l: Level, payload: &serde_json::Value) -> anyhow::Result<Run> {
    let (jobs, c) = (l.jobs, l.concurrency);
    let (store, s) = at.get(0).await?;
    let r = one_run(&store, jobs, c, l.producers, payload).await;
    if let Some(s) = s {
        cleanup(s).await;
    }
    let mut r = r?;
    if l.ceiling {
        let ceiling = |s: Store| async move { bench_scale::ceiling(&s, QUEUE, jobs, c).await };
        let (ceil, cpu) = after_store(at, 1, l, payload, "ceiling", ceiling).await?;
        r.ceiling_cpu_us_per_job = cpu;
        r.ceiling_drain_jobs_per_s = Some(ceil);
        r.store_vs_ceiling = Some(r.drain_jobs_per_s / ceil);
    }
    let runtime = |s: Store| async move {
        crate::cmd::bench_runtime::drain(&s, QUEUE, jobs, c * CLAIM_BATCH).await
    };
    let (rt, cpu) = after_store(at, 2, l, payload, "runtime", runtime).await?;
    r.runtime_cpu_us_per_job = cpu;
    r.runtime_drain_jobs_per_s = rt;
    r.runtime_vs_store = rt / r.drain_jobs_per_s;
    Ok(r)
}

/// The level's `k`th drain after the store-level one (`what`: ceiling or runtime): its
/// store filled and checkpointed, `drain` timed (its jobs/s, and this process's µs of CPU
/// per job), a fresh store cleaned up however it ends.
async fn after_store<F, Fut>(
    at: Stores<'_>,
    k: u32,
    l: Level,
    payload: &serde_json::Value,
    what: &str,
    drain: F,
) -> anyhow::Result<(f64, Option<f64>)>
where
    F: FnOnce(Store) -> Fut,
    Fut: Future<Output = anyhow::Result<f64>>,
{
    let (store, s) = at.get(k).await?;
    let out = async {
        fill(&store, at, l.jobs, l.producers, payload).await?;
        checkpoint(&store).await;
        let pb = bar(0, format!("{what} drain (c={})", l.concurrency));
        let (rate, cpu) = bench_scale::cpu_per_job(l.jobs, drain(store.clone())).await;
        pb.finish_and_clear();
        anyhow::Ok((rate?, cpu))
    }
    .await;
    if let Some(s) = s {
        cleanup(s).await;
    }
    out
}

/// The `jobs` a drain after the store-level one takes: on a fresh store enqueued as the
/// store-level drain's were (untimed); on the seeded store, seeded on top of its backlog.
async fn fill(
    store: &Store,
    at: Stores<'_>,
    jobs: u64,
    producers: u32,
    payload: &serde_json::Value,
) -> anyhow::Result<()> {
    match at {
        Stores::Fresh { .. } => {
            enqueue(store, jobs, producers, payload, "enqueue").await?;
        }
        Stores::Seeded(_) => {
            let rows = SeedRows::Available;
            bench_scale::seed(store, QUEUE, rows, jobs, payload, Duration::ZERO).await?;
        }
    }
    Ok(())
}

/// The first checkpoint that failed, for the report.
static CHECKPOINT_ERROR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// [`bench_scale::checkpoint`] before a timed drain; a failure is reported (once, and in
/// the report's `checkpoint_error`), and the drains go on, each of them then liable to
/// include a checkpoint the server starts itself.
async fn checkpoint(store: &Store) {
    if let Err(e) = bench_scale::checkpoint(store).await
        && CHECKPOINT_ERROR.set(e.clone()).is_ok()
    {
        eprintln!("redrive: bench: no checkpoint before the drains ({e}); a drain may include one");
    }
}

/// Enqueues `jobs` noop jobs from `producers` tasks, in transactions of up to 5,000;
/// returns the seconds it took.
async fn enqueue(
    store: &Store,
    jobs: u64,
    producers: u32,
    payload: &serde_json::Value,
    what: &str,
) -> anyhow::Result<f64> {
    let now = chrono::Utc::now();
    // Up to 5,000 jobs per transaction, fewer with big payloads (about 16 MiB of them).
    let per_batch = (16 << 20) / payload.to_string().len().max(1);
    let per_batch = per_batch.clamp(1, ENQUEUE_BATCH);
    let pb = bar(jobs, what.to_owned());
    let t = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..u64::from(producers) {
        // Producer p enqueues its share: jobs / producers, the first ones one more.
        let mut left = jobs / u64::from(producers) + u64::from(p < jobs % u64::from(producers));
        let store = store.clone();
        let pb = pb.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            while left > 0 {
                let n = left.min(per_batch as u64) as usize;
                let batch: Vec<NewJob> = (0..n)
                    .map(|_| NewJob::new(QUEUE, "noop", payload.clone()))
                    .collect();
                store.enqueue_many(&batch, now).await?;
                left -= n as u64;
                pb.inc(n as u64);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    pb.finish_and_clear();
    Ok(t.elapsed().as_secs_f64())
}

async fn one_run(
    store: &Store,
    jobs: u64,
    concurrency: u32,
    producers: u32,
    payload: &serde_json::Value,
) -> anyhow::Result<Run> {
    let what = format!("enqueue (c={concurrency})");
    let enqueue_s = enqueue(store, jobs, producers, payload, &what).await?;
    checkpoint(store).await;

    let pb = bar(jobs, format!("drain (c={concurrency})"));
    let left = Arc::new(AtomicU64::new(jobs));
    let t = Instant::now();
    let (done, cpu) = bench_scale::cpu_per_job(jobs, async {
        let mut tasks = Vec::new();
        for w in 0..concurrency {
            let (store, pb, left) = (store.clone(), pb.clone(), left.clone());
            tasks.push(tokio::spawn(async move { drain(store, w, left, pb).await }));
        }
        let mut done = 0;
        for t in tasks {
            done += t.await??;
        }
        anyhow::Ok(done)
    })
    .await;
    let drain_s = t.elapsed().as_secs_f64();
    let done = done?;
    pb.finish_and_clear();
    if done != jobs {
        anyhow::bail!("drained {done} jobs, expected {jobs}");
    }
    Ok(Run {
        concurrency,
        jobs,
        enqueue_producers: producers,
        enqueue_jobs_per_s: jobs as f64 / enqueue_s,
        drain_jobs_per_s: jobs as f64 / drain_s,
        drain_seconds: drain_s,
        runtime_drain_jobs_per_s: 0.0,
        runtime_vs_store: 0.0,
        ceiling_drain_jobs_per_s: None,
        store_vs_ceiling: None,
        drain_cpu_us_per_job: cpu,
        runtime_cpu_us_per_job: None,
        ceiling_cpu_us_per_job: None,
    })
}

/// Claims and completes batches until `left` (shared by the drain's tasks) is used up or the
/// queue runs dry.
async fn drain(store: Store, w: u32, left: Arc<AtomicU64>, pb: ProgressBar) -> anyhow::Result<u64> {
    let mut n = 0;
    loop {
        let take = bench_scale::reserve(&left, u64::from(CLAIM_BATCH));
        if take == 0 {
            return Ok(n);
        }
        let now = chrono::Utc::now();
        let got = store
            .claim(&ClaimParams {
                queues: vec![QUEUE.into()],
                kinds: redrive_store::Kinds::only(["noop"]),
                worker: format!("bench-{w}"),
                limit: take as u32,
                lease: Duration::from_secs(60),
                now,
            })
            .await?;
        let cs: Vec<Completion> = got.iter().map(|j| succeed(j, now)).collect();
        for r in store.complete_many(&cs).await? {
            r?;
        }
        n += got.len() as u64;
        pb.inc(got.len() as u64);
        if (got.len() as u64) < take {
            left.fetch_add(take - got.len() as u64, Ordering::SeqCst);
            return Ok(n);
        }
    }
}

fn succeed(j: &redrive_store::Job, now: chrono::DateTime<chrono::Utc>) -> Completion {
    let attempt = NewAttempt {
        worker: None,
        started_at: now,
        duration: Duration::ZERO,
        class: FailureClass::Success,
        http_status: None,
        error: None,
        counted: true,
        response: None,
    };
    let counters = JobCounters {
        attempts: j.attempts + 1,
        first_attempt_at: Some(now),
        ..j.counters()
    };
    Completion::succeeded(j.lease(), attempt, counters, json!(null), now)
}

/// An idle worker (waiting on the store's wake-up signal, polling every second as the
/// fallback) and a producer enqueueing one job every 10 ms: time from enqueue to claim.
async fn pickup(store: &Store, samples: usize) -> anyhow::Result<Vec<f64>> {
    let worker = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut rx = store.subscribe();
            let mut lat = Vec::with_capacity(samples);
            while lat.len() < samples {
                rx.borrow_and_update();
                let now = chrono::Utc::now();
                let got = store
                    .claim(&ClaimParams {
                        queues: vec![QUEUE.into()],
                        kinds: redrive_store::Kinds::only(["noop"]),
                        worker: "pickup".into(),
                        limit: 10,
                        lease: Duration::from_secs(60),
                        now,
                    })
                    .await?;
                if got.is_empty() {
                    let _ = tokio::time::timeout(Duration::from_secs(1), rx.changed()).await;
                    continue;
                }
                let cs: Vec<Completion> = got.iter().map(|j| succeed(j, now)).collect();
                store.complete_many(&cs).await?;
                for j in &got {
                    let at: i64 = j.payload["at_us"].as_i64().unwrap_or(0);
                    lat.push((chrono::Utc::now().timestamp_micros() - at) as f64 / 1000.0);
                }
            }
            anyhow::Ok(lat)
        })
    };
    for _ in 0..samples {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let at = chrono::Utc::now();
        store
            .enqueue(
                &NewJob::new(QUEUE, "noop", json!({"at_us": at.timestamp_micros()})),
                at,
            )
            .await?;
    }
    worker.await?
}

/// What `redrive bench --queues N` measured: claims across queues.
#[derive(Debug, Serialize)]
struct QueuesReport {
    backend: &'static str,
    jobs: u64,
    queues: u64,
    rounds: usize,
    /// A worker of every queue (concurrency 64) draining the jobs in one queue, jobs/s: the
    /// median of the rounds.
    drain_one_queue_jobs_per_s: f64,
    /// The same drain of the jobs spread over `queues` queues.
    drain_spread_jobs_per_s: f64,
    /// spread / one queue.
    spread_vs_one: f64,
    claims: Vec<ClaimTimes>,
}

/// One claim of 200 jobs, timed with a number of queue names in the store.
#[derive(Debug, Serialize)]
struct ClaimTimes {
    /// Distinct queue names in the store (100,000 finished jobs spread over them, and 10,000
    /// waiting jobs over at most 1,000 of them).
    queue_names: u64,
    /// A claim of every queue, ms: median of the claims.
    every_queue_claim_ms_p50: f64,
    /// A claim of the one queue (with one name only), ms: median, taken in turn with those of
    /// every queue.
    one_queue_claim_ms_p50: Option<f64>,
    claims: usize,
}

/// Rounds of the drains of `--queues`, one queue and spread in turn.
const QUEUE_ROUNDS: usize = 3;

/// `redrive bench --queues N`: see [`QueuesReport`].
async fn bench_queues(db: &str, jobs: u64, queues: u64, json: bool) -> anyhow::Result<ExitCode> {
    let (mut one, mut spread) = (Vec::new(), Vec::new());
    let mut backend = "sqlite";
    for round in 0..QUEUE_ROUNDS {
        for (k, n) in [(0, 1), (1, queues)] {
            let s = scratch(db, 20_000 + 2 * round as u32 + k).await?;
            backend = s.store.backend();
            let pb = bar(0, format!("drain over {n} queue(s)"));
            let r = drain_every_queue(&s.store, jobs, n).await;
            pb.finish_and_clear();
            cleanup(s).await;
            if k == 0 { &mut one } else { &mut spread }.push(r?);
        }
    }
    let mut claims = Vec::new();
    for (i, names) in [1_u64, 1_000, 100_000].into_iter().enumerate() {
        let s = scratch(db, 21_000 + i as u32).await?;
        let pb = bar(0, format!("claims, {names} queue names"));
        let r = claim_times(&s.store, names).await;
        pb.finish_and_clear();
        cleanup(s).await;
        claims.push(r?);
    }
    let (one, spread) = (pct(&one, 0.5), pct(&spread, 0.5));
    let report = QueuesReport {
        backend,
        jobs,
        queues,
        rounds: QUEUE_ROUNDS,
        drain_one_queue_jobs_per_s: one,
        drain_spread_jobs_per_s: spread,
        spread_vs_one: spread / one,
        claims,
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "backend {}: a worker of every queue (c=64) drains {} noop jobs, medians of {} rounds",
        report.backend,
        jobs,
        QUEUE_ROUNDS
    );
    outln!(
        "  in 1 queue {:.0} jobs/s, over {} queues {:.0} jobs/s: {:.0}%",
        one,
        queues,
        spread,
        report.spread_vs_one * 100.0
    );
    outln!("one claim of 200 (100,000 finished jobs and 10,000 waiting in the store):");
    for c in &report.claims {
        let vs = match c.one_queue_claim_ms_p50 {
            Some(o) => format!(
                ", of the one queue {o:.2} ms ({:.2}x)",
                c.every_queue_claim_ms_p50 / o
            ),
            None => String::new(),
        };
        outln!(
            "  {:>7} queue names: of every queue {:.2} ms{vs} (median of {} claims)",
            c.queue_names,
            c.every_queue_claim_ms_p50,
            c.claims
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `jobs` noop jobs seeded over `queues` queues, drained by a worker of every queue; jobs/s.
async fn drain_every_queue(store: &Store, jobs: u64, queues: u64) -> anyhow::Result<f64> {
    let at = chrono::Utc::now() - chrono::Duration::seconds(60);
    store
        .seed(&redrive_store::Seed {
            queue: QUEUE.into(),
            queues,
            kind: "noop".into(),
            count: jobs,
            rows: SeedRows::Available,
            payload: json!({}),
            at,
        })
        .await?;
    checkpoint(store).await;
    let worker = redrive_runtime::Worker::builder(store.clone(), vec![])
        .handler("noop", Arc::new(redrive_runtime::Noop))
        .concurrency(64)
        .gauge_interval(None)
        .build()?;
    let t = Instant::now();
    let s = worker.run_until_idle().await?;
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        s.succeeded == jobs,
        "drain over {queues} queues: {} of {jobs} jobs succeeded",
        s.succeeded
    );
    Ok(jobs as f64 / secs.max(1e-9))
}

/// Claims of 200 with `names` queue names in the store: 100,000 finished jobs spread over
/// them and 10,000 waiting over at most 1,000 of them, all taken by 50 claims of every queue
/// (with one name, 25 of every queue and 25 of the queue, in turn).
async fn claim_times(store: &Store, names: u64) -> anyhow::Result<ClaimTimes> {
    let at = chrono::Utc::now() - chrono::Duration::seconds(60);
    let seed = |rows, count, queues| redrive_store::Seed {
        queue: QUEUE.into(),
        queues,
        kind: "noop".into(),
        count,
        rows,
        payload: json!({}),
        at,
    };
    store
        .seed(&seed(SeedRows::Succeeded, 100_000, names))
        .await?;
    store
        .seed(&seed(SeedRows::Available, 10_000, names.min(1_000)))
        .await?;
    checkpoint(store).await;
    let (mut every, mut one) = (Vec::new(), Vec::new());
    for i in 0..50 {
        let alone = names == 1 && i % 2 == 1;
        let p = ClaimParams {
            queues: if alone { vec![QUEUE.into()] } else { vec![] },
            kinds: redrive_store::Kinds::Any,
            worker: "bench".into(),
            limit: CLAIM_BATCH,
            lease: Duration::from_secs(300),
            now: chrono::Utc::now(),
        };
        let t = Instant::now();
        let got = store.claim(&p).await?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        anyhow::ensure!(
            got.len() == CLAIM_BATCH as usize,
            "claim {i} with {names} queue names took {} jobs",
            got.len()
        );
        if alone { &mut one } else { &mut every }.push(ms);
    }
    Ok(ClaimTimes {
        queue_names: names,
        every_queue_claim_ms_p50: pct(&every, 0.5),
        one_queue_claim_ms_p50: (!one.is_empty()).then(|| pct(&one, 0.5)),
        claims: every.len() + one.len(),
    })
}
