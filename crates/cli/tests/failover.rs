//! PostgreSQL failover as a fleet meets it (issue 39): a primary with a synchronous streaming
//! standby (`scripts/pg-ha.sh`), one `redrive serve` taking enqueues over HTTP and three
//! `redrive work` processes charging the PSP simulator, all given both hosts
//! (`host1,host2 … target_session_attrs=read-write`). Mid-run the primary dies
//! (`pg_ctl stop -m immediate`) and the standby is promoted. Nobody restarts anything.
//!
//! Judged where the user sees it: every enqueue answered 2xx exists afterwards, the
//! simulator (its own dedupe off) saw every charge exactly once, no job is left running, and
//! the simulator's log shows charges again within 10 s of the promotion.
//!
//! Needs PostgreSQL's server binaries; skipped without them, and failing under `CI=true`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redrive_store::{JobState, Store};

#[path = "support/pgbouncer.rs"]
mod bouncer;
use redrive_testkit::cli::{Running, block, http_request, spawn_listening, terminate};

/// A primary and a standby made by `scripts/pg-ha.sh`, stopped and removed on drop.
struct Ha {
    dir: PathBuf,
    ports: (u16, u16),
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pg-ha.sh")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Ha {
    /// `None` when PostgreSQL's server binaries are missing and CI is not set.
    fn start() -> Option<Self> {
        // Not a tempdir: the `postgres` user must reach it, and tempdirs are private to root.
        let dir = std::env::temp_dir().join(format!(
            "redrive-pgha-{}-{}",
            std::process::id(),
            free_port()
        ));
        let ports = (free_port(), free_port());
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .args([ports.0.to_string(), ports.1.to_string()])
            .output()
            .expect("bash");
        if out.status.code() == Some(3) && !redrive_testkit::ci() {
            eprintln!("skipped: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
        let ha = Self { dir, ports };
        assert!(
            out.status.success(),
            "pg-ha.sh start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(ha)
    }

    fn run(&self, what: &str) {
        let out = Command::new("bash")
            .arg(script())
            .arg(what)
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg-ha.sh {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/redrive?target_session_attrs=read-write",
            self.ports.0, self.ports.1
        )
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

/// Charges per run: 300 in `cargo test`; the benchmark's chaos run sets
/// `FAILOVER_CHARGES=3000` (docs/benchmarks.md).
fn charges_per_run() -> usize {
    std::env::var("FAILOVER_CHARGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

#[test]
fn a_fleet_rides_a_failover_to_a_synchronous_standby() {
    let Some(ha) = Ha::start() else { return };
    let db = ha.url();
    ride(&ha, &db);
}

/// The same with a PgBouncer (session mode) in front of each server, as many fleets reach
/// PostgreSQL: the host list names the two poolers, and `target_session_attrs` is checked
/// through them.
#[test]
fn a_fleet_rides_a_failover_through_a_pgbouncer_per_server() {
    let Some((bin, _)) = bouncer::pgbouncer() else {
        return;
    };
    let Some(ha) = Ha::start() else { return };
    let server = |p: u16| format!("postgres://postgres@127.0.0.1:{p}/redrive");
    let b1 = bouncer::start(&bin, "session", &server(ha.ports.0), "public");
    let b2 = bouncer::start(&bin, "session", &server(ha.ports.1), "public");
    let db = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/redrive?target_session_attrs=read-write",
        b1.port, b2.port
    );
    ride(&ha, &db);
    drop((b1, b2));
}

fn ride(ha: &Ha, db: &str) {
    let db = db.to_owned();
    let n = charges_per_run();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(
            redrive_psp_sim::PspSim::builder()
                .ledger_dedupe(false)
                .with_idempotency_layer()
                .start("127.0.0.1:0"),
        )
        .unwrap();
    let charges = format!("{}/v1/charges", sim.url());

    let mut serve = redrive_testkit::cli!().db_command(&db, ["serve", "--addr", "127.0.0.1:0"]);
    serve.args(["--allow-host", "loopback"]);
    let (server, addr) = spawn_listening(&mut serve, "listening on http://");
    let workers: Vec<Running> = (0..3)
        .map(|_| {
            redrive_testkit::cli!()
                .cmd()
                .args(["--db", &db, "work", "--queue", "pay", "--concurrency", "8"])
                .args(["--shutdown-grace", "1s", "--allow-host", "loopback"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map(Running)
                .unwrap()
        })
        .collect();

    // A client enqueues N charges at about 60/s, each with its key, repeating a request that
    // got no 2xx (a client's ordinary retry; the key makes it safe) until one does.
    sim.reset();
    let t0 = Instant::now();
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let refused = Arc::new(Mutex::new(0usize));
    let done = Arc::new(AtomicBool::new(false));
    let client = {
        let (acked, refused, done, addr, charges) = (
            Arc::clone(&acked),
            Arc::clone(&refused),
            Arc::clone(&done),
            addr.clone(),
            charges.clone(),
        );
        std::thread::spawn(move || {
            for i in 0..n {
                let key = format!("order-{i}");
                let body = serde_json::json!({
                    "queue": "pay", "kind": "http", "key": key,
                    "payload": {"method": "POST", "url": charges,
                                "body": {"amount": 100 + i, "currency": "EUR"}, "timeout_ms": 2000},
                })
                .to_string();
                let t = Instant::now();
                loop {
                    let r = http_request(
                        &addr,
                        "POST",
                        "/v1/jobs",
                        &["Content-Type: application/json"],
                        &body,
                        Duration::from_secs(15),
                    );
                    match r {
                        Ok(r) if (200..300).contains(&r.status) => {
                            acked.lock().unwrap().insert(key.clone());
                            break;
                        }
                        _ => *refused.lock().unwrap() += 1,
                    }
                    assert!(
                        t.elapsed() < Duration::from_secs(60),
                        "{key}: no 2xx in 60 s"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
                std::thread::sleep(Duration::from_millis(15));
            }
            done.store(true, Ordering::SeqCst);
        })
    };

    // The primary dies while charges are enqueued and running; the standby takes over 2 s
    // later, as an operator or Patroni would. Meanwhile the service says it is not ready.
    std::thread::sleep(Duration::from_secs(2));
    ha.run("kill-primary");
    let killed = t0.elapsed();
    let mut unready = false;
    while t0.elapsed() < killed + Duration::from_secs(2) {
        if let Ok(r) = http_request(
            &addr,
            "GET",
            "/readyz",
            &[] as &[&str],
            "",
            Duration::from_secs(5),
        ) {
            unready |= r.status == 503;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ha.run("promote");
    let promoted = t0.elapsed();
    client.join().unwrap();
    assert!(done.load(Ordering::SeqCst));

    // Every acknowledged enqueue exists and succeeds, read on the new primary.
    let store = block(Store::connect(&db)).expect("the promoted standby");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let counts = block(store.counts()).unwrap_or_default();
        let of = |s: JobState| {
            counts
                .iter()
                .filter(|c| c.state == s)
                .map(|c| c.count)
                .sum::<u64>()
        };
        if of(JobState::Succeeded) as usize >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} jobs succeeded: {counts:?}",
            of(JobState::Succeeded)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let keys: Vec<String> = block(
        sqlx::query_scalar("SELECT idempotency_key FROM redrive_jobs WHERE queue = 'pay'")
            .fetch_all(match &store {
                Store::Postgres(pg) => pg.pool(),
                #[allow(unreachable_patterns)]
                _ => unreachable!(),
            }),
    )
    .unwrap();
    let stored: HashSet<String> = keys.into_iter().collect();
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), n, "every charge was acknowledged in the end");
    let lost: Vec<&String> = acked.difference(&stored).collect();
    assert!(lost.is_empty(), "acknowledged but gone: {lost:?}");
    assert_eq!(stored.len(), n, "one job per key");
    assert!(
        unready,
        "/readyz answered 503 while no primary was reachable"
    );

    terminate(workers, Duration::from_secs(10));
    terminate(vec![server], Duration::from_secs(10));

    let stats = sim.stats();
    let log = sim.request_log();
    let promoted_us = promoted.as_micros() as u64;
    let back = log
        .iter()
        .filter(|r| (200..300).contains(&r.status) && r.t_us >= promoted_us)
        .map(|r| (r.t_us - promoted_us) as f64 / 1e6)
        .fold(f64::INFINITY, f64::min);
    eprintln!(
        "failover: killed at {:.1} s, promoted at {:.1} s; charges again {back:.2} s after the \
         promotion; {} enqueue requests refused during it; {} requests at the PSP, {} charges",
        killed.as_secs_f64(),
        promoted.as_secs_f64(),
        refused.lock().unwrap(),
        log.len(),
        stats.charges
    );
    assert!(!stats.ledger_dedupe);
    assert_eq!(stats.charges, n as u64, "every charge made");
    assert_eq!(stats.duplicate_effects, 0, "no charge made twice");
    assert!(stats.effects_max_per_key <= 1);
    assert!(
        back <= 10.0,
        "draining resumed {back:.1} s after the promotion"
    );
    drop(store);
}
