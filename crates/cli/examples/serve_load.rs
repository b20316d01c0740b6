//! Load benchmark of `redrive serve`, run as a user runs it: the built binary on a temporary
//! SQLite database on 127.0.0.1 (port 0), nothing else on the network.
//!
//! 1. **Mixed load:** `serve --workers 2`; `--conns` (200) keep-alive connections, one task
//!    each, send for `--secs` (20) seconds a mix of `POST /v1/jobs` (`noop` jobs, with and
//!    without `Idempotency-Key`, and the repeat of a keyed one, which must replay the same job),
//!    `GET /v1/jobs/{id}`, two `GET /v1/jobs?…` listings, `GET /v1/stats`, `GET /readyz`, the
//!    dashboard's `GET /`, and a `GET /v1/jobs/{id}` of a job that does not exist (404
//!    expected); one `http` job against the 1 GiB response of part 2 is enqueued as the load
//!    starts. Reports requests/s, p50/p99 latency per request kind, every unexpected answer,
//!    whether the jobs in the store are exactly those acknowledged, the most descriptors serve
//!    held (its connections among them), and serve's peak RSS (`VmHWM` of
//!    `/proc/PID/status`).
//! 2. **1 GiB response:** `serve --workers 1`; one `http` job whose target (a server in this
//!    process) answers `Content-Length: 1073741824` and streams until the client goes away.
//!    Reports serve's peak RSS, how much the target got out, and the job's result.
//!
//! Each of `--runs` (3) runs starts a fresh serve and database for each part; the last lines
//! are the medians. Bounded: every loop stops at its deadline.
//!
//! ```sh
//! cargo build --release -p redrive-cli
//! cargo run --release -p redrive-cli --example serve_load -- --runs 3
//! ```
//!
//! Flags: `--bin PATH` (default: the `redrive` beside this example's directory, i.e.
//! `target/release/redrive` for a release run), `--secs N`, `--conns N`, `--runs N`,
//! `--big-bytes N`, `--only load|big`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Args {
    bin: PathBuf,
    secs: u64,
    conns: usize,
    runs: usize,
    big_bytes: u64,
    load: bool,
    big: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let default_bin = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.join("redrive")))
        .unwrap_or_else(|| PathBuf::from("target/release/redrive"));
    let mut a = Args {
        bin: default_bin,
        secs: 20,
        conns: 200,
        runs: 3,
        big_bytes: 1 << 30,
        load: true,
        big: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bin" => a.bin = value()?.into(),
            "--secs" => a.secs = num(&flag, &value()?)?,
            "--conns" => a.conns = num(&flag, &value()?)?,
            "--runs" => a.runs = num(&flag, &value()?)?,
            "--big-bytes" => a.big_bytes = num(&flag, &value()?)?,
            "--only" => match value()?.as_str() {
                "load" => a.big = false,
                "big" => a.load = false,
                other => bail!("--only: {other:?} is neither load nor big"),
            },
            other => bail!(
                "unknown flag {other:?}; expected --bin, --secs, --conns, --runs, --big-bytes, --only"
            ),
        }
    }
    if a.secs == 0 || a.conns == 0 || a.runs == 0 {
        bail!("--secs, --conns and --runs must be at least 1");
    }
    if !a.bin.is_file() {
        bail!(
            "--bin: {} does not exist; build it first (cargo build --release -p redrive-cli)",
            a.bin.display()
        );
    }
    Ok(a)
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> anyhow::Result<T> {
    v.parse()
        .map_err(|_| anyhow::anyhow!("{flag}: {v:?} is not a whole number"))
}

/// A running `redrive serve`; killed when dropped.
struct Serve {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Serve {
    fn start(bin: &PathBuf, workers: u32) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let log = std::fs::File::create(dir.path().join("serve.log"))?;
        let db = format!("sqlite:{}", dir.path().join("load.db").display());
        let mut child = Command::new(bin)
            .args(["--db", &db, "serve", "--addr", "127.0.0.1:0", "--workers"])
            .arg(workers.to_string())
            // The load's `http` jobs call a target on this machine.
            .args(["--allow-host", "loopback"])
            .env_remove("REDRIVE_API_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut out = BufReader::new(child.stdout.take().context("serve's stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        let Some(addr) = line.trim_end().strip_prefix("listening on http://") else {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
            bail!("serve's first line was {line:?}; its log:\n{log}");
        };
        let addr = addr.to_owned();
        // Keep draining stdout so serve never blocks on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        });
        Ok(Self { child, addr, dir })
    }

    /// Peak resident set size so far, in kB (`VmHWM`).
    fn peak_rss_kb(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmHWM in /proc/PID/status")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, then up to 10 s for a clean exit, then SIGKILL.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The request kinds of the mix, in the order each connection cycles through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Create,
    GetJob,
    CreateKeyed,
    RepeatKeyed,
    ListQueue,
    Stats,
    Readyz,
    Dashboard,
    ListState,
    Missing,
}

const MIX: [Op; 10] = [
    Op::Create,
    Op::GetJob,
    Op::CreateKeyed,
    Op::RepeatKeyed,
    Op::ListQueue,
    Op::Stats,
    Op::Readyz,
    Op::Dashboard,
    Op::ListState,
    Op::Missing,
];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Create => "POST /v1/jobs",
            Op::GetJob => "GET /v1/jobs/{id}",
            Op::CreateKeyed => "POST /v1/jobs + Idempotency-Key",
            Op::RepeatKeyed => "POST /v1/jobs, same key (replay)",
            Op::ListQueue => "GET /v1/jobs?queue=load&limit=20",
            Op::Stats => "GET /v1/stats",
            Op::Readyz => "GET /readyz",
            Op::Dashboard => "GET / (dashboard)",
            Op::ListState => "GET /v1/jobs?state=succeeded&limit=50",
            Op::Missing => "GET /v1/jobs/{missing} (404)",
        }
    }
}

#[derive(Default)]
struct OpStats {
    micros: Vec<u32>,
    unexpected: u64,
}

#[derive(Default)]
struct TaskStats {
    ops: BTreeMap<Op, OpStats>,
    /// Jobs this connection got 201 for (not replays).
    created: u64,
    /// Requests whose outcome is unknown (transport error): the job count may differ by these.
    transport_errors: u64,
    samples: Vec<String>,
}

impl TaskStats {
    fn record(&mut self, op: Op, took: Duration, problem: Option<String>) {
        let s = self.ops.entry(op).or_default();
        s.micros
            .push(u32::try_from(took.as_micros()).unwrap_or(u32::MAX));
        if let Some(p) = problem {
            s.unexpected += 1;
            if self.samples.len() < 5 {
                self.samples.push(format!("{}: {p}", op.name()));
            }
        }
    }
}

/// One connection's loop until `deadline`.
async fn connection(
    base: String,
    client: reqwest::Client,
    index: usize,
    deadline: Instant,
) -> TaskStats {
    let mut st = TaskStats::default();
    let mut last_id: Option<i64> = None;
    let mut last_keyed: Option<(String, Value, i64)> = None;
    let mut n = index; // connections start at different points of the mix
    while Instant::now() < deadline {
        let op = MIX[n % MIX.len()];
        n += 1;
        let t0 = Instant::now();
        let r = match op {
            Op::Create => {
                let body =
                    json!({"queue": "load", "kind": "noop", "payload": {"conn": index, "n": n}});
                client
                    .post(format!("{base}/v1/jobs"))
                    .json(&body)
                    .send()
                    .await
            }
            Op::GetJob => {
                let Some(id) = last_id else { continue };
                client.get(format!("{base}/v1/jobs/{id}")).send().await
            }
            Op::CreateKeyed => {
                let key = format!("load-{index}-{n}");
                let body = json!({"queue": "load", "kind": "noop", "payload": {"keyed": key}});
                let r = client
                    .post(format!("{base}/v1/jobs"))
                    .header("idempotency-key", &key)
                    .json(&body)
                    .send()
                    .await;
                last_keyed = Some((key, body, 0));
                r
            }
            Op::RepeatKeyed => {
                let Some((key, body, id)) = &last_keyed else {
                    continue;
                };
                if *id == 0 {
                    continue;
                }
                client
                    .post(format!("{base}/v1/jobs"))
                    .header("idempotency-key", key)
                    .json(body)
                    .send()
                    .await
            }
            Op::ListQueue => {
                client
                    .get(format!("{base}/v1/jobs?queue=load&limit=20"))
                    .send()
                    .await
            }
            Op::Stats => client.get(format!("{base}/v1/stats")).send().await,
            Op::Readyz => client.get(format!("{base}/readyz")).send().await,
            Op::Dashboard => client.get(format!("{base}/")).send().await,
            Op::ListState => {
                client
                    .get(format!("{base}/v1/jobs?state=succeeded&limit=50"))
                    .send()
                    .await
            }
            Op::Missing => {
                client
                    .get(format!("{base}/v1/jobs/9000000000000"))
                    .send()
                    .await
            }
        };
        let res = match r {
            Ok(res) => res,
            Err(e) => {
                st.transport_errors += 1;
                st.record(op, t0.elapsed(), Some(format!("transport: {e}")));
                continue;
            }
        };
        let status = res.status().as_u16();
        let replayed = res
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let body = match res.bytes().await {
            Ok(b) => b,
            Err(e) => {
                st.transport_errors += 1;
                st.record(op, t0.elapsed(), Some(format!("reading the body: {e}")));
                continue;
            }
        };
        let took = t0.elapsed();
        let job_id = || {
            serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["job"]["id"].as_i64())
        };
        let problem = match op {
            Op::Create | Op::CreateKeyed => match (status, job_id()) {
                (201, Some(id)) if !replayed => {
                    st.created += 1;
                    if op == Op::Create {
                        last_id = Some(id);
                    } else if let Some(k) = &mut last_keyed {
                        k.2 = id;
                    }
                    None
                }
                _ => Some(format!(
                    "{status} replayed={replayed} {}",
                    String::from_utf8_lossy(&body)
                )),
            },
            Op::RepeatKeyed => {
                let first = last_keyed.as_ref().map_or(0, |k| k.2);
                match (status, job_id()) {
                    (201, Some(id)) if replayed && id == first => None,
                    _ => Some(format!(
                        "{status} replayed={replayed}, expected job {first}: {}",
                        String::from_utf8_lossy(&body)
                    )),
                }
            }
            Op::Missing => (status != 404).then(|| format!("{status}, expected 404")),
            _ => (status != 200).then(|| format!("{status}: {}", String::from_utf8_lossy(&body))),
        };
        st.record(op, took, problem);
    }
    st
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

struct LoadResult {
    requests: u64,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    unexpected: u64,
    peak_rss_kb: u64,
    jobs_acknowledged: u64,
    jobs_in_store: u64,
    transport_errors: u64,
}

fn run_load(rt: &tokio::runtime::Runtime, a: &Args, run: usize) -> anyhow::Result<LoadResult> {
    let serve = Serve::start(&a.bin, 2)?;
    let base = format!("http://{}", serve.addr);
    let deadline_len = Duration::from_secs(a.secs);
    let (stats, elapsed, big) = rt.block_on(async {
        // One `http` job against a 1 GiB response runs while the load starts.
        let (target, sent) = big_target(a.big_bytes).await?;
        let big_id = enqueue_big(&reqwest::Client::new(), &base, &target).await?;
        // One client per connection: each keeps its one keep-alive connection.
        let clients = (0..a.conns)
            .map(|_| {
                reqwest::Client::builder()
                    .http1_only()
                    .pool_max_idle_per_host(1)
                    .timeout(Duration::from_secs(60))
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let started = Instant::now();
        let deadline = started + deadline_len;
        // How many descriptors serve holds (its connections among them), sampled.
        let fd_dir = format!("/proc/{}/fd", serve.child.id());
        let fds = std::thread::spawn(move || {
            let mut max = 0;
            while Instant::now() < deadline {
                let n = std::fs::read_dir(&fd_dir).map_or(0, Iterator::count);
                max = max.max(n);
                std::thread::sleep(Duration::from_millis(250));
            }
            max
        });
        let tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, c)| tokio::spawn(connection(base.clone(), c, i, deadline)))
            .collect();
        let mut all = Vec::with_capacity(tasks.len());
        for t in tasks {
            all.push(t.await?);
        }
        let elapsed = started.elapsed();
        let max_fds = fds.join().unwrap_or(0);
        let job = wait_job(
            &reqwest::Client::new(),
            &base,
            big_id,
            Duration::from_secs(60),
        )
        .await?;
        anyhow::Ok((all, elapsed, (job, sent.load(Ordering::Relaxed), max_fds)))
    })?;
    let peak_rss_kb = serve.peak_rss_kb()?;

    // Every acknowledged job is in the store, once.
    let jobs_in_store = rt.block_on(async {
        let v: Value = reqwest::get(format!("{base}/v1/stats"))
            .await?
            .error_for_status()?
            .json()
            .await?;
        anyhow::Ok(
            v["counts"]
                .as_array()
                .map(|cs| {
                    cs.iter()
                        .filter(|c| c["queue"] == "load")
                        .filter_map(|c| c["count"].as_u64())
                        .sum()
                })
                .unwrap_or(0),
        )
    })?;

    let mut per_op: BTreeMap<Op, OpStats> = BTreeMap::new();
    let mut samples = Vec::new();
    let (mut created, mut transport_errors) = (0, 0);
    for s in stats {
        created += s.created;
        transport_errors += s.transport_errors;
        samples.extend(s.samples);
        for (op, o) in s.ops {
            let e = per_op.entry(op).or_default();
            e.micros.extend(o.micros);
            e.unexpected += o.unexpected;
        }
    }
    let mut every: Vec<u32> = per_op
        .values()
        .flat_map(|o| o.micros.iter().copied())
        .collect();
    every.sort_unstable();
    let requests = every.len() as u64;
    let unexpected: u64 = per_op.values().map(|o| o.unexpected).sum();
    println!(
        "\nrun {run}: mixed load, serve --workers 2, {} connections, {:.1} s",
        a.conns,
        elapsed.as_secs_f64()
    );
    println!(
        "  {:<40} {:>8} {:>9} {:>9} {:>10}",
        "request", "count", "p50 ms", "p99 ms", "unexpected"
    );
    for (op, o) in &mut per_op {
        o.micros.sort_unstable();
        println!(
            "  {:<40} {:>8} {:>9.1} {:>9.1} {:>10}",
            op.name(),
            o.micros.len(),
            percentile(&o.micros, 0.5),
            percentile(&o.micros, 0.99),
            o.unexpected
        );
    }
    let (big_job, big_sent, max_fds) = big;
    let big_ok = big_job["state"] == "succeeded";
    let result = LoadResult {
        requests,
        rps: requests as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&every, 0.5),
        p99_ms: percentile(&every, 0.99),
        unexpected: unexpected + u64::from(!big_ok),
        peak_rss_kb,
        jobs_acknowledged: created,
        jobs_in_store,
        transport_errors,
    };
    println!(
        "  all: {} requests, {:.0} req/s, p50 {:.1} ms, p99 {:.1} ms, {} unexpected ({} transport errors)",
        result.requests,
        result.rps,
        result.p50_ms,
        result.p99_ms,
        result.unexpected,
        result.transport_errors
    );
    println!(
        "  jobs: {} acknowledged with 201, {} in the store; serve's peak RSS {:.1} MB ({} kB)",
        result.jobs_acknowledged,
        result.jobs_in_store,
        result.peak_rss_kb as f64 / 1000.0,
        result.peak_rss_kb
    );
    println!(
        "  serve held up to {max_fds} descriptors; the 1 GiB http job: state {}, truncated {}, the target got {:.1} MB out",
        big_job["state"],
        big_job["result"]["truncated"],
        big_sent as f64 / 1e6
    );
    for s in samples {
        println!("  unexpected: {}", s.chars().take(300).collect::<String>());
    }
    if result.unexpected > 0 {
        println!("  serve's log (last lines):\n{}", serve.log_tail());
    }
    serve.stop();
    Ok(result)
}

/// A target that answers every request with `Content-Length: total` and writes 64 KiB
/// chunks until done or the client goes away; counts what it got out.
async fn big_target(total: u64) -> anyhow::Result<(String, Arc<AtomicU64>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                // Read the request head.
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.len() > 64 * 1024 {
                        return;
                    }
                }
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {total}\r\n\r\n"
                );
                if sock.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 64 * 1024];
                let mut left = total;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if sock.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                    counter.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    Ok((addr, sent))
}

/// Enqueues an `http` GET of `target` (a [`big_target`]); returns the job id.
async fn enqueue_big(client: &reqwest::Client, base: &str, target: &str) -> anyhow::Result<i64> {
    let res = client
        .post(format!("{base}/v1/jobs"))
        .json(&json!({
            "queue": "big", "kind": "http",
            "payload": {"method": "GET", "url": format!("http://{target}/1g"), "timeout_ms": 600_000}
        }))
        .send()
        .await?;
    if res.status() != 201 {
        bail!("enqueue: {} {}", res.status(), res.text().await?);
    }
    res.json::<Value>().await?["job"]["id"]
        .as_i64()
        .context("no job id")
}

/// Polls job `id` until it has finished (or `within` has passed); returns the job.
async fn wait_job(
    client: &reqwest::Client,
    base: &str,
    id: i64,
    within: Duration,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + within;
    loop {
        let v: Value = client
            .get(format!("{base}/v1/jobs/{id}"))
            .send()
            .await?
            .json()
            .await?;
        let state = v["job"]["state"].as_str().unwrap_or("").to_owned();
        if matches!(state.as_str(), "succeeded" | "dead" | "cancelled") {
            return Ok(v["job"].clone());
        }
        if Instant::now() > deadline {
            bail!("job {id} still {state} after {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct BigResult {
    peak_rss_kb: u64,
    sent: u64,
}

fn run_big(rt: &tokio::runtime::Runtime, a: &Args, run: usize) -> anyhow::Result<BigResult> {
    let serve = Serve::start(&a.bin, 1)?;
    let base = format!("http://{}", serve.addr);
    let (job, sent, took) = rt.block_on(async {
        let (target, sent) = big_target(a.big_bytes).await?;
        let client = reqwest::Client::new();
        let started = Instant::now();
        let id = enqueue_big(&client, &base, &target).await?;
        let job = wait_job(&client, &base, id, Duration::from_secs(600)).await?;
        anyhow::Ok((job, sent, started.elapsed()))
    })?;
    let peak_rss_kb = serve.peak_rss_kb()?;
    let sent = sent.load(Ordering::Relaxed);
    let body_len = job["result"]["body"].as_str().map_or(0, str::len);
    println!(
        "\nrun {run}: one http job against a {} byte response, serve --workers 1",
        a.big_bytes
    );
    println!(
        "  job {} in {:.2} s: state {}, result status {}, body kept {} bytes, truncated {}",
        job["id"],
        took.as_secs_f64(),
        job["state"],
        job["result"]["status"],
        body_len,
        job["result"]["truncated"]
    );
    println!(
        "  the target got {:.1} MB out; serve's peak RSS {:.1} MB ({} kB)",
        sent as f64 / 1e6,
        peak_rss_kb as f64 / 1000.0,
        peak_rss_kb
    );
    if job["state"] != "succeeded" {
        println!("  serve's log (last lines):\n{}", serve.log_tail());
        bail!("the job did not succeed: {job}");
    }
    serve.stop();
    Ok(BigResult { peak_rss_kb, sent })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn main() -> anyhow::Result<ExitCode> {
    let a = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut loads = Vec::new();
    let mut bigs = Vec::new();
    let mut ok = true;
    for run in 1..=a.runs {
        if a.load {
            let r = run_load(&rt, &a, run)?;
            ok &= r.unexpected == 0 && r.jobs_acknowledged == r.jobs_in_store;
            loads.push(r);
        }
        if a.big {
            bigs.push(run_big(&rt, &a, run)?);
        }
    }
    println!("\nmedians of {} runs", a.runs);
    if !loads.is_empty() {
        let m = |f: fn(&LoadResult) -> f64| median(loads.iter().map(f).collect());
        println!(
            "  mixed load ({} connections, {} s, serve --workers 2): {:.0} req/s, p50 {:.1} ms, p99 {:.1} ms, peak RSS {:.1} MB; unexpected answers {} in all runs",
            a.conns,
            a.secs,
            m(|r| r.rps),
            m(|r| r.p50_ms),
            m(|r| r.p99_ms),
            m(|r| r.peak_rss_kb as f64) / 1000.0,
            loads.iter().map(|r| r.unexpected).sum::<u64>()
        );
        for r in &loads {
            if r.jobs_acknowledged != r.jobs_in_store {
                println!(
                    "  jobs: {} acknowledged but {} in the store{}",
                    r.jobs_acknowledged,
                    r.jobs_in_store,
                    if r.transport_errors > 0 {
                        " (transport errors leave some outcomes unknown)"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    if !bigs.is_empty() {
        println!(
            "  1 GiB response (serve --workers 1): peak RSS {:.1} MB, the target got {:.1} MB out",
            median(bigs.iter().map(|b| b.peak_rss_kb as f64).collect()) / 1000.0,
            median(bigs.iter().map(|b| b.sent as f64).collect()) / 1e6
        );
    }
    if !ok {
        println!("FAILED: unexpected answers, or jobs acknowledged but not in the store");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
