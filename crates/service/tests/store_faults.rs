//! `/readyz` and the enqueue under store faults (findings 1 and 9 of the hardening issue), and
//! the operator's idempotency routes (finding 8).
//!
//! Before: `/readyz` read one row, so it answered 200 while the store could not take writes or
//! while its SQLite file had been deleted, and enqueues into a deleted file answered 201 for
//! jobs that were gone at the next start. The disk fault ([`redrive_testkit::DiskFault`]) is
//! process-wide: every test of this file takes `ONE` first.

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use redrive_idempotency::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, LockToken, SqliteIdempotencyStore,
};
use redrive_service::{AppConfig, ReadyCheck};
use redrive_store::Store;
use support::*;

static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const JOB: &str = r#"{"queue": "q", "kind": "noop"}"#;

fn problem_type(r: &Reply) -> String {
    r.json()["type"].as_str().unwrap_or_default().to_owned()
}

/// The SQLite file deleted under a running service: not ready, and no enqueue acknowledged
/// (a job written to the unlinked file would be gone after a restart).
#[tokio::test]
async fn a_deleted_sqlite_file_fails_readyz_and_enqueues() {
    let _one = ONE.lock().await;
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    assert_eq!(send(&app, get("/readyz")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, post_json("/v1/jobs", JOB)).await.status,
        StatusCode::CREATED
    );
    let path = h.sqlite_path().unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let r = send(&app, get("/readyz")).await;
    r.assert_problem_status(503);
    assert!(
        problem_type(&r).ends_with("/store-file-changed"),
        "{}",
        r.body
    );
    assert!(r.json()["detail"].as_str().unwrap().contains("restart"));
    let r = send(&app, post_json("/v1/jobs", JOB)).await;
    r.assert_problem_status(503);
    // With an Idempotency-Key too (the layer releases the key on the 503).
    let r = send(
        &app,
        Request::post("/v1/jobs")
            .header("content-type", "application/json")
            .header("idempotency-key", "after-delete")
            .body(Body::from(JOB))
            .unwrap(),
    )
    .await;
    r.assert_problem_status(503);
}

/// A disk that takes no writes: reads still answer, but the service is not ready until the
/// disk takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_takes_no_writes_is_not_ready() {
    let _one = ONE.lock().await;
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    assert_eq!(send(&app, get("/readyz")).await.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let fault = redrive_testkit::DiskFault::engage();
    assert_eq!(send(&app, get("/v1/jobs")).await.status, StatusCode::OK);
    let r = send(&app, get("/readyz")).await;
    r.assert_problem_status(503);
    assert!(
        problem_type(&r).ends_with("/store-unavailable"),
        "{}",
        r.body
    );
    assert!(r.body.contains("cannot take writes"), "{}", r.body);
    fault.lift();
    // The failed probe is reused for up to a second.
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = send(&app, get("/readyz")).await;
        if r.status == StatusCode::OK {
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "never ready again: {}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A readiness check of the caller's (serve's worker pool) decides too.
#[tokio::test]
async fn a_stopped_worker_pool_is_not_ready() {
    let _one = ONE.lock().await;
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let r2 = running.clone();
    let h = sqlite(AppConfig {
        ready_checks: vec![ReadyCheck::new("workers-stopped", move || {
            if r2.load(std::sync::atomic::Ordering::SeqCst) {
                Ok(())
            } else {
                Err("the in-process worker pool is not running".into())
            }
        })],
        ..Default::default()
    })
    .await;
    let app = h.app();
    assert_eq!(send(&app, get("/readyz")).await.status, StatusCode::OK);
    running.store(false, std::sync::atomic::Ordering::SeqCst);
    let r = send(&app, get("/readyz")).await;
    r.assert_problem_status(503);
    assert!(problem_type(&r).ends_with("/workers-stopped"), "{}", r.body);
    assert!(r.body.contains("worker pool is not running"), "{}", r.body);
}

/// A key claimed by a request whose process vanished: listed as stuck, recovered by the
/// operator's route; other keys are refused naming the key.
#[tokio::test]
async fn stuck_keys_are_listed_and_recovered() {
    let _one = ONE.lock().await;
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let Store::Sqlite(s) = &h.store else {
        unreachable!()
    };
    let idem = SqliteIdempotencyStore::from_pool(s.pool().clone());
    // The claim of a request that then vanished (no heartbeat, no response).
    let claim = ClaimRequest {
        scope: "default".into(),
        key: "k/stuck:1".into(),
        method: "POST".into(),
        path: "/v1/jobs".into(),
        fingerprint: [7; 32],
        token: LockToken::new(),
        lease: Duration::from_millis(100),
        retention: Duration::from_secs(3600),
        take_over_abandoned: false,
    };
    assert!(matches!(
        idem.claim(&claim).await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
    // A completed key.
    let done = send(
        &app,
        Request::post("/v1/jobs")
            .header("content-type", "application/json")
            .header("idempotency-key", "k-done")
            .body(Body::from(JOB))
            .unwrap(),
    )
    .await;
    assert_eq!(done.status, StatusCode::CREATED, "{}", done.body);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let r = send(&app, get("/v1/idempotency?state=stuck")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let page = r.json();
    let records = page["records"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{}", r.body);
    assert_eq!(records[0]["key"], "k/stuck:1");
    assert_eq!(records[0]["stuck"], true);
    assert_eq!(records[0]["state"], "in_progress");
    assert!(records[0]["created_at"].is_string());
    let all = send(&app, get("/v1/idempotency")).await.json();
    assert_eq!(all["records"].as_array().unwrap().len(), 2);
    let first = send(&app, get("/v1/idempotency?limit=1")).await.json();
    assert_eq!(first["records"][0]["key"], "k/stuck:1");
    let next = first["next"].as_i64().unwrap();
    let second = send(&app, get(&format!("/v1/idempotency?limit=1&after={next}")))
        .await
        .json();
    assert_eq!(second["records"][0]["key"], "k-done");
    assert_eq!(second["records"][0]["response_status"], 201);

    send(&app, get("/v1/idempotency?state=nope"))
        .await
        .assert_problem(400, "state");
    send(&app, get("/v1/idempotency?limit=0"))
        .await
        .assert_problem(400, "limit");

    // The key travels percent-encoded in the path.
    let r = send(&app, post_empty("/v1/idempotency/k%2Fstuck%3A1/recover")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["stuck"], false);
    assert_eq!(r.json()["running"], false);
    let r = send(&app, get("/v1/idempotency?state=stuck")).await.json();
    assert!(r["records"].as_array().unwrap().is_empty());

    let r = send(&app, post_empty("/v1/idempotency/k-done/recover")).await;
    r.assert_problem(409, "key");
    assert!(r.body.contains("completed"), "{}", r.body);
    send(&app, post_empty("/v1/idempotency/no-such-key/recover"))
        .await
        .assert_problem(404, "key");
    send(&app, post_empty("/v1/idempotency/has%7Fdel/recover"))
        .await
        .assert_problem(400, "key");
}

/// With a token, the idempotency routes are behind it.
#[tokio::test]
async fn the_idempotency_routes_need_the_token() {
    let _one = ONE.lock().await;
    let h = sqlite(AppConfig {
        token: Some("s3cret-token".into()),
        ..Default::default()
    })
    .await;
    let app = h.app();
    assert_eq!(
        send(&app, get("/v1/idempotency")).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&app, post_empty("/v1/idempotency/k/recover"))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
}
