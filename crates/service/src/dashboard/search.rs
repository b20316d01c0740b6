//! `/search`: a job id, an idempotency key or a dependency.

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use maud::html;
use redrive_store::{Job, JobId};

use super::format::{relative, state_badge};
use super::jobs::job_row;
use super::layout::{Page, html_response, layout};
use crate::error::ApiError;
use crate::state::AppState;

/// The search box: a job id, an idempotency key or a dependency. One job found (and no
/// dependency) goes straight to that job; otherwise a page lists what matched.
pub(super) async fn search(
    State(state): State<AppState>,
    RawQuery(q): RawQuery,
) -> Result<Response, Page> {
    let term = form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "q")
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    if term.is_empty() {
        return Err(ApiError::bad_field(
            "q",
            "",
            "type a job id, an idempotency key or a dependency",
        )
        .into());
    }
    let store = &state.inner.store;
    let by_id = match term.parse::<JobId>() {
        Ok(id) => store.get(id).await?,
        Err(_) => None,
    };
    let by_key = store
        .list(&redrive_store::ListParams {
            key: Some(term.clone()),
            limit: Some(100),
            ..Default::default()
        })
        .await?
        .jobs;
    let dependency = store.dependency(&term).await?;
    let jobs: Vec<&Job> = by_id.iter().chain(by_key.iter()).collect();
    if jobs.len() == 1 && dependency.is_none() {
        return Ok(Redirect::to(&format!("/jobs/{}", jobs[0].id)).into_response());
    }
    let now = Utc::now();
    let body = html! {
        p { "Results for " code #search-term { (term) } }
        @if jobs.is_empty() && dependency.is_none() {
            p.muted #no-results { "No job has this id or idempotency key, and no dependency has this name." }
        }
        @if !jobs.is_empty() {
            h2 { "Jobs" }
            table #jobs {
                thead { tr { th { "Id" } th { "Queue" } th { "Kind" } th { "State" } th { "Attempts" } th { "Run at" } th { "Reason / last error" } } }
                tbody { @for j in &jobs { (job_row(j, now)) } }
            }
        }
        @if let Some(d) = &dependency {
            h2 { "Dependency" }
            p #dependency-result { a href="/breakers" { (d.name) } ": breaker " (state_badge(d.flow.state.as_str()))
                @if let Some(t) = d.flow.paused_until { @if t > now { " · paused " (relative(t, now)) } } }
        }
    };
    Ok(html_response(layout("Search", false, body)))
}
