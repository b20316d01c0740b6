//! The HTTP surface: `/v1/charges` behind the fault middleware, and the
//! `/_sim` control routes (never faulted, never counted).
//!
//! Why the layer slot sits where it does: outage, rate limit and error rate
//! are decided at the edge, before any idempotency check (a real PSP's load
//! balancer answers those); the hold-back and the latency are added after,
//! so an idempotency layer in the slot sees the charge committed and its
//! response stored at once, exactly as a PSP whose answer got lost.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, Route, get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tower::{Layer, Service};

use crate::faults::{Faults, Verdict};
use crate::ledger::{Begin, ChargeRequest, ChargeRequestError, MAX_KEY_LEN};
use crate::state::{Reservation, SimState};
use crate::stats::Note;

/// The header carrying the idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The header set on a response replayed from the ledger.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The `POST /v1/charges` route, as handed to a charges layer.
pub type ChargesRoute = MethodRouter<SimState>;

/// A function wrapping the charges route (what [`router_with`] and
/// [`crate::PspSimBuilder::charges_layer`] install).
pub(crate) type Wrap = Box<dyn FnOnce(ChargesRoute) -> ChargesRoute + Send>;

/// The simulator's routes over `state`, with nothing in front of the ledger.
pub fn router(state: SimState) -> Router {
    build(state, Box::new(|r| r))
}

/// The simulator's routes with `charges_layer` wrapped around
/// `POST /v1/charges` only: after the edge faults (outage, rate limit, error
/// rate), before the ledger's own dedupe, and inside the hold-back and the
/// latency. This is the seam for the generic idempotency layer.
pub fn router_with<L>(state: SimState, charges_layer: L) -> Router
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Response: IntoResponse + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    build(state, wrap_with(charges_layer))
}

pub(crate) fn wrap_with<L>(layer: L) -> Wrap
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Response: IntoResponse + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    Box::new(move |r: ChargesRoute| r.route_layer(layer))
}

pub(crate) fn build(state: SimState, wrap: Wrap) -> Router {
    let v1 = Router::new()
        .route("/v1/charges", wrap(post(create_charge)).get(charge_by_key))
        .route("/v1/charges/{id}", get(charge_by_id))
        .layer(middleware::from_fn_with_state(state.clone(), faults_mw));
    let control = Router::new()
        .route("/_sim/faults", get(get_faults).post(post_faults))
        .route("/_sim/stats", get(get_stats))
        .route("/_sim/requests", get(get_requests))
        .route("/_sim/reset", post(post_reset));
    v1.merge(control).fallback(not_found).with_state(state)
}

/// A `application/problem+json` answer.
#[derive(Debug)]
pub(crate) struct Problem {
    status: StatusCode,
    title: &'static str,
    detail: String,
    field: Option<String>,
    retry_after: Option<u64>,
}

impl Problem {
    fn new(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            status,
            title,
            detail: detail.into(),
            field: None,
            retry_after: None,
        }
    }

    fn field(mut self, f: impl Into<String>) -> Self {
        self.field = Some(f.into());
        self
    }

    fn retry_after(mut self, secs: Option<u64>) -> Self {
        self.retry_after = secs;
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": "about:blank",
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let Some(f) = self.field {
            body["field"] = Value::String(f);
        }
        let mut resp = (self.status, body.to_string()).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// Marks a response whose charge was just made (not a replay).
#[derive(Debug, Clone, Copy)]
struct Committed;

fn with_note(mut resp: Response, note: Note) -> Response {
    resp.extensions_mut().insert(note);
    resp
}

async fn faults_mw(State(sim): State<SimState>, req: Request, next: Next) -> Response {
    let charge_key = if req.method() == Method::POST && req.uri().path() == "/v1/charges" {
        req.headers()
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN)
            .map(str::to_owned)
    } else {
        None
    };
    let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
    let traceparent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .filter(|t| t.len() <= 128)
        .map(str::to_owned);
    let (mut arrival, faults, verdict) = sim.arrive(&method, &path, charge_key);
    arrival.traceparent = traceparent;
    let (resp, note) = match verdict {
        Verdict::Pass => {
            let resp = next.run(req).await;
            let note = match resp.extensions().get::<Note>().copied() {
                Some(n) => n,
                // A stored response replayed by a layer in front of the ledger: it carries
                // the replay marker but none of the handler's notes.
                None if resp
                    .headers()
                    .get(IDEMPOTENT_REPLAYED)
                    .is_some_and(|v| v == "true") =>
                {
                    Note::LayerReplay
                }
                None => Note::Plain,
            };
            (resp, note)
        }
        Verdict::Outage => (outage(&faults).into_response(), Note::Outage),
        Verdict::RateLimited => (rate_limited(&faults).into_response(), Note::RateLimited),
        Verdict::Error(s) => (server_error(s).into_response(), Note::Error),
    };
    sim.record(arrival, resp.status().as_u16(), note);
    if resp.extensions().get::<Committed>().is_some() && sim.roll_timeout_after_commit() {
        sim.sleep(faults.timeout_delay).await;
    }
    sim.sleep(faults.latency).await;
    resp
}

fn outage(f: &Faults) -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "Service Unavailable",
        "simulated outage",
    )
    .retry_after(f.outage_retry_after.map(|d| d.as_secs()))
}

fn rate_limited(f: &Faults) -> Problem {
    Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "Too Many Requests",
        format!(
            "simulated rate limit of {} requests per second",
            f.rate_limit.unwrap_or_default()
        ),
    )
    .retry_after(f.retry_after.map(|d| d.as_secs()))
}

fn server_error(status: u16) -> Problem {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Problem::new(
        status,
        status.canonical_reason().unwrap_or("Server Error"),
        "simulated server error; no charge was made",
    )
}

fn reservation_key(r: &Reservation) -> String {
    r.key().to_owned()
}

/// A 402 decline: `application/problem+json` with the network's advice as extension members
/// (`network`, `response_code`, `category`, `advice_code`), the mix name as `decline_code`,
/// and the `card`. redrive's `http` kind reads it with the `redrive` decline preset.
fn declined(kind: crate::DeclineKind, card: &str) -> Response {
    let a = kind.advice();
    let body = json!({
        "type": "about:blank",
        "title": "Payment Required",
        "status": 402,
        "detail": format!("card declined ({kind})"),
        "decline_code": kind.to_string(),
        "network": a.network().as_str(),
        "response_code": kind.response_code(),
        "category": a.category(),
        "advice_code": a.advice_code().map(|m| format!("{m:02}")),
        "card": card,
    });
    let mut resp = (StatusCode::PAYMENT_REQUIRED, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let bad = |detail: &str| {
        Problem::new(StatusCode::BAD_REQUEST, "Bad Request", detail).field("Idempotency-Key")
    };
    let v = headers
        .get(IDEMPOTENCY_KEY)
        .ok_or_else(|| bad("the Idempotency-Key header is required"))?;
    let k = v
        .to_str()
        .map_err(|_| bad("the Idempotency-Key header must be visible ASCII"))?;
    if k.is_empty() || k.len() > MAX_KEY_LEN {
        return Err(bad(&format!(
            "the Idempotency-Key header must be 1 to {MAX_KEY_LEN} characters"
        )));
    }
    Ok(k.to_owned())
}

fn charge_json(status: StatusCode, charge: &crate::Charge) -> Response {
    (status, Json(charge)).into_response()
}

async fn create_charge(State(sim): State<SimState>, headers: HeaderMap, body: Bytes) -> Response {
    let key = match idempotency_key(&headers) {
        Ok(k) => k,
        Err(p) => return p.into_response(),
    };
    sim.executed(&key);
    let request = match ChargeRequest::parse(&body) {
        Ok(r) => r,
        Err(ChargeRequestError::Malformed { reason }) => {
            return Problem::new(
                StatusCode::BAD_REQUEST,
                "Bad Request",
                format!("malformed JSON body: {reason}"),
            )
            .field("body")
            .into_response();
        }
        Err(ChargeRequestError::Invalid { field, reason }) => {
            return Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Unprocessable Content",
                format!("invalid {field}: {reason}"),
            )
            .field(field)
            .into_response();
        }
    };
    let token = match sim.begin(&key, &request) {
        Begin::Fresh(t) => t,
        Begin::Replay(charge) => {
            let mut resp = charge_json(StatusCode::CREATED, &charge);
            resp.headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            return with_note(resp, Note::Replay);
        }
        Begin::InFlight => {
            let p = Problem::new(
                StatusCode::CONFLICT,
                "Conflict",
                "a request with this Idempotency-Key is still being processed",
            )
            .field("Idempotency-Key")
            .retry_after(Some(1));
            return with_note(p.into_response(), Note::Conflict);
        }
        Begin::Mismatch => {
            let p = Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Unprocessable Content",
                "this Idempotency-Key was used for a different request",
            )
            .field("Idempotency-Key");
            return with_note(p.into_response(), Note::Mismatch);
        }
    };
    let reservation = Reservation::new(sim.clone(), key, token);
    // The transaction is the body's `reference` (a reattempt may come with a new key), else
    // the key; the card is the body's `card`, else the transaction.
    let txn = request
        .reference
        .clone()
        .unwrap_or_else(|| reservation_key(&reservation));
    let card = request.card.clone().unwrap_or_else(|| txn.clone());
    if let Some(kind) = sim.authorise(&txn, &card) {
        // Declined: nothing is charged and nothing is kept under the key (the reservation
        // is given back), so a repeat is a new authorisation.
        drop(reservation);
        return with_note(declined(kind, &card), Note::Declined);
    }
    let processing = sim.faults().processing;
    sim.sleep(processing).await;
    let charge = reservation.commit(&request);
    let mut resp = charge_json(StatusCode::CREATED, &charge);
    resp.extensions_mut().insert(Committed);
    resp
}

async fn charge_by_id(State(sim): State<SimState>, Path(id): Path<String>) -> Response {
    match sim.charge(&id) {
        Some(c) => charge_json(StatusCode::OK, &c),
        None => Problem::new(
            StatusCode::NOT_FOUND,
            "Not Found",
            format!("no charge {id}"),
        )
        .into_response(),
    }
}

async fn charge_by_key(
    State(sim): State<SimState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(key) = q.get("key").filter(|k| !k.is_empty()) else {
        return Problem::new(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "the key query parameter is required: GET /v1/charges?key=IDEMPOTENCY_KEY",
        )
        .field("key")
        .into_response();
    };
    match sim.by_key(key) {
        Ok(Some(c)) => charge_json(StatusCode::OK, &c),
        Ok(None) => Problem::new(
            StatusCode::NOT_FOUND,
            "Not Found",
            "no charge was made for this key",
        )
        .into_response(),
        Err(_) => Problem::new(
            StatusCode::CONFLICT,
            "Conflict",
            "a charge with this key is still being processed",
        )
        .retry_after(Some(1))
        .into_response(),
    }
}

async fn get_faults(State(sim): State<SimState>) -> Response {
    Json(sim.faults().to_json()).into_response()
}

async fn post_faults(State(sim): State<SimState>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return Problem::new(
                StatusCode::BAD_REQUEST,
                "Bad Request",
                format!("malformed JSON body: {e}"),
            )
            .field("body")
            .into_response();
        }
    };
    match Faults::from_json(&v).and_then(|f| sim.set_faults(f)) {
        Ok(f) => Json(f.to_json()).into_response(),
        Err(e) => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Unprocessable Content",
            e.to_string(),
        )
        .field(e.field())
        .into_response(),
    }
}

async fn get_stats(State(sim): State<SimState>) -> Response {
    Json(sim.stats()).into_response()
}

/// Default page size of `GET /_sim/requests`.
const REQUESTS_PAGE: usize = 1_000;
/// Largest page size of `GET /_sim/requests`.
const REQUESTS_PAGE_MAX: usize = 10_000;

async fn get_requests(
    State(sim): State<SimState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let bad = |field: &str, detail: String| {
        Problem::new(StatusCode::BAD_REQUEST, "Bad Request", detail)
            .field(field)
            .into_response()
    };
    if let Some(k) = q.keys().find(|k| *k != "after" && *k != "limit") {
        return bad(
            k,
            format!("unknown query parameter {k:?}: known are after, limit"),
        );
    }
    let after = match q.get("after").map(|v| v.parse::<u64>()) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return bad(
                "after",
                format!("after={:?} is not a request number", q["after"]),
            );
        }
    };
    let limit = match q.get("limit").map(|v| v.parse::<usize>()) {
        None => REQUESTS_PAGE,
        Some(Ok(n)) if (1..=REQUESTS_PAGE_MAX).contains(&n) => n,
        Some(_) => {
            return bad(
                "limit",
                format!(
                    "limit={:?} must be a whole number from 1 to {REQUESTS_PAGE_MAX}",
                    q["limit"]
                ),
            );
        }
    };
    Json(sim.requests(after, limit)).into_response()
}

async fn post_reset(State(sim): State<SimState>) -> Response {
    sim.reset();
    StatusCode::NO_CONTENT.into_response()
}

async fn not_found(req: Request) -> Response {
    Problem::new(
        StatusCode::NOT_FOUND,
        "Not Found",
        format!("no route {} {}", req.method(), req.uri().path()),
    )
    .into_response()
}
