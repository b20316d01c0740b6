//! `redrive enqueue --file`, run as the real binary: a good NDJSON file is enqueued (across
//! several transactions), the same file again creates nothing, a bad line is exit 2 naming the
//! line and the field with nothing enqueued, and `-` reads standard input.

use std::io::Write;
use std::process::{Output, Stdio};

use redrive_store::{ListParams, Store};
use redrive_testkit::cli::{block, err_text, ok_json, ok_text};

fn redrive(db: &str, args: &[&str]) -> Output {
    redrive_testkit::cli!().run_db(db, args)
}

fn fresh() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    (dir, db)
}

fn jobs_in(db: &str) -> Vec<redrive_store::Job> {
    block(async {
        let store = Store::connect(db).await.unwrap();
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = store
                .list(&ListParams {
                    limit: Some(1000),
                    after,
                    ..Default::default()
                })
                .await
                .unwrap();
            all.extend(page.jobs);
            match page.next {
                Some(n) => after = Some(n),
                None => return all,
            }
        }
    })
}

/// `n` keyed noop jobs, one per line; every 7th with a delay, every 5th with `max_attempts`.
fn ndjson(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        let mut job = serde_json::json!({
            "queue": "billing", "kind": "noop", "key": format!("run-1/{i}"),
            "payload": {"invoice": i},
        });
        if i % 7 == 0 {
            job["delay"] = "1h".into();
        }
        if i % 5 == 0 {
            job["max_attempts"] = 3.into();
        }
        s.push_str(&job.to_string());
        s.push('\n');
        if i == 10 {
            s.push('\n'); // A blank line is skipped (and still counted for line numbers).
        }
    }
    s
}

#[test]
fn a_file_is_enqueued_once_and_again_creates_nothing() {
    let (dir, db) = fresh();
    let path = dir.path().join("jobs.ndjson");
    let n = 2_345; // Three transactions of at most 1,000.
    std::fs::write(&path, ndjson(n)).unwrap();
    let file = path.to_str().unwrap();
    let out = ok_text(&redrive(&db, &["enqueue", "--file", file]));
    assert_eq!(out.trim(), format!("enqueued {n}, existing 0"));
    let jobs = jobs_in(&db);
    assert_eq!(jobs.len(), n);
    let by_key = |k: &str| jobs.iter().find(|j| j.key.as_deref() == Some(k)).unwrap();
    assert_eq!(by_key("run-1/5").max_attempts, 3, "max_attempts applied");
    assert_eq!(
        by_key("run-1/1").max_attempts,
        15,
        "the payment policy's budget"
    );
    assert_eq!(by_key("run-1/7").state, redrive_store::JobState::Scheduled);
    assert_eq!(by_key("run-1/1").state, redrive_store::JobState::Available);
    assert_eq!(by_key("run-1/9").payload, serde_json::json!({"invoice": 9}));

    // The same file again: idempotent per key.
    let again = ok_json(&redrive(&db, &["enqueue", "--file", file, "--json"]));
    assert_eq!(again["enqueued"], 0);
    assert_eq!(again["existing"], n);
    let items = again["jobs"].as_array().unwrap();
    assert_eq!(items.len(), n);
    // Line numbers count the blank line after line 11.
    assert_eq!(items[10]["line"], 11);
    assert_eq!(items[11]["line"], 13);
    assert_eq!(items[11]["id"], by_key("run-1/11").id);
    assert_eq!(items[11]["created"], false);
    assert_eq!(jobs_in(&db).len(), n, "nothing enqueued twice");
}

#[test]
fn a_bad_line_is_exit_2_naming_it_and_nothing_is_enqueued() {
    let (dir, db) = fresh();
    let path = dir.path().join("bad.ndjson");
    let file = path.to_str().unwrap();
    let good = ndjson(3000);
    let mut lines: Vec<&str> = good.lines().collect();
    // Line 3: above the payment policy's 15 attempts.
    let bad = r#"{"queue":"billing","kind":"noop","key":"x","max_attempts":99}"#;
    lines[2] = bad;
    std::fs::write(&path, lines.join("\n")).unwrap();
    let o = redrive(&db, &["enqueue", "--file", file]);
    let stderr = err_text(&o, 2);
    assert!(stderr.contains("line 3: max_attempts"), "{stderr}");
    assert!(stderr.contains("nothing enqueued"), "{stderr}");
    assert!(jobs_in(&db).is_empty(), "nothing enqueued from a bad file");

    // Not JSON, an unknown field, an unknown policy: each named by its line.
    for (line, needle) in [
        ("{\"queue\":", "line 2: not valid JSON"),
        (
            r#"{"queue":"q","kind":"noop","colour":"red"}"#,
            "line 2: colour",
        ),
        (
            r#"{"queue":"q","kind":"noop","policy":"nope"}"#,
            "line 2: policy",
        ),
        (r#"{"kind":"noop"}"#, "line 2: queue"),
        ("[1]", "line 2: a job must be a JSON object"),
    ] {
        let text = format!("{}\n{line}\n{}\n", lines[0], lines[1]);
        std::fs::write(&path, text).unwrap();
        let stderr = err_text(&redrive(&db, &["enqueue", "--file", file]), 2);
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    assert!(jobs_in(&db).is_empty());

    // A key used by another request (another payload): exit 1 naming the line, and the
    // transaction holding it rolled back.
    std::fs::write(&path, ndjson(3)).unwrap();
    ok_text(&redrive(&db, &["enqueue", "--file", file]));
    let conflicting = format!(
        "{}\n{}\n",
        r#"{"queue":"billing","kind":"noop","key":"new-1"}"#,
        r#"{"queue":"billing","kind":"noop","key":"run-1/2","payload":{"invoice":99}}"#
    );
    std::fs::write(&path, conflicting).unwrap();
    let stderr = err_text(&redrive(&db, &["enqueue", "--file", file]), 1);
    assert!(
        stderr.contains("line 2:") && stderr.contains("run-1/2"),
        "{stderr}"
    );
    assert_eq!(jobs_in(&db).len(), 3, "new-1 rolled back with it");

    // --file takes no per-job flags.
    let stderr = err_text(
        &redrive(&db, &["enqueue", "--file", file, "--queue", "q"]),
        2,
    );
    assert!(stderr.contains("--queue"), "{stderr}");
}

#[test]
fn dash_reads_the_jobs_from_standard_input() {
    let (_dir, db) = fresh();
    let mut child = redrive_testkit::cli!()
        .db_command(&db, ["enqueue", "--file", "-", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(ndjson(40).as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let v = ok_json(&o);
    assert_eq!(v["enqueued"], 40);
    assert_eq!(v["existing"], 0);
    assert_eq!(v["jobs"][0]["line"], 1);
    assert_eq!(jobs_in(&db).len(), 40);
}

#[test]
fn bench_api_batch_sends_every_job_through_http() {
    let (_dir, db) = fresh();
    let v = ok_json(&redrive(
        &db,
        &["bench", "--api-batch", "--jobs", "2500", "--json"],
    ));
    assert_eq!(v["backend"], "sqlite");
    assert_eq!(v["jobs"], 2500);
    assert_eq!(v["batch_size"], 1000);
    assert_eq!(v["clients"], 2);
    let runs = v["runs_jobs_per_s"].as_array().unwrap();
    assert_eq!(runs.len(), 5);
    assert!(runs.iter().all(|r| r.as_f64().unwrap() > 0.0), "{v}");
    let mut sorted: Vec<f64> = runs.iter().map(|r| r.as_f64().unwrap()).collect();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(v["median_jobs_per_s"].as_f64().unwrap(), sorted[2]);
    // The user's database is not touched.
    assert!(jobs_in(&db).is_empty());
}
