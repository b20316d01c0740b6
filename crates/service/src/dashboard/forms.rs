//! Reading the dashboard's forms, and the confirm and done pages of bulk actions.

use axum::Extension;
use axum::body::Body;
use axum::response::Response;
use maud::html;
use redrive_store::{Actor, JobFilter, JobId};

use super::layout::{html_response, layout};
use crate::api::{parse_id, read_body};
use crate::auth::Identity;
use crate::error::ApiError;

pub(super) async fn form_pairs(body: Body) -> Result<Vec<(String, String)>, ApiError> {
    let bytes = read_body(body).await?;
    Ok(form_urlencoded::parse(&bytes)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect())
}

/// The audit actor of a dashboard request.
pub(super) fn actor(who: &Option<Extension<Identity>>) -> Actor {
    crate::operator::actor(who.as_ref().map(|e| &e.0), "dashboard")
}

pub(super) struct BulkForm {
    pub(super) ids: Vec<JobId>,
    pub(super) all: bool,
    pub(super) queue: Option<String>,
    pub(super) confirmed: bool,
}

pub(super) fn bulk_form(pairs: &[(String, String)]) -> Result<BulkForm, ApiError> {
    let mut f = BulkForm {
        ids: Vec::new(),
        all: false,
        queue: None,
        confirmed: false,
    };
    for (k, v) in pairs {
        match k.as_str() {
            "ids" => f.ids.push(parse_id(v)?),
            "all" => f.all = v == "1",
            "queue" if !v.is_empty() => f.queue = Some(v.clone()),
            "confirm" => f.confirmed = v == "yes",
            _ => {}
        }
    }
    if !f.all && f.ids.is_empty() {
        return Err(ApiError::bad_field(
            "ids",
            "",
            "tick at least one job, or choose all",
        ));
    }
    Ok(f)
}

pub(super) fn confirm_page(verb: &str, action: &str, f: &BulkForm, count: u64) -> Response {
    let what = if f.all {
        format!(
            "all {count} dead job{}{}",
            if count == 1 { "" } else { "s" },
            f.queue
                .as_ref()
                .map(|q| format!(" of queue {q}"))
                .unwrap_or_default()
        )
    } else {
        format!(
            "{} selected dead job{}",
            f.ids.len(),
            if f.ids.len() == 1 { "" } else { "s" }
        )
    };
    let body = html! {
        div.problem #confirm {
            p { strong { (verb) " " (what) "?" } }
            @if verb == "Purge" { p { "Purged jobs and their attempts are deleted for good." } }
            form method="post" action=(action) {
                input type="hidden" name="confirm" value="yes";
                @if f.all { input type="hidden" name="all" value="1"; }
                @if let Some(q) = &f.queue { input type="hidden" name="queue" value=(q); }
                @for id in &f.ids { input type="hidden" name="ids" value=(id); }
                button #confirm-yes class=(if verb == "Purge" { "danger" } else { "primary" }) type="submit" { "Yes, " (verb.to_lowercase()) " " (what) }
                " "
                a.button href="/dead" { "No, go back" }
            }
        }
    };
    html_response(layout(&format!("{verb} dead jobs"), false, body))
}

pub(super) fn done_page(verb: &str, n: u64) -> Response {
    let body = html! {
        p #done { (verb) " " (n) " dead job" @if n != 1 { "s" } "." }
        p { a href="/dead" { "Back to the dead letters" } " · " a href="/" { "Overview" } }
    };
    html_response(layout(&format!("{verb} done"), false, body))
}

pub(super) fn filter_of(f: &BulkForm) -> JobFilter {
    JobFilter {
        ids: (!f.all).then(|| f.ids.clone()),
        queue: f.queue.clone(),
        ..JobFilter::default()
    }
}
