//! One conformance suite, run against both backends: every test below exists twice, as
//! `sqlite::NAME` and `postgres::NAME`. The PostgreSQL run uses `REDRIVE_TEST_POSTGRES_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`), one fresh schema per test. It skips
//! only when the server is unreachable (refused or timed out) and `CI` is not `true` or `1`;
//! any other connection or migration error fails (see `redrive-testkit`).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use redrive_policy::{
    BreakerMode, BreakerState, DeadReason, DeferReason, FailureClass, FlowRow, JobCounters,
    PauseReason,
};
use redrive_store::*;
use serde_json::json;

#[macro_use]
mod support;

use support::{Harness, sqlite};

async fn postgres() -> Option<Harness> {
    support::postgres("rdt", 16).await
}

fn ms(t: i64) -> Timestamp {
    from_millis(t)
}

const T0: i64 = 1_800_000_000_000;

fn job(queue: &str) -> NewJob {
    NewJob::new(queue, "noop", json!({"n": 1}))
}

fn claim_params(queue: &str, limit: u32, now: Timestamp) -> ClaimParams {
    ClaimParams {
        queues: vec![queue.into()],
        kinds: Kinds::Any,
        worker: "w".into(),
        limit,
        lease: Duration::from_secs(30),
        now,
    }
}

fn done(job: &Job, now: Timestamp) -> Completion {
    Completion {
        lease: job.lease(),
        attempt: Some(attempt(FailureClass::Success, now)),
        counters: JobCounters {
            attempts: job.attempts + 1,
            first_attempt_at: Some(now),
            ..job.counters()
        },
        transition: Transition::Succeeded {
            result: json!({"ok": true}),
        },
        error: None,
        now,
        decline: None,
    }
}

fn attempt(class: FailureClass, now: Timestamp) -> NewAttempt {
    NewAttempt {
        worker: Some("w".into()),
        started_at: now,
        duration: Duration::from_millis(5),
        class,
        http_status: None,
        error: None,
        counted: true,
        response: None,
    }
}

fn with(job: &Job, transition: Transition, now: Timestamp) -> Completion {
    Completion {
        lease: job.lease(),
        attempt: Some(attempt(FailureClass::Infrastructure, now)),
        counters: JobCounters {
            attempts: job.attempts + 1,
            first_attempt_at: Some(now),
            ..job.counters()
        },
        transition,
        error: Some("503 from psp".into()),
        now,
        decline: None,
    }
}

both_backends!(
    traceparent_is_stored_with_the_job,
    enqueue_dedupes_on_key,
    enqueued_job_is_the_stored_job,
    enqueue_many_exact_rolls_back_a_key_used_by_another_request,
    concurrent_enqueues_of_one_key_make_one_job,
    enqueue_in_callers_transaction,
    bad_input_is_refused_naming_the_field,
    claim_order_and_schedule,
    eight_claimers_ten_thousand_jobs_each_claimed_once,
    stale_token_cannot_write,
    expired_lease_is_rescued_exactly_once,
    rescue_out_of_attempts_dies_lease_expired,
    retry_in_process_and_defer_record_attempts,
    durations_in_json_are_whole_milliseconds,
    replay_and_purge,
    pagination_is_stable_under_concurrent_inserts,
    paused_or_open_dependency_is_not_claimed,
    half_open_probe_permits,
    dependency_row_compare_and_set,
    breaker_compare_and_set_and_events,
    cancel_revokes_a_running_lease,
    counts_next_due_and_prune,
    wake_up_on_enqueue,
    list_by_every_state_and_counts,
    large_mixed_batch_applies_each_item_alone,
    check_writable_commits_a_write,
    claim_takes_only_the_given_kinds,
    workers_register_beat_expire_and_flag_unhandled_kinds,
    list_by_key_across_queues,
    paused_queue_is_not_claimed_until_resumed,
    claim_of_several_queues_takes_the_first_in_order_across_them,
    operator_pause_of_a_dependency,
    forced_breakers_decide_claims,
    run_now_brings_jobs_forward_keeping_budgets,
    bulk_actions_by_filter_dry_run_and_audit,
    dead_since_and_oldest_due_for_alerts,
);

mod cases {
    use super::*;

    pub(super) async fn claim_takes_only_the_given_kinds(s: &Store) {
        let now = ms(T0);
        // The `charge` job is first in claim order (lowest priority value).
        let charge = s
            .enqueue(&NewJob::new("q", "charge", json!({})).priority(-5), now)
            .await
            .unwrap()
            .job;
        let http = s
            .enqueue(&NewJob::new("q", "http", json!({})), now)
            .await
            .unwrap()
            .job;
        let noop = s.enqueue(&job("q"), now).await.unwrap().job;
        let other = s
            .enqueue(&NewJob::new("q2", "charge", json!({})), now)
            .await
            .unwrap()
            .job;
        let only = |k: &[&str]| Kinds::only(k.iter().copied());
        let claim = |queues: &[&str], kinds: Kinds, worker: &str| ClaimParams {
            queues: queues.iter().map(|q| q.to_string()).collect(),
            kinds,
            worker: worker.into(),
            limit: 10,
            lease: Duration::from_secs(30),
            now,
        };
        // No kind: nothing, whatever is waiting.
        assert!(
            s.claim(&claim(&["q"], Kinds::Only(vec![]), "w"))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            s.next_due_for(&["q".into()], &Kinds::Only(vec![]))
                .await
                .unwrap(),
            None
        );
        // One queue (the single-queue statement) and two queues (the list statement).
        let got = s
            .claim(&claim(&["q"], only(&["http", "noop"]), "w1"))
            .await
            .unwrap();
        let ids: Vec<i64> = got.iter().map(|j| j.id).collect();
        assert_eq!(
            ids,
            [http.id, noop.id],
            "charge is first in order but not taken"
        );
        assert!(
            s.claim(&claim(
                &["q", "q2"],
                only(&["http", "noop", "refund"]),
                "w1"
            ))
            .await
            .unwrap()
            .is_empty()
        );
        // The charges are untouched: no lease, no attempt, no change.
        for id in [charge.id, other.id] {
            let j = s.get(id).await.unwrap().unwrap();
            assert_eq!(
                (j.state, j.attempts, j.lease_token, j.lease_owner.as_deref()),
                (JobState::Available, 0, 0, None)
            );
            assert!(s.attempts(id).await.unwrap().is_empty());
        }
        // What a worker of some kinds waits for.
        let qs: Vec<String> = vec!["q".into(), "q2".into()];
        assert_eq!(s.next_due_for(&qs, &only(&["http"])).await.unwrap(), None);
        assert_eq!(
            s.next_due_for(&qs, &only(&["charge"])).await.unwrap(),
            Some(now)
        );
        assert_eq!(s.next_due_for(&qs, &Kinds::Any).await.unwrap(), Some(now));
        assert_eq!(s.next_due(&qs).await.unwrap(), Some(now));
        // A worker that runs `charge` takes both, in claim order.
        let got = s
            .claim(&claim(&["q", "q2"], only(&["charge"]), "w2"))
            .await
            .unwrap();
        let ids: Vec<i64> = got.iter().map(|j| j.id).collect();
        assert_eq!(ids, [charge.id, other.id]);
        assert!(got.iter().all(|j| j.lease_owner.as_deref() == Some("w2")));
        // `Any` takes every kind.
        let a = s
            .enqueue(&NewJob::new("q", "x", json!({})), now)
            .await
            .unwrap()
            .job;
        let b = s
            .enqueue(&NewJob::new("q", "y", json!({})), now)
            .await
            .unwrap()
            .job;
        let got = s.claim(&claim(&["q"], Kinds::Any, "w3")).await.unwrap();
        let ids: Vec<i64> = got.iter().map(|j| j.id).collect();
        assert_eq!(ids, [a.id, b.id]);
    }

    pub(super) async fn workers_register_beat_expire_and_flag_unhandled_kinds(s: &Store) {
        let t0 = ms(T0);
        let info = |name: &str, queues: &[&str], kinds: Kinds| WorkerInfo {
            name: name.into(),
            host: "host-a".into(),
            pid: 4711,
            queues: queues.iter().map(|q| q.to_string()).collect(),
            kinds,
            concurrency: 4,
            started_at: t0,
            last_seen: t0,
            clock_offset_ms: None,
            policy_version: None,
        };
        assert!(s.workers(t0).await.unwrap().is_empty());
        for (q, k) in [
            ("q", "charge"),
            ("q", "http"),
            ("q3", "noop"),
            ("q", "charge"),
        ] {
            s.enqueue(&NewJob::new(q, k, json!({})), t0).await.unwrap();
        }
        // A finished job of an unhandled kind is not waiting: not flagged.
        let done_job = s
            .enqueue(&NewJob::new("q", "gone", json!({})), t0)
            .await
            .unwrap()
            .job;
        s.cancel(done_job.id, t0).await.unwrap();
        // No live worker: everything waiting is flagged, per queue and kind.
        let flagged = |u: Vec<Unhandled>| -> Vec<(String, String, u64)> {
            u.into_iter().map(|u| (u.queue, u.kind, u.jobs)).collect()
        };
        assert_eq!(
            flagged(s.unhandled(t0).await.unwrap()),
            [
                ("q".to_owned(), "charge".to_owned(), 2),
                ("q".to_owned(), "http".to_owned(), 1),
                ("q3".to_owned(), "noop".to_owned(), 1),
            ]
        );
        let w1 = info("w1", &[], Kinds::only(["http", "noop"]));
        let w2 = info("w2", &["q"], Kinds::Any);
        s.register_worker(&w1, t0).await.unwrap();
        s.register_worker(&w2, t0).await.unwrap();
        assert_eq!(s.workers(t0).await.unwrap(), [w1.clone(), w2.clone()]);
        // Every queue and any kind of q: nothing unhandled.
        assert!(s.unhandled(t0).await.unwrap().is_empty());
        // w1 beats, w2 does not: after the staleness w2 is gone (and its row deleted).
        let beat = t0 + chrono::Duration::seconds(50);
        assert!(s.worker_heartbeat("w1", beat).await.unwrap());
        let later = t0
            + chrono::Duration::from_std(WORKER_STALE_AFTER).unwrap()
            + chrono::Duration::seconds(1);
        let live = s.workers(later).await.unwrap();
        assert_eq!(live.len(), 1);
        assert_eq!((live[0].name.as_str(), live[0].last_seen), ("w1", beat));
        assert!(
            !s.worker_heartbeat("w2", later).await.unwrap(),
            "w2's row was deleted"
        );
        assert_eq!(
            flagged(s.unhandled(later).await.unwrap()),
            [("q".to_owned(), "charge".to_owned(), 2)]
        );
        // A worker of `charge` on another queue does not help; one on q does.
        s.register_worker(&info("w3", &["q2"], Kinds::only(["charge"])), later)
            .await
            .unwrap();
        assert_eq!(s.unhandled(later).await.unwrap().len(), 1);
        s.register_worker(&info("w4", &["q", "q2"], Kinds::only(["charge"])), later)
            .await
            .unwrap();
        assert!(s.unhandled(later).await.unwrap().is_empty());
        // Re-registering replaces the row; a clean stop removes it.
        let mut w1b = w1.clone();
        w1b.pid = 4712;
        s.register_worker(&w1b, later).await.unwrap();
        let got = s.workers(later).await.unwrap();
        assert_eq!(got.iter().find(|w| w.name == "w1").unwrap().pid, 4712);
        assert!(s.unregister_worker("w1").await.unwrap());
        assert!(!s.unregister_worker("w1").await.unwrap());
        let names: Vec<String> = s
            .workers(later)
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(names, ["w3", "w4"]);
        // A bad name is refused, naming the field.
        let e = s
            .register_worker(&info("", &[], Kinds::Any), later)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("name"), "{e}");
    }

    pub(super) async fn list_by_key_across_queues(s: &Store) {
        let now = ms(T0);
        let a = s
            .enqueue(&job("q1").key("order-4711"), now)
            .await
            .unwrap()
            .job;
        let b = s
            .enqueue(&job("q2").key("order-4711"), now)
            .await
            .unwrap()
            .job;
        s.enqueue(&job("q1").key("order-4712"), now).await.unwrap();
        s.enqueue(&job("q1"), now).await.unwrap();
        let by = |key: &str, queue: Option<&str>, state: Option<JobState>| ListParams {
            key: Some(key.into()),
            queue: queue.map(str::to_owned),
            state,
            ..Default::default()
        };
        let ids = |p: Page| p.jobs.into_iter().map(|j| j.id).collect::<Vec<_>>();
        assert_eq!(
            ids(s.list(&by("order-4711", None, None)).await.unwrap()),
            [a.id, b.id]
        );
        assert_eq!(
            ids(s.list(&by("order-4711", Some("q2"), None)).await.unwrap()),
            [b.id]
        );
        assert!(
            s.list(&by("order-0", None, None))
                .await
                .unwrap()
                .jobs
                .is_empty()
        );
        // With a state, and paginated.
        s.cancel(b.id, now).await.unwrap();
        let p = by("order-4711", None, Some(JobState::Cancelled));
        assert_eq!(ids(s.list(&p).await.unwrap()), [b.id]);
        let p = ListParams {
            limit: Some(1),
            ..by("order-4711", None, None)
        };
        let first = s.list(&p).await.unwrap();
        assert_eq!((ids(first.clone()), first.next), (vec![a.id], Some(a.id)));
        let rest = s
            .list(&ListParams {
                after: first.next,
                ..p
            })
            .await
            .unwrap();
        assert_eq!((ids(rest.clone()), rest.next), (vec![b.id], None));
    }

    pub(super) async fn check_writable_commits_a_write(s: &Store) {
        s.check_file().unwrap();
        for (n, t) in [(1, T0), (2, T0 + 1000), (3, T0 + 1000)] {
            s.check_writable("conformance", ms(t)).await.unwrap();
            let q = "SELECT checked_at, writes FROM redrive_probe WHERE name = 'conformance'";
            let row: (i64, i64) = match s {
                Store::Sqlite(x) => sqlx::query_as(q).fetch_one(x.pool()).await.unwrap(),
                Store::Postgres(x) => sqlx::query_as(q).fetch_one(x.pool()).await.unwrap(),
            };
            assert_eq!(row, (t, n), "the probe row was written (and rewritten)");
        }
    }

    /// The W3C `traceparent` of the enqueuing request is stored with the job (one enqueue
    /// and a batch), read back by get and claim; a malformed one is refused naming the field.
    pub(super) async fn traceparent_is_stored_with_the_job(s: &Store) {
        let now = ms(T0);
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let one = s
            .enqueue(&job("tp").traceparent(tp), now)
            .await
            .unwrap()
            .job;
        assert_eq!(one.traceparent.as_deref(), Some(tp));
        let many = s
            .enqueue_many(&[job("tp"), job("tp").traceparent(tp)], now)
            .await
            .unwrap();
        assert_eq!(many[0].job.traceparent, None);
        assert_eq!(many[1].job.traceparent.as_deref(), Some(tp));
        for id in [one.id, many[1].job.id] {
            let got = s.get(id).await.unwrap().unwrap();
            assert_eq!(got.traceparent.as_deref(), Some(tp));
        }
        assert_eq!(
            s.get(many[0].job.id).await.unwrap().unwrap().traceparent,
            None
        );
        let claimed = s.claim(&claim_params("tp", 10, now)).await.unwrap();
        assert_eq!(claimed.len(), 3);
        assert_eq!(
            claimed
                .iter()
                .filter(|j| j.traceparent.as_deref() == Some(tp))
                .count(),
            2
        );
        for bad in [
            "00-abc-def-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            match s.enqueue(&job("tp").traceparent(bad), now).await {
                Err(StoreError::Invalid { field, .. }) => assert_eq!(field, "traceparent"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    pub(super) async fn enqueue_dedupes_on_key(s: &Store) {
        let now = ms(T0);
        let a = s.enqueue(&job("q").key("k1"), now).await.unwrap();
        assert!(a.created);
        assert_eq!(a.job.state, JobState::Available);
        let b = s
            .enqueue(&job("q").key("k1").priority(5), now)
            .await
            .unwrap();
        assert!(!b.created);
        assert_eq!(b.job.id, a.job.id);
        assert_eq!(b.job.priority, 0, "the existing job is returned unchanged");
        // Keys are unique per queue.
        let c = s.enqueue(&job("other").key("k1"), now).await.unwrap();
        assert!(c.created);
        assert_ne!(c.job.id, a.job.id);
        // No key: always a new job.
        let d1 = s.enqueue(&job("q"), now).await.unwrap();
        let d2 = s.enqueue(&job("q"), now).await.unwrap();
        assert!(d1.created && d2.created && d1.job.id != d2.job.id);
        // Batches dedupe too, also within the batch.
        let many = s
            .enqueue_many(
                &[job("q").key("k1"), job("q").key("k2"), job("q").key("k2")],
                now,
            )
            .await
            .unwrap();
        assert_eq!(
            many.iter().map(|e| e.created).collect::<Vec<_>>(),
            [false, true, false]
        );
        assert_eq!(many[0].job.id, a.job.id);
        assert_eq!(many[1].job.id, many[2].job.id);
        let fetched = s.get(a.job.id).await.unwrap().unwrap();
        assert_eq!(fetched.payload, json!({"n": 1}));
        assert_eq!(fetched.key.as_deref(), Some("k1"));
        assert!(s.get(999_999).await.unwrap().is_none());
    }

    /// The enqueue builds the returned job from what it sent (the insert returns only ids):
    /// it must be exactly what the store reads back, for every kind of field.
    pub(super) async fn enqueued_job_is_the_stored_job(s: &Store) {
        let now = ms(T0 + 123);
        let jobs = [
            job("q"),
            job("q")
                .key("k")
                .dependency("psp.example")
                .priority(-3)
                .policy("low")
                .max_attempts(3)
                .ttl(Duration::from_millis(90_500))
                .run_at(ms(T0 + 60_000)),
            NewJob::new(
                "q2",
                "http",
                json!({"a": [1, 2.5, "x"], "b": null, "c": {"d": true}}),
            ),
            job("q").key("k"),
        ];
        let mut all = s.enqueue_many(&jobs, now).await.unwrap();
        all.push(s.enqueue(&job("q3").key("one"), now).await.unwrap());
        all.push(s.enqueue(&job("q3").key("one"), now).await.unwrap());
        assert_eq!(
            all.iter().map(|e| e.created).collect::<Vec<_>>(),
            [true, true, true, false, true, false]
        );
        assert_eq!(all[1].job.state, JobState::Scheduled);
        assert_eq!(all[1].job.deadline, Some(ms(T0 + 123 + 90_500)));
        assert!(all[0].job.id < all[1].job.id && all[1].job.id < all[2].job.id);
        for e in &all {
            let stored = s.get(e.job.id).await.unwrap().unwrap();
            assert_eq!(e.job, stored);
        }
    }

    /// `enqueue_many_exact`: repeats of the same request are `created: false`; a key used by
    /// another kind or payload (stored before, or earlier in the batch) writes nothing.
    pub(super) async fn enqueue_many_exact_rolls_back_a_key_used_by_another_request(s: &Store) {
        let now = ms(T0);
        let first = s
            .enqueue_many_exact(&[job("q").key("a"), job("q").key("b")], now)
            .await
            .unwrap()
            .unwrap();
        assert!(first.iter().all(|e| e.created));
        // The same requests again, a new key, and a repeat within the batch.
        let again = s
            .enqueue_many_exact(
                &[
                    job("q").key("b"),
                    job("q").key("c"),
                    job("q").key("a"),
                    job("q").key("c"),
                ],
                now,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            again.iter().map(|e| e.created).collect::<Vec<_>>(),
            [false, true, false, false]
        );
        assert_eq!(again[0].job.id, first[1].job.id);
        assert_eq!(again[2].job.id, first[0].job.id);
        assert_eq!(again[1].job.id, again[3].job.id);
        let count = |s: &Store| {
            let s = s.clone();
            async move {
                s.counts()
                    .await
                    .unwrap()
                    .iter()
                    .map(|c| c.count)
                    .sum::<u64>()
            }
        };
        assert_eq!(count(s).await, 3);
        // Key `a` with another payload: nothing of the batch is written.
        let other = NewJob::new("q", "noop", json!({"n": 2})).key("a");
        let taken = s
            .enqueue_many_exact(&[job("q").key("d"), other], now)
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(taken.index, 1);
        assert_eq!(taken.existing.id, first[0].job.id);
        assert_eq!(count(s).await, 3, "d rolled back");
        // Another kind under a key first used earlier in the same batch.
        let taken = s
            .enqueue_many_exact(
                &[
                    job("q").key("e"),
                    NewJob::new("q", "http", json!({"n": 1})).key("e"),
                ],
                now,
            )
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(taken.index, 1);
        assert_eq!(taken.existing.kind, "noop");
        assert_eq!(count(s).await, 3, "e rolled back");
        assert!(
            s.list(&ListParams::default())
                .await
                .unwrap()
                .jobs
                .iter()
                .all(|j| { j.key.as_deref() != Some("d") && j.key.as_deref() != Some("e") })
        );
    }

    pub(super) async fn concurrent_enqueues_of_one_key_make_one_job(s: &Store) {
        let now = ms(T0);
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.enqueue(&job("q").key("same"), now).await
            }));
        }
        let mut ids = HashSet::new();
        let mut created = 0;
        for t in tasks {
            let e = t.await.unwrap().expect("no error under concurrent enqueue");
            ids.insert(e.job.id);
            created += usize::from(e.created);
        }
        assert_eq!(ids.len(), 1);
        assert_eq!(created, 1);
        let page = s.list(&ListParams::default()).await.unwrap();
        assert_eq!(page.jobs.len(), 1);
    }

    pub(super) async fn enqueue_in_callers_transaction(s: &Store) {
        let now = ms(T0);
        match s {
            Store::Sqlite(lite) => {
                let mut tx = lite.pool().begin().await.unwrap();
                lite.enqueue_in(&mut tx, &job("q").key("rolled"), now)
                    .await
                    .unwrap();
                tx.rollback().await.unwrap();
                let mut tx = lite.pool().begin().await.unwrap();
                lite.enqueue_in(&mut tx, &job("q").key("kept"), now)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            Store::Postgres(pg) => {
                let mut tx = pg.pool().begin().await.unwrap();
                pg.enqueue_in(&mut tx, &job("q").key("rolled"), now)
                    .await
                    .unwrap();
                tx.rollback().await.unwrap();
                let mut tx = pg.pool().begin().await.unwrap();
                pg.enqueue_in(&mut tx, &job("q").key("kept"), now)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }
        let keys: Vec<_> = s
            .list(&ListParams::default())
            .await
            .unwrap()
            .jobs
            .into_iter()
            .map(|j| j.key)
            .collect();
        assert_eq!(keys, [Some("kept".to_string())]);
    }

    pub(super) async fn bad_input_is_refused_naming_the_field(s: &Store) {
        let now = ms(T0);
        let e = s.enqueue(&job(""), now).await.unwrap_err();
        assert!(e.to_string().contains("queue"), "{e}");
        let e = s.enqueue(&job("q").max_attempts(0), now).await.unwrap_err();
        assert!(
            e.to_string().contains("max_attempts") && e.to_string().contains('0'),
            "{e}"
        );
        let e = s
            .enqueue(&job("q").key("x".repeat(300)), now)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("key"), "{e}");
        let e = s.enqueue(&job("q").key("a\u{0}b"), now).await.unwrap_err();
        assert!(e.to_string().contains("control"), "{e}");
        // Nothing was stored.
        assert!(
            s.list(&ListParams::default())
                .await
                .unwrap()
                .jobs
                .is_empty()
        );
    }

    pub(super) async fn claim_order_and_schedule(s: &Store) {
        let now = ms(T0);
        let low = s.enqueue(&job("q").priority(5), now).await.unwrap().job;
        let high = s.enqueue(&job("q").priority(-1), now).await.unwrap().job;
        let later = s
            .enqueue(&job("q").run_at(ms(T0 + 60_000)), now)
            .await
            .unwrap()
            .job;
        assert_eq!(later.state, JobState::Scheduled);
        let normal = s.enqueue(&job("q"), now).await.unwrap().job;
        s.enqueue(&job("elsewhere"), now).await.unwrap();
        let got = s.claim(&claim_params("q", 10, now)).await.unwrap();
        let ids: Vec<_> = got.iter().map(|j| j.id).collect();
        assert_eq!(ids, [high.id, normal.id, low.id]);
        assert!(
            got.iter()
                .all(|j| j.state == JobState::Running && j.lease_token == 1)
        );
        assert_eq!(got[0].lease_owner.as_deref(), Some("w"));
        assert_eq!(got[0].lease_expires_at, Some(ms(T0 + 30_000)));
        assert!(
            s.claim(&claim_params("q", 10, now))
                .await
                .unwrap()
                .is_empty()
        );
        let due = s
            .claim(&claim_params("q", 10, ms(T0 + 60_000)))
            .await
            .unwrap();
        assert_eq!(due.iter().map(|j| j.id).collect::<Vec<_>>(), [later.id]);
    }

    pub(super) async fn eight_claimers_ten_thousand_jobs_each_claimed_once(s: &Store) {
        let now = ms(T0);
        for chunk in 0..10 {
            let batch: Vec<NewJob> = (0..1000)
                .map(|i| job("bulk").key(format!("k{chunk}-{i}")))
                .collect();
            s.enqueue_many(&batch, now).await.unwrap();
        }
        let mut tasks = Vec::new();
        for w in 0..8 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let mut p = claim_params("bulk", 64, now);
                    p.worker = format!("w{w}");
                    let got = s.claim(&p).await.unwrap();
                    if got.is_empty() {
                        break;
                    }
                    let cs: Vec<_> = got.iter().map(|j| done(j, now)).collect();
                    for r in s.complete_many(&cs).await.unwrap() {
                        r.expect("our own lease holds");
                    }
                    mine.extend(got.into_iter().map(|j| j.id));
                }
                mine
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let distinct: HashSet<_> = all.iter().copied().collect();
        assert_eq!(all.len(), 10_000, "claimed {} times in all", all.len());
        assert_eq!(distinct.len(), 10_000);
        let counts = s.counts().await.unwrap();
        assert_eq!(
            counts,
            vec![QueueCount {
                queue: "bulk".into(),
                state: JobState::Succeeded,
                count: 10_000
            }]
        );
    }

    pub(super) async fn stale_token_cannot_write(s: &Store) {
        let now = ms(T0);
        s.enqueue(&job("q").max_attempts(5), now).await.unwrap();
        let first = s.claim(&claim_params("q", 1, now)).await.unwrap().remove(0);
        let later = ms(T0 + 31_000);
        assert_eq!(s.rescue(later, 100).await.unwrap().len(), 1);
        let second = s
            .claim(&claim_params("q", 1, later))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(second.id, first.id);
        assert!(second.lease_token > first.lease_token);

        let stale = |t: Transition| with(&first, t, later);
        for t in [
            Transition::Succeeded { result: json!(1) },
            Transition::Deferred {
                until: ms(T0 + 90_000),
                reason: DeferReason::Backoff,
                delay: Duration::from_secs(60),
            },
            Transition::Dead {
                reason: DeadReason::Permanent,
            },
            Transition::RetryInProcess {
                delay: Duration::from_millis(100),
            },
            Transition::Released,
        ] {
            let e = s.complete(&stale(t.clone())).await.unwrap_err();
            assert!(e.is_lease_lost(), "{t:?}: {e}");
        }
        let e = s
            .heartbeat(first.lease(), Duration::from_secs(30), later)
            .await
            .unwrap_err();
        assert!(e.is_lease_lost());
        // Batched: the stale item fails alone.
        let res = s
            .complete_many(&[stale(Transition::Succeeded { result: json!(1) })])
            .await
            .unwrap();
        assert!(res[0].as_ref().unwrap_err().is_lease_lost());
        // Nothing of the stale worker was written.
        let j = s.get(first.id).await.unwrap().unwrap();
        assert_eq!(j.state, JobState::Running);
        assert_eq!(j.lease_token, second.lease_token);
        assert_eq!(
            s.attempts(first.id).await.unwrap().len(),
            1,
            "only the rescue's attempt"
        );
        // The current holder can.
        let until = s
            .heartbeat(second.lease(), Duration::from_secs(30), later)
            .await
            .unwrap();
        assert_eq!(until, ms(T0 + 61_000));
        s.complete(&done(&second, later)).await.unwrap();
        assert_eq!(
            s.get(first.id).await.unwrap().unwrap().state,
            JobState::Succeeded
        );
    }

    pub(super) async fn expired_lease_is_rescued_exactly_once(s: &Store) {
        let now = ms(T0);
        for _ in 0..20 {
            s.enqueue(&job("q").max_attempts(5), now).await.unwrap();
        }
        let claimed = s.claim(&claim_params("q", 20, now)).await.unwrap();
        assert_eq!(claimed.len(), 20);
        // Not yet expired.
        assert!(s.rescue(ms(T0 + 29_999), 100).await.unwrap().is_empty());
        let later = ms(T0 + 30_001);
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let s = s.clone();
            tasks.push(tokio::spawn(
                async move { s.rescue(later, 1000).await.unwrap() },
            ));
        }
        let mut rescued = Vec::new();
        for t in tasks {
            rescued.extend(t.await.unwrap());
        }
        assert_eq!(rescued.len(), 20);
        assert_eq!(
            rescued.iter().map(|r| r.id).collect::<HashSet<_>>().len(),
            20
        );
        assert!(rescued.iter().all(|r| r.queue == "q"), "{rescued:?}");
        assert!(rescued.iter().all(|r| !r.dead));
        let j = s.get(claimed[0].id).await.unwrap().unwrap();
        assert_eq!(j.state, JobState::Available);
        assert_eq!(j.attempts, 1, "the lost attempt counts");
        assert_eq!(j.lease_owner, None);
        let a = s.attempts(j.id).await.unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].class.as_str(), "timeout");
        assert_eq!(a[0].lease_token, claimed[0].lease_token);
        assert!(a[0].error.as_deref().unwrap().contains("lease expired"));
    }

    pub(super) async fn rescue_out_of_attempts_dies_lease_expired(s: &Store) {
        let now = ms(T0);
        let id = s
            .enqueue(&job("q").max_attempts(2), now)
            .await
            .unwrap()
            .job
            .id;
        let mut t = T0;
        for round in 0..2 {
            let got = s.claim(&claim_params("q", 1, ms(t))).await.unwrap();
            assert_eq!(got.len(), 1, "round {round}");
            t += 31_000;
            s.rescue(ms(t), 10).await.unwrap();
        }
        let j = s.get(id).await.unwrap().unwrap();
        assert_eq!(j.state, JobState::Dead);
        assert_eq!(j.dead_reason.map(|r| r.as_str()), Some("lease_expired"));
        assert_eq!(j.attempts, 2);
        assert!(j.finished_at.is_some());
        let a = s.attempts(id).await.unwrap();
        assert_eq!(a.iter().map(|a| a.number).collect::<Vec<_>>(), [1, 2]);
    }

    /// The model's durations serialise under their `*_ms` keys as whole milliseconds (the
    /// JSON the CLI and the API print), and as `null` when unset.
    pub(super) async fn durations_in_json_are_whole_milliseconds(s: &Store) {
        let now = ms(T0);
        let plain = s.enqueue(&job("q"), now).await.unwrap().job;
        let v = serde_json::to_value(&plain).unwrap();
        assert_eq!(
            (&v["prev_delay_ms"], &v["ttl_ms"]),
            (&json!(null), &json!(null))
        );
        let id = s
            .enqueue(&job("q").key("ttl").ttl(Duration::from_secs(90)), now)
            .await
            .unwrap()
            .job
            .id;
        let j = s.claim(&claim_params("q", 2, now)).await.unwrap();
        let j = j.into_iter().find(|j| j.id == id).unwrap();
        let mut c = with(
            &j,
            Transition::RetryInProcess {
                delay: Duration::from_millis(150),
            },
            now,
        );
        c.counters.prev_delay = Some(Duration::from_millis(150));
        s.complete(&c).await.unwrap();
        let v = serde_json::to_value(s.get(id).await.unwrap().unwrap()).unwrap();
        assert_eq!(v["prev_delay_ms"], json!(150));
        assert_eq!(v["ttl_ms"], json!(90_000));
        let a = serde_json::to_value(&s.attempts(id).await.unwrap()[0]).unwrap();
        assert_eq!(
            (&a["duration_ms"], &a["delay_ms"]),
            (&json!(5), &json!(150))
        );
        for key in ["prev_delay", "ttl"] {
            assert!(v.get(key).is_none(), "job has {key}");
        }
        for key in ["duration", "delay"] {
            assert!(a.get(key).is_none(), "attempt has {key}");
        }
    }

    pub(super) async fn retry_in_process_and_defer_record_attempts(s: &Store) {
        let now = ms(T0);
        let id = s.enqueue(&job("q"), now).await.unwrap().job.id;
        let j = s.claim(&claim_params("q", 1, now)).await.unwrap().remove(0);
        let mut c = with(
            &j,
            Transition::RetryInProcess {
                delay: Duration::from_millis(150),
            },
            now,
        );
        c.attempt.as_mut().unwrap().http_status = Some(503);
        c.counters.prev_delay = Some(Duration::from_millis(150));
        s.complete(&c).await.unwrap();
        let j2 = s.get(id).await.unwrap().unwrap();
        assert_eq!(j2.state, JobState::Running, "still leased");
        assert_eq!(j2.lease_token, j.lease_token);
        assert_eq!(j2.attempts, 1);
        assert_eq!(j2.prev_delay, Some(Duration::from_millis(150)));
        assert_eq!(j2.last_error.as_deref(), Some("503 from psp"));
        let until = ms(T0 + 120_000);
        s.complete(&with(
            &j2,
            Transition::Deferred {
                until,
                reason: DeferReason::RateLimited,
                delay: Duration::from_secs(120),
            },
            ms(T0 + 200),
        ))
        .await
        .unwrap();
        let j3 = s.get(id).await.unwrap().unwrap();
        assert_eq!(j3.state, JobState::Deferred);
        assert_eq!(j3.defer_reason.map(|r| r.as_str()), Some("rate_limited"));
        assert_eq!(j3.run_at, until);
        assert_eq!(j3.attempts, 2);
        assert_eq!(j3.lease_owner, None);
        let a = s.attempts(id).await.unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(
            (
                a[0].number,
                a[0].mode.map(|m| m.as_str()),
                a[0].delay,
                a[0].http_status
            ),
            (
                1,
                Some("retry"),
                Some(Duration::from_millis(150)),
                Some(503)
            )
        );
        assert_eq!(
            (a[1].number, a[1].mode.map(|m| m.as_str()), a[1].delay),
            (2, Some("defer"), Some(Duration::from_secs(120)))
        );
        assert_eq!(a[0].class.as_str(), "infrastructure");
        // Not claimable before run_at; claimable after.
        assert!(
            s.claim(&claim_params("q", 1, ms(T0 + 119_999)))
                .await
                .unwrap()
                .is_empty()
        );
        let j4 = s
            .claim(&claim_params("q", 1, until))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(j4.lease_token, j.lease_token + 1);
        // A release (shutdown) puts it back without an attempt.
        s.complete(&Completion {
            lease: j4.lease(),
            attempt: None,
            counters: j4.counters(),
            transition: Transition::Released,
            error: None,
            now: until,
            decline: None,
        })
        .await
        .unwrap();
        let j5 = s.get(id).await.unwrap().unwrap();
        assert_eq!((j5.state, j5.attempts), (JobState::Available, 2));
        assert_eq!(s.attempts(id).await.unwrap().len(), 2);
    }

    pub(super) async fn replay_and_purge(s: &Store) {
        let now = ms(T0);
        let mut ids = Vec::new();
        for i in 0..4 {
            let q = if i < 3 { "a" } else { "b" };
            ids.push(
                s.enqueue(&job(q).ttl(Duration::from_secs(600)), now)
                    .await
                    .unwrap()
                    .job
                    .id,
            );
        }
        for q in ["a", "b"] {
            for j in s.claim(&claim_params(q, 10, now)).await.unwrap() {
                s.complete(&with(
                    &j,
                    Transition::Dead {
                        reason: DeadReason::AttemptsExhausted,
                    },
                    now,
                ))
                .await
                .unwrap();
            }
        }
        let dead = s
            .list(&ListParams {
                state: Some(JobState::Dead),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(dead.jobs.len(), 4);
        assert_eq!(
            dead.jobs[0].dead_reason.map(|r| r.as_str()),
            Some("attempts_exhausted")
        );
        let by_reason = s
            .list(&ListParams {
                dead_reason: Some("permanent".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(by_reason.jobs.is_empty());
        // Replay one: fresh budgets, history kept, deadline from the replay.
        let later = ms(T0 + 1_000_000);
        assert_eq!(
            s.replay(&Selection::Ids(vec![ids[0]]), later)
                .await
                .unwrap(),
            1
        );
        let j = s.get(ids[0]).await.unwrap().unwrap();
        assert_eq!(
            (j.state, j.attempts, j.replays),
            (JobState::Available, 0, 1)
        );
        assert_eq!(j.dead_reason, None);
        assert_eq!(j.first_attempt_at, None);
        assert_eq!(j.deadline, Some(ms(T0 + 1_000_000 + 600_000)));
        assert_eq!(s.attempts(ids[0]).await.unwrap().len(), 1);
        // Replaying a job that is not dead does nothing.
        assert_eq!(
            s.replay(&Selection::Ids(vec![ids[0]]), later)
                .await
                .unwrap(),
            0
        );
        // A new attempt after replay is number 1 of run 1.
        let j = s
            .claim(&claim_params("a", 1, later))
            .await
            .unwrap()
            .remove(0);
        s.complete(&done(&j, later)).await.unwrap();
        let a = s.attempts(ids[0]).await.unwrap();
        assert_eq!(
            a.iter().map(|a| (a.replay, a.number)).collect::<Vec<_>>(),
            [(0, 1), (1, 1)]
        );
        // Replay all of queue a.
        assert_eq!(
            s.replay(
                &Selection::All {
                    queue: Some("a".into())
                },
                later
            )
            .await
            .unwrap(),
            2
        );
        // Purge: only dead ones go, with their attempts.
        assert_eq!(s.attempts(ids[3]).await.unwrap().len(), 1);
        let kept = s.attempts(ids[0]).await.unwrap().len();
        assert!(kept > 0);
        assert_eq!(
            s.purge(&Selection::Ids(vec![ids[0], ids[1], ids[3]]))
                .await
                .unwrap(),
            1
        );
        assert!(s.get(ids[3]).await.unwrap().is_none());
        assert!(
            s.attempts(ids[3]).await.unwrap().is_empty(),
            "attempts go with the job"
        );
        assert!(s.get(ids[0]).await.unwrap().is_some());
        assert_eq!(s.attempts(ids[0]).await.unwrap().len(), kept);
        assert_eq!(s.purge(&Selection::All { queue: None }).await.unwrap(), 0);
        // Purge all of a queue: its dead jobs go with their attempts, nothing else.
        let c = s.enqueue(&job("c"), now).await.unwrap().job.id;
        for j in s.claim(&claim_params("c", 10, now)).await.unwrap() {
            let dead = Transition::Dead {
                reason: DeadReason::Permanent,
            };
            s.complete(&with(&j, dead, now)).await.unwrap();
        }
        assert_eq!(s.attempts(c).await.unwrap().len(), 1);
        let all_of_c = Selection::All {
            queue: Some("c".into()),
        };
        assert_eq!(s.purge(&all_of_c).await.unwrap(), 1);
        assert!(s.get(c).await.unwrap().is_none());
        assert!(
            s.attempts(c).await.unwrap().is_empty(),
            "attempts go with the job"
        );
        assert_eq!(s.attempts(ids[0]).await.unwrap().len(), kept);
    }

    pub(super) async fn pagination_is_stable_under_concurrent_inserts(s: &Store) {
        let now = ms(T0);
        let batch: Vec<NewJob> = (0..100).map(|_| job("q")).collect();
        let first: Vec<JobId> = s
            .enqueue_many(&batch, now)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.job.id)
            .collect();
        let writer = {
            let s = s.clone();
            tokio::spawn(async move {
                for _ in 0..50 {
                    s.enqueue(&job("q"), now).await.unwrap();
                }
            })
        };
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = s
                .list(&ListParams {
                    queue: Some("q".into()),
                    after,
                    limit: Some(7),
                    ..Default::default()
                })
                .await
                .unwrap();
            assert!(page.jobs.len() <= 7);
            seen.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        writer.await.unwrap();
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "ids strictly increasing: no duplicates, no reordering"
        );
        for id in &first {
            assert!(seen.contains(id), "job {id} was skipped");
        }
    }

    pub(super) async fn paused_or_open_dependency_is_not_claimed(s: &Store) {
        let now = ms(T0);
        let psp = s
            .enqueue(&job("q").dependency("psp-a"), now)
            .await
            .unwrap()
            .job
            .id;
        let free = s.enqueue(&job("q"), now).await.unwrap().job.id;
        let other = s
            .enqueue(&job("q").dependency("psp-b"), now)
            .await
            .unwrap()
            .job
            .id;
        s.pause("psp-a", ms(T0 + 10_000), PauseReason::RetryAfter, now)
            .await
            .unwrap();
        // A shorter pause never shortens a longer one.
        s.pause("psp-a", ms(T0 + 5_000), PauseReason::RetryAfter, now)
            .await
            .unwrap();
        s.set_breaker(&BreakerUpdate {
            dependency: "psp-b".into(),
            expect: None,
            state: BreakerState::Open,
            open_until: Some(ms(T0 + 20_000)),
            probe_permits: 0,
            reason: "failure rate 0.8".into(),
            now,
        })
        .await
        .unwrap();
        let got: Vec<_> = s
            .claim(&claim_params("q", 10, now))
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(got, [free]);
        assert_eq!(
            s.next_due(&["q".into()]).await.unwrap(),
            Some(ms(T0 + 10_000))
        );
        let dep = s.dependency("psp-a").await.unwrap().unwrap();
        assert_eq!(dep.flow.paused_until, Some(ms(T0 + 10_000)));
        assert_eq!(dep.flow.pause_reason, Some(PauseReason::RetryAfter));
        assert!(
            s.claim(&claim_params("q", 10, ms(T0 + 9_999)))
                .await
                .unwrap()
                .is_empty()
        );
        let got: Vec<_> = s
            .claim(&claim_params("q", 10, ms(T0 + 10_000)))
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(got, [psp]);
        // Open breaker past its open_until: claimable again (the worker moves it to half-open).
        let got: Vec<_> = s
            .claim(&claim_params("q", 10, ms(T0 + 20_000)))
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(got, [other]);
        s.unpause("psp-a", now).await.unwrap();
        assert_eq!(
            s.dependency("psp-a")
                .await
                .unwrap()
                .unwrap()
                .flow
                .paused_until,
            None
        );
    }

    pub(super) async fn half_open_probe_permits(s: &Store) {
        let now = ms(T0);
        for _ in 0..3 {
            s.enqueue(&job("q").dependency("psp"), now).await.unwrap();
        }
        let row = FlowRow {
            state: BreakerState::HalfOpen,
            probe_permits: 0,
            round_started: Some(now),
            ..FlowRow::default()
        };
        let v = s
            .update_dependency(&DependencyWrite {
                dependency: "psp".into(),
                expect_version: None,
                flow: row,
                transition: Some((
                    BreakerState::Open,
                    BreakerState::HalfOpen,
                    "cool-down elapsed".into(),
                )),
                now,
            })
            .await
            .unwrap();
        assert_eq!(v, Some(1));
        assert!(
            s.claim(&claim_params("q", 10, now))
                .await
                .unwrap()
                .is_empty(),
            "half-open with no permit left: nothing claimed"
        );
    }

    /// The whole flow row round-trips, writes are compare-and-set on the version, and every
    /// other writer (pause, unpause, set_breaker) bumps the version too.
    pub(super) async fn dependency_row_compare_and_set(s: &Store) {
        let now = ms(T0);
        let flow = FlowRow {
            mode: BreakerMode::Normal,
            state: BreakerState::Open,
            open_until: Some(ms(T0 + 1_500)),
            openings: 3,
            probe_permits: 2,
            probe_successes: 1,
            probe_failures: 1,
            round_started: Some(ms(T0 + 7)),
            paused_until: Some(ms(T0 + 900)),
            pause_reason: Some(PauseReason::RetryAfter),
            rate: Some(72.5),
            tat: Some(now + chrono::Duration::microseconds(12_345)),
            rate_cut_at: Some(ms(T0 + 3)),
            rate_cap: Some(80.25),
            rate_raised_at: Some(ms(T0 + 4)),
            rate_lifted: true,
            meter_started: Some(ms(T0 + 5)),
            meter_slots: 41,
            meter_rate: Some(61.5),
            cycle_started: Some(ms(T0 - 1_000)),
            cycle_slots: 377,
            rate_pause: Some(std::time::Duration::from_secs(3)),
        };
        let write = |expect: Option<i64>, flow: FlowRow, t: bool| DependencyWrite {
            dependency: "psp".into(),
            expect_version: expect,
            flow,
            transition: t.then(|| {
                (
                    BreakerState::Closed,
                    BreakerState::Open,
                    "failure rate 60% over 20 calls".into(),
                )
            }),
            now,
        };
        assert!(s.dependency("psp").await.unwrap().is_none());
        assert_eq!(
            s.update_dependency(&write(None, flow.clone(), true))
                .await
                .unwrap(),
            Some(1)
        );
        // A second process that also saw no row loses the insert.
        assert_eq!(
            s.update_dependency(&write(None, flow.clone(), true))
                .await
                .unwrap(),
            None
        );
        let d = s.dependency("psp").await.unwrap().unwrap();
        assert_eq!((d.version, &d.flow), (1, &flow));
        let mut next = flow.clone();
        next.mode = BreakerMode::ForcedOpen;
        next.rate = None;
        next.tat = None;
        assert_eq!(
            s.update_dependency(&write(Some(1), next.clone(), false))
                .await
                .unwrap(),
            Some(2)
        );
        // A stale version is refused and changes nothing.
        assert_eq!(
            s.update_dependency(&write(Some(1), flow.clone(), false))
                .await
                .unwrap(),
            None
        );
        let d = s.dependency("psp").await.unwrap().unwrap();
        assert_eq!((d.version, &d.flow), (2, &next));
        // Other writers bump the version, so a read-apply-write that raced them is refused.
        s.pause("psp", ms(T0 + 60_000), PauseReason::Operator, now)
            .await
            .unwrap();
        assert_eq!(
            s.update_dependency(&write(Some(2), flow.clone(), false))
                .await
                .unwrap(),
            None
        );
        let d = s.dependency("psp").await.unwrap().unwrap();
        assert_eq!(d.version, 3);
        assert_eq!(d.flow.pause_reason, Some(PauseReason::Operator));
        s.unpause("psp", now).await.unwrap();
        assert_eq!(s.dependency("psp").await.unwrap().unwrap().version, 4);
        // One transition recorded, by the write that made it.
        let ev = s.dependency_events(Some("psp"), 10).await.unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].from, ev[0].to),
            (BreakerState::Closed, BreakerState::Open)
        );
        assert_eq!(ev[0].reason, "failure rate 60% over 20 calls");
    }

    pub(super) async fn breaker_compare_and_set_and_events(s: &Store) {
        let now = ms(T0);
        use BreakerState::{Closed, HalfOpen, Open};
        let open = |expect: Option<BreakerState>, state: BreakerState| BreakerUpdate {
            dependency: "psp".into(),
            expect,
            state,
            open_until: Some(ms(T0 + 10_000)),
            probe_permits: 0,
            reason: "test".into(),
            now,
        };
        assert!(s.set_breaker(&open(Some(Closed), Open)).await.unwrap());
        // A second worker seeing the same failure does not record a second transition.
        assert!(!s.set_breaker(&open(Some(Closed), Open)).await.unwrap());
        assert!(s.set_breaker(&open(Some(Open), HalfOpen)).await.unwrap());
        assert!(s.set_breaker(&open(Some(HalfOpen), Closed)).await.unwrap());
        let ev = s.dependency_events(Some("psp"), 10).await.unwrap();
        let pairs: Vec<_> = ev
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("half_open", "closed"),
                ("open", "half_open"),
                ("closed", "open")
            ]
        );
        let deps = s.dependencies().await.unwrap();
        assert_eq!(deps.len(), 1);
        assert_eq!(deps[0].flow.state, Closed);
        assert_eq!(deps[0].version, 3);
    }

    pub(super) async fn cancel_revokes_a_running_lease(s: &Store) {
        let now = ms(T0);
        let a = s.enqueue(&job("q"), now).await.unwrap().job.id;
        let b = s
            .enqueue(&job("q").run_at(ms(T0 + 1000)), now)
            .await
            .unwrap()
            .job
            .id;
        let running = s.claim(&claim_params("q", 1, now)).await.unwrap().remove(0);
        assert_eq!(running.id, a);
        let c = s.cancel(a, now).await.unwrap();
        assert_eq!(c.state, JobState::Cancelled);
        assert!(
            s.complete(&done(&running, now))
                .await
                .unwrap_err()
                .is_lease_lost()
        );
        assert!(
            s.heartbeat(running.lease(), Duration::from_secs(1), now)
                .await
                .unwrap_err()
                .is_lease_lost()
        );
        assert_eq!(s.cancel(b, now).await.unwrap().state, JobState::Cancelled);
        let e = s.cancel(b, now).await.unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::WrongState {
                    state: JobState::Cancelled,
                    ..
                }
            ),
            "{e}"
        );
        assert!(matches!(
            s.cancel(424_242, now).await.unwrap_err(),
            StoreError::JobNotFound { id: 424_242 }
        ));
    }

    pub(super) async fn counts_next_due_and_prune(s: &Store) {
        let now = ms(T0);
        assert_eq!(s.next_due(&["q".into()]).await.unwrap(), None);
        s.enqueue(&job("q").run_at(ms(T0 + 5000)), now)
            .await
            .unwrap();
        let id = s.enqueue(&job("q"), now).await.unwrap().job.id;
        assert_eq!(s.next_due(&["q".into()]).await.unwrap(), Some(now));
        let j = s.claim(&claim_params("q", 1, now)).await.unwrap().remove(0);
        assert_eq!(j.id, id);
        s.complete(&done(&j, now)).await.unwrap();
        assert_eq!(
            s.next_due(&["q".into()]).await.unwrap(),
            Some(ms(T0 + 5000))
        );
        let counts = s.counts().await.unwrap();
        assert_eq!(
            counts,
            vec![
                QueueCount {
                    queue: "q".into(),
                    state: JobState::Scheduled,
                    count: 1
                },
                QueueCount {
                    queue: "q".into(),
                    state: JobState::Succeeded,
                    count: 1
                },
            ]
        );
        assert_eq!(
            s.prune(now, false).await.unwrap(),
            0,
            "finished at now, not before"
        );
        assert_eq!(s.prune(ms(T0 + 1), false).await.unwrap(), 1);
        assert!(s.get(id).await.unwrap().is_none());
    }

    pub(super) async fn wake_up_on_enqueue(s: &Store) {
        let mut rx = s.subscribe();
        rx.borrow_and_update();
        let s2 = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            s2.enqueue(&job("q"), Utc::now()).await.unwrap();
        });
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("woken")
            .unwrap();
    }
    /// Migration 0002 keeps by-state indexes only for `dead` and `cancelled`: every state's
    /// list (with and without a queue, paged) and the counts must still be exact.
    /// 203 completions in one `complete_many` (SQLite splits it into chunks of 128, 32, 8
    /// and 1 rows): successes, defers with an HTTP status, releases without an attempt,
    /// dead-letters, and every seventh with a stale token. Each item applies or fails on
    /// its own, with its own fields.
    pub(super) async fn large_mixed_batch_applies_each_item_alone(s: &Store) {
        let now = ms(T0);
        let batch: Vec<NewJob> = (0..203).map(|_| job("mix")).collect();
        s.enqueue_many(&batch, now).await.unwrap();
        let jobs = s.claim(&claim_params("mix", 203, now)).await.unwrap();
        assert_eq!(jobs.len(), 203);
        let until = ms(T0 + 60_000);
        let later = ms(T0 + 10);
        let cs: Vec<Completion> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let mut c = match i % 4 {
                    0 => {
                        let mut c = done(j, later);
                        c.transition = Transition::Succeeded {
                            result: json!({"i": i}),
                        };
                        c
                    }
                    1 => {
                        let mut c = with(
                            j,
                            Transition::Deferred {
                                until,
                                reason: DeferReason::RateLimited,
                                delay: Duration::from_secs(60),
                            },
                            later,
                        );
                        c.attempt.as_mut().unwrap().http_status = Some(429);
                        c.error = Some(format!("429 number {i}"));
                        c
                    }
                    2 => Completion {
                        lease: j.lease(),
                        attempt: None,
                        counters: j.counters(),
                        transition: Transition::Released,
                        error: None,
                        now: later,
                        decline: None,
                    },
                    _ => with(
                        j,
                        Transition::Dead {
                            reason: DeadReason::Permanent,
                        },
                        later,
                    ),
                };
                if i % 7 == 3 {
                    c.lease.token += 1_000;
                }
                c
            })
            .collect();
        let results = s.complete_many(&cs).await.unwrap();
        assert_eq!(results.len(), 203);
        for (i, (j, r)) in jobs.iter().zip(&results).enumerate() {
            let got = s.get(j.id).await.unwrap().unwrap();
            let attempts = s.attempts(j.id).await.unwrap();
            if i % 7 == 3 {
                assert!(r.as_ref().unwrap_err().is_lease_lost(), "item {i}: {r:?}");
                assert_eq!(got.state, JobState::Running, "item {i}");
                assert!(attempts.is_empty(), "item {i}: {attempts:?}");
                continue;
            }
            r.as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
            match i % 4 {
                0 => {
                    assert_eq!(got.state, JobState::Succeeded, "item {i}");
                    assert_eq!(got.result, Some(json!({"i": i})), "item {i}");
                    assert_eq!(attempts.len(), 1, "item {i}");
                    assert_eq!(attempts[0].class.as_str(), "success", "item {i}");
                }
                1 => {
                    assert_eq!(got.state, JobState::Deferred, "item {i}");
                    assert_eq!(got.run_at, until, "item {i}");
                    assert_eq!(got.defer_reason.map(|r| r.as_str()), Some("rate_limited"));
                    let error = format!("429 number {i}");
                    assert_eq!(got.last_error.as_deref(), Some(error.as_str()));
                    assert_eq!(attempts.len(), 1, "item {i}");
                    assert_eq!(
                        (attempts[0].number, attempts[0].http_status),
                        (1, Some(429)),
                        "item {i}"
                    );
                    assert_eq!(
                        attempts[0].mode.map(|m| m.as_str()),
                        Some("defer"),
                        "item {i}"
                    );
                }
                2 => {
                    assert_eq!(got.state, JobState::Available, "item {i}");
                    assert!(attempts.is_empty(), "item {i}: {attempts:?}");
                }
                _ => {
                    assert_eq!(got.state, JobState::Dead, "item {i}");
                    assert_eq!(
                        got.dead_reason.map(|r| r.as_str()),
                        Some("permanent"),
                        "item {i}"
                    );
                    assert_eq!(attempts.len(), 1, "item {i}");
                }
            }
        }
    }

    pub(super) async fn list_by_every_state_and_counts(s: &Store) {
        let now = ms(T0);
        let mut want: Vec<(String, JobState, JobId)> = Vec::new();
        for q in ["a", "b"] {
            let sched = s
                .enqueue(&job(q).run_at(ms(T0 + 60_000)), now)
                .await
                .unwrap();
            want.push((q.into(), JobState::Scheduled, sched.job.id));
            let ids: Vec<JobId> = s
                .enqueue_many(&(0..6).map(|_| job(q)).collect::<Vec<_>>(), now)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.job.id)
                .collect();
            let mut claimed = s.claim(&claim_params(q, 5, now)).await.unwrap();
            assert_eq!(claimed.len(), 5);
            want.push((q.into(), JobState::Available, ids[5]));
            let running = claimed.pop().unwrap();
            want.push((q.into(), JobState::Running, running.id));
            let succ = claimed.pop().unwrap();
            s.complete(&done(&succ, now)).await.unwrap();
            want.push((q.into(), JobState::Succeeded, succ.id));
            let dead = claimed.pop().unwrap();
            let t = Transition::Dead {
                reason: DeadReason::Permanent,
            };
            s.complete(&with(&dead, t, now)).await.unwrap();
            want.push((q.into(), JobState::Dead, dead.id));
            let deferred = claimed.pop().unwrap();
            let t = Transition::Deferred {
                until: ms(T0 + 90_000),
                reason: DeferReason::Backoff,
                delay: Duration::from_secs(90),
            };
            s.complete(&with(&deferred, t, now)).await.unwrap();
            want.push((q.into(), JobState::Deferred, deferred.id));
            let cancelled = claimed.pop().unwrap();
            s.cancel(cancelled.id, now).await.unwrap();
            want.push((q.into(), JobState::Cancelled, cancelled.id));
        }
        for st in JobState::ALL {
            for queue in [None, Some("a"), Some("b")] {
                let expect: Vec<JobId> = want
                    .iter()
                    .filter(|(q, s2, _)| *s2 == st && queue.is_none_or(|x| x == q))
                    .map(|w| w.2)
                    .collect();
                let mut got = Vec::new();
                let mut after = None;
                loop {
                    let page = s
                        .list(&ListParams {
                            state: Some(st),
                            queue: queue.map(Into::into),
                            after,
                            limit: Some(1),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    assert!(page.jobs.iter().all(|j| j.state == st));
                    got.extend(page.jobs.iter().map(|j| j.id));
                    match page.next {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
                assert_eq!(got, expect, "list state {st:?} queue {queue:?}");
            }
        }
        let dead = s
            .list(&ListParams {
                state: Some(JobState::Dead),
                dead_reason: Some("permanent".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(dead.jobs.len(), 2);
        let all = s.list(&ListParams::default()).await.unwrap();
        assert_eq!(all.jobs.len(), want.len());
        let mut expect: Vec<QueueCount> = want
            .iter()
            .map(|(q, st, _)| QueueCount {
                queue: q.clone(),
                state: *st,
                count: 1,
            })
            .collect();
        expect.sort_by(|x, y| (&x.queue, x.state.as_str()).cmp(&(&y.queue, y.state.as_str())));
        assert_eq!(s.counts().await.unwrap(), expect);
    }

    fn op() -> Actor {
        Actor::new("alice", "cli")
    }

    async fn kill(s: &Store, j: &Job, reason: DeadReason, error: &str, now: Timestamp) {
        let mut c = with(j, Transition::Dead { reason }, now);
        c.error = Some(error.into());
        s.complete(&c).await.unwrap();
    }

    /// A claim of several queues takes the first jobs of all of them together (priority, then
    /// run_at, then id), at most its limit, whichever queue they are in; a paused queue of the
    /// list gives none.
    pub(super) async fn claim_of_several_queues_takes_the_first_in_order_across_them(s: &Store) {
        let now = ms(T0);
        let mut ids = std::collections::HashMap::new();
        for (name, queue, priority, ago) in [
            ("a-late", "a", 0, 1),
            ("b-early", "b", 0, 5),
            ("c-urgent", "c", -1, 0),
            ("a-early", "a", 0, 4),
            ("b-late", "b", 0, 2),
            ("b-low", "b", 5, 9),
        ] {
            let j = job(queue).priority(priority).run_at(ms(T0 - ago * 1000));
            ids.insert(name, s.enqueue(&j, now).await.unwrap().job.id);
        }
        let mut p = claim_params("a", 3, now);
        p.queues = vec!["a".into(), "b".into(), "c".into()];
        let got: Vec<i64> = s.claim(&p).await.unwrap().iter().map(|j| j.id).collect();
        assert_eq!(got, [ids["c-urgent"], ids["b-early"], ids["a-early"]]);
        assert!(s.pause_queue("b", &op(), now).await.unwrap());
        let got: Vec<i64> = s.claim(&p).await.unwrap().iter().map(|j| j.id).collect();
        assert_eq!(got, [ids["a-late"]], "b is paused");
        assert!(s.resume_queue("b", &op(), now).await.unwrap());
        p.limit = 10;
        let got: Vec<i64> = s.claim(&p).await.unwrap().iter().map(|j| j.id).collect();
        assert_eq!(got, [ids["b-late"], ids["b-low"]]);
    }

    pub(super) async fn paused_queue_is_not_claimed_until_resumed(s: &Store) {
        let now = ms(T0);
        let a = s.enqueue(&job("a"), now).await.unwrap().job.id;
        let b = s.enqueue(&job("b"), now).await.unwrap().job.id;
        assert!(s.pause_queue("a", &op(), now).await.unwrap());
        // Pausing twice changes nothing (and says so).
        assert!(!s.pause_queue("a", &op(), now).await.unwrap());
        let paused = s.paused_queues().await.unwrap();
        assert_eq!(paused.len(), 1);
        assert_eq!(
            (paused[0].queue.as_str(), paused[0].paused_by.as_str()),
            ("a", "alice")
        );
        assert_eq!(paused[0].paused_at, now);
        let mut p = claim_params("a", 10, now);
        p.queues.push("b".into());
        let got: Vec<i64> = s.claim(&p).await.unwrap().iter().map(|j| j.id).collect();
        assert_eq!(got, vec![b]);
        // No busy loop on a paused queue: nothing of it is due.
        assert_eq!(s.next_due(&["a".into()]).await.unwrap(), None);
        assert!(
            s.claim(&claim_params("a", 10, now))
                .await
                .unwrap()
                .is_empty()
        );
        // Resumed: claimed at the next poll, and the job is untouched.
        assert!(s.resume_queue("a", &op(), now).await.unwrap());
        assert!(!s.resume_queue("a", &op(), now).await.unwrap());
        assert!(s.paused_queues().await.unwrap().is_empty());
        let got = s.claim(&claim_params("a", 10, now)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].id, got[0].attempts), (a, 0));
        // Every call audited, newest first, with how many rows it changed.
        let audit = s.audit(None, 10).await.unwrap();
        let seen: Vec<(&str, u64)> = audit.iter().map(|e| (e.action.as_str(), e.rows)).collect();
        assert_eq!(
            seen,
            vec![
                ("queue_resume", 0),
                ("queue_resume", 1),
                ("queue_pause", 0),
                ("queue_pause", 1)
            ]
        );
        assert_eq!(audit[0].actor, "alice");
        assert_eq!(audit[0].via, "cli");
        assert_eq!(audit[0].target, json!({"queue": "a"}));
        assert_eq!(audit[0].at, now);
        // Keyset pagination.
        let older = s.audit(Some(audit[1].id), 10).await.unwrap();
        assert_eq!(older.len(), 2);
        assert_eq!(older[0].id, audit[2].id);
        // A bad name is refused, naming the field.
        let e = s.pause_queue("", &op(), now).await.unwrap_err();
        assert!(e.to_string().contains("queue"), "{e}");
    }

    pub(super) async fn operator_pause_of_a_dependency(s: &Store) {
        let now = ms(T0);
        s.enqueue(&job("q").dependency("psp"), now).await.unwrap();
        // Paused until a time: not claimed before it, claimed at it.
        let d = s
            .operate_dependency(
                "psp",
                DependencyOp::Pause {
                    until: Some(ms(T0 + 60_000)),
                },
                &op(),
                now,
            )
            .await
            .unwrap();
        assert_eq!(d.flow.paused_until, Some(ms(T0 + 60_000)));
        assert_eq!(d.flow.pause_reason, Some(PauseReason::Operator));
        assert!(
            s.claim(&claim_params("q", 1, ms(T0 + 59_999)))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            s.next_due(&["q".into()]).await.unwrap(),
            Some(ms(T0 + 60_000))
        );
        // Until resumed: held far beyond, then resumed and claimed.
        let d = s
            .operate_dependency("psp", DependencyOp::Pause { until: None }, &op(), now)
            .await
            .unwrap();
        assert!(d.flow.paused_until_resumed());
        assert_eq!(s.dependency("psp").await.unwrap().unwrap().flow, d.flow);
        let far = ms(T0 + 365 * 24 * 3_600_000);
        assert!(
            s.claim(&claim_params("q", 1, far))
                .await
                .unwrap()
                .is_empty()
        );
        let d = s
            .operate_dependency("psp", DependencyOp::Resume, &op(), now)
            .await
            .unwrap();
        assert_eq!((d.flow.paused_until, d.flow.pause_reason), (None, None));
        assert_eq!(s.claim(&claim_params("q", 1, now)).await.unwrap().len(), 1);
        // A pause ending in the past is refused, naming the field.
        let e = s
            .operate_dependency(
                "psp",
                DependencyOp::Pause {
                    until: Some(ms(T0 - 1)),
                },
                &op(),
                now,
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("until"), "{e}");
        let audit = s.audit(None, 10).await.unwrap();
        let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(
            actions,
            vec!["dependency_resume", "dependency_pause", "dependency_pause"]
        );
        assert_eq!(audit[1].target, json!({"dependency": "psp", "until": null}));
        assert_eq!(audit[2].target["dependency"], "psp");
    }

    pub(super) async fn forced_breakers_decide_claims(s: &Store) {
        let now = ms(T0);
        let id = s
            .enqueue(&job("q").dependency("psp"), now)
            .await
            .unwrap()
            .job
            .id;
        // Forced open: nothing is claimed, whatever the time, and next_due does not spin.
        let d = s
            .operate_dependency(
                "psp",
                DependencyOp::Force(BreakerMode::ForcedOpen),
                &op(),
                now,
            )
            .await
            .unwrap();
        assert_eq!(d.flow.mode, BreakerMode::ForcedOpen);
        assert_eq!(d.flow.effective_state(), BreakerState::Open);
        assert!(
            s.claim(&claim_params("q", 1, ms(T0 + 3_600_000)))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(s.next_due(&["q".into()]).await.unwrap(), None);
        // The machine's breaker open (another process tripped it), but forced closed: claimed.
        s.set_breaker(&BreakerUpdate {
            dependency: "psp".into(),
            state: BreakerState::Open,
            open_until: Some(ms(T0 + 3_600_000)),
            probe_permits: 0,
            expect: None,
            reason: "failure rate".into(),
            now,
        })
        .await
        .unwrap();
        let d = s
            .operate_dependency(
                "psp",
                DependencyOp::Force(BreakerMode::ForcedClosed),
                &op(),
                now,
            )
            .await
            .unwrap();
        assert_eq!(d.flow.state, BreakerState::Open);
        assert_eq!(d.flow.effective_state(), BreakerState::Closed);
        let got = s.claim(&claim_params("q", 1, now)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].id, id);
        s.complete(&with(
            &got[0],
            Transition::Deferred {
                until: now,
                reason: DeferReason::BreakerOpen,
                delay: Duration::ZERO,
            },
            now,
        ))
        .await
        .unwrap();
        // Auto: back to the machine, from closed.
        let d = s
            .operate_dependency("psp", DependencyOp::Force(BreakerMode::Normal), &op(), now)
            .await
            .unwrap();
        assert_eq!(
            (d.flow.mode, d.flow.state, d.flow.open_until),
            (BreakerMode::Normal, BreakerState::Closed, None)
        );
        assert_eq!(s.claim(&claim_params("q", 1, now)).await.unwrap().len(), 1);
        // The transitions are in the history, naming who forced them.
        let ev = s.dependency_events(Some("psp"), 10).await.unwrap();
        assert!(
            ev.iter()
                .any(|e| e.to == BreakerState::Open && e.reason.contains("alice")),
            "{ev:?}"
        );
        let audit = s.audit(None, 10).await.unwrap();
        let modes: Vec<&str> = audit
            .iter()
            .map(|e| e.target["mode"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(modes, vec!["auto", "closed", "open"]);
        assert!(
            audit
                .iter()
                .all(|e| e.action == "breaker_force" && e.rows == 1)
        );
    }

    pub(super) async fn run_now_brings_jobs_forward_keeping_budgets(s: &Store) {
        let now = ms(T0);
        let later = ms(T0 + 3_600_000);
        let scheduled = s
            .enqueue(&job("q").run_at(later), now)
            .await
            .unwrap()
            .job
            .id;
        // A deferred job that has used one attempt.
        let deferred = s.enqueue(&job("q").max_attempts(5), now).await.unwrap().job;
        let j = &s.claim(&claim_params("q", 10, now)).await.unwrap()[0];
        assert_eq!(j.id, deferred.id);
        s.complete(&with(
            j,
            Transition::Deferred {
                until: later,
                reason: DeferReason::Backoff,
                delay: Duration::from_secs(3600),
            },
            now,
        ))
        .await
        .unwrap();
        let before = s.get(deferred.id).await.unwrap().unwrap();
        assert_eq!(before.state, JobState::Deferred);
        assert!(
            s.claim(&claim_params("q", 10, now))
                .await
                .unwrap()
                .is_empty()
        );
        // A dry run changes nothing.
        let f = JobFilter::ids(vec![scheduled, deferred.id]);
        let dry = s
            .bulk(BulkAction::RunNow, &f, &op(), true, now)
            .await
            .unwrap();
        assert_eq!((dry.count, dry.dry_run), (2, true));
        assert_eq!(s.get(scheduled).await.unwrap().unwrap().run_at, later);
        assert!(s.audit(None, 10).await.unwrap().is_empty());
        let out = s
            .bulk(BulkAction::RunNow, &f, &op(), false, now)
            .await
            .unwrap();
        assert_eq!(out.ids, vec![scheduled, deferred.id]);
        let after = s.get(deferred.id).await.unwrap().unwrap();
        assert_eq!(after.run_at, now);
        // Budgets untouched.
        assert_eq!(
            (
                after.attempts,
                after.max_attempts,
                after.defers,
                after.first_attempt_at,
                after.deadline
            ),
            (
                before.attempts,
                before.max_attempts,
                before.defers,
                before.first_attempt_at,
                before.deadline
            )
        );
        assert_eq!(s.claim(&claim_params("q", 10, now)).await.unwrap().len(), 2);
        // Jobs already due, running or finished are not "brought forward".
        let again = s
            .bulk(BulkAction::RunNow, &f, &op(), false, now)
            .await
            .unwrap();
        assert_eq!(again.count, 0);
        let audit = s.audit(None, 10).await.unwrap();
        assert_eq!(audit.len(), 2);
        assert_eq!((audit[1].action.as_str(), audit[1].rows), ("run_now", 2));
        assert_eq!(audit[1].target, json!({"ids": [scheduled, deferred.id]}));
    }

    pub(super) async fn bulk_actions_by_filter_dry_run_and_audit(s: &Store) {
        let now = ms(T0);
        let mut mk = Vec::new();
        for (q, kind, dep) in [
            ("a", "http", Some("psp-1")),
            ("a", "http", Some("psp-2")),
            ("a", "charge", None),
            ("b", "http", Some("psp-1")),
        ] {
            let mut j = NewJob::new(q, kind, json!({}));
            if let Some(d) = dep {
                j = j.dependency(d);
            }
            mk.push(s.enqueue(&j, now).await.unwrap().job.id);
        }
        for q in ["a", "b"] {
            for j in s.claim(&claim_params(q, 10, now)).await.unwrap() {
                let (reason, err) = if j.id == mk[0] {
                    (DeadReason::Permanent, "card ch_12345678 declined (code 51)")
                } else if j.id == mk[1] {
                    (DeadReason::Permanent, "card ch_87654321 declined (code 05)")
                } else {
                    (DeadReason::AttemptsExhausted, "HTTP 503")
                };
                kill(s, &j, reason, err, now).await;
            }
        }
        let waiting = s
            .enqueue(&NewJob::new("a", "http", json!({})), now)
            .await
            .unwrap()
            .job
            .id;
        let dead = |ids: &[i64]| {
            let ids = ids.to_vec();
            async move {
                let mut n = 0;
                for id in ids {
                    if s.get(id)
                        .await
                        .unwrap()
                        .is_some_and(|j| j.state == JobState::Dead)
                    {
                        n += 1;
                    }
                }
                n
            }
        };
        // Dry runs of every action change nothing and write no audit row.
        for action in BulkAction::ALL {
            let out = s
                .bulk(action, &JobFilter::default(), &op(), true, now)
                .await
                .unwrap();
            assert!(out.dry_run);
            let want = match action {
                BulkAction::Replay | BulkAction::Purge => mk.clone(),
                BulkAction::Cancel => vec![waiting],
                BulkAction::RunNow => vec![],
            };
            assert_eq!(out.ids, want, "{action:?}");
        }
        assert_eq!(dead(&mk).await, 4);
        assert_eq!(
            s.get(waiting).await.unwrap().unwrap().state,
            JobState::Available
        );
        assert!(s.audit(None, 10).await.unwrap().is_empty());
        // Each filter.
        let by = |f: JobFilter| async move {
            s.bulk(BulkAction::Replay, &f, &op(), true, now)
                .await
                .unwrap()
                .ids
        };
        assert_eq!(
            by(JobFilter {
                queue: Some("b".into()),
                ..Default::default()
            })
            .await,
            vec![mk[3]]
        );
        assert_eq!(
            by(JobFilter {
                kind: Some("charge".into()),
                ..Default::default()
            })
            .await,
            vec![mk[2]]
        );
        assert_eq!(
            by(JobFilter {
                dependency: Some("psp-1".into()),
                ..Default::default()
            })
            .await,
            vec![mk[0], mk[3]]
        );
        assert_eq!(
            by(JobFilter {
                dead_reason: Some("permanent".into()),
                ..Default::default()
            })
            .await,
            vec![mk[0], mk[1]]
        );
        let sig = error_signature("card ch_12345678 declined (code 51)");
        assert_eq!(
            by(JobFilter {
                signature: Some(sig.clone()),
                ..Default::default()
            })
            .await,
            vec![mk[0], mk[1]]
        );
        assert_eq!(
            by(JobFilter {
                queue: Some("a".into()),
                dependency: Some("psp-1".into()),
                ..Default::default()
            })
            .await,
            vec![mk[0]]
        );
        // Replay by signature, purge by queue, cancel by kind: each audited once.
        let sig_filter = JobFilter {
            signature: Some(sig),
            ..Default::default()
        };
        let r = s
            .bulk(BulkAction::Replay, &sig_filter, &op(), false, now)
            .await
            .unwrap();
        assert_eq!(r.ids, vec![mk[0], mk[1]]);
        let j = s.get(mk[0]).await.unwrap().unwrap();
        assert_eq!(
            (j.state, j.attempts, j.replays),
            (JobState::Available, 0, 1)
        );
        let b = JobFilter {
            queue: Some("b".into()),
            ..Default::default()
        };
        let p = s
            .bulk(BulkAction::Purge, &b, &op(), false, now)
            .await
            .unwrap();
        assert_eq!(p.ids, vec![mk[3]]);
        assert!(s.get(mk[3]).await.unwrap().is_none());
        assert!(s.attempts(mk[3]).await.unwrap().is_empty());
        let c = s
            .bulk(
                BulkAction::Cancel,
                &JobFilter {
                    kind: Some("http".into()),
                    ..Default::default()
                },
                &Actor::new("ops-token", "api"),
                false,
                now,
            )
            .await
            .unwrap();
        assert_eq!(c.ids, vec![mk[0], mk[1], waiting]);
        assert_eq!(
            s.get(waiting).await.unwrap().unwrap().state,
            JobState::Cancelled
        );
        // The charge job is still dead: no filter took it.
        assert_eq!(dead(&[mk[2]]).await, 1);
        let audit = s.audit(None, 10).await.unwrap();
        let seen: Vec<(&str, &str, u64)> = audit
            .iter()
            .map(|e| (e.action.as_str(), e.actor.as_str(), e.rows))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("cancel", "ops-token", 3),
                ("purge", "alice", 1),
                ("replay", "alice", 2)
            ]
        );
        assert_eq!(audit[0].via, "api");
        assert_eq!(audit[0].target, json!({"kind": "http"}));
        assert_eq!(audit[1].target, json!({"queue": "b"}));
        // Ids and filters must be valid.
        let e = s
            .bulk(
                BulkAction::Replay,
                &JobFilter {
                    queue: Some(String::new()),
                    ..Default::default()
                },
                &op(),
                false,
                now,
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("queue"), "{e}");
    }

    pub(super) async fn dead_since_and_oldest_due_for_alerts(s: &Store) {
        let t = |d: i64| ms(T0 + d);
        let a = s.enqueue(&job("a"), t(0)).await.unwrap().job.id;
        let b = s.enqueue(&job("b"), t(0)).await.unwrap().job.id;
        s.enqueue(&job("c").run_at(t(50_000)), t(0)).await.unwrap();
        let jb = s.claim(&claim_params("b", 1, t(1_000))).await.unwrap();
        kill(s, &jb[0], DeadReason::Permanent, "x", t(2_000)).await;
        let ja = s.claim(&claim_params("a", 1, t(3_000))).await.unwrap();
        kill(s, &ja[0], DeadReason::Permanent, "y", t(3_000)).await;
        let ids = |v: Vec<Job>| v.into_iter().map(|j| j.id).collect::<Vec<_>>();
        // By the time they died, then id.
        assert_eq!(ids(s.dead_since(t(0), 10).await.unwrap()), vec![b, a]);
        assert_eq!(ids(s.dead_since(t(2_001), 10).await.unwrap()), vec![a]);
        assert_eq!(ids(s.dead_since(t(0), 1).await.unwrap()), vec![b]);
        // The oldest due job per queue: c is not due yet; then it is.
        s.enqueue(&job("d").run_at(t(10)), t(0)).await.unwrap();
        s.enqueue(&job("d").run_at(t(20)), t(0)).await.unwrap();
        assert_eq!(
            s.oldest_due(t(40_000)).await.unwrap(),
            vec![("d".into(), t(10))]
        );
        let due = s.oldest_due(t(60_000)).await.unwrap();
        assert_eq!(due, vec![("c".into(), t(50_000)), ("d".into(), t(10))]);
        // A paused queue is left out.
        s.pause_queue("d", &op(), t(0)).await.unwrap();
        assert_eq!(
            s.oldest_due(t(60_000)).await.unwrap(),
            vec![("c".into(), t(50_000))]
        );
    }
}

/// SQLite only: the file under a running store.
mod sqlite_file {
    use super::*;

    async fn open() -> (tempfile::TempDir, std::path::PathBuf, Store) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.db");
        let store = Store::connect(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        (dir, path, store)
    }

    /// A deleted file: the enqueue is committed into the unlinked file, which the next start
    /// will not see, so it must not be acknowledged; the write check fails too.
    #[tokio::test]
    async fn a_deleted_file_is_not_acknowledged() {
        let (_dir, path, store) = open().await;
        let now = ms(T0);
        store.enqueue(&job("q"), now).await.unwrap();
        store.check_writable("t", now).await.unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let e = store.enqueue(&job("q"), now).await.unwrap_err();
        assert!(matches!(e, StoreError::FileChanged { .. }), "{e}");
        assert!(e.to_string().contains("q.db"), "{e}");
        assert!(e.to_string().contains("deleted"), "{e}");
        let e = store.enqueue_many(&[job("q")], now).await.unwrap_err();
        assert!(matches!(e, StoreError::FileChanged { .. }), "{e}");
        let e = store.check_writable("t", now).await.unwrap_err();
        assert!(matches!(e, StoreError::FileChanged { .. }), "{e}");
        assert!(store.check_file().is_err());
    }

    /// A file put in the place of the one opened (a restore, a copy over it) is another file.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_replaced_file_is_not_acknowledged() {
        let (dir, path, store) = open().await;
        let now = ms(T0);
        let other = dir.path().join("other.db");
        std::fs::write(&other, b"").unwrap();
        std::fs::rename(&other, &path).unwrap();
        let e = store.enqueue(&job("q"), now).await.unwrap_err();
        assert!(e.to_string().contains("another file"), "{e}");
    }

    #[tokio::test]
    async fn an_in_memory_database_has_no_file_to_check() {
        let store = Store::connect("sqlite::memory:").await.unwrap();
        store.check_file().unwrap();
        store.enqueue(&job("q"), ms(T0)).await.unwrap();
        store.check_writable("t", ms(T0)).await.unwrap();
    }
}

/// Retention and periodic jobs (issue 17, items 4 and 5): the pruner's lease, batch pruning,
/// and schedules fired by concurrent schedulers. The same harness, as `retention::sqlite::NAME`
/// and `retention::postgres::NAME`.
mod retention {
    use super::*;

    both_backends!(
        pruner_lease_one_contender_wins_and_expiry_lets_the_other,
        prune_batches_take_only_finished_jobs_older_than_the_age,
        four_concurrent_schedulers_make_one_job_per_tick,
        schedules_upsert_keep_their_place_and_missed_ticks_follow_the_rule,
    );

    mod cases {
        use super::*;

        async fn count(s: &Store, sql: &str) -> i64 {
            match s {
                Store::Sqlite(x) => sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
                    .fetch_one(x.pool())
                    .await
                    .unwrap(),
                Store::Postgres(x) => sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
                    .fetch_one(x.pool())
                    .await
                    .unwrap(),
            }
        }

        pub(in super::super) async fn pruner_lease_one_contender_wins_and_expiry_lets_the_other(
            s: &Store,
        ) {
            let ttl = Duration::from_secs(30);
            let now = ms(T0);
            // Two contenders at the same instant: exactly one wins.
            let (a, b) = tokio::join!(
                s.acquire_lease(PRUNER_LEASE, "a", ttl, now),
                s.acquire_lease(PRUNER_LEASE, "b", ttl, now)
            );
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!(a ^ b, "exactly one holds the lease: a {a}, b {b}");
            let (winner, loser) = if a { ("a", "b") } else { ("b", "a") };
            assert_eq!(
                s.lease_holder(PRUNER_LEASE, now).await.unwrap(),
                Some((winner.to_owned(), ms(T0 + 30_000)))
            );
            // The holder renews; the other keeps failing while the lease runs.
            assert!(
                s.acquire_lease(PRUNER_LEASE, winner, ttl, ms(T0 + 20_000))
                    .await
                    .unwrap()
            );
            assert!(
                !s.acquire_lease(PRUNER_LEASE, loser, ttl, ms(T0 + 49_999))
                    .await
                    .unwrap()
            );
            // The holder crashes (no more renewals): once its lease has run out the other
            // takes it, and the old holder cannot renew any more.
            assert!(
                s.acquire_lease(PRUNER_LEASE, loser, ttl, ms(T0 + 50_000))
                    .await
                    .unwrap()
            );
            assert!(
                !s.acquire_lease(PRUNER_LEASE, winner, ttl, ms(T0 + 50_001))
                    .await
                    .unwrap()
            );
            assert_eq!(
                s.lease_holder(PRUNER_LEASE, ms(T0 + 50_001))
                    .await
                    .unwrap()
                    .map(|h| h.0),
                Some(loser.to_owned())
            );
            // Giving it up lets the other in at once; only the holder can give it up.
            assert!(!s.release_lease(PRUNER_LEASE, winner).await.unwrap());
            assert!(s.release_lease(PRUNER_LEASE, loser).await.unwrap());
            assert!(
                s.lease_holder(PRUNER_LEASE, ms(T0 + 50_002))
                    .await
                    .unwrap()
                    .is_none()
            );
            assert!(
                s.acquire_lease(PRUNER_LEASE, winner, ttl, ms(T0 + 50_002))
                    .await
                    .unwrap()
            );
            // Leases of other names are independent.
            assert!(
                s.acquire_lease("other", loser, ttl, ms(T0 + 50_002))
                    .await
                    .unwrap()
            );
            let e = s.acquire_lease("", "a", ttl, now).await.unwrap_err();
            assert!(
                matches!(e, StoreError::Invalid { field: "name", .. }),
                "{e}"
            );
            let e = s
                .acquire_lease("x", "a", Duration::ZERO, now)
                .await
                .unwrap_err();
            assert!(matches!(e, StoreError::Invalid { field: "ttl", .. }), "{e}");
        }

        pub(in super::super) async fn prune_batches_take_only_finished_jobs_older_than_the_age(
            s: &Store,
        ) {
            const DAY: i64 = 86_400_000;
            let old = ms(T0);
            let young = ms(T0 + 10 * DAY);
            // Finished jobs, each with one attempt: 5 succeeded long ago, 2 recently,
            // 3 cancelled long ago, 2 dead long ago.
            let mut finished = std::collections::HashMap::new();
            for (state, at, n) in [
                (JobState::Succeeded, old, 5),
                (JobState::Succeeded, young, 2),
                (JobState::Dead, old, 2),
            ] {
                let q = format!("{}-{}", state.as_str(), n);
                for _ in 0..n {
                    s.enqueue(&job(&q), at).await.unwrap();
                }
                for j in s.claim(&claim_params(&q, 10, at)).await.unwrap() {
                    let c = if state == JobState::Dead {
                        with(
                            &j,
                            Transition::Dead {
                                reason: DeadReason::Permanent,
                            },
                            at,
                        )
                    } else {
                        done(&j, at)
                    };
                    s.complete(&c).await.unwrap();
                    finished.insert(j.id, (state, at));
                }
            }
            for _ in 0..3 {
                let id = s.enqueue(&job("c"), old).await.unwrap().job.id;
                s.cancel(id, old).await.unwrap();
                finished.insert(id, (JobState::Cancelled, old));
            }
            // Jobs that are not finished, however old: available, scheduled, deferred, running.
            let available = s.enqueue(&job("live"), old).await.unwrap().job.id;
            let scheduled = s
                .enqueue(&job("live").run_at(ms(T0 + 20 * DAY)), old)
                .await
                .unwrap()
                .job
                .id;
            let r = s.enqueue(&job("run"), old).await.unwrap().job.id;
            let running = s.claim(&claim_params("run", 1, old)).await.unwrap();
            assert_eq!(running[0].id, r);
            let d = s.enqueue(&job("def"), old).await.unwrap().job.id;
            let j = s
                .claim(&claim_params("def", 1, old))
                .await
                .unwrap()
                .remove(0);
            s.complete(&with(
                &j,
                Transition::Deferred {
                    until: ms(T0 + 1),
                    reason: DeferReason::Backoff,
                    delay: Duration::from_millis(1),
                },
                old,
            ))
            .await
            .unwrap();
            assert_eq!(count(s, "SELECT COUNT(*) FROM redrive_attempts").await, 10);

            // Only finished states can be pruned.
            for st in [
                JobState::Available,
                JobState::Running,
                JobState::Scheduled,
                JobState::Deferred,
            ] {
                let e = s.prune_batch(st, ms(T0 + 100 * DAY), 10).await.unwrap_err();
                assert!(
                    matches!(e, StoreError::Invalid { field: "state", .. }),
                    "{e}"
                );
            }
            let e = s.prune_batch(JobState::Dead, young, 0).await.unwrap_err();
            assert!(
                matches!(e, StoreError::Invalid { field: "limit", .. }),
                "{e}"
            );

            // What would go: succeeded before a day after the old ones.
            let cut = ms(T0 + DAY);
            assert_eq!(
                s.prune_preview(JobState::Succeeded, cut).await.unwrap(),
                Pruned {
                    jobs: 5,
                    attempts: 5
                }
            );
            assert_eq!(
                s.prune_preview(JobState::Cancelled, cut).await.unwrap(),
                Pruned {
                    jobs: 3,
                    attempts: 0
                }
            );
            // In batches of 2: 2, 2, 1, then nothing.
            let mut batches = Vec::new();
            loop {
                let p = s.prune_batch(JobState::Succeeded, cut, 2).await.unwrap();
                batches.push(p.jobs);
                if p.jobs < 2 {
                    break;
                }
            }
            assert_eq!(batches, [2, 2, 1]);
            assert_eq!(
                s.prune_preview(JobState::Succeeded, cut).await.unwrap(),
                Pruned::default()
            );
            // The finished-before bound is exclusive: a job finished at the cut stays.
            assert_eq!(
                s.prune_batch(JobState::Dead, old, 100).await.unwrap(),
                Pruned::default()
            );
            assert_eq!(
                s.prune_batch(JobState::Dead, cut, 100).await.unwrap(),
                Pruned {
                    jobs: 2,
                    attempts: 2
                }
            );
            assert_eq!(
                s.prune_batch(JobState::Cancelled, cut, 100).await.unwrap(),
                Pruned {
                    jobs: 3,
                    attempts: 0
                }
            );
            for (id, (state, at)) in &finished {
                let gone = s.get(*id).await.unwrap().is_none();
                assert_eq!(gone, *at == old, "job {id} ({state}) finished at {at}");
                if gone {
                    assert!(
                        s.attempts(*id).await.unwrap().is_empty(),
                        "its attempts went too"
                    );
                }
            }
            // The two recent successes and their attempts, and every unfinished job, stay.
            for id in [available, scheduled, r, d] {
                assert!(
                    s.get(id).await.unwrap().is_some(),
                    "job {id} is not finished"
                );
            }
            assert_eq!(
                count(s, "SELECT COUNT(*) FROM redrive_attempts").await,
                3,
                "the 2 recent successes' and the deferred job's attempts"
            );
            // Past everything: only the finished ones go, never the others.
            for st in FINISHED_STATES {
                s.prune_batch(st, ms(T0 + 1000 * DAY), 1000).await.unwrap();
            }
            assert_eq!(count(s, "SELECT COUNT(*) FROM redrive_jobs").await, 4);
            // The running job's lease still holds: it completes normally.
            s.complete(&done(&running[0], old)).await.unwrap();
        }

        fn every_second(name: &str, missed: Missed) -> ScheduleSpec {
            ScheduleSpec {
                name: name.into(),
                cron: "* * * * * *".into(),
                missed,
                job: NewJob::new("ticks", "noop", json!({"from": name})),
            }
        }

        pub(in super::super) async fn four_concurrent_schedulers_make_one_job_per_tick(s: &Store) {
            let (sched, created) = s
                .upsert_schedule(&every_second("every", Missed::All), "api", ms(T0))
                .await
                .unwrap();
            assert!(created);
            assert_eq!(sched.next_tick, Some(ms(T0 + 1000)));
            // A simulated clock in steps of 300 ms over 21 s; at each step four schedulers
            // fire at once, each with its own view of now (0 to 120 ms apart).
            let mut made = 0;
            let mut seen = 0;
            let mut latest = ms(T0);
            for step in 1..=70 {
                let base = T0 + step * 300;
                let runs = (0..4i64).map(|i| {
                    let s = s.clone();
                    tokio::spawn(async move { s.fire_schedules(ms(base + i * 40)).await })
                });
                for r in futures::future::join_all(runs).await {
                    let fired = r.unwrap().unwrap();
                    made += fired.iter().filter(|f| f.created).count();
                    seen += fired.len();
                }
                latest = ms(base + 120);
            }
            let page = s
                .list(&ListParams {
                    queue: Some("ticks".into()),
                    limit: Some(1000),
                    ..Default::default()
                })
                .await
                .unwrap();
            let ticks = (latest.timestamp_millis() - T0) / 1000;
            assert_eq!(ticks, 21);
            let mut keys: Vec<String> = page.jobs.iter().filter_map(|j| j.key.clone()).collect();
            keys.sort();
            let want: Vec<String> = (1..=ticks)
                .map(|k| tick_key("every", ms(T0 + k * 1000)))
                .collect();
            assert_eq!(keys, want, "one job per tick, no gap, no duplicate");
            assert_eq!(page.jobs.len() as i64, ticks);
            assert_eq!(made as i64, ticks, "each tick's job created once");
            assert!(seen >= made);
            for j in &page.jobs {
                // The job runs at its tick, with the schedule's payload.
                assert_eq!(j.key.as_deref(), Some(tick_key("every", j.run_at).as_str()));
                assert_eq!(j.payload, json!({"from": "every"}));
            }
            let sched = s.schedule("every").await.unwrap().unwrap();
            assert_eq!(sched.last_tick, Some(ms(T0 + ticks * 1000)));
            assert_eq!(sched.next_tick, Some(ms(T0 + (ticks + 1) * 1000)));
            assert!(page.jobs.iter().any(|j| Some(j.id) == sched.last_job_id));
        }

        pub(in super::super) async fn schedules_upsert_keep_their_place_and_missed_ticks_follow_the_rule(
            s: &Store,
        ) {
            // Bad input names the field.
            let mut bad = every_second("x", Missed::Skip);
            bad.cron = "every second".into();
            let e = s.upsert_schedule(&bad, "api", ms(T0)).await.unwrap_err();
            assert!(
                matches!(e, StoreError::Invalid { field: "cron", .. }),
                "{e}"
            );
            bad = every_second("", Missed::Skip);
            let e = s.upsert_schedule(&bad, "api", ms(T0)).await.unwrap_err();
            assert!(
                matches!(e, StoreError::Invalid { field: "name", .. }),
                "{e}"
            );
            bad = every_second(&"n".repeat(201), Missed::Skip);
            let e = s.upsert_schedule(&bad, "api", ms(T0)).await.unwrap_err();
            assert!(
                matches!(e, StoreError::Invalid { field: "name", .. }),
                "{e}"
            );
            bad = every_second("x", Missed::Skip);
            bad.job.queue = String::new();
            let e = s.upsert_schedule(&bad, "api", ms(T0)).await.unwrap_err();
            assert!(
                matches!(e, StoreError::Invalid { field: "queue", .. }),
                "{e}"
            );
            bad = every_second("x", Missed::Skip);
            bad.cron = "0 0 0 1 1 * 2001".into();
            let e = s.upsert_schedule(&bad, "api", ms(T0)).await.unwrap_err();
            assert!(e.to_string().contains("no tick after now"), "{e}");
            assert!(s.schedules().await.unwrap().is_empty());

            // Three minutely schedules, one per rule, created at T0.
            for (name, missed) in [
                ("skip", Missed::Skip),
                ("last", Missed::Last),
                ("all", Missed::All),
            ] {
                let mut spec = every_second(name, missed);
                spec.cron = "0 * * * * *".into();
                spec.job.queue = name.into();
                s.upsert_schedule(&spec, "policies", ms(T0)).await.unwrap();
            }
            // A restart upserts them again 30 s later: same expression, same place.
            let mut spec = every_second("last", Missed::Last);
            spec.cron = "0 * * * * *".into();
            spec.job.queue = "last".into();
            spec.job.priority = 7;
            let (again, created) = s
                .upsert_schedule(&spec, "policies", ms(T0 + 30_000))
                .await
                .unwrap();
            assert!(!created);
            assert_eq!(again.next_tick, Some(ms(T0 + 60_000)));
            assert_eq!(again.priority, 7, "the other fields are replaced");
            let names: Vec<String> = s
                .schedules()
                .await
                .unwrap()
                .into_iter()
                .map(|x| x.name)
                .collect();
            assert_eq!(names, ["all", "last", "skip"]);
            assert_eq!(s.next_schedule_tick().await.unwrap(), Some(ms(T0 + 60_000)));

            // Nobody fired for ten minutes and a half: ticks 1m..10m were missed.
            let now = ms(T0 + 630_000);
            let fired = s.fire_schedules(now).await.unwrap();
            let per = |q: &str| fired.iter().filter(|f| f.schedule == q).count();
            assert_eq!((per("skip"), per("last"), per("all")), (0, 1, 10));
            let last = fired.iter().find(|f| f.schedule == "last").unwrap();
            assert_eq!(last.tick, ms(T0 + 600_000));
            let job = s.get(last.job_id).await.unwrap().unwrap();
            assert_eq!((job.queue.as_str(), job.priority), ("last", 7));
            assert_eq!(job.state, JobState::Available);
            // Every schedule moved past now; nothing more until the next tick.
            for x in s.schedules().await.unwrap() {
                assert_eq!(x.next_tick, Some(ms(T0 + 660_000)), "{}", x.name);
            }
            assert!(s.fire_schedules(ms(T0 + 659_999)).await.unwrap().is_empty());
            // The next tick, on time, is enqueued whatever the rule.
            let fired = s.fire_schedules(ms(T0 + 660_500)).await.unwrap();
            assert_eq!(fired.len(), 3);
            assert!(
                fired
                    .iter()
                    .all(|f| f.created && f.tick == ms(T0 + 660_000))
            );

            // A new expression starts from its first tick after the upsert.
            spec.cron = "30 * * * * *".into();
            let (moved, _) = s
                .upsert_schedule(&spec, "api", ms(T0 + 661_000))
                .await
                .unwrap();
            assert_eq!(moved.next_tick, Some(ms(T0 + 690_000)));
            assert_eq!(moved.origin, "api");
            // Removed: no more ticks; its jobs stay.
            assert!(s.remove_schedule("last").await.unwrap());
            assert!(!s.remove_schedule("last").await.unwrap());
            assert!(s.schedule("last").await.unwrap().is_none());
            assert!(s.get(last.job_id).await.unwrap().is_some());
            let fired = s.fire_schedules(ms(T0 + 720_000)).await.unwrap();
            assert!(fired.iter().all(|f| f.schedule != "last"));
        }
    }
}

/// Card declines and per-card reattempt quotas (issue 18): the quota is counted atomically
/// across concurrent workers. As `declines::sqlite::NAME` and `declines::postgres::NAME`.
mod declines {
    use super::*;

    both_backends!(
        eight_workers_forty_declined_jobs_of_one_card_take_at_most_fifteen_reattempts,
        quota_key_is_stored_and_a_card_number_is_refused,
        declines_are_recorded_with_their_advice,
        a_full_window_frees_when_its_oldest_reattempt_leaves,
        quota_use_counts_each_window_and_when_it_frees,
        a_stopping_decline_commits_with_its_attempt_and_stops_the_card_until_lifted,
    );

    mod cases {
        use super::*;
        use redrive_policy::{DeclineAdvice, Network, QuotaWindow};
        use std::sync::Arc;
        use std::sync::atomic::AtomicU32;

        const DAY: Duration = Duration::from_secs(86_400);

        fn visa_15() -> Vec<QuotaWindow> {
            vec![QuotaWindow::new(15, DAY * 30).unwrap()]
        }

        pub(crate) async fn eight_workers_forty_declined_jobs_of_one_card_take_at_most_fifteen_reattempts(
            s: &Store,
        ) {
            let now = ms(T0);
            let jobs: Vec<NewJob> = (0..40)
                .map(|i| {
                    job("subs")
                        .key(format!("renewal-{i}"))
                        .quota_key("fp_card_1")
                })
                .collect();
            s.enqueue_many(&jobs, now).await.unwrap();
            let taken = Arc::new(AtomicU32::new(0));
            let full = Arc::new(AtomicU32::new(0));
            let mut tasks = Vec::new();
            for w in 0..8 {
                let (s, taken, full) = (s.clone(), taken.clone(), full.clone());
                tasks.push(tokio::spawn(async move {
                    let mut p = claim_params("subs", 1, now);
                    p.worker = format!("w{w}");
                    loop {
                        let jobs = s.claim(&p).await.unwrap();
                        let Some(j) = jobs.first() else { break };
                        assert_eq!(j.quota_key.as_deref(), Some("fp_card_1"));
                        // The first attempt is declined category 2; then two reattempts each.
                        let advice = DeclineAdvice::visa("51", Some(2)).unwrap();
                        s.record_decline(&NewDecline {
                            job_id: j.id,
                            attempt: 1,
                            quota_key: j.quota_key.clone(),
                            advice,
                            at: now,
                            stop_for: None,
                        })
                        .await
                        .unwrap();
                        for k in 0..2 {
                            let at = ms(T0 + 1000 * i64::from(w) + k);
                            let windows = visa_15();
                            let r = s
                                .take_reattempt(&ReattemptParams {
                                    quota_key: "fp_card_1",
                                    network: Network::Visa,
                                    windows: &windows,
                                    job_id: j.id,
                                    now: at,
                                })
                                .await
                                .unwrap();
                            match r {
                                QuotaTake::Taken => taken.fetch_add(1, Ordering::SeqCst),
                                QuotaTake::Full(f) => {
                                    assert!(f.until > at, "{f:?}");
                                    assert_eq!(f.window.max(), 15);
                                    full.fetch_add(1, Ordering::SeqCst)
                                }
                            };
                        }
                        s.complete(&with(
                            j,
                            Transition::Dead {
                                reason: DeadReason::ReattemptQuota,
                            },
                            now,
                        ))
                        .await
                        .unwrap();
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(
                taken.load(Ordering::SeqCst),
                15,
                "exactly the quota, never more"
            );
            assert_eq!(full.load(Ordering::SeqCst), 80 - 15);
            let counted = s.reattempts("fp_card_1", ms(0)).await.unwrap();
            assert_eq!(counted.len(), 15);
            assert!(counted.iter().all(|r| r.network == Network::Visa));
        }

        pub(crate) async fn quota_key_is_stored_and_a_card_number_is_refused(s: &Store) {
            let now = ms(T0);
            let e = s
                .enqueue(&job("q").quota_key("4242 4242 4242 4242"), now)
                .await
                .unwrap_err();
            let text = e.to_string();
            assert!(text.contains("quota_key"), "{text}");
            assert!(
                text.contains("4242") && !text.contains("4242 4242"),
                "{text}"
            );
            // Not Luhn-valid, or not 13–19 digits: a fine key.
            for ok in [
                "4242424242424241",
                "pm_1234567890123456",
                "123456789012345678901",
            ] {
                let j = s.enqueue(&job("q").quota_key(ok), now).await.unwrap().job;
                assert_eq!(j.quota_key.as_deref(), Some(ok));
                assert_eq!(
                    s.get(j.id).await.unwrap().unwrap().quota_key.as_deref(),
                    Some(ok)
                );
            }
            let windows = visa_15();
            let e = s
                .take_reattempt(&ReattemptParams {
                    quota_key: "5555555555554444",
                    network: Network::Mastercard,
                    windows: &windows,
                    job_id: 1,
                    now,
                })
                .await
                .unwrap_err();
            assert!(e.to_string().contains("quota_key"), "{e}");
        }

        pub(crate) async fn declines_are_recorded_with_their_advice(s: &Store) {
            let now = ms(T0);
            let j = s
                .enqueue(&job("q").quota_key("fp_2"), now)
                .await
                .unwrap()
                .job;
            for (n, a) in [
                DeclineAdvice::mastercard("51", Some(25)).unwrap(),
                DeclineAdvice::visa("14", None).unwrap(),
            ]
            .into_iter()
            .enumerate()
            {
                s.record_decline(&NewDecline {
                    job_id: j.id,
                    attempt: n as u32 + 1,
                    quota_key: Some("fp_2".into()),
                    advice: a,
                    at: ms(T0 + n as i64),
                    stop_for: None,
                })
                .await
                .unwrap();
            }
            let d = s.declines(j.id).await.unwrap();
            assert_eq!(d.len(), 2);
            assert_eq!(
                (
                    d[0].network,
                    d[0].code.as_deref(),
                    d[0].advice_code,
                    d[0].rule.as_str()
                ),
                (Network::Mastercard, Some("51"), Some(25), "retry_after 24h")
            );
            assert_eq!(
                (
                    d[1].network,
                    d[1].category,
                    d[1].rule.as_str(),
                    d[1].attempt
                ),
                (Network::Visa, Some(1), "never_retry", 2)
            );
        }

        pub(crate) async fn a_full_window_frees_when_its_oldest_reattempt_leaves(s: &Store) {
            // Mastercard-like: 2 per minute and 3 per hour.
            let windows = vec![
                QuotaWindow::new(2, Duration::from_secs(60)).unwrap(),
                QuotaWindow::new(3, Duration::from_secs(3600)).unwrap(),
            ];
            let take = |t: i64| {
                let windows = windows.clone();
                let s = s.clone();
                async move {
                    s.take_reattempt(&ReattemptParams {
                        quota_key: "fp_3",
                        network: Network::Mastercard,
                        windows: &windows,
                        job_id: 7,
                        now: ms(t),
                    })
                    .await
                    .unwrap()
                }
            };
            assert_eq!(take(T0).await, QuotaTake::Taken);
            assert_eq!(take(T0 + 10_000).await, QuotaTake::Taken);
            // The minute is full until the first leaves it (T0 + 60 s).
            match take(T0 + 20_000).await {
                QuotaTake::Full(f) => {
                    assert_eq!(f.until, ms(T0 + 60_000));
                    assert_eq!(f.window.max(), 2);
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(take(T0 + 60_000).await, QuotaTake::Taken);
            // Now the hour is full (3 in it) until T0 + 1 h.
            match take(T0 + 200_000).await {
                QuotaTake::Full(f) => {
                    assert_eq!((f.until, f.window.max()), (ms(T0 + 3_600_000), 3))
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(take(T0 + 3_600_000).await, QuotaTake::Taken);
            assert_eq!(
                s.reattempts("fp_3", ms(T0)).await.unwrap().len(),
                3,
                "after T0 only"
            );
        }

        pub(crate) async fn quota_use_counts_each_window_and_when_it_frees(s: &Store) {
            let minute = QuotaWindow::new(2, Duration::from_secs(60)).unwrap();
            let hour = QuotaWindow::new(3, Duration::from_secs(3600)).unwrap();
            let rules =
                redrive_policy::QuotaRules::none().with(Network::Mastercard, vec![minute, hour]);
            for t in [T0, T0 + 10_000, T0 + 70_000] {
                let taken = s
                    .take_reattempt(&ReattemptParams {
                        quota_key: "fp_4",
                        network: Network::Mastercard,
                        windows: &[minute, hour],
                        job_id: 8,
                        now: ms(t),
                    })
                    .await
                    .unwrap();
                assert_eq!(taken, QuotaTake::Taken, "at {t}");
            }
            let (windows, reattempts) = s.quota_use("fp_4", &rules, ms(T0 + 75_000)).await.unwrap();
            assert_eq!(reattempts.len(), 3);
            let seen: Vec<_> = windows
                .iter()
                .map(|w| (w.network, w.window.max(), w.used, w.frees_at))
                .collect();
            assert_eq!(
                seen,
                vec![
                    // The minute holds only the third; it leaves at T0 + 130 s.
                    (Network::Mastercard, 2, 1, Some(ms(T0 + 130_000))),
                    // The hour holds all three; the oldest leaves at T0 + 1 h.
                    (Network::Mastercard, 3, 3, Some(ms(T0 + 3_600_000))),
                ]
            );
            // Another card's use is its own; no reattempt: nothing frees.
            let (other, _) = s.quota_use("fp_5", &rules, ms(T0)).await.unwrap();
            assert!(other.iter().all(|w| w.used == 0 && w.frees_at.is_none()));
            assert_eq!(other.len(), 2);
        }

        /// Issue 41 items 2 and 6: a category-1 decline rides on its attempt's completion (one
        /// transaction, fenced like it), sets the card key's stop for the window given, and an
        /// operator's lift (audited) ends it and makes the key's waiting jobs due.
        pub(crate) async fn a_stopping_decline_commits_with_its_attempt_and_stops_the_card_until_lifted(
            s: &Store,
        ) {
            let now = ms(T0);
            let key = "fp_stop";
            let first = s.enqueue(&job("st").quota_key(key), now).await.unwrap().job;
            let waiting = s.enqueue(&job("st").quota_key(key), now).await.unwrap().job;
            let j = s
                .claim(&claim_params("st", 1, now))
                .await
                .unwrap()
                .remove(0);
            assert_eq!(j.id, first.id);
            let decline = |job_id, stop_for| NewDecline {
                job_id,
                attempt: 1,
                quota_key: Some(key.into()),
                advice: DeclineAdvice::visa("14", None).unwrap(),
                at: now,
                stop_for,
            };
            // A completion whose lease is not held records neither its attempt nor its decline.
            let mut stale = with(
                &j,
                Transition::Dead {
                    reason: DeadReason::DoNotRetry,
                },
                now,
            )
            .with_decline(decline(j.id, Some(DAY * 30)));
            stale.lease.token += 1;
            assert!(s.complete(&stale).await.unwrap_err().is_lease_lost());
            assert!(s.declines(j.id).await.unwrap().is_empty());
            assert_eq!(s.card_stop(key, now).await.unwrap(), None);
            // The real one: the attempt, its decline and the card stop together.
            let c = with(
                &j,
                Transition::Dead {
                    reason: DeadReason::DoNotRetry,
                },
                now,
            )
            .with_decline(decline(j.id, Some(DAY * 30)));
            s.complete(&c).await.unwrap();
            assert_eq!(s.attempts(j.id).await.unwrap().len(), 1);
            let d = s.declines(j.id).await.unwrap();
            assert_eq!((d.len(), d[0].rule.as_str()), (1, "never_retry"));
            let stop = s.card_stop(key, now).await.unwrap().expect("stopped");
            assert_eq!((stop.job_id, stop.attempt), (j.id, 1));
            assert_eq!((stop.network, stop.category), (Network::Visa, Some(1)));
            assert_eq!(stop.code.as_deref(), Some("14"));
            assert_eq!(stop.until, ms(T0) + chrono::Duration::days(30));
            let text = stop.describe();
            assert!(
                text.contains(&format!("job {} declined visa 14 cat 1", j.id))
                    && text.contains("never_retry"),
                "{text}"
            );
            assert_eq!(s.card_stops(now, 10).await.unwrap(), vec![stop.clone()]);
            // In force until its end, not after; another card is not stopped.
            let end = ms(T0) + chrono::Duration::days(30);
            assert!(
                s.card_stop(key, end - chrono::Duration::milliseconds(1))
                    .await
                    .unwrap()
                    .is_some()
            );
            assert_eq!(s.card_stop(key, end).await.unwrap(), None);
            assert_eq!(s.card_stop("fp_other", now).await.unwrap(), None);
            // A shorter stop does not shorten it; a longer one extends it.
            s.record_decline(&decline(waiting.id, Some(DAY)))
                .await
                .unwrap();
            assert_eq!(s.card_stop(key, now).await.unwrap().unwrap().until, end);
            s.record_decline(&decline(waiting.id, Some(DAY * 40)))
                .await
                .unwrap();
            let longer = s.card_stop(key, now).await.unwrap().unwrap();
            assert_eq!(
                (longer.job_id, longer.until),
                (waiting.id, ms(T0) + chrono::Duration::days(40))
            );
            // The other job waits for the stop (declines.card_stop = "wait").
            let w = s
                .claim(&claim_params("st", 1, now))
                .await
                .unwrap()
                .remove(0);
            assert_eq!(w.id, waiting.id);
            let mut wait = Completion::new(
                w.lease(),
                None,
                w.counters(),
                Transition::Deferred {
                    until: longer.until,
                    reason: DeferReason::CardStopped,
                    delay: DAY * 40,
                },
                now,
            );
            wait.error = Some(longer.describe());
            s.complete(&wait).await.unwrap();
            let w = s.get(waiting.id).await.unwrap().unwrap();
            assert_eq!(
                (w.run_at, w.defer_reason),
                (longer.until, Some(DeferReason::CardStopped))
            );
            // Lifted: audited, gone, and the waiting job is due at once.
            let later = ms(T0 + 60_000);
            let actor = Actor::new("alice", "cli");
            let lifted = s.lift_card_stop(key, &actor, later).await.unwrap();
            assert_eq!(lifted.map(|l| l.job_id), Some(waiting.id));
            assert_eq!(s.card_stop(key, later).await.unwrap(), None);
            assert_eq!(s.get(waiting.id).await.unwrap().unwrap().run_at, later);
            let a = s.audit(None, 1).await.unwrap().remove(0);
            assert_eq!(
                (a.action.as_str(), a.actor.as_str(), a.rows),
                ("card_stop_lift", "alice", 1)
            );
            assert_eq!(a.target["quota_key"], key);
            // Nothing to lift: audited with no row; a card number is refused.
            assert_eq!(s.lift_card_stop(key, &actor, later).await.unwrap(), None);
            assert_eq!(s.audit(None, 1).await.unwrap()[0].rows, 0);
            let e = s
                .lift_card_stop("4242424242424242", &actor, later)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("quota_key"), "{e}");
        }
    }
}

/// One clock for shared decisions (R24): leases are compared in the database's clock, which
/// a process reaches through its measured offset ([`Store::clock_offset`]).
mod db_clock {
    use super::*;

    both_backends!(
        a_claimer_ahead_by_half_the_lease_rescues_nothing_alive_through_the_db_clock,
        the_registry_keeps_each_workers_clock_offset,
    );

    mod cases {
        use super::*;
        use std::sync::Arc;

        /// A live worker's lease, claimed (in the database's clock) 4 s of a 6 s lease ago:
        /// 2 s left. A claimer whose own clock is 3 s ahead (half the lease) rescues nothing
        /// through its offset to the database; by its own clock, it would have taken the job
        /// from the live worker (the control).
        pub(crate) async fn a_claimer_ahead_by_half_the_lease_rescues_nothing_alive_through_the_db_clock(
            s: &Store,
        ) {
            let lease = Duration::from_secs(6);
            let db_now = s.db_time().await.unwrap();
            let host = (Utc::now() - db_now).num_milliseconds().abs();
            assert!(host < 5_000, "the database's clock is {host} ms from ours");
            let claimed_at = db_now - chrono::Duration::seconds(4);
            let job = s.enqueue(&job("q"), claimed_at).await.unwrap().job;
            let mut p = claim_params("q", 1, claimed_at);
            p.lease = lease;
            let claimed = s.claim(&p).await.unwrap();
            assert_eq!(claimed.len(), 1);
            let ahead: Arc<dyn Clock> = Arc::new(OffsetClock::new(
                Arc::new(SystemClock),
                chrono::Duration::seconds(3),
            ));
            let (offset, rtt) = s.clock_offset(&*ahead, 3).await.unwrap();
            let error = (offset + chrono::Duration::seconds(3))
                .num_milliseconds()
                .abs();
            assert!(
                error <= 1_000 + rtt.num_milliseconds(),
                "offset {offset} for a clock 3 s ahead (round trip {rtt})"
            );
            // Through the database's clock: the lease has about 2 s left.
            let synced = ahead.now() + offset;
            assert!(s.rescue(synced, 10).await.unwrap().is_empty());
            let j = s.get(job.id).await.unwrap().unwrap();
            assert_eq!(
                (j.state, j.lease_token),
                (JobState::Running, claimed[0].lease_token)
            );
            // The control: by its own clock, the lease ran out a second ago.
            let rescued = s.rescue(ahead.now(), 10).await.unwrap();
            assert_eq!(
                rescued.iter().map(|r| r.id).collect::<Vec<_>>(),
                [job.id],
                "an unsynced clock 3 s ahead takes the live lease"
            );
        }

        /// The registry stores each worker's measured offset: at registration, at each beat
        /// that brings one, kept by a beat that does not.
        pub(crate) async fn the_registry_keeps_each_workers_clock_offset(s: &Store) {
            let now = ms(s.db_time().await.unwrap().timestamp_millis());
            let w = WorkerInfo {
                name: "skewed".into(),
                host: "h".into(),
                pid: 1,
                queues: vec![],
                kinds: Kinds::Any,
                concurrency: 1,
                started_at: now,
                last_seen: now,
                clock_offset_ms: Some(-3_000),
                policy_version: None,
            };
            let unsynced = WorkerInfo {
                name: "unsynced".into(),
                clock_offset_ms: None,
                ..w.clone()
            };
            s.register_worker(&w, now).await.unwrap();
            s.register_worker(&unsynced, now).await.unwrap();
            let offsets = |ws: Vec<WorkerInfo>| -> Vec<(String, Option<i64>)> {
                ws.into_iter()
                    .map(|w| (w.name, w.clock_offset_ms))
                    .collect()
            };
            assert_eq!(
                offsets(s.workers(now).await.unwrap()),
                [("skewed".into(), Some(-3_000)), ("unsynced".into(), None)]
            );
            let later = now + chrono::Duration::seconds(10);
            assert!(
                s.worker_heartbeat_offset("skewed", later, Some(-2_950))
                    .await
                    .unwrap()
            );
            assert!(s.worker_heartbeat("unsynced", later).await.unwrap());
            let got = s.workers(later).await.unwrap();
            assert_eq!(
                offsets(got.clone()),
                [("skewed".into(), Some(-2_950)), ("unsynced".into(), None)]
            );
            assert_eq!(got[0].last_seen, later);
            // A beat without a new measurement keeps the last one.
            assert!(s.worker_heartbeat("skewed", later).await.unwrap());
            assert_eq!(
                s.workers(later).await.unwrap()[0].clock_offset_ms,
                Some(-2_950)
            );
        }
    }
}

/// Claims of every queue, and of more queues than a claim gives an arm each: the cost of a
/// claim must not grow with the number of queues (issue 36).
mod every_queue {
    use super::*;

    both_backends!(
        claim_of_every_queue_serves_each_queue_with_work_among_100000_names,
        claim_of_more_than_500_queues_takes_every_job,
        every_queue_and_long_lists_claim_in_the_order_of_the_arms,
        four_claimers_of_every_queue_claim_each_job_once,
    );

    /// A claim of `queues` (none: every queue) of up to `limit` jobs at `now`.
    fn claim_of(queues: &[String], limit: u32, now: Timestamp) -> ClaimParams {
        ClaimParams {
            queues: queues.to_vec(),
            kinds: Kinds::Any,
            worker: "w".into(),
            limit,
            lease: Duration::from_secs(30),
            now,
        }
    }

    /// `count` jobs spread over `queues` queues named `{prefix}-N`, seeded in bulk.
    async fn seed(s: &Store, prefix: &str, queues: u64, count: u64, rows: SeedRows, at: i64) {
        let seed = Seed {
            queue: prefix.into(),
            queues,
            kind: "noop".into(),
            count,
            rows,
            payload: json!({}),
            at: ms(at),
        };
        assert_eq!(s.seed(&seed).await.unwrap(), count);
    }

    /// The (priority, run_at, id) order of jobs: the order a claim takes them in.
    fn order(jobs: &[Job]) -> Vec<(i32, Timestamp, i64)> {
        jobs.iter().map(|j| (j.priority, j.run_at, j.id)).collect()
    }

    mod cases {
        use super::*;

        pub(crate) async fn claim_of_every_queue_serves_each_queue_with_work_among_100000_names(
            s: &Store,
        ) {
            let now = ms(T0);
            // History: 100,000 queues whose only job is finished. Work: 3,000 jobs over 1,000
            // other queues, and one urgent job.
            seed(
                s,
                "done",
                100_000,
                100_000,
                SeedRows::Succeeded,
                T0 - 60_000,
            )
            .await;
            seed(s, "wait", 1_000, 3_000, SeedRows::Available, T0 - 10_000).await;
            let urgent = s
                .enqueue(&job("wait-7").priority(-1), now)
                .await
                .unwrap()
                .job;
            // A paused queue is passed over, and its jobs stay as they were.
            assert!(
                s.pause_queue("wait-3", &Actor::new("alice", "cli"), now)
                    .await
                    .unwrap()
            );
            assert_eq!(
                s.next_due(&[]).await.unwrap(),
                Some(ms(T0 - 10_000)),
                "the idle wait of every queue"
            );
            let mut served = HashSet::new();
            let mut claims = 0;
            let mut taken: Vec<Job> = Vec::new();
            loop {
                let got = s.claim(&claim_of(&[], 200, now)).await.unwrap();
                if got.is_empty() {
                    break;
                }
                claims += 1;
                assert!(order(&got).is_sorted(), "one claim in claim order");
                if let Some(last) = taken.last() {
                    assert!(
                        order(std::slice::from_ref(last))[0] < order(&got[..1])[0],
                        "each claim goes on where the last one ended"
                    );
                }
                served.extend(got.iter().map(|j| j.queue.clone()));
                // Fair: the first 1,000 jobs (5 claims) reach every queue with work.
                if claims == 5 {
                    assert_eq!(served.len(), 999, "queues served in 5 claims of 200");
                }
                taken.extend(got);
            }
            assert_eq!(taken[0].id, urgent.id, "the urgent job first");
            assert_eq!(
                taken.len(),
                3_001 - 3,
                "every job but the paused queue's three"
            );
            assert!(!served.contains("wait-3"));
            assert!(served.iter().all(|q| q.starts_with("wait-")));
            let distinct: HashSet<i64> = taken.iter().map(|j| j.id).collect();
            assert_eq!(distinct.len(), taken.len(), "no job claimed twice");
            // Nothing else due but the paused queue's jobs, which wait for its resume.
            assert_eq!(s.next_due(&[]).await.unwrap(), None);
            assert!(
                s.resume_queue("wait-3", &Actor::new("alice", "cli"), now)
                    .await
                    .unwrap()
            );
            assert_eq!(s.next_due(&[]).await.unwrap(), Some(ms(T0 - 10_000)));
            let last = s.claim(&claim_of(&[], 200, now)).await.unwrap();
            assert_eq!(last.len(), 3);
            assert!(last.iter().all(|j| j.queue == "wait-3" && j.attempts == 0));
        }

        /// SQLite refused a claim of 501 queues or more ("too many terms in compound
        /// SELECT"): no job of any queue ran.
        pub(crate) async fn claim_of_more_than_500_queues_takes_every_job(s: &Store) {
            let now = ms(T0);
            let names: Vec<String> = (0..600).map(|i| format!("q{i:03}")).collect();
            let jobs: Vec<NewJob> = names.iter().map(|q| job(q)).collect();
            s.enqueue_many(&jobs, now).await.unwrap();
            // The list of every queue, then every queue unnamed: each job once.
            let mut ids = HashSet::new();
            for _ in 0..3 {
                for j in s.claim(&claim_of(&names, 200, now)).await.unwrap() {
                    assert!(ids.insert(j.id), "{} claimed twice", j.id);
                }
            }
            assert_eq!(ids.len(), 600);
            s.enqueue_many(&jobs, now).await.unwrap();
            assert_eq!(s.next_due(&names).await.unwrap(), Some(now));
            assert_eq!(
                s.next_due_for(&[], &Kinds::only(["noop"])).await.unwrap(),
                Some(now)
            );
            assert_eq!(
                s.next_due_for(&[], &Kinds::only(["charge"])).await.unwrap(),
                None
            );
            for _ in 0..3 {
                let mut p = claim_of(&[], 200, now);
                p.kinds = Kinds::only(["noop"]);
                for j in s.claim(&p).await.unwrap() {
                    assert!(ids.insert(j.id), "{} claimed twice", j.id);
                }
            }
            assert_eq!(ids.len(), 1_200);
            assert!(s.claim(&claim_of(&[], 200, now)).await.unwrap().is_empty());
            assert_eq!(s.next_due(&[]).await.unwrap(), None);
        }

        /// The claim of every queue, of a long list (past the arms) and of a short one (an arm
        /// per queue) take the same jobs in the same order: the first by (priority, run_at,
        /// id) of the queues they serve, kinds and pauses respected.
        pub(crate) async fn every_queue_and_long_lists_claim_in_the_order_of_the_arms(s: &Store) {
            let now = ms(T0);
            let names: Vec<String> = (0..20).map(|i| format!("o{i:02}")).collect();
            let mut jobs = Vec::new();
            for n in 0..120_i64 {
                let q = &names[(n * 7 % 20) as usize];
                let kind = if n % 5 == 0 { "charge" } else { "noop" };
                jobs.push(
                    NewJob::new(q, kind, json!({}))
                        .priority((n % 3) as i32 - 1)
                        .run_at(ms(T0 - (n * 37 % 50) * 1000)),
                );
            }
            // Not due yet: never claimed.
            jobs.push(job("o05").run_at(ms(T0 + 60_000)));
            s.enqueue_many(&jobs, now).await.unwrap();
            assert!(
                s.pause_queue("o13", &Actor::new("alice", "cli"), now)
                    .await
                    .unwrap()
            );
            // Three stores' worth of the same jobs is one store claimed three ways in turn:
            // each way's claims are compared with the expected order of what is left.
            let mut left: Vec<Job> = s
                .list(&ListParams {
                    state: Some(JobState::Available),
                    queue: None,
                    dead_reason: None,
                    key: None,
                    after: None,
                    limit: Some(500),
                })
                .await
                .unwrap()
                .jobs
                .into_iter()
                .filter(|j| j.queue != "o13" && j.run_at <= now && j.kind == "noop")
                .collect();
            left.sort_by_key(|j| (j.priority, j.run_at, j.id));
            let every: Vec<String> = Vec::new();
            let ways: [(&str, &[String]); 3] = [
                ("every queue", &every),
                ("a list past the arms", &names),
                ("an arm per queue", &names[..16]),
            ];
            let mut turn = 0;
            while !left.is_empty() {
                let (way, queues) = ways[turn % 3];
                turn += 1;
                let mut p = claim_of(queues, 7, now);
                p.kinds = Kinds::only(["noop"]);
                let got = s.claim(&p).await.unwrap();
                let want: Vec<_> = left
                    .iter()
                    .filter(|j| queues.is_empty() || queues.contains(&j.queue))
                    .take(7)
                    .map(|j| j.id)
                    .collect();
                let ids: Vec<_> = got.iter().map(|j| j.id).collect();
                assert_eq!(ids, want, "{way}, turn {turn}");
                if got.is_empty() {
                    // Only jobs of the queues past the 16 arms are left.
                    assert_eq!(way, "an arm per queue");
                    continue;
                }
                left.retain(|j| !ids.contains(&j.id));
            }
            assert!(turn > 10);
        }

        pub(crate) async fn four_claimers_of_every_queue_claim_each_job_once(s: &Store) {
            let now = ms(T0);
            seed(s, "c", 300, 3_000, SeedRows::Available, T0 - 1_000).await;
            let mut tasks = Vec::new();
            for w in 0..4 {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    let mut mine = Vec::new();
                    loop {
                        let mut p = claim_of(&[], 50, now);
                        p.worker = format!("w{w}");
                        let got = s.claim(&p).await.unwrap();
                        if got.is_empty() {
                            break;
                        }
                        let cs: Vec<_> = got.iter().map(|j| done(j, now)).collect();
                        for r in s.complete_many(&cs).await.unwrap() {
                            r.expect("our own lease holds");
                        }
                        mine.extend(got.into_iter().map(|j| j.id));
                    }
                    mine
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            let distinct: HashSet<_> = all.iter().copied().collect();
            assert_eq!(all.len(), 3_000, "claimed {} times in all", all.len());
            assert_eq!(distinct.len(), 3_000);
        }
    }
}

/// A PostgreSQL server error ended "at line 948": sqlx shows the line of the server's C
/// source that raised it. The store's message is the server's message and its SQLSTATE.
#[tokio::test]
async fn a_postgres_server_error_names_no_source_line() {
    let url = redrive_testkit::postgres_url();
    if !redrive_testkit::postgres_available(&url).await {
        return;
    }
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url.as_str(), String::new()),
    };
    let (server, _db) = base.rsplit_once('/').expect("a database in the URL");
    let missing = format!("{server}/redrive_no_such_database_36{query}");
    let e = match Store::connect(&missing).await {
        Ok(_) => panic!("connected to a database that does not exist"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("does not exist"), "{e}");
    assert!(e.contains("(SQLSTATE 3D000)"), "{e}");
    assert!(!e.contains(" at line "), "{e}");
}

/// Versions of the policies document (issue 37): numbered from 1, a new one only when the
/// text differs from the latest, audited with it, and the registry's policy version.
mod policy_versions {
    use super::*;

    both_backends!(
        policy_versions_are_numbered_and_an_identical_body_stores_nothing,
        concurrent_applies_of_two_bodies_store_each_once_without_gaps,
        the_registry_keeps_each_workers_policy_version,
    );

    mod cases {
        use super::*;

        pub(crate) async fn policy_versions_are_numbered_and_an_identical_body_stores_nothing(
            s: &Store,
        ) {
            assert_eq!(s.latest_policy_version().await.unwrap(), None);
            assert_eq!(s.policy_version_number().await.unwrap(), None);
            let alice = Actor::new("alice", "cli");
            let v1 = s
                .put_policy_version("[policy.checkout]\n", &alice, Some("first"), ms(T0))
                .await
                .unwrap();
            assert!(v1.created);
            assert_eq!(v1.version.version, 1);
            assert_eq!(v1.version.body, "[policy.checkout]\n");
            assert_eq!(v1.version.digest, policy_digest("[policy.checkout]\n"));
            assert_eq!(v1.version.applied_at, ms(T0));
            assert_eq!(
                (v1.version.applied_by.as_str(), v1.version.via.as_str()),
                ("alice", "cli")
            );
            assert_eq!(v1.version.comment.as_deref(), Some("first"));
            // The same text again: nothing new, the latest returned.
            let again = s
                .put_policy_version(
                    "[policy.checkout]\n",
                    &Actor::new("bob", "cli"),
                    None,
                    ms(T0 + 1),
                )
                .await
                .unwrap();
            assert!(!again.created);
            assert_eq!(again.version, v1.version);
            let v2 = s
                .put_policy_version(
                    "[policy.checkout]\nextends = \"payment\"\n",
                    &alice,
                    None,
                    ms(T0 + 2),
                )
                .await
                .unwrap();
            assert!(v2.created);
            assert_eq!(v2.version.version, 2);
            assert_eq!(s.policy_version_number().await.unwrap(), Some(2));
            assert_eq!(
                s.latest_policy_version().await.unwrap(),
                Some(v2.version.clone())
            );
            assert_eq!(s.policy_version(1).await.unwrap(), Some(v1.version.clone()));
            assert_eq!(s.policy_version(3).await.unwrap(), None);
            // Back to the first text: a third version (a change back is a change).
            let v3 = s
                .put_policy_version("[policy.checkout]\n", &alice, None, ms(T0 + 3))
                .await
                .unwrap();
            assert_eq!((v3.created, v3.version.version), (true, 3));
            let listed: Vec<i64> = s
                .policy_versions(10)
                .await
                .unwrap()
                .iter()
                .map(|v| v.version)
                .collect();
            assert_eq!(listed, [3, 2, 1]);
            assert_eq!(s.policy_versions(1).await.unwrap()[0].version, 3);
            // Each stored version wrote one audit row; the unchanged apply none.
            let audit: Vec<(String, i64)> = s
                .audit(None, 100)
                .await
                .unwrap()
                .into_iter()
                .filter(|a| a.action == "policy_apply")
                .map(|a| (a.actor, a.target["version"].as_i64().unwrap()))
                .collect();
            assert_eq!(
                audit,
                [
                    ("alice".into(), 3),
                    ("alice".into(), 2),
                    ("alice".into(), 1)
                ]
            );
            // Bad input names the field.
            let e = s
                .put_policy_version(" ", &alice, None, ms(T0))
                .await
                .unwrap_err();
            assert!(e.to_string().contains("invalid body"), "{e}");
            assert_eq!(s.policy_version_number().await.unwrap(), Some(3));
        }

        pub(crate) async fn concurrent_applies_of_two_bodies_store_each_once_without_gaps(
            s: &Store,
        ) {
            let mut tasks = Vec::new();
            for i in 0..8 {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    let body = format!("# body {}\n", i % 2);
                    s.put_policy_version(&body, &Actor::new(format!("op{i}"), "cli"), None, ms(T0))
                        .await
                        .unwrap()
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let versions = s.policy_versions(100).await.unwrap();
            let numbers: Vec<i64> = versions.iter().map(|v| v.version).collect();
            // Each apply stores its text unless it is the latest: the numbers have no gaps
            // and no two neighbours share a text.
            let n = i64::try_from(numbers.len()).unwrap();
            assert_eq!(numbers, (1..=n).rev().collect::<Vec<_>>());
            assert!((2..=8).contains(&n), "{numbers:?}");
            for w in versions.windows(2) {
                assert_ne!(w[0].digest, w[1].digest, "{numbers:?}");
            }
        }

        pub(crate) async fn the_registry_keeps_each_workers_policy_version(s: &Store) {
            let now = ms(s.db_time().await.unwrap().timestamp_millis());
            let w = WorkerInfo {
                name: "w1".into(),
                host: "h".into(),
                pid: 1,
                queues: vec![],
                kinds: Kinds::Any,
                concurrency: 1,
                started_at: now,
                last_seen: now,
                clock_offset_ms: None,
                policy_version: Some("v1".into()),
            };
            s.register_worker(&w, now).await.unwrap();
            assert_eq!(
                s.workers(now).await.unwrap()[0].policy_version.as_deref(),
                Some("v1")
            );
            assert!(
                s.worker_heartbeat_with("w1", now, None, Some("v2"))
                    .await
                    .unwrap()
            );
            assert_eq!(
                s.workers(now).await.unwrap()[0].policy_version.as_deref(),
                Some("v2")
            );
            // A beat that says nothing keeps it.
            assert!(s.worker_heartbeat("w1", now).await.unwrap());
            assert_eq!(
                s.workers(now).await.unwrap()[0].policy_version.as_deref(),
                Some("v2")
            );
            let e = s
                .worker_heartbeat_with("w1", now, None, Some(""))
                .await
                .unwrap_err();
            assert!(e.to_string().contains("policy_version"), "{e}");
        }
    }
}
