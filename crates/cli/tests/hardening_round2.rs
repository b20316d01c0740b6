//! Issue 36, the second hardening round, run as the real binary: SQLite file safety, card
//! data masked on every surface, bounded cardinality, and the smaller findings.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use redrive_testkit::cli::{Running, http_request, text};
use serde_json::Value;

fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    (dir, db)
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

/// Exit `code`, stderr containing every needle.
fn err(o: &Output, code: i32, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "{}", text(o));
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
