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

/// Another clock moved by a fixed amount: a host whose clock is off by `by` (ahead when
/// positive). For tests and drills of a skewed fleet.
///
/// ```
/// use redrive_store::{Clock, ManualClock, OffsetClock};
/// use std::sync::Arc;
/// let c = OffsetClock::new(Arc::new(ManualClock::at_millis(10_000)), chrono::Duration::seconds(-3));
/// assert_eq!(c.now().timestamp_millis(), 7_000);
/// ```
#[derive(Debug, Clone)]
pub struct OffsetClock {
    inner: std::sync::Arc<dyn Clock>,
    by: chrono::Duration,
}

impl OffsetClock {
    /// `inner`'s time plus `by`.
    pub fn new(inner: std::sync::Arc<dyn Clock>, by: chrono::Duration) -> Self {
        Self { inner, by }
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> Timestamp {
        self.inner.now() + self.by
    }
}

/// One reading of the database's clock between two readings of the local one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// The local time just before the query was sent.
    pub sent: Timestamp,
    /// The database's time, as it answered.
    pub db: Timestamp,
    /// The local time just after the answer arrived.
    pub received: Timestamp,
}

impl ClockSample {
    /// The round trip, as the local clock measured it (zero if the local clock went back).
    pub fn round_trip(&self) -> chrono::Duration {
        (self.received - self.sent).max(chrono::Duration::zero())
    }

    /// The database's time minus the local time at the middle of the round trip (NTP's
    /// estimate: the answer was read half-way). Its error is at most half the round trip.
    pub fn offset(&self) -> chrono::Duration {
        let mid = self.sent + self.round_trip() / 2;
        self.db - mid
    }
}

/// The offset of the sample with the shortest round trip (the one least disturbed by
/// queueing on the way), with that round trip; `None` without samples.
///
/// ```
/// use redrive_store::{ClockSample, best_offset, from_millis};
/// let s = |sent, db, received| ClockSample {
///     sent: from_millis(sent), db: from_millis(db), received: from_millis(received) };
/// // The database is 3 s behind; the second sample's round trip (4 ms) is the shortest.
/// let (offset, rtt) = best_offset(&[s(0, -2_000, 100), s(200, -2_798, 204)]).unwrap();
/// assert_eq!((offset.num_milliseconds(), rtt.num_milliseconds()), (-3_000, 4));
/// ```
pub fn best_offset(samples: &[ClockSample]) -> Option<(chrono::Duration, chrono::Duration)> {
    samples
        .iter()
        .min_by_key(|s| s.round_trip())
        .map(|s| (s.offset(), s.round_trip()))
}

/// The database's own clock, in microseconds since the Unix epoch: PostgreSQL's
/// `clock_timestamp()` (the time at the statement, not the transaction's start), SQLite's
/// `'now'` (the host's clock, read by the connection; milliseconds).
#[cfg(feature = "postgres")]
const DB_TIME_PG: &str =
    "SELECT CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000) AS BIGINT)";
#[cfg(feature = "sqlite")]
const DB_TIME_SQLITE: &str =
    "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000";

impl crate::Store {
    /// The database's clock, now (one round trip): the time every process of a fleet
    /// compares leases, pauses, cool-downs and ticks in (R24). Use it through a clock that
    /// measures its offset once in a while (the runtime's `DbClock`), not per decision.
    ///
    /// # Errors
    /// The database's.
    pub async fn db_time(&self) -> crate::Result<Timestamp> {
        // The read pools: a reading queued behind the SQLite writer would only widen the
        // round trip, and so the offset's error.
        let us: i64 = match self {
            #[cfg(feature = "sqlite")]
            crate::Store::Sqlite(s) => {
                sqlx::query_scalar(DB_TIME_SQLITE)
                    .fetch_one(&s.read)
                    .await?
            }
            #[cfg(feature = "postgres")]
            crate::Store::Postgres(s) => sqlx::query_scalar(DB_TIME_PG).fetch_one(&s.read).await?,
        };
        chrono::DateTime::from_timestamp_micros(us).ok_or_else(|| crate::StoreError::Corrupt {
            what: "database time",
            detail: format!("{us} µs is out of range"),
        })
    }

    /// Measures the offset of `local` to the database's clock: `samples` readings (at least
    /// one), the one with the shortest round trip kept ([`best_offset`]). Returns the offset
    /// (database − local) and that round trip.
    ///
    /// # Errors
    /// The database's.
    pub async fn clock_offset(
        &self,
        local: &dyn Clock,
        samples: usize,
    ) -> crate::Result<(chrono::Duration, chrono::Duration)> {
        let mut taken = Vec::with_capacity(samples.max(1));
        for _ in 0..samples.max(1) {
            let sent = local.now();
            let db = self.db_time().await?;
            taken.push(ClockSample {
                sent,
                db,
                received: local.now(),
            });
        }
        Ok(best_offset(&taken).unwrap_or_default())
    }
}
