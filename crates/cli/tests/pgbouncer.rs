//! redrive behind PgBouncer (issue 39), started here on a free port in front of the test
//! server. Session mode: migrations, enqueues, claims, completions and the idempotency layer go
//! through the pooler, in a schema of their own, and LISTEN goes straight to the server
//! (`--listen-db`). Transaction mode: see docs/operations.md ("Behind PgBouncer"); it needs
//! PgBouncer 1.21 or later (protocol-level prepared statements), which `pgbouncer --version`
//! tells, and is run here only then.
//!
//! Needs the `pgbouncer` binary (Debian's package; `.ci/run` installs it); skipped without it,
//! failing under `CI=true`.

use std::path::PathBuf;

use redrive_testkit::PgSchema;
use redrive_testkit::cli::{block, ok_json};

#[path = "support/pgbouncer.rs"]
mod bouncer;
use bouncer::{pgbouncer, start, through};

fn drain_through(mode: &str, bin: &PathBuf) {
    let Some(schema) = block(PgSchema::fresh(&format!("rdpgb_{}", &mode[..4]))) else {
        return;
    };
    let bouncer = start(bin, mode, schema.server_url(), schema.name());
    let via = through(&bouncer, schema.server_url());
    let db = format!("{via}?schema={}", schema.name());
    let cli = redrive_testkit::cli!();
    let direct = schema.server_url().to_owned();
    let run = |args: &[&str]| {
        let mut cmd = cli.cmd();
        cmd.args(["--db", &db, "--listen-db", &direct]).args(args);
        cli.output(&mut cmd)
    };
    let o = run(&["migrate"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for i in 0..20 {
        let key = format!("k{i}");
        let o = run(&["enqueue", "--queue", "pgb", "--kind", "noop", "--key", &key]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // The same key again: the same job (the unique index decides, through the pooler too).
    let again = ok_json(&run(&[
        "enqueue", "--queue", "pgb", "--kind", "noop", "--key", "k3", "--json",
    ]));
    assert_eq!(again["created"], false, "{again}");
    let o = run(&[
        "work",
        "--queue",
        "pgb",
        "--until-idle",
        "--concurrency",
        "8",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stats = ok_json(&run(&["stats", "--json"]));
    let text = stats.to_string();
    assert!(text.contains("succeeded"), "{text}");
    let jobs = ok_json(&run(&[
        "jobs",
        "--queue",
        "pgb",
        "--state",
        "succeeded",
        "--json",
        "--limit",
        "100",
    ]));
    let n = jobs["jobs"].as_array().map_or(0, Vec::len);
    assert_eq!(n, 20, "{jobs}");
    drop(bouncer);
    block(schema.drop_now());
}

#[test]
fn a_queue_drains_through_pgbouncer_in_session_mode() {
    let Some((bin, _)) = pgbouncer() else { return };
    drain_through("session", &bin);
}

#[test]
fn a_queue_drains_through_pgbouncer_in_transaction_mode_from_1_21() {
    let Some((bin, version)) = pgbouncer() else {
        return;
    };
    if version < (1, 21) {
        eprintln!(
            "skipped: pgbouncer {}.{} has no prepared statements in transaction mode (1.21+)",
            version.0, version.1
        );
        return;
    }
    drain_through("transaction", &bin);
}
