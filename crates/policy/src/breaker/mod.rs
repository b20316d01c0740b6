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

mod config;
mod machine;
mod state;
mod transition;
mod window;

pub use config::{
    BreakerConfig, BreakerConfigBuilder, DEFAULT_COOLDOWN_MAX, DEFAULT_COOLDOWN_MULTIPLIER,
    DEFAULT_OPEN_COOLDOWN, Window,
};
pub use machine::CircuitBreaker;
pub use state::{BreakerMode, BreakerState};
pub use transition::{Admission, CallResult, Transition, TransitionReason};

#[cfg(test)]
mod tests;
