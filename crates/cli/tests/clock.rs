//! Each worker process's clock against the database's: `redrive serve --workers` and
//! `redrive work` measure their offset and `redrive workers` (text and `--json`) and
//! `GET /v1/workers` show it; `REDRIVE_CLOCK_OFFSET` (tests and drills) skews a process.

use std::process::Stdio;
use std::time::Duration;

use redrive_testkit::cli::{Running, err_text, http_request, ok_json, ok_text, spawn_listening};

fn work(db: &str, name_env: &[(&str, &str)]) -> Running {
    let mut cmd = redrive_testkit::cli!().db_command(db, ["work", "--queue", "q"]);
    for (k, v) in name_env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .unwrap()
}

/// The registry's rows, by pid.
fn offsets_by_pid(v: &serde_json::Value) -> Vec<(u64, serde_json::Value)> {
    v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["pid"].as_u64().unwrap(), w["clock_offset_ms"].clone()))
        .collect()
}

fn near(v: &serde_json::Value, want: i64) -> bool {
    v.as_i64().is_some_and(|ms| (ms - want).abs() < 500)
}

#[test]
fn workers_show_each_processes_measured_clock_offset() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let cli = redrive_testkit::cli!();
    ok_text(&cli.run_db(&db, ["migrate"]));
    let mut serve = cli.db_command(&db, ["serve", "--addr", "127.0.0.1:0", "--workers", "1"]);
    serve.env("REDRIVE_CLOCK_OFFSET", "3s");
    let (server, addr) = spawn_listening(&mut serve, "listening on http://");
    let behind = work(&db, &[("REDRIVE_CLOCK_OFFSET", "-2s")]);
    let unsynced = work(
        &db,
        &[
            ("REDRIVE_CLOCK_OFFSET", "1s"),
            ("REDRIVE_CLOCK_SYNC", "off"),
        ],
    );
    let pids = [server.0.id(), behind.0.id(), unsynced.0.id()].map(u64::from);
    let mut v = serde_json::Value::Null;
    redrive_testkit::cli::wait_for("three workers registered", Duration::from_secs(30), || {
        v = ok_json(&cli.run_db(&db, ["workers", "--json"]));
        v["workers"].as_array().is_some_and(|w| w.len() == 3)
    });
    let rows = offsets_by_pid(&v);
    let of = |pid: u64| &rows.iter().find(|(p, _)| *p == pid).unwrap().1;
    // database − host: a host 3 s ahead is −3,000 ms, one 2 s behind +2,000 ms.
    assert!(near(of(pids[0]), -3_000), "serve, 3 s ahead: {v}");
    assert!(near(of(pids[1]), 2_000), "work, 2 s behind: {v}");
    assert!(of(pids[2]).is_null(), "work, unsynced: {v}");

    let text = ok_text(&cli.run_db(&db, ["workers"]));
    assert!(text.lines().next().unwrap().contains("CLOCK"), "{text}");
    let line = |pid: u32| {
        text.lines()
            .find(|l| l.split_whitespace().any(|w| w == pid.to_string()))
            .unwrap_or_else(|| panic!("no line for {pid}: {text}"))
    };
    assert!(line(server.0.id()).contains("s ahead"), "{text}");
    assert!(line(behind.0.id()).contains("s behind"), "{text}");
    assert!(line(unsynced.0.id()).contains("unsynced"), "{text}");

    let r = http_request(
        &addr,
        "GET",
        "/v1/workers",
        &[] as &[&str],
        "",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.raw());
    let api: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(offsets_by_pid(&api).len(), 3, "{api}");
    let api_rows = offsets_by_pid(&api);
    let api_serve = &api_rows.iter().find(|(p, _)| *p == pids[0]).unwrap().1;
    assert!(near(api_serve, -3_000), "{api}");

    redrive_testkit::cli::terminate(vec![server, behind, unsynced], Duration::from_secs(30));
}

#[test]
fn a_bad_clock_offset_is_a_usage_error_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let cli = redrive_testkit::cli!();
    let mut cmd = cli.db_command(&db, ["work", "--until-idle"]);
    cmd.env("REDRIVE_CLOCK_OFFSET", "soon");
    let e = err_text(&cli.output(&mut cmd), 2);
    assert!(
        e.contains("REDRIVE_CLOCK_OFFSET") && e.contains("soon"),
        "{e}"
    );
    let mut cmd = cli.db_command(&db, ["work", "--until-idle"]);
    cmd.env("REDRIVE_CLOCK_SYNC", "maybe");
    let e = err_text(&cli.output(&mut cmd), 2);
    assert!(
        e.contains("REDRIVE_CLOCK_SYNC") && e.contains("maybe"),
        "{e}"
    );
}
