//! `redrive serve`, run as a user runs it: the built binary on 127.0.0.1:0.

use std::time::Duration;

use redrive_testkit::cli::{Running, http_request, spawn_listening};

fn start(db: &str, extra: &[&str]) -> (Running, String) {
    let mut serve = redrive_testkit::cli!().db_command(db, ["serve", "--addr", "127.0.0.1:0"]);
    let (server, addr) = spawn_listening(serve.args(extra), "listening on http://");
    assert!(!addr.ends_with(":0"), "the real port is printed: {addr}");
    (server, addr)
}

/// One HTTP/1.1 request with `Connection: close`; returns (status, whole response).
fn request(addr: &str, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let r = http_request(addr, method, path, headers, body, Duration::from_secs(10)).unwrap();
    (r.status, r.raw())
}

#[test]
fn serve_answers_health_api_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let (_server, addr) = start(&db, &["--token", "t0k", "--metrics-refresh", "50ms"]);
    assert_eq!(request(&addr, "GET", "/healthz", &[], "").0, 200);
    assert_eq!(request(&addr, "GET", "/readyz", &[], "").0, 200);
    let (status, res) = request(&addr, "GET", "/v1/jobs", &[], "");
    assert_eq!(status, 401, "{res}");
    let (status, res) = request(
        &addr,
        "POST",
        "/v1/jobs",
        &[
            "Authorization: Bearer t0k",
            "Content-Type: application/json",
        ],
        r#"{"queue": "cli", "kind": "noop"}"#,
    );
    assert_eq!(status, 201, "{res}");
    // With a token, /metrics needs it too.
    let (status, res) = request(&addr, "GET", "/metrics", &[], "");
    assert_eq!(status, 401, "{res}");
    // The gauges are refreshed by a background task (every 50 ms here), not by the scrape.
    let t = std::time::Instant::now();
    loop {
        let (status, res) = request(&addr, "GET", "/metrics", &["Authorization: Bearer t0k"], "");
        assert_eq!(status, 200, "{res}");
        if res.contains("redrive_jobs{queue=\"cli\",state=\"available\"} 1") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{res}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `serve` with `extra` after `--addr 0.0.0.0:0`: refused before anything is bound.
fn refused_beyond_loopback(extra: &[&str]) -> String {
    let out = redrive_testkit::cli!()
        .cmd()
        .args(["--db", "sqlite::memory:", "serve", "--addr", "0.0.0.0:0"])
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

#[test]
fn serve_refuses_a_short_token_beyond_loopback() {
    let err = refused_beyond_loopback(&["--token", "fifteen-chars-x"]);
    assert!(
        err.contains("with a token of 15 characters") && err.contains("at least 16"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "short\n").unwrap();
    let err = refused_beyond_loopback(&["--token-file", file.to_str().unwrap()]);
    assert!(err.contains("with a token of 5 characters"), "{err}");
    // The environment variable is held to the same rule.
    let out = redrive_testkit::cli!()
        .cmd()
        .args(["--db", "sqlite::memory:", "serve", "--addr", "0.0.0.0:0"])
        .env("REDRIVE_API_TOKEN", "short")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // Loopback keeps accepting short tokens (tests, local use).
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let (_server, addr) = start(&db, &["--token", "t0k"]);
    assert_eq!(request(&addr, "GET", "/healthz", &[], "").0, 200);
}

#[test]
fn serve_reads_the_token_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(
        &file,
        "  token-from-a-file-0123456789  \nignored second line\n",
    )
    .unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let (_server, addr) = start(&db, &["--token-file", file.to_str().unwrap()]);
    assert_eq!(request(&addr, "GET", "/v1/jobs", &[], "").0, 401);
    let auth = "Authorization: Bearer token-from-a-file-0123456789";
    let (status, res) = request(&addr, "GET", "/v1/jobs", &[auth], "");
    assert_eq!(status, 200, "{res}");

    // Bad files and doubled tokens are usage errors naming the flag.
    let missing = dir.path().join("missing");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n  \n").unwrap();
    for (args, want) in [
        (
            vec!["--token-file", missing.to_str().unwrap()],
            "cannot read",
        ),
        (vec!["--token-file", empty.to_str().unwrap()], "is empty"),
        (
            vec!["--token-file", file.to_str().unwrap(), "--token", "x"],
            "give the token once",
        ),
    ] {
        let out = redrive_testkit::cli!()
            .cmd()
            .args(["--db", &db, "serve", "--addr", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--token-file") && err.contains(want), "{err}");
    }
}

#[test]
fn serve_checks_its_new_flags() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    for (args, want) in [
        (vec!["--public-host", "https://r.example"], "--public-host"),
        (vec!["--public-host", "r.example/x"], "--public-host"),
        (vec!["--header-timeout", "0s"], "--header-timeout"),
        (vec!["--idle-timeout", "soon"], "--idle-timeout"),
        (vec!["--max-connections", "0"], "--max-connections"),
    ] {
        let out = redrive_testkit::cli!()
            .cmd()
            .args(["--db", &db, "serve", "--addr", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn serve_refuses_a_public_address_without_a_token() {
    let out = redrive_testkit::cli!()
        .cmd()
        .args(["--db", "sqlite::memory:", "serve", "--addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without a token"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let out = redrive_testkit::cli!()
        .cmd()
        .args(["serve", "--addr", "localhost"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--addr"));
}

#[test]
fn serve_with_workers_runs_the_jobs_it_accepts_and_exports_their_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let (_server, addr) = start(&db, &["--workers", "2"]);
    // Ready: the store takes writes and the worker pool runs.
    let (status, res) = request(&addr, "GET", "/readyz", &[], "");
    assert_eq!(status, 200, "{res}");
    let (status, res) = request(
        &addr,
        "POST",
        "/v1/jobs",
        &["Content-Type: application/json"],
        r#"{"queue":"q","kind":"noop","payload":{}}"#,
    );
    assert_eq!(status, 201, "{res}");
    let body = res.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let id = v["job"]["id"].as_i64().unwrap();
    let t = std::time::Instant::now();
    loop {
        let (_, res) = request(&addr, "GET", &format!("/v1/jobs/{id}"), &[], "");
        if res.contains("\"succeeded\"") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "never ran: {res}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The in-process workers record into the same Prometheus registry /metrics renders.
    let (status, metrics) = request(&addr, "GET", "/metrics", &[], "");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("redrive_attempts_total{") && metrics.contains("class=\"success\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("redrive_jobs_finished_total{"),
        "{metrics}"
    );
}
