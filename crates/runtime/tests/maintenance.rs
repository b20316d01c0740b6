//! The worker's housekeeping through the real worker on a real SQLite store, with a manual
//! clock: its scheduler fires the store's schedules and its jobs run; its pruner takes the
//! fleet's lease and deletes only finished jobs older than their state's age.
//!
//! No assertion depends on how fast the machine is: each test waits (up to a generous bound)
//! for the state it expects, and then checks it exactly.

use std::sync::Arc;
use std::time::Duration;

use redrive_runtime::{Noop, Retention, Worker};
use redrive_store::{
    ClaimParams, ListParams, ManualClock, Missed, NewJob, PRUNER_LEASE, ScheduleSpec, Store,
    from_millis, tick_key,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const T0: i64 = 1_800_000_000_000;
const DAY: i64 = 86_400_000;

async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    (Store::connect(&url).await.unwrap(), dir)
}

/// Polls `f` every 20 ms until it is true, at most 30 s.
async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..1500 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_fires_missed_ticks_by_the_rule_and_the_jobs_run() {
    let (store, _dir) = store().await;
    // Created 30 s before the clock's now: a schedule every 10 s with `all` has three
    // ticks due (two missed, one on time), one with `skip` only the on-time one.
    for (name, missed) in [("all", Missed::All), ("skip", Missed::Skip)] {
        let spec = ScheduleSpec {
            name: name.into(),
            cron: "*/10 * * * * *".into(),
            missed,
            job: NewJob::new(name, "noop", json!({})),
        };
        store
            .upsert_schedule(&spec, "api", from_millis(T0 - 30_000))
            .await
            .unwrap();
    }
    let clock = Arc::new(ManualClock::at_millis(T0 + 5_000));
    let stop = CancellationToken::new();
    let worker = Worker::builder(store.clone(), vec!["all".into(), "skip".into()])
        .handler("noop", Arc::new(Noop))
        .clock(clock.clone())
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    let succeeded = |q: &'static str| {
        let s = store.clone();
        async move {
            s.list(&ListParams {
                queue: Some(q.into()),
                limit: Some(100),
                ..Default::default()
            })
            .await
            .unwrap()
            .jobs
            .into_iter()
            .filter(|j| j.state == redrive_store::JobState::Succeeded)
            .filter_map(|j| j.key)
            .collect::<Vec<_>>()
        }
    };
    until("the ticks' jobs to run", || async {
        succeeded("all").await.len() == 3 && succeeded("skip").await.len() == 1
    })
    .await;
    let mut all = succeeded("all").await;
    all.sort();
    let want: Vec<String> = [-20_000, -10_000, 0]
        .iter()
        .map(|d| tick_key("all", from_millis(T0 + d)))
        .collect();
    assert_eq!(all, want);
    assert_eq!(succeeded("skip").await, [tick_key("skip", from_millis(T0))]);
    // The clock moves to the next tick: one more job each.
    clock.set(from_millis(T0 + 10_000));
    until("the next tick's jobs", || async {
        succeeded("all").await.len() == 4 && succeeded("skip").await.len() == 2
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pruner_takes_the_lease_and_deletes_only_what_is_old_enough() {
    let (store, _dir) = store().await;
    // Six jobs succeed at T0 and two at T0 + 6 days; one stays available.
    let done = |at: i64, n: usize, q: &'static str| {
        let s = store.clone();
        async move {
            for _ in 0..n {
                s.enqueue(&NewJob::new(q, "noop", json!({})), from_millis(at))
                    .await
                    .unwrap();
            }
            let jobs = s
                .claim(&ClaimParams {
                    queues: vec![q.into()],
                    worker: "w".into(),
                    limit: 100,
                    lease: Duration::from_secs(30),
                    now: from_millis(at),
                    kinds: redrive_store::Kinds::Any,
                })
                .await
                .unwrap();
            for j in jobs {
                s.complete(&redrive_store::Completion {
                    lease: j.lease(),
                    attempt: None,
                    counters: j.counters(),
                    transition: redrive_store::Transition::Succeeded {
                        result: json!(null),
                    },
                    error: None,
                    now: from_millis(at),
                    decline: None,
                })
                .await
                .unwrap();
            }
        }
    };
    done(T0, 6, "old").await;
    done(T0 + 6 * DAY, 2, "young").await;
    let waiting = store
        .enqueue(
            &NewJob::new("idle", "noop", json!({})).run_at(from_millis(T0 + 100 * DAY)),
            from_millis(T0),
        )
        .await
        .unwrap()
        .job
        .id;
    // Another process holds the lease for a while: this worker's pruner waits for it.
    let clock = Arc::new(ManualClock::at_millis(T0 + 8 * DAY));
    assert!(
        store
            .acquire_lease(
                PRUNER_LEASE,
                "other",
                Duration::from_secs(60),
                clock_now(&clock)
            )
            .await
            .unwrap()
    );
    let stop = CancellationToken::new();
    let worker = Worker::builder(store.clone(), vec!["idle".into()])
        .handler("noop", Arc::new(Noop))
        .clock(clock.clone())
        .name("pruner-test")
        .retention(Some(Retention {
            every: Duration::from_millis(20),
            batch: 4,
            ..Retention::default()
        }))
        .build()
        .unwrap();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    let count = |q: &'static str| {
        let s = store.clone();
        async move {
            s.list(&ListParams {
                queue: Some(q.into()),
                limit: Some(100),
                ..Default::default()
            })
            .await
            .unwrap()
            .jobs
            .len()
        }
    };
    // While the other holds the lease nothing goes (the pruner has tried many rounds by
    // the time the worker has looked for work a few times).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count("old").await, 6, "the lease is another's");
    // The other's lease runs out: this worker's pruner takes it and prunes.
    clock.set(from_millis(T0 + 8 * DAY + 61_000));
    until("the old jobs to go", || async { count("old").await == 0 }).await;
    let holder = store
        .lease_holder(PRUNER_LEASE, clock_now(&clock))
        .await
        .unwrap()
        .map(|h| h.0);
    assert_eq!(holder.as_deref(), Some("pruner-test"));
    assert_eq!(count("young").await, 2, "six days old: kept for seven");
    assert!(store.get(waiting).await.unwrap().is_some());
    stop.cancel();
    run.await.unwrap().unwrap();
    // A stopped pruner gives the lease back.
    until("the lease to be released", || async {
        store
            .lease_holder(PRUNER_LEASE, clock_now(&clock))
            .await
            .unwrap()
            .is_none()
    })
    .await;
}

fn clock_now(c: &ManualClock) -> redrive_store::Timestamp {
    redrive_store::Clock::now(c)
}
