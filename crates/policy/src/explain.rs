//! What a policy will do, attempt by attempt, before it is deployed
//! (`redrive policy show`).
//!
//! The table is computed by running the real decision function
//! ([`RetryPolicy::decide`]) many times with seeded randomness against a
//! dependency that always fails with an infrastructure error (no
//! `Retry-After`), calls taking no time. So it shows exactly where retries turn
//! into defers, how long a job keeps trying, and which budget ends it.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Serialize;

use crate::jitter::Jitter;
use crate::outcome::Outcome;
use crate::policy::{Action, JobCounters, RetryPolicy};
use crate::{DeadReason, DeferReason};

/// One attempt's row: what happens after attempt number `attempt` fails.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExplainRow {
    /// The attempt that just failed (1 = the first call).
    pub attempt: u32,
    /// `retry` or `defer` (the phase most samples were in).
    pub phase: &'static str,
    /// The nominal (jitter-free) delay, in milliseconds.
    pub nominal_ms: u64,
    /// The lowest delay the jitter can give, in milliseconds.
    pub range_low_ms: u64,
    /// The highest delay the jitter can give, in milliseconds.
    pub range_high_ms: u64,
    /// Sampled delay, 5th percentile, in milliseconds.
    pub p5_ms: u64,
    /// Sampled delay, median, in milliseconds.
    pub p50_ms: u64,
    /// Sampled delay, 95th percentile, in milliseconds.
    pub p95_ms: u64,
    /// Median time from the first call to the next call, in milliseconds.
    pub elapsed_p50_ms: u64,
    /// Share of samples whose wait is slept in process (the rest are deferred).
    pub in_process_share: f64,
    /// Share of samples that made this attempt.
    pub reached_share: f64,
    /// Share of samples that die after this attempt (no delay then).
    pub dies_share: f64,
}

/// The whole table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The policy's name.
    pub policy: String,
    /// Trajectories sampled.
    pub samples: u32,
    /// The seed of the first.
    pub seed: u64,
    /// `in_process_max_wait`, in milliseconds.
    pub in_process_max_wait_ms: u64,
    /// The most attempts a job can make.
    pub max_attempts_total: u32,
    /// The deadline from enqueue, in milliseconds, if any.
    pub deadline_ms: Option<u64>,
    /// One row per attempt.
    pub rows: Vec<ExplainRow>,
    /// How the samples died: reason → count.
    pub dead: BTreeMap<String, u32>,
    /// Median attempts made before death.
    pub attempts_p50: u32,
    /// Median time from the first call to death, in milliseconds.
    pub total_p50_ms: u64,
}

struct Step {
    delay: Duration,
    defer_phase: bool,
    in_process: bool,
    elapsed: Duration,
    prev: Option<Duration>,
    defers_before: u32,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Samples `samples` trajectories of `policy` (seeded from `seed`) and tabulates them.
///
/// ```
/// let e = redrive_policy::explain(&redrive_policy::RetryPolicy::classic(), 200, 1);
/// assert_eq!(e.rows.len(), 5);
/// assert_eq!(e.rows[0].nominal_ms, 1000);
/// assert_eq!(e.dead["attempts_exhausted"], 200);
/// ```
pub fn explain(policy: &RetryPolicy, samples: u32, seed: u64) -> Explanation {
    let samples = samples.max(1);
    let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let mut trajectories: Vec<(Vec<Step>, DeadReason, Duration)> = Vec::new();
    for s in 0..samples {
        let mut rng = SmallRng::seed_from_u64(seed.wrapping_add(u64::from(s)));
        let mut c = JobCounters {
            deadline: policy.deadline_from(t0),
            ..Default::default()
        };
        let mut now = t0;
        let mut steps = Vec::new();
        let outcome = Outcome::Infrastructure { retry_after: None };
        let reason = loop {
            let prev = c.prev_delay;
            let defers_before = c.defers;
            let v = policy.decide(&c, &outcome, now, &mut rng);
            let (delay, defer_phase, in_process) = match v.action {
                Action::RetryInProcess { delay, .. } => (delay, false, true),
                Action::Defer { delay, reason, .. } => {
                    (delay, reason == DeferReason::DeferPhase, false)
                }
                Action::Dead { reason } => break reason,
                Action::Done | Action::RefreshCredentials => unreachable!("always failing"),
            };
            now += chrono::TimeDelta::from_std(delay).unwrap_or(chrono::TimeDelta::MAX);
            steps.push(Step {
                delay,
                defer_phase,
                in_process,
                elapsed: (now - t0).to_std().unwrap_or_default(),
                prev,
                defers_before,
            });
            c = v.counters;
        };
        let total = (now - t0).to_std().unwrap_or_default();
        trajectories.push((steps, reason, total));
    }

    let max_len = trajectories
        .iter()
        .map(|t| t.0.len() + 1)
        .max()
        .unwrap_or(1);
    let mut rows = Vec::with_capacity(max_len);
    for k in 0..max_len {
        let reached: Vec<_> = trajectories.iter().filter(|t| t.0.len() + 1 > k).collect();
        let steps: Vec<&Step> = reached.iter().filter_map(|t| t.0.get(k)).collect();
        let dies = reached.len() - steps.len();
        let defer_votes = steps.iter().filter(|s| s.defer_phase).count();
        let in_defer_phase = defer_votes * 2 > steps.len();
        let mut delays: Vec<Duration> = steps.iter().map(|s| s.delay).collect();
        delays.sort();
        let mut elapsed: Vec<Duration> = steps.iter().map(|s| s.elapsed).collect();
        elapsed.sort();
        let (nominal, jitter, base, cap, prev) = if in_defer_phase {
            let d = policy.defer().expect("defer phase exists");
            let n = steps.first().map_or(0, |s| s.defers_before);
            (
                d.schedule().nominal(n),
                d.jitter(),
                d.schedule().base(),
                d.schedule().cap(),
                None,
            )
        } else {
            let b = policy.retry().backoff();
            let prev = steps.first().and_then(|s| s.prev);
            (
                b.nominal(k as u32),
                policy.retry().jitter(),
                b.base(),
                b.cap(),
                prev,
            )
        };
        let (lo, hi) = if steps.is_empty() {
            (Duration::ZERO, Duration::ZERO)
        } else if jitter == Jitter::Decorrelated && !in_defer_phase && k > 0 {
            (delays[0], *delays.last().unwrap())
        } else {
            jitter.range(nominal, base, cap, prev)
        };
        rows.push(ExplainRow {
            attempt: k as u32 + 1,
            phase: if in_defer_phase { "defer" } else { "retry" },
            nominal_ms: if steps.is_empty() { 0 } else { ms(nominal) },
            range_low_ms: ms(lo),
            range_high_ms: ms(hi),
            p5_ms: ms(pct(&delays, 0.05)),
            p50_ms: ms(pct(&delays, 0.5)),
            p95_ms: ms(pct(&delays, 0.95)),
            elapsed_p50_ms: ms(pct(&elapsed, 0.5)),
            in_process_share: if steps.is_empty() {
                0.0
            } else {
                steps.iter().filter(|s| s.in_process).count() as f64 / steps.len() as f64
            },
            reached_share: reached.len() as f64 / f64::from(samples),
            dies_share: dies as f64 / f64::from(samples),
        });
    }

    let mut dead = BTreeMap::new();
    for t in &trajectories {
        *dead.entry(t.1.as_str().to_owned()).or_insert(0) += 1;
    }
    let mut attempts: Vec<u32> = trajectories.iter().map(|t| t.0.len() as u32 + 1).collect();
    attempts.sort_unstable();
    let mut totals: Vec<Duration> = trajectories.iter().map(|t| t.2).collect();
    totals.sort();
    Explanation {
        policy: policy.name().to_owned(),
        samples,
        seed,
        in_process_max_wait_ms: ms(policy.retry().in_process_max_wait()),
        max_attempts_total: policy.total_max_attempts(),
        deadline_ms: policy.deadline().map(ms),
        rows,
        dead,
        attempts_p50: attempts[attempts.len() / 2],
        total_p50_ms: ms(pct(&totals, 0.5)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backoff, ExponentialBuilder};

    #[test]
    fn a_jitter_free_policy_is_exact() {
        let p = RetryPolicy::builder("x")
            .with_backoff(
                ExponentialBuilder::new()
                    .with_base(Duration::from_secs(1))
                    .with_cap(Duration::from_secs(8))
                    .build()
                    .unwrap(),
            )
            .with_jitter(Jitter::None)
            .with_max_attempts(6)
            .without_window()
            .with_in_process_max_wait(Duration::from_secs(4))
            .build()
            .unwrap();
        let e = explain(&p, 10, 1);
        let nominal: Vec<_> = e.rows.iter().map(|r| r.nominal_ms).collect();
        assert_eq!(nominal, vec![1000, 2000, 4000, 8000, 8000, 0]);
        let p50: Vec<_> = e.rows.iter().map(|r| r.p50_ms).collect();
        assert_eq!(p50, vec![1000, 2000, 4000, 8000, 8000, 0]);
        let elapsed: Vec<_> = e.rows.iter().map(|r| r.elapsed_p50_ms).collect();
        assert_eq!(elapsed, vec![1000, 3000, 7000, 15000, 23000, 0]);
        let in_process: Vec<_> = e.rows.iter().map(|r| r.in_process_share).collect();
        assert_eq!(in_process, vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        assert_eq!(e.rows[5].dies_share, 1.0);
        assert_eq!(e.dead["attempts_exhausted"], 10);
        assert_eq!(e.attempts_p50, 6);
        assert_eq!(e.total_p50_ms, 23_000);
    }

    #[test]
    fn payment_shows_the_defer_phase_and_its_end() {
        let e = explain(&RetryPolicy::payment(), 300, 1);
        assert_eq!(e.rows.len(), 15);
        assert!(e.rows[..9].iter().all(|r| r.phase == "retry"));
        assert!(e.rows[9..14].iter().all(|r| r.phase == "defer"));
        let defer: Vec<_> = e.rows[9..14].iter().map(|r| r.nominal_ms).collect();
        assert_eq!(defer, vec![60_000, 300_000, 900_000, 3_600_000, 14_400_000]);
        assert_eq!(e.rows[14].dies_share, 1.0);
        assert_eq!(e.dead["defers_exhausted"], 300);
        for r in &e.rows {
            assert!(r.p5_ms <= r.p50_ms && r.p50_ms <= r.p95_ms);
            assert!(r.range_low_ms <= r.p5_ms && r.p95_ms <= r.range_high_ms);
        }
    }

    #[test]
    fn a_window_can_end_the_retry_phase_early() {
        let p = RetryPolicy::builder("w")
            .with_backoff(Backoff::constant(Duration::from_secs(60)).unwrap())
            .with_jitter(Jitter::None)
            .with_max_attempts(100)
            .with_window(Duration::from_secs(300))
            .build()
            .unwrap();
        let e = explain(&p, 5, 1);
        assert_eq!(e.dead["window_exhausted"], 5);
        assert_eq!(e.attempts_p50, 6);
    }
}
