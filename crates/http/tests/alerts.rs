//! The alerter against a real store (SQLite), with time passed in: breaker transitions and
//! queue ages make one alert job per event, however many alerters look and however often.

use chrono::{TimeZone, Utc};
use redrive_http::alerts::{Alerter, check_alert_rules, split_alerts_toml};
use redrive_policy::{BreakerState, PolicySet};
use redrive_store::{BreakerUpdate, JobState, ListParams, NewJob, Store};
use serde_json::json;

async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    (Store::connect(&url).await.unwrap(), dir)
}

fn alerters(text: &str, now: chrono::DateTime<Utc>, n: usize) -> Vec<Alerter> {
    let (rules, rest) = split_alerts_toml(text).unwrap();
    let set = PolicySet::from_toml(&rest).unwrap();
    check_alert_rules(&rules, &set).unwrap();
    (0..n)
        .map(|_| Alerter::new(rules.clone(), set.clone(), now))
        .collect()
}

async fn alert_jobs(s: &Store) -> Vec<redrive_store::Job> {
    s.list(&ListParams {
        queue: Some("alerts".into()),
        ..Default::default()
    })
    .await
    .unwrap()
    .jobs
}

#[tokio::test]
async fn breaker_transitions_alert_once_each_whoever_looks() {
    let (s, _d) = store().await;
    let t0 = Utc::now();
    let mut a = alerters(
        r#"
[[alerts]]
name = "ops"
url = "https://hooks.example/x"
on = ["breaker_open", "breaker_closed"]
dependencies = ["psp"]
"#,
        t0,
        2,
    );
    let set = |dep: &str, st: BreakerState| BreakerUpdate {
        dependency: dep.into(),
        expect: None,
        state: st,
        open_until: None,
        probe_permits: 0,
        reason: "failure rate 60% over 20 calls".into(),
        now: Utc::now(),
    };
    s.set_breaker(&set("psp", BreakerState::Open))
        .await
        .unwrap();
    s.set_breaker(&set("other", BreakerState::Open))
        .await
        .unwrap();
    assert_eq!(a[0].tick(&s, Utc::now()).await.unwrap(), 1);
    // The second alerter and a repeat find the same event: no second alert.
    assert_eq!(a[1].tick(&s, Utc::now()).await.unwrap(), 0);
    assert_eq!(a[0].tick(&s, Utc::now()).await.unwrap(), 0);
    s.set_breaker(&set("psp", BreakerState::HalfOpen))
        .await
        .unwrap();
    s.set_breaker(&set("psp", BreakerState::Closed))
        .await
        .unwrap();
    assert_eq!(
        a[1].tick(&s, Utc::now()).await.unwrap(),
        1,
        "closed; half-open is not an event"
    );
    assert_eq!(a[0].tick(&s, Utc::now()).await.unwrap(), 0);
    let jobs = alert_jobs(&s).await;
    assert_eq!(jobs.len(), 2);
    let open = &jobs[0].payload;
    assert_eq!(open["method"], "POST");
    assert_eq!(open["url"], "https://hooks.example/x");
    let body = &open["body"];
    assert_eq!(body["event"], "breaker_open");
    assert_eq!(body["breaker"]["dependency"], "psp");
    assert_eq!(body["breaker"]["from"], "closed");
    assert_eq!(body["breaker"]["to"], "open");
    assert_eq!(body["breaker"]["reason"], "failure rate 60% over 20 calls");
    assert_eq!(jobs[1].payload["body"]["event"], "breaker_closed");
    assert!(
        jobs[0]
            .key
            .as_deref()
            .unwrap()
            .starts_with("alert:ops:breaker:")
    );
    assert_eq!(jobs[0].state, JobState::Available);
}

#[tokio::test]
async fn a_queue_backlog_older_than_the_threshold_alerts_once_per_episode() {
    let (s, _d) = store().await;
    let t0 = Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, 0).unwrap();
    let mut a = alerters(
        r#"
[[alerts]]
name = "lag"
url = "https://hooks.example/lag"
on = ["queue_age"]
oldest_available = "5m"
"#,
        t0,
        2,
    );
    s.enqueue(&NewJob::new("payments", "noop", json!({})).run_at(t0), t0)
        .await
        .unwrap();
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    assert_eq!(
        a[0].tick(&s, at(299)).await.unwrap(),
        0,
        "not yet older than 5m"
    );
    assert_eq!(a[0].tick(&s, at(301)).await.unwrap(), 1);
    assert_eq!(a[0].tick(&s, at(400)).await.unwrap(), 0, "the same episode");
    assert_eq!(
        a[1].tick(&s, at(500)).await.unwrap(),
        0,
        "another process, the same key"
    );
    let jobs = alert_jobs(&s).await;
    assert_eq!(jobs.len(), 1);
    let q = &jobs[0].payload["body"]["queue"];
    assert_eq!(q["name"], "payments");
    assert_eq!(q["age_seconds"], 301);
    assert_eq!(q["threshold_seconds"], 300);
    // The alert queue itself is never watched (its job is 399 s old here).
    assert_eq!(a[0].tick(&s, at(700)).await.unwrap(), 0);
    assert_eq!(alert_jobs(&s).await.len(), 1);
    // A paused queue's backlog is intended: not reported.
    let op = redrive_store::Actor::new("t", "cli");
    s.pause_queue("payments", &op, at(0)).await.unwrap();
    assert!(
        s.oldest_due(at(600))
            .await
            .unwrap()
            .iter()
            .all(|(q, _)| q != "payments")
    );
    s.resume_queue("payments", &op, at(0)).await.unwrap();
}
