//! `redrive psp-sim`, run as a user runs it: the built binary on 127.0.0.1:0.

use std::time::Duration;

use redrive_testkit::cli::{Running, http_request, spawn_listening};

/// Starts the simulator and reads its `listening on http://ADDR` line.
fn start(extra: &[&str]) -> (Running, String) {
    let mut sim = redrive_testkit::cli!().command(["psp-sim", "--addr", "127.0.0.1:0"]);
    let (sim, addr) = spawn_listening(sim.args(extra), "listening on http://");
    assert!(!addr.ends_with(":0"), "the real port is printed: {addr}");
    (sim, addr)
}

/// One HTTP/1.1 request with `Connection: close`; returns (status, head in lower case, body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let headers: Vec<String> = headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let r = http_request(addr, method, path, &headers, body, Duration::from_secs(30)).unwrap();
    (r.status, r.head.to_ascii_lowercase(), r.body)
}

const JSON: (&str, &str) = ("Content-Type", "application/json");

#[test]
fn serves_charges_and_stats_until_killed() {
    let (_sim, addr) = start(&["--seed", "4", "--latency", "1ms"]);
    let (status, _, body) = http(
        &addr,
        "POST",
        "/v1/charges",
        &[JSON, ("Idempotency-Key", "cli-1")],
        r#"{"amount":1500,"currency":"EUR"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let charge: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(charge["amount"], 1500);

    let (status, head, _) = http(
        &addr,
        "POST",
        "/v1/charges",
        &[JSON, ("Idempotency-Key", "cli-1")],
        r#"{"amount":1500,"currency":"EUR"}"#,
    );
    assert_eq!(status, 201);
    assert!(head.contains("idempotent-replayed: true"), "{head}");

    let (status, _, body) = http(&addr, "GET", "/_sim/stats", &[], "");
    assert_eq!(status, 200);
    let s: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["requests_total"], 2);
    assert_eq!(s["charges"], 1);
    assert_eq!(s["distinct_keys"], 1);
    assert_eq!(s["duplicate_effects"], 0);
    assert_eq!(s["ledger_dedupe"], true, "on by default");
    assert_eq!(s["seed"], 4);
    assert!(s["timeline"].is_array());

    let (_, _, body) = http(&addr, "GET", "/_sim/faults", &[], "");
    let f: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(f["latency_ms"], 1);
}

#[test]
fn fault_flags_reach_the_simulator() {
    let (_sim, addr) = start(&[
        "--outage",
        "0s+1h",
        "--rate-limit",
        "5",
        "--retry-after",
        "2",
        "--error-rate",
        "0.5",
        "--timeout-after-commit",
        "0.1",
    ]);
    let (status, head, _) = http(
        &addr,
        "POST",
        "/v1/charges",
        &[JSON, ("Idempotency-Key", "k")],
        r#"{"amount":1,"currency":"EUR"}"#,
    );
    assert_eq!(status, 503);
    assert!(!head.contains("retry-after"), "{head}");
    let (_, _, body) = http(&addr, "GET", "/_sim/faults", &[], "");
    let f: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(f["outage"]["start_ms"], 0);
    assert_eq!(f["outage"]["length_ms"], 3_600_000);
    assert_eq!(f["rate_limit"], 5.0);
    assert_eq!(f["retry_after"], 2);
    assert_eq!(f["error_rate"], 0.5);
    assert_eq!(f["timeout_after_commit"], 0.1);
}

/// `--ledger-dedupe off`: the layer in front is the only protection, and its replays show.
#[test]
fn ledger_dedupe_off_leaves_the_charges_to_the_idempotency_layer() {
    let (_sim, addr) = start(&["--ledger-dedupe", "off"]);
    for _ in 0..2 {
        let (status, _, body) = http(
            &addr,
            "POST",
            "/v1/charges",
            &[JSON, ("Idempotency-Key", "k")],
            r#"{"amount":1,"currency":"EUR"}"#,
        );
        assert_eq!(status, 201, "{body}");
    }
    let (_, _, body) = http(&addr, "GET", "/_sim/stats", &[], "");
    let s: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["ledger_dedupe"], false, "{s}");
    assert_eq!(s["charges"], 1, "{s}");
    assert_eq!(s["layer_replays"], 1, "{s}");
    assert_eq!(s["replays"], 0, "{s}");
    let (status, _, body) = http(&addr, "GET", "/_sim/requests", &[], "");
    assert_eq!(status, 200);
    let log: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(log["requests"][1]["replayed_by"], "layer", "{log}");
}

#[test]
fn bad_flag_values_exit_2_naming_the_flag() {
    let cases: [(&[&str], &str); 7] = [
        (&["--ledger-dedupe", "maybe"], "--ledger-dedupe"),
        (&["--outage", "5s"], "--outage"),
        (&["--outage", "5s+0s"], "--outage"),
        (&["--error-rate", "2"], "--error-rate"),
        (&["--timeout-after-commit=-1"], "--timeout-after-commit"),
        (&["--rate-limit", "0"], "--rate-limit"),
        (&["--latency", "fast"], "--latency"),
    ];
    for (args, flag) in cases {
        let o = redrive_testkit::cli!()
            .cmd()
            .args(["psp-sim", "--addr", "127.0.0.1:0"])
            .args(args)
            .output()
            .expect("run redrive");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
}

#[test]
fn an_address_in_use_exits_1() {
    let (_sim, addr) = start(&[]);
    let o = redrive_testkit::cli!()
        .cmd()
        .args(["psp-sim", "--addr", &addr])
        .output()
        .expect("run redrive");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot listen on"), "{err}");
}
