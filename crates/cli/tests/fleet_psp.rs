//! The fleet's effect on a PSP with the configuration a new user gets: several `redrive
//! work` processes on one PostgreSQL schema, no policies file, jobs enqueued as `redrive
//! enqueue` and `POST /v1/jobs` build them (policy `payment`, the dependency the URL's host),
//! against the PSP simulator. Every figure is read from the simulator's own request log,
//! never from the workers.
//!
//! The scenarios are issue 35's: 3 processes × 16 against 50/s with `Retry-After: 1`, 10% 5xx
//! and a 5 s outage from 4 s; 5 and 8 processes × 16 against 40/s with `Retry-After: 3` and
//! 5% 5xx (the same outage). The simulator's own dedupe is off: only its idempotency layer
//! protects the charges, and every run asserts each charge was made exactly once.
//!
//! `cargo test --release -p redrive-cli --test fleet_psp -- --ignored --nocapture` runs the
//! benchmark (5 seeds of each scenario, medians); the quick test below runs one short seed
//! with bounds loose enough for a loaded CI machine.
//!
//! Uses `REDRIVE_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`); fails,
//! not skips, when `CI=true` and the server is unreachable.

use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::Utc;
use redrive_http::validate::JobRequest;
use redrive_psp_sim::{Faults, Outage, PspSim, RequestRecord};
use redrive_store::Store;
use redrive_testkit::cli::{Running, block, terminate};
use serde_json::json;

#[path = "support/pg_fleet.rs"]
mod pg_fleet;
use pg_fleet::{all_succeeded, schema};

/// One scenario: the fleet and the PSP.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    processes: usize,
    concurrency: usize,
    charges: usize,
    limit: f64,
    retry_after_s: u64,
    error_rate: f64,
    /// Outage start and length, seconds from the simulator's reset.
    outage: (u64, u64),
}

const THREE: Scenario = Scenario {
    processes: 3,
    concurrency: 16,
    charges: 1000,
    limit: 50.0,
    retry_after_s: 1,
    error_rate: 0.1,
    outage: (4, 5),
};

/// The PSP-side figures of one run (definitions on each field).
#[derive(Debug, Clone, Copy)]
struct Load {
    /// The run's wall time, from the workers' start to the last job's success.
    seconds: f64,
    /// The outage plus the requests the PSP admitted outside it at the limit.
    minimum: f64,
    /// `seconds / minimum`.
    vs_minimum: f64,
    /// The most requests in any one second (a sliding window on 100 ms steps) after the first
    /// 5 s, over the limit.
    peak_1s: f64,
    /// Share of all requests answered 429.
    share_429: f64,
    /// From the outage's end to the end of the first whole second in which the PSP admitted
    /// (answered other than 429) at least 80% of its limit.
    back_80: f64,
    /// From the outage's end to the first 2xx.
    first_2xx: f64,
    /// Requests in the first 100 ms of the run, over the limit's 100 ms share.
    first_100ms: f64,
}

/// Runs `s` once with the simulator seeded by `seed`; `None` when PostgreSQL is unreachable
/// (and CI is not set).
fn run(s: Scenario, seed: u64) -> Option<(Load, Vec<RequestRecord>)> {
    let (fresh, pg) = schema("rdfleetpsp", 2)?;
    let db = fresh.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(
            PspSim::builder()
                .faults(Faults {
                    error_rate: s.error_rate,
                    rate_limit: Some(s.limit),
                    retry_after: Some(Duration::from_secs(s.retry_after_s)),
                    outage: Some(Outage::new(
                        Duration::from_secs(s.outage.0),
                        Duration::from_secs(s.outage.1),
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
    let policies = redrive_policy::PolicySet::builtin();
    let policy = policies.get("payment").unwrap();
    let jobs: Vec<_> = (0..s.charges)
        .map(|i| {
            JobRequest {
                key: Some(format!("order-{i}")),
                ..JobRequest::new(
                    "pay",
                    "http",
                    json!({"method": "POST", "url": url,
                           "body": {"amount": 100 + i, "currency": "EUR"}}),
                )
            }
            .build(policy, Utc::now())
            .unwrap()
        })
        .collect();
    let store = Store::Postgres(pg.clone());
    block(store.enqueue_many(&jobs, Utc::now())).unwrap();
    sim.reset();
    let t = Instant::now();
    let workers: Vec<Running> = (0..s.processes)
        .map(|_| {
            redrive_testkit::cli!()
                .cmd()
                .args(["--db", &db, "work", "--allow-host", "loopback"])
                .args(["--queue", "pay", "--concurrency"])
                .arg(s.concurrency.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map(Running)
                .unwrap()
        })
        .collect();
    all_succeeded(&pg, s.charges as u64, Duration::from_secs(240));
    let seconds = t.elapsed().as_secs_f64();
    terminate(workers, Duration::from_secs(30));
    let stats = sim.stats();
    assert!(!stats.ledger_dedupe);
    assert_eq!(stats.charges, s.charges as u64, "every charge made");
    assert_eq!(stats.duplicate_effects, 0, "no charge made twice");
    assert!(stats.effects_max_per_key <= 1);
    let log = sim.request_log();
    block(fresh.drop_now());
    Some((load(s, seconds, &log), log))
}

/// The figures of [`Load`] from the simulator's request log.
fn load(s: Scenario, seconds: f64, log: &[RequestRecord]) -> Load {
    let at = |x: &RequestRecord| x.t_us as f64 / 1e6;
    let total = log.len() as f64;
    let limited = log.iter().filter(|x| x.status == 429).count() as f64;
    let (o0, o1) = (s.outage.0 as f64, (s.outage.0 + s.outage.1) as f64);
    let in_outage = log
        .iter()
        .filter(|x| at(x) >= o0 && at(x) < o1 && x.status != 429)
        .count() as f64;
    let minimum = s.outage.1 as f64 + (total - limited - in_outage) / s.limit;
    // Requests (all, and admitted) per 100 ms slice.
    let end = log.iter().map(|x| x.t_us / 100_000).max().unwrap_or(0) as usize + 1;
    let (mut all, mut admitted) = (vec![0u32; end + 10], vec![0u32; end + 10]);
    for x in log {
        let i = (x.t_us / 100_000) as usize;
        all[i] += 1;
        if x.status != 429 {
            admitted[i] += 1;
        }
    }
    let second = |v: &[u32], i: usize| v[i..(i + 10).min(v.len())].iter().sum::<u32>() as f64;
    let peak_1s = (50..end).map(|i| second(&all, i)).fold(0.0, f64::max) / s.limit;
    let first = (o1 * 10.0) as usize;
    let back_80 = (first..end)
        .find(|&i| second(&admitted, i) >= 0.8 * s.limit)
        .map_or(f64::INFINITY, |i| (i + 10) as f64 / 10.0 - o1);
    let first_2xx = log
        .iter()
        .filter(|x| (200..300).contains(&x.status) && at(x) >= o1)
        .map(|x| at(x) - o1)
        .fold(f64::INFINITY, f64::min);
    // The first 100 ms from the first request (the processes' start-up is not the PSP's).
    let t0 = log.iter().map(|x| x.t_us).min().unwrap_or(0);
    let first_100ms =
        log.iter().filter(|x| x.t_us < t0 + 100_000).count() as f64 / (s.limit / 10.0);
    Load {
        seconds,
        minimum,
        vs_minimum: seconds / minimum,
        peak_1s,
        share_429: limited / total,
        back_80,
        first_2xx,
        first_100ms,
    }
}

fn show(name: &str, l: &Load, requests: usize) -> String {
    format!(
        "{name}: {:.1} s, {requests} requests, minimum {:.1} s, vs_minimum {:.3}, peak_1s {:.2}, \
         share_429 {:.2}%, back_80 {:.2} s, first_2xx {:.2} s, first_100ms {:.2}",
        l.seconds,
        l.minimum,
        l.vs_minimum,
        l.peak_1s,
        l.share_429 * 100.0,
        l.back_80,
        l.first_2xx,
        l.first_100ms
    )
}

/// Three processes with the default configuration keep to the PSP's limit and come back
/// after its outage; every charge exactly once. Bounds loose enough for a loaded CI machine:
/// the exact figures are the benchmark's.
#[test]
fn three_default_processes_keep_to_the_psps_limit_and_come_back_after_an_outage() {
    let s = Scenario {
        charges: 600,
        ..THREE
    };
    let Some((l, log)) = run(s, 7) else { return };
    let report = show("seed 7", &l, log.len());
    eprintln!("{report}");
    assert!(l.share_429 <= 0.05, "too many 429s: {report}");
    assert!(l.peak_1s <= 2.0, "too far above the limit: {report}");
    assert!(l.back_80 <= 5.0, "too slow back after the outage: {report}");
    assert!(l.vs_minimum <= 1.5, "too slow: {report}");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench(name: &str, s: Scenario) {
    let mut loads = vec![];
    for seed in 1..=5 {
        let Some((l, log)) = run(s, seed) else { return };
        eprintln!("{}", show(&format!("{name} seed {seed}"), &l, log.len()));
        loads.push(l);
    }
    let m = |f: fn(&Load) -> f64| median(&mut loads.iter().map(f).collect::<Vec<_>>());
    eprintln!(
        "{name} median: vs_minimum {:.3}, peak_1s {:.2}, share_429 {:.2}%, back_80 {:.2} s, \
         first_2xx {:.2} s, first_100ms {:.2}",
        m(|l| l.vs_minimum),
        m(|l| l.peak_1s),
        m(|l| l.share_429) * 100.0,
        m(|l| l.back_80),
        m(|l| l.first_2xx),
        m(|l| l.first_100ms)
    );
}

/// Issue 35's benchmark: 3 processes against 50/s, then 5 and 8 against 40/s with
/// `Retry-After: 3` and 5% 5xx; five seeds each, medians. About 10 minutes.
#[test]
#[ignore = "a benchmark: about 10 minutes"]
fn fleet_default_configuration_benchmark() {
    let only = std::env::var("FLEET_BENCH_ONLY").ok();
    let wanted = |n: &str| only.as_deref().is_none_or(|o| o == n);
    if wanted("3") {
        bench("3x16 50/s", THREE);
    }
    for p in [5, 8] {
        if wanted(&p.to_string()) {
            let s = Scenario {
                processes: p,
                limit: 40.0,
                retry_after_s: 3,
                error_rate: 0.05,
                ..THREE
            };
            bench(&format!("{p}x16 40/s"), s);
        }
    }
}
