//! The storage seam of the idempotency layer: one object-safe trait, three backends.
//!
//! Every operation is one short transaction; no transaction is held while a handler runs.
//! Time comparisons (lease, expiry) are made with the database's clock (`now()` in
//! PostgreSQL, `julianday('now')` in SQLite), so a skewed application clock cannot change a
//! decision; only the in-memory store uses an injected [`Clock`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::error::StoreError;

mod memory;
mod postgres;
mod sqlite;

pub use memory::MemoryStore;
pub use postgres::PostgresStore;
pub use sqlite::{MIN_SQLITE_VERSION, SqliteStore};

/// The table every SQL backend uses (separate from the job store's tables).
pub const TABLE: &str = "idempotency_keys";

/// The recovery point of a freshly claimed record.
pub const RECOVERY_POINT_STARTED: &str = "started";

/// The recovery point of a completed record.
pub const RECOVERY_POINT_FINISHED: &str = "finished";

/// The boxed future every store operation returns (keeps the trait object-safe).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

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

/// A time stored as unix milliseconds.
pub(crate) fn from_unix_ms(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// One row of a listing.
pub(crate) type ListRow = (
    i64,         // id
    String,      // scope
    String,      // key
    String,      // state
    String,      // method
    String,      // path
    String,      // recovery_point
    i32,         // attempts
    bool,        // live lease
    bool,        // token set
    Option<i32>, // response_status
    i64,         // created_at, unix ms
    i64,         // last_run_at, unix ms
);

pub(crate) fn listed_from_row(row: ListRow) -> Result<ListedRecord, StoreError> {
    let (id, scope, key, state, method, path, rp, attempts, locked, held, status, created, run) =
        row;
    Ok(ListedRecord {
        scope,
        key,
        info: info_from_row((id, state, method, path, rp, attempts, locked, held, status))?,
        created_at: from_unix_ms(created),
        last_run_at: from_unix_ms(run),
    })
}

/// The `WHERE` condition of a filter, given the SQL of "the lease is live".
pub(crate) fn filter_sql(filter: ListFilter, live: &str) -> String {
    match filter {
        ListFilter::All => "TRUE".to_owned(),
        ListFilter::InProgress => "state = 'in_progress'".to_owned(),
        ListFilter::Completed => "state = 'completed'".to_owned(),
        ListFilter::Stuck => {
            format!("state = 'in_progress' AND lock_token IS NOT NULL AND NOT ({live})")
        }
    }
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
/// Implementations: [`MemoryStore`], [`SqliteStore`], [`PostgresStore`]. All pass the same
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
) -> Result<ReleaseOutcome, StoreError> {
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
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<SystemTime>>);

impl ManualClock {
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

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Milliseconds of a duration, saturating, for SQL parameters.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Headers as JSON text: `[[name, hex-value], ...]`.
pub(crate) fn headers_to_json(headers: &[(String, Vec<u8>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(n, v)| serde_json::json!([n, hex_encode(v)]))
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// The inverse of [`headers_to_json`].
pub(crate) fn headers_from_json(id: i64, text: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        id,
        field: "response_headers",
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    let list = value
        .as_array()
        .ok_or_else(|| corrupt("not a JSON array".into()))?;
    list.iter()
        .map(|pair| {
            let name = pair.get(0).and_then(|n| n.as_str());
            let hex = pair.get(1).and_then(|v| v.as_str());
            match (name, hex) {
                (Some(name), Some(hex)) => Ok((
                    name.to_owned(),
                    hex_decode(hex).ok_or_else(|| corrupt(format!("bad hex for header {name}")))?,
                )),
                _ => Err(corrupt("entry is not [name, value]".into())),
            }
        })
        .collect()
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One decoded row of the "classify the existing record" select.
pub(crate) type ExistingRow = (
    i64,             // id
    Vec<u8>,         // fingerprint
    String,          // state
    String,          // recovery_point
    Option<String>,  // lock_token
    bool,            // live lease
    Option<i32>,     // response_status
    Option<String>,  // response_headers
    Option<Vec<u8>>, // response_body
    bool,            // replay_unavailable
);

/// What to do with an existing record, from its row.
pub(crate) enum Existing {
    Outcome(ClaimOutcome),
    TakeOver(i64),
}

pub(crate) fn classify(row: ExistingRow, request: &ClaimRequest) -> Result<Existing, StoreError> {
    let (id, fingerprint, state, _rp, token, live, status, headers, body, unavailable) = row;
    if fingerprint.as_slice() != request.fingerprint.as_slice() {
        return Ok(Existing::Outcome(ClaimOutcome::Mismatch));
    }
    match state.as_str() {
        "completed" => {
            let status =
                status
                    .and_then(|s| u16::try_from(s).ok())
                    .ok_or_else(|| StoreError::Corrupt {
                        id,
                        field: "response_status",
                        reason: format!("{status:?} is not a status code"),
                    })?;
            let headers = match headers {
                Some(text) => headers_from_json(id, &text)?,
                None => Vec::new(),
            };
            Ok(Existing::Outcome(ClaimOutcome::Completed(StoredResponse {
                status,
                headers,
                body: body.unwrap_or_default(),
                replay_unavailable: unavailable,
            })))
        }
        "in_progress" if live => Ok(Existing::Outcome(ClaimOutcome::InProgress)),
        "in_progress" if token.is_some() && !request.take_over_abandoned => {
            Ok(Existing::Outcome(ClaimOutcome::Abandoned))
        }
        "in_progress" => Ok(Existing::TakeOver(id)),
        other => Err(StoreError::Corrupt {
            id,
            field: "state",
            reason: format!("unknown state {other:?}"),
        }),
    }
}

pub(crate) fn parse_state(id: i64, state: &str) -> Result<RecordState, StoreError> {
    match state {
        "in_progress" => Ok(RecordState::InProgress),
        "completed" => Ok(RecordState::Completed),
        other => Err(StoreError::Corrupt {
            id,
            field: "state",
            reason: format!("unknown state {other:?}"),
        }),
    }
}

/// One row of the operator's `get`.
pub(crate) type InfoRow = (
    i64,
    String,
    String,
    String,
    String,
    i32,
    bool,
    bool,
    Option<i32>,
);

pub(crate) fn info_from_row(row: InfoRow) -> Result<RecordInfo, StoreError> {
    let (id, state, method, path, recovery_point, attempts, locked, held, status) = row;
    Ok(RecordInfo {
        id: RecordId(id),
        state: parse_state(id, &state)?,
        method,
        path,
        recovery_point,
        attempts: attempts_u32(attempts),
        locked,
        held,
        response_status: status.and_then(|s| u16::try_from(s).ok()),
    })
}

pub(crate) fn attempts_u32(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_json() {
        let headers = vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            ("x-bin".to_owned(), vec![0xff, 0x00]),
        ];
        assert_eq!(
            headers_from_json(1, &headers_to_json(&headers)).unwrap(),
            headers
        );
        assert!(headers_from_json(1, "[[\"a\", \"zz\"]]").is_err());
    }
}
