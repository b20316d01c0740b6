//! The `/v1` JSON API, `/metrics`, `/healthz`, `/readyz` and `/openapi.json`.

use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use redrive_http::{JobRequest, RunAt};
use redrive_store::{JobId, JobState, ListParams, NewJob, Store};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tracing::Instrument;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::{ApiError, ProblemBody};
use crate::state::{AppState, MAX_BODY_BYTES};
use crate::views::*;

/// The longest `delay` accepted.
pub const MAX_DELAY: Duration = redrive_http::validate::MAX_DELAY;

/// Transitions shown per breaker.
pub const TRANSITIONS_PER_BREAKER: u32 = 10;

/// Reads a request body of at most [`MAX_BODY_BYTES`]; larger → 413 problem+json.
pub(crate) async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if too_large {
                let mut p = ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body-too-large",
                    "The request body is too large",
                    format!("the body is larger than {MAX_BODY_BYTES} bytes"),
                );
                p.field = Some("body".into());
                p
            } else {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "body-unreadable",
                    "The request body could not be read",
                    e.to_string(),
                )
            }
        })
}

const ENQUEUE_FIELDS: [&str; 11] = [
    "queue",
    "kind",
    "payload",
    "key",
    "delay",
    "run_at",
    "policy",
    "dependency",
    "priority",
    "max_attempts",
    "quota_key",
];

/// An integer field: JSON Schema's `integer` admits `5.0`, so an integral float is accepted too.
fn take_int<T: TryFrom<i64>>(
    obj: &mut Map<String, Value>,
    name: &str,
) -> Result<Option<T>, ApiError> {
    let Some(v) = obj.remove(name).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let shown = v.to_string();
    let n = match &v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        }),
        _ => None,
    };
    let n = n.ok_or_else(|| {
        ApiError::bad_field(
            name,
            &shown,
            format!("{name}: expected a whole number, got {shown}"),
        )
    })?;
    T::try_from(n)
        .map(Some)
        .map_err(|_| ApiError::bad_field(name, &shown, format!("{name}: {shown} is out of range")))
}

fn take<T: DeserializeOwned>(
    obj: &mut Map<String, Value>,
    name: &str,
) -> Result<Option<T>, ApiError> {
    match obj.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let shown = match &v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            serde_json::from_value(v)
                .map(Some)
                .map_err(|e| ApiError::bad_field(name, &shown, format!("{name}: {e}")))
        }
    }
}

fn required<T>(v: Option<T>, name: &str) -> Result<T, ApiError> {
    v.ok_or_else(|| ApiError::bad_field(name, "", format!("{name} is required")))
}

/// A refusal of the shared enqueue validation as a problem: 422 naming the field.
pub(crate) fn enqueue_problem(e: redrive_http::EnqueueError) -> ApiError {
    let detail = redrive_http::redact::redact_text(&e.to_string());
    match e {
        redrive_http::EnqueueError::Invalid { field, value, .. } => {
            ApiError::unprocessable(field, &value, detail)
        }
        redrive_http::EnqueueError::KeyConflict { key, .. } => {
            ApiError::unprocessable("key", &key, detail)
        }
        other => ApiError::unprocessable("job", "", other.to_string()),
    }
}

/// Why a payload with card data is refused (`--refuse-card-data`).
pub(crate) const CARD_DATA_REFUSED: &str = "the payload carries card data (a card number or a \
    card field such as cvc); this service refuses it: send a token from your PSP instead";

/// Turns the body of `POST /v1/jobs` into a job, naming the first bad field.
pub(crate) fn parse_enqueue(
    state: &AppState,
    body: &[u8],
    header_key: Option<&str>,
    now: redrive_store::Timestamp,
) -> Result<NewJob, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_field("body", "", format!("the body is not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::bad_field(
            "body",
            &value.to_string(),
            "the body must be a JSON object",
        ));
    };
    parse_enqueue_object(state, obj, header_key, now)
}

/// Turns one job object (the body of `POST /v1/jobs`, or an item of `POST /v1/jobs/batch`)
/// into a job, naming the first bad field.
pub(crate) fn parse_enqueue_object(
    state: &AppState,
    obj: Map<String, Value>,
    header_key: Option<&str>,
    now: redrive_store::Timestamp,
) -> Result<NewJob, ApiError> {
    parse_job_object(
        &state.inner.policies.current(),
        state.inner.refuse_card_data,
        obj,
        header_key,
        now,
    )
}

/// Turns one job object as the API takes it (`queue`, `kind`, `payload`, `key`, `delay`,
/// `run_at`, `policy`, `dependency`, `priority`, `max_attempts`, `quota_key`) into a validated
/// job: the parser of `POST /v1/jobs`, shared with `redrive enqueue --file`. `header_key` is
/// the job's key when the object has none; `refuse_card_data` refuses a payload carrying card
/// data (`redrive serve --refuse-card-data`).
///
/// # Errors
/// An [`ApiError`] naming the first bad field: 400 for a malformed or unknown one, 422 for a
/// value refused (out of range, an unknown policy, a `max_attempts` above the policy's).
pub fn parse_job_object(
    policies: &redrive_policy::PolicySet,
    refuse_card_data: bool,
    mut obj: Map<String, Value>,
    header_key: Option<&str>,
    now: redrive_store::Timestamp,
) -> Result<NewJob, ApiError> {
    if let Some(unknown) = obj.keys().find(|k| !ENQUEUE_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_field(
            unknown.clone(),
            "",
            format!(
                "unknown field {unknown:?}; expected one of {}",
                ENQUEUE_FIELDS.join(", ")
            ),
        ));
    }
    let queue: String = required(take(&mut obj, "queue")?, "queue")?;
    let kind: String = required(take(&mut obj, "kind")?, "kind")?;
    let payload: Value = take(&mut obj, "payload")?.unwrap_or_else(|| Value::Object(Map::new()));
    let key: Option<String> = take(&mut obj, "key")?;
    let delay: Option<String> = take(&mut obj, "delay")?;
    let run_at_raw: Option<String> = take(&mut obj, "run_at")?;
    let policy_name: Option<String> = take(&mut obj, "policy")?;
    let dependency: Option<String> = take(&mut obj, "dependency")?;
    let priority: Option<i32> = take_int(&mut obj, "priority")?;
    let max_attempts: Option<u32> = take_int(&mut obj, "max_attempts")?;
    let quota_key: Option<String> = take(&mut obj, "quota_key")?;
    if refuse_card_data && let Some(path) = redrive_http::redact::find_card_data(&payload) {
        let detail = format!("{path}: {CARD_DATA_REFUSED}");
        return Err(ApiError::unprocessable(path, "", detail));
    }

    let policy_name = policy_name.as_deref().unwrap_or("payment");
    let policy = policies
        .get(policy_name)
        .map_err(|e| ApiError::unprocessable("policy", policy_name, e.to_string()))?;
    let run_at = match (delay, run_at_raw) {
        (Some(d), Some(_)) => {
            return Err(ApiError::bad_field(
                "delay",
                &d,
                "give delay or run_at, not both",
            ));
        }
        (Some(d), None) => RunAt::After(
            redrive_policy::parse_duration(&d)
                .map_err(|e| ApiError::bad_field("delay", &d, e.to_string()))?,
        ),
        (None, Some(t)) => RunAt::At(
            chrono::DateTime::parse_from_rfc3339(&t)
                .map(|t| t.with_timezone(&chrono::Utc))
                .map_err(|e| {
                    ApiError::bad_field(
                        "run_at",
                        &t,
                        format!("expected an RFC 3339 time like 2026-12-02T10:00:00Z: {e}"),
                    )
                })?,
        ),
        (None, None) => RunAt::Now,
    };
    JobRequest {
        key: key.or_else(|| header_key.map(str::to_owned)),
        priority,
        max_attempts,
        dependency,
        run_at,
        quota_key,
        ..JobRequest::new(queue, kind, payload)
    }
    .build(policy, now)
    .map_err(enqueue_problem)
}

/// Enqueue a job.
///
/// With an `Idempotency-Key` header a repeat returns the first response (marked
/// `Idempotent-Replayed: true`); without `key` in the body the header is also the job's key, so
/// the store's dedupe holds across retention too. A repeat of a body `key` returns the existing
/// job with 200 and `created: false` when the kind and payload are the same, and 422 naming
/// the key when they differ.
///
/// A request with an `Idempotency-Key` whose process vanished (killed, crashed) before it
/// answered holds its key for the recovery window (`redrive serve
/// --idempotency-recovery-window`, default 30 s); meanwhile a repeat gets 409, afterwards the
/// repeat runs the enqueue again and finds the job by its key if the first run made it.
#[utoipa::path(
    post, path = "/v1/jobs", tag = "jobs",
    request_body = EnqueueRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes the request safe to repeat")),
    responses(
        (status = 201, description = "Enqueued", body = EnqueueResponse),
        (status = 200, description = "A job with this queue and key already existed", body = EnqueueResponse),
        (status = 400, description = "Malformed body, field or header", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "The first request with this Idempotency-Key is in flight (or vanished less than the recovery window ago)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "Body over 1 MiB", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A value out of range, or the Idempotency-Key reused for another request", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable, or its SQLite file deleted or replaced (the job is not acknowledged)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn create_job(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(body).await?;
    let now = state.now();
    // The layer has validated the header already; its parsed form drops the optional quotes.
    let header_key = redrive_idempotency::parse_key(&headers).ok().flatten();
    let mut job = parse_enqueue(&state, &body, header_key.as_ref().map(|k| k.as_str()), now)?;
    // W3C trace context: an invalid `traceparent` is ignored (the spec's rule), not refused.
    let received = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| redrive_store::TraceParent::parse(s).ok())
        .map(|t| t.to_string());
    let span = tracing::info_span!("enqueue", queue = %job.queue, kind = %job.kind,
        job = tracing::field::Empty, created = tracing::field::Empty);
    redrive_runtime::trace::set_parent(&span, received.as_deref());
    // Stored with the job: the enqueue span's own context (with `otel`), so the attempts are
    // its children; else the one received.
    job.traceparent = redrive_runtime::trace::of_span(&span).or(received);
    let e = state
        .inner
        .store
        .enqueue(&job, now)
        .instrument(span.clone())
        .await?;
    span.record("job", e.job.id);
    span.record("created", e.created);
    if !e.created {
        // The same key for another request is refused, as the CLI refuses it.
        redrive_http::check_same_request(&job, &e.job).map_err(enqueue_problem)?;
    }
    let status = if e.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let location = format!("/v1/jobs/{}", e.job.id);
    let mut res = (
        status,
        Json(EnqueueResponse {
            created: e.created,
            job: e.job.into(),
        }),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    Ok(res)
}

/// A query parameter a route does not take: 400 naming it and the ones it takes.
pub(crate) fn unknown_param(name: &str, known: &[&str]) -> ApiError {
    ApiError::bad_field(
        name,
        "",
        format!(
            "unknown query parameter {name:?}; this route takes {}",
            known.join(", ")
        ),
    )
}

/// The query parameters of `GET /v1/jobs`.
pub(crate) const LIST_PARAMS: [&str; 5] = ["state", "queue", "key", "limit", "after"];

/// Parses `state`, `queue`, `key`, `limit`, `after` of a listing.
///
/// With `empty_is_any` (the dashboard's filter form) an empty `state`, `queue` or `key` means
/// no filter and other parameters are the form's own; the API refuses an empty state (it is
/// not one of the states) and any parameter it does not take (400 naming it).
pub(crate) fn parse_list(query: Option<&str>, empty_is_any: bool) -> Result<ListParams, ApiError> {
    let mut p = ListParams {
        limit: Some(50),
        ..Default::default()
    };
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "state" if empty_is_any && v.is_empty() => {}
            "state" => {
                p.state = Some(
                    v.parse::<JobState>()
                        .map_err(|e| ApiError::bad_field("state", &v, e.to_string()))?,
                );
            }
            "queue" if !v.is_empty() => p.queue = Some(v.into_owned()),
            "key" if v.len() > redrive_store::MAX_NAME_LEN => {
                return Err(ApiError::bad_field(
                    "key",
                    &v,
                    "key is at most 255 bytes (no job has a longer one)",
                ));
            }
            "key" if !v.is_empty() => p.key = Some(v.into_owned()),
            "key" if !empty_is_any => {
                return Err(ApiError::bad_field("key", "", "key must not be empty"));
            }
            "limit" => {
                let n: u32 = v.parse().map_err(|_| {
                    ApiError::bad_field("limit", &v, "limit must be a whole number 1..=1000")
                })?;
                if !(1..=1000).contains(&n) {
                    return Err(ApiError::bad_field("limit", &v, "limit must be 1..=1000"));
                }
                p.limit = Some(n);
            }
            "after" => {
                let n: i64 = v.parse().map_err(|_| {
                    ApiError::bad_field("after", &v, "after must be a job id (a whole number >= 0)")
                })?;
                if n < 0 {
                    return Err(ApiError::bad_field("after", &v, "after must be >= 0"));
                }
                p.after = Some(n);
            }
            k if !empty_is_any && !LIST_PARAMS.contains(&k) => {
                return Err(unknown_param(k, &LIST_PARAMS));
            }
            _ => {}
        }
    }
    Ok(p)
}

/// List jobs by id, with keyset pagination. `key` finds the jobs with that idempotency key
/// (at most one per queue; add `queue` for one). A parameter not listed here is a 400 naming
/// it.
#[utoipa::path(
    get, path = "/v1/jobs", tag = "jobs",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of jobs; pass `next` as `after` for the next", body = JobPage),
        (status = 400, description = "Bad or unknown query parameter (`field` names it)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_jobs(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<JobPage>, ApiError> {
    let p = parse_list(query.as_deref(), false)?;
    let page = state.inner.store.list(&p).await?;
    Ok(Json(JobPage {
        jobs: page.jobs.into_iter().map(JobView::from).collect(),
        next: page.next,
    }))
}

/// Parses a job id from the path.
pub(crate) fn parse_id(raw: &str) -> Result<JobId, ApiError> {
    raw.parse::<JobId>()
        .map_err(|_| ApiError::bad_field("id", raw, "id must be a whole number"))
}

async fn job_or_404(store: &Store, id: JobId) -> Result<redrive_store::Job, ApiError> {
    store
        .get(id)
        .await?
        .ok_or_else(|| redrive_store::StoreError::JobNotFound { id }.into())
}

/// One job with every attempt.
#[utoipa::path(
    get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = i64, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job and its attempts", body = JobDetail),
        (status = 400, description = "The id is not a number", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn get_job(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<JobDetail>, ApiError> {
    let id = parse_id(&id)?;
    let job = job_or_404(&state.inner.store, id).await?;
    let attempts = state.inner.store.attempts(id).await?;
    let waiting = state.inner.store.waiting_because(&job).await?;
    Ok(Json(JobDetail {
        job: job.into(),
        attempts: attempts.into_iter().map(AttemptView::from).collect(),
        waiting_because: waiting.into_iter().map(WaitingView::from).collect(),
    }))
}

/// Replays one dead job (returns it, available again).
/// Audited (in the same transaction) as `who`'s.
pub(crate) async fn replay_one(
    store: &Store,
    id: JobId,
    who: &redrive_store::Actor,
) -> Result<redrive_store::Job, ApiError> {
    act_on_one(
        store,
        id,
        who,
        redrive_store::BulkAction::Replay,
        "replay (only dead jobs can be replayed)",
    )
    .await
}

/// `action` on the job `id`, audited as `who`'s: the job as it is after, 404 for none, 409
/// (naming `operation`) when the action did not apply to it.
async fn act_on_one(
    store: &Store,
    id: JobId,
    who: &redrive_store::Actor,
    action: redrive_store::BulkAction,
    operation: &'static str,
) -> Result<redrive_store::Job, ApiError> {
    let n = store
        .bulk(
            action,
            &redrive_store::JobFilter::ids(vec![id]),
            who,
            false,
            chrono::Utc::now(),
        )
        .await?
        .count;
    let job = job_or_404(store, id).await?;
    if n == 0 {
        return Err(redrive_store::StoreError::WrongState {
            id,
            state: job.state,
            operation,
        }
        .into());
    }
    Ok(job)
}

/// Put a dead job back in the queue with a fresh budget (its history is kept).
#[utoipa::path(
    post, path = "/v1/jobs/{id}/replay", tag = "jobs",
    params(("id" = i64, Path, description = "Job id")),
    responses(
        (status = 200, description = "Replayed; the job as it is now", body = JobView),
        (status = 400, description = "The id is not a number", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "The job is not dead", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn replay_job(
    State(state): State<AppState>,
    who: Option<axum::extract::Extension<crate::auth::Identity>>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let id = parse_id(&id)?;
    let who = crate::operator::actor(who.as_ref().map(|e| &e.0), "api");
    Ok(Json(replay_one(&state.inner.store, id, &who).await?.into()))
}

/// Cancel a job that has not finished (a running job's lease is revoked).
#[utoipa::path(
    post, path = "/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = i64, Path, description = "Job id")),
    responses(
        (status = 200, description = "Cancelled; the job as it is now", body = JobView),
        (status = 400, description = "The id is not a number", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "The job has already finished", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn cancel_job(
    State(state): State<AppState>,
    who: Option<axum::extract::Extension<crate::auth::Identity>>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let id = parse_id(&id)?;
    let who = crate::operator::actor(who.as_ref().map(|e| &e.0), "api");
    Ok(Json(cancel_one(&state.inner.store, id, &who).await?.into()))
}

/// Cancels one job, audited as `who`'s: 404 for none, 409 when it has finished.
pub(crate) async fn cancel_one(
    store: &Store,
    id: JobId,
    who: &redrive_store::Actor,
) -> Result<redrive_store::Job, ApiError> {
    act_on_one(store, id, who, redrive_store::BulkAction::Cancel, "cancel").await
}

/// Every breaker with its recent transitions.
pub(crate) async fn breaker_views(
    store: &Store,
    range: Option<(usize, usize)>,
) -> Result<(Vec<BreakerView>, usize), ApiError> {
    let now = chrono::Utc::now();
    let mut deps = store.dependencies().await?;
    let total = deps.len();
    if let Some((offset, limit)) = range {
        // The ones that need attention first (not closed, or paused), then by name.
        let quiet = |d: &redrive_store::Dependency| {
            d.flow.effective_state() == redrive_policy::BreakerState::Closed
                && d.flow.mode == redrive_policy::BreakerMode::Normal
                && d.flow.paused_until.is_none()
        };
        deps.sort_by(|a, b| (quiet(a), &a.name).cmp(&(quiet(b), &b.name)));
        deps = deps.into_iter().skip(offset).take(limit).collect();
    }
    let mut out = Vec::new();
    for d in deps {
        let events = store
            .dependency_events(Some(&d.name), TRANSITIONS_PER_BREAKER)
            .await?;
        out.push(BreakerView::new(
            d,
            now,
            events.into_iter().map(TransitionView::from).collect(),
        ));
    }
    Ok((out, total))
}

/// Jobs per queue and state, the breakers, and the jobs waiting for a queue and kind that no
/// live worker runs (`unhandled`).
#[utoipa::path(
    get, path = "/v1/stats", tag = "fleet",
    params(
        ("limit" = Option<u32>, Query, description = "At most this many queues, breakers and unhandled rows each (1..=1000, default 100); `more` counts the rest"),
    ),
    responses(
        (status = 200, description = "Counts, breakers and unhandled kinds", body = StatsResponse),
        (status = 400, description = "A bad or unknown query parameter (named in `field`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn stats(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<StatsResponse>, ApiError> {
    let mut limit = DEFAULT_STATS_LIMIT;
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_field("limit", &v, "limit must be a whole number 1..=1000")
                    })?;
            }
            k => return Err(unknown_param(k, &STATS_PARAMS)),
        }
    }
    let store = &state.inner.store;
    let (counts, more_queues) = redrive_store::labels::busiest_queues(store.counts().await?, limit);
    let mut unhandled = store.unhandled(state.now()).await?;
    unhandled.sort_by_key(|u| std::cmp::Reverse(u.jobs));
    let more_unhandled = unhandled.len().saturating_sub(limit);
    unhandled.truncate(limit);
    let (breakers, total) = breaker_views(store, Some((0, limit))).await?;
    let paused = store.paused_queues().await?;
    Ok(Json(StatsResponse {
        paused_queues: paused.into_iter().map(Into::into).collect(),
        counts: counts.into_iter().map(CountView::from).collect(),
        more: crate::views::MoreView {
            queues: more_queues,
            breakers: total - breakers.len(),
            unhandled: more_unhandled,
        },
        breakers,
        unhandled: unhandled.into_iter().map(UnhandledView::from).collect(),
    }))
}

/// The live workers of the fleet (each process registers itself; a worker not seen for
/// `stale_after_seconds` counts as gone and its row is deleted).
#[utoipa::path(
    get, path = "/v1/workers", tag = "fleet",
    responses(
        (status = 200, description = "Live workers, by name", body = WorkersResponse),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn workers(
    State(state): State<AppState>,
) -> Result<Json<WorkersResponse>, ApiError> {
    let workers = state.inner.store.workers(state.now()).await?;
    Ok(Json(WorkersResponse {
        workers: workers.into_iter().map(WorkerView::from).collect(),
        stale_after_seconds: redrive_store::WORKER_STALE_AFTER.as_secs(),
    }))
}

/// At most this many queues, breakers and unhandled rows in `GET /v1/stats` by default.
pub(crate) const DEFAULT_STATS_LIMIT: usize = 100;

/// The query parameters of `GET /v1/stats`.
const STATS_PARAMS: [&str; 1] = ["limit"];

/// Circuit breakers per dependency: state, next probe, pause, recent transitions.
#[utoipa::path(
    get, path = "/v1/breakers", tag = "fleet",
    responses(
        (status = 200, description = "Breakers", body = BreakersResponse),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn breakers(
    State(state): State<AppState>,
) -> Result<Json<BreakersResponse>, ApiError> {
    Ok(Json(BreakersResponse {
        breakers: breaker_views(&state.inner.store, None).await?.0,
    }))
}

/// The process is up.
#[utoipa::path(
    get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "Up", body = Health))
)]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        backend: None,
    })
}

/// How long a write probe of `/readyz` is reused.
const WRITE_PROBE_REUSE: Duration = Duration::from_secs(1);

/// How long `/readyz` waits for the store's write.
const WRITE_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

fn not_ready(slug: &'static str, detail: impl Into<String>) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        slug,
        "The service is not ready",
        detail,
    )
}

/// The store takes writes: a committed write (reused for a second). `Err`: the detail.
async fn store_writable(state: &AppState) -> Result<(), String> {
    let mut last = state.inner.write_probe.lock().await;
    if let Some((at, r)) = &*last
        && at.elapsed() < WRITE_PROBE_REUSE
    {
        return r.clone();
    }
    let store = &state.inner.store;
    let r = match tokio::time::timeout(
        WRITE_PROBE_TIMEOUT,
        store.check_writable("readyz", chrono::Utc::now()),
    )
    .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the store cannot take writes");
            Err("the job store cannot take writes".to_owned())
        }
        Err(_) => {
            tracing::warn!("readiness: the store's write timed out");
            Err(format!(
                "the job store did not commit a write within {} s",
                WRITE_PROBE_TIMEOUT.as_secs()
            ))
        }
    };
    *last = Some((std::time::Instant::now(), r.clone()));
    r
}

/// Ready: the store answers a read and takes writes (a committed write), on SQLite its file is
/// still the one opened, and the in-process worker pool (`redrive serve --workers N`) runs.
/// 503 otherwise, naming what is wrong (`type` ends in `store-file-changed`,
/// `store-unavailable` or `workers-stopped`).
#[utoipa::path(
    get, path = "/readyz", tag = "health", security(()),
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Not ready: the store cannot take writes, its file was deleted or replaced, or the worker pool stopped", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let store = &state.inner.store;
    if let Err(e) = store.check_file() {
        tracing::error!(error = %e, "readiness: the database file changed");
        return Err(not_ready(
            "store-file-changed",
            "the job store's database file was deleted or replaced since it was opened: nothing written now is durable; restart redrive",
        ));
    }
    // A read of the jobs' table (every time), then a committed write (reused for a second).
    match tokio::time::timeout(WRITE_PROBE_TIMEOUT, store.get(0)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the store cannot be read");
            return Err(not_ready(
                "store-unavailable",
                "the job store cannot be read",
            ));
        }
        Err(_) => {
            tracing::warn!("readiness: the store's read timed out");
            return Err(not_ready(
                "store-unavailable",
                format!(
                    "the job store did not answer a read within {} s",
                    WRITE_PROBE_TIMEOUT.as_secs()
                ),
            ));
        }
    }
    store_writable(&state)
        .await
        .map_err(|why| not_ready("store-unavailable", why))?;
    for c in &state.inner.ready_checks {
        if let Err(why) = c.check() {
            tracing::warn!(check = c.name(), "readiness: {why}");
            return Err(not_ready(c.name(), why));
        }
    }
    Ok(Json(Health {
        status: "ok".into(),
        backend: Some(store.backend().into()),
    }))
}

/// `/metrics`: renders what the recorder holds. No query runs per scrape: the gauges that
/// need the database are set by one background task
/// ([`redrive_runtime::metrics::spawn_gauges`], or the worker pool's own loop).
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let Some(handle) = &state.inner.prometheus else {
        return Err(ApiError::not_found("no Prometheus recorder is installed"));
    };
    let body = handle.render();
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        body,
    )
        .into_response())
}

/// The answers of the front door ([`crate::guard`]), which every route can give: 414, 421 and
/// 431 everywhere, 403 on writes, 415 on `POST /v1/jobs`; and the bearer throttle's 429 on
/// `/v1`.
struct FrontDoorResponses;

impl Modify for FrontDoorResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let problem = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    crate::error::PROBLEM_JSON,
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ProblemBody")))
                        .build(),
                )
                .build()
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let ops = [
                (false, item.get.as_mut()),
                (true, item.post.as_mut()),
                (true, item.put.as_mut()),
                (true, item.patch.as_mut()),
                (true, item.delete.as_mut()),
            ];
            for (write, op) in ops {
                let Some(op) = op else { continue };
                let r = &mut op.responses.responses;
                let mut add = |code: &str, description: &str| {
                    r.entry(code.to_owned())
                        .or_insert_with(|| problem(description).into());
                };
                add("414", "The request target is over 8 KiB (field `uri`)");
                add(
                    "421",
                    "The Host is neither a loopback name nor a --public-host (checked without a \
                     token, and with one when public hosts are configured)",
                );
                add(
                    "431",
                    "The header section is over 32 KiB or 100 fields (field `headers`)",
                );
                if path.starts_with("/v1/") {
                    add(
                        "429",
                        "With a token: this client address sent too many wrong bearer tokens in \
                         the last minute (Retry-After says when to try again)",
                    );
                }
                if write {
                    add(
                        "403",
                        "Without a token: a cross-origin Origin header (field `Origin`)",
                    );
                    if path.starts_with("/v1/") {
                        add(
                            "415",
                            "Without a token: a Content-Type other than application/json (or \
                             none on POST /v1/jobs and POST /v1/jobs/batch)",
                        );
                    }
                }
            }
        }
    }
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The OpenAPI document of the API, generated from the handlers and views.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "redrive",
        description = "A durable job queue and retry engine for payment workers: enqueue jobs \
            (e.g. outbound HTTP calls), list, inspect, replay and cancel them, and watch the \
            fleet's breakers. Errors are application/problem+json with `field` and `value`."
    ),
    paths(
        create_job, crate::batch::create_jobs, list_jobs, get_job, replay_job, cancel_job, stats, breakers, workers, healthz,
        readyz,
        crate::idempotency::list_keys, crate::idempotency::recover_key,
        crate::schedules::list, crate::schedules::upsert, crate::schedules::remove,
        crate::operator::paused_queues, crate::operator::pause_queue,
        crate::operator::resume_queue, crate::operator::pause_dependency,
        crate::operator::resume_dependency, crate::operator::force_breaker,
        crate::operator::run_now, crate::operator::bulk, crate::operator::audit,
        crate::operator::card_stop, crate::operator::lift_card_stop
    ),
    components(schemas(
        EnqueueRequest, EnqueueResponse, crate::batch::BatchRequest, crate::batch::BatchResponse,
        crate::batch::BatchItem, crate::batch::BatchProblem, crate::batch::BatchItemError, JobView, AttemptView, JobPage, JobDetail, WaitingView, StateName,
        CountView, BreakerView, TransitionView, BreakersResponse, StatsResponse, Health, ProblemBody,
        UnhandledView, WorkerView, WorkersResponse, crate::views::MoreView,
        crate::idempotency::IdempotencyRecordView, crate::idempotency::IdempotencyPage,
        crate::schedules::ScheduleRequest, crate::schedules::ScheduleView,
        crate::schedules::ScheduleList, crate::schedules::ScheduleUpsert,
        crate::operator::QueueStateView, crate::operator::PausedQueueView,
        crate::operator::PausedQueuesResponse, crate::operator::DependencyPauseRequest,
        crate::operator::ForceRequest, crate::operator::BulkRequest,
        crate::operator::BulkResponse, crate::operator::AuditView, crate::operator::AuditPage,
        crate::operator::CardStopView, crate::operator::CardStopResponse,
        crate::operator::CardStopLifted
    )),
    modifiers(&BearerAuth, &FrontDoorResponses),
    security(("bearer" = [])),
    tags(
        (name = "jobs", description = "Enqueue, list, inspect, replay, cancel"),
        (name = "fleet", description = "Counts, circuit breakers and live workers"),
        (name = "health", description = "Liveness and readiness"),
        (name = "idempotency", description = "The Idempotency-Keys of POST /v1/jobs: list, recover stuck ones"),
        (name = "schedules", description = "Periodic jobs: one job per cron tick, fleet-wide"),
        (name = "operator", description = "Operator controls (pause, resume, force, run now, bulk actions by filter, card stops) and their audit trail"),
    )
)]
pub struct ApiDoc;

/// The document as served: [`ApiDoc`] plus what only the running service knows (the policy
/// names it accepts) and what the derive cannot say (`delay` and `run_at` exclude each other).
pub fn openapi_document(policies: &redrive_policy::PolicySet) -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    if let Some(req) = doc.pointer_mut("/components/schemas/EnqueueRequest")
        && let Some(obj) = req.as_object_mut()
    {
        if let Some(policy) = obj
            .get_mut("properties")
            .and_then(|p| p.get_mut("policy"))
            .and_then(Value::as_object_mut)
        {
            let mut names: Vec<Value> = policies.names().map(Value::from).collect();
            names.push(Value::Null);
            policy.insert("enum".into(), Value::Array(names));
        }
        obj.insert(
            "not".into(),
            serde_json::json!({
                "properties": {"delay": {"type": "string"}, "run_at": {"type": "string"}},
                "required": ["delay", "run_at"]
            }),
        );
    }
    if let Some(params) = doc
        .pointer_mut("/paths/~1v1~1jobs/post/parameters")
        .and_then(Value::as_array_mut)
    {
        for p in params {
            if p["name"] == "Idempotency-Key" {
                p["schema"] = serde_json::json!({
                    "type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!#-\\[\\]-~]+$"
                });
            }
        }
    }
    doc
}

/// `/openapi.json`: [`openapi_document`] as this service answers. Without a token no call
/// needs one, so the document drops its bearer requirement (the scheme stays described): a
/// client generated from it, or a fuzzer checking that calls without one are refused, sees the
/// service as it is.
pub(crate) async fn openapi(State(state): State<AppState>) -> Json<Value> {
    let mut doc = openapi_document(&state.inner.policies.current());
    if state.inner.token.is_none()
        && let Some(obj) = doc.as_object_mut()
    {
        obj.remove("security");
    }
    Json(doc)
}
