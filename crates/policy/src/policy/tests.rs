//! The decision table, row by row, and its invariants.

use super::*;
use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn t0() -> Timestamp {
    Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn rng() -> SmallRng {
    SmallRng::seed_from_u64(7)
}

/// A jitter-free policy so delays are exact.
fn exact() -> RetryPolicy {
    RetryPolicy::builder("exact")
        .with_backoff(
            ExponentialBuilder::new()
                .with_base(secs(1))
                .with_multiplier(2.0)
                .with_cap(secs(60))
                .build()
                .unwrap(),
        )
        .with_jitter(Jitter::None)
        .with_max_attempts(5)
        .with_window(secs(600))
        .with_in_process_max_wait(secs(10))
        .with_max_exceptions(3)
        .build()
        .unwrap()
}

fn after(n: u32) -> JobCounters {
    JobCounters {
        attempts: n,
        first_attempt_at: Some(t0()),
        ..Default::default()
    }
}

fn infra() -> Outcome {
    Outcome::Infrastructure { retry_after: None }
}

#[test]
fn success_is_done() {
    let v = exact().decide(&after(2), &Outcome::Success, t0(), &mut rng());
    assert_eq!(v.action, Action::Done);
    assert_eq!(v.counters.attempts, 3);
    assert!(v.counted);
}

#[test]
fn permanent_is_dead_at_once() {
    let v = exact().decide(&after(0), &Outcome::Permanent, t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::Permanent
        }
    );
    assert_eq!(v.counters.attempts, 1);
}

#[test]
fn first_401_refreshes_without_counting_second_is_final() {
    let p = exact();
    let v = p.decide(&after(4), &Outcome::Auth, t0(), &mut rng());
    assert_eq!(v.action, Action::RefreshCredentials);
    assert!(!v.counted);
    assert_eq!(
        v.counters.attempts, 4,
        "a first 401 does not use up an attempt"
    );
    assert_eq!(v.counters.consecutive_auth, 1);

    let v2 = p.decide(&v.counters, &Outcome::Auth, t0(), &mut rng());
    assert_eq!(
        v2.action,
        Action::Dead {
            reason: DeadReason::Auth
        }
    );
    assert_eq!(v2.counters.attempts, 5);
}

#[test]
fn a_401_after_a_success_streak_resets() {
    let p = exact();
    let v = p.decide(&after(0), &Outcome::Auth, t0(), &mut rng());
    // The call after the refresh fails with a 500: the 401 streak ends.
    let v = p.decide(&v.counters, &infra(), t0(), &mut rng());
    assert_eq!(v.counters.consecutive_auth, 0);
    let v = p.decide(&v.counters, &Outcome::Auth, t0(), &mut rng());
    assert_eq!(v.action, Action::RefreshCredentials);
}

#[test]
fn rate_limit_with_short_retry_after_retries_in_process_and_pauses() {
    let v = exact().decide(
        &after(0),
        &Outcome::RateLimited {
            retry_after: Some(secs(2)),
        },
        t0(),
        &mut rng(),
    );
    assert_eq!(
        v.action,
        Action::RetryInProcess {
            delay: secs(2),
            source: DelaySource::RetryAfter
        }
    );
    assert_eq!(v.pause_until, Some(t0() + TimeDelta::seconds(2)));
}

#[test]
fn rate_limit_with_long_retry_after_defers_instead_of_sleeping() {
    let v = exact().decide(
        &after(0),
        &Outcome::RateLimited {
            retry_after: Some(secs(45)),
        },
        t0(),
        &mut rng(),
    );
    assert_eq!(
        v.action,
        Action::Defer {
            until: t0() + TimeDelta::seconds(45),
            delay: secs(45),
            reason: DeferReason::RateLimited,
            source: DelaySource::RetryAfter,
        }
    );
    assert_eq!(v.pause_until, Some(t0() + TimeDelta::seconds(45)));
}

#[test]
fn rate_limit_without_retry_after_uses_the_formula() {
    let v = exact().decide(
        &after(1),
        &Outcome::RateLimited { retry_after: None },
        t0(),
        &mut rng(),
    );
    assert_eq!(
        v.action,
        Action::RetryInProcess {
            delay: secs(2),
            source: DelaySource::Backoff
        }
    );
    assert_eq!(v.pause_until, Some(t0() + TimeDelta::seconds(2)));
}

#[test]
fn retry_after_is_clamped() {
    let p = RetryPolicy::builder("c")
        .with_retry_after_max(secs(30))
        .build()
        .unwrap();
    let v = p.decide(
        &after(0),
        &Outcome::RateLimited {
            retry_after: Some(secs(100_000)),
        },
        t0(),
        &mut rng(),
    );
    assert!(matches!(v.action, Action::Defer { delay, .. } if delay == secs(30)));
}

#[test]
fn infrastructure_follows_the_exact_backoff_then_defers() {
    let p = exact();
    // Delays 1, 2, 4, 8 are in process (≤ 10 s); attempt 5 is the last one.
    let mut c = JobCounters::default();
    let mut delays = vec![];
    for _ in 0..4 {
        let v = p.decide(&c, &infra(), t0(), &mut rng());
        match v.action {
            Action::RetryInProcess { delay, source } => {
                assert_eq!(source, DelaySource::Backoff);
                delays.push(delay);
            }
            other => panic!("expected a retry, got {other:?}"),
        }
        assert!(v.pause_until.is_none());
        c = v.counters;
    }
    assert_eq!(delays, vec![secs(1), secs(2), secs(4), secs(8)]);
    let v = p.decide(&c, &infra(), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::AttemptsExhausted
        }
    );
    assert_eq!(v.counters.attempts, 5);
}

#[test]
fn a_backoff_delay_longer_than_in_process_max_wait_defers() {
    let p = RetryPolicy::builder("d")
        .with_backoff(Backoff::constant(secs(20)).unwrap())
        .with_jitter(Jitter::None)
        .build()
        .unwrap();
    let v = p.decide(&after(0), &infra(), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Defer {
            until: t0() + TimeDelta::seconds(20),
            delay: secs(20),
            reason: DeferReason::Backoff,
            source: DelaySource::Backoff,
        }
    );
}

#[test]
fn in_process_max_wait_is_inclusive() {
    let p = RetryPolicy::builder("d")
        .with_backoff(Backoff::constant(secs(10)).unwrap())
        .with_jitter(Jitter::None)
        .with_in_process_max_wait(secs(10))
        .build()
        .unwrap();
    let v = p.decide(&after(0), &infra(), t0(), &mut rng());
    assert!(matches!(v.action, Action::RetryInProcess { .. }));
}

#[test]
fn ambiguous_timeout_with_key_retries_without_key_dies() {
    let p = exact();
    let v = p.decide(
        &after(0),
        &Outcome::Timeout { idempotent: true },
        t0(),
        &mut rng(),
    );
    assert!(matches!(v.action, Action::RetryInProcess { delay, .. } if delay == secs(1)));
    let v = p.decide(
        &after(0),
        &Outcome::Timeout { idempotent: false },
        t0(),
        &mut rng(),
    );
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::Ambiguous
        }
    );
}

#[test]
fn exceptions_are_retried_until_max_exceptions() {
    let p = exact(); // max_exceptions = 3
    let mut c = JobCounters::default();
    for i in 1..=2 {
        let v = p.decide(&c, &Outcome::Exception, t0(), &mut rng());
        assert!(matches!(v.action, Action::RetryInProcess { .. }), "{i}");
        assert_eq!(v.counters.exceptions, i);
        c = v.counters;
    }
    let v = p.decide(&c, &Outcome::Exception, t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::ExceptionsExhausted
        }
    );
    assert_eq!(v.counters.exceptions, 3);
}

#[test]
fn exceptions_count_across_the_defer_phase() {
    let p = RetryPolicy::payment(); // 5 exceptions, 10 attempts, defer phase
    let c = JobCounters {
        attempts: 12,
        exceptions: 4,
        defers: 2,
        first_attempt_at: Some(t0()),
        ..Default::default()
    };
    let v = p.decide(
        &c,
        &Outcome::Exception,
        t0() + TimeDelta::hours(1),
        &mut rng(),
    );
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::ExceptionsExhausted
        }
    );
}

#[test]
fn the_window_ends_the_retry_phase() {
    let p = exact(); // window 600 s
    let now = t0() + TimeDelta::seconds(600);
    let v = p.decide(&after(1), &infra(), now, &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::WindowExhausted
        }
    );
    let v = p.decide(&after(1), &infra(), now - TimeDelta::seconds(1), &mut rng());
    assert!(matches!(v.action, Action::RetryInProcess { .. }));
}

#[test]
fn the_window_starts_at_the_first_attempt() {
    let p = exact();
    // No first attempt yet: this one starts the window, even far in the future.
    let v = p.decide(
        &JobCounters::default(),
        &infra(),
        t0() + TimeDelta::days(3),
        &mut rng(),
    );
    assert_eq!(v.counters.first_attempt_at, Some(t0() + TimeDelta::days(3)));
    assert!(matches!(v.action, Action::RetryInProcess { .. }));
}

#[test]
fn the_defer_phase_follows_its_schedule_then_dies() {
    let p = RetryPolicy::builder("d")
        .with_jitter(Jitter::None)
        .with_max_attempts(1)
        .with_defer(
            Backoff::schedule(vec![secs(60), secs(300)], secs(3600)).unwrap(),
            Jitter::None,
            3,
        )
        .build()
        .unwrap();
    assert_eq!(p.total_max_attempts(), 4);
    let mut c = JobCounters::default();
    let mut got = vec![];
    for _ in 0..3 {
        let v = p.decide(&c, &infra(), t0(), &mut rng());
        match v.action {
            Action::Defer {
                delay,
                reason,
                source,
                ..
            } => {
                assert_eq!(reason, DeferReason::DeferPhase);
                assert_eq!(source, DelaySource::DeferSchedule);
                got.push(delay);
            }
            other => panic!("expected a defer, got {other:?}"),
        }
        c = v.counters;
    }
    assert_eq!(got, vec![secs(60), secs(300), secs(300)]);
    assert_eq!(c.defers, 3);
    let v = p.decide(&c, &infra(), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::DefersExhausted
        }
    );
}

#[test]
fn a_longer_retry_after_wins_in_the_defer_phase() {
    let p = RetryPolicy::builder("d")
        .with_max_attempts(1)
        .with_defer(Backoff::constant(secs(60)).unwrap(), Jitter::None, 3)
        .build()
        .unwrap();
    let ra = |s| Outcome::RateLimited {
        retry_after: Some(secs(s)),
    };
    let v = p.decide(&after(0), &ra(600), t0(), &mut rng());
    assert!(matches!(v.action, Action::Defer { delay, .. } if delay == secs(600)));
    let v = p.decide(&after(0), &ra(5), t0(), &mut rng());
    assert!(matches!(v.action, Action::Defer { delay, .. } if delay == secs(60)));
}

#[test]
fn a_429_in_the_defer_phase_pauses_the_fleet_for_the_retry_after_not_the_defer_schedule() {
    let p = RetryPolicy::builder("d")
        .with_max_attempts(1)
        .with_defer(Backoff::constant(secs(3600)).unwrap(), Jitter::None, 3)
        .build()
        .unwrap();
    // The job waits its hour; the fleet pauses the 5 s the server asked.
    let v = p.decide(
        &after(1),
        &Outcome::RateLimited {
            retry_after: Some(secs(5)),
        },
        t0(),
        &mut rng(),
    );
    assert!(matches!(v.action, Action::Defer { delay, .. } if delay == secs(3600)));
    assert_eq!(v.pause_until, Some(t0() + TimeDelta::seconds(5)));
    // Without a Retry-After no fleet-wide pause (the learned rate is cut instead).
    let v = p.decide(
        &after(1),
        &Outcome::RateLimited { retry_after: None },
        t0(),
        &mut rng(),
    );
    assert!(matches!(v.action, Action::Defer { delay, .. } if delay == secs(3600)));
    assert_eq!(v.pause_until, None);
    // Another class never pauses.
    let v = p.decide(&after(1), &infra(), t0(), &mut rng());
    assert_eq!(v.pause_until, None);
}

#[test]
fn the_deadline_ends_everything() {
    let p = RetryPolicy::payment();
    let c = JobCounters {
        attempts: 1,
        first_attempt_at: Some(t0()),
        deadline: Some(t0() + TimeDelta::seconds(10)),
        ..Default::default()
    };
    // Passed.
    let v = p.decide(&c, &infra(), t0() + TimeDelta::seconds(10), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::Deadline
        }
    );
    // A wait that would end after it.
    let v = p.decide(
        &c,
        &Outcome::RateLimited {
            retry_after: Some(secs(60)),
        },
        t0(),
        &mut rng(),
    );
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::Deadline
        }
    );
}

#[test]
fn blocked_defers_to_the_probe_time_plus_spread_and_is_not_an_attempt() {
    let p = RetryPolicy::payment();
    let probe = t0() + TimeDelta::seconds(30);
    for seed in 0..50 {
        let mut r = SmallRng::seed_from_u64(seed);
        match p.decide_blocked(&after(3), probe, DeferReason::BreakerOpen, t0(), &mut r) {
            Action::Defer {
                until,
                reason,
                source,
                ..
            } => {
                assert!(
                    until >= probe && until <= probe + TimeDelta::seconds(2),
                    "{until}"
                );
                assert_eq!(reason, DeferReason::BreakerOpen);
                assert_eq!(source, DelaySource::Blocked);
            }
            other => panic!("{other:?}"),
        }
    }
    let c = JobCounters {
        deadline: Some(t0() + TimeDelta::seconds(10)),
        ..after(3)
    };
    assert_eq!(
        p.decide_blocked(&c, probe, DeferReason::BreakerOpen, t0(), &mut rng()),
        Action::Dead {
            reason: DeadReason::Deadline
        }
    );
}

#[test]
fn presets_are_valid_and_match_the_issue() {
    for name in RetryPolicy::PRESETS {
        let p = RetryPolicy::preset(name).unwrap();
        p.validate().unwrap();
        assert_eq!(p.name, *name);
    }
    let p = RetryPolicy::payment();
    assert_eq!(p.retry.max_attempts, 10);
    assert_eq!(p.retry.window, Some(secs(300)));
    assert_eq!(p.retry.backoff.nominal(0), Duration::from_millis(200));
    assert_eq!(p.retry.backoff.cap(), secs(30));
    assert_eq!(p.deadline, Some(secs(86_400)));
    assert_eq!(p.total_max_attempts(), 15);
    let d = p.defer.as_ref().unwrap();
    let sched: Vec<_> = (0..5).map(|n| d.schedule.nominal(n)).collect();
    assert_eq!(
        sched,
        vec![secs(60), secs(300), secs(900), secs(3600), secs(14_400)]
    );
    assert_eq!(RetryPolicy::background().retry.max_attempts, 3);
    let c = RetryPolicy::classic();
    assert_eq!(c.retry.max_attempts, 5);
    assert_eq!(c.max_exceptions, Some(3));
    assert_eq!(c.retry.jitter, Jitter::proportional(0.5).unwrap());
    assert_eq!(c.retry.backoff.cap(), secs(60));
    assert!(RetryPolicy::preset("nope").is_none());
}

#[test]
fn invalid_fields_are_named() {
    let e = RetryPolicy::builder("x")
        .with_max_attempts(0)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("retry.max_attempts"), "{e}");
    let e = RetryPolicy::builder("x")
        .with_in_process_max_wait(secs(3600))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("in_process_max_wait"), "{e}");
    let e = RetryPolicy::builder("x")
        .with_max_exceptions(0)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("max_exceptions"), "{e}");
    let e = RetryPolicy::builder("bad name").build().unwrap_err();
    assert!(e.to_string().contains("name"), "{e}");
}

#[test]
fn every_field_is_refused_out_of_range_by_build() {
    let b = || RetryPolicy::builder("x");
    let one = Backoff::constant(secs(1)).unwrap();
    let cases: Vec<(RetryPolicyBuilder, &str)> = vec![
        (
            b().with_max_attempts(MAX_ATTEMPTS_LIMIT + 1),
            "invalid retry.max_attempts = 1001: must be from 1 to 1000",
        ),
        (
            b().with_window(Duration::ZERO),
            "invalid retry.window = 0ms",
        ),
        (
            b().with_window(MAX_DEADLINE + secs(1)),
            "invalid retry.window = ",
        ),
        (
            b().with_retry_after_max(Duration::ZERO),
            "invalid retry.retry_after_max = 0ms",
        ),
        (
            b().with_defer(one.clone(), Jitter::Full, 0),
            "invalid defer.max_defers = 0: must be from 1 to 1000",
        ),
        (
            b().with_defer(one.clone(), Jitter::Full, MAX_DEFERS_LIMIT + 1),
            "invalid defer.max_defers = 1001",
        ),
        (b().with_deadline(Duration::ZERO), "invalid deadline = 0ms"),
        (
            b().with_decline_retry_later(Duration::ZERO),
            "invalid declines.retry_later = 0ms",
        ),
        (
            b().with_blocked_jitter(secs(3601)),
            "invalid blocked_jitter = ",
        ),
        (b().with_name(""), "invalid name = \"\""),
        (b().with_name("a".repeat(65)), "invalid name = "),
    ];
    for (builder, want) in cases {
        let e = builder.build().unwrap_err().to_string();
        assert!(e.starts_with(want), "{e:?} should start with {want:?}");
    }
    for bad in [0, MAX_DEFERS_LIMIT + 1] {
        let e = DeferPhase::new(one.clone(), Jitter::Full, bad).unwrap_err();
        assert!(e.to_string().contains("defer.max_defers"), "{e}");
    }
    let d = DeferPhase::new(one.clone(), Jitter::None, MAX_DEFERS_LIMIT).unwrap();
    assert_eq!(
        (d.schedule(), d.jitter(), d.max_defers()),
        (&one, Jitter::None, MAX_DEFERS_LIMIT)
    );
}

#[test]
fn into_builder_keeps_every_field_and_the_without_setters_clear_them() {
    for name in RetryPolicy::PRESETS {
        let p = RetryPolicy::preset(name).unwrap();
        assert_eq!(p.clone().into_builder().build().unwrap(), p);
    }
    let p = RetryPolicy::payment()
        .into_builder()
        .with_name("other")
        .without_defer()
        .without_deadline()
        .without_max_exceptions()
        .without_window()
        .build()
        .unwrap();
    assert_eq!(p.name(), "other");
    assert_eq!(p.defer(), None);
    assert_eq!(p.deadline(), None);
    assert_eq!(p.max_exceptions(), None);
    assert_eq!(p.retry().window(), None);
    assert_eq!(
        p.retry().backoff(),
        RetryPolicy::payment().retry().backoff()
    );
    let d = DeferPhase::new(Backoff::constant(secs(60)).unwrap(), Jitter::None, 2).unwrap();
    let p = p
        .into_builder()
        .with_defer_phase(d.clone())
        .build()
        .unwrap();
    assert_eq!(p.defer(), Some(&d));
    assert_eq!(p.total_max_attempts(), 12);
}

proptest! {
    /// Whatever values a builder is given, `build` refuses them or the policy decides every
    /// outcome without panicking.
    #[test]
    fn built_policies_never_panic(
        attempts in 0u32..1100,
        window_s in proptest::option::of(0u64..40_000_000),
        in_process_s in 0u64..400,
        retry_after_s in 0u64..100_000,
        defers in proptest::option::of(0u32..1100),
        exceptions in proptest::option::of(0u32..20),
        deadline_s in proptest::option::of(0u64..40_000_000),
        blocked_s in 0u64..4000,
        counters in (0u32..2000, 0u32..30, 0u32..2000, 0u32..3),
        outcome in arb_outcome(),
        seed in any::<u64>(),
    ) {
        let mut b = RetryPolicy::builder("p")
            .with_max_attempts(attempts)
            .with_in_process_max_wait(secs(in_process_s))
            .with_retry_after_max(secs(retry_after_s))
            .with_blocked_jitter(secs(blocked_s));
        if let Some(w) = window_s { b = b.with_window(secs(w)); }
        if let Some(n) = defers {
            b = b.with_defer(Backoff::schedule(vec![secs(60)], secs(60)).unwrap(), Jitter::Full, n);
        }
        if let Some(n) = exceptions { b = b.with_max_exceptions(n); }
        if let Some(d) = deadline_s { b = b.with_deadline(secs(d)); }
        let Ok(p) = b.build() else { return Ok(()) };
        prop_assert!(p.retry().max_attempts() >= 1);
        let now = t0();
        let c = JobCounters {
            attempts: counters.0,
            exceptions: counters.1,
            defers: counters.2,
            consecutive_auth: counters.3,
            first_attempt_at: Some(now),
            deadline: p.deadline_from(now),
            prev_delay: None,
        };
        let mut rng = SmallRng::seed_from_u64(seed);
        let v = p.decide(&c, &outcome, now, &mut rng);
        prop_assert!(v.counters.attempts >= c.attempts);
    }
}

fn arb_outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Success),
        Just(Outcome::Permanent),
        Just(Outcome::Auth),
        proptest::option::of(0u64..200).prop_map(|s| Outcome::RateLimited {
            retry_after: s.map(secs)
        }),
        proptest::option::of(0u64..200).prop_map(|s| Outcome::Infrastructure {
            retry_after: s.map(secs)
        }),
        any::<bool>().prop_map(|idempotent| Outcome::Timeout { idempotent }),
        Just(Outcome::Exception),
    ]
}

proptest! {
    /// Replaying any sequence of outcomes through the decision, advancing time by each delay:
    /// never more counted attempts than the policy allows, never more exceptions, delays never
    /// above their caps, and every death names the budget that actually ran out.
    #[test]
    fn budgets_hold_for_any_sequence(
        seed in any::<u64>(),
        outcomes in proptest::collection::vec(arb_outcome(), 1..80),
        preset in 0usize..3,
    ) {
        let p = RetryPolicy::preset(RetryPolicy::PRESETS[preset]).unwrap();
        let mut r = SmallRng::seed_from_u64(seed);
        let mut now = t0();
        let mut c = JobCounters { deadline: p.deadline_from(now), ..Default::default() };
        for o in outcomes {
            let v = p.decide(&c, &o, now, &mut r);
            prop_assert!(v.counters.attempts <= p.total_max_attempts());
            if let Some(m) = p.max_exceptions {
                prop_assert!(v.counters.exceptions <= m);
            }
            match v.action {
                Action::Done | Action::Dead { .. } => {
                    if let Action::Dead { reason } = v.action {
                        match reason {
                            DeadReason::AttemptsExhausted => {
                                prop_assert!(v.counters.attempts >= p.retry.max_attempts);
                                prop_assert!(p.defer.is_none());
                            }
                            DeadReason::DefersExhausted => {
                                let d = p.defer.as_ref().unwrap();
                                prop_assert_eq!(v.counters.defers, d.max_defers);
                            }
                            DeadReason::ExceptionsExhausted => {
                                prop_assert_eq!(Some(v.counters.exceptions), p.max_exceptions);
                                prop_assert_eq!(o, Outcome::Exception);
                            }
                            DeadReason::WindowExhausted => {
                                let w = p.retry.window.unwrap();
                                let first = v.counters.first_attempt_at.unwrap();
                                prop_assert!(since(now, first) >= w);
                            }
                            DeadReason::Permanent => prop_assert_eq!(o, Outcome::Permanent),
                            DeadReason::Auth => prop_assert_eq!(o, Outcome::Auth),
                            DeadReason::Ambiguous => prop_assert_eq!(o, Outcome::Timeout { idempotent: false }),
                            DeadReason::Deadline => prop_assert!(c.deadline.is_some()),
                            DeadReason::LeaseExpired => prop_assert!(false, "decide never says lease_expired"),
                            DeadReason::DoNotRetry
                            | DeadReason::UpdatePaymentMethod
                            | DeadReason::RecurringStopped => prop_assert!(o.decline().is_some()),
                            DeadReason::ReattemptQuota => prop_assert!(false, "decide never says reattempt_quota"),
                            DeadReason::CardStopped => prop_assert!(false, "decide never says card_stopped"),
                        }
                    }
                    break;
                }
                Action::RefreshCredentials => {}
                Action::RetryInProcess { delay, .. } => {
                    prop_assert!(delay <= p.retry.in_process_max_wait);
                    now = add(now, delay);
                }
                Action::Defer { until, delay, .. } => {
                    prop_assert!(delay > p.retry.in_process_max_wait || p.defer.is_some());
                    prop_assert!(until >= now);
                    if let Some(dl) = c.deadline { prop_assert!(until <= dl); }
                    now = until;
                }
            }
            c = v.counters;
        }
    }

    #[test]
    fn retry_phase_delays_never_exceed_the_cap(seed in any::<u64>(), attempts in 0u32..9) {
        let p = RetryPolicy::payment();
        let mut r = SmallRng::seed_from_u64(seed);
        let v = p.decide(&after(attempts), &infra(), t0(), &mut r);
        if let Action::RetryInProcess { delay, .. } | Action::Defer { delay, .. } = v.action {
            prop_assert!(delay <= p.retry.backoff.cap());
        }
    }
}

// ===== the decline rows =====

fn visa(cat: u8) -> Outcome {
    Outcome::Declined(
        crate::DeclineAdvice::new(crate::Network::Visa, Some("05"), Some(cat), None).unwrap(),
    )
}

fn mac(m: u8) -> Outcome {
    Outcome::Declined(crate::DeclineAdvice::mastercard("05", Some(m)).unwrap())
}

fn first(deadline: Option<Duration>) -> JobCounters {
    JobCounters {
        deadline: deadline.map(|d| add(t0(), d)),
        ..Default::default()
    }
}

#[test]
fn visa_category_1_is_dead_after_one_attempt() {
    let v = exact().decide(&first(None), &visa(1), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::DoNotRetry
        }
    );
    assert_eq!(v.counters.attempts, 1);
    assert_eq!(v.pause_until, None);
}

#[test]
fn mac_03_is_dead_do_not_retry() {
    let v = exact().decide(&first(None), &mac(3), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::DoNotRetry
        }
    );
}

#[test]
fn mac_25_defers_exactly_24_hours() {
    let v = exact().decide(&first(None), &mac(25), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Defer {
            until: add(t0(), secs(24 * 3600)),
            delay: secs(24 * 3600),
            reason: DeferReason::DeclineAdvice,
            source: DelaySource::DeclineAdvice,
        }
    );
    assert_eq!(v.counters.attempts, 1);
    // Then one attempt: an approval after the wait is done.
    let later = add(t0(), secs(24 * 3600));
    let v2 = exact().decide(&v.counters, &Outcome::Success, later, &mut rng());
    assert_eq!(v2.action, Action::Done);
    assert_eq!(v2.counters.attempts, 2);
}

#[test]
fn every_mac_wait_is_exact() {
    let hours = [1u64, 24, 48, 96, 144, 192, 240];
    for (m, h) in (24u8..=30).zip(hours) {
        let v = exact().decide(&first(None), &mac(m), t0(), &mut rng());
        assert!(
            matches!(v.action, Action::Defer { delay, reason: DeferReason::DeclineAdvice, .. } if delay == secs(h * 3600)),
            "MAC {m}: {:?}",
            v.action
        );
    }
}

#[test]
fn mac_21_is_dead_recurring_stopped() {
    let v = exact().decide(&first(None), &mac(21), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::RecurringStopped
        }
    );
}

#[test]
fn visa_category_3_and_mac_01_are_dead_update_payment_method() {
    for o in [visa(3), mac(1), mac(4)] {
        let v = exact().decide(&first(None), &o, t0(), &mut rng());
        assert_eq!(
            v.action,
            Action::Dead {
                reason: DeadReason::UpdatePaymentMethod
            },
            "{o:?}"
        );
    }
}

#[test]
fn retry_later_declines_defer_by_the_policy_wait() {
    let p = RetryPolicy::builder("later")
        .with_decline_retry_later(secs(90))
        .build()
        .unwrap();
    for o in [visa(2), visa(4), mac(2)] {
        let v = p.decide(&first(None), &o, t0(), &mut rng());
        assert_eq!(
            v.action,
            Action::Defer {
                until: add(t0(), secs(90)),
                delay: secs(90),
                reason: DeferReason::DeclineAdvice,
                source: DelaySource::DeclineAdvice,
            },
            "{o:?}"
        );
    }
}

#[test]
fn a_decline_wait_past_the_deadline_is_dead_deadline() {
    let v = exact().decide(&first(Some(secs(3600))), &mac(25), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::Deadline
        }
    );
    // MAC 24 (1 h) ends exactly at the deadline: still allowed.
    let v = exact().decide(&first(Some(secs(3600))), &mac(24), t0(), &mut rng());
    assert!(matches!(v.action, Action::Defer { .. }), "{:?}", v.action);
}

#[test]
fn declines_use_up_the_attempt_budget() {
    let p = exact();
    let c = JobCounters {
        attempts: p.total_max_attempts() - 1,
        first_attempt_at: Some(t0()),
        ..Default::default()
    };
    let v = p.decide(&c, &visa(2), t0(), &mut rng());
    assert_eq!(
        v.action,
        Action::Dead {
            reason: DeadReason::AttemptsExhausted
        }
    );
}

#[test]
fn quota_exhausted_defers_to_the_window_edge_or_dies() {
    let p = RetryPolicy::payment();
    let edge = add(t0(), secs(7200));
    let c = first(Some(secs(3 * 3600)));
    assert_eq!(
        p.decide_quota(&c, edge, t0()),
        Action::Defer {
            until: edge,
            delay: secs(7200),
            reason: DeferReason::ReattemptQuota,
            source: DelaySource::Quota,
        }
    );
    let c = first(Some(secs(3600)));
    assert_eq!(
        p.decide_quota(&c, edge, t0()),
        Action::Dead {
            reason: DeadReason::ReattemptQuota
        }
    );
}

#[test]
fn a_decline_is_never_a_breaker_failure() {
    let b = crate::BreakerConfig::default();
    assert_eq!(
        b.result_of(crate::FailureClass::Declined),
        crate::CallResult::Success
    );
    let e = crate::BreakerConfig::builder()
        .with_failure_classes(&[
            crate::FailureClass::Infrastructure,
            crate::FailureClass::Declined,
        ])
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("declined"), "{e}");
}

fn arb_decline() -> impl Strategy<Value = Outcome> {
    (
        0usize..5,
        proptest::option::of(1u8..=4),
        proptest::option::of(1u8..=40),
    )
        .prop_map(|(n, cat, m)| {
            Outcome::Declined(
                crate::DeclineAdvice::new(crate::Network::ALL[n], Some("51"), cat, m).unwrap(),
            )
        })
}

proptest! {
    /// A decline never waits in process, never pauses the fleet, never defers past the
    /// deadline, and never defers shorter than its network's advised wait.
    #[test]
    fn declines_never_retry_in_process(o in arb_decline(), attempts in 0u32..20, preset in 0usize..3) {
        let p = RetryPolicy::preset(RetryPolicy::PRESETS[preset]).unwrap();
        let c = JobCounters { attempts, deadline: p.deadline_from(t0()), ..Default::default() };
        let v = p.decide(&c, &o, t0(), &mut rng());
        prop_assert_eq!(v.pause_until, None);
        let waits = matches!(v.action, Action::RetryInProcess { .. } | Action::Done);
        prop_assert!(!waits);
        if let Action::Defer { until, delay, .. } = v.action {
            if let Some(d) = c.deadline { prop_assert!(until <= d); }
            if let crate::DeclineRule::RetryAfter(w) = o.decline().unwrap().rule() {
                prop_assert!(delay >= w);
            }
        }
    }
}

/// Runs `p` against infrastructure failures until it stops; the attempts made and the end.
fn attempts_until_dead(p: &RetryPolicy) -> (u32, Action) {
    let mut c = JobCounters::default();
    loop {
        let v = p.decide(&c, &infra(), t0(), &mut rng());
        c = v.counters;
        if let Action::Dead { .. } = v.action {
            return (c.attempts, v.action);
        }
        assert!(c.attempts <= 1000, "no end");
    }
}

#[test]
fn a_job_limit_below_the_retry_phase_ends_the_job_after_that_many_attempts() {
    let p = exact().into_builder().with_defer(
        Backoff::schedule(vec![secs(60)], secs(3600)).unwrap(),
        Jitter::None,
        4,
    );
    let p = p.build().unwrap();
    assert_eq!(p.total_max_attempts(), 9);
    let limited = p.limited_to(3);
    assert_eq!(limited.total_max_attempts(), 3);
    let dead = Action::Dead {
        reason: DeadReason::AttemptsExhausted,
    };
    assert_eq!(attempts_until_dead(&limited), (3, dead));
    // Into the defer phase: the retry phase's 5, then 2 defers.
    let limited = p.limited_to(7);
    let dead = Action::Dead {
        reason: DeadReason::DefersExhausted,
    };
    assert_eq!(attempts_until_dead(&limited), (7, dead));
    // The policy's own budget wins over a larger or absent limit.
    assert_eq!(attempts_until_dead(&p.limited_to(50)).0, 9);
    assert_eq!(attempts_until_dead(&p.limited_to(0)).0, 9);
    assert!(matches!(p.limited_to(9), std::borrow::Cow::Borrowed(_)));
}
