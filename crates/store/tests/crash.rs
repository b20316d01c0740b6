//! Crash test (R18): a child process claims a batch, finishes part of it and is killed with
//! SIGKILL mid-batch. After its leases expire, the survivors rescue and finish every job:
//! none lost, none finished twice. The child is this test binary run again with
//! `REDRIVE_CRASH_CHILD` set.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use redrive_policy::{FailureClass, JobCounters};
use redrive_store::*;
use serde_json::json;

const JOBS: usize = 500;

fn succeed(j: &Job) -> Completion {
    let now = Utc::now();
    Completion {
        lease: j.lease(),
        attempt: Some(NewAttempt {
            worker: Some(format!("pid-{}", std::process::id())),
            started_at: now,
            duration: Duration::ZERO,
            class: FailureClass::Success,
            http_status: None,
            error: None,
            counted: true,
            response: None,
        }),
        counters: JobCounters {
            attempts: j.attempts + 1,
            first_attempt_at: Some(now),
            ..j.counters()
        },
        transition: Transition::Succeeded {
            result: json!({"by": std::process::id()}),
        },
        error: None,
        now,
        decline: None,
    }
}

/// The child: claims 200 jobs with a 1 s lease, completes them one by one, slowly, until killed.
#[tokio::test]
#[ignore = "run only as the crash test's child process"]
async fn crash_child() {
    let Ok(url) = std::env::var("REDRIVE_CRASH_CHILD") else {
        return;
    };
    let store = Store::connect(&url).await.unwrap();
    let jobs = store
        .claim(&ClaimParams {
            queues: vec!["crash".into()],
            kinds: Kinds::Any,
            worker: "child".into(),
            limit: 200,
            lease: Duration::from_secs(1),
            now: Utc::now(),
        })
        .await
        .unwrap();
    println!("claimed {}", jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        store.complete(&succeed(j)).await.unwrap();
        if i == 50 {
            println!("half");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

async fn crash_case(store: Store, url: String) {
    let now = Utc::now();
    let batch: Vec<NewJob> = (0..JOBS)
        .map(|i| NewJob::new("crash", "noop", json!({})).key(format!("c{i}")))
        .collect();
    store.enqueue_many(&batch, now).await.unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("REDRIVE_CRASH_CHILD", &url)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut claimed = 0;
    for line in lines.by_ref() {
        let line = line.unwrap();
        // The harness prints `test crash_child ... ` on the same line.
        if let Some((_, n)) = line.split_once("claimed ") {
            claimed = n.trim().parse::<usize>().unwrap();
        }
        if line.contains("half") {
            break;
        }
    }
    // SIGKILL, mid-batch (before any assertion, so a failure never leaves the child running).
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(claimed, 200);

    // Survivors: rescue expired leases and drain everything.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rescued = store.rescue(Utc::now(), 1000).await.unwrap();
    assert!(
        !rescued.is_empty() && rescued.len() < 200,
        "rescued {}",
        rescued.len()
    );
    loop {
        let got = store
            .claim(&ClaimParams {
                queues: vec!["crash".into()],
                kinds: Kinds::Any,
                worker: "survivor".into(),
                limit: 100,
                lease: Duration::from_secs(30),
                now: Utc::now(),
            })
            .await
            .unwrap();
        if got.is_empty() {
            break;
        }
        let cs: Vec<_> = got.iter().map(succeed).collect();
        for r in store.complete_many(&cs).await.unwrap() {
            r.unwrap();
        }
    }
    let counts = store.counts().await.unwrap();
    assert_eq!(
        counts,
        vec![QueueCount {
            queue: "crash".into(),
            state: JobState::Succeeded,
            count: JOBS as u64
        }]
    );
    // None finished twice: exactly one success attempt per job.
    let mut after = None;
    let mut seen = 0;
    loop {
        let page = store
            .list(&ListParams {
                after,
                limit: Some(1000),
                ..Default::default()
            })
            .await
            .unwrap();
        for j in &page.jobs {
            let a = store.attempts(j.id).await.unwrap();
            assert_eq!(
                a.iter().filter(|a| a.class.as_str() == "success").count(),
                1,
                "job {}: {a:?}",
                j.id
            );
            seen += 1;
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, JOBS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_kill_9_loses_nothing_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("crash.db").display());
    let store = Store::connect(&url).await.unwrap();
    crash_case(store, url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_9_loses_nothing_and_doubles_nothing() {
    let Some(schema) = redrive_testkit::PgSchema::fresh("rdcrash").await else {
        return;
    };
    let url = schema.url();
    let store = Store::connect(&url).await.expect("postgres store");
    crash_case(store, url).await;
    schema.drop_now().await;
}
