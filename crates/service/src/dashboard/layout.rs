//! The frame of every page, the error page and the headers every HTML answer carries.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::assets::{CSS, JS};
use crate::error::ApiError;

/// A dashboard failure, shown as an HTML page.
pub(super) struct Page(ApiError);

impl From<ApiError> for Page {
    fn from(e: ApiError) -> Self {
        Page(e)
    }
}

impl From<redrive_store::StoreError> for Page {
    fn from(e: redrive_store::StoreError) -> Self {
        Page(e.into())
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let e = self.0;
        let body = layout(
            e.title,
            false,
            html! {
                div.problem {
                    h2 { (e.status.as_u16()) " — " (e.title) }
                    p { (e.detail) }
                    @if let Some(f) = &e.field {
                        p { "Field: " code { (f) } @if let Some(v) = &e.value { " = " code { (v) } } }
                    }
                    p { a href="/" { "Back to the overview" } }
                }
            },
        );
        (e.status, html_response(body)).into_response()
    }
}

pub(super) fn html_response(m: Markup) -> Response {
    let mut res = m.into_string().into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res.headers_mut()
        .insert("x-frame-options", HeaderValue::from_static("DENY"));
    res
}

pub(super) fn layout(title: &str, live: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · redrive" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    a.brand href="/" { "redrive" }
                    a href="/" { "Overview" }
                    a href="/jobs" { "Jobs" }
                    a href="/dead" { "Dead letters" }
                    a href="/breakers" { "Breakers" }
                    a href="/workers" { "Workers" }
                    a href="/audit" { "Audit" }
                    span.spacer {}
                    form #search method="get" action="/search" role="search" {
                        input #search-q type="search" name="q" placeholder="Job id, key or dependency" aria-label="Search by job id, idempotency key or dependency";
                        " " button type="submit" { "Search" }
                    }
                    @if live { button #live-toggle type="button" { "Pause live refresh" } }
                }
                main {
                    h1 { (title) }
                    div #live data-live=(if live { "1" } else { "0" }) { (body) }
                }
                script { (PreEscaped(JS)) }
            }
        }
    }
}
