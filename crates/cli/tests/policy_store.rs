//! The database as the one source of truth for policies (issue 37, item 2), run as a user
//! runs it: `redrive policy apply` stores a checked version, `enqueue`, `policy show|list`
//! and `simulate` read it without a file, and a running `redrive work` started without
//! `--policies` picks a new version up within seconds (`redrive workers` shows which).

use std::process::Stdio;
use std::time::Duration;

use redrive_testkit::cli::{Running, err_text, ok_json, ok_text, stdout, wait_for};

/// `checkout`: `attempts` tries 10–20 ms apart, no defer phase.
fn checkout(attempts: u32) -> String {
    format!(
        "# the checkout policy\n[policy.checkout.retry]\nbase = \"10ms\"\ncap = \"20ms\"\nmax_attempts = {attempts}\n"
    )
}

struct Setup {
    dir: tempfile::TempDir,
    db: String,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite:{}", dir.path().join("q.db").display());
        Self { dir, db }
    }

    /// Writes `text` to the file `name` in the test's directory; returns its path.
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        redrive_testkit::cli!().run_db(&self.db, args)
    }
}

#[test]
fn enqueue_with_a_stored_policy_needs_no_file_once_applied() {
    let s = Setup::new();
    let enqueue = |key: &str| {
        s.run(&[
            "enqueue", "--queue", "q", "--kind", "noop", "--policy", "checkout", "--key", key,
        ])
    };
    // Before any version is stored, `checkout` is unknown: a usage error.
    let e = err_text(&enqueue("k0"), 2);
    assert!(e.contains("unknown policy \"checkout\""), "{e}");

    let p1 = s.file("p1.toml", &checkout(2));
    let out = ok_text(&s.run(&["policy", "apply", &p1, "--comment", "first"]));
    assert!(out.contains("--- (none stored)"), "{out}");
    assert!(out.contains("+max_attempts = 2"), "{out}");
    assert!(out.contains("stored policies v1"), "{out}");

    let out = ok_text(&enqueue("k1"));
    assert!(out.starts_with("enqueued job 1 on q"), "{out}");
    // The job's budget is the stored policy's.
    let job = ok_json(&s.run(&["show", "--key", "k1", "--json"]));
    assert_eq!(job["job"]["policy"], "checkout", "{job}");
    assert_eq!(job["job"]["max_attempts"], 2, "{job}");

    // `enqueue --file` too.
    let lines = s.file(
        "jobs.ndjson",
        "{\"queue\":\"q\",\"kind\":\"noop\",\"policy\":\"checkout\",\"key\":\"f1\"}\n",
    );
    let out = ok_text(&s.run(&["enqueue", "--file", &lines]));
    assert!(out.contains("enqueued 1"), "{out}");
    let job = ok_json(&s.run(&["show", "--key", "f1", "--json"]));
    assert_eq!(job["job"]["max_attempts"], 2, "{job}");

    // The same file again stores nothing.
    let out = ok_text(&s.run(&["policy", "apply", &p1]));
    assert!(out.contains("unchanged: "), "{out}");
    assert!(out.contains("v1 already"), "{out}");

    // A change: its diff, and a second version.
    let p2 = s.file("p2.toml", &checkout(5));
    let out = ok_text(&s.run(&["policy", "apply", &p2, "-m", "more attempts"]));
    assert!(out.contains("--- v1 (stored)"), "{out}");
    assert!(
        out.contains("-max_attempts = 2\n+max_attempts = 5\n"),
        "{out}"
    );
    assert!(out.contains("stored policies v2"), "{out}");
    let out = ok_text(&enqueue("k2"));
    assert!(out.starts_with("enqueued job 3"), "{out}");
    let job = ok_json(&s.run(&["show", "--key", "k2", "--json"]));
    assert_eq!(job["job"]["max_attempts"], 5, "{job}");

    // History: two versions, newest first, with time, author, digest and comment.
    let h = ok_json(&s.run(&["policy", "history", "--json"]));
    let versions = h["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{h}");
    assert_eq!(versions[0]["version"], 2);
    assert_eq!(versions[0]["comment"], "more attempts");
    assert_eq!(versions[1]["comment"], "first");
    assert_eq!(versions[0]["digest"].as_str().unwrap().len(), 64);
    assert!(versions[0]["applied_at"].is_string(), "{h}");
    let text = ok_text(&s.run(&["policy", "history"]));
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        rows[0].starts_with("v2 ") && rows[0].ends_with("more attempts"),
        "{text}"
    );
    assert!(rows[1].starts_with("v1 "), "{text}");

    // Each stored version is in the audit trail; the unchanged apply is not.
    let audit = ok_json(&s.run(&["audit", "--json"]));
    let applied: Vec<i64> = audit["audit"]
        .as_array()
        .expect("audit rows")
        .iter()
        .filter(|a| a["action"] == "policy_apply")
        .map(|a| a["target"]["version"].as_i64().unwrap())
        .collect();
    assert_eq!(applied, [2, 1], "{audit}");
}

#[test]
fn an_invalid_file_is_refused_with_exit_2_and_nothing_is_stored() {
    let s = Setup::new();
    let bad = s.file("bad.toml", "[policy.checkout.retry]\nbase = \"0s\"\n");
    let e = err_text(&s.run(&["policy", "apply", &bad]), 2);
    // The parser's own message, naming the file and the field.
    assert!(e.contains("bad.toml"), "{e}");
    assert!(e.contains("policy.checkout.retry.base"), "{e}");
    let unknown = s.file("unknown.toml", "[policy.checkout]\nretries = 3\n");
    let e = err_text(&s.run(&["policy", "apply", &unknown]), 2);
    assert!(e.contains("retries"), "{e}");
    // Refused before the database is opened: not even created.
    assert!(!s.dir.path().join("q.db").exists());
    ok_text(&s.run(&["migrate"]));
    let e = err_text(&s.run(&["policy", "apply", &bad]), 2);
    assert!(e.contains("policy.checkout.retry.base"), "{e}");
    let out = ok_text(&s.run(&["policy", "history"]));
    assert!(
        out.contains("no version of the policies is stored"),
        "{out}"
    );
    let h = ok_json(&s.run(&["policy", "history", "--json"]));
    assert_eq!(h["versions"], serde_json::json!([]));
}

#[test]
fn policy_show_list_and_simulate_read_the_stored_version() {
    let s = Setup::new();
    ok_text(&s.run(&["policy", "apply", &s.file("p1.toml", &checkout(2))]));
    ok_text(&s.run(&["policy", "apply", &s.file("p2.toml", &checkout(4))]));
    let out = ok_text(&s.run(&["policy", "show", "checkout", "--samples", "10"]));
    assert!(
        out.starts_with("policy checkout: at most 4 attempts"),
        "{out}"
    );
    let out = ok_text(&s.run(&[
        "policy",
        "show",
        "checkout",
        "--policy-version",
        "1",
        "--samples",
        "10",
    ]));
    assert!(
        out.starts_with("policy checkout: at most 2 attempts"),
        "{out}"
    );
    let e = err_text(
        &s.run(&["policy", "show", "checkout", "--policy-version", "7"]),
        2,
    );
    assert!(e.contains("the stored ones are 1 to 2"), "{e}");
    // `--policies FILE` wins over the stored version.
    let file = s.file("p3.toml", &checkout(3));
    let out = ok_text(&s.run(&["--policies", &file, "policy", "show", "checkout"]));
    assert!(
        out.starts_with("policy checkout: at most 3 attempts"),
        "{out}"
    );

    let out = ok_text(&s.run(&["policy", "list"]));
    assert!(out.starts_with("policies v2 (applied "), "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("checkout") && l.contains("4 attempts")),
        "{out}"
    );

    // `simulate --policy NAME`: the fleet scenario with the stored policy.
    let v = ok_json(&s.run(&["simulate", "--policy", "checkout", "--runs", "1", "--json"]));
    assert_eq!(v["scenario"], "fleet", "{v}");
    let e = err_text(&s.run(&["simulate", "--policy", "nope", "--runs", "1"]), 2);
    assert!(e.contains("unknown policy \"nope\""), "{e}");
    // The demo scenario has its own policies.
    let e = err_text(
        &s.run(&[
            "simulate",
            "--model",
            "capacity",
            "--scenario",
            "demo",
            "--policy",
            "checkout",
        ]),
        2,
    );
    assert!(
        e.contains("--policy does not apply with --scenario demo"),
        "{e}"
    );
}

/// `redrive work` without `--policies`, running when a new version is applied by another
/// process: the next job runs under it within seconds, and `redrive workers` shows the version
/// each process runs (a process started with a file says it differs).
#[test]
fn a_running_worker_picks_up_a_newly_applied_version_within_seconds() {
    let s = Setup::new();
    ok_text(&s.run(&["policy", "apply", &s.file("p1.toml", &checkout(2))]));
    // A port nothing listens on: every call is refused, a retryable failure.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let payload =
        format!(r#"{{"method":"POST","url":"http://127.0.0.1:{port}/charge","timeout_ms":500}}"#);
    let cli = redrive_testkit::cli!();
    let spawn = |args: &[&str], log: &str| {
        let log = std::fs::File::create(s.dir.path().join(log)).unwrap();
        cli.db_command(&s.db, args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map(Running)
            .unwrap()
    };
    let log = |name: &str| std::fs::read_to_string(s.dir.path().join(name)).unwrap();
    let worker = spawn(
        &["work", "--queue", "payments", "--allow-host", "127.0.0.1"],
        "worker.log",
    );
    // A second process run with a file (it works another queue: only its label matters).
    let pinned_file = s.file("pinned.toml", &checkout(2));
    let pinned = spawn(
        &["--policies", &pinned_file, "work", "--queue", "other"],
        "pinned.log",
    );
    let label_of = |pid: u32| {
        let v = ok_json(&s.run(&["workers", "--json"]));
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["pid"] == pid)
            .map(|w| w["policy_version"].as_str().unwrap_or("").to_owned())
    };
    wait_for("both workers registered", Duration::from_secs(30), || {
        label_of(worker.0.id()).is_some() && label_of(pinned.0.id()).is_some()
    });
    assert_eq!(label_of(worker.0.id()).unwrap(), "v1");
    assert_eq!(label_of(pinned.0.id()).unwrap(), "file (same as v1)");

    let enqueue = |key: &str| {
        ok_text(&s.run(&[
            "enqueue",
            "--queue",
            "payments",
            "--kind",
            "http",
            "--policy",
            "checkout",
            "--key",
            key,
            "--payload",
            &payload,
        ]))
    };
    let dead_after = |key: &str| -> Option<u64> {
        let v = ok_json(&s.run(&["show", "--key", key, "--json"]));
        (v["job"]["state"] == "dead").then(|| v["job"]["attempts"].as_u64().unwrap())
    };
    enqueue("before");
    wait_for("the first job dead", Duration::from_secs(30), || {
        dead_after("before").is_some()
    });
    assert_eq!(dead_after("before"), Some(2));

    // Another process applies v2; the running worker takes it within a few seconds.
    ok_text(&s.run(&["policy", "apply", &s.file("p2.toml", &checkout(5))]));
    let applied = std::time::Instant::now();
    wait_for("the worker runs v2", Duration::from_secs(15), || {
        label_of(worker.0.id()).as_deref() == Some("v2")
    });
    let took = applied.elapsed();
    eprintln!("v2 reached the running worker's registry row {took:?} after `policy apply` ended");
    assert!(
        took < Duration::from_secs(6),
        "v2 reached the worker after {took:?}"
    );
    assert_eq!(
        label_of(pinned.0.id()).unwrap(),
        "file (differs from v2)",
        "a process run with a file says it differs"
    );
    // The job's own budget is 5 (v2 at enqueue); a worker still on v1 would stop at 2.
    enqueue("after");
    wait_for("the second job dead", Duration::from_secs(30), || {
        dead_after("after").is_some()
    });
    assert_eq!(dead_after("after"), Some(5), "the worker ran v2");
    let text = stdout(&s.run(&["workers"]));
    assert!(text.lines().next().unwrap().contains("POLICIES"), "{text}");
    redrive_testkit::cli::terminate(vec![worker, pinned], Duration::from_secs(30));
    // Each says so in its log.
    let w = log("worker.log");
    assert!(w.contains("policies v2 in force (was policies v1)"), "{w}");
    let p = log("pinned.log");
    assert!(
        p.contains("policies v2 were applied by") && p.contains("which differs"),
        "{p}"
    );
}

/// `redrive serve` (API only) started before any version is stored: its `POST /v1/jobs`
/// refuses `checkout` until `policy apply` stores it, then accepts it, without a restart.
#[test]
fn the_api_of_a_running_serve_accepts_a_newly_applied_policy() {
    let s = Setup::new();
    ok_text(&s.run(&["migrate"]));
    let mut serve = redrive_testkit::cli!().db_command(&s.db, ["serve", "--addr", "127.0.0.1:0"]);
    let (server, addr) = redrive_testkit::cli::spawn_listening(&mut serve, "listening on http://");
    let post = |key: &str| {
        let body = format!(
            r#"{{"queue":"q","kind":"noop","policy":"checkout","key":"{key}","payload":{{}}}}"#
        );
        redrive_testkit::cli::http_request(
            &addr,
            "POST",
            "/v1/jobs",
            &["Content-Type: application/json"],
            &body,
            Duration::from_secs(10),
        )
        .unwrap()
    };
    let r = post("k0");
    assert_eq!(r.status, 422, "{}", r.raw());
    assert!(r.body.contains("checkout"), "{}", r.raw());
    ok_text(&s.run(&["policy", "apply", &s.file("p1.toml", &checkout(2))]));
    let mut last = String::new();
    wait_for("the API knows checkout", Duration::from_secs(15), || {
        let r = post("k1");
        last = r.raw();
        r.status == 201
    });
    let job = ok_json(&s.run(&["show", "--key", "k1", "--json"]));
    assert_eq!(job["job"]["max_attempts"], 2, "{job} {last}");
    redrive_testkit::cli::terminate(vec![server], Duration::from_secs(30));
}
