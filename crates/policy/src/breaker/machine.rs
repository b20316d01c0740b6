//! [`CircuitBreaker`]: one process's state machine over its window.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::jitter::Jitter;
use crate::{FailureClass, Timestamp};

use super::config::*;
use super::state::*;
use super::transition::*;
use super::window::*;

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
    pub(super) round_started_ms: i64,
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
        let window = WindowState::new(config.window());
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
                let timeout_ms = self.config.half_open_timeout().as_millis() as i64;
                if now_ms - self.round_started_ms >= timeout_ms {
                    // The probes of the last round never answered: start a new round.
                    self.round_started_ms = now_ms;
                    self.permits_left = self.config.half_open_probes();
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
                    .slow_call_duration()
                    .is_some_and(|d| duration >= d);
                self.window.add(failure, slow, now_ms);
                let c = self.window.totals(now_ms);
                if c.calls < self.config.minimum_calls() {
                    return None;
                }
                let rate = f64::from(c.failures) / f64::from(c.calls);
                if failure && rate >= self.config.failure_rate() {
                    return Some(self.trip_open(
                        now,
                        TransitionReason::FailureRate {
                            rate,
                            calls: c.calls,
                        },
                    ));
                }
                let slow_rate = f64::from(c.slow) / f64::from(c.calls);
                if slow && slow_rate >= self.config.slow_call_rate() {
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
                if self.probe_successes > self.config.half_open_probes() - reopen {
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
                self.permits_left = self.config.half_open_probes();
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
        // A validated config's cooldown_jitter is 0 (no jitter) or in (0, 10].
        let cooldown = if let Ok(jitter) = Jitter::proportional(self.config.cooldown_jitter()) {
            jitter.apply(
                nominal,
                nominal,
                self.config.cooldown_max(),
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
        self.permits_left = self.config.half_open_probes();
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
