//! Exact timing, in process: `router(state).oneshot(request)` on a paused
//! tokio clock, so windows, buckets and latencies are asserted to the
//! millisecond.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use redrive_psp_sim::{Faults, Outage, PspSim, SimState};
use tokio::time::{Instant, advance};
use tower::ServiceExt;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn sim(faults: Faults) -> (SimState, Router) {
    PspSim::builder().faults(faults).seed(3).build().unwrap()
}

async fn charge(router: &Router, key: &str) -> (StatusCode, axum::http::HeaderMap) {
    let req = Request::post("/v1/charges")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(r#"{"amount":1000,"currency":"EUR"}"#))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    (resp.status(), resp.headers().clone())
}

#[tokio::test(start_paused = true)]
async fn outage_window_is_exact_and_half_open() {
    let (state, router) = sim(Faults {
        outage: Some(Outage::new(ms(5000), ms(5000))),
        ..Faults::none()
    });
    assert_eq!(charge(&router, "a").await.0, StatusCode::CREATED);
    advance(ms(5000)).await;
    let (status, headers) = charge(&router, "b").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.get("retry-after").is_none());
    assert_eq!(headers["content-type"], "application/problem+json");
    advance(ms(4999)).await;
    assert_eq!(
        charge(&router, "c").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    advance(ms(1)).await;
    assert_eq!(charge(&router, "d").await.0, StatusCode::CREATED);

    let s = state.stats();
    assert_eq!(s.charges, 2);
    assert_eq!(s.injected.outage, 2);
    assert_eq!(s.requests_by_status[&503], 2);
    // Faulted keys are still keys seen.
    assert_eq!(s.distinct_keys, 4);
}

#[tokio::test(start_paused = true)]
async fn outage_relative_to_now_counts_from_the_post() {
    let (state, router) = sim(Faults::none());
    advance(ms(10_000)).await;
    let f: Faults = serde_json::from_value(serde_json::json!({
        "outage": {"start_ms": 100, "length_ms": 200, "relative_to": "now"},
        "outage_retry_after": 4
    }))
    .unwrap();
    let set = state.set_faults(f).unwrap();
    assert_eq!(set.outage, Some(Outage::new(ms(10_100), ms(200))));
    assert_eq!(charge(&router, "a").await.0, StatusCode::CREATED);
    advance(ms(100)).await;
    let (status, headers) = charge(&router, "b").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "4");
    advance(ms(200)).await;
    assert_eq!(charge(&router, "c").await.0, StatusCode::CREATED);
}

#[tokio::test(start_paused = true)]
async fn rate_limit_bucket_refills_exactly() {
    let (state, router) = sim(Faults {
        rate_limit: Some(2.0),
        retry_after: Some(Duration::from_secs(1)),
        ..Faults::none()
    });
    assert_eq!(charge(&router, "a").await.0, StatusCode::CREATED);
    assert_eq!(charge(&router, "b").await.0, StatusCode::CREATED);
    let (status, headers) = charge(&router, "c").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "1");
    advance(ms(499)).await;
    assert_eq!(charge(&router, "c").await.0, StatusCode::TOO_MANY_REQUESTS);
    advance(ms(1)).await;
    assert_eq!(charge(&router, "c").await.0, StatusCode::CREATED);
    assert_eq!(charge(&router, "d").await.0, StatusCode::TOO_MANY_REQUESTS);
    let s = state.stats();
    assert_eq!(s.charges, 3);
    assert_eq!(s.injected.rate_limited, 3);
}

#[tokio::test(start_paused = true)]
async fn latency_is_added_exactly_to_faulted_and_plain_answers() {
    let (_state, router) = sim(Faults {
        latency: ms(250),
        outage: Some(Outage::new(ms(1000), ms(1000))),
        ..Faults::none()
    });
    let t0 = Instant::now();
    assert_eq!(charge(&router, "a").await.0, StatusCode::CREATED);
    assert_eq!(t0.elapsed(), ms(250));
    advance(ms(750)).await;
    let t1 = Instant::now();
    assert_eq!(
        charge(&router, "b").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(t1.elapsed(), ms(250));
}

#[tokio::test(start_paused = true)]
async fn timeout_after_commit_holds_the_answer_for_the_delay() {
    let (state, router) = sim(Faults {
        timeout_after_commit: 1.0,
        timeout_delay: ms(30_000),
        ..Faults::none()
    });
    let t0 = Instant::now();
    let r = router.clone();
    let held = tokio::spawn(async move { charge(&r, "k").await.0 });
    // The charge is committed before the answer is held back.
    tokio::time::sleep(ms(1)).await;
    assert!(state.charge_for_key("k").is_some());
    assert_eq!(held.await.unwrap(), StatusCode::CREATED);
    assert_eq!(t0.elapsed(), ms(30_000));
    // A replay is not a charge made: answered at once.
    let t1 = Instant::now();
    let (status, headers) = charge(&router, "k").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(t1.elapsed(), Duration::ZERO);
    let s = state.stats();
    assert_eq!(s.injected.timeouts_after_commit, 1);
    assert_eq!(s.charges, 1);
}

#[tokio::test(start_paused = true)]
async fn timeline_slices_are_100ms_by_arrival() {
    let (state, router) = sim(Faults::none());
    charge(&router, "a").await;
    advance(ms(99)).await;
    charge(&router, "b").await;
    advance(ms(151)).await; // t = 250 ms
    charge(&router, "a").await;
    let s = state.stats();
    let t: Vec<(u64, u64)> = s.timeline.iter().map(|b| (b.t_ms, b.requests)).collect();
    assert_eq!(t, vec![(0, 2), (100, 0), (200, 1)]);
    assert_eq!(s.timeline[2].by_status[&201], 1);
    assert_eq!(s.replays, 1);
    assert_eq!(s.elapsed_ms, 250);

    // A reset restarts the clock and the timeline.
    state.reset();
    advance(ms(120)).await;
    charge(&router, "a").await;
    let s = state.stats();
    assert_eq!(s.charges, 1);
    assert_eq!(s.replays, 0);
    let t: Vec<(u64, u64)> = s.timeline.iter().map(|b| (b.t_ms, b.requests)).collect();
    assert_eq!(t, vec![(0, 0), (100, 1)]);
}

#[tokio::test(start_paused = true)]
async fn reset_replays_the_same_faults_for_the_same_requests() {
    let (state, router) = sim(Faults {
        error_rate: 0.5,
        ..Faults::none()
    });
    let mut first = vec![];
    for i in 0..40 {
        first.push(charge(&router, &format!("k{i}")).await.0);
    }
    state.reset();
    let mut second = vec![];
    for i in 0..40 {
        second.push(charge(&router, &format!("k{i}")).await.0);
    }
    assert_eq!(first, second);
    assert!(first.contains(&StatusCode::CREATED));
    assert!(first.iter().any(|s| s.is_server_error()));
}

#[tokio::test(start_paused = true)]
async fn the_request_log_has_each_arrival_to_the_microsecond() {
    let (state, router) = sim(Faults {
        outage: Some(Outage::new(ms(1000), ms(500))),
        latency: ms(30),
        ..Faults::none()
    });
    assert_eq!(charge(&router, "a").await.0, StatusCode::CREATED);
    advance(ms(1000)).await;
    assert_eq!(
        charge(&router, "b").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // b was answered at 1,060 ms: c arrives 1 µs before the outage's end.
    advance(Duration::from_micros(439_999)).await;
    assert_eq!(
        charge(&router, "c").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let log = state.request_log();
    let got: Vec<_> = log
        .iter()
        .map(|r| (r.seq, r.t_us, r.key.as_deref().unwrap(), r.status))
        .collect();
    // Arrivals, not answers: each answer came 30 ms later.
    assert_eq!(
        got,
        [
            (1, 0, "a", 201),
            (2, 1_030_000, "b", 503),
            (3, 1_499_999, "c", 503)
        ]
    );
}
