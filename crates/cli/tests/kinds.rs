//! A mixed fleet: `redrive serve --workers 2` runs the built-in kinds, a worker of the user's
//! own (here: this test process, built on `redrive-runtime`) runs `charge`. The serve workers
//! must leave the `charge` job alone.

use std::process::Output;
use std::time::Duration;

use redrive_runtime::{Attempted, Worker, typed};
use redrive_store::{JobState, Kinds, Store};
use redrive_testkit::cli::{Running, ok_json as ok, spawn_listening};

fn start(db: &str, extra: &[&str]) -> (Running, String) {
    let mut serve = redrive_testkit::cli!().db_command(db, ["serve", "--addr", "127.0.0.1:0"]);
    spawn_listening(serve.args(extra), "listening on http://")
}

fn redrive(db: &str, args: &[&str]) -> Output {
    redrive_testkit::cli!().run_db(db, args)
}

fn enqueue(db: &str, kind: &str, key: &str) -> i64 {
    ok(&redrive(
        db,
        &[
            "enqueue", "--queue", "payments", "--kind", kind, "--key", key, "--json",
        ],
    ))["job"]["id"]
        .as_i64()
        .unwrap()
}

/// Polls `f` until it holds (the serve process works on its own schedule).
fn wait_for(what: &str, f: impl FnMut() -> bool) {
    redrive_testkit::cli::wait_for(what, Duration::from_secs(30), f);
}

#[test]
fn a_charge_job_waits_for_a_worker_that_runs_charge() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    ok(&redrive(&db, &["migrate"]));
    let (server, _addr) = start(&db, &["--workers", "2"]);
    let pid = server.0.id();

    // The serve pool registers itself with the kinds it runs.
    let mut workers = serde_json::Value::Null;
    wait_for("serve's workers registered", || {
        workers = ok(&redrive(&db, &["workers", "--json"]));
        workers["workers"].as_array().is_some_and(|w| !w.is_empty())
    });
    let w = &workers["workers"].as_array().unwrap()[0];
    assert_eq!(w["pid"], pid, "{workers}");
    assert_eq!(w["concurrency"], 2, "{workers}");
    assert_eq!(
        w["kinds"],
        serde_json::json!({"only": ["http", "noop"]}),
        "{workers}"
    );
    assert_eq!(w["queues"], serde_json::json!([]), "{workers}");
    let text = String::from_utf8_lossy(&redrive(&db, &["workers"]).stdout).into_owned();
    assert!(
        text.contains("http,noop") && text.contains(&pid.to_string()),
        "{text}"
    );

    // A charge, then a noop behind it in claim order: once the noop ran, the serve workers
    // have claimed past the charge.
    let charge = enqueue(&db, "charge", "order-4711");
    let noop = enqueue(&db, "noop", "after-4711");
    wait_for("the noop job ran", || {
        ok(&redrive(&db, &["show", &noop.to_string(), "--json"]))["job"]["state"] == "succeeded"
    });
    let v = ok(&redrive(&db, &["show", &charge.to_string(), "--json"]));
    assert_eq!(v["job"]["state"], "available", "{v}");
    assert_eq!(v["job"]["attempts"], 0, "{v}");
    assert_eq!(v["job"]["lease_token"], 0, "never leased: {v}");
    assert!(v["attempts"].as_array().unwrap().is_empty(), "{v}");
    // Flagged: no live worker runs `charge`.
    let stats = ok(&redrive(&db, &["stats", "--json"]));
    assert_eq!(
        stats["unhandled"],
        serde_json::json!([{"queue": "payments", "kind": "charge", "jobs": 1,
            "oldest_run_at": v["job"]["run_at"]}]),
        "{stats}"
    );

    // A second process that runs `charge` (this one) takes it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Store::connect(&db).await.unwrap();
        let handler = typed(
            |p: serde_json::Value, ctx: redrive_runtime::JobContext| async move {
                Attempted::success(serde_json::json!({"charged": ctx.key, "payload": p}))
            },
        );
        let worker = Worker::builder(store.clone(), vec!["payments".into()])
            .handler("charge", handler)
            .name("charge-worker")
            .concurrency(1)
            .build()
            .unwrap();
        assert_eq!(worker.kinds(), Kinds::only(["charge"]));
        let sum = worker.run_until_idle().await.unwrap();
        assert_eq!((sum.succeeded, sum.attempts), (1, 1));
        let job = store.get(charge).await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Succeeded);
        assert_eq!(job.result.unwrap()["charged"], "order-4711");
        let attempts = store.attempts(charge).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].worker.as_deref(), Some("charge-worker"));
    });
    // Nothing waits for a missing kind any more; the charge worker left the registry.
    let stats = ok(&redrive(&db, &["stats", "--json"]));
    assert_eq!(stats["unhandled"], serde_json::json!([]), "{stats}");
    let workers = ok(&redrive(&db, &["workers", "--json"]));
    let names: Vec<&str> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 1, "{workers}");
    assert!(!names.contains(&"charge-worker"), "{workers}");
}

#[test]
fn serve_takes_queue_and_kind_for_its_workers() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    ok(&redrive(&db, &["migrate"]));
    let (_server, _addr) = start(
        &db,
        &["--workers", "1", "--queue", "fast", "--kind", "noop"],
    );
    let mut workers = serde_json::Value::Null;
    wait_for("serve's workers registered", || {
        workers = ok(&redrive(&db, &["workers", "--json"]));
        workers["workers"].as_array().is_some_and(|w| !w.is_empty())
    });
    let w = &workers["workers"][0];
    assert_eq!(w["queues"], serde_json::json!(["fast"]), "{workers}");
    assert_eq!(
        w["kinds"],
        serde_json::json!({"only": ["noop"]}),
        "{workers}"
    );
    // A noop on another queue stays; one on `fast` runs.
    let slow = ok(&redrive(
        &db,
        &["enqueue", "--queue", "slow", "--kind", "noop", "--json"],
    ))["job"]["id"]
        .as_i64()
        .unwrap();
    let fast = ok(&redrive(
        &db,
        &["enqueue", "--queue", "fast", "--kind", "noop", "--json"],
    ))["job"]["id"]
        .as_i64()
        .unwrap();
    wait_for("the fast job ran", || {
        ok(&redrive(&db, &["show", &fast.to_string(), "--json"]))["job"]["state"] == "succeeded"
    });
    let v = ok(&redrive(&db, &["show", &slow.to_string(), "--json"]));
    assert_eq!(
        (v["job"]["state"].as_str(), v["job"]["lease_token"].as_i64()),
        (Some("available"), Some(0))
    );

    // Refused at once, naming the flag.
    for (args, needle) in [
        (
            &["--workers", "1", "--kind", "charge"][..],
            "--kind: \"charge\"",
        ),
        (&["--queue", "q"][..], "--workers"),
    ] {
        let o = redrive_testkit::cli!()
            .cmd()
            .args(["--db", &db, "serve", "--addr", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
