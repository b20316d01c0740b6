//! Running the `redrive` binary from a test: a clean environment, output captured within a
//! time limit, long-running commands that are killed when the test ends, and the small checks
//! every CLI test makes of an [`Output`].

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The environment variables a test command does not inherit: each would change what the
/// binary does (a database, a policy file, a token, redaction, log filters, an OTLP exporter).
pub const CLEARED_ENV: &[&str] = &[
    "REDRIVE_DATABASE_URL",
    "REDRIVE_POLICIES",
    "REDRIVE_API_TOKEN",
    "REDRIVE_REDACT",
    "RUST_LOG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long [`Cli::run`] waits for a command before it kills it and fails the test.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The [`Cli`] of the `redrive` binary of the calling test crate (`CARGO_BIN_EXE_redrive`).
#[macro_export]
macro_rules! cli {
    () => {
        $crate::cli::Cli::new(env!("CARGO_BIN_EXE_redrive"))
    };
}

/// A binary under test.
#[derive(Debug, Clone)]
pub struct Cli {
    bin: PathBuf,
    timeout: Duration,
}

impl Cli {
    /// The binary at `bin`, with [`DEFAULT_TIMEOUT`].
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        Self {
            bin: bin.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same binary with another time limit for [`Cli::run`].
    #[must_use]
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = limit;
        self
    }

    /// `BIN` without the [`CLEARED_ENV`] variables (add the arguments).
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        for v in CLEARED_ENV {
            c.env_remove(v);
        }
        c
    }

    /// `BIN ARGS` without the [`CLEARED_ENV`] variables.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.cmd();
        c.args(args);
        c
    }

    /// `BIN --db DB ARGS` without the [`CLEARED_ENV`] variables.
    pub fn db_command<I, S>(&self, db: &str, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.command(["--db", db]);
        c.args(args);
        c
    }

    /// Runs `BIN ARGS` to its end (see [`output_within`]).
    pub fn run<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output_within(&mut self.command(args), self.timeout)
    }

    /// Runs `BIN --db DB ARGS` to its end (see [`output_within`]).
    pub fn run_db<I, S>(&self, db: &str, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output_within(&mut self.db_command(db, args), self.timeout)
    }

    /// Runs `cmd` to its end within this binary's time limit (see [`output_within`]).
    pub fn output(&self, cmd: &mut Command) -> Output {
        output_within(cmd, self.timeout)
    }
}

/// Runs `cmd` with stdin closed and stdout and stderr captured, as [`Command::output`] does,
/// but kills it and fails the test when it has not ended within `limit`.
///
/// # Panics
/// When the command cannot start or does not end in time (with what it printed so far).
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let (stdout, stderr) = (joined(out), joined(err));
                panic!(
                    "{cmd:?} did not end within {limit:?}\nstdout: {}\nstderr: {}",
                    String::from_utf8_lossy(&stdout),
                    String::from_utf8_lossy(&stderr)
                );
            }
            Err(e) => panic!("wait for {cmd:?}: {e}"),
        }
    };
    Output {
        status,
        stdout: joined(out),
        stderr: joined(err),
    }
}

type Reader = Option<std::thread::JoinHandle<Vec<u8>>>;

fn drain(pipe: Option<impl Read + Send + 'static>) -> Reader {
    pipe.map(|mut p| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = p.read_to_end(&mut buf);
            buf
        })
    })
}

fn joined(r: Reader) -> Vec<u8> {
    r.and_then(|h| h.join().ok()).unwrap_or_default()
}

/// A child process that is killed (and reaped) when the value is dropped, so a failing test
/// leaves no server behind.
#[derive(Debug)]
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` (stdout piped, stderr dropped) and reads its first line, which must start
/// with `prefix` (as `listening on http://`); returns the process and the rest of the line.
///
/// # Panics
/// When the command cannot start or its first line is not as expected.
pub fn spawn_listening(cmd: &mut Command, prefix: &str) -> (Running, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let running = Running(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap_or_else(|e| panic!("read the first line of {cmd:?}: {e}"));
    let rest = line
        .trim_end()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected first line {line:?} (wanted {prefix:?}…)"))
        .to_owned();
    (running, rest)
}

/// Sends SIGTERM to every child, then waits for each to exit; one still running after
/// `limit` is killed and fails the test. (A child of a test that fails before this is killed
/// when its [`Running`] is dropped.)
///
/// # Panics
/// When `kill` cannot be run or a child outlives `limit`.
pub fn terminate(mut children: Vec<Running>, limit: Duration) {
    for Running(c) in &children {
        let sent = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {}: {sent}", c.id());
    }
    let deadline = Instant::now() + limit;
    for Running(c) in &mut children {
        loop {
            match c.try_wait().expect("wait for a child") {
                Some(_) => break,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                None => {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!(
                        "process {} did not exit within {limit:?} of SIGTERM",
                        c.id()
                    );
                }
            }
        }
    }
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// stdout, asserting the command succeeded (else fails with its exit code and stderr).
///
/// # Panics
/// When the command did not succeed.
pub fn ok_text(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    stdout(o)
}

/// stdout as JSON (`null` when it is not JSON: a caller that needs JSON checks its fields),
/// asserting the command succeeded.
///
/// # Panics
/// When the command did not succeed.
pub fn ok_json(o: &Output) -> serde_json::Value {
    serde_json::from_str(&ok_text(o)).unwrap_or(serde_json::Value::Null)
}

/// stdout and stderr, one after the other, as text.
pub fn text(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

/// stderr, asserting the command exited with `code`.
///
/// # Panics
/// When the exit code is another.
pub fn err_text(o: &Output, code: i32) -> String {
    let stderr = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {stderr}");
    stderr
}

/// Polls `f` every 50 ms until it is true; fails the test naming `what` after `limit`.
///
/// # Panics
/// When `f` is not true within `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `f` to its end on the test binary's one shared runtime (for synchronous tests).
///
/// One runtime for the whole binary, as a program has: a store connected in one `block` and
/// used in the next keeps its pooled connections and its background tasks (LISTEN, the
/// failover watch). A runtime per call shut those down between calls, and a connection opened
/// by a task in the middle of that shutdown could fail the next call ("A Tokio 1.x context was
/// found, but it is being shutdown").
///
/// # Panics
/// When the runtime cannot be built, or when called from inside a runtime.
pub fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a tokio runtime")
        })
        .block_on(f)
}

/// An answer read by [`http_request`].
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// The status code.
    pub status: u16,
    /// The status line and headers, as sent.
    pub head: String,
    /// The body.
    pub body: String,
}

impl RawResponse {
    /// The whole answer: head, blank line and body.
    pub fn raw(&self) -> String {
        format!("{}\r\n\r\n{}", self.head, self.body)
    }
}

/// One HTTP/1.1 request over a fresh connection with `Connection: close` and the given
/// headers (`Name: value` lines); reads the answer to its end (at most `read_limit` between
/// bytes).
///
/// # Errors
/// Connection and read errors, and an answer without a status line.
pub fn http_request<H: AsRef<str>>(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[H],
    body: &str,
    read_limit: Duration,
) -> std::io::Result<RawResponse> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(read_limit))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for h in headers {
        req.push_str(h.as_ref());
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw.as_str(), ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {raw:?}")))?;
    Ok(RawResponse {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    })
}
