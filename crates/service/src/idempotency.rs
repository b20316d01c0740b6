//! `/v1/idempotency`: the operator's view of the `Idempotency-Key`s of `POST /v1/jobs`, and
//! the recovery of stuck ones (what `redrive idempotency list|recover` does on the database).
//!
//! A key is *stuck* when the request that claimed it vanished (its process was killed or
//! crashed) before its response was stored. `POST /v1/jobs` recovers such a key by itself
//! once its recovery window has passed (a repeat takes it over and enqueues again, idempotent
//! by job key); recovering it here lets the next request run at once.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use redrive_idempotency::{
    IdempotencyKey, ListFilter, ListRequest, ListedRecord, MAX_LIST, RecordId, RecordInfo,
    RecordState, ReleaseOutcome, release_stuck,
};
use serde::Serialize;
use utoipa::{IntoParams, ToSchema};

use crate::error::ApiError;
use crate::state::{AppState, IDEMPOTENCY_SCOPE};

/// One `Idempotency-Key` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct IdempotencyRecordView {
    /// The record's id (increasing; pass the last as `after` for the next page).
    pub id: i64,
    /// The key.
    pub key: String,
    /// `in_progress` (no response stored) or `completed`.
    pub state: String,
    /// In progress and held by a request whose lease ran out: it vanished before storing its
    /// response. Recovered by itself by the next request with the key, or by
    /// `POST /v1/idempotency/{key}/recover`.
    pub stuck: bool,
    /// A request holds the key now (its lease is live).
    pub running: bool,
    /// The method of the first request.
    pub method: String,
    /// The path of the first request.
    pub path: String,
    /// Where the last run got to (`started`, `finished`).
    pub recovery_point: String,
    /// Runs so far.
    pub attempts: u32,
    /// The stored status, when completed.
    pub response_status: Option<u16>,
    /// When the first request claimed the key (absent in the answer of a recovery).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// When the last run started (absent in the answer of a recovery).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_run_at: Option<DateTime<Utc>>,
}

impl IdempotencyRecordView {
    fn of(key: String, info: &RecordInfo) -> Self {
        Self {
            id: info.id.0,
            key,
            state: match info.state {
                RecordState::Completed => "completed",
                _ => "in_progress",
            }
            .into(),
            stuck: info.is_abandoned(),
            running: info.locked,
            method: info.method.clone(),
            path: info.path.clone(),
            recovery_point: info.recovery_point.clone(),
            attempts: info.attempts,
            response_status: info.response_status,
            created_at: None,
            last_run_at: None,
        }
    }
}

impl From<ListedRecord> for IdempotencyRecordView {
    fn from(l: ListedRecord) -> Self {
        Self {
            created_at: Some(l.created_at.into()),
            last_run_at: Some(l.last_run_at.into()),
            ..Self::of(l.key, &l.info)
        }
    }
}

/// A page of records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct IdempotencyPage {
    /// The records, by id.
    pub records: Vec<IdempotencyRecordView>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next: Option<i64>,
}

/// The query of `GET /v1/idempotency`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct IdempotencyQuery {
    /// `all` (default), `in_progress`, `stuck` or `completed`.
    state: Option<String>,
    /// At most this many (1..=1000, default 100).
    limit: Option<u32>,
    /// Only records with a larger id.
    after: Option<i64>,
}

fn parse_query(query: Option<&str>) -> Result<ListRequest, ApiError> {
    let mut r = ListRequest {
        scope: Some(IDEMPOTENCY_SCOPE.into()),
        limit: 100,
        ..Default::default()
    };
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "state" => {
                r.filter = v
                    .parse::<ListFilter>()
                    .map_err(|e| ApiError::bad_field("state", &v, e))?;
            }
            "limit" => {
                let n: u32 = v.parse().map_err(|_| {
                    ApiError::bad_field(
                        "limit",
                        &v,
                        format!("limit must be a whole number 1..={MAX_LIST}"),
                    )
                })?;
                if !(1..=MAX_LIST).contains(&n) {
                    return Err(ApiError::bad_field(
                        "limit",
                        &v,
                        format!("limit must be 1..={MAX_LIST}"),
                    ));
                }
                r.limit = n;
            }
            "after" => {
                let n: i64 = v.parse().map_err(|_| {
                    ApiError::bad_field(
                        "after",
                        &v,
                        "after must be a record id (a whole number >= 0)",
                    )
                })?;
                if n < 0 {
                    return Err(ApiError::bad_field("after", &v, "after must be >= 0"));
                }
                r.after = Some(RecordId(n));
            }
            k => {
                return Err(crate::api::unknown_param(k, &["state", "limit", "after"]));
            }
        }
    }
    Ok(r)
}

fn store_problem(e: redrive_idempotency::IdempotencyStoreError) -> ApiError {
    tracing::error!(error = %e, "idempotency store failure");
    ApiError::unavailable()
}

/// The `Idempotency-Key`s of `POST /v1/jobs`, by id (`state=stuck`: the ones whose request
/// vanished before storing its response).
#[utoipa::path(
    get, path = "/v1/idempotency", tag = "idempotency",
    params(IdempotencyQuery),
    responses(
        (status = 200, description = "A page of records; pass `next` as `after` for the next", body = IdempotencyPage),
        (status = 400, description = "Bad or unknown query parameter (`field` names it)", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = crate::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_keys(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<IdempotencyPage>, ApiError> {
    let request = parse_query(query.as_deref())?;
    let store = state.inner.idempotency.store();
    let records = store.list(&request).await.map_err(store_problem)?;
    let next = (records.len() == request.effective_limit() as usize)
        .then(|| records.last().map(|r| r.info.id.0))
        .flatten();
    Ok(Json(IdempotencyPage {
        records: records.into_iter().map(Into::into).collect(),
        next,
    }))
}

/// Recovers a stuck `Idempotency-Key` of `POST /v1/jobs`: releases it, so the next request
/// with the key enqueues again (and finds the job by its key if the vanished request made
/// it). Refused for a key that completed (409) or whose request still runs (409).
#[utoipa::path(
    post, path = "/v1/idempotency/{key}/recover", tag = "idempotency",
    params(("key" = String, Path, description = "The Idempotency-Key (percent-encoded)")),
    responses(
        (status = 200, description = "Released; the record as it is now", body = IdempotencyRecordView),
        (status = 400, description = "Not a valid Idempotency-Key", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong bearer token", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No record has this key", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "The key completed, or its request still runs", body = crate::ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable", body = crate::ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn recover_key(
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Json<IdempotencyRecordView>, ApiError> {
    let parsed = IdempotencyKey::parse(key.as_bytes())
        .map_err(|e| ApiError::bad_field("key", &key, e.to_string()))?;
    let key = parsed.as_str().to_owned();
    let store = state.inner.idempotency.store();
    let conflict = |detail: String| {
        let mut p = ApiError::new(
            StatusCode::CONFLICT,
            "not-stuck",
            "The key is not stuck",
            detail,
        );
        p.field = Some("key".into());
        p.value = Some(key.clone());
        p
    };
    match release_stuck(&**store, IDEMPOTENCY_SCOPE, &key)
        .await
        .map_err(store_problem)?
    {
        ReleaseOutcome::Released(info) => {
            tracing::warn!(key = %key, "idempotency key released by an operator");
            Ok(Json(IdempotencyRecordView::of(key, &info)))
        }
        ReleaseOutcome::NotFound => {
            let mut p = ApiError::not_found(format!("no record has the Idempotency-Key {key:?}"));
            p.field = Some("key".into());
            p.value = Some(key);
            Err(p)
        }
        ReleaseOutcome::Completed => Err(conflict(format!(
            "the request with the Idempotency-Key {key:?} completed; a repeat gets its response"
        ))),
        ReleaseOutcome::Running => Err(conflict(format!(
            "the request with the Idempotency-Key {key:?} is still running"
        ))),
        other => Err(conflict(format!("{other:?}"))),
    }
}
