//! `POST /v1/jobs/batch`: N jobs create N, a resent batch creates none (same ids, in order),
//! one bad job refuses the batch naming its index and field with nothing stored, a key used
//! for another request rolls the batch back, and the maximum is enforced.

mod support;

use axum::http::StatusCode;
use redrive_service::{AppConfig, MAX_BATCH_JOBS};
use redrive_store::ListParams;
use serde_json::{Value, json};
use support::*;

async fn stored(h: &Harness) -> Vec<redrive_store::Job> {
    h.store
        .list(&ListParams {
            limit: Some(10_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .jobs
}

fn batch(jobs: Vec<Value>) -> String {
    json!({ "jobs": jobs }).to_string()
}

fn keyed(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"queue": "bill", "kind": "noop", "key": format!("inv-{i}"), "payload": {"n": i}}))
        .collect()
}

async fn resend_creates_nothing_twice(h: &Harness) {
    let app = h.app();
    let n = 250;
    let body = batch(keyed(n));
    let first = send(&app, post_json("/v1/jobs/batch", &body)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let v = first.json();
    assert_eq!(v["created"], n);
    assert_eq!(v["existing"], 0);
    let items = v["jobs"].as_array().unwrap();
    assert_eq!(items.len(), n);
    for (i, it) in items.iter().enumerate() {
        assert_eq!(it["key"], format!("inv-{i}"), "results in input order");
        assert_eq!(it["created"], true);
        assert_eq!(it["state"], "available");
        assert_eq!(it["queue"], "bill");
    }
    let ids: Vec<i64> = items.iter().map(|it| it["id"].as_i64().unwrap()).collect();
    assert_eq!(stored(h).await.len(), n);

    let again = send(&app, post_json("/v1/jobs/batch", &body)).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    let v = again.json();
    assert_eq!(v["created"], 0);
    assert_eq!(v["existing"], n);
    let again_ids: Vec<i64> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|it| {
            assert_eq!(it["created"], false);
            it["id"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(again_ids, ids, "a resent batch returns the same jobs");
    assert_eq!(stored(h).await.len(), n, "nothing stored twice");

    // A batch mixing old and new keys creates only the new ones; the job stored is the one sent.
    let mut mixed = keyed(n + 2);
    mixed.swap(0, n + 1);
    let r = send(&app, post_json("/v1/jobs/batch", &batch(mixed))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (v["created"].as_u64(), v["existing"].as_u64()),
        (Some(2), Some(n as u64))
    );
    assert_eq!(v["jobs"][0]["key"], format!("inv-{}", n + 1));
    assert_eq!(v["jobs"][0]["created"], true);
    let id = v["jobs"][0]["id"].as_i64().unwrap();
    let job = h.store.get(id).await.unwrap().unwrap();
    assert_eq!(job.payload, json!({"n": n + 1}));
    assert_eq!(stored(h).await.len(), n + 2);
}

#[tokio::test]
async fn a_batch_creates_each_job_once_and_a_resend_creates_none_sqlite() {
    let h = sqlite(AppConfig::default()).await;
    resend_creates_nothing_twice(&h).await;
    h.cleanup().await;
}

#[tokio::test]
async fn a_batch_creates_each_job_once_and_a_resend_creates_none_postgres() {
    let Some(h) = postgres(AppConfig::default()).await else {
        return;
    };
    resend_creates_nothing_twice(&h).await;
    h.cleanup().await;
}

#[tokio::test]
async fn bad_jobs_are_named_by_index_and_field_and_nothing_is_stored() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let mut jobs = keyed(6);
    // Above the payment policy's 15 attempts: 422 alone.
    jobs[2]["max_attempts"] = json!(99);
    // Not a number: 400 alone.
    jobs[4]["priority"] = json!("high");
    jobs[5] = json!("not an object");
    let r = send(&app, post_json("/v1/jobs/batch", &batch(jobs))).await;
    r.assert_problem(422, "jobs[2].max_attempts");
    let p = r.json();
    assert_eq!(p["value"], "99");
    let errors = p["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 3, "{}", r.body);
    assert_eq!(
        (
            &errors[0]["index"],
            &errors[0]["field"],
            errors[0]["status"].as_u64()
        ),
        (&json!(2), &json!("max_attempts"), Some(422))
    );
    assert_eq!(
        (
            &errors[1]["index"],
            &errors[1]["field"],
            errors[1]["status"].as_u64()
        ),
        (&json!(4), &json!("priority"), Some(400))
    );
    assert_eq!(errors[2]["index"], 5);
    assert!(
        errors[0]["detail"]
            .as_str()
            .unwrap()
            .contains("max_attempts"),
        "{}",
        r.body
    );
    assert!(stored(&h).await.is_empty(), "one bad job: nothing stored");

    // An unknown field of a job is named too.
    let mut jobs = keyed(2);
    jobs[1]["colour"] = json!("red");
    let r = send(&app, post_json("/v1/jobs/batch", &batch(jobs))).await;
    r.assert_problem(422, "jobs[1].colour");
    assert!(stored(&h).await.is_empty());
    h.cleanup().await;
}

#[tokio::test]
async fn a_key_used_for_another_request_rolls_the_batch_back() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let r = send(
        &app,
        post_json(
            "/v1/jobs",
            r#"{"queue": "bill", "kind": "noop", "key": "inv-1", "payload": {"n": 1}}"#,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // inv-0 is new; inv-1 exists with payload {"n": 1}, sent now with {"n": 7}.
    let mut jobs = keyed(3);
    jobs[1]["payload"] = json!({"n": 7});
    let r = send(&app, post_json("/v1/jobs/batch", &batch(jobs))).await;
    r.assert_problem(422, "jobs[1].key");
    assert_eq!(r.json()["errors"][0]["index"], 1);
    assert_eq!(stored(&h).await.len(), 1, "inv-0 and inv-2 rolled back");

    // The same key twice in one batch: the same request is one job, another is refused.
    let same = vec![keyed(1)[0].clone(), keyed(1)[0].clone()];
    let r = send(&app, post_json("/v1/jobs/batch", &batch(same))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let v = r.json();
    assert_eq!(v["jobs"][0]["id"], v["jobs"][1]["id"]);
    assert_eq!(
        (v["created"].as_u64(), v["existing"].as_u64()),
        (Some(1), Some(1))
    );
    let mut other = vec![keyed(3)[2].clone(), keyed(3)[2].clone()];
    other[1]["kind"] = json!("http-ish");
    let r = send(&app, post_json("/v1/jobs/batch", &batch(other))).await;
    r.assert_problem(422, "jobs[1].key");
    assert_eq!(stored(&h).await.len(), 2, "inv-2 was not stored");
    h.cleanup().await;
}

#[tokio::test]
async fn more_than_the_maximum_is_refused_naming_jobs() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let r = send(
        &app,
        post_json("/v1/jobs/batch", &batch(keyed(MAX_BATCH_JOBS + 1))),
    )
    .await;
    r.assert_problem(422, "jobs");
    assert_eq!(r.json()["value"], (MAX_BATCH_JOBS + 1).to_string());
    assert!(r.json().get("errors").is_none(), "{}", r.body);
    assert!(stored(&h).await.is_empty());
    // The maximum itself is fine.
    let r = send(
        &app,
        post_json("/v1/jobs/batch", &batch(keyed(MAX_BATCH_JOBS))),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(stored(&h).await.len(), MAX_BATCH_JOBS);
    // A body over the byte limit: 413 naming the body.
    let pad = "x".repeat(1024 * 1024 - 100);
    let big: Vec<Value> = (0..9)
        .map(|i| json!({"queue": "big", "kind": "noop", "payload": {"pad": pad, "i": i}}))
        .collect();
    let r = send(&app, post_json("/v1/jobs/batch", &batch(big))).await;
    r.assert_problem(413, "body");
    h.cleanup().await;
}

#[tokio::test]
async fn malformed_batches_are_problems() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    for (body, field) in [
        ("[]", "body"),
        (r#"{"job": []}"#, "job"),
        ("{}", "jobs"),
        (r#"{"jobs": {}}"#, "jobs"),
        ("{", "body"),
    ] {
        let r = send(&app, post_json("/v1/jobs/batch", body)).await;
        r.assert_problem(400, field);
    }
    // Each job's key is its idempotency; the header is refused rather than ignored.
    let mut req = post_json("/v1/jobs/batch", &batch(keyed(1)));
    req.headers_mut()
        .insert("idempotency-key", "k".parse().unwrap());
    send(&app, req).await.assert_problem(400, "Idempotency-Key");
    // Without a token a body needs Content-Type: application/json.
    let req = axum::http::Request::post("/v1/jobs/batch")
        .body(axum::body::Body::empty())
        .unwrap();
    send(&app, req).await.assert_problem_status(415);
    // An empty batch does nothing.
    let r = send(&app, post_json("/v1/jobs/batch", r#"{"jobs": []}"#)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json(), json!({"created": 0, "existing": 0, "jobs": []}));
    assert!(stored(&h).await.is_empty());
    h.cleanup().await;
}

#[tokio::test]
async fn the_batch_route_is_in_the_openapi_document_behind_the_token() {
    let token = "batch-test-token-0123456789abcdef";
    let h = sqlite(AppConfig {
        token: Some(token.into()),
        ..Default::default()
    })
    .await;
    let app = h.app();
    let doc = send(&app, get("/openapi.json")).await.json();
    let op = &doc["paths"]["/v1/jobs/batch"]["post"];
    assert_eq!(
        op["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/BatchRequest"
    );
    assert_eq!(
        doc["components"]["schemas"]["BatchRequest"]["properties"]["jobs"]["maxItems"],
        MAX_BATCH_JOBS
    );
    for code in ["200", "201", "400", "401", "413", "422"] {
        assert!(op["responses"][code].is_object(), "{code} undocumented");
    }
    // Refused without the token, accepted with it.
    let r = send(&app, post_json("/v1/jobs/batch", &batch(keyed(2)))).await;
    r.assert_problem_status(401);
    let mut req = post_json("/v1/jobs/batch", &batch(keyed(2)));
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let r = send(&app, req).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    h.cleanup().await;
}
