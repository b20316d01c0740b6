//! The circuit breaker (R9–R11) as a pure state machine.
//!
//! ```text
//!            failure rate ≥ threshold (≥ minimum calls)
//!   Closed ───────────────────────────────────────────▶ Open
//!     ▲                                                  │ cool-down elapsed
//!     │ every probe succeeded                            ▼
//!     └──────────────────────────────────────────── HalfOpen ──probe failed──▶ Open
//! ```
//!
//! Why a state machine with time passed in: the breaker must be testable to
//! the millisecond and its state must be shareable across a fleet (the
//! runtime writes openings to the store, so every worker stops calling a PSP
//! that is down). Nothing here reads a clock; `now` comes from the caller.
//! Every change of state returns a [`Transition`], so the caller can emit a
//! metric, an event and a log line for it (R11).
//!
//! ```
//! use std::time::Duration;
//! use chrono::Utc;
//! use redrive_policy::{Admission, BreakerConfig, BreakerState, CircuitBreaker, FailureClass, Window};
//!
//! let config = BreakerConfig::builder()
//!     .with_window(Window::Count { size: 10 })
//!     .with_minimum_calls(4)
//!     .with_failure_rate(0.5)
//!     .with_open_cooldown(Duration::from_secs(5))
//!     .build()
//!     .unwrap();
//! let mut b = CircuitBreaker::new(config, 1);
//! let now = Utc::now();
//! for _ in 0..4 {
//!     assert_eq!(b.admit(now).0, Admission::Allowed);
//!     b.record(FailureClass::Infrastructure, Duration::from_millis(30), now);
//! }
//! assert_eq!(b.state(), BreakerState::Open);
//! assert!(matches!(b.admit(now).0, Admission::Rejected { .. }));
//! ```

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::error::PolicyError;
use crate::jitter::Jitter;
use crate::{FailureClass, Timestamp, format_duration};

/// The breaker's state, as stored and shown (`closed`, `open`, `half_open`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls go through; outcomes fill the window.
    #[default]
    Closed,
    /// No calls until the cool-down ends.
    Open,
    /// A limited number of probes go through.
    HalfOpen,
}

impl BreakerState {
    /// The stored name.
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The Prometheus gauge value of `redrive_breaker_state`: 0 closed, 1 open, 2 half-open.
    pub const fn gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::Open => 1.0,
            BreakerState::HalfOpen => 2.0,
        }
    }

    /// Parses a stored name.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] for an unknown name.
    pub fn parse(s: &str) -> Result<Self, PolicyError> {
        match s {
            "closed" => Ok(BreakerState::Closed),
            "open" => Ok(BreakerState::Open),
            "half_open" => Ok(BreakerState::HalfOpen),
            _ => Err(PolicyError::invalid(
                "breaker state",
                format!("{s:?}"),
                "one of closed, open, half_open",
            )),
        }
    }
}

impl std::fmt::Display for BreakerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operator's override (stored and shown as `normal`, `forced_open`, `forced_closed`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BreakerMode {
    /// The state machine decides.
    #[default]
    Normal,
    /// Always open: no calls at all, until released.
    ForcedOpen,
    /// Always closed: every call goes through, until released.
    ForcedClosed,
}

impl BreakerMode {
    /// The stored name.
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerMode::Normal => "normal",
            BreakerMode::ForcedOpen => "forced_open",
            BreakerMode::ForcedClosed => "forced_closed",
        }
    }

    /// Parses a stored name.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] for an unknown name.
    pub fn parse(s: &str) -> Result<Self, PolicyError> {
        match s {
            "normal" => Ok(BreakerMode::Normal),
            "forced_open" => Ok(BreakerMode::ForcedOpen),
            "forced_closed" => Ok(BreakerMode::ForcedClosed),
            _ => Err(PolicyError::invalid(
                "breaker mode",
                format!("{s:?}"),
                "one of normal, forced_open, forced_closed",
            )),
        }
    }
}

/// The sliding window over which the failure rate is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The last `size` calls.
    Count {
        /// Calls in the window (1..=10,000).
        size: u32,
    },
    /// The calls of the last `length`, in ten buckets.
    Time {
        /// The window's length (100 ms..=1 h).
        length: Duration,
    },
}

/// How one call counts for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    /// The dependency worked.
    Success,
    /// The dependency failed.
    Failure,
    /// Neither (e.g. a rate limit: the pause handles it).
    Ignored,
}

/// Whether a call may go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: go.
    Allowed,
    /// Half-open: go, as one of the limited probes.
    Probe,
    /// Open, or half-open with no probe left: don't call. `until` is when to try again
    /// (`None` while forced open).
    Rejected {
        /// The next time a call may be admitted.
        until: Option<Timestamp>,
    },
}

/// Why the breaker changed state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TransitionReason {
    /// The failure rate reached the threshold.
    FailureRate {
        /// The measured rate (0..1).
        rate: f64,
        /// Calls in the window.
        calls: u32,
    },
    /// The slow-call rate reached the threshold.
    SlowCallRate {
        /// The measured rate (0..1).
        rate: f64,
        /// Calls in the window.
        calls: u32,
    },
    /// The cool-down ended: probes may go.
    CooldownElapsed,
    /// A probe failed.
    ProbeFailed,
    /// Every probe of the round succeeded.
    ProbesSucceeded,
    /// An operator forced or released the breaker.
    Forced,
    /// Another worker of the fleet changed the shared state.
    Remote,
}

impl std::fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransitionReason::FailureRate { rate, calls } => {
                write!(f, "failure rate {:.0}% over {calls} calls", rate * 100.0)
            }
            TransitionReason::SlowCallRate { rate, calls } => {
                write!(f, "slow-call rate {:.0}% over {calls} calls", rate * 100.0)
            }
            TransitionReason::CooldownElapsed => f.write_str("cool-down elapsed"),
            TransitionReason::ProbeFailed => f.write_str("probe failed"),
            TransitionReason::ProbesSucceeded => f.write_str("probes succeeded"),
            TransitionReason::Forced => f.write_str("forced by an operator"),
            TransitionReason::Remote => f.write_str("changed by another worker"),
        }
    }
}

/// One change of state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    /// The state before.
    pub from: BreakerState,
    /// The state after.
    pub to: BreakerState,
    /// When.
    pub at: Timestamp,
    /// Why.
    pub reason: TransitionReason,
    /// For a transition to open: when probes may start.
    pub open_until: Option<Timestamp>,
}

// ===== config =====

/// A breaker's configuration. Build it with [`BreakerConfig::builder`].
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// The sliding window.
    pub window: Window,
    /// Open when failures / calls ≥ this (0 < rate ≤ 1).
    pub failure_rate: f64,
    /// …and at least this many calls are in the window.
    pub minimum_calls: u32,
    /// A call slower than this is slow; `None`: slow calls are not tracked.
    pub slow_call_duration: Option<Duration>,
    /// Open when slow calls / calls ≥ this.
    pub slow_call_rate: f64,
    /// How long the breaker stays open the first time.
    pub open_cooldown: Duration,
    /// Each further opening without a close in between multiplies the cool-down by this.
    pub cooldown_multiplier: f64,
    /// The cool-down never exceeds this (jitter included).
    pub cooldown_max: Duration,
    /// The cool-down is spread by `proportional(f)` jitter with this `f` (0: none).
    pub cooldown_jitter: f64,
    /// Probes admitted per half-open round.
    pub half_open_probes: u32,
    /// A half-open round whose probes have not all answered after this starts a new round.
    pub half_open_timeout: Duration,
    failure_mask: u8,
    ignored_mask: u8,
}

const fn bit(c: FailureClass) -> u8 {
    1 << (c as u8)
}

impl BreakerConfig {
    /// A builder with the defaults.
    pub const fn builder() -> BreakerConfigBuilder {
        BreakerConfigBuilder::new()
    }

    /// How a call of this class counts.
    pub fn result_of(&self, class: FailureClass) -> CallResult {
        let b = bit(class);
        if self.failure_mask & b != 0 {
            CallResult::Failure
        } else if self.ignored_mask & b != 0 {
            CallResult::Ignored
        } else {
            CallResult::Success
        }
    }

    /// The classes that count as failures.
    pub fn failure_classes(&self) -> Vec<FailureClass> {
        FailureClass::ALL
            .iter()
            .copied()
            .filter(|c| self.failure_mask & bit(*c) != 0)
            .collect()
    }

    /// The classes that are ignored.
    pub fn ignored_classes(&self) -> Vec<FailureClass> {
        FailureClass::ALL
            .iter()
            .copied()
            .filter(|c| self.ignored_mask & bit(*c) != 0)
            .collect()
    }

    /// Failed probes of one half-open round that reopen the breaker: `failure_rate` of the
    /// round's probes, at least one. As many successes as can no longer let the failures
    /// reach it close the breaker (5 probes at 50%: 3 failures reopen, 3 successes close).
    pub fn probes_to_reopen(&self) -> u32 {
        let n = self.half_open_probes.max(1);
        ((self.failure_rate * f64::from(n)).ceil() as u32).clamp(1, n)
    }

    /// The cool-down after `openings` openings in a row (1 for the first), before jitter.
    pub fn cooldown(&self, openings: u32) -> Duration {
        let exp = i32::try_from(openings.saturating_sub(1)).unwrap_or(i32::MAX);
        let s = self.open_cooldown.as_secs_f64() * self.cooldown_multiplier.powi(exp);
        if !s.is_finite() || s >= self.cooldown_max.as_secs_f64() {
            self.cooldown_max
        } else {
            Duration::from_secs_f64(s)
        }
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfigBuilder::new()
            .build()
            .expect("defaults are valid")
    }
}

/// Builds a [`BreakerConfig`].
///
/// # Default
/// - window: the last 50 calls (`Window::Count { size: 50 }`)
/// - failure rate: 0.5, minimum calls: 20
/// - slow calls: not tracked (slow-call rate 1.0 when enabled)
/// - open cool-down: 10 s, ×2 per further opening, at most 5 min, jitter `proportional(0.1)`
/// - half-open: 5 probes judged as a group (see [`crate::FlowConfig`]), a new round after
///   30 s without answers
/// - failures: `infrastructure` and `timeout`; ignored: `rate_limited` and `exception`;
///   everything else (success, permanent, auth) counts as a success: the dependency answered.
#[derive(Debug, Clone)]
pub struct BreakerConfigBuilder {
    c: BreakerConfig,
}

impl Default for BreakerConfigBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BreakerConfigBuilder {
    /// The defaults listed above.
    pub const fn new() -> Self {
        Self {
            c: BreakerConfig {
                window: Window::Count { size: 50 },
                failure_rate: 0.5,
                minimum_calls: 20,
                slow_call_duration: None,
                slow_call_rate: 1.0,
                open_cooldown: Duration::from_secs(10),
                cooldown_multiplier: 2.0,
                cooldown_max: Duration::from_secs(300),
                cooldown_jitter: 0.1,
                half_open_probes: 5,
                half_open_timeout: Duration::from_secs(30),
                failure_mask: bit(FailureClass::Infrastructure) | bit(FailureClass::Timeout),
                ignored_mask: bit(FailureClass::RateLimited) | bit(FailureClass::Exception),
            },
        }
    }

    /// The sliding window.
    pub const fn with_window(mut self, w: Window) -> Self {
        self.c.window = w;
        self
    }
    /// The failure-rate threshold.
    pub const fn with_failure_rate(mut self, r: f64) -> Self {
        self.c.failure_rate = r;
        self
    }
    /// The minimum number of calls before the rate is judged.
    pub const fn with_minimum_calls(mut self, n: u32) -> Self {
        self.c.minimum_calls = n;
        self
    }
    /// Track slow calls: slower than `d` is slow; open at `rate`.
    pub const fn with_slow_calls(mut self, d: Duration, rate: f64) -> Self {
        self.c.slow_call_duration = Some(d);
        self.c.slow_call_rate = rate;
        self
    }
    /// The first cool-down.
    pub const fn with_open_cooldown(mut self, d: Duration) -> Self {
        self.c.open_cooldown = d;
        self
    }
    /// Growth of the cool-down per further opening (1: constant).
    pub const fn with_cooldown_multiplier(mut self, m: f64) -> Self {
        self.c.cooldown_multiplier = m;
        self
    }
    /// The longest cool-down.
    pub const fn with_cooldown_max(mut self, d: Duration) -> Self {
        self.c.cooldown_max = d;
        self
    }
    /// The cool-down's proportional jitter factor (0: none).
    pub const fn with_cooldown_jitter(mut self, f: f64) -> Self {
        self.c.cooldown_jitter = f;
        self
    }
    /// Probes per half-open round.
    pub const fn with_half_open_probes(mut self, n: u32) -> Self {
        self.c.half_open_probes = n;
        self
    }
    /// How long a half-open round waits for its probes.
    pub const fn with_half_open_timeout(mut self, d: Duration) -> Self {
        self.c.half_open_timeout = d;
        self
    }
    /// The classes that count as failures (the rest count as successes unless ignored).
    pub fn with_failure_classes(mut self, classes: &[FailureClass]) -> Self {
        self.c.failure_mask = classes.iter().fold(0, |m, c| m | bit(*c));
        self.c.ignored_mask &= !self.c.failure_mask;
        self
    }
    /// The classes that count neither way.
    pub fn with_ignored_classes(mut self, classes: &[FailureClass]) -> Self {
        self.c.ignored_mask = classes.iter().fold(0, |m, c| m | bit(*c)) & !self.c.failure_mask;
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming the field and its range.
    pub fn build(self) -> Result<BreakerConfig, PolicyError> {
        let c = self.c;
        let rate_ok = |r: f64| r > 0.0 && r <= 1.0;
        match c.window {
            Window::Count { size } if !(1..=10_000).contains(&size) => {
                return Err(PolicyError::invalid(
                    "window",
                    format!("{size} calls"),
                    "from 1 to 10000 calls",
                ));
            }
            Window::Time { length }
                if length < Duration::from_millis(100) || length > Duration::from_secs(3600) =>
            {
                return Err(PolicyError::invalid(
                    "window",
                    format_duration(length),
                    "from 100ms to 1h",
                ));
            }
            _ => {}
        }
        if !rate_ok(c.failure_rate) {
            return Err(PolicyError::invalid(
                "failure_rate",
                c.failure_rate.to_string(),
                "above 0 and at most 1",
            ));
        }
        if c.minimum_calls == 0 {
            return Err(PolicyError::invalid("minimum_calls", "0", "at least 1"));
        }
        if !rate_ok(c.slow_call_rate) {
            return Err(PolicyError::invalid(
                "slow_call_rate",
                c.slow_call_rate.to_string(),
                "above 0 and at most 1",
            ));
        }
        if c.slow_call_duration.is_some_and(|d| d.is_zero()) {
            return Err(PolicyError::invalid("slow_call_duration", "0s", "above 0s"));
        }
        if c.open_cooldown.is_zero() || c.open_cooldown > c.cooldown_max {
            return Err(PolicyError::invalid(
                "open_cooldown",
                format_duration(c.open_cooldown),
                format!(
                    "above 0s and at most cooldown_max ({})",
                    format_duration(c.cooldown_max)
                ),
            ));
        }
        if c.cooldown_max > Duration::from_secs(24 * 3600) {
            return Err(PolicyError::invalid(
                "cooldown_max",
                format_duration(c.cooldown_max),
                "at most 24h",
            ));
        }
        if !(1.0..=100.0).contains(&c.cooldown_multiplier) {
            return Err(PolicyError::invalid(
                "cooldown_multiplier",
                c.cooldown_multiplier.to_string(),
                "from 1 to 100",
            ));
        }
        if !(0.0..=10.0).contains(&c.cooldown_jitter) {
            return Err(PolicyError::invalid(
                "cooldown_jitter",
                c.cooldown_jitter.to_string(),
                "from 0 to 10",
            ));
        }
        if !(1..=1000).contains(&c.half_open_probes) {
            return Err(PolicyError::invalid(
                "half_open_probes",
                c.half_open_probes.to_string(),
                "from 1 to 1000",
            ));
        }
        if c.half_open_timeout.is_zero() {
            return Err(PolicyError::invalid("half_open_timeout", "0s", "above 0s"));
        }
        if c.failure_mask == 0 {
            return Err(PolicyError::invalid(
                "failure_classes",
                "[]",
                "at least one class",
            ));
        }
        // A decline is the PSP answering: the issuer said no, the dependency is healthy.
        if c.failure_mask & bit(FailureClass::Declined) != 0 {
            return Err(PolicyError::invalid(
                "failure_classes",
                "\"declined\"",
                "without declined (a decline is the dependency answering, never a breaker failure)",
            ));
        }
        Ok(c)
    }
}

// ===== windows =====

const BUCKETS: usize = 10;

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    calls: u32,
    failures: u32,
    slow: u32,
}

#[derive(Debug, Clone)]
enum WindowState {
    Count {
        ring: Vec<u8>, // bit 0: failure, bit 1: slow, bit 2: present
        next: usize,
        totals: Counts,
    },
    Time {
        bucket_ms: i64,
        buckets: Box<[(i64, Counts); BUCKETS]>,
    },
}

impl WindowState {
    fn new(w: Window) -> Self {
        match w {
            Window::Count { size } => WindowState::Count {
                ring: vec![0; size as usize],
                next: 0,
                totals: Counts::default(),
            },
            Window::Time { length } => WindowState::Time {
                bucket_ms: (length.as_millis() as i64 / BUCKETS as i64).max(1),
                buckets: Box::new([(i64::MIN, Counts::default()); BUCKETS]),
            },
        }
    }

    fn reset(&mut self) {
        match self {
            WindowState::Count { ring, next, totals } => {
                ring.iter_mut().for_each(|x| *x = 0);
                *next = 0;
                *totals = Counts::default();
            }
            WindowState::Time { buckets, .. } => {
                **buckets = [(i64::MIN, Counts::default()); BUCKETS];
            }
        }
    }

    fn add(&mut self, failure: bool, slow: bool, now_ms: i64) {
        match self {
            WindowState::Count { ring, next, totals } => {
                let old = ring[*next];
                if old & 4 != 0 {
                    totals.calls -= 1;
                    totals.failures -= u32::from(old & 1);
                    totals.slow -= u32::from((old >> 1) & 1);
                }
                ring[*next] = 4 | u8::from(failure) | (u8::from(slow) << 1);
                totals.calls += 1;
                totals.failures += u32::from(failure);
                totals.slow += u32::from(slow);
                *next = (*next + 1) % ring.len();
            }
            WindowState::Time { bucket_ms, buckets } => {
                let epoch = now_ms.div_euclid(*bucket_ms);
                let slot = &mut buckets[epoch.rem_euclid(BUCKETS as i64) as usize];
                if slot.0 != epoch {
                    *slot = (epoch, Counts::default());
                }
                slot.1.calls += 1;
                slot.1.failures += u32::from(failure);
                slot.1.slow += u32::from(slow);
            }
        }
    }

    fn totals(&self, now_ms: i64) -> Counts {
        match self {
            WindowState::Count { totals, .. } => *totals,
            WindowState::Time { bucket_ms, buckets } => {
                let epoch = now_ms.div_euclid(*bucket_ms);
                let oldest = epoch - (BUCKETS as i64 - 1);
                buckets
                    .iter()
                    .filter(|(e, _)| *e >= oldest && *e <= epoch)
                    .fold(Counts::default(), |a, (_, c)| Counts {
                        calls: a.calls + c.calls,
                        failures: a.failures + c.failures,
                        slow: a.slow + c.slow,
                    })
            }
        }
    }
}

// ===== impl CircuitBreaker =====

/// One process's view of a dependency's circuit breaker: its own failure window (the
/// closed-state judgement) and the state last seen. The fleet's shared state is a
/// [`FlowRow`](crate::FlowRow), moved by [`FlowConfig::apply`](crate::FlowConfig::apply).
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    state: BreakerState,
    mode: BreakerMode,
    open_until_ms: i64,
    openings: u32,
    permits_left: u32,
    probe_successes: u32,
    probe_failures: u32,
    round_started_ms: i64,
    window: WindowState,
    rng: SmallRng,
}

fn ms_of(t: Timestamp) -> i64 {
    t.timestamp_millis()
}

fn ts(ms: i64) -> Timestamp {
    DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl CircuitBreaker {
    /// A closed breaker; `seed` seeds the cool-down jitter.
    pub fn new(config: BreakerConfig, seed: u64) -> Self {
        let window = WindowState::new(config.window);
        Self {
            config,
            state: BreakerState::Closed,
            mode: BreakerMode::Normal,
            open_until_ms: 0,
            openings: 0,
            permits_left: 0,
            probe_successes: 0,
            probe_failures: 0,
            round_started_ms: 0,
            window,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The current state (an operator's override shows as open or closed).
    pub fn state(&self) -> BreakerState {
        match self.mode {
            BreakerMode::Normal => self.state,
            BreakerMode::ForcedOpen => BreakerState::Open,
            BreakerMode::ForcedClosed => BreakerState::Closed,
        }
    }

    /// The operator's override.
    pub fn mode(&self) -> BreakerMode {
        self.mode
    }

    /// When an open breaker lets probes through.
    pub fn open_until(&self) -> Option<Timestamp> {
        (self.state == BreakerState::Open).then(|| ts(self.open_until_ms))
    }

    /// Openings in a row without a close (drives the growing cool-down).
    pub fn openings(&self) -> u32 {
        self.openings
    }

    /// Calls and failures in the window now: `(calls, failures, slow)`.
    pub fn window_counts(&self, now: Timestamp) -> (u32, u32, u32) {
        let c = self.window.totals(ms_of(now));
        (c.calls, c.failures, c.slow)
    }

    /// May a call go through now? A half-open admission takes one probe permit.
    ///
    /// Returns the admission and the transition it caused (open → half-open when the cool-down
    /// has ended).
    pub fn admit(&mut self, now: Timestamp) -> (Admission, Option<Transition>) {
        match self.mode {
            BreakerMode::ForcedOpen => return (Admission::Rejected { until: None }, None),
            BreakerMode::ForcedClosed => return (Admission::Allowed, None),
            BreakerMode::Normal => {}
        }
        let now_ms = ms_of(now);
        match self.state {
            BreakerState::Closed => (Admission::Allowed, None),
            BreakerState::Open => {
                if now_ms < self.open_until_ms {
                    return (
                        Admission::Rejected {
                            until: Some(ts(self.open_until_ms)),
                        },
                        None,
                    );
                }
                let t = self.enter_half_open(now, TransitionReason::CooldownElapsed);
                self.permits_left -= 1;
                (Admission::Probe, Some(t))
            }
            BreakerState::HalfOpen => {
                let timeout_ms = self.config.half_open_timeout.as_millis() as i64;
                if now_ms - self.round_started_ms >= timeout_ms {
                    // The probes of the last round never answered: start a new round.
                    self.round_started_ms = now_ms;
                    self.permits_left = self.config.half_open_probes;
                    self.probe_successes = 0;
                    self.probe_failures = 0;
                }
                if self.permits_left > 0 {
                    self.permits_left -= 1;
                    (Admission::Probe, None)
                } else {
                    (
                        Admission::Rejected {
                            until: Some(ts(self.round_started_ms + timeout_ms)),
                        },
                        None,
                    )
                }
            }
        }
    }

    /// Records a call's outcome; returns the transition it caused, if any.
    pub fn record(
        &mut self,
        class: FailureClass,
        duration: Duration,
        now: Timestamp,
    ) -> Option<Transition> {
        self.record_result(self.config.result_of(class), duration, now)
    }

    /// Records a call's result as already mapped (see [`BreakerConfig::result_of`]).
    pub fn record_result(
        &mut self,
        result: CallResult,
        duration: Duration,
        now: Timestamp,
    ) -> Option<Transition> {
        if result == CallResult::Ignored || self.mode != BreakerMode::Normal {
            return None;
        }
        let failure = result == CallResult::Failure;
        match self.state {
            BreakerState::Closed => {
                let now_ms = ms_of(now);
                let slow = self
                    .config
                    .slow_call_duration
                    .is_some_and(|d| duration >= d);
                self.window.add(failure, slow, now_ms);
                let c = self.window.totals(now_ms);
                if c.calls < self.config.minimum_calls {
                    return None;
                }
                let rate = f64::from(c.failures) / f64::from(c.calls);
                if failure && rate >= self.config.failure_rate {
                    return Some(self.trip_open(
                        now,
                        TransitionReason::FailureRate {
                            rate,
                            calls: c.calls,
                        },
                    ));
                }
                let slow_rate = f64::from(c.slow) / f64::from(c.calls);
                if slow && slow_rate >= self.config.slow_call_rate {
                    return Some(self.trip_open(
                        now,
                        TransitionReason::SlowCallRate {
                            rate: slow_rate,
                            calls: c.calls,
                        },
                    ));
                }
                None
            }
            BreakerState::HalfOpen => {
                // The round is judged as a group (as the fleet's row is: crate::FlowConfig).
                if failure {
                    self.probe_failures += 1;
                } else {
                    self.probe_successes += 1;
                }
                let reopen = self.config.probes_to_reopen();
                if self.probe_failures >= reopen {
                    return Some(self.trip_open(now, TransitionReason::ProbeFailed));
                }
                if self.probe_successes > self.config.half_open_probes - reopen {
                    return Some(self.enter_closed(now, TransitionReason::ProbesSucceeded));
                }
                None
            }
            // A late answer to a call admitted before the breaker opened.
            BreakerState::Open => None,
        }
    }

    /// Sets or releases an operator's override.
    pub fn force(&mut self, mode: BreakerMode, now: Timestamp) -> Option<Transition> {
        let before = self.state();
        self.mode = mode;
        if mode == BreakerMode::Normal && before != self.state {
            // Released: start over closed, with an empty window.
            self.state = BreakerState::Closed;
            self.window.reset();
            self.openings = 0;
        }
        let after = self.state();
        (before != after).then_some(Transition {
            from: before,
            to: after,
            at: now,
            reason: TransitionReason::Forced,
            open_until: None,
        })
    }

    /// Adopts the fleet's shared state, as read from the store: another worker opened,
    /// half-opened or closed this dependency. Returns the local transition, if any.
    pub fn observe(
        &mut self,
        state: BreakerState,
        open_until: Option<Timestamp>,
        now: Timestamp,
    ) -> Option<Transition> {
        if self.mode != BreakerMode::Normal {
            return None;
        }
        let from = self.state;
        match state {
            BreakerState::Open => {
                let until = open_until.map_or(ms_of(now), ms_of);
                if from == BreakerState::Open && until <= self.open_until_ms {
                    return None;
                }
                if from != BreakerState::Open {
                    self.openings = self.openings.saturating_add(1);
                }
                self.state = BreakerState::Open;
                self.open_until_ms = until;
            }
            BreakerState::HalfOpen => {
                if from == BreakerState::HalfOpen {
                    return None;
                }
                self.state = BreakerState::HalfOpen;
                self.round_started_ms = ms_of(now);
                self.permits_left = self.config.half_open_probes;
                self.probe_successes = 0;
                self.probe_failures = 0;
            }
            BreakerState::Closed => {
                if from == BreakerState::Closed {
                    return None;
                }
                self.state = BreakerState::Closed;
                self.window.reset();
                self.openings = 0;
            }
        }
        (from != self.state).then_some(Transition {
            from,
            to: self.state,
            at: now,
            reason: TransitionReason::Remote,
            open_until: self.open_until(),
        })
    }

    fn trip_open(&mut self, now: Timestamp, reason: TransitionReason) -> Transition {
        let from = self.state;
        self.openings = self.openings.saturating_add(1);
        let nominal = self.config.cooldown(self.openings);
        let cooldown = if self.config.cooldown_jitter > 0.0 {
            Jitter::Proportional(self.config.cooldown_jitter).apply(
                nominal,
                nominal,
                self.config.cooldown_max,
                None,
                &mut self.rng,
            )
        } else {
            nominal
        };
        self.state = BreakerState::Open;
        self.open_until_ms = ms_of(now).saturating_add(cooldown.as_millis() as i64);
        self.permits_left = 0;
        self.probe_successes = 0;
        self.probe_failures = 0;
        Transition {
            from,
            to: BreakerState::Open,
            at: now,
            reason,
            open_until: Some(ts(self.open_until_ms)),
        }
    }

    fn enter_half_open(&mut self, now: Timestamp, reason: TransitionReason) -> Transition {
        let from = self.state;
        self.state = BreakerState::HalfOpen;
        self.round_started_ms = ms_of(now);
        self.permits_left = self.config.half_open_probes;
        self.probe_successes = 0;
        self.probe_failures = 0;
        Transition {
            from,
            to: BreakerState::HalfOpen,
            at: now,
            reason,
            open_until: None,
        }
    }

    fn enter_closed(&mut self, now: Timestamp, reason: TransitionReason) -> Transition {
        let from = self.state;
        self.state = BreakerState::Closed;
        self.window.reset();
        self.openings = 0;
        Transition {
            from,
            to: BreakerState::Closed,
            at: now,
            reason,
            open_until: None,
        }
    }
}

#[cfg(test)]
mod tests;
