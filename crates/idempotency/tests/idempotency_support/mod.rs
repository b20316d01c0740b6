//! Backends, a counting router and helpers for the idempotency suite.
#![allow(dead_code, unreachable_pub)]

pub mod cases;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Extension;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use redrive_idempotency::{
    ClaimOutcome, ClaimRequest, IdempotencyCtx, IdempotencyLayer, IdempotencyLayerBuilder,
    IdempotencyStore, IdempotencyStoreError, ListRequest, ListedRecord, LockToken,
    ManualIdempotencyClock, MemoryIdempotencyStore, PostgresIdempotencyStore, ReapReport, RecordId,
    RecordInfo, Recovery, SqliteIdempotencyStore, StoreFuture, StoredResponse,
};
use redrive_testkit::PgSchema;
use tower::ServiceExt;

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Sqlite,
    Postgres,
}

/// One test's database.
#[derive(Debug)]
pub struct Backend {
    pub kind: Kind,
    store: Arc<dyn IdempotencyStore>,
    clock: Option<ManualIdempotencyClock>,
    sqlite_url: Option<String>,
    pg: Option<PgSchema>,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    pub async fn memory() -> Option<Self> {
        let clock = ManualIdempotencyClock::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        );
        let store = Arc::new(MemoryIdempotencyStore::with_clock(Arc::new(clock.clone())));
        Some(Self {
            kind: Kind::Memory,
            store,
            clock: Some(clock),
            sqlite_url: None,
            pg: None,
            _dir: None,
        })
    }

    pub async fn sqlite() -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("idem.db").display());
        let store = SqliteIdempotencyStore::connect(&url)
            .await
            .expect("open sqlite");
        store.ensure_schema().await.expect("sqlite schema");
        Some(Self {
            kind: Kind::Sqlite,
            store: Arc::new(store),
            clock: None,
            sqlite_url: Some(url),
            pg: None,
            _dir: Some(dir),
        })
    }

    pub async fn postgres() -> Option<Self> {
        // Skips only when the server is unreachable (refused or timed out) and CI is not set;
        // any other error fails.
        let guard = PgSchema::fresh("idem_test").await?;
        let store =
            PostgresIdempotencyStore::connect_in_schema(guard.server_url(), guard.name(), 10)
                .await
                .expect("pg pool");
        store.ensure_schema().await.expect("pg schema");
        Some(Self {
            kind: Kind::Postgres,
            store: Arc::new(store),
            clock: None,
            sqlite_url: None,
            pg: Some(guard),
            _dir: None,
        })
    }

    pub fn store(&self) -> Arc<dyn IdempotencyStore> {
        self.store.clone()
    }

    /// A new store instance on the same database (a restarted process).
    pub async fn reopen(&self) -> Arc<dyn IdempotencyStore> {
        match self.kind {
            Kind::Memory => self.store.clone(),
            Kind::Sqlite => Arc::new(
                SqliteIdempotencyStore::connect(self.sqlite_url.as_deref().unwrap())
                    .await
                    .unwrap(),
            ),
            Kind::Postgres => {
                let pg = self.pg.as_ref().unwrap();
                Arc::new(
                    PostgresIdempotencyStore::connect_in_schema(pg.server_url(), pg.name(), 10)
                        .await
                        .unwrap(),
                )
            }
        }
    }

    /// A store whose every operation fails (the database is down).
    pub async fn broken_store(&self) -> Arc<dyn IdempotencyStore> {
        match self.kind {
            Kind::Memory => {
                let faulty = Faulty::new(self.store.clone());
                faulty.fail_all.store(true, Ordering::SeqCst);
                Arc::new(faulty)
            }
            Kind::Sqlite => {
                let s = SqliteIdempotencyStore::connect(self.sqlite_url.as_deref().unwrap())
                    .await
                    .unwrap();
                s.close().await;
                Arc::new(s)
            }
            Kind::Postgres => {
                let pg = self.pg.as_ref().unwrap();
                let s = PostgresIdempotencyStore::connect_in_schema(pg.server_url(), pg.name(), 10)
                    .await
                    .unwrap();
                s.close().await;
                Arc::new(s)
            }
        }
    }

    /// Lets `d` pass in real time, moving the memory store's clock along.
    pub async fn wait_real(&self, d: Duration) {
        tokio::time::sleep(d).await;
        if let Some(clock) = &self.clock {
            clock.advance(d);
        }
    }

    /// Lets `d` pass for the store's clock.
    pub async fn wait(&self, d: Duration) {
        match &self.clock {
            Some(clock) => clock.advance(d),
            None => tokio::time::sleep(d).await,
        }
    }
}

/// Lease settings for tests that wait for a lease or a retention to pass.
pub const SHORT_LEASE: Duration = Duration::from_millis(600);
pub const SHORT_HEARTBEAT: Duration = Duration::from_millis(150);
pub const SHORT_RETENTION: Duration = Duration::from_millis(1200);

pub fn builder(store: Arc<dyn IdempotencyStore>) -> IdempotencyLayerBuilder {
    IdempotencyLayer::builder(store).with_docs_url("https://docs.example/idempotency")
}

pub fn short(store: Arc<dyn IdempotencyStore>) -> IdempotencyLayerBuilder {
    builder(store)
        .with_lease(SHORT_LEASE)
        .with_heartbeat_interval(SHORT_HEARTBEAT)
        .with_retention(SHORT_RETENTION)
}

/// What the counting handler saw of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub recovery_point: String,
    pub attempts: u32,
    pub resumed: bool,
}

/// The state shared by the counting handler.
#[derive(Debug)]
pub struct Counters {
    /// Runs that started.
    pub started: AtomicUsize,
    /// Side effects made ("charges").
    pub effects: AtomicUsize,
    /// What each run saw.
    pub seen: Mutex<Vec<Seen>>,
    /// Released by tests to let gated handlers go on.
    pub gate: tokio::sync::Semaphore,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            started: AtomicUsize::new(0),
            effects: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            gate: tokio::sync::Semaphore::new(0),
        }
    }
}

impl Counters {
    pub fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }
    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The counting handler; its behaviour is steered by `x-test-*` headers (which are not part
/// of the fingerprint, like any volatile header).
async fn charge(
    Extension(counters): Extension<Arc<Counters>>,
    ctx: Option<Extension<IdempotencyCtx>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    counters.started.fetch_add(1, Ordering::SeqCst);
    if let Some(Extension(ctx)) = &ctx {
        counters.seen.lock().unwrap().push(Seen {
            recovery_point: ctx.recovery_point().to_owned(),
            attempts: ctx.attempts(),
            resumed: ctx.is_resumed(),
        });
    }
    if headers.contains_key("x-test-gate") {
        counters.gate.acquire().await.unwrap().forget();
    }
    if let Some(ms) = header_str(&headers, "x-test-delay-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if headers.contains_key("x-test-panic") {
        panic!("handler panics on purpose");
    }
    let resumable = headers.contains_key("x-test-resumable");
    let already = resumable
        && ctx
            .as_ref()
            .is_some_and(|Extension(c)| c.recovery_point() == "charged");
    if !already {
        counters.effects.fetch_add(1, Ordering::SeqCst);
        if let Some(Extension(ctx)) = &ctx
            && (resumable || headers.contains_key("x-test-advance"))
        {
            ctx.advance("charged").await.expect("advance");
        }
    }
    if headers.contains_key("x-test-hang") {
        // The process "dies" here: after the effect, before any response.
        std::future::pending::<()>().await;
    }
    if let Some(ms) = header_str(&headers, "x-test-then-delay-ms").and_then(|v| v.parse().ok()) {
        // A long second phase; a second effect only while the lease is held.
        tokio::time::sleep(Duration::from_millis(ms)).await;
        counters.effects.fetch_add(1, Ordering::SeqCst);
    }
    let status = header_str(&headers, "x-test-status")
        .and_then(|v| v.parse().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
        .unwrap_or(StatusCode::CREATED);
    let n = counters.effects();
    let body = match header_str(&headers, "x-test-big").and_then(|v| v.parse::<usize>().ok()) {
        Some(size) => vec![b'x'; size],
        None => format!(
            "{{\"charge\":{n},\"request\":{}}}",
            String::from_utf8_lossy(&body)
        )
        .into_bytes(),
    };
    let mut response = (status, body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/charges/{n}")).unwrap(),
    );
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"v{n}\"")).unwrap(),
    );
    h.insert(header::SET_COOKIE, HeaderValue::from_static("session=abc"));
    h.insert(
        header::DATE,
        HeaderValue::from_static("Wed, 01 Jan 2031 00:00:00 GMT"),
    );
    h.insert(
        "x-payment-id",
        HeaderValue::from_str(&format!("pay_{n}")).unwrap(),
    );
    h.insert("x-internal", HeaderValue::from_static("not-replayed"));
    response
}

/// A router with the counting handler on `/charges` and `/refunds`, behind `layer`.
pub fn app(layer: IdempotencyLayer) -> (Router, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let router = Router::new()
        .route("/charges", post(charge).patch(charge).get(charge))
        .route("/refunds", post(charge))
        .layer(layer)
        .layer(Extension(counters.clone()));
    (router, counters)
}

/// A request builder.
pub fn req(
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> axum::http::request::Builder {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    let _ = body;
    b
}

pub fn post_req(key: Option<&str>, body: &str) -> Request<Body> {
    req("POST", "/charges", key, body)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// One finished response.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    /// Asserts a problem document of type slug `slug` and `status`.
    pub fn assert_problem(&self, status: u16, slug: &str) {
        assert_eq!(self.status.as_u16(), status, "status; body {:?}", self.body);
        assert_eq!(
            self.headers.get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json"
        );
        let j = self.json();
        assert!(j["type"].as_str().unwrap().ends_with(slug), "type {j}");
        assert_eq!(j["status"], status);
        assert!(j["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(j["detail"].as_str().is_some_and(|t| !t.is_empty()));
    }
}

pub async fn send(router: &Router, request: Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Waits (in real time, bounded) until the record of `key` is completed.
pub async fn until_completed(store: &dyn IdempotencyStore, scope: &str, key: &str) -> RecordInfo {
    for _ in 0..500 {
        if let Some(info) = store.get(scope, key).await.unwrap()
            && info.response_status.is_some()
        {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("record never completed");
}

/// A store wrapper with injectable faults.
#[derive(Debug)]
pub struct Faulty {
    inner: Arc<dyn IdempotencyStore>,
    pub fail_all: AtomicBool,
    pub fail_finalise: AtomicBool,
    pub heartbeat_refused: AtomicBool,
}

impl Faulty {
    pub fn new(inner: Arc<dyn IdempotencyStore>) -> Self {
        Self {
            inner,
            fail_all: AtomicBool::new(false),
            fail_finalise: AtomicBool::new(false),
            heartbeat_refused: AtomicBool::new(false),
        }
    }
    fn down<'a, T: Send + 'a>(&self) -> Option<StoreFuture<'a, T>> {
        self.fail_all.load(Ordering::SeqCst).then(|| {
            let f: StoreFuture<'a, T> = Box::pin(async {
                Err(IdempotencyStoreError::Unavailable {
                    reason: "injected fault".into(),
                })
            });
            f
        })
    }
}

impl IdempotencyStore for Faulty {
    fn ensure_schema(&self) -> StoreFuture<'_, ()> {
        self.down().unwrap_or_else(|| self.inner.ensure_schema())
    }
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        self.down().unwrap_or_else(|| self.inner.claim(request))
    }
    fn heartbeat(&self, id: RecordId, token: LockToken, lease: Duration) -> StoreFuture<'_, bool> {
        if self.heartbeat_refused.load(Ordering::SeqCst) {
            return Box::pin(async { Ok(false) });
        }
        self.down()
            .unwrap_or_else(|| self.inner.heartbeat(id, token, lease))
    }
    fn advance<'a>(&'a self, id: RecordId, token: LockToken, rp: &'a str) -> StoreFuture<'a, bool> {
        self.down()
            .unwrap_or_else(|| self.inner.advance(id, token, rp))
    }
    fn finalise<'a>(
        &'a self,
        id: RecordId,
        token: LockToken,
        response: &'a StoredResponse,
    ) -> StoreFuture<'a, bool> {
        if self.fail_finalise.load(Ordering::SeqCst) {
            return Box::pin(async {
                Err(IdempotencyStoreError::Unavailable {
                    reason: "injected finalise fault".into(),
                })
            });
        }
        self.down()
            .unwrap_or_else(|| self.inner.finalise(id, token, response))
    }
    fn release(&self, id: RecordId, token: LockToken) -> StoreFuture<'_, bool> {
        self.down().unwrap_or_else(|| self.inner.release(id, token))
    }
    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> StoreFuture<'a, Option<RecordInfo>> {
        self.inner.get(scope, key)
    }
    fn recover<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        action: &'a Recovery,
    ) -> StoreFuture<'a, bool> {
        self.inner.recover(scope, key, action)
    }
    fn reap(&self, batch: u32) -> StoreFuture<'_, ReapReport> {
        self.down().unwrap_or_else(|| self.inner.reap(batch))
    }
    fn list<'a>(&'a self, request: &'a ListRequest) -> StoreFuture<'a, Vec<ListedRecord>> {
        self.down().unwrap_or_else(|| self.inner.list(request))
    }
}
