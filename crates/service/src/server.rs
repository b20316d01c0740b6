//! The router and the listening loop.

use std::future::Future;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};

use crate::auth::{MIN_PUBLIC_TOKEN_CHARS, MIN_PUBLIC_TOKEN_DISTINCT};
use crate::error::{ApiError, PROBLEM_JSON, ServiceError};
use crate::state::{AppState, MAX_BODY_BYTES, ServiceConfig};
use crate::{api, auth, batch, conn, dashboard, guard, idempotency, operator, schedules};

/// The whole application: `/v1` (behind the bearer token, if one is configured), `/metrics`,
/// `/healthz`, `/readyz`, `/openapi.json` and the dashboard, all behind the front door
/// ([`guard`](crate::guard): head limits, `Host`, `Origin`, JSON-only writes).
pub fn app(state: AppState) -> Router {
    // On the handler, not the method router: the layer must not see other methods (405).
    let enqueue = post(api::create_job.layer(state.inner.idempotency.clone()));
    let v1 = Router::new()
        .route("/v1/jobs", enqueue.get(api::list_jobs))
        .route("/v1/jobs/{id}", get(api::get_job))
        .route("/v1/jobs/{id}/replay", post(api::replay_job))
        .route("/v1/jobs/{id}/cancel", post(api::cancel_job))
        .route("/v1/stats", get(api::stats))
        .route("/v1/breakers", get(api::breakers))
        .route("/v1/workers", get(api::workers))
        .route("/v1/idempotency", get(idempotency::list_keys))
        .route("/v1/jobs/bulk", post(operator::bulk))
        .route("/v1/jobs/batch", post(batch::create_jobs))
        .route("/v1/jobs/{id}/run-now", post(operator::run_now))
        .route("/v1/queues", get(operator::paused_queues))
        .route("/v1/queues/{queue}/pause", post(operator::pause_queue))
        .route("/v1/queues/{queue}/resume", post(operator::resume_queue))
        .route(
            "/v1/dependencies/{name}/pause",
            post(operator::pause_dependency),
        )
        .route(
            "/v1/dependencies/{name}/resume",
            post(operator::resume_dependency),
        )
        .route("/v1/breakers/{name}/force", post(operator::force_breaker))
        .route("/v1/audit", get(operator::audit))
        .route("/v1/quotas/{key}", get(operator::card_stop))
        .route("/v1/quotas/{key}/lift", post(operator::lift_card_stop))
        .route(
            "/v1/idempotency/{key}/recover",
            post(idempotency::recover_key),
        )
        .route(
            "/v1/schedules",
            get(schedules::list).post(schedules::upsert),
        )
        .route("/v1/schedules/{name}", delete(schedules::remove))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            guard::json_writes,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_bearer,
        ));
    let metrics = get(api::metrics).route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_metrics_auth,
    ));
    Router::new()
        .merge(v1)
        .merge(dashboard::routes(state.clone()))
        .route("/metrics", metrics)
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/openapi.json", get(api::openapi))
        .fallback(not_found)
        .layer(middleware::map_response(problem_for_bare_errors))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::front_door,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such page; see / for the dashboard and /openapi.json for the API")
}

/// axum answers some errors itself (405, a bad path, a body rejection) with a plain body;
/// turn every such 4xx/5xx into problem+json so clients see one error format.
async fn problem_for_bare_errors(res: Response) -> Response {
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let typed = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(PROBLEM_JSON) || v.starts_with("text/html"));
    if typed {
        return res;
    }
    let allow = res.headers().get(header::ALLOW).cloned();
    let (slug, title) = match status {
        StatusCode::METHOD_NOT_ALLOWED => ("method-not-allowed", "Method not allowed"),
        StatusCode::PAYLOAD_TOO_LARGE => ("body-too-large", "The request body is too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported-media-type", "Unsupported media type"),
        s if s.is_server_error() => ("internal", "Internal error"),
        _ => ("bad-request", "Bad request"),
    };
    let detail = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            "this route does not take that method; see /openapi.json".to_owned()
        }
        StatusCode::PAYLOAD_TOO_LARGE => format!("the body is larger than {MAX_BODY_BYTES} bytes"),
        s => s.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let mut out = ApiError::new(status, slug, title, detail).into_response();
    if let Some(a) = allow {
        out.headers_mut().insert(header::ALLOW, a);
    }
    out
}

fn is_loopback(addr: &std::net::SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// Whether `token` may guard a service on `addr`: beyond loopback a token is required, of at
/// least [`MIN_PUBLIC_TOKEN_CHARS`] characters, [`MIN_PUBLIC_TOKEN_DISTINCT`] of them distinct.
///
/// # Errors
/// [`ServiceError::TokenRequired`], [`ServiceError::TokenTooShort`],
/// [`ServiceError::TokenTooSimple`].
pub fn check_exposure(
    addr: &std::net::SocketAddr,
    token: Option<&str>,
) -> Result<(), ServiceError> {
    if is_loopback(addr) {
        return Ok(());
    }
    match token {
        None => Err(ServiceError::TokenRequired { addr: *addr }),
        Some(t) if t.chars().count() < MIN_PUBLIC_TOKEN_CHARS => Err(ServiceError::TokenTooShort {
            addr: *addr,
            chars: t.chars().count(),
            min: MIN_PUBLIC_TOKEN_CHARS,
        }),
        Some(t) => {
            let distinct = t.chars().collect::<std::collections::BTreeSet<_>>().len();
            if distinct < MIN_PUBLIC_TOKEN_DISTINCT {
                return Err(ServiceError::TokenTooSimple {
                    addr: *addr,
                    distinct,
                    min: MIN_PUBLIC_TOKEN_DISTINCT,
                });
            }
            Ok(())
        }
    }
}

/// Binds `config.addr`, prints `listening on http://ADDR` (the bound address, so port 0 shows
/// the port picked) and serves until `shutdown` completes, then finishes in-flight requests.
///
/// # Errors
/// [`ServiceError::TokenRequired`] for a non-loopback address without a token, and
/// [`ServiceError::TokenTooShort`] with a token shorter than [`MIN_PUBLIC_TOKEN_CHARS`]
/// (nothing is bound); [`ServiceError::Bind`], [`ServiceError::Serve`], and the errors of
/// [`AppState::new`].
pub async fn serve(
    config: ServiceConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let mut secrets: Vec<&str> = config.app.token.iter().map(String::as_str).collect();
    secrets.extend(config.app.tokens.iter().map(|t| t.secret.as_str()));
    if secrets.is_empty() {
        check_exposure(&config.addr, None)?;
    }
    for secret in secrets {
        check_exposure(&config.addr, Some(secret))?;
    }
    let state = AppState::new(config.store, config.app).await?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|source| ServiceError::Bind {
            addr: config.addr,
            source,
        })?;
    serve_listener(listener, state, shutdown).await
}

/// Serves `state` on an already bound listener (tests bind 127.0.0.1:0 themselves), printing
/// `listening on http://ADDR`, until `shutdown` completes; expired idempotency records are
/// reaped meanwhile. The connections are limited as the state's
/// [`ConnLimits`](crate::ConnLimits) say (see [`conn`](crate::conn)).
///
/// # Errors
/// [`ServiceError::Serve`] when the listener's address cannot be read.
pub async fn serve_listener(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let local = listener.local_addr().map_err(ServiceError::Serve)?;
    println!("listening on http://{local}");
    serve_listener_quietly(listener, state, shutdown).await
}

/// [`serve_listener`] without the `listening on` line, for a caller that reports the address
/// itself (`redrive bench --api-batch`, whose stdout may be one JSON document).
///
/// # Errors
/// [`ServiceError::Serve`] when the listener's address cannot be read.
pub async fn serve_listener_quietly(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    let local = listener.local_addr().map_err(ServiceError::Serve)?;
    // Expired idempotency records are deleted while the service runs.
    let reaper = redrive_idempotency::spawn_reaper(
        state.inner.idempotency.store().clone(),
        redrive_idempotency::DEFAULT_REAP_INTERVAL,
        redrive_idempotency::DEFAULT_REAP_BATCH,
    );
    tracing::info!(%local, "redrive serve listening");
    let limits = state.inner.connections;
    let slots = state.inner.connection_slots.clone();
    conn::serve(listener, app(state), limits, slots, shutdown).await;
    reaper.abort();
    Ok(())
}
