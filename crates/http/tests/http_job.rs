//! The `http` job kind end to end: real HTTP to the PSP simulator, jobs in an SQLite store,
//! the runtime's executor in between.

use std::sync::Arc;
use std::time::Duration;

use redrive_http::{HttpJob, redact_payload};
use redrive_psp_sim::{Faults, PspSim};
use redrive_runtime::Worker;
use redrive_store::{JobState, ListParams, NewJob, Store};
use serde_json::json;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_survive_5xx_and_timeouts_after_commit_with_one_effect_each() {
    let sim = PspSim::builder()
        .faults(Faults {
            error_rate: 0.3,
            timeout_after_commit: 0.1,
            timeout_delay: Duration::from_secs(5),
            seed: Some(3),
            ..Faults::none()
        })
        .with_idempotency_layer()
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let (s, _d) = store().await;
    let jobs: Vec<NewJob> = (0..60)
        .map(|i| charge(&sim.url(), 100 + i, &format!("order-{i}")))
        .collect();
    s.enqueue_many(&jobs, chrono::Utc::now()).await.unwrap();
    let worker = Worker::builder(s.clone(), vec!["payments".into()])
        .handler("http", Arc::new(HttpJob::default()))
        .concurrency(16)
        .seed(1)
        .build();
    // Deferred jobs come back when due: run until every job is finished (at most 60 s).
    let mut succeeded = 0;
    for _ in 0..60 {
        succeeded += worker.run_until_idle().await.unwrap().succeeded;
        if succeeded == 60 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let counts = s.counts().await.unwrap();
    assert_eq!(succeeded, 60, "{counts:?}");
    let stats = sim.stats();
    assert_eq!(stats.charges, 60, "one effect per job");
    assert_eq!(stats.duplicate_effects, 0);
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
    let j = &page.jobs[0];
    assert_eq!(j.result.as_ref().unwrap()["status"], 201);
    let attempts = s.attempts(j.id).await.unwrap();
    assert_eq!(attempts.last().unwrap().http_status, Some(201));
    // Classes seen across all jobs include the faults.
    let mut classes = std::collections::BTreeSet::new();
    for j in &page.jobs {
        for a in s.attempts(j.id).await.unwrap() {
            classes.insert(a.class);
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
    sim.shutdown().await;
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
        .handler("http", Arc::new(HttpJob::default()))
        .build()
        .run_until_idle()
        .await
        .unwrap();
    let j = s.get(bad).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.dead_reason.as_deref(), j.attempts),
        (JobState::Dead, Some("permanent"), 1)
    );
    assert_eq!(s.attempts(bad).await.unwrap()[0].http_status, Some(422));
    let a = s.attempts(down).await.unwrap();
    assert!(a.iter().all(|a| a.class == "infrastructure"), "{a:?}");
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
