//! The layer's edge cases, written once for every backend and named after what each checks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use redrive_idempotency::{
    ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, ListFilter, ListRequest, LockToken,
    RecordId, RecordState, Recovery, RecoveryMode, Scope, StoredResponse, reap_expired,
};

use super::*;

const BODY: &str = r#"{"amount":1000,"currency":"EUR"}"#;

/// First request runs once, 2xx, row completed, no replay marker.
pub async fn a_first_request_runs_once_and_is_stored(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let a = send(&app, post_req(Some("k-t01"), BODY)).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert!(!a.replayed());
    assert_eq!(c.effects(), 1);
    let info = b.store().get("default", "k-t01").await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::Completed);
    assert_eq!(info.response_status, Some(201));
    assert_eq!(
        (info.method.as_str(), info.path.as_str()),
        ("POST", "/charges")
    );
    assert!(!info.held && !info.locked);
}

/// A repeat gets the byte-identical stored response, marked, without a second run.
pub async fn an_identical_repeat_gets_the_stored_response(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let first = send(&app, post_req(Some("k-t02"), BODY)).await;
    let second = send(&app, post_req(Some("k-t02"), BODY)).await;
    assert_eq!(c.effects(), 1);
    assert!(second.replayed());
    assert_eq!(second.status, first.status);
    assert_eq!(second.body, first.body);
    for h in ["content-type", "location", "etag"] {
        assert_eq!(second.headers.get(h), first.headers.get(h), "{h}");
    }
    let third = send(&app, post_req(Some("\"k-t02\""), BODY)).await;
    assert!(third.replayed());
    assert_eq!(c.started(), 1);
}

/// A 201 replays as 201 with the same Location.
pub async fn a_201_replays_with_its_location(b: &Backend) {
    let (app, _c) = app(builder(b.store()).build().unwrap());
    let first = send(&app, post_req(Some("k-t03"), BODY)).await;
    let second = send(&app, post_req(Some("k-t03"), BODY)).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert_eq!(second.headers.get("location").unwrap(), "/charges/1");
    assert_eq!(
        first.headers.get("location"),
        second.headers.get("location")
    );
}

/// Same key, different body: 422, nothing stored for it, handler not run.
pub async fn the_key_with_another_body_is_422(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    send(&app, post_req(Some("k-t04"), BODY)).await;
    let a = send(
        &app,
        post_req(Some("k-t04"), r#"{"amount":2000,"currency":"EUR"}"#),
    )
    .await;
    a.assert_problem(422, "key-reused");
    assert_eq!(c.started(), 1);
    // The stored response is still the first one.
    let again = send(&app, post_req(Some("k-t04"), BODY)).await;
    assert!(again.replayed());
    assert!(String::from_utf8_lossy(&again.body).contains("1000"));
}

/// Same key and body on another path or method: 422.
pub async fn the_key_on_another_path_or_method_is_422(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    send(&app, post_req(Some("k-t05"), BODY)).await;
    let path = send(
        &app,
        req("POST", "/refunds", Some("k-t05"), BODY)
            .body(Body::from(BODY))
            .unwrap(),
    )
    .await;
    path.assert_problem(422, "key-reused");
    let method = send(
        &app,
        req("PATCH", "/charges", Some("k-t05"), BODY)
            .body(Body::from(BODY))
            .unwrap(),
    )
    .await;
    method.assert_problem(422, "key-reused");
    let query = send(
        &app,
        req("POST", "/charges?x=1", Some("k-t05"), BODY)
            .body(Body::from(BODY))
            .unwrap(),
    )
    .await;
    query.assert_problem(422, "key-reused");
    assert_eq!(c.started(), 1);
}

/// 50 parallel first requests with one key: exactly one execution, never a 5xx.
pub async fn fifty_parallel_first_requests_run_once(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let r = req("POST", "/charges", Some("k-t06"), BODY)
                .header("x-test-delay-ms", "100")
                .body(Body::from(BODY))
                .unwrap();
            send(&app, r).await
        }));
    }
    let mut fresh = 0;
    for t in tasks {
        let a = t.await.unwrap();
        assert!(
            !a.status.is_server_error(),
            "5xx: {:?} {:?}",
            a.status,
            a.body
        );
        match a.status {
            StatusCode::CREATED if a.replayed() => {}
            StatusCode::CREATED => fresh += 1,
            StatusCode::CONFLICT => {
                a.assert_problem(409, "request-in-progress");
                assert_eq!(a.headers.get("retry-after").unwrap(), "1");
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(fresh, 1);
    assert_eq!(c.started(), 1);
    assert_eq!(c.effects(), 1);
}

/// A repeat while the first runs: 409 request-in-progress, then the replay.
pub async fn a_repeat_in_flight_is_409_then_replayed(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let app2 = app.clone();
    let first = tokio::spawn(async move {
        send(
            &app2,
            req("POST", "/charges", Some("k-t07"), BODY)
                .header("x-test-gate", "1")
                .body(Body::from(BODY))
                .unwrap(),
        )
        .await
    });
    while c.started() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let during = send(&app, post_req(Some("k-t07"), BODY)).await;
    during.assert_problem(409, "request-in-progress");
    assert_eq!(during.headers.get("retry-after").unwrap(), "1");
    c.gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let after = send(&app, post_req(Some("k-t07"), BODY)).await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(c.started(), 1);
}

/// Missing key on a required route: 400 key-missing with a describedby link; on an
/// optional route the request passes through; GET is never touched.
pub async fn a_missing_key_on_a_required_route_is_400(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let a = send(&app, post_req(None, BODY)).await;
    a.assert_problem(400, "key-missing");
    assert_eq!(
        a.headers.get("link").unwrap(),
        "<https://docs.example/idempotency>; rel=\"describedby\""
    );
    assert_eq!(c.started(), 0);
    let get = send(
        &app,
        req("GET", "/charges", None, "")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(get.status, StatusCode::CREATED);
    let (optional, c2) = app_with(builder(b.store()).with_required(false).build().unwrap());
    let passed = send(&optional, post_req(None, BODY)).await;
    assert_eq!(passed.status, StatusCode::CREATED);
    assert!(!passed.replayed());
    assert_eq!(c2.started(), 1);
}

fn app_with(layer: redrive_idempotency::IdempotencyLayer) -> (axum::Router, Arc<Counters>) {
    app(layer)
}

/// 256 bytes, empty, control char, space, escape, unterminated quote, two fields: 400.
pub async fn malformed_keys_are_400(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let long = "a".repeat(256);
    for bad in [
        long.as_str(),
        "",
        "\"\"",
        "a\tb",
        "a b",
        "\"a\\\"b\"",
        "\"abc",
    ] {
        let a = send(&app, post_req(Some(bad), BODY)).await;
        a.assert_problem(400, "key-invalid");
        assert!(
            !String::from_utf8_lossy(&a.body).contains(&long),
            "the key is not echoed"
        );
    }
    let two = req("POST", "/charges", Some("k1"), BODY)
        .header("idempotency-key", "k2")
        .body(Body::from(BODY))
        .unwrap();
    let a = send(&app, two).await;
    a.assert_problem(400, "key-invalid");
    assert!(a.json()["detail"].as_str().unwrap().contains("2 times"));
    let ok = send(&app, post_req(Some(&"a".repeat(255)), BODY)).await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(c.started(), 1);
    let (uuid_app, _) = app_with(builder(b.store()).with_uuid_keys().build().unwrap());
    send(&uuid_app, post_req(Some("not-a-uuid"), BODY))
        .await
        .assert_problem(400, "key-invalid");
    let u = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        send(&uuid_app, post_req(Some(&u), BODY)).await.status,
        StatusCode::CREATED
    );
}

/// `"abc"` and `abc` are the same key.
pub async fn quoted_and_bare_keys_are_one_key(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let first = send(&app, post_req(Some("\"k-t10\""), BODY)).await;
    let second = send(&app, post_req(Some("k-t10"), BODY)).await;
    assert!(!first.replayed());
    assert!(second.replayed());
    assert_eq!(c.started(), 1);
}

/// Two principals, one key: independent runs, no cross replay, no 409 across them;
/// a request without a principal is refused.
pub async fn scopes_do_not_share_keys(b: &Backend) {
    let layer = builder(b.store())
        .with_scope(Scope::Header("x-tenant".try_into().unwrap()))
        .build()
        .unwrap();
    let (app, c) = app(layer);
    let as_tenant = |t: &str, gate: bool| {
        let mut r = req("POST", "/charges", Some("k-t11"), BODY).header("x-tenant", t);
        if gate {
            r = r.header("x-test-gate", "1");
        }
        r.body(Body::from(BODY)).unwrap()
    };
    let app2 = app.clone();
    let a_run = tokio::spawn(async move { send(&app2, as_tenant("acme", true)).await });
    while c.started() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let other = send(&app, as_tenant("globex", false)).await;
    assert_eq!(
        other.status,
        StatusCode::CREATED,
        "no 409 across principals"
    );
    assert!(!other.replayed());
    c.gate.add_permits(1);
    let first = a_run.await.unwrap();
    assert!(!first.replayed());
    assert_ne!(first.body, other.body);
    assert_eq!(c.effects(), 2);
    assert!(send(&app, as_tenant("acme", false)).await.replayed());
    assert!(b.store().get("acme", "k-t11").await.unwrap().is_some());
    assert!(b.store().get("globex", "k-t11").await.unwrap().is_some());
    let anonymous = send(&app, post_req(Some("k-t11"), BODY)).await;
    anonymous.assert_problem(400, "scope-missing");
    assert!(
        anonymous.json()["detail"]
            .as_str()
            .unwrap()
            .contains("x-tenant")
    );
}

/// A 500 releases the key; the retry runs again, sees the recovery point, and the
/// first 500 is not replayed.
pub async fn a_5xx_releases_the_key(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let fail = req("POST", "/charges", Some("k-t12"), BODY)
        .header("x-test-status", "500")
        .header("x-test-advance", "1")
        .body(Body::from(BODY))
        .unwrap();
    let a = send(&app, fail).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    let info = b.store().get("default", "k-t12").await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::InProgress);
    assert!(!info.held, "released");
    assert_eq!(info.recovery_point, "charged");
    let retry = send(&app, post_req(Some("k-t12"), BODY)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(c.started(), 2);
    let seen = c.seen.lock().unwrap().clone();
    assert_eq!(seen[1].recovery_point, "charged");
    assert_eq!(seen[1].attempts, 2);
    assert!(seen[1].resumed);
    assert!(send(&app, post_req(Some("k-t12"), BODY)).await.replayed());
}

/// A panic releases the key (500 problem, no row left locked); the retry runs.
pub async fn a_panic_releases_the_key(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let boom = req("POST", "/charges", Some("k-t13"), BODY)
        .header("x-test-panic", "1")
        .body(Body::from(BODY))
        .unwrap();
    send(&app, boom).await.assert_problem(500, "handler-failed");
    let info = b.store().get("default", "k-t13").await.unwrap().unwrap();
    assert!(!info.held && !info.locked);
    let retry = send(&app, post_req(Some("k-t13"), BODY)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(c.started(), 2);
    assert_eq!(c.effects(), 1);
}

/// Runs one request in a runtime of its own and kills that runtime right after the handler's
/// side effect, before any response or finalise: a `kill -9` of the serving process.
async fn crash_after_effect(
    store: Arc<dyn IdempotencyStore>,
    key: &'static str,
    resumable: bool,
) -> Arc<Counters> {
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (app, inner) = {
            let _guard = rt.enter();
            app(short(store)
                .with_recovery(RecoveryMode::Resume)
                .build()
                .unwrap())
        };
        let app2 = app.clone();
        rt.spawn(async move {
            let mut r = req("POST", "/charges", Some(key), BODY).header("x-test-hang", "1");
            if resumable {
                r = r.header("x-test-resumable", "1");
            }
            let _ = send(&app2, r.body(Body::from(BODY)).unwrap()).await;
        });
        let start = std::time::Instant::now();
        while inner.effects() == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the effect never happened"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        if resumable {
            // Give the fenced `advance("charged")` after the effect time to land.
            std::thread::sleep(Duration::from_millis(200));
        }
        rt.shutdown_background();
        c.effects.store(inner.effects(), Ordering::SeqCst);
    })
    .await
    .unwrap();
    counters
}

/// Explicit recovery, the default: killed after the effect, before finalise. A repeat
/// during the lease gets 409 in-progress, after the lease 409 recovery-required — never a
/// second run. An operator then completes the record and the repeat gets that response.
pub async fn a_crash_after_the_effect_needs_explicit_recovery(b: &Backend) {
    let crashed = crash_after_effect(b.reopen().await, "k-t14", false).await;
    assert_eq!(crashed.effects(), 1);
    let (app, c) = app(short(b.store()).build().unwrap());
    send(&app, post_req(Some("k-t14"), BODY))
        .await
        .assert_problem(409, "request-in-progress");
    b.wait(SHORT_LEASE + Duration::from_millis(200)).await;
    send(&app, post_req(Some("k-t14"), BODY))
        .await
        .assert_problem(409, "recovery-required");
    assert_eq!(c.started(), 0, "no second effect after a crash");
    let info = b.store().get("default", "k-t14").await.unwrap().unwrap();
    assert!(info.is_abandoned());
    let reconciled = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: br#"{"charge":"reconciled"}"#.to_vec(),
        replay_unavailable: false,
    };
    assert!(
        b.store()
            .recover("default", "k-t14", &Recovery::Complete(reconciled))
            .await
            .unwrap()
    );
    let after = send(&app, post_req(Some("k-t14"), BODY)).await;
    assert!(after.replayed());
    assert_eq!(&after.body[..], br#"{"charge":"reconciled"}"#);
    assert_eq!(c.started(), 0);
}

/// Resume mode: after the lease the retry takes over, sees the recovery point the
/// crashed run stored after its effect, and does not charge again.
pub async fn resume_mode_takes_over_without_a_second_effect(b: &Backend) {
    let crashed = crash_after_effect(b.reopen().await, "k-t14r", true).await;
    assert_eq!(crashed.effects(), 1);
    let (app, c) = app(short(b.store())
        .with_recovery(RecoveryMode::Resume)
        .build()
        .unwrap());
    b.wait(SHORT_LEASE + Duration::from_millis(200)).await;
    let r = req("POST", "/charges", Some("k-t14r"), BODY)
        .header("x-test-resumable", "1")
        .body(Body::from(BODY))
        .unwrap();
    let a = send(&app, r).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(c.started(), 1);
    assert_eq!(c.effects(), 0, "the resumed run skipped the charge");
    let seen = c.seen.lock().unwrap().clone();
    assert_eq!(
        seen[0],
        Seen {
            recovery_point: "charged".into(),
            attempts: 2,
            resumed: true
        }
    );
}

/// A finalise that fails (store error right after the effect) leaves the record held; once
/// its lease ends, a repeat is refused for recovery rather than charged again.
pub async fn a_failed_finalise_makes_no_second_effect(b: &Backend) {
    let faulty = Arc::new(Faulty::new(b.store()));
    faulty.fail_finalise.store(true, Ordering::SeqCst);
    let (app, c) = app(short(faulty.clone()).build().unwrap());
    let first = send(&app, post_req(Some("k-t14f"), BODY)).await;
    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "the client still gets the real outcome"
    );
    faulty.fail_finalise.store(false, Ordering::SeqCst);
    b.wait(SHORT_LEASE + Duration::from_millis(200)).await;
    send(&app, post_req(Some("k-t14f"), BODY))
        .await
        .assert_problem(409, "recovery-required");
    assert_eq!(c.effects(), 1);
    // Explicit release: the operator decides the charge did not happen; now it runs again.
    assert!(
        b.store()
            .recover("default", "k-t14f", &Recovery::Release)
            .await
            .unwrap()
    );
    assert_eq!(
        send(&app, post_req(Some("k-t14f"), BODY)).await.status,
        StatusCode::CREATED
    );
    assert_eq!(c.effects(), 2);
}

/// During the live lease of a crashed holder: 409 in-progress; recovery is refused
/// while the lease is live; after it, takeover (resume mode).
pub async fn a_live_lease_blocks_until_it_ends_then_is_taken_over(b: &Backend) {
    let store = b.store();
    let claim = claim_req("k-t15", [7; 32], SHORT_LEASE, true);
    assert!(matches!(
        store.claim(&claim).await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
    let again = ClaimRequest {
        token: LockToken::new(),
        ..claim.clone()
    };
    assert_eq!(store.claim(&again).await.unwrap(), ClaimOutcome::InProgress);
    assert!(
        !store
            .recover("default", "k-t15", &Recovery::Release)
            .await
            .unwrap(),
        "live lease"
    );
    b.wait(SHORT_LEASE + Duration::from_millis(200)).await;
    let explicit = ClaimRequest {
        take_over_abandoned: false,
        ..again.clone()
    };
    assert_eq!(
        store.claim(&explicit).await.unwrap(),
        ClaimOutcome::Abandoned
    );
    match store.claim(&again).await.unwrap() {
        ClaimOutcome::Acquired(a) => {
            assert!(a.resumed);
            assert_eq!(a.attempts, 2);
        }
        other => panic!("expected a takeover, got {other:?}"),
    }
}

fn claim_req(key: &str, fp: [u8; 32], lease: Duration, take_over: bool) -> ClaimRequest {
    ClaimRequest {
        scope: "default".into(),
        key: key.into(),
        method: "POST".into(),
        path: "/charges".into(),
        fingerprint: fp,
        token: LockToken::new(),
        lease,
        retention: SHORT_RETENTION.max(lease * 2),
        take_over_abandoned: take_over,
    }
}

fn stored(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![],
        body: body.as_bytes().to_vec(),
        replay_unavailable: false,
    }
}

/// A stale holder's finalise, heartbeat, advance and release after a takeover affect
/// nothing; the newer result wins.
pub async fn a_stale_holder_is_fenced(b: &Backend) {
    let store = b.store();
    // A long retention: only the lease may run out here, however slow the machine.
    let old = ClaimRequest {
        retention: Duration::from_secs(60),
        ..claim_req("k-t16", [1; 32], SHORT_LEASE, true)
    };
    let ClaimOutcome::Acquired(a) = store.claim(&old).await.unwrap() else {
        panic!("claim")
    };
    b.wait(SHORT_LEASE + Duration::from_millis(200)).await;
    let new = ClaimRequest {
        token: LockToken::new(),
        ..old.clone()
    };
    let ClaimOutcome::Acquired(a2) = store.claim(&new).await.unwrap() else {
        panic!("takeover")
    };
    assert_eq!(a.id, a2.id);
    assert!(!store.heartbeat(a.id, old.token, SHORT_LEASE).await.unwrap());
    assert!(!store.advance(a.id, old.token, "stale").await.unwrap());
    assert!(
        !store
            .finalise(a.id, old.token, &stored(201, "old"))
            .await
            .unwrap()
    );
    assert!(!store.release(a.id, old.token).await.unwrap());
    assert!(
        store
            .finalise(a.id, new.token, &stored(201, "new"))
            .await
            .unwrap()
    );
    match store
        .claim(&ClaimRequest {
            token: LockToken::new(),
            ..old
        })
        .await
        .unwrap()
    {
        ClaimOutcome::Completed(s) => assert_eq!(s.body, b"new"),
        other => panic!("{other:?}"),
    }
}

/// A handler longer than the lease keeps it by heartbeat: no takeover meanwhile,
/// even in resume mode.
pub async fn a_long_handler_keeps_its_lease_by_heartbeat(b: &Backend) {
    let layer = short(b.store())
        .with_retention(Duration::from_secs(30))
        .with_recovery(RecoveryMode::Resume);
    let (app, c) = app(layer.build().unwrap());
    let app2 = app.clone();
    let long = tokio::spawn(async move {
        send(
            &app2,
            req("POST", "/charges", Some("k-t17"), BODY)
                .header("x-test-delay-ms", "4000")
                .body(Body::from(BODY))
                .unwrap(),
        )
        .await
    });
    // 1.2 s in all (twice the lease; the handler takes 4 s so that a loaded machine still
    // asks while it runs), in steps shorter than the lease; the memory store's
    // clock moves with real time here so that its heartbeats are exercised too.
    for _ in 0..4 {
        b.wait_real(Duration::from_millis(300)).await;
        let during = send(&app, post_req(Some("k-t17"), BODY)).await;
        during.assert_problem(409, "request-in-progress");
    }
    let done = long.await.unwrap();
    assert_eq!(done.status, StatusCode::CREATED);
    assert!(send(&app, post_req(Some("k-t17"), BODY)).await.replayed());
    assert_eq!(c.started(), 1);
}

/// A lost heartbeat stops the handler before its next side effect.
pub async fn a_lost_heartbeat_stops_the_handler(b: &Backend) {
    let faulty = Arc::new(Faulty::new(b.store()));
    let (app, c) = app(short(faulty.clone()).build().unwrap());
    faulty.heartbeat_refused.store(true, Ordering::SeqCst);
    let r = req("POST", "/charges", Some("k-t17l"), BODY)
        .header("x-test-then-delay-ms", "1500")
        .body(Body::from(BODY))
        .unwrap();
    let a = send(&app, r).await;
    a.assert_problem(503, "lease-lost");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(c.effects(), 1, "the second effect never happened");
}

/// A 4xx the handler decided (402 decline) is stored and replayed.
pub async fn a_handler_4xx_is_stored_and_replayed(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let decline = || {
        req("POST", "/charges", Some("k-t18"), BODY)
            .header("x-test-status", "402")
            .body(Body::from(BODY))
            .unwrap()
    };
    assert_eq!(
        send(&app, decline()).await.status,
        StatusCode::PAYMENT_REQUIRED
    );
    let again = send(&app, post_req(Some("k-t18"), BODY)).await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed());
    assert_eq!(c.started(), 1);
}

async fn auth(request: Request<Body>, next: Next) -> Response {
    if request.headers().get("authorization").is_none() {
        return (StatusCode::UNAUTHORIZED, "no credentials").into_response();
    }
    next.run(request).await
}

/// A 401 from the auth layer outside never reaches the store; the authenticated retry
/// runs normally.
pub async fn an_outer_401_never_reaches_the_store(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let app = app.layer(middleware::from_fn(auth));
    assert_eq!(
        send(&app, post_req(Some("k-t19"), BODY)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert!(b.store().get("default", "k-t19").await.unwrap().is_none());
    let mut r = post_req(Some("k-t19"), BODY);
    r.headers_mut()
        .insert("authorization", HeaderValue::from_static("Bearer t"));
    let a = send(&app, r).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert!(!a.replayed());
    assert_eq!(c.started(), 1);
}

/// After the retention the key runs as new.
pub async fn an_expired_key_runs_again(b: &Backend) {
    let (app, c) = app(short(b.store()).build().unwrap());
    send(&app, post_req(Some("k-t20"), BODY)).await;
    assert!(send(&app, post_req(Some("k-t20"), BODY)).await.replayed());
    b.wait(SHORT_RETENTION + Duration::from_millis(200)).await;
    let again = send(&app, post_req(Some("k-t20"), BODY)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed());
    assert_eq!(c.started(), 2);
    // And even with another body: the old record is gone, not a mismatch.
    b.wait(SHORT_RETENTION + Duration::from_millis(200)).await;
    assert_eq!(
        send(&app, post_req(Some("k-t20"), r#"{"amount":1}"#))
            .await
            .status,
        StatusCode::CREATED
    );
}

/// The reaper deletes expired completed rows in batches, never in-progress ones, and
/// reports them.
pub async fn the_reaper_deletes_expired_completed_records(b: &Backend) {
    let (app, _c) = app(short(b.store()).build().unwrap());
    for k in ["r1", "r2", "r3"] {
        send(&app, post_req(Some(k), BODY)).await;
    }
    let store = b.store();
    let stuck = claim_req("r-stuck", [9; 32], SHORT_LEASE, false);
    assert!(matches!(
        store.claim(&stuck).await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
    let early = reap_expired(store.as_ref(), 2).await.unwrap();
    assert_eq!(early.deleted, 0);
    b.wait(SHORT_RETENTION * 2 + Duration::from_millis(200))
        .await;
    let report = reap_expired(store.as_ref(), 2).await.unwrap();
    assert_eq!(report.deleted, 3);
    assert_eq!(report.expired_in_progress, 1);
    assert_eq!(report.abandoned, 1);
    for k in ["r1", "r2", "r3"] {
        assert!(store.get("default", k).await.unwrap().is_none());
    }
    assert!(store.get("default", "r-stuck").await.unwrap().is_some());
}

/// The store is down: 503 store-unavailable with Retry-After, handler not run.
pub async fn an_unavailable_store_fails_closed(b: &Backend) {
    let (app, c) = app(builder(b.broken_store().await).build().unwrap());
    let a = send(&app, post_req(Some("k-t23"), BODY)).await;
    a.assert_problem(503, "store-unavailable");
    assert_eq!(a.headers.get("retry-after").unwrap(), "5");
    assert_eq!(c.started(), 0);
}

/// A body over the cap: 413, nothing stored, handler not run (declared and streamed).
pub async fn a_request_over_the_cap_is_413(b: &Backend) {
    let (app, c) = app(builder(b.store())
        .with_max_request_bytes(16)
        .build()
        .unwrap());
    send(&app, post_req(Some("k-t24"), BODY))
        .await
        .assert_problem(413, "request-too-large");
    let chunks = futures::stream::iter(
        (0..3).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from_static(&[b'a'; 10]))),
    );
    let streamed = req("POST", "/charges", Some("k-t24"), "")
        .body(Body::from_stream(chunks))
        .unwrap();
    send(&app, streamed)
        .await
        .assert_problem(413, "request-too-large");
    assert!(b.store().get("default", "k-t24").await.unwrap().is_none());
    assert_eq!(c.started(), 0);
}

/// A response over `max_response_bytes` is delivered once; the replay is 409
/// replay-unavailable with a link to the created resource.
pub async fn a_response_over_the_cap_is_not_replayed(b: &Backend) {
    let (app, c) = app(builder(b.store())
        .with_max_response_bytes(100)
        .build()
        .unwrap());
    let big = || {
        req("POST", "/charges", Some("k-t25"), BODY)
            .header("x-test-big", "1000")
            .body(Body::from(BODY))
            .unwrap()
    };
    let first = send(&app, big()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body.len(), 1000);
    let again = send(&app, big()).await;
    again.assert_problem(409, "replay-unavailable");
    assert_eq!(
        again.headers.get("link").unwrap(),
        "</charges/1>; rel=\"related\""
    );
    assert_eq!(c.started(), 1);
}

/// The client disconnects mid-handler; the run completes detached and finalises.
pub async fn a_client_disconnect_still_finalises(b: &Backend) {
    let (app, c) = app(builder(b.store()).build().unwrap());
    let app2 = app.clone();
    let client = tokio::spawn(async move {
        send(
            &app2,
            req("POST", "/charges", Some("k-t26"), BODY)
                .header("x-test-gate", "1")
                .body(Body::from(BODY))
                .unwrap(),
        )
        .await
    });
    while c.started() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    c.gate.add_permits(1);
    until_completed(b.store().as_ref(), "default", "k-t26").await;
    let again = send(&app, post_req(Some("k-t26"), BODY)).await;
    assert!(again.replayed());
    assert_eq!(c.effects(), 1);
}

/// Only allowlisted headers are replayed.
pub async fn only_allowlisted_headers_are_replayed(b: &Backend) {
    let layer = builder(b.store())
        .with_replayed_header("x-payment-id".try_into().unwrap())
        .build()
        .unwrap();
    let (app, _c) = app(layer);
    let first = send(&app, post_req(Some("k-t27"), BODY)).await;
    assert!(
        first.headers.contains_key("set-cookie"),
        "the first response is untouched"
    );
    let again = send(&app, post_req(Some("k-t27"), BODY)).await;
    for h in ["content-type", "location", "etag", "x-payment-id"] {
        assert_eq!(again.headers.get(h), first.headers.get(h), "{h} replayed");
    }
    for h in ["set-cookie", "date", "x-internal"] {
        assert!(!again.headers.contains_key(h), "{h} not replayed");
    }
}

/// Canonical-JSON routes ignore key order; raw routes do not.
pub async fn canonical_json_routes_ignore_key_order(b: &Backend) {
    let reordered = r#"{ "currency": "EUR", "amount": 1000 }"#;
    let (canon, c) = app(builder(b.store())
        .with_fingerprint(Fingerprint::CanonicalJson)
        .build()
        .unwrap());
    send(&canon, post_req(Some("k-t28c"), BODY)).await;
    assert!(
        send(&canon, post_req(Some("k-t28c"), reordered))
            .await
            .replayed()
    );
    assert_eq!(c.started(), 1);
    let (raw, _) = app(builder(b.store()).build().unwrap());
    send(&raw, post_req(Some("k-t28r"), BODY)).await;
    send(&raw, post_req(Some("k-t28r"), reordered))
        .await
        .assert_problem(422, "key-reused");
}

/// The schema call is idempotent (and SQLite's version is checked in it).
pub async fn ensure_schema_is_idempotent(b: &Backend) {
    b.store().ensure_schema().await.unwrap();
    b.store().ensure_schema().await.unwrap();
    let (app, _c) = app(builder(b.store()).build().unwrap());
    assert_eq!(
        send(&app, post_req(Some("k-t29"), BODY)).await.status,
        StatusCode::CREATED
    );
}

/// `store_5xx`: Stripe-v1 parity stores and replays a 500.
pub async fn a_5xx_is_stored_when_opted_in(b: &Backend) {
    let (app, c) = app(builder(b.store()).with_store_5xx(true).build().unwrap());
    let fail = || {
        req("POST", "/charges", Some("k-5xx"), BODY)
            .header("x-test-status", "500")
            .body(Body::from(BODY))
            .unwrap()
    };
    assert_eq!(
        send(&app, fail()).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let again = send(&app, fail()).await;
    assert_eq!(again.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(again.replayed());
    assert_eq!(c.started(), 1);
}

/// The operator's listing: by id, filtered (a stuck record is one whose holder vanished),
/// by scope, in pages; a recovered record is no longer stuck.
pub async fn the_listing_filters_pages_and_sees_recovery(b: &Backend) {
    let (app, _c) = app(builder(b.store()).build().unwrap());
    let done = send(&app, post_req(Some("k-t30-done"), BODY)).await;
    assert_eq!(done.status, StatusCode::CREATED);
    let crashed = crash_after_effect(b.reopen().await, "k-t30-stuck", false).await;
    assert_eq!(crashed.effects(), 1);
    let store = b.store();
    let keys = |v: Vec<redrive_idempotency::ListedRecord>| -> Vec<String> {
        v.into_iter().map(|l| l.key).collect()
    };
    let list = |filter: ListFilter| ListRequest {
        filter,
        limit: 100,
        ..Default::default()
    };
    // While the crashed run's lease is live it is in progress, not stuck.
    assert_eq!(
        keys(store.list(&list(ListFilter::InProgress)).await.unwrap()),
        ["k-t30-stuck"]
    );
    assert!(
        store
            .list(&list(ListFilter::Stuck))
            .await
            .unwrap()
            .is_empty()
    );
    b.wait(SHORT_LEASE + Duration::from_millis(200)).await;
    let stuck = store.list(&list(ListFilter::Stuck)).await.unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].key, "k-t30-stuck");
    assert_eq!(stuck[0].scope, "default");
    assert!(stuck[0].info.is_abandoned());
    assert_eq!(stuck[0].info.path, "/charges");
    assert!(stuck[0].created_at <= stuck[0].last_run_at);
    let age = std::time::SystemTime::now()
        .duration_since(stuck[0].created_at)
        .unwrap_or_default();
    assert!(age < Duration::from_secs(3600), "created just now: {age:?}");
    assert_eq!(
        keys(store.list(&list(ListFilter::Completed)).await.unwrap()),
        ["k-t30-done"]
    );
    // Every record, in id order, one page at a time.
    let all = store.list(&list(ListFilter::All)).await.unwrap();
    assert_eq!(keys(all.clone()), ["k-t30-done", "k-t30-stuck"]);
    let first = store
        .list(&ListRequest {
            limit: 1,
            ..list(ListFilter::All)
        })
        .await
        .unwrap();
    assert_eq!(keys(first.clone()), ["k-t30-done"]);
    let second = store
        .list(&ListRequest {
            limit: 1,
            after: Some(first[0].info.id),
            ..list(ListFilter::All)
        })
        .await
        .unwrap();
    assert_eq!(keys(second.clone()), ["k-t30-stuck"]);
    let third = store
        .list(&ListRequest {
            after: Some(second[0].info.id),
            ..list(ListFilter::All)
        })
        .await
        .unwrap();
    assert!(third.is_empty());
    let other_scope = store
        .list(&ListRequest {
            scope: Some("someone-else".into()),
            ..list(ListFilter::All)
        })
        .await
        .unwrap();
    assert!(other_scope.is_empty());
    let after_all = store
        .list(&ListRequest {
            after: Some(RecordId(i64::MAX)),
            ..list(ListFilter::All)
        })
        .await
        .unwrap();
    assert!(after_all.is_empty());
    // Recovered: no longer stuck.
    assert!(
        store
            .recover("default", "k-t30-stuck", &Recovery::Release)
            .await
            .unwrap()
    );
    assert!(
        store
            .list(&list(ListFilter::Stuck))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        keys(store.list(&list(ListFilter::InProgress)).await.unwrap()),
        ["k-t30-stuck"],
        "released, still without a response"
    );
}

/// The operator's release of a stuck key: refused for a missing, completed or running key;
/// a stuck one is released and its next request runs again.
pub async fn release_stuck_lets_the_next_request_run(b: &Backend) {
    use redrive_idempotency::{ReleaseOutcome, release_stuck};
    let store = b.store();
    assert_eq!(
        release_stuck(&*store, "default", "k-t31-none")
            .await
            .unwrap(),
        ReleaseOutcome::NotFound
    );
    let (app, c) = app(short(b.store()).build().unwrap());
    send(&app, post_req(Some("k-t31-done"), BODY)).await;
    assert_eq!(
        release_stuck(&*store, "default", "k-t31-done")
            .await
            .unwrap(),
        ReleaseOutcome::Completed
    );
    let crashed = crash_after_effect(b.reopen().await, "k-t31-stuck", false).await;
    assert_eq!(crashed.effects(), 1);
    assert_eq!(
        release_stuck(&*store, "default", "k-t31-stuck")
            .await
            .unwrap(),
        ReleaseOutcome::Running,
        "its lease is still live"
    );
    b.wait(SHORT_LEASE + Duration::from_millis(200)).await;
    send(&app, post_req(Some("k-t31-stuck"), BODY))
        .await
        .assert_problem(409, "recovery-required");
    match release_stuck(&*store, "default", "k-t31-stuck")
        .await
        .unwrap()
    {
        ReleaseOutcome::Released(info) => {
            assert!(!info.held && !info.locked);
            assert_eq!(info.state, RecordState::InProgress);
        }
        other => panic!("expected a release, got {other:?}"),
    }
    let started = c.started();
    let again = send(&app, post_req(Some("k-t31-stuck"), BODY)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(c.started(), started + 1, "the released key runs again");
}
