//! SQLite file safety (issue 36, item 3): the database, its write-ahead log and its
//! shared-memory index are one identity. A log deleted under a running process takes every
//! commit not yet checkpointed with it, so once any of the three is gone or replaced the store
//! acknowledges no enqueue and hands out no job.

use std::time::Duration;

use redrive_store::{ClaimParams, Kinds, NewJob, Store, StoreError, Timestamp, from_millis};
use serde_json::json;

const T0: i64 = 1_800_000_000_000;

fn now() -> Timestamp {
    from_millis(T0)
}

fn job() -> NewJob {
    NewJob::new("q", "noop", json!({"n": 1}))
}

fn claim() -> ClaimParams {
    ClaimParams {
        queues: vec!["q".into()],
        kinds: Kinds::Any,
        worker: "w".into(),
        limit: 10,
        lease: Duration::from_secs(30),
        now: now(),
    }
}

async fn open() -> (tempfile::TempDir, std::path::PathBuf, Store) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let store = Store::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    (dir, path, store)
}

fn companion(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// `rm q.db-wal` while serving: the next enqueues were acknowledged and lost at the restart.
#[tokio::test]
async fn a_deleted_write_ahead_log_refuses_enqueues_and_claims() {
    let (_dir, path, store) = open().await;
    store.enqueue(&job(), now()).await.unwrap();
    std::fs::remove_file(companion(&path, "-wal")).unwrap();
    let e = store.enqueue(&job(), now()).await.unwrap_err();
    assert!(matches!(e, StoreError::FileChanged { .. }), "{e}");
    assert!(e.to_string().contains("q.db-wal was deleted"), "{e}");
    let e = store.enqueue_many(&[job()], now()).await.unwrap_err();
    assert!(matches!(e, StoreError::FileChanged { .. }), "{e}");
    let e = store.claim(&claim()).await.unwrap_err();
    assert!(matches!(e, StoreError::FileChanged { .. }), "{e}");
    assert!(store.check_writable("t", now()).await.is_err());
}

#[tokio::test]
async fn a_deleted_shared_memory_index_is_a_broken_identity() {
    let (_dir, path, store) = open().await;
    std::fs::remove_file(companion(&path, "-shm")).unwrap();
    let e = store.check_file().unwrap_err();
    assert!(e.to_string().contains("q.db-shm was deleted"), "{e}");
}

#[cfg(unix)]
#[tokio::test]
async fn a_replaced_write_ahead_log_is_a_broken_identity() {
    let (dir, path, store) = open().await;
    let other = dir.path().join("other");
    std::fs::write(&other, b"").unwrap();
    std::fs::rename(&other, companion(&path, "-wal")).unwrap();
    let e = store.enqueue(&job(), now()).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("another file was put in the place of"),
        "{e}"
    );
}

/// The workers went on claiming from a deleted database and called the PSP three times.
#[tokio::test]
async fn a_deleted_database_hands_out_no_job() {
    let (_dir, path, store) = open().await;
    store.enqueue(&job(), now()).await.unwrap();
    std::fs::remove_file(&path).unwrap();
    let e = store.claim(&claim()).await.unwrap_err();
    assert!(e.to_string().contains("it was deleted"), "{e}");
}

/// Other processes (here: other stores) opening and closing the same file must not look like
/// a replaced log: the store's own connection keeps the log and the index in place.
#[tokio::test]
async fn other_connections_coming_and_going_keep_the_identity() {
    let (_dir, path, store) = open().await;
    for _ in 0..3 {
        let other = Store::connect(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        other.enqueue(&job(), now()).await.unwrap();
        drop(other);
    }
    store.enqueue(&job(), now()).await.unwrap();
    assert_eq!(store.claim(&claim()).await.unwrap().len(), 4);
    store.check_file().unwrap();
}

/// A shared-memory index made read-only: SIGBUS within a second, with no log line. The check
/// (run by every enqueue, claim and `/readyz`) names the file first. It reads the file's mode
/// only: opening the index to try a write would drop SQLite's POSIX locks on it (a regression
/// that crashed processes sharing the file with SIGBUS, caught by the CLI's operator tests).
#[cfg(unix)]
#[tokio::test]
async fn an_unwritable_shared_memory_index_is_named() {
    let (_dir, path, store) = open().await;
    let shm = companion(&path, "-shm");
    let mut perms = std::fs::metadata(&shm).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&shm, perms).unwrap();
    let e = store.check_file().unwrap_err();
    assert!(e.to_string().contains("q.db-shm cannot be written"), "{e}");
}
