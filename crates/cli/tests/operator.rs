//! Operator controls, run as the real binary against a fresh SQLite file: a paused queue
//! stops claims within one poll, a forced-open breaker stops calls to the PSP simulator for
//! every worker process, every bulk action's `--dry-run` changes nothing, and the audit trail
//! records what was done.

use std::process::{Output, Stdio};
use std::time::Duration;

use chrono::Utc;
use redrive_policy::DeadReason;
use redrive_store::{
    ClaimParams, Completion, JobState, NewAttempt, NewJob, Store, Transition, error_signature,
};
use redrive_testkit::cli::{Running, block, ok_json as ok, stdout as text, terminate, wait_for};
use serde_json::{Value, json};

fn redrive(db: &str, args: &[&str]) -> Output {
    let cli = redrive_testkit::cli!();
    cli.output(cli.db_command(db, args).env("USER", "ops-alice"))
}

fn fresh() -> (tempfile::TempDir, String, Store) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let store = block(Store::connect(&db)).unwrap();
    (dir, db, store)
}

fn worker(db: &str, queue: &str) -> Running {
    redrive_testkit::cli!()
        .cmd()
        .args(["--db", db, "work", "--queue", queue, "--concurrency", "4"])
        .args(["--shutdown-grace", "1s", "--allow-host", "loopback"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .unwrap()
}

fn stop(children: Vec<Running>) {
    terminate(children, Duration::from_secs(30));
}

fn state(store: &Store, id: i64) -> JobState {
    block(store.get(id)).unwrap().unwrap().state
}

#[test]
fn queue_pause_stops_claims_within_one_poll_then_resume_runs_them() {
    let (_dir, db, store) = fresh();
    let w = worker(&db, "a");
    let first = block(store.enqueue(&NewJob::new("a", "noop", json!({})), Utc::now()))
        .unwrap()
        .job
        .id;
    wait_for("the worker runs a job", Duration::from_secs(20), || {
        state(&store, first) == JobState::Succeeded
    });
    let o = ok(&redrive(&db, &["queue", "pause", "a", "--json"]));
    assert_eq!(o, json!({"queue": "a", "paused": true, "changed": true}));
    let paused = ok(&redrive(&db, &["queue", "list", "--json"]));
    assert_eq!(paused["paused"][0]["queue"], "a");
    assert_eq!(paused["paused"][0]["paused_by"], "ops-alice");
    let held: Vec<i64> = (0..5)
        .map(|_| {
            block(store.enqueue(&NewJob::new("a", "noop", json!({})), Utc::now()))
                .unwrap()
                .job
                .id
        })
        .collect();
    // A poll is 250 ms: eight of them later, nothing was claimed.
    std::thread::sleep(Duration::from_secs(2));
    for id in &held {
        assert_eq!(state(&store, *id), JobState::Available, "job {id}");
    }
    ok(&redrive(&db, &["queue", "resume", "a", "--json"]));
    wait_for(
        "the held jobs run after resume",
        Duration::from_secs(20),
        || {
            held.iter()
                .all(|id| state(&store, *id) == JobState::Succeeded)
        },
    );
    stop(vec![w]);
    let audit = ok(&redrive(&db, &["audit", "--json"]));
    let actions: Vec<&str> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, vec!["queue_resume", "queue_pause"]);
    assert_eq!(audit["audit"][0]["actor"], "ops-alice");
    assert_eq!(audit["audit"][0]["via"], "cli");
    assert_eq!(audit["audit"][0]["rows"], 1);
}

/// Dead jobs made through the store: `(id, queue, kind, reason, error)`.
fn dead_jobs(store: &Store) -> Vec<i64> {
    let now = Utc::now();
    let specs = [
        (
            "a",
            "http",
            DeadReason::Permanent,
            "card ch_12345678 declined (code 51)",
        ),
        (
            "a",
            "http",
            DeadReason::Permanent,
            "card ch_99999999 declined (code 05)",
        ),
        ("a", "charge", DeadReason::AttemptsExhausted, "HTTP 503"),
        ("b", "http", DeadReason::AttemptsExhausted, "HTTP 503"),
    ];
    let mut ids = Vec::new();
    for (q, kind, reason, error) in specs {
        let j = block(store.enqueue(&NewJob::new(q, kind, json!({})).dependency("psp"), now))
            .unwrap()
            .job;
        let claimed = block(store.claim(&ClaimParams {
            queues: vec![q.into()],
            worker: "t".into(),
            limit: 1,
            lease: Duration::from_secs(30),
            now,
            kinds: redrive_store::Kinds::Any,
        }))
        .unwrap();
        assert_eq!(claimed[0].id, j.id);
        let c = &claimed[0];
        block(store.complete(&Completion {
            lease: c.lease(),
            attempt: Some(NewAttempt {
                worker: Some("t".into()),
                started_at: now,
                duration: Duration::from_millis(1),
                class: redrive_policy::FailureClass::Permanent,
                http_status: None,
                error: Some(error.into()),
                counted: true,
                response: None,
            }),
            counters: redrive_policy::JobCounters {
                attempts: 1,
                first_attempt_at: Some(now),
                ..c.counters()
            },
            transition: Transition::Dead { reason },
            error: Some(error.into()),
            now,
            decline: None,
        }))
        .unwrap();
        ids.push(j.id);
    }
    ids
}

fn snapshot(db: &str) -> (Value, Value) {
    let jobs = ok(&redrive(db, &["jobs", "--json", "--limit", "1000"]));
    let audit = ok(&redrive(db, &["audit", "--json"]));
    (jobs, audit)
}

#[test]
fn every_bulk_action_with_dry_run_changes_nothing_and_filters_select() {
    let (_dir, db, store) = fresh();
    let dead = dead_jobs(&store);
    let later = Utc::now() + chrono::Duration::hours(1);
    let waiting = block(store.enqueue(
        &NewJob::new("a", "http", json!({})).run_at(later),
        Utc::now(),
    ))
    .unwrap()
    .job
    .id;
    let before = snapshot(&db);
    let sig = error_signature("card ch_12345678 declined (code 51)");
    let ids = |v: &Value| -> Vec<i64> {
        v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    };
    let d = |s: &str| s.to_owned();
    let cases: Vec<(Vec<String>, &str, Vec<i64>)> = vec![
        (
            vec![d("dead"), d("replay"), d("--all")],
            "replayed",
            dead.clone(),
        ),
        (
            vec![d("dead"), d("replay"), d("--reason"), d("permanent")],
            "replayed",
            dead[..2].to_vec(),
        ),
        (
            vec![d("dead"), d("replay"), d("--signature"), sig.clone()],
            "replayed",
            dead[..2].to_vec(),
        ),
        (
            vec![d("dead"), d("purge"), d("--queue"), d("b")],
            "purged",
            vec![dead[3]],
        ),
        (
            vec![d("dead"), d("purge"), d("--kind"), d("charge")],
            "purged",
            vec![dead[2]],
        ),
        (
            vec![d("dead"), d("purge"), d("--all")],
            "purged",
            dead.clone(),
        ),
        (vec![d("cancel"), d("--all")], "cancelled", vec![waiting]),
        (
            vec![d("cancel"), d("--dependency"), d("psp")],
            "cancelled",
            vec![],
        ),
        (
            vec![d("run-now"), d("--queue"), d("a")],
            "brought_forward",
            vec![waiting],
        ),
        (
            vec![d("run-now"), waiting.to_string()],
            "brought_forward",
            vec![waiting],
        ),
    ];
    for (args, verb, want) in &cases {
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.extend(["--dry-run", "--json"]);
        let out = ok(&redrive(&db, &a));
        assert_eq!(out["dry_run"], true, "{a:?}");
        assert_eq!(ids(&out), *want, "{a:?}");
        assert_eq!(out[*verb], want.len(), "{a:?}");
        // The text form lists them too.
        a.pop();
        let t = text(&redrive(&db, &a));
        assert!(t.contains("dry run: nothing changed"), "{t}");
        for id in want {
            assert!(t.contains(&format!("job {id}\n")), "{a:?}: {t}");
        }
        assert_eq!(snapshot(&db), before, "{a:?} changed something");
    }
    // For real: the filters take what their dry runs named, and each is audited.
    let r = ok(&redrive(
        &db,
        &["dead", "replay", "--reason", "permanent", "--json"],
    ));
    assert_eq!(ids(&r), dead[..2].to_vec());
    assert_eq!(state(&store, dead[0]), JobState::Available);
    assert_eq!(state(&store, dead[2]), JobState::Dead);
    let p = ok(&redrive(
        &db,
        &["dead", "purge", "--queue", "b", "--yes", "--json"],
    ));
    assert_eq!(ids(&p), vec![dead[3]]);
    assert!(block(store.get(dead[3])).unwrap().is_none());
    let n = ok(&redrive(&db, &["run-now", &waiting.to_string(), "--json"]));
    assert_eq!(ids(&n), vec![waiting]);
    let j = block(store.get(waiting)).unwrap().unwrap();
    assert!(j.run_at <= Utc::now());
    assert_eq!((j.attempts, j.state), (0, JobState::Scheduled));
    // An id the action does not apply to is skipped, named, exit 1.
    let o = redrive(&db, &["run-now", &dead[2].to_string()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("{} (dead, not waiting)", dead[2]))
    );
    let audit = ok(&redrive(&db, &["audit", "--json"]));
    let rows: Vec<(String, u64, Value)> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap().to_owned(),
                r["rows"].as_u64().unwrap(),
                r["target"].clone(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (d("run_now"), 0, json!({"ids": [dead[2]]})),
            (d("run_now"), 1, json!({"ids": [waiting]})),
            (d("purge"), 1, json!({"queue": "b"})),
            (d("replay"), 2, json!({"dead_reason": "permanent"})),
        ]
    );
    let t = text(&redrive(&db, &["audit"]));
    assert!(t.contains("ops-alice") && t.contains("replay"), "{t}");
    // Nothing selected at all is a usage error.
    let o = redrive(&db, &["run-now"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn breakers_force_open_stops_calls_fleet_wide_and_auto_lets_them_go() {
    use redrive_psp_sim::PspSim;
    let (_dir, db, store) = fresh();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt.block_on(PspSim::builder().start("127.0.0.1:0")).unwrap();
    let url = format!("{}/v1/charges", sim.url());
    let enqueue = |n: usize, from: usize| -> Vec<i64> {
        (from..from + n)
            .map(|i| {
                block(
                    store.enqueue(
                        &NewJob::new(
                            "pay",
                            "http",
                            json!({"method": "POST", "url": url,
                               "body": {"amount": 100 + i, "currency": "EUR"}}),
                        )
                        .key(format!("order-{i}"))
                        .dependency("psp"),
                        Utc::now(),
                    ),
                )
                .unwrap()
                .job
                .id
            })
            .collect()
    };
    // Two worker processes, shown calling first (issue 41: "no call while forced open" means
    // something only after calls were flowing).
    let workers = vec![worker(&db, "pay"), worker(&db, "pay")];
    let warm = enqueue(1, 100);
    wait_for("the workers call the PSP", Duration::from_secs(30), || {
        state(&store, warm[0]) == JobState::Succeeded
    });
    let calls = sim.stats().requests_total;
    assert_eq!(calls, 1, "the warm-up charge reached the PSP");
    let o = ok(&redrive(
        &db,
        &["breakers", "force", "psp", "open", "--json"],
    ));
    assert_eq!(o["mode"], "forced_open");
    let listed = ok(&redrive(&db, &["breakers", "--json"]));
    assert_eq!(listed["breakers"][0]["mode"], "forced_open");
    let t = text(&redrive(&db, &["breakers"]));
    // Issue 37: the state as the fleet sees it, marked as forced (it read `forced_open`).
    assert!(t.contains("open (forced)"), "{t}");
    let st = text(&redrive(&db, &["stats"]));
    assert!(st.contains("open (forced)"), "{st}");
    // Neither worker calls while the breaker is forced open.
    let first = enqueue(10, 0);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        sim.stats().requests_total,
        calls,
        "no call while forced open"
    );
    for id in &first {
        assert_eq!(state(&store, *id), JobState::Available);
    }
    ok(&redrive(&db, &["breakers", "force", "psp", "auto"]));
    wait_for("every charge after auto", Duration::from_secs(30), || {
        first
            .iter()
            .all(|id| state(&store, *id) == JobState::Succeeded)
    });
    let after_auto = sim.stats().requests_total;
    assert_eq!(after_auto, calls + 10);
    // Forced open again while the workers run: no further call reaches the PSP.
    ok(&redrive(&db, &["breakers", "force", "psp", "open"]));
    let second = enqueue(10, 10);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(sim.stats().requests_total, after_auto);
    assert!(sim.request_log().len() as u64 == after_auto);
    // Forced closed: every call goes.
    ok(&redrive(&db, &["breakers", "force", "psp", "closed"]));
    wait_for("every charge after closed", Duration::from_secs(30), || {
        second
            .iter()
            .all(|id| state(&store, *id) == JobState::Succeeded)
    });
    stop(workers);
    assert_eq!(sim.stats().requests_total, calls + 20);
    let audit = ok(&redrive(&db, &["audit", "--json"]));
    let modes: Vec<&str> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["target"]["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, vec!["closed", "open", "auto", "open"]);
}

#[test]
fn dependency_pause_until_resumed_holds_its_jobs() {
    let (_dir, db, store) = fresh();
    let o = ok(&redrive(&db, &["dependency", "pause", "psp", "--json"]));
    assert_eq!(o["pause_reason"], "operator");
    let t = text(&redrive(&db, &["breakers"]));
    assert!(t.contains("until resumed"), "{t}");
    let w = worker(&db, "q");
    let id = block(store.enqueue(
        &NewJob::new("q", "noop", json!({})).dependency("psp"),
        Utc::now(),
    ))
    .unwrap()
    .job
    .id;
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(state(&store, id), JobState::Available);
    let o = ok(&redrive(&db, &["dependency", "resume", "psp", "--json"]));
    assert_eq!(o["paused_until"], Value::Null);
    wait_for("the job runs after resume", Duration::from_secs(20), || {
        state(&store, id) == JobState::Succeeded
    });
    // A pause for a while ends by itself.
    let o = ok(&redrive(
        &db,
        &["dependency", "pause", "psp", "--until", "1s", "--json"],
    ));
    assert!(o["paused_until"].is_string());
    let id = block(store.enqueue(
        &NewJob::new("q", "noop", json!({})).dependency("psp"),
        Utc::now(),
    ))
    .unwrap()
    .job
    .id;
    wait_for(
        "the job runs after the pause",
        Duration::from_secs(20),
        || state(&store, id) == JobState::Succeeded,
    );
    stop(vec![w]);
    let bad = redrive(&db, &["dependency", "pause", "psp", "--until", "yesterday"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--until"));
}

/// What the test's web server received: (path, idempotency key, body).
type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>, Value)>>>;

/// A local server: `POST /decline` answers 422 (a permanent failure), `POST /hook` 200 and
/// keeps every request.
fn hook_server() -> (String, Received, tokio::runtime::Runtime) {
    use axum::extract::{Path, State};
    use axum::http::HeaderMap;
    let got: Received = Default::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state = got.clone();
    let addr = rt.block_on(async move {
        let app = axum::Router::new()
            .route(
                "/{path}",
                axum::routing::post(
                    |State(s): State<Received>,
                     Path(p): Path<String>,
                     h: HeaderMap,
                     body: String| async move {
                        let key = h
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        let v = serde_json::from_str(&body).unwrap_or(Value::String(body));
                        s.lock().unwrap().push((p.clone(), key, v));
                        if p == "decline" {
                            axum::http::StatusCode::UNPROCESSABLE_ENTITY
                        } else {
                            axum::http::StatusCode::OK
                        }
                    },
                ),
            )
            .with_state(state);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        addr
    });
    (format!("http://{addr}"), got, rt)
}

fn worker_with(db: &str, policies: &std::path::Path) -> Running {
    redrive_testkit::cli!()
        .cmd()
        .arg("--db")
        .arg(db)
        .arg("--policies")
        .arg(policies)
        .args(["work", "--concurrency", "4", "--shutdown-grace", "1s"])
        .args(["--allow-host", "loopback"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .unwrap()
}

#[test]
fn a_job_going_dead_sends_one_alert_with_the_documented_body() {
    let (dir, db, store) = fresh();
    let (base, got, _rt) = hook_server();
    let policies = dir.path().join("p.toml");
    std::fs::write(
        &policies,
        format!(
            r#"
[[alerts]]
name = "ops"
url = "{base}/hook"
on = ["job_dead", "breaker_open"]
headers = {{ X-Hook-Token = "t0ken" }}
"#
        ),
    )
    .unwrap();
    // The file is accepted by the other commands too.
    let o = redrive_testkit::cli!()
        .cmd()
        .arg("--policies")
        .arg(&policies)
        .args(["policy", "show", "payment", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Two worker processes: both see the death, one alert is made.
    let workers = vec![worker_with(&db, &policies), worker_with(&db, &policies)];
    let id = block(
        store.enqueue(
            &NewJob::new(
                "payments",
                "http",
                json!({"method": "POST", "url": format!("{base}/decline"), "body": {"amount": 5}}),
            )
            .key("order-7")
            .dependency("psp-test"),
            Utc::now(),
        ),
    )
    .unwrap()
    .job
    .id;
    let hooks = || -> Vec<(Option<String>, Value)> {
        got.lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| p == "hook")
            .map(|(_, k, v)| (k.clone(), v.clone()))
            .collect()
    };
    wait_for(
        "the alert reaches the hook",
        Duration::from_secs(30),
        || !hooks().is_empty(),
    );
    // Both processes have looked again meanwhile (they poll every second).
    std::thread::sleep(Duration::from_secs(3));
    stop(workers);
    let hooks = hooks();
    assert_eq!(
        hooks.len(),
        1,
        "one alert, whoever saw the death: {hooks:?}"
    );
    let (key, body) = &hooks[0];
    assert_eq!(
        key.as_deref(),
        Some(format!("alert:ops:job_dead:{id}:0").as_str())
    );
    assert_eq!(body["alert"], "ops");
    assert_eq!(body["event"], "job_dead");
    assert_eq!(body["key"], format!("job_dead:{id}:0"));
    assert!(chrono::DateTime::parse_from_rfc3339(body["at"].as_str().unwrap()).is_ok());
    let job = &body["job"];
    assert_eq!(job["id"], id);
    assert_eq!(job["queue"], "payments");
    assert_eq!(job["kind"], "http");
    assert_eq!(job["dead_reason"], "permanent");
    assert_eq!(job["attempts"], 1);
    assert_eq!(job["replays"], 0);
    assert!(job["last_error"].as_str().unwrap().contains("422"), "{job}");
    assert!(job["finished_at"].is_string());
    assert_eq!(job["dependency"], "psp-test");
    // The alert is a job of its own queue, succeeded, with the event's key.
    let alerts = ok(&redrive(&db, &["jobs", "--queue", "alerts", "--json"]));
    let alerts = alerts["jobs"].as_array().unwrap();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0]["state"], "succeeded");
    assert_eq!(alerts[0]["key"], format!("alert:ops:job_dead:{id}:0"));
    // A bad rule is refused at start, naming the field.
    std::fs::write(
        &policies,
        "[[alerts]]\nurl = \"http://x/\"\non = [\"sometimes\"]\n",
    )
    .unwrap();
    let o = redrive_testkit::cli!()
        .cmd()
        .arg("--db")
        .arg(&db)
        .arg("--policies")
        .arg(&policies)
        .args(["work", "--until-idle"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("alerts[0].on[0]"));
}

/// Issue 37: a job held by a paused queue or a forced-open breaker showed as plain
/// `available`, `stats` did not show paused queues, and `prune` and `schedule add/remove`
/// wrote no audit row.
#[test]
fn show_says_why_a_job_waits_stats_lists_paused_queues_and_every_change_is_audited() {
    let (_dir, db, store) = fresh();
    let enqueue = |job: NewJob| block(store.enqueue(&job, Utc::now())).unwrap().job.id;
    let held = enqueue(NewJob::new("a", "noop", json!({})));
    let free = enqueue(NewJob::new("b", "noop", json!({})));
    let psp = enqueue(NewJob::new("b", "noop", json!({})).dependency("psp"));
    let later = enqueue(
        NewJob::new("b", "noop", json!({})).run_at(Utc::now() + chrono::Duration::minutes(5)),
    );
    ok(&redrive(&db, &["queue", "pause", "a"]));
    ok(&redrive(&db, &["breakers", "force", "psp", "open"]));
    let why = |id: i64| -> Vec<String> {
        let v = ok(&redrive(&db, &["show", &id.to_string(), "--json"]));
        v["waiting_because"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["reason"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(why(held), ["queue_paused"]);
    assert_eq!(why(free), Vec::<String>::new());
    assert_eq!(why(psp), ["breaker_open"]);
    assert_eq!(why(later), ["run_at"]);
    let t = text(&redrive(&db, &["show", &held.to_string()]));
    assert!(t.contains("waiting    queue paused (by ops-alice)"), "{t}");
    let t = text(&redrive(&db, &["show", &psp.to_string()]));
    assert!(
        t.contains("waiting    breaker open (forced by an operator)"),
        "{t}"
    );

    let stats = ok(&redrive(&db, &["stats", "--json"]));
    assert_eq!(stats["paused_queues"][0]["queue"], "a", "{stats}");
    assert_eq!(stats["paused_queues"].as_array().unwrap().len(), 1);
    let t = text(&redrive(&db, &["stats"]));
    assert!(t.contains("queue a is paused"), "{t}");
    ok(&redrive(&db, &["queue", "resume", "a"]));
    assert_eq!(why(held), Vec::<String>::new());

    // Schedules and prune are operator changes too.
    ok(&redrive(
        &db,
        &[
            "schedule",
            "add",
            "nightly",
            "--cron",
            "0 0 3 * * *",
            "--queue",
            "a",
            "--kind",
            "noop",
        ],
    ));
    ok(&redrive(&db, &["schedule", "remove", "nightly"]));
    ok(&redrive(&db, &["prune", "--older-than", "1h", "--dry-run"]));
    ok(&redrive(&db, &["prune", "--older-than", "1h"]));
    let audit = ok(&redrive(&db, &["audit", "--json"]));
    let rows = audit["audit"].as_array().unwrap();
    let actions: Vec<&str> = rows.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions[..3],
        ["prune", "schedule_remove", "schedule_add"],
        "newest first; the dry run wrote none: {audit}"
    );
    assert!(
        rows[..3].iter().all(|r| r["actor"] == "ops-alice"),
        "{audit}"
    );
    assert_eq!(rows[1]["target"]["name"], "nightly");
    assert_eq!(rows[2]["target"]["cron"], "0 0 3 * * *");
}
