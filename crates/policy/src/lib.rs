//! Pure decisions for redrive: backoff, jitter, failure classes, `Retry-After`,
//! budgets, the retry-or-defer-or-dead decision, and the circuit breaker.
//!
//! Nothing here does I/O, sleeps or reads a clock: time and randomness are
//! passed in, so every decision can be tested to the millisecond.

mod reason;

pub use reason::{DeadReason, DeferReason, FailureClass, ParseNameError, RetryMode};

/// The wall-clock instant used throughout redrive (UTC, millisecond precision in storage).
pub type Timestamp = chrono::DateTime<chrono::Utc>;

mod duration;

pub use duration::{ParseDurationError, format_duration, parse_duration};
