//! The queue commands, run as the real binary against a fresh SQLite file.

use std::process::Output;

use redrive_testkit::cli::{err_text, ok_json as ok};

fn redrive(db: &str, args: &[&str]) -> Output {
    redrive_testkit::cli!().run_db(db, args)
}

fn err(o: &Output, code: i32, needle: &str) {
    let stderr = err_text(o, code);
    assert!(stderr.contains(needle), "{needle:?} not in {stderr:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr:?}");
}

#[test]
fn enqueue_list_show_dedupe_and_stats() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let o = redrive(&db, &["migrate"]);
    assert!(o.status.success());
    let a = ok(&redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "payments",
            "--kind",
            "http",
            "--payload",
            r#"{"method":"POST","url":"https://psp.example:8443/v1/charges"}"#,
            "--key",
            "order-1",
            "--json",
        ],
    ));
    assert_eq!(a["created"], true);
    assert_eq!(
        a["job"]["dependency"], "psp.example:8443",
        "http jobs default to the URL's host"
    );
    assert_eq!(a["job"]["max_attempts"], 15, "the payment policy's budget");
    let b = ok(&redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "payments",
            "--kind",
            "http",
            "--payload",
            r#"{"url":"https://psp.example:8443/v1/charges","method":"POST"}"#,
            "--key",
            "order-1",
            "--json",
        ],
    ));
    assert_eq!(b["created"], false);
    assert_eq!(b["job"]["id"], a["job"]["id"]);
    let later = ok(&redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "payments",
            "--kind",
            "noop",
            "--delay",
            "5m",
            "--policy",
            "background",
            "--json",
        ],
    ));
    assert_eq!(later["job"]["state"], "scheduled");

    let list = ok(&redrive(&db, &["jobs", "--json"]));
    assert_eq!(list["jobs"].as_array().unwrap().len(), 2);
    let page = ok(&redrive(&db, &["jobs", "--limit", "1", "--json"]));
    assert_eq!(page["jobs"].as_array().unwrap().len(), 1);
    let after = page["next"].as_i64().unwrap().to_string();
    let page2 = ok(&redrive(
        &db,
        &["jobs", "--limit", "1", "--after", &after, "--json"],
    ));
    assert_eq!(page2["jobs"][0]["id"], later["job"]["id"]);
    let sched = ok(&redrive(&db, &["jobs", "--state", "scheduled", "--json"]));
    assert_eq!(sched["jobs"].as_array().unwrap().len(), 1);

    let id = a["job"]["id"].to_string();
    let show = ok(&redrive(&db, &["show", &id, "--json"]));
    assert_eq!(show["job"]["key"], "order-1");
    assert_eq!(show["attempts"], serde_json::json!([]));
    let text = redrive(&db, &["show", &id]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("attempts:"));

    let stats = ok(&redrive(&db, &["stats", "--json"]));
    assert_eq!(stats["counts"].as_array().unwrap().len(), 2);
    assert!(ok(&redrive(&db, &["breakers", "--json"]))["breakers"].is_array());

    let o = redrive(&db, &["cancel", &id]);
    assert!(o.status.success());
    err(&redrive(&db, &["cancel", &id]), 1, "cancelled");
    let dead = ok(&redrive(&db, &["dead", "list", "--json"]));
    assert_eq!(dead["jobs"], serde_json::json!([]));
    assert_eq!(
        ok(&redrive(&db, &["dead", "replay", "--all", "--json"]))["replayed"],
        0
    );
    assert_eq!(
        ok(&redrive(&db, &["dead", "purge", "--all", "--json"]))["purged"],
        0
    );
}

#[test]
fn bad_input_is_a_one_line_error_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    ok(&redrive(
        &db,
        &["enqueue", "--queue", "q", "--kind", "noop", "--json"],
    ));
    err(
        &redrive(
            &db,
            &[
                "enqueue",
                "--queue",
                "q",
                "--kind",
                "noop",
                "--payload",
                "{nope",
            ],
        ),
        2,
        "--payload",
    );
    err(
        &redrive(
            &db,
            &[
                "enqueue",
                "--queue",
                "q",
                "--kind",
                "noop",
                "--payload",
                "@/nonexistent/file.json",
            ],
        ),
        2,
        "--payload",
    );
    err(
        &redrive(
            &db,
            &["enqueue", "--queue", "q", "--kind", "noop", "--delay", "10"],
        ),
        2,
        "--delay",
    );
    err(
        &redrive(
            &db,
            &[
                "enqueue", "--queue", "q", "--kind", "noop", "--policy", "nope",
            ],
        ),
        2,
        "--policy",
    );
    err(
        &redrive(&db, &["enqueue", "--queue", "", "--kind", "noop"]),
        2,
        "queue",
    );
    err(
        &redrive(&db, &["jobs", "--state", "sleeping"]),
        2,
        "--state",
    );
    err(&redrive(&db, &["dead", "replay"]), 2, "--all");
    err(&redrive(&db, &["show", "424242"]), 1, "424242");
    err(&redrive("mysql://x", &["jobs"]), 2, "--db");
    err(
        &redrive("postgres://nobody@127.0.0.1:1/none", &["jobs"]),
        1,
        "Connection refused",
    );
    // The job accepted first is still there, untouched.
    let list = ok(&redrive(&db, &["jobs", "--json"]));
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1);
}

#[test]
fn bench_runs_small_and_prints_json() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let r = ok(&redrive(
        &db,
        &[
            "bench",
            "--jobs",
            "300",
            "--concurrency",
            "1",
            "--concurrency",
            "4",
            "--json",
        ],
    ));
    assert_eq!(r["backend"], "sqlite");
    assert_eq!(
        r["runs"][0]["enqueue_producers"], 1,
        "one writer: one producer"
    );
    // Unseeded: each drain on a fresh file, after a WAL checkpoint.
    assert_eq!(r["fresh_stores"], true, "{r}");
    assert!(r["checkpoint_error"].is_null(), "{r}");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(
        runs.iter()
            .all(|x| x["drain_jobs_per_s"].as_f64().unwrap() > 0.0 && x["jobs"] == 300)
    );
    let f = |k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing or not a number: {r:#}"))
    };
    // From enqueue to claim takes some time, and the tail is no shorter than the median.
    let (p50, p99) = (f("pickup_latency_ms_p50"), f("pickup_latency_ms_p99"));
    assert!(p50 > 0.0 && p50 <= p99 && p99 < 60_000.0, "{p50} / {p99}");
    // Every scheduled job ran (the bench fails otherwise), none before its run_at (stored in
    // whole milliseconds, so up to 1 ms early), and the median well before the worker's 5 s
    // poll: its due-time timer started them.
    assert_eq!(r["scheduled_pickup_samples"], 200);
    let (p50, p99) = (
        f("scheduled_pickup_latency_ms_p50"),
        f("scheduled_pickup_latency_ms_p99"),
    );
    assert!(p50 > -1.0 && p50 <= p99 && p50 < 5_000.0, "{p50} / {p99}");
    err(
        &redrive(&db, &["bench", "--concurrency", "0"]),
        2,
        "--concurrency",
    );
    // Three producers share 301 jobs (101, 100, 100); the drain checks it got every one.
    let r = ok(&redrive(
        &db,
        &[
            "bench",
            "--jobs",
            "301",
            "--concurrency",
            "2",
            "--producers",
            "3",
            "--json",
        ],
    ));
    assert_eq!(r["runs"][0]["enqueue_producers"], 3);
    assert_eq!(r["runs"][0]["jobs"], 301);
    err(
        &redrive(&db, &["bench", "--producers", "0"]),
        2,
        "--producers",
    );
}

#[test]
fn bench_drains_the_top_of_a_seeded_queue_beside_the_plain_sql_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let r = ok(&redrive(
        &db,
        &[
            "bench",
            "--jobs",
            "400",
            "--concurrency",
            "2",
            "--concurrency",
            "3",
            "--backlog",
            "1000",
            "--history",
            "700",
            "--payload-bytes",
            "300",
            "--ceiling",
            "--json",
        ],
    ));
    assert_eq!(
        (&r["backlog"], &r["history"], &r["payload_bytes"]),
        (
            &serde_json::json!(1000),
            &serde_json::json!(700),
            &serde_json::json!(300)
        )
    );
    assert_eq!(r["fresh_stores"], false, "{r}");
    // Both levels ran on the one seeded store, each draining exactly its 400 jobs three
    // times (store, ceiling, runtime) from the top of the backlog (the bench fails if any
    // drain got more or fewer).
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        assert_eq!(run["jobs"], 400);
        for k in [
            "drain_jobs_per_s",
            "runtime_drain_jobs_per_s",
            "ceiling_drain_jobs_per_s",
        ] {
            assert!(run[k].as_f64().unwrap() > 0.0, "{k}: {run}");
        }
        let ratio = run["store_vs_ceiling"].as_f64().unwrap();
        let expect = run["drain_jobs_per_s"].as_f64().unwrap()
            / run["ceiling_drain_jobs_per_s"].as_f64().unwrap();
        assert!((ratio - expect).abs() < 1e-9, "{run}");
    }
    assert!(r["seed_seconds"].as_f64().unwrap() > 0.0);
    assert!(r["peak_rss_mib"].as_f64().unwrap() > 1.0);
    // Without --ceiling there is no ceiling figure.
    let r = ok(&redrive(
        &db,
        &["bench", "--jobs", "50", "--concurrency", "1", "--json"],
    ));
    assert!(
        r["runs"][0].get("ceiling_drain_jobs_per_s").is_none(),
        "{r}"
    );
    assert_eq!(r["payload_bytes"], 2, "{{}}");
    // c=64 gives the runtime 64 claims' worth of slots (12,800), above the worker's bound
    // of 10,000: the runtime half runs at the bound instead of failing.
    let r = ok(&redrive(
        &db,
        &["bench", "--jobs", "50", "--concurrency", "64", "--json"],
    ));
    assert_eq!(r["runs"][0]["concurrency"], 64, "{r}");
    assert!(
        r["runs"][0]["runtime_drain_jobs_per_s"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    err(
        &redrive(&db, &["bench", "--processes", "2"]),
        2,
        "--processes",
    );
    err(
        &redrive(&db, &["bench", "--payload-bytes", "1"]),
        2,
        "--payload-bytes",
    );
}

#[test]
fn work_until_idle_runs_noop_jobs_and_leaves_other_kinds_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    for _ in 0..3 {
        ok(&redrive(
            &db,
            &["enqueue", "--queue", "q", "--kind", "noop", "--json"],
        ));
    }
    let mystery = ok(&redrive(
        &db,
        &["enqueue", "--queue", "other", "--kind", "mystery", "--json"],
    ))["job"]["id"]
        .as_i64()
        .unwrap();
    let http = ok(&redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "q",
            "--kind",
            "http",
            "--payload",
            r#"{"method": "POST", "url": "https://psp.example/charges"}"#,
            "--json",
        ],
    ))["job"]["id"]
        .as_i64()
        .unwrap();
    // `--kind noop`: the http job is not this worker's either.
    let o = redrive(&db, &["work", "--until-idle", "--kind", "noop"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("succeeded 3, dead 0"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // Left alone: not claimed, no attempt.
    for id in [mystery, http] {
        let v = ok(&redrive(&db, &["show", &id.to_string(), "--json"]));
        assert_eq!(v["job"]["state"], "available", "{v}");
        assert_eq!(v["job"]["attempts"], 0, "{v}");
        assert_eq!(v["job"]["lease_token"], 0, "{v}");
        assert_eq!(v["attempts"].as_array().unwrap().len(), 0, "{v}");
    }
    assert!(
        ok(&redrive(&db, &["dead", "list", "--json"]))["jobs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let succeeded = ok(&redrive(&db, &["jobs", "--state", "succeeded", "--json"]));
    assert_eq!(succeeded["jobs"].as_array().unwrap().len(), 3);
    // No worker runs now: both are flagged.
    let stats = ok(&redrive(&db, &["stats", "--json"]));
    let flagged: Vec<(String, String, u64)> = stats["unhandled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["queue"].as_str().unwrap().to_owned(),
                u["kind"].as_str().unwrap().to_owned(),
                u["jobs"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        flagged,
        [
            ("other".into(), "mystery".into(), 1),
            ("q".into(), "http".into(), 1)
        ]
    );
    let text = String::from_utf8_lossy(&redrive(&db, &["stats"]).stdout).into_owned();
    assert!(
        text.contains("waiting for a kind no live worker runs"),
        "{text}"
    );
    assert!(text.contains("mystery"), "{text}");
    // A kind `work` cannot run is a usage error naming it.
    err(
        &redrive(&db, &["work", "--until-idle", "--kind", "charge"]),
        2,
        "--kind: \"charge\"",
    );
}

#[test]
fn jobs_and_show_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let enqueue = |queue: &str, key: &str| {
        ok(&redrive(
            &db,
            &[
                "enqueue", "--queue", queue, "--kind", "noop", "--key", key, "--json",
            ],
        ))["job"]["id"]
            .as_i64()
            .unwrap()
    };
    let a = enqueue("payments", "order-4711");
    let b = enqueue("refunds", "order-4711");
    let c = enqueue("payments", "order-4712");
    let ids = |v: &serde_json::Value| -> Vec<i64> {
        v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect()
    };
    let v = ok(&redrive(&db, &["jobs", "--key", "order-4711", "--json"]));
    assert_eq!(ids(&v), [a, b]);
    let v = ok(&redrive(
        &db,
        &[
            "jobs",
            "--key",
            "order-4711",
            "--queue",
            "refunds",
            "--json",
        ],
    ));
    assert_eq!(ids(&v), [b]);
    let v = ok(&redrive(&db, &["jobs", "--key", "order-4712", "--json"]));
    assert_eq!(ids(&v), [c]);
    let v = ok(&redrive(&db, &["jobs", "--key", "nope", "--json"]));
    assert!(ids(&v).is_empty());
    let text = String::from_utf8_lossy(&redrive(&db, &["jobs", "--key", "order-4712"]).stdout)
        .into_owned();
    assert!(
        text.contains(&c.to_string()) && text.lines().count() == 2,
        "{text}"
    );

    // show --key: one queue holds it.
    let v = ok(&redrive(&db, &["show", "--key", "order-4712", "--json"]));
    assert_eq!(v["job"]["id"], c);
    assert!(v["attempts"].as_array().is_some());
    let text = String::from_utf8_lossy(&redrive(&db, &["show", "--key", "order-4712"]).stdout)
        .into_owned();
    assert!(text.starts_with(&format!("job {c} on payments")), "{text}");
    // Several queues: say so, list them, and pick with --queue.
    let o = redrive(&db, &["show", "--key", "order-4711"]);
    err(&o, 2, "held by jobs on 2 queues");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(&format!("payments (job {a})"))
            && stderr.contains(&format!("refunds (job {b})"))
            && stderr.contains("--queue"),
        "{stderr}"
    );
    let v = ok(&redrive(
        &db,
        &[
            "show",
            "--key",
            "order-4711",
            "--queue",
            "refunds",
            "--json",
        ],
    ));
    assert_eq!(v["job"]["id"], b);
    // Not found, and bad combinations.
    err(
        &redrive(&db, &["show", "--key", "nope"]),
        1,
        "no job with key \"nope\"",
    );
    err(
        &redrive(&db, &["show", "--key", "order-4712", "--queue", "refunds"]),
        1,
        "on queue \"refunds\"",
    );
    let o = redrive(&db, &["show", "1", "--key", "order-4711"]);
    assert_eq!(o.status.code(), Some(2));
    let o = redrive(&db, &["show", "1", "--queue", "payments"]);
    assert_eq!(o.status.code(), Some(2));
    let o = redrive(&db, &["show"]);
    assert_eq!(o.status.code(), Some(2));
    // By id still works.
    let v = ok(&redrive(&db, &["show", &a.to_string(), "--json"]));
    assert_eq!(v["job"]["key"], "order-4711");
}

/// Issue 37: `enqueue` had no flag for a job's attempt budget, and the workers ignored the
/// stored one.
#[test]
fn enqueue_max_attempts_is_enforced_by_work_and_shown_by_show() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let base = [
        "enqueue",
        "--queue",
        "payments",
        "--kind",
        "http",
        "--payload",
        // Nothing listens on port 9: connection refused, an infrastructure failure.
        r#"{"method":"POST","url":"http://127.0.0.1:9/v1/charges"}"#,
    ];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    ok(&redrive(&db, &["migrate"]));
    for bad in ["0", "lots", "-2"] {
        err(
            &redrive(&db, &with(&["--max-attempts", bad])),
            2,
            "--max-attempts",
        );
    }
    // Above the policy's total (payment: 15) it could never be reached: refused.
    let o = redrive(&db, &with(&["--max-attempts", "16"]));
    err(&o, 2, "--max-attempts");
    assert!(err_text(&o, 2).contains("15"), "names the policy's limit");
    assert_eq!(
        ok(&redrive(&db, &["jobs", "--json"]))["jobs"],
        serde_json::json!([]),
        "nothing stored"
    );

    let a = ok(&redrive(
        &db,
        &with(&["--key", "m1", "--max-attempts", "3", "--json"]),
    ));
    assert_eq!(a["job"]["max_attempts"], 3);
    let id = a["job"]["id"].to_string();
    let o = redrive(&db, &["work", "--until-idle", "--allow-host", "loopback"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shown = redrive(&db, &["show", &id]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("attempts   3/3"), "{text}");
    assert!(text.contains("dead (attempts_exhausted)"), "{text}");
    let j = ok(&redrive(&db, &["show", &id, "--json"]));
    assert_eq!(j["job"]["attempts"], 3, "{j}");
    assert_eq!(j["attempts"].as_array().unwrap().len(), 3, "{j}");
}

/// Issue 37: a 422 whose body explained it ("invalid amount") was kept as `POST … → 422`
/// only; the operator reading the dead letter could not see why.
#[test]
fn a_refused_charge_keeps_the_psps_answer_redacted_in_show() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let sim = rt
        .block_on(redrive_psp_sim::PspSim::builder().start("127.0.0.1:0"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let payload = serde_json::json!({
        "method": "POST", "url": format!("{}/v1/charges", sim.url()),
        "headers": {"Authorization": "Bearer sk_live_hidden"},
        "body": {"amount": -5, "currency": "EUR", "reference": "4111 1111 1111 1111"},
    });
    let a = ok(&redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "pay",
            "--kind",
            "http",
            "--key",
            "refused",
            "--payload",
            &payload.to_string(),
            "--json",
        ],
    ));
    let id = a["job"]["id"].to_string();
    let o = redrive(&db, &["work", "--until-idle", "--allow-host", "loopback"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j = ok(&redrive(&db, &["show", &id, "--json"]));
    assert_eq!(j["job"]["state"], "dead", "{j}");
    let answer = j["attempts"][0]["response"]
        .as_str()
        .expect("an answer kept");
    assert!(answer.contains("invalid amount"), "{answer}");
    assert!(answer.len() <= 2048);
    let text = String::from_utf8_lossy(&redrive(&db, &["show", &id]).stdout).into_owned();
    assert!(text.contains("answer     {"), "{text}");
    assert!(text.contains("invalid amount"), "{text}");
    assert!(
        text.contains("answered: "),
        "on the attempt's line too: {text}"
    );
    assert!(!text.contains("sk_live_hidden"), "{text}");
    rt.block_on(sim.shutdown());
}
