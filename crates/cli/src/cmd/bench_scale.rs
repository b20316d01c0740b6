//! The scale half of `redrive bench`: bulk seeding (`--backlog`, `--history`), the plain-SQL
//! ceiling (`--ceiling`) and several `redrive work` processes on one PostgreSQL queue
//! (`--processes`), with their peak resident memory.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redrive_store::{Seed, SeedRows, Store};
use serde::Serialize;

/// Jobs per claim of the ceiling's loop (as the store-level drain's).
const CEILING_BATCH: u64 = 200;

/// Takes up to `most` of what is `left` (0 when nothing is): how the drains split exactly
/// `--jobs` claims between their tasks.
pub(crate) fn reserve(left: &AtomicU64, most: u64) -> u64 {
    let mut took = 0;
    let _ = left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
        took = l.min(most);
        Some(l - took)
    });
    took
}

/// Writes `count` jobs of `queue` in bulk (see [`Store::seed`]); returns the seconds taken.
pub(crate) async fn seed(
    store: &Store,
    queue: &str,
    rows: SeedRows,
    count: u64,
    payload: &serde_json::Value,
    age: Duration,
) -> anyhow::Result<f64> {
    if count == 0 {
        return Ok(0.0);
    }
    let t = Instant::now();
    store
        .seed(&Seed {
            queue: queue.into(),
            queues: 1,
            kind: "noop".into(),
            count,
            rows,
            payload: payload.clone(),
            at: chrono::Utc::now() - chrono::Duration::from_std(age)?,
        })
        .await?;
    Ok(t.elapsed().as_secs_f64())
}

/// `jobs` claims of `queue` by `concurrency` tasks, each a batched claim of up to 200 jobs
/// and one fenced completion of the batch, in plain SQL on the store's own pool: no attempt
/// rows, no counters, no runtime. Returns jobs per second.
pub(crate) async fn ceiling(
    store: &Store,
    queue: &str,
    jobs: u64,
    concurrency: u32,
) -> anyhow::Result<f64> {
    let left = Arc::new(AtomicU64::new(jobs));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (store, left, queue) = (store.clone(), left.clone(), queue.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                let take = reserve(&left, CEILING_BATCH);
                if take == 0 {
                    return anyhow::Ok(n);
                }
                let got = ceiling_batch(&store, &queue, take, w).await?;
                n += got;
                if got < take {
                    // The queue ran dry: give the rest back and stop.
                    left.fetch_add(take - got, Ordering::SeqCst);
                    return Ok(n);
                }
            }
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await??;
    }
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        done == jobs,
        "ceiling: drained {done} jobs, expected {jobs}"
    );
    Ok(jobs as f64 / secs.max(1e-9))
}

const PG_CLAIM: &str = "WITH picked AS (SELECT id FROM redrive_jobs WHERE queue = $1 \
    AND state IN ('scheduled', 'available', 'deferred') AND run_at <= $2 \
    ORDER BY priority, run_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
    UPDATE redrive_jobs t SET state = 'running', lease_owner = $4, \
    lease_token = t.lease_token + 1, lease_expires_at = $5, updated_at = $2 \
    WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING t.id, t.lease_token, t.payload";

/// The jobs are reached by primary key and the fence on `running` is kept out of the partial
/// lease index's reach, as in the store's own completion (see there: stale statistics made
/// the planner walk every running job, or scan the whole table).
const PG_COMPLETE: &str = "UPDATE redrive_jobs t SET state = 'succeeded', lease_owner = NULL, \
    lease_expires_at = NULL, attempts = t.attempts + 1, finished_at = $3, updated_at = $3 \
    FROM UNNEST(CAST($1 AS INT8[]), CAST($2 AS INT8[])) AS v(id, token) \
    WHERE t.id = ANY(CAST($1 AS INT8[])) AND t.id = v.id AND t.lease_token = v.token \
    AND CASE t.state WHEN 'running' THEN TRUE ELSE FALSE END";

const SQLITE_CLAIM: &str = "UPDATE redrive_jobs SET state = 'running', lease_owner = $4, \
    lease_token = lease_token + 1, lease_expires_at = $5, updated_at = $2 \
    WHERE id IN (SELECT id FROM redrive_jobs WHERE queue = $1 \
      AND state IN ('scheduled', 'available', 'deferred') AND run_at <= $2 \
      ORDER BY priority, run_at, id LIMIT $3) \
    RETURNING id, lease_token, payload";

const SQLITE_COMPLETE: &str = "UPDATE redrive_jobs SET state = 'succeeded', lease_owner = NULL, \
    lease_expires_at = NULL, attempts = attempts + 1, finished_at = $2, updated_at = $2 \
    WHERE +state = 'running' AND (id, lease_token) IN \
      (SELECT value ->> 0, value ->> 1 FROM json_each($1))";

/// One claim of up to `take` jobs and the fenced completion of those claimed; returns how
/// many were claimed (and completed: a completion that misses one is an error).
async fn ceiling_batch(store: &Store, queue: &str, take: u64, w: u32) -> anyhow::Result<u64> {
    let now = chrono::Utc::now().timestamp_millis();
    let worker = format!("ceiling-{w}");
    let (claimed, completed) = match store {
        Store::Postgres(pg) => {
            let rows: Vec<(i64, i64, String)> = sqlx::query_as(PG_CLAIM)
                .bind(queue)
                .bind(now)
                .bind(take as i64)
                .bind(&worker)
                .bind(now + 60_000)
                .fetch_all(pg.pool())
                .await?;
            let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
            let tokens: Vec<i64> = rows.iter().map(|r| r.1).collect();
            let done = sqlx::query(PG_COMPLETE)
                .bind(ids)
                .bind(tokens)
                .bind(now)
                .execute(pg.pool())
                .await?
                .rows_affected();
            (rows.len() as u64, done)
        }
        Store::Sqlite(s) => {
            let rows: Vec<(i64, i64, String)> = sqlx::query_as(SQLITE_CLAIM)
                .bind(queue)
                .bind(now)
                .bind(take as i64)
                .bind(&worker)
                .bind(now + 60_000)
                .fetch_all(s.pool())
                .await?;
            let pairs: Vec<(i64, i64)> = rows.iter().map(|r| (r.0, r.1)).collect();
            let done = sqlx::query(SQLITE_COMPLETE)
                .bind(serde_json::to_string(&pairs)?)
                .bind(now)
                .execute(s.pool())
                .await?
                .rows_affected();
            (rows.len() as u64, done)
        }
    };
    anyhow::ensure!(
        completed == claimed,
        "ceiling: completed {completed} of {claimed} claimed jobs"
    );
    Ok(claimed)
}

/// One process of a `--processes` run.
#[derive(Debug, Serialize)]
pub(crate) struct ProcessShare {
    /// Jobs it ran to success.
    pub(crate) succeeded: u64,
    /// Its part of the run's jobs.
    pub(crate) share: f64,
    /// Its peak resident memory (VmHWM), MiB.
    pub(crate) peak_rss_mib: f64,
    /// Claim statements it ran.
    pub(crate) claims: u64,
    /// Of those, the ones that found nothing.
    pub(crate) empty_claims: u64,
}

/// A `--processes` run: `processes` `redrive work` processes on one PostgreSQL queue.
#[derive(Debug, Serialize)]
pub(crate) struct ProcessRun {
    pub(crate) processes: u32,
    /// Each process's `--concurrency`.
    pub(crate) concurrency: u32,
    pub(crate) jobs: u64,
    /// Jobs over the time from the first attempt's start to the last job's finish (as the
    /// database recorded them: process start-up and connecting are not counted).
    pub(crate) drain_jobs_per_s: f64,
    pub(crate) drain_seconds: f64,
    /// From starting the processes to the last one's exit.
    pub(crate) wall_seconds: f64,
    /// Total drain / this run's processes' count (each one's mean rate).
    pub(crate) per_process_jobs_per_s: f64,
    pub(crate) per_process: Vec<ProcessShare>,
    /// The largest peak resident memory of the processes, MiB.
    pub(crate) peak_rss_mib: f64,
}

/// The shape of a `--processes` run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Processes {
    /// Jobs to drain.
    pub(crate) jobs: u64,
    /// Jobs left waiting below them.
    pub(crate) backlog: u64,
    /// `redrive work` processes.
    pub(crate) processes: u32,
    /// Each one's `--concurrency`.
    pub(crate) concurrency: u32,
}

/// Seeds `jobs` (after the backlog and history, already in `store`) and drains them with
/// `processes` `redrive work --until-idle` processes on `url` (the store's schema), each at
/// `concurrency`. With a backlog, each process stops after its part of `jobs` (`--max-jobs`).
pub(crate) async fn processes(
    store: &Store,
    url: &str,
    queue: &str,
    run: Processes,
    payload: &serde_json::Value,
) -> anyhow::Result<ProcessRun> {
    let Processes {
        jobs,
        backlog,
        processes,
        concurrency,
    } = run;
    seed(
        store,
        queue,
        SeedRows::Available,
        jobs,
        payload,
        Duration::from_secs(1),
    )
    .await?;
    let exe = std::env::current_exe()?;
    let t0 = chrono::Utc::now();
    let wall = Instant::now();
    let mut children = Vec::new();
    for p in 0..u64::from(processes) {
        let mut cmd = Command::new(&exe);
        cmd.args(["--db", url, "work", "--until-idle", "--queue", queue])
            .args(["--kind", "noop", "--concurrency", &concurrency.to_string()])
            .env_remove("REDRIVE_POLICIES")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if backlog > 0 {
            let share = jobs / u64::from(processes) + u64::from(p < jobs % u64::from(processes));
            cmd.args(["--max-jobs", &share.to_string()]);
        }
        children.push(std::thread::spawn(move || watch(cmd)));
    }
    let mut outs = Vec::new();
    for c in children {
        outs.push(
            c.join()
                .map_err(|_| anyhow::anyhow!("a watcher thread panicked"))??,
        );
    }
    let wall_seconds = wall.elapsed().as_secs_f64();
    let (first, last, n): (Option<i64>, Option<i64>, i64) = match store {
        Store::Postgres(pg) => {
            sqlx::query_as(
                "SELECT MIN(first_attempt_at), MAX(finished_at), COUNT(*) FROM redrive_jobs \
             WHERE state = 'succeeded' AND finished_at >= $1",
            )
            .bind(t0.timestamp_millis())
            .fetch_one(pg.pool())
            .await?
        }
        Store::Sqlite(_) => anyhow::bail!("--processes: needs a PostgreSQL --db"),
    };
    let succeeded: u64 = outs.iter().map(|o| o.succeeded).sum();
    anyhow::ensure!(
        succeeded >= jobs && n as u64 == succeeded,
        "{processes} processes: {succeeded} jobs succeeded by their count, {n} in the database, {jobs} expected"
    );
    let drain_seconds = match (first, last) {
        (Some(f), Some(l)) => ((l - f) as f64 / 1000.0).max(1e-3),
        _ => wall_seconds,
    };
    let drain = succeeded as f64 / drain_seconds;
    Ok(ProcessRun {
        processes,
        concurrency,
        jobs: succeeded,
        drain_jobs_per_s: drain,
        drain_seconds,
        wall_seconds,
        per_process_jobs_per_s: drain / f64::from(processes),
        peak_rss_mib: outs.iter().map(|o| o.peak_rss_mib).fold(0.0, f64::max),
        per_process: outs
            .into_iter()
            .map(|o| ProcessShare {
                share: o.succeeded as f64 / succeeded.max(1) as f64,
                succeeded: o.succeeded,
                peak_rss_mib: o.peak_rss_mib,
                claims: o.claims,
                empty_claims: o.empty_claims,
            })
            .collect(),
    })
}

/// What one watched process did.
struct Watched {
    succeeded: u64,
    peak_rss_mib: f64,
    claims: u64,
    empty_claims: u64,
}

/// Runs `cmd`, reading its peak resident memory (`VmHWM`, which only grows) every 20 ms
/// until it exits; its summary line gives the jobs it ran.
fn watch(mut cmd: Command) -> anyhow::Result<Watched> {
    let mut child = cmd.spawn()?;
    let status = format!("/proc/{}/status", child.id());
    // The pipes are drained by threads, so a chatty child never blocks on a full pipe.
    let mut out = child.stdout.take().map(drain_pipe);
    let mut err = child.stderr.take().map(drain_pipe);
    let mut peak_kib = 0u64;
    let code = loop {
        if let Some(kib) = vm_hwm_kib(&status) {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(code) = child.try_wait()? {
            break code;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = |p: &mut Option<std::thread::JoinHandle<String>>| {
        p.take().and_then(|h| h.join().ok()).unwrap_or_default()
    };
    let (stdout, stderr) = (text(&mut out), text(&mut err));
    anyhow::ensure!(
        code.success(),
        "redrive work exited with {code}: {}",
        stderr.trim()
    );
    let (succeeded, claims, empty_claims) = parse_summary(&stdout)
        .ok_or_else(|| anyhow::anyhow!("redrive work printed no summary: {stdout:?}"))?;
    Ok(Watched {
        succeeded,
        peak_rss_mib: peak_kib as f64 / 1024.0,
        claims,
        empty_claims,
    })
}

/// `succeeded N, …, claims C (E empty)` of `redrive work`'s summary line: (N, C, E).
fn parse_summary(stdout: &str) -> Option<(u64, u64, u64)> {
    let after = |key: &str, end: char| -> Option<u64> {
        let (_, rest) = stdout.split_once(key)?;
        rest.split(end).next()?.trim().parse().ok()
    };
    Some((
        after("succeeded ", ',')?,
        after("claims ", '(')?,
        after("(", ' ')?,
    ))
}

fn drain_pipe<R: Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// `VmHWM` (peak resident set) of a `/proc/PID/status` file, KiB; `None` once it is gone.
fn vm_hwm_kib(path: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    parse_vm_hwm(&s)
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// This process's own peak resident memory, MiB (0 where `/proc` is missing).
pub(crate) fn own_peak_rss_mib() -> f64 {
    vm_hwm_kib("/proc/self/status").map_or(0.0, |k| k as f64 / 1024.0)
}

/// This process's CPU time so far (user and system, all its threads), seconds; `None` where
/// `/proc` is missing. In clock ticks of 10 ms (Linux reports `/proc` times in USER_HZ, 100).
pub(crate) fn own_cpu_seconds() -> Option<f64> {
    parse_cpu_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?).map(|t| t as f64 / 100.0)
}

/// utime + stime of a `/proc/PID/stat` line (fields 14 and 15; the command name, field 2,
/// may hold spaces and parentheses, so counting starts after its last `)`).
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Writes the database's dirty pages out before a timed drain (PostgreSQL `CHECKPOINT`,
/// SQLite `wal_checkpoint(TRUNCATE)`), so that no drain pays for the checkpoint its
/// predecessors' writes made due: a run writes a few hundred MB of WAL, and a checkpoint the
/// server starts on its own lands in whichever drain is running. The reason it could not
/// when it fails (PostgreSQL wants a superuser or `pg_checkpoint`).
pub(crate) async fn checkpoint(store: &Store) -> Result<(), String> {
    let r = match store {
        Store::Postgres(pg) => sqlx::query("CHECKPOINT").execute(pg.pool()).await.map(drop),
        Store::Sqlite(s) => sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(s.pool())
            .await
            .map(drop),
    };
    r.map_err(|e| e.to_string())
}

/// Microseconds of this process's CPU per job while `f` drains `jobs` jobs (its tasks
/// spawned inside it, so that their work counts from the start), beside `f`'s own answer
/// (`None` where `/proc` is missing).
pub(crate) async fn cpu_per_job<T>(jobs: u64, f: impl Future<Output = T>) -> (T, Option<f64>) {
    let before = own_cpu_seconds();
    let out = f.await;
    let per_job = match (before, own_cpu_seconds()) {
        (Some(a), Some(b)) if jobs > 0 => Some((b - a) * 1e6 / jobs as f64),
        _ => None,
    };
    (out, per_job)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let line = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 4 0 1 2 3";
        assert_eq!(parse_cpu_ticks(line), Some(281));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1 2"), None);
        assert!(own_cpu_seconds().is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn reserve_splits_exactly() {
        let left = AtomicU64::new(450);
        assert_eq!(reserve(&left, 200), 200);
        assert_eq!(reserve(&left, 200), 200);
        assert_eq!(reserve(&left, 200), 50);
        assert_eq!(reserve(&left, 200), 0);
        assert_eq!(left.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn summary_line_is_parsed() {
        let line = "succeeded 12, dead 0, deferred 1, released 0, lease lost 0, attempts 13, claims 7 (2 empty)\n";
        assert_eq!(parse_summary(line), Some((12, 7, 2)));
        assert_eq!(parse_summary("nothing"), None);
    }

    #[test]
    fn vm_hwm_is_read_from_a_status_file() {
        let s = "Name:\tredrive\nVmPeak:\t  300000 kB\nVmHWM:\t   51234 kB\nVmRSS:\t 40000 kB\n";
        assert_eq!(parse_vm_hwm(s), Some(51_234));
        assert_eq!(parse_vm_hwm("Name:\tx\n"), None);
        assert!(own_peak_rss_mib() > 0.0, "this test runs on Linux");
    }
}
