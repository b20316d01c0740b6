//! Shared test harness: a fresh SQLite file or PostgreSQL schema per test, the app, requests
//! with `oneshot`, and jobs driven to `dead` by the real runtime.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use redrive_policy::Outcome;
use redrive_runtime::{Attempted, Handler, JobContext, Worker};
use redrive_service::{AppConfig, AppState, Router, app};
use redrive_store::{NewJob, PgStore, Store};
use redrive_testkit::PgSchema;
use serde_json::Value;
use tower::ServiceExt;

pub struct Harness {
    pub store: Store,
    pub state: AppState,
    _dir: Option<tempfile::TempDir>,
    schema: Option<PgSchema>,
}

impl Harness {
    /// Drops the PostgreSQL schema (an SQLite directory goes with the value).
    pub async fn cleanup(self) {
        let Self { schema, .. } = self;
        if let Some(schema) = schema {
            schema.drop_now().await;
        }
    }
    pub fn app(&self) -> Router {
        app(self.state.clone())
    }
    /// The SQLite file of an SQLite harness.
    pub fn sqlite_path(&self) -> Option<std::path::PathBuf> {
        self._dir.as_ref().map(|d| d.path().join("q.db"))
    }
}

pub async fn sqlite(config: AppConfig) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let store = Store::connect(&url).await.expect("sqlite store");
    let state = AppState::new(store.clone(), config).await.expect("state");
    Harness {
        store,
        state,
        _dir: Some(dir),
        schema: None,
    }
}

/// A harness on a fresh PostgreSQL schema; `None` (skip) only when PostgreSQL is unreachable
/// (refused or timed out) and CI is not set; a panic for any other connection error.
pub async fn postgres(config: AppConfig) -> Option<Harness> {
    let schema = PgSchema::fresh("rds").await?;
    let pg = PgStore::connect(schema.server_url(), Some(schema.name()), 4)
        .await
        .expect("postgres store");
    let store = Store::Postgres(pg);
    let state = AppState::new(store.clone(), config).await.expect("state");
    Some(Harness {
        store,
        state,
        _dir: None,
        schema: Some(schema),
    })
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    /// Asserts a problem+json with this status.
    pub fn assert_problem_status(&self, status: u16) {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.body
        );
    }
    /// Asserts a problem+json with this status naming `field`.
    pub fn assert_problem(&self, status: u16, field: &str) {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.body
        );
        let p = self.json();
        assert_eq!(p["status"], status, "{}", self.body);
        assert_eq!(p["field"], field, "{}", self.body);
        for k in ["type", "title", "detail"] {
            assert!(p[k].is_string(), "{k} missing: {}", self.body);
        }
    }
}

pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

pub fn post_json(uri: &str, body: &str) -> Request<Body> {
    Request::post(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

pub fn post_empty(uri: &str) -> Request<Body> {
    Request::post(uri).body(Body::empty()).unwrap()
}

/// A handler that always fails permanently with `error`.
#[derive(Debug)]
pub struct Fails(pub &'static str);

impl Handler for Fails {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        let e = self.0;
        Box::pin(async move { Attempted::failure(Outcome::Permanent, e) })
    }
}

/// A handler that succeeds.
#[derive(Debug)]
pub struct Succeeds;

impl Handler for Succeeds {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        Box::pin(async { Attempted::success(serde_json::json!({"ok": true})) })
    }
}

/// Runs a worker over `queue` with `handler` for `kind` until nothing is left to do.
pub async fn work(store: &Store, queue: &str, kind: &str, handler: Arc<dyn Handler>) {
    Worker::builder(store.clone(), vec![queue.to_owned()])
        .handler(kind, handler)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .expect("worker");
}

/// Enqueues a job of kind `charge` on `queue` and lets it die with `error`; returns its id.
pub async fn dead_job(store: &Store, queue: &str, payload: Value, error: &'static str) -> i64 {
    let id = store
        .enqueue(&NewJob::new(queue, "charge", payload), chrono::Utc::now())
        .await
        .unwrap()
        .job
        .id;
    work(store, queue, "charge", Arc::new(Fails(error))).await;
    let j = store.get(id).await.unwrap().unwrap();
    assert_eq!(j.state, redrive_store::JobState::Dead, "{j:?}");
    id
}

/// The process-wide Prometheus recorder (installed once per test binary).
pub fn prometheus() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("install recorder")
        })
        .clone()
}
