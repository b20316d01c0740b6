//! The breaker's configuration, its window kind and its builder.

use std::time::Duration;

use crate::error::PolicyError;
use crate::{FailureClass, format_duration};

use super::transition::CallResult;

/// The first cool-down of an opened breaker by default: short, because a PSP's outages are
/// mostly short, and it grows while the outage lasts.
pub const DEFAULT_OPEN_COOLDOWN: Duration = Duration::from_secs(1);
/// Each further opening without a close multiplies the cool-down by this by default: slow
/// growth, so that the probe after a short outage comes soon after its end (the wait after the
/// end is at most one cool-down, ~2 s into a 5 s outage), while an outage of minutes still
/// reaches [`DEFAULT_COOLDOWN_MAX`] within about five minutes.
pub const DEFAULT_COOLDOWN_MULTIPLIER: f64 = 1.3;
/// The cool-down never exceeds this by default (jitter included): a long outage costs one
/// probe round a minute.
pub const DEFAULT_COOLDOWN_MAX: Duration = Duration::from_secs(60);

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

/// A breaker's configuration. Build it with [`BreakerConfig::builder`]; the fields are private
/// and checked by [`BreakerConfigBuilder::build`], so every value is in range. Read them with the
/// accessors of the same name.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// The sliding window.
    window: Window,
    /// Open when failures / calls ≥ this (0 < rate ≤ 1).
    failure_rate: f64,
    /// …and at least this many calls are in the window.
    minimum_calls: u32,
    /// A call slower than this is slow; `None`: slow calls are not tracked.
    slow_call_duration: Option<Duration>,
    /// Open when slow calls / calls ≥ this.
    slow_call_rate: f64,
    /// How long the breaker stays open the first time.
    open_cooldown: Duration,
    /// Each further opening without a close in between multiplies the cool-down by this.
    cooldown_multiplier: f64,
    /// The cool-down never exceeds this (jitter included).
    cooldown_max: Duration,
    /// The cool-down is spread by `proportional(f)` jitter with this `f` (0: none).
    cooldown_jitter: f64,
    /// Probes admitted per half-open round.
    half_open_probes: u32,
    /// A half-open round whose probes have not all answered after this starts a new round.
    half_open_timeout: Duration,
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

    /// The sliding window.
    pub const fn window(&self) -> Window {
        self.window
    }

    /// Open when failures / calls ≥ this (0 < rate ≤ 1).
    pub const fn failure_rate(&self) -> f64 {
        self.failure_rate
    }

    /// …and at least this many calls are in the window.
    pub const fn minimum_calls(&self) -> u32 {
        self.minimum_calls
    }

    /// A call slower than this is slow; `None`: slow calls are not tracked.
    pub const fn slow_call_duration(&self) -> Option<Duration> {
        self.slow_call_duration
    }

    /// Open when slow calls / calls ≥ this.
    pub const fn slow_call_rate(&self) -> f64 {
        self.slow_call_rate
    }

    /// How long the breaker stays open the first time.
    pub const fn open_cooldown(&self) -> Duration {
        self.open_cooldown
    }

    /// Each further opening without a close in between multiplies the cool-down by this.
    pub const fn cooldown_multiplier(&self) -> f64 {
        self.cooldown_multiplier
    }

    /// The cool-down never exceeds this (jitter included).
    pub const fn cooldown_max(&self) -> Duration {
        self.cooldown_max
    }

    /// The cool-down is spread by `proportional(f)` jitter with this `f` (0: none).
    pub const fn cooldown_jitter(&self) -> f64 {
        self.cooldown_jitter
    }

    /// Probes admitted per half-open round.
    pub const fn half_open_probes(&self) -> u32 {
        self.half_open_probes
    }

    /// A half-open round whose probes have not all answered after this starts a new round.
    pub const fn half_open_timeout(&self) -> Duration {
        self.half_open_timeout
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
/// - open cool-down: 1 s, ×1.3 per further opening while the outage lasts, at most 60 s, jitter
///   `proportional(0.1)` (a 5 s outage costs about 1–2 s of recovery; a long one a probe round
///   a minute)
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
                open_cooldown: DEFAULT_OPEN_COOLDOWN,
                cooldown_multiplier: DEFAULT_COOLDOWN_MULTIPLIER,
                cooldown_max: DEFAULT_COOLDOWN_MAX,
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
