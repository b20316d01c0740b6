//! Property tests of the policy crate's parsers of outside input: `Retry-After`, durations and
//! the policies TOML. None may panic, whatever it is fed; what they accept round-trips.
//!
//! The long run (`REDRIVE_PROPTEST_SECS`, default 600 s) is ignored by default:
//! `cargo test -p redrive-policy --test parsers_prop -- --ignored`.

use std::time::{Duration, Instant, SystemTime};

use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redrive_policy::{PolicySet, format_duration, parse_duration, parse_retry_after};

fn now() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 4, 10, 0, 0).unwrap()
}

/// Header values: numbers, dates, near-misses and noise.
fn retry_after_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        "[0-9]{1,40}",
        "-?[0-9.]{1,12}",
        "[ \t]{0,2}[0-9]{1,6}[ \t]{0,2}",
        (0i64..4_000_000_000).prop_map(|s| {
            httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(s as u64))
        }),
        "[A-Za-z]{3}, [0-9]{2} [A-Za-z]{3} [0-9]{4} [0-9:]{8} GMT",
        "\\PC{0,40}",
        ".{0,40}",
    ]
}

fn check_retry_after(v: &str) -> Result<(), TestCaseError> {
    // Never panics; a plain number is that many seconds.
    let r = parse_retry_after(v, now());
    let t = v.trim_matches([' ', '\t']);
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        match t.parse::<u64>() {
            Ok(n) => prop_assert_eq!(r.clone(), Ok(Duration::from_secs(n))),
            Err(_) => prop_assert!(r.is_err()),
        }
    }
    if let Err(e) = &r {
        prop_assert!(!e.to_string().is_empty());
    }
    Ok(())
}

/// An HTTP date in the future is the wait until then, to the second.
fn check_retry_after_date(ahead: u64) -> Result<(), TestCaseError> {
    let at: SystemTime = SystemTime::from(now()) + Duration::from_secs(ahead);
    let v = httpdate::fmt_http_date(at);
    prop_assert_eq!(parse_retry_after(&v, now()), Ok(Duration::from_secs(ahead)));
    Ok(())
}

fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            any::<u32>(),
            prop::sample::select(vec!["ms", "s", "m", "h", "d", "us", "ns", "x", ""])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        "[0-9]{1,25}(ms|s|m|h)",
        "[0-9 hms.-]{0,16}",
        "\\PC{0,20}",
    ]
}

fn check_duration(s: &str) -> Result<(), TestCaseError> {
    if let Ok(d) = parse_duration(s) {
        // What is accepted has a unit and is not negative.
        prop_assert!(!s.trim().starts_with('-'));
        let _ = format_duration(d);
    } else {
        prop_assert!(
            parse_duration(s)
                .unwrap_err()
                .to_string()
                .contains("invalid duration")
        );
    }
    Ok(())
}

/// Whole seconds, and milliseconds under a second, survive format → parse exactly.
fn check_duration_round_trip(secs: u64, ms: u64) -> Result<(), TestCaseError> {
    let d = Duration::from_secs(secs);
    let shown = format_duration(d);
    if secs > 0 {
        prop_assert_eq!(parse_duration(&shown).ok(), Some(d), "{}", shown);
    }
    let d = Duration::from_millis(ms);
    let shown = format_duration(d);
    prop_assert_eq!(parse_duration(&shown).ok(), Some(d), "{}", shown);
    Ok(())
}

/// Policies files: valid, nearly valid and broken.
fn policy_toml() -> impl Strategy<Value = (String, Option<u32>)> {
    let dur = prop_oneof![
        Just("100ms".to_owned()),
        Just("0s".to_owned()),
        Just("10m".to_owned()),
        Just("-1s".to_owned()),
        "[0-9]{1,6}(ms|s|m|h)?",
        "\\PC{0,6}",
    ];
    let jitter = prop::sample::select(vec![
        "none",
        "full",
        "equal",
        "decorrelated",
        "proportional(0.5)",
        "proportional(9)",
        "bogus",
    ]);
    let attempts = prop_oneof![1i64..=20, any::<i64>()];
    let structured = (
        "[a-z][a-z0-9_-]{0,10}",
        prop::sample::select(vec!["payment", "background", "classic", "nope"]),
        dur.clone(),
        dur,
        jitter,
        attempts,
        prop::option::of(100u16..700),
    )
        .prop_map(|(name, extends, base, cap, jitter, attempts, status)| {
            let mut t = format!(
                "[policy.{name}]\nextends = \"{extends}\"\n[policy.{name}.retry]\nbase = {base:?}\ncap = {cap:?}\njitter = \"{jitter}\"\nmax_attempts = {attempts}\n"
            );
            if let Some(s) = status {
                t.push_str(&format!("[policy.{name}.status]\n{s} = \"infrastructure\"\n"));
            }
            let want = u32::try_from(attempts).ok();
            (t, want)
        });
    prop_oneof![
        structured,
        "\\PC{0,80}".prop_map(|t| (t, None)),
        "(\\[[a-z.]{0,12}\\]\n)?([a-z_]{1,8} = [0-9\"a-z]{0,6}\n){0,4}".prop_map(|t| (t, None)),
    ]
}

fn check_policy_toml(text: &str, attempts: Option<u32>) -> Result<(), TestCaseError> {
    match PolicySet::from_toml(text) {
        Ok(set) => {
            // A policy that was accepted is there, with the attempts it was given.
            if let (Some(n), Some(name)) = (
                attempts,
                text.strip_prefix("[policy.")
                    .and_then(|r| r.split(']').next()),
            ) {
                let p = set
                    .get(name)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(p.retry().max_attempts(), n);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!msg.is_empty() && !msg.contains('\n'), "{:?}", msg);
        }
    }
    Ok(())
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        // Runners made by hand know no source file to persist failures to.
        failure_persistence: None,
        ..Config::default()
    })
}

fn run_all(cases: u32) {
    runner(cases)
        .run(&retry_after_value(), |v| check_retry_after(&v))
        .unwrap();
    runner(cases)
        .run(&(0u64..10_000_000_000), check_retry_after_date)
        .unwrap();
    runner(cases)
        .run(&duration_text(), |s| check_duration(&s))
        .unwrap();
    runner(cases)
        .run(&(0u64..100_000_000, 0u64..1000), |(s, ms)| {
            check_duration_round_trip(s, ms)
        })
        .unwrap();
    runner(cases)
        .run(&policy_toml(), |(t, n)| check_policy_toml(&t, n))
        .unwrap();
}

#[test]
fn parsers_never_panic_and_round_trip() {
    // PROPTEST_CASES from the environment raises it; 256 by default.
    run_all(Config::default().cases);
}

/// The long run: every property, over and over, for `REDRIVE_PROPTEST_SECS` (default 600).
#[test]
#[ignore = "long run: cargo test -p redrive-policy --test parsers_prop -- --ignored"]
fn parsers_long_run() {
    let secs: u64 = std::env::var("REDRIVE_PROPTEST_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut rounds = 0u64;
    while Instant::now() < end {
        run_all(2000);
        rounds += 1;
    }
    eprintln!(
        "policy parsers: {} cases per property, 0 failures",
        rounds * 2000
    );
}
