//! One-shot commands time what they write to shared rows in the database's clock (R24), not
//! in this host's: `REDRIVE_CLOCK_OFFSET` moves the command's own clock an hour ahead (a host
//! whose clock is wrong), and a delayed job, a dependency's pause and a schedule's next tick
//! still come when the database's clock says. `REDRIVE_CLOCK_SYNC=off` is the control: the
//! host's clock then decides, an hour late.

use chrono::{DateTime, Utc};
use serde_json::Value;

fn redrive(db: &str, env: &[(&str, &str)], args: &[&str]) -> Value {
    let mut cmd = redrive_testkit::cli!().cmd();
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.args(["--db", db]).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn time(v: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(v.as_str().unwrap_or_else(|| panic!("{v}")))
        .unwrap()
        .to_utc()
}

/// Seconds from now (the database's clock: SQLite's is this machine's true one) to `t`.
fn ahead(t: DateTime<Utc>) -> f64 {
    (t - Utc::now()).num_milliseconds() as f64 / 1000.0
}

#[test]
fn one_shot_commands_time_shared_rows_in_the_databases_clock() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let skewed = [("REDRIVE_CLOCK_OFFSET", "1h")];
    let unsynced = [
        ("REDRIVE_CLOCK_OFFSET", "1h"),
        ("REDRIVE_CLOCK_SYNC", "off"),
    ];
    // A delayed job.
    let e = redrive(
        &db,
        &skewed,
        &[
            "enqueue", "--queue", "q", "--kind", "noop", "--key", "a", "--delay", "30s", "--json",
        ],
    );
    let run_at = ahead(time(&e["job"]["run_at"]));
    assert!((20.0..=31.0).contains(&run_at), "run_at {run_at} s ahead");
    let e = redrive(
        &db,
        &unsynced,
        &[
            "enqueue", "--queue", "q", "--kind", "noop", "--key", "b", "--delay", "30s", "--json",
        ],
    );
    let run_at = ahead(time(&e["job"]["run_at"]));
    assert!(run_at > 3500.0, "the control: {run_at} s ahead");
    // A dependency's pause for a while.
    let d = redrive(
        &db,
        &skewed,
        &["dependency", "pause", "psp", "--until", "45s", "--json"],
    );
    let until = ahead(time(&d["paused_until"]));
    assert!((35.0..=46.0).contains(&until), "paused for {until} s");
    let d = redrive(
        &db,
        &unsynced,
        &["dependency", "pause", "psp", "--until", "45s", "--json"],
    );
    let until = ahead(time(&d["paused_until"]));
    assert!(until > 3500.0, "the control: paused for {until} s");
}
