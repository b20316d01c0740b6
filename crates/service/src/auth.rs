//! Bearer-token authentication for `/v1` and `/metrics`, and the dashboard's session cookie.
//!
//! The token is compared as a SHA-256 digest with [`subtle::ConstantTimeEq`], so neither its
//! content nor its length leaks through timing. A session cookie is a random id looked up by
//! its digest in [`Sessions`](crate::session) (expiring, revoked on logout), never derived
//! from the token.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, ServiceError};
use crate::state::AppState;

/// The dashboard's session cookie.
pub const SESSION_COOKIE: &str = "redrive_session";

/// The least number of characters of a token when serving beyond loopback.
pub const MIN_PUBLIC_TOKEN_CHARS: usize = 16;

/// A configured token, kept only as a digest.
pub(crate) struct Token {
    digest: [u8; 32],
}

fn sha(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

impl Token {
    pub(crate) fn new(token: &str) -> Result<Self, ServiceError> {
        if token.is_empty() {
            return Err(ServiceError::InvalidToken {
                reason: "it is empty",
            });
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ServiceError::InvalidToken {
                reason: "use visible ASCII characters only (no spaces)",
            });
        }
        Ok(Self {
            digest: sha(&[token.as_bytes()]),
        })
    }

    /// Whether `given` is the token (constant time).
    pub(crate) fn matches(&self, given: &str) -> bool {
        bool::from(sha(&[given.as_bytes()]).ct_eq(&self.digest))
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// The cookie's value, if the request carries it.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Middleware for `/v1`: with a token configured, `Authorization: Bearer <token>` is required;
/// otherwise 401 problem+json with `WWW-Authenticate: Bearer`.
pub(crate) async fn require_bearer(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = &state.inner.token else {
        return next.run(req).await;
    };
    match bearer(req.headers()) {
        None => ApiError::unauthorized("send Authorization: Bearer <token>").into_response(),
        Some(given) if token.matches(given) => next.run(req).await,
        Some(_) => ApiError::unauthorized("the bearer token is not valid").into_response(),
    }
}

/// Whether a dashboard request is signed in: the bearer token or a live session (no token
/// configured: always).
pub(crate) fn dashboard_allowed(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(token) = &state.inner.token else {
        return true;
    };
    if let Some(given) = bearer(headers)
        && token.matches(given)
    {
        return true;
    }
    cookie(headers, SESSION_COOKIE).is_some_and(|c| state.inner.sessions.valid(c))
}

/// Route layer of `/metrics`: with a token (and without `--metrics-public`) the bearer token
/// or a dashboard session is required; 401 problem+json otherwise.
pub(crate) async fn require_metrics_auth(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if state.inner.metrics_public || dashboard_allowed(&state, req.headers()) {
        return next.run(req).await;
    }
    let detail = if bearer(req.headers()).is_some() {
        "the bearer token is not valid"
    } else {
        "send Authorization: Bearer <token> (or serve with --metrics-public)"
    };
    ApiError::unauthorized(detail).into_response()
}

/// Middleware for the dashboard: signed-out requests are sent to the login form.
pub(crate) async fn require_session(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if dashboard_allowed(&state, req.headers()) {
        return next.run(req).await;
    }
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let next_q: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("next", &target)
        .finish();
    Redirect::to(&format!("/login?{next_q}")).into_response()
}

/// CSRF check for a dashboard POST: the `Origin` (or else `Referer`) must name this host.
pub(crate) fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let refuse = |detail: String| {
        Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "cross-origin",
            "Cross-origin form posts are refused",
            detail,
        ))
    };
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return refuse("the request has no Host header".into());
    };
    let source = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|v| v.to_str().ok());
    let Some(source) = source else {
        return refuse("the form post carries neither Origin nor Referer".into());
    };
    let authority = source
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""));
    if authority.is_some_and(|a| a.eq_ignore_ascii_case(host)) {
        Ok(())
    } else {
        refuse(format!("origin {source:?} is not this host ({host})"))
    }
}
