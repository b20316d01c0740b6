//! `/login` and `/logout`: the session cookie of a dashboard with a token.

use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::forms::form_pairs;
use super::layout::{Page, html_response, layout};
use crate::auth::{self, SESSION_COOKIE};
use crate::error::ApiError;
use crate::state::AppState;

/// Where to go after signing in: a path of this site, else `/`. It must start with one `/`
/// (not `//`, which a browser reads as another host) and hold only visible ASCII, no
/// backslash: browsers drop tabs and newlines and read `\` as `/`, so `/<TAB>/evil.com` and
/// `/\evil.com` would leave the site, and CR/LF would split the `Location` header.
pub(crate) fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

pub(super) fn login_page(next: &str, error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        false,
        html! {
            @if let Some(e) = error { div.problem { (e) } }
            form method="post" action="/login" {
                input type="hidden" name="next" value=(next);
                label { "API token " input type="password" name="token" autocomplete="current-password" autofocus; }
                " " button.primary type="submit" { "Sign in" }
            }
            p.muted { "The token is the one given to " code { "redrive serve" } " (REDRIVE_API_TOKEN, --token-file or --token)." }
        },
    )
}

pub(super) async fn login_form(State(state): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let next = form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "next")
        .map(|(_, v)| v.into_owned());
    let next = safe_next(next.as_deref());
    if state.inner.token.is_none() {
        return Redirect::to(&next).into_response();
    }
    html_response(login_page(&next, None))
}

/// 429 problem+json for a client over its failed logins.
pub(super) fn too_many_logins(retry_after: Duration) -> Response {
    let secs = retry_after.as_secs().max(1);
    let mut res = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-logins",
        "Too many failed logins",
        format!(
            "more than {} failed logins in a minute from this address; try again in {secs} s",
            crate::session::LOGIN_FAILURES_PER_MINUTE
        ),
    )
    .into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    res
}

/// The session cookie's attributes (`Secure` with `--cookie-secure`).
pub(super) fn cookie_attributes(state: &AppState) -> &'static str {
    if state.inner.cookie_secure {
        "Path=/; HttpOnly; SameSite=Strict; Secure"
    } else {
        "Path=/; HttpOnly; SameSite=Strict"
    }
}

pub(super) async fn login(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let Some(token) = &state.inner.token else {
        let pairs = form_pairs(body).await?;
        let next = pairs
            .iter()
            .find(|(n, _)| n == "next")
            .map(|(_, v)| v.as_str());
        return Ok(Redirect::to(&safe_next(next)).into_response());
    };
    let ip = peer.map(|Extension(ConnectInfo(a))| a.ip());
    if let Err(wait) = state.inner.logins.check(ip) {
        return Ok(too_many_logins(wait));
    }
    let pairs = form_pairs(body).await?;
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let next = safe_next(get("next"));
    let Some(identity) = get("token").and_then(|t| token.find(t)).cloned() else {
        state.inner.logins.failed(ip);
        tracing::warn!(client = ?ip, "failed dashboard login");
        let mut res = html_response(login_page(&next, Some("That token is not valid.")));
        *res.status_mut() = StatusCode::UNAUTHORIZED;
        return Ok(res);
    };
    let id = state.inner.sessions.create(identity);
    let mut res = Redirect::to(&next).into_response();
    let cookie = format!(
        "{SESSION_COOKIE}={id}; {}; Max-Age={}",
        cookie_attributes(&state),
        state.inner.sessions.ttl().as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(res)
}

pub(super) async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    if let Some(id) = auth::cookie(&headers, SESSION_COOKIE) {
        state.inner.sessions.revoke(id);
    }
    let mut res = Redirect::to("/login").into_response();
    let clear = format!(
        "{SESSION_COOKIE}=; {}; Max-Age=0",
        cookie_attributes(&state)
    );
    if let Ok(v) = HeaderValue::from_str(&clear) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(res)
}
