//! One worker process's side of a dependency's flow control.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Check, FlowConfig, FlowEvent, FlowRow, Grant, ServedRate, add};
use crate::breaker::{BreakerMode, BreakerState, CircuitBreaker};
use crate::{DeferReason, FailureClass, RetryBudget, Timestamp};

/// A send slot older than this is dropped rather than used late (it would bunch calls).
const SLOT_GRACE: Duration = Duration::from_millis(20);
/// The farthest ahead a process reserves send slots, whatever its in-process wait: slots
/// reserved far ahead at a rate that a 429 then cuts would keep going out at the old rate.
pub const SLOT_HORIZON: Duration = Duration::from_secs(1);
/// How long a retry held back by the retry budget waits before it looks again.
const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// What a worker does next about one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    /// Call now; `probe` when it is one of the half-open probes (report its answer).
    Call {
        /// A half-open probe.
        probe: bool,
    },
    /// Call at `at`, a send slot of the rate limit (wait for it in process).
    CallAt {
        /// The slot.
        at: Timestamp,
    },
    /// Apply this event to the shared row (compare-and-set), then give the step's grant to
    /// [`FlowClient::granted`].
    Apply(FlowEvent),
    /// No send slot can be reserved yet (slots are reserved at most [`SLOT_HORIZON`] ahead),
    /// but one comes within the wait in process: wait until `until`, holding the job, then
    /// ask again with [`FlowClient::after_wait`].
    Wait {
        /// When to ask again.
        until: Timestamp,
    },
    /// Don't call before `until`: the job is deferred, and this is not an attempt.
    Blocked {
        /// The earliest time worth trying again.
        until: Timestamp,
        /// Why.
        reason: DeferReason,
    },
}

/// What one worker process keeps about a dependency between reads of the shared
/// [`FlowRow`]: its own failure window (the breaker's closed-state judgement), the send slots
/// it reserved, what got through lately ([`ServedRate`]), the congestion epoch it reported
/// to, and its retry budget. Pure, like the row's machine: the runtime wraps it with the
/// store's I/O, and `redrive simulate` with simulated time.
///
/// The protocol, for every call:
/// 1. [`FlowClient::before_call`] with the row as last read: call now, call at a slot, apply
///    an event first (reserve slots, take a probe), or defer.
/// 2. After applying an event, [`FlowClient::granted`] with the step's grant. A
///    [`Next::Wait`] asks again after the wait with [`FlowClient::after_wait`].
/// 3. After the call, [`FlowClient::after_call`]: the report to apply to the row, if any
///    (a probe's answer, an opening, a 429); then [`FlowClient::reported`] with the row after it.
///
/// ```
/// use std::time::Duration;
/// use chrono::{TimeZone, Utc};
/// use rand::{SeedableRng, rngs::SmallRng};
/// use redrive_policy::{FailureClass, FlowClient, FlowConfig, FlowRow, Next, RateConfig};
///
/// let cfg = FlowConfig::default().with_rate(RateConfig::fixed(80.0).unwrap().with_burst(0)).unwrap();
/// let mut client = FlowClient::new(cfg.clone(), 1);
/// let mut rng = SmallRng::seed_from_u64(1);
/// let (now, wait) = (Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap(), Duration::from_secs(1));
/// let mut row = FlowRow::default();
/// let Next::Apply(ev) = client.before_call(&row, false, wait, now) else { panic!() };
/// let step = cfg.apply(&row, ev, now, &mut rng); // the runtime writes step.row to the store
/// row = step.row;
/// assert_eq!(client.granted(step.grant, wait, now), Next::CallAt { at: now });
/// // The next call takes the batch's second slot, 12.5 ms later, without touching the row.
/// let at = now + chrono::Duration::microseconds(12_500);
/// assert_eq!(client.before_call(&row, false, wait, now), Next::CallAt { at });
/// assert_eq!(client.after_call(&row, false, FailureClass::Success, Duration::ZERO, None, now), None);
/// ```
#[derive(Debug, Clone)]
pub struct FlowClient {
    config: FlowConfig,
    window: CircuitBreaker,
    served: ServedRate,
    slots: VecDeque<Timestamp>,
    /// When this process last reported its share to a congestion epoch.
    last_share: Option<Timestamp>,
    budget: Option<RetryBudget>,
    /// This process's window tripped and its opening is on its way to the row: until the
    /// row says so ([`FlowClient::reported`]), calls are held here (until the cool-down's end
    /// the window chose), and a row read before the write does not undo the trip.
    opening: Option<Timestamp>,
}

impl FlowClient {
    /// A client for one dependency; `seed` seeds its local breaker's jitter.
    pub fn new(config: FlowConfig, seed: u64) -> Self {
        // A FlowConfig's budget always builds (checked by `FlowConfig::with_retry_budget`).
        let budget = config.retry_budget.and_then(|b| b.build().ok());
        Self {
            window: CircuitBreaker::new(config.breaker.clone(), seed),
            config,
            served: ServedRate::default(),
            slots: VecDeque::new(),
            last_share: None,
            budget,
            opening: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FlowConfig {
        &self.config
    }

    /// What got through lately, per second.
    pub fn served_per_s(&self, now: Timestamp) -> f64 {
        self.served.per_second(now)
    }

    /// Send slots this process holds.
    pub fn slots_held(&self) -> usize {
        self.slots.len()
    }

    /// Keeps the local window in step with the fleet's state (an opening or a close by
    /// another process).
    fn observe(&mut self, row: &FlowRow, now: Timestamp) {
        if self.opening.is_some() {
            if row.mode == BreakerMode::Normal && row.state == BreakerState::Closed {
                // Read before this process's opening was written: stale, keep the trip.
                return;
            }
            self.opening = None;
        }
        let state = match row.mode {
            BreakerMode::ForcedOpen => BreakerState::Open,
            BreakerMode::ForcedClosed => BreakerState::Closed,
            BreakerMode::Normal => row.state,
        };
        self.window.observe(state, row.open_until, now);
    }

    /// Before a call, with the row as last read. `retry`: the job has been attempted before
    /// (it draws on the retry budget). `max_wait`: the longest wait in process for a send slot.
    pub fn before_call(
        &mut self,
        row: &FlowRow,
        retry: bool,
        max_wait: Duration,
        now: Timestamp,
    ) -> Next {
        let check = match self.look(row, now) {
            Ok(c) => c,
            Err(next) => return next,
        };
        if let Some(b) = self.budget.as_mut() {
            if !retry {
                b.deposit(now);
            } else if !b.withdraw(now) {
                return Next::Blocked {
                    until: add(now, BUDGET_WAIT),
                    reason: DeferReason::RetryBudget,
                };
            }
        }
        self.slot(check, max_wait, now)
    }

    /// Asks again after a [`Next::Wait`], with what is left of the wait in process. Like
    /// [`FlowClient::before_call`], but the call was already counted against the retry budget.
    pub fn after_wait(&mut self, row: &FlowRow, max_wait: Duration, now: Timestamp) -> Next {
        match self.look(row, now) {
            Ok(check) => self.slot(check, max_wait, now),
            Err(next) => next,
        }
    }

    /// Just before a call whose send slot ([`Next::CallAt`]) was waited for: the breaker may
    /// have opened, or the dependency been paused, during the wait. `None`: call now, with
    /// the slot in hand; otherwise what to do instead (the slot is given up). A breaker gone
    /// half-open in the meantime takes probes only, so the call is held back as well.
    ///
    /// ```
    /// use redrive_policy::{FlowClient, FlowConfig, FlowRow};
    /// let mut client = FlowClient::new(FlowConfig::default(), 1);
    /// assert_eq!(client.at_slot(&FlowRow::default(), chrono::Utc::now()), None);
    /// ```
    pub fn at_slot(&mut self, row: &FlowRow, now: Timestamp) -> Option<Next> {
        match self.look(row, now) {
            Ok(_) => None,
            Err(Next::Apply(_)) => Some(Next::Blocked {
                until: now,
                reason: DeferReason::BreakerOpen,
            }),
            Err(next) => Some(next),
        }
    }

    /// Just before a probe whose permit was taken ([`Next::Call`] with `probe`): the round may
    /// have failed (the breaker reopened), or the dependency been paused, while the permit's
    /// write went to the store. `true`: send it.
    pub fn at_probe(&mut self, row: &FlowRow, now: Timestamp) -> bool {
        self.observe(row, now);
        if self.opening.is_some_and(|u| u > now) || row.paused_until.is_some_and(|p| p > now) {
            return false;
        }
        match row.mode {
            BreakerMode::ForcedOpen => false,
            BreakerMode::ForcedClosed => true,
            BreakerMode::Normal => row.state != BreakerState::Open,
        }
    }

    /// The row's verdict, and this process's own opening on its way to the row: `Ok` when a
    /// call may go (now or at a send slot), else what to do instead.
    fn look(&mut self, row: &FlowRow, now: Timestamp) -> Result<Check, Next> {
        self.observe(row, now);
        if let Some(until) = self.opening.filter(|u| *u > now) {
            return Err(Next::Blocked {
                until,
                reason: DeferReason::BreakerOpen,
            });
        }
        match self.config.check(row, now) {
            Check::Blocked { until, reason } => Err(Next::Blocked { until, reason }),
            Check::Probe => Err(Next::Apply(FlowEvent::TakeProbe)),
            check => Ok(check),
        }
    }

    /// A held send slot, or a reservation to apply.
    fn slot(&mut self, check: Check, max_wait: Duration, now: Timestamp) -> Next {
        if check == Check::Go {
            self.slots.clear();
            return Next::Call { probe: false };
        }
        let oldest = now - chrono::Duration::from_std(SLOT_GRACE).unwrap_or_default();
        while self.slots.front().is_some_and(|s| *s < oldest) {
            self.slots.pop_front();
        }
        match self.slots.front().copied() {
            Some(at) if at <= add(now, max_wait) => {
                self.slots.pop_front();
                Next::CallAt { at }
            }
            Some(at) => Next::Blocked {
                until: at,
                reason: DeferReason::Throttled,
            },
            None => Next::Apply(FlowEvent::Reserve {
                max_ahead: max_wait.min(SLOT_HORIZON),
            }),
        }
    }

    /// After applying the event [`FlowClient::before_call`] asked for: what the step granted.
    /// `max_wait`: the same as given to `before_call`.
    pub fn granted(&mut self, grant: Grant, max_wait: Duration, now: Timestamp) -> Next {
        match grant {
            Grant::Go | Grant::None => Next::Call { probe: false },
            Grant::Probe => Next::Call { probe: true },
            // The next slot is beyond the reservation horizon but within the wait: wait.
            Grant::Blocked {
                until,
                reason: DeferReason::Throttled,
            } if until <= add(now, max_wait) => Next::Wait { until },
            Grant::Blocked { until, reason } => Next::Blocked { until, reason },
            Grant::Slots(s) => {
                self.slots.extend((0..s.count()).map(|i| s.at(i)));
                match self.slots.pop_front() {
                    Some(at) => Next::CallAt { at },
                    None => Next::Blocked {
                        until: now,
                        reason: DeferReason::Throttled,
                    },
                }
            }
        }
    }

    /// After a call: the report to apply to the shared row, if any. `pause_until` is the
    /// server's `Retry-After` as an instant.
    pub fn after_call(
        &mut self,
        row: &FlowRow,
        probe: bool,
        class: FailureClass,
        took: Duration,
        pause_until: Option<Timestamp>,
        now: Timestamp,
    ) -> Option<FlowEvent> {
        self.observe(row, now);
        if class != FailureClass::Exception {
            self.served.sent(now);
        }
        if class == FailureClass::RateLimited {
            // The slots were drawn at a rate the dependency just refused.
            self.slots.clear();
            // Its share once per congestion epoch, however many of its calls got a 429.
            let fresh = self
                .last_share
                .is_none_or(|t| now >= add(t, super::CONGESTION_EPOCH));
            if fresh {
                self.last_share = Some(now);
            }
            return Some(FlowEvent::RateLimited {
                pause_until,
                served_per_s: fresh.then(|| self.served.per_second(now)),
                delivered: if fresh {
                    self.served.delivered_share(now)
                } else {
                    None
                },
                probe,
            });
        }
        if class != FailureClass::Exception {
            self.served.record(now);
        }
        let result = self.config.breaker.result_of(class);
        if probe {
            return Some(FlowEvent::ProbeAnswered { result });
        }
        if row.mode != BreakerMode::Normal || row.state != BreakerState::Closed {
            return None;
        }
        let t = self.window.record_result(result, took, now)?;
        if t.to != BreakerState::Open {
            return None;
        }
        self.opening = Some(t.open_until.unwrap_or(now));
        Some(FlowEvent::Opened { reason: t.reason })
    }

    /// After a report was applied: the row as it is now (the truth, whatever this process
    /// reported).
    pub fn reported(&mut self, row: &FlowRow, now: Timestamp) {
        self.opening = None;
        self.observe(row, now);
    }
}
