//! The storage seam of the idempotency layer: one object-safe trait, three backends.
//!
//! Every operation is one short transaction; no transaction is held while a handler runs.
//! Time comparisons (lease, expiry) are made with the database's clock (`now()` in
//! PostgreSQL, `julianday('now')` in SQLite), so a skewed application clock cannot change a
//! decision; only the in-memory store uses an injected [`IdempotencyClock`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::error::IdempotencyStoreError;

mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod rows;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use memory::MemoryIdempotencyStore;
#[cfg(feature = "postgres")]
pub use postgres::PostgresIdempotencyStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sql::{Dialect, MIGRATIONS_TABLE, SqlIdempotencyStore, Statements};
#[cfg(feature = "sqlite")]
pub use sqlite::{MIN_SQLITE_VERSION, SqliteIdempotencyStore};

/// The table every SQL backend uses (separate from the job store's tables).
pub const TABLE: &str = "idempotency_keys";

/// The recovery point of a freshly claimed record.
pub const RECOVERY_POINT_STARTED: &str = "started";

/// The recovery point of a completed record.
pub const RECOVERY_POINT_FINISHED: &str = "finished";

/// The boxed future every store operation returns (keeps the trait object-safe).
pub type StoreFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, IdempotencyStoreError>> + Send + 'a>>;

/// The id of one stored record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId(pub i64);

/// The fencing token of one claim: a write carrying an old token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockToken(pub Uuid);

impl LockToken {
    /// A fresh random token.
    #[must_use]
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
}

impl Default for LockToken {
    fn default() -> Self {
        Self::new()
    }
}

/// Everything a claim needs.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The tenant or principal the key belongs to.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// The request method (kept for operators; the fingerprint decides).
    pub method: String,
    /// The concrete request path (kept for operators; the fingerprint decides).
    pub path: String,
    /// The request fingerprint.
    pub fingerprint: [u8; 32],
    /// The token of this claim.
    pub token: LockToken,
    /// How long the claim holds the key without a heartbeat.
    pub lease: Duration,
    /// How long a record lives after its creation.
    pub retention: Duration,
    /// Whether an abandoned record (lease expired without a release) may be taken over.
    pub take_over_abandoned: bool,
}

/// A claim that succeeded: the caller now holds the key and runs the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The record.
    pub id: RecordId,
    /// Where the previous run got to (`started` for a new record).
    pub recovery_point: String,
    /// How many runs the record has had, this one included.
    pub attempts: u32,
    /// Whether this claim took over an existing record (after a release or an abandonment).
    pub resumed: bool,
}

/// The result of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The caller holds the key.
    Acquired(Acquired),
    /// The key was used for a request with another fingerprint.
    Mismatch,
    /// The key completed; here is its response.
    Completed(StoredResponse),
    /// Another holder's lease is live.
    InProgress,
    /// The last holder vanished without finishing; explicit recovery is required.
    Abandoned,
}

/// A stored response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// The allowlisted headers, in order (name lowercase, raw value bytes).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body bytes (empty when `replay_unavailable`).
    pub body: Vec<u8>,
    /// The body was over the size limit and was not kept.
    pub replay_unavailable: bool,
}

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// Claimed, released or abandoned; no response stored.
    InProgress,
    /// A response is stored.
    Completed,
}

/// What an operator sees of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    /// The record.
    pub id: RecordId,
    /// Its state.
    pub state: RecordState,
    /// The method of the first request.
    pub method: String,
    /// The path of the first request.
    pub path: String,
    /// Where the handler got to.
    pub recovery_point: String,
    /// Runs so far.
    pub attempts: u32,
    /// A holder's lease is live now.
    pub locked: bool,
    /// A holder's token is set (live, or abandoned when not `locked`).
    pub held: bool,
    /// The stored status, when completed.
    pub response_status: Option<u16>,
}

impl RecordInfo {
    /// In progress with a token but no live lease: the holder vanished.
    #[must_use]
    pub fn is_abandoned(&self) -> bool {
        self.state == RecordState::InProgress && self.held && !self.locked
    }
}

/// Which records [`IdempotencyStore::list`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListFilter {
    /// Every record.
    #[default]
    All,
    /// Records without a stored response (running, released or abandoned).
    InProgress,
    /// Abandoned records ([`RecordInfo::is_abandoned`]): in progress and held by a token
    /// whose lease ran out, because the holder vanished between its claim and storing the
    /// response (a crash, a kill). They answer 409 `recovery-required` in
    /// [`RecoveryMode::Explicit`](super::RecoveryMode::Explicit) until recovered.
    Stuck,
    /// Records with a stored response.
    Completed,
}

impl ListFilter {
    /// The filter's name: `all`, `in_progress`, `stuck`, `completed`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::InProgress => "in_progress",
            Self::Stuck => "stuck",
            Self::Completed => "completed",
        }
    }

    /// Every filter, in the order of [`ListFilter::as_str`]'s documentation.
    pub const ALL: [ListFilter; 4] = [Self::All, Self::InProgress, Self::Stuck, Self::Completed];
}

impl std::str::FromStr for ListFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not one of all, in_progress, stuck, completed"))
    }
}

/// The most records one [`IdempotencyStore::list`] call returns.
pub const MAX_LIST: u32 = 1000;

/// One page of [`IdempotencyStore::list`]: records by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListRequest {
    /// Which records.
    pub filter: ListFilter,
    /// Only this scope (`None`: every scope).
    pub scope: Option<String>,
    /// Only records with a larger id (the last id of the previous page).
    pub after: Option<RecordId>,
    /// At most this many (1 to [`MAX_LIST`]; 0 counts as 1, more as [`MAX_LIST`]).
    pub limit: u32,
}

impl ListRequest {
    /// The limit as applied.
    #[must_use]
    pub fn effective_limit(&self) -> u32 {
        self.limit.clamp(1, MAX_LIST)
    }
}

/// A record as listed for operators: its scope and key with what [`RecordInfo`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRecord {
    /// The scope the key belongs to.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// The record.
    pub info: RecordInfo,
    /// When the first request claimed it.
    pub created_at: SystemTime,
    /// When its last run started (the first request, or the last take-over).
    pub last_run_at: SystemTime,
}

/// The explicit recovery of an in-progress record whose lease is not live.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recovery {
    /// Let the next request with the key run again (it sees the stored recovery point).
    Release,
    /// Store this response as the outcome (e.g. after reconciling with the PSP).
    Complete(StoredResponse),
    /// Forget the record; the next request runs as new.
    Delete,
}

/// What one reaper pass did and saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Completed records past their expiry that were deleted.
    pub deleted: u64,
    /// In-progress records past their expiry (never deleted: they need a human).
    pub expired_in_progress: u64,
    /// In-progress records whose holder vanished (token set, lease expired).
    pub abandoned: u64,
}

/// Storage for idempotency records. Object-safe; use it as `Arc<dyn IdempotencyStore>`.
///
/// Implementations: [`MemoryIdempotencyStore`], [`SqliteIdempotencyStore`], [`PostgresIdempotencyStore`]. All pass the same
/// suite (`tests/idempotency.rs`).
pub trait IdempotencyStore: Send + Sync + fmt::Debug + 'static {
    /// Creates the table and indexes when missing (idempotent).
    fn ensure_schema(&self) -> StoreFuture<'_, ()>;

    /// Atomically claims `(scope, key)`, or says why not. An expired completed record counts
    /// as never seen and is replaced.
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome>;

    /// Extends the lease to now + `lease`; `false` when `token` no longer holds the record.
    fn heartbeat(&self, id: RecordId, token: LockToken, lease: Duration) -> StoreFuture<'_, bool>;

    /// Moves the recovery point (fenced); `false` when `token` no longer holds the record.
    fn advance<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        recovery_point: &'a str,
    ) -> StoreFuture<'a, bool>;

    /// Stores the response and completes the record (fenced); `false` when `token` no longer
    /// holds it (someone took over: their result wins).
    fn finalise<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        response: &'a StoredResponse,
    ) -> StoreFuture<'a, bool>;

    /// Gives the key up without a response (fenced), keeping the recovery point.
    fn release(&self, id: RecordId, token: LockToken) -> StoreFuture<'_, bool>;

    /// Deletes a held record that has no response (fenced): the key is free again for any
    /// request, as if never used (after a 400, a malformed request that had no effect). The
    /// default only [`release`](Self::release)s it, keeping the fingerprint.
    fn forget(&self, id: RecordId, token: LockToken) -> StoreFuture<'_, bool> {
        self.release(id, token)
    }

    /// The record of `(scope, key)`, if any.
    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> StoreFuture<'a, Option<RecordInfo>>;

    /// Applies an explicit recovery to an in-progress record whose lease is not live;
    /// `false` when there is no such record.
    fn recover<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        action: &'a Recovery,
    ) -> StoreFuture<'a, bool>;

    /// Deletes up to `batch` completed records past their expiry and counts stuck ones.
    fn reap(&self, batch: u32) -> StoreFuture<'_, ReapReport>;

    /// A page of records by id, for operators (`redrive idempotency list`, and the stuck
    /// ones to [`recover`](Self::recover)).
    fn list<'a>(&'a self, request: &'a ListRequest) -> StoreFuture<'a, Vec<ListedRecord>>;
}

/// What [`release_stuck`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// Released (or already without a holder): the next request with the key runs again.
    /// The record as it is now.
    Released(RecordInfo),
    /// No record has this key.
    NotFound,
    /// A response is stored: nothing to recover (a repeat gets the replay).
    Completed,
    /// A holder's lease is live: the first request is still running.
    Running,
}

/// The operator's recovery of a stuck key (`redrive idempotency recover`): releases the record
/// of `(scope, key)` unless it completed or its holder's lease is live, so that the next
/// request with the key runs again (it sees the stored recovery point). Only for routes whose
/// handler may run twice (the job store's enqueue, idempotent by job key) or after the first
/// run's effect was reconciled.
///
/// # Errors
/// The store's.
pub async fn release_stuck(
    store: &dyn IdempotencyStore,
    scope: &str,
    key: &str,
) -> Result<ReleaseOutcome, IdempotencyStoreError> {
    let judge = |info: Option<RecordInfo>| match info {
        None => Err(ReleaseOutcome::NotFound),
        Some(i) if i.state == RecordState::Completed => Err(ReleaseOutcome::Completed),
        Some(i) if i.locked => Err(ReleaseOutcome::Running),
        Some(i) => Ok(i),
    };
    if let Err(outcome) = judge(store.get(scope, key).await?) {
        return Ok(outcome);
    }
    let released = store.recover(scope, key, &Recovery::Release).await?;
    // Read again: what the record is now (or, if another request took it meanwhile, why not).
    match judge(store.get(scope, key).await?) {
        Ok(info) if released => Ok(ReleaseOutcome::Released(info)),
        Ok(_) => Ok(ReleaseOutcome::Running),
        Err(outcome) => Ok(outcome),
    }
}

/// Wall-clock time for the in-memory store (the SQL stores use the database clock).
pub trait IdempotencyClock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemIdempotencyClock;

impl IdempotencyClock for SystemIdempotencyClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug, Clone)]
pub struct ManualIdempotencyClock(Arc<Mutex<SystemTime>>);

impl ManualIdempotencyClock {
    /// A clock showing `start`.
    #[must_use]
    pub fn new(start: SystemTime) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *now += by;
    }
}

impl IdempotencyClock for ManualIdempotencyClock {
    fn now(&self) -> SystemTime {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
