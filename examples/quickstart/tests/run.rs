//! Runs the README's library snippet (the `quickstart` binary) against a temporary SQLite
//! file: the charge is enqueued with its order and run; a second run, whose order insert
//! fails, enqueues nothing (the job is in the order's transaction).

use std::process::Command;

use redrive_runtime::testing::{JobMatch, TestStore};
use redrive_store::JobState;

fn run(url: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .arg(url)
        .output()
        .expect("the quickstart binary runs")
}

#[tokio::test]
async fn the_readme_snippet_charges_once_and_rolls_back_with_its_order() {
    let t = TestStore::new().await.unwrap();
    let first = run(t.url());
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        stdout.contains("charged 1000 EUR for order-42\n"),
        "{stdout}"
    );
    assert!(stdout.contains("1 succeeded, 0 dead\n"), "{stdout}");

    // The order exists now: the second run's insert fails, and its transaction (with the
    // enqueue) rolls back. The enqueue alone would have returned the existing job.
    let second = run(t.url());
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("UNIQUE constraint failed: orders.id"),
        "{stderr}"
    );

    let job = t.assert_enqueued(&JobMatch::new()).await; // the one job in the store
    assert_eq!(
        (job.queue.as_str(), job.kind.as_str()),
        ("payments", "charge")
    );
    assert_eq!(job.key.as_deref(), Some("order-42"));
    assert_eq!((job.state, job.attempts), (JobState::Succeeded, 1));
    assert_eq!(
        job.payload,
        serde_json::json!({"amount": 1000, "currency": "EUR"})
    );
}
