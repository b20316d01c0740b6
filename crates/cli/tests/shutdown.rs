//! `redrive work` under signals, as a real process against a slow HTTP dependency on
//! 127.0.0.1: SIGTERM lets running attempts finish (or, past the grace period, releases their
//! jobs without counting the attempt); SIGKILL leaves leases that expire and are rescued.
//! In every case each job ends succeeded exactly once.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redrive_store::{JobState, NewJob, Store};
use redrive_testkit::cli::{block, ok_text, wait_for};
use serde_json::json;

/// A dependency that answers 200 after `delay`, counting requests per idempotency key.
struct Slow {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<HashMap<String, u32>>>,
    _rt: tokio::runtime::Runtime,
}

fn slow(delay: Duration) -> Slow {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let s2 = seen.clone();
    let addr = rt.block_on(async move {
        let app = axum::Router::new().route(
            "/charge",
            axum::routing::post(move |h: axum::http::HeaderMap| {
                let seen = s2.clone();
                async move {
                    let key = h
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    *seen.lock().unwrap().entry(key).or_default() += 1;
                    tokio::time::sleep(delay).await;
                    "{\"ok\":true}"
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        addr
    });
    Slow {
        addr,
        seen,
        _rt: rt,
    }
}

impl Slow {
    fn requests(&self) -> u32 {
        self.seen.lock().unwrap().values().sum()
    }
}

fn setup(n: usize, dep: &Slow) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let url = format!("http://{}/charge", dep.addr);
    block(async {
        let s = Store::connect(&db).await.unwrap();
        let jobs: Vec<NewJob> = (0..n)
            .map(|i| {
                NewJob::new(
                    "pay",
                    "http",
                    json!({"method": "POST", "url": url, "body": {"n": i}}),
                )
                .key(format!("order-{i}"))
            })
            .collect();
        s.enqueue_many(&jobs, chrono::Utc::now()).await.unwrap();
    });
    (dir, db)
}

fn work(db: &str, extra: &[&str]) -> Child {
    redrive_testkit::cli!()
        .cmd()
        .args(["--db", db, "work", "--queue", "pay", "--concurrency", "4"])
        .args(["--allow-host", "loopback"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

fn jobs(db: &str) -> Vec<redrive_store::Job> {
    block(async {
        let s = Store::connect(db).await.unwrap();
        s.list(&redrive_store::ListParams {
            limit: Some(1000),
            ..Default::default()
        })
        .await
        .unwrap()
        .jobs
    })
}

fn finish(db: &str) {
    ok_text(&redrive_testkit::cli!().run_db(
        db,
        [
            "work",
            "--until-idle",
            "--concurrency",
            "8",
            "--allow-host",
            "loopback",
        ],
    ));
}

#[test]
fn sigterm_lets_running_attempts_finish_and_loses_nothing() {
    let dep = slow(Duration::from_millis(800));
    let (_d, db) = setup(12, &dep);
    let child = work(&db, &["--shutdown-grace", "10s"]);
    wait_for("4 calls in flight", Duration::from_secs(20), || {
        dep.requests() >= 4
    });
    signal(&child, "-TERM");
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let js = jobs(&db);
    assert_eq!(js.len(), 12);
    assert!(
        js.iter().all(|j| j.state != JobState::Running),
        "nothing left leased"
    );
    let done: Vec<_> = js
        .iter()
        .filter(|j| j.state == JobState::Succeeded)
        .collect();
    assert!(
        done.len() >= 4,
        "the in-flight attempts finished: {}",
        done.len()
    );
    assert!(done.len() < 12, "it stopped claiming");
    finish(&db);
    let js = jobs(&db);
    assert_eq!(js.len(), 12);
    assert!(
        js.iter()
            .all(|j| j.state == JobState::Succeeded && j.attempts == 1)
    );
    // Every key was called exactly once: no attempt was repeated.
    assert!(dep.seen.lock().unwrap().values().all(|&n| n == 1));
    assert_eq!(dep.seen.lock().unwrap().len(), 12);
}

#[test]
fn sigterm_past_the_grace_period_releases_without_counting_the_attempt() {
    let dep = slow(Duration::from_secs(30));
    let (_d, db) = setup(4, &dep);
    let child = work(&db, &["--shutdown-grace", "200ms"]);
    wait_for("4 calls in flight", Duration::from_secs(20), || {
        dep.requests() >= 4
    });
    signal(&child, "-TERM");
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("released 4"));
    let js = jobs(&db);
    assert_eq!(js.len(), 4);
    assert!(
        js.iter()
            .all(|j| j.state == JobState::Available && j.attempts == 0),
        "released, attempt not counted: {:?}",
        js.iter().map(|j| (j.state, j.attempts)).collect::<Vec<_>>()
    );
}

#[test]
fn sigkill_leaves_leases_that_expire_and_every_job_still_finishes_once() {
    let dep = slow(Duration::from_millis(1500));
    let (_d, db) = setup(8, &dep);
    let child = work(&db, &["--lease", "1s"]);
    wait_for("4 calls in flight", Duration::from_secs(20), || {
        dep.requests() >= 4
    });
    let mut child = child;
    signal(&child, "-KILL");
    child.wait().unwrap();
    let leased = jobs(&db)
        .iter()
        .filter(|j| j.state == JobState::Running)
        .count();
    assert_eq!(leased, 4, "the killed worker's leases are still held");
    std::thread::sleep(Duration::from_millis(1100));
    finish(&db);
    let js = jobs(&db);
    assert_eq!(js.len(), 8);
    assert!(
        js.iter().all(|j| j.state == JobState::Succeeded),
        "none lost"
    );
    // The four lost attempts count; nothing finished twice.
    let twice = js.iter().filter(|j| j.attempts == 2).count();
    assert_eq!(twice, 4);
    assert!(js.iter().all(|j| j.attempts <= 2));
}

#[test]
fn work_exports_the_design_metrics() {
    let dep = slow(Duration::from_millis(10));
    let (_d, db) = setup(3, &dep);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = work(&db, &["--metrics-addr", &addr]);
    let jobs_done = || jobs(&db).iter().all(|j| j.state == JobState::Succeeded);
    wait_for("3 jobs done", Duration::from_secs(20), jobs_done);
    let body = block(async {
        reqwest::get(format!("http://{addr}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    signal(&child, "-TERM");
    child.wait_with_output().unwrap();
    for name in [
        "redrive_attempts_total{",
        "redrive_jobs_finished_total{",
        "redrive_job_duration_seconds",
        "redrive_jobs{",
    ] {
        assert!(body.contains(name), "{name} missing from {body}");
    }
    assert!(
        body.contains("queue=\"pay\"") && body.contains("kind=\"http\""),
        "{body}"
    );
}
