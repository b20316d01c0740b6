//! Issue 16, the API's half of part B: the shared enqueue validation (a bad `http` payload is a
//! 422 naming the field, the same key for another payload is a 422), redaction of everything
//! the API shows, and property tests of the list query string.

mod support;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redrive_service::AppConfig;
use redrive_store::NewJob;
use serde_json::json;
use support::*;

#[tokio::test]
async fn bad_http_payloads_are_refused_at_enqueue_naming_the_field() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let cases = [
        (json!({}), "payload"),
        (
            json!({"method": "FETCH", "url": "http://h/"}),
            "payload.method",
        ),
        (
            json!({"method": "GET", "url": "http://h/", "headers": {"X-Api-Key": "k-value\r\nX-Evil: 1"}}),
            "payload.headers.X-Api-Key",
        ),
        (
            json!({"method": "GET", "url": "http://user:hunter2@exa mple.com/?api_key=k-value"}),
            "payload.url",
        ),
        (
            json!({"method": "GET", "url": "http://h/", "timeout_ms": 0}),
            "payload.timeout_ms",
        ),
    ];
    for (payload, field) in cases {
        let body = json!({"queue": "q", "kind": "http", "payload": payload}).to_string();
        let r = send(&app, post_json("/v1/jobs", &body)).await;
        r.assert_problem(422, field);
        assert!(
            !r.body.contains("hunter2") && !r.body.contains("k-value"),
            "a secret in the problem: {}",
            r.body
        );
    }
    for (body, field) in [
        (
            r#"{"queue": "q", "kind": "noop", "priority": 2000000}"#,
            "priority",
        ),
        (r#"{"queue": "q\u202e", "kind": "noop"}"#, "queue"),
        (r#"{"queue": "q", "kind": "noop", "key": "k\u200b"}"#, "key"),
        (
            r#"{"queue": "q", "kind": "noop", "run_at": "2999-01-01T00:00:00Z"}"#,
            "run_at",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "delay": "9000h"}"#,
            "delay",
        ),
    ] {
        send(&app, post_json("/v1/jobs", body))
            .await
            .assert_problem(422, field);
    }
    assert!(h.store.counts().await.unwrap().is_empty());
    h.cleanup().await;
}

#[tokio::test]
async fn the_same_key_for_another_payload_is_refused() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let first = send(
        &app,
        post_json(
            "/v1/jobs",
            r#"{"queue": "pay", "kind": "noop", "key": "order-9", "payload": {"amount": 5}}"#,
        ),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let same = send(
        &app,
        post_json(
            "/v1/jobs",
            r#"{"queue": "pay", "kind": "noop", "key": "order-9", "payload": {"amount": 5}}"#,
        ),
    )
    .await;
    assert_eq!(same.status, StatusCode::OK, "{}", same.body);
    let other = send(
        &app,
        post_json(
            "/v1/jobs",
            r#"{"queue": "pay", "kind": "noop", "key": "order-9", "payload": {"amount": 6}}"#,
        ),
    )
    .await;
    other.assert_problem(422, "key");
    assert!(other.body.contains("order-9"), "{}", other.body);
    h.cleanup().await;
}

#[tokio::test]
async fn what_the_api_and_dashboard_show_carries_no_secret() {
    let h = sqlite(AppConfig::default()).await;
    let secrets = [
        "sv-auth",
        "sv-apikey",
        "sv-apim",
        "sv-sig",
        "sv-pass",
        "sv-query",
    ];
    let payload = json!({
        "method": "POST",
        "url": "https://merchant:sv-pass@psp.example/v1/charges?api_key=sv-query&page=1",
        "headers": {"Authorization": "Bearer sv-auth", "X-Api-Key": "sv-apikey",
                    "Ocp-Apim-Subscription-Key": "sv-apim", "X-Signature": "sv-sig",
                    "Accept": "application/json"},
        "body": {"amount": 5}
    });
    let id = h
        .store
        .enqueue(&NewJob::new("pay", "http", payload), chrono::Utc::now())
        .await
        .unwrap()
        .job
        .id;
    // A dead job whose error carries a URL with credentials (as an older version wrote them).
    let dead = dead_job(
        &h.store,
        "pay",
        json!({}),
        "POST https://merchant:sv-pass@psp.example/x?token=sv-query → 500",
    )
    .await;
    let app = h.app();
    for uri in [
        format!("/v1/jobs/{id}"),
        "/v1/jobs".to_owned(),
        format!("/v1/jobs/{dead}"),
        format!("/jobs/{id}"),
    ] {
        let r = send(&app, get(&uri)).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.body);
        for s in secrets {
            assert!(!r.body.contains(s), "{uri} shows {s}: {}", r.body);
        }
    }
    let d = send(&app, get(&format!("/v1/jobs/{id}"))).await.json();
    assert_eq!(
        d["job"]["payload"]["url"],
        "https://merchant:***@psp.example/v1/charges?api_key=***&page=1"
    );
    assert_eq!(d["job"]["payload"]["headers"]["Accept"], "application/json");
    // Stored payloads keep the real values: the worker needs them.
    let stored = h.store.get(id).await.unwrap().unwrap();
    assert_eq!(stored.payload["headers"]["X-Api-Key"], "sv-apikey");
    h.cleanup().await;
}

/// One generated query parameter.
fn param() -> impl Strategy<Value = (String, String)> {
    let key = prop_oneof![
        Just("state".to_owned()),
        Just("queue".to_owned()),
        Just("limit".to_owned()),
        Just("after".to_owned()),
        "[a-z_]{1,8}",
        "\\PC{0,6}",
    ];
    let value = prop_oneof![
        Just("dead".to_owned()),
        Just("available".to_owned()),
        (0u64..2000).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "-?[0-9]{1,30}",
        "\\PC{0,12}",
        ".{0,12}",
    ];
    (key, value)
}

/// The query as sent: encoded pairs, or raw bytes kept to what a URI may hold.
fn query() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(param(), 0..6).prop_map(|ps| {
            form_urlencoded::Serializer::new(String::new())
                .extend_pairs(ps)
                .finish()
        }),
        "[!-~]{0,40}".prop_map(|s| s.replace('#', "%23")),
    ]
}

/// `GET /v1/jobs?Q` never fails with a 5xx or a panic; a 200 honours `limit` and `state`.
fn check_query(
    rt: &tokio::runtime::Runtime,
    app: &redrive_service::Router,
    q: &str,
) -> Result<(), TestCaseError> {
    let uri = format!("/v1/jobs?{q}");
    let Ok(req) = axum::http::Request::builder()
        .uri(&uri)
        .body(axum::body::Body::empty())
    else {
        return Ok(()); // not a URI a client could send
    };
    let r = rt.block_on(send(app, req));
    prop_assert!(
        r.status == StatusCode::OK || r.status == StatusCode::BAD_REQUEST,
        "{uri}: {} {}",
        r.status,
        r.body
    );
    if r.status == StatusCode::OK {
        let page = r.json();
        let jobs = page["jobs"].as_array().unwrap();
        let pairs: Vec<(String, String)> = form_urlencoded::parse(q.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if let Some((_, n)) = pairs.iter().rev().find(|(k, _)| k == "limit") {
            prop_assert!(jobs.len() <= n.parse::<usize>().unwrap(), "{uri}");
        }
        if let Some((_, s)) = pairs.iter().rev().find(|(k, _)| k == "state") {
            prop_assert!(jobs.iter().all(|j| j["state"] == s.as_str()), "{uri}");
        }
    } else {
        let p = r.json();
        prop_assert!(p["field"].is_string(), "{uri}: {}", r.body);
    }
    Ok(())
}

fn query_harness() -> (tokio::runtime::Runtime, Harness) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let h = rt.block_on(async {
        let h = sqlite(AppConfig::default()).await;
        for (i, q) in ["a", "b", "a"].iter().enumerate() {
            h.store
                .enqueue(
                    &NewJob::new(*q, "noop", json!({"i": i})),
                    chrono::Utc::now(),
                )
                .await
                .unwrap();
        }
        h
    });
    (rt, h)
}

#[test]
fn list_query_strings_never_fail_the_server() {
    let (rt, h) = query_harness();
    let app = h.app();
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&query(), |q| check_query(&rt, &app, &q))
        .unwrap();
}

/// The long run: `REDRIVE_PROPTEST_SECS` (default 600) of generated query strings.
#[test]
#[ignore = "long run: cargo test -p redrive-service --test hardening -- --ignored"]
fn list_query_strings_long_run() {
    let (rt, h) = query_harness();
    let app = h.app();
    let secs: u64 = std::env::var("REDRIVE_PROPTEST_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut cases = 0u64;
    while Instant::now() < end {
        let mut runner = TestRunner::new(Config {
            cases: 1000,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&query(), |q| check_query(&rt, &app, &q))
            .unwrap();
        cases += 1000;
    }
    eprintln!("list query strings: {cases} cases, 0 failures");
}
