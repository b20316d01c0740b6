//! Bearer-token authentication for `/v1` and `/metrics`, and the dashboard's session cookie.
//!
//! The token is compared as a SHA-256 digest with [`subtle::ConstantTimeEq`], so neither its
//! content nor its length leaks through timing. Wrong bearer tokens are counted per client
//! address: beyond [`BEARER_FAILURES_PER_MINUTE`](crate::session::BEARER_FAILURES_PER_MINUTE)
//! in a minute, a request with a bearer token from that address gets 429 problem+json with
//! `Retry-After`, and its token is not compared at all. A session cookie is a random id looked up by
//! its digest in [`Sessions`](crate::session) (expiring, revoked on logout), never derived
//! from the token.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
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

/// The least number of distinct characters of a token when serving beyond loopback: sixteen
/// of one repeated letter is long and guessable (a random hex token of 16 has about 10).
pub const MIN_PUBLIC_TOKEN_DISTINCT: usize = 6;

/// A configured token, kept only as a digest, with its label and role.
pub(crate) struct Token {
    digest: [u8; 32],
    identity: Identity,
}

/// Who a request is: the label of the token it carried (or of the session signed in with
/// it), and whether that token may only read. Put in the request's extensions by the auth
/// middlewares; the audit trail names the label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) label: String,
    pub(crate) read_only: bool,
}

impl Identity {
    /// Without any token: everyone may do everything, as `anonymous`.
    pub(crate) fn anonymous() -> Self {
        Self {
            label: "anonymous".into(),
            read_only: false,
        }
    }
}

/// Every configured token (at least one).
pub(crate) struct Tokens(Vec<Token>);

impl Tokens {
    /// The tokens; `None` when there is none (the service is open).
    pub(crate) fn new(tokens: Vec<Token>) -> Option<Self> {
        (!tokens.is_empty()).then_some(Self(tokens))
    }

    /// The identity of the token `given` is, if any. Every token is compared, each in
    /// constant time, so the time taken says nothing about which matched.
    pub(crate) fn find(&self, given: &str) -> Option<&Identity> {
        let d = sha(&[given.as_bytes()]);
        let mut found = None;
        for t in &self.0 {
            if bool::from(d.ct_eq(&t.digest)) && found.is_none() {
                found = Some(&t.identity);
            }
        }
        found
    }
}

fn sha(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

impl Token {
    /// A token with its label and role.
    pub(crate) fn labelled(
        label: &str,
        token: &str,
        read_only: bool,
    ) -> Result<Self, ServiceError> {
        let mut t = Self::new(token)?;
        t.identity = Identity {
            label: label.to_owned(),
            read_only,
        };
        Ok(t)
    }

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
            identity: Identity {
                label: crate::state::PLAIN_TOKEN_LABEL.into(),
                read_only: false,
            },
        })
    }
}

fn is_read(method: &axum::http::Method) -> bool {
    matches!(
        *method,
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    )
}

fn read_only_refusal(label: &str) -> Response {
    ApiError::new(
        axum::http::StatusCode::FORBIDDEN,
        "read-only-token",
        "This token may only read",
        format!("the token {label:?} is read-only: only GET requests are allowed"),
    )
    .into_response()
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

/// The peer's address, from the connection ([`ConnectInfo`]).
pub(crate) fn peer_ip(req: &Request) -> Option<IpAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip())
}

/// What a request's bearer token says.
enum Bearer {
    /// No `Authorization: Bearer` header.
    Absent,
    /// A configured token.
    Valid(Identity),
    /// A wrong token (counted against the client).
    Wrong,
    /// The client is over its wrong tokens: not compared; try again after this.
    Throttled(Duration),
}

/// Checks the bearer token of a request from `ip` against `tokens`, throttled per client.
fn check_bearer(state: &AppState, tokens: &Tokens, ip: Option<IpAddr>, h: &HeaderMap) -> Bearer {
    let Some(given) = bearer(h) else {
        return Bearer::Absent;
    };
    if let Err(wait) = state.inner.bearers.check(ip) {
        return Bearer::Throttled(wait);
    }
    match tokens.find(given) {
        Some(id) => Bearer::Valid(id.clone()),
        None => {
            state.inner.bearers.failed(ip);
            tracing::warn!(client = ?ip, "wrong bearer token");
            Bearer::Wrong
        }
    }
}

/// 429 problem+json with `Retry-After` for a client over its wrong bearer tokens.
pub(crate) fn too_many_bearers(state: &AppState, retry_after: Duration) -> Response {
    let secs = retry_after.as_secs().max(1);
    let mut res = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-bad-tokens",
        "Too many wrong bearer tokens",
        format!(
            "more than {} wrong bearer tokens in a minute from this address; its requests \
             are refused without checking the token; try again in {secs} s",
            state.inner.bearers.limit()
        ),
    )
    .into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    res
}

/// Middleware for `/v1`: with a token configured, `Authorization: Bearer <token>` is required;
/// otherwise 401 problem+json with `WWW-Authenticate: Bearer`.
/// A read-only token gets 403 problem+json on anything but a read; a client over its wrong
/// tokens gets 429.
pub(crate) async fn require_bearer(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(tokens) = &state.inner.token else {
        req.extensions_mut().insert(Identity::anonymous());
        return next.run(req).await;
    };
    let identity = match check_bearer(&state, tokens, peer_ip(&req), req.headers()) {
        Bearer::Absent => {
            return ApiError::unauthorized("send Authorization: Bearer <token>").into_response();
        }
        Bearer::Valid(id) => id,
        Bearer::Wrong => {
            return ApiError::unauthorized("the bearer token is not valid").into_response();
        }
        Bearer::Throttled(wait) => return too_many_bearers(&state, wait),
    };
    if identity.read_only && !is_read(req.method()) {
        return read_only_refusal(&identity.label);
    }
    req.extensions_mut().insert(identity);
    next.run(req).await
}

/// Who a dashboard request is: the bearer token's identity or the session's (no token
/// configured: [`Identity::anonymous`]); `Ok(None)` when signed out (or with a wrong bearer
/// token), `Err(retry_after)` when the client is over its wrong bearer tokens.
pub(crate) fn dashboard_identity(
    state: &AppState,
    ip: Option<IpAddr>,
    headers: &HeaderMap,
) -> Result<Option<Identity>, Duration> {
    let Some(tokens) = &state.inner.token else {
        return Ok(Some(Identity::anonymous()));
    };
    match check_bearer(state, tokens, ip, headers) {
        Bearer::Valid(id) => return Ok(Some(id)),
        Bearer::Throttled(wait) => return Err(wait),
        Bearer::Absent | Bearer::Wrong => {}
    }
    Ok(cookie(headers, SESSION_COOKIE).and_then(|c| state.inner.sessions.get(c)))
}

/// Route layer of `/metrics`: with a token (and without `--metrics-public`) the bearer token
/// or a dashboard session is required; 401 problem+json otherwise (429 for a client over its
/// wrong bearer tokens).
pub(crate) async fn require_metrics_auth(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if state.inner.metrics_public {
        return next.run(req).await;
    }
    match dashboard_identity(&state, peer_ip(&req), req.headers()) {
        Ok(Some(_)) => return next.run(req).await,
        Err(wait) => return too_many_bearers(&state, wait),
        Ok(None) => {}
    }
    let detail = if bearer(req.headers()).is_some() {
        "the bearer token is not valid"
    } else {
        "send Authorization: Bearer <token> (or serve with --metrics-public)"
    };
    ApiError::unauthorized(detail).into_response()
}

/// Middleware for the dashboard: signed-out requests are sent to the login form; a
/// read-only session's form posts (but signing out) get 403.
pub(crate) async fn require_session(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let identity = match dashboard_identity(&state, peer_ip(&req), req.headers()) {
        Ok(found) => found,
        Err(wait) => return too_many_bearers(&state, wait),
    };
    if let Some(identity) = identity {
        if identity.read_only && !is_read(req.method()) && req.uri().path() != "/logout" {
            return read_only_refusal(&identity.label);
        }
        req.extensions_mut().insert(identity);
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
