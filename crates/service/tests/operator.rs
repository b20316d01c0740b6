//! The operator routes: pause and resume a queue and a dependency, force a breaker, run now,
//! bulk actions by filter with a dry run, the audit trail with the token's label, and
//! read-only tokens.

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use redrive_service::{ApiToken, AppConfig};
use redrive_store::{ClaimParams, JobState, NewJob};
use serde_json::json;
use support::*;

fn with_token(req: axum::http::request::Builder, token: &str) -> axum::http::request::Builder {
    req.header("authorization", format!("Bearer {token}"))
}

fn authed_post(uri: &str, token: &str, body: &str) -> Request<Body> {
    with_token(Request::post(uri), token)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

fn authed_get(uri: &str, token: &str) -> Request<Body> {
    with_token(Request::get(uri), token)
        .body(Body::empty())
        .unwrap()
}

fn tokens() -> AppConfig {
    AppConfig {
        tokens: vec![
            ApiToken::parse("ops:ops-secret-123", false),
            ApiToken::parse("viewer:view-secret-123", true),
            ApiToken::parse("plain-secret-no-label", false),
        ],
        ..AppConfig::default()
    }
}

fn claim(queue: &str) -> ClaimParams {
    ClaimParams {
        queues: vec![queue.into()],
        worker: "w".into(),
        limit: 10,
        lease: std::time::Duration::from_secs(30),
        now: chrono::Utc::now(),
        kinds: redrive_store::Kinds::Any,
    }
}

#[tokio::test]
async fn queue_pause_and_resume_with_the_tokens_label_in_the_audit() {
    let h = sqlite(tokens()).await;
    let app = h.app();
    h.store
        .enqueue(&NewJob::new("pay", "noop", json!({})), chrono::Utc::now())
        .await
        .unwrap();
    let r = send(
        &app,
        authed_post("/v1/queues/pay/pause", "ops-secret-123", ""),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"queue": "pay", "paused": true, "changed": true})
    );
    assert!(h.store.claim(&claim("pay")).await.unwrap().is_empty());
    let listed = send(&app, authed_get("/v1/queues", "view-secret-123")).await;
    assert_eq!(listed.json()["paused"][0]["queue"], "pay");
    assert_eq!(listed.json()["paused"][0]["paused_by"], "ops");
    // A read-only token may read, never write.
    let refused = send(
        &app,
        authed_post("/v1/queues/pay/resume", "view-secret-123", ""),
    )
    .await;
    refused.assert_problem_status(403);
    assert!(refused.body.contains("read-only"), "{}", refused.body);
    assert!(h.store.claim(&claim("pay")).await.unwrap().is_empty());
    // A plain token keeps working (labelled `token`).
    let r = send(
        &app,
        authed_post("/v1/queues/pay/resume", "plain-secret-no-label", ""),
    )
    .await;
    assert_eq!(r.json()["changed"], true);
    assert_eq!(h.store.claim(&claim("pay")).await.unwrap().len(), 1);
    let audit = send(&app, authed_get("/v1/audit", "view-secret-123")).await;
    assert_eq!(audit.status, StatusCode::OK);
    let rows = audit.json()["audit"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 2, "the refused write left no row: {rows:?}");
    assert_eq!(rows[0]["action"], "queue_resume");
    assert_eq!(rows[0]["actor"], "token");
    assert_eq!(rows[1]["action"], "queue_pause");
    assert_eq!(rows[1]["actor"], "ops");
    assert_eq!(rows[1]["via"], "api");
    assert_eq!(rows[1]["target"], json!({"queue": "pay"}));
    assert_eq!(rows[1]["rows"], 1);
    // Unknown or bad query parameters are named.
    send(&app, authed_get("/v1/audit?nope=1", "ops-secret-123"))
        .await
        .assert_problem(400, "nope");
    send(&app, authed_get("/v1/audit?limit=0", "ops-secret-123"))
        .await
        .assert_problem(400, "limit");
    let page = send(&app, authed_get("/v1/audit?limit=1", "ops-secret-123")).await;
    let next = page.json()["next"].as_i64().unwrap();
    let older = send(
        &app,
        authed_get(&format!("/v1/audit?before={next}"), "ops-secret-123"),
    )
    .await;
    assert_eq!(older.json()["audit"][0]["action"], "queue_pause");
    h.cleanup().await;
}

#[tokio::test]
async fn dependency_pause_force_and_the_breakers_show_the_override() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let r = send(
        &app,
        post_json("/v1/breakers/psp/force", r#"{"mode":"open"}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["mode"], "forced_open");
    assert_eq!(r.json()["effective_state"], "open");
    let b = send(&app, get("/v1/breakers")).await.json();
    let psp = &b["breakers"][0];
    assert_eq!(
        (psp["name"].as_str(), psp["mode"].as_str()),
        (Some("psp"), Some("forced_open"))
    );
    send(
        &app,
        post_json("/v1/breakers/psp/force", r#"{"mode":"sideways"}"#),
    )
    .await
    .assert_problem(400, "mode");
    send(
        &app,
        post_json("/v1/breakers/psp/force", r#"{"mood":"open"}"#),
    )
    .await
    .assert_problem(400, "mood");
    let r = send(
        &app,
        post_json("/v1/breakers/psp/force", r#"{"mode":"auto"}"#),
    )
    .await;
    assert_eq!(r.json()["mode"], "normal");
    // Pause until resumed (no body), for a while, until a time.
    let r = send(&app, post_empty("/v1/dependencies/psp/pause")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["paused_until_resumed"], true);
    assert_eq!(r.json()["pause_reason"], "operator");
    let r = send(&app, post_empty("/v1/dependencies/psp/resume")).await;
    assert_eq!(r.json()["paused_until"], serde_json::Value::Null);
    let r = send(
        &app,
        post_json("/v1/dependencies/psp/pause", r#"{"for":"10m"}"#),
    )
    .await;
    assert_eq!(r.json()["paused_until_resumed"], false);
    assert!(r.json()["paused_until"].is_string());
    send(
        &app,
        post_json(
            "/v1/dependencies/psp/pause",
            r#"{"until":"2001-01-01T00:00:00Z"}"#,
        ),
    )
    .await
    .assert_problem(400, "until");
    send(
        &app,
        post_json("/v1/dependencies/psp/pause", r#"{"for":"soon"}"#),
    )
    .await
    .assert_problem(400, "for");
    // Only an object is a body (serde would take an array of the fields).
    send(
        &app,
        post_json("/v1/dependencies/psp/pause", "[null, null]"),
    )
    .await
    .assert_problem(400, "body");
    // An empty field is refused, not read as "until resumed" (schemathesis found it).
    send(
        &app,
        post_json("/v1/dependencies/psp/pause", r#"{"until":""}"#),
    )
    .await
    .assert_problem(400, "until");
    send(
        &app,
        post_json("/v1/dependencies/psp/pause", r#"{"for":""}"#),
    )
    .await
    .assert_problem(400, "for");
    let audit = send(&app, get("/v1/audit")).await.json();
    let actions: Vec<&str> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        vec![
            "dependency_pause",
            "dependency_resume",
            "dependency_pause",
            "breaker_force",
            "breaker_force"
        ]
    );
    assert_eq!(audit["audit"][0]["actor"], "anonymous");
    h.cleanup().await;
}

#[tokio::test]
async fn run_now_and_bulk_actions_with_dry_run_and_audit_of_replay_and_cancel() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let now = chrono::Utc::now();
    let later = now + chrono::Duration::hours(1);
    let scheduled = h
        .store
        .enqueue(&NewJob::new("later", "noop", json!({})).run_at(later), now)
        .await
        .unwrap()
        .job
        .id;
    let r = send(&app, post_empty(&format!("/v1/jobs/{scheduled}/run-now"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["attempts"], 0);
    let j = h.store.get(scheduled).await.unwrap().unwrap();
    assert!(j.run_at <= chrono::Utc::now());
    // Already due: 409; none: 404.
    send(&app, post_empty(&format!("/v1/jobs/{scheduled}/run-now")))
        .await
        .assert_problem_status(409);
    send(&app, post_empty("/v1/jobs/999999/run-now"))
        .await
        .assert_problem_status(404);
    let d1 = dead_job(&h.store, "pay", json!({}), "card ch_12345678 declined").await;
    let d2 = dead_job(&h.store, "refunds", json!({}), "HTTP 503").await;
    // Dry runs of each action change nothing.
    for (action, want) in [
        ("replay", vec![d1, d2]),
        ("purge", vec![d1, d2]),
        ("cancel", vec![scheduled]),
        ("run_now", vec![]),
    ] {
        let r = send(
            &app,
            post_json(
                "/v1/jobs/bulk",
                &json!({"action": action, "dry_run": true}).to_string(),
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.json()["dry_run"], true);
        assert_eq!(r.json()["ids"], json!(want), "{action}");
    }
    assert_eq!(
        h.store.get(d1).await.unwrap().unwrap().state,
        JobState::Dead
    );
    assert_eq!(
        h.store.get(d2).await.unwrap().unwrap().state,
        JobState::Dead
    );
    assert!(
        send(&app, get("/v1/audit")).await.json()["audit"]
            .as_array()
            .unwrap()
            .len()
            == 3,
        "only the three run-now calls so far (dry runs are not audited)"
    );
    // By signature: only the card decline.
    let sig = redrive_store::error_signature("card ch_12345678 declined");
    let r = send(
        &app,
        post_json(
            "/v1/jobs/bulk",
            &json!({"action": "replay", "signature": sig}).to_string(),
        ),
    )
    .await;
    assert_eq!(r.json()["ids"], json!([d1]));
    assert_eq!(
        h.store.get(d1).await.unwrap().unwrap().state,
        JobState::Available
    );
    send(&app, post_json("/v1/jobs/bulk", r#"{"action":"explode"}"#))
        .await
        .assert_problem(400, "action");
    send(
        &app,
        post_json("/v1/jobs/bulk", r#"{"action":"replay","colour":"red"}"#),
    )
    .await
    .assert_problem(400, "colour");
    // The existing replay and cancel routes are audited too.
    let r = send(&app, post_empty(&format!("/v1/jobs/{d2}/replay"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = send(&app, post_empty(&format!("/v1/jobs/{d2}/cancel"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    send(&app, post_empty(&format!("/v1/jobs/{d2}/cancel")))
        .await
        .assert_problem_status(409);
    let audit = send(&app, get("/v1/audit")).await.json();
    let rows: Vec<(String, u64)> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap().to_owned(),
                r["rows"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("cancel".to_owned(), 0),
            ("cancel".to_owned(), 1),
            ("replay".to_owned(), 1),
            ("replay".to_owned(), 1),
            ("run_now".to_owned(), 0),
            ("run_now".to_owned(), 0),
            ("run_now".to_owned(), 1),
        ]
    );
    h.cleanup().await;
}

#[tokio::test]
async fn the_openapi_document_describes_the_operator_routes() {
    let doc = redrive_service::openapi_document(&redrive_policy::PolicySet::default());
    for path in [
        "/v1/queues",
        "/v1/queues/{queue}/pause",
        "/v1/queues/{queue}/resume",
        "/v1/dependencies/{name}/pause",
        "/v1/dependencies/{name}/resume",
        "/v1/breakers/{name}/force",
        "/v1/jobs/{id}/run-now",
        "/v1/jobs/bulk",
        "/v1/audit",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is not documented");
    }
    assert!(doc["components"]["schemas"]["AuditView"].is_object());
}
