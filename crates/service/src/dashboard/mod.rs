//! The dashboard: server-rendered HTML (maud) with a few lines of JavaScript that reload the
//! page's live part every 2 seconds (pausable, and paused while a box is ticked).
//!
//! Pages: `/` (queues, breakers, attempts per second, dead by reason), `/jobs` (filtered list
//! with a keyset "next page"), `/jobs/{id}` (fields and the attempt timeline), `/dead` (grouped
//! by reason and error signature, replay or purge one, a selection or all), `/breakers`,
//! `/workers` (the live workers, and the jobs waiting for a kind none of them runs), and
//! `/search?q=` (the search box of every page: a job id, an idempotency key or a dependency).
//! Forms POST to the dashboard's own routes; every POST must come from this host (its
//! `Origin`, else `Referer`), and with a token configured the dashboard needs a session cookie
//! set by `/login`: a random id, HttpOnly, SameSite=Strict, `Secure` with `--cookie-secure`,
//! expiring after the session time to live and revoked by `/logout`. Failed logins are
//! limited per client address (429 problem+json with `Retry-After`). Errors, results and
//! reasons go through the shared redaction before they are shown.

use std::time::Duration;

use axum::Router;
use axum::middleware;
use axum::routing::{get, post};

use crate::auth;
use crate::state::AppState;

mod actions;
mod assets;
mod breakers;
mod chart;
mod dead;
mod format;
mod forms;
mod jobs;
mod layout;
mod login;
mod overview;
mod search;
mod workers;

use self::actions::{
    audit_page, breaker_force, bulk_action, dependency_pause, dependency_resume, job_cancel,
    job_replay, job_run_now, queue_pause, queue_resume,
};
use self::breakers::breakers;
use self::dead::{dead, dead_purge, dead_replay};
use self::jobs::{job, jobs};
use self::login::{login, login_form, logout};
use self::overview::overview;
use self::search::search;
use self::workers::workers;

/// How far back the chart of attempts looks.
pub(crate) const CHART_WINDOW: Duration = Duration::from_secs(10 * 60);
/// One point of the chart.
pub(crate) const CHART_BUCKET: Duration = Duration::from_secs(10);
/// Ids listed (with a checkbox) per dead group.
pub(crate) const IDS_PER_GROUP: u32 = 50;

pub(crate) fn routes(state: AppState) -> Router<AppState> {
    let guarded = Router::new()
        .route("/", get(overview))
        .route("/jobs", get(jobs))
        .route("/jobs/{id}", get(job))
        .route("/jobs/{id}/replay", post(job_replay))
        .route("/jobs/{id}/cancel", post(job_cancel))
        .route("/dead", get(dead))
        .route("/dead/replay", post(dead_replay))
        .route("/dead/purge", post(dead_purge))
        .route("/breakers", get(breakers))
        .route("/workers", get(workers))
        .route("/search", get(search))
        .route("/jobs/{id}/run-now", post(job_run_now))
        .route("/queues/{queue}/pause", post(queue_pause))
        .route("/queues/{queue}/resume", post(queue_resume))
        .route("/breakers/{name}/force", post(breaker_force))
        .route("/dependencies/{name}/pause", post(dependency_pause))
        .route("/dependencies/{name}/resume", post(dependency_resume))
        .route("/bulk", post(bulk_action))
        .route("/audit", get(audit_page))
        .route_layer(middleware::from_fn_with_state(state, auth::require_session));
    Router::new()
        .merge(guarded)
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
}
