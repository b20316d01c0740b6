//! `/breakers`: every breaker, its state, next probe and transitions.

use axum::extract::{RawQuery, State};
use axum::response::Response;
use chrono::Utc;
use maud::html;
use redrive_http::redact::redact_text;

use super::format::{breaker_badge, fmt_time, relative, state_badge, when};
use super::layout::{Page, html_response, layout};
use super::overview::{PAGE_SIZE, page_of, pager};
use crate::api::breaker_views;
use crate::state::AppState;

pub(super) async fn breakers(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, Page> {
    // One page of breakers, those that need attention first.
    let page = page_of(query.as_deref());
    let (list, total) = breaker_views(
        &state.inner.store,
        Some(((page - 1) * PAGE_SIZE, PAGE_SIZE)),
    )
    .await?;
    let now = Utc::now();
    let body = html! {
        @if total == 0 { p.muted { "No dependency has a breaker or a pause yet." } }
        @else {
            (pager("/breakers", page, total, "breakers"))
            table #breakers {
                thead { tr { th { "Dependency" } th { "State" } th { "Override" } th { "Next probe" } th { "Probe permits" } th { "Rate limit" } th { "Paused until" } th { "Updated" } th { "Operator" } } }
                tbody {
                    @for b in &list {
                        tr data-name=(b.name) {
                            td { (b.name) }
                            td.state { (breaker_badge(b)) }
                            td.override {
                                @match b.mode.as_str() {
                                    "forced_open" => { strong.state-open { "forced open" } }
                                    "forced_closed" => { strong.state-closed { "forced closed" } }
                                    _ => { span.muted { "auto" } }
                                }
                                @if b.paused_until_resumed { br; strong.state-open { "paused until resumed" } }
                            }
                            td { @match b.next_probe_at { Some(t) => { (relative(t, now)) }, None => { span.muted { "—" } } } }
                            td.n { (b.probe_permits) }
                            td.n.rate { @match b.rate_limit { Some(r) => { (format!("{r:.1}/s")) }, None => { span.muted { "none" } } } @if b.mode != "normal" { br; span.muted { (b.mode) } } }
                            td { (when(b.paused_until, now)) @if let Some(r) = &b.pause_reason { br; span.muted { (redact_text(r)) } } }
                            td { (when(Some(b.updated_at), now)) }
                            td.controls {
                                @let path = form_urlencoded::byte_serialize(b.name.as_bytes()).collect::<String>();
                                @for (mode, label) in [("open", "Force open"), ("closed", "Force closed"), ("auto", "Auto")] {
                                    form method="post" action=(format!("/breakers/{path}/force")) style="display:inline" {
                                        input type="hidden" name="mode" value=(mode);
                                        button class=(format!("force-{mode}")) type="submit" { (label) }
                                    }
                                    " "
                                }
                                br;
                                @if b.paused_until.is_some() {
                                    form method="post" action=(format!("/dependencies/{path}/resume")) style="display:inline" {
                                        button.primary.resume-dependency type="submit" { "Resume" }
                                    }
                                } @else {
                                    form method="post" action=(format!("/dependencies/{path}/pause")) style="display:inline" {
                                        input name="for" placeholder="for (e.g. 30m; empty: until resumed)" size="28";
                                        " " button.pause-dependency type="submit" { "Pause" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Recent transitions" }
            @for b in &list {
                @if !b.recent_transitions.is_empty() {
                    h3 { (b.name) }
                    ul {
                        @for t in &b.recent_transitions {
                            li { (fmt_time(t.at)) " (" (relative(t.at, now)) "): " (state_badge(&t.from)) " → " (state_badge(&t.to)) " — " (redact_text(&t.reason)) }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(layout("Breakers", true, body)))
}
