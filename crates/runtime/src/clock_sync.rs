//! One clock for shared decisions (R24): the database's.
//!
//! Leases, the rate limiter's arrival times, cool-downs, pauses, schedule ticks, quota windows
//! and the pruner's lease are times written to rows that every process of the fleet compares
//! with its own "now". If each process used its host's wall clock, a host 3 s ahead would see
//! live leases of a 6 s lease as expired and take them (a second call to the PSP), fire ticks
//! early and shorten pauses. So every time a worker writes or compares is in the database's
//! clock.
//!
//! **Why an offset, not `now()` in SQL.** The store takes `now` as a parameter everywhere
//! (every operation is testable to the millisecond with a manual clock, and the decisions made
//! in Rust — the flow machine, the breaker, the budgets — use the same instant as the row they
//! write). Asking the database for its time per decision would be a round trip each. Instead
//! [`DbClock`] measures its local clock's offset to the database NTP-style — the database's
//! time minus the middle of the local send and receive times, the sample with the shortest
//! round trip of a few — at start and every [`DEFAULT_CLOCK_SYNC`], and reads
//! `local + offset`. Its error is at most half that round trip (about a millisecond on a LAN),
//! far below any lease; a local clock that jumps between two syncs is caught up at the next.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use redrive_policy::Timestamp;
use redrive_store::{Clock, ClockSample, Store, StoreError, best_offset};
use tokio_util::sync::CancellationToken;

use crate::db::Db;

/// How often a [`DbClock`] measures its offset again, by default.
pub const DEFAULT_CLOCK_SYNC: Duration = Duration::from_secs(15);
/// Readings of the database's clock per measurement; the one with the shortest round trip
/// is kept.
pub const CLOCK_SAMPLES: usize = 5;
/// An offset beyond this is logged as a warning: the host's clock is off (fix its NTP), and
/// times it shows in logs differ from the fleet's.
pub const CLOCK_WARN_OFFSET: Duration = Duration::from_secs(1);
/// After a warning, another one only when the offset moved by more than this.
pub const CLOCK_WARN_CHANGE: Duration = Duration::from_millis(500);

/// A clock that reads the database's time: a local clock plus its measured offset to the
/// database (see the module docs). Before its first measurement it reads the local clock.
///
/// ```
/// use std::sync::Arc;
/// use redrive_runtime::DbClock;
/// use redrive_store::{Clock, ManualClock};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let local = Arc::new(ManualClock::at_millis(10_000));
/// let clock = DbClock::new(local.clone());
/// // The database reads 3 s less than the local clock.
/// let db = || async { Ok::<_, std::convert::Infallible>(redrive_store::from_millis(7_000)) };
/// clock.sync_with(db).await.unwrap();
/// assert_eq!(clock.offset(), Some(chrono::Duration::seconds(-3)));
/// assert_eq!(clock.now().timestamp_millis(), 7_000);
/// # });
/// ```
#[derive(Debug)]
pub struct DbClock {
    local: Arc<dyn Clock>,
    /// The offset in microseconds (database − local).
    offset_us: AtomicI64,
    synced: AtomicBool,
    /// The offset last warned about.
    warned: Mutex<Option<chrono::Duration>>,
}

impl DbClock {
    /// A clock over `local`, not measured yet (it reads `local` until [`DbClock::sync`]).
    pub fn new(local: Arc<dyn Clock>) -> Self {
        Self {
            local,
            offset_us: AtomicI64::new(0),
            synced: AtomicBool::new(false),
            warned: Mutex::new(None),
        }
    }

    /// The measured offset (database − local); `None` before the first measurement.
    pub fn offset(&self) -> Option<chrono::Duration> {
        self.synced
            .load(Ordering::Acquire)
            .then(|| chrono::Duration::microseconds(self.offset_us.load(Ordering::Acquire)))
    }

    /// The measured offset in whole milliseconds, as the registry of workers stores it.
    pub fn offset_ms(&self) -> Option<i64> {
        self.offset().map(|o| o.num_milliseconds())
    }

    /// Measures the offset against the store's database ([`CLOCK_SAMPLES`] readings of
    /// [`Store::db_time`]) and uses it from now on.
    ///
    /// # Errors
    /// The store's; the clock keeps its last offset.
    pub async fn sync(&self, store: &Store) -> Result<chrono::Duration, StoreError> {
        self.sync_on(&Db::new(store.clone(), None)).await
    }

    /// [`DbClock::sync`] through the worker's way to the store.
    pub(crate) async fn sync_on(&self, db: &Db) -> Result<chrono::Duration, StoreError> {
        self.sync_with(|| db.run(|s| async move { s.db_time().await }))
            .await
    }

    /// Measures the offset against a source of the database's time, read [`CLOCK_SAMPLES`]
    /// times, keeping the reading with the shortest round trip; logs a warning when the
    /// offset passes [`CLOCK_WARN_OFFSET`] (once, and again when it moves by more than
    /// [`CLOCK_WARN_CHANGE`]). Returns the offset (database − local).
    ///
    /// # Errors
    /// The source's; the clock keeps its last offset.
    pub async fn sync_with<F, Fut, E>(&self, mut read: F) -> Result<chrono::Duration, E>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Timestamp, E>>,
    {
        let mut samples = Vec::with_capacity(CLOCK_SAMPLES);
        for _ in 0..CLOCK_SAMPLES {
            let sent = self.local.now();
            let db = read().await?;
            let received = self.local.now();
            samples.push(ClockSample { sent, db, received });
        }
        let (offset, rtt) = best_offset(&samples).unwrap_or_default();
        let us = offset.num_microseconds().unwrap_or(i64::MAX);
        self.offset_us.store(us, Ordering::Release);
        self.synced.store(true, Ordering::Release);
        self.warn_if_off(offset, rtt);
        Ok(offset)
    }

    /// The warning of a host whose clock is off (see [`DbClock::sync_with`]).
    fn warn_if_off(&self, offset: chrono::Duration, rtt: chrono::Duration) {
        let limit = chrono::Duration::from_std(CLOCK_WARN_OFFSET).unwrap_or_default();
        let change = chrono::Duration::from_std(CLOCK_WARN_CHANGE).unwrap_or_default();
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        if offset.abs() <= limit {
            if warned.take().is_some() {
                tracing::info!(
                    offset_ms = offset.num_milliseconds(),
                    "this host's clock is within {CLOCK_WARN_OFFSET:?} of the database's again"
                );
            }
            return;
        }
        if warned.is_some_and(|w| (w - offset).abs() <= change) {
            return;
        }
        *warned = Some(offset);
        tracing::warn!(
            offset_ms = offset.num_milliseconds(),
            round_trip_ms = rtt.num_milliseconds(),
            "this host's clock is {} ms {} the database's: redrive uses the database's time \
             for leases, pauses and schedules, but check the host's time synchronisation (NTP)",
            offset.num_milliseconds().abs(),
            if offset > chrono::Duration::zero() {
                "behind"
            } else {
                "ahead of"
            },
        );
    }

    /// Measures the offset again every `every` until `stop` (first after `every`, or after a
    /// second if it was never measured: make the first measurement with [`DbClock::sync`]
    /// before using the clock). A failure is logged, the last offset kept, and the next
    /// measurement made after a second.
    pub fn spawn_sync(
        self: Arc<Self>,
        store: Store,
        every: Duration,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        self.spawn_sync_on(Db::new(store, None), every, stop)
    }

    /// [`DbClock::spawn_sync`] through the worker's way to the store.
    pub(crate) fn spawn_sync_on(
        self: Arc<Self>,
        db: Db,
        every: Duration,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            // Not measured yet (the first measurement failed): try again soon.
            let mut wait = match self.offset() {
                Some(_) => every,
                None => every.min(Duration::from_secs(1)),
            };
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = match self.sync_on(&db).await {
                    Ok(_) => every,
                    Err(e) => {
                        tracing::warn!("measuring the clock's offset to the database failed: {e}");
                        every.min(Duration::from_secs(1))
                    }
                };
            }
        })
    }
}

impl Clock for DbClock {
    fn now(&self) -> Timestamp {
        self.local.now() + chrono::Duration::microseconds(self.offset_us.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_store::{ManualClock, from_millis};
    use std::convert::Infallible;

    /// A database whose clock reads `db_ms` while each reading takes `rtt_ms` of the local
    /// clock (half on the way there, half back), the local clock moved by each reading.
    fn reader(
        local: Arc<ManualClock>,
        db: Arc<ManualClock>,
        rtts_ms: Vec<u64>,
    ) -> impl FnMut() -> std::future::Ready<Result<Timestamp, Infallible>> {
        let mut rtts = rtts_ms.into_iter().cycle();
        move || {
            let half = Duration::from_millis(rtts.next().unwrap_or(0) / 2);
            local.advance(half);
            db.advance(half);
            let t = db.now();
            local.advance(half);
            db.advance(half);
            std::future::ready(Ok(t))
        }
    }

    #[tokio::test]
    async fn a_local_clock_ahead_reads_the_databases_time() {
        let local = Arc::new(ManualClock::at_millis(1_003_000));
        let db = Arc::new(ManualClock::at_millis(1_000_000));
        let clock = DbClock::new(local.clone());
        assert_eq!(clock.offset(), None, "not measured yet");
        assert_eq!(clock.now(), local.now(), "unmeasured: the local clock");
        let offset = clock
            .sync_with(reader(local.clone(), db.clone(), vec![10]))
            .await
            .unwrap();
        assert_eq!(offset, chrono::Duration::seconds(-3));
        assert_eq!(clock.offset_ms(), Some(-3_000));
        assert_eq!(clock.now(), db.now());
        local.advance(Duration::from_secs(7));
        db.advance(Duration::from_secs(7));
        assert_eq!(clock.now(), db.now(), "both move on together");
    }

    #[tokio::test]
    async fn a_local_clock_behind_reads_the_databases_time() {
        let local = Arc::new(ManualClock::at_millis(997_000));
        let db = Arc::new(ManualClock::at_millis(1_000_000));
        let clock = DbClock::new(local.clone());
        let offset = clock
            .sync_with(reader(local.clone(), db.clone(), vec![4]))
            .await
            .unwrap();
        assert_eq!(offset, chrono::Duration::seconds(3));
        assert_eq!(clock.now(), db.now());
    }

    /// Readings disturbed by queueing (long round trips with the delay all on the way back)
    /// are outweighed by the one with the shortest round trip.
    #[tokio::test]
    async fn the_reading_with_the_shortest_round_trip_wins() {
        let local = Arc::new(ManualClock::at_millis(0));
        let db = Arc::new(ManualClock::at_millis(2_000));
        let clock = DbClock::new(local.clone());
        // The database answers at once; the answer waits `queued` before it is read.
        let mut queued = [400u64, 300, 2, 500, 250].into_iter();
        let read = || {
            let t = db.now();
            let q = Duration::from_millis(queued.next().unwrap());
            local.advance(q);
            db.advance(q);
            std::future::ready(Ok::<_, Infallible>(t))
        };
        let offset = clock.sync_with(read).await.unwrap();
        // Error at most half the best round trip (2 ms): 1 ms.
        assert_eq!(offset, chrono::Duration::milliseconds(1_999));
    }

    /// The local clock jumps 5 s forward between two measurements (an NTP step, a VM
    /// resumed): until the next measurement the clock is off by the jump; after it, the
    /// database's time again.
    #[tokio::test]
    async fn a_jump_of_the_local_clock_is_caught_up_at_the_next_sync() {
        let local = Arc::new(ManualClock::at_millis(50_000));
        let db = Arc::new(ManualClock::at_millis(50_000));
        let clock = DbClock::new(local.clone());
        clock
            .sync_with(reader(local.clone(), db.clone(), vec![2]))
            .await
            .unwrap();
        assert_eq!(clock.offset(), Some(chrono::Duration::zero()));
        local.advance(Duration::from_secs(5));
        assert_eq!(clock.now() - db.now(), chrono::Duration::seconds(5));
        let offset = clock
            .sync_with(reader(local.clone(), db.clone(), vec![2]))
            .await
            .unwrap();
        assert_eq!(offset, chrono::Duration::seconds(-5));
        assert_eq!(clock.now(), db.now());
        // And back (a step backwards).
        local.set(from_millis(db.now().timestamp_millis() - 2_000));
        clock
            .sync_with(reader(local.clone(), db.clone(), vec![2]))
            .await
            .unwrap();
        assert_eq!(clock.offset_ms(), Some(2_000));
        assert_eq!(clock.now(), db.now());
    }

    /// A failed measurement keeps the last offset.
    #[tokio::test]
    async fn a_failed_sync_keeps_the_last_offset() {
        let local = Arc::new(ManualClock::at_millis(10_000));
        let db = Arc::new(ManualClock::at_millis(12_000));
        let clock = DbClock::new(local.clone());
        clock
            .sync_with(reader(local.clone(), db.clone(), vec![0]))
            .await
            .unwrap();
        let r = clock
            .sync_with(|| std::future::ready(Err::<Timestamp, _>("unreachable")))
            .await;
        assert_eq!(r, Err("unreachable"));
        assert_eq!(clock.offset_ms(), Some(2_000));
    }

    /// The warning's state: set past the threshold, kept while the offset stays close, reset
    /// once the clock is back within it.
    #[test]
    fn an_offset_beyond_a_second_is_warned_once_until_it_moves() {
        let clock = DbClock::new(Arc::new(ManualClock::at_millis(0)));
        let warned = || *clock.warned.lock().unwrap();
        let ms = chrono::Duration::milliseconds;
        clock.warn_if_off(ms(900), ms(1));
        assert_eq!(warned(), None);
        clock.warn_if_off(ms(-3_000), ms(1));
        assert_eq!(warned(), Some(ms(-3_000)));
        clock.warn_if_off(ms(-3_400), ms(1));
        assert_eq!(warned(), Some(ms(-3_000)), "moved 400 ms: no new warning");
        clock.warn_if_off(ms(-4_000), ms(1));
        assert_eq!(warned(), Some(ms(-4_000)), "moved 1 s: warned again");
        clock.warn_if_off(ms(10), ms(1));
        assert_eq!(warned(), None);
    }
}
