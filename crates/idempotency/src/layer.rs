//! The tower [`Layer`] and [`Service`].

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::BoxError;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use futures::{FutureExt, StreamExt};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tower::{Layer, Service, ServiceExt};

use super::config::{IdempotencyConfig, IdempotencyLayerBuilder, RecoveryMode};
use super::error::{CtxError, Problem, ProblemKind};
use super::key::{IDEMPOTENT_REPLAYED, KeyError, parse_key};
use super::store::{
    Acquired, ClaimOutcome, ClaimRequest, IdempotencyStore, LockToken, RecordId, StoredResponse,
};

struct Shared {
    config: IdempotencyConfig,
    store: Arc<dyn IdempotencyStore>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("store", &self.store)
            .finish()
    }
}

/// Adds server-side idempotency to a router or service (see the [module docs](super)).
#[derive(Debug, Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl IdempotencyLayer {
    /// A builder with the defaults, storing in `store`.
    #[must_use]
    pub fn builder(store: Arc<dyn IdempotencyStore>) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder::new(store)
    }

    /// A layer with every default (see [`IdempotencyLayerBuilder`]).
    #[must_use]
    pub fn new(store: Arc<dyn IdempotencyStore>) -> Self {
        Self::from_parts(store, IdempotencyConfig::defaults())
    }

    pub(crate) fn from_parts(store: Arc<dyn IdempotencyStore>, config: IdempotencyConfig) -> Self {
        Self {
            shared: Arc::new(Shared { config, store }),
        }
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.shared.store
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &IdempotencyConfig {
        &self.shared.config
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service made by [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// What the layer tells the handler, as a request extension.
///
/// A handler that makes a foreign call (a PSP charge) should derive the downstream key with
/// [`downstream_key`](Self::downstream_key), move its [`recovery_point`](Self::recovery_point)
/// forward with [`advance`](Self::advance) (or its own fenced update in the same transaction
/// as its business writes: `WHERE id = record_id AND lock_token = token`), and check
/// [`lease_held`](Self::lease_held) before each side effect.
#[derive(Debug, Clone)]
pub struct IdempotencyCtx {
    record_id: RecordId,
    token: LockToken,
    scope: Arc<str>,
    recovery_point: Arc<str>,
    attempts: u32,
    resumed: bool,
    store: Arc<dyn IdempotencyStore>,
    lease_lost: watch::Receiver<bool>,
}

impl IdempotencyCtx {
    /// The stored record.
    #[must_use]
    pub fn record_id(&self) -> RecordId {
        self.record_id
    }

    /// The fencing token of this run.
    #[must_use]
    pub fn lock_token(&self) -> LockToken {
        self.token
    }

    /// The scope of the key.
    #[must_use]
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Where the previous run got to (`started` on a first run).
    #[must_use]
    pub fn recovery_point(&self) -> &str {
        &self.recovery_point
    }

    /// Runs of this record so far, this one included.
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether this run took over a released or abandoned record.
    #[must_use]
    pub fn is_resumed(&self) -> bool {
        self.resumed
    }

    /// Whether the layer still holds the lease (check before each side effect).
    #[must_use]
    pub fn lease_held(&self) -> bool {
        !*self.lease_lost.borrow()
    }

    /// A key for a downstream call at `step`, the same on every run of this record:
    /// 32 hex characters of `SHA-256(scope ‖ 0 ‖ record id ‖ 0 ‖ step)`.
    #[must_use]
    pub fn downstream_key(&self, step: &str) -> String {
        let mut h = Sha256::new();
        h.update(self.scope.as_bytes());
        h.update([0]);
        h.update(self.record_id.0.to_be_bytes());
        h.update([0]);
        h.update(step.as_bytes());
        let digest = h.finalize();
        digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// Stores a new recovery point (fenced by this run's token).
    ///
    /// # Errors
    /// [`CtxError::LeaseLost`] when another run holds the record, [`CtxError::Store`] when
    /// the store fails.
    pub async fn advance(&self, recovery_point: &str) -> Result<(), CtxError> {
        let id = self.record_id.0;
        if !self.lease_held() {
            return Err(CtxError::LeaseLost { id });
        }
        match self
            .store
            .advance(self.record_id, self.token, recovery_point)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(CtxError::LeaseLost { id }),
            Err(source) => Err(CtxError::Store { id, source }),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ResBody> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness of the inner service is awaited inside the call, after the claim.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(handle(shared, inner, request.map(Body::new)))
    }
}

async fn pass_through<S, ResBody>(
    inner: S,
    request: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let response = inner.oneshot(request).await?;
    Ok(response.map(Body::new))
}

async fn handle<S, ResBody>(
    shared: Arc<Shared>,
    inner: S,
    request: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let config = &shared.config;
    if !config.methods.contains(request.method()) {
        return pass_through(inner, request).await;
    }
    let problem = |p: Problem| Ok(p.to_response(&config.problem_base));
    let key = match parse_key(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) if !config.required => return pass_through(inner, request).await,
        Ok(None) => {
            let mut p = Problem::new(
                ProblemKind::KeyMissing,
                "header `Idempotency-Key` is required on this route; send 1 to 255 bytes of visible ASCII, e.g. a UUID",
            );
            if let Some(url) = &config.docs_url {
                p = p.with_link(format!("<{url}>; rel=\"describedby\""));
            }
            return problem(p);
        }
        Err(e) => return problem(Problem::new(ProblemKind::KeyInvalid, e.to_string())),
    };
    if config.uuid_keys && uuid::Uuid::try_parse(key.as_str()).is_err() {
        return problem(Problem::new(
            ProblemKind::KeyInvalid,
            KeyError::NotUuid.to_string(),
        ));
    }
    let (parts, body) = request.into_parts();
    let scope = match config.scope.extract(&parts) {
        Ok(scope) => scope,
        Err(why) => return problem(Problem::new(ProblemKind::ScopeMissing, why)),
    };
    let body = match read_body(&parts, body, config.max_request_bytes).await {
        Ok(body) => body,
        Err(p) => return problem(p),
    };
    let claim = ClaimRequest {
        scope: scope.clone(),
        key: key.as_str().to_owned(),
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_owned(),
        fingerprint: config.fingerprint.compute(&parts, &body),
        token: LockToken::new(),
        lease: config.lease,
        retention: config.retention,
        take_over_abandoned: config.recovery == RecoveryMode::Resume,
    };
    let outcome = match shared.store.claim(&claim).await {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::error!(error = %e, source = ?std::error::Error::source(&e), "idempotency claim failed; refusing the request");
            return problem(
                Problem::new(
                    ProblemKind::StoreUnavailable,
                    "the idempotency store could not be reached; the request was not processed",
                )
                .with_retry_after(config.unavailable_retry_after),
            );
        }
    };
    match outcome {
        ClaimOutcome::Acquired(acquired) => {
            let request = Request::from_parts(parts, Body::from(body));
            execute(shared.clone(), inner, request, acquired, scope, claim.token).await
        }
        ClaimOutcome::Mismatch => problem(Problem::new(
            ProblemKind::KeyReused,
            "header `Idempotency-Key` was already used for a different request (its method, path, query, content type or body differ); use a new key for a new request",
        )),
        ClaimOutcome::InProgress => problem(
            Problem::new(
                ProblemKind::RequestInProgress,
                "the first request with this `Idempotency-Key` is still being processed; retry later with the same key",
            )
            .with_retry_after(config.in_progress_retry_after),
        ),
        ClaimOutcome::Abandoned => problem(Problem::new(
            ProblemKind::RecoveryRequired,
            "the first request with this `Idempotency-Key` was interrupted before its response was stored and may have taken effect; it will not be run again until it is recovered explicitly",
        )),
        ClaimOutcome::Completed(stored) => Ok(replay(&shared.config, stored)),
    }
}

async fn read_body(
    parts: &axum::http::request::Parts,
    body: Body,
    limit: usize,
) -> Result<Bytes, Problem> {
    let too_large = || {
        Problem::new(
            ProblemKind::RequestTooLarge,
            format!("the request body is over the limit of {limit} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            Problem::new(
                ProblemKind::BodyUnreadable,
                format!("reading the request body failed: {e}"),
            )
        })?;
        if buffer.len() + chunk.len() > limit {
            return Err(too_large());
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buffer))
}

fn replay(config: &IdempotencyConfig, stored: StoredResponse) -> Response<Body> {
    if stored.replay_unavailable {
        let location = stored
            .headers
            .iter()
            .find(|(n, _)| n == header::LOCATION.as_str())
            .and_then(|(_, v)| std::str::from_utf8(v).ok().map(str::to_owned));
        let mut p = Problem::new(
            ProblemKind::ReplayUnavailable,
            format!(
                "the request with this `Idempotency-Key` completed with status {}, but its response was too large to store{}",
                stored.status,
                location
                    .as_deref()
                    .map(|l| format!("; the resource is at {l}"))
                    .unwrap_or_default()
            ),
        );
        if let Some(l) = location {
            p = p.with_link(format!("<{l}>; rel=\"related\""));
        }
        return p.to_response(&config.problem_base);
    }
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::from_bytes(&value))
        {
            headers.append(name, value);
        }
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// Aborts the heartbeat task when the run ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn spawn_heartbeat(
    store: Arc<dyn IdempotencyStore>,
    id: RecordId,
    token: LockToken,
    config: &IdempotencyConfig,
    lost: watch::Sender<bool>,
) -> AbortOnDrop {
    let (lease, every) = (config.lease, config.heartbeat_interval);
    AbortOnDrop(tokio::spawn(async move {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(every).await;
            match store.heartbeat(id, token, lease).await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(
                        record = id.0,
                        "idempotency lease lost: another run holds the record"
                    );
                    let _ = lost.send(true);
                    return;
                }
                Err(e) => {
                    tracing::warn!(record = id.0, error = %e, "idempotency heartbeat failed");
                    if last_ok.elapsed() >= lease {
                        tracing::error!(
                            record = id.0,
                            "idempotency lease lost: no heartbeat for a whole lease"
                        );
                        let _ = lost.send(true);
                        return;
                    }
                }
            }
        }
    }))
}

/// Runs the handler in its own task, so a client that disconnects does not cancel a payment
/// halfway: the run always ends in a finalise or a release (or, when the process dies, in
/// an abandoned record that needs explicit recovery).
async fn execute<S, ResBody>(
    shared: Arc<Shared>,
    inner: S,
    mut request: Request<Body>,
    acquired: Acquired,
    scope: String,
    token: LockToken,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (lost_tx, lost_rx) = watch::channel(false);
    let ctx = IdempotencyCtx {
        record_id: acquired.id,
        token,
        scope: Arc::from(scope),
        recovery_point: Arc::from(acquired.recovery_point),
        attempts: acquired.attempts,
        resumed: acquired.resumed,
        store: shared.store.clone(),
        lease_lost: lost_rx.clone(),
    };
    request.extensions_mut().insert(ctx);
    let task = tokio::spawn(run(
        shared.clone(),
        inner,
        request,
        acquired.id,
        token,
        lost_tx,
        lost_rx,
    ));
    match task.await {
        Ok(result) => result,
        Err(e) => {
            // The run task itself failed (it catches handler panics, so this is a bug or
            // a runtime shutdown); the record is left to its lease.
            tracing::error!(error = %e, "idempotency run task failed");
            Ok(
                Problem::new(ProblemKind::HandlerFailed, "the request failed")
                    .to_response(&shared.config.problem_base),
            )
        }
    }
}

enum RunEnd<T> {
    Done(T),
    LeaseLost,
}

async fn run<S, ResBody>(
    shared: Arc<Shared>,
    inner: S,
    request: Request<Body>,
    id: RecordId,
    token: LockToken,
    lost_tx: watch::Sender<bool>,
    mut lost_rx: watch::Receiver<bool>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let config = &shared.config;
    let store = &shared.store;
    let base = config.problem_base.as_str();
    let _heartbeat = spawn_heartbeat(store.clone(), id, token, config, lost_tx);
    let call = AssertUnwindSafe(inner.oneshot(request)).catch_unwind();
    let lease_lost = async move {
        if lost_rx.wait_for(|lost| *lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let end = tokio::select! {
        result = call => RunEnd::Done(result),
        () = lease_lost => RunEnd::LeaseLost,
    };
    let release = |why: &'static str| async move {
        match store.release(id, token).await {
            Ok(true) => tracing::debug!(record = id.0, why, "idempotency key released"),
            Ok(false) => tracing::error!(
                record = id.0,
                why,
                "idempotency release refused: another run holds the record"
            ),
            Err(e) => {
                tracing::error!(record = id.0, why, error = %e, "idempotency release failed; the key is freed when its lease ends")
            }
        }
    };
    let response = match end {
        RunEnd::LeaseLost => {
            return Ok(Problem::new(
                ProblemKind::LeaseLost,
                "the idempotency lease of this request was lost; the handler was stopped; retry with the same key",
            )
            .with_retry_after(config.in_progress_retry_after)
            .to_response(base));
        }
        RunEnd::Done(Err(_panic)) => {
            tracing::error!(
                record = id.0,
                "handler panicked behind the idempotency layer"
            );
            release("panic").await;
            return Ok(Problem::new(
                ProblemKind::HandlerFailed,
                "the request failed; it may be retried with the same key",
            )
            .to_response(base));
        }
        RunEnd::Done(Ok(Err(e))) => {
            release("service error").await;
            return Err(e);
        }
        RunEnd::Done(Ok(Ok(response))) => response,
    };
    if response.status().is_server_error() && !config.store_5xx {
        release("5xx").await;
        return Ok(response.map(Body::new));
    }
    if response.status() == StatusCode::BAD_REQUEST && !config.store_400 {
        // A malformed request had no effect: the key is free for the corrected one.
        if let Err(e) = store.forget(id, token).await {
            tracing::warn!(record = id.0, error = %e, "giving the key up after a 400 failed");
        }
        return Ok(response.map(Body::new));
    }
    let (parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(Body::new(body), usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::error!(record = id.0, error = %e, "response body failed behind the idempotency layer");
            release("response body error").await;
            return Ok(Problem::new(
                ProblemKind::HandlerFailed,
                "the request failed; it may be retried with the same key",
            )
            .to_response(base));
        }
    };
    let replay_unavailable = bytes.len() > config.max_response_bytes;
    let stored = StoredResponse {
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .filter(|(name, _)| config.replayed_headers.contains(name))
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect(),
        body: if replay_unavailable {
            Vec::new()
        } else {
            bytes.to_vec()
        },
        replay_unavailable,
    };
    match store.finalise(id, token, &stored).await {
        Ok(true) => {}
        Ok(false) => tracing::error!(
            record = id.0,
            "idempotency finalise refused: another run took the record over; its result wins"
        ),
        Err(e) => tracing::error!(
            record = id.0,
            error = %e,
            "idempotency finalise failed; the record stays in progress and needs explicit recovery after its lease"
        ),
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}
