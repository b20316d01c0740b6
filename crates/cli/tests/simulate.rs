//! `redrive simulate`, run as a user runs it: the built binary.

use std::process::Output;

use redrive_testkit::cli::{stderr, stdout};

fn redrive(args: &[&str]) -> Output {
    redrive_testkit::cli!().run(std::iter::once("simulate").chain(args.iter().copied()))
}

#[test]
fn a_small_seeded_sweep_prints_a_table_and_writes_csv() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("occ.csv");
    let o = redrive(&[
        "--clients",
        "10,20",
        "--runs",
        "5",
        "--seed",
        "3",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("model occ"), "{out}");
    assert!(out.contains("seeds 3..7"), "{out}");
    for s in [
        "none",
        "constant",
        "exponential",
        "full",
        "equal",
        "decorrelated",
        "proportional(0.5)",
    ] {
        assert!(out.contains(s), "{s}: {out}");
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 1 + 7 * 2, "{text}");
    // Same seed, same output.
    let again = redrive(&["--clients", "10,20", "--runs", "5", "--seed", "3"]);
    let first: Vec<_> = out.lines().filter(|l| !l.starts_with("wrote")).collect();
    assert_eq!(first, stdout(&again).lines().collect::<Vec<_>>());
}

#[test]
fn capacity_model_json_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("cap.svg");
    let o = redrive(&[
        "--model",
        "capacity",
        "--clients",
        "50",
        "--runs",
        "3",
        "--strategy",
        "exponential",
        "--strategy",
        "full+ra,schedule(1s,2s,4s)",
        "--capacity",
        "20",
        "--outage",
        "0s+2s",
        "--plot",
        svg.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    assert_eq!(v["model"], "capacity");
    assert_eq!(v["capacity_per_100ms"], 2.0);
    let names: Vec<_> = v["strategies"].as_array().unwrap().iter().collect();
    assert_eq!(names, ["exponential", "full+ra", "schedule(1s,2s,4s)"]);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

#[test]
fn a_bad_strategy_exits_2_naming_the_flag_and_value() {
    let o = redrive(&["--strategy", "fulll", "--runs", "1", "--clients", "5"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("--strategy"), "{err}");
    assert!(err.contains("fulll"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let o = redrive(&["--strategy", "full+ra", "--runs", "1", "--clients", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("capacity model only"), "{}", stderr(&o));

    for (bad, needle) in [
        ("full+limit+adaptive", "exclude each other"),
        ("full+ra+turbo", "+turbo"),
        ("full+adaptiv", "+adaptiv"),
    ] {
        let o = redrive(&[
            "--model",
            "capacity",
            "--strategy",
            bad,
            "--runs",
            "1",
            "--clients",
            "5",
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("--strategy"), "{bad}: {err}");
        assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        assert!(err.contains(needle), "{bad}: {err}");
    }
    let o = redrive(&["--strategy", "full+limit", "--runs", "1", "--clients", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("capacity model only"), "{}", stderr(&o));
}

#[test]
fn capacity_model_takes_a_rate_limit_configured_or_learned() {
    let o = redrive(&[
        "--model",
        "capacity",
        "--clients",
        "100",
        "--runs",
        "3",
        "--strategy",
        "full+ra,full+ra+adaptive,full+limit",
        "--processes",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    let names: Vec<_> = v["strategies"].as_array().unwrap().iter().collect();
    assert_eq!(names, ["full+ra", "full+ra+adaptive", "full+limit"]);
    let cell = |s: &str| {
        v["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["strategy"] == s)
            .unwrap()
            .clone()
    };
    // A limit at the PSP's capacity (50/s): 100 payments in about 2 s, none wasted.
    assert_eq!(cell("full+limit")["wasted"], 0.0);
    assert!(cell("full+limit")["completion_ms"]["max"].as_f64().unwrap() < 2_500.0);
    assert!(cell("full+ra")["wasted"].as_f64().unwrap() > 0.0);
}

#[test]
fn the_demo_scenario_prints_the_psp_load() {
    let o = redrive(&["--model", "capacity", "--scenario", "demo", "--runs", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("scenario demo: 2000 charges, 16 workers"),
        "{out}"
    );
    assert!(out.contains("rate limit 80/s with Retry-After 1s"), "{out}");
    assert!(out.contains("seeds 1..2"), "{out}");
    for f in [
        "psp_load (mean): limit_rps 80 ",
        "peak_ratio",
        "share_429",
        "minimum_seconds",
        "vs_minimum",
        "back_after_outage_s",
    ] {
        assert!(out.contains(f), "{f}: {out}");
    }
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("mean")),
        "{out}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (csv, svg) = (dir.path().join("demo.csv"), dir.path().join("demo.svg"));
    let o = redrive(&[
        "--model",
        "capacity",
        "--scenario",
        "demo",
        "--runs",
        "1",
        "--seed",
        "3",
        "--clients",
        "32",
        "--json",
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    assert_eq!(v["scenario"], "demo");
    assert_eq!(v["workers"], 32);
    let run = &v["runs"][0];
    assert_eq!(run["seed"], 3);
    assert_eq!(run["succeeded"], 2000);
    assert_eq!(run["charges"], 2000);
    let load = &run["psp_load"];
    assert_eq!(load["limit_rps"], 80.0);
    for f in ["peak_ratio", "share_429", "minimum_seconds", "vs_minimum"] {
        assert!(load[f].as_f64().unwrap() > 0.0, "{f}: {load}");
    }
    assert!(
        load["back_after_outage_s"].as_f64().unwrap() > 0.0,
        "{load}"
    );
    assert!(v["mean"]["psp_load"]["vs_minimum"].as_f64().unwrap() >= 1.0);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

#[test]
fn the_demo_scenario_refuses_what_it_sets() {
    for (args, needle) in [
        (&["--scenario", "demo"][..], "--model capacity only"),
        (
            &["--model", "capacity", "--scenario", "black-friday"][..],
            "\"black-friday\"",
        ),
        (
            &[
                "--model",
                "capacity",
                "--scenario",
                "demo",
                "--strategy",
                "full",
            ][..],
            "--strategy does not apply",
        ),
        (
            &[
                "--model",
                "capacity",
                "--scenario",
                "demo",
                "--capacity",
                "10",
            ][..],
            "--capacity does not apply",
        ),
        (
            &[
                "--model",
                "capacity",
                "--scenario",
                "demo",
                "--clients",
                "8,16",
            ][..],
            "--clients",
        ),
    ] {
        let o = redrive(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn other_bad_values_exit_2() {
    for (args, needle) in [
        (&["--model", "herd"][..], "--model"),
        (&["--clients", "10,x"][..], "--clients"),
        (&["--clients", "0"][..], "--clients"),
        (
            &["--capacity", "100"][..],
            "--capacity applies to --model capacity",
        ),
        (
            &["--model", "capacity", "--capacity", "0"][..],
            "--capacity",
        ),
        (
            &["--model", "capacity", "--overload", "500"][..],
            "--overload",
        ),
        (
            &["--model", "capacity", "--retry-after", "soon"][..],
            "--retry-after",
        ),
        (&["--model", "capacity", "--outage", "5s"][..], "--outage"),
        (&["--plot", "chart.jpg"][..], "--plot"),
    ] {
        let o = redrive(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn the_fleet_scenario_runs_three_processes_on_one_row() {
    let o = redrive(&[
        "--model",
        "capacity",
        "--scenario",
        "fleet",
        "--runs",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    assert_eq!(v["scenario"], "fleet");
    assert_eq!(
        (v["processes"].as_u64(), v["workers"].as_u64()),
        (Some(3), Some(16))
    );
    let run = &v["runs"][0];
    assert_eq!(run["succeeded"], 1000);
    assert_eq!(run["psp_load"]["limit_rps"], 50.0);
    // Skewed clocks and another number of processes, in text.
    let o = redrive(&[
        "--model",
        "capacity",
        "--scenario",
        "fleet",
        "--runs",
        "1",
        "--processes",
        "2",
        "--clock-skew",
        "200ms",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains(
            "scenario fleet: 1000 charges, 2 processes × 16 workers (clocks skewed over ±200ms)"
        ),
        "{out}"
    );
    // The herd model takes both flags; the occ model refuses them.
    let o = redrive(&[
        "--model",
        "capacity",
        "--processes",
        "3",
        "--clock-skew",
        "1s",
        "--runs",
        "2",
        "--strategy",
        "full+ra+adaptive",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = redrive(&["--clock-skew", "1s"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--clock-skew applies to --model capacity only"),
        "{}",
        stderr(&o)
    );
    let o = redrive(&["--model", "capacity", "--clock-skew", "2h"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--clock-skew"), "{}", stderr(&o));
}

/// The fleet scenario's PSP can be changed (issue 35's second fleet), and its figures include
/// the fleet benchmark's own: `peak_1s` and `back_80_s`. `--error-rate` belongs to the fleet
/// scenario; bad values are named.
#[test]
fn the_fleet_scenario_takes_the_psps_limit_retry_after_and_error_rate() {
    let o = redrive(&[
        "--model",
        "capacity",
        "--scenario",
        "fleet",
        "--runs",
        "1",
        "--processes",
        "5",
        "--capacity",
        "40",
        "--retry-after",
        "3",
        "--error-rate",
        "0.05",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    assert_eq!(v["psp"]["rate_limit"], 40.0);
    assert_eq!(v["psp"]["error_rate"], 0.05);
    let load = &v["runs"][0]["psp_load"];
    assert_eq!(load["limit_rps"], 40.0);
    assert!(load["peak_1s"].as_f64().unwrap() > 0.5, "{load}");
    assert!(load["back_80_s"].as_f64().unwrap() > 0.0, "{load}");
    assert_eq!(v["runs"][0]["succeeded"], 1000);
    for (args, want) in [
        (
            vec!["--model", "capacity", "--error-rate", "0.1"],
            "--error-rate applies to --scenario fleet only",
        ),
        (
            vec![
                "--model",
                "capacity",
                "--scenario",
                "demo",
                "--error-rate",
                "0.1",
            ],
            "--error-rate does not apply with --scenario demo",
        ),
        (
            vec![
                "--model",
                "capacity",
                "--scenario",
                "fleet",
                "--retry-after",
                "soon",
            ],
            "invalid --retry-after \"soon\"",
        ),
        (
            vec![
                "--model",
                "capacity",
                "--scenario",
                "fleet",
                "--error-rate",
                "2",
            ],
            "error",
        ),
    ] {
        let o = redrive(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}
