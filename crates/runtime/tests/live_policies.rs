//! Policies replaced while a worker runs ([`LivePolicies`]): the next claim runs under the new
//! set, without a restart (issue 37: one source of truth, picked up by running workers).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redrive_policy::{Backoff, Outcome, PolicySet, RetryPolicy};
use redrive_runtime::{Attempted, Handler, JobContext, LivePolicies, Worker};
use redrive_store::{JobState, NewJob, Store};
use serde_json::json;

/// Always a 503.
#[derive(Debug)]
struct Down;

impl Handler for Down {
    fn run(&self, _: JobContext) -> BoxFuture<'static, Attempted> {
        Box::pin(async {
            Attempted {
                http_status: Some(503),
                ..Attempted::failure(Outcome::Infrastructure { retry_after: None }, "503")
            }
        })
    }
}

/// The built-in presets plus `checkout`: `attempts` tries, 1 ms apart, no defer phase.
fn set_with_checkout(attempts: u32) -> PolicySet {
    let mut set = PolicySet::builtin();
    set.insert(
        RetryPolicy::builder("checkout")
            .with_backoff(
                Backoff::exponential()
                    .with_base(Duration::from_millis(1))
                    .with_cap(Duration::from_millis(1))
                    .build()
                    .unwrap(),
            )
            .with_max_attempts(attempts)
            .build()
            .unwrap(),
    );
    set
}

#[tokio::test]
async fn a_replaced_policy_set_governs_the_next_claim_of_the_same_worker() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display()))
        .await
        .unwrap();
    let live = LivePolicies::new(set_with_checkout(2)).with_label("v1");
    let worker = Worker::builder(store.clone(), vec!["q".into()])
        .handler("down", Arc::new(Down))
        .live_policies(live.clone())
        .build()
        .unwrap();
    // Each job allows 10 attempts of its own: its policy's budget decides.
    let job = |key: &str| {
        NewJob::new("q", "down", json!({}))
            .key(key)
            .max_attempts(10)
            .policy("checkout")
    };
    let first = store
        .enqueue(&job("a"), chrono::Utc::now())
        .await
        .unwrap()
        .job
        .id;
    worker.run_until_idle().await.unwrap();
    let a = store.get(first).await.unwrap().unwrap();
    assert_eq!((a.state, a.attempts), (JobState::Dead, 2));

    live.replace(set_with_checkout(4), Some("v2".into()));
    assert_eq!(live.label().as_deref(), Some("v2"));
    let second = store
        .enqueue(&job("b"), chrono::Utc::now())
        .await
        .unwrap()
        .job
        .id;
    worker.run_until_idle().await.unwrap();
    let b = store.get(second).await.unwrap().unwrap();
    assert_eq!(
        (b.state, b.attempts),
        (JobState::Dead, 4),
        "the worker still ran the first set"
    );
}
