//! Injected time: the store and the runtime never read the wall clock directly.

use std::sync::Mutex;
use std::time::Duration;

use redrive_policy::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in UTC.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        chrono::Utc::now()
    }
}

/// A clock that only moves when told to, for exact tests.
///
/// ```
/// use std::time::Duration;
/// use redrive_store::{Clock, ManualClock};
/// let clock = ManualClock::at_millis(1_000);
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now().timestamp_millis(), 3_000);
/// ```
#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    /// A clock stopped at `t`.
    pub fn new(t: Timestamp) -> Self {
        Self(Mutex::new(t))
    }

    /// A clock stopped at `ms` milliseconds after the Unix epoch.
    pub fn at_millis(ms: i64) -> Self {
        Self::new(crate::model::from_millis(ms))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
    }

    /// Sets the clock.
    pub fn set(&self, to: Timestamp) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
