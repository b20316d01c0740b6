//! The service's errors: [`ServiceError`] for starting and running the server, [`ApiError`] for
//! one request, rendered as an RFC 9457 `application/problem+json` document.
//!
//! A problem names the bad input in two extension members, `field` and `value`, so a client (or
//! the person at 3 a.m.) sees at once what to change. 5xx bodies say little; the log says all.

use std::net::SocketAddr;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use redrive_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The base of the `type` URIs of the service's problems; the slug is appended.
pub const PROBLEM_BASE: &str = "https://redrive.invalid/problems/";

/// What can stop the service from starting or running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The listen address is not loopback and no token is configured.
    #[error(
        "refusing to listen on {addr} without a token: set --token or REDRIVE_API_TOKEN, or listen on 127.0.0.1"
    )]
    TokenRequired {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The listen address is not loopback and the token is shorter than
    /// [`MIN_PUBLIC_TOKEN_CHARS`](crate::MIN_PUBLIC_TOKEN_CHARS).
    #[error(
        "refusing to listen on {addr} with a token of {chars} characters: beyond loopback the token needs at least {min} (e.g. `openssl rand -hex 32` in a --token-file)"
    )]
    TokenTooShort {
        /// The address asked for.
        addr: SocketAddr,
        /// The token's length in characters.
        chars: usize,
        /// The least accepted.
        min: usize,
    },
    /// Beyond loopback, a token made of fewer than
    /// [`MIN_PUBLIC_TOKEN_DISTINCT`](crate::MIN_PUBLIC_TOKEN_DISTINCT) distinct characters.
    #[error(
        "refusing to listen on {addr} with a token of {distinct} distinct characters: beyond loopback the token needs at least {min} (a random one, e.g. `openssl rand -hex 32` in a --token-file)"
    )]
    TokenTooSimple {
        /// The address asked for.
        addr: SocketAddr,
        /// The token's distinct characters.
        distinct: usize,
        /// The least accepted.
        min: usize,
    },
    /// A `--public-host` value is not a host with an optional port.
    #[error("--public-host: {value:?}: {reason}")]
    InvalidPublicHost {
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A connection limit, timeout or the session time to live is zero.
    #[error("{name} must be more than zero")]
    InvalidLimit {
        /// The setting.
        name: &'static str,
    },
    /// The token is empty or not visible ASCII.
    #[error("invalid token: {reason}")]
    InvalidToken {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving HTTP")]
    Serve(#[source] std::io::Error),
    /// The idempotency table could not be prepared.
    #[error("preparing the idempotency store")]
    Idempotency(#[source] redrive_idempotency::IdempotencyStoreError),
    /// The idempotency layer's settings were refused.
    #[error("configuring the idempotency layer")]
    IdempotencyConfig(#[source] redrive_idempotency::ConfigError),
}

/// An RFC 9457 problem document, as sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ProblemBody {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary of the kind.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong this time.
    pub detail: String,
    /// The request field that is wrong, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The value given for it (cut to 200 characters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// One request's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// The problem slug (last segment of `type`).
    pub slug: &'static str,
    /// The title.
    pub title: &'static str,
    /// The detail.
    pub detail: String,
    /// The bad field.
    pub field: Option<String>,
    /// Its value.
    pub value: Option<String>,
    /// Whether to send `WWW-Authenticate: Bearer`.
    pub challenge: bool,
}

fn cut(v: &str) -> String {
    v.chars().take(200).collect()
}

impl ApiError {
    /// A problem of status `status`.
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            field: None,
            value: None,
            challenge: false,
        }
    }

    /// 400: a field of the request is malformed (bad JSON type, unknown state, bad duration).
    pub fn bad_field(field: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            value: Some(cut(value)),
            ..Self::new(
                StatusCode::BAD_REQUEST,
                "invalid-field",
                "A field of the request is invalid",
                detail,
            )
        }
    }

    /// 422: the request is well-formed but a value is out of range or refused.
    pub fn unprocessable(field: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            value: Some(cut(value)),
            ..Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unprocessable-field",
                "A value of the request is not acceptable",
                detail,
            )
        }
    }

    /// 401 with a Bearer challenge.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self {
            challenge: true,
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Authentication required",
                detail,
            )
        }
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    /// 503: the store could not be used; the detail stays vague, the log has the cause.
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "The job store is unavailable",
            "the job store could not be reached; try again later",
        )
    }

    /// The JSON body.
    pub fn body(&self) -> ProblemBody {
        ProblemBody {
            kind: format!("{PROBLEM_BASE}{}", self.slug),
            title: self.title.to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            field: self.field.clone(),
            value: self.value.clone(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match &e {
            StoreError::Invalid { field, value, .. } => {
                ApiError::unprocessable(*field, value, e.to_string())
            }
            StoreError::JobNotFound { id } => {
                let mut p = ApiError::not_found(e.to_string());
                p.field = Some("id".into());
                p.value = Some(id.to_string());
                p
            }
            StoreError::WrongState { id, .. } => {
                let mut p = ApiError::new(
                    StatusCode::CONFLICT,
                    "wrong-state",
                    "The job is not in a state that allows this",
                    e.to_string(),
                );
                p.field = Some("id".into());
                p.value = Some(id.to_string());
                p
            }
            _ => {
                tracing::error!(error = %e, "store failure");
                ApiError::unavailable()
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut res = (self.status, body).into_response();
        res.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if self.challenge {
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"redrive\""),
            );
        }
        res
    }
}
