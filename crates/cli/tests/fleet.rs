//! The fleet: two `redrive work` processes against one PostgreSQL schema, calling one fake
//! dependency on 127.0.0.1 over real HTTP.
//! - While the dependency is down, the breaker opens (in the store) and neither process
//!   calls it until the probe time; while half-open the whole fleet sends at most the probe
//!   limit; then every job succeeds.
//! - A `Retry-After` answered to one process delays the other's calls too.
//!
//! Uses `REDRIVE_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`); fails,
//! not skips, when `CI=true` and the server is unreachable.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redrive_policy::BreakerState;
use redrive_store::{NewJob, PgStore, Store};
use redrive_testkit::cli::{Running, block, terminate};
use serde_json::json;

#[path = "support/pg_fleet.rs"]
mod pg_fleet;
use pg_fleet::{all_succeeded, schema};

const POLICIES: &str = r#"
[breaker.default]
window_calls = 10
minimum_calls = 4
failure_rate = 0.5
open_cooldown = "2s"
cooldown_jitter = 0.0
half_open_probes = 2
"#;

/// The fake dependency: 503 while `down`, one 429 with `Retry-After: 2` if `rate_limit_once`,
/// else 200; every request's arrival time and status is kept.
#[derive(Default)]
struct Dep {
    down: AtomicBool,
    rate_limit_once: AtomicBool,
    limited: AtomicU32,
    log: Mutex<Vec<(DateTime<Utc>, u16)>>,
}

fn serve(dep: Arc<Dep>) -> (String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = rt.block_on(async move {
        let app = axum::Router::new().route(
            "/charge",
            axum::routing::post(move || {
                let dep = dep.clone();
                async move {
                    let status = if dep.down.load(Ordering::SeqCst) {
                        503
                    } else if dep.rate_limit_once.swap(false, Ordering::SeqCst) {
                        dep.limited.fetch_add(1, Ordering::SeqCst);
                        429
                    } else {
                        200
                    };
                    dep.log.lock().unwrap().push((Utc::now(), status));
                    let code = axum::http::StatusCode::from_u16(status).unwrap();
                    let mut r = axum::response::Response::new(axum::body::Body::from("{}"));
                    *r.status_mut() = code;
                    if status == 429 {
                        r.headers_mut()
                            .insert("retry-after", axum::http::HeaderValue::from_static("2"));
                    }
                    r
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        addr
    });
    (format!("http://{addr}/charge"), rt)
}

fn enqueue(pg: &PgStore, url: &str, n: usize) {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            NewJob::new("pay", "http", json!({"method": "POST", "url": url}))
                .key(format!("order-{i}"))
                .dependency("psp")
        })
        .collect();
    block(Store::Postgres(pg.clone()).enqueue_many(&jobs, Utc::now())).unwrap();
}

fn worker(db: &str, policies: &std::path::Path) -> Running {
    redrive_testkit::cli!()
        .cmd()
        .args(["--db", db, "--policies"])
        .arg(policies)
        .args([
            "work",
            "--queue",
            "pay",
            "--concurrency",
            "4",
            "--shutdown-grace",
            "1s",
            "--allow-host",
            "loopback",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .unwrap()
}

/// Held by each test that runs three worker processes, so that two of them never share the
/// server's connections (each process's pool holds up to 16, and the server allows 100).
fn three_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// SIGTERM to every worker, then waits for each to exit (at most 30 s, then SIGKILL and a
/// failure).
fn stop(children: Vec<Running>) {
    terminate(children, Duration::from_secs(30));
}

#[test]
fn two_processes_share_one_breaker_and_the_probe_limit() {
    let Some((fresh, pg)) = schema("rdfleet", 4) else {
        return;
    };
    let db = fresh.url();
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("p.toml");
    std::fs::write(&policies, POLICIES).unwrap();
    let dep = Arc::new(Dep::default());
    dep.down.store(true, Ordering::SeqCst);
    let (url, _rt) = serve(dep.clone());
    enqueue(&pg, &url, 40);
    let workers = vec![worker(&db, &policies), worker(&db, &policies)];
    // Down for 1.5 s, then healthy.
    std::thread::sleep(Duration::from_millis(1500));
    dep.down.store(false, Ordering::SeqCst);
    all_succeeded(&pg, 40, Duration::from_secs(60));
    stop(workers);

    let store = Store::Postgres(pg.clone());
    let mut events = block(store.dependency_events(Some("psp"), 100)).unwrap();
    events.reverse();
    let log = dep.log.lock().unwrap().clone();
    block(fresh.drop_now());

    let opened = events
        .iter()
        .position(|e| e.from == BreakerState::Closed && e.to == BreakerState::Open)
        .unwrap_or_else(|| panic!("the breaker never opened: {events:?}"));
    let open_at = events[opened].at;
    let half = events[opened..]
        .iter()
        .position(|e| e.to == BreakerState::HalfOpen)
        .map(|i| opened + i)
        .expect("went half-open");
    let half_at = events[half].at;
    let after = events.get(half + 1).map_or(Utc::now(), |e| e.at);
    // Open: no call from either process (150 ms of slack for calls already on the wire).
    let during_open = log
        .iter()
        .filter(|(t, _)| *t > open_at + chrono::Duration::milliseconds(150) && *t < half_at)
        .count();
    assert_eq!(during_open, 0, "calls while open; events {events:?}");
    assert!(half_at - open_at >= chrono::Duration::milliseconds(1900));
    // Half-open: at most the probe limit, fleet-wide.
    let probes = log
        .iter()
        .filter(|(t, _)| *t >= half_at && *t < after)
        .count();
    assert!(
        probes <= 2,
        "{probes} calls while half-open; events {events:?}"
    );
    // No charge was made twice and none is missing.
    assert_eq!(log.iter().filter(|(_, s)| *s == 200).count(), 40);
}

#[test]
fn a_retry_after_answered_to_one_process_delays_the_other() {
    let Some((fresh, pg)) = schema("rdfleet", 4) else {
        return;
    };
    let db = fresh.url();
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("p.toml");
    std::fs::write(&policies, POLICIES).unwrap();
    let dep = Arc::new(Dep::default());
    let (url, _rt) = serve(dep.clone());
    let workers = vec![worker(&db, &policies), worker(&db, &policies)];
    std::thread::sleep(Duration::from_millis(500));
    dep.rate_limit_once.store(true, Ordering::SeqCst);
    enqueue(&pg, &url, 30);
    all_succeeded(&pg, 30, Duration::from_secs(60));
    stop(workers);
    block(fresh.drop_now());

    assert_eq!(dep.limited.load(Ordering::SeqCst), 1);
    let log = dep.log.lock().unwrap().clone();
    let t429 = log.iter().find(|(_, s)| *s == 429).unwrap().0;
    // Nobody called during the 2 s (after 200 ms for calls already on their way).
    let early = log
        .iter()
        .filter(|(t, _)| {
            *t > t429 + chrono::Duration::milliseconds(200)
                && *t < t429 + chrono::Duration::milliseconds(1990)
        })
        .count();
    assert_eq!(early, 0, "calls during the Retry-After: {log:?}");
    assert_eq!(log.iter().filter(|(_, s)| *s == 200).count(), 30);
}

#[test]
fn bench_on_postgres_enqueues_from_four_producers_by_default() {
    let url = redrive_testkit::postgres_url();
    if !block(redrive_testkit::postgres_available(&url)) {
        return;
    }
    let o = redrive_testkit::cli!()
        .cmd()
        .args([
            "--db",
            &url,
            "bench",
            "--jobs",
            "301",
            "--concurrency",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr: {stderr}");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["backend"], "postgres");
    assert_eq!(r["runs"][0]["enqueue_producers"], 4);
    assert_eq!(r["runs"][0]["jobs"], 301);
    assert_eq!(r["scheduled_pickup_samples"], 200);
}

/// The bench keeps the URL's parameters other than `schema=` (it uses a schema of its own):
/// an `options=-c …` reaches the server, which refuses a setting it does not know. They were
/// dropped before, so experiments such as `synchronous_commit=off` measured nothing.
#[test]
fn bench_on_postgres_passes_the_urls_parameters_to_the_server() {
    let url = redrive_testkit::postgres_url();
    if !block(redrive_testkit::postgres_available(&url)) {
        return;
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    let run = |params: &str| {
        redrive_testkit::cli!()
            .cmd()
            .args([
                "--db",
                &format!("{url}{sep}{params}"),
                "bench",
                "--jobs",
                "20",
                "--concurrency",
                "1",
                "--json",
            ])
            .output()
            .unwrap()
    };
    let o = run("options=-c%20redrive_no_such%3D1&schema=ignored");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "an unknown setting was not sent: {stderr}"
    );
    assert!(stderr.contains("redrive_no_such"), "stderr: {stderr}");
    let o = run("options=-c%20synchronous_commit%3Doff&schema=ignored");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr: {stderr}");
}

/// RUST_LOG reaches every event: the group commits' debug lines, each written right after a
/// sqlx statement, were all lost on PostgreSQL while the log layer had a filter of its own
/// (sqlx's check of its own query log left a stale answer for the next event;
/// tokio-rs/tracing#2519), and so could a warning written at that instant.
#[test]
fn rust_log_shows_the_events_written_right_after_a_postgres_statement() {
    let url = redrive_testkit::postgres_url();
    if !block(redrive_testkit::postgres_available(&url)) {
        return;
    }
    let o = redrive_testkit::cli!()
        .cmd()
        .env("RUST_LOG", "redrive_runtime::completer=debug")
        .args([
            "--db",
            &url,
            "bench",
            "--jobs",
            "400",
            "--concurrency",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr: {stderr}");
    let commits = stderr
        .lines()
        .filter(|l| l.contains("group commit"))
        .count();
    assert!(commits > 0, "no group commit logged; stderr: {stderr}");
}

#[test]
fn bench_drains_one_postgres_queue_with_several_work_processes() {
    let url = redrive_testkit::postgres_url();
    if !block(redrive_testkit::postgres_available(&url)) {
        return;
    }
    let o = redrive_testkit::cli!()
        .cmd()
        .args([
            "--db",
            &url,
            "bench",
            "--jobs",
            "600",
            "--concurrency",
            "4",
            "--processes",
            "1",
            "--processes",
            "3",
            "--payload-bytes",
            "2048",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stderr: {stderr}");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let procs = r["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    for (p, n) in procs.iter().zip([1, 3]) {
        assert_eq!(p["processes"], n);
        assert_eq!(p["concurrency"], 4);
        assert_eq!(p["jobs"], 600, "every job ran once: {p}");
        let each = p["per_process"].as_array().unwrap();
        assert_eq!(each.len(), n);
        let ran: u64 = each.iter().map(|e| e["succeeded"].as_u64().unwrap()).sum();
        assert_eq!(ran, 600, "{p}");
        let shares: f64 = each.iter().map(|e| e["share"].as_f64().unwrap()).sum();
        assert!((shares - 1.0).abs() < 1e-9, "{p}");
        assert!(
            each.iter()
                .all(|e| e["peak_rss_mib"].as_f64().unwrap() > 1.0),
            "{p}"
        );
        assert!(p["drain_jobs_per_s"].as_f64().unwrap() > 0.0);
    }
    // In-process runs and pickup figures are not part of a processes run.
    assert!(r["runs"].as_array().unwrap().is_empty());
}

/// What one run of the fleet scenario left at the PSP.
struct FleetRun {
    seconds: f64,
    stats: redrive_psp_sim::Stats,
    log: Vec<redrive_psp_sim::RequestRecord>,
    /// Attempts ended by a rescue of an expired lease.
    rescues: i64,
    /// The registry's clock offsets of the live workers, at the end of the run.
    offsets_ms: Vec<Option<i64>>,
    /// The ticks of the `every-second` schedule enqueued (with [`Fleet::schedule`]), from the
    /// jobs' keys, sorted.
    ticks: Vec<chrono::DateTime<Utc>>,
}

const FLEET_LIMIT: f64 = 50.0;
const FLEET_OUTAGE: (u64, u64) = (4, 5);

/// Three `redrive work` processes (8 workers each) on one PostgreSQL queue against the PSP
/// simulator at 50 requests/s with `Retry-After: 1`, 10% 5xx and a 5 s outage from 4 s
/// (issue 15's fleet scenario), `n` charges. The simulator's own dedupe is off: only its
/// idempotency layer protects the charges. `None` when PostgreSQL is unreachable (and CI is
/// not set).
fn fleet_run(n: usize, seed: u64) -> Option<FleetRun> {
    fleet_run_with(n, seed, &Fleet::default())
}

/// How the fleet's processes are set up: each one's `REDRIVE_CLOCK_OFFSET`, the sync switch,
/// extra arguments of `work`.
#[derive(Default)]
struct Fleet {
    /// One per process (three processes when empty, none skewed).
    offsets: Vec<&'static str>,
    /// `REDRIVE_CLOCK_SYNC=off` on every process.
    unsynced: bool,
    work_args: Vec<&'static str>,
    /// A schedule ticking every second (`[[schedules]]` in the policies file, a `noop` job
    /// into queue `ticks`, which no worker serves): every process's scheduler takes part.
    schedule: bool,
}

fn fleet_run_with(n: usize, seed: u64, fleet: &Fleet) -> Option<FleetRun> {
    use redrive_psp_sim::{Faults, Outage, PspSim};
    let (fresh, pg) = schema("rdfleet", 4)?;
    let db = fresh.url();
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("p.toml");
    std::fs::write(
        &policies,
        r#"
[policy.fleet]
extends = "payment"
[policy.fleet.retry]
max_attempts = 25
window = "5m"

[breaker.psp]
window_calls = 50
minimum_calls = 30
failure_rate = 0.6
open_cooldown = "1s"
cooldown_multiplier = 1.5
cooldown_max = "1500ms"
"#
        .to_owned()
            + if fleet.schedule {
                "\n[[schedules]]\nname = \"every-second\"\ncron = \"* * * * * *\"\nqueue = \"ticks\"\nkind = \"noop\"\nmissed = \"skip\"\n"
            } else {
                ""
            },
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(
            PspSim::builder()
                .faults(Faults {
                    error_rate: 0.1,
                    rate_limit: Some(FLEET_LIMIT),
                    retry_after: Some(Duration::from_secs(1)),
                    outage: Some(Outage::new(
                        Duration::from_secs(FLEET_OUTAGE.0),
                        Duration::from_secs(FLEET_OUTAGE.1),
                    )),
                    seed: Some(seed),
                    ..Faults::none()
                })
                .ledger_dedupe(false)
                .with_idempotency_layer()
                .start("127.0.0.1:0"),
        )
        .unwrap();
    let url = format!("{}/v1/charges", sim.url());
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            NewJob::new(
                "pay",
                "http",
                json!({"method": "POST", "url": url,
                       "body": {"amount": 100 + i, "currency": "EUR"}, "timeout_ms": 2000}),
            )
            .key(format!("order-{i}"))
            .dependency("psp")
            .policy("fleet")
        })
        .collect();
    block(Store::Postgres(pg.clone()).enqueue_many(&jobs, Utc::now())).unwrap();
    sim.reset();
    let t = Instant::now();
    let offsets = if fleet.offsets.is_empty() {
        vec!["0s"; 3]
    } else {
        fleet.offsets.clone()
    };
    let workers: Vec<Running> = offsets
        .iter()
        .map(|offset| {
            redrive_testkit::cli!()
                .cmd()
                .env("REDRIVE_CLOCK_OFFSET", offset)
                .env(
                    "REDRIVE_CLOCK_SYNC",
                    if fleet.unsynced { "off" } else { "on" },
                )
                .args(["--db", &db, "--policies"])
                .arg(&policies)
                .args(["work", "--queue", "pay", "--concurrency", "8"])
                .args(["--shutdown-grace", "1s", "--allow-host", "loopback"])
                .args(&fleet.work_args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map(Running)
                .unwrap()
        })
        .collect();
    all_succeeded(&pg, n as u64, Duration::from_secs(180));
    let seconds = t.elapsed().as_secs_f64();
    let workers_seen = block(
        Store::Postgres(pg.clone()).workers(block(Store::Postgres(pg.clone()).db_time()).unwrap()),
    )
    .unwrap();
    stop(workers);
    let rescues: i64 = block(
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM redrive_attempts WHERE error LIKE 'lease expired%'",
        )
        .fetch_one(pg.pool()),
    )
    .unwrap();
    let keys: Vec<String> = block(
        sqlx::query_scalar("SELECT idempotency_key FROM redrive_jobs WHERE queue = 'ticks'")
            .fetch_all(pg.pool()),
    )
    .unwrap();
    let mut ticks: Vec<chrono::DateTime<Utc>> = keys
        .iter()
        .map(|k| {
            let t = k.strip_prefix("schedule:every-second:").unwrap();
            chrono::DateTime::parse_from_rfc3339(t).unwrap().to_utc()
        })
        .collect();
    ticks.sort();
    let run = FleetRun {
        seconds,
        stats: sim.stats(),
        log: sim.request_log(),
        rescues,
        offsets_ms: workers_seen.iter().map(|w| w.clock_offset_ms).collect(),
        ticks,
    };
    block(fresh.drop_now());
    Some(run)
}

/// The demo's `psp_load` figures, by the same definitions (see the README): the largest
/// requests per 100 ms after the first 10 s over the limit's 100 ms share; the share of 429s;
/// the outage plus the requests that had to be made at the limit; the run over that minimum;
/// the outage's end to the first 2xx.
fn psp_load(r: &FleetRun) -> (f64, f64, f64, f64, f64) {
    let at = |x: &redrive_psp_sim::RequestRecord| x.t_us as f64 / 1e6;
    let total = r.log.len() as f64;
    let limited = r.log.iter().filter(|x| x.status == 429).count() as f64;
    let mut slices = std::collections::HashMap::<u64, u64>::new();
    for x in r.log.iter().filter(|x| at(x) >= 10.0) {
        *slices.entry(x.t_us / 100_000).or_default() += 1;
    }
    let peak = slices.values().copied().max().unwrap_or(0) as f64 / (FLEET_LIMIT / 10.0);
    let (o0, o1) = (
        FLEET_OUTAGE.0 as f64,
        (FLEET_OUTAGE.0 + FLEET_OUTAGE.1) as f64,
    );
    let in_outage = r
        .log
        .iter()
        .filter(|x| at(x) >= o0 && at(x) < o1 && x.status != 429)
        .count() as f64;
    let minimum = FLEET_OUTAGE.1 as f64 + (total - limited - in_outage) / FLEET_LIMIT;
    let back = r
        .log
        .iter()
        .filter(|x| (200..300).contains(&x.status) && at(x) >= o1)
        .map(|x| at(x) - o1)
        .fold(f64::INFINITY, f64::min);
    (peak, limited / total, minimum, r.seconds / minimum, back)
}

fn exactly_once(r: &FleetRun, n: usize) {
    assert!(!r.stats.ledger_dedupe);
    assert_eq!(r.stats.charges, n as u64);
    assert_eq!(r.stats.duplicate_effects, 0);
    assert!(r.stats.effects_max_per_key <= 1);
}

/// The fleet learns the PSP's limit and keeps to it after the outage, few 429s, every charge
/// made exactly once. Generous bounds: the exact figures are the benchmark's (below).
#[test]
fn three_processes_keep_to_the_psps_rate_limit_through_an_outage() {
    const N: usize = 500;
    let _one = three_at_a_time();
    let Some(r) = fleet_run(N, 7) else { return };
    let (peak, share, minimum, vs, back) = psp_load(&r);
    let report = format!(
        "{:.1} s, {} requests, statuses {:?}; peak_ratio {peak:.2}, share_429 {:.1}%, \
         minimum {minimum:.1} s, vs_minimum {vs:.2}, back {back:.2} s",
        r.seconds,
        r.log.len(),
        r.stats.requests_by_status,
        share * 100.0
    );
    assert!(peak <= 4.0, "peak too high: {report}");
    assert!(share <= 0.10, "too many 429s: {report}");
    exactly_once(&r, N);
    eprintln!("{report}");
}

/// The benchmark of issue 15's fleet scenario: five seeds, 1,000 charges each, medians.
/// `cargo test --release -p redrive-cli --test fleet -- --ignored --nocapture fleet_psp_load_benchmark`
#[test]
#[ignore = "a benchmark: about 2 minutes"]
fn fleet_psp_load_benchmark() {
    const N: usize = 1000;
    let mut rows = vec![];
    for seed in 1..=5 {
        let Some(r) = fleet_run(N, seed) else { return };
        exactly_once(&r, N);
        let f = psp_load(&r);
        eprintln!(
            "seed {seed}: {:.1} s, {} requests; peak_ratio {:.2}, share_429 {:.2}%, minimum {:.1} s, \
             vs_minimum {:.3}, back_after_outage {:.2} s",
            r.seconds,
            r.log.len(),
            f.0,
            f.1 * 100.0,
            f.2,
            f.3,
            f.4
        );
        rows.push(f);
    }
    let median = |k: fn(&(f64, f64, f64, f64, f64)) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(k).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "median: peak_ratio {:.2}, share_429 {:.2}%, vs_minimum {:.3}, back_after_outage {:.2} s",
        median(|f| f.0),
        median(|f| f.1) * 100.0,
        median(|f| f.3),
        median(|f| f.4)
    );
}

/// Issue 35: three `redrive work` processes whose clocks are 3 s ahead, right and 3 s behind
/// (`REDRIVE_CLOCK_OFFSET`), a 6 s lease, the fleet scenario's PSP (rate limit with
/// `Retry-After: 1`, errors, an outage): no lease is taken from a live worker (no attempt
/// ended by a rescue), and every charge is made exactly once. Each process measured its
/// offset to the database and the registry shows it.
///
/// Without the sync (`REDRIVE_CLOCK_SYNC=off`, by hand: `SKEW_UNSYNCED=1 cargo test -p
/// redrive-cli --test fleet skewed -- --nocapture`) the process 3 s ahead takes the leases of
/// the one 3 s behind as soon as they are claimed, and this test fails.
#[test]
fn three_processes_with_skewed_clocks_take_no_live_lease() {
    const N: usize = 300;
    let _one = three_at_a_time();
    let unsynced = std::env::var("SKEW_UNSYNCED").is_ok_and(|v| v == "1");
    let fleet = Fleet {
        offsets: vec!["3s", "0s", "-3s"],
        unsynced,
        work_args: vec!["--lease", "6s"],
        schedule: true,
    };
    let Some(r) = fleet_run_with(N, 11, &fleet) else {
        return;
    };
    eprintln!(
        "{:.1} s, {} requests, statuses {:?}, rescues {}, duplicate effects {}, offsets {:?}",
        r.seconds,
        r.log.len(),
        r.stats.requests_by_status,
        r.rescues,
        r.stats.duplicate_effects,
        r.offsets_ms
    );
    assert_eq!(r.rescues, 0, "attempts ended by a rescue of a live lease");
    exactly_once(&r, N);
    // The schedule ticked every second for the whole run: each tick once (its key), none
    // skipped, whichever process's scheduler took it.
    let ticks = &r.ticks;
    assert!(
        ticks.len() as f64 >= r.seconds - 4.0,
        "{} ticks in {:.1} s",
        ticks.len(),
        r.seconds
    );
    for w in ticks.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_milliseconds(),
            1000,
            "ticks {} then {}: skipped or doubled",
            w[0],
            w[1]
        );
    }
    if !unsynced {
        let mut offsets: Vec<i64> = r.offsets_ms.iter().map(|o| o.unwrap()).collect();
        offsets.sort();
        assert_eq!(offsets.len(), 3, "{:?}", r.offsets_ms);
        for (got, want) in offsets.iter().zip([-3_000, 0, 3_000]) {
            assert!(
                (got - want).abs() < 500,
                "offsets {offsets:?}: each process's own skew, measured"
            );
        }
    }
}
