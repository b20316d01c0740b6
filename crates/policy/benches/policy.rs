//! Policy hot paths, side by side with backon (backoff) and failsafe (breaker) in the same run.
//!
//! Run: `cargo bench -p redrive-policy --bench policy`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use redrive_policy::{
    BreakerConfig, CircuitBreaker, ExponentialBuilder, FailureClass, Jitter, JobCounters, Outcome,
    RetryPolicy, SharedBreaker, Window,
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
    let shared = SharedBreaker::new(breaker_config(), 1);
    g.bench_function("redrive/SharedBreaker (mutex), 1 thread", |bench| {
        bench.iter(|| {
            black_box(shared.admit(now));
            black_box(shared.record(FailureClass::Success, d, now))
        })
    });
    let fs = failsafe::Config::new().build();
    g.bench_function("failsafe/StateMachine, 1 thread", |bench| {
        bench.iter(|| {
            black_box(fs.is_call_permitted());
            fs.on_success();
        })
    });

    // Two threads hammering one breaker: the time per admit+record pair on this thread while
    // another thread does the same.
    let shared = Arc::new(SharedBreaker::new(breaker_config(), 1));
    g.bench_function("redrive/SharedBreaker (mutex), 2 threads", |bench| {
        bench.iter_custom(|iters| {
            let other = shared.clone();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            let h = std::thread::spawn(move || {
                while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                    other.admit(now);
                    other.record(FailureClass::Success, d, now);
                }
            });
            let t = std::time::Instant::now();
            for _ in 0..iters {
                black_box(shared.admit(now));
                black_box(shared.record(FailureClass::Success, d, now));
            }
            let e = t.elapsed();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            h.join().unwrap();
            e
        })
    });
    let fs = Arc::new(failsafe::Config::new().build());
    g.bench_function("failsafe/StateMachine, 2 threads", |bench| {
        bench.iter_custom(|iters| {
            let other = fs.clone();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            let h = std::thread::spawn(move || {
                while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                    other.is_call_permitted();
                    other.on_success();
                }
            });
            let t = std::time::Instant::now();
            for _ in 0..iters {
                black_box(fs.is_call_permitted());
                fs.on_success();
            }
            let e = t.elapsed();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            h.join().unwrap();
            e
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = delays, decision, breakers
}
criterion_main!(benches);
