//! Errors of the idempotency layer, and the RFC 9457 problem documents it answers with.
//!
//! Every refusal of the layer is an `application/problem+json` body with `type`, `title`,
//! `status` and `detail`; the detail names the field (and the offending value or bound), but
//! never echoes the idempotency key itself: the key belongs to the caller.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use axum::response::IntoResponse;

/// The default base of the problem `type` URIs; the slug of each [`ProblemKind`] is appended.
pub const DEFAULT_PROBLEM_BASE: &str = "https://redrive.invalid/problems/idempotency/";

/// The media type of every error body of the layer (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// What went wrong; each kind has its own status code, problem type and title.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The route requires an `Idempotency-Key` header and the request has none (400).
    KeyMissing,
    /// The key is malformed, too long, or sent in more than one field (400).
    KeyInvalid,
    /// The scope (tenant, principal) of the request could not be determined (400).
    ScopeMissing,
    /// The key was already used for a different request (422).
    KeyReused,
    /// The first request with this key is still running (409 + `Retry-After`).
    RequestInProgress,
    /// The first request with this key was interrupted (its holder vanished without storing a
    /// response or releasing the key); it is not re-run automatically (409).
    RecoveryRequired,
    /// The request body is larger than the configured buffer (413).
    RequestTooLarge,
    /// The request body could not be read (400).
    BodyUnreadable,
    /// The idempotency store could not be reached; the handler was not run (503 + `Retry-After`).
    StoreUnavailable,
    /// The stored response was too large to keep, so it cannot be replayed (409).
    ReplayUnavailable,
    /// The layer lost the lease of the key while the handler ran, and stopped the handler (503).
    LeaseLost,
    /// The handler panicked or its response body failed; the key was released (500).
    HandlerFailed,
}

impl ProblemKind {
    /// The last segment of the problem `type` URI, e.g. `key-reused`.
    #[must_use]
    pub const fn slug(self) -> &'static str {
        match self {
            Self::KeyMissing => "key-missing",
            Self::KeyInvalid => "key-invalid",
            Self::ScopeMissing => "scope-missing",
            Self::KeyReused => "key-reused",
            Self::RequestInProgress => "request-in-progress",
            Self::RecoveryRequired => "recovery-required",
            Self::RequestTooLarge => "request-too-large",
            Self::BodyUnreadable => "body-unreadable",
            Self::StoreUnavailable => "store-unavailable",
            Self::ReplayUnavailable => "replay-unavailable",
            Self::LeaseLost => "lease-lost",
            Self::HandlerFailed => "handler-failed",
        }
    }

    /// The HTTP status of this problem.
    #[must_use]
    pub const fn status(self) -> StatusCode {
        match self {
            Self::KeyMissing | Self::KeyInvalid | Self::ScopeMissing | Self::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::RequestInProgress | Self::RecoveryRequired | Self::ReplayUnavailable => {
                StatusCode::CONFLICT
            }
            Self::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::StoreUnavailable | Self::LeaseLost => StatusCode::SERVICE_UNAVAILABLE,
            Self::HandlerFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The short human title (the IETF draft's wording where it has one).
    #[must_use]
    pub const fn title(self) -> &'static str {
        match self {
            Self::KeyMissing => "Idempotency-Key is missing",
            Self::KeyInvalid => "Idempotency-Key is invalid",
            Self::ScopeMissing => "The idempotency scope of the request is missing",
            Self::KeyReused => "Idempotency-Key is already used",
            Self::RequestInProgress => "A request is outstanding for this Idempotency-Key",
            Self::RecoveryRequired => "The request for this Idempotency-Key needs recovery",
            Self::RequestTooLarge => "The request body is too large",
            Self::BodyUnreadable => "The request body could not be read",
            Self::StoreUnavailable => "The idempotency store is unavailable",
            Self::ReplayUnavailable => "The stored response cannot be replayed",
            Self::LeaseLost => "The idempotency lease was lost",
            Self::HandlerFailed => "The request failed",
        }
    }
}

/// One problem document (RFC 9457), ready to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What went wrong.
    pub kind: ProblemKind,
    /// The explanation for this occurrence, naming the field and the value or bound.
    pub detail: String,
    /// Sent as `Retry-After` (whole seconds, rounded up) when set.
    pub retry_after: Option<Duration>,
    /// Sent as a `Link` header when set (e.g. `<https://…>; rel="describedby"`).
    pub link: Option<String>,
}

impl Problem {
    /// A problem of `kind` with `detail`.
    #[must_use]
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            retry_after: None,
            link: None,
        }
    }

    /// Adds a `Retry-After`.
    #[must_use]
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Adds a `Link` header value.
    #[must_use]
    pub fn with_link(mut self, link: impl Into<String>) -> Self {
        self.link = Some(link.into());
        self
    }

    /// The JSON body, with `type` = `type_base` + the kind's slug.
    #[must_use]
    pub fn body(&self, type_base: &str) -> serde_json::Value {
        serde_json::json!({
            "type": format!("{type_base}{}", self.kind.slug()),
            "title": self.kind.title(),
            "status": self.kind.status().as_u16(),
            "detail": self.detail,
        })
    }

    /// Renders the problem as a response whose `type` URIs start with `type_base`.
    #[must_use]
    pub fn to_response(&self, type_base: &str) -> Response<Body> {
        let body = self.body(type_base).to_string();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = self.kind.status();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(after)),
            );
        }
        if let Some(link) = &self.link
            && let Ok(value) = HeaderValue::from_str(link)
        {
            headers.insert(header::LINK, value);
        }
        response
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
        self.to_response(DEFAULT_PROBLEM_BASE)
    }
}

/// Whole seconds for a `Retry-After` header, rounded up, at least 1.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    secs.max(1)
}

/// A failure of an idempotency store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdempotencyStoreError {
    /// A query failed. The driver's error is in the message, not returned again as a source
    /// (sqlx's messages embed their own causes); a server error is shown by its message and
    /// SQLSTATE, without the line of the server's C source that raised it.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[error("idempotency store operation `{op}` failed: {}", database_text(.error))]
    Database {
        /// The store operation, e.g. `claim`.
        op: &'static str,
        /// The driver's error.
        error: sqlx::Error,
    },
    /// The store refused to work (e.g. a store that was shut down, or an injected fault).
    #[error("idempotency store is unavailable: {reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
    /// A stored record could not be decoded.
    #[error("idempotency record {id} has a corrupt `{field}`: {reason}")]
    Corrupt {
        /// The record id.
        id: i64,
        /// The column.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A PostgreSQL schema name that is not a plain identifier.
    #[error(
        "schema {schema:?} is not a plain identifier (letters, digits and `_`, not starting with a digit, at most 63 bytes)"
    )]
    BadSchema {
        /// The name given.
        schema: String,
    },
    /// The linked SQLite is older than the layer needs (`RETURNING`, upsert).
    #[error("sqlite {found} is too old: the idempotency store needs {required} or newer")]
    SqliteTooOld {
        /// The version found.
        found: String,
        /// The minimum version.
        required: &'static str,
    },
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl IdempotencyStoreError {
    pub(crate) fn db(op: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |error| Self::Database { op, error }
    }
}

/// The text of a driver error: a server error as its message and SQLSTATE (PostgreSQL's
/// `Display` ends with `at line N` of the server's C source, which means nothing to a user).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn database_text(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => match d.code() {
            Some(code) => format!("{} (SQLSTATE {code})", d.message()),
            None => d.message().to_owned(),
        },
        other => other.to_string(),
    }
}

/// An invalid layer configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting is out of its bounds.
    #[error("invalid idempotency setting `{field}`: {reason}")]
    Invalid {
        /// The setting, e.g. `heartbeat_interval`.
        field: &'static str,
        /// The bound it breaks, with the value given.
        reason: String,
    },
}

/// A failure of an [`IdempotencyCtx`](super::IdempotencyCtx) operation inside a handler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CtxError {
    /// The layer no longer holds the key's lease (another holder took over, or the store was
    /// unreachable for a whole lease): the handler must stop before its next side effect.
    #[error("the lease of idempotency record {id} is lost")]
    LeaseLost {
        /// The record id.
        id: i64,
    },
    /// The store failed.
    #[error("idempotency store failed while advancing record {id}")]
    Store {
        /// The record id.
        id: i64,
        /// The store's error.
        #[source]
        source: IdempotencyStoreError,
    },
}
