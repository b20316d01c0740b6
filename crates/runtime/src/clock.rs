//! A clock for the runtime that follows tokio's timer, so that tests with a paused tokio clock
//! see every stored time move exactly with their sleeps.

use redrive_policy::Timestamp;
use redrive_store::Clock;

/// Time as tokio sees it: the wall-clock time at creation plus the tokio time elapsed since.
/// Under `tokio::time::pause` it moves only with the paused clock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use redrive_store::Clock;
/// let c = redrive_runtime::TokioClock::starting_at(chrono::DateTime::UNIX_EPOCH);
/// tokio::time::sleep(std::time::Duration::from_secs(45)).await;
/// assert_eq!(c.now().timestamp(), 45);
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads the wall clock once, now.
    pub fn new() -> Self {
        Self::starting_at(chrono::Utc::now())
    }

    /// A clock that reads `base` now.
    pub fn starting_at(base: Timestamp) -> Self {
        Self {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let d = tokio::time::Instant::now() - self.start;
        self.base + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
    }
}
