//! `/`: queues, breakers, attempts per second and dead jobs by reason.

use std::collections::{BTreeMap, HashMap};

use axum::extract::{RawQuery, State};
use axum::response::Response;
use maud::{Markup, html};
use redrive_store::{JobState, QueueCount};

use super::chart::chart;
use super::format::{breaker_badge, fmt_time, jobs_link, relative};
use super::layout::{Page, html_response, layout};
use super::{CHART_BUCKET, CHART_WINDOW};
use crate::state::AppState;
use crate::views::BreakerView;

/// Rows per page of the overview's queue table and of `/breakers`.
pub(super) const PAGE_SIZE: usize = 100;

/// The `page` query parameter (1-based; anything else is page 1).
pub(super) fn page_of(query: Option<&str>) -> usize {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "page")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .filter(|p| *p >= 1)
        .unwrap_or(1)
}

/// "Page N of M" with links to the pages before and after (nothing when one page holds all).
pub(super) fn pager(path: &str, page: usize, total: usize, what: &str) -> Markup {
    let pages = total.div_ceil(PAGE_SIZE).max(1);
    html! {
        @if pages > 1 {
            p.pager {
                (total) " " (what) ", page " (page.min(pages)) " of " (pages) " "
                @if page > 1 { a.prev href=(format!("{path}?page={}", page.min(pages) - 1)) { "← previous" } " " }
                @if page < pages { a.next href=(format!("{path}?page={}", page + 1)) { "next →" } }
            }
        }
    }
}

/// The queues (by name, one page of [`PAGE_SIZE`]) with their counts per state.
pub(super) fn queue_table(counts: &[QueueCount], paused: &[String], page: usize) -> Markup {
    let mut by_queue: BTreeMap<&str, HashMap<JobState, u64>> = BTreeMap::new();
    for c in counts {
        *by_queue
            .entry(c.queue.as_str())
            .or_default()
            .entry(c.state)
            .or_default() += c.count;
    }
    // A paused queue without jobs still shows (to be resumed).
    for p in paused {
        by_queue.entry(p.as_str()).or_default();
    }
    let total = by_queue.len();
    let queues: Vec<(&str, &HashMap<JobState, u64>)> = by_queue
        .iter()
        .skip((page - 1) * PAGE_SIZE)
        .take(PAGE_SIZE)
        .map(|(q, m)| (*q, m))
        .collect();
    let is_paused = |q: &str| paused.iter().any(|p| p == q);
    html! {
        @if total == 0 {
            p.muted { "No jobs yet. Enqueue one with " code { "POST /v1/jobs" } " or " code { "redrive enqueue" } "." }
        } @else {
            (pager("/", page, total, "queues"))
            table #queues {
                thead { tr {
                    th { "Queue" }
                    @for s in JobState::ALL { th { (s.as_str()) } }
                    th { "total" }
                    th { "Claims" }
                } }
                tbody {
                    @for (q, states) in &queues {
                        tr data-queue=(q) {
                            td { a href=(jobs_link(Some(q), None)) { (q) } }
                            @for s in JobState::ALL {
                                @let n = states.get(&s).copied().unwrap_or(0);
                                td.n data-state=(s.as_str()) {
                                    @if n == 0 { span.zero { "0" } }
                                    @else { a class=(format!("state-{}", s.as_str())) href=(jobs_link(Some(q), Some(s))) { (n) } }
                                }
                            }
                            td.n { (states.values().sum::<u64>()) }
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
                    tbody { @for u in unhandled.iter().take(PAGE_SIZE) {
                        tr data-queue=(u.queue) data-kind=(u.kind) {
                            td { a href=(jobs_link(Some(&u.queue), None)) { (u.queue) } }
                            td { (u.kind) } td.n { (u.jobs) } td { (fmt_time(u.oldest_run_at)) }
                        }
                    } }
                }
                @if unhandled.len() > PAGE_SIZE {
                    p.more { "and " (unhandled.len() - PAGE_SIZE) " more (" code { "redrive stats --limit N" } ")" }
                }
            }
        }
    }
}

pub(super) async fn overview(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, Page> {
    let page = page_of(query.as_deref());
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
    // Every breaker's state, without its transitions (one query, however many there are).
    let breakers: Vec<BreakerView> = store
        .dependencies()
        .await?
        .into_iter()
        .map(|d| BreakerView::new(d, now, Vec::new()))
        .collect();
    let from = now - chrono::Duration::from_std(CHART_WINDOW).unwrap_or_default();
    let buckets = store.attempt_rate(from, now, CHART_BUCKET).await?;
    let reasons = store.dead_reasons().await?;
    let not_closed: Vec<&BreakerView> = breakers
        .iter()
        .filter(|b| b.state_label != "closed" || b.paused_until.is_some())
        .collect();
    // Counted as the fleet sees them: a forced-open breaker is open, and says it is forced.
    let count = |label: &str| breakers.iter().filter(|b| b.state_label == label).count();
    let forced: Vec<(&str, usize)> = ["open (forced)", "closed (forced)"]
        .into_iter()
        .map(|l| (l, count(l)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let more_not_closed = not_closed.len().saturating_sub(PAGE_SIZE);
    let body = html! {
        (unhandled_warning(&unhandled))
        h2 { "Queues" }
        (queue_table(&counts, &paused, page))
        div.cards {
            div.card #breakers-summary {
                h2 { "Breakers" }
                @if breakers.is_empty() { p.muted { "No dependency has a breaker yet." } }
                @else {
                    p #breaker-counts { (count("closed")) " closed, "
                        (count("open")) " open, "
                        (count("half_open")) " half-open"
                        @for (label, n) in &forced { ", " (n) " " (label) } }
                    ul {
                        @for b in not_closed.iter().take(PAGE_SIZE) {
                            li { a href="/breakers" { (b.name) } ": " (breaker_badge(b))
                                @if let Some(t) = b.next_probe_at { " · next probe " (relative(t, now)) }
                                @if let Some(t) = b.paused_until { " · paused " (relative(t, now)) }
                            }
                        }
                    }
                    @if more_not_closed > 0 {
                        p.more { a href="/breakers" { "and " (more_not_closed) " more" } }
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
