use std::time::Duration;

use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;
use crate::{BreakerConfig, FailureClass, Window};

fn t0() -> Timestamp {
    Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap()
}

fn at_ms(ms: i64) -> Timestamp {
    t0() + chrono::Duration::milliseconds(ms)
}

fn rng() -> SmallRng {
    SmallRng::seed_from_u64(7)
}

fn breaker() -> BreakerConfig {
    BreakerConfig::builder()
        .with_window(Window::Count { size: 10 })
        .with_minimum_calls(4)
        .with_failure_rate(0.5)
        .with_open_cooldown(Duration::from_secs(1))
        .with_cooldown_multiplier(2.0)
        .with_cooldown_max(Duration::from_secs(8))
        .with_cooldown_jitter(0.0)
        .with_half_open_probes(5)
        .build()
        .unwrap()
}

/// The breaker above, and the adaptive rate without slow start (the breaker's and pause's
/// tests start from a dependency with no rate in force).
fn cfg() -> FlowConfig {
    FlowConfig::default()
        .with_breaker(breaker())
        .with_rate(RateConfig::adaptive().with_slow_start(None))
        .unwrap()
}

/// The breaker above, with the default rate limiter (slow start on).
fn slow_cfg() -> FlowConfig {
    FlowConfig::default().with_breaker(breaker())
}

fn open_row(c: &FlowConfig, now: Timestamp) -> FlowRow {
    let s = c.apply(
        &FlowRow::default(),
        FlowEvent::Opened {
            reason: TransitionReason::FailureRate {
                rate: 1.0,
                calls: 4,
            },
        },
        now,
        &mut rng(),
    );
    assert_eq!(s.row.state, BreakerState::Open);
    s.row
}

const AHEAD: Duration = Duration::from_secs(1);

// ===== breaker =====

#[test]
fn an_opening_sets_the_first_cool_down_and_blocks_calls() {
    let c = cfg();
    let row = open_row(&c, t0());
    assert_eq!(row.openings, 1);
    assert_eq!(row.open_until, Some(at_ms(1000)));
    assert_eq!(
        c.check(&row, at_ms(999)),
        Check::Blocked {
            until: at_ms(1000),
            reason: DeferReason::BreakerOpen
        }
    );
    assert_eq!(c.check(&row, at_ms(1000)), Check::Probe);
}

#[test]
fn an_opening_reported_twice_applies_once() {
    let c = cfg();
    let row = open_row(&c, t0());
    let again = c.apply(
        &row,
        FlowEvent::Opened {
            reason: TransitionReason::ProbeFailed,
        },
        at_ms(10),
        &mut rng(),
    );
    assert!(!again.changed);
    assert_eq!(again.transition, None);
}

#[test]
fn the_fleet_gets_at_most_the_rounds_permits() {
    let c = cfg();
    let mut row = open_row(&c, t0());
    let mut probes = 0;
    let mut transitions = vec![];
    for i in 0..20 {
        let s = c.apply(&row, FlowEvent::TakeProbe, at_ms(1000 + i), &mut rng());
        if s.grant == Grant::Probe {
            probes += 1;
        }
        transitions.extend(s.transition);
        row = s.row;
    }
    assert_eq!(probes, 5);
    assert_eq!(transitions.len(), 1);
    assert_eq!(transitions[0].to, BreakerState::HalfOpen);
    assert!(matches!(
        c.check(&row, at_ms(1100)),
        Check::Blocked {
            reason: DeferReason::BreakerOpen,
            ..
        }
    ));
}

fn round(c: &FlowConfig, results: &[CallResult]) -> (FlowRow, Vec<Transition>) {
    let mut row = open_row(c, t0());
    let mut ts = vec![];
    for _ in 0..c.breaker.half_open_probes() {
        let s = c.apply(&row, FlowEvent::TakeProbe, at_ms(1000), &mut rng());
        ts.extend(s.transition);
        row = s.row;
    }
    for r in results {
        let s = c.apply(
            &row,
            FlowEvent::ProbeAnswered { result: *r },
            at_ms(1100),
            &mut rng(),
        );
        ts.extend(s.transition);
        row = s.row;
    }
    (row, ts)
}

#[test]
fn one_failed_probe_of_five_does_not_reopen() {
    use CallResult::{Failure as F, Success as S};
    let c = cfg();
    let (row, ts) = round(&c, &[F, S, S, S]);
    assert_eq!(row.state, BreakerState::Closed);
    assert_eq!(ts.last().unwrap().reason, TransitionReason::ProbesSucceeded);
    // The growth of the cool-down starts over after a close.
    assert_eq!(row.openings, 0);
    let again = open_row(&c, at_ms(5000));
    assert_eq!(again.openings, 1);
}

#[test]
fn three_failed_probes_of_five_reopen_with_a_longer_cool_down() {
    use CallResult::{Failure as F, Success as S};
    let c = cfg();
    let (row, ts) = round(&c, &[F, S, F, F]);
    assert_eq!(row.state, BreakerState::Open);
    assert_eq!(row.openings, 2);
    assert_eq!(row.open_until, Some(at_ms(1100 + 2000)));
    let last = ts.last().unwrap();
    assert_eq!(
        (last.from, last.to),
        (BreakerState::HalfOpen, BreakerState::Open)
    );
    // A late answer of the judged round changes nothing.
    let late = c.apply(
        &row,
        FlowEvent::ProbeAnswered { result: S },
        at_ms(1200),
        &mut rng(),
    );
    assert!(!late.changed);
}

#[test]
fn a_rate_limited_probe_hands_its_permit_back() {
    let c = cfg();
    let mut row = open_row(&c, t0());
    row = c
        .apply(&row, FlowEvent::TakeProbe, at_ms(1000), &mut rng())
        .row;
    assert_eq!(row.probe_permits, 4);
    let s = c.apply(
        &row,
        FlowEvent::ProbeAnswered {
            result: CallResult::Ignored,
        },
        at_ms(1010),
        &mut rng(),
    );
    assert_eq!(s.row.probe_permits, 5);
    assert_eq!(s.row.state, BreakerState::HalfOpen);
}

#[test]
fn a_round_whose_probers_vanished_starts_again_after_the_timeout() {
    let c = cfg();
    let mut row = open_row(&c, t0());
    for _ in 0..5 {
        row = c
            .apply(&row, FlowEvent::TakeProbe, at_ms(1000), &mut rng())
            .row;
    }
    assert_eq!(row.probe_permits, 0);
    let early = c.apply(&row, FlowEvent::Tick, at_ms(20_000), &mut rng());
    assert!(!early.changed);
    let late = c.apply(&row, FlowEvent::Tick, at_ms(31_000), &mut rng());
    assert_eq!(late.row.probe_permits, 5);
    assert_eq!(late.row.round_started, Some(at_ms(31_000)));
    // The new round is published: operators see the round that hung.
    let t = late.transition.expect("a new round is a transition");
    assert_eq!(
        (t.from, t.to, t.reason),
        (
            BreakerState::HalfOpen,
            BreakerState::HalfOpen,
            TransitionReason::ProbesUnanswered
        )
    );
    assert_eq!(t.reason.to_string(), "probes unanswered: new round");
}

#[test]
fn forced_open_blocks_and_auto_starts_over_closed() {
    let c = cfg();
    let s = c.apply(
        &FlowRow::default(),
        FlowEvent::Force(BreakerMode::ForcedOpen),
        t0(),
        &mut rng(),
    );
    assert_eq!(s.transition.unwrap().to, BreakerState::Open);
    assert!(matches!(c.check(&s.row, t0()), Check::Blocked { .. }));
    // The machine does not move a forced breaker.
    let tick = c.apply(&s.row, FlowEvent::Tick, at_ms(100_000), &mut rng());
    assert!(!tick.changed);
    let back = c.apply(
        &s.row,
        FlowEvent::Force(BreakerMode::Normal),
        at_ms(1),
        &mut rng(),
    );
    assert_eq!(back.row.state, BreakerState::Closed);
    assert_eq!(c.check(&back.row, at_ms(1)), Check::Go);
}

// ===== pause =====

#[test]
fn a_retry_after_pauses_the_fleet_until_then_and_never_shortens_a_pause() {
    let c = cfg();
    let ev = |until| FlowEvent::RateLimited {
        pause_until: Some(until),
        served_per_s: Some(50.0),
        delivered: None,
        probe: false,
    };
    let s = c.apply(&FlowRow::default(), ev(at_ms(2000)), t0(), &mut rng());
    assert_eq!(s.row.paused_until, Some(at_ms(2000)));
    assert_eq!(s.row.pause_reason, Some(PauseReason::RetryAfter));
    assert_eq!(
        c.check(&s.row, at_ms(1999)),
        Check::Blocked {
            until: at_ms(2000),
            reason: DeferReason::Paused
        }
    );
    let shorter = c.apply(&s.row, ev(at_ms(1500)), at_ms(10), &mut rng());
    assert_eq!(shorter.row.paused_until, Some(at_ms(2000)));
}

// ===== rate limit =====

#[test]
fn a_fixed_limit_hands_out_slots_at_the_rate() {
    let c = cfg()
        .with_rate(RateConfig::fixed(80.0).unwrap().with_burst(0))
        .unwrap();
    let s = c.apply(
        &FlowRow::default(),
        FlowEvent::Reserve { max_ahead: AHEAD },
        t0(),
        &mut rng(),
    );
    let Grant::Slots(slots) = s.grant else {
        panic!("{:?}", s.grant)
    };
    assert_eq!(slots.count(), 8);
    assert_eq!(slots.at(0), t0());
    assert_eq!(
        slots.at(7),
        t0() + chrono::Duration::microseconds(7 * 12_500)
    );
    assert_eq!(
        s.row.tat,
        Some(t0() + chrono::Duration::microseconds(8 * 12_500))
    );
    // The next reservation continues where this one ended.
    let s2 = c.apply(
        &s.row,
        FlowEvent::Reserve { max_ahead: AHEAD },
        t0(),
        &mut rng(),
    );
    let Grant::Slots(next) = s2.grant else {
        panic!()
    };
    assert_eq!(
        next.at(0),
        t0() + chrono::Duration::microseconds(8 * 12_500)
    );
}

#[test]
fn no_slot_beyond_max_ahead_and_the_wait_is_named() {
    let c = cfg()
        .with_rate(RateConfig::fixed(10.0).unwrap().with_burst(0))
        .unwrap();
    let mut row = FlowRow {
        tat: Some(at_ms(5000)),
        ..FlowRow::default()
    };
    let s = c.apply(
        &row,
        FlowEvent::Reserve { max_ahead: AHEAD },
        t0(),
        &mut rng(),
    );
    assert_eq!(
        s.grant,
        Grant::Blocked {
            until: at_ms(5000),
            reason: DeferReason::Throttled
        }
    );
    // A short max_ahead trims the batch instead of handing out slots too far away.
    row.tat = Some(at_ms(950));
    let s = c.apply(
        &row,
        FlowEvent::Reserve { max_ahead: AHEAD },
        t0(),
        &mut rng(),
    );
    let Grant::Slots(slots) = s.grant else {
        panic!("{:?}", s.grant)
    };
    assert_eq!(slots.count(), 1);
    assert_eq!(slots.at(0), at_ms(950));
}

#[test]
fn without_slow_start_a_limit_or_a_429_nothing_is_reserved() {
    let c = cfg()
        .with_rate(RateConfig::adaptive().with_slow_start(None))
        .unwrap();
    let s = c.apply(
        &FlowRow::default(),
        FlowEvent::Reserve { max_ahead: AHEAD },
        t0(),
        &mut rng(),
    );
    assert_eq!(s.grant, Grant::Go);
    assert!(!s.changed);
    assert_eq!(c.check(&FlowRow::default(), t0()), Check::Go);
}

/// Looks every `step_ms` from `from_ms` to `until_ms` and reserves when the slots reserved
/// so far are used up (as a busy fleet does); the row after.
fn reserve_every(
    c: &FlowConfig,
    mut row: FlowRow,
    from_ms: i64,
    until_ms: i64,
    step_ms: i64,
) -> FlowRow {
    let mut t = from_ms;
    while t < until_ms {
        if row.tat.is_some_and(|tat| tat > at_ms(t)) {
            t += step_ms;
            continue;
        }
        row = c
            .apply(
                &row,
                FlowEvent::Reserve { max_ahead: AHEAD },
                at_ms(t),
                &mut rng(),
            )
            .row;
        t += step_ms;
    }
    row
}

#[test]
fn slow_start_begins_modest_and_doubles_with_use_until_the_first_429() {
    let c = slow_cfg();
    assert_eq!(c.check(&FlowRow::default(), t0()), Check::Limited);
    let s = c.apply(
        &FlowRow::default(),
        FlowEvent::Reserve { max_ahead: AHEAD },
        t0(),
        &mut rng(),
    );
    let Grant::Slots(slots) = s.grant else {
        panic!("{:?}", s.grant)
    };
    assert_eq!(slots.count(), 2); // 100 ms of 20/s
    assert_eq!(slots.interval(), Duration::from_millis(50));
    // The rate grows with the slots handed out: 2 slots are 100 ms of 250.
    let r0 = s.row.rate.unwrap();
    assert!(
        (r0 - DEFAULT_SLOW_START * 2f64.powf(0.4)).abs() < 1e-9,
        "{r0}"
    );
    // It doubles every 250 ms worth of slots handed out: about four times in the slots of
    // 500 ms (the rate grows within them).
    let row = reserve_every(&c, s.row, 100, 600, 1);
    let r = row.rate.unwrap();
    assert!((3.0..=8.0).contains(&(r / DEFAULT_SLOW_START)), "{r}");
    // Idle time does not count: 10 s later one reservation grows it by its own slots only.
    let later = reserve_every(&c, row.clone(), 10_600, 10_601, 1);
    assert!(later.rate.unwrap() < 1.5 * r, "{:?} after {r}", later.rate);
    // The first 429 stops it: the rate is cut and climbs along the cubic, no more doubling.
    let cut = c
        .apply(
            &row,
            FlowEvent::RateLimited {
                pause_until: None,
                served_per_s: Some(10.0),
                delivered: Some(1.0),
                probe: false,
            },
            at_ms(600),
            &mut rng(),
        )
        .row;
    let r_cut = cut.rate.unwrap();
    assert!(r_cut < r, "{r_cut} after {r}");
    // What got through is learned from the ramp (see slow_start_limit): never more than the
    // fleet sent.
    let sent = c.fleet_send_rate(&row, at_ms(600)).unwrap();
    let cap = cut.rate_cap.unwrap();
    assert!(
        cap > 0.0 && cap <= sent.min(r) + 1e-9,
        "{cap} for {sent} sent"
    );
    let after = reserve_every(&c, cut, 1700, 2000, 100);
    assert!(after.rate.unwrap() < 1.5 * r_cut, "{:?}", after.rate);
}

#[test]
fn a_configured_limit_skips_slow_start() {
    let c = cfg().with_rate(RateConfig::fixed(500.0).unwrap()).unwrap();
    let s = c.apply(
        &FlowRow::default(),
        FlowEvent::Reserve { max_ahead: AHEAD },
        t0(),
        &mut rng(),
    );
    let Grant::Slots(slots) = s.grant else {
        panic!("{:?}", s.grant)
    };
    assert_eq!(slots.count(), 50); // 100 ms of 500/s at once
    assert_eq!(
        s.row.rate,
        Some(500.0),
        "the configured limit, nothing learned"
    );
}

#[test]
fn a_lifted_limit_stays_lifted_and_slow_start_does_not_restart() {
    let c = slow_cfg()
        .with_rate(RateConfig::adaptive().with_bounds(1.0, 100.0))
        .unwrap();
    let mut row = FlowRow::default();
    let mut lifted_at = None;
    for i in 0..40 {
        let s = c.apply(
            &row,
            FlowEvent::Reserve { max_ahead: AHEAD },
            at_ms(i * 100),
            &mut rng(),
        );
        if s.grant == Grant::Go && lifted_at.is_none() {
            lifted_at = Some(i);
        }
        if lifted_at.is_some_and(|l| l < i) {
            assert_eq!(s.grant, Grant::Go, "reservation {i} after the lift");
            assert!(!s.changed, "a lifted limit writes nothing");
        }
        row = s.row;
    }
    assert!(lifted_at.is_some_and(|i| i <= 10), "{lifted_at:?}");
    assert!(row.rate_lifted);
    assert_eq!(row.rate, None);
    assert_eq!(c.check(&row, at_ms(5000)), Check::Go);
}

#[test]
fn the_first_429_sets_the_rate_from_what_got_through() {
    let c = cfg();
    let s = c.apply(
        &FlowRow::default(),
        FlowEvent::RateLimited {
            pause_until: Some(at_ms(1000)),
            served_per_s: Some(80.0),
            delivered: None,
            probe: false,
        },
        t0(),
        &mut rng(),
    );
    assert_eq!(s.row.rate, Some(72.0));
    assert_eq!(s.row.rate_cut_at, Some(t0()));
    assert_eq!(c.check(&s.row, at_ms(1000)), Check::Limited);
}

#[test]
fn a_429_cuts_from_what_the_fleet_got_through_not_the_reporters_share() {
    // Three processes share a 62/s rate; the PSP allows 50/s, so 80% got through.
    let c = cfg().with_rate(RateConfig::fixed(62.0).unwrap()).unwrap();
    let row = reserve_every(&c, FlowRow::default(), 0, 2500, 10);
    let sent = c.fleet_send_rate(&row, at_ms(2500)).unwrap();
    assert!((sent - 62.0).abs() < 5.0, "metered {sent}/s");
    let ev = |served: Option<f64>, delivered| FlowEvent::RateLimited {
        pause_until: None,
        served_per_s: served,
        delivered,
        probe: false,
    };
    // The fleet started from idle 2.5 s ago (the PSP's bucket full: the cycle counts it as a
    // second at the rate): what got through over the cycle is 80% of its slots over 3.5 s.
    let cycle = c.cycle_rate(&row, at_ms(2500)).unwrap();
    assert!((cycle - 62.0 * 2.5 / 3.5).abs() < 3.0, "cycle {cycle}/s");
    // The reporter got ~17/s through itself (a third of the fleet's).
    let a = c.apply(&row, ev(Some(17.0), Some(0.8)), at_ms(2500), &mut rng());
    let r = a.row.rate.unwrap();
    // The cycle ends at its first 429: what was sent in it got through (no share applies).
    let through = cycle.min(sent * 0.8);
    let want = 0.9 * through;
    assert!((r - want).abs() < 1e-9, "{r} vs {want}");
    assert!(r > 30.0, "{r}: not one process's share");
    assert!((a.row.rate_cap.unwrap() - through).abs() < 1e-9);
    // More 429s in the same epoch do not cut again.
    let b = c.apply(&a.row, ev(Some(16.0), Some(0.5)), at_ms(2505), &mut rng());
    assert_eq!(b.row.rate, a.row.rate);
    let b2 = c.apply(&b.row, ev(None, None), at_ms(2506), &mut rng());
    assert!(!b2.changed, "a report without a share changes nothing");
    // A 429 after the epoch is a new cut.
    let later = reserve_every(&c, b2.row, 3600, 4700, 10);
    let later = c.apply(&later, ev(Some(17.0), Some(0.9)), at_ms(4700), &mut rng());
    assert!(later.row.rate_cut_at == Some(at_ms(4700)));
}

#[test]
fn a_client_gives_its_share_once_per_epoch_however_many_429s_it_gets() {
    let c = cfg();
    let mut client = FlowClient::new(c.clone(), 1);
    let row = FlowRow::default();
    for i in 0..40 {
        let now = at_ms(i);
        assert_eq!(
            client.before_call(&row, false, AHEAD, now),
            Next::Call { probe: false }
        );
        client.after_call(
            &row,
            false,
            FailureClass::Success,
            Duration::ZERO,
            None,
            now,
        );
    }
    let shares: Vec<_> = (0..5)
        .map(|i| {
            match client.after_call(
                &row,
                false,
                FailureClass::RateLimited,
                Duration::ZERO,
                None,
                at_ms(50 + i),
            ) {
                Some(FlowEvent::RateLimited { served_per_s, .. }) => served_per_s,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(shares, [Some(40.0), None, None, None, None]);
    let next = client.after_call(
        &row,
        false,
        FailureClass::RateLimited,
        Duration::ZERO,
        None,
        at_ms(1100),
    );
    assert!(matches!(
        next,
        Some(FlowEvent::RateLimited {
            served_per_s: Some(_),
            ..
        })
    ));
}

#[test]
fn a_client_never_reserves_beyond_the_slot_horizon() {
    let c = cfg().with_rate(RateConfig::fixed(80.0).unwrap()).unwrap();
    let mut client = FlowClient::new(c, 1);
    assert_eq!(
        client.before_call(&FlowRow::default(), false, Duration::from_secs(10), t0()),
        Next::Apply(FlowEvent::Reserve {
            max_ahead: SLOT_HORIZON
        })
    );
}

#[test]
fn after_a_cut_the_rate_climbs_the_cubic_back_to_w_max_and_probes_above_slowly() {
    let c = cfg()
        .with_rate(RateConfig::fixed(1000.0).unwrap().with_burst(0))
        .unwrap();
    let row = FlowRow {
        rate: Some(45.0),
        rate_cap: Some(50.0),
        rate_cut_at: Some(t0()),
        rate_raised_at: Some(t0()),
        ..FlowRow::default()
    };
    // Inside the epoch: no increase.
    let s = c.apply(
        &row,
        FlowEvent::Reserve { max_ahead: AHEAD },
        at_ms(500),
        &mut rng(),
    );
    assert_eq!(s.row.rate, Some(45.0));
    // K = ∛(50 × 0.1 / 0.4) ≈ 2.32 s of use back to W_max.
    let k = (50.0f64 * 0.1 / 0.4).cbrt();
    let back = reserve_every(&c, row.clone(), 1000, 1000 + (k * 1000.0) as i64 + 100, 100);
    let r = back.rate.unwrap();
    assert!((49.0..=51.0).contains(&r), "{r} after K of use");
    // Then slowly above it: 2 s beyond K, at most W_max + probe_slope × W_max per second (the
    // pure curve would be at 50 + 0.4 × 8 = 53.2).
    let above = reserve_every(&c, back, 3500, 3320 + 2000, 100);
    let r2 = above.rate.unwrap();
    let most = 50.0 * (1.0 + probe_slope(None) * 2.0);
    assert!(r2 > 50.5 && r2 <= most + 1e-9, "{r2} (at most {most})");
    // A gap of 10 s without reservations counts as one second at most.
    let r3 = c
        .apply(
            &above,
            FlowEvent::Reserve { max_ahead: AHEAD },
            at_ms(15_500),
            &mut rng(),
        )
        .row
        .rate
        .unwrap();
    assert!(r3 - r2 < 0.4 * 4.0f64.powi(3), "{r3} after {r2}");
}

#[test]
fn the_climb_stops_at_the_configured_limit() {
    let c = cfg()
        .with_rate(RateConfig::fixed(100.0).unwrap().with_burst(0))
        .unwrap();
    let row = FlowRow {
        rate: Some(50.0),
        rate_cap: Some(60.0),
        rate_cut_at: Some(t0()),
        rate_raised_at: Some(t0()),
        ..FlowRow::default()
    };
    let r = reserve_every(&c, row, 1000, 40_000, 100);
    assert_eq!(r.rate, Some(100.0));
}

#[test]
fn a_learned_rate_that_reaches_the_ceiling_is_lifted() {
    let c = cfg()
        .with_rate(
            RateConfig::adaptive()
                .with_bounds(1.0, 100.0)
                .with_increase(50.0),
        )
        .unwrap();
    let row = FlowRow {
        rate: Some(90.0),
        rate_cap: Some(95.0),
        rate_cut_at: Some(at_ms(-2000)),
        rate_raised_at: Some(t0()),
        ..FlowRow::default()
    };
    // Above W_max the probe adds probe_slope × 95 per second of use: the ceiling in ~2 s.
    let row = reserve_every(&c, row, 1000, 4000, 100);
    let s = c.apply(
        &row,
        FlowEvent::Reserve { max_ahead: AHEAD },
        at_ms(4000),
        &mut rng(),
    );
    assert_eq!(s.grant, Grant::Go);
    assert_eq!(s.row.rate, None);
    assert!(s.row.rate_lifted);
}

#[test]
fn a_fixed_limit_that_is_not_adaptive_ignores_429s() {
    let c = cfg()
        .with_rate(RateConfig::fixed(80.0).unwrap().with_adaptive(false))
        .unwrap();
    let s = c.apply(
        &FlowRow::default(),
        FlowEvent::RateLimited {
            pause_until: None,
            served_per_s: Some(10.0),
            delivered: None,
            probe: false,
        },
        t0(),
        &mut rng(),
    );
    assert_eq!(s.row.rate, None);
    assert_eq!(c.rate_in_force(&s.row), Some(80.0));
}

#[test]
fn bad_rate_settings_are_named() {
    let e = RateConfig::fixed(0.0).unwrap_err().to_string();
    assert!(e.contains("rate_limit"), "{e}");
    for (c, field) in [
        (RateConfig::adaptive().with_decrease(1.0), "rate_decrease"),
        (
            RateConfig::adaptive().with_bounds(10.0, 5.0),
            "rate_ceiling",
        ),
        (RateConfig::adaptive().with_bounds(0.0, 5.0), "rate_floor"),
        (
            RateConfig::adaptive().with_batch(Duration::from_secs(2)),
            "rate_batch",
        ),
        (
            RateConfig::adaptive().with_increase(f64::NAN),
            "rate_increase",
        ),
    ] {
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(field), "{e} should name {field}");
        // A FlowConfig refuses it too, so none holds an invalid rate.
        let e = FlowConfig::default().with_rate(c).unwrap_err().to_string();
        assert!(e.contains(field), "{e} should name {field}");
    }
}

#[test]
fn flow_config_setters_refuse_invalid_values() {
    for n in [0, crate::MAX_INFLIGHT + 1] {
        let e = FlowConfig::default().with_max_inflight(n).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("invalid max_inflight = {n}")),
            "{e}"
        );
    }
    let c = FlowConfig::default()
        .with_max_inflight(crate::MAX_INFLIGHT)
        .unwrap();
    assert_eq!(c.max_inflight(), Some(crate::MAX_INFLIGHT));
    assert_eq!(c.without_max_inflight().max_inflight(), None);
    for bad in [
        crate::RetryBudgetBuilder::new().with_retry_ratio(-1.0),
        crate::RetryBudgetBuilder::new().with_retry_ratio(f64::NAN),
        crate::RetryBudgetBuilder::new().with_ttl(Duration::ZERO),
    ] {
        assert!(FlowConfig::default().with_retry_budget(bad).is_err());
    }
    let b = crate::RetryBudgetBuilder::new().with_retry_ratio(0.5);
    let c = FlowConfig::default().with_retry_budget(b).unwrap();
    assert_eq!(c.retry_budget(), Some(b));
    assert_eq!(c.without_retry_budget().retry_budget(), None);
    let r = RateConfig::fixed(5.0).unwrap();
    assert_eq!(FlowConfig::default().with_rate(r).unwrap().rate(), r);
}

/// Runs a fleet of `procs` processes reserving slots whenever they run out, each sending
/// every slot, for `secs` seconds; returns the send times (µs since t0).
fn fleet_sends(c: &FlowConfig, procs: usize, secs: i64, step_us: i64) -> Vec<i64> {
    let mut row = FlowRow::default();
    let mut queues: Vec<Vec<Timestamp>> = vec![vec![]; procs];
    let mut sends = vec![];
    let mut r = rng();
    let mut now_us = 0;
    while now_us < secs * 1_000_000 {
        let now = t0() + chrono::Duration::microseconds(now_us);
        for q in queues.iter_mut() {
            q.retain(|t| {
                if *t <= now {
                    sends.push((*t - t0()).num_microseconds().unwrap());
                    false
                } else {
                    true
                }
            });
            if q.is_empty() {
                let s = c.apply(&row, FlowEvent::Reserve { max_ahead: AHEAD }, now, &mut r);
                if let Grant::Slots(sl) = s.grant {
                    q.extend((0..sl.count()).map(|i| sl.at(i)));
                }
                row = s.row;
            }
        }
        now_us += step_us;
    }
    sends.sort_unstable();
    sends
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over any window, the fleet's sends stay within rate × window + burst + 1.
    #[test]
    fn the_limiter_admits_at_most_rate_times_window_plus_burst(
        rate in 1.0f64..500.0,
        burst in 0u32..20,
        procs in 1usize..6,
        step_us in 100i64..20_000,
        window_ms in 50i64..2000,
    ) {
        let c = cfg().with_rate(RateConfig::fixed(rate).unwrap().with_burst(burst).with_adaptive(false)).unwrap();
        let sends = fleet_sends(&c, procs, 3, step_us);
        let w = window_ms * 1000;
        let bound = (rate * window_ms as f64 / 1000.0).floor() as usize + burst as usize + 1;
        let mut j = 0;
        for i in 0..sends.len() {
            while sends[i] - sends[j] >= w { j += 1; }
            prop_assert!(i - j < bound, "{} sends in {window_ms} ms at {rate}/s burst {burst}", i - j + 1);
        }
    }

    /// Never more probes than permits, whatever the order of events.
    #[test]
    fn never_more_probes_than_permits(events in proptest::collection::vec(0u8..4, 1..200)) {
        let c = cfg();
        let mut row = open_row(&c, t0());
        let mut r = rng();
        let mut outstanding = 0u32; // probes taken and not answered, this round
        for (i, e) in events.iter().enumerate() {
            let now = at_ms(1000 + i as i64 * 10);
            let before = row.state;
            let s = match e {
                0 | 1 => c.apply(&row, FlowEvent::TakeProbe, now, &mut r),
                2 => c.apply(&row, FlowEvent::ProbeAnswered { result: CallResult::Failure }, now, &mut r),
                _ => c.apply(&row, FlowEvent::ProbeAnswered { result: CallResult::Success }, now, &mut r),
            };
            if s.grant == Grant::Probe { outstanding += 1; }
            if s.row.state != before || s.row.round_started != row.round_started { outstanding = u32::from(s.grant == Grant::Probe); }
            prop_assert!(outstanding <= c.breaker.half_open_probes());
            prop_assert!(s.row.probe_permits <= c.breaker.half_open_probes());
            row = s.row;
        }
    }

    /// A local error (exception class) never moves the breaker: it is ignored by default.
    #[test]
    fn a_local_error_never_moves_the_breaker(n in 1usize..200) {
        let b = breaker();
        prop_assert_eq!(b.result_of(FailureClass::Exception), CallResult::Ignored);
        prop_assert_eq!(b.result_of(FailureClass::Permanent), CallResult::Success);
        let mut local = crate::CircuitBreaker::new(b, 1);
        for i in 0..n {
            prop_assert_eq!(local.record(FailureClass::Exception, Duration::ZERO, at_ms(i as i64)), None);
        }
        prop_assert_eq!(local.state(), BreakerState::Closed);
    }
}

/// The learned rate (the cut, then CUBIC's climb) against a PSP that serves `limit`/s (a token bucket holding one second of it, as the
/// PSP simulator's) and answers 429 with `Retry-After: 1` beyond, through the same
/// [`FlowClient`] protocol a worker process runs: after a minute, what gets through settles
/// within 10% of the limit, with few 429s, and the learned rate stays near it.
#[test]
fn aimd_settles_near_a_fixed_psp_limit() {
    for limit in [20.0, 80.0, 300.0] {
        let c = cfg();
        let mut client = FlowClient::new(c.clone(), 3);
        let mut row = FlowRow::default();
        let mut r = rng();
        let mut tokens = limit;
        let mut last_us = 0i64;
        let mut rates = vec![];
        let (mut ok_late, mut limited_late, mut sent_late) = (0u32, 0u32, 0u32);
        let mut wait_until: Option<Timestamp> = None;
        let step = 1000i64; // 1 ms; the process always has work, one call at a time
        let mut now_us = 0i64;
        while now_us < 120_000_000 {
            let now = t0() + chrono::Duration::microseconds(now_us);
            let late = now_us >= 60_000_000;
            if late && now_us % 1_000_000 == 0 {
                rates.push(c.rate_in_force(&row).unwrap_or(f64::INFINITY));
            }
            now_us += step;
            if wait_until.is_some_and(|w| w > now) {
                continue;
            }
            wait_until = None;
            let mut next = client.before_call(&row, false, AHEAD, now);
            if let Next::Apply(ev) = next {
                let s = c.apply(&row, ev, now, &mut r);
                row = s.row;
                next = client.granted(s.grant, AHEAD, now);
            }
            match next {
                Next::Call { .. } => {}
                Next::CallAt { at } if at <= now => {}
                Next::CallAt { at }
                | Next::Blocked { until: at, .. }
                | Next::Wait { until: at } => {
                    wait_until = Some(at);
                    // The slot is this call's: it goes at `at`.
                    if !matches!(next, Next::CallAt { .. }) {
                        continue;
                    }
                }
                Next::Apply(_) => unreachable!(),
            }
            let send_at = wait_until.unwrap_or(now);
            sent_late += u32::from(late);
            let t_us = (send_at - t0()).num_microseconds().unwrap();
            tokens = (tokens + (t_us - last_us).max(0) as f64 / 1e6 * limit).min(limit);
            last_us = last_us.max(t_us);
            let class = if tokens >= 1.0 {
                tokens -= 1.0;
                ok_late += u32::from(late);
                FailureClass::Success
            } else {
                limited_late += u32::from(late);
                FailureClass::RateLimited
            };
            let pause = (class == FailureClass::RateLimited)
                .then(|| send_at + chrono::Duration::seconds(1));
            if let Some(ev) = client.after_call(&row, false, class, Duration::ZERO, pause, send_at)
            {
                let s = c.apply(&row, ev, send_at, &mut r);
                row = s.row;
                client.reported(&row, send_at);
            }
        }
        let through = f64::from(ok_late) / 60.0;
        let share_429 = f64::from(limited_late) / f64::from(sent_late);
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        assert!(
            (through - limit).abs() <= 0.1 * limit && share_429 < 0.03,
            "limit {limit}: {through:.1}/s got through, {:.1}% 429, learned rate {mean:.1}",
            share_429 * 100.0
        );
        // The PSP's bucket holds a second of its rate, so a rate a little above the limit
        // gets through for seconds before the first 429: what the fleet measured then is
        // what it climbs back to.
        assert!(
            (mean - limit).abs() <= 0.3 * limit,
            "limit {limit}: learned rate {mean:.1} (rates {rates:?})"
        );
    }
}

#[test]
fn a_slot_beyond_the_horizon_but_within_the_wait_is_waited_for() {
    let c = cfg()
        .with_rate(RateConfig::fixed(80.0).unwrap().with_burst(0))
        .unwrap();
    let mut client = FlowClient::new(c.clone(), 1);
    let mut r = rng();
    // The fleet has reserved three seconds ahead.
    let busy = FlowRow {
        rate: Some(80.0),
        tat: Some(t0() + chrono::Duration::seconds(3)),
        ..FlowRow::default()
    };
    let ten = Duration::from_secs(10);
    let Next::Apply(ev) = client.before_call(&busy, false, ten, t0()) else {
        panic!("a reservation first")
    };
    let step = c.apply(&busy, ev, t0(), &mut r);
    let until = t0() + chrono::Duration::seconds(3);
    assert_eq!(client.granted(step.grant, ten, t0()), Next::Wait { until });
    // With a two-second wait the job is deferred instead.
    let step = c.apply(&busy, ev, t0(), &mut r);
    assert_eq!(
        client.granted(step.grant, Duration::from_secs(2), t0()),
        Next::Blocked {
            until,
            reason: DeferReason::Throttled
        }
    );
    // After the wait the client reserves again: a slot now.
    let Next::Apply(ev) = client.after_wait(&busy, Duration::from_secs(7), until) else {
        panic!("a reservation after the wait")
    };
    let step = c.apply(&busy, ev, until, &mut r);
    assert_eq!(
        client.granted(step.grant, Duration::from_secs(7), until),
        Next::CallAt { at: until }
    );
}

#[test]
fn asking_again_after_a_wait_does_not_draw_on_the_retry_budget_twice() {
    let mut c = cfg().with_rate(RateConfig::fixed(80.0).unwrap()).unwrap();
    c = c
        .with_retry_budget(
            crate::RetryBudgetBuilder::new()
                .with_min_per_sec(0)
                .with_retry_ratio(0.0),
        )
        .unwrap();
    let mut client = FlowClient::new(c, 1);
    let row = FlowRow::default();
    let wait = Duration::from_secs(10);
    assert!(matches!(
        client.before_call(&row, true, wait, t0()),
        Next::Blocked {
            reason: DeferReason::RetryBudget,
            ..
        }
    ));
    // The retry was admitted before its wait: asking again reserves, it is not refused.
    assert!(matches!(
        client.after_wait(&row, wait, t0()),
        Next::Apply(FlowEvent::Reserve { .. })
    ));
}

#[test]
fn a_process_whose_window_tripped_calls_nothing_before_the_row_says_open() {
    let c = cfg();
    let mut client = FlowClient::new(c.clone(), 1);
    let closed = FlowRow::default();
    let fail = |client: &mut FlowClient, ms| {
        client.after_call(
            &closed,
            false,
            FailureClass::Infrastructure,
            Duration::ZERO,
            None,
            at_ms(ms),
        )
    };
    for ms in 0..3 {
        assert_eq!(fail(&mut client, ms), None);
    }
    let Some(ev @ FlowEvent::Opened { .. }) = fail(&mut client, 3) else {
        panic!("the fourth failure trips the window")
    };
    // Another task of the process asks with the row read before the opening was written:
    // held until the cool-down's end, not let through.
    let until = at_ms(3) + chrono::Duration::seconds(1);
    let held = Next::Blocked {
        until,
        reason: DeferReason::BreakerOpen,
    };
    assert_eq!(client.before_call(&closed, false, AHEAD, at_ms(4)), held);
    assert_eq!(client.after_wait(&closed, AHEAD, at_ms(4)), held);
    // The opening is written; the row is the truth from then on.
    let step = c.apply(&closed, ev, at_ms(5), &mut rng());
    client.reported(&step.row, at_ms(5));
    assert!(matches!(
        client.before_call(&step.row, false, AHEAD, at_ms(6)),
        Next::Blocked {
            reason: DeferReason::BreakerOpen,
            ..
        }
    ));
    // Had the fleet refused the opening (forced closed, say), calls go on at once.
    let mut client = FlowClient::new(c.clone(), 1);
    for ms in 0..4 {
        fail(&mut client, ms);
    }
    let forced = FlowRow {
        mode: BreakerMode::ForcedClosed,
        ..FlowRow::default()
    };
    client.reported(&forced, at_ms(5));
    assert_eq!(
        client.before_call(&forced, false, AHEAD, at_ms(6)),
        Next::Call { probe: false }
    );
}

#[test]
fn a_call_at_a_slot_waited_for_looks_again_at_the_breaker() {
    let c = cfg().with_rate(RateConfig::fixed(10.0).unwrap()).unwrap();
    let mut r = rng();
    let row = FlowRow::default();
    let mut reserve = |client: &mut FlowClient, now| {
        let Next::Apply(ev) = client.before_call(&row, false, AHEAD, now) else {
            panic!("a reservation first")
        };
        let step = c.apply(&row, ev, now, &mut r);
        let Next::CallAt { at } = client.granted(step.grant, AHEAD, now) else {
            panic!("a slot")
        };
        at
    };
    // Nothing changed during the wait: the call goes with its slot.
    let mut client = FlowClient::new(c.clone(), 1);
    let at = reserve(&mut client, t0());
    assert_eq!(client.at_slot(&row, at), None);
    // The row opened during the wait (another process, or this one's write): held back.
    let mut client = FlowClient::new(c.clone(), 1);
    let at = reserve(&mut client, t0());
    let open = open_row(&c, at_ms(50));
    assert!(matches!(
        client.at_slot(&open, at.max(at_ms(60))),
        Some(Next::Blocked {
            reason: DeferReason::BreakerOpen,
            ..
        })
    ));
    // This process's own window tripped during the wait, the row not yet written: held back.
    let mut client = FlowClient::new(c.clone(), 1);
    let at = reserve(&mut client, t0());
    for ms in 0..4 {
        client.after_call(
            &row,
            false,
            FailureClass::Infrastructure,
            Duration::ZERO,
            None,
            at_ms(ms),
        );
    }
    assert!(matches!(
        client.at_slot(&row, at.max(at_ms(5))),
        Some(Next::Blocked {
            reason: DeferReason::BreakerOpen,
            ..
        })
    ));
    // Half-open by the time the slot came: probes only, so not this call.
    let mut client = FlowClient::new(c.clone(), 1);
    reserve(&mut client, t0());
    assert!(matches!(
        client.at_slot(&open, at_ms(1500)),
        Some(Next::Blocked { .. })
    ));
}

// ===== operator overrides =====

#[test]
fn forced_open_blocks_every_call_and_every_probe() {
    let c = cfg();
    // Even a breaker whose cool-down is over (a probe would be due) gives nothing.
    let open = open_row(&c, t0());
    let forced = c
        .apply(
            &open,
            FlowEvent::Force(BreakerMode::ForcedOpen),
            t0(),
            &mut rng(),
        )
        .row;
    let late = at_ms(10_000_000);
    assert!(matches!(
        c.check(&forced, late),
        Check::Blocked {
            reason: DeferReason::BreakerOpen,
            ..
        }
    ));
    let probe = c.apply(&forced, FlowEvent::TakeProbe, late, &mut rng());
    assert!(matches!(probe.grant, Grant::Blocked { .. }));
    assert_eq!(probe.row.state, BreakerState::Open);
    assert_eq!(probe.row.probe_permits, 0);
    let reserve = c.apply(
        &forced,
        FlowEvent::Reserve {
            max_ahead: Duration::from_secs(1),
        },
        late,
        &mut rng(),
    );
    assert!(matches!(reserve.grant, Grant::Blocked { .. }));
    // And a client asked before each call defers the job.
    let mut client = FlowClient::new(c.clone(), 1);
    assert!(matches!(
        client.before_call(&forced, false, Duration::from_secs(1), late),
        Next::Blocked {
            reason: DeferReason::BreakerOpen,
            ..
        }
    ));
    assert_eq!(forced.effective_state(), BreakerState::Open);
}

#[test]
fn forced_closed_lets_calls_through_whatever_the_window_says() {
    let c = cfg();
    let open = open_row(&c, t0());
    let forced = c.apply(
        &open,
        FlowEvent::Force(BreakerMode::ForcedClosed),
        t0(),
        &mut rng(),
    );
    assert_eq!(forced.transition.unwrap().to, BreakerState::Closed);
    let row = forced.row;
    assert_eq!(row.effective_state(), BreakerState::Closed);
    assert_eq!(c.check(&row, at_ms(1)), Check::Go);
    // A client whose own window sees nothing but failures keeps calling and reports no opening.
    let mut client = FlowClient::new(c.clone(), 1);
    for i in 0..200 {
        let now = at_ms(10 + i);
        assert_eq!(
            client.before_call(&row, false, Duration::from_secs(1), now),
            Next::Call { probe: false }
        );
        assert_eq!(
            client.after_call(
                &row,
                false,
                FailureClass::Infrastructure,
                Duration::ZERO,
                None,
                now
            ),
            None
        );
    }
    // An opening reported meanwhile (a process that read the row before) changes nothing.
    let opened = c.apply(
        &row,
        FlowEvent::Opened {
            reason: TransitionReason::FailureRate {
                rate: 1.0,
                calls: 20,
            },
        },
        at_ms(300),
        &mut rng(),
    );
    assert!(!opened.changed);
}

#[test]
fn auto_hands_a_forced_breaker_back_to_the_machine() {
    let c = cfg();
    let open = open_row(&c, t0());
    for mode in [BreakerMode::ForcedOpen, BreakerMode::ForcedClosed] {
        let forced = c.apply(&open, FlowEvent::Force(mode), t0(), &mut rng()).row;
        let auto = c.apply(
            &forced,
            FlowEvent::Force(BreakerMode::Normal),
            at_ms(5),
            &mut rng(),
        );
        assert_eq!(auto.row.mode, BreakerMode::Normal);
        assert_eq!(auto.row.state, BreakerState::Closed);
        assert_eq!(auto.row.openings, 0);
        assert_eq!(c.check(&auto.row, at_ms(5)), Check::Go);
        // The machine works again: an opening is taken.
        let opened = c.apply(
            &auto.row,
            FlowEvent::Opened {
                reason: TransitionReason::FailureRate {
                    rate: 1.0,
                    calls: 20,
                },
            },
            at_ms(6),
            &mut rng(),
        );
        assert_eq!(opened.row.state, BreakerState::Open);
    }
}

#[test]
fn a_manual_pause_holds_calls_until_its_end_or_until_resumed() {
    let c = cfg();
    let row = c
        .apply(
            &FlowRow::default(),
            FlowEvent::Pause {
                until: at_ms(60_000),
            },
            t0(),
            &mut rng(),
        )
        .row;
    assert_eq!(row.pause_reason, Some(PauseReason::Operator));
    assert!(!row.paused_until_resumed());
    assert_eq!(
        c.check(&row, at_ms(59_999)),
        Check::Blocked {
            until: at_ms(60_000),
            reason: DeferReason::Paused
        }
    );
    assert_eq!(c.check(&row, at_ms(60_000)), Check::Go);
    // Even a forced-closed breaker waits for the pause.
    let closed = c
        .apply(
            &row,
            FlowEvent::Force(BreakerMode::ForcedClosed),
            t0(),
            &mut rng(),
        )
        .row;
    assert!(matches!(c.check(&closed, at_ms(1)), Check::Blocked { .. }));
    // Until resumed: no end in sight, then Resume lifts it at once.
    let held = c
        .apply(
            &row,
            FlowEvent::Pause {
                until: until_resumed(),
            },
            t0(),
            &mut rng(),
        )
        .row;
    assert!(held.paused_until_resumed());
    assert!(matches!(
        c.check(&held, at_ms(1_000_000_000)),
        Check::Blocked {
            reason: DeferReason::Paused,
            ..
        }
    ));
    let resumed = c.apply(&held, FlowEvent::Resume, at_ms(2), &mut rng()).row;
    assert_eq!((resumed.paused_until, resumed.pause_reason), (None, None));
    assert_eq!(c.check(&resumed, at_ms(2)), Check::Go);
    // An operator's shorter pause never cuts a longer Retry-After short; a longer one wins.
    let ra = c
        .apply(
            &FlowRow::default(),
            FlowEvent::RateLimited {
                pause_until: Some(at_ms(30_000)),
                served_per_s: None,
                delivered: None,
                probe: false,
            },
            t0(),
            &mut rng(),
        )
        .row;
    let short = c
        .apply(
            &ra,
            FlowEvent::Pause {
                until: at_ms(10_000),
            },
            t0(),
            &mut rng(),
        )
        .row;
    assert_eq!(short.paused_until, Some(at_ms(30_000)));
    let long = c
        .apply(
            &ra,
            FlowEvent::Pause {
                until: at_ms(90_000),
            },
            t0(),
            &mut rng(),
        )
        .row;
    assert_eq!(long.paused_until, Some(at_ms(90_000)));
    // An operator may shorten their own pause.
    let shorter = c
        .apply(
            &long,
            FlowEvent::Pause {
                until: at_ms(40_000),
            },
            t0(),
            &mut rng(),
        )
        .row;
    assert_eq!(shorter.paused_until, Some(at_ms(40_000)));
}

#[test]
fn a_probe_whose_round_failed_meanwhile_is_not_sent() {
    let c = cfg();
    let mut client = FlowClient::new(c.clone(), 1);
    let open = open_row(&c, t0());
    // The cool-down is over: a probe's permit is taken.
    let half = c
        .apply(&open, FlowEvent::TakeProbe, at_ms(1000), &mut rng())
        .row;
    assert_eq!(half.state, BreakerState::HalfOpen);
    assert!(client.at_probe(&half, at_ms(1001)));
    // The round failed (another probe's answer reopened the breaker) before this one went.
    let reopened = FlowRow {
        state: BreakerState::Open,
        open_until: Some(at_ms(3000)),
        probe_permits: 0,
        ..half.clone()
    };
    assert!(!client.at_probe(&reopened, at_ms(1003)));
    // The round closed the breaker meanwhile: the call may go.
    let closed = FlowRow::default();
    assert!(client.at_probe(&closed, at_ms(1003)));
    // Forced open, or paused: not sent.
    let forced = c
        .apply(
            &half,
            FlowEvent::Force(BreakerMode::ForcedOpen),
            at_ms(1002),
            &mut rng(),
        )
        .row;
    assert!(!client.at_probe(&forced, at_ms(1003)));
    let paused = FlowRow {
        paused_until: Some(at_ms(5000)),
        ..half.clone()
    };
    assert!(!client.at_probe(&paused, at_ms(1003)));
    // Plainly open: not sent.
    assert!(!client.at_probe(&open, at_ms(10)));
}

// ===== the fleet: N processes on one row =====

/// Runs `procs` busy processes on one row for `secs` seconds, each reserving whenever it
/// has used its slots and sending each slot when its own clock reaches it; process `p`'s
/// clock reads `offsets_us[p]` off the true time. Returns the row and the true send times
/// (µs since t0), sorted.
fn skewed_fleet(
    c: &FlowConfig,
    mut row: FlowRow,
    offsets_us: &[i64],
    from_us: i64,
    until_us: i64,
    step_us: i64,
) -> (FlowRow, Vec<i64>) {
    let mut queues: Vec<Vec<i64>> = vec![vec![]; offsets_us.len()];
    let mut sends = vec![];
    let mut r = rng();
    let mut now_us = from_us;
    while now_us < until_us {
        for (p, q) in queues.iter_mut().enumerate() {
            let local_us = now_us + offsets_us[p];
            q.retain(|&t| {
                if t <= local_us {
                    sends.push(t - offsets_us[p]);
                    false
                } else {
                    true
                }
            });
            if q.is_empty() {
                let local = t0() + chrono::Duration::microseconds(local_us);
                let s = c.apply(&row, FlowEvent::Reserve { max_ahead: AHEAD }, local, &mut r);
                if let Grant::Slots(sl) = s.grant {
                    q.extend(
                        (0..sl.count()).map(|i| (sl.at(i) - t0()).num_microseconds().unwrap()),
                    );
                }
                row = s.row;
            }
        }
        now_us += step_us;
    }
    sends.sort_unstable();
    (row, sends)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// After a 429, the shared rate is at least `decrease ×` what the whole fleet was sending
    /// (counted from its sends over the last second) × the reporter's delivered share, within
    /// the meter's 10% — never one process's share of it.
    #[test]
    fn a_cut_is_relative_to_the_fleets_rate_not_one_process_share(
        limit in 20.0f64..600.0,
        procs in 1usize..6,
        step_us in 500i64..5_000,
        share in 0.5f64..1.0,
        secs in 2i64..5,
    ) {
        let c = cfg().with_rate(RateConfig::fixed(limit).unwrap()).unwrap();
        let offsets = vec![0; procs];
        let end = secs * 1_000_000;
        let (row, sends) = skewed_fleet(&c, FlowRow::default(), &offsets, 0, end, step_us);
        let sent_last_s = sends.iter().filter(|&&t| t >= end - 1_000_000).count() as f64;
        let now = t0() + chrono::Duration::microseconds(end);
        // The reporter got its own share through: 1/N of what the fleet got.
        let own = sent_last_s * share / procs as f64;
        let s = c.apply(&row, FlowEvent::RateLimited {
            pause_until: None,
            served_per_s: Some(own),
            delivered: Some(share),
            probe: false,
        }, now, &mut rng());
        let cut = s.row.rate.unwrap();
        // What got through over the cycle: the fleet's sends since it started from idle, over
        // the time since with the PSP's full bucket counted as a second.
        let cycle = sends.len() as f64 / (secs as f64 + 1.0);
        let want = DEFAULT_RATE_DECREASE * cycle.min(sent_last_s * share);
        prop_assert!(cut >= 0.9 * want, "cut {cut:.1} < 0.9 × {want:.1} ({procs} processes, sent {sent_last_s}/s)");
        prop_assert!(cut > 1.2 * DEFAULT_RATE_DECREASE * own || procs == 1, "cut {cut:.1}: one process's share {own:.1}");
        prop_assert!(cut <= DEFAULT_RATE_DECREASE * limit + 1e-9, "cut {cut:.1} above 0.9 × {limit:.1}");
    }

    /// After a cut to `decrease ×` what got through (`W_max`, near the PSP's limit), a busy
    /// fleet of N processes is back at 90% of the limit within the epoch + K + one second
    /// (K = ∛(W_max·(1 − β)/C)), whatever the number of processes and their cadence.
    #[test]
    fn the_rate_returns_to_90_percent_of_the_limit_within_a_bounded_time(
        limit in 10.0f64..1000.0,
        got in 0.9f64..1.0,
        procs in 1usize..6,
        step_us in 1_000i64..20_000,
    ) {
        let c = cfg();
        let w_max = got * limit;
        let row = FlowRow {
            rate: Some(DEFAULT_RATE_DECREASE * w_max),
            rate_cap: Some(w_max),
            rate_cut_at: Some(t0()),
            rate_raised_at: Some(t0()),
            ..FlowRow::default()
        };
        let k = (w_max * (1.0 - DEFAULT_RATE_DECREASE) / DEFAULT_RATE_INCREASE).cbrt();
        let bound_us = ((1.0 + k + 1.0) * 1e6) as i64;
        let offsets = vec![0; procs];
        let (back, _) = skewed_fleet(&c, row, &offsets, 0, bound_us, step_us);
        let r = back.rate.unwrap();
        prop_assert!(r >= 0.9 * limit, "{r:.1} < 90% of {limit:.1} after {:.2} s", bound_us as f64 / 1e6);
    }

    /// With the processes' clocks skewed by up to ±S, no window admits more than
    /// rate × (window + 2S) + burst + 1: a process whose clock is behind sends the slots it
    /// reserved up to 2S late, on top of those of a process whose clock is ahead. (Shared
    /// times come from the database's clock, which makes S 0 in the runtime.)
    #[test]
    fn skewed_clocks_admit_at_most_rate_times_window_plus_twice_the_skew(
        rate in 5.0f64..300.0,
        burst in 0u32..10,
        procs in 2usize..6,
        skew_ms in 0i64..500,
        step_us in 500i64..10_000,
        window_ms in 100i64..2000,
    ) {
        let c = cfg().with_rate(RateConfig::fixed(rate).unwrap().with_burst(burst).with_adaptive(false)).unwrap();
        let s = skew_ms * 1000;
        let offsets: Vec<i64> = (0..procs).map(|i| -s + 2 * s * i as i64 / (procs as i64 - 1)).collect();
        let (_, sends) = skewed_fleet(&c, FlowRow::default(), &offsets, 0, 4_000_000, step_us);
        let w = window_ms * 1000;
        let bound = (rate * (window_ms + 2 * skew_ms) as f64 / 1000.0).floor() as usize + burst as usize + 1;
        let mut j = 0;
        for i in 0..sends.len() {
            while sends[i] - sends[j] >= w { j += 1; }
            prop_assert!(i - j < bound, "{} sends in {window_ms} ms at {rate}/s, skew ±{skew_ms} ms", i - j + 1);
        }
    }
}

#[test]
fn the_probe_above_w_max_is_bounded_per_second_of_use() {
    let c = cfg()
        .with_rate(RateConfig::fixed(10_000.0).unwrap().with_burst(0))
        .unwrap();
    let row = FlowRow {
        rate: Some(50.0),
        rate_cap: Some(50.0),
        rate_cut_at: Some(at_ms(-5000)),
        rate_raised_at: Some(t0()),
        ..FlowRow::default()
    };
    // Ten seconds of use at W_max: the pure curve would be at 50 + 0.4 × 10³ = 450/s.
    let r = reserve_every(&c, row, 0, 10_000, 10).rate.unwrap();
    assert!(r <= 50.0 * (1.0 + probe_slope(None) * 10.0) + 1e-6, "{r}");
    assert!(
        r > 50.0 * (1.0 + 0.8 * probe_slope(None) * 10.0),
        "{r}: it still probes"
    );
}

/// What a fleet of `procs` busy processes (each its own [`FlowClient`], one call at a time,
/// on one shared row, slow start on) does to a PSP that serves `limit`/s from a token bucket
/// holding one second of it (as the PSP simulator's) and answers 429 with `Retry-After:
/// retry_after_s` beyond, for `secs` seconds: (429s, requests admitted per second of the
/// time not paused by a 429, after the first 10 s).
fn fleet_against_a_bucket(limit: f64, retry_after_s: i64, procs: usize, secs: i64) -> (u32, f64) {
    let c = slow_cfg();
    let mut clients: Vec<FlowClient> = (0..procs)
        .map(|p| FlowClient::new(c.clone(), p as u64 + 1))
        .collect();
    // (until, whether it is a send slot's time).
    let mut waits: Vec<Option<(Timestamp, bool)>> = vec![None; procs];
    let mut row = FlowRow::default();
    let mut r = rng();
    let mut tokens = limit;
    let mut last_us = 0i64;
    let (mut limited, mut ok_late) = (0u32, 0u32);
    let mut paused_late_us = 0i64;
    let step = 1000i64;
    let mut now_us = 0i64;
    while now_us < secs * 1_000_000 {
        let now = t0() + chrono::Duration::microseconds(now_us);
        let late = now_us >= 10_000_000;
        if late && row.paused_until.is_some_and(|p| p > now) {
            paused_late_us += step;
        }
        for p in 0..procs {
            if waits[p].is_some_and(|(w, _)| w > now) {
                continue;
            }
            let mut next = match waits[p].take() {
                // A slot waited for: look again at the row, then send.
                Some((_, true)) => clients[p]
                    .at_slot(&row, now)
                    .unwrap_or(Next::Call { probe: false }),
                _ => clients[p].before_call(&row, false, AHEAD, now),
            };
            if let Next::Apply(ev) = next {
                let s = c.apply(&row, ev, now, &mut r);
                row = s.row;
                next = clients[p].granted(s.grant, AHEAD, now);
            }
            match next {
                Next::Call { .. } => {}
                Next::CallAt { at } if at <= now => {}
                Next::CallAt { at } => {
                    waits[p] = Some((at, true));
                    continue;
                }
                Next::Blocked { until: at, .. } | Next::Wait { until: at } => {
                    waits[p] = Some((at, false));
                    continue;
                }
                Next::Apply(_) => unreachable!(),
            }
            tokens = (tokens + (now_us - last_us).max(0) as f64 / 1e6 * limit).min(limit);
            last_us = last_us.max(now_us);
            let class = if tokens >= 1.0 {
                tokens -= 1.0;
                ok_late += u32::from(late);
                FailureClass::Success
            } else {
                limited += 1;
                FailureClass::RateLimited
            };
            let pause = (class == FailureClass::RateLimited)
                .then(|| now + chrono::Duration::seconds(retry_after_s));
            if let Some(ev) = clients[p].after_call(&row, false, class, Duration::ZERO, pause, now)
            {
                let s = c.apply(&row, ev, now, &mut r);
                row = s.row;
                clients[p].reported(&row, now);
            }
        }
        now_us += step;
    }
    let active_s = ((secs - 10) * 1_000_000 - paused_late_us) as f64 / 1e6;
    (limited, f64::from(ok_late) / active_s.max(1e-9))
}

/// A PSP whose 429 asks for a 3 s pause, and whose bucket refills during it: the fleet learns
/// its limit over the send cycle (the bucket counted as a second of time), not from the burst
/// the refilled bucket let through in the last second, and probes above it rarely. Five
/// processes against 40/s for a minute: at most four 429s (the first contact and a probe
/// every ~24 s), and what gets through while not paused is within 10% of the limit. (The
/// meter of the last second alone learned the burst: 429s every few seconds.)
#[test]
fn a_fleet_learns_a_bucketed_limit_over_the_cycle_and_probes_rarely_when_429s_cost_seconds() {
    for (limit, ra, procs) in [(40.0, 3, 5), (50.0, 1, 3), (40.0, 3, 8), (200.0, 1, 8)] {
        let (n429, through) = fleet_against_a_bucket(limit, ra, procs, 60);
        let most = if ra >= 3 { 4 } else { 9 };
        assert!(
            n429 <= most,
            "{procs} × against {limit}/s, Retry-After {ra}: {n429} 429s, {through:.1}/s through"
        );
        assert!(
            // Admitted per second not paused: a pause refills the bucket, so a little above.
            through >= 0.9 * limit && through <= 1.2 * limit,
            "{procs} × against {limit}/s, Retry-After {ra}: {through:.1}/s through, {n429} 429s"
        );
    }
}

#[test]
fn the_probe_is_slower_the_longer_a_429_pauses_the_fleet() {
    assert!((probe_slope(None) - 2.0 / 64.0).abs() < 1e-12);
    assert!((probe_slope(Some(Duration::from_millis(300))) - 2.0 / 64.0).abs() < 1e-12);
    assert!((probe_slope(Some(Duration::from_secs(3))) - 2.0 / 576.0).abs() < 1e-12);
    // The row keeps the pause the cut asked for.
    let c = cfg();
    let row = FlowRow {
        rate: Some(40.0),
        ..FlowRow::default()
    };
    let s = c.apply(
        &row,
        FlowEvent::RateLimited {
            pause_until: Some(at_ms(3000)),
            served_per_s: Some(40.0),
            delivered: Some(1.0),
            probe: false,
        },
        t0(),
        &mut rng(),
    );
    assert_eq!(s.row.rate_pause, Some(Duration::from_secs(3)));
    assert_eq!(s.row.cycle_started, Some(t0()), "a cut starts a new cycle");
    assert_eq!(s.row.cycle_slots, 0);
}

/// After a second without reservations the cycle starts a second before the first one (the
/// PSP's bucket is full); reservations closer together add to it.
#[test]
fn the_cycle_restarts_after_a_second_without_reservations() {
    let c = cfg()
        .with_rate(RateConfig::fixed(100.0).unwrap().with_burst(0))
        .unwrap();
    let row = reserve_every(&c, FlowRow::default(), 0, 1000, 1);
    assert_eq!(row.cycle_started, Some(at_ms(-1000)));
    assert!((95..=105).contains(&row.cycle_slots), "{}", row.cycle_slots);
    let cycle = c.cycle_rate(&row, at_ms(1000)).unwrap();
    assert!((cycle - 50.0).abs() < 3.0, "{cycle}: 100 slots over 2 s");
    // 1.5 s idle: a new cycle.
    let row = reserve_every(&c, row, 2600, 2700, 1);
    assert_eq!(row.cycle_started, Some(at_ms(1600)));
    assert!(row.cycle_slots <= 12, "{}", row.cycle_slots);
    assert_eq!(c.cycle_rate(&row, at_ms(2700)), None, "too short to say");
}

/// Slow start's ramp (from 20/s, doubling every 250 ms) against a PSP whose bucket holds a
/// second of its limit: the slots sent when the bucket ran dry, and the time since one second
/// before the ramp began, give the limit back within 5%, from 30/s to 2,000/s.
#[test]
fn slow_start_limit_inverts_the_ramp_against_a_bucket() {
    for limit in [30.0f64, 40.0, 200.0, 2000.0] {
        let (mut tokens, mut sent, mut t) = (limit, 0.0f64, 0.0f64);
        let dt = 1e-4;
        while tokens >= 0.0 {
            let rate = DEFAULT_SLOW_START * (t / SLOW_START_DOUBLING.as_secs_f64()).exp2();
            tokens = (tokens + limit * dt).min(limit) - rate * dt;
            sent += rate * dt;
            t += dt;
        }
        let est = slow_start_limit(sent, t + 1.0, DEFAULT_SLOW_START);
        assert!(
            (est - limit).abs() <= 0.05 * limit,
            "{limit}/s learned as {est:.1} ({sent:.0} sent in {t:.2} s)"
        );
        // Counting the ramp as time at the limit learns it low.
        assert!(sent / (t + 1.0) < est);
    }
}
