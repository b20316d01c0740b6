//! Issue 36, the second hardening round, run as the real binary: SQLite file safety, card
//! data masked on every surface, bounded cardinality, and the smaller findings.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use redrive_testkit::cli::{Running, err_text, http_request, ok_json as ok, ok_text, text};

fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    (dir, db)
}

fn redrive(db: &str, args: &[&str]) -> Output {
    redrive_testkit::cli!().run_db(db, args)
}

/// Exit `code`, stderr containing every needle.
fn err(o: &Output, code: i32, needles: &[&str]) -> String {
    let stderr = err_text(o, code);
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in {stderr:?}");
    }
    stderr
}

/// `serve` on 127.0.0.1:0 with its stderr in `log`; returns the process and its address.
fn serve(db: &str, log: &std::path::Path, extra: &[&str]) -> (Running, String) {
    let mut cmd: Command =
        redrive_testkit::cli!().db_command(db, ["serve", "--addr", "127.0.0.1:0"]);
    let mut child = cmd
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let running = Running(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .trim_end()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("first line {line:?}"))
        .to_owned();
    (running, addr)
}

fn request(addr: &str, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let r = http_request(addr, method, path, headers, body, Duration::from_secs(10)).unwrap();
    (r.status, r.raw())
}

fn post_job(addr: &str, body: &str) -> (u16, String) {
    request(
        addr,
        "POST",
        "/v1/jobs",
        &["Content-Type: application/json"],
        body,
    )
}

/// `rm q.db-wal` while serving: 100 enqueues were acknowledged, /readyz stayed 200, and
/// after a restart there were no jobs. Now the enqueue is refused, /readyz says why, and an
/// error line is logged.
#[test]
fn a_deleted_write_ahead_log_is_not_acknowledged_by_serve() {
    let (dir, db) = sqlite();
    let log = dir.path().join("serve.log");
    let (_server, addr) = serve(&db, &log, &[]);
    let job = r#"{"queue": "q", "kind": "noop"}"#;
    assert_eq!(post_job(&addr, job).0, 201);
    std::fs::remove_file(dir.path().join("q.db-wal")).unwrap();
    let (status, res) = post_job(&addr, job);
    assert_eq!(status, 503, "{res}");
    let (status, res) = request(&addr, "GET", "/readyz", &[], "");
    assert_eq!(status, 503, "{res}");
    assert!(res.contains("store-file-changed"), "{res}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("ERROR") && logged.contains("q.db-wal was deleted"),
        "{logged}"
    );
}

/// `serve` and `work` acknowledge and run jobs: a database that keeps nothing is refused.
#[test]
fn serve_and_work_refuse_a_database_that_keeps_nothing() {
    for (db, why) in [
        ("sqlite::memory:", "in-memory"),
        ("sqlite:", "names no file"),
        ("sqlite://", "names no file"),
        ("sqlite:q.db?mode=memory", "in-memory"),
    ] {
        for command in [
            &["serve", "--addr", "127.0.0.1:0"][..],
            &["work", "--until-idle"],
        ] {
            let o = redrive(db, command);
            let e = err(&o, 2, &["--db", why, "would lose every job"]);
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
    // Other commands keep accepting it (a quick look at policies, a test).
    ok(&redrive("sqlite::memory:", &["stats", "--json"]));
}

/// Stored as given (the handler sends it), shown nowhere: a card number in a string, in a
/// JSON number and in text, and members named `card_number`, `pan`, `cvc`.
const CARD_BODY: &str = r#"{"card_number": "4111111111111111", "pan": "5500 0055 5555 5559",
    "cvc": "8642", "cardNumber": 4012888888881881, "note": "retry 4242-4242-4242-4242"}"#;
const CARD_SECRETS: [&str; 5] = [
    "4111111111111111",
    "5500 0055 5555 5559",
    "8642",
    "4012888888881881",
    "4242-4242-4242-4242",
];

fn assert_no_card(what: &str, t: &str) {
    for s in CARD_SECRETS {
        assert!(!t.contains(s), "{what} shows {s}: {t}");
    }
}

/// A payload with `card_number`, `pan`, `cvc` showed the full number and CVC in the API,
/// `show`, `jobs --json`, the dead-letter list and the dashboard.
#[test]
fn card_data_is_masked_on_every_surface() {
    let (dir, db) = sqlite();
    // An http job that dies at its first attempt without any network (the metadata address
    // is always refused by the egress policy), so it is in the dead-letter list too.
    let payload =
        format!(r#"{{"method": "POST", "url": "http://169.254.169.254/x", "body": {CARD_BODY}}}"#);
    let e = redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "pay",
            "--kind",
            "http",
            "--payload",
            &payload,
            "--json",
        ],
    );
    assert_no_card("enqueue --json", &text(&e));
    let id = ok(&e)["job"]["id"].to_string();
    let w = redrive(&db, &["work", "--until-idle"]);
    ok(&w);
    assert_no_card("work's log", &text(&w));
    for args in [
        &["show", &id, "--json"][..],
        &["show", &id],
        &["jobs", "--json"],
        &["jobs"],
        &["dead", "list", "--json"],
        &["dead", "list"],
    ] {
        assert_no_card(&args.join(" "), &text(&redrive(&db, args)));
    }
    let shown = ok(&redrive(&db, &["show", &id, "--json"]));
    assert_eq!(shown["job"]["state"], "dead", "{shown}");
    let body = &shown["job"]["payload"]["body"];
    assert_eq!(body["card_number"], "[redacted]", "{shown}");
    assert_eq!(body["note"], "retry ****-****-****-4242", "{shown}");

    let log = dir.path().join("serve.log");
    let (_server, addr) = serve(&db, &log, &[]);
    for path in [
        format!("/v1/jobs/{id}"),
        "/v1/jobs".into(),
        "/v1/jobs?state=dead".into(),
        format!("/jobs/{id}"),
        "/jobs".into(),
        "/dead".into(),
    ] {
        let (status, res) = request(&addr, "GET", &path, &[], "");
        assert_eq!(status, 200, "{path}: {res}");
        if path.ends_with(&id) {
            assert!(
                res.contains("redacted") && res.contains("4242"),
                "{path}: {res}"
            );
        }
        assert_no_card(&path, &res);
    }
    // What is stored is what the handler sends.
    let store = redrive_testkit::cli::block(redrive_store::Store::connect(&db)).unwrap();
    let job = redrive_testkit::cli::block(store.get(id.parse().unwrap()))
        .unwrap()
        .unwrap();
    assert_eq!(job.payload["body"]["cvc"], "8642");
}

/// `serve --refuse-card-data`: a payment fleet stores tokens, not PANs. 422 naming the member.
#[test]
fn serve_can_refuse_card_data() {
    let (dir, db) = sqlite();
    let log = dir.path().join("serve.log");
    let (_server, addr) = serve(&db, &log, &["--refuse-card-data"]);
    for (payload, member) in [
        (r#"{"source": {"cvv": "123"}}"#, "payload.source.cvv"),
        (
            r#"{"lines": ["x", "4111 1111 1111 1111"]}"#,
            "payload.lines[1]",
        ),
        (r#"{"cardNumber": "tok_visa"}"#, "payload.cardNumber"),
    ] {
        let body = format!(r#"{{"queue": "q", "kind": "noop", "payload": {payload}}}"#);
        let (status, res) = post_job(&addr, &body);
        assert_eq!(status, 422, "{res}");
        assert!(res.contains(&format!("\"field\":\"{member}\"")), "{res}");
        assert!(res.contains("card data"), "{res}");
        assert!(!res.contains("4111"), "{res}");
    }
    let ok_body =
        r#"{"queue": "q", "kind": "noop", "payload": {"source": "pm_1", "at": 1764000000005}}"#;
    assert_eq!(post_job(&addr, ok_body).0, 201);
}

/// `[payload] refuse_card_data = true` in the policies file is `serve --refuse-card-data`; a
/// key the section does not know stops `serve` naming it.
#[test]
fn the_policies_file_can_refuse_card_data() {
    let (dir, db) = sqlite();
    let log = dir.path().join("serve.log");
    let file = dir.path().join("policies.toml");
    std::fs::write(
        &file,
        "[policy.quick]\nextends = \"background\"\n\n[payload]\nrefuse_card_data = true\n",
    )
    .unwrap();
    let policies = file.to_str().unwrap();
    let (server, addr) = serve(&db, &log, &["--policies", policies]);
    let body = r#"{"queue": "q", "kind": "noop", "policy": "quick", "payload": {"pan": "4111111111111111"}}"#;
    let (status, res) = post_job(&addr, body);
    assert_eq!(status, 422, "{res}");
    assert!(res.contains("\"field\":\"payload.pan\""), "{res}");
    let ok_body =
        r#"{"queue": "q", "kind": "noop", "policy": "quick", "payload": {"source": "pm_1"}}"#;
    assert_eq!(
        post_job(&addr, ok_body).0,
        201,
        "the rest of the file still applies"
    );
    drop(server);
    std::fs::write(&file, "[payload]\nrefuse_card = true\n").unwrap();
    let o = redrive(
        &db,
        &["--policies", policies, "serve", "--addr", "127.0.0.1:0"],
    );
    err(&o, 2, &["payload", "refuse_card"]);
}

/// `[payload] refuse_card_data` holds for `redrive enqueue` and `enqueue --file` too, from a
/// `--policies` file or from the stored version (`policy apply`): exit 2 naming the member,
/// nothing stored.
#[test]
fn the_cli_enqueue_refuses_card_data_when_the_policies_say_so() {
    let (dir, db) = sqlite();
    let file = dir.path().join("policies.toml");
    std::fs::write(&file, "[payload]\nrefuse_card_data = true\n").unwrap();
    let policies = file.to_str().unwrap();
    let card = r#"{"pan": "4111111111111111"}"#;
    let lines = dir.path().join("jobs.ndjson");
    std::fs::write(
        &lines,
        format!(
            "{{\"queue\": \"q\", \"kind\": \"noop\", \"payload\": {{\"source\": \"pm_1\"}}}}\n\
             {{\"queue\": \"q\", \"kind\": \"noop\", \"payload\": {card}}}\n"
        ),
    )
    .unwrap();
    let lines = lines.to_str().unwrap();
    let enqueue = [
        "enqueue",
        "--queue",
        "q",
        "--kind",
        "noop",
        "--payload",
        card,
    ];
    // Without the setting both are accepted as before (and masked when shown).
    let o = redrive(&db, &enqueue);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // From a --policies file.
    let with_file: Vec<&str> = ["--policies", policies]
        .iter()
        .chain(&enqueue)
        .copied()
        .collect();
    err(&redrive(&db, &with_file), 2, &["payload.pan", "card data"]);
    err(
        &redrive(&db, &["--policies", policies, "enqueue", "--file", lines]),
        2,
        &["line 2", "payload.pan"],
    );
    // From the stored version, with no file given.
    let o = redrive(&db, &["policy", "apply", policies]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    err(&redrive(&db, &enqueue), 2, &["payload.pan", "card data"]);
    err(
        &redrive(&db, &["enqueue", "--file", lines]),
        2,
        &["line 2", "payload.pan"],
    );
    let jobs = redrive(&db, &["jobs", "--queue", "q", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&jobs.stdout).unwrap();
    assert_eq!(
        v["jobs"].as_array().map(Vec::len),
        Some(1),
        "only the job enqueued before the setting: {v}"
    );
}

/// Distinct `queue="…"` label values of `/metrics`.
fn queue_labels(metrics: &str) -> std::collections::BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("queue=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// 20,000 queue names made `/metrics` 9.2 MB (180,000 series). Every queue name beyond the
/// cap shares the label `other`; the busiest keep theirs; the gauges sum the rest.
#[test]
fn metrics_labels_are_capped_per_queue() {
    let (dir, db) = sqlite();
    // 3 jobs in q-big, 2 in q-mid, 1 in each of 30 others: with a cap of 2, q-big and q-mid
    // keep their labels (the busiest), the 30 others are `other`.
    let mut jobs = Vec::new();
    for (q, n) in [("q-big", 3), ("q-mid", 2)] {
        for _ in 0..n {
            jobs.push(redrive_store::NewJob::new(q, "noop", serde_json::json!({})));
        }
    }
    for i in 0..30 {
        jobs.push(redrive_store::NewJob::new(
            format!("q{i:02}"),
            "noop",
            serde_json::json!({}),
        ));
    }
    let store = redrive_testkit::cli::block(redrive_store::Store::connect(&db)).unwrap();
    redrive_testkit::cli::block(store.enqueue_many(&jobs, chrono::Utc::now())).unwrap();
    let log = dir.path().join("serve.log");
    let (_server, addr) = serve(
        &db,
        &log,
        &["--metrics-max-labels", "2", "--metrics-refresh", "50ms"],
    );
    let mut metrics = String::new();
    redrive_testkit::cli::wait_for("the gauges", Duration::from_secs(10), || {
        metrics = request(&addr, "GET", "/metrics", &[], "").1;
        metrics.contains("redrive_jobs{queue=\"other\",state=\"available\"}")
    });
    let labels = queue_labels(&metrics);
    let want: std::collections::BTreeSet<String> =
        ["q-big", "q-mid", "other"].map(str::to_owned).into();
    assert_eq!(labels, want, "{metrics}");
    assert!(
        metrics.contains("redrive_jobs{queue=\"other\",state=\"available\"} 30"),
        "{metrics}"
    );
    assert!(
        metrics.contains("redrive_jobs{queue=\"q-big\",state=\"available\"} 3"),
        "{metrics}"
    );
    // Enqueues through this process count under the same labels.
    let (status, res) = post_job(&addr, r#"{"queue": "q-new", "kind": "noop"}"#);
    assert_eq!(status, 201, "{res}");
    let metrics = request(&addr, "GET", "/metrics", &[], "").1;
    assert!(
        metrics.contains("redrive_enqueued_total{queue=\"other\",kind=\"noop\"} 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("q-new"), "{metrics}");
}

/// `n` queues `q000`…, queue `qNNN` with `NNN + 1` jobs (so the busiest are the last ones).
fn many_queues(db: &str, n: usize) {
    let mut jobs = Vec::new();
    for i in 0..n {
        for _ in 0..=(i % 3) {
            jobs.push(redrive_store::NewJob::new(
                format!("q{i:03}"),
                "noop",
                serde_json::json!({}),
            ));
        }
    }
    let store = redrive_testkit::cli::block(redrive_store::Store::connect(db)).unwrap();
    for chunk in jobs.chunks(500) {
        redrive_testkit::cli::block(store.enqueue_many(chunk, chrono::Utc::now())).unwrap();
    }
}

/// 20,000 queues: the dashboard overview was 16.5 MB in 11.3 s, and `stats` listed them all.
/// `stats` and `/v1/stats` keep the busiest `limit` (default 100) and say how many more; the
/// dashboard pages its queue table.
#[test]
fn stats_and_the_dashboard_stay_small_with_many_queues() {
    let (dir, db) = sqlite();
    many_queues(&db, 150);
    let v = ok(&redrive(&db, &["stats", "--json", "--limit", "5"]));
    let queues: std::collections::BTreeSet<&str> = v["counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["queue"].as_str().unwrap())
        .collect();
    assert_eq!(queues.len(), 5, "{v}");
    // The busiest: 3 jobs each (i % 3 == 2), the first five of them by name.
    assert_eq!(
        queues.into_iter().collect::<Vec<_>>(),
        ["q002", "q005", "q008", "q011", "q014"],
        "{v}"
    );
    assert_eq!(v["more"]["queues"], 145, "{v}");
    let t = ok_text(&redrive(&db, &["stats"]));
    assert!(t.contains("and 50 more queues"), "{t}");
    assert_eq!(t.lines().filter(|l| l.starts_with('q')).count(), 100, "{t}");

    let log = dir.path().join("serve.log");
    let (_server, addr) = serve(&db, &log, &[]);
    let (status, res) = request(&addr, "GET", "/v1/stats?limit=5", &[], "");
    assert_eq!(status, 200, "{res}");
    assert!(res.contains("\"more\":{\"queues\":145,"), "{res}");
    let (status, res) = request(&addr, "GET", "/v1/stats", &[], "");
    assert_eq!(status, 200, "{res}");
    assert!(res.contains("\"more\":{\"queues\":50,"), "{res}");
    for bad in ["/v1/stats?limit=0", "/v1/stats?limit=x", "/v1/stats?page=2"] {
        let (status, res) = request(&addr, "GET", bad, &[], "");
        assert_eq!(status, 400, "{bad}: {res}");
    }
    let (status, page1) = request(&addr, "GET", "/", &[], "");
    assert_eq!(status, 200);
    let rows = |page: &str| page.matches("data-state=\"scheduled\"").count();
    assert_eq!(rows(&page1), 100, "{page1}");
    assert!(page1.contains("150 queues, page 1 of 2"), "{page1}");
    let (_, page2) = request(&addr, "GET", "/?page=2", &[], "");
    assert_eq!(rows(&page2), 50, "{page2}");
    assert!(page2.contains("data-queue=\"q149\""), "{page2}");
}

/// `work --metrics-addr 0.0.0.0:…` served /metrics without authentication and without a word,
/// while `serve` refuses the same.
#[test]
fn work_guards_a_public_metrics_address_like_serve() {
    let (_dir, db) = sqlite();
    let o = redrive(
        &db,
        &["work", "--until-idle", "--metrics-addr", "0.0.0.0:0"],
    );
    let e = err(&o, 2, &["--metrics-addr", "0.0.0.0:0", "--metrics-public"]);
    assert_eq!(e.lines().count(), 1, "{e}");
    let o = redrive(
        &db,
        &[
            "work",
            "--until-idle",
            "--metrics-addr",
            "0.0.0.0:0",
            "--metrics-public",
        ],
    );
    ok(&o);
    assert!(text(&o).contains("without authentication"), "{}", text(&o));
    ok(&redrive(
        &db,
        &["work", "--until-idle", "--metrics-addr", "127.0.0.1:0"],
    ));
}

/// `--payload @/dev/urandom` said "is 0 bytes" (a device has no size), then "is over 1048576
/// bytes": it is no file at all. A device or a directory is refused as such; a pipe is read.
#[cfg(unix)]
#[test]
fn a_payload_from_a_device_is_not_a_regular_file() {
    let (_dir, db) = sqlite();
    let o = redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "q",
            "--kind",
            "noop",
            "--payload",
            "@/dev/urandom",
        ],
    );
    let e = err(
        &o,
        2,
        &[
            "--payload",
            "/dev/urandom is not a regular file (a character device)",
        ],
    );
    assert!(!e.contains("bytes"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let at_dir = format!("@{}", dir.path().display());
    let o = redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "q",
            "--kind",
            "noop",
            "--payload",
            &at_dir,
        ],
    );
    err(&o, 2, &["--payload", "is not a regular file (a directory)"]);
    // A pipe is fine: the payload on standard input.
    let mut child = redrive_testkit::cli!()
        .db_command(
            &db,
            [
                "enqueue",
                "--queue",
                "q",
                "--kind",
                "noop",
                "--payload",
                "@/dev/stdin",
            ],
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(br#"{"from": "a pipe"}"#).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    ok_text(&out);
}

fn post_keyed(addr: &str, key: &str, body: &str) -> (u16, String) {
    request(
        addr,
        "POST",
        "/v1/jobs",
        &[
            "Content-Type: application/json",
            &format!("Idempotency-Key: {key}"),
        ],
        body,
    )
}

/// The same JSON under the same key with other whitespace or member order was a 422 (a raw
/// fingerprint); a 400 under a key used the key up.
#[test]
fn idempotency_keys_compare_canonical_json_and_survive_a_400() {
    let (dir, db) = sqlite();
    let log = dir.path().join("serve.log");
    let (_server, addr) = serve(&db, &log, &[]);
    let (status, first) = post_keyed(
        &addr,
        "k-canon",
        r#"{"queue":"q","kind":"noop","payload":{"a":1,"b":[1,2]}}"#,
    );
    assert_eq!(status, 201, "{first}");
    let (status, again) = post_keyed(
        &addr,
        "k-canon",
        "{ \"payload\": {\"b\": [1, 2], \"a\": 1},\n  \"kind\": \"noop\", \"queue\": \"q\" }",
    );
    assert_eq!(status, 201, "{again}");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{again}"
    );
    let (status, other) = post_keyed(
        &addr,
        "k-canon",
        r#"{"queue":"q","kind":"noop","payload":{"a":2,"b":[1,2]}}"#,
    );
    assert_eq!(status, 422, "{other}");

    let (status, bad) = post_keyed(&addr, "k-400", r#"{"queue": "q", "kind": "noop""#);
    assert_eq!(status, 400, "{bad}");
    let (status, fixed) = post_keyed(&addr, "k-400", r#"{"queue": "q", "kind": "noop"}"#);
    assert_eq!(status, 201, "{fixed}");
}

/// Sixteen of one repeated letter was accepted as a public token, and `--token` stayed in
/// argv without a word.
#[test]
fn a_public_token_needs_entropy_and_an_argv_token_is_warned_about() {
    let (dir, db) = sqlite();
    for token in ["aaaaaaaaaaaaaaaa", "abababababababababab"] {
        let o = redrive(&db, &["serve", "--addr", "0.0.0.0:0", "--token", token]);
        let e = err(&o, 2, &["distinct characters", "at least 6"]);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(!e.contains(token), "{e}");
    }
    let log = dir.path().join("serve.log");
    let (_server, addr) = serve(&db, &log, &["--token", "t0k"]);
    assert_eq!(request(&addr, "GET", "/healthz", &[], "").0, 200);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("--token is visible in the process list")
            && logged.contains("--token-file"),
        "{logged}"
    );
    assert!(!logged.contains("t0k"), "{logged}");
}

/// A policies file that silently redefined the built-in `payment` preset (every job's
/// default) now says so; a policy of its own name does not.
#[test]
fn redefining_a_built_in_preset_is_warned_about() {
    let (dir, db) = sqlite();
    let file = dir.path().join("policies.toml");
    std::fs::write(&file, "[policy.payment]\nextends = \"background\"\n").unwrap();
    let o = redrive(
        &db,
        &["--policies", file.to_str().unwrap(), "work", "--until-idle"],
    );
    ok(&o);
    let t = text(&o);
    assert!(
        t.contains("[policy.payment] redefines the built-in preset")
            && t.contains("names no policy"),
        "{t}"
    );
    std::fs::write(&file, "[policy.quick]\nextends = \"payment\"\n").unwrap();
    let o = redrive(
        &db,
        &["--policies", file.to_str().unwrap(), "work", "--until-idle"],
    );
    ok(&o);
    assert!(!text(&o).contains("redefines"), "{}", text(&o));
}

/// `work --until-idle` after a kill -9 exited with jobs still leased, though its help said it
/// waited for running jobs. Now it waits (bounded by --until-idle-wait) for jobs leased by
/// another process, and runs them here once their lease expires; the help says so.
#[test]
fn until_idle_waits_for_jobs_leased_by_a_killed_worker() {
    let o = redrive_testkit::cli!().run(["work", "--help"]);
    let t = ok_text(&o);
    assert!(
        t.contains("leased by another process") && t.contains("--until-idle-wait"),
        "{t}"
    );
    let (_dir, db) = sqlite();
    let store = redrive_testkit::cli::block(redrive_store::Store::connect(&db)).unwrap();
    let jobs: Vec<_> = (0..5)
        .map(|i| redrive_store::NewJob::new("q", "noop", serde_json::json!({ "n": i })))
        .collect();
    let now = chrono::Utc::now();
    redrive_testkit::cli::block(store.enqueue_many(&jobs, now)).unwrap();
    // A worker that claimed them with a 2 s lease and was killed: nothing completes them.
    let claimed = redrive_testkit::cli::block(store.claim(&redrive_store::ClaimParams {
        queues: vec!["q".into()],
        kinds: redrive_store::Kinds::Any,
        worker: "killed".into(),
        limit: 5,
        lease: Duration::from_secs(2),
        now,
    }))
    .unwrap();
    assert_eq!(claimed.len(), 5);
    // Without waiting: the old behaviour, said on stderr.
    let o = redrive(&db, &["work", "--until-idle", "--until-idle-wait", "0s"]);
    let t = ok_text(&o);
    assert!(t.contains("succeeded 0"), "{t}");
    assert!(text(&o).contains("5 job(s) still leased"), "{}", text(&o));
    // Waiting: the leases expire, the jobs are taken back and run here.
    let o = redrive(&db, &["work", "--until-idle"]);
    let t = ok_text(&o);
    assert!(t.contains("succeeded 5"), "{t}");
    assert!(
        text(&o).contains("waiting for 5 job(s) leased by another process"),
        "{}",
        text(&o)
    );
    let left = redrive_testkit::cli::block(store.list(&redrive_store::ListParams {
        state: Some(redrive_store::JobState::Running),
        ..Default::default()
    }))
    .unwrap();
    assert!(left.jobs.is_empty(), "{left:?}");
}

/// Cyrillic homoglyphs in a queue or key were accepted: `pаy` (Cyrillic а) and `pay` were two
/// queues no one could tell apart. A name mixing Latin with such letters is refused, naming
/// the character; a name in one script is fine.
#[test]
fn mixed_script_names_are_refused() {
    let (_dir, db) = sqlite();
    let enqueue = |queue: &str, key: &str| {
        redrive(
            &db,
            &["enqueue", "--queue", queue, "--kind", "noop", "--key", key],
        )
    };
    err(
        &enqueue("p\u{0430}y", "k1"),
        2,
        &["--queue", "U+0430", "Cyrillic"],
    );
    err(&enqueue("pay", "\u{043E}rder-1"), 2, &["--key", "U+043E"]);
    ok(&enqueue("платежи", "заказ-1"));
    ok(&enqueue("pay", "order-1"));
}

/// Egress to private networks was open by default (issue 36): `work` refuses a job calling
/// this machine, naming the rule and how to allow it, and sends nothing; `--allow-host
/// 127.0.0.1` (or `allow_hosts` in `[egress]`) lets the same call through.
#[test]
fn work_calls_loopback_only_when_allowed() {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    let (dir, db) = sqlite();
    let enqueue = |key: &str| {
        let payload = format!(r#"{{"method": "GET", "url": "http://127.0.0.1:{port}/"}}"#);
        let o = redrive(
            &db,
            &[
                "enqueue",
                "--queue",
                "q",
                "--kind",
                "http",
                "--key",
                key,
                "--payload",
                &payload,
                "--json",
            ],
        );
        ok(&o)["job"]["id"].to_string()
    };
    let refused = enqueue("by-default");
    ok_text(&redrive(&db, &["work", "--until-idle"]));
    let shown = ok(&redrive(&db, &["show", &refused, "--json"]));
    assert_eq!(shown["job"]["state"], "dead", "{shown}");
    let e = shown["attempts"][0]["error"].as_str().unwrap();
    assert!(
        e.contains("is in 127.0.0.0/8 (loopback), denied by default"),
        "{e}"
    );
    assert!(
        e.contains("--allow-host 127.0.0.1") && e.contains("[egress]"),
        "{e}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing was sent");

    let allowed = enqueue("by-flag");
    ok_text(&redrive(
        &db,
        &["work", "--until-idle", "--allow-host", "127.0.0.1"],
    ));
    let shown = ok(&redrive(&db, &["show", &allowed, "--json"]));
    assert_eq!(shown["job"]["state"], "succeeded", "{shown}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    let file = dir.path().join("egress.toml");
    std::fs::write(&file, "[egress]\nallow_hosts = [\"loopback\"]\n").unwrap();
    let by_file = enqueue("by-file");
    ok_text(&redrive(
        &db,
        &["--policies", file.to_str().unwrap(), "work", "--until-idle"],
    ));
    let shown = ok(&redrive(&db, &["show", &by_file, "--json"]));
    assert_eq!(shown["job"]["state"], "succeeded", "{shown}");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}
