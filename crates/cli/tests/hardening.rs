//! Issue 16, the CLI's half of part B, run as the real binary: secrets never printed, enqueue
//! validation shared with the API, bulk commands that name what they skipped, purge that asks,
//! read commands that do not create databases, pipes that close, logs without colour in a
//! pipe, `localhost` addresses.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use redrive_store::{NewJob, PgStore, Store};
use redrive_testkit::PgSchema;
use redrive_testkit::cli::{block, text};
use serde_json::{Value, json};

fn cmd(db: &str, args: &[&str]) -> Command {
    let mut c = redrive_testkit::cli!().db_command(db, args);
    c.stdin(Stdio::null());
    c
}

fn redrive(db: &str, args: &[&str]) -> Output {
    redrive_testkit::cli!().run_db(db, args)
}

fn ok(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        text(o)
    );
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

/// Exit `code`, stderr one line containing every needle.
fn err(o: &Output, code: i32, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "{}", text(o));
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in {stderr:?}");
    }
    stderr
}

fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    (dir, db)
}

const SECRETS: [&str; 7] = [
    "sv-bearer",
    "sv-apikey",
    "sv-apim",
    "sv-signature",
    "sv-userinfo",
    "sv-query",
    "sv-token",
];

fn secret_payload(port: u16) -> String {
    json!({
        "method": "POST",
        "url": format!("http://merchant:sv-userinfo@127.0.0.1:{port}/v1/charges?api_key=sv-query&page=1"),
        "headers": {"Authorization": "Bearer sv-bearer", "X-Api-Key": "sv-apikey",
                    "Ocp-Apim-Subscription-Key": "sv-apim", "X-Signature": "sv-signature",
                    "X-Session-Token": "sv-token", "Accept": "application/json"},
        "body": {"amount": 5}
    })
    .to_string()
}

fn assert_no_secret(what: &str, o: &Output) {
    let t = text(o);
    for s in SECRETS {
        assert!(!t.contains(s), "{what} prints {s}: {t}");
    }
}

#[test]
fn no_listing_prints_a_secret() {
    let (dir, db) = sqlite();
    // The policies file's [egress] section denies loopback: the job dies at once, permanent,
    // with an error that names its URL.
    let policies = dir.path().join("policies.toml");
    std::fs::write(
        &policies,
        "[policy.quick]\nextends = \"background\"\n\n[egress]\ndeny_hosts = [\"loopback\"]\n",
    )
    .unwrap();
    let p = policies.to_str().unwrap();
    let payload = secret_payload(9);
    let e = redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "pay",
            "--kind",
            "http",
            "--key",
            "k1",
            "--payload",
            &payload,
            "--json",
        ],
    );
    let id = ok(&e)["job"]["id"].to_string();
    assert_no_secret("enqueue --json", &e);
    let w = redrive(&db, &["--policies", p, "work", "--until-idle"]);
    ok(&w);
    assert_no_secret("work", &w);
    let shown = ok(&redrive(&db, &["show", &id, "--json"]));
    assert_eq!(shown["job"]["state"], "dead", "{shown}");
    assert!(
        shown["attempts"][0]["error"]
            .as_str()
            .unwrap()
            .contains("egress denied"),
        "{shown}"
    );
    assert_eq!(
        shown["job"]["payload"]["url"],
        "http://merchant:***@127.0.0.1:9/v1/charges?api_key=***&page=1"
    );
    for args in [
        &["jobs", "--json"][..],
        &["jobs"],
        &["dead", "list", "--json"],
        &["dead", "list"],
        &["show", &id, "--json"],
        &["show", &id],
    ] {
        assert_no_secret(&args.join(" "), &redrive(&db, args));
    }
    // What is stored keeps the real values: the worker needs them.
    let store = block(Store::connect(&db)).unwrap();
    let job = block(store.get(id.parse().unwrap())).unwrap().unwrap();
    assert_eq!(job.payload["headers"]["X-Api-Key"], "sv-apikey");
    // An extra secret name from --redact.
    let o = redrive(&db, &["--redact", "accept", "show", &id, "--json"]);
    assert_eq!(ok(&o)["job"]["payload"]["headers"]["Accept"], "[redacted]");
}

#[test]
fn database_passwords_are_never_printed() {
    // --help shows that the variable is read, not its value.
    let o = redrive_testkit::cli!()
        .cmd()
        .args(["jobs", "--help"])
        .env(
            "REDRIVE_DATABASE_URL",
            "postgres://app:sv-dbpass@127.0.0.1:1/q",
        )
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(text(&o).contains("REDRIVE_DATABASE_URL"), "{}", text(&o));
    assert!(!text(&o).contains("sv-dbpass"), "{}", text(&o));
    // A connection error names the database without its password.
    let o = redrive("postgres://app:sv-dbpass@127.0.0.1:1/q", &["migrate"]);
    let e = err(&o, 1, &["app:***@127.0.0.1:1"]);
    assert!(!e.contains("sv-dbpass"), "{e}");
    // So does migrate's report (trust authentication ignores the password).
    let Some(fresh) = block(PgSchema::fresh("rdharden")) else {
        eprintln!("skipping the PostgreSQL half");
        return;
    };
    let (url, schema) = (fresh.server_url().to_owned(), fresh.name());
    block(PgStore::connect(&url, Some(schema), 2)).expect("postgres store");
    let with_pw = match url
        .split_once("://")
        .and_then(|(s, r)| r.split_once('@').map(|(u, h)| (s, u, h)))
    {
        Some((scheme, user, host)) if !user.contains(':') => {
            format!("{scheme}://{user}:sv-dbpass@{host}")
        }
        _ => url.clone(),
    };
    let sep = if with_pw.contains('?') { '&' } else { '?' };
    let o = redrive(&format!("{with_pw}{sep}schema={schema}"), &["migrate"]);
    let out = text(&o);
    block(fresh.drop_now());
    assert!(o.status.success(), "{out}");
    assert!(out.contains("migrated postgres://"), "{out}");
    assert!(!out.contains("sv-dbpass"), "{out}");
}

#[test]
fn http_payloads_and_input_edges_are_refused_at_enqueue_naming_the_field() {
    let (_dir, db) = sqlite();
    let enqueue = |kind: &str, extra: &[&str]| {
        let mut args = vec!["enqueue", "--queue", "q", "--kind", kind];
        args.extend_from_slice(extra);
        redrive(&db, &args)
    };
    err(
        &enqueue("http", &[]),
        2,
        &["--payload", "payload", "method"],
    );
    err(
        &enqueue(
            "http",
            &["--payload", r#"{"method":"FETCH","url":"http://h/"}"#],
        ),
        2,
        &["payload.method", "GET"],
    );
    let e = err(
        &enqueue(
            "http",
            &[
                "--payload",
                r#"{"method":"GET","url":"http://h/","headers":{"X-Api-Key":"sv-k\r\nX-Evil: 1"}}"#,
            ],
        ),
        2,
        &["payload.headers.X-Api-Key", "CR or LF"],
    );
    assert!(!e.contains("sv-k"), "{e}");
    err(
        &enqueue("noop", &["--priority", "2000000"]),
        2,
        &["--priority", "1000000"],
    );
    err(
        &enqueue("noop", &["--run-at", "2999-01-01T00:00:00Z"]),
        2,
        &["--run-at", "365 days"],
    );
    err(
        &enqueue("noop", &["--delay", "9000h"]),
        2,
        &["--delay", "365 days"],
    );
    err(
        &redrive(
            &db,
            &["enqueue", "--queue", "pay\u{202E}", "--kind", "noop"],
        ),
        2,
        &["--queue", "U+202E"],
    );
    err(
        &enqueue("noop", &["--key", "k\u{200B}"]),
        2,
        &["--key", "U+200B"],
    );
    // A payload file beyond 1 MiB is refused without being read whole.
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(60 * 1024 * 1024)
        .unwrap();
    let arg = format!("@{}", big.display());
    err(
        &enqueue("noop", &["--payload", &arg]),
        2,
        &["--payload", "62914560 bytes", "at most 1048576"],
    );
    // Nothing was enqueued by any of it: the database was not even created.
    let path = db.strip_prefix("sqlite:").unwrap();
    assert!(!std::path::Path::new(path).exists());
}

#[test]
fn the_same_key_for_another_payload_exits_1_naming_the_key() {
    let (_dir, db) = sqlite();
    let enqueue = |payload: &str| {
        redrive(
            &db,
            &[
                "enqueue",
                "--queue",
                "q",
                "--kind",
                "noop",
                "--key",
                "order-7",
                "--payload",
                payload,
            ],
        )
    };
    ok(&enqueue(r#"{"amount": 5}"#));
    let again = enqueue(r#"{"amount": 5}"#);
    ok(&again);
    assert!(text(&again).contains("already exists"));
    err(
        &enqueue(r#"{"amount": 6}"#),
        1,
        &["order-7", "different payload"],
    );
}

/// An `http` job that dies `permanent` at its first attempt, without any network: the cloud
/// metadata address is always refused by the egress policy. (A job of a kind no worker runs
/// is not claimed at all: it waits.)
const DOOMED_HTTP: &str = r#"{"method": "GET", "url": "http://169.254.169.254/latest/meta-data"}"#;

/// A database with one dead job (refused by the egress policy) and one scheduled job; their
/// ids.
fn dead_and_scheduled(db: &str) -> (String, String) {
    let dead = ok(&redrive(
        db,
        &[
            "enqueue",
            "--queue",
            "q",
            "--kind",
            "http",
            "--payload",
            DOOMED_HTTP,
            "--json",
        ],
    ))["job"]["id"]
        .to_string();
    ok(&redrive(db, &["work", "--until-idle"]));
    let later = ok(&redrive(
        db,
        &[
            "enqueue", "--queue", "q", "--kind", "noop", "--delay", "1h", "--json",
        ],
    ))["job"]["id"]
        .to_string();
    (dead, later)
}

#[test]
fn bulk_commands_name_every_skipped_id_and_exit_1() {
    let (_dir, db) = sqlite();
    let (dead, later) = dead_and_scheduled(&db);
    let e = err(
        &redrive(&db, &["dead", "replay", "99999", &later, &dead]),
        1,
        &[
            "99999 (no such job)",
            &format!("{later} (scheduled, not dead)"),
        ],
    );
    assert_eq!(
        e.trim().lines().count(),
        1,
        "one line naming every skipped id: {e}"
    );
    // The dead one among them was replayed.
    let j = ok(&redrive(&db, &["show", &dead, "--json"]));
    assert_eq!(j["job"]["state"], "available");
    err(
        &redrive(&db, &["cancel", "99999", &later]),
        1,
        &["99999 (no such job)"],
    );
    let j = ok(&redrive(&db, &["show", &later, "--json"]));
    assert_eq!(j["job"]["state"], "cancelled", "the valid id was cancelled");
    err(
        &redrive(&db, &["dead", "purge", "--yes", "99999"]),
        1,
        &["99999 (no such job)"],
    );
    // All of them fine: exit 0.
    ok(&redrive(&db, &["dead", "replay", "--all"]));
}

#[test]
fn purge_asks_or_needs_yes_and_dry_run_changes_nothing() {
    let (_dir, db) = sqlite();
    let (dead, _) = dead_and_scheduled(&db);
    let count = || {
        ok(&redrive(&db, &["dead", "list", "--json"]))["jobs"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(count(), 1);
    err(&redrive(&db, &["dead", "purge", "--all"]), 2, &["--yes"]);
    err(&redrive(&db, &["dead", "purge", &dead]), 2, &["--yes"]);
    assert_eq!(count(), 1);
    let dry = redrive(&db, &["dead", "purge", "--all", "--dry-run"]);
    ok(&dry);
    assert!(
        text(&dry).contains(&format!("would purge job {dead}")),
        "{}",
        text(&dry)
    );
    let dry = ok(&redrive(
        &db,
        &["dead", "replay", "--all", "--dry-run", "--json"],
    ));
    assert_eq!(dry["replayed"], 1);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(count(), 1, "dry runs change nothing");
    let done = ok(&redrive(
        &db,
        &["dead", "purge", "--all", "--yes", "--json"],
    ));
    assert_eq!(done["purged"], 1);
    assert_eq!(count(), 0);
}

#[test]
fn read_commands_refuse_a_missing_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.db");
    let db = format!("sqlite:{}", path.display());
    for args in [
        &["jobs"][..],
        &["show", "1"],
        &["stats"],
        &["breakers"],
        &["dead", "list"],
        &["dead", "replay", "--all"],
        &["cancel", "1"],
    ] {
        err(
            &redrive(&db, args),
            1,
            &["no database at", &path.display().to_string()],
        );
        assert!(!path.exists(), "{args:?} created {}", path.display());
    }
    ok(&redrive(&db, &["migrate"]));
    assert!(path.exists());
    ok(&redrive(&db, &["jobs"]));
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let (_dir, db) = sqlite();
    let store = block(Store::connect(&db)).unwrap();
    let jobs: Vec<NewJob> = (0..3000)
        .map(|i| NewJob::new("q", "noop", json!({"i": i})))
        .collect();
    block(store.enqueue_many(&jobs, chrono::Utc::now())).unwrap();
    for args in [
        &["jobs", "--limit", "3000"][..],
        &["jobs", "--limit", "3000", "--json"],
    ] {
        let mut child = cmd(&db, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty());
        // The reader is gone (as `| head -1` does).
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn log_lines_carry_no_colour_into_a_pipe() {
    let (_dir, db) = sqlite();
    ok(&redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "q",
            "--kind",
            "http",
            "--payload",
            DOOMED_HTTP,
        ],
    ));
    let o = redrive(&db, &["work", "--until-idle"]);
    ok(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("job dead"),
        "a log line was written: {stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "no ANSI escape: {stderr:?}");
}

#[test]
fn localhost_is_an_address_and_egress_flags_are_checked() {
    let (_dir, db) = sqlite();
    let o = redrive(
        &db,
        &["work", "--until-idle", "--metrics-addr", "localhost:0"],
    );
    ok(&o);
    assert!(
        text(&o).contains("metrics on http://127.0.0.1:0"),
        "{}",
        text(&o)
    );
    let mut sim = cmd(&db, &["psp-sim", "--addr", "localhost:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(sim.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    sim.kill().unwrap();
    sim.wait().unwrap();
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line}");
    err(
        &redrive(&db, &["work", "--until-idle", "--allow-host", "a b"]),
        2,
        &["--allow-host", "a b"],
    );
    err(
        &redrive(&db, &["work", "--until-idle", "--redirects", "all"]),
        2,
        &["--redirects"],
    );
}
