//! A process's PostgreSQL connections are one budget (issue 39): `--db-pool N` bounds what a
//! process opens, the LISTEN connection included, and `redrive workers` shows each process's
//! connections as the server counts them, against `max_connections`. Bad URLs (a malformed
//! host list, an unknown `target_session_attrs`, a pool size out of range) are refused with
//! the part named.

use std::process::Stdio;
use std::time::{Duration, Instant};

use redrive_store::{NewJob, PgStore, Store};
use redrive_testkit::PgSchema;
use redrive_testkit::cli::{Running, block, err_text, ok_json, terminate};

#[test]
fn db_pool_bounds_a_workers_connections_and_workers_shows_them() {
    let Some(schema) = block(PgSchema::fresh("rdconn")) else {
        return;
    };
    let db = schema.url();
    let cli = redrive_testkit::cli!();
    // A backlog of no-op jobs, drained by one process with many workers and a budget of 5.
    block(async {
        let pg = PgStore::connect(schema.server_url(), Some(schema.name()), 2)
            .await
            .unwrap();
        let jobs: Vec<NewJob> = (0..3000)
            .map(|_| NewJob::new("c", "noop", serde_json::json!({})))
            .collect();
        Store::Postgres(pg)
            .enqueue_many(&jobs, chrono::Utc::now())
            .await
            .unwrap();
    });
    let worker = Running(
        cli.cmd()
            .args(["--db", &db, "--db-pool", "5", "work", "--queue", "c"])
            .args(["--concurrency", "64", "--shutdown-grace", "1s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    let mut seen = Vec::new();
    while t.elapsed() < Duration::from_secs(20) {
        let v = ok_json(&cli.run_db(&db, ["workers", "--json"]));
        if let Some(w) = v["workers"].as_array().and_then(|a| a.first()) {
            seen.push(w["db_connections"].as_u64().unwrap());
            let budget = &v["database_connections"];
            assert!(budget["max_connections"].as_u64().unwrap() > 0, "{v}");
        }
        if seen.len() >= 10 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    terminate(vec![worker], Duration::from_secs(10));
    assert!(!seen.is_empty(), "the worker never showed up in `workers`");
    let most = *seen.iter().max().unwrap();
    assert!((1..=5).contains(&most), "connections seen: {seen:?}");
    block(schema.drop_now());
}

#[test]
fn bad_postgres_urls_name_the_part() {
    let cli = redrive_testkit::cli!();
    let cases = [
        ("postgres://u@127.0.0.1:5432,,127.0.0.1:5433/test", "host 2"),
        ("postgres://u@127.0.0.1:5432,127.0.0.1:x/test", "\"x\""),
        (
            "postgres://u@127.0.0.1/test?target_session_attrs=leader",
            "target_session_attrs",
        ),
        (
            "postgres://u@127.0.0.1/test?target_session_attrs=standby",
            "redrive writes",
        ),
    ];
    for (url, part) in cases {
        let e = err_text(&cli.run_db(url, ["stats"]), 2);
        assert!(e.contains(part), "{url}: {e}");
    }
    let e = err_text(
        &cli.run([
            "--db",
            "postgres://u@127.0.0.1/test",
            "--db-pool",
            "1",
            "stats",
        ]),
        2,
    );
    assert!(e.contains("pool_size") && e.contains("\"1\""), "{e}");
}

#[test]
fn a_host_list_of_standbys_only_is_refused_naming_each_host() {
    // 127.0.0.1:1 refuses; the local server is a primary, so ask the list for something only a
    // standby is, through an unreachable host and a live one: every host is named.
    let cli = redrive_testkit::cli!();
    let Some(schema) = block(PgSchema::fresh("rdstandby")) else {
        return;
    };
    let server = schema.server_url().to_owned();
    let hostport = server
        .split('@')
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or("127.0.0.1:5432")
        .to_owned();
    let user = server
        .strip_prefix("postgres://")
        .and_then(|r| r.split('@').next())
        .unwrap_or("postgres")
        .to_owned();
    // The server refuses writes in this session: it is "read-only" to read-write.
    let url = format!(
        "postgres://{user}@127.0.0.1:1,{hostport}/test?target_session_attrs=read-write&options=-c%20default_transaction_read_only%3Don"
    );
    let e = err_text(&cli.run_db(&url, ["stats"]), 1);
    assert!(e.contains("127.0.0.1:1") && e.contains(&hostport), "{e}");
    assert!(e.contains("read-only"), "{e}");
    block(schema.drop_now());
}
