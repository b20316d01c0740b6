//! Server-side idempotency for axum: a tower layer that stores each
//! `Idempotency-Key` with a fingerprint of its request and the first response, and replays
//! that response for a repeat instead of running the handler again.
//!
//! # Why a claim, a lease and explicit recovery
//! A payment handler makes a side effect (a PSP charge) that cannot be undone. The layer
//! therefore claims `(scope, key)` atomically *before* the handler runs
//! (`INSERT … ON CONFLICT DO NOTHING`): of fifty simultaneous first requests exactly one runs,
//! the others get 409 or, later, the replay — never a 5xx. The claim is a lease with a fencing
//! token, extended by a heartbeat while the handler runs; the response is stored only if the
//! token still holds. A 5xx or a panic means "nothing happened that cannot be repeated", so
//! the key is released and a retry runs again. A holder that vanishes (the process is killed
//! between the charge and storing the response) leaves an in-progress record whose lease runs
//! out; by default ([`RecoveryMode::Explicit`]) a repeat then gets 409 `recovery-required`
//! and is **not** run, because a second run could charge twice. Recovery is an explicit call
//! ([`IdempotencyStore::recover`]) after reconciling with the PSP, or, for handlers built to
//! resume from their recovery point with deterministic downstream keys (or whose handler is
//! idempotent anyway, as the job store's enqueue is by job key), [`RecoveryMode::Resume`].
//! [`IdempotencyStore::list`] with [`ListFilter::Stuck`] finds abandoned records, and
//! [`release_stuck`] releases one so that its next request runs again.
//!
//! # Behaviour
//! | situation | answer |
//! |---|---|
//! | key missing on a required route | 400 `key-missing` (+ `Link rel=describedby` if configured) |
//! | key malformed / > 255 bytes / two fields | 400 `key-invalid` |
//! | same key, different method/path/query/content type/body | 422 `key-reused` |
//! | same key while the first runs | 409 `request-in-progress` + `Retry-After` |
//! | same key, first run vanished | 409 `recovery-required` |
//! | body over `max_request_bytes` | 413 `request-too-large` |
//! | store unreachable | 503 `store-unavailable` + `Retry-After` (handler not run) |
//! | completed key | stored status, allowlisted headers, body + `Idempotent-Replayed: true` |
//! | stored body was over `max_response_bytes` | 409 `replay-unavailable` (+ link to `Location`) |
//!
//! Errors are `application/problem+json` ([`Problem`]). Handler 2xx/3xx/4xx are stored; 5xx
//! and panics release the key. Records live for the retention (24 h by default), then a
//! repeat runs as new; [`reap_expired`]/[`spawn_reaper`] delete them.
//!
//! Put the layer inside authentication and rate limiting, so 401/403/429 never reach the
//! store, and give it the authenticated principal as its [`Scope`].
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use axum::{Router, routing::post, http::StatusCode};
//! use redrive_idempotency::{IdempotencyLayer, IdempotencyStore, MemoryIdempotencyStore};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // SqliteIdempotencyStore::connect("sqlite://idem.db") or PostgresIdempotencyStore::from_pool(pool) in production.
//! let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryIdempotencyStore::new());
//! store.ensure_schema().await?;
//! let layer = IdempotencyLayer::builder(store)
//!     .with_docs_url("https://example.com/docs/idempotency")
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/v1/charges", post(|| async { (StatusCode::CREATED, "charged") }))
//!     .layer(layer);
//! # let _ = app;
//! # Ok(())
//! # }
//! ```

mod config;
mod error;
mod fingerprint;
mod key;
mod layer;
mod reaper;
mod store;

pub use config::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_IN_PROGRESS_RETRY_AFTER, DEFAULT_LEASE,
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_REPLAYED_HEADERS,
    DEFAULT_RETENTION, DEFAULT_UNAVAILABLE_RETRY_AFTER, IdempotencyConfig, IdempotencyLayerBuilder,
    IdempotencyScope, MIN_LEASE, RecoveryMode, Scope, ScopeFn,
};
pub use error::{
    ConfigError, CtxError, DEFAULT_PROBLEM_BASE, IdempotencyStoreError, PROBLEM_JSON, Problem,
    ProblemKind,
};
pub use fingerprint::{Fingerprint, FingerprintFn};
pub use key::{
    IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyKey, KeyError, MAX_KEY_BYTES, parse_key,
};
pub use layer::{IdempotencyCtx, IdempotencyLayer, IdempotencyService};
pub use reaper::{DEFAULT_REAP_BATCH, DEFAULT_REAP_INTERVAL, reap_expired, spawn_reaper};
#[cfg(feature = "postgres")]
pub use store::PostgresIdempotencyStore;
pub use store::{
    Acquired, ClaimOutcome, ClaimRequest, IdempotencyClock, IdempotencyStore, ListFilter,
    ListRequest, ListedRecord, LockToken, MAX_LIST, ManualIdempotencyClock, MemoryIdempotencyStore,
    RECOVERY_POINT_FINISHED, RECOVERY_POINT_STARTED, ReapReport, RecordId, RecordInfo, RecordState,
    Recovery, ReleaseOutcome, StoreFuture, StoredResponse, SystemIdempotencyClock, TABLE,
    release_stuck,
};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use store::{Dialect, MIGRATIONS_TABLE, SqlIdempotencyStore, Statements};
#[cfg(feature = "sqlite")]
pub use store::{MIN_SQLITE_VERSION, SqliteIdempotencyStore};
