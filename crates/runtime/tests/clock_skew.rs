//! Workers whose hosts' clocks disagree, on one store, each through its own connection (two
//! processes as far as the store can tell): synced to the database's clock they fire each
//! schedule tick exactly once, none early, and register their measured offsets.
//!
//! No assertion depends on how fast the machine is: a load that slows the test down can only
//! make a tick look later, never earlier, than the database's clock.

use std::sync::Arc;
use std::time::Duration;

use redrive_runtime::{Noop, Worker};
use redrive_store::{
    Clock, ListParams, Missed, NewJob, OffsetClock, ScheduleSpec, Store, SystemClock,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A worker that runs only the scheduler (and no kind of the ticks' queue), with its local
/// clock `skew` seconds off, synced or not.
fn worker(store: Store, name: &str, skew: i64, synced: bool) -> Worker {
    let local: Arc<dyn Clock> = Arc::new(OffsetClock::new(
        Arc::new(SystemClock),
        chrono::Duration::seconds(skew),
    ));
    Worker::builder(store, vec!["other".into()])
        .handler("noop", Arc::new(Noop))
        .name(name)
        .clock(local)
        .sync_clock(synced)
        .scheduler(Some(Duration::from_millis(50)))
        .registry_heartbeat(Duration::from_millis(100))
        .gauge_interval(None)
        .build()
        .unwrap()
}

/// Runs two workers, 3 s ahead and 3 s behind, over a schedule of every second for about
/// five ticks, watching the ticks' jobs as they appear. Returns the ticks (ms), by id; the
/// earliest any tick appeared relative to the database's clock (ms, positive: early); and
/// the workers' registered offsets.
async fn two_skewed_schedulers(synced: bool) -> (Vec<i64>, i64, Vec<Option<i64>>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let (a, b) = (
        Store::connect(&url).await.unwrap(),
        Store::connect(&url).await.unwrap(),
    );
    let spec = ScheduleSpec {
        name: "every-second".into(),
        cron: "* * * * * *".into(),
        missed: Missed::Skip,
        job: NewJob::new("ticks", "tick", json!({})),
    };
    a.upsert_schedule(&spec, "api", a.db_time().await.unwrap())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let runs: Vec<_> = [(a.clone(), "ahead", 3), (b, "behind", -3)]
        .into_iter()
        .map(|(s, name, skew)| {
            let w = worker(s, name, skew, synced);
            let stop = stop.clone();
            tokio::spawn(async move { w.run(stop).await })
        })
        .collect();
    let list = ListParams {
        queue: Some("ticks".into()),
        limit: Some(1000),
        ..ListParams::default()
    };
    let mut earliest = i64::MIN;
    let mut offsets = vec![];
    let end = a.db_time().await.unwrap() + chrono::Duration::seconds(5);
    loop {
        // The jobs first, then the time: each job seen existed at that time.
        let jobs = a.list(&list).await.unwrap().jobs;
        let now = a.db_time().await.unwrap();
        for j in &jobs {
            earliest = earliest.max((j.run_at - now).num_milliseconds());
        }
        if now >= end {
            offsets = a
                .workers(now)
                .await
                .unwrap()
                .into_iter()
                .map(|w| w.clock_offset_ms)
                .collect();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    let jobs = a.list(&list).await.unwrap().jobs;
    let ticks = jobs.iter().map(|j| j.run_at.timestamp_millis()).collect();
    (ticks, earliest, offsets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_with_skewed_clocks_fire_each_tick_once_and_none_early() {
    let (ticks, earliest, offsets) = two_skewed_schedulers(true).await;
    assert!(ticks.len() >= 4, "ticks {ticks:?}");
    // One job per tick, one tick per second, none skipped.
    for pair in ticks.windows(2) {
        assert_eq!(pair[1] - pair[0], 1_000, "ticks {ticks:?}");
    }
    // No tick was enqueued before its time by the database's clock (the margin is the
    // offset's error, half a round trip, and the scheduler's step).
    assert!(
        earliest <= 300,
        "a tick appeared {earliest} ms before its time; ticks {ticks:?}"
    );
    // Each worker measured its own skew: ahead (3 s) is −3,000 ms, behind +3,000 ms.
    let mut offsets: Vec<i64> = offsets.into_iter().map(Option::unwrap).collect();
    offsets.sort();
    assert_eq!(offsets.len(), 2);
    assert!(
        (offsets[0] + 3_000).abs() < 500 && (offsets[1] - 3_000).abs() < 500,
        "offsets {offsets:?}"
    );
}

/// The control: the same two workers unsynced. The one 3 s ahead fires every tick about 3 s
/// early, and their rows show no offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsynced_the_worker_ahead_fires_ticks_early() {
    let (ticks, earliest, offsets) = two_skewed_schedulers(false).await;
    assert!(!ticks.is_empty());
    assert!(
        earliest >= 2_000,
        "the earliest tick appeared only {earliest} ms early"
    );
    assert_eq!(offsets, [None, None]);
}
