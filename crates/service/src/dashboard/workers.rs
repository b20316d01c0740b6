//! `/workers`: the live workers and the jobs waiting for a kind none of them runs.

use axum::extract::State;
use axum::response::Response;
use maud::html;

use super::format::{relative, when};
use super::layout::{Page, html_response, layout};
use super::overview::unhandled_warning;
use crate::state::AppState;

pub(super) async fn workers(State(state): State<AppState>) -> Result<Response, Page> {
    let store = &state.inner.store;
    let now = state.now();
    let list = store.workers(now).await?;
    let unhandled = store.unhandled(now).await?;
    let stale = redrive_store::WORKER_STALE_AFTER.as_secs();
    let body = html! {
        (unhandled_warning(&unhandled))
        @if list.is_empty() { p.muted #no-workers { "No live workers. Start some with " code { "redrive work" } ", " code { "redrive serve --workers N" } " or your own worker built on redrive-runtime." } }
        @else {
            table #workers {
                thead { tr { th { "Name" } th { "Host" } th { "Pid" } th { "Queues" } th { "Kinds" } th { "Concurrency" } th { "Started" } th { "Policies" } th { "Last seen" } } }
                tbody {
                    @for w in &list {
                        tr data-name=(w.name) {
                            td { (w.name) }
                            td { (w.host) }
                            td.n { (w.pid) }
                            td { @if w.queues.is_empty() { span.muted { "all" } } @else { (w.queues.join(", ")) } }
                            td.kinds { @match w.kinds.as_list() { None => { span.muted { "any" } }, Some(k) => { (k.join(", ")) } } }
                            td.n { (w.concurrency) }
                            td { (when(Some(w.started_at), now)) }
                            td.policies { @match &w.policy_version { Some(v) => { (v) }, None => { span.muted { "-" } } } }
                            td { (relative(w.last_seen, now)) }
                        }
                    }
                }
            }
        }
        p.muted { "Each worker refreshes its row every few seconds; one not seen for " (stale) " s counts as gone." }
    };
    Ok(html_response(layout("Workers", true, body)))
}
