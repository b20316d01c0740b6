//! The layer's settings and their builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::http::request::Parts;
use axum::http::{HeaderName, Method, header};

use super::error::{ConfigError, DEFAULT_PROBLEM_BASE};
use super::fingerprint::Fingerprint;
use super::layer::IdempotencyLayer;
use super::store::IdempotencyStore;

/// Default lease of a claim without a heartbeat.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default heartbeat interval (a third of the lease).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// Default retention of a record (24 h).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// Default largest request body buffered (1 MiB).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// Default largest response body stored for replay (1 MiB).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Default `Retry-After` of a 409 while the first request runs.
pub const DEFAULT_IN_PROGRESS_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Default `Retry-After` of a 503 when the store is down.
pub const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(5);
/// The shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// Response headers stored and replayed by default; everything else (`Set-Cookie`, `Date`,
/// hop-by-hop headers, `Content-Length`) is dropped.
pub const DEFAULT_REPLAYED_HEADERS: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::LOCATION,
    header::ETAG,
    header::CACHE_CONTROL,
    header::CONTENT_LANGUAGE,
];

/// The request extension that carries the scope when [`Scope::Extension`] is used; the
/// authentication layer (outside the idempotency layer) inserts it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyScope(pub String);

/// A scope function over the request head: `None` refuses the request (400 `scope-missing`).
pub type ScopeFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Where the scope (the tenant or principal that owns the keys) comes from.
#[derive(Clone)]
#[non_exhaustive]
pub enum Scope {
    /// One scope for every request (the default, `"default"`): single-tenant services.
    Constant(Arc<str>),
    /// The value of a request header (e.g. a tenant header set by a trusted proxy).
    Header(HeaderName),
    /// The [`IdempotencyScope`] request extension, set by the authentication layer.
    Extension,
    /// Your own function.
    Custom(Arc<ScopeFn>),
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Constant(s) => f.debug_tuple("Constant").field(s).finish(),
            Self::Header(h) => f.debug_tuple("Header").field(h).finish(),
            Self::Extension => f.write_str("Extension"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl Scope {
    /// The scope of a request, or a description of what is missing.
    pub(crate) fn extract(&self, parts: &Parts) -> Result<String, String> {
        match self {
            Self::Constant(s) => Ok(s.to_string()),
            Self::Header(name) => parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| format!("header `{name}` is missing or not visible ASCII")),
            Self::Extension => parts
                .extensions
                .get::<IdempotencyScope>()
                .map(|s| s.0.clone())
                .ok_or_else(|| "the request carries no authenticated principal".to_owned()),
            Self::Custom(f) => {
                f(parts).ok_or_else(|| "the scope function found no scope".to_owned())
            }
        }
    }
}

/// What happens to a record whose holder vanished (its lease expired while it still held
/// the key: a crash, a kill, a lost connection to the store).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryMode {
    /// The default: a repeat gets 409 `recovery-required` and the handler is **not** run
    /// again, because the first run may have made its side effect. An operator (or a
    /// reconciliation job) calls [`IdempotencyStore::recover`] to release, complete or delete
    /// the record.
    #[default]
    Explicit,
    /// A repeat after the lease takes over and runs the handler again, with
    /// [`IdempotencyCtx::is_resumed`](super::IdempotencyCtx::is_resumed) and the stored
    /// recovery point; only for handlers that resume from their recovery point and use
    /// deterministic downstream keys (case T14 of the layer's test suite).
    Resume,
}

/// The validated settings of an [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyConfig {
    pub(crate) required: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) uuid_keys: bool,
    pub(crate) scope: Scope,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) lease: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) retention: Duration,
    pub(crate) in_progress_retry_after: Duration,
    pub(crate) unavailable_retry_after: Duration,
    pub(crate) store_5xx: bool,
    pub(crate) store_400: bool,
    pub(crate) recovery: RecoveryMode,
    pub(crate) replayed_headers: Vec<HeaderName>,
    pub(crate) problem_base: String,
    pub(crate) docs_url: Option<String>,
}

impl IdempotencyConfig {
    pub(crate) fn defaults() -> Self {
        Self {
            required: true,
            methods: vec![Method::POST, Method::PATCH],
            uuid_keys: false,
            scope: Scope::Constant(Arc::from("default")),
            fingerprint: Fingerprint::Raw,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            lease: DEFAULT_LEASE,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            retention: DEFAULT_RETENTION,
            in_progress_retry_after: DEFAULT_IN_PROGRESS_RETRY_AFTER,
            unavailable_retry_after: DEFAULT_UNAVAILABLE_RETRY_AFTER,
            store_5xx: false,
            store_400: true,
            recovery: RecoveryMode::Explicit,
            replayed_headers: DEFAULT_REPLAYED_HEADERS.to_vec(),
            problem_base: DEFAULT_PROBLEM_BASE.to_owned(),
            docs_url: None,
        }
    }

    /// Whether requests without a key are refused.
    #[must_use]
    pub fn required(&self) -> bool {
        self.required
    }

    /// The lease of a claim.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The retention of a record.
    #[must_use]
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// What happens to abandoned records.
    #[must_use]
    pub fn recovery(&self) -> RecoveryMode {
        self.recovery
    }
}

/// Builds an [`IdempotencyLayer`].
///
/// # Default
/// - key required: yes (`with_required(false)` lets requests without a key pass through)
/// - methods: `POST`, `PATCH` (others pass through untouched)
/// - scope: [`Scope::Constant`] `"default"`
/// - fingerprint: [`Fingerprint::Raw`]
/// - request buffer: [`DEFAULT_MAX_REQUEST_BYTES`] (1 MiB; beyond → 413)
/// - stored response: [`DEFAULT_MAX_RESPONSE_BYTES`] (1 MiB; beyond → not replayable)
/// - lease [`DEFAULT_LEASE`] (30 s), heartbeat [`DEFAULT_HEARTBEAT_INTERVAL`] (10 s)
/// - retention [`DEFAULT_RETENTION`] (24 h)
/// - `Retry-After`: 1 s on 409 in progress, 5 s on 503 store unavailable
/// - 5xx: released, not stored; recovery of abandoned records: [`RecoveryMode::Explicit`]
/// - 400: stored and replayed ([`IdempotencyLayerBuilder::with_store_400`])
/// - replayed headers: [`DEFAULT_REPLAYED_HEADERS`]
/// - problem types: [`DEFAULT_PROBLEM_BASE`] + slug; no docs link
#[derive(Debug, Clone)]
pub struct IdempotencyLayerBuilder {
    store: Arc<dyn IdempotencyStore>,
    config: IdempotencyConfig,
}

impl IdempotencyLayerBuilder {
    /// A builder with the defaults, storing in `store`.
    #[must_use]
    pub fn new(store: Arc<dyn IdempotencyStore>) -> Self {
        Self {
            store,
            config: IdempotencyConfig::defaults(),
        }
    }

    /// Whether a request without a key is refused (400) or passed through untouched.
    #[must_use]
    pub fn with_required(mut self, required: bool) -> Self {
        self.config.required = required;
        self
    }

    /// The methods the layer applies to (others pass through).
    #[must_use]
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Requires keys to be UUIDs.
    #[must_use]
    pub fn with_uuid_keys(mut self) -> Self {
        self.config.uuid_keys = true;
        self
    }

    /// Where the scope comes from.
    #[must_use]
    pub fn with_scope(mut self, scope: Scope) -> Self {
        self.config.scope = scope;
        self
    }

    /// How the request fingerprint is computed.
    #[must_use]
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.config.fingerprint = fingerprint;
        self
    }

    /// The largest request body buffered; larger requests get 413.
    #[must_use]
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.config.max_request_bytes = bytes;
        self
    }

    /// The largest response body stored; a larger one is delivered once and not replayable.
    #[must_use]
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.config.max_response_bytes = bytes;
        self
    }

    /// The lease of a claim (must exceed the heartbeat interval).
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How often a running handler's lease is extended.
    #[must_use]
    pub fn with_heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = interval;
        self
    }

    /// How long a record is kept (the spec recommends at least 24 h; shorter is allowed for
    /// tests and must exceed the lease).
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// The `Retry-After` of a 409 while the first request runs.
    #[must_use]
    pub fn with_in_progress_retry_after(mut self, after: Duration) -> Self {
        self.config.in_progress_retry_after = after;
        self
    }

    /// The `Retry-After` of a 503 when the store is down.
    #[must_use]
    pub fn with_unavailable_retry_after(mut self, after: Duration) -> Self {
        self.config.unavailable_retry_after = after;
        self
    }

    /// Stores and replays 5xx responses too (Stripe v1 parity; off by default).
    #[must_use]
    pub fn with_store_5xx(mut self, store: bool) -> Self {
        self.config.store_5xx = store;
        self
    }

    /// Stores and replays a 400 (on by default). Off: a 400 (a malformed request, which had
    /// no effect) releases the key, so that the corrected request may use it.
    ///
    /// # Default
    /// `true`.
    #[must_use]
    pub fn with_store_400(mut self, store: bool) -> Self {
        self.config.store_400 = store;
        self
    }

    /// What happens to abandoned records.
    #[must_use]
    pub fn with_recovery(mut self, recovery: RecoveryMode) -> Self {
        self.config.recovery = recovery;
        self
    }

    /// Also stores and replays this response header.
    #[must_use]
    pub fn with_replayed_header(mut self, name: HeaderName) -> Self {
        self.config.replayed_headers.push(name);
        self
    }

    /// The base URI of problem `type`s (the slug is appended).
    #[must_use]
    pub fn with_problem_base(mut self, base: impl Into<String>) -> Self {
        self.config.problem_base = base.into();
        self
    }

    /// A documentation URL, sent as `Link: <url>; rel="describedby"` on 400 `key-missing`.
    #[must_use]
    pub fn with_docs_url(mut self, url: impl Into<String>) -> Self {
        self.config.docs_url = Some(url.into());
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting and its bound.
    pub fn build(self) -> Result<IdempotencyLayer, ConfigError> {
        let c = &self.config;
        let invalid = |field, reason: String| Err(ConfigError::Invalid { field, reason });
        if c.lease < MIN_LEASE {
            return invalid(
                "lease",
                format!("{:?} is below the minimum {MIN_LEASE:?}", c.lease),
            );
        }
        if c.heartbeat_interval.is_zero() || c.heartbeat_interval >= c.lease {
            return invalid(
                "heartbeat_interval",
                format!(
                    "{:?} must be above zero and below the lease {:?}",
                    c.heartbeat_interval, c.lease
                ),
            );
        }
        if c.retention <= c.lease {
            return invalid(
                "retention",
                format!("{:?} must exceed the lease {:?}", c.retention, c.lease),
            );
        }
        if c.max_request_bytes == 0 {
            return invalid("max_request_bytes", "0 must be at least 1".to_owned());
        }
        if c.methods.is_empty() {
            return invalid("methods", "the list is empty".to_owned());
        }
        Ok(IdempotencyLayer::from_parts(self.store, self.config))
    }
}
