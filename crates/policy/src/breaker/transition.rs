//! What the breaker answers: a call's admission, how a call counts, and each change of state.

use crate::Timestamp;

use super::state::BreakerState;

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
    /// A half-open round got no verdict within `half_open_timeout` (its probes were lost or
    /// never answered): a new round starts, with a full group of probes.
    ProbesUnanswered,
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
            TransitionReason::ProbesUnanswered => f.write_str("probes unanswered: new round"),
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
