//! Retention and periodic jobs, run as the real binary against a fresh SQLite file:
//! `prune --dry-run` then `prune`; `schedule add|list|remove`; the policies file's
//! `[[schedules]]`; and a schedule every second worked by two `redrive work` processes, which
//! makes exactly one job per tick.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use redrive_testkit::cli::{err_text, ok_json as ok};

fn redrive(db: &str, args: &[&str]) -> Output {
    redrive_testkit::cli!().run_db(db, args)
}

fn err(o: &Output, code: i32, needle: &str) {
    let stderr = err_text(o, code);
    assert!(stderr.contains(needle), "{needle:?} not in {stderr:?}");
}

fn db() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    (dir, db)
}

fn jobs(db: &str, queue: &str) -> Vec<serde_json::Value> {
    let v = ok(&redrive(
        db,
        &["jobs", "--queue", queue, "--limit", "10000", "--json"],
    ));
    v["jobs"].as_array().cloned().unwrap_or_default()
}

fn per_state(v: &serde_json::Value) -> Vec<(String, u64, u64)> {
    v["states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["state"].as_str().unwrap().to_owned(),
                s["jobs"].as_u64().unwrap(),
                s["attempts"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn prune_dry_run_counts_then_prune_deletes_only_finished_jobs() {
    let (_dir, db) = db();
    for _ in 0..3 {
        ok(&redrive(
            &db,
            &["enqueue", "--queue", "done", "--kind", "noop"],
        ));
    }
    ok(&redrive(
        &db,
        &["work", "--queue", "done", "--until-idle", "--no-scheduler"],
    ));
    let c = ok(&redrive(
        &db,
        &["enqueue", "--queue", "c", "--kind", "noop", "--json"],
    ));
    let cid = c["job"]["id"].to_string();
    ok(&redrive(&db, &["cancel", &cid]));
    // Waiting jobs, however old, are never pruned.
    ok(&redrive(
        &db,
        &["enqueue", "--queue", "wait", "--kind", "noop"],
    ));
    ok(&redrive(
        &db,
        &[
            "enqueue", "--queue", "wait", "--kind", "noop", "--delay", "1h",
        ],
    ));
    std::thread::sleep(Duration::from_millis(20));

    // The defaults (7 days, 30 for dead): nothing is that old.
    let v = ok(&redrive(&db, &["prune", "--dry-run", "--json"]));
    assert_eq!(
        per_state(&v),
        [
            ("succeeded".into(), 0, 0),
            ("cancelled".into(), 0, 0),
            ("dead".into(), 0, 0)
        ]
    );
    // Older than 1 ms: what would go, and nothing changes.
    let v = ok(&redrive(
        &db,
        &["prune", "--older-than", "1ms", "--dry-run", "--json"],
    ));
    assert_eq!(v["dry_run"], true);
    assert_eq!(
        per_state(&v),
        [
            ("succeeded".into(), 3, 3),
            ("cancelled".into(), 1, 0),
            ("dead".into(), 0, 0)
        ]
    );
    assert_eq!(jobs(&db, "done").len(), 3, "a dry run changes nothing");
    let text = redrive(&db, &["prune", "--older-than", "1ms", "--dry-run"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("would delete 3 jobs and 3 attempts"),
        "{text}"
    );

    // Only succeeded: the cancelled job stays.
    let v = ok(&redrive(
        &db,
        &[
            "prune",
            "--older-than",
            "1ms",
            "--state",
            "succeeded",
            "--json",
        ],
    ));
    assert_eq!(v["dry_run"], false);
    assert_eq!(per_state(&v), [("succeeded".into(), 3, 3)]);
    assert!(jobs(&db, "done").is_empty(), "the succeeded jobs are gone");
    let shown = redrive(&db, &["show", "1", "--json"]);
    assert!(!shown.status.success(), "job 1 is gone with its attempts");
    assert_eq!(jobs(&db, "c").len(), 1);
    // Everything finished: the cancelled one goes; the waiting ones stay.
    let v = ok(&redrive(&db, &["prune", "--older-than", "1ms", "--json"]));
    assert_eq!(v["jobs"], 1);
    assert!(jobs(&db, "c").is_empty());
    assert_eq!(jobs(&db, "wait").len(), 2);
    // Bad input names the flag and the value.
    err(
        &redrive(&db, &["prune", "--state", "running"]),
        2,
        "--state: \"running\"",
    );
    err(&redrive(&db, &["prune", "--older-than", "soon"]), 2, "soon");
}

#[test]
fn schedule_add_list_remove_and_bad_input() {
    let (_dir, db) = db();
    let a = ok(&redrive(
        &db,
        &[
            "schedule",
            "add",
            "settle",
            "--cron",
            "0 0 2 * * *",
            "--queue",
            "ops",
            "--kind",
            "noop",
            "--missed",
            "skip",
            "--payload",
            r#"{"run":"settlement"}"#,
            "--json",
        ],
    ));
    assert_eq!(a["created"], true);
    assert_eq!(a["schedule"]["missed"], "skip");
    assert_eq!(a["schedule"]["payload"]["run"], "settlement");
    assert!(
        a["schedule"]["next_tick"]
            .as_str()
            .unwrap()
            .ends_with("T02:00:00Z")
    );
    let b = ok(&redrive(
        &db,
        &[
            "schedule",
            "add",
            "settle",
            "--cron",
            "0 0 2 * * *",
            "--queue",
            "ops",
            "--kind",
            "noop",
            "--json",
        ],
    ));
    assert_eq!(b["created"], false);
    assert_eq!(b["schedule"]["missed"], "last", "replaced");
    assert_eq!(b["schedule"]["next_tick"], a["schedule"]["next_tick"]);
    let l = ok(&redrive(&db, &["schedule", "list", "--json"]));
    assert_eq!(l["schedules"].as_array().unwrap().len(), 1);
    err(
        &redrive(
            &db,
            &[
                "schedule", "add", "x", "--cron", "daily", "--queue", "q", "--kind", "noop",
            ],
        ),
        2,
        "--cron: cron \"daily\"",
    );
    err(
        &redrive(
            &db,
            &[
                "schedule",
                "add",
                "x",
                "--cron",
                "* * * * * *",
                "--queue",
                "q",
                "--kind",
                "noop",
                "--missed",
                "twice",
            ],
        ),
        2,
        "--missed: missed \"twice\"",
    );
    err(
        &redrive(
            &db,
            &[
                "schedule",
                "add",
                "x",
                "--cron",
                "* * * * * *",
                "--queue",
                "q",
                "--kind",
                "http",
                "--payload",
                r#"{"method":"GET","url":"ftp://x"}"#,
            ],
        ),
        2,
        "--payload",
    );
    let r = redrive(&db, &["schedule", "remove", "settle", "nope"]);
    err(&r, 1, "no schedule named nope");
    let l = ok(&redrive(&db, &["schedule", "list", "--json"]));
    assert!(l["schedules"].as_array().unwrap().is_empty());
}

#[test]
fn the_policies_files_schedules_are_upserted_at_start_and_bad_ones_named() {
    let (dir, db) = db();
    let file = dir.path().join("policies.toml");
    std::fs::write(
        &file,
        r#"
[policy.reports.retry]
max_attempts = 3

[[schedules]]
name = "reconcile"
cron = "*/5 * * * * *"
queue = "ops"
kind = "noop"
policy = "reports"
missed = "all"

[schedules.payload]
psp = "acme"

[[schedules]]
name = "weekly"
cron = "0 0 * * 1"
queue = "ops"
kind = "noop"
"#,
    )
    .unwrap();
    let policies = file.display().to_string();
    ok(&redrive(
        &db,
        &[
            "--policies",
            &policies,
            "work",
            "--queue",
            "none",
            "--until-idle",
            "--no-scheduler",
        ],
    ));
    let l = ok(&redrive(&db, &["schedule", "list", "--json"]));
    let s = l["schedules"].as_array().unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0]["name"], "reconcile");
    assert_eq!(s[0]["origin"], "policies");
    assert_eq!(s[0]["missed"], "all");
    assert_eq!(s[0]["policy"], "reports");
    assert_eq!(s[0]["payload"]["psp"], "acme");
    assert_eq!(s[1]["missed"], "last");
    // The policies in the same file still load (`policy show` reads it too).
    ok(&redrive(
        &db,
        &["--policies", &policies, "policy", "show", "reports"],
    ));
    std::fs::write(
        &file,
        "[[schedules]]\nname = \"x\"\ncron = \"* * * * * *\"\nqueue = \"q\"\nkind = \"noop\"\nevery = 3\n",
    )
    .unwrap();
    err(
        &redrive(&db, &["--policies", &policies, "work", "--until-idle"]),
        2,
        "every",
    );
    std::fs::write(
        &file,
        "[[schedules]]\nname = \"x\"\ncron = \"61 * * * * *\"\nqueue = \"q\"\nkind = \"noop\"\n",
    )
    .unwrap();
    err(
        &redrive(&db, &["--policies", &policies, "work", "--until-idle"]),
        2,
        "schedules[0].cron",
    );
}

/// Two `redrive work` processes, each with its own scheduler, for about ten seconds on a
/// schedule that ticks every second: every tick between the first and the last job has
/// exactly one job (no duplicate, no gap), and the ticks cover the run.
#[test]
fn two_workers_make_exactly_one_job_per_tick() {
    let (_dir, db) = db();
    let started = chrono::Utc::now();
    ok(&redrive(
        &db,
        &[
            "schedule",
            "add",
            "every",
            "--cron",
            "* * * * * *",
            "--queue",
            "ticks",
            "--kind",
            "noop",
            "--missed",
            "all",
        ],
    ));
    let spawn = || {
        redrive_testkit::cli!()
            .cmd()
            .args([
                "--db",
                &db,
                "work",
                "--queue",
                "ticks",
                "--concurrency",
                "2",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redrive work")
    };
    let mut workers = [spawn(), spawn()];
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        for w in &mut workers {
            assert!(w.try_wait().unwrap().is_none(), "a worker exited early");
        }
    }
    for w in &mut workers {
        // SIGTERM: a graceful stop.
        let _ = Command::new("kill").arg(w.id().to_string()).status();
    }
    for w in &mut workers {
        let st = w.wait().unwrap();
        assert!(st.success(), "worker exit {st:?}");
    }
    let ended = chrono::Utc::now();
    let all = jobs(&db, "ticks");
    let mut ticks: Vec<chrono::DateTime<chrono::Utc>> = all
        .iter()
        .map(|j| {
            let key = j["key"].as_str().unwrap();
            let t = key.strip_prefix("schedule:every:").expect("a tick key");
            chrono::DateTime::parse_from_rfc3339(t).unwrap().into()
        })
        .collect();
    ticks.sort();
    let n = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), n, "no tick has two jobs");
    assert!(
        ticks
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::seconds(1)),
        "no gap between the first and the last tick: {ticks:?}"
    );
    // About ten seconds of ticks (the edges depend on the processes' start and stop).
    assert!(n >= 5, "{n} ticks in ten seconds: {ticks:?}");
    assert!(ticks[0] > started && *ticks.last().unwrap() <= ended);
    // And they ran.
    let succeeded = all.iter().filter(|j| j["state"] == "succeeded").count();
    assert!(succeeded + 2 >= n, "{succeeded} of {n} ran");
}
