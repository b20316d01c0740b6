//! `redrive serve`: the HTTP API, the dashboard and the Prometheus metrics of a redrive store.
//!
//! [`app`] builds the axum [`Router`]; [`serve`] binds, prints `listening on http://ADDR` and
//! serves until its shutdown future completes. Every `/v1` route (and `/metrics`) needs
//! `Authorization: Bearer` when a token is configured; without one, the [`guard`] refuses
//! foreign hosts, cross-origin writes and non-JSON API writes. Connections are capped and
//! timed out ([`conn`]). Errors are `application/problem+json` naming the bad `field` and
//! `value`; `/openapi.json` documents every route.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use redrive_service::{AppConfig, AppState, app};
//! use tower::ServiceExt;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let url = format!("sqlite:{}", dir.path().join("q.db").display());
//! let store = redrive_store::Store::connect(&url).await.unwrap();
//! let state = AppState::new(store, AppConfig::default()).await.unwrap();
//! let res = app(state)
//!     .oneshot(axum::http::Request::get("/healthz").body(axum::body::Body::empty()).unwrap())
//!     .await
//!     .unwrap();
//! assert_eq!(res.status(), 200);
//! # });
//! ```

mod api;
mod auth;
mod batch;
pub mod conn;
mod dashboard;
mod error;
pub mod guard;
mod idempotency;
mod operator;
mod schedules;
mod server;
mod session;
mod state;
mod views;

pub use api::{ApiDoc, MAX_DELAY, TRANSITIONS_PER_BREAKER, openapi_document, parse_job_object};
pub use auth::{MIN_PUBLIC_TOKEN_CHARS, MIN_PUBLIC_TOKEN_DISTINCT, SESSION_COOKIE};
pub use batch::{
    BatchItem, BatchItemError, BatchProblem, BatchRequest, BatchResponse, MAX_BATCH_BODY_BYTES,
    MAX_BATCH_JOBS,
};
pub use conn::{ConnLimits, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
pub use error::{ApiError, PROBLEM_BASE, PROBLEM_JSON, ProblemBody, ServiceError};
pub use guard::validate_public_host;
pub use idempotency::{IdempotencyPage, IdempotencyRecordView};
pub use operator::{
    AuditPage, AuditView, BulkRequest, BulkResponse, CardStopLifted, CardStopResponse,
    CardStopView, DependencyPauseRequest, ForceRequest, PausedQueueView, PausedQueuesResponse,
    QueueStateView,
};
pub use schedules::{
    ScheduleList, ScheduleRequest, ScheduleUpsert, ScheduleView,
    audit_target as schedule_audit_target, schedule_spec,
};
pub use server::{app, check_exposure, serve, serve_listener, serve_listener_quietly};
pub use session::{BEARER_FAILURES_PER_MINUTE, DEFAULT_SESSION_TTL, LOGIN_FAILURES_PER_MINUTE};
pub use state::{
    ApiToken, AppConfig, AppState, DEFAULT_ADDR, DEFAULT_IDEMPOTENCY_RECOVERY_WINDOW,
    IDEMPOTENCY_SCOPE, MAX_BODY_BYTES, MIN_IDEMPOTENCY_RECOVERY_WINDOW, PLAIN_TOKEN_LABEL,
    ReadyCheck, ServiceConfig,
};
pub use views::*;

pub use axum::Router;
