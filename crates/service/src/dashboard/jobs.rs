//! `/jobs` (the filtered list) and `/jobs/{id}` (a job and its attempt timeline).

use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use chrono::Utc;
use maud::{Markup, html};
use redrive_http::redact::{redact_text, redact_value};
use redrive_store::{BulkAction, Job, JobState, Timestamp};

use super::chart::class_colour;
use super::format::{duration, fmt_time, jobs_link, state_badge, when};
use super::layout::{Page, html_response, layout};
use crate::api::{parse_id, parse_list};
use crate::state::AppState;

pub(super) fn job_row(j: &Job, now: Timestamp) -> Markup {
    let why = j
        .dead_reason
        .map(|r| r.as_str())
        .or(j.defer_reason.map(|r| r.as_str()))
        .unwrap_or("");
    html! {
        tr data-id=(j.id) {
            td { a href=(format!("/jobs/{}", j.id)) { (j.id) } }
            td { (j.queue) }
            td { (j.kind) }
            td { (state_badge(j.state.as_str())) }
            td.n { (j.attempts) "/" (j.max_attempts) }
            td { (when(Some(j.run_at), now)) }
            td { (why) @if let Some(e) = &j.last_error { " " span.muted { (redact_text(e).chars().take(120).collect::<String>()) } } }
        }
    }
}

pub(super) async fn jobs(
    State(state): State<AppState>,
    RawQuery(q): RawQuery,
) -> Result<Response, Page> {
    let p = parse_list(q.as_deref(), true)?;
    let page = state.inner.store.list(&p).await?;
    let now = Utc::now();
    let next_link = page.next.map(|n| {
        let mut s = form_urlencoded::Serializer::new(String::new());
        if let Some(st) = p.state {
            s.append_pair("state", st.as_str());
        }
        if let Some(qu) = &p.queue {
            s.append_pair("queue", qu);
        }
        if let Some(k) = &p.key {
            s.append_pair("key", k);
        }
        if let Some(l) = p.limit {
            s.append_pair("limit", &l.to_string());
        }
        s.append_pair("after", &n.to_string());
        format!("/jobs?{}", s.finish())
    });
    let mut title = match (&p.state, &p.queue) {
        (Some(s), Some(q)) => format!("Jobs: {q}, {s}"),
        (Some(s), None) => format!("Jobs: {s}"),
        (None, Some(q)) => format!("Jobs: {q}"),
        (None, None) => "Jobs".into(),
    };
    if let Some(k) = &p.key {
        title = format!("{title} with key {k}");
    }
    let body = html! {
        form method="get" action="/jobs" {
            label { "State " select name="state" {
                option value="" { "any" }
                @for s in JobState::ALL {
                    option value=(s.as_str()) selected[p.state == Some(s)] { (s.as_str()) }
                }
            } }
            " "
            label { "Queue " input name="queue" value=(p.queue.clone().unwrap_or_default()); }
            " "
            label { "Key " input name="key" value=(p.key.clone().unwrap_or_default()); }
            " " button type="submit" { "Filter" }
        }
        @if page.jobs.is_empty() { p.muted { "No jobs match." } }
        @else {
            table #jobs {
                thead { tr { th { "Id" } th { "Queue" } th { "Kind" } th { "State" } th { "Attempts" } th { "Run at" } th { "Reason / last error" } } }
                tbody { @for j in &page.jobs { (job_row(j, now)) } }
            }
        }
        @if let Some(l) = next_link { p { a.button #next-page href=(l) { "Next page →" } } }
        @if p.after.is_some() { p { a href=(jobs_link(p.queue.as_deref(), p.state)) { "← First page" } } }
        details #bulk {
            summary { "Bulk action by filter" }
            form method="post" action="/bulk" {
                label { "Action " select name="action" {
                    option value="replay" { "replay (dead)" }
                    option value="purge" { "purge (dead)" }
                    option value="cancel" { "cancel (unfinished)" }
                    option value="run_now" { "run now (waiting)" }
                } } " "
                label { "Queue " input name="queue" value=(p.queue.clone().unwrap_or_default()); } " "
                label { "Kind " input name="kind"; } " "
                label { "Dependency " input name="dependency"; } " "
                label { "Dead reason " input name="dead_reason"; } " "
                label { "Error signature " input name="signature"; } " "
                label { input type="checkbox" name="all" value="1"; " every job (no filter)" } " "
                label { input type="checkbox" name="dry_run" value="1" checked; " dry run" } " "
                button.primary #bulk-submit type="submit" { "Go" }
            }
        }
    };
    Ok(html_response(layout(&title, true, body)))
}

pub(super) async fn job(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, Page> {
    let id = parse_id(&id)?;
    let store = &state.inner.store;
    let j = store
        .get(id)
        .await?
        .ok_or(redrive_store::StoreError::JobNotFound { id })?;
    let attempts = store.attempts(id).await?;
    let waiting = store.waiting_because(&j).await?;
    let now = Utc::now();
    let declines = store.declines(id).await?;
    let quota = match &j.quota_key {
        Some(k) => quota_use(store, &state.inner.policies.current(), k, now).await?,
        None => Vec::new(),
    };
    let card_stop = match &j.quota_key {
        Some(k) => store.card_stop(k, now).await?,
        None => None,
    };
    let payload = redrive_http::redact_payload(&j.payload);
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let body = html! {
        p { "State: " strong #job-state { (state_badge(j.state.as_str())) }
            @if let Some(r) = &j.dead_reason { " — died: " strong { (r) } }
            @if let Some(r) = &j.defer_reason { " — deferred: " strong { (r) } }
        }
        @if !waiting.is_empty() {
            p #waiting { "Waiting because: "
                @for (i, w) in waiting.iter().enumerate() {
                    @if i > 0 { "; " }
                    strong data-reason=(w.code()) { (w) }
                }
            }
        }
        div {
            @if j.state == JobState::Dead {
                form method="post" action=(format!("/jobs/{id}/replay")) style="display:inline" {
                    button.primary #replay type="submit" { "Replay" }
                }
                " "
            }
            @if BulkAction::RunNow.states().contains(&j.state) && j.run_at > now {
                form method="post" action=(format!("/jobs/{id}/run-now")) style="display:inline" {
                    button.primary #run-now type="submit" { "Run now" }
                }
                " "
            }
            @if !j.state.is_final() {
                form method="post" action=(format!("/jobs/{id}/cancel")) style="display:inline" {
                    button.danger #cancel type="submit" { "Cancel" }
                }
            }
        }
        table #fields { tbody {
            tr { th { "Queue" } td { a href=(jobs_link(Some(&j.queue), None)) { (j.queue) } } }
            tr { th { "Kind" } td { (j.kind) } }
            tr { th { "Key" } td { (j.key.as_deref().unwrap_or("—")) } }
            tr { th { "Dependency" } td { (j.dependency.as_deref().unwrap_or("—")) } }
            @if let Some(k) = &j.quota_key { tr { th { "Quota key" } td #quota-key { (k) } } }
            tr { th { "Policy" } td { (j.policy) } }
            tr { th { "Priority" } td { (j.priority) } }
            tr { th { "Attempts" } td { (j.attempts) " of " (j.max_attempts) " (exceptions " (j.exceptions) ", defers " (j.defers) ")" } }
            tr { th { "Replays" } td { (j.replays) } }
            tr { th { "Run at" } td { (when(Some(j.run_at), now)) } }
            tr { th { "Deadline" } td { (when(j.deadline, now)) } }
            tr { th { "Lease" } td { (j.lease_owner.as_deref().unwrap_or("—")) " · token " (j.lease_token) " · expires " (when(j.lease_expires_at, now)) } }
            tr { th { "Created" } td { (when(Some(j.created_at), now)) } }
            tr { th { "Finished" } td { (when(j.finished_at, now)) } }
            tr { th { "Last error" } td { (j.last_error.as_deref().map_or_else(|| "—".to_owned(), redact_text)) } }
            @if let Some(r) = attempts.iter().rev().find_map(|a| a.response.as_deref()) {
                tr { th { "Last answer" } td { code #last-answer { (redact_text(r)) } } }
            }
        } }
        h2 { "Payload" span.muted { " (secret headers redacted)" } }
        pre #payload { (pretty(&payload)) }
        @if let Some(r) = &j.result { h2 { "Result" } pre { (pretty(&redact_value(r))) } }
        @if !declines.is_empty() || j.quota_key.is_some() {
            h2 { "Declines (" (declines.len()) ")" }
            @if !declines.is_empty() {
                table #declines {
                    thead { tr { th { "Attempt" } th { "At" } th { "Network" } th { "Code" } th { "Category" } th { "Advice" } th { "Rule" } } }
                    tbody { @for d in &declines {
                        tr {
                            td { "#" (d.attempt) } td { (fmt_time(d.at)) } td { (d.network.as_str()) }
                            td { (d.code.as_deref().unwrap_or("—")) }
                            td { (d.category.map_or("—".into(), |c| c.to_string())) }
                            td { (d.advice_code.map_or("—".into(), |m| format!("MAC {m:02}"))) }
                            td { strong { (d.rule) } }
                        }
                    } }
                }
            }
            @if let Some(stop) = &card_stop {
                p #card-stop { strong { "Card stopped: " } (stop.describe())
                    span.muted { " (no job of this card key is called; "
                        code { "redrive quota lift " (stop.quota_key) } " ends it)" } }
            }
            @if !quota.is_empty() {
                p #quota { "Reattempt quota of this card: "
                    @for (i, (network, used, max, window)) in quota.iter().enumerate() {
                        @if i > 0 { " · " }
                        (network) " " strong { (used) "/" (max) } " in " (window)
                    }
                }
            }
        }
        h2 { "Attempts (" (attempts.len()) ")" }
        @if attempts.is_empty() { p.muted { "No attempt yet." } }
        @else {
            ol.timeline #attempts {
                @for a in &attempts {
                    li style=(format!("--c:{}", class_colour(a.class.as_str()))) data-class=(a.class.as_str()) {
                        strong { "#" (a.number) } @if a.replay > 0 { span.muted { " (replay " (a.replay) ")" } }
                        " · " (fmt_time(a.started_at)) " · took " (duration(Some(a.duration)))
                        " · " span style=(format!("color:{}", class_colour(a.class.as_str()))) { (a.class.as_str()) }
                        @if let Some(s) = a.http_status { " · HTTP " (s) }
                        @if let Some(m) = a.mode { " · then " strong { (m.as_str()) } " after " (duration(a.delay)) }
                        @else if let Some(d) = a.delay { " · delay " (duration(Some(d))) }
                        " · fencing token " (a.lease_token)
                        @if !a.counted { span.muted { " · not counted" } }
                        @if let Some(w) = &a.worker { span.muted { " · " (w) } }
                        @if let Some(e) = &a.error { br; code { (redact_text(e)) } }
                        @if let Some(r) = &a.response { br; span.muted { "answered: " } code.answer { (redact_text(r)) } }
                    }
                }
            }
        }
    };
    Ok(html_response(layout(&format!("Job {id}"), true, body)))
}

/// A card key's reattempts in each quota window: (network, used, max, window).
pub(super) async fn quota_use(
    store: &redrive_store::Store,
    set: &redrive_policy::PolicySet,
    key: &str,
    now: chrono::DateTime<Utc>,
) -> Result<Vec<(String, u64, u32, String)>, redrive_store::StoreError> {
    let (windows, _) = store.quota_use(key, set.quotas(), now).await?;
    Ok(windows
        .into_iter()
        .map(|w| {
            (
                w.network.as_str().to_owned(),
                w.used,
                w.window.max(),
                redrive_policy::format_duration(w.window.window()),
            )
        })
        .collect())
}
