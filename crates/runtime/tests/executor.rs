//! The executor against a real SQLite store: outcomes go through the policy's decision and
//! every attempt is stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::future::BoxFuture;
use redrive_policy::Outcome;
use redrive_runtime::{Attempted, Handler, JobContext, Noop, Worker};
use redrive_store::{JobState, NewJob, Store};
use serde_json::json;

/// Fails with a 503 `fail` times, then succeeds; counts calls.
#[derive(Debug, Default)]
struct Flaky {
    fail: u32,
    calls: AtomicU32,
    keys: std::sync::Mutex<Vec<Option<String>>>,
}

impl Handler for Flaky {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.keys.lock().unwrap().push(ctx.key.clone());
        let fail = self.fail;
        Box::pin(async move {
            if n < fail {
                Attempted {
                    http_status: Some(503),
                    ..Attempted::failure(
                        Outcome::Infrastructure { retry_after: None },
                        "503 from psp",
                    )
                }
            } else {
                Attempted::success(json!({"charge": "ch_1"}))
            }
        })
    }
}

#[derive(Debug)]
struct Fixed(Outcome);
impl Handler for Fixed {
    fn run(&self, _: JobContext) -> BoxFuture<'static, Attempted> {
        let o = self.0;
        Box::pin(async move { Attempted::failure(o, "declined") })
    }
}

#[derive(Debug)]
struct Panics;
impl Handler for Panics {
    fn run(&self, _: JobContext) -> BoxFuture<'static, Attempted> {
        Box::pin(async { panic!("boom") })
    }
}

async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display()))
        .await
        .unwrap();
    (s, dir)
}

#[tokio::test]
async fn transient_failures_are_retried_in_process_with_the_same_key() {
    let (s, _d) = store().await;
    let id = s
        .enqueue(
            &NewJob::new("q", "flaky", json!({})).key("order-1"),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id;
    let h = Arc::new(Flaky {
        fail: 2,
        ..Default::default()
    });
    let sum = Worker::builder(s.clone(), vec!["q".into()])
        .handler("flaky", h.clone())
        .seed(7)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((sum.succeeded, sum.attempts), (1, 3));
    let j = s.get(id).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(j.result, Some(json!({"charge": "ch_1"})));
    let a = s.attempts(id).await.unwrap();
    let seen: Vec<_> = a
        .iter()
        .map(|a| (a.class.as_str(), a.mode.map(|m| m.as_str()), a.http_status))
        .collect();
    assert_eq!(
        seen,
        [
            ("infrastructure", Some("retry"), Some(503)),
            ("infrastructure", Some("retry"), Some(503)),
            ("success", None, None)
        ]
    );
    assert!(
        a[0].delay.unwrap() <= std::time::Duration::from_millis(200),
        "payment: full jitter under 200 ms first"
    );
    assert_eq!(
        *h.keys.lock().unwrap(),
        [
            Some("order-1".to_owned()),
            Some("order-1".to_owned()),
            Some("order-1".to_owned())
        ],
        "one key on every attempt"
    );
}

#[tokio::test]
async fn permanent_goes_dead_at_once_and_an_unknown_kind_is_left_alone() {
    let (s, _d) = store().await;
    let a = s
        .enqueue(&NewJob::new("q", "decline", json!({})), chrono::Utc::now())
        .await
        .unwrap()
        .job
        .id;
    let b = s
        .enqueue(&NewJob::new("q", "nobody", json!({})), chrono::Utc::now())
        .await
        .unwrap()
        .job
        .id;
    let worker = Worker::builder(s.clone(), vec!["q".into()])
        .handler("decline", Arc::new(Fixed(Outcome::Permanent)))
        .build()
        .unwrap();
    assert_eq!(worker.kinds(), redrive_store::Kinds::only(["decline"]));
    let sum = worker.run_until_idle().await.unwrap();
    assert_eq!((sum.dead, sum.attempts), (1, 1));
    let j = s.get(a).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.dead_reason.map(|r| r.as_str())),
        (JobState::Dead, Some("permanent"))
    );
    // A kind this worker has no handler for is not claimed: no lease, no attempt.
    let j = s.get(b).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.lease_token, j.lease_owner),
        (JobState::Available, 0, 0, None)
    );
    assert!(s.attempts(b).await.unwrap().is_empty());
    // The run registered the worker and removed it when it ended.
    assert!(s.workers(chrono::Utc::now()).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_panic_is_an_exception_and_the_worker_survives() {
    let (s, _d) = store().await;
    let id = s
        .enqueue(
            &NewJob::new("q", "panics", json!({}))
                .policy("classic")
                .max_attempts(5),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id;
    s.enqueue(&NewJob::new("q", "noop", json!({})), chrono::Utc::now())
        .await
        .unwrap();
    let sum = Worker::builder(s.clone(), vec!["q".into()])
        .handler("panics", Arc::new(Panics))
        .handler("noop", Arc::new(Noop))
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(sum.succeeded, 1);
    let j = s.get(id).await.unwrap().unwrap();
    let a = s.attempts(id).await.unwrap();
    assert_eq!(a[0].class.as_str(), "exception");
    assert!(a[0].error.as_deref().unwrap().contains("boom"));
    assert!(j.exceptions >= 1);
    // classic: 1s first delay (> in-process max? no: retried in process) … ends dead or deferred, never lost.
    assert!(
        matches!(j.state, JobState::Dead | JobState::Deferred),
        "{:?}",
        j.state
    );
}

/// Records when each job started.
#[derive(Debug, Default)]
struct Started(std::sync::Mutex<Vec<(i64, chrono::DateTime<chrono::Utc>)>>);
impl Handler for Started {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        self.0
            .lock()
            .unwrap()
            .push((ctx.job_id, chrono::Utc::now()));
        Box::pin(async { Attempted::success(json!(null)) })
    }
}

#[tokio::test]
async fn an_idle_worker_starts_a_scheduled_job_at_its_run_at_not_at_the_next_poll() {
    let (s, _d) = store().await;
    let h = Arc::new(Started::default());
    let worker = Worker::builder(s.clone(), vec!["q".into()])
        .handler("stamp", h.clone())
        .poll_interval(std::time::Duration::from_secs(60))
        .gauge_interval(None)
        .build()
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // The worker first sleeps towards a job due in 30 s, then a job due sooner arrives.
    let now = chrono::Utc::now();
    let later = s
        .enqueue(
            &NewJob::new("q", "stamp", json!({})).run_at(now + chrono::Duration::seconds(30)),
            now,
        )
        .await
        .unwrap()
        .job
        .id;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let now = chrono::Utc::now();
    let due = now + chrono::Duration::milliseconds(300);
    let soon = s
        .enqueue(&NewJob::new("q", "stamp", json!({})).run_at(due), now)
        .await
        .unwrap()
        .job
        .id;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while h.0.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the job due in 300 ms did not start within 20 s (poll interval 60 s)"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let started = h.0.lock().unwrap().clone();
    assert_eq!(
        started.len(),
        1,
        "only the job that was due ran: {started:?}"
    );
    assert_eq!(started[0].0, soon);
    // Stored times have millisecond precision.
    assert!(
        started[0].1 >= due - chrono::Duration::milliseconds(1),
        "started {} before its run_at {due}",
        started[0].1
    );
    assert_eq!(
        s.get(later).await.unwrap().unwrap().state,
        JobState::Scheduled
    );
}

/// Polls until `f` holds (the worker beats on its own schedule).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..1000 {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

#[tokio::test]
async fn a_running_worker_is_registered_comes_back_after_deletion_and_leaves_on_stop() {
    let (s, _d) = store().await;
    let worker = Worker::builder(s.clone(), vec!["payments".into(), "refunds".into()])
        .handler("noop", Arc::new(Noop))
        .handler("charge", Arc::new(Noop))
        .name("reg-test")
        .concurrency(3)
        .registry_heartbeat(std::time::Duration::from_millis(20))
        .build()
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let (w, stop) = (worker.clone(), stop.clone());
        async move { w.run(stop).await }
    });
    let live = || async { s.workers(chrono::Utc::now()).await.unwrap() };
    eventually("registered", || async { !live().await.is_empty() }).await;
    let w = live().await.remove(0);
    assert_eq!(w.name, "reg-test");
    assert_eq!(w.pid, std::process::id());
    assert_eq!(w.queues, ["payments", "refunds"]);
    assert_eq!(w.kinds, redrive_store::Kinds::only(["charge", "noop"]));
    assert_eq!(w.concurrency, 3);
    assert!(!w.host.is_empty());
    // Its row deleted (as if it had been found stale): the next beat registers it again.
    assert!(s.unregister_worker("reg-test").await.unwrap());
    eventually("registered again", || async { !live().await.is_empty() }).await;
    // A clean stop removes it.
    stop.cancel();
    run.await.unwrap().unwrap();
    assert!(live().await.is_empty());
}

/// Issue 41 item 6: a dependency whose breaker row cannot be read (here corrupt: a state no
/// version wrote). By default the worker fails open and calls; with `fail_closed` it defers
/// the job (reason `breaker_unreadable`, not an attempt) and makes no call.
#[tokio::test]
async fn an_unreadable_breaker_row_is_called_by_default_and_deferred_when_failing_closed() {
    for closed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("q.db").display());
        let s = Store::connect(&url).await.unwrap();
        let id = s
            .enqueue(
                &NewJob::new("q", "flaky", json!({})).dependency("psp.example"),
                chrono::Utc::now(),
            )
            .await
            .unwrap()
            .job
            .id;
        let raw = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query(
            "INSERT INTO redrive_dependencies (name, state, updated_at) \
             VALUES ('psp.example', 'sideways', 0)",
        )
        .execute(&raw)
        .await
        .unwrap();
        raw.close().await;
        assert!(
            s.dependency("psp.example").await.is_err(),
            "the row is unreadable"
        );
        let h = Arc::new(Flaky::default());
        let defer = std::time::Duration::from_secs(60);
        let sum = Worker::builder(s.clone(), vec!["q".into()])
            .handler("flaky", h.clone())
            .fail_closed(closed.then_some(defer))
            .build()
            .unwrap()
            .run_until_idle()
            .await
            .unwrap();
        let j = s.get(id).await.unwrap().unwrap();
        if closed {
            assert_eq!(h.calls.load(Ordering::SeqCst), 0, "no call it cannot see");
            assert_eq!((sum.deferred, sum.attempts), (1, 0));
            assert_eq!(j.state, JobState::Deferred);
            assert_eq!(
                j.defer_reason,
                Some(redrive_policy::DeferReason::BreakerUnreadable)
            );
            assert!(
                j.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("breaker of psp.example unreadable")),
                "{:?}",
                j.last_error
            );
            assert!(s.attempts(id).await.unwrap().is_empty());
        } else {
            assert_eq!(h.calls.load(Ordering::SeqCst), 1, "fail open: called");
            assert_eq!(j.state, JobState::Succeeded);
        }
    }
}

/// Issue 41 item 2, in the runtime: a category 1 decline stops the card key; with the
/// policy's `declines.card_stop = "wait"` the key's next job is not called but deferred to the
/// stop's end (reason `card_stopped`, naming the decline), and a lift makes it due at once.
#[tokio::test]
async fn a_stopped_card_waits_under_a_wait_policy_and_a_lift_makes_it_due() {
    let (s, _d) = store().await;
    let now = chrono::Utc::now();
    let mut ids = Vec::new();
    for i in 0..2 {
        let j = NewJob::new("q", "charge", json!({}))
            .key(format!("renewal-{i}"))
            .quota_key("fp_wait");
        ids.push(s.enqueue(&j, now).await.unwrap().job.id);
    }
    let advice = redrive_policy::DeclineAdvice::visa("14", None).unwrap();
    let h = Arc::new(Fixed(Outcome::Declined(advice)));
    let wait = redrive_policy::RetryPolicy::payment()
        .into_builder()
        .with_card_stop(redrive_policy::CardStopAction::Wait)
        .build()
        .unwrap();
    let sum = Worker::builder(s.clone(), vec!["q".into()])
        .handler("charge", h)
        .kind_policy("charge", wait)
        .concurrency(1)
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((sum.attempts, sum.dead, sum.deferred), (1, 1, 1), "{sum:?}");
    let first = s.get(ids[0]).await.unwrap().unwrap();
    assert_eq!(
        first.dead_reason,
        Some(redrive_policy::DeadReason::DoNotRetry)
    );
    let stop = s.card_stop("fp_wait", now).await.unwrap().expect("stopped");
    assert_eq!(stop.job_id, ids[0]);
    assert!(stop.until >= now + chrono::Duration::days(29), "{stop:?}");
    let second = s.get(ids[1]).await.unwrap().unwrap();
    assert_eq!(second.state, JobState::Deferred);
    assert_eq!(
        second.defer_reason,
        Some(redrive_policy::DeferReason::CardStopped)
    );
    assert_eq!(second.run_at, stop.until);
    assert!(s.attempts(ids[1]).await.unwrap().is_empty(), "never called");
    let why = second.last_error.unwrap_or_default();
    assert!(
        why.contains(&format!("job {} declined visa 14 cat 1", ids[0])),
        "{why}"
    );
    let later = chrono::Utc::now();
    s.lift_card_stop("fp_wait", &redrive_store::Actor::new("alice", "cli"), later)
        .await
        .unwrap()
        .expect("lifted");
    assert!(s.get(ids[1]).await.unwrap().unwrap().run_at <= later + chrono::Duration::seconds(1));
}
