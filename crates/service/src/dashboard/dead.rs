//! `/dead`: dead jobs grouped by reason and error signature, replayed or purged.

use axum::Extension;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use maud::html;
use redrive_http::redact::redact_text;
use redrive_store::BulkAction;

use super::IDS_PER_GROUP;
use super::format::state_badge;
use super::forms::{actor, bulk_form, confirm_page, done_page, filter_of, form_pairs};
use super::layout::{Page, html_response, layout};
use crate::auth;
use crate::auth::Identity;
use crate::state::AppState;

pub(super) async fn dead(
    State(state): State<AppState>,
    RawQuery(q): RawQuery,
) -> Result<Response, Page> {
    let queue = form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes())
        .find(|(k, v)| k == "queue" && !v.is_empty())
        .map(|(_, v)| v.into_owned());
    let groups = state
        .inner
        .store
        .dead_groups(queue.as_deref(), IDS_PER_GROUP)
        .await?;
    let total: u64 = groups.iter().map(|g| g.count).sum();
    let body = html! {
        p { strong #dead-total { (total) } " dead job" @if total != 1 { "s" } @if let Some(q) = &queue { " in queue " code { (q) } } ", in " (groups.len()) " group" @if groups.len() != 1 { "s" } " (same reason and error signature; digits and ids normalised)." }
        @if total > 0 {
            form method="post" action="/dead/replay" style="display:inline" {
                input type="hidden" name="all" value="1";
                @if let Some(q) = &queue { input type="hidden" name="queue" value=(q); }
                button.primary #replay-all type="submit" { "Replay all " (total) "…" }
            }
            " "
            form method="post" action="/dead/purge" style="display:inline" {
                input type="hidden" name="all" value="1";
                @if let Some(q) = &queue { input type="hidden" name="queue" value=(q); }
                button.danger #purge-all type="submit" { "Purge all " (total) "…" }
            }
            form #selection method="post" action="/dead/replay" {
                @for (gi, g) in groups.iter().enumerate() {
                    div.group data-reason=(g.reason) data-count=(g.count) {
                        h3 { (state_badge("dead")) " " (g.reason) " — " (g.count) " job" @if g.count != 1 { "s" } }
                        p { "Error: " code.signature { (if g.signature.is_empty() { "(none)".to_owned() } else { redact_text(&g.signature) }) } }
                        @if let Some(e) = g.example.as_ref().filter(|e| **e != g.signature) { p.muted { "e.g. " (redact_text(e)) } }
                        @if let Some(a) = &g.answer { p { "Answer: " code.answer { (redact_text(a)) } } }
                        p.muted { "Queues: " (g.queues.join(", ")) }
                        p {
                            label { input type="checkbox" data-group=(gi) onclick="var c=this.checked;var g=this.dataset.group;document.querySelectorAll('input[data-in=\"'+g+'\"]').forEach(function(x){x.checked=c;});"; " select group" }
                            " · "
                            @for id in &g.ids {
                                label style="margin-right:8px" {
                                    input type="checkbox" name="ids" value=(id) data-in=(gi);
                                    a href=(format!("/jobs/{id}")) { (id) }
                                }
                                " "
                                button type="submit" formaction=(format!("/jobs/{id}/replay")) title=(format!("replay job {id}")) class="replay-one" { "replay" }
                                " "
                            }
                            @if g.count > g.ids.len() as u64 { span.muted { "… and " (g.count - g.ids.len() as u64) " more" } }
                        }
                    }
                }
                button.primary #replay-selected type="submit" { "Replay selected" }
                " "
                button.danger #purge-selected type="submit" formaction="/dead/purge" { "Purge selected…" }
            }
        }
    };
    Ok(html_response(layout("Dead letters", true, body)))
}

pub(super) async fn dead_count(state: &AppState, queue: Option<&str>) -> Result<u64, Page> {
    Ok(state
        .inner
        .store
        .dead_groups(queue, 1)
        .await?
        .iter()
        .map(|g| g.count)
        .sum())
}

pub(super) async fn dead_replay(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let f = bulk_form(&form_pairs(body).await?)?;
    if f.all && !f.confirmed {
        let n = dead_count(&state, f.queue.as_deref()).await?;
        return Ok(confirm_page("Replay", "/dead/replay", &f, n));
    }
    let n = state
        .inner
        .store
        .bulk(
            BulkAction::Replay,
            &filter_of(&f),
            &actor(&who),
            false,
            state.now(),
        )
        .await?
        .count;
    Ok(done_page("Replayed", n))
}

pub(super) async fn dead_purge(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Page> {
    auth::same_origin(&headers)?;
    let f = bulk_form(&form_pairs(body).await?)?;
    if !f.confirmed {
        let n = if f.all {
            dead_count(&state, f.queue.as_deref()).await?
        } else {
            f.ids.len() as u64
        };
        return Ok(confirm_page("Purge", "/dead/purge", &f, n));
    }
    let n = state
        .inner
        .store
        .bulk(
            BulkAction::Purge,
            &filter_of(&f),
            &actor(&who),
            false,
            state.now(),
        )
        .await?
        .count;
    Ok(done_page("Purged", n))
}
