//! `/v1/schedules`: add (201), replace (200, keeping the next tick), list, remove (204, then
//! 404), bad bodies as problems naming the field, the routes in `/openapi.json`, and the
//! token on every route; on SQLite and PostgreSQL.

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use redrive_service::AppConfig;
use serde_json::json;
use support::*;

fn delete(uri: &str) -> Request<Body> {
    Request::delete(uri).body(Body::empty()).unwrap()
}

async fn schedules_round_trip(h: &Harness) {
    let app = h.app();
    let body = json!({
        "name": "settle", "cron": "0 0 2 * * *", "queue": "ops", "kind": "http",
        "payload": {"method": "POST", "url": "https://psp.example/v1/settle",
                    "headers": {"Authorization": "Bearer sk_live_abc"}},
        "missed": "skip", "priority": 5
    });
    let r = send(&app, post_json("/v1/schedules", &body.to_string())).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let v = r.json();
    assert_eq!(v["created"], true);
    let s = &v["schedule"];
    assert_eq!(s["name"], "settle");
    assert_eq!(s["missed"], "skip");
    assert_eq!(s["origin"], "api");
    assert_eq!(s["priority"], 5);
    assert_eq!(
        s["dependency"], "psp.example",
        "http jobs default to the URL's host"
    );
    assert!(s["next_tick"].as_str().unwrap().contains("T02:00:00"));
    assert!(
        !r.body.contains("sk_live_abc"),
        "the payload's secrets are redacted: {}",
        r.body
    );
    // Replaced with the same expression: 200, the same next tick.
    let mut again = body.clone();
    again["missed"] = json!("all");
    let r = send(&app, post_json("/v1/schedules", &again.to_string())).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["created"], false);
    assert_eq!(r.json()["schedule"]["missed"], "all");
    assert_eq!(r.json()["schedule"]["next_tick"], s["next_tick"]);
    let minimal = json!({"name": "tick", "cron": "* * * * * *", "queue": "q", "kind": "noop"});
    let r = send(&app, post_json("/v1/schedules", &minimal.to_string())).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.json()["schedule"]["missed"], "last", "the default rule");
    assert_eq!(r.json()["schedule"]["policy"], "payment");

    let list = send(&app, get("/v1/schedules")).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    let names: Vec<String> = list.json()["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["settle", "tick"]);
    // The store has them as the fleet's schedulers read them.
    let stored = h.store.schedule("settle").await.unwrap().unwrap();
    assert_eq!(stored.missed, redrive_store::Missed::All);

    // Bad bodies: problems naming the field.
    for (body, status, field) in [
        (
            json!({"name": "x", "cron": "daily", "queue": "q", "kind": "noop"}),
            422,
            "cron",
        ),
        (
            json!({"name": "x", "cron": "* * * * * *", "queue": "q", "kind": "noop", "missed": "twice"}),
            422,
            "missed",
        ),
        (
            json!({"name": "", "cron": "* * * * * *", "queue": "q", "kind": "noop"}),
            422,
            "name",
        ),
        (
            json!({"name": "x", "cron": "* * * * * *", "queue": "", "kind": "noop"}),
            422,
            "queue",
        ),
        (
            json!({"name": "x", "cron": "* * * * * *", "queue": "q", "kind": "noop", "policy": "nope"}),
            422,
            "policy",
        ),
        (
            json!({"name": "x", "cron": "* * * * * *", "queue": "q", "kind": "http", "payload": {"url": "https://a.example"}}),
            422,
            "payload",
        ),
        (
            json!({"name": "x", "cron": "* * * * * *", "queue": "q", "kind": "noop", "every": 3}),
            400,
            "every",
        ),
        (
            json!({"cron": "* * * * * *", "queue": "q", "kind": "noop"}),
            400,
            "name",
        ),
    ] {
        let r = send(&app, post_json("/v1/schedules", &body.to_string())).await;
        r.assert_problem(status, field);
    }
    let r = send(&app, post_json("/v1/schedules", "not json")).await;
    r.assert_problem(400, "body");
    assert_eq!(
        send(&app, get("/v1/schedules")).await.json()["schedules"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "nothing bad was stored"
    );

    let r = send(&app, delete("/v1/schedules/settle")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let r = send(&app, delete("/v1/schedules/settle")).await;
    r.assert_problem(404, "name");
    assert!(h.store.schedule("settle").await.unwrap().is_none());
}

#[tokio::test]
async fn schedules_round_trip_sqlite() {
    let h = sqlite(AppConfig::default()).await;
    schedules_round_trip(&h).await;
    h.cleanup().await;
}

#[tokio::test]
async fn schedules_round_trip_postgres() {
    if let Some(h) = postgres(AppConfig::default()).await {
        schedules_round_trip(&h).await;
        h.cleanup().await;
    }
}

#[tokio::test]
async fn schedule_routes_need_the_token_and_are_in_the_document() {
    let h = sqlite(AppConfig {
        token: Some("s3cret-token".into()),
        ..Default::default()
    })
    .await;
    let app = h.app();
    for req in [
        get("/v1/schedules"),
        post_json("/v1/schedules", "{}"),
        delete("/v1/schedules/x"),
    ] {
        send(&app, req).await.assert_problem_status(401);
    }
    let doc = send(&app, get("/openapi.json")).await.json();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths["/v1/schedules"]["get"].is_object());
    assert!(paths["/v1/schedules"]["post"].is_object());
    assert!(paths["/v1/schedules/{name}"]["delete"].is_object());
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for s in [
        "ScheduleRequest",
        "ScheduleView",
        "ScheduleList",
        "ScheduleUpsert",
    ] {
        assert!(schemas.contains_key(s), "schema {s} missing");
    }
    h.cleanup().await;
}
