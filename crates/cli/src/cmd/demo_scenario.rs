//! The demo's scenario, shared by `redrive demo` (which runs it against the PSP simulator)
//! and `redrive simulate --scenario demo` (which predicts it with the same flow-control code):
//! a bad day at a PSP, and the policies the demo's workers use through it.

use std::time::Duration;

use redrive_policy::{
    BreakerConfig, FlowConfig, Jitter, PolicySet, RateConfig, RetryPolicy, Window,
};
use redrive_psp_sim::{Faults, Outage};

use crate::args::DemoArgs;

/// The queue the demo's charges go to.
pub(crate) const QUEUE: &str = "payments";
/// The dependency every charge calls.
pub(crate) const DEPENDENCY: &str = "psp";
/// The outage: (start, length) in seconds from the start of the run.
pub(crate) const OUTAGE: (u64, u64) = (3, 5);
/// The PSP's `Retry-After` on a 429, in seconds.
pub(crate) const RETRY_AFTER_S: u64 = 1;
/// The PSP's rate limit, requests per second.
pub(crate) const LIMIT_RPS: f64 = 80.0;
/// The share of requests answered 5xx.
pub(crate) const ERROR_RATE: f64 = 0.2;
/// The share of charges whose answer is lost after the charge was made.
pub(crate) const LOST_ANSWERS: f64 = 0.05;
/// The charges' timeout per call (the `http` payloads' `timeout_ms`).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(1000);
/// How often the demo's idle worker looks for work.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(50);

pub(crate) fn policies() -> anyhow::Result<(PolicySet, RetryPolicy)> {
    // The payment preset, with demo-sized budgets: more attempts (every 429 is one), a backoff
    // capped at 2 s and a defer phase in seconds instead of minutes, so the whole run fits in a
    // minute. (With the preset's 30 s cap, the one charge in a few thousand that fails six or
    // seven times in a row against the demo's 25% failures waited up to 13 s after all the
    // others were done: the run's time was that charge's.)
    let policy = RetryPolicy::builder("demo")
        .with_backoff(
            redrive_policy::ExponentialBuilder::new()
                .with_base(Duration::from_millis(200))
                .with_multiplier(2.0)
                .with_cap(Duration::from_secs(2))
                .build()?,
        )
        .with_max_attempts(25)
        .with_jitter(Jitter::Full)
        .with_window(Duration::from_secs(300))
        .with_defer(
            redrive_policy::Backoff::schedule(
                vec![
                    Duration::from_secs(2),
                    Duration::from_secs(5),
                    Duration::from_secs(10),
                ],
                Duration::from_secs(10),
            )?,
            Jitter::proportional(0.2)?,
            3,
        )
        .with_max_exceptions(5)
        .with_blocked_jitter(Duration::from_millis(500))
        .build()?;
    // A quarter of all calls fail on a normal minute here (20% 5xx, 5% lost answers): open at
    // 60% over the last 50 calls (at least 30), so that background errors never open it while
    // an outage opens it within a few hundred milliseconds. Short cool-downs (1 s, then 1.5 s
    // at most): the outage lasts 5 s, and the fleet should find out within a second and a half
    // that it is over. Five probes per round, judged as a group: one unlucky probe does not
    // keep it open.
    let breaker = BreakerConfig::builder()
        .with_window(Window::Count { size: 50 })
        .with_minimum_calls(30)
        .with_failure_rate(0.6)
        .with_open_cooldown(Duration::from_secs(1))
        .with_cooldown_multiplier(1.5)
        .with_cooldown_max(Duration::from_millis(1500))
        .build()?;
    // No configured rate limit: the fleet learns the PSP's from its 429s (the default).
    let flow = FlowConfig::default()
        .with_breaker(breaker)
        .with_rate(RateConfig::adaptive())?;
    let mut set = PolicySet::builtin();
    set.insert(policy.clone());
    set.insert_flow(DEPENDENCY, flow);
    Ok((set, policy))
}

pub(crate) fn scenario(a: &DemoArgs) -> Faults {
    if a.no_faults {
        return Faults {
            seed: Some(a.seed),
            ..Faults::none()
        };
    }
    Faults {
        error_rate: ERROR_RATE,
        rate_limit: Some(LIMIT_RPS),
        retry_after: Some(Duration::from_secs(RETRY_AFTER_S)),
        outage: Some(Outage::new(
            Duration::from_secs(OUTAGE.0),
            Duration::from_secs(OUTAGE.1),
        )),
        latency: Duration::from_millis(10),
        timeout_after_commit: LOST_ANSWERS,
        timeout_delay: Duration::from_secs(2),
        seed: Some(a.seed),
        ..Faults::none()
    }
}
