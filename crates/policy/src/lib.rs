//! Pure decisions for redrive: backoff, jitter, failure classes, `Retry-After`,
//! budgets, the retry-or-defer-or-dead decision, the circuit breaker and the
//! retry budget.
//!
//! Nothing here does I/O, sleeps or reads a clock: time and randomness are
//! passed in (a [`Timestamp`] and any [`rand::Rng`]), so every decision can be
//! tested to the millisecond.
//!
//! ```
//! use std::time::Duration;
//! use chrono::Utc;
//! use rand::{SeedableRng, rngs::SmallRng};
//! use redrive_policy::{Action, JobCounters, Outcome, RetryPolicy, StatusTable};
//!
//! let policy = RetryPolicy::payment();
//! let mut rng = SmallRng::seed_from_u64(42);
//!
//! // A 503 from the PSP, first attempt: retry in process after a jittered 0–200 ms.
//! let outcome = StatusTable::default().outcome(503, None);
//! let verdict = policy.decide(&JobCounters::default(), &outcome, Utc::now(), &mut rng);
//! match verdict.action {
//!     Action::RetryInProcess { delay, .. } => assert!(delay <= Duration::from_millis(200)),
//!     other => panic!("unexpected {other:?}"),
//! }
//! // The caller stores `verdict.counters` with the attempt before it waits.
//! assert_eq!(verdict.counters.attempts, 1);
//! ```

mod backoff;
mod breaker;
mod budget;
mod decline;
mod duration;
mod error;
mod explain;
mod file;
mod flow;
mod jitter;
mod outcome;
mod policy;
mod reason;
mod retry_after;

pub use backoff::{
    Backoff, BackoffKind, DEFAULT_BASE, DEFAULT_CAP, DEFAULT_MULTIPLIER, ExponentialBuilder,
    MAX_CAP, MAX_MULTIPLIER, MAX_SCHEDULE_LEN,
};
pub use breaker::{
    Admission, BreakerConfig, BreakerConfigBuilder, BreakerMode, BreakerState, CallResult,
    CircuitBreaker, DEFAULT_COOLDOWN_MAX, DEFAULT_COOLDOWN_MULTIPLIER, DEFAULT_OPEN_COOLDOWN,
    Transition, TransitionReason, Window,
};
pub use budget::{RetryBudget, RetryBudgetBuilder};
pub use decline::{
    DECLINE_ROWS, DEFAULT_CARD_STOP, DeclineAdvice, DeclineRule, MAX_QUOTA, Network,
    QuotaExhausted, QuotaRules, QuotaWindow, ResponseCode, VISA_CATEGORY_1, VISA_CATEGORY_2,
    VISA_CATEGORY_3, mac_wait, visa_category_of,
};
pub use duration::{ParseDurationError, format_duration, parse_duration};
pub use error::PolicyError;
pub use explain::{ExplainRow, Explanation, explain};
pub use file::PolicySet;
pub use flow::{
    BUCKET_REFILL, CONGESTION_EPOCH, Check, DEFAULT_RATE_BATCH, DEFAULT_RATE_BURST,
    DEFAULT_RATE_CEILING, DEFAULT_RATE_DECREASE, DEFAULT_RATE_FLOOR, DEFAULT_RATE_INCREASE,
    DEFAULT_SLOW_START, FlowClient, FlowConfig, FlowEvent, FlowRow, Grant, MAX_INFLIGHT,
    MAX_SLOTS_PER_RESERVATION, METER_WINDOW, Next, PROBE_PERIOD, PROBE_SLOPE, RateConfig,
    SLOT_HORIZON, SLOW_START_DOUBLING, ServedRate, Slots, Step, cubic, probe_slope, until_resumed,
};
pub use jitter::{Jitter, MAX_PROPORTIONAL_FACTOR, ProportionalFactor};
pub use outcome::{Outcome, StatusTable};
pub use policy::{
    Action, CardStopAction, DEFAULT_BLOCKED_JITTER, DEFAULT_DECLINE_RETRY_LATER,
    DEFAULT_IN_PROCESS_MAX_WAIT, DEFAULT_RETRY_AFTER_MAX, DeferPhase, DelaySource, JobCounters,
    MAX_ATTEMPTS_LIMIT, MAX_DEADLINE, MAX_DEFERS_LIMIT, MAX_IN_PROCESS_MAX_WAIT, RetryPhase,
    RetryPolicy, RetryPolicyBuilder, Verdict,
};
pub use reason::{DeadReason, DeferReason, FailureClass, ParseNameError, PauseReason, RetryMode};
pub use retry_after::{RetryAfterError, parse_retry_after, retry_after_clamped};

/// The wall-clock instant used throughout redrive (UTC; stored with millisecond precision).
pub type Timestamp = chrono::DateTime<chrono::Utc>;
