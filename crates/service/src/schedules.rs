//! `/v1/schedules`: periodic jobs (what `redrive schedule add|list|remove` does on the
//! database), and the one check of a schedule shared by the API, the CLI and the policies
//! file's `[[schedules]]` ([`schedule_spec`]).
//!
//! A schedule's ticks are fired by the workers' schedulers (`redrive work`, `serve
//! --workers`), each tick enqueuing exactly one job fleet-wide, keyed
//! `schedule:NAME:TICK`; see `redrive_store`'s schedule docs.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use redrive_http::{EnqueueError, JobRequest};
use redrive_policy::PolicySet;
use redrive_store::{Cron, Missed, Schedule, ScheduleSpec, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::auth::Identity;
use crate::error::ApiError;
use crate::state::AppState;

/// A schedule to add or replace (`POST /v1/schedules`).
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// Unique name, at most 200 bytes (its jobs' keys are `schedule:NAME:TICK`).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD\\u061C\\u115F\\u1160\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB]+$"
    )]
    pub name: String,
    /// Cron expression in UTC with seconds: `SEC MIN HOUR DOM MON DOW [YEAR]` (e.g.
    /// `0 0 2 * * *`); a 5-field crontab line runs at second 0.
    #[schema(example = "0 */5 * * * *", min_length = 1)]
    pub cron: String,
    /// Queue of each tick's job.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD\\u061C\\u115F\\u1160\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB]+$"
    )]
    pub queue: String,
    /// Kind of each tick's job.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD\\u061C\\u115F\\u1160\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB]+$"
    )]
    pub kind: String,
    /// Payload of each tick's job (default `{}`); for `http`: `{method, url, headers?,
    /// body?, timeout_ms?}`.
    #[serde(default)]
    pub payload: Option<Value>,
    /// Retry policy name (default `payment`).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255)]
    pub policy: Option<String>,
    /// Dependency (breaker) name; `http` jobs default to the URL's host.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD\\u061C\\u115F\\u1160\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB]+$"
    )]
    pub dependency: Option<String>,
    /// Priority: lower runs first (default 0), -1000000..=1000000.
    #[serde(default)]
    #[schema(minimum = -1_000_000, maximum = 1_000_000)]
    pub priority: Option<i32>,
    /// Ticks missed while no scheduler ran: `skip`, `last` (default: the latest once) or
    /// `all` (at most the latest 100).
    #[serde(default)]
    #[schema(example = "last")]
    pub missed: Option<String>,
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ScheduleView {
    /// Unique name.
    pub name: String,
    /// The cron expression.
    pub cron: String,
    /// `skip`, `last` or `all`.
    pub missed: String,
    /// Queue of each tick's job.
    pub queue: String,
    /// Kind of each tick's job.
    pub kind: String,
    /// Payload of each tick's job (secrets redacted).
    pub payload: Value,
    /// Dependency of each tick's job.
    pub dependency: Option<String>,
    /// Priority of each tick's job.
    pub priority: i32,
    /// Retry policy of each tick's job.
    pub policy: String,
    /// `policies` (the policies file, upserted at start) or `api` (the CLI or this API).
    pub origin: String,
    /// The first tick not handled yet (null: the expression has no more ticks).
    pub next_tick: Option<DateTime<Utc>>,
    /// The latest tick a job was enqueued for.
    pub last_tick: Option<DateTime<Utc>>,
    /// That job's id.
    pub last_job_id: Option<i64>,
    /// When the schedule was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed (an upsert or a tick).
    pub updated_at: DateTime<Utc>,
}

impl From<Schedule> for ScheduleView {
    fn from(s: Schedule) -> Self {
        Self {
            payload: redrive_http::redact::redact_value(&s.payload),
            name: s.name,
            cron: s.cron,
            missed: s.missed.as_str().into(),
            queue: s.queue,
            kind: s.kind,
            dependency: s.dependency,
            priority: s.priority,
            policy: s.policy,
            origin: s.origin,
            next_tick: s.next_tick,
            last_tick: s.last_tick,
            last_job_id: s.last_job_id,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

/// The schedules.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ScheduleList {
    /// Every schedule, by name.
    pub schedules: Vec<ScheduleView>,
}

/// The answer of `POST /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ScheduleUpsert {
    /// `false`: a schedule of that name was replaced.
    pub created: bool,
    /// The schedule as stored.
    pub schedule: ScheduleView,
}

/// Checks a schedule as an enqueue is checked (the store's field rules, the payload of the
/// `http` kind, the policy's name) plus its name, cron expression and rule for missed ticks,
/// and builds it: the policy gives each tick's job its budget and deadline, and an `http`
/// job's dependency defaults to the URL's host. Used by the API, `redrive schedule add` and
/// the policies file's `[[schedules]]`.
///
/// # Errors
/// [`EnqueueError::Invalid`] naming the first bad field (`name`, `cron`, `missed`, `policy`,
/// `queue`, `kind`, `payload…`, `dependency`, `priority`).
pub fn schedule_spec(
    policies: &PolicySet,
    r: &ScheduleRequest,
    now: Timestamp,
) -> Result<ScheduleSpec, EnqueueError> {
    let missed: Missed = r
        .missed
        .as_deref()
        .unwrap_or("last")
        .parse()
        .map_err(EnqueueError::from)?;
    let policy_name = r.policy.as_deref().unwrap_or("payment");
    let policy = policies
        .get(policy_name)
        .map_err(|e| EnqueueError::invalid("policy", policy_name, e.to_string()))?;
    let payload = r.payload.clone().unwrap_or_else(|| serde_json::json!({}));
    let job = JobRequest {
        priority: r.priority,
        dependency: r.dependency.clone(),
        ..JobRequest::new(r.queue.clone(), r.kind.clone(), payload)
    }
    .assemble(policy, now)?;
    let spec = ScheduleSpec {
        name: r.name.clone(),
        cron: r.cron.clone(),
        missed,
        job,
    };
    spec.validate().map_err(EnqueueError::from)?;
    redrive_http::validate_new_job(&spec.job, now)?;
    let cron = Cron::parse(&spec.cron).map_err(EnqueueError::from)?;
    if cron.next_after(now).is_none() {
        return Err(EnqueueError::invalid(
            "cron",
            &spec.cron,
            "has no tick after now",
        ));
    }
    Ok(spec)
}

/// What the audit trail keeps of a schedule added or replaced.
pub fn audit_target(s: &Schedule, created: bool) -> Value {
    serde_json::json!({
        "name": s.name, "cron": s.cron, "queue": s.queue, "kind": s.kind,
        "replaced": !created,
    })
}

/// List the schedules.
#[utoipa::path(
    get, path = "/v1/schedules", tag = "schedules",
    responses(
        (status = 200, description = "Every schedule, by name", body = ScheduleList),
        (status = 401, description = "Missing or wrong bearer token", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = crate::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<ScheduleList>, ApiError> {
    let schedules = state.inner.store.schedules().await?;
    Ok(Json(ScheduleList {
        schedules: schedules.into_iter().map(ScheduleView::from).collect(),
    }))
}

/// Add a schedule, or replace the one of that name.
///
/// A replacement with the same cron expression keeps its place (its next tick), so no tick
/// is lost or repeated; a new expression starts at its first tick after now.
#[utoipa::path(
    post, path = "/v1/schedules", tag = "schedules",
    request_body = ScheduleRequest,
    responses(
        (status = 201, description = "Created", body = ScheduleUpsert),
        (status = 200, description = "A schedule of that name was replaced", body = ScheduleUpsert),
        (status = 400, description = "Malformed body or unknown field", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "Body over 1 MiB", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A value out of range: the field is named", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = crate::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn upsert(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = crate::api::read_body(body).await?;
    let r: ScheduleRequest = serde_json::from_slice(&body).map_err(|e| {
        let msg = e.to_string();
        let field = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
            .unwrap_or("body")
            .to_owned();
        ApiError::bad_field(field, "", format!("the body is not a schedule: {msg}"))
    })?;
    let now = state.now();
    let spec = schedule_spec(&state.inner.policies.current(), &r, now)
        .map_err(crate::api::enqueue_problem)?;
    let (sched, created) = state.inner.store.upsert_schedule(&spec, "api", now).await?;
    // An operator change: audited like a pause or a forced breaker.
    let who = crate::operator::actor(who.as_ref().map(|e| &e.0), "api");
    state
        .inner
        .store
        .record_audit(&who, "schedule_add", &audit_target(&sched, created), 1, now)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(ScheduleUpsert {
            created,
            schedule: sched.into(),
        }),
    )
        .into_response())
}

/// Remove a schedule (its jobs stay).
#[utoipa::path(
    delete, path = "/v1/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 401, description = "Missing or wrong bearer token", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No schedule of that name", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = crate::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn remove(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.inner.store.remove_schedule(&name).await? {
        let who = crate::operator::actor(who.as_ref().map(|e| &e.0), "api");
        let target = serde_json::json!({ "name": name });
        let store = &state.inner.store;
        store
            .record_audit(&who, "schedule_remove", &target, 1, state.now())
            .await?;
        Ok(StatusCode::NO_CONTENT)
    } else {
        let mut e = ApiError::not_found(format!("no schedule named {name:?}"));
        e.field = Some("name".into());
        e.value = Some(name.chars().take(200).collect());
        Err(e)
    }
}
