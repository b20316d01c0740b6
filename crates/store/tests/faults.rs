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
}
