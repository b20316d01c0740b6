//! `POST /v1/jobs/batch`: many jobs in one request and one transaction (a billing run
//! enqueues tens of thousands at once; one request per job costs a round trip and a commit
//! each).
//!
//! The semantics are all or nothing:
//! 1. every job is validated first, exactly as `POST /v1/jobs` validates its body; one bad job
//!    or more: 422 listing each (`errors[]`: its index, field and value), nothing stored;
//! 2. then every job is inserted in one transaction ([`Store::enqueue_many_exact`]): a job
//!    whose queue and key already exist is returned with `created: false` (a retried batch
//!    creates nothing twice), and a key already used by a job of another kind or payload
//!    (before, or earlier in the same batch) rolls the whole transaction back: 422 naming its
//!    index and `key`, nothing stored;
//! 3. the answer lists one result per job, in input order.
//!
//! A crash at any instant leaves either the whole batch or none of it; resending a batch whose
//! answer was lost is safe for the jobs that carry a `key` (jobs without one have nothing to
//! be recognised by, as with `POST /v1/jobs`).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use redrive_store::{NewJob, Store};
use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;
use utoipa::ToSchema;

use crate::api::{enqueue_problem, parse_enqueue_object};
use crate::error::{ApiError, PROBLEM_JSON, ProblemBody};
use crate::state::AppState;
use crate::views::{EnqueueRequest, StateName};

/// The most jobs one `POST /v1/jobs/batch` may carry; more is a 422 naming `jobs`.
pub const MAX_BATCH_JOBS: usize = 1_000;

/// The largest body of `POST /v1/jobs/batch` (8 MiB; one job's body is at most 1 MiB); more is
/// a 413.
pub const MAX_BATCH_BODY_BYTES: usize = 8 * 1024 * 1024;

/// The body of `POST /v1/jobs/batch`.
#[derive(Debug, Clone, ToSchema)]
pub struct BatchRequest {
    /// The jobs, each the body `POST /v1/jobs` takes (at most 1,000).
    #[schema(max_items = 1000)]
    pub jobs: Vec<EnqueueRequest>,
}

/// What `POST /v1/jobs/batch` did with one job.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct BatchItem {
    /// The job's id: the new job's, or the existing one's with the same queue and key.
    pub id: i64,
    /// False when a job with the same queue and key already existed and is returned instead.
    pub created: bool,
    /// The job's state now.
    pub state: StateName,
    /// The queue.
    pub queue: String,
    /// The idempotency key, if the job has one.
    pub key: Option<String>,
}

/// What `POST /v1/jobs/batch` did: one result per job, in the request's order.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct BatchResponse {
    /// Jobs created by this request.
    pub created: usize,
    /// Jobs that already existed (same queue and key) and were returned instead.
    pub existing: usize,
    /// The results, in the request's order.
    pub jobs: Vec<BatchItem>,
}

/// One refused job of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct BatchItemError {
    /// The job's position in `jobs` (from 0).
    pub index: usize,
    /// The job's field that is wrong (`max_attempts`, `payload.url`, `key`).
    pub field: Option<String>,
    /// The value given for it (cut to 200 characters).
    pub value: Option<String>,
    /// The status `POST /v1/jobs` answers for this job alone (400 malformed, 422 refused).
    pub status: u16,
    /// What is wrong.
    pub detail: String,
}

/// A refused batch: the problem of the first bad job (`field` is `jobs[INDEX].FIELD`), and
/// every bad job in `errors`. Nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct BatchProblem {
    /// The problem, naming the first bad job.
    #[serde(flatten)]
    pub problem: ProblemBody,
    /// Every bad job, by index; absent when the request as a whole is refused (more than
    /// 1,000 jobs: `field` is `jobs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<BatchItemError>,
}

impl BatchProblem {
    fn new(errors: Vec<BatchItemError>, total: usize) -> Self {
        let first = &errors[0];
        let field = match &first.field {
            Some(f) => format!("jobs[{}].{f}", first.index),
            None => format!("jobs[{}]", first.index),
        };
        let detail = format!(
            "{} of {total} jobs refused, nothing enqueued; first: {field}: {}",
            errors.len(),
            first.detail
        );
        let problem = ApiError {
            field: Some(field),
            value: first.value.clone(),
            ..ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unprocessable-batch",
                "Jobs of the batch are not acceptable",
                detail,
            )
        }
        .body();
        Self { problem, errors }
    }
}

impl IntoResponse for BatchProblem {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut res = (StatusCode::UNPROCESSABLE_ENTITY, body).into_response();
        res.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        res
    }
}

/// Why a batch is refused: the whole request, or some of its jobs.
enum Refused {
    Request(ApiError),
    Jobs(Box<BatchProblem>),
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Self::Request(e)
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Self::Request(e) => e.into_response(),
            Self::Jobs(p) => p.into_response(),
        }
    }
}

fn item_error(index: usize, e: ApiError) -> BatchItemError {
    BatchItemError {
        index,
        field: e.field,
        value: e.value,
        status: e.status.as_u16(),
        detail: e.detail,
    }
}

/// Reads a body of at most [`MAX_BATCH_BODY_BYTES`]; larger → 413 naming `body`.
async fn read_batch_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BATCH_BODY_BYTES)
        .await
        .map_err(|e| {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if too_large {
                ApiError {
                    field: Some("body".into()),
                    ..ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "body-too-large",
                        "The request body is too large",
                        format!(
                            "the body is larger than {MAX_BATCH_BODY_BYTES} bytes; send fewer \
                             jobs per request"
                        ),
                    )
                }
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

/// The job objects of a batch body: 400 for a body that is not `{"jobs": [...]}`, 422 naming
/// `jobs` for more than [`MAX_BATCH_JOBS`].
fn job_values(body: &[u8]) -> Result<Vec<Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_field("body", "", format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(ApiError::bad_field(
            "body",
            &value.to_string(),
            "the body must be a JSON object {\"jobs\": [...]}",
        ));
    };
    if let Some(unknown) = obj.keys().find(|k| k.as_str() != "jobs") {
        return Err(ApiError::bad_field(
            unknown.clone(),
            "",
            format!("unknown field {unknown:?}; the body is {{\"jobs\": [...]}}"),
        ));
    }
    let jobs = match obj.remove("jobs") {
        Some(Value::Array(jobs)) => jobs,
        None => return Err(ApiError::bad_field("jobs", "", "jobs is required")),
        Some(other) => {
            return Err(ApiError::bad_field(
                "jobs",
                &other.to_string(),
                "jobs must be an array of job objects",
            ));
        }
    };
    if jobs.len() > MAX_BATCH_JOBS {
        return Err(ApiError::unprocessable(
            "jobs",
            &jobs.len().to_string(),
            format!(
                "jobs: {} jobs in one request; at most {MAX_BATCH_JOBS} (split the batch)",
                jobs.len()
            ),
        ));
    }
    Ok(jobs)
}

/// Validates every job of a batch as `POST /v1/jobs` would; every refused one is listed.
fn parse_batch(
    state: &AppState,
    values: Vec<Value>,
    now: redrive_store::Timestamp,
) -> Result<Vec<NewJob>, Refused> {
    let total = values.len();
    let mut jobs = Vec::with_capacity(total);
    let mut errors = Vec::new();
    for (index, v) in values.into_iter().enumerate() {
        let parsed = match v {
            Value::Object(obj) => parse_enqueue_object(state, obj, None, now),
            other => Err(ApiError::bad_field(
                "",
                &other.to_string(),
                "each job must be a JSON object",
            )),
        };
        match parsed {
            Ok(job) => jobs.push(job),
            Err(e) => {
                let mut e = item_error(index, e);
                e.field = e.field.filter(|f| !f.is_empty());
                errors.push(e);
            }
        }
    }
    if errors.is_empty() {
        Ok(jobs)
    } else {
        Err(Refused::Jobs(Box::new(BatchProblem::new(errors, total))))
    }
}

/// Stores validated jobs in one transaction; a key taken by another request refuses the batch.
async fn store_batch(
    store: &Store,
    jobs: &[NewJob],
    now: redrive_store::Timestamp,
) -> Result<Vec<redrive_store::Enqueued>, Refused> {
    match store
        .enqueue_many_exact(jobs, now)
        .await
        .map_err(ApiError::from)?
    {
        Ok(out) => Ok(out),
        Err(taken) => {
            let e = match redrive_http::check_same_request(&jobs[taken.index], &taken.existing) {
                Err(e) => enqueue_problem(e),
                // Not reached: the store compared the same fields.
                Ok(()) => ApiError::unprocessable("key", "", "the key is used by another job"),
            };
            Err(Refused::Jobs(Box::new(BatchProblem::new(
                vec![item_error(taken.index, e)],
                jobs.len(),
            ))))
        }
    }
}

/// Enqueue many jobs at once (at most 1,000), all or nothing.
///
/// Every job is validated first as `POST /v1/jobs` validates its body: one bad job or more is
/// a 422 listing each in `errors` (index, field, value) and nothing is stored. Then all are
/// inserted in one transaction. A job whose queue and key already exist (with the same kind and
/// payload) is returned with `created: false`, so a resent batch creates nothing twice; a key
/// already used for another kind or payload (before, or earlier in this batch) is a 422 naming
/// its index, and nothing is stored. The results are in the request's order. No
/// `Idempotency-Key` header: each job's `key` makes it safe to resend.
#[utoipa::path(
    post, path = "/v1/jobs/batch", tag = "jobs",
    request_body = BatchRequest,
    responses(
        (status = 201, description = "Enqueued: at least one job was created", body = BatchResponse),
        (status = 200, description = "Every job already existed (same queue and key): nothing was created", body = BatchResponse),
        (status = 400, description = "The body is not {\"jobs\": [...]}, or carries an Idempotency-Key header", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "Body over 8 MiB", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "More than 1,000 jobs (field `jobs`), or jobs refused (each in `errors`, by index); nothing was stored", body = BatchProblem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable, or its SQLite file deleted or replaced (nothing is acknowledged)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn create_jobs(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Response> {
    create_jobs_inner(state, headers, body)
        .await
        .map_err(IntoResponse::into_response)
}

async fn create_jobs_inner(
    state: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::bad_field(
            "Idempotency-Key",
            "",
            "POST /v1/jobs/batch takes no Idempotency-Key header: give each job a `key`, and a \
             resent batch creates nothing twice",
        )
        .into());
    }
    let body = read_batch_body(body).await?;
    let now = state.now();
    let mut jobs = parse_batch(&state, job_values(&body)?, now)?;
    // W3C trace context, as `POST /v1/jobs`: an invalid `traceparent` is ignored.
    let received = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| redrive_store::TraceParent::parse(s).ok())
        .map(|t| t.to_string());
    let span = tracing::info_span!(
        "enqueue_batch",
        jobs = jobs.len(),
        created = tracing::field::Empty
    );
    redrive_runtime::trace::set_parent(&span, received.as_deref());
    let traceparent = redrive_runtime::trace::of_span(&span).or(received);
    for job in &mut jobs {
        job.traceparent.clone_from(&traceparent);
    }
    let out = store_batch(&state.inner.store, &jobs, now)
        .instrument(span.clone())
        .await?;
    let created = out.iter().filter(|e| e.created).count();
    span.record("created", created);
    let response = BatchResponse {
        created,
        existing: out.len() - created,
        jobs: out
            .into_iter()
            .map(|e| BatchItem {
                id: e.job.id,
                created: e.created,
                state: e.job.state.into(),
                queue: e.job.queue,
                key: e.job.key,
            })
            .collect(),
    };
    let status = if created > 0 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(response)).into_response())
}
