//! Store faults on SQLite: writes that fail on a failing disk must fail only while it fails.
//!
//! The fault ([`redrive_testkit::DiskFault`]) is process-wide, so this file holds one test.

use chrono::Utc;
use redrive_store::*;
use serde_json::json;

/// A disk that stops taking writes fails the enqueues made meanwhile; once it takes writes
/// again, so does the store. Before the fix the failed commit left the single writer
/// connection counted as inside a transaction, and every later write failed with "attempted to
/// call begin_with at non-zero transaction depth" until the process restarted.
#[tokio::test]
async fn a_failing_disk_fails_writes_only_while_it_fails() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let store = Store::connect(&url).await.unwrap();
    let now = Utc::now();
    store
        .enqueue(&NewJob::new("q", "noop", json!({})), now)
        .await
        .unwrap();
    store.check_writable("t", now).await.unwrap();
    let fault = redrive_testkit::DiskFault::engage();
    // Reads still answer: a read-only readiness check would call this store ready.
    store.get(1).await.unwrap();
    let e = store.check_writable("t", now).await.unwrap_err();
    eprintln!("write check while the disk fails: {e}");
    for i in 0..3 {
        let e = store
            .enqueue_many(
                &[NewJob::new("q", "noop", json!({})).key(format!("f{i}"))],
                now,
            )
            .await
            .unwrap_err();
        eprintln!("while the disk fails: {e}");
    }
    fault.lift();
    store.check_writable("t", now).await.unwrap();
    for i in 0..3 {
        let r = store
            .enqueue_many(
                &[NewJob::new("q", "noop", json!({})).key(format!("a{i}"))],
                now,
            )
            .await;
        assert!(r.is_ok(), "after the disk recovered: {:?}", r.err());
    }
    let page = store.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        page.jobs.len(),
        4,
        "the first job and the three after the fault"
    );
    // Claims and fenced completions (transactions too) work again.
    let jobs = store
        .claim(&ClaimParams {
            queues: vec!["q".into()],
            kinds: Kinds::Any,
            worker: "w".into(),
            limit: 10,
            lease: std::time::Duration::from_secs(30),
            now,
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 4);

    // Issue 41 item 6: a decline is written with its attempt's completion, so a failing disk
    // loses both or neither; never the attempt without its decline (a later claim would then
    // decide a reattempt on a missing record).
    let j = &jobs[0];
    let decline = NewDecline {
        job_id: j.id,
        attempt: 1,
        quota_key: Some("fp_f".into()),
        advice: redrive_policy::DeclineAdvice::visa("14", None).unwrap(),
        at: now,
        stop_for: Some(std::time::Duration::from_secs(30 * 86_400)),
    };
    let completion = Completion::new(
        j.lease(),
        Some(NewAttempt {
            worker: Some("w".into()),
            started_at: now,
            duration: std::time::Duration::from_millis(3),
            class: redrive_policy::FailureClass::Declined,
            http_status: Some(402),
            error: Some("declined".into()),
            counted: true,
            response: None,
        }),
        redrive_policy::JobCounters {
            attempts: 1,
            first_attempt_at: Some(now),
            ..j.counters()
        },
        Transition::Dead {
            reason: redrive_policy::DeadReason::DoNotRetry,
        },
        now,
    )
    .with_decline(decline);
    let fault = redrive_testkit::DiskFault::engage();
    let e = store.complete(&completion).await.unwrap_err();
    eprintln!("a declined attempt's completion while the disk fails: {e}");
    fault.lift();
    assert!(
        store.attempts(j.id).await.unwrap().is_empty(),
        "neither the attempt"
    );
    assert!(
        store.declines(j.id).await.unwrap().is_empty(),
        "nor its decline"
    );
    assert_eq!(store.card_stop("fp_f", now).await.unwrap(), None);
    // Written again (the worker retries its completion while it holds the lease): both.
    store.complete(&completion).await.unwrap();
    assert_eq!(store.attempts(j.id).await.unwrap().len(), 1);
    assert_eq!(store.declines(j.id).await.unwrap().len(), 1);
    assert_eq!(
        store
            .card_stop("fp_f", now)
            .await
            .unwrap()
            .map(|s| s.job_id),
        Some(j.id)
    );
}
