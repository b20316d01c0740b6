//! `redrive policy show`, run as a user runs it: the built binary.

use std::process::Output;

use redrive_testkit::cli::{stderr, stdout};

fn redrive(args: &[&str]) -> Output {
    redrive_testkit::cli!().run(args)
}

#[test]
fn payment_table_shows_retry_defer_and_death() {
    let o = redrive(&["policy", "show", "payment", "--samples", "200"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("policy payment: at most 15 attempts (10 retry + 5 defer)"),
        "{out}"
    );
    assert!(out.contains("retry in process"), "{out}");
    assert!(out.contains("defer"), "{out}");
    assert!(out.contains("defers_exhausted 100%"), "{out}");
    // One header, 15 attempt rows.
    let rows = out
        .lines()
        .filter(|l| l.starts_with("  ") && l.trim_start().starts_with(char::is_numeric))
        .count();
    assert_eq!(rows, 15, "{out}");
}

#[test]
fn json_is_one_document_with_every_attempt() {
    let o = redrive(&[
        "policy",
        "show",
        "classic",
        "--json",
        "--samples",
        "100",
        "--seed",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    assert_eq!(v["policy"], "classic");
    assert_eq!(v["seed"], 3);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5);
    let nominal: Vec<u64> = rows
        .iter()
        .map(|r| r["nominal_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(nominal, vec![1000, 2000, 4000, 8000, 0]);
    assert_eq!(v["dead"]["attempts_exhausted"], 100);
}

#[test]
fn same_seed_same_table() {
    let a = redrive(&[
        "policy",
        "show",
        "payment",
        "--seed",
        "9",
        "--samples",
        "50",
    ]);
    let b = redrive(&[
        "policy",
        "show",
        "payment",
        "--seed",
        "9",
        "--samples",
        "50",
    ]);
    assert_eq!(stdout(&a), stdout(&b));
}

#[test]
fn ad_hoc_flags_build_a_policy() {
    let o = redrive(&[
        "policy",
        "show",
        "--base",
        "1s",
        "--cap",
        "4s",
        "--multiplier",
        "2",
        "--jitter",
        "none",
        "--attempts",
        "4",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let p50: Vec<u64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["p50_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(p50, vec![1000, 2000, 4000, 0]);
}

#[test]
fn a_policy_file_is_shown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.toml");
    std::fs::write(
        &path,
        "[policy.refunds.retry]\nbackoff = \"schedule\"\nschedule = [\"2s\", \"4s\"]\njitter = \"none\"\nmax_attempts = 3\n",
    )
    .unwrap();
    let o = redrive(&["policy", "show", "--file", path.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["policy"], "refunds");
    // And through the global --policies flag, by name.
    let o = redrive(&[
        "--policies",
        path.to_str().unwrap(),
        "policy",
        "show",
        "refunds",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("policy refunds"));
}

fn assert_usage_error(args: &[&str], needle: &str) {
    let o = redrive(args);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in {err:?}"
    );
    assert!(stdout(&o).is_empty(), "{args:?}: nothing on stdout");
}

#[test]
fn bad_input_is_a_usage_error_naming_the_flag() {
    assert_usage_error(
        &["policy", "show", "--multiplier", "0.5"],
        "--multiplier 0.5",
    );
    assert_usage_error(&["policy", "show", "--attempts", "0"], "--attempts 0");
    assert_usage_error(&["policy", "show", "--jitter", "wild"], "--jitter \"wild\"");
    assert_usage_error(&["policy", "show", "--base", "5"], "--base");
    assert_usage_error(
        &["policy", "show", "--base", "10s", "--cap", "1s"],
        "--base 10s",
    );
    assert_usage_error(&["policy", "show", "premium"], "unknown policy \"premium\"");
    assert_usage_error(&["policy", "show"], "name a policy");
    assert_usage_error(
        &["policy", "show", "payment", "--samples", "0"],
        "--samples",
    );
}

#[test]
fn an_invalid_file_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[policy.x.retry]\nmax_attempts = 0\n").unwrap();
    assert_usage_error(
        &["policy", "show", "--file", path.to_str().unwrap()],
        "policy.x.retry.max_attempts = 0",
    );
    let o = redrive(&["policy", "show", "--file", "/nonexistent/p.toml"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("/nonexistent/p.toml"));
}
