//! The `/v1` API, with `oneshot` and over a real socket: auth, problem+json errors naming the
//! field, idempotent enqueue, keyset pagination, replay and cancel, OpenAPI, health, metrics.

mod support;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use redrive_service::{AppConfig, AppState, ServiceConfig, ServiceError, serve_listener};
use redrive_store::{BreakerUpdate, NewJob};
use serde_json::{Value, json};
use support::*;

const TOKEN: &str = "s3cret-token";

fn with_token() -> AppConfig {
    AppConfig {
        token: Some(TOKEN.into()),
        ..Default::default()
    }
}

fn authed(mut req: Request<Body>, token: &str) -> Request<Body> {
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

#[tokio::test]
async fn bearer_token_is_required_on_every_v1_route() {
    let h = sqlite(with_token()).await;
    let app = h.app();
    for (method, uri) in [
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/1"),
        ("POST", "/v1/jobs/1/replay"),
        ("POST", "/v1/jobs/1/cancel"),
        ("GET", "/v1/stats"),
        ("GET", "/v1/breakers"),
        ("GET", "/v1/workers"),
    ] {
        let req = || {
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap()
        };
        let none = send(&app, req()).await;
        assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{method} {uri}");
        assert_eq!(
            none.header("www-authenticate"),
            Some("Bearer realm=\"redrive\"")
        );
        assert_eq!(
            none.header("content-type"),
            Some("application/problem+json")
        );
        let wrong = send(&app, authed(req(), "s3cret-tokeN")).await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{method} {uri}");
        let basic = {
            let mut r = req();
            r.headers_mut()
                .insert("authorization", "Basic czNjcmV0LXRva2Vu".parse().unwrap());
            send(&app, r).await
        };
        assert_eq!(basic.status, StatusCode::UNAUTHORIZED, "{method} {uri}");
    }
    let ok = send(&app, authed(get("/v1/jobs"), TOKEN)).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    let ok = send(&app, authed(get("/v1/stats"), TOKEN)).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    // Health and the document stay open.
    assert_eq!(send(&app, get("/healthz")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, get("/openapi.json")).await.status,
        StatusCode::OK
    );
    h.cleanup().await;
}

#[tokio::test]
async fn over_a_real_socket_auth_and_enqueue() {
    let h = sqlite(with_token()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_listener(listener, h.state.clone(), async {
        let _ = stopped.await;
    }));
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();

    let r = client.get(format!("{base}/v1/jobs")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["www-authenticate"].to_str().unwrap(),
        "Bearer realm=\"redrive\""
    );
    let r = client
        .get(format!("{base}/v1/jobs"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "sock-1")
        .json(&json!({"queue": "s", "kind": "noop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let first: Value = r.json().await.unwrap();
    let r = client
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "sock-1")
        .json(&json!({"queue": "s", "kind": "noop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    let again: Value = r.json().await.unwrap();
    assert_eq!(again["job"]["id"], first["job"]["id"]);
    let r = client
        .get(format!("{base}/v1/jobs"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let page: Value = r.json().await.unwrap();
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    h.cleanup().await;
}

#[tokio::test]
async fn serve_refuses_a_public_address_without_a_token() {
    let h = sqlite(AppConfig::default()).await;
    let err = redrive_service::serve(
        ServiceConfig {
            addr: "0.0.0.0:0".parse().unwrap(),
            store: h.store.clone(),
            app: AppConfig::default(),
        },
        async {},
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ServiceError::TokenRequired { .. }), "{err}");
    assert!(err.to_string().contains("0.0.0.0:0"), "{err}");
    let bad = AppState::new(
        h.store.clone(),
        AppConfig {
            token: Some("has space".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(bad, ServiceError::InvalidToken { .. }), "{bad}");
    h.cleanup().await;
}

#[tokio::test]
async fn bad_bodies_are_problems_naming_the_field() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let cases: &[(&str, u16, &str)] = &[
        ("{not json", 400, "body"),
        ("[1, 2]", 400, "body"),
        (r#"{"kind": "noop"}"#, 400, "queue"),
        (r#"{"queue": "q"}"#, 400, "kind"),
        (r#"{"queue": 7, "kind": "noop"}"#, 400, "queue"),
        (
            r#"{"queue": "q", "kind": "noop", "priority": "high"}"#,
            400,
            "priority",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "colour": "red"}"#,
            400,
            "colour",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "delay": "soon"}"#,
            400,
            "delay",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "delay": "-5s"}"#,
            400,
            "delay",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "delay": "400d"}"#,
            422,
            "delay",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "delay": "5s", "run_at": "2030-01-01T00:00:00Z"}"#,
            400,
            "delay",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "run_at": "tomorrow"}"#,
            400,
            "run_at",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "max_attempts": 0}"#,
            422,
            "max_attempts",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "max_attempts": -1}"#,
            400,
            "max_attempts",
        ),
        // Above the policy's budget (payment: 10 attempts + 5 defers) it would be stored and
        // never reached: refused, not kept silently.
        (
            r#"{"queue": "q", "kind": "noop", "max_attempts": 16}"#,
            422,
            "max_attempts",
        ),
        // Fields a worker would not honour are not accepted (and so never stored).
        (r#"{"queue": "q", "kind": "noop", "ttl": "5m"}"#, 400, "ttl"),
        (
            r#"{"queue": "q", "kind": "noop", "tenant": "acme"}"#,
            400,
            "tenant",
        ),
        (
            r#"{"queue": "q", "kind": "noop", "policy": "nope"}"#,
            422,
            "policy",
        ),
        (r#"{"queue": "", "kind": "noop"}"#, 422, "queue"),
        (r#"{"queue": "q\u0001", "kind": "noop"}"#, 422, "queue"),
        (
            r#"{"queue": "q", "kind": "http", "payload": {"method": "GET"}}"#,
            422,
            "payload",
        ),
        (
            r#"{"queue": "q", "kind": "http", "payload": {"method": "GET", "url": "ftp://x"}}"#,
            422,
            "payload.url",
        ),
    ];
    for (body, status, field) in cases {
        let r = send(&app, post_json("/v1/jobs", body)).await;
        r.assert_problem(*status, field);
    }
    // The value is echoed so the caller sees what was refused.
    let r = send(
        &app,
        post_json(
            "/v1/jobs",
            r#"{"queue": "q", "kind": "noop", "delay": "soon"}"#,
        ),
    )
    .await;
    assert_eq!(r.json()["value"], "soon");

    // Over 1 MiB: 413 problem+json, with or without the idempotency layer buffering.
    let big = format!(
        r#"{{"queue": "q", "kind": "noop", "payload": "{}"}}"#,
        "x".repeat(1024 * 1024 + 10)
    );
    let r = send(&app, post_json("/v1/jobs", &big)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let mut req = post_json("/v1/jobs", &big);
    req.headers_mut()
        .insert("idempotency-key", "big-1".parse().unwrap());
    let r = send(&app, req).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    // Query and path parameters.
    for (uri, field) in [
        ("/v1/jobs?state=bogus", "state"),
        ("/v1/jobs?state=", "state"),
        ("/v1/jobs?limit=0", "limit"),
        ("/v1/jobs?limit=1001", "limit"),
        ("/v1/jobs?limit=ten", "limit"),
        ("/v1/jobs?after=-1", "after"),
        ("/v1/jobs?after=x", "after"),
        ("/v1/jobs/abc", "id"),
    ] {
        send(&app, get(uri)).await.assert_problem(400, field);
    }
    send(&app, get("/v1/jobs/999"))
        .await
        .assert_problem(404, "id");
    send(&app, post_empty("/v1/jobs/abc/replay"))
        .await
        .assert_problem(400, "id");
    // Nothing was enqueued by any of it.
    assert!(h.store.counts().await.unwrap().is_empty());
    h.cleanup().await;
}

async fn enqueue_idempotently(h: &Harness) {
    let app = h.app();
    let body = r#"{"queue": "pay", "kind": "noop", "payload": {"amount": 5}}"#;
    let req = |body: &str, key: &str| {
        let mut r = post_json("/v1/jobs", body);
        r.headers_mut()
            .insert("idempotency-key", key.parse().unwrap());
        r
    };
    let first = send(&app, req(body, "order-1")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let id = first.json()["job"]["id"].as_i64().unwrap();
    assert_eq!(
        first.header("location"),
        Some(format!("/v1/jobs/{id}").as_str())
    );
    assert_eq!(first.json()["job"]["key"], "order-1");
    let repeat = send(&app, req(body, "order-1")).await;
    assert_eq!(repeat.status, StatusCode::CREATED);
    assert_eq!(repeat.header("idempotent-replayed"), Some("true"));
    assert_eq!(repeat.json()["job"]["id"], id);
    // Same key, another request: 422 from the idempotency layer.
    let other = send(
        &app,
        req(
            r#"{"queue": "pay", "kind": "noop", "payload": {"amount": 6}}"#,
            "order-1",
        ),
    )
    .await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        other.body
    );
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    // The store's dedupe: the same body key without the header returns the job, 200.
    let by_key = send(
        &app,
        post_json(
            "/v1/jobs",
            r#"{"queue": "pay", "kind": "noop", "key": "order-1", "payload": {"amount": 5}}"#,
        ),
    )
    .await;
    assert_eq!(by_key.status, StatusCode::OK, "{}", by_key.body);
    assert_eq!(by_key.json()["created"], false);
    assert_eq!(by_key.json()["job"]["id"], id);
    let page = send(&app, get("/v1/jobs?queue=pay")).await.json();
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn idempotent_enqueue_sqlite() {
    let h = sqlite(AppConfig::default()).await;
    enqueue_idempotently(&h).await;
    h.cleanup().await;
}

#[tokio::test]
async fn idempotent_enqueue_postgres() {
    if let Some(h) = postgres(AppConfig::default()).await {
        enqueue_idempotently(&h).await;
        h.cleanup().await;
    }
}

async fn paginate(h: &Harness) {
    let app = h.app();
    let mut want = BTreeSet::new();
    for i in 0..23 {
        let q = if i % 3 == 0 { "b" } else { "a" };
        let r = send(
            &app,
            post_json(
                "/v1/jobs",
                &format!(r#"{{"queue": "{q}", "kind": "noop", "key": "k{i}"}}"#),
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        if q == "a" {
            want.insert(r.json()["job"]["id"].as_i64().unwrap());
        }
    }
    let mut seen = Vec::new();
    let mut after: Option<i64> = None;
    let mut pages = 0;
    loop {
        let uri = match after {
            Some(a) => format!("/v1/jobs?queue=a&state=available&limit=4&after={a}"),
            None => "/v1/jobs?queue=a&state=available&limit=4".into(),
        };
        let page = send(&app, get(&uri)).await.json();
        pages += 1;
        let jobs = page["jobs"].as_array().unwrap();
        assert!(jobs.len() <= 4);
        for j in jobs {
            assert_eq!(j["queue"], "a");
            seen.push(j["id"].as_i64().unwrap());
        }
        match page["next"].as_i64() {
            Some(n) => after = Some(n),
            None => break,
        }
        assert!(pages < 20, "pagination does not end");
    }
    let unique: BTreeSet<i64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "a job was listed twice: {seen:?}");
    assert_eq!(unique, want);
    assert_eq!(pages, want.len().div_ceil(4));
    let none = send(&app, get("/v1/jobs?state=dead")).await.json();
    assert_eq!(none["jobs"], json!([]));
    assert_eq!(none["next"], Value::Null);
}

#[tokio::test]
async fn pagination_walks_every_job_once_sqlite() {
    let h = sqlite(AppConfig::default()).await;
    paginate(&h).await;
    h.cleanup().await;
}

#[tokio::test]
async fn pagination_walks_every_job_once_postgres() {
    if let Some(h) = postgres(AppConfig::default()).await {
        paginate(&h).await;
        h.cleanup().await;
    }
}

#[tokio::test]
async fn show_replay_and_cancel() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let id = dead_job(
        &h.store,
        "pay",
        json!({"headers": {"Authorization": "Bearer sk_live_123", "X-Api-Key": "k-999"}, "amount": 5}),
        "card declined",
    )
    .await;
    let detail = send(&app, get(&format!("/v1/jobs/{id}"))).await;
    assert_eq!(detail.status, StatusCode::OK);
    assert!(!detail.body.contains("sk_live_123"), "{}", detail.body);
    assert!(!detail.body.contains("k-999"), "{}", detail.body);
    let d = detail.json();
    assert_eq!(d["job"]["state"], "dead");
    assert_eq!(
        d["job"]["payload"]["headers"]["Authorization"],
        "[redacted]"
    );
    assert_eq!(d["job"]["payload"]["amount"], 5);
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["class"], "permanent");
    assert_eq!(attempts[0]["error"], "card declined");
    let list = send(&app, get("/v1/jobs?state=dead")).await;
    assert!(!list.body.contains("sk_live_123"), "{}", list.body);

    let r = send(&app, post_empty(&format!("/v1/jobs/{id}/replay"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["state"], "available");
    assert_eq!(r.json()["replays"], 1);
    send(&app, post_empty(&format!("/v1/jobs/{id}/replay")))
        .await
        .assert_problem(409, "id");
    let r = send(&app, post_empty(&format!("/v1/jobs/{id}/cancel"))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["state"], "cancelled");
    send(&app, post_empty(&format!("/v1/jobs/{id}/cancel")))
        .await
        .assert_problem(409, "id");
    send(&app, post_empty("/v1/jobs/424242/cancel"))
        .await
        .assert_problem(404, "id");
    send(&app, post_empty("/v1/jobs/424242/replay"))
        .await
        .assert_problem(404, "id");
    h.cleanup().await;
}

#[tokio::test]
async fn stats_and_breakers_show_state_next_probe_and_transitions() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let now = chrono::Utc::now();
    for _ in 0..3 {
        h.store
            .enqueue(&NewJob::new("pay", "noop", json!({})), now)
            .await
            .unwrap();
    }
    let open_until = now + chrono::Duration::seconds(30);
    assert!(
        h.store
            .set_breaker(&BreakerUpdate {
                dependency: "psp.test".into(),
                expect: None,
                state: redrive_policy::BreakerState::Open,
                open_until: Some(open_until),
                probe_permits: 0,
                reason: "failure rate 80% over 20 calls".into(),
                now,
            })
            .await
            .unwrap()
    );
    h.store
        .pause(
            "other.test",
            now + chrono::Duration::seconds(60),
            redrive_policy::PauseReason::RetryAfter,
            now,
        )
        .await
        .unwrap();
    let stats = send(&app, get("/v1/stats")).await.json();
    assert_eq!(
        stats["counts"],
        json!([{"queue": "pay", "state": "available", "count": 3}])
    );
    let b = send(&app, get("/v1/breakers")).await.json();
    let list = b["breakers"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{b}");
    let psp = list.iter().find(|x| x["name"] == "psp.test").unwrap();
    assert_eq!(psp["state"], "open");
    assert_eq!(psp["next_probe_at"], psp["open_until"]);
    assert!(psp["next_probe_at"].is_string());
    assert_eq!(psp["recent_transitions"][0]["to"], "open");
    assert_eq!(
        psp["recent_transitions"][0]["reason"],
        "failure rate 80% over 20 calls"
    );
    let other = list.iter().find(|x| x["name"] == "other.test").unwrap();
    assert!(other["paused_until"].is_string(), "{other}");
    assert_eq!(other["pause_reason"], "retry_after");
    assert_eq!(stats["breakers"].as_array().unwrap().len(), 2);
    h.cleanup().await;
}

#[tokio::test]
async fn openapi_parses_and_lists_every_route() {
    let h = sqlite(AppConfig::default()).await;
    let doc = send(&h.app(), get("/openapi.json")).await.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, methods) in [
        ("/v1/jobs", &["get", "post"][..]),
        ("/v1/jobs/{id}", &["get"]),
        ("/v1/jobs/{id}/replay", &["post"]),
        ("/v1/jobs/{id}/cancel", &["post"]),
        ("/v1/stats", &["get"]),
        ("/v1/breakers", &["get"]),
        ("/healthz", &["get"]),
        ("/readyz", &["get"]),
    ] {
        let p = paths.get(path).unwrap_or_else(|| panic!("{path} missing"));
        for m in methods {
            assert!(p.get(*m).is_some(), "{m} {path} missing");
        }
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for s in [
        "EnqueueRequest",
        "EnqueueResponse",
        "JobView",
        "AttemptView",
        "JobPage",
        "JobDetail",
        "StatsResponse",
        "BreakersResponse",
        "BreakerView",
        "ProblemBody",
    ] {
        assert!(schemas.contains_key(s), "schema {s} missing");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    // Every $ref points at a schema that exists.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|x| refs(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let name = r.trim_start_matches("#/components/schemas/");
        assert!(schemas.contains_key(name), "dangling {r}");
    }
    h.cleanup().await;
}

/// The store is gone when its tables are: dropped behind the service's back (another
/// connection to the SQLite file, the schema on PostgreSQL).
#[tokio::test]
async fn readyz_is_503_when_the_store_is_gone() {
    let h = sqlite(AppConfig::default()).await;
    let r = send(&h.app(), get("/readyz")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["backend"], "sqlite");
    {
        use sqlx::Connection;
        let path = h.sqlite_path().unwrap();
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        sqlx::query("DROP TABLE redrive_attempts")
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::query("DROP TABLE redrive_jobs")
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
    }
    let r = send(&h.app(), get("/readyz")).await;
    r.assert_problem_status(503);
    assert!(
        !r.body.contains("no such table"),
        "5xx bodies say little: {}",
        r.body
    );
    assert_eq!(send(&h.app(), get("/healthz")).await.status, StatusCode::OK);
    h.cleanup().await;

    if let Some(h) = postgres(AppConfig::default()).await {
        let r = send(&h.app(), get("/readyz")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.json()["backend"], "postgres");
        // Drop the schema: the store's tables are gone.
        if let redrive_store::Store::Postgres(pg) = &h.store {
            pg.drop_schema().await.unwrap();
        }
        let r = send(&h.app(), get("/readyz")).await;
        r.assert_problem_status(503);
        assert!(
            !r.body.contains("relation"),
            "5xx bodies say little: {}",
            r.body
        );
        assert_eq!(send(&h.app(), get("/healthz")).await.status, StatusCode::OK);
    }
}

/// The SQLite file deleted under a running service: `/readyz` answers 503. Today that is
/// because the store's read opens a fresh connection, which finds an empty file without the
/// store's tables; the hardening issue makes readyz check the file itself, and this test
/// must keep passing through that change.
#[tokio::test]
async fn readyz_is_503_when_the_sqlite_file_is_deleted() {
    let h = sqlite(AppConfig::default()).await;
    assert_eq!(send(&h.app(), get("/readyz")).await.status, StatusCode::OK);
    let path = h.sqlite_path().unwrap();
    std::fs::remove_file(&path).unwrap();
    send(&h.app(), get("/readyz"))
        .await
        .assert_problem_status(503);
}

/// `/metrics` renders the gauges the background task set ([`publish_gauges`]) and runs no
/// query of its own: jobs enqueued after the last refresh do not show until the next one.
///
/// [`publish_gauges`]: redrive_runtime::metrics::publish_gauges
#[tokio::test]
async fn metrics_renders_the_gauges_the_background_task_set_without_querying() {
    let h0 = sqlite(AppConfig::default()).await;
    send(&h0.app(), get("/metrics"))
        .await
        .assert_problem_status(404);
    let handle = support::prometheus();
    let h = sqlite(AppConfig {
        prometheus: Some(handle),
        ..Default::default()
    })
    .await;
    let now = chrono::Utc::now();
    let enqueue = || async {
        h.store
            .enqueue(&NewJob::new("metrics-q", "noop", json!({})), now)
            .await
            .unwrap();
    };
    for _ in 0..3 {
        enqueue().await;
    }
    redrive_runtime::metrics::publish_gauges(&h.store, now + chrono::Duration::seconds(7))
        .await
        .unwrap();
    enqueue().await;
    let r = send(&h.app(), get("/metrics")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert!(
        r.body
            .contains("redrive_jobs{queue=\"metrics-q\",state=\"available\"} 3"),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("redrive_jobs{queue=\"metrics-q\",state=\"dead\"} 0"),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("redrive_oldest_available_seconds{queue=\"metrics-q\"} 7"),
        "{}",
        r.body
    );
    h.cleanup().await;
    h0.cleanup().await;
}

/// Found by schemathesis: the idempotency layer sat on the whole method router, so `PATCH
/// /v1/jobs` with a bad `Idempotency-Key` got 400 from the layer instead of 405.
#[tokio::test]
async fn undeclared_method_with_idempotency_key_is_405_not_400() {
    let h = sqlite(AppConfig::default()).await;
    let req = Request::patch("/v1/jobs")
        .header("idempotency-key", "")
        .body(Body::empty())
        .unwrap();
    let r = send(&h.app(), req).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    h.cleanup().await;
}

/// Found by schemathesis: JSON Schema's `integer` admits `-4188.0`, which serde refused for
/// an `i32`.
#[tokio::test]
async fn integral_floats_are_accepted_for_integer_fields() {
    let h = sqlite(AppConfig::default()).await;
    let r = send(
        &h.app(),
        post_json(
            "/v1/jobs",
            r#"{"queue": "q", "kind": "noop", "priority": -4.0, "max_attempts": 3.0}"#,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.json()["job"]["priority"], -4);
    assert_eq!(r.json()["job"]["max_attempts"], 3);
    send(
        &h.app(),
        post_json(
            "/v1/jobs",
            r#"{"queue": "q", "kind": "noop", "priority": 1.5}"#,
        ),
    )
    .await
    .assert_problem(400, "priority");
    send(
        &h.app(),
        post_json(
            "/v1/jobs",
            r#"{"queue": "q", "kind": "noop", "priority": 3000000000}"#,
        ),
    )
    .await
    .assert_problem(400, "priority");
    h.cleanup().await;
}

/// A quoted `Idempotency-Key` (`"k1"`, as the draft allows) is the key `k1`, not `"k1"`.
#[tokio::test]
async fn quoted_idempotency_key_becomes_the_bare_job_key() {
    let h = sqlite(AppConfig::default()).await;
    let mut req = post_json("/v1/jobs", r#"{"queue": "q", "kind": "noop"}"#);
    req.headers_mut()
        .insert("idempotency-key", "\"k1\"".parse().unwrap());
    let r = send(&h.app(), req).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.json()["job"]["key"], "k1");
    h.cleanup().await;
}

#[tokio::test]
async fn served_document_names_the_policies_and_excludes_delay_with_run_at() {
    let h = sqlite(AppConfig::default()).await;
    let doc = send(&h.app(), get("/openapi.json")).await.json();
    let req = &doc["components"]["schemas"]["EnqueueRequest"];
    let names = req["properties"]["policy"]["enum"].as_array().unwrap();
    assert!(names.contains(&json!("payment")), "{names:?}");
    assert_eq!(req["not"]["required"], json!(["delay", "run_at"]));
    h.cleanup().await;
}

#[tokio::test]
async fn jobs_by_key_and_unknown_query_parameters() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let now = chrono::Utc::now();
    let mut ids = Vec::new();
    for (queue, key) in [
        ("payments", "order-4711"),
        ("refunds", "order-4711"),
        ("payments", "order-4712"),
    ] {
        ids.push(
            h.store
                .enqueue(&NewJob::new(queue, "noop", json!({})).key(key), now)
                .await
                .unwrap()
                .job
                .id,
        );
    }
    h.store
        .enqueue(&NewJob::new("payments", "noop", json!({})), now)
        .await
        .unwrap();
    let listed = |r: &Reply| -> Vec<i64> {
        r.json()["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect()
    };
    let r = send(&app, get("/v1/jobs?key=order-4711")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(listed(&r), [ids[0], ids[1]]);
    let r = send(&app, get("/v1/jobs?key=order-4711&queue=refunds")).await;
    assert_eq!(listed(&r), [ids[1]]);
    let r = send(&app, get("/v1/jobs?key=order%2D4712")).await;
    assert_eq!(listed(&r), [ids[2]]);
    let r = send(&app, get("/v1/jobs?key=nobody")).await;
    assert_eq!((r.status, listed(&r)), (StatusCode::OK, vec![]));
    let r = send(&app, get("/v1/jobs?key=order-4711&limit=1")).await;
    assert_eq!(
        (listed(&r), r.json()["next"].as_i64()),
        (vec![ids[0]], Some(ids[0]))
    );
    let r = send(&app, get("/v1/jobs?key=order-4711&state=cancelled")).await;
    assert!(listed(&r).is_empty());
    // An empty key is refused, not "everything".
    send(&app, get("/v1/jobs?key="))
        .await
        .assert_problem(400, "key");
    send(&app, get(&format!("/v1/jobs?key={}", "k".repeat(256))))
        .await
        .assert_problem(400, "key");
    // Unknown parameters: 400 naming the parameter (they used to be ignored silently).
    for (uri, field) in [
        ("/v1/jobs?kye=order-4711", "kye"),
        ("/v1/jobs?state=dead&sort=id", "sort"),
        ("/v1/idempotency?stat=stuck", "stat"),
    ] {
        let r = send(&app, get(uri)).await;
        r.assert_problem(400, field);
        assert!(
            r.json()["detail"]
                .as_str()
                .unwrap()
                .contains("unknown query parameter"),
            "{}",
            r.body
        );
    }
    // The document describes `key`.
    let doc = send(&app, get("/openapi.json")).await.json();
    let params = doc["paths"]["/v1/jobs"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        params
            .iter()
            .any(|p| p["name"] == "key" && p["in"] == "query"),
        "{params:?}"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn workers_and_unhandled_kinds_in_the_api() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let now = chrono::Utc::now();
    let r = send(&app, get("/v1/workers")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json(), json!({"workers": [], "stale_after_seconds": 60}));
    let charge = h
        .store
        .enqueue(&NewJob::new("payments", "charge", json!({})), now)
        .await
        .unwrap()
        .job;
    h.store
        .enqueue(&NewJob::new("payments", "http", json!({})), now)
        .await
        .unwrap();
    h.store
        .register_worker(
            &redrive_store::WorkerInfo {
                name: "serve-1".into(),
                host: "box".into(),
                pid: 42,
                queues: vec![],
                kinds: redrive_store::Kinds::only(["http", "noop"]),
                concurrency: 4,
                started_at: now,
                last_seen: now,
                clock_offset_ms: None,
                policy_version: Some("v3".into()),
            },
            now,
        )
        .await
        .unwrap();
    let r = send(&app, get("/v1/workers")).await;
    let w = &r.json()["workers"][0];
    assert_eq!(w["name"], "serve-1");
    // The policies it runs (issue 37): the stored version 3.
    assert_eq!(w["policy_version"], "v3");
    assert_eq!(w["kinds"], json!(["http", "noop"]));
    assert_eq!(w["queues"], json!([]));
    assert_eq!(
        (w["pid"].as_u64(), w["concurrency"].as_u64()),
        (Some(42), Some(4))
    );
    // Stats: the existing fields, plus the charge no live worker runs.
    let stats = send(&app, get("/v1/stats")).await.json();
    assert!(
        stats["counts"].is_array() && stats["breakers"].is_array(),
        "{stats}"
    );
    let u = stats["unhandled"].as_array().unwrap();
    assert_eq!(u.len(), 1, "{stats}");
    assert_eq!(
        (
            u[0]["queue"].as_str(),
            u[0]["kind"].as_str(),
            u[0]["jobs"].as_u64()
        ),
        (Some("payments"), Some("charge"), Some(1))
    );
    assert!(u[0]["oldest_run_at"].is_string());
    // Gone once a worker for it is live, or the job is no longer waiting.
    h.store.cancel(charge.id, now).await.unwrap();
    let stats = send(&app, get("/v1/stats")).await.json();
    assert_eq!(stats["unhandled"], json!([]), "{stats}");
    // Documented.
    let doc = send(&app, get("/openapi.json")).await.json();
    assert!(doc["paths"]["/v1/workers"]["get"].is_object());
    assert!(doc["components"]["schemas"]["StatsResponse"]["properties"]["unhandled"].is_object());
    assert!(doc["components"]["schemas"]["WorkerView"]["properties"]["last_seen"].is_object());
    h.cleanup().await;
}

/// A handler that fails permanently with the answer a PSP gave.
#[derive(Debug)]
struct Refused;

impl redrive_runtime::Handler for Refused {
    fn run(
        &self,
        _ctx: redrive_runtime::JobContext,
    ) -> futures::future::BoxFuture<'static, redrive_runtime::Attempted> {
        Box::pin(async {
            redrive_runtime::Attempted::failure(
                redrive_policy::Outcome::Permanent,
                "POST https://psp.test/v1/charges → 422",
            )
            .with_status(422)
            .with_response(r#"{"error":"invalid amount: -5","card":"4111 1111 1111 1111"}"#)
        })
    }
}

/// Issue 37: the PSP's answer in the attempt JSON; why a job waits in the job JSON; paused
/// queues and forced breakers in `/v1/stats`; all documented.
#[tokio::test]
async fn job_json_says_what_the_psp_answered_and_why_a_job_waits() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let now = chrono::Utc::now();
    let enqueue = |job: NewJob| {
        let store = h.store.clone();
        async move { store.enqueue(&job, now).await.unwrap().job.id }
    };
    let refused = enqueue(NewJob::new("pay", "charge", json!({}))).await;
    work(&h.store, "pay", "charge", std::sync::Arc::new(Refused)).await;
    let d = send(&app, get(&format!("/v1/jobs/{refused}"))).await.json();
    let answer = d["attempts"][0]["response"].as_str().unwrap();
    assert!(answer.contains("invalid amount: -5"), "{d}");
    assert!(answer.contains("**** **** **** 1111"), "masked: {d}");
    assert!(!answer.contains("4111 1111"), "{d}");
    assert_eq!(
        d["waiting_because"],
        json!([]),
        "a dead job waits for nothing"
    );

    let held = enqueue(NewJob::new("q", "noop", json!({})).dependency("psp")).await;
    let free = enqueue(NewJob::new("other", "noop", json!({}))).await;
    let who = redrive_store::Actor::new("ops", "api");
    h.store.pause_queue("q", &who, now).await.unwrap();
    h.store
        .operate_dependency(
            "psp",
            redrive_store::DependencyOp::Force(redrive_policy::BreakerMode::ForcedOpen),
            &who,
            now,
        )
        .await
        .unwrap();
    let d = send(&app, get(&format!("/v1/jobs/{held}"))).await.json();
    let why: Vec<&str> = d["waiting_because"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["reason"].as_str().unwrap())
        .collect();
    assert_eq!(why, ["queue_paused", "breaker_open"], "{d}");
    assert_eq!(
        d["waiting_because"][1]["text"],
        "breaker open (forced by an operator)"
    );
    let d = send(&app, get(&format!("/v1/jobs/{free}"))).await.json();
    assert_eq!(d["waiting_because"], json!([]), "{d}");

    let stats = send(&app, get("/v1/stats")).await.json();
    assert_eq!(stats["paused_queues"][0]["queue"], "q", "{stats}");
    assert_eq!(
        stats["breakers"][0]["state_label"], "open (forced)",
        "{stats}"
    );
    let doc = send(&app, get("/openapi.json")).await.json();
    let schemas = &doc["components"]["schemas"];
    assert!(schemas["StatsResponse"]["properties"]["paused_queues"].is_object());
    assert!(schemas["JobDetail"]["properties"]["waiting_because"].is_object());
    assert!(schemas["AttemptView"]["properties"]["response"].is_object());
    assert!(schemas["BreakerView"]["properties"]["state_label"].is_object());
    h.cleanup().await;
}
