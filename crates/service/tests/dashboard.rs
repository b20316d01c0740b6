//! The dashboard's HTML: counts, dead groups, the attempt timeline, redaction, the bulk
//! actions with their confirmation step, CSRF and the login cookie.

mod support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use redrive_service::AppConfig;
use redrive_store::{JobState, NewJob};
use serde_json::json;
use support::*;

fn form(uri: &str, body: &str, origin: Option<&str>) -> Request<Body> {
    let mut b = Request::post(uri)
        .header("host", "localhost:8080")
        .header("content-type", "application/x-www-form-urlencoded");
    if let Some(o) = origin {
        b = b.header("origin", o);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

const SAME: Option<&str> = Some("http://localhost:8080");

#[tokio::test]
async fn overview_shows_counts_per_queue_and_state_and_dead_reasons() {
    let h = sqlite(AppConfig::default()).await;
    let now = chrono::Utc::now();
    for _ in 0..4 {
        h.store
            .enqueue(&NewJob::new("payments", "noop", json!({})), now)
            .await
            .unwrap();
    }
    for _ in 0..2 {
        dead_job(&h.store, "refunds", json!({}), "declined").await;
    }
    let r = send(&h.app(), get("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    let html = &r.body;
    // The queue rows carry the counts as links to the filtered lists.
    assert!(
        html.contains(
            r#"<a class="state-available" href="/jobs?queue=payments&amp;state=available">4</a>"#
        ),
        "{html}"
    );
    assert!(
        html.contains(r#"<a class="state-dead" href="/jobs?queue=refunds&amp;state=dead">2</a>"#),
        "{html}"
    );
    assert!(
        html.contains(r#"<td class="n" data-reason="permanent">2</td>"#),
        "{html}"
    );
    // The chart saw the two permanent attempts.
    assert!(html.contains(r#"data-class="permanent""#), "{html}");
    assert!(html.contains("permanent (2)"), "{html}");
    h.cleanup().await;
}

#[tokio::test]
async fn jobs_list_filters_and_pages() {
    let h = sqlite(AppConfig::default()).await;
    let now = chrono::Utc::now();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            h.store
                .enqueue(&NewJob::new("a", "noop", json!({})), now)
                .await
                .unwrap()
                .job
                .id,
        );
    }
    h.store
        .enqueue(&NewJob::new("b", "noop", json!({})), now)
        .await
        .unwrap();
    let r = send(&h.app(), get("/jobs?queue=a&limit=3")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.matches("<tr data-id=").count(), 3, "{}", r.body);
    let next = format!("/jobs?queue=a&amp;limit=3&amp;after={}", ids[2]);
    assert!(r.body.contains(&next), "{}", r.body);
    let r2 = send(&h.app(), get(&next.replace("&amp;", "&"))).await;
    assert_eq!(r2.body.matches("<tr data-id=").count(), 2, "{}", r2.body);
    assert!(!r2.body.contains("next-page"));
    let bad = send(&h.app(), get("/jobs?state=nope")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("state"), "{}", bad.body);
    h.cleanup().await;
}

#[tokio::test]
async fn job_page_shows_the_attempt_timeline_and_redacts_secrets() {
    let h = sqlite(AppConfig::default()).await;
    let id = dead_job(
        &h.store,
        "pay",
        json!({"method": "POST", "url": "https://psp.test/c", "headers": {"Authorization": "Bearer sk_live_abc", "Cookie": "sid=zzz"}}),
        "card declined (code 51)",
    )
    .await;
    let r = send(&h.app(), get(&format!("/jobs/{id}"))).await;
    assert_eq!(r.status, StatusCode::OK);
    let html = &r.body;
    assert!(!html.contains("sk_live_abc"), "{html}");
    assert!(!html.contains("sid=zzz"), "{html}");
    assert!(html.contains("[redacted]"));
    assert!(
        html.contains(r#"<ol class="timeline" id="attempts">"#),
        "{html}"
    );
    assert_eq!(
        html.matches(r#"data-class="permanent""#).count(),
        1,
        "{html}"
    );
    assert!(
        html.contains("<code>card declined (code 51)</code>"),
        "{html}"
    );
    assert!(html.contains("fencing token 1"), "{html}");
    assert!(
        html.contains(r#"id="replay""#),
        "a dead job can be replayed"
    );
    assert!(
        !html.contains(r#"id="cancel""#),
        "a dead job cannot be cancelled"
    );

    // Replay from the page: back to available, with the history kept.
    let r = send(&h.app(), form(&format!("/jobs/{id}/replay"), "", SAME)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let j = h.store.get(id).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Available);
    let page = send(&h.app(), get(&format!("/jobs/{id}"))).await.body;
    assert!(page.contains(r#"id="cancel""#));
    let r = send(&h.app(), form(&format!("/jobs/{id}/cancel"), "", SAME)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(
        h.store.get(id).await.unwrap().unwrap().state,
        JobState::Cancelled
    );
    let missing = send(&h.app(), get("/jobs/9999")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    h.cleanup().await;
}

#[tokio::test]
async fn dead_page_groups_by_reason_and_signature_and_replays_in_bulk() {
    let h = sqlite(AppConfig::default()).await;
    let mut declined = Vec::new();
    for _ in 0..3 {
        declined.push(dead_job(&h.store, "pay", json!({}), "charge ch_12345678 declined").await);
    }
    // Different ids, the same signature: one group.
    let other = h
        .store
        .enqueue(&NewJob::new("pay", "other", json!({})), chrono::Utc::now())
        .await
        .unwrap()
        .job
        .id;
    work(
        &h.store,
        "pay",
        "other",
        Arc::new(Fails("psp said 400 bad amount")),
    )
    .await;

    let r = send(&h.app(), get("/dead")).await;
    assert_eq!(r.status, StatusCode::OK);
    let html = &r.body;
    assert!(
        html.contains(r#"<strong id="dead-total">4</strong>"#),
        "{html}"
    );
    assert!(
        html.contains(r#"data-reason="permanent" data-count="3""#),
        "{html}"
    );
    assert!(html.contains("charge &lt;id&gt; declined"), "{html}");
    assert!(html.contains("psp said N bad amount"), "{html}");
    for id in &declined {
        assert!(
            html.contains(&format!(r#"name="ids" value="{id}""#)),
            "{html}"
        );
    }

    // A selection is replayed at once.
    let r = send(
        &h.app(),
        form(
            "/dead/replay",
            &format!("ids={}&ids={}", declined[0], declined[1]),
            SAME,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains("Replayed 2 dead jobs."), "{}", r.body);
    // All: a confirmation first, nothing done yet.
    let r = send(&h.app(), form("/dead/replay", "all=1", SAME)).await;
    assert!(r.body.contains("Replay all 2 dead jobs?"), "{}", r.body);
    assert_eq!(
        h.store.get(declined[2]).await.unwrap().unwrap().state,
        JobState::Dead
    );
    let r = send(&h.app(), form("/dead/replay", "all=1&confirm=yes", SAME)).await;
    assert!(r.body.contains("Replayed 2 dead jobs."), "{}", r.body);
    assert_eq!(
        h.store.get(other).await.unwrap().unwrap().state,
        JobState::Available
    );

    // Purge always asks first.
    work(
        &h.store,
        "pay",
        "other",
        Arc::new(Fails("psp said 400 bad amount")),
    )
    .await;
    let r = send(&h.app(), form("/dead/purge", &format!("ids={other}"), SAME)).await;
    assert!(r.body.contains("Purge 1 selected dead job?"), "{}", r.body);
    assert!(h.store.get(other).await.unwrap().is_some());
    let r = send(
        &h.app(),
        form("/dead/purge", &format!("ids={other}&confirm=yes"), SAME),
    )
    .await;
    assert!(r.body.contains("Purged 1 dead job."), "{}", r.body);
    assert!(h.store.get(other).await.unwrap().is_none());

    let r = send(&h.app(), form("/dead/replay", "", SAME)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = send(&h.app(), form("/dead/replay", "ids=abc", SAME)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    h.cleanup().await;
}

#[tokio::test]
async fn posts_from_another_origin_are_refused() {
    let h = sqlite(AppConfig::default()).await;
    let id = dead_job(&h.store, "pay", json!({}), "declined").await;
    for origin in [
        None,
        Some("http://evil.test"),
        Some("http://localhost:9999"),
    ] {
        let r = send(&h.app(), form(&format!("/jobs/{id}/replay"), "", origin)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{origin:?}: {}", r.body);
        let r = send(&h.app(), form("/dead/replay", "all=1&confirm=yes", origin)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{origin:?}");
    }
    // A Referer from this host is enough.
    let mut req = form(&format!("/jobs/{id}/replay"), "", None);
    req.headers_mut()
        .insert("referer", "http://localhost:8080/dead".parse().unwrap());
    assert_eq!(send(&h.app(), req).await.status, StatusCode::SEE_OTHER);
    h.cleanup().await;
}

#[tokio::test]
async fn with_a_token_the_dashboard_needs_the_login_cookie() {
    let h = sqlite(AppConfig {
        token: Some("tok-123".into()),
        ..Default::default()
    })
    .await;
    let r = send(&h.app(), get("/dead?queue=x")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(
        r.header("location"),
        Some("/login?next=%2Fdead%3Fqueue%3Dx")
    );
    let login = send(&h.app(), get("/login?next=/dead")).await;
    assert!(login.body.contains(r#"type="password""#));

    let bad = send(&h.app(), form("/login", "token=nope&next=%2Fdead", SAME)).await;
    assert_eq!(bad.status, StatusCode::UNAUTHORIZED);
    assert!(bad.header("set-cookie").is_none());
    let csrf = send(
        &h.app(),
        form("/login", "token=tok-123", Some("http://evil.test")),
    )
    .await;
    assert_eq!(csrf.status, StatusCode::FORBIDDEN);

    let ok = send(&h.app(), form("/login", "token=tok-123&next=%2Fdead", SAME)).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    assert_eq!(ok.header("location"), Some("/dead"));
    let cookie = ok.header("set-cookie").unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("tok-123"),
        "the cookie is not the token itself"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    let req = Request::get("/dead")
        .header("cookie", &pair)
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&h.app(), req).await.status, StatusCode::OK);
    let forged = Request::get("/dead")
        .header("cookie", "redrive_session=00")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&h.app(), forged).await.status, StatusCode::SEE_OTHER);
    // An open redirect through `next` is not possible.
    let ok = send(
        &h.app(),
        form("/login", "token=tok-123&next=%2F%2Fevil.test", SAME),
    )
    .await;
    assert_eq!(ok.header("location"), Some("/"));
    h.cleanup().await;
}

#[tokio::test]
async fn breakers_page_shows_state_next_probe_and_transitions() {
    let h = sqlite(AppConfig::default()).await;
    let now = chrono::Utc::now();
    h.store
        .set_breaker(&redrive_store::BreakerUpdate {
            dependency: "psp.test".into(),
            expect: None,
            state: redrive_policy::BreakerState::Open,
            open_until: Some(now + chrono::Duration::seconds(45)),
            probe_permits: 0,
            reason: "failure rate 90%".into(),
            now,
        })
        .await
        .unwrap();
    let r = send(&h.app(), get("/breakers")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.body.contains(r#"<tr data-name="psp.test">"#),
        "{}",
        r.body
    );
    assert!(r.body.contains(r#"<span class="state-open">open</span>"#));
    assert!(r.body.contains("in 4"), "next probe in 44-45 s: {}", r.body);
    assert!(r.body.contains("failure rate 90%"));
    let o = send(&h.app(), get("/")).await;
    assert!(o.body.contains("1 open"), "{}", o.body);
    h.cleanup().await;
}

#[tokio::test]
async fn breakers_page_and_api_show_the_learned_rate_limit() {
    let h = sqlite(AppConfig::default()).await;
    let now = chrono::Utc::now();
    let flow = redrive_policy::FlowRow {
        rate: Some(72.5),
        rate_cut_at: Some(now),
        ..redrive_policy::FlowRow::default()
    };
    h.store
        .update_dependency(&redrive_store::DependencyWrite {
            dependency: "psp.rate".into(),
            expect_version: None,
            flow,
            transition: None,
            now,
        })
        .await
        .unwrap();
    let r = send(&h.app(), get("/breakers")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains("72.5/s"), "{}", r.body);
    let api = send(&h.app(), get("/v1/breakers")).await;
    let v: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(v["breakers"][0]["rate_limit"], 72.5, "{v}");
    assert_eq!(v["breakers"][0]["mode"], "normal", "{v}");
    h.cleanup().await;
}

#[tokio::test]
async fn search_box_finds_a_job_by_id_key_or_dependency() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let now = chrono::Utc::now();
    // Every page carries the search box.
    let r = send(&app, get("/")).await;
    assert!(
        r.body
            .contains(r#"<form id="search" method="get" action="/search""#),
        "{}",
        r.body
    );
    assert!(r.body.contains(r#"name="q""#), "{}", r.body);
    let one = h
        .store
        .enqueue(
            &NewJob::new("payments", "charge", json!({}))
                .key("order-4711")
                .dependency("psp.example"),
            now,
        )
        .await
        .unwrap()
        .job
        .id;
    let twice: Vec<i64> = {
        let mut v = Vec::new();
        for q in ["payments", "refunds"] {
            v.push(
                h.store
                    .enqueue(&NewJob::new(q, "noop", json!({})).key("order-9"), now)
                    .await
                    .unwrap()
                    .job
                    .id,
            );
        }
        v
    };
    // One job by key: straight to it.
    let r = send(&app, get("/search?q=order-4711")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.header("location"), Some(format!("/jobs/{one}").as_str()));
    // By id.
    let r = send(&app, get(&format!("/search?q={}", twice[1]))).await;
    assert_eq!(
        r.header("location"),
        Some(format!("/jobs/{}", twice[1]).as_str())
    );
    // A key held on two queues: both listed.
    let r = send(&app, get("/search?q=order-9")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.matches("<tr data-id=").count(), 2, "{}", r.body);
    for id in &twice {
        assert!(
            r.body.contains(&format!(r#"<tr data-id="{id}""#)),
            "{}",
            r.body
        );
    }
    // A dependency.
    h.store
        .set_breaker(&redrive_store::BreakerUpdate {
            dependency: "psp.example".into(),
            expect: None,
            state: redrive_policy::BreakerState::Open,
            open_until: Some(now + chrono::Duration::seconds(30)),
            probe_permits: 0,
            reason: "test".into(),
            now,
        })
        .await
        .unwrap();
    let r = send(&app, get("/search?q=psp.example")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.body.contains(r#"id="dependency-result""#) && r.body.contains("state-open"),
        "{}",
        r.body
    );
    // Nothing.
    let r = send(&app, get("/search?q=nothing-here")).await;
    assert!(r.body.contains(r#"id="no-results""#), "{}", r.body);
    let r = send(&app, get("/search?q=")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    // The jobs list filters by key too.
    let r = send(&app, get("/jobs?key=order-9&state=&queue=refunds")).await;
    assert_eq!(r.body.matches("<tr data-id=").count(), 1, "{}", r.body);
    assert!(
        r.body.contains(r#"name="key" value="order-9""#),
        "{}",
        r.body
    );
    h.cleanup().await;
}

#[tokio::test]
async fn workers_page_lists_live_workers_and_flags_unhandled_kinds() {
    let h = sqlite(AppConfig::default()).await;
    let app = h.app();
    let now = chrono::Utc::now();
    let r = send(&app, get("/")).await;
    assert!(
        r.body.contains(r#"<a href="/workers">Workers</a>"#),
        "{}",
        r.body
    );
    let r = send(&app, get("/workers")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains(r#"id="no-workers""#), "{}", r.body);
    h.store
        .enqueue(&NewJob::new("payments", "charge", json!({})), now)
        .await
        .unwrap();
    h.store
        .register_worker(
            &redrive_store::WorkerInfo {
                name: "serve-7".into(),
                host: "box-1".into(),
                pid: 4242,
                queues: vec![],
                kinds: redrive_store::Kinds::only(["http", "noop"]),
                concurrency: 2,
                started_at: now,
                last_seen: now,
                clock_offset_ms: None,
                policy_version: Some("file (differs from v3)".into()),
            },
            now,
        )
        .await
        .unwrap();
    let r = send(&app, get("/workers")).await;
    assert!(r.body.contains(r#"<tr data-name="serve-7">"#), "{}", r.body);
    // The policies it runs (issue 37).
    assert!(
        r.body
            .contains(r#"<td class="policies">file (differs from v3)</td>"#),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("box-1") && r.body.contains("4242") && r.body.contains("http, noop"),
        "{}",
        r.body
    );
    // The charge waits for a kind no live worker runs: flagged here and on the overview.
    for page in ["/workers", "/"] {
        let r = send(&app, get(page)).await;
        assert!(r.body.contains(r#"id="unhandled""#), "{page}: {}", r.body);
        assert!(
            r.body
                .contains(r#"data-queue="payments" data-kind="charge""#),
            "{page}: {}",
            r.body
        );
    }
    // A worker for it clears the flag.
    h.store
        .register_worker(
            &redrive_store::WorkerInfo {
                name: "charges".into(),
                host: "box-2".into(),
                pid: 7,
                queues: vec!["payments".into()],
                kinds: redrive_store::Kinds::only(["charge"]),
                concurrency: 1,
                started_at: now,
                last_seen: now,
                clock_offset_ms: None,
                policy_version: None,
            },
            now,
        )
        .await
        .unwrap();
    let r = send(&app, get("/")).await;
    assert!(!r.body.contains(r#"id="unhandled""#), "{}", r.body);
    h.cleanup().await;
}

fn with_cookie(mut req: Request<Body>, cookie: &str) -> Request<Body> {
    req.headers_mut().insert("cookie", cookie.parse().unwrap());
    req
}

async fn login(h: &Harness, token: &str) -> String {
    let ok = send(&h.app(), form("/login", &format!("token={token}"), SAME)).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.body);
    ok.header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn operator_controls_pause_a_queue_force_a_breaker_run_now_bulk_and_audit() {
    let h = sqlite(AppConfig {
        tokens: vec![
            redrive_service::ApiToken::parse("alice:alice-secret-1", false),
            redrive_service::ApiToken::parse("viewer:viewer-secret-1", true),
        ],
        ..Default::default()
    })
    .await;
    let now = chrono::Utc::now();
    let later = now + chrono::Duration::hours(1);
    let id = h
        .store
        .enqueue(
            &NewJob::new("payments", "noop", json!({}))
                .dependency("psp")
                .run_at(later),
            now,
        )
        .await
        .unwrap()
        .job
        .id;
    let alice = login(&h, "alice-secret-1").await;
    let app = h.app();
    // The overview offers a pause per queue; pausing shows it paused.
    let page = send(&app, with_cookie(get("/"), &alice)).await;
    assert!(
        page.body.contains(r#"action="/queues/payments/pause""#),
        "{}",
        page.body
    );
    let r = send(
        &app,
        with_cookie(form("/queues/payments/pause", "", SAME), &alice),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let page = send(&app, with_cookie(get("/"), &alice)).await;
    assert!(
        page.body.contains(r#"class="state-open paused""#),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"action="/queues/payments/resume""#));
    assert_eq!(h.store.paused_queues().await.unwrap()[0].queue, "payments");
    // A cross-origin post is refused.
    let r = send(
        &app,
        with_cookie(
            form("/queues/payments/resume", "", Some("http://evil.test")),
            &alice,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Force the breaker open from the breakers page.
    send(
        &app,
        with_cookie(form("/dependencies/psp/pause", "for=10m", SAME), &alice),
    )
    .await;
    let page = send(&app, with_cookie(get("/breakers"), &alice)).await;
    assert!(
        page.body.contains(r#"action="/breakers/psp/force""#),
        "{}",
        page.body
    );
    let r = send(
        &app,
        with_cookie(form("/breakers/psp/force", "mode=open", SAME), &alice),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let page = send(&app, with_cookie(get("/breakers"), &alice)).await;
    assert!(page.body.contains("forced open"), "{}", page.body);
    let d = h.store.dependency("psp").await.unwrap().unwrap();
    assert_eq!(d.flow.mode, redrive_policy::BreakerMode::ForcedOpen);
    let bad = send(
        &app,
        with_cookie(form("/breakers/psp/force", "mode=maybe", SAME), &alice),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("mode"));
    // Run now from the job page.
    let page = send(&app, with_cookie(get(&format!("/jobs/{id}")), &alice)).await;
    assert!(page.body.contains(r#"id="run-now""#), "{}", page.body);
    send(
        &app,
        with_cookie(form(&format!("/jobs/{id}/run-now"), "", SAME), &alice),
    )
    .await;
    let j = h.store.get(id).await.unwrap().unwrap();
    assert!(j.run_at <= chrono::Utc::now());
    assert_eq!(j.attempts, 0);
    // A bulk dry run names the jobs and changes nothing.
    let r = send(
        &app,
        with_cookie(
            form("/bulk", "action=cancel&queue=payments&dry_run=1", SAME),
            &alice,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains(r#"data-count="1" data-dry-run="true""#),
        "{}",
        r.body
    );
    assert_eq!(
        h.store.get(id).await.unwrap().unwrap().state,
        JobState::Scheduled
    );
    let r = send(
        &app,
        with_cookie(form("/bulk", "action=cancel", SAME), &alice),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "no filter, no 'every job': refused"
    );
    // The audit page shows who did what.
    let page = send(&app, with_cookie(get("/audit"), &alice)).await;
    assert_eq!(page.status, StatusCode::OK);
    for action in [
        "queue_pause",
        "dependency_pause",
        "breaker_force",
        "run_now",
    ] {
        assert!(
            page.body.contains(&format!(r#"data-action="{action}""#)),
            "{action}: {}",
            page.body
        );
    }
    assert!(
        page.body.contains(r#"<td class="actor">alice</td>"#),
        "{}",
        page.body
    );
    assert!(
        !page.body.contains(r#"data-action="cancel""#),
        "the dry run is not audited"
    );
    // A read-only session may look, not change.
    let viewer = login(&h, "viewer-secret-1").await;
    assert_eq!(
        send(&app, with_cookie(get("/audit"), &viewer)).await.status,
        StatusCode::OK
    );
    let r = send(
        &app,
        with_cookie(form("/queues/payments/resume", "", SAME), &viewer),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(h.store.paused_queues().await.unwrap().len(), 1);
    let r = send(&app, with_cookie(form("/logout", "", SAME), &viewer)).await;
    assert_ne!(
        r.status,
        StatusCode::FORBIDDEN,
        "a read-only session may sign out"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn a_card_key_is_taken_by_the_api_a_card_number_refused_and_the_job_page_shows_declines() {
    let h = sqlite(AppConfig::default()).await;
    let bad = send(
        &h.app(),
        post_json(
            "/v1/jobs",
            r#"{"queue":"subs","kind":"noop","quota_key":"4242424242424242"}"#,
        ),
    )
    .await;
    assert!(matches!(bad.status.as_u16(), 400 | 422), "{}", bad.body);
    assert_eq!(bad.json()["field"], "quota_key", "{}", bad.body);
    assert!(!bad.body.contains("4242424242424242"), "{}", bad.body);
    let r = send(
        &h.app(),
        post_json(
            "/v1/jobs",
            r#"{"queue":"subs","kind":"noop","quota_key":"pm_card_1"}"#,
        ),
    )
    .await;
    assert!(r.status.is_success(), "{}", r.body);
    let id = r.json()["job"]["id"].as_i64().unwrap();
    assert_eq!(r.json()["job"]["quota_key"], "pm_card_1");
    h.store
        .record_decline(&redrive_store::NewDecline {
            job_id: id,
            attempt: 1,
            quota_key: Some("pm_card_1".into()),
            advice: redrive_policy::DeclineAdvice::mastercard("51", Some(25)).unwrap(),
            at: chrono::Utc::now(),
            stop_for: None,
        })
        .await
        .unwrap();
    let page = send(&h.app(), get(&format!("/jobs/{id}"))).await.body;
    assert!(page.contains("id=\"quota-key\""), "{page}");
    assert!(page.contains("id=\"declines\""), "{page}");
    assert!(
        page.contains("MAC 25") && page.contains("retry_after 24h"),
        "{page}"
    );
    assert!(page.contains("Reattempt quota of this card"), "{page}");
    assert!(page.contains("<strong>0/15</strong>"), "{page}");
    assert!(!page.contains("id=\"card-stop\""), "not stopped: {page}");
    // A MAC 21 decline stops the card: the page names the decline and how to lift it.
    h.store
        .record_decline(&redrive_store::NewDecline {
            job_id: id,
            attempt: 2,
            quota_key: Some("pm_card_1".into()),
            advice: redrive_policy::DeclineAdvice::mastercard("05", Some(21)).unwrap(),
            at: chrono::Utc::now(),
            stop_for: Some(std::time::Duration::from_secs(30 * 86_400)),
        })
        .await
        .unwrap();
    let page = send(&h.app(), get(&format!("/jobs/{id}"))).await.body;
    assert!(page.contains("id=\"card-stop\""), "{page}");
    assert!(
        page.contains(&format!(
            "job {id} declined mastercard 05 mac 21 (recurring_stopped)"
        )),
        "{page}"
    );
    assert!(page.contains("redrive quota lift pm_card_1"), "{page}");
    // The API says so too, and lifts it (audited).
    let r = send(&h.app(), get("/v1/quotas/pm_card_1")).await;
    assert!(r.status.is_success(), "{}", r.body);
    let v = r.json();
    assert_eq!(v["card_stop"]["job_id"], id, "{v}");
    assert_eq!(v["card_stop"]["advice_code"], 21, "{v}");
    assert_eq!(v["card_stop"]["rule"], "recurring_stopped", "{v}");
    assert!(
        v["card_stop"]["description"]
            .as_str()
            .unwrap()
            .starts_with("card key pm_card_1 stopped until"),
        "{v}"
    );
    let r = send(&h.app(), post_empty("/v1/quotas/pm_card_1/lift")).await;
    assert!(r.status.is_success(), "{}", r.body);
    assert_eq!(r.json()["lifted"]["job_id"], id);
    let r = send(&h.app(), get("/v1/quotas/pm_card_1")).await;
    assert!(r.json()["card_stop"].is_null(), "{}", r.body);
    let r = send(&h.app(), get("/v1/audit")).await;
    assert_eq!(
        r.json()["audit"][0]["action"],
        "card_stop_lift",
        "{}",
        r.body
    );
    let r = send(&h.app(), get("/v1/quotas/4242424242424242")).await;
    assert_eq!(r.status.as_u16(), 422, "{}", r.body);
    assert!(r.body.contains("quota_key"), "{}", r.body);
    let page = send(&h.app(), get(&format!("/jobs/{id}"))).await.body;
    assert!(!page.contains("id=\"card-stop\""), "lifted: {page}");
    h.cleanup().await;
}
