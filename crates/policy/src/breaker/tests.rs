use super::*;
use crate::{FailureClass, Timestamp};
use chrono::Utc;
use chrono::{TimeDelta, TimeZone};
use proptest::prelude::*;
use std::time::Duration;

fn t0() -> Timestamp {
    Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()
}

fn at(ms: i64) -> Timestamp {
    t0() + TimeDelta::milliseconds(ms)
}

const D: Duration = Duration::from_millis(20);

fn config() -> BreakerConfig {
    BreakerConfig::builder()
        .with_window(Window::Count { size: 10 })
        .with_minimum_calls(5)
        .with_failure_rate(0.5)
        .with_open_cooldown(Duration::from_secs(10))
        .with_cooldown_multiplier(2.0)
        .with_cooldown_max(Duration::from_secs(35))
        .with_cooldown_jitter(0.0)
        .with_half_open_probes(2)
        .with_half_open_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn trip(b: &mut CircuitBreaker, now: Timestamp) -> Transition {
    for _ in 0..20 {
        if let Some(t) = b.record(FailureClass::Infrastructure, D, now) {
            return t;
        }
    }
    panic!("did not open");
}

#[test]
fn opens_at_the_failure_rate_after_minimum_calls() {
    let mut b = CircuitBreaker::new(config(), 1);
    // 4 failures: under the minimum of 5 calls, stays closed.
    for _ in 0..4 {
        assert_eq!(b.record(FailureClass::Infrastructure, D, t0()), None);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    let t = b.record(FailureClass::Timeout, D, t0()).unwrap();
    assert_eq!((t.from, t.to), (BreakerState::Closed, BreakerState::Open));
    assert_eq!(t.open_until, Some(at(10_000)));
    assert!(matches!(
        t.reason,
        TransitionReason::FailureRate { calls: 5, .. }
    ));
    assert_eq!(
        b.admit(at(9_999)).0,
        Admission::Rejected {
            until: Some(at(10_000))
        }
    );
}

#[test]
fn successes_keep_it_closed_below_the_rate() {
    let mut b = CircuitBreaker::new(config(), 1);
    for i in 0..100 {
        let class = if i % 3 == 0 {
            FailureClass::Infrastructure
        } else {
            FailureClass::Success
        };
        assert_eq!(b.record(class, D, t0()), None, "call {i}");
    }
    assert_eq!(b.state(), BreakerState::Closed);
}

#[test]
fn default_classes_rate_limits_and_declines_do_not_open_it() {
    let mut b = CircuitBreaker::new(config(), 1);
    for _ in 0..50 {
        assert_eq!(b.record(FailureClass::RateLimited, D, t0()), None);
        assert_eq!(b.record(FailureClass::Exception, D, t0()), None);
    }
    assert_eq!(
        b.window_counts(t0()).0,
        0,
        "ignored classes are not counted"
    );
    for _ in 0..50 {
        assert_eq!(b.record(FailureClass::Permanent, D, t0()), None);
        assert_eq!(b.record(FailureClass::Auth, D, t0()), None);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(b.window_counts(t0()), (10, 0, 0));
}

#[test]
fn failure_classes_are_configurable() {
    let c = BreakerConfig::builder()
        .with_minimum_calls(2)
        .with_failure_classes(&[FailureClass::RateLimited])
        .build()
        .unwrap();
    let mut b = CircuitBreaker::new(c, 1);
    // Infrastructure now counts as a success: it never opens the breaker.
    for _ in 0..20 {
        assert_eq!(b.record(FailureClass::Infrastructure, D, t0()), None);
    }
    // 20 successes, then rate limits: opens when they are half the calls.
    let n = (1..=50)
        .find(|_| b.record(FailureClass::RateLimited, D, t0()).is_some())
        .expect("opens");
    assert_eq!(n, 20);
}

#[test]
fn half_open_admits_exactly_the_probe_limit_then_closes() {
    let mut b = CircuitBreaker::new(config(), 1);
    trip(&mut b, t0());
    let (a, t) = b.admit(at(10_000));
    assert_eq!(a, Admission::Probe);
    let t = t.unwrap();
    assert_eq!((t.from, t.to), (BreakerState::Open, BreakerState::HalfOpen));
    assert_eq!(b.admit(at(10_001)).0, Admission::Probe);
    assert!(matches!(b.admit(at(10_002)).0, Admission::Rejected { .. }));
    assert_eq!(b.record(FailureClass::Success, D, at(10_100)), None);
    let t = b.record(FailureClass::Success, D, at(10_200)).unwrap();
    assert_eq!(
        (t.from, t.to),
        (BreakerState::HalfOpen, BreakerState::Closed)
    );
    assert_eq!(t.reason, TransitionReason::ProbesSucceeded);
    assert_eq!(b.admit(at(10_300)).0, Admission::Allowed);
    assert_eq!(b.openings(), 0);
}

#[test]
fn a_failed_probe_reopens_with_a_longer_capped_cooldown() {
    let mut b = CircuitBreaker::new(config(), 1);
    trip(&mut b, t0());
    assert_eq!(b.admit(at(10_000)).0, Admission::Probe);
    let t = b
        .record(FailureClass::Infrastructure, D, at(10_500))
        .unwrap();
    assert_eq!(t.reason, TransitionReason::ProbeFailed);
    // second opening: 10 s × 2 = 20 s
    assert_eq!(t.open_until, Some(at(30_500)));
    assert_eq!(b.admit(at(30_500)).0, Admission::Probe);
    let t = b.record(FailureClass::Timeout, D, at(30_600)).unwrap();
    // third: 40 s, capped at 35 s
    assert_eq!(t.open_until, Some(at(65_600)));
}

#[test]
fn cooldown_jitter_stays_within_cap() {
    let c = BreakerConfig::builder()
        .with_minimum_calls(1)
        .with_open_cooldown(Duration::from_secs(10))
        .with_cooldown_max(Duration::from_secs(11))
        .with_cooldown_jitter(0.5)
        .build()
        .unwrap();
    for seed in 0..100 {
        let mut b = CircuitBreaker::new(c.clone(), seed);
        let t = b.record(FailureClass::Infrastructure, D, t0()).unwrap();
        let until = t.open_until.unwrap();
        assert!(until >= at(10_000) && until <= at(11_000), "{until}");
    }
}

#[test]
fn a_stuck_half_open_round_starts_again() {
    let mut b = CircuitBreaker::new(config(), 1);
    trip(&mut b, t0());
    assert_eq!(b.admit(at(10_000)).0, Admission::Probe);
    assert_eq!(b.admit(at(10_000)).0, Admission::Probe);
    assert_eq!(
        b.admit(at(14_999)).0,
        Admission::Rejected {
            until: Some(at(15_000))
        }
    );
    // The probes never answered; after the half-open timeout a new round starts.
    assert_eq!(b.admit(at(15_000)).0, Admission::Probe);
}

#[test]
fn time_window_forgets_old_calls() {
    let c = BreakerConfig::builder()
        .with_window(Window::Time {
            length: Duration::from_secs(10),
        })
        .with_minimum_calls(5)
        .build()
        .unwrap();
    let mut b = CircuitBreaker::new(c, 1);
    for i in 0..4 {
        assert_eq!(b.record(FailureClass::Infrastructure, D, at(i * 100)), None);
    }
    assert_eq!(b.window_counts(at(500)).0, 4);
    // 11 s later the old failures have left the window.
    assert_eq!(b.window_counts(at(11_500)).0, 0);
    assert_eq!(b.record(FailureClass::Infrastructure, D, at(11_500)), None);
    assert_eq!(b.state(), BreakerState::Closed);
    for i in 0..3 {
        assert_eq!(
            b.record(FailureClass::Infrastructure, D, at(11_600 + i)),
            None
        );
    }
    assert!(
        b.record(FailureClass::Infrastructure, D, at(11_700))
            .is_some()
    );
}

#[test]
fn slow_calls_open_it() {
    let c = BreakerConfig::builder()
        .with_minimum_calls(4)
        .with_slow_calls(Duration::from_secs(2), 0.75)
        .build()
        .unwrap();
    let mut b = CircuitBreaker::new(c, 1);
    let slow = Duration::from_secs(3);
    assert_eq!(b.record(FailureClass::Success, D, t0()), None);
    assert_eq!(b.record(FailureClass::Success, slow, t0()), None);
    assert_eq!(b.record(FailureClass::Success, slow, t0()), None);
    let t = b.record(FailureClass::Success, slow, t0()).unwrap();
    assert!(matches!(
        t.reason,
        TransitionReason::SlowCallRate { calls: 4, .. }
    ));
}

#[test]
fn forced_states_override_and_release() {
    let mut b = CircuitBreaker::new(config(), 1);
    let t = b.force(BreakerMode::ForcedOpen, t0()).unwrap();
    assert_eq!((t.from, t.to), (BreakerState::Closed, BreakerState::Open));
    assert_eq!(b.admit(t0()).0, Admission::Rejected { until: None });
    assert_eq!(b.record(FailureClass::Success, D, t0()), None);
    let t = b.force(BreakerMode::Normal, t0()).unwrap();
    assert_eq!(t.to, BreakerState::Closed);
    trip(&mut b, t0());
    let t = b.force(BreakerMode::ForcedClosed, t0()).unwrap();
    assert_eq!(t.to, BreakerState::Closed);
    assert_eq!(b.admit(t0()).0, Admission::Allowed);
    for _ in 0..50 {
        assert_eq!(b.record(FailureClass::Infrastructure, D, t0()), None);
    }
}

#[test]
fn observes_the_fleet_state() {
    let mut b = CircuitBreaker::new(config(), 1);
    let t = b
        .observe(BreakerState::Open, Some(at(5_000)), t0())
        .unwrap();
    assert_eq!(t.reason, TransitionReason::Remote);
    assert_eq!(b.open_until(), Some(at(5_000)));
    assert!(matches!(b.admit(at(4_000)).0, Admission::Rejected { .. }));
    // Seeing the same opening again changes nothing.
    assert_eq!(b.observe(BreakerState::Open, Some(at(5_000)), t0()), None);
    let t = b.observe(BreakerState::Closed, None, at(6_000)).unwrap();
    assert_eq!(t.to, BreakerState::Closed);
    assert_eq!(b.admit(at(6_000)).0, Admission::Allowed);
}

#[test]
fn invalid_config_names_the_field() {
    let cases: Vec<(BreakerConfigBuilder, &str)> = vec![
        (
            BreakerConfig::builder().with_failure_rate(0.0),
            "failure_rate",
        ),
        (
            BreakerConfig::builder().with_failure_rate(1.5),
            "failure_rate",
        ),
        (
            BreakerConfig::builder().with_minimum_calls(0),
            "minimum_calls",
        ),
        (
            BreakerConfig::builder().with_half_open_probes(0),
            "half_open_probes",
        ),
        (
            BreakerConfig::builder().with_window(Window::Count { size: 0 }),
            "window",
        ),
        (
            BreakerConfig::builder().with_open_cooldown(Duration::from_secs(600)),
            "open_cooldown",
        ),
        (
            BreakerConfig::builder().with_failure_classes(&[]),
            "failure_classes",
        ),
    ];
    for (b, field) in cases {
        let e = b.build().unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
}

#[derive(Debug, Clone)]
enum Op {
    Admit(i64),
    Record(bool, i64),
}

proptest! {
    /// Whatever happens, a half-open round never admits more probes than its limit.
    #[test]
    fn half_open_never_admits_more_than_its_probe_limit(
        ops in proptest::collection::vec(
            prop_oneof![
                (0i64..3_000).prop_map(Op::Admit),
                (any::<bool>(), 0i64..3_000).prop_map(|(f, dt)| Op::Record(f, dt)),
            ],
            1..300,
        ),
        probes in 1u32..5,
    ) {
        let c = BreakerConfig::builder()
            .with_window(Window::Count { size: 10 })
            .with_minimum_calls(3)
            .with_open_cooldown(Duration::from_secs(1))
            .with_half_open_probes(probes)
            .with_half_open_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let mut b = CircuitBreaker::new(c, 9);
        let mut now = 0i64;
        let mut round_probes = 0u32;
        for op in ops {
            match op {
                Op::Admit(dt) => {
                    now += dt;
                    let before = b.state();
                    let round_before = b.round_started_ms;
                    let (a, t) = b.admit(at(now));
                    let new_round = t.is_some() || b.round_started_ms != round_before || before != BreakerState::HalfOpen;
                    if new_round { round_probes = 0; }
                    if a == Admission::Probe { round_probes += 1; }
                    prop_assert!(round_probes <= probes, "{round_probes} probes > limit {probes}");
                    if before == BreakerState::Closed { prop_assert_eq!(a, Admission::Allowed); }
                }
                Op::Record(fail, dt) => {
                    now += dt;
                    let class = if fail { FailureClass::Infrastructure } else { FailureClass::Success };
                    if let Some(t) = b.record(class, D, at(now)) {
                        prop_assert_ne!(t.from, t.to);
                        round_probes = 0;
                    }
                }
            }
        }
    }
}

#[test]
fn default_cool_downs_start_at_one_second_grow_by_a_third_and_stop_at_a_minute() {
    let c = BreakerConfig::default();
    assert_eq!(c.open_cooldown(), Duration::from_secs(1));
    assert_eq!(c.cooldown_multiplier(), 1.3);
    assert_eq!(c.cooldown_max(), Duration::from_secs(60));
    let nominal: Vec<u64> = (1..=18)
        .map(|n| (c.cooldown(n).as_secs_f64() * 1000.0).round() as u64)
        .collect();
    assert_eq!(
        nominal,
        [
            1000, 1300, 1690, 2197, 2856, 3713, 4827, 6275, 8157, 10604, 13786, 17922, 23298,
            30288, 39374, 51186, 60000, 60000
        ]
    );
    // A 5 s outage is over within the first four cool-downs (1 + 1.3 + 1.69 + 2.2 = 6.2 s),
    // the longest of which is 2.2 s; the cap is reached after about 4 minutes.
    let to_cap: u64 = nominal[..16].iter().sum();
    assert!(
        (200_000..300_000).contains(&to_cap),
        "{to_cap} ms to the cap"
    );
    // Jittered, and never beyond the cap.
    assert!(c.cooldown_jitter() > 0.0);
    let mut b = CircuitBreaker::new(c, 3);
    let t = trip(&mut b, t0());
    let until = t.open_until.unwrap();
    let ms = (until - t0()).num_milliseconds();
    assert!((1000..=1100).contains(&ms), "first cool-down {ms} ms");
}
