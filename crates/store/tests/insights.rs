//! The dashboard's read-only queries (`insights`), on both backends. The PostgreSQL run uses
//! `REDRIVE_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`), one fresh
//! schema per test; it fails, not skips, when `CI=true` and the server is unreachable.

use std::time::Duration;

use redrive_policy::{DeadReason, FailureClass, JobCounters};
use redrive_store::*;
use serde_json::json;

#[macro_use]
mod support;

use support::{Harness, sqlite};

async fn postgres() -> Option<Harness> {
    support::postgres("rdi", 4).await
}

const T0: i64 = 1_800_000_000_000;

fn ms(t: i64) -> Timestamp {
    from_millis(t)
}

/// Enqueues one job on `queue`, claims it at `at` and ends its only attempt with `class`,
/// `error` and `transition`.
async fn run_once(
    s: &Store,
    queue: &str,
    class: FailureClass,
    error: Option<&str>,
    transition: Transition,
    at: Timestamp,
) -> JobId {
    run_answered(s, queue, class, error, None, transition, at).await
}

/// [`run_once`] with the dependency's answer kept with the attempt.
async fn run_answered(
    s: &Store,
    queue: &str,
    class: FailureClass,
    error: Option<&str>,
    response: Option<&str>,
    transition: Transition,
    at: Timestamp,
) -> JobId {
    let id = s
        .enqueue(&NewJob::new(queue, "noop", json!({})), at)
        .await
        .unwrap()
        .job
        .id;
    let job = s
        .claim(&ClaimParams {
            queues: vec![queue.into()],
            kinds: Kinds::Any,
            worker: "w".into(),
            limit: 1,
            lease: Duration::from_secs(30),
            now: at,
        })
        .await
        .unwrap()
        .remove(0);
    assert_eq!(job.id, id);
    s.complete(&Completion {
        lease: job.lease(),
        attempt: Some(NewAttempt {
            worker: Some("w".into()),
            started_at: at,
            duration: Duration::from_millis(3),
            class,
            http_status: None,
            error: error.map(str::to_owned),
            counted: true,
            response: response.map(str::to_owned),
        }),
        counters: JobCounters {
            attempts: 1,
            first_attempt_at: Some(at),
            ..job.counters()
        },
        transition,
        error: error.map(str::to_owned),
        now: at,
        decline: None,
    })
    .await
    .unwrap();
    id
}

fn dead(reason: DeadReason) -> Transition {
    Transition::Dead { reason }
}

mod cases {
    use super::*;

    pub(super) async fn attempt_rate_buckets_by_second_and_class(s: &Store) {
        let ok = || Transition::Succeeded { result: json!(1) };
        // Two successes in second 0, one at 999 ms (still second 0), one in second 2,
        // one infrastructure failure in second 2, and one outside the window.
        run_once(s, "a", FailureClass::Success, None, ok(), ms(T0)).await;
        run_once(s, "a", FailureClass::Success, None, ok(), ms(T0 + 999)).await;
        run_once(s, "a", FailureClass::Success, None, ok(), ms(T0 + 2_500)).await;
        run_once(
            s,
            "b",
            FailureClass::Infrastructure,
            Some("503"),
            dead(DeadReason::AttemptsExhausted),
            ms(T0 + 2_001),
        )
        .await;
        run_once(s, "a", FailureClass::Success, None, ok(), ms(T0 + 60_000)).await;

        let got = s
            .attempt_rate(ms(T0), ms(T0 + 60_000), Duration::from_secs(1))
            .await
            .unwrap();
        let flat: Vec<(i64, &str, u64)> = got
            .iter()
            .map(|b| (b.start.timestamp_millis() - T0, b.class.as_str(), b.count))
            .collect();
        assert_eq!(
            flat,
            vec![
                (0, "success", 2),
                (2_000, "infrastructure", 1),
                (2_000, "success", 1)
            ]
        );
        assert!(matches!(
            s.attempt_rate(ms(T0), ms(T0), Duration::ZERO).await,
            Err(StoreError::Invalid {
                field: "bucket",
                ..
            })
        ));
        assert!(matches!(
            s.attempt_rate(ms(T0 + 1), ms(T0), Duration::from_secs(1))
                .await,
            Err(StoreError::Invalid { field: "to", .. })
        ));
    }

    pub(super) async fn dead_reasons_and_groups(s: &Store) {
        let mut declined = Vec::new();
        for (i, q) in ["a", "a", "b"].into_iter().enumerate() {
            let err = format!("charge ch_{i}f3a9b2c1d declined (code 51)");
            declined.push(
                run_once(
                    s,
                    q,
                    FailureClass::Permanent,
                    Some(&err),
                    dead(DeadReason::Permanent),
                    ms(T0 + i as i64),
                )
                .await,
            );
        }
        let exhausted = run_once(
            s,
            "a",
            FailureClass::Infrastructure,
            Some("HTTP 503 after 1200ms"),
            dead(DeadReason::AttemptsExhausted),
            ms(T0 + 10),
        )
        .await;
        // A succeeded job is no dead job.
        run_once(
            s,
            "a",
            FailureClass::Success,
            None,
            Transition::Succeeded { result: json!(1) },
            ms(T0 + 11),
        )
        .await;

        let reasons = s.dead_reasons().await.unwrap();
        assert_eq!(
            reasons,
            vec![
                DeadReasonCount {
                    reason: "permanent".into(),
                    count: 3
                },
                DeadReasonCount {
                    reason: "attempts_exhausted".into(),
                    count: 1
                },
            ]
        );

        let groups = s.dead_groups(None, 2).await.unwrap();
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(groups[0].reason, "permanent");
        assert_eq!(groups[0].signature, "charge <id> declined (code N)");
        assert_eq!(groups[0].count, 3);
        assert_eq!(
            groups[0].ids,
            declined[..2].to_vec(),
            "capped at 2, oldest first"
        );
        assert_eq!(groups[0].queues, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(groups[1].reason, "attempts_exhausted");
        assert_eq!(groups[1].signature, "HTTP N after Nms");
        assert_eq!(groups[1].ids, vec![exhausted]);
        assert_eq!(groups[1].example.as_deref(), Some("HTTP 503 after 1200ms"));

        let only_b = s.dead_groups(Some("b"), 10).await.unwrap();
        assert_eq!(only_b.len(), 1);
        assert_eq!(only_b[0].ids, vec![declined[2]]);
        assert!(matches!(
            s.dead_groups(None, 0).await,
            Err(StoreError::Invalid {
                field: "ids_per_group",
                ..
            })
        ));
    }

    /// Issue 37: a 422 whose body said why was kept as `POST … → 422` only; two different
    /// refusals looked like one group.
    pub(super) async fn the_answer_is_kept_cut_to_2_kib_and_splits_dead_groups(s: &Store) {
        let err = "POST http://psp/v1/charges → 422";
        let permanent = || dead(DeadReason::Permanent);
        let f = FailureClass::Permanent;
        let amount = r#"{"error":"invalid amount: -5"}"#;
        let mut ids = vec![];
        for (i, answer) in [amount, amount, r#"{"error":"card expired"}"#]
            .iter()
            .enumerate()
        {
            let at = ms(T0 + i as i64);
            ids.push(run_answered(s, "a", f, Some(err), Some(answer), permanent(), at).await);
        }
        // 3000 bytes of two-byte characters: kept up to 2048 bytes, never split inside one.
        let long = "é".repeat(1500);
        let cut = run_answered(s, "b", f, Some(err), Some(&long), permanent(), ms(T0 + 9)).await;
        let kept = s.attempts(cut).await.unwrap()[0].response.clone().unwrap();
        assert_eq!(kept.len(), MAX_RESPONSE_EXCERPT, "{}", kept.len());
        assert_eq!(kept, "é".repeat(1024));
        assert_eq!(
            s.attempts(ids[0]).await.unwrap()[0].response.as_deref(),
            Some(amount)
        );
        // No answer (a refused connection) stays none.
        let none = run_once(s, "a", f, Some(err), permanent(), ms(T0 + 10)).await;
        assert_eq!(s.attempts(none).await.unwrap()[0].response, None);

        let groups = s.dead_groups(Some("a"), 10).await.unwrap();
        let got: Vec<(Option<&str>, u64)> = groups
            .iter()
            .map(|g| (g.answer.as_deref(), g.count))
            .collect();
        assert_eq!(
            got,
            vec![
                (Some(r#"{"error":"invalid amount: -N"}"#), 2),
                (None, 1),
                (Some(r#"{"error":"card expired"}"#), 1),
            ],
            "{groups:?}"
        );
        assert!(
            groups
                .iter()
                .all(|g| g.signature == "POST http://psp/vN/charges → N")
        );
        assert_eq!(groups[0].ids, ids[..2].to_vec());
    }
}

both_backends!(
    attempt_rate_buckets_by_second_and_class,
    dead_reasons_and_groups,
    the_answer_is_kept_cut_to_2_kib_and_splits_dead_groups
);

#[test]
fn error_signature_keeps_words_and_masks_numbers() {
    assert_eq!(error_signature(""), "");
    assert_eq!(error_signature("timeout"), "timeout");
    assert_eq!(
        error_signature("job 12 of 018f2a6b-7c1d-4e3f: HTTP 429"),
        "job N of <id>: HTTP N"
    );
}
