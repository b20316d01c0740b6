//! `/`: queues, breakers, attempts per second and dead jobs by reason.

use axum::extract::State;
use axum::response::Response;
use maud::{Markup, html};
use redrive_store::{JobState, QueueCount};

use super::chart::chart;
use super::format::{fmt_time, jobs_link, relative, state_badge};
use super::layout::{Page, html_response, layout};
use super::{CHART_BUCKET, CHART_WINDOW};
use crate::api::breaker_views;
use crate::state::AppState;
use crate::views::BreakerView;

pub(super) fn queue_table(counts: &[QueueCount], paused: &[String]) -> Markup {
    let mut queues: Vec<&str> = counts.iter().map(|c| c.queue.as_str()).collect();
    // A paused queue without jobs still shows (to be resumed).
    queues.extend(paused.iter().map(String::as_str));
    queues.sort_unstable();
    queues.dedup();
    let is_paused = |q: &str| paused.iter().any(|p| p == q);
    let count = |q: &str, s: JobState| {
        counts
            .iter()
            .find(|c| c.queue == q && c.state == s)
            .map_or(0, |c| c.count)
    };
    html! {
        @if queues.is_empty() {
            p.muted { "No jobs yet. Enqueue one with " code { "POST /v1/jobs" } " or " code { "redrive enqueue" } "." }
        } @else {
            table #queues {
                thead { tr {
                    th { "Queue" }
                    @for s in JobState::ALL { th { (s.as_str()) } }
                    th { "total" }
                    th { "Claims" }
                } }
                tbody {
                    @for q in &queues {
                        tr data-queue=(q) {
                            td { a href=(jobs_link(Some(q), None)) { (q) } }
                            @for s in JobState::ALL {
                                @let n = count(q, s);
                                td.n data-state=(s.as_str()) {
                                    @if n == 0 { span.zero { "0" } }
                                    @else { a class=(format!("state-{}", s.as_str())) href=(jobs_link(Some(q), Some(s))) { (n) } }
                                }
                            }
                            td.n { (JobState::ALL.iter().map(|s| count(q, *s)).sum::<u64>()) }
                            td.claims {
                                @let path = form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>();
                                @if is_paused(q) {
                                    strong.state-open.paused { "paused" } " "
                                    form method="post" action=(format!("/queues/{path}/resume")) style="display:inline" {
                                        button.primary.resume-queue type="submit" { "Resume" }
                                    }
                                } @else {
                                    span.state-closed { "on" } " "
                                    form method="post" action=(format!("/queues/{path}/pause")) style="display:inline" {
                                        button.pause-queue type="submit" { "Pause" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Jobs waiting for a queue and kind no live worker runs, as a warning (nothing if none).
pub(super) fn unhandled_warning(unhandled: &[redrive_store::Unhandled]) -> Markup {
    html! {
        @if !unhandled.is_empty() {
            div.warn #unhandled {
                strong { "Waiting for a kind no live worker runs" }
                " — these jobs will not run until a worker for their queue and kind starts ("
                a href="/workers" { "workers" } "):"
                table { thead { tr { th { "Queue" } th { "Kind" } th { "Jobs" } th { "Oldest run at" } } }
                    tbody { @for u in unhandled {
                        tr data-queue=(u.queue) data-kind=(u.kind) {
                            td { a href=(jobs_link(Some(&u.queue), None)) { (u.queue) } }
                            td { (u.kind) } td.n { (u.jobs) } td { (fmt_time(u.oldest_run_at)) }
                        }
                    } }
                }
            }
        }
    }
}

pub(super) async fn overview(State(state): State<AppState>) -> Result<Response, Page> {
    let store = &state.inner.store;
    let now = state.now();
    let counts = store.counts().await?;
    let unhandled = store.unhandled(now).await?;
    let paused: Vec<String> = store
        .paused_queues()
        .await?
        .into_iter()
        .map(|p| p.queue)
        .collect();
    let breakers = breaker_views(store).await?;
    let from = now - chrono::Duration::from_std(CHART_WINDOW).unwrap_or_default();
    let buckets = store.attempt_rate(from, now, CHART_BUCKET).await?;
    let reasons = store.dead_reasons().await?;
    let not_closed: Vec<&BreakerView> = breakers
        .iter()
        .filter(|b| b.state != "closed" || b.paused_until.is_some())
        .collect();
    let body = html! {
        (unhandled_warning(&unhandled))
        h2 { "Queues" }
        (queue_table(&counts, &paused))
        div.cards {
            div.card #breakers-summary {
                h2 { "Breakers" }
                @if breakers.is_empty() { p.muted { "No dependency has a breaker yet." } }
                @else {
                    p { (breakers.iter().filter(|b| b.state == "closed").count()) " closed, "
                        (breakers.iter().filter(|b| b.state == "open").count()) " open, "
                        (breakers.iter().filter(|b| b.state == "half_open").count()) " half-open" }
                    ul {
                        @for b in &not_closed {
                            li { a href="/breakers" { (b.name) } ": " (state_badge(&b.state))
                                @if let Some(t) = b.next_probe_at { " · next probe " (relative(t, now)) }
                                @if let Some(t) = b.paused_until { " · paused " (relative(t, now)) }
                            }
                        }
                    }
                }
            }
            div.card #dead-summary {
                h2 { "Dead letters by reason" }
                @if reasons.is_empty() { p.muted { "No dead jobs." } }
                @else {
                    table { tbody {
                        @for r in &reasons {
                            tr { td { a href="/dead" { (r.reason) } } td.n data-reason=(r.reason) { (r.count) } }
                        }
                    } }
                }
            }
        }
        (chart(&buckets, from, now))
        p.muted { "Updated " (fmt_time(now)) }
    };
    Ok(html_response(layout("Overview", true, body)))
}
