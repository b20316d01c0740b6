//! The operator routes: pause and resume a queue or a dependency, force a breaker, bring a
//! job forward, bulk actions by filter (with a dry run), and the audit trail. Every change is
//! audited by the store in its own transaction, naming the token's label.

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, RawQuery, State};
use chrono::{DateTime, Utc};
use redrive_policy::BreakerMode;
use redrive_store::{Actor, AuditEntry, BulkAction, DependencyOp, JobFilter, JobId, PausedQueue};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::{parse_id, read_body};
use crate::auth::Identity;
use crate::error::{ApiError, ProblemBody};
use crate::state::AppState;
use crate::views::{BreakerView, JobView, TransitionView};

/// The audit actor of a request: the token's label, through `via` (`api` or `dashboard`).
pub(crate) fn actor(identity: Option<&Identity>, via: &str) -> Actor {
    let label = identity.map_or("anonymous", |i| i.label.as_str());
    Actor::new(label, via)
}

/// A queue after a pause or a resume.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct QueueStateView {
    /// The queue.
    pub queue: String,
    /// Whether it is paused now.
    pub paused: bool,
    /// Whether this call changed it.
    pub changed: bool,
}

/// A paused queue.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PausedQueueView {
    /// The queue.
    pub queue: String,
    /// Since when.
    pub paused_at: DateTime<Utc>,
    /// By whom (a token's label, or an operating-system user).
    pub paused_by: String,
}

impl From<PausedQueue> for PausedQueueView {
    fn from(p: PausedQueue) -> Self {
        Self {
            queue: p.queue,
            paused_at: p.paused_at,
            paused_by: p.paused_by,
        }
    }
}

/// The paused queues.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PausedQueuesResponse {
    /// By name.
    pub paused: Vec<PausedQueueView>,
}

/// `POST /v1/dependencies/{name}/pause`: until a time, for a while, or (neither) until resumed.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DependencyPauseRequest {
    /// Until this time (RFC 3339).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub until: Option<String>,
    /// For this long (`30m`, `2h`); not with `until`.
    #[serde(rename = "for")]
    pub for_: Option<String>,
}

/// `POST /v1/breakers/{name}/force`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForceRequest {
    /// `open` (no call at all, probes included), `closed` (every call goes, whatever the
    /// failure rate) or `auto` (back to the machine, from closed).
    pub mode: String,
}

/// `POST /v1/jobs/bulk`: an action on every job the filter takes (every condition given must
/// hold; none: every job the action applies to).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// `replay` or `purge` (dead jobs), `cancel` (unfinished jobs), `run_now` (waiting jobs
    /// due later).
    pub action: String,
    /// Only these jobs (at most 10000).
    pub ids: Option<Vec<JobId>>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only this dependency.
    pub dependency: Option<String>,
    /// Only this dead reason.
    pub dead_reason: Option<String>,
    /// Only jobs whose last error has this signature (the dashboard's dead-letter groups).
    pub signature: Option<String>,
    /// Say what would change, change nothing (and audit nothing).
    #[serde(default)]
    pub dry_run: bool,
}

/// What a bulk action did, or in a dry run would do.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct BulkResponse {
    /// The action.
    pub action: String,
    /// The jobs changed (or that would change).
    pub ids: Vec<JobId>,
    /// How many.
    pub count: u64,
    /// Nothing was changed.
    pub dry_run: bool,
}

/// One operator action.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct AuditView {
    /// Id (grows with time).
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Who: the API token's label, or the operating-system user for the CLI.
    pub actor: String,
    /// Through what: `cli`, `api` or `dashboard`.
    pub via: String,
    /// What: `replay`, `purge`, `cancel`, `run_now`, `queue_pause`, `queue_resume`,
    /// `dependency_pause`, `dependency_resume`, `breaker_force`.
    pub action: String,
    /// On what: the filter or ids, the queue, or the dependency and the override.
    #[schema(value_type = Object)]
    pub target: serde_json::Value,
    /// How many rows it changed.
    pub rows: u64,
}

impl From<AuditEntry> for AuditView {
    fn from(e: AuditEntry) -> Self {
        Self {
            id: e.id,
            at: e.at,
            actor: e.actor,
            via: e.via,
            action: e.action,
            target: e.target,
            rows: e.rows,
        }
    }
}

/// A page of the audit trail, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct AuditPage {
    /// The rows.
    pub audit: Vec<AuditView>,
    /// The cursor of the next (older) page (`before`), if there may be more.
    pub next: Option<i64>,
}

fn json_body<T: for<'de> Deserialize<'de> + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_json(bytes)
}

fn parse_json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    // A derived struct would also take a JSON array of its fields in order: only an object
    // is a request body here.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(ApiError::bad_field(
            "body",
            "",
            "the body must be a JSON object",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        let msg = e.to_string();
        // serde names the field in its message (`unknown field `x``, `missing field `y``).
        let field = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.contains("field"))
            .unwrap_or("body")
            .to_owned();
        ApiError::bad_field(field, "", format!("the body is not valid: {msg}"))
    })
}

/// The paused queues.
#[utoipa::path(
    get, path = "/v1/queues", tag = "operator",
    responses(
        (status = 200, description = "The paused queues", body = PausedQueuesResponse),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn paused_queues(
    State(state): State<AppState>,
) -> Result<Json<PausedQueuesResponse>, ApiError> {
    let paused = state.inner.store.paused_queues().await?;
    Ok(Json(PausedQueuesResponse {
        paused: paused.into_iter().map(PausedQueueView::from).collect(),
    }))
}

async fn set_queue(
    state: &AppState,
    queue: &str,
    pause: bool,
    who: &Actor,
) -> Result<QueueStateView, ApiError> {
    let now = state.now();
    let changed = if pause {
        state.inner.store.pause_queue(queue, who, now).await?
    } else {
        state.inner.store.resume_queue(queue, who, now).await?
    };
    Ok(QueueStateView {
        queue: queue.to_owned(),
        paused: pause,
        changed,
    })
}

/// Pause a queue: workers claim nothing from it (running jobs finish).
#[utoipa::path(
    post, path = "/v1/queues/{queue}/pause", tag = "operator",
    params(("queue" = String, Path, description = "Queue")),
    responses(
        (status = 200, description = "Paused (`changed`: it was not before)", body = QueueStateView),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad queue name", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn pause_queue(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path(queue): Path<String>,
) -> Result<Json<QueueStateView>, ApiError> {
    let who = actor(who.as_ref().map(|e| &e.0), "api");
    Ok(Json(set_queue(&state, &queue, true, &who).await?))
}

/// Resume a paused queue.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/resume", tag = "operator",
    params(("queue" = String, Path, description = "Queue")),
    responses(
        (status = 200, description = "Resumed (`changed`: it was paused)", body = QueueStateView),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad queue name", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn resume_queue(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path(queue): Path<String>,
) -> Result<Json<QueueStateView>, ApiError> {
    let who = actor(who.as_ref().map(|e| &e.0), "api");
    Ok(Json(set_queue(&state, &queue, false, &who).await?))
}

/// The end of a pause from `until` (RFC 3339) or `for` (a duration); `None`: until resumed.
pub(crate) fn pause_end(
    until: Option<&str>,
    for_: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, ApiError> {
    match (
        until.filter(|s| !s.is_empty()),
        for_.filter(|s| !s.is_empty()),
    ) {
        (Some(_), Some(f)) => Err(ApiError::bad_field(
            "for",
            f,
            "give `until` or `for`, not both",
        )),
        (Some(u), None) => {
            let t = DateTime::parse_from_rfc3339(u)
                .map_err(|e| ApiError::bad_field("until", u, format!("not an RFC 3339 time: {e}")))?
                .with_timezone(&Utc);
            if t <= now {
                return Err(ApiError::bad_field("until", u, "must be in the future"));
            }
            Ok(Some(t))
        }
        (None, Some(f)) => {
            let d = redrive_policy::parse_duration(f)
                .map_err(|e| ApiError::bad_field("for", f, e.to_string()))?;
            if d.is_zero() {
                return Err(ApiError::bad_field("for", f, "must be more than zero"));
            }
            Ok(Some(
                now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX),
            ))
        }
        (None, None) => Ok(None),
    }
}

/// The breaker view of a dependency's row after an operator's change.
async fn view_of(state: &AppState, d: redrive_store::Dependency) -> Result<BreakerView, ApiError> {
    let events = state
        .inner
        .store
        .dependency_events(Some(&d.name), crate::api::TRANSITIONS_PER_BREAKER)
        .await?;
    Ok(BreakerView::new(
        d,
        Utc::now(),
        events.into_iter().map(TransitionView::from).collect(),
    ))
}

/// Applies an operator's override to a dependency.
pub(crate) async fn operate(
    state: &AppState,
    name: &str,
    op: DependencyOp,
    who: &Actor,
) -> Result<BreakerView, ApiError> {
    let d = state
        .inner
        .store
        .operate_dependency(name, op, who, state.now())
        .await?;
    view_of(state, d).await
}

/// Pause a dependency for the whole fleet: until `until`, for `for`, or (an empty body)
/// until resumed. Its jobs are not claimed meanwhile.
#[utoipa::path(
    post, path = "/v1/dependencies/{name}/pause", tag = "operator",
    params(("name" = String, Path, description = "Dependency")),
    request_body(content = Option<DependencyPauseRequest>, description = "Optional: no body pauses until resumed"),
    responses(
        (status = 200, description = "Paused; the breaker as it is now", body = BreakerView),
        (status = 400, description = "A bad `until` or `for` (named in `field`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad dependency name", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn pause_dependency(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<BreakerView>, ApiError> {
    let req: DependencyPauseRequest = json_body(&read_body(body).await?)?;
    // An empty field is a mistake in the API (leave it out to pause until resumed); the
    // dashboard's form sends its empty fields, and `pause_end` reads those as absent.
    for (field, v) in [("until", &req.until), ("for", &req.for_)] {
        if v.as_deref() == Some("") {
            return Err(ApiError::bad_field(
                field,
                "",
                "empty: leave the field out to pause until resumed",
            ));
        }
    }
    let until = pause_end(req.until.as_deref(), req.for_.as_deref(), state.now())?;
    let who = actor(who.as_ref().map(|e| &e.0), "api");
    Ok(Json(
        operate(&state, &name, DependencyOp::Pause { until }, &who).await?,
    ))
}

/// Lift a dependency's pause.
#[utoipa::path(
    post, path = "/v1/dependencies/{name}/resume", tag = "operator",
    params(("name" = String, Path, description = "Dependency")),
    responses(
        (status = 200, description = "Resumed; the breaker as it is now", body = BreakerView),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad dependency name", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn resume_dependency(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path(name): Path<String>,
) -> Result<Json<BreakerView>, ApiError> {
    let who = actor(who.as_ref().map(|e| &e.0), "api");
    Ok(Json(
        operate(&state, &name, DependencyOp::Resume, &who).await?,
    ))
}

/// The override a `mode` names.
pub(crate) fn parse_mode(mode: &str) -> Result<BreakerMode, ApiError> {
    match mode {
        "open" => Ok(BreakerMode::ForcedOpen),
        "closed" => Ok(BreakerMode::ForcedClosed),
        "auto" => Ok(BreakerMode::Normal),
        _ => Err(ApiError::bad_field(
            "mode",
            mode,
            "mode must be open, closed or auto",
        )),
    }
}

/// Force a dependency's breaker open or closed for the whole fleet, or hand it back to the
/// machine (`auto`).
#[utoipa::path(
    post, path = "/v1/breakers/{name}/force", tag = "operator",
    params(("name" = String, Path, description = "Dependency")),
    request_body = ForceRequest,
    responses(
        (status = 200, description = "Forced; the breaker as it is now", body = BreakerView),
        (status = 400, description = "A bad `mode`", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad dependency name", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn force_breaker(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<BreakerView>, ApiError> {
    let req: ForceRequest = parse_json(&read_body(body).await?)?;
    let mode = parse_mode(&req.mode)?;
    let who = actor(who.as_ref().map(|e| &e.0), "api");
    Ok(Json(
        operate(&state, &name, DependencyOp::Force(mode), &who).await?,
    ))
}

/// Brings one job forward; 404 for none, 409 when it is not waiting for a later time.
pub(crate) async fn run_now_one(
    state: &AppState,
    id: JobId,
    who: &Actor,
) -> Result<redrive_store::Job, ApiError> {
    let store = &state.inner.store;
    let out = store
        .bulk(
            BulkAction::RunNow,
            &JobFilter::ids(vec![id]),
            who,
            false,
            state.now(),
        )
        .await?;
    let job = store
        .get(id)
        .await?
        .ok_or(redrive_store::StoreError::JobNotFound { id })?;
    if out.count == 0 {
        return Err(redrive_store::StoreError::WrongState {
            id,
            state: job.state,
            operation: "run now (only scheduled, available or deferred jobs due later)",
        }
        .into());
    }
    Ok(job)
}

/// Bring a scheduled or deferred job forward: due now, its attempt counts, retry budget and
/// deadline untouched.
#[utoipa::path(
    post, path = "/v1/jobs/{id}/run-now", tag = "operator",
    params(("id" = i64, Path, description = "Job id")),
    responses(
        (status = 200, description = "Due now; the job as it is now", body = JobView),
        (status = 400, description = "The id is not a number", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "The job is not waiting for a later time", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn run_now(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let id = parse_id(&id)?;
    let who = actor(who.as_ref().map(|e| &e.0), "api");
    Ok(Json(run_now_one(&state, id, &who).await?.into()))
}

/// The action a name says.
pub(crate) fn parse_action(s: &str) -> Result<BulkAction, ApiError> {
    BulkAction::ALL
        .into_iter()
        .find(|a| a.as_str() == s || a.as_str().replace('_', "-") == s)
        .ok_or_else(|| {
            ApiError::bad_field(
                "action",
                s,
                "action must be replay, purge, cancel or run_now",
            )
        })
}

/// A bulk action on every job a filter takes: `replay` or `purge` dead jobs, `cancel`
/// unfinished ones, `run_now` waiting ones due later. `dry_run` says what would change.
#[utoipa::path(
    post, path = "/v1/jobs/bulk", tag = "operator",
    request_body = BulkRequest,
    responses(
        (status = 200, description = "What changed (or would)", body = BulkResponse),
        (status = 400, description = "A bad action or body (named in `field`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad filter value (named in `field`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn bulk(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    body: Body,
) -> Result<Json<BulkResponse>, ApiError> {
    let req: BulkRequest = parse_json(&read_body(body).await?)?;
    let action = parse_action(&req.action)?;
    let filter = JobFilter {
        ids: req.ids,
        queue: req.queue,
        kind: req.kind,
        dependency: req.dependency,
        dead_reason: req.dead_reason,
        signature: req.signature,
    };
    let who = actor(who.as_ref().map(|e| &e.0), "api");
    let out = state
        .inner
        .store
        .bulk(action, &filter, &who, req.dry_run, state.now())
        .await?;
    Ok(Json(BulkResponse {
        action: action.as_str().into(),
        ids: out.ids,
        count: out.count,
        dry_run: out.dry_run,
    }))
}

/// Reads `limit` (1..=1000, default 50) and `before` of the audit's query; any other
/// parameter is a 400 naming it.
pub(crate) fn parse_audit_query(query: Option<&str>) -> Result<(u32, Option<i64>), ApiError> {
    let (mut limit, mut before) = (50u32, None);
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=redrive_store::MAX_AUDIT_PAGE).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_field("limit", &v, "limit must be a whole number 1..=1000")
                    })?;
            }
            "before" => {
                before = Some(v.parse().map_err(|_| {
                    ApiError::bad_field("before", &v, "before must be a whole number")
                })?);
            }
            other => {
                return Err(ApiError::bad_field(
                    other,
                    &v,
                    format!("unknown query parameter {other:?}; known: limit, before"),
                ));
            }
        }
    }
    Ok((limit, before))
}

/// The audit trail of operator actions, newest first.
#[utoipa::path(
    get, path = "/v1/audit", tag = "operator",
    params(
        ("limit" = Option<u32>, Query, description = "At most this many rows (1..=1000, default 50)"),
        ("before" = Option<i64>, Query, description = "Only rows with a smaller id (the previous page's `next`)"),
    ),
    responses(
        (status = 200, description = "A page of the audit trail", body = AuditPage),
        (status = 400, description = "A bad or unknown query parameter (named in `field`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn audit(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<AuditPage>, ApiError> {
    let (limit, before) = parse_audit_query(query.as_deref())?;
    let rows = state.inner.store.audit(before, limit).await?;
    let next = (rows.len() == limit as usize)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    Ok(Json(AuditPage {
        audit: rows.into_iter().map(AuditView::from).collect(),
        next,
    }))
}

/// A card key's stop, set by a Visa category 1 or Mastercard MAC 03/21 decline: no job of
/// the key is called until `until` (or until lifted).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CardStopView {
    /// The card key.
    pub quota_key: String,
    /// The job whose decline stopped it.
    pub job_id: JobId,
    /// That job's attempt.
    pub attempt: u32,
    /// When the decline came.
    pub at: DateTime<Utc>,
    /// When the stop ends.
    pub until: DateTime<Utc>,
    /// The decline's network (`visa`, `mastercard`, ...).
    pub network: String,
    /// The issuer's response code.
    pub code: Option<String>,
    /// Visa's decline category.
    pub category: Option<u8>,
    /// Mastercard's Merchant Advice Code.
    pub advice_code: Option<u8>,
    /// The decline's rule (`never_retry`, `recurring_stopped`).
    pub rule: String,
    /// One line naming the blocking decline (a blocked job's last error).
    pub description: String,
}

impl From<redrive_store::CardStop> for CardStopView {
    fn from(s: redrive_store::CardStop) -> Self {
        Self {
            description: s.describe(),
            quota_key: s.quota_key,
            job_id: s.job_id,
            attempt: s.attempt,
            at: s.at,
            until: s.until,
            network: s.network.as_str().to_owned(),
            code: s.code,
            category: s.category,
            advice_code: s.advice_code,
            rule: s.rule,
        }
    }
}

/// A card key's stop, if any (`GET /v1/quotas/{key}`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CardStopResponse {
    /// The card key.
    pub key: String,
    /// Its stop in force, or `null`.
    pub card_stop: Option<CardStopView>,
}

/// A lift's answer (`POST /v1/quotas/{key}/lift`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CardStopLifted {
    /// The card key.
    pub key: String,
    /// The stop that was in force and is lifted, or `null` (nothing to lift; still audited).
    pub lifted: Option<CardStopView>,
}

/// A card key's stop: whether a Visa category 1 / MAC 03 / MAC 21 decline stopped every job
/// of the key, naming the decline.
#[utoipa::path(
    get, path = "/v1/quotas/{key}", tag = "operator",
    params(("key" = String, Path, description = "The card key (a job's quota_key; never a card number)")),
    responses(
        (status = 200, description = "The key's stop in force, or `card_stop: null`", body = CardStopResponse),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad key (a card number is refused)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn card_stop(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Json<CardStopResponse>, ApiError> {
    redrive_store::check_quota_key(&key)?;
    let stop = state.inner.store.card_stop(&key, state.now()).await?;
    Ok(Json(CardStopResponse {
        key,
        card_stop: stop.map(Into::into),
    }))
}

/// Lift a card key's stop (audited as `card_stop_lift`): its jobs are called again from their
/// next claim; those waiting for the stop are due at once.
#[utoipa::path(
    post, path = "/v1/quotas/{key}/lift", tag = "operator",
    params(("key" = String, Path, description = "The card key")),
    responses(
        (status = 200, description = "Lifted (`lifted`: the stop that was in force, or null)", body = CardStopLifted),
        (status = 401, description = "Missing or wrong bearer token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad key (a card number is refused)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn lift_card_stop(
    State(state): State<AppState>,
    who: Option<Extension<Identity>>,
    Path(key): Path<String>,
) -> Result<Json<CardStopLifted>, ApiError> {
    let who = actor(who.as_ref().map(|e| &e.0), "api");
    let lifted = state
        .inner
        .store
        .lift_card_stop(&key, &who, state.now())
        .await?;
    Ok(Json(CardStopLifted {
        key,
        lifted: lifted.map(Into::into),
    }))
}
