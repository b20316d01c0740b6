//! The breaker's state and the operator's override of it, as stored and shown.

use crate::error::PolicyError;

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
