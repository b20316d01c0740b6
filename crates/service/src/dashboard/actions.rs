//! The operator's POST routes: a job replayed, cancelled or run now; queues and dependencies
//! paused; breakers forced; bulk actions; and the audit page.

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use maud::html;
use redrive_http::redact::redact_text;
use redrive_store::{DependencyOp, JobFilter};

use super::format::when;
use super::forms::{actor, form_pairs};
use super::layout::{Page, html_response, layout};
use crate::api::{parse_id, replay_one};
use crate::auth;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::state::AppState;

pub(super) async fn job_replay(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let id = parse_id(&id)?;
    replay_one(&state.inner.store, id, &actor(&who)).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

pub(super) async fn job_cancel(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let id = parse_id(&id)?;
    crate::api::cancel_one(&state.inner.store, id, &actor(&who)).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

pub(super) async fn job_run_now(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let id = parse_id(&id)?;
    crate::operator::run_now_one(&state, id, &actor(&who)).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

pub(super) async fn queue_pause(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(queue): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    state
        .inner
        .store
        .pause_queue(&queue, &actor(&who), state.now())
        .await?;
    Ok(Redirect::to("/").into_response())
}

pub(super) async fn queue_resume(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(queue): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    state
        .inner
        .store
        .resume_queue(&queue, &actor(&who), state.now())
        .await?;
    Ok(Redirect::to("/").into_response())
}

pub(super) async fn breaker_force(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let pairs = form_pairs(body).await?;
    let mode = pairs
        .iter()
        .find(|(k, _)| k == "mode")
        .map_or("", |(_, v)| v.as_str());
    let mode = crate::operator::parse_mode(mode)?;
    crate::operator::operate(&state, &name, DependencyOp::Force(mode), &actor(&who)).await?;
    Ok(Redirect::to("/breakers").into_response())
}

pub(super) async fn dependency_pause(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let pairs = form_pairs(body).await?;
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let until = crate::operator::pause_end(get("until"), get("for"), state.now())?;
    crate::operator::operate(&state, &name, DependencyOp::Pause { until }, &actor(&who)).await?;
    Ok(Redirect::to("/breakers").into_response())
}

pub(super) async fn dependency_resume(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    crate::operator::operate(&state, &name, DependencyOp::Resume, &actor(&who)).await?;
    Ok(Redirect::to("/breakers").into_response())
}

/// The bulk form of `/jobs`: an action on every job a filter takes, with a dry run.
pub(super) async fn bulk_action(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let pairs = form_pairs(body).await?;
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(n, v)| n == k && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned())
    };
    let action = crate::operator::parse_action(get("action").as_deref().unwrap_or(""))?;
    let filter = JobFilter {
        ids: None,
        queue: get("queue"),
        kind: get("kind"),
        dependency: get("dependency"),
        dead_reason: get("dead_reason"),
        signature: get("signature"),
    };
    let dry_run = get("dry_run").is_some_and(|v| v == "1");
    if filter.is_empty() && get("all").is_none_or(|v| v != "1") {
        return Err(ApiError::bad_field(
            "queue",
            "",
            "give at least one filter, or tick \"every job\"",
        )
        .into());
    }
    let out = state
        .inner
        .store
        .bulk(action, &filter, &actor(&who), dry_run, state.now())
        .await?;
    let verb = action.as_str().replace('_', " ");
    let body = html! {
        p #bulk-result data-count=(out.count) data-dry-run=(out.dry_run) {
            @if out.dry_run { "Dry run: " (verb) " would change " strong { (out.count) } " job" @if out.count != 1 { "s" } "; nothing changed." }
            @else { (verb) ": " strong { (out.count) } " job" @if out.count != 1 { "s" } " changed." }
        }
        p.muted { "Filter: " code { (serde_json::to_string(&filter).unwrap_or_default()) } }
        @if !out.ids.is_empty() {
            ul #bulk-ids { @for id in out.ids.iter().take(500) { li { a href=(format!("/jobs/{id}")) { (id) } } } }
            @if out.ids.len() > 500 { p.muted { "… and " (out.ids.len() - 500) " more" } }
        }
        @if out.dry_run {
            form method="post" action="/bulk" {
                @for (k, v) in pairs.iter().filter(|(k, _)| k != "dry_run") { input type="hidden" name=(k) value=(v); }
                button.danger #bulk-confirm type="submit" { "Do it: " (verb) " " (out.count) " job" @if out.count != 1 { "s" } }
            }
        }
        p { a href="/jobs" { "Back to the jobs" } " · " a href="/audit" { "Audit trail" } }
    };
    Ok(html_response(layout("Bulk action", false, body)))
}

pub(super) async fn audit_page(
    State(state): State<AppState>,
    RawQuery(q): RawQuery,
) -> Result<Response, Page> {
    let (limit, before) = crate::operator::parse_audit_query(q.as_deref())?;
    let rows = state.inner.store.audit(before, limit).await?;
    let now = Utc::now();
    let next = (rows.len() == limit as usize)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    let body = html! {
        @if rows.is_empty() { p.muted { "No operator action yet." } }
        @else {
            table #audit {
                thead { tr { th { "Id" } th { "When" } th { "Who" } th { "Via" } th { "Action" } th { "Target" } th { "Rows" } } }
                tbody {
                    @for r in &rows {
                        tr data-id=(r.id) data-action=(r.action) {
                            td.n { (r.id) }
                            td { (when(Some(r.at), now)) }
                            td.actor { (r.actor) }
                            td { (r.via) }
                            td.action { (r.action) }
                            td { code { (redact_text(&r.target.to_string())) } }
                            td.n.rows { (r.rows) }
                        }
                    }
                }
            }
        }
        @if let Some(n) = next { p { a.button #next-page href=(format!("/audit?before={n}&limit={limit}")) { "Older →" } } }
    };
    Ok(html_response(layout("Audit", true, body)))
}
