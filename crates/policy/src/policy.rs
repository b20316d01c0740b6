//! Retry policies and the one decision function (the decision table in docs/design.md).
//!
//! # Why the decision is a pure function of stored counters
//! A job's budgets (attempts, exceptions, defers, the window, the deadline)
//! must survive deferrals, crashes and other workers picking the job up. So
//! they live in the job's row, and the decision reads them, never a
//! worker's memory: [`RetryPolicy::decide`] takes the counters *before* the
//! attempt and returns what to do together with the counters *after* it, which
//! the caller stores (before any wait) with the attempt.
//!
//! # Why two phases
//! *Retry* means the same worker sleeps a short delay holding its lease and
//! calls again; *defer* means the job goes back to the queue with a later
//! `run_at` and the worker moves on (R8). A delay at or below
//! `in_process_max_wait` is a retry; a longer one is a defer. When the retry
//! phase is spent (attempts or window), an optional defer phase keeps trying
//! along a long schedule (minutes to hours) for outages.

use std::time::Duration;

use chrono::TimeDelta;
use rand::Rng;

use crate::backoff::{Backoff, ExponentialBuilder, MAX_CAP};
use crate::error::PolicyError;
use crate::jitter::Jitter;
use crate::outcome::{Outcome, StatusTable};
use crate::{DeadReason, DeclineAdvice, DeclineRule, DeferReason, Timestamp, format_duration};

/// Default `in_process_max_wait`: delays up to 10 s are slept by the same worker.
pub const DEFAULT_IN_PROCESS_MAX_WAIT: Duration = Duration::from_secs(10);
/// The largest `in_process_max_wait` accepted: 5 minutes (longer waits belong in the queue).
pub const MAX_IN_PROCESS_MAX_WAIT: Duration = Duration::from_secs(300);
/// Default clamp of a server's `Retry-After`: 1 h.
pub const DEFAULT_RETRY_AFTER_MAX: Duration = Duration::from_secs(3600);
/// Default spread added to a breaker or pause deferral so a fleet does not wake together: 2 s.
pub const DEFAULT_BLOCKED_JITTER: Duration = Duration::from_secs(2);
/// Default wait after a "retry later" decline (Visa category 2/4, Mastercard MAC 02): 1 h.
/// Fifteen reattempts spread an hour apart stay well inside Visa's 30 days.
pub const DEFAULT_DECLINE_RETRY_LATER: Duration = Duration::from_secs(3600);
/// The most attempts a retry phase may allow.
pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;
/// The most runs a defer phase may allow.
pub const MAX_DEFERS_LIMIT: u32 = 1000;
/// The longest total deadline accepted: 365 days.
pub const MAX_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The retry phase: short delays, in process or deferred.
///
/// Part of a [`RetryPolicy`], built by [`RetryPolicyBuilder`]; its fields are private and
/// checked by [`RetryPolicyBuilder::build`], so every value is in its documented range.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPhase {
    /// Nominal delays.
    backoff: Backoff,
    /// How nominal delays are spread.
    jitter: Jitter,
    /// Attempts in this phase, counting the first call (≥ 1).
    max_attempts: u32,
    /// Time since the first attempt after which the phase is spent; `None`: no window.
    window: Option<Duration>,
    /// Delays at or below this are slept in process; longer ones are deferred.
    in_process_max_wait: Duration,
    /// A server's `Retry-After` is clamped to this.
    retry_after_max: Duration,
}

/// The optional defer phase for long outages: one attempt per run along a schedule.
///
/// Built by [`DeferPhase::new`], which checks `max_defers`; the fields are private.
#[derive(Debug, Clone, PartialEq)]
pub struct DeferPhase {
    /// The nominal delay before each run (`schedule[k]` before run `k`; the last repeats).
    schedule: Backoff,
    /// How the schedule is spread.
    jitter: Jitter,
    /// Runs allowed in this phase.
    max_defers: u32,
}

/// A named retry policy (R7, R8, R12).
///
/// Build one with [`RetryPolicy::builder`], take a preset
/// ([`RetryPolicy::payment`], [`RetryPolicy::background`], [`RetryPolicy::classic`]) or load a
/// TOML file ([`crate::PolicySet::from_toml`]). The fields are private and every constructor
/// validates them, so a `RetryPolicy` is always valid; read them with the accessors, change
/// them with [`RetryPolicy::into_builder`] and a new [`RetryPolicyBuilder::build`].
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// The policy's name (`payment`).
    name: String,
    /// The retry phase.
    retry: RetryPhase,
    /// The defer phase, if any.
    defer: Option<DeferPhase>,
    /// Unclassified errors and panics allowed across both phases; `None`: unlimited.
    max_exceptions: Option<u32>,
    /// The job's total time budget from enqueue (its deadline); `None`: none.
    deadline: Option<Duration>,
    /// Spread added to breaker and pause deferrals.
    blocked_jitter: Duration,
    /// HTTP status → class.
    status: StatusTable,
    /// The wait after a "retry later" decline (Visa category 2/4, Mastercard MAC 02).
    decline_retry_later: Duration,
    /// What a job of a stopped card key does (`declines.card_stop`).
    card_stop: CardStopAction,
}

/// What a job does when its card key is stopped by another job's decline (Visa category 1,
/// Mastercard MAC 03/21): the policy's `declines.card_stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CardStopAction {
    /// Dead `card_stopped` at once, no call (the default: the card will not be approved).
    #[default]
    Dead,
    /// Deferred until the stop ends (reason `card_stopped`), or dead `card_stopped` when
    /// that is after the job's deadline; an operator's lift lets it run at its time.
    Wait,
}

impl CardStopAction {
    /// The name in the policies file: `dead` or `wait`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CardStopAction::Dead => "dead",
            CardStopAction::Wait => "wait",
        }
    }
}

impl std::str::FromStr for CardStopAction {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dead" => Ok(CardStopAction::Dead),
            "wait" => Ok(CardStopAction::Wait),
            other => Err(PolicyError::invalid(
                "declines.card_stop",
                format!("{other:?}"),
                "\"dead\" or \"wait\"",
            )),
        }
    }
}

impl RetryPhase {
    /// Nominal delays.
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// How nominal delays are spread.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// Attempts in this phase, counting the first call (1 to [`MAX_ATTEMPTS_LIMIT`]).
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Time since the first attempt after which the phase is spent; `None`: no window.
    pub const fn window(&self) -> Option<Duration> {
        self.window
    }

    /// Delays at or below this are slept in process; longer ones are deferred.
    pub const fn in_process_max_wait(&self) -> Duration {
        self.in_process_max_wait
    }

    /// A server's `Retry-After` is clamped to this.
    pub const fn retry_after_max(&self) -> Duration {
        self.retry_after_max
    }
}

impl DeferPhase {
    /// A defer phase: `max_defers` runs along `schedule` (`schedule.nominal(k)` before run `k`),
    /// spread by `jitter`.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `defer.max_defers` when it is not from 1 to
    /// [`MAX_DEFERS_LIMIT`].
    pub fn new(schedule: Backoff, jitter: Jitter, max_defers: u32) -> Result<Self, PolicyError> {
        let phase = Self {
            schedule,
            jitter,
            max_defers,
        };
        phase.validate()?;
        Ok(phase)
    }

    fn validate(&self) -> Result<(), PolicyError> {
        if self.max_defers == 0 || self.max_defers > MAX_DEFERS_LIMIT {
            return Err(PolicyError::invalid(
                "defer.max_defers",
                self.max_defers.to_string(),
                format!("from 1 to {MAX_DEFERS_LIMIT}"),
            ));
        }
        Ok(())
    }

    /// The nominal delay before each run (`schedule.nominal(k)` before run `k`; the last
    /// repeats).
    pub const fn schedule(&self) -> &Backoff {
        &self.schedule
    }

    /// How the schedule is spread.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// Runs allowed in this phase (1 to [`MAX_DEFERS_LIMIT`]).
    pub const fn max_defers(&self) -> u32 {
        self.max_defers
    }
}

impl RetryPolicy {
    /// The policy's name (`payment`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The retry phase.
    pub const fn retry(&self) -> &RetryPhase {
        &self.retry
    }

    /// The defer phase, if any.
    pub const fn defer(&self) -> Option<&DeferPhase> {
        self.defer.as_ref()
    }

    /// Unclassified errors and panics allowed across both phases; `None`: unlimited.
    pub const fn max_exceptions(&self) -> Option<u32> {
        self.max_exceptions
    }

    /// The job's total time budget from enqueue (its deadline); `None`: none.
    pub const fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// Spread added to breaker and pause deferrals.
    pub const fn blocked_jitter(&self) -> Duration {
        self.blocked_jitter
    }

    /// HTTP status → class.
    pub const fn status(&self) -> &StatusTable {
        &self.status
    }

    /// Wait after a "retry later" decline.
    pub const fn decline_retry_later(&self) -> Duration {
        self.decline_retry_later
    }

    /// What a job of a stopped card key does.
    pub const fn card_stop(&self) -> CardStopAction {
        self.card_stop
    }

    /// A builder holding this policy's fields, to change some and build again.
    pub fn into_builder(self) -> RetryPolicyBuilder {
        RetryPolicyBuilder { policy: self }
    }
}

/// A job's budget counters, as stored in its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobCounters {
    /// Attempts counted so far.
    pub attempts: u32,
    /// Unclassified errors and panics so far.
    pub exceptions: u32,
    /// Defer-phase runs scheduled so far.
    pub defers: u32,
    /// When the first attempt started (`None`: no attempt yet).
    pub first_attempt_at: Option<Timestamp>,
    /// The job's absolute deadline, if any.
    pub deadline: Option<Timestamp>,
    /// The previous jittered backoff delay (for decorrelated jitter).
    pub prev_delay: Option<Duration>,
    /// 401s in a row just before this attempt (kept by the worker during one claim).
    pub consecutive_auth: u32,
}

/// Where a chosen delay came from (stored with the attempt, shown by `redrive show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelaySource {
    /// The backoff formula (with jitter).
    Backoff,
    /// The server's `Retry-After`, clamped.
    RetryAfter,
    /// The defer phase's schedule (with jitter), or a `Retry-After` if longer.
    DeferSchedule,
    /// An open breaker's or a pause's end, with spread.
    Blocked,
    /// A decline's network advice (a MAC 24–30 wait, or `decline_retry_later`), exact.
    DeclineAdvice,
    /// The end of a full reattempt-quota window, or of a card stop.
    Quota,
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Succeeded: store the result.
    Done,
    /// First 401 in a row: refresh the credentials and call again at once. This attempt does not
    /// count against `max_attempts`.
    RefreshCredentials,
    /// Sleep `delay` holding the lease, then call again.
    RetryInProcess {
        /// The wait.
        delay: Duration,
        /// Where it came from.
        source: DelaySource,
    },
    /// Back to the queue until `until`.
    Defer {
        /// The new `run_at`.
        until: Timestamp,
        /// The wait (`until - now`).
        delay: Duration,
        /// Why.
        reason: DeferReason,
        /// Where the wait came from.
        source: DelaySource,
    },
    /// To the dead-letter table.
    Dead {
        /// What ended the job.
        reason: DeadReason,
    },
}

/// The decision: the action, and the counters to store with the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// What to do.
    pub action: Action,
    /// The job's counters after this attempt (store them with it).
    pub counters: JobCounters,
    /// Whether this attempt counted against `max_attempts` (a first 401 does not).
    pub counted: bool,
    /// For a rate limit: pause the dependency fleet-wide until then (R19). In the retry
    /// phase the job's own wait (the server's `Retry-After`, else the backoff); in the defer
    /// phase only the server's `Retry-After`, never the job's defer schedule.
    pub pause_until: Option<Timestamp>,
}

fn add(now: Timestamp, d: Duration) -> Timestamp {
    let delta = TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX);
    now.checked_add_signed(delta)
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
}

fn since(now: Timestamp, then: Timestamp) -> Duration {
    (now - then).to_std().unwrap_or(Duration::ZERO)
}

impl RetryPolicy {
    /// A builder with the `payment` preset's retry phase and no defer phase.
    pub fn builder(name: impl Into<String>) -> RetryPolicyBuilder {
        RetryPolicyBuilder::new(name)
    }

    /// The most attempts a job under this policy can make: the retry phase's attempts plus one
    /// per defer-phase run. The store uses it to decide when a job whose lease expired is out of
    /// attempts.
    pub fn total_max_attempts(&self) -> u32 {
        self.retry
            .max_attempts
            .saturating_add(self.defer.as_ref().map_or(0, |d| d.max_defers))
    }

    /// This policy with its attempt budget lowered to a job's own limit (`max_attempts` given
    /// at enqueue): the smaller of the two wins, so a job can ask for fewer attempts than its
    /// policy allows, never more.
    ///
    /// The retry phase comes first: a limit at or below `retry.max_attempts` ends the retry
    /// phase there and drops the defer phase (the job dies `attempts_exhausted`); a larger one
    /// keeps the retry phase and shortens the defer phase to the attempts left (the job dies
    /// `defers_exhausted`). A limit of 0, or at or above [`Self::total_max_attempts`], leaves
    /// the policy as it is.
    ///
    /// ```
    /// use redrive_policy::RetryPolicy;
    /// let p = RetryPolicy::payment(); // 10 attempts, then 5 defers
    /// assert_eq!(p.limited_to(3).total_max_attempts(), 3);
    /// assert!(p.limited_to(3).defer().is_none());
    /// assert_eq!(p.limited_to(12).defer().unwrap().max_defers(), 2);
    /// assert_eq!(p.limited_to(99).total_max_attempts(), 15);
    /// ```
    pub fn limited_to(&self, max_attempts: u32) -> std::borrow::Cow<'_, RetryPolicy> {
        use std::borrow::Cow;
        if max_attempts == 0 || max_attempts >= self.total_max_attempts() {
            return Cow::Borrowed(self);
        }
        let mut p = self.clone();
        if max_attempts <= p.retry.max_attempts {
            p.retry.max_attempts = max_attempts;
            p.defer = None;
        } else if let Some(d) = &mut p.defer {
            // Between the retry phase's attempts and the total: at least one defer is left.
            d.max_defers = max_attempts - p.retry.max_attempts;
        }
        Cow::Owned(p)
    }

    /// The absolute deadline of a job enqueued (or replayed) at `now`.
    pub fn deadline_from(&self, now: Timestamp) -> Option<Timestamp> {
        self.deadline.map(|d| add(now, d))
    }

    /// The decision table of docs/design.md: what to do after an attempt.
    ///
    /// `before` are the job's stored counters before this attempt; `now` is when the attempt
    /// ended; `rng` draws the jitter. The returned [`Verdict::counters`] are the counters to
    /// store with the attempt.
    ///
    /// Order of the checks: success → done; permanent → dead; 401 → refresh once, then dead;
    /// ambiguous timeout → dead; exception → `max_exceptions`; the deadline; the retry phase
    /// (attempts and window); the defer phase; otherwise dead naming the budget that ran out.
    ///
    /// ```
    /// use std::time::Duration;
    /// use chrono::Utc;
    /// use rand::{SeedableRng, rngs::SmallRng};
    /// use redrive_policy::{Action, JobCounters, Outcome, RetryPolicy};
    ///
    /// let policy = RetryPolicy::payment();
    /// let mut rng = SmallRng::seed_from_u64(1);
    /// let v = policy.decide(
    ///     &JobCounters::default(),
    ///     &Outcome::RateLimited { retry_after: Some(Duration::from_secs(2)) },
    ///     Utc::now(),
    ///     &mut rng,
    /// );
    /// assert!(matches!(v.action, Action::RetryInProcess { delay, .. } if delay == Duration::from_secs(2)));
    /// assert_eq!(v.counters.attempts, 1);
    /// ```
    pub fn decide<R: Rng + ?Sized>(
        &self,
        before: &JobCounters,
        outcome: &Outcome,
        now: Timestamp,
        rng: &mut R,
    ) -> Verdict {
        let mut c = *before;
        if c.first_attempt_at.is_none() {
            c.first_attempt_at = Some(now);
        }
        let dead = |reason, c| Verdict {
            action: Action::Dead { reason },
            counters: c,
            counted: true,
            pause_until: None,
        };

        // A first 401 in a row does not count; everything else does.
        if let Outcome::Auth = outcome {
            if before.consecutive_auth == 0 {
                c.consecutive_auth = 1;
                return Verdict {
                    action: Action::RefreshCredentials,
                    counters: c,
                    counted: false,
                    pause_until: None,
                };
            }
            c.attempts = c.attempts.saturating_add(1);
            c.consecutive_auth = c.consecutive_auth.saturating_add(1);
            return dead(DeadReason::Auth, c);
        }
        c.attempts = c.attempts.saturating_add(1);
        c.consecutive_auth = 0;

        match outcome {
            Outcome::Success => {
                return Verdict {
                    action: Action::Done,
                    counters: c,
                    counted: true,
                    pause_until: None,
                };
            }
            Outcome::Permanent => return dead(DeadReason::Permanent, c),
            Outcome::Timeout { idempotent: false } => return dead(DeadReason::Ambiguous, c),
            Outcome::Declined(advice) => return self.decide_declined(advice, c, now),
            Outcome::Exception => {
                c.exceptions = c.exceptions.saturating_add(1);
                if self.max_exceptions.is_some_and(|m| c.exceptions >= m) {
                    return dead(DeadReason::ExceptionsExhausted, c);
                }
            }
            _ => {}
        }
        // Time arithmetic in milliseconds: chrono's date arithmetic costs more than the rest
        // of the decision, and stored times have millisecond precision anyway.
        let now_ms = now.timestamp_millis();
        let deadline_ms = c.deadline.map(|d| d.timestamp_millis());
        if deadline_ms.is_some_and(|d| d <= now_ms) {
            return dead(DeadReason::Deadline, c);
        }
        // Would a wait of `delay` end after the deadline?
        let past_deadline = |delay: Duration| {
            deadline_ms.is_some_and(|d| i128::from(d - now_ms) < delay.as_millis() as i128)
        };

        let rate_limited = matches!(outcome, Outcome::RateLimited { .. });
        let retry_after = outcome
            .retry_after()
            .map(|d| d.min(self.retry.retry_after_max));
        let first_ms = c.first_attempt_at.map_or(now_ms, |t| t.timestamp_millis());
        let in_window = self
            .retry
            .window
            .is_none_or(|w| ((now_ms - first_ms).max(0) as u128) < w.as_millis());

        // Retry phase.
        if c.attempts < self.retry.max_attempts && in_window {
            let (delay, source) = match retry_after {
                Some(ra) => (ra, DelaySource::RetryAfter),
                None => {
                    let b = &self.retry.backoff;
                    let d = self.retry.jitter.apply(
                        b.nominal(c.attempts - 1),
                        b.base(),
                        b.cap(),
                        c.prev_delay,
                        rng,
                    );
                    c.prev_delay = Some(d);
                    (d, DelaySource::Backoff)
                }
            };
            if past_deadline(delay) {
                return dead(DeadReason::Deadline, c);
            }
            let in_process = delay <= self.retry.in_process_max_wait;
            let until = (!in_process || rate_limited).then(|| add(now, delay));
            let action = match until {
                Some(until) if !in_process => Action::Defer {
                    until,
                    delay,
                    reason: if rate_limited {
                        DeferReason::RateLimited
                    } else {
                        DeferReason::Backoff
                    },
                    source,
                },
                _ => Action::RetryInProcess { delay, source },
            };
            return Verdict {
                action,
                counters: c,
                counted: true,
                pause_until: until.filter(|_| rate_limited),
            };
        }

        // Defer phase.
        if let Some(defer) = &self.defer {
            if c.defers < defer.max_defers {
                let s = &defer.schedule;
                let planned = defer
                    .jitter
                    .apply(s.nominal(c.defers), s.base(), s.cap(), None, rng);
                let delay = retry_after.map_or(planned, |ra| ra.max(planned));
                if past_deadline(delay) {
                    return dead(DeadReason::Deadline, c);
                }
                let until = add(now, delay);
                c.defers += 1;
                return Verdict {
                    action: Action::Defer {
                        until,
                        delay,
                        reason: DeferReason::DeferPhase,
                        source: DelaySource::DeferSchedule,
                    },
                    counters: c,
                    counted: true,
                    // The fleet waits what the server asked, not this job's defer schedule
                    // (minutes to hours): without a Retry-After the learned rate's cut is
                    // the fleet's answer to the 429.
                    pause_until: retry_after.filter(|_| rate_limited).map(|ra| add(now, ra)),
                };
            }
            return dead(DeadReason::DefersExhausted, c);
        }
        if c.attempts >= self.retry.max_attempts {
            dead(DeadReason::AttemptsExhausted, c)
        } else {
            dead(DeadReason::WindowExhausted, c)
        }
    }

    /// The decline rows of the decision table (docs/declines.md). A decline never waits in
    /// process and is never jittered: the networks' waits are exact minimums.
    ///
    /// - [`DeclineRule::NeverRetry`] (Visa category 1, MAC 03) → dead `do_not_retry`;
    /// - [`DeclineRule::RecurringStopped`] (MAC 21) → dead `recurring_stopped`;
    /// - [`DeclineRule::UpdatePaymentMethod`] (Visa category 3, MAC 01/04) → dead
    ///   `update_payment_method`;
    /// - [`DeclineRule::RetryAfter`] (MAC 24–30) → deferred exactly the wait (reason
    ///   `decline_advice`);
    /// - [`DeclineRule::RetryLater`] (Visa category 2/4, MAC 02) → deferred
    ///   `decline_retry_later` (reason `decline_advice`);
    ///
    /// a wait past the deadline is dead `deadline`, and a job out of attempts (both phases'
    /// budget, [`RetryPolicy::total_max_attempts`]) is dead `attempts_exhausted`.
    fn decide_declined(&self, advice: &DeclineAdvice, c: JobCounters, now: Timestamp) -> Verdict {
        let dead = |reason| Verdict {
            action: Action::Dead { reason },
            counters: c,
            counted: true,
            pause_until: None,
        };
        let delay = match advice.rule() {
            DeclineRule::NeverRetry => return dead(DeadReason::DoNotRetry),
            DeclineRule::RecurringStopped => return dead(DeadReason::RecurringStopped),
            DeclineRule::UpdatePaymentMethod => return dead(DeadReason::UpdatePaymentMethod),
            DeclineRule::RetryAfter(d) => d,
            DeclineRule::RetryLater => self.decline_retry_later,
        };
        if c.attempts >= self.total_max_attempts() {
            return dead(DeadReason::AttemptsExhausted);
        }
        let until = add(now, delay);
        if c.deadline.is_some_and(|d| d <= now || until > d) {
            return dead(DeadReason::Deadline);
        }
        Verdict {
            action: Action::Defer {
                until,
                delay,
                reason: DeferReason::DeclineAdvice,
                source: DelaySource::DeclineAdvice,
            },
            counters: c,
            counted: true,
            pause_until: None,
        }
    }

    /// The decision for a job whose card's reattempt quota is used up *before* its call (the
    /// store said the next reattempt fits at `fits_at`): deferred until then (reason
    /// `reattempt_quota`), or dead `reattempt_quota` when that is after the job's deadline.
    /// Not an attempt: the counters do not change.
    ///
    /// ```
    /// use chrono::{TimeDelta, Utc};
    /// use redrive_policy::{Action, DeadReason, JobCounters, RetryPolicy};
    /// let now = Utc::now();
    /// let fits = now + TimeDelta::hours(3);
    /// let p = RetryPolicy::payment();
    /// let c = JobCounters { deadline: Some(now + TimeDelta::hours(2)), ..Default::default() };
    /// assert_eq!(p.decide_quota(&c, fits, now), Action::Dead { reason: DeadReason::ReattemptQuota });
    /// ```
    pub fn decide_quota(
        &self,
        counters: &JobCounters,
        fits_at: Timestamp,
        now: Timestamp,
    ) -> Action {
        let until = fits_at.max(now);
        if counters.deadline.is_some_and(|d| until > d) {
            return Action::Dead {
                reason: DeadReason::ReattemptQuota,
            };
        }
        Action::Defer {
            until,
            delay: since(until, now),
            reason: DeferReason::ReattemptQuota,
            source: DelaySource::Quota,
        }
    }

    /// The decision for a job whose card key is stopped until `until` by another job's decline
    /// (Visa category 1, Mastercard MAC 03/21), *before* its call: dead `card_stopped`, or
    /// with `declines.card_stop = "wait"` deferred until the stop ends (reason
    /// `card_stopped`; dead `card_stopped` when that is after the deadline). Not an attempt:
    /// the counters do not change.
    ///
    /// ```
    /// use chrono::{TimeDelta, Utc};
    /// use redrive_policy::{Action, CardStopAction, DeadReason, JobCounters, RetryPolicy};
    /// let now = Utc::now();
    /// let p = RetryPolicy::payment();
    /// let c = JobCounters::default();
    /// let until = now + TimeDelta::days(30);
    /// assert_eq!(p.decide_card_stop(&c, until, now), Action::Dead { reason: DeadReason::CardStopped });
    /// let wait = p.into_builder().with_card_stop(CardStopAction::Wait).build().unwrap();
    /// assert!(matches!(wait.decide_card_stop(&c, until, now), Action::Defer { .. }));
    /// ```
    pub fn decide_card_stop(
        &self,
        counters: &JobCounters,
        until: Timestamp,
        now: Timestamp,
    ) -> Action {
        let until = until.max(now);
        let dead = Action::Dead {
            reason: DeadReason::CardStopped,
        };
        if self.card_stop == CardStopAction::Dead || counters.deadline.is_some_and(|d| until > d) {
            return dead;
        }
        Action::Defer {
            until,
            delay: since(until, now),
            reason: DeferReason::CardStopped,
            source: DelaySource::Quota,
        }
    }

    /// The decision for a job whose dependency is blocked (breaker open, or paused) *before* any
    /// call: defer it to `blocked_until` plus a spread of up to `blocked_jitter`, or, when that
    /// is past its deadline, dead with reason `deadline`. Not an attempt: the counters do not
    /// change (R10).
    pub fn decide_blocked<R: Rng + ?Sized>(
        &self,
        counters: &JobCounters,
        blocked_until: Timestamp,
        reason: DeferReason,
        now: Timestamp,
        rng: &mut R,
    ) -> Action {
        let base = if blocked_until > now {
            blocked_until
        } else {
            now
        };
        let spread = Jitter::Full.apply(
            self.blocked_jitter,
            Duration::ZERO,
            self.blocked_jitter.max(Duration::from_nanos(1)),
            None,
            rng,
        );
        let until = add(base, spread);
        if counters.deadline.is_some_and(|d| until > d) {
            return Action::Dead {
                reason: DeadReason::Deadline,
            };
        }
        Action::Defer {
            until,
            delay: since(until, now),
            reason,
            source: DelaySource::Blocked,
        }
    }

    /// Checks every field against its allowed range (the backoffs and jitters are valid by
    /// construction).
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming the field (`retry.max_attempts`, …), the value and
    /// the allowed range.
    fn validate(&self) -> Result<(), PolicyError> {
        let r = &self.retry;
        if r.max_attempts == 0 || r.max_attempts > MAX_ATTEMPTS_LIMIT {
            return Err(PolicyError::invalid(
                "retry.max_attempts",
                r.max_attempts.to_string(),
                format!("from 1 to {MAX_ATTEMPTS_LIMIT}"),
            ));
        }
        if let Some(w) = r.window
            && (w.is_zero() || w > MAX_DEADLINE)
        {
            return Err(PolicyError::invalid(
                "retry.window",
                format_duration(w),
                "above 0s and at most 365 days",
            ));
        }
        if r.in_process_max_wait > MAX_IN_PROCESS_MAX_WAIT {
            return Err(PolicyError::invalid(
                "retry.in_process_max_wait",
                format_duration(r.in_process_max_wait),
                "at most 5m (longer waits are deferred to the queue)",
            ));
        }
        if r.retry_after_max.is_zero() || r.retry_after_max > MAX_CAP {
            return Err(PolicyError::invalid(
                "retry.retry_after_max",
                format_duration(r.retry_after_max),
                "above 0s and at most 24h",
            ));
        }
        if let Some(d) = &self.defer {
            d.validate()?;
        }
        if self.max_exceptions == Some(0) {
            return Err(PolicyError::invalid(
                "max_exceptions",
                "0",
                "at least 1 (omit it for no limit)",
            ));
        }
        if let Some(d) = self.deadline
            && (d.is_zero() || d > MAX_DEADLINE)
        {
            return Err(PolicyError::invalid(
                "deadline",
                format_duration(d),
                "above 0s and at most 365 days",
            ));
        }
        if self.decline_retry_later.is_zero() || self.decline_retry_later > MAX_DEADLINE {
            return Err(PolicyError::invalid(
                "declines.retry_later",
                format_duration(self.decline_retry_later),
                "above 0s and at most 365 days",
            ));
        }
        if self.blocked_jitter > Duration::from_secs(3600) {
            return Err(PolicyError::invalid(
                "blocked_jitter",
                format_duration(self.blocked_jitter),
                "at most 1h",
            ));
        }
        if self.name.is_empty()
            || self.name.len() > 64
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(PolicyError::invalid(
                "name",
                format!("{:?}", self.name),
                "1 to 64 characters of letters, digits, '-', '_' or '.'",
            ));
        }
        Ok(())
    }
}

// ===== presets =====

impl RetryPolicy {
    /// The `payment` preset: for high-value payments.
    ///
    /// - retry phase: exponential, base 200 ms, ×2, cap 30 s, full jitter, 10 attempts within a
    ///   5-minute window, delays up to 10 s slept in process, `Retry-After` clamped to 1 h;
    /// - defer phase: 1m, 5m, 15m, 1h, 4h, each +0–20% (`proportional(0.2)`), 5 runs;
    /// - 5 exceptions; deadline 24 h.
    pub fn payment() -> Self {
        let m = |s: u64| Duration::from_secs(60 * s);
        RetryPolicy {
            name: "payment".into(),
            retry: RetryPhase {
                backoff: ExponentialBuilder::new()
                    .with_base(Duration::from_millis(200))
                    .with_multiplier(2.0)
                    .with_cap(Duration::from_secs(30))
                    .build()
                    .expect("valid preset"),
                jitter: Jitter::Full,
                max_attempts: 10,
                window: Some(m(5)),
                in_process_max_wait: DEFAULT_IN_PROCESS_MAX_WAIT,
                retry_after_max: DEFAULT_RETRY_AFTER_MAX,
            },
            defer: Some(DeferPhase {
                schedule: Backoff::schedule(vec![m(1), m(5), m(15), m(60), m(240)], m(6 * 60))
                    .expect("valid preset"),
                jitter: Jitter::proportional(0.2).expect("valid preset"),
                max_defers: 5,
            }),
            max_exceptions: Some(5),
            deadline: Some(Duration::from_secs(24 * 3600)),
            blocked_jitter: DEFAULT_BLOCKED_JITTER,
            status: StatusTable::new(),
            decline_retry_later: DEFAULT_DECLINE_RETRY_LATER,
            card_stop: CardStopAction::Dead,
        }
    }

    /// The `background` preset: low-priority calls, 3 attempts.
    ///
    /// Exponential, base 1 s, ×2, cap 1 min, full jitter, 3 attempts, no window, no defer
    /// phase, 3 exceptions, no deadline.
    pub fn background() -> Self {
        RetryPolicy {
            name: "background".into(),
            retry: RetryPhase {
                backoff: ExponentialBuilder::new()
                    .with_base(Duration::from_secs(1))
                    .with_multiplier(2.0)
                    .with_cap(Duration::from_secs(60))
                    .build()
                    .expect("valid preset"),
                jitter: Jitter::Full,
                max_attempts: 3,
                window: None,
                in_process_max_wait: DEFAULT_IN_PROCESS_MAX_WAIT,
                retry_after_max: DEFAULT_RETRY_AFTER_MAX,
            },
            defer: None,
            max_exceptions: Some(3),
            deadline: None,
            blocked_jitter: DEFAULT_BLOCKED_JITTER,
            status: StatusTable::new(),
            decline_retry_later: DEFAULT_DECLINE_RETRY_LATER,
            card_stop: CardStopAction::Dead,
        }
    }

    /// The `classic` preset: schedule 1s, 2s, 4s, 8s, 16s with
    /// `proportional(0.5)` jitter, cap 60 s, 5 tries, 3 exceptions; no window, no defer phase.
    pub fn classic() -> Self {
        let s = Duration::from_secs;
        RetryPolicy {
            name: "classic".into(),
            retry: RetryPhase {
                backoff: Backoff::schedule(vec![s(1), s(2), s(4), s(8), s(16)], s(60))
                    .expect("valid preset"),
                jitter: Jitter::proportional(0.5).expect("valid preset"),
                max_attempts: 5,
                window: None,
                in_process_max_wait: DEFAULT_IN_PROCESS_MAX_WAIT,
                retry_after_max: DEFAULT_RETRY_AFTER_MAX,
            },
            defer: None,
            max_exceptions: Some(3),
            deadline: None,
            blocked_jitter: DEFAULT_BLOCKED_JITTER,
            status: StatusTable::new(),
            decline_retry_later: DEFAULT_DECLINE_RETRY_LATER,
            card_stop: CardStopAction::Dead,
        }
    }

    /// The built-in presets, by name.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "payment" => Some(Self::payment()),
            "background" => Some(Self::background()),
            "classic" => Some(Self::classic()),
            _ => None,
        }
    }

    /// The names of the built-in presets.
    pub const PRESETS: &'static [&'static str] = &["payment", "background", "classic"];
}

// ===== impl RetryPolicyBuilder =====

/// Builds a [`RetryPolicy`] field by field, validating at the end.
///
/// `new` takes the policy's name, so it is not a `const fn` (a name is a `String`); the setters
/// are `with_*` (and `without_*` for the optional fields), and [`build`](Self::build) checks
/// every field.
///
/// # Default
/// The `payment` preset's retry phase (exponential 200 ms ×2, cap 30 s, full jitter, 10
/// attempts, 5-minute window, 10 s in process, `Retry-After` ≤ 1 h), no defer phase, no
/// exception limit, no deadline, 2 s blocked jitter, the default status table.
#[derive(Debug, Clone)]
pub struct RetryPolicyBuilder {
    policy: RetryPolicy,
}

impl RetryPolicyBuilder {
    /// The defaults listed above.
    pub fn new(name: impl Into<String>) -> Self {
        let mut policy = RetryPolicy::payment();
        policy.name = name.into();
        policy.defer = None;
        policy.max_exceptions = None;
        policy.deadline = None;
        Self { policy }
    }

    /// The retry phase's backoff.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.policy.retry.backoff = backoff;
        self
    }

    /// The retry phase's jitter.
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.policy.retry.jitter = jitter;
        self
    }

    /// Attempts in the retry phase, counting the first call.
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.policy.retry.max_attempts = n;
        self
    }

    /// The retry window from the first attempt.
    pub fn with_window(mut self, window: Duration) -> Self {
        self.policy.retry.window = Some(window);
        self
    }

    /// No retry window.
    pub fn without_window(mut self) -> Self {
        self.policy.retry.window = None;
        self
    }

    /// Delays at or below this are slept in process.
    pub fn with_in_process_max_wait(mut self, d: Duration) -> Self {
        self.policy.retry.in_process_max_wait = d;
        self
    }

    /// The clamp of a server's `Retry-After`.
    pub fn with_retry_after_max(mut self, d: Duration) -> Self {
        self.policy.retry.retry_after_max = d;
        self
    }

    /// The policy's name (1 to 64 letters, digits, `-`, `_` or `.`).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.policy.name = name.into();
        self
    }

    /// A defer phase, built and checked.
    pub fn with_defer_phase(mut self, defer: DeferPhase) -> Self {
        self.policy.defer = Some(defer);
        self
    }

    /// No defer phase.
    pub fn without_defer(mut self) -> Self {
        self.policy.defer = None;
        self
    }

    /// No limit on unclassified errors.
    pub fn without_max_exceptions(mut self) -> Self {
        self.policy.max_exceptions = None;
        self
    }

    /// No deadline.
    pub fn without_deadline(mut self) -> Self {
        self.policy.deadline = None;
        self
    }

    /// The policy as built so far (not yet validated).
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// A defer phase (`max_defers` is checked by [`build`](Self::build)).
    pub fn with_defer(mut self, schedule: Backoff, jitter: Jitter, max_defers: u32) -> Self {
        self.policy.defer = Some(DeferPhase {
            schedule,
            jitter,
            max_defers,
        });
        self
    }

    /// Unclassified errors allowed across both phases.
    pub fn with_max_exceptions(mut self, n: u32) -> Self {
        self.policy.max_exceptions = Some(n);
        self
    }

    /// The job's total time budget from enqueue.
    pub fn with_deadline(mut self, d: Duration) -> Self {
        self.policy.deadline = Some(d);
        self
    }

    /// Spread added to breaker and pause deferrals.
    pub fn with_blocked_jitter(mut self, d: Duration) -> Self {
        self.policy.blocked_jitter = d;
        self
    }

    /// The wait after a "retry later" decline.
    pub fn with_decline_retry_later(mut self, d: Duration) -> Self {
        self.policy.decline_retry_later = d;
        self
    }

    /// What a job of a stopped card key does.
    pub fn with_card_stop(mut self, a: CardStopAction) -> Self {
        self.policy.card_stop = a;
        self
    }

    /// The status table.
    pub fn with_status(mut self, status: StatusTable) -> Self {
        self.policy.status = status;
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming the first field out of range (`retry.max_attempts`,
    /// `retry.window`, `retry.in_process_max_wait`, `retry.retry_after_max`,
    /// `defer.max_defers`, `max_exceptions`, `deadline`, `declines.retry_later`,
    /// `blocked_jitter`, `name`), its value and the allowed range.
    pub fn build(self) -> Result<RetryPolicy, PolicyError> {
        self.policy.validate()?;
        Ok(self.policy)
    }
}

#[cfg(test)]
mod tests;
