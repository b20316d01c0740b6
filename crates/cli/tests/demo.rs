//! `redrive demo` as the end-to-end test of the product (issue 5's scenario): 2,000 charges as
//! `http` jobs, 16 concurrent workers, against the PSP simulator with 20% 5xx, a rate limit
//! with `Retry-After`, a 5-second outage and 5% of answers lost after the charge was made.
//!
//! The simulator's ledger runs with its own dedupe off (as a real PSP's would), so "exactly
//! once" is read from its effects per key; the negative control runs the same scenario
//! without the idempotency layer and sees the check fail.

use std::process::Output;

use serde_json::Value;

fn demo(dir: &std::path::Path, args: &[&str]) -> Output {
    let cli = redrive_testkit::cli!();
    let mut demo = cli.command(["demo", "--json", "--out"]);
    cli.output(demo.arg(dir).args(args).current_dir(dir))
}

fn report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): exit {:?}\n{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// The field at `p`, which must exist and be a whole number.
fn n(r: &Value, p: &str) -> u64 {
    r.pointer(p)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{p} missing or not a whole number: {r:#}"))
}

/// The field at `p`, which must exist and be a number.
fn x(r: &Value, p: &str) -> f64 {
    r.pointer(p)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{p} missing or not a number: {r:#}"))
}

/// The field at `p`, which must exist and be `null`.
fn null(r: &Value, p: &str) {
    assert!(
        r.pointer(p).is_some_and(Value::is_null),
        "{p} missing or not null: {r:#}"
    );
}

#[test]
fn healthy_psp_with_and_without_the_simulators_layer() {
    for layer in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["--no-faults", "--charges", "300", "--concurrency", "8"];
        if layer {
            args.push("--sim-idempotency-layer");
        }
        let o = demo(dir.path(), &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r = report(&o);
        assert_eq!(r["sim_idempotency_layer"], layer, "{r:#}");
        assert_eq!(n(&r, "/succeeded"), 300, "{r:#}");
        assert_eq!(n(&r, "/psp/charges"), 300);
        assert_eq!(n(&r, "/psp/duplicate_effects"), 0);
        assert_eq!(n(&r, "/psp/effects_max_per_key"), 1);
        assert_eq!(r["psp"]["ledger_dedupe"], false, "{r:#}");
        assert_eq!(r["exactly_once"], true);
        assert_eq!(n(&r, "/requests_while_open"), 0);
        assert_eq!(n(&r, "/probes_sent"), 0);
        // No rate limit, no outage: no figure is invented against them.
        for f in [
            "limit_rps",
            "peak_ratio",
            "minimum_seconds",
            "vs_minimum",
            "back_after_outage_s",
        ] {
            null(&r, &format!("/psp_load/{f}"));
        }
        assert_eq!(x(&r, "/psp_load/share_429"), 0.0);
    }
}

#[test]
fn two_thousand_charges_through_a_bad_day_are_each_made_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let o = demo(dir.path(), &["--charges", "2000", "--concurrency", "16"]);
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    let r = report(&o);
    // Every job succeeded, and the PSP's ledger, which refuses nothing itself, made exactly
    // 2,000 charges, one per key: only the idempotency layer stood between the retries and a
    // second charge, and it replayed the lost answers.
    assert_eq!(r["psp"]["ledger_dedupe"], false, "{r:#}");
    assert_eq!(n(&r, "/succeeded"), 2000, "{r:#}");
    assert_eq!(n(&r, "/psp/charges"), 2000);
    assert_eq!(n(&r, "/psp/distinct_keys"), 2000);
    assert_eq!(n(&r, "/psp/duplicate_effects"), 0);
    assert_eq!(n(&r, "/psp/effects_max_per_key"), 1);
    assert_eq!(n(&r, "/psp/executions_max_per_key"), 1, "{r:#}");
    assert_eq!(n(&r, "/psp/replays"), 0, "the ledger replays nothing");
    assert!(n(&r, "/psp/layer_replays") > 0, "{r:#}");
    assert_eq!(r["exactly_once"], true);
    // The scenario really hit: 5xx, 429s and lost answers (timeouts) were seen.
    assert!(n(&r, "/psp/requests_by_status/429") > 0, "{r:#}");
    assert!(n(&r, "/psp/requests_by_status/503") > 0, "{r:#}");
    assert!(n(&r, "/attempts_by_class/timeout") > 0);
    // The breaker opened during the outage; no request was let through while it was open,
    // and the probes were at most 5 (the half-open group's size) per half-open round, not
    // counting the probes answered 429 (a rate-limited probe gives its permit back).
    let transitions = r["breaker_transitions"].as_array().unwrap();
    let opened = transitions
        .iter()
        .any(|t| t["from"] == "closed" && t["to"] == "open");
    assert!(opened, "{transitions:#?}");
    assert_eq!(n(&r, "/requests_while_open"), 0, "{r:#}");
    let rounds = transitions
        .iter()
        .filter(|t| t["to"] == "half_open")
        .count() as u64;
    let probes = n(&r, "/probes_sent");
    let judged = probes - n(&r, "/probes_rate_limited");
    let per_round: Vec<u64> = r["probes_judged_per_round"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(per_round.len() as u64, rounds, "{r:#}");
    assert_eq!(per_round.iter().sum::<u64>(), judged, "{r:#}");
    assert!(
        probes >= 1 && per_round.iter().all(|p| *p <= 5),
        "{probes} probes ({judged} not answered 429) in {rounds} rounds: {per_round:?}\n{transitions:#?}"
    );
    // No retry came before the Retry-After it was answered with.
    assert_eq!(n(&r, "/retries_before_retry_after"), 0);
    // The PSP's load against its limit: generous bounds (the figures are in the benchmark).
    assert_eq!(x(&r, "/psp_load/limit_rps"), 80.0);
    let peak = x(&r, "/psp_load/peak_ratio");
    assert!(peak > 0.0 && peak <= 4.0, "{:#}", r["psp_load"]);
    let share = x(&r, "/psp_load/share_429");
    assert!(share > 0.0 && share <= 0.1, "{:#}", r["psp_load"]);
    // At least the 5 s outage plus 2,000 charges at 80/s.
    let minimum = x(&r, "/psp_load/minimum_seconds");
    assert!(minimum >= 5.0 + 2000.0 / 80.0, "{:#}", r["psp_load"]);
    let vs = x(&r, "/psp_load/vs_minimum");
    assert!((1.0..=3.0).contains(&vs), "{:#}", r["psp_load"]);
    assert!((vs - x(&r, "/seconds") / minimum).abs() < 1e-9);
    let back = x(&r, "/psp_load/back_after_outage_s");
    assert!((0.0..60.0).contains(&back), "{:#}", r["psp_load"]);
}

/// The negative control: the same bad day without the simulator's idempotency layer. The
/// answers lost after the charge are retried with the same key, the ledger (its own dedupe
/// off) charges again, and the demo's exactly-once check reports the double charges and
/// fails. A smaller run keeps the suite's time down; the outage and the lost answers are the
/// same.
#[test]
fn exactly_once_check_catches_a_double_charge_without_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    let o = demo(
        dir.path(),
        &[
            "--no-sim-idempotency-layer",
            "--charges",
            "300",
            "--concurrency",
            "8",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = report(&o);
    assert_eq!(r["sim_idempotency_layer"], false, "{r:#}");
    assert_eq!(r["exactly_once"], false, "{r:#}");
    assert!(n(&r, "/psp/duplicate_effects") > 0, "{r:#}");
    assert!(n(&r, "/psp/effects_max_per_key") >= 2, "{r:#}");
    assert!(n(&r, "/psp/charges") > 300, "{r:#}");
    assert_eq!(n(&r, "/psp/layer_replays"), 0);
    let why = r["not_exactly_once"].to_string();
    assert!(why.contains("duplicate charges"), "{why}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("not every charge was made exactly once"),
        "{stderr}"
    );
}

#[test]
fn demo_refuses_bad_flags_naming_them() {
    let o = redrive_testkit::cli!()
        .cmd()
        .args(["demo", "--concurrency", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--concurrency"));
    let o = redrive_testkit::cli!()
        .cmd()
        .args(["demo", "--serve", "--addr", "0.0.0.0:8080"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("loopback"));
    let o = redrive_testkit::cli!()
        .cmd()
        .args([
            "demo",
            "--sim-idempotency-layer",
            "--no-sim-idempotency-layer",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--no-sim-idempotency-layer"));
}
