//! `redrive serve`: the HTTP API, the dashboard and the Prometheus metrics of a redrive store.
//!
//! [`app`] builds the axum [`Router`]; [`serve`] binds, prints `listening on http://ADDR` and
//! serves until its shutdown future completes. Every `/v1` route needs `Authorization: Bearer`
//! when a token is configured; errors are `application/problem+json` naming the bad `field`
//! and `value`; `/openapi.json` documents every route.
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
mod dashboard;
mod error;
mod idempotency;
mod server;
mod state;
mod views;

pub use api::{ApiDoc, MAX_DELAY, TRANSITIONS_PER_BREAKER, openapi_document};
pub use auth::SESSION_COOKIE;
pub use error::{ApiError, PROBLEM_BASE, PROBLEM_JSON, ProblemBody, ServiceError};
pub use idempotency::{IdempotencyPage, IdempotencyRecordView};
pub use server::{app, serve, serve_listener};
pub use state::{
    AppConfig, AppState, DEFAULT_ADDR, DEFAULT_IDEMPOTENCY_RECOVERY_WINDOW, IDEMPOTENCY_SCOPE,
    MAX_BODY_BYTES, MIN_IDEMPOTENCY_RECOVERY_WINDOW, ReadyCheck, ServiceConfig,
};
pub use views::*;

pub use axum::Router;
