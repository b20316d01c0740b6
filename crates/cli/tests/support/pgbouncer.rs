//! PgBouncer for the tests (`pgbouncer.rs`, `failover.rs`): the installed binary and its
//! version, and a pooler started on a free port in front of one server, stopped on drop.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Bouncer {
    child: Child,
    dir: PathBuf,
    pub(crate) port: u16,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn pgbouncer() -> Option<(PathBuf, (u32, u32))> {
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
pub(crate) fn start(bin: &PathBuf, mode: &str, server_url: &str, schema: &str) -> Bouncer {
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
pub(crate) fn through(b: &Bouncer, server_url: &str) -> String {
    let (scheme_user, rest) = server_url.split_once('@').unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    format!("{scheme_user}@127.0.0.1:{}/{path}", b.port)
}
