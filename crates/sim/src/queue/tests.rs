use std::time::Duration;

use redrive_policy::{BreakerConfig, FlowConfig, Jitter, RateConfig, RetryPolicy, Window};

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A policy that retries in process for a long while, without a window.
fn policy() -> RetryPolicy {
    RetryPolicy::builder("test")
        .with_max_attempts(100)
        .without_window()
        .with_jitter(Jitter::Full)
        .with_blocked_jitter(ms(100))
        .build()
        .unwrap()
}

/// No limiter, no breaker that could open.
fn open_flow() -> FlowConfig {
    FlowConfig::default().with_rate(RateConfig::off()).unwrap()
}

fn healthy(latency: Duration) -> PspModel {
    PspModel {
        latency,
        ..PspModel::default()
    }
}

/// No store time, no network: only the PSP's latency and the claim loop.
fn bare(jobs: u32, workers: u32, flow: FlowConfig, psp: PspModel) -> QueueConfig {
    QueueConfig {
        jobs,
        workers,
        net: Duration::ZERO,
        store: Duration::ZERO,
        ..QueueConfig::new(policy(), flow, psp)
    }
}

#[test]
fn a_healthy_psp_takes_jobs_times_latency_over_workers() {
    let cfg = bare(160, 16, open_flow(), healthy(ms(10)));
    let r = run_queue(&cfg, 1).unwrap();
    // Ten waves of sixteen, 10 ms each: the whole batch ends at once, so the claim loop
    // takes all sixteen slots again without lingering.
    assert!((r.seconds - 0.100).abs() < 1e-9, "{}", r.seconds);
    assert_eq!(r.succeeded, 160);
    assert_eq!(r.requests_total, 160);
    assert_eq!(r.charges, 160);
    assert!(r.finished);
    // With the default network and store times, each wave also pays a claim, two network
    // legs and a write: 10 × (10 + 1 + 0.5 + 0.5 + 1) ms.
    let cfg = QueueConfig {
        jobs: 160,
        workers: 16,
        ..QueueConfig::new(policy(), open_flow(), healthy(ms(10)))
    };
    let r = run_queue(&cfg, 1).unwrap();
    assert!((r.seconds - 0.130).abs() < 1e-9, "{}", r.seconds);
}

#[test]
fn an_idle_claim_loop_polls_for_deferred_jobs() {
    // Every first call fails (the PSP's outage covers the first 50 ms); the retries wait in
    // process, so the claim loop only polls; the run ends once every job got through.
    let psp = PspModel {
        outage: Some(PspOutage {
            start: Duration::ZERO,
            length: ms(50),
        }),
        ..healthy(ms(10))
    };
    let cfg = bare(4, 8, open_flow(), psp);
    let r = run_queue(&cfg, 3).unwrap();
    assert_eq!(r.succeeded, 4);
    assert!(r.seconds > 0.05, "{}", r.seconds);
    assert_eq!(r.attempts_by_class["success"], 4);
    assert!(r.attempts_by_class["infrastructure"] >= 4);
}

#[test]
fn a_fixed_limit_never_lets_more_than_its_rate_plus_burst_through_in_100ms() {
    for rate in [20.0, 50.0, 80.0] {
        let flow = FlowConfig::default()
            .with_rate(RateConfig::fixed(rate).unwrap())
            .unwrap();
        let cfg = QueueConfig {
            jobs: 300,
            workers: 16,
            ..QueueConfig::new(policy(), flow, healthy(ms(10)))
        };
        let r = run_queue(&cfg, 2).unwrap();
        assert_eq!(r.succeeded, 300);
        let burst = f64::from(redrive_policy::DEFAULT_RATE_BURST);
        assert!(
            f64::from(r.peak_per_100ms) <= rate / 10.0 + burst,
            "{rate}/s: peak {}",
            r.peak_per_100ms
        );
        // …and it is the limit, not the workers, that sets the pace: the first call and the
        // burst go at once, then one call per interval.
        assert!(
            r.seconds >= (300.0 - 1.0 - burst) / rate,
            "{rate}: {}",
            r.seconds
        );
        assert!(r.seconds <= 300.0 / rate + 0.5, "{rate}: {}", r.seconds);
    }
}

fn outage_breaker() -> FlowConfig {
    let b = BreakerConfig::builder()
        .with_window(Window::Count { size: 20 })
        .with_minimum_calls(10)
        .with_failure_rate(0.5)
        .with_open_cooldown(ms(500))
        .with_cooldown_jitter(0.0)
        .with_half_open_probes(3)
        .build()
        .unwrap();
    FlowConfig::default()
        .with_breaker(b)
        .with_rate(RateConfig::off())
        .unwrap()
}

#[test]
fn while_the_breaker_is_open_only_probes_reach_the_psp() {
    let psp = PspModel {
        outage: Some(PspOutage {
            start: ms(1000),
            length: ms(3000),
        }),
        ..healthy(ms(10))
    };
    let cfg = QueueConfig {
        jobs: 2000,
        workers: 16,
        net: Duration::ZERO,
        ..QueueConfig::new(policy(), outage_breaker(), psp)
    };
    let r = run_queue(&cfg, 5).unwrap();
    assert_eq!(r.succeeded, 2000);
    let half_opens = r
        .breaker_transitions
        .iter()
        .filter(|t| t.to == "half_open")
        .count() as u64;
    assert!(half_opens >= 2, "{:?}", r.breaker_transitions);
    // No call leaves a worker while the row says open; in half-open, only the round's probes.
    assert_eq!(r.calls_while_open, 0);
    assert!(
        r.probes >= half_opens && r.probes <= 3 * half_opens,
        "{} probes, {half_opens} rounds",
        r.probes
    );
    // After the first opening, every request the outage saw was a probe.
    let first_open = r
        .breaker_transitions
        .iter()
        .find(|t| t.to == "open")
        .unwrap()
        .t_s;
    let from = (first_open * 10.0).ceil() as usize;
    let during: u32 = r.failed[from..40].iter().sum();
    assert!(
        u64::from(during) <= r.probes,
        "{during} requests, {} probes",
        r.probes
    );
    assert!(r.probes > 0);
    // R10, no churn: the claim skips the queue's jobs while the breaker is open, so only the
    // jobs already running (or coming back just then) are deferred, not the 2,000.
    let openings = r
        .breaker_transitions
        .iter()
        .filter(|t| t.to == "open")
        .count();
    assert!(
        r.blocked < 50 * openings as u64,
        "{} deferrals, {openings} openings",
        r.blocked
    );
}

#[test]
fn lost_answers_are_replayed_never_charged_twice() {
    let psp = PspModel {
        lost_answers: 0.3,
        hold_back: ms(2000),
        ..healthy(ms(10))
    };
    let cfg = QueueConfig {
        jobs: 500,
        workers: 16,
        call_timeout: ms(1000),
        ..QueueConfig::new(policy(), open_flow(), psp)
    };
    let r = run_queue(&cfg, 4).unwrap();
    assert_eq!(r.succeeded, 500);
    assert_eq!(r.charges, 500);
    let timeouts = r.attempts_by_class["timeout"];
    assert!(timeouts > 100 && timeouts < 200, "{timeouts}");
    // Each lost answer's retry is answered by the replay, never held back.
    assert_eq!(r.replays, timeouts);
    assert_eq!(r.requests_total, 500 + timeouts);
}

#[test]
fn runs_are_reproducible_per_seed() {
    let psp = PspModel {
        rate_limit: Some(80.0),
        retry_after: Some(Duration::from_secs(1)),
        error_rate: 0.2,
        lost_answers: 0.05,
        hold_back: ms(2000),
        ..healthy(ms(10))
    };
    let cfg = QueueConfig {
        jobs: 300,
        call_timeout: ms(1000),
        poll: ms(50),
        ..QueueConfig::new(policy(), FlowConfig::default(), psp)
    };
    let a = run_queue(&cfg, 9).unwrap();
    assert_eq!(a, run_queue(&cfg, 9).unwrap());
    assert_ne!(a, run_queue(&cfg, 10).unwrap());
    let many = run_queue_many(&cfg, 3, 9, &|_| {}).unwrap();
    assert_eq!(many[0], a);
    assert_eq!(many.iter().map(|r| r.seed).collect::<Vec<_>>(), [9, 10, 11]);
    let load = a.psp_load.unwrap();
    assert_eq!(load.limit_rps, 80.0);
    assert!(load.share_429 > 0.0 && load.share_429 < 0.5, "{load:?}");
    assert!(load.vs_minimum >= 1.0, "{load:?}");
}

#[test]
fn bad_parameters_are_named() {
    let mut cfg = bare(10, 2, open_flow(), healthy(ms(1)));
    cfg.jobs = 0;
    assert!(run_queue(&cfg, 1).unwrap_err().to_string().contains("jobs"));
    let mut cfg = bare(10, 2, open_flow(), healthy(ms(1)));
    cfg.psp.error_rate = 1.5;
    assert!(
        run_queue(&cfg, 1)
            .unwrap_err()
            .to_string()
            .contains("error rate")
    );
    let cfg = bare(10, 2, open_flow(), healthy(ms(1)));
    assert!(
        run_queue_many(&cfg, 0, 1, &|_| {})
            .unwrap_err()
            .to_string()
            .contains("runs")
    );
}

#[test]
fn several_processes_drain_one_queue_each_with_its_slots() {
    // Three processes of 16 slots: three times the concurrency of one, every job once.
    let one = bare(480, 16, open_flow(), healthy(ms(10)));
    let three = QueueConfig {
        processes: 3,
        ..one.clone()
    };
    let r1 = run_queue(&one, 1).unwrap();
    let r3 = run_queue(&three, 1).unwrap();
    assert_eq!(
        (r3.succeeded, r3.charges, r3.requests_total),
        (480, 480, 480)
    );
    assert!((r1.seconds - 0.300).abs() < 1e-9, "{}", r1.seconds);
    assert!((r3.seconds - 0.100).abs() < 1e-9, "{}", r3.seconds);
}

/// The fleet of the issue: 3 processes × 16 workers, 1,000 charges, a PSP at 50/s with
/// `Retry-After: 1`, the default flow control. The learned rate after a 429 is cut relative
/// to what the fleet got through: the PSP keeps getting close to its limit, the run stays
/// near the minimum, and few requests get a 429.
#[test]
fn a_fleet_of_three_processes_learns_the_limit_as_one() {
    let psp = PspModel {
        rate_limit: Some(50.0),
        retry_after: Some(Duration::from_secs(1)),
        ..PspModel::default()
    };
    let cfg = QueueConfig {
        jobs: 1000,
        workers: 16,
        processes: 3,
        ..QueueConfig::new(policy(), FlowConfig::default(), psp)
    };
    for seed in 1..=3 {
        let r = run_queue(&cfg, seed).unwrap();
        assert_eq!(r.succeeded, 1000);
        let load = r.psp_load.unwrap();
        assert!(load.vs_minimum < 1.15, "seed {seed}: {load:?}");
        assert!(load.share_429 < 0.03, "seed {seed}: {load:?}");
    }
}

#[test]
fn skewed_clocks_change_nothing_that_is_not_time() {
    let psp = PspModel {
        rate_limit: Some(50.0),
        retry_after: Some(Duration::from_secs(1)),
        ..PspModel::default()
    };
    let cfg = QueueConfig {
        jobs: 300,
        workers: 16,
        processes: 3,
        clock_skew: ms(300),
        ..QueueConfig::new(policy(), FlowConfig::default(), psp)
    };
    let r = run_queue(&cfg, 1).unwrap();
    assert_eq!((r.succeeded, r.charges), (300, 300));
    let too_much = QueueConfig {
        clock_skew: Duration::from_secs(7200),
        ..cfg
    };
    let e = run_queue(&too_much, 1).unwrap_err().to_string();
    assert!(e.contains("clock skew"), "{e}");
}
