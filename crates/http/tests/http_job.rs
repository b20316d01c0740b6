//! The `http` job kind end to end: real HTTP to the PSP simulator, jobs in an SQLite store,
//! the runtime's executor in between.

use std::sync::Arc;
use std::time::Duration;

use redrive_http::{HttpJob, redact_payload};
use redrive_psp_sim::{Faults, PspSim};
use redrive_runtime::Worker;
use redrive_store::{JobState, ListParams, NewJob, Store};
use serde_json::json;

/// The `http` kind allowed to call the simulator on 127.0.0.1 (the default refuses loopback).
fn local_http() -> HttpJob {
    HttpJob::with_egress(
        redrive_policy::StatusTable::default(),
        redrive_http::EgressPolicy::loopback_only(),
    )
    .unwrap()
}

async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display()))
        .await
        .unwrap();
    (s, dir)
}

fn charge(url: &str, amount: u64, key: &str) -> NewJob {
    NewJob::new(
        "payments",
        "http",
        json!({"method": "POST", "url": format!("{url}/v1/charges"),
               "headers": {"Authorization": "Bearer sk_live_secret"},
               "body": {"amount": amount, "currency": "EUR"}, "timeout_ms": 2000}),
    )
    .key(key)
}

/// 60 charges through 30% 5xx and 10% answers lost after the charge, at a PSP whose ledger
/// refuses nothing itself (its own dedupe off): with `layer`, the simulator's idempotency
/// layer in front of it. Returns the simulator's stats, the jobs that succeeded and the store.
async fn bad_day(layer: bool) -> (redrive_psp_sim::Stats, u64, Store, tempfile::TempDir) {
    let mut sim = PspSim::builder()
        .faults(Faults {
            error_rate: 0.3,
            timeout_after_commit: 0.1,
            timeout_delay: Duration::from_secs(5),
            seed: Some(3),
            ..Faults::none()
        })
        .ledger_dedupe(false);
    if layer {
        sim = sim.with_idempotency_layer();
    }
    let sim = sim.start("127.0.0.1:0").await.unwrap();
    let (s, d) = store().await;
    let jobs: Vec<NewJob> = (0..60)
        .map(|i| charge(&sim.url(), 100 + i, &format!("order-{i}")))
        .collect();
    s.enqueue_many(&jobs, chrono::Utc::now()).await.unwrap();
    let worker = Worker::builder(s.clone(), vec!["payments".into()])
        .handler("http", Arc::new(local_http()))
        .concurrency(16)
        .seed(1)
        .build()
        .unwrap();
    // Deferred jobs come back when due: run until every job is finished (at most 60 s).
    let mut succeeded = 0;
    for _ in 0..60 {
        succeeded += worker.run_until_idle().await.unwrap().succeeded;
        if succeeded == 60 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let stats = sim.stats();
    sim.shutdown().await;
    (stats, succeeded, s, d)
}

/// One charge per key, read from the ledger's effects per key (its own dedupe is off).
fn one_charge_per_key(stats: &redrive_psp_sim::Stats, jobs: u64) -> Result<(), String> {
    if stats.ledger_dedupe {
        return Err("the ledger's own dedupe was on: a double charge could not show".into());
    }
    if stats.charges != jobs || stats.duplicate_effects != 0 || stats.effects_max_per_key != 1 {
        return Err(format!(
            "{} charges for {jobs} jobs, {} duplicate, up to {} for one key",
            stats.charges, stats.duplicate_effects, stats.effects_max_per_key
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_survive_5xx_and_timeouts_after_commit_with_one_effect_each() {
    let (stats, succeeded, s, _d) = bad_day(true).await;
    let counts = s.counts().await.unwrap();
    assert_eq!(succeeded, 60, "{counts:?}");
    assert_eq!(one_charge_per_key(&stats, 60), Ok(()), "{stats:?}");
    assert_eq!(
        stats.executions_max_per_key, 1,
        "the layer ran each charge once"
    );
    assert!(
        stats.layer_replays > 0,
        "lost answers were replayed: {stats:?}"
    );
    assert!(
        stats.requests_total > 60,
        "faults forced retries: {}",
        stats.requests_total
    );
    let page = s
        .list(&ListParams {
            state: Some(JobState::Succeeded),
            limit: Some(100),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), 60);
    let j = &page.jobs[0];
    assert_eq!(j.result.as_ref().unwrap()["status"], 201);
    let attempts = s.attempts(j.id).await.unwrap();
    assert_eq!(attempts.last().unwrap().http_status, Some(201));
    // Classes seen across all jobs include the faults.
    let mut classes = std::collections::BTreeSet::new();
    for j in &page.jobs {
        for a in s.attempts(j.id).await.unwrap() {
            classes.insert(a.class.as_str().to_owned());
            assert!(
                !a.error.unwrap_or_default().contains("sk_live"),
                "no secret in attempts"
            );
        }
    }
    assert!(
        classes.contains("infrastructure") && classes.contains("timeout"),
        "{classes:?}"
    );
}

/// The negative control: the same run without the layer. The lost answers are retried with
/// the same key and the ledger charges again, so the check above reports double charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_check_catches_a_double_charge_without_the_layer() {
    let (stats, succeeded, _s, _d) = bad_day(false).await;
    assert_eq!(succeeded, 60);
    assert!(stats.injected.timeouts_after_commit > 0, "{stats:?}");
    let err = one_charge_per_key(&stats, 60).unwrap_err();
    assert!(
        stats.duplicate_effects > 0 && stats.effects_max_per_key >= 2,
        "{err}"
    );
    assert_eq!(stats.layer_replays, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decline_is_dead_at_once_and_a_refused_connection_is_infrastructure() {
    let sim = PspSim::builder().start("127.0.0.1:0").await.unwrap();
    let (s, _d) = store().await;
    // amount 0 → 422 from the PSP: permanent.
    let bad = s
        .enqueue(&charge(&sim.url(), 0, "bad"), chrono::Utc::now())
        .await
        .unwrap()
        .job
        .id;
    // Nothing listens on port 9 here: connection refused.
    let down = s
        .enqueue(
            &charge("http://127.0.0.1:9", 100, "down")
                .policy("background")
                .max_attempts(3),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id;
    // A malformed payload: permanent, naming the field.
    let junk = s
        .enqueue(
            &NewJob::new(
                "payments",
                "http",
                json!({"method": "POST", "url": "ftp://x"}),
            ),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id;
    Worker::builder(s.clone(), vec!["payments".into()])
        .handler("http", Arc::new(local_http()))
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    let j = s.get(bad).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.dead_reason.map(|r| r.as_str()), j.attempts),
        (JobState::Dead, Some("permanent"), 1)
    );
    let refused = &s.attempts(bad).await.unwrap()[0];
    assert_eq!(refused.http_status, Some(422));
    // What the PSP said is kept with the attempt (issue 37), the error line stays short.
    let answer = refused.response.as_deref().expect("the 422's body is kept");
    assert!(answer.contains("invalid amount"), "{answer}");
    assert!(!refused.error.as_deref().unwrap().contains("invalid amount"));
    let a = s.attempts(down).await.unwrap();
    assert!(!a.is_empty(), "the refused connection was attempted");
    assert!(
        a.iter().all(|a| a.response.is_none()),
        "no answer, none kept"
    );
    assert!(
        a.iter().all(|a| a.class.as_str() == "infrastructure"),
        "{a:?}"
    );
    let j = s.get(junk).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Dead);
    assert!(j.last_error.unwrap().contains("payload.url"));
    sim.shutdown().await;
}

#[test]
fn secrets_are_redacted_for_display() {
    let p = json!({"headers": {"Authorization": "Bearer x", "X-Api-Key": "k", "Accept": "json"}});
    let r = redact_payload(&p);
    assert_eq!(r["headers"]["Authorization"], "[redacted]");
    assert_eq!(r["headers"]["X-Api-Key"], "[redacted]");
    assert_eq!(r["headers"]["Accept"], "json");
}

/// Issue 37: a job's own `max_attempts` was stored and ignored (only the lease-expiry rescue
/// read it); the runtime ran the policy's 10 attempts and 5 defers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_job_max_attempts_of_3_makes_exactly_3_attempts_then_dead_letters() {
    let (s, _d) = store().await;
    // The payment policy allows 15 attempts (10, then 5 defers); nothing listens on port 9.
    let job = charge("http://127.0.0.1:9", 100, "m1").max_attempts(3);
    let id = s.enqueue(&job, chrono::Utc::now()).await.unwrap().job.id;
    let worker = Worker::builder(s.clone(), vec!["payments".into()])
        .handler("http", Arc::new(local_http()))
        .seed(5)
        .build()
        .unwrap();
    // Payment's first delays are slept in process (full jitter of 200 ms, 400 ms): one run.
    let summary = worker.run_until_idle().await.unwrap();
    let j = s.get(id).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.dead_reason.map(|r| r.as_str()), j.attempts),
        (JobState::Dead, Some("attempts_exhausted"), 3),
        "{summary:?}"
    );
    let a = s.attempts(id).await.unwrap();
    assert_eq!(a.len(), 3, "{a:?}");
    assert!(
        a.iter()
            .all(|a| a.class.as_str() == "infrastructure" && a.counted)
    );
    // Nothing is left for a later run.
    assert_eq!(worker.run_until_idle().await.unwrap().attempts, 0);
    assert_eq!(s.attempts(id).await.unwrap().len(), 3);
}
