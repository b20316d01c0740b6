//! The `capacity` model: a fleet of payment workers against a PSP with a rate limit.
//!
//! At t = 0 every one of the N workers has just had its payment call fail at once (a blip,
//! a restart, a batch that hit a full limiter: the herd's trigger, not counted). From then
//! on each worker retries its one payment along its strategy until it succeeds or its
//! attempts run out. The PSP serves `capacity` requests per second (a token bucket holding
//! 100 ms of capacity) and answers everything beyond that with 429 or 503, with or without
//! `Retry-After`; during an optional outage window it answers 503 to everything.
//!
//! What a worker does is redrive's. The delay comes from [`Backoff::nominal`] and
//! [`Jitter::apply`]. Every call goes through the flow-control protocol of the runtime's
//! workers ([`FlowClient`] per worker process, one [`FlowRow`] for the fleet, events applied
//! by [`FlowConfig::apply`]; see the `fleet` module): a call the row blocks is deferred by
//! [`RetryPolicy::decide_blocked`] to the block's end plus up to `blocked_jitter`, without a
//! call, and a retry whose wait would end while the row still blocks is deferred the same way.
//! - `+ra`: the server's `Retry-After` is parsed by [`retry_after_clamped`], wins over the
//!   formula (R6), and pauses the whole fleet until it ends (R19).
//! - `+breaker`: the row's circuit breaker (R9, R10): each process judges its own window,
//!   the fleet shares the opening, the half-open probes and their verdict. Without it the row
//!   is forced closed.
//! - `+limit`: a configured rate limit equal to the PSP's capacity
//!   ([`RateConfig::fixed`]); `+adaptive`: none configured, learned from 429s
//!   ([`RateConfig::adaptive`], told the PSP's burst: [`RateConfig::with_psp_burst`]). Without either, [`RateConfig::off`]. Workers wait in process
//!   for their send slot (up to the policy's `in_process_max_wait`).
//!
//! [`Backoff::nominal`]: redrive_policy::Backoff::nominal
//! [`Jitter::apply`]: redrive_policy::Jitter::apply
//! [`FlowClient`]: redrive_policy::FlowClient
//! [`FlowRow`]: redrive_policy::FlowRow

use std::time::Duration;

use rand::Rng;
use redrive_policy::{
    Action, BreakerConfig, DEFAULT_BLOCKED_JITTER, DEFAULT_RETRY_AFTER_MAX, FailureClass,
    FlowConfig, JobCounters, RateConfig, RetryPolicy, Timestamp, retry_after_clamped,
};

use crate::error::SimError;
use crate::fleet::{Fleet, Gate, ns_of, ts};
use crate::net::{Net, Queue, RunResult, ns};
use crate::strategy::{RateMode, Retrier, Strategy};

/// What the PSP answers beyond its capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Overload {
    /// 429 Too Many Requests (rate limited: a breaker ignores it).
    TooManyRequests,
    /// 503 Service Unavailable (infrastructure: a breaker counts it).
    Unavailable,
}

impl Overload {
    /// The HTTP status.
    pub const fn status(self) -> u16 {
        match self {
            Overload::TooManyRequests => 429,
            Overload::Unavailable => 503,
        }
    }
}

/// A window during which the PSP answers 503 to everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Outage {
    /// When it starts, from t = 0.
    pub start: Duration,
    /// How long it lasts.
    pub length: Duration,
}

/// Parameters of the `capacity` model.
///
/// # Default
/// - capacity 50 requests/s, burst 100 ms of it (5 requests)
/// - beyond it: 429 with `Retry-After: 1`
/// - no outage
/// - backoff base 1 s, cap 30 s (R1: the first delay is the base)
/// - network `|Normal(10 ms, 2 ms)|` each way
/// - 50 attempts per worker (the trigger's failed call included), `Retry-After` clamped to 1 h
/// - blocked deferrals spread by up to 2 s ([`DEFAULT_BLOCKED_JITTER`]); a send slot waited for
///   in process up to 10 s ([`DEFAULT_IN_PROCESS_MAX_WAIT`](redrive_policy::DEFAULT_IN_PROCESS_MAX_WAIT))
/// - the breaker: [`BreakerConfig::default`]
/// - one worker process (all workers share one [`FlowClient`](redrive_policy::FlowClient)),
///   no clock skew
/// - the run stops after 1 h of simulated time (workers still waiting count as failed)
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityConfig {
    /// Requests per second the PSP serves.
    pub capacity: f64,
    /// Tokens the bucket holds; `None`: 100 ms of capacity (at least 1).
    pub burst: Option<u32>,
    /// The answer beyond capacity.
    pub overload: Overload,
    /// Whole seconds sent as `Retry-After` with each overload answer; `None`: no header.
    pub retry_after: Option<u64>,
    /// An optional outage window.
    pub outage: Option<Outage>,
    /// Backoff base.
    pub base: Duration,
    /// Backoff cap.
    pub cap: Duration,
    /// The network.
    pub net: Net,
    /// Attempts per worker, counting the trigger's failed call.
    pub max_attempts: u32,
    /// `Retry-After` is clamped to this.
    pub retry_after_max: Duration,
    /// Spread added to breaker and pause deferrals.
    pub blocked_jitter: Duration,
    /// The longest wait in process for a send slot of the rate limit.
    pub in_process_max_wait: Duration,
    /// The breaker used by `+breaker` strategies.
    pub breaker: BreakerConfig,
    /// Worker processes the workers are spread over (round robin): each has its own
    /// [`FlowClient`](redrive_policy::FlowClient), so its own breaker window and send slots.
    pub processes: u32,
    /// The processes' clocks are off the true time by offsets spread evenly over
    /// `-clock_skew..=+clock_skew` (see the `fleet` module).
    pub clock_skew: Duration,
    /// Simulated time after which the run stops.
    pub horizon: Duration,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        Self {
            capacity: 50.0,
            burst: None,
            overload: Overload::TooManyRequests,
            retry_after: Some(1),
            outage: None,
            base: Duration::from_secs(1),
            cap: Duration::from_secs(30),
            net: Net::default(),
            max_attempts: 50,
            retry_after_max: DEFAULT_RETRY_AFTER_MAX,
            blocked_jitter: DEFAULT_BLOCKED_JITTER,
            in_process_max_wait: redrive_policy::DEFAULT_IN_PROCESS_MAX_WAIT,
            breaker: BreakerConfig::default(),
            processes: 1,
            clock_skew: Duration::ZERO,
            horizon: Duration::from_secs(3600),
        }
    }
}

impl CapacityConfig {
    /// Checks the parameters.
    ///
    /// # Errors
    /// [`SimError::InvalidConfig`] naming the parameter.
    pub fn validate(&self) -> Result<(), SimError> {
        if !(self.capacity.is_finite() && self.capacity > 0.0 && self.capacity <= 1e7) {
            return Err(SimError::config(
                "capacity",
                self.capacity,
                "requests per second above 0 and at most 10000000",
            ));
        }
        if self.burst == Some(0) {
            return Err(SimError::config("burst", 0, "at least 1"));
        }
        if !(1..=1000).contains(&self.max_attempts) {
            return Err(SimError::config(
                "max attempts",
                self.max_attempts,
                "from 1 to 1000",
            ));
        }
        if !(1..=100_000).contains(&self.processes) {
            return Err(SimError::config(
                "processes",
                self.processes,
                "from 1 to 100000",
            ));
        }
        if self.horizon.is_zero() || self.horizon > Duration::from_secs(7 * 24 * 3600) {
            return Err(SimError::config(
                "horizon",
                redrive_policy::format_duration(self.horizon),
                "above 0s and at most 7 days",
            ));
        }
        check_skew(self.clock_skew)
    }

    /// The bucket's size in requests.
    pub fn burst_size(&self) -> u32 {
        self.burst
            .unwrap_or_else(|| (self.capacity * 0.1).round().max(1.0) as u32)
    }

    /// The strategy's delay calculator for this model.
    ///
    /// # Errors
    /// The strategy's own errors (see [`Strategy::retrier`]).
    pub fn retrier(&self, strategy: &Strategy) -> Result<Retrier, SimError> {
        strategy.retrier(self.base, self.cap, 0)
    }

    /// The flow control a strategy puts between the workers and the PSP.
    ///
    /// # Errors
    /// [`SimError::InvalidConfig`] when `+limit` cannot take the capacity as a rate limit.
    pub fn flow(&self, strategy: &Strategy) -> Result<FlowConfig, SimError> {
        let rate = match strategy.rate {
            RateMode::Off => RateConfig::off(),
            // The limiter is told the PSP's burst (`rate_psp_burst`), as an operator who knows
            // it would: the model's bucket is 100 ms of the capacity by default, a tenth of
            // what the limiter assumes otherwise.
            RateMode::Adaptive => RateConfig::adaptive().with_psp_burst(
                std::time::Duration::from_secs_f64(f64::from(self.burst_size()) / self.capacity),
            ),
            RateMode::Limit => RateConfig::fixed(self.capacity)
                .map_err(|e| SimError::config("capacity", self.capacity, e.to_string()))?,
        };
        FlowConfig::default()
            .with_breaker(self.breaker.clone())
            .with_rate(rate)
            .map_err(|e| SimError::config("capacity", self.capacity, e.to_string()))
    }

    fn blocked_policy(&self) -> Result<RetryPolicy, SimError> {
        RetryPolicy::builder("simulated")
            .with_blocked_jitter(self.blocked_jitter)
            .with_in_process_max_wait(self.in_process_max_wait)
            .build()
            .map_err(|e| SimError::config("blocked jitter", e, "at most 1h"))
    }
}

/// The largest clock skew a model accepts.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(3600);

/// Refuses a clock skew beyond [`MAX_CLOCK_SKEW`].
pub(crate) fn check_skew(skew: Duration) -> Result<(), SimError> {
    if skew > MAX_CLOCK_SKEW {
        return Err(SimError::config(
            "clock skew",
            redrive_policy::format_duration(skew),
            "at most 1h",
        ));
    }
    Ok(())
}

const WAKE: u8 = 0;
const AT_SERVER: u8 = 1;
const REPLY: u8 = 2;
const TICK: u8 = 3;
const RA_BIT: u64 = 1 << 16;
/// The fleet's housekeeping ([`redrive_policy::FlowEvent::Tick`]) runs this often.
const TICK_NS: u64 = 100_000_000;
/// How long the trigger's failed call took.
const TRIGGER_TOOK: Duration = Duration::from_millis(20);

/// One run of the `capacity` model.
pub(crate) fn run<R: Rng + ?Sized>(
    cfg: &CapacityConfig,
    strategy: &Strategy,
    retrier: &Retrier,
    clients: u32,
    seed: u64,
    rng: &mut R,
) -> Result<RunResult, SimError> {
    let n = clients as usize;
    let policy = cfg.blocked_policy()?;
    let max_wait = policy.retry().in_process_max_wait();
    let mut fleet = Fleet::new(cfg.flow(strategy)?, cfg.processes, seed, !strategy.breaker)
        .with_clock_skew(cfg.clock_skew);
    let process = |c: u32| (c % cfg.processes.max(1)) as usize;
    let mut out = RunResult::default();
    let mut q = Queue::with_capacity(n);
    let mut attempts = vec![1u32; n];
    let mut prev: Vec<Option<Duration>> = vec![None; n];
    let mut sent_at = vec![0u64; n];
    let mut probe = vec![false; n];
    let mut waited: Vec<Option<u64>> = vec![None; n];
    let mut done = 0u32;
    let mut last = 0u64;
    let burst = f64::from(cfg.burst_size());
    let mut tokens = burst;
    let mut refilled_at = 0u64;
    let horizon = ns(cfg.horizon);
    let ra_header = cfg.retry_after.map(|s| s.to_string());

    // The trigger: every call failed at t = 0 with a 503, and each process saw its own.
    for c in 0..clients {
        fleet.after_call(
            process(c),
            false,
            FailureClass::Infrastructure,
            TRIGGER_TOOK,
            None,
            0,
            rng,
        );
        if cfg.max_attempts <= 1 {
            out.failed += 1;
            continue;
        }
        let d = retrier.delay(1, None, rng);
        prev[c as usize] = Some(d);
        q.push(ns(d), c, WAKE, 0);
    }
    if cfg.max_attempts <= 1 {
        return Ok(out);
    }
    q.push(TICK_NS, 0, TICK, 0);

    // A deferral (not an attempt): to the block's end plus the policy's spread.
    let defer = |until: Timestamp, reason, now: u64, rng: &mut R| -> u64 {
        match policy.decide_blocked(&JobCounters::default(), until, reason, ts(now), rng) {
            Action::Defer { until, .. } => ns_of(until).max(now + 1),
            // No deadline is set, so decide_blocked always defers; keep going regardless.
            _ => ns_of(until).max(now + 1),
        }
    };

    while let Some((t, c, kind, payload)) = q.pop() {
        if t > horizon {
            break;
        }
        let ci = c as usize;
        match kind {
            TICK => {
                fleet.tick(t, rng);
                if done + out.failed < clients {
                    q.push(t + TICK_NS, 0, TICK, 0);
                }
            }
            WAKE => match fleet.before_call(process(c), true, max_wait, waited[ci], t, rng) {
                Gate::Wait { at_ns } => {
                    waited[ci].get_or_insert(t);
                    q.push(at_ns, c, WAKE, 0);
                }
                Gate::Blocked { until, reason } => {
                    waited[ci] = None;
                    out.blocked += 1;
                    q.push(defer(until, reason, t, rng), c, WAKE, 0);
                }
                Gate::Call { at_ns, probe: p } => {
                    // A send slot later than now is waited for in process.
                    waited[ci] = None;
                    probe[ci] = p;
                    sent_at[ci] = at_ns;
                    q.push(at_ns + cfg.net.delay_ns(rng), c, AT_SERVER, 0);
                }
            },
            AT_SERVER => {
                out.count_call(t);
                let in_outage = cfg.outage.is_some_and(|o| {
                    let s = ns(o.start);
                    t >= s && t < s.saturating_add(ns(o.length))
                });
                let answer = if in_outage {
                    503
                } else {
                    let dt = t.saturating_sub(refilled_at) as f64 / 1e9;
                    tokens = (tokens + dt * cfg.capacity).min(burst);
                    refilled_at = refilled_at.max(t);
                    if tokens >= 1.0 {
                        tokens -= 1.0;
                        200
                    } else {
                        u64::from(cfg.overload.status())
                            | if cfg.retry_after.is_some() { RA_BIT } else { 0 }
                    }
                };
                if answer == 200 {
                    out.count_served(t);
                } else {
                    out.wasted += 1;
                }
                q.push(t + cfg.net.delay_ns(rng), c, REPLY, answer);
            }
            _ => {
                let status = payload & 0xffff;
                let class = match status {
                    200 => FailureClass::Success,
                    429 => FailureClass::RateLimited,
                    _ => FailureClass::Infrastructure,
                };
                // R6: a valid Retry-After wins over the formula (clamped); R19: it pauses the
                // fleet, through the report of this call.
                let server_wait = match (&ra_header, payload & RA_BIT != 0) {
                    (Some(h), true) if strategy.retry_after => {
                        retry_after_clamped(h, ts(t), cfg.retry_after_max)
                    }
                    _ => None,
                };
                let pause_until = server_wait
                    .filter(|_| class == FailureClass::RateLimited)
                    .map(|w| ts(t + ns(w)));
                let took = Duration::from_nanos(t - sent_at[ci]);
                fleet.after_call(process(c), probe[ci], class, took, pause_until, t, rng);
                if status == 200 {
                    done += 1;
                    last = t;
                    continue;
                }
                attempts[ci] += 1;
                if attempts[ci] >= cfg.max_attempts {
                    out.failed += 1;
                    last = t;
                    continue;
                }
                let d = match server_wait {
                    Some(wait) => wait,
                    None => {
                        let d = retrier.delay(attempts[ci], prev[ci], rng);
                        prev[ci] = Some(d);
                        d
                    }
                };
                // A wait that would end while the row still blocks calls: defer instead.
                let wake = match fleet.blocked_until(t) {
                    Some((until, reason)) if ns_of(until) > t + ns(d) => {
                        out.blocked += 1;
                        defer(until, reason, t, rng)
                    }
                    _ => t + ns(d),
                };
                q.push(wake, c, WAKE, 0);
            }
        }
    }
    // Workers still waiting at the horizon did not get their payment through.
    let finished = done + out.failed;
    if finished < clients {
        out.failed += clients - finished;
        last = horizon;
    }
    out.completion = Duration::from_nanos(last);
    Ok(out)
}
