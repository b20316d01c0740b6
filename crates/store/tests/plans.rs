//! The claim's query plan at depth, on both backends: with 100,000 jobs waiting and 100,000
//! finished (with their attempts), the claim must walk the partial claim index (no
//! sequential scan of the jobs table) and must not sort the pending rows. The rows come from
//! [`Store::seed`], which is checked here too.
//!
//! PostgreSQL runs in a fresh schema (`REDRIVE_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); it skips only when the server is unreachable
//! and `CI` is not set (see `redrive-testkit`).

use std::time::Duration;

use chrono::Utc;
use redrive_store::*;

mod support;

use support::{Harness, sqlite};

async fn postgres(tag: &str) -> Option<Harness> {
    support::postgres(&format!("rdp_{tag}"), 8).await
}

const DEPTH: u64 = 100_000;

fn seed(queue: &str, rows: SeedRows, count: u64) -> Seed {
    Seed {
        queue: queue.into(),
        queues: 1,
        kind: "noop".into(),
        count,
        rows,
        payload: padded_payload(64),
        at: Utc::now() - chrono::Duration::seconds(10),
    }
}

fn claim(queues: &[&str], kinds: Kinds) -> ClaimParams {
    ClaimParams {
        queues: queues.iter().map(|q| (*q).to_owned()).collect(),
        kinds,
        worker: "plan".into(),
        limit: 200,
        lease: Duration::from_secs(30),
        now: Utc::now(),
    }
}

/// The plan's lines that show a full pass over the jobs table or a sort of its rows.
fn bad_lines(plan: &[String]) -> Vec<String> {
    let depth = |l: &str| l.len() - l.trim_start().len();
    let jobs_access = |l: &str| {
        let l = l.trim();
        l == "SCAN j" || l.starts_with("SCAN j ") || l.starts_with("SEARCH j ")
    };
    let mut bad = Vec::new();
    for (i, line) in plan.iter().enumerate() {
        let l = line.trim();
        // PostgreSQL: a sequential scan of the jobs table, or a sort of its rows (a claim of
        // several queues sorts only the first few of each, as `c`).
        if l.contains("Seq Scan on redrive_jobs") || l.contains("Sort Key: j.") {
            bad.push(line.clone());
        }
        // SQLite: a scan (not a search) of the jobs table, or a temporary b-tree ordering the
        // rows of a select that reads the jobs table itself (its siblings in the plan tree).
        if l == "SCAN j" || l.starts_with("SCAN j ") || l.starts_with("SCAN redrive_jobs") {
            bad.push(line.clone());
        }
        if l.contains("TEMP B-TREE") {
            let d = depth(line);
            let sorts_jobs = plan[..i]
                .iter()
                .rev()
                .take_while(|p| depth(p) >= d)
                .any(|p| depth(p) == d && jobs_access(p));
            if sorts_jobs {
                bad.push(line.clone());
            }
        }
    }
    bad
}

#[test]
fn bad_lines_tell_a_sort_of_jobs_from_a_sort_of_a_few() {
    let sorted_jobs: Vec<String> = [
        "LIST SUBQUERY 4",
        "  SEARCH j USING INDEX redrive_jobs_claim (queue=?)",
        "  CORRELATED SCALAR SUBQUERY 2",
        "    SEARCH d USING INDEX x (name=?)",
        "  USE TEMP B-TREE FOR ORDER BY",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(bad_lines(&sorted_jobs).len(), 1);
    let sorted_few: Vec<String> = [
        "CO-ROUTINE c",
        "  CO-ROUTINE a0",
        "    SEARCH j USING INDEX redrive_jobs_claim (queue=?)",
        "SCAN c",
        "USE TEMP B-TREE FOR ORDER BY",
    ]
    .map(String::from)
    .to_vec();
    assert!(bad_lines(&sorted_few).is_empty());
    assert_eq!(bad_lines(&["SCAN j".into()]).len(), 1);
    assert_eq!(
        bad_lines(&["  ->  Seq Scan on redrive_jobs j".into()]).len(),
        1
    );
    assert_eq!(
        bad_lines(&["    Sort Key: j.priority, j.run_at, j.id".into()]).len(),
        1
    );
    assert!(bad_lines(&["    Sort Key: c.priority, c.run_at, c.id".into()]).is_empty());
}

async fn claim_uses_the_index_at_depth(h: Harness) {
    let s = &h.store;
    assert_eq!(
        s.seed(&seed("pay", SeedRows::Succeeded, DEPTH))
            .await
            .unwrap(),
        DEPTH
    );
    s.seed(&seed("pay", SeedRows::Available, DEPTH))
        .await
        .unwrap();
    s.seed(&seed("other", SeedRows::Available, DEPTH / 10))
        .await
        .unwrap();
    for (what, p) in [
        ("one queue", claim(&["pay"], Kinds::Any)),
        (
            "one queue, some kinds",
            claim(&["pay"], Kinds::only(["noop"])),
        ),
        ("two queues", claim(&["pay", "other"], Kinds::Any)),
        (
            "two queues, some kinds",
            claim(&["pay", "other"], Kinds::only(["noop", "http"])),
        ),
    ] {
        let plan = s.claim_plan(&p).await.unwrap();
        assert!(!plan.is_empty(), "{what}: no plan");
        let bad = bad_lines(&plan);
        assert!(
            bad.is_empty(),
            "{}: the claim scans or sorts the jobs: {bad:?}\nplan:\n{}",
            s.backend(),
            plan.join("\n")
        );
        // And the plan is the claim's: a claim right after takes the oldest jobs.
        let got = s.claim(&p).await.unwrap();
        assert_eq!(got.len(), 200, "{what}");
    }
    // The seed wrote what it said: jobs by state, and one attempt per finished job.
    let counts = s.counts().await.unwrap();
    let n = |q: &str, st: JobState| {
        counts
            .iter()
            .find(|c| c.queue == q && c.state == st)
            .map_or(0, |c| c.count)
    };
    assert_eq!(n("pay", JobState::Succeeded), DEPTH);
    assert_eq!(
        n("pay", JobState::Available) + n("pay", JobState::Running),
        DEPTH
    );
    let first = s
        .list(&ListParams {
            state: Some(JobState::Succeeded),
            queue: Some("pay".into()),
            dead_reason: None,
            key: None,
            after: None,
            limit: Some(1),
        })
        .await
        .unwrap();
    let a = s.attempts(first.jobs[0].id).await.unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].class.as_str(), "success");
    h.cleanup().await;
}

#[tokio::test]
async fn sqlite_claim_uses_the_index_at_depth() {
    claim_uses_the_index_at_depth(sqlite().await.unwrap()).await;
}

#[tokio::test]
async fn postgres_claim_uses_the_index_at_depth() {
    if let Some(h) = postgres("idx").await {
        claim_uses_the_index_at_depth(h).await;
    }
}

#[tokio::test]
async fn seed_rejects_a_bad_queue_and_pads_payloads() {
    let h = sqlite().await.unwrap();
    let err = h
        .store
        .seed(&seed("", SeedRows::Available, 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("queue"), "{err}");
    assert_eq!(padded_payload(1024).to_string().len(), 1024);
    assert_eq!(padded_payload(3).to_string(), r#"{"pad":""}"#);
    h.cleanup().await;
}

/// The completion of a batch reaches its jobs by primary key, also with statistics gathered
/// while no job ran (the bulk seed's `ANALYZE`, as autovacuum's after a big enqueue): the
/// planner once walked the partial lease index (every running job) for each row instead,
/// and then joined the batch by a nested loop. The claim's update at this depth, too,
/// reaches its rows by primary key.
#[tokio::test]
async fn postgres_completion_uses_the_primary_key_with_stale_statistics() {
    let Some(h) = postgres("done").await else {
        return;
    };
    let Store::Postgres(pg) = &h.store else {
        unreachable!()
    };
    h.store
        .seed(&seed("pay", SeedRows::Available, 20_000))
        .await
        .unwrap();
    // A table this small invited the claim's update to hash-join the picked ids with a
    // sequential scan of every job (instead of 200 probes of the primary key).
    let plan = h
        .store
        .claim_plan(&claim(&["pay"], Kinds::only(["noop"])))
        .await
        .unwrap();
    let bad = bad_lines(&plan);
    assert!(
        bad.is_empty(),
        "the claim scans the jobs: {bad:?}\nplan:\n{}",
        plan.join("\n")
    );
    let mut running = Vec::new();
    for _ in 0..10 {
        running.extend(h.store.claim(&claim(&["pay"], Kinds::Any)).await.unwrap());
    }
    assert_eq!(running.len(), 2_000);
    let now = Utc::now();
    let cs: Vec<Completion> = running[..200]
        .iter()
        .map(|j| Completion {
            lease: j.lease(),
            attempt: None,
            counters: j.counters(),
            transition: Transition::Succeeded {
                result: serde_json::json!(null),
            },
            error: None,
            now,
            decline: None,
        })
        .collect();
    let plan = pg.complete_plan(&cs).await.unwrap();
    let text = plan.join("\n");
    assert!(
        !text.contains("redrive_jobs_lease"),
        "the completion walks the running jobs:\n{text}"
    );
    assert!(
        !text.contains("Seq Scan on redrive_jobs"),
        "the completion scans the jobs table:\n{text}"
    );
    assert!(text.contains("redrive_jobs_pkey"), "{text}");
    // Nor does it compare every job of the batch with every row of it (a nested loop that
    // reads the batch's arrays again for each job: quadratic in the batch).
    assert!(
        !text.contains("Join Filter"),
        "the completion joins the batch by a nested loop:\n{text}"
    );
    // And it completes exactly those.
    let done = h.store.complete_many(&cs).await.unwrap();
    assert!(done.iter().all(|r| r.is_ok()));
    h.cleanup().await;
}

/// The plan's lines that show a pass over the jobs table other than the walk of the
/// all-queues claim index in order, or a sort of its rows.
fn bad_lines_of_every_queue(plan: &[String]) -> Vec<String> {
    bad_lines(plan)
        .into_iter()
        .filter(|l| {
            let l = l.trim();
            // SQLite's walk of the whole index in order, to the limit: what is wanted.
            l != "SCAN j USING INDEX redrive_jobs_claim_all"
        })
        .collect()
}

fn spread(prefix: &str, queues: u64, rows: SeedRows, count: u64) -> Seed {
    Seed {
        queues,
        ..seed(prefix, rows, count)
    }
}

/// A claim of every queue walks one index in claim order, whatever the number of queues:
/// with 1,000 queues of waiting jobs, 100,000 more names of finished ones change nothing in
/// its plan, which neither scans nor sorts the jobs. So is a claim of a list
/// longer than a claim gives an arm each.
async fn claim_of_every_queue_is_one_walk(h: Harness) {
    let s = &h.store;
    let every = claim(&[], Kinds::Any);
    let some_kinds = claim(&[], Kinds::only(["noop", "http"]));
    let shape = |plan: &[String]| -> Vec<String> {
        // PostgreSQL's lines without their cost and row estimates.
        plan.iter()
            .map(|l| l.split("  (cost=").next().unwrap_or(l).to_owned())
            .collect()
    };
    s.seed(&spread("wait", 1_000, SeedRows::Available, DEPTH))
        .await
        .unwrap();
    let before = shape(&s.claim_plan(&every).await.unwrap());
    s.seed(&spread("done", 100_000, SeedRows::Succeeded, DEPTH))
        .await
        .unwrap();
    let names: Vec<String> = (0..600).map(|i| format!("wait-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for (what, p) in [
        ("every queue", every.clone()),
        ("every queue, some kinds", some_kinds),
        ("600 queues", claim(&names, Kinds::Any)),
    ] {
        let plan = s.claim_plan(&p).await.unwrap();
        let bad = bad_lines_of_every_queue(&plan);
        assert!(
            bad.is_empty(),
            "{} {what}: the claim scans or sorts the jobs: {bad:?}\nplan:\n{}",
            s.backend(),
            plan.join("\n")
        );
        assert!(
            plan.iter().any(|l| l.contains("redrive_jobs_claim_all")),
            "{} {what}: the claim does not walk the all-queues index:\n{}",
            s.backend(),
            plan.join("\n")
        );
        let got = s.claim(&p).await.unwrap();
        assert_eq!(got.len(), 200, "{what}");
    }
    let after = shape(&s.claim_plan(&every).await.unwrap());
    assert_eq!(
        before,
        after,
        "{}: the plan changed with the number of queues",
        s.backend()
    );
    h.cleanup().await;
}

#[tokio::test]
async fn sqlite_claim_of_every_queue_is_one_walk() {
    claim_of_every_queue_is_one_walk(sqlite().await.unwrap()).await;
}

#[tokio::test]
async fn postgres_claim_of_every_queue_is_one_walk() {
    if let Some(h) = postgres("all").await {
        claim_of_every_queue_is_one_walk(h).await;
    }
}
