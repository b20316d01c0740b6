//! Policy hot paths, side by side with backon (backoff) and failsafe (breaker) in the same run,
//! and the flow-control machine the fleet shares (one event applied to a dependency's row).
//!
//! Run: `cargo bench -p redrive-policy --bench policy` (`-- flow` for the flow machine alone)

use std::hint::black_box;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use criterion::BatchSize;
use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use redrive_policy::{
    BreakerConfig, BreakerState, CallResult, CircuitBreaker, ExponentialBuilder, FailureClass,
    FlowClient, FlowConfig, FlowEvent, FlowRow, Jitter, JobCounters, Next, Outcome, RateConfig,
    RetryPolicy, Window,
};

fn delays(c: &mut Criterion) {
    let mut g = c.benchmark_group("delay");
    let b = ExponentialBuilder::new()
        .with_base(Duration::from_millis(200))
        .with_cap(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut rng = SmallRng::seed_from_u64(1);
    let mut n = 0u32;
    g.bench_function("redrive/one full-jitter delay", |bench| {
        bench.iter(|| {
            n = (n + 1) % 10;
            black_box(Jitter::Full.apply(
                b.nominal(black_box(n)),
                b.base(),
                b.cap(),
                None,
                &mut rng,
            ))
        })
    });
    g.bench_function("redrive/ten full-jitter delays", |bench| {
        bench.iter(|| {
            let mut total = Duration::ZERO;
            for n in 0..10 {
                total += Jitter::Full.apply(b.nominal(n), b.base(), b.cap(), None, &mut rng);
            }
            black_box(total)
        })
    });
    g.bench_function("backon/ten jittered delays (build + 10 next)", |bench| {
        bench.iter(|| {
            let it = backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(30))
                .with_jitter()
                .with_jitter_seed(1)
                .with_max_times(10);
            use backon::BackoffBuilder;
            black_box(it.build().sum::<Duration>())
        })
    });
    g.finish();
}

fn decision(c: &mut Criterion) {
    let p = RetryPolicy::payment();
    let now = Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap();
    let counters = JobCounters {
        attempts: 3,
        first_attempt_at: Some(now),
        deadline: p.deadline_from(now),
        ..Default::default()
    };
    let mut rng = SmallRng::seed_from_u64(1);
    c.bench_function("decision/redrive payment, 5xx on attempt 4", |bench| {
        bench.iter(|| {
            black_box(p.decide(
                black_box(&counters),
                black_box(&Outcome::Infrastructure { retry_after: None }),
                now,
                &mut rng,
            ))
        })
    });
}

fn breaker_config() -> BreakerConfig {
    // Never opens in the bench: a success-only workload measures the closed hot path.
    BreakerConfig::builder()
        .with_window(Window::Count { size: 100 })
        .with_minimum_calls(100)
        .build()
        .unwrap()
}

fn breakers(c: &mut Criterion) {
    let mut g = c.benchmark_group("breaker admit+record");
    let now = Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap();
    let d = Duration::from_millis(20);

    let mut b = CircuitBreaker::new(breaker_config(), 1);
    g.bench_function("redrive/CircuitBreaker, 1 thread", |bench| {
        bench.iter(|| {
            black_box(b.admit(now));
            black_box(b.record(FailureClass::Success, d, now))
        })
    });
    let fs = failsafe::Config::new().build();
    g.bench_function("failsafe/StateMachine, 1 thread", |bench| {
        bench.iter(|| {
            black_box(fs.is_call_permitted());
            fs.on_success();
        })
    });
    g.finish();
}

/// One event applied to a dependency's shared row ([`FlowConfig::apply`]), and a worker's
/// look before a call ([`FlowClient::before_call`]): what each call to a dependency costs in
/// the policy crate, before any store I/O. Each iteration starts from the same row.
fn flow(c: &mut Criterion) {
    let mut g = c.benchmark_group("flow");
    let now = Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap();
    let second = chrono::Duration::seconds(1);
    let wait = Duration::from_secs(1);
    let mut rng = SmallRng::seed_from_u64(1);
    let cfg = FlowConfig::default()
        .with_rate(RateConfig::fixed(80.0).unwrap())
        .unwrap();
    let limited = FlowRow {
        rate: Some(80.0),
        tat: Some(now),
        ..FlowRow::default()
    };
    let reserve = FlowEvent::Reserve { max_ahead: wait };
    g.bench_function("apply Reserve (rate in force)", |b| {
        b.iter(|| black_box(cfg.apply(black_box(&limited), reserve, now, &mut rng)))
    });
    let half_open = FlowRow {
        state: BreakerState::HalfOpen,
        probe_permits: 5,
        round_started: Some(now),
        openings: 1,
        ..FlowRow::default()
    };
    g.bench_function("apply TakeProbe", |b| {
        b.iter(|| black_box(cfg.apply(black_box(&half_open), FlowEvent::TakeProbe, now, &mut rng)))
    });
    let answered = FlowEvent::ProbeAnswered {
        result: CallResult::Success,
    };
    let probing = FlowRow {
        probe_permits: 3,
        probe_successes: 1,
        ..half_open.clone()
    };
    g.bench_function("apply ProbeAnswered", |b| {
        b.iter(|| black_box(cfg.apply(black_box(&probing), answered, now, &mut rng)))
    });
    let limited_429 = FlowEvent::RateLimited {
        pause_until: Some(now + second),
        served_per_s: Some(80.0),
        delivered: None,
        probe: false,
    };
    g.bench_function("apply RateLimited", |b| {
        b.iter(|| black_box(cfg.apply(black_box(&limited), limited_429, now, &mut rng)))
    });
    // A worker that holds send slots takes the next one without touching the row.
    let mut holder = FlowClient::new(cfg.clone(), 1);
    let Next::Apply(ev) = holder.before_call(&limited, false, wait, now) else {
        panic!("a limited row asks for a reservation first")
    };
    let step = cfg.apply(&limited, ev, now, &mut rng);
    let row = step.row;
    assert!(matches!(
        holder.granted(step.grant, wait, now),
        Next::CallAt { .. }
    ));
    assert!(holder.slots_held() > 0);
    g.bench_function("FlowClient::before_call, slot held", |b| {
        b.iter_batched_ref(
            || holder.clone(),
            |client| black_box(client.before_call(black_box(&row), false, wait, now)),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = delays, decision, breakers, flow
}
criterion_main!(benches);
