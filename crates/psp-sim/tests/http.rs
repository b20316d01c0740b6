//! The simulator over real HTTP on 127.0.0.1:0, as a client sees it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redrive_psp_sim::{Faults, Outage, PspSim, RunningSim, Stats};
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};

async fn start(faults: Faults) -> RunningSim {
    PspSim::builder()
        .faults(faults)
        .seed(1)
        .start("127.0.0.1:0")
        .await
        .expect("start the simulator")
}

async fn charge(c: &Client, sim: &RunningSim, key: &str, body: Value) -> Response {
    c.post(format!("{}/v1/charges", sim.url()))
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .expect("send")
}

fn eur(amount: u64) -> Value {
    json!({"amount": amount, "currency": "EUR"})
}

async fn problem(r: Response, status: StatusCode, field: &str) -> Value {
    assert_eq!(r.status(), status);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], status.as_u16());
    assert_eq!(v["field"], field, "{v}");
    v
}

#[tokio::test]
async fn a_repeat_with_the_same_key_replays_the_same_charge() {
    let sim = start(Faults::none()).await;
    let c = Client::new();
    let r = charge(
        &c,
        &sim,
        "order-1",
        json!({"amount": 1999, "currency": "eur", "reference": "o-1"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(r.headers().get("idempotent-replayed").is_none());
    let first: Value = r.json().await.unwrap();
    assert_eq!(first["amount"], 1999);
    assert_eq!(first["currency"], "EUR");
    assert_eq!(first["reference"], "o-1");
    assert_eq!(first["idempotency_key"], "order-1");

    let r = charge(
        &c,
        &sim,
        "order-1",
        json!({"amount": 1999, "currency": "eur", "reference": "o-1"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    let again: Value = r.json().await.unwrap();
    assert_eq!(again, first);

    let id = first["id"].as_str().unwrap();
    let r = c
        .get(format!("{}/v1/charges/{id}", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap(), first);
    let r = c
        .get(format!("{}/v1/charges?key=order-1", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["id"], id);
    let r = c
        .get(format!("{}/v1/charges?key=nope", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = c
        .get(format!("{}/v1/charges/ch_999999", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = c
        .get(format!("{}/v1/charges", sim.url()))
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "key").await;

    let s = sim.stats();
    assert_eq!(s.charges, 1);
    assert_eq!(s.distinct_keys, 1);
    assert_eq!(s.replays, 1);
    assert_eq!(s.duplicate_effects, 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn same_key_with_another_body_is_422() {
    let sim = start(Faults::none()).await;
    let c = Client::new();
    assert_eq!(
        charge(&c, &sim, "k", eur(100)).await.status(),
        StatusCode::CREATED
    );
    let r = charge(&c, &sim, "k", eur(101)).await;
    problem(r, StatusCode::UNPROCESSABLE_ENTITY, "Idempotency-Key").await;
    let s = sim.stats();
    assert_eq!(s.charges, 1);
    assert_eq!(s.key_mismatches, 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn bad_requests_name_the_field_and_charge_nothing() {
    let sim = start(Faults::none()).await;
    let c = Client::new();
    let r = c
        .post(format!("{}/v1/charges", sim.url()))
        .json(&eur(100))
        .send()
        .await
        .unwrap();
    let v = problem(r, StatusCode::BAD_REQUEST, "Idempotency-Key").await;
    assert!(v["detail"].as_str().unwrap().contains("required"), "{v}");

    let r = c
        .post(format!("{}/v1/charges", sim.url()))
        .header("Idempotency-Key", "k")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "body").await;
    let cases = [
        (json!({"amount": 0, "currency": "EUR"}), "amount"),
        (json!({"amount": 12.5, "currency": "EUR"}), "amount"),
        (json!({"currency": "EUR"}), "amount"),
        (json!({"amount": 5, "currency": "EURO"}), "currency"),
        (json!({"amount": 5}), "currency"),
        (
            json!({"amount": 5, "currency": "EUR", "reference": 1}),
            "reference",
        ),
    ];
    for (body, field) in cases {
        let r = charge(&c, &sim, "k", body).await;
        problem(r, StatusCode::UNPROCESSABLE_ENTITY, field).await;
    }
    // A refused request does not hold the key: a good one goes through.
    assert_eq!(
        charge(&c, &sim, "k", eur(5)).await.status(),
        StatusCode::CREATED
    );
    let s = sim.stats();
    assert_eq!(s.charges, 1);
    assert_eq!(s.requests_by_status[&400], 2);
    assert_eq!(s.requests_by_status[&422], 6);
    sim.shutdown().await;
}

#[tokio::test]
async fn fifty_parallel_requests_with_one_key_make_one_charge() {
    let sim = start(Faults {
        processing: Duration::from_millis(1500),
        ..Faults::none()
    })
    .await;
    let c = Client::new();
    let url = format!("{}/v1/charges", sim.url());
    let mut tasks = vec![];
    for _ in 0..50 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let r = c
                .post(url)
                .header("Idempotency-Key", "same")
                .json(&eur(500))
                .send()
                .await
                .unwrap();
            let status = r.status();
            let replayed = r.headers().contains_key("idempotent-replayed");
            let retry_after = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = r.json().await.unwrap();
            (status, replayed, retry_after, body)
        }));
    }
    let mut fresh = vec![];
    let mut conflicts = 0;
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        let (status, replayed, retry_after, body) = t.await.unwrap();
        match status {
            StatusCode::CREATED => {
                ids.insert(body["id"].as_str().unwrap().to_owned());
                if !replayed {
                    fresh.push(body);
                }
            }
            StatusCode::CONFLICT => {
                conflicts += 1;
                assert_eq!(retry_after.as_deref(), Some("1"));
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(fresh.len(), 1, "exactly one request made the charge");
    assert_eq!(ids.len(), 1, "every success names the same charge");
    assert!(conflicts >= 1, "requests during processing get 409");
    let s = sim.stats();
    assert_eq!(s.charges, 1);
    assert_eq!(s.duplicate_effects, 0);
    assert_eq!(s.distinct_keys, 1);
    assert_eq!(s.conflicts, conflicts);
    assert_eq!(s.requests_total, 50);
    sim.shutdown().await;
}

#[tokio::test]
async fn error_rate_share_is_roughly_right_reproducible_and_charges_nothing() {
    let faults = Faults {
        error_rate: 0.3,
        ..Faults::none()
    };
    let run = |seed: u64| {
        let faults = faults.clone();
        async move {
            let sim = PspSim::builder()
                .faults(faults)
                .seed(seed)
                .start("127.0.0.1:0")
                .await
                .unwrap();
            let c = Client::new();
            let mut statuses = vec![];
            for i in 0..300 {
                statuses.push(
                    charge(&c, &sim, &format!("k{i}"), eur(100))
                        .await
                        .status()
                        .as_u16(),
                );
            }
            let s = sim.stats();
            sim.shutdown().await;
            (statuses, s)
        }
    };
    let (a, stats) = run(11).await;
    let errors = a.iter().filter(|s| **s >= 500).count();
    assert!((60..=120).contains(&errors), "{errors} errors out of 300");
    assert!(a.iter().all(|s| [201, 500, 502, 503].contains(s)), "{a:?}");
    for s in [500, 502, 503] {
        assert!(a.contains(&s), "{s} never drawn");
    }
    let created = a.iter().filter(|s| **s == 201).count() as u64;
    assert_eq!(stats.charges, created, "errors make no charge");
    assert_eq!(stats.injected.errors, errors as u64);
    assert_eq!(stats.seed, 11);
    let (b, _) = run(11).await;
    assert_eq!(a, b, "same seed, same faults");
}

#[tokio::test]
async fn rate_limit_gives_429_without_and_with_retry_after() {
    // 0.1 rps: one token, the next one in 10 s.
    let sim = start(Faults {
        rate_limit: Some(0.1),
        ..Faults::none()
    })
    .await;
    let c = Client::new();
    assert_eq!(
        charge(&c, &sim, "a", eur(1)).await.status(),
        StatusCode::CREATED
    );
    let r = charge(&c, &sim, "b", eur(1)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().get("retry-after").is_none());

    sim.set_faults(Faults {
        rate_limit: Some(0.1),
        retry_after: Some(Duration::from_secs(3)),
        ..Faults::none()
    })
    .unwrap();
    assert_eq!(
        charge(&c, &sim, "b", eur(1)).await.status(),
        StatusCode::CREATED
    );
    let r = charge(&c, &sim, "c", eur(1)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "3");
    // Status queries are limited too.
    let r = c
        .get(format!("{}/v1/charges?key=a", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let s = sim.stats();
    assert_eq!(s.charges, 2);
    assert_eq!(s.requests_by_status[&429], 3);
    assert_eq!(s.injected.rate_limited, 3);
    sim.shutdown().await;
}

#[tokio::test]
async fn outage_window_answers_503() {
    let sim = start(Faults {
        outage: Some(Outage::new(Duration::ZERO, Duration::from_secs(3600))),
        ..Faults::none()
    })
    .await;
    let c = Client::new();
    let r = charge(&c, &sim, "a", eur(1)).await;
    assert!(r.headers().get("retry-after").is_none());
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // A window in the future lets requests through.
    let r = c
        .post(format!("{}/_sim/faults", sim.url()))
        .json(&json!({"outage": {"start_ms": 3_600_000, "length_ms": 1000, "relative_to": "now"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        charge(&c, &sim, "a", eur(1)).await.status(),
        StatusCode::CREATED
    );
    // Retry-After on outage 503s only when configured.
    sim.set_faults(Faults {
        outage: Some(Outage::new(Duration::ZERO, Duration::from_secs(3600))),
        outage_retry_after: Some(Duration::from_secs(7)),
        ..Faults::none()
    })
    .unwrap();
    let r = charge(&c, &sim, "b", eur(1)).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "7");
    let s = sim.stats();
    assert_eq!(s.injected.outage, 2);
    assert_eq!(s.charges, 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn timeout_after_commit_commits_and_the_status_query_finds_it() {
    let sim = start(Faults {
        timeout_after_commit: 1.0,
        timeout_delay: Duration::from_secs(30),
        ..Faults::none()
    })
    .await;
    let impatient = Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let err = impatient
        .post(format!("{}/v1/charges", sim.url()))
        .header("Idempotency-Key", "lost")
        .json(&eur(4200))
        .send()
        .await
        .expect_err("the answer is held back past the client's timeout");
    assert!(err.is_timeout(), "{err}");

    let c = Client::new();
    let r = c
        .get(format!("{}/v1/charges?key=lost", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let found: Value = r.json().await.unwrap();
    assert_eq!(found["amount"], 4200);
    assert_eq!(found["idempotency_key"], "lost");
    // Repeating with the same key is safe: the stored charge, at once.
    let r = charge(&c, &sim, "lost", eur(4200)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(r.json::<Value>().await.unwrap()["id"], found["id"]);
    let s = sim.stats();
    assert_eq!(s.charges, 1);
    assert_eq!(s.duplicate_effects, 0);
    assert_eq!(s.injected.timeouts_after_commit, 1);
    // Shutdown ends the hold-back rather than waiting 30 s (a bound, not a speed test).
    tokio::time::timeout(Duration::from_secs(25), sim.shutdown())
        .await
        .expect("shutdown does not wait for held-back answers");
}

#[tokio::test]
async fn latency_is_added_to_every_answer() {
    let sim = start(Faults {
        latency: Duration::from_millis(300),
        ..Faults::none()
    })
    .await;
    let c = Client::new();
    let t = std::time::Instant::now();
    assert_eq!(
        charge(&c, &sim, "a", eur(1)).await.status(),
        StatusCode::CREATED
    );
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let t = std::time::Instant::now();
    let r = c
        .get(format!("{}/v1/charges?key=zzz", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    // Control routes have no latency and are not counted.
    let s: Value = c
        .get(format!("{}/_sim/stats", sim.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(s["requests_total"], 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn stats_endpoint_has_the_contract_fields() {
    let sim = start(Faults::none()).await;
    let c = Client::new();
    charge(&c, &sim, "a", eur(1)).await;
    charge(&c, &sim, "a", eur(1)).await;
    charge(&c, &sim, "b", eur(0)).await;
    let v: Value = c
        .get(format!("{}/_sim/stats", sim.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for f in [
        "requests_total",
        "requests_by_status",
        "charges",
        "distinct_keys",
        "duplicate_effects",
        "timeline",
    ] {
        assert!(v.get(f).is_some(), "missing {f}: {v}");
    }
    assert_eq!(v["requests_total"], 3);
    assert_eq!(v["requests_by_status"]["201"], 2);
    assert_eq!(v["requests_by_status"]["422"], 1);
    assert_eq!(v["charges"], 1);
    assert_eq!(v["distinct_keys"], 2);
    assert_eq!(v["duplicate_effects"], 0);
    let timeline = v["timeline"].as_array().unwrap();
    assert!(!timeline.is_empty());
    let mut total = 0;
    for (i, b) in timeline.iter().enumerate() {
        assert_eq!(b["t_ms"], i as u64 * 100);
        let by: u64 = b["by_status"]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(b["requests"], by);
        total += b["requests"].as_u64().unwrap();
    }
    assert_eq!(total, 3);
    // The same struct the library returns.
    let s: Stats = serde_json::from_value(v).unwrap();
    assert_eq!(s.charges, sim.stats().charges);
    sim.shutdown().await;
}

#[tokio::test]
async fn faults_can_be_posted_read_back_and_reset() {
    let sim = start(Faults::none()).await;
    let c = Client::new();
    let url = sim.url();
    let r = c
        .post(format!("{url}/_sim/faults"))
        .json(&json!({"error_rate": 1.0, "latency_ms": 0, "seed": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let posted: Value = r.json().await.unwrap();
    assert_eq!(posted["error_rate"], 1.0);
    assert_eq!(posted["seed"], 5);
    assert_eq!(posted["timeout_delay_ms"], 30_000);
    let got: Value = c
        .get(format!("{url}/_sim/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got, posted);
    assert!(
        charge(&c, &sim, "a", eur(1))
            .await
            .status()
            .is_server_error()
    );

    let bad = [
        (json!({"error_rate": 2}), "error_rate"),
        (json!({"rate_limit": -1}), "rate_limit"),
        (json!({"outage": "5s"}), "outage"),
        (json!({"errorrate": 0.1}), "errorrate"),
    ];
    for (body, field) in bad {
        let r = c
            .post(format!("{url}/_sim/faults"))
            .json(&body)
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::UNPROCESSABLE_ENTITY, field).await;
    }
    let r = c
        .post(format!("{url}/_sim/faults"))
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "body").await;
    // A refused post changed nothing.
    assert_eq!(sim.faults().error_rate, 1.0);

    // An empty object clears every fault (the seed stays).
    let r = c
        .post(format!("{url}/_sim/faults"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["seed"], 5);
    assert_eq!(
        charge(&c, &sim, "a", eur(1)).await.status(),
        StatusCode::CREATED
    );

    let r = c.post(format!("{url}/_sim/reset")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let s = sim.stats();
    assert_eq!((s.requests_total, s.charges, s.distinct_keys), (0, 0, 0));
    assert!(s.timeline.is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn without_the_ledger_dedupe_duplicates_are_counted() {
    let sim = PspSim::builder()
        .ledger_dedupe(false)
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let c = Client::new();
    for _ in 0..3 {
        assert_eq!(
            charge(&c, &sim, "k", eur(1)).await.status(),
            StatusCode::CREATED
        );
    }
    let s = sim.stats();
    assert_eq!(s.charges, 3);
    assert_eq!(s.distinct_keys, 1);
    assert_eq!(s.duplicate_effects, 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_charges_layer_sits_after_the_edge_faults_and_before_the_ledger() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let layer = axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                let mut resp = next.run(req).await;
                resp.headers_mut().insert("x-layer", "1".parse().unwrap());
                resp
            }
        },
    );
    let sim = PspSim::builder()
        .charges_layer(layer)
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let c = Client::new();
    let r = charge(&c, &sim, "k", eur(1)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["x-layer"], "1");
    // Only POST /v1/charges goes through it.
    let r = c
        .get(format!("{}/v1/charges?key=k", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("x-layer").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Edge faults answer before the layer is reached.
    sim.set_faults(Faults {
        outage: Some(Outage::new(Duration::ZERO, Duration::from_secs(3600))),
        ..Faults::none()
    })
    .unwrap();
    assert_eq!(
        charge(&c, &sim, "j", eur(1)).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    sim.shutdown().await;
}

/// The charges route behind redrive's own idempotency layer, with the ledger's check turned
/// off: the layer alone keeps 50 parallel requests with one key to one charge, and a later
/// repeat is a replay.
#[tokio::test]
async fn the_idempotency_layer_alone_keeps_one_key_to_one_charge() {
    let sim = PspSim::builder()
        .faults(Faults {
            processing: Duration::from_millis(500),
            ..Faults::none()
        })
        .ledger_dedupe(false)
        .with_idempotency_layer()
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let c = Client::new();
    let url = format!("{}/v1/charges", sim.url());
    let mut tasks = vec![];
    for _ in 0..50 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            c.post(url)
                .header("Idempotency-Key", "layered")
                .json(&eur(700))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    for t in tasks {
        let status = t.await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::CONFLICT,
            "{status}"
        );
    }
    let again = charge(&c, &sim, "layered", eur(700)).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let missing = c.post(&url).json(&eur(700)).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let s = sim.stats();
    assert_eq!(s.charges, 1);
    assert_eq!(s.duplicate_effects, 0);
    sim.shutdown().await;
}

/// With the ledger's dedupe off and no layer in front, a repeat is a second charge: the
/// negative control of every exactly-once check that reads `duplicate_effects` and
/// `effects_max_per_key`.
#[tokio::test]
async fn without_the_layer_and_the_ledger_dedupe_a_repeat_is_a_second_charge() {
    let sim = PspSim::builder()
        .ledger_dedupe(false)
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let c = Client::new();
    for _ in 0..2 {
        charge(&c, &sim, "k", eur(5)).await;
    }
    let s = sim.stats();
    assert!(!s.ledger_dedupe);
    assert_eq!((s.charges, s.duplicate_effects), (2, 1));
    assert_eq!((s.effects_max_per_key, s.executions_max_per_key), (2, 2));
    assert_eq!((s.replays, s.layer_replays), (0, 0));
    sim.shutdown().await;
}

/// Behind the idempotency layer with the ledger's dedupe off, a repeat is the layer's
/// replay: counted in `layer_replays`, the handler not run again.
#[tokio::test]
async fn the_layers_replays_and_the_handlers_runs_are_counted() {
    let sim = PspSim::builder()
        .ledger_dedupe(false)
        .with_idempotency_layer()
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let c = Client::new();
    assert_eq!(
        charge(&c, &sim, "k", eur(5)).await.status(),
        StatusCode::CREATED
    );
    for _ in 0..3 {
        let r = charge(&c, &sim, "k", eur(5)).await;
        assert_eq!(r.headers()["idempotent-replayed"], "true");
    }
    charge(&c, &sim, "j", eur(5)).await;
    let s = sim.stats();
    assert_eq!(
        (s.charges, s.duplicate_effects, s.effects_max_per_key),
        (2, 0, 1)
    );
    assert_eq!((s.layer_replays, s.replays), (3, 0));
    assert_eq!(s.executions_max_per_key, 1);
    let v: Value = Client::new()
        .get(format!("{}/_sim/stats", sim.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["layer_replays"], 3);
    assert_eq!(v["executions_max_per_key"], 1);
    assert_eq!(v["effects_max_per_key"], 1);
    assert_eq!(v["ledger_dedupe"], false);
    let log = sim.request_log();
    let replayed: Vec<_> = log.iter().map(|r| r.replayed_by).collect();
    use redrive_psp_sim::ReplayedBy::Layer;
    assert_eq!(
        replayed,
        [None, Some(Layer), Some(Layer), Some(Layer), None]
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn the_request_log_has_each_arrival_in_utc_and_pages_over_http() {
    let sim = start(Faults {
        outage: Some(Outage::new(
            Duration::from_secs(3600),
            Duration::from_secs(1),
        )),
        ..Faults::none()
    })
    .await;
    let c = Client::new();
    let before = chrono::Utc::now();
    charge(&c, &sim, "a", eur(1)).await;
    let between = chrono::Utc::now();
    charge(&c, &sim, "b", eur(0)).await;
    c.get(format!("{}/v1/charges?key=a", sim.url()))
        .send()
        .await
        .unwrap();
    let after = chrono::Utc::now();
    let get = |q: &str| {
        let (c, url) = (c.clone(), format!("{}/_sim/requests{q}", sim.url()));
        async move { c.get(url).send().await.unwrap() }
    };
    let page: Value = get("").await.json().await.unwrap();
    let rs = page["requests"].as_array().unwrap();
    assert_eq!(rs.len(), 3, "{page}");
    assert_eq!(page["next"], Value::Null);
    assert_eq!(page["dropped"], 0);
    let at = |i: usize| {
        chrono::DateTime::parse_from_rfc3339(rs[i]["at"].as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    assert!(before <= at(0) && at(0) <= between, "{page}");
    assert!(
        between <= at(1) && at(1) <= at(2) && at(2) <= after,
        "{page}"
    );
    assert_eq!(
        (
            &rs[0]["seq"],
            &rs[0]["method"],
            &rs[0]["path"],
            &rs[0]["key"],
            &rs[0]["status"]
        ),
        (
            &json!(1),
            &json!("POST"),
            &json!("/v1/charges"),
            &json!("a"),
            &json!(201)
        )
    );
    assert_eq!(rs[1]["status"], 422);
    assert_eq!(
        (&rs[2]["method"], &rs[2]["path"]),
        (&json!("GET"), &json!("/v1/charges"))
    );
    assert!(
        rs[2].get("key").is_none(),
        "only charges carry a key: {page}"
    );
    assert!(rs[0]["t_us"].as_u64().unwrap() <= rs[1]["t_us"].as_u64().unwrap());
    // Paging: one at a time, by the `next` cursor.
    let p1: Value = get("?limit=2").await.json().await.unwrap();
    assert_eq!(p1["requests"].as_array().unwrap().len(), 2);
    assert_eq!(p1["next"], 2);
    let p2: Value = get("?after=2&limit=2").await.json().await.unwrap();
    assert_eq!(p2["requests"][0]["seq"], 3);
    assert_eq!(p2["next"], Value::Null);
    // The control routes are not logged, and bad parameters are named.
    assert_eq!(sim.request_log().len(), 3);
    problem(get("?limit=0").await, StatusCode::BAD_REQUEST, "limit").await;
    problem(get("?limit=10001").await, StatusCode::BAD_REQUEST, "limit").await;
    problem(get("?after=x").await, StatusCode::BAD_REQUEST, "after").await;
    problem(get("?since=1").await, StatusCode::BAD_REQUEST, "since").await;
    sim.reset();
    assert!(sim.request_log().is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn declines_set_by_the_faults_route_answer_402_with_advice_and_count_violations() {
    let sim = start(Faults::none()).await;
    let c = Client::new();
    let bad = c
        .post(format!("{}/_sim/faults", sim.url()))
        .json(&json!({"decline_rate": 1.0, "decline_mix": "visa9:1"}))
        .send()
        .await
        .unwrap();
    problem(bad, StatusCode::UNPROCESSABLE_ENTITY, "decline_mix").await;
    let set = c
        .post(format!("{}/_sim/faults", sim.url()))
        .json(&json!({"decline_rate": 1.0, "decline_mix": "visa1:1"}))
        .send()
        .await
        .unwrap();
    assert!(set.status().is_success());
    let now: Value = c
        .get(format!("{}/_sim/faults", sim.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(now["decline_mix"], "visa1:1");
    let body = json!({"amount": 500, "currency": "EUR", "reference": "renewal-1", "card": "fp_1"});
    let r = charge(&c, &sim, "renewal-1", body.clone()).await;
    assert_eq!(r.status(), StatusCode::PAYMENT_REQUIRED);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (
            &v["network"],
            &v["response_code"],
            &v["category"],
            &v["card"]
        ),
        (&json!("visa"), &json!("14"), &json!(1), &json!("fp_1"))
    );
    assert_eq!(
        sim.stats().reattempt_violations,
        0,
        "a first attempt is no reattempt"
    );
    // A reattempt of the same transaction (a new key, as redrive sends): a violation.
    let r = charge(&c, &sim, "renewal-1-r1", body).await;
    assert_eq!(r.status(), StatusCode::PAYMENT_REQUIRED);
    let s: Stats = c
        .get(format!("{}/_sim/stats", sim.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(s.declines_by_code.get("visa1"), Some(&2));
    assert_eq!((s.reattempts, s.reattempt_violations), (1, 1));
    assert_eq!(s.reattempt_violations_by_card.get("fp_1"), Some(&1));
    assert_eq!(s.charges, 0, "a decline charges nothing");
    sim.shutdown().await;
}
