//! `redrive demo` as the end-to-end test of the product (issue 5's scenario): 2,000 charges as
//! `http` jobs, 16 concurrent workers, against the PSP simulator with 20% 5xx, a rate limit
//! with `Retry-After`, a 5-second outage and 5% of answers lost after the charge was made.

use std::process::Command;

#[test]
fn healthy_psp_with_and_without_the_simulators_layer() {
    for layer in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_redrive"));
        cmd.args(["demo", "--json", "--no-faults", "--charges", "300"])
            .args(["--concurrency", "8", "--out"])
            .arg(dir.path())
            .current_dir(dir.path());
        if layer {
            cmd.arg("--sim-idempotency-layer");
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["sim_idempotency_layer"], layer, "{r:#}");
        assert_eq!(r["succeeded"], 300, "{r:#}");
        assert_eq!(r["psp"]["charges"], 300);
        assert_eq!(r["exactly_once"], true);
    }
}

#[test]
fn two_thousand_charges_through_a_bad_day_are_each_made_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .args([
            "demo",
            "--json",
            "--charges",
            "2000",
            "--concurrency",
            "16",
            "--out",
        ])
        .arg(dir.path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let n = |p: &str| r.pointer(p).and_then(|v| v.as_u64()).unwrap_or(0);
    // Every job succeeded, and the PSP made exactly 2,000 charges.
    assert_eq!(n("/succeeded"), 2000, "{r:#}");
    assert_eq!(n("/psp/charges"), 2000);
    assert_eq!(n("/psp/distinct_keys"), 2000);
    assert_eq!(n("/psp/duplicate_effects"), 0);
    assert_eq!(r["exactly_once"], true);
    // The scenario really hit: 5xx, 429s and lost answers (timeouts) were seen.
    let by_status = &r["psp"]["requests_by_status"];
    assert!(by_status["429"].as_u64().unwrap_or(0) > 0, "{by_status}");
    assert!(by_status["503"].as_u64().unwrap_or(0) > 0, "{by_status}");
    assert!(n("/attempts_by_class/timeout") > 0);
    // The breaker opened during the outage, and while it was open the PSP received no more
    // requests than the probe limit (3).
    let opened = r["breaker_transitions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["from"] == "closed" && t["to"] == "open");
    assert!(opened, "{:#}", r["breaker_transitions"]);
    assert!(n("/requests_while_open") <= 3, "{r:#}");
    // No retry came before the Retry-After it was answered with.
    assert_eq!(n("/retries_before_retry_after"), 0);
}

#[test]
fn demo_refuses_bad_flags_naming_them() {
    let o = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .args(["demo", "--concurrency", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--concurrency"));
    let o = Command::new(env!("CARGO_BIN_EXE_redrive"))
        .args(["demo", "--serve", "--addr", "0.0.0.0:8080"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("loopback"));
}
