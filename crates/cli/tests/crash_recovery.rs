//! Finding 8 of the hardening issue, as a user meets it: `redrive serve` killed with SIGKILL
//! while clients enqueue with `Idempotency-Key`. Before the fix the keys whose request was cut
//! short answered 409 `recovery-required` for 24 h, with no way out, and many never got their
//! job. Now, once the recovery window has passed, a repeat takes the key over and enqueues
//! again (idempotent by job key): every key ends with exactly one job, and no repeat gets 409.
//! `redrive idempotency list|recover` shows and releases stuck keys.

use std::collections::HashMap;
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redrive_testkit::cli::{Running, http_request, ok_json as json_of, spawn_listening};
use serde_json::Value;

fn start(db: &str) -> (Running, String) {
    let mut serve = redrive_testkit::cli!().db_command(db, ["serve", "--addr", "127.0.0.1:0"]);
    serve.args(["--idempotency-recovery-window", "1s"]);
    spawn_listening(&mut serve, "listening on http://")
}

/// One request with `Connection: close`: (status, headers and body), or an I/O error.
fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[String],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let r = http_request(addr, method, path, headers, body, Duration::from_secs(20))?;
    Ok((r.status, r.raw()))
}

const BODY: &str = r#"{"queue": "crash", "kind": "noop"}"#;

fn enqueue(addr: &str, key: &str) -> std::io::Result<(u16, String)> {
    request(
        addr,
        "POST",
        "/v1/jobs",
        &[
            "Content-Type: application/json".into(),
            format!("Idempotency-Key: {key}"),
        ],
        BODY,
    )
}

fn redrive(db: &str, args: &[&str]) -> Output {
    redrive_testkit::cli!().run_db(db, args)
}

fn stuck_keys(db: &str) -> Vec<String> {
    let v = json_of(&redrive(
        db,
        &[
            "idempotency",
            "list",
            "--stuck",
            "--limit",
            "1000",
            "--json",
        ],
    ));
    v["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn after_a_kill_every_idempotency_key_ends_with_exactly_one_job() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let (mut server, addr) = start(&db);

    // Sixteen clients enqueue with fresh keys until the server dies under them.
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let answered = Arc::new(AtomicUsize::new(0));
    let dead = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..16)
        .map(|t| {
            let (sent, answered, dead, addr) =
                (sent.clone(), answered.clone(), dead.clone(), addr.clone());
            std::thread::spawn(move || {
                for i in 0.. {
                    if dead.load(Ordering::SeqCst) {
                        return;
                    }
                    let key = format!("crash-{t}-{i}");
                    sent.lock().unwrap().push(key.clone());
                    match enqueue(&addr, &key) {
                        Ok((201, _)) => {
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok((status, res)) => panic!("{key}: {status} before the kill: {res}"),
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    while answered.load(Ordering::SeqCst) < 150 {
        assert!(t0.elapsed() < Duration::from_secs(60), "too slow");
        std::thread::sleep(Duration::from_millis(2));
    }
    server.0.kill().unwrap(); // SIGKILL
    server.0.wait().unwrap();
    dead.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let sent = sent.lock().unwrap().clone();
    drop(server);

    // Restarted. Keys cut short are stuck once the recovery window (1 s) has passed.
    let (_server, addr) = start(&db);
    std::thread::sleep(Duration::from_millis(1500));
    let stuck = stuck_keys(&db);
    eprintln!("{} keys sent, {} stuck", sent.len(), stuck.len());
    assert!(
        !stuck.is_empty(),
        "the kill left no key cut short; nothing was tested ({} sent)",
        sent.len()
    );
    assert!(stuck.iter().all(|k| sent.contains(k)));
    let text = redrive(&db, &["idempotency", "list", "--stuck"]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains(&stuck[0]));

    // The operator releases one; the rest recover by themselves.
    let out = redrive(&db, &["idempotency", "recover", &stuck[0]]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("released {}", stuck[0])));
    assert!(!stuck_keys(&db).contains(&stuck[0]));
    // A key that completed is not stuck: skipped, exit 1, named.
    let completed = sent.iter().find(|k| !stuck.contains(k)).unwrap();
    let out = redrive(
        &db,
        &["idempotency", "recover", completed, "nope-no-such-key"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(completed.as_str()) && err.contains("nope-no-such-key"),
        "{err}"
    );

    // Every key again: 201 (enqueued now, or the first response replayed) or 200 (the job
    // existed: the run that was cut short had made it). Never 409.
    for key in &sent {
        let (status, res) = enqueue(&addr, key).unwrap();
        assert!(matches!(status, 200 | 201), "{key}: {status}: {res}");
    }
    assert!(stuck_keys(&db).is_empty());

    // Exactly one job per key.
    let mut per_key: HashMap<String, u32> = HashMap::new();
    let mut after = 0;
    loop {
        let (status, res) = request(
            &addr,
            "GET",
            &format!("/v1/jobs?limit=1000&after={after}"),
            &[],
            "",
        )
        .unwrap();
        assert_eq!(status, 200, "{res}");
        let body: Value = serde_json::from_str(res.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        for j in body["jobs"].as_array().unwrap() {
            *per_key
                .entry(j["key"].as_str().unwrap_or("").to_owned())
                .or_default() += 1;
        }
        match body["next"].as_i64() {
            Some(n) => after = n,
            None => break,
        }
    }
    for key in &sent {
        assert_eq!(per_key.get(key), Some(&1), "{key}");
    }
    assert_eq!(per_key.values().sum::<u32>() as usize, sent.len());
}

#[test]
fn idempotency_commands_name_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let out = redrive(&db, &["migrate"]);
    assert!(out.status.success());
    let out = redrive(&db, &["idempotency", "list", "--state", "bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--state"));
    let out = redrive(&db, &["idempotency", "recover", "has space"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has space"));
    let out = redrive(&db, &["idempotency", "recover"]);
    assert_eq!(out.status.code(), Some(2));
    let out = redrive(&db, &["idempotency", "list"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("(no idempotency keys)"));
    let out = redrive(&db, &["idempotency", "recover", "--all-stuck"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no stuck idempotency keys"));
    let missing = format!("sqlite:{}", dir.path().join("missing.db").display());
    let out = redrive(&missing, &["idempotency", "list"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.db"));
    let out = redrive_testkit::cli!()
        .cmd()
        .args([
            "--db",
            &db,
            "serve",
            "--idempotency-recovery-window",
            "10ms",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--idempotency-recovery-window"));
}
