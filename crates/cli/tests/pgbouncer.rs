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
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redrive_testkit::PgSchema;
use redrive_testkit::cli::{block, ok_json};

struct Bouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn pgbouncer() -> Option<(PathBuf, (u32, u32))> {
    let bin = [
        "/usr/sbin/pgbouncer",
        "/usr/bin/pgbouncer",
        "/usr/local/bin/pgbouncer",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists());
    let Some(bin) = bin else {
        assert!(
            !redrive_testkit::ci(),
            "pgbouncer is not installed (apt-get install pgbouncer)"
        );
        eprintln!("skipped: pgbouncer is not installed");
        return None;
    };
    let out = Command::new(&bin).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| {
            let mut it = v.split('.');
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .unwrap_or((0, 0));
    Some((bin, version))
}

/// PgBouncer in `mode` in front of the server of `server_url` (`postgres://user@host:port/db`).
/// In transaction mode a server connection serves many clients, so session state such as
/// redrive's `SET search_path` does not follow a client: the pooler sets the schema on each
/// server connection itself (`connect_query`), as docs/operations.md says to.
fn start(bin: &PathBuf, mode: &str, server_url: &str, schema: &str) -> Bouncer {
    let rest = server_url.strip_prefix("postgres://").unwrap();
    let (user, rest) = rest.split_once('@').unwrap();
    let user = user.split(':').next().unwrap();
    let (hostport, _) = rest.split_once('/').unwrap();
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "5432"));
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let my_port = listen.local_addr().unwrap().port();
    drop(listen);
    // Not a tempdir: PgBouncer runs as `postgres` when the tests run as root.
    let dir = std::env::temp_dir().join(format!("redrive-pgb-{}-{my_port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n")).unwrap();
    std::fs::write(
        dir.join("pgbouncer.ini"),
        format!(
            "[databases]\n* = host={host} port={port}{}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {my_port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
             pool_mode = {mode}\nmax_client_conn = 200\ndefault_pool_size = 40\n{}\
             ignore_startup_parameters = extra_float_digits\nlogfile = {}\n",
            if mode == "transaction" {
                format!(" connect_query='SET search_path TO {schema}'")
            } else {
                String::new()
            },
            dir.join("users.txt").display(),
            if mode == "transaction" {
                "max_prepared_statements = 200\n"
            } else {
                ""
            },
            dir.join("pgbouncer.log").display()
        ),
    )
    .unwrap();
    let root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
    let mut cmd = Command::new(bin);
    if root {
        // PgBouncer refuses to run as root; `-u` drops to `postgres` in the same process, so
        // killing the child stops the pooler.
        let _ = Command::new("chown")
            .arg("-R")
            .arg("postgres")
            .arg(&dir)
            .status();
        cmd.args(["-u", "postgres"]);
    }
    let child = cmd
        .arg(dir.join("pgbouncer.ini"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", my_port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "pgbouncer did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Bouncer {
        child,
        dir,
        port: my_port,
    }
}

/// The server URL with the pooler's port instead of the server's.
fn through(b: &Bouncer, server_url: &str) -> String {
    let (scheme_user, rest) = server_url.split_once('@').unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    format!("{scheme_user}@127.0.0.1:{}/{path}", b.port)
}

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
