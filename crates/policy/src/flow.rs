//! Flow control toward one dependency, shared by the whole fleet (R9, R10, R19, R21): the
//! circuit breaker's shared state, the pause after a `Retry-After`, and the rate limiter
//! (configured, or learned from 429s), as one pure state machine over the dependency's
//! shared row.
//!
//! ```text
//! (row, event, now, rng) ──apply──▶ (new row, grant, transition)
//! ```
//!
//! The store keeps one [`FlowRow`] per dependency; every worker process reads it, applies an
//! event with [`FlowConfig::apply`] and writes the result back with a compare-and-set (the
//! runtime's only job is that I/O). `redrive simulate` applies the same events to the same
//! row in simulated time, so what it shows is what the fleet does (R23).
//!
//! # The parts
//! - **Breaker.** Closed → open is decided by each process's own window
//!   ([`CircuitBreaker`](crate::CircuitBreaker)) and published with [`FlowEvent::Opened`].
//!   After the cool-down the row goes half-open with `half_open_probes` permits; the whole
//!   fleet sends at most that many probes ([`FlowEvent::TakeProbe`]). The round is judged as
//!   a group ([`FlowEvent::ProbeAnswered`]): it reopens as soon as the failed probes reach
//!   `failure_rate` of the round, and closes as soon as they no longer can. Each reopening
//!   without a close lengthens the cool-down; a close resets it.
//! - **Pause.** A `Retry-After` seen by one worker pauses the dependency for all until then
//!   ([`FlowEvent::RateLimited`]).
//! - **Rate limit** (GCRA over the row's theoretical arrival time `tat`). A process reserves a
//!   small batch of send slots at a time ([`FlowEvent::Reserve`], about `batch` worth of the
//!   rate), so the store is written about ten times a second per busy process, not once per
//!   call; over any window the fleet gets at most `rate × window + burst` slots. Jobs held by
//!   a pause or an open breaker take slots like any other call when they come back, so they
//!   resume spread at the rate, never in one instant.
//! - **Slow start.** Without a configured limit and before the first 429, a dependency is not
//!   sent to unthrottled: the rate starts at `slow_start` (20/s) and doubles every 250 ms of
//!   use (TCP's slow start), so first contact is no burst. Reaching the ceiling lifts the
//!   limit, and a lifted limit stays lifted (`rate_lifted`): slow start is for first contact
//!   only.
//! - **Learning the rate from the fleet's measurements (R24).** The row meters the slots the
//!   whole fleet reserves (`meter_started`, `meter_slots`, and the previous window's rate
//!   `meter_rate`, rolled every second inside [`FlowEvent::Reserve`]), so the fleet's send
//!   rate is known from the row alone. A 429 starts a *congestion epoch*: its reporter
//!   multiplies the fleet's send rate by its own delivered share (answers other than 429 over
//!   requests sent, [`ServedRate`]) to estimate what the fleet got through, and the rate is
//!   cut to `decrease ×` that, never to one process's share. Further 429s in the same epoch
//!   only extend the pause. After the epoch the rate climbs back along CUBIC's curve (as the
//!   AWS SDKs' adaptive retry mode): `W(t) = W_max + C·(t − K)³`, `K = ∛(W_max·(1 − β)/C)`,
//!   with `W_max` what got through when the 429 came (`rate_cap`), `β = decrease` and
//!   `C = increase`: fast back to `W_max`, slowly above it (at most [`PROBE_SLOPE`] × `W_max`
//!   more per second). `t` counts seconds *of use*: it is
//!   recovered from the current rate by inverting the curve, and one reservation adds at most
//!   one second, so idle time does not count.
//!
//! ```
//! use std::time::Duration;
//! use chrono::Utc;
//! use rand::{SeedableRng, rngs::SmallRng};
//! use redrive_policy::{FlowConfig, FlowEvent, FlowRow, Grant, RateConfig};
//!
//! let cfg = FlowConfig::default().with_rate(RateConfig::fixed(80.0).unwrap().with_burst(0)).unwrap();
//! let mut rng = SmallRng::seed_from_u64(1);
//! let now = Utc::now();
//! let step = cfg.apply(&FlowRow::default(), FlowEvent::Reserve { max_ahead: Duration::from_secs(1) }, now, &mut rng);
//! let Grant::Slots(slots) = step.grant else { panic!() };
//! assert_eq!(slots.count(), 8); // 100 ms of 80/s
//! assert_eq!(slots.at(1) - slots.at(0), chrono::Duration::microseconds(12_500));
//! ```

use std::time::Duration;

use chrono::DateTime;
use rand::Rng;

use crate::breaker::{
    BreakerConfig, BreakerMode, BreakerState, CallResult, Transition, TransitionReason,
};
use crate::error::PolicyError;
use crate::jitter::Jitter;
use crate::{DeferReason, PauseReason, RetryBudgetBuilder, Timestamp};

/// How much of the rate one reservation takes by default (100 ms worth).
pub const DEFAULT_RATE_BATCH: Duration = Duration::from_millis(100);
/// The learned rate after a 429 is this share of what got through (multiplicative decrease,
/// CUBIC's β).
pub const DEFAULT_RATE_DECREASE: f64 = 0.9;
/// CUBIC's scaling constant `C` of the climb after a cut (requests per second, per second³ of
/// use): `W(t) = W_max + C·(t − K)³`. 0.4 as TCP CUBIC and the AWS SDKs' adaptive mode.
pub const DEFAULT_RATE_INCREASE: f64 = 0.4;
/// Slow start's first rate on first contact (requests per second), when no limit is
/// configured and none was learned yet.
pub const DEFAULT_SLOW_START: f64 = 20.0;
/// Slow start doubles the rate every this much time of use.
pub const SLOW_START_DOUBLING: Duration = Duration::from_millis(250);
/// Above the rate that drew the last 429 (`W_max`), the climb adds at most this share of it
/// per second of use (CUBIC's convex probe, bounded), whatever the pause a 429 costs
/// ([`probe_slope`] is smaller when it is long).
pub const PROBE_SLOPE: f64 = 0.1;
/// The fleet's reservations are metered in windows of this length (the row's meter).
pub const METER_WINDOW: Duration = Duration::from_secs(1);
/// What a PSP's rate limiter lets through at once after a pause by default, as time at its
/// rate ([`RateConfig::with_psp_burst`]): a token bucket holding one second of the rate, or a
/// per-second window. After that long without requests the bucket is taken to be full; a
/// smaller one makes the learned limit low (found again by the probe), a larger one high by
/// at most the difference over the cycle.
pub const BUCKET_REFILL: Duration = Duration::from_secs(1);
/// Above `W_max`, the probe is paced so that it drains a one-second bucket at the limit in
/// about this long per second of pause a 429 costs ([`probe_slope`]): with `Retry-After: 1`,
/// ~8 s from the plateau to the next 429; with `Retry-After: 3`, ~24 s.
pub const PROBE_PERIOD: Duration = Duration::from_secs(8);
/// The learned rate never goes below this (requests per second).
pub const DEFAULT_RATE_FLOOR: f64 = 1.0;
/// A learned rate that grows to this lifts the limit (requests per second).
pub const DEFAULT_RATE_CEILING: f64 = 10_000.0;
/// Send slots that may go at once beyond the steady rate.
pub const DEFAULT_RATE_BURST: u32 = 1;
/// 429s within this time after a cut belong to the same congestion epoch (one cut).
pub const CONGESTION_EPOCH: Duration = Duration::from_secs(1);
/// Most slots one reservation hands out.
pub const MAX_SLOTS_PER_RESERVATION: u32 = 1000;

/// The rate limiter of one dependency. Build with [`RateConfig::fixed`],
/// [`RateConfig::adaptive`] or [`RateConfig::off`], then the `with_*` setters.
///
/// # Default
/// [`RateConfig::adaptive`]: slow start from 20/s (doubling every 250 ms of use) until the
/// first 429, then learned (decrease 0.9, CUBIC's climb with `C` = 0.4, floor 1/s, ceiling
/// 10,000/s), burst 1, batch 100 ms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateConfig {
    limit: Option<f64>,
    adaptive: bool,
    burst: u32,
    floor: f64,
    ceiling: f64,
    decrease: f64,
    increase: f64,
    batch: Duration,
    slow_start: Option<f64>,
    psp_burst: Duration,
}

impl Default for RateConfig {
    fn default() -> Self {
        Self::adaptive()
    }
}

impl RateConfig {
    /// Learn the rate from 429s; no limit until the first one.
    pub const fn adaptive() -> Self {
        Self {
            limit: None,
            adaptive: true,
            burst: DEFAULT_RATE_BURST,
            floor: DEFAULT_RATE_FLOOR,
            ceiling: DEFAULT_RATE_CEILING,
            decrease: DEFAULT_RATE_DECREASE,
            increase: DEFAULT_RATE_INCREASE,
            batch: DEFAULT_RATE_BATCH,
            slow_start: Some(DEFAULT_SLOW_START),
            psp_burst: BUCKET_REFILL,
        }
    }

    /// No rate limit at all, and none learned (429s still pause the dependency).
    pub const fn off() -> Self {
        let mut c = Self::adaptive();
        c.adaptive = false;
        c
    }

    /// A configured limit of `rps` requests per second for the whole fleet; 429s still cut it
    /// (and it grows back to `rps`, never beyond) unless [`RateConfig::with_adaptive`]`(false)`.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] for a rate outside 0.01..=1,000,000.
    pub fn fixed(rps: f64) -> Result<Self, PolicyError> {
        let c = Self {
            limit: Some(rps),
            ..Self::adaptive()
        };
        c.validate()?;
        Ok(c)
    }

    /// Learn from 429s (or not).
    pub const fn with_adaptive(mut self, on: bool) -> Self {
        self.adaptive = on;
        self
    }
    /// Slots that may go at once beyond the steady rate (0..=10,000).
    pub const fn with_burst(mut self, n: u32) -> Self {
        self.burst = n;
        self
    }
    /// The learned rate's floor and ceiling (requests per second).
    pub const fn with_bounds(mut self, floor: f64, ceiling: f64) -> Self {
        self.floor = floor;
        self.ceiling = ceiling;
        self
    }
    /// The multiplicative decrease after a 429 (0 < f < 1).
    pub const fn with_decrease(mut self, f: f64) -> Self {
        self.decrease = f;
        self
    }
    /// The climb after a cut: CUBIC's `C`, in requests per second per second³ of use.
    pub const fn with_increase(mut self, rps_per_s: f64) -> Self {
        self.increase = rps_per_s;
        self
    }
    /// Slow start's first rate on first contact (`None`: unthrottled until the first 429).
    /// Only without a configured limit.
    pub const fn with_slow_start(mut self, rps: Option<f64>) -> Self {
        self.slow_start = rps;
        self
    }
    /// How long the dependency's own rate limiter lets the fleet run above its rate after a
    /// pause, as time at that rate: its token bucket, or its counting window (0..=60 s;
    /// default [`BUCKET_REFILL`], one second). A 429 learns the limit over the send cycle
    /// with this much counted as time; 0: from the last second's meter alone.
    pub const fn with_psp_burst(mut self, d: Duration) -> Self {
        self.psp_burst = d;
        self
    }
    /// How much of the rate one reservation takes (10 ms..=1 s).
    pub const fn with_batch(mut self, d: Duration) -> Self {
        self.batch = d;
        self
    }

    /// The configured limit, if any.
    pub const fn limit(&self) -> Option<f64> {
        self.limit
    }
    /// Whether 429s teach the fleet a rate.
    pub const fn is_adaptive(&self) -> bool {
        self.adaptive
    }
    /// Slots beyond the steady rate.
    pub const fn burst(&self) -> u32 {
        self.burst
    }
    /// The learned rate's floor.
    pub const fn floor(&self) -> f64 {
        self.floor
    }
    /// The learned rate's ceiling.
    pub const fn ceiling(&self) -> f64 {
        self.ceiling
    }
    /// The multiplicative decrease.
    pub const fn decrease(&self) -> f64 {
        self.decrease
    }
    /// The climb's `C`.
    pub const fn increase(&self) -> f64 {
        self.increase
    }
    /// Slow start's first rate, if on.
    pub const fn slow_start(&self) -> Option<f64> {
        self.slow_start
    }
    /// The reservation batch.
    pub const fn batch(&self) -> Duration {
        self.batch
    }
    /// The dependency's burst, as time at its rate ([`RateConfig::with_psp_burst`]).
    pub const fn psp_burst(&self) -> Duration {
        self.psp_burst
    }

    /// Checks every field against its range.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming the field, the value and the range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let rate_ok = |r: f64| r.is_finite() && (0.01..=1_000_000.0).contains(&r);
        if let Some(l) = self.limit
            && !rate_ok(l)
        {
            return Err(PolicyError::invalid(
                "rate_limit",
                format!("{l}/s"),
                "from 0.01/s to 1000000/s",
            ));
        }
        if !rate_ok(self.floor) {
            return Err(PolicyError::invalid(
                "rate_floor",
                format!("{}/s", self.floor),
                "from 0.01/s to 1000000/s",
            ));
        }
        if !rate_ok(self.ceiling) || self.ceiling < self.floor {
            return Err(PolicyError::invalid(
                "rate_ceiling",
                format!("{}/s", self.ceiling),
                format!(
                    "at least rate_floor ({}/s) and at most 1000000/s",
                    self.floor
                ),
            ));
        }
        if let Some(s) = self.slow_start
            && !rate_ok(s)
        {
            return Err(PolicyError::invalid(
                "rate_slow_start",
                format!("{s}/s"),
                "from 0.01/s to 1000000/s",
            ));
        }
        if !(self.decrease > 0.0 && self.decrease < 1.0) {
            return Err(PolicyError::invalid(
                "rate_decrease",
                self.decrease.to_string(),
                "above 0 and below 1",
            ));
        }
        if !(self.increase.is_finite() && (0.0..=1_000_000.0).contains(&self.increase)) {
            return Err(PolicyError::invalid(
                "rate_increase",
                format!("{}/s", self.increase),
                "from 0/s to 1000000/s per second",
            ));
        }
        if self.burst > 10_000 {
            return Err(PolicyError::invalid(
                "rate_burst",
                self.burst.to_string(),
                "from 0 to 10000",
            ));
        }
        if self.psp_burst > Duration::from_secs(60) {
            return Err(PolicyError::invalid(
                "rate_psp_burst",
                crate::format_duration(self.psp_burst),
                "from 0s to 60s",
            ));
        }
        if self.batch < Duration::from_millis(10) || self.batch > Duration::from_secs(1) {
            return Err(PolicyError::invalid(
                "rate_batch",
                crate::format_duration(self.batch),
                "from 10ms to 1s",
            ));
        }
        Ok(())
    }
}

/// The most calls in flight per worker process that [`FlowConfig::with_max_inflight`] accepts.
pub const MAX_INFLIGHT: u32 = 100_000;

/// Everything the fleet does toward one dependency.
///
/// The fields are private and every setter that can receive an invalid value checks it
/// (`with_rate`, `with_max_inflight`, `with_retry_budget` return a `Result`), so a
/// `FlowConfig` is always valid.
///
/// # Default
/// [`BreakerConfig::default`], [`RateConfig::adaptive`], no concurrency cap, no retry budget.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlowConfig {
    /// The breaker.
    breaker: BreakerConfig,
    /// The rate limiter.
    rate: RateConfig,
    /// At most this many calls in flight to the dependency per worker process (bulkhead).
    max_inflight: Option<u32>,
    /// Retries beyond this budget's share of first attempts are deferred (per process, as
    /// gRPC's retry throttling is per channel). Always builds.
    retry_budget: Option<RetryBudgetBuilder>,
}

impl FlowConfig {
    /// This configuration with another breaker (valid by construction).
    pub fn with_breaker(mut self, b: BreakerConfig) -> Self {
        self.breaker = b;
        self
    }

    /// This configuration with another rate limiter.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] from [`RateConfig::validate`], naming the field.
    pub fn with_rate(mut self, r: RateConfig) -> Result<Self, PolicyError> {
        r.validate()?;
        self.rate = r;
        Ok(self)
    }

    /// At most `n` calls in flight to the dependency per worker process.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `max_inflight` when `n` is not from 1 to
    /// [`MAX_INFLIGHT`].
    pub fn with_max_inflight(mut self, n: u32) -> Result<Self, PolicyError> {
        if n == 0 || n > MAX_INFLIGHT {
            return Err(PolicyError::invalid(
                "max_inflight",
                n.to_string(),
                format!("from 1 to {MAX_INFLIGHT}"),
            ));
        }
        self.max_inflight = Some(n);
        Ok(self)
    }

    /// No cap on calls in flight.
    pub fn without_max_inflight(mut self) -> Self {
        self.max_inflight = None;
        self
    }

    /// A retry budget per worker process.
    ///
    /// # Errors
    /// The error of [`RetryBudgetBuilder::build`] when the budget does not build.
    pub fn with_retry_budget(mut self, b: RetryBudgetBuilder) -> Result<Self, PolicyError> {
        b.build()?;
        self.retry_budget = Some(b);
        Ok(self)
    }

    /// No retry budget.
    pub fn without_retry_budget(mut self) -> Self {
        self.retry_budget = None;
        self
    }

    /// The breaker.
    pub const fn breaker(&self) -> &BreakerConfig {
        &self.breaker
    }

    /// The rate limiter.
    pub const fn rate(&self) -> RateConfig {
        self.rate
    }

    /// At most this many calls in flight per worker process; `None`: no cap.
    pub const fn max_inflight(&self) -> Option<u32> {
        self.max_inflight
    }

    /// The retry budget per worker process (it builds); `None`: none.
    pub const fn retry_budget(&self) -> Option<RetryBudgetBuilder> {
        self.retry_budget
    }
}

/// The dependency's state shared by the fleet (one row in the store).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct FlowRow {
    /// An operator's override of the breaker.
    pub mode: BreakerMode,
    /// The breaker's state.
    pub state: BreakerState,
    /// While open: when probes may start.
    pub open_until: Option<Timestamp>,
    /// Openings in a row without a close (the cool-down grows with them).
    pub openings: u32,
    /// Half-open: probe permits left in this round.
    pub probe_permits: u32,
    /// Half-open: probes of this round that succeeded.
    pub probe_successes: u32,
    /// Half-open: probes of this round that failed.
    pub probe_failures: u32,
    /// Half-open: when this round started.
    pub round_started: Option<Timestamp>,
    /// Paused until then (fleet-wide).
    pub paused_until: Option<Timestamp>,
    /// Why it is paused.
    pub pause_reason: Option<PauseReason>,
    /// The learned rate limit in force (requests per second); `None`: none learned (a
    /// configured one applies, if any).
    #[serde(rename = "rate_limit")]
    pub rate: Option<f64>,
    /// The limiter's theoretical arrival time (GCRA), microsecond precision.
    pub tat: Option<Timestamp>,
    /// When the current congestion epoch started (the last cut).
    pub rate_cut_at: Option<Timestamp>,
    /// What the fleet got through when the last 429 came (CUBIC's `W_max`: the climb after
    /// the cut returns to it quickly and probes above it slowly); `None` before any 429.
    pub rate_cap: Option<f64>,
    /// When the rate was last raised.
    pub rate_raised_at: Option<Timestamp>,
    /// The learned limit grew to the ceiling and was lifted: no slow start again.
    pub rate_lifted: bool,
    /// The start of the meter's window: the slots the whole fleet reserved since then.
    pub meter_started: Option<Timestamp>,
    /// Slots the whole fleet reserved in the meter's window.
    pub meter_slots: u32,
    /// The fleet's reservations per second over the previous meter window (`None`: none, or
    /// it ended with a gap of more than two windows).
    pub meter_rate: Option<f64>,
    /// The start of the send cycle: the last cut (the PSP's bucket was empty then), or one
    /// [`BUCKET_REFILL`] before the first reservation after a second without any (the bucket
    /// was full then). The slots since, over the time since, are what a 429 at the cycle's end
    /// says the PSP lets through ([`FlowConfig::cycle_rate`]).
    pub cycle_started: Option<Timestamp>,
    /// Slots the whole fleet reserved since [`FlowRow::cycle_started`].
    pub cycle_slots: u32,
    /// How long the last 429 paused the fleet (its `Retry-After`; `None`: none asked). A 429
    /// costs the fleet that long, so the probe above the learned limit is slower the longer
    /// it is ([`probe_slope`]).
    #[serde(rename = "rate_pause_ms", serialize_with = "ser_opt_ms")]
    pub rate_pause: Option<Duration>,
}

fn ser_opt_ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&(d.as_millis() as u64)),
        None => s.serialize_none(),
    }
}

/// The `until` of an operator's pause that lasts until it is lifted ([`FlowEvent::Resume`]):
/// the last millisecond of the year 9999 (the store keeps milliseconds).
pub fn until_resumed() -> Timestamp {
    DateTime::from_timestamp_millis(253_402_300_799_999).unwrap_or(DateTime::<chrono::Utc>::MAX_UTC)
}

impl FlowRow {
    /// Whether an operator paused the dependency until the pause is lifted (no end time).
    pub fn paused_until_resumed(&self) -> bool {
        self.pause_reason == Some(PauseReason::Operator)
            && self.paused_until.is_some_and(|p| p >= until_resumed())
    }

    /// The breaker's state as the fleet sees it: an operator's forced state, else the
    /// machine's.
    pub fn effective_state(&self) -> BreakerState {
        match self.mode {
            BreakerMode::Normal => self.state,
            BreakerMode::ForcedOpen => BreakerState::Open,
            BreakerMode::ForcedClosed => BreakerState::Closed,
        }
    }

    /// The state as screens show it: the [`effective_state`](Self::effective_state), marked
    /// `(forced)` when an operator forced it, so a forced-open breaker never reads `closed`.
    ///
    /// ```
    /// use redrive_policy::{BreakerMode, FlowRow};
    /// let mut f = FlowRow::default();
    /// assert_eq!(f.state_label(), "closed");
    /// f.mode = BreakerMode::ForcedOpen;
    /// assert_eq!(f.state_label(), "open (forced)");
    /// ```
    pub fn state_label(&self) -> &'static str {
        match self.mode {
            BreakerMode::Normal => self.state.as_str(),
            BreakerMode::ForcedOpen => "open (forced)",
            BreakerMode::ForcedClosed => "closed (forced)",
        }
    }
}

/// An event applied to the shared row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FlowEvent {
    /// Reserve send slots; none is granted beyond `now + max_ahead`.
    Reserve {
        /// The longest wait the caller accepts for its first slot.
        max_ahead: Duration,
    },
    /// Take one half-open probe permit (moves an open breaker whose cool-down ended to
    /// half-open first).
    TakeProbe,
    /// A probe's answer.
    ProbeAnswered {
        /// How the probe's outcome counts.
        result: CallResult,
    },
    /// A process's own window crossed the threshold while it saw the breaker closed.
    Opened {
        /// The window's verdict.
        reason: TransitionReason,
    },
    /// A 429 (or another rate-limit answer) came back.
    RateLimited {
        /// The server's `Retry-After`, as an instant: pause the fleet until then.
        pause_until: Option<Timestamp>,
        /// What the reporting process got through lately (answers other than 429), per
        /// second ([`ServedRate::per_second`]); `None` when this process has already reported
        /// to the current congestion epoch (its share is counted once: the report then only
        /// extends the pause). Used for the cut only when the row has no meter (the limit was
        /// lifted).
        served_per_s: Option<f64>,
        /// The reporter's delivered share: its requests answered other than 429 over its
        /// requests sent, lately ([`ServedRate::delivered_share`]). The cut is `decrease ×`
        /// the fleet's metered send rate × this. `None`: unknown (taken as 1).
        delivered: Option<f64>,
        /// The call was a half-open probe: its permit goes back to the round (a 429 says
        /// nothing about the dependency's health).
        probe: bool,
    },
    /// Housekeeping: an open breaker whose cool-down ended goes half-open; a half-open round
    /// that timed out starts again.
    Tick,
    /// An operator forces the breaker open or closed, or hands it back to the machine.
    Force(BreakerMode),
    /// An operator pauses the dependency until `until` ([`until_resumed`]: until lifted).
    Pause {
        /// Until when.
        until: Timestamp,
    },
    /// An operator lifts the pause.
    Resume,
}

/// Send slots handed to one process: `count` instants, `interval` apart, none before `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    base_us: i64,
    interval_us: i64,
    count: u32,
    now_us: i64,
}

impl Slots {
    /// How many slots.
    pub const fn count(&self) -> u32 {
        self.count
    }
    /// The time between two slots.
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.interval_us.max(0) as u64)
    }
    /// Slot `i` (0-based): the instant from which that call may go.
    pub fn at(&self, i: u32) -> Timestamp {
        let t = self
            .base_us
            .saturating_add(self.interval_us.saturating_mul(i64::from(i)));
        ts_us(t.max(self.now_us))
    }
}

/// What the event gave the caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Grant {
    /// Nothing to hand out (a report, or housekeeping).
    None,
    /// Call now: no rate limit is in force.
    Go,
    /// Call at these instants.
    Slots(Slots),
    /// Call now, as one of the half-open probes.
    Probe,
    /// Don't call before `until`.
    Blocked {
        /// The earliest time worth trying again.
        until: Timestamp,
        /// Why.
        reason: DeferReason,
    },
}

/// The result of applying an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The row after the event.
    pub row: FlowRow,
    /// Whether the row changed (and must be written).
    pub changed: bool,
    /// What the caller got.
    pub grant: Grant,
    /// The breaker's change of state, if any (for the metric, the event and the log line).
    pub transition: Option<Transition>,
}

/// What a look at the row (no write) says about a call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Call: closed and no rate limit in force.
    Go,
    /// Closed with a rate limit: take a slot ([`FlowEvent::Reserve`]).
    Limited,
    /// Half-open, or open with the cool-down over: take a probe ([`FlowEvent::TakeProbe`]).
    Probe,
    /// Don't call before `until`.
    Blocked {
        /// The earliest time worth trying again.
        until: Timestamp,
        /// Why.
        reason: DeferReason,
    },
}

/// What got through to a dependency lately, per second: the measure a process reports with
/// a 429 ([`FlowEvent::RateLimited::served_per_s`]).
///
/// Counts answers other than 429 over the last [`ServedRate::WINDOW`] (in ten buckets of
/// 500 ms), divided by the time in that window during which the process was sending (buckets
/// with at least one request), never less than one second: time spent paused, behind an open
/// breaker or idle says nothing about what the dependency allows, and a burst that a PSP's
/// bucket let through in a few milliseconds is not a rate.
///
/// It also counts the requests sent ([`ServedRate::sent`]), for the delivered share a 429's
/// report carries ([`ServedRate::delivered_share`]).
///
/// ```
/// use chrono::{Duration, Utc};
/// use redrive_policy::ServedRate;
/// let t = Utc::now();
/// let mut m = ServedRate::default();
/// for i in 0..80 { m.sent(t + Duration::milliseconds(i)); m.record(t + Duration::milliseconds(i)); }
/// for i in 80..100 { m.sent(t + Duration::milliseconds(i)); } // answered 429
/// assert_eq!(m.per_second(t + Duration::milliseconds(100)), 80.0);
/// assert_eq!(m.delivered_share(t + Duration::milliseconds(100)), Some(0.8));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ServedRate {
    /// (bucket number, answers other than 429, requests sent, active).
    buckets: [(i64, u32, u32, bool); 10],
}

impl ServedRate {
    /// The window over which the rate is measured.
    pub const WINDOW: Duration = Duration::from_secs(5);
    const BUCKET_MS: i64 = 500;

    fn bucket(&mut self, now: Timestamp) -> &mut (i64, u32, u32, bool) {
        let epoch = now.timestamp_millis().div_euclid(Self::BUCKET_MS);
        let slot = &mut self.buckets[epoch.rem_euclid(10) as usize];
        if slot.0 != epoch {
            *slot = (epoch, 0, 0, false);
        }
        slot
    }

    fn live(&self, now: Timestamp) -> impl Iterator<Item = &(i64, u32, u32, bool)> {
        let epoch = now.timestamp_millis().div_euclid(Self::BUCKET_MS);
        self.buckets
            .iter()
            .filter(move |(e, _, _, active)| *active && *e > epoch - 10 && *e <= epoch)
    }

    /// Notes that a request was sent and answered (whatever its answer).
    pub fn sent(&mut self, now: Timestamp) {
        let b = self.bucket(now);
        b.2 = b.2.saturating_add(1);
        b.3 = true;
    }

    /// Counts one answer that got through (anything but a 429).
    pub fn record(&mut self, now: Timestamp) {
        let b = self.bucket(now);
        b.1 = b.1.saturating_add(1);
        b.3 = true;
    }

    /// Answers per second of sending, over the window.
    pub fn per_second(&self, now: Timestamp) -> f64 {
        let (n, active) = self
            .live(now)
            .fold((0u32, 0i64), |(n, a), (_, c, _, _)| (n + c, a + 1));
        let span_ms = (active * Self::BUCKET_MS).max(1000);
        f64::from(n) * 1000.0 / span_ms as f64
    }

    /// The share of the requests sent over the window that got through (answers other than
    /// 429 over requests sent), at most 1; `None` when none was sent.
    pub fn delivered_share(&self, now: Timestamp) -> Option<f64> {
        let (ok, sent) = self.live(now).fold((0u64, 0u64), |(o, s), (_, c, n, _)| {
            (o + u64::from(*c), s + u64::from(*n))
        });
        (sent > 0).then(|| (ok as f64 / sent as f64).min(1.0))
    }
}

/// CUBIC's climb: the rate `dt` seconds of use after `rate`, on the curve
/// `W(t) = w_max + c·(t − K)³` with `K = ∛(w_max·(1 − beta)/c)`. The point's `t` is recovered
/// by inverting the curve at `rate`, so the climb depends only on the row.
pub fn cubic(rate: f64, w_max: f64, beta: f64, c: f64, dt: f64) -> f64 {
    if !(c > 0.0 && dt > 0.0 && w_max.is_finite() && rate.is_finite()) {
        return rate;
    }
    let k = (w_max * (1.0 - beta) / c).cbrt();
    let t = k + ((rate - w_max) / c).cbrt();
    let next = w_max + c * (t + dt - k).powi(3);
    next.max(rate)
}

/// The probe's slope above `W_max` (a share of it per second of use) when a 429 pauses the
/// fleet for `pause`: the slope at which the rate, rising from `W_max` at the limit, drains a
/// [`BUCKET_REFILL`] bucket in [`PROBE_PERIOD`] per second of pause (`τ = √(2/s)`), at most
/// [`PROBE_SLOPE`]. A 429 that costs 3 s of the whole fleet's time is worth three times
/// rarer probes, and a limit that is learned low is found again more slowly.
///
/// ```
/// use std::time::Duration;
/// use redrive_policy::probe_slope;
/// assert!((probe_slope(Some(Duration::from_secs(1))) - 2.0 / 64.0).abs() < 1e-9);
/// assert!(probe_slope(Some(Duration::from_secs(3))) < probe_slope(None));
/// ```
pub fn probe_slope(pause: Option<Duration>) -> f64 {
    let cost = pause.map_or(1.0, |p| p.as_secs_f64().max(1.0));
    let tau = PROBE_PERIOD.as_secs_f64() * cost;
    let bucket = BUCKET_REFILL.as_secs_f64();
    (2.0 * bucket / (tau * tau)).min(PROBE_SLOPE)
}

/// The limit `L` a slow start's first 429 reveals: the fleet ramped from `s0`/s, doubling
/// every [`SLOW_START_DOUBLING`], and had sent `sent` slots when the PSP's bucket ran dry,
/// `span` seconds after the cycle's start (one [`BUCKET_REFILL`] before the ramp began). While
/// the ramp was below `L` the bucket stayed full and the PSP's refill went unused, so what got
/// through is the bucket, plus `L` per second after the ramp crossed `L` at `t₁ = d·log₂(L/s0)`,
/// plus the ramp's own sends before that (`d·(L − s0)/ln 2`):
/// `sent = L·(span − t₁ + d/ln 2) − d·s0/ln 2`, solved for `L` (increasing in `L` while the ramp
/// crossed it before the 429). Counting the whole ramp as time at the limit would learn it low.
fn slow_start_limit(sent: f64, span: f64, s0: f64) -> f64 {
    let d = SLOW_START_DOUBLING.as_secs_f64();
    let k = d / std::f64::consts::LN_2;
    let s0 = s0.max(f64::MIN_POSITIVE);
    let got = |l: f64| {
        let t1 = (d * (l / s0).log2()).max(0.0);
        l * (span - t1 + k) - k * s0
    };
    // Bisection between the plain cycle rate (every second of the span at L: a lower bound)
    // and the rate that crossed at the 429 itself.
    let (mut lo, mut hi) = (sent / span, sent / span);
    while got(hi) < sent && hi < 1e9 {
        hi *= 2.0;
    }
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if got(mid) < sent {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let l = 0.5 * (lo + hi);
    // Past the point where the ramp crosses L at the 429 the relation turns: keep the bound.
    if d * (l / s0).log2() >= span {
        sent / span
    } else {
        l
    }
}

/// Counts `n` slots reserved at `now` in the row's meter; `from` is where they start on the
/// limiter's timeline (the `tat` before the reservation, or now when the fleet was idle), so
/// a window's slots run from its start to the current `tat`. The window rolls every
/// [`METER_WINDOW`]; one that ended after a gap of more than two windows leaves no rate (it
/// would mix idle time into the fleet's rate).
fn meter(row: &mut FlowRow, n: u32, from: Timestamp, now: Timestamp) {
    let window_us = METER_WINDOW.as_micros() as i64;
    match row.meter_started {
        Some(s) if us(now) - us(s) < window_us => {
            row.meter_slots = row.meter_slots.saturating_add(n);
        }
        Some(s) => {
            // The window's slots ran from its start to where this reservation's slots begin
            // (at least a window: the roll comes a window after the start, or later).
            let el = (us(from) - us(s)) as f64 / 1e6;
            let gap = (us(now) - us(s)) as f64 / 1e6;
            let window = METER_WINDOW.as_secs_f64();
            row.meter_rate =
                (gap <= 2.0 * window).then(|| f64::from(row.meter_slots) / el.max(window));
            row.meter_started = Some(ms_floor(from));
            row.meter_slots = n;
        }
        None => {
            row.meter_started = Some(ms_floor(from));
            row.meter_slots = n;
            row.meter_rate = None;
        }
    }
}

/// Counts `n` slots reserved at `now` in the row's send cycle (before the reservation moves
/// `tat`). A cycle starts anew when the fleet reserved nothing for `refill` (the PSP's burst,
/// [`RateConfig::psp_burst`]: its bucket is full again, so the cycle is taken to start that
/// long before now, as if the bucket's content had been sent at the rate then), or when none
/// was started.
fn cycle(row: &mut FlowRow, n: u32, refill: Duration, now: Timestamp) {
    let refill_us = refill.as_micros() as i64;
    let full = row.tat.is_none_or(|t| us(now) - us(t) >= refill_us);
    if full || row.cycle_started.is_none() {
        row.cycle_started = Some(ms_floor(ts_us(us(now) - refill_us)));
        row.cycle_slots = n;
    } else {
        row.cycle_slots = row.cycle_slots.saturating_add(n);
    }
}

/// Whole milliseconds, as the store keeps its times.
fn ms_floor(t: Timestamp) -> Timestamp {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

fn us(t: Timestamp) -> i64 {
    t.timestamp_micros()
}

fn ts_us(u: i64) -> Timestamp {
    DateTime::from_timestamp_micros(u).unwrap_or(DateTime::<chrono::Utc>::MAX_UTC)
}

pub(crate) fn add(t: Timestamp, d: Duration) -> Timestamp {
    ts_us(us(t).saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)))
}

impl FlowConfig {
    /// The rate in force for `row`: the learned or configured one, `None` when unlimited.
    pub fn rate_in_force(&self, row: &FlowRow) -> Option<f64> {
        row.rate.or(self.rate.limit)
    }

    /// How long other workers wait for a half-open round's verdict before looking again.
    fn round_wait(&self) -> Duration {
        self.breaker.half_open_timeout().min(Duration::from_secs(1))
    }

    /// What the row says about a call now, without changing it.
    pub fn check(&self, row: &FlowRow, now: Timestamp) -> Check {
        if row.mode == BreakerMode::ForcedOpen {
            return Check::Blocked {
                until: add(now, self.breaker.open_cooldown()),
                reason: DeferReason::BreakerOpen,
            };
        }
        if let Some(p) = row.paused_until.filter(|p| *p > now) {
            return Check::Blocked {
                until: p,
                reason: DeferReason::Paused,
            };
        }
        let state = if row.mode == BreakerMode::ForcedClosed {
            BreakerState::Closed
        } else {
            row.state
        };
        match state {
            BreakerState::Open => match row.open_until.filter(|u| *u > now) {
                Some(until) => Check::Blocked {
                    until,
                    reason: DeferReason::BreakerOpen,
                },
                None => Check::Probe,
            },
            BreakerState::HalfOpen if row.probe_permits > 0 => Check::Probe,
            BreakerState::HalfOpen => Check::Blocked {
                until: add(now, self.round_wait()),
                reason: DeferReason::BreakerOpen,
            },
            BreakerState::Closed if self.rate_in_force(row).is_some() || self.slow_starts(row) => {
                Check::Limited
            }
            BreakerState::Closed => Check::Go,
        }
    }

    /// Applies one event to the shared row.
    pub fn apply<R: Rng + ?Sized>(
        &self,
        row: &FlowRow,
        event: FlowEvent,
        now: Timestamp,
        rng: &mut R,
    ) -> Step {
        let mut next = row.clone();
        let mut grant = Grant::None;
        let mut transition = None;
        match event {
            FlowEvent::Reserve { max_ahead } => grant = self.reserve(&mut next, max_ahead, now),
            FlowEvent::TakeProbe => {
                (grant, transition) = self.take_probe(&mut next, now);
            }
            FlowEvent::ProbeAnswered { result } => {
                transition = self.probe_answered(&mut next, result, now, rng);
            }
            FlowEvent::Opened { reason } => {
                if next.mode == BreakerMode::Normal && next.state == BreakerState::Closed {
                    transition = Some(self.trip(&mut next, reason, now, rng));
                }
            }
            FlowEvent::RateLimited {
                pause_until,
                served_per_s,
                delivered,
                probe,
            } => {
                if probe {
                    transition = self.probe_answered(&mut next, CallResult::Ignored, now, rng);
                }
                self.rate_limited(&mut next, pause_until, served_per_s, delivered, now);
            }
            FlowEvent::Tick => transition = self.tick(&mut next, now),
            FlowEvent::Force(mode) => transition = self.force(&mut next, mode, now),
            FlowEvent::Pause { until } => {
                // An operator's pause never cuts short a longer `Retry-After` the dependency
                // asked for; it may shorten or lengthen an operator's earlier pause.
                let keep = row
                    .paused_until
                    .filter(|p| row.pause_reason == Some(PauseReason::RetryAfter) && *p > until);
                next.paused_until = Some(keep.unwrap_or(until));
                next.pause_reason = Some(PauseReason::Operator);
            }
            FlowEvent::Resume => {
                next.paused_until = None;
                next.pause_reason = None;
            }
        }
        Step {
            changed: next != *row,
            row: next,
            grant,
            transition,
        }
    }

    fn reserve(&self, row: &mut FlowRow, max_ahead: Duration, now: Timestamp) -> Grant {
        match self.check(row, now) {
            Check::Blocked { until, reason } => return Grant::Blocked { until, reason },
            Check::Probe => {
                // Probes go through TakeProbe; a reservation here is a caller's race.
                return Grant::Blocked {
                    until: now,
                    reason: DeferReason::BreakerOpen,
                };
            }
            Check::Go | Check::Limited => {}
        }
        let cfg = &self.rate;
        let max_rate = cfg.limit.map_or(cfg.ceiling, |l| l.min(cfg.ceiling));
        if self.slow_starts(row) {
            // First contact: a modest rate that grows fast until the first 429.
            row.rate = cfg.slow_start.map(|s| s.min(max_rate));
            row.rate_raised_at = Some(now);
        }
        let Some(mut rate) = self.rate_in_force(row) else {
            return Grant::Go;
        };
        // Grow, while the dependency is used and outside a congestion epoch.
        if cfg.adaptive && row.rate.is_some() {
            let calm = row
                .rate_cut_at
                .is_none_or(|c| now >= add(c, CONGESTION_EPOCH));
            if calm {
                // The climb counts from the epoch's end (the epoch is no time of use).
                let since = row.rate_raised_at.map(|t| match row.rate_cut_at {
                    Some(c) => us(t).max(us(add(c, CONGESTION_EPOCH))),
                    None => us(t),
                });
                let dt = since.map_or(0.0, |t| (us(now) - t).max(0) as f64 / 1e6);
                rate = self.grown(row, rate, dt).min(max_rate);
                row.rate_raised_at = Some(now);
                if cfg.limit.is_none() && rate >= cfg.ceiling {
                    // Grown to the ceiling: the learned limit is lifted, for good.
                    row.rate = None;
                    row.tat = None;
                    row.rate_cap = None;
                    row.rate_lifted = true;
                    row.meter_started = None;
                    row.meter_slots = 0;
                    row.meter_rate = None;
                    row.cycle_started = None;
                    row.cycle_slots = 0;
                    return Grant::Go;
                }
            }
        }
        row.rate = Some(rate);
        // Rounded up, so that the slots never run faster than the rate.
        let interval_us = ((1e6 / rate).ceil() as i64).max(1);
        let tol_us = interval_us.saturating_mul(i64::from(cfg.burst));
        let now_us = us(now);
        let a0 = row.tat.map_or(now_us, us).max(now_us);
        let first = (a0 - tol_us).max(now_us);
        let mut ahead_us = i64::try_from(max_ahead.as_micros()).unwrap_or(i64::MAX);
        let slow_start = self.in_slow_start(row);
        if slow_start {
            // Slow start doubles with the slots handed out: reserved far ahead, they would
            // double it faster than time passes (and hide from the cycle what was sent).
            ahead_us = ahead_us.min(cfg.batch.as_micros() as i64);
        }
        if first - now_us > ahead_us {
            return Grant::Blocked {
                until: ts_us(first),
                reason: DeferReason::Throttled,
            };
        }
        let want = (rate * cfg.batch.as_secs_f64()).ceil().max(1.0) as i64;
        // Slot i is at a0 - tol + i·interval: keep the last within max_ahead.
        let fit = (now_us.saturating_add(ahead_us) - (a0 - tol_us)) / interval_us + 1;
        let n = want.min(fit).clamp(1, i64::from(MAX_SLOTS_PER_RESERVATION));
        cycle(row, n as u32, cfg.psp_burst, now);
        row.tat = Some(ts_us(a0 + n * interval_us));
        meter(row, n as u32, ts_us(a0), now);
        if slow_start {
            // Slow start: the rate doubles every SLOW_START_DOUBLING worth of the slots handed
            // out (as TCP's window per round trip of acknowledgements), so slots reserved
            // ahead at the old rate are used before it grows again: no burst when they are.
            let d = SLOW_START_DOUBLING.as_secs_f64();
            row.rate = Some((rate * 2f64.powf(n as f64 / (rate * d))).min(max_rate));
        }
        Grant::Slots(Slots {
            base_us: a0 - tol_us,
            interval_us,
            count: n as u32,
            now_us,
        })
    }

    fn half_open(&self, row: &mut FlowRow, now: Timestamp) {
        row.state = BreakerState::HalfOpen;
        row.open_until = None;
        row.probe_permits = self.breaker.half_open_probes();
        row.probe_successes = 0;
        row.probe_failures = 0;
        row.round_started = Some(now);
    }

    fn take_probe(&self, row: &mut FlowRow, now: Timestamp) -> (Grant, Option<Transition>) {
        let mut transition = None;
        if row.mode == BreakerMode::Normal
            && row.state == BreakerState::Open
            && row.open_until.is_none_or(|u| u <= now)
            && row.paused_until.is_none_or(|p| p <= now)
        {
            self.half_open(row, now);
            transition = Some(Transition {
                from: BreakerState::Open,
                to: BreakerState::HalfOpen,
                at: now,
                reason: TransitionReason::CooldownElapsed,
                open_until: None,
            });
        }
        let grant = match self.check(row, now) {
            Check::Probe if row.state == BreakerState::HalfOpen => {
                row.probe_permits -= 1;
                Grant::Probe
            }
            Check::Blocked { until, reason } => Grant::Blocked { until, reason },
            Check::Go => Grant::Go,
            // Closed with a limit (or forced closed): the caller reserves a slot instead.
            Check::Limited | Check::Probe => Grant::Blocked {
                until: now,
                reason: DeferReason::Throttled,
            },
        };
        (grant, transition)
    }

    fn probe_answered<R: Rng + ?Sized>(
        &self,
        row: &mut FlowRow,
        result: CallResult,
        now: Timestamp,
        rng: &mut R,
    ) -> Option<Transition> {
        if row.mode != BreakerMode::Normal || row.state != BreakerState::HalfOpen {
            return None; // the round was already judged (or an operator took over)
        }
        match result {
            CallResult::Success => row.probe_successes += 1,
            CallResult::Failure => row.probe_failures += 1,
            // Neither way (a 429 answered the probe): the permit goes back to the round.
            CallResult::Ignored => {
                row.probe_permits = (row.probe_permits + 1).min(self.breaker.half_open_probes());
                return None;
            }
        }
        let n = self.breaker.half_open_probes();
        let reopen = self.breaker.probes_to_reopen();
        if row.probe_failures >= reopen {
            let reason = TransitionReason::ProbeFailed;
            return Some(self.trip(row, reason, now, rng));
        }
        if row.probe_successes > n - reopen {
            let from = row.state;
            row.state = BreakerState::Closed;
            row.openings = 0;
            row.probe_permits = 0;
            row.probe_successes = 0;
            row.probe_failures = 0;
            row.round_started = None;
            return Some(Transition {
                from,
                to: BreakerState::Closed,
                at: now,
                reason: TransitionReason::ProbesSucceeded,
                open_until: None,
            });
        }
        None
    }

    /// Opens the breaker with the next cool-down.
    fn trip<R: Rng + ?Sized>(
        &self,
        row: &mut FlowRow,
        reason: TransitionReason,
        now: Timestamp,
        rng: &mut R,
    ) -> Transition {
        let b = &self.breaker;
        let from = row.state;
        row.openings = row.openings.saturating_add(1);
        let nominal = b.cooldown(row.openings);
        // A validated config's cooldown_jitter is 0 (no jitter) or in (0, 10].
        let cooldown = if let Ok(jitter) = Jitter::proportional(b.cooldown_jitter()) {
            jitter.apply(nominal, nominal, b.cooldown_max(), None, rng)
        } else {
            nominal
        };
        // Whole milliseconds, as the store keeps them.
        let until = add(now, cooldown);
        let until = DateTime::from_timestamp_millis(until.timestamp_millis()).unwrap_or(until);
        row.state = BreakerState::Open;
        row.open_until = Some(until);
        row.probe_permits = 0;
        row.probe_successes = 0;
        row.probe_failures = 0;
        row.round_started = None;
        Transition {
            from,
            to: BreakerState::Open,
            at: now,
            reason,
            open_until: Some(until),
        }
    }

    fn rate_limited(
        &self,
        row: &mut FlowRow,
        pause_until: Option<Timestamp>,
        served_per_s: Option<f64>,
        delivered: Option<f64>,
        now: Timestamp,
    ) {
        if let Some(u) = pause_until.filter(|u| *u > now) {
            row.paused_until = Some(row.paused_until.map_or(u, |p| p.max(u)));
            if row.pause_reason != Some(PauseReason::Operator) {
                row.pause_reason = Some(PauseReason::RetryAfter);
            }
        }
        let cfg = &self.rate;
        // No share: this process already reported to the epoch (only the pause applies).
        let Some(served) = served_per_s.filter(|_| cfg.adaptive) else {
            return;
        };
        let served = if served.is_finite() {
            served.max(0.0)
        } else {
            0.0
        };
        // One cut per congestion epoch: the 429s of the same overload say nothing new. That
        // includes the 429s of the slots the fleet reserved before the cut, at the old rate, up
        // to a slot horizon ahead: they go out for that long after the cut.
        let in_epoch = row
            .rate_cut_at
            .is_some_and(|c| now < add(add(c, CONGESTION_EPOCH), SLOT_HORIZON));
        if in_epoch {
            return;
        }
        let in_force = self
            .rate_in_force(row)
            .unwrap_or(cfg.ceiling)
            .min(cfg.ceiling);
        let share = delivered
            .filter(|d| d.is_finite())
            .map_or(1.0, |d| d.clamp(0.0, 1.0));
        // What the fleet got through: its metered send rate × the delivered share; never less
        // than what the reporter alone got through. Without a meter (no limit was in force),
        // the reporter's own measure is all there is.
        let metered = match self.fleet_send_rate(row, now) {
            Some(sent) => (sent.min(in_force) * share).max(served),
            None => served,
        }
        .min(in_force);
        let in_slow_start = self.in_slow_start(row);
        // The cycle since the PSP's bucket was last full or empty: what got through over it,
        // its bucket's content counted as time ([`BUCKET_REFILL`]). The last second's meter
        // alone is taught by the bucket: after a pause the fleet runs above the limit for as
        // long as the bucket lasts, and the 429 comes at the rate that drained it. The cycle
        // ends at its first 429, so what was sent in it got through (no share applies).
        let through = match self.cycle_sent(row, now) {
            Some((sent, span)) if in_slow_start => {
                slow_start_limit(sent, span, cfg.slow_start.unwrap_or(cfg.floor)).min(metered)
            }
            Some((sent, span)) => (sent / span).min(metered),
            // The first 429 of slow start: the limit lies within the last doubling, and a
            // PSP's bucket let the fleet run past it for a while (TCP halves its window here).
            None if in_slow_start => 0.5 * metered,
            None => metered,
        };
        let r = (cfg.decrease * through).clamp(cfg.floor, cfg.ceiling);
        row.rate = Some(r);
        row.rate_cap = Some(through.max(r));
        row.rate_cut_at = Some(now);
        row.rate_raised_at = Some(now);
        row.rate_pause = pause_until
            .filter(|u| *u > now)
            .and_then(|u| (u - now).to_std().ok());
        // The bucket is empty now: a new cycle.
        row.cycle_started = Some(ms_floor(now));
        row.cycle_slots = 0;
    }

    /// The fleet's send rate over the current cycle ([`FlowRow::cycle_started`]): its slots up
    /// to now (those reserved ahead of now are not sent yet) over the time from its start to
    /// now. `None` when the cycle is too short to say more than the meter (under the PSP's
    /// burst plus half a second), nothing was sent in it, or the burst is set to 0.
    pub fn cycle_rate(&self, row: &FlowRow, now: Timestamp) -> Option<f64> {
        self.cycle_sent(row, now).map(|(sent, span)| sent / span)
    }

    /// The current cycle's slots sent by now, and its length in seconds (see
    /// [`FlowConfig::cycle_rate`]).
    fn cycle_sent(&self, row: &FlowRow, now: Timestamp) -> Option<(f64, f64)> {
        let start = row.cycle_started?;
        let span = (us(now) - us(start)).max(0) as f64 / 1e6;
        // The slots reserved ahead of now were not sent yet: at the rate in force, or in slow
        // start at the rates it doubled through (`r·2^(−t/d)` t before the last one).
        let ahead = row
            .tat
            .map_or(0.0, |t| (us(t) - us(now)).max(0) as f64 / 1e6);
        let future = self.rate_in_force(row).map_or(0.0, |r| {
            if self.in_slow_start(row) {
                let d = SLOW_START_DOUBLING.as_secs_f64();
                r * d / std::f64::consts::LN_2 * (1.0 - (-ahead / d).exp2())
            } else {
                r * ahead
            }
        });
        let sent = (f64::from(row.cycle_slots) - future).max(0.0);
        let min_span = self.rate.psp_burst.as_secs_f64() + 0.5;
        let on = !self.rate.psp_burst.is_zero();
        (on && span >= min_span && sent > 0.0).then_some((sent, span))
    }

    /// Whether slow start is under way on `row`: adaptive, no configured limit, a rate that
    /// grew from slow start's and no 429 yet.
    fn in_slow_start(&self, row: &FlowRow) -> bool {
        let cfg = &self.rate;
        cfg.adaptive
            && cfg.limit.is_none()
            && cfg.slow_start.is_some()
            && row.rate.is_some()
            && row.rate_cap.is_none()
            && row.rate_cut_at.is_none()
    }

    /// Whether a reservation on `row` starts slow start: adaptive, no configured limit, none
    /// learned and never lifted.
    fn slow_starts(&self, row: &FlowRow) -> bool {
        let cfg = &self.rate;
        cfg.adaptive
            && cfg.limit.is_none()
            && cfg.slow_start.is_some()
            && row.rate.is_none()
            && !row.rate_lifted
    }

    /// The rate after `dt` more seconds of use: CUBIC's climb after a 429. One reservation
    /// counts at most one second, so time without reservations (idle, paused, open) does not
    /// count.
    fn grown(&self, row: &FlowRow, rate: f64, dt: f64) -> f64 {
        let cfg = &self.rate;
        let Some(w_max) = row.rate_cap else {
            // Slow start grows with the slots it hands out ([`FlowConfig::reserve`]).
            return rate;
        };
        let dt = dt.min(1.0);
        let next = cubic(rate, w_max, cfg.decrease, cfg.increase, dt);
        if next > w_max {
            // Above W_max the curve is convex: against a PSP whose bucket holds seconds of
            // its rate, the 429 comes seconds late and the rate would have run far beyond the
            // limit meanwhile. Probe at most PROBE_SLOPE × W_max more per second of use.
            return next.min(rate.max(w_max) + probe_slope(row.rate_pause) * w_max * dt);
        }
        next
    }

    /// The fleet's send rate (slots reserved per second) from the row's meter: the current
    /// window (its slots run from its start to the limiter's `tat`, or to now when the fleet
    /// fell idle) blended with the previous one's rate. `None` when nothing was metered.
    pub fn fleet_send_rate(&self, row: &FlowRow, now: Timestamp) -> Option<f64> {
        let start = row.meter_started?;
        let end = row.tat.map_or(us(now), |t| us(t).max(us(now)));
        let span = ((end - us(start)).max(0) as f64 / 1e6).max(self.rate.batch.as_secs_f64());
        let cur = f64::from(row.meter_slots);
        let window = METER_WINDOW.as_secs_f64();
        Some(match row.meter_rate {
            Some(prev) => (prev * window + cur) / (window + span),
            None => cur / span,
        })
    }

    fn tick(&self, row: &mut FlowRow, now: Timestamp) -> Option<Transition> {
        if row.mode != BreakerMode::Normal {
            return None;
        }
        match row.state {
            BreakerState::Open if row.open_until.is_none_or(|u| u <= now) => {
                self.half_open(row, now);
                Some(Transition {
                    from: BreakerState::Open,
                    to: BreakerState::HalfOpen,
                    at: now,
                    reason: TransitionReason::CooldownElapsed,
                    open_until: None,
                })
            }
            BreakerState::HalfOpen
                if row
                    .round_started
                    .is_none_or(|s| add(s, self.breaker.half_open_timeout()) <= now) =>
            {
                // Its probers died or never answered: a new round, published like any other
                // (operators see a round that hung, and a fleet's probes count per round).
                self.half_open(row, now);
                Some(Transition {
                    from: BreakerState::HalfOpen,
                    to: BreakerState::HalfOpen,
                    at: now,
                    reason: TransitionReason::ProbesUnanswered,
                    open_until: None,
                })
            }
            _ => None,
        }
    }

    fn force(&self, row: &mut FlowRow, mode: BreakerMode, now: Timestamp) -> Option<Transition> {
        let shown = |r: &FlowRow| match r.mode {
            BreakerMode::Normal => r.state,
            BreakerMode::ForcedOpen => BreakerState::Open,
            BreakerMode::ForcedClosed => BreakerState::Closed,
        };
        let from = shown(row);
        row.mode = mode;
        if mode == BreakerMode::Normal {
            // Back to the machine, from a clean start.
            row.state = BreakerState::Closed;
            row.open_until = None;
            row.openings = 0;
            row.probe_permits = 0;
            row.probe_successes = 0;
            row.probe_failures = 0;
            row.round_started = None;
        }
        let to = shown(row);
        (from != to).then_some(Transition {
            from,
            to,
            at: now,
            reason: TransitionReason::Forced,
            open_until: None,
        })
    }
}

mod client;
pub use client::{FlowClient, Next, SLOT_HORIZON};

#[cfg(test)]
mod tests;
