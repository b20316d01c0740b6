//! The queue commands: `migrate`, `enqueue`, `jobs`, `show`, `dead list`, `stats`,
//! `workers`, `breakers` (the operator's changes are in `operator`).

use crate::out::{out, outln};
use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use redrive_http::redact::{redact_text, redact_value};
use redrive_http::validate::MAX_PAYLOAD_BYTES;
use redrive_http::{EnqueueError, JobRequest, RunAt, check_same_request};
use redrive_store::{Attempt, Job, JobState, ListParams, NewJob, Store, StoreError};
use serde_json::json;

use crate::args::{
    DeadCommand, DeadListArgs, EnqueueArgs, Global, JobsArgs, JsonArgs, ShowArgs, StatsArgs,
};
use crate::error::usage;
use crate::policies;

/// Runs an async command body on a fresh runtime.
pub(crate) fn block_on<F: std::future::Future<Output = anyhow::Result<ExitCode>>>(
    f: F,
) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(f)
}

/// Opens the store named by `--db`, creating an SQLite file that does not exist yet (for
/// `migrate`, `enqueue`, `work`, `serve`); a malformed URL is a usage error.
/// Now in the database's clock (R24): what a one-shot command writes to shared rows (a
/// delayed job's `run_at`, a pause's end, a schedule's next tick, an audit row) is timed as the
/// fleet's workers time it, whatever this host's clock says. This host's clock only when the
/// database cannot say (the command's own write then fails and says why), or with the clock
/// sync turned off for a drill (see [`crate::clock`]).
pub(crate) async fn db_now(store: &Store) -> chrono::DateTime<chrono::Utc> {
    let local = crate::clock::ClockSetup::from_env().ok();
    let host = || {
        local
            .as_ref()
            .map_or_else(chrono::Utc::now, |c| c.local.now())
    };
    if local.as_ref().is_some_and(|c| !c.sync) {
        return host();
    }
    store.db_time().await.unwrap_or_else(|_| host())
}

pub(crate) async fn open(global: &Global) -> anyhow::Result<Store> {
    if global.db.starts_with("postgres://") || global.db.starts_with("postgresql://") {
        // A malformed host list, `target_session_attrs` or `pool_size` is the user's to fix.
        redrive_store::PgUrl::parse(&global.db).map_err(|e| usage(format!("--db: {e}")))?;
    }
    match Store::connect(&global.db).await {
        Ok(s) => Ok(s),
        Err(e @ StoreError::BadUrl { .. }) => Err(usage(format!("--db: {e}"))),
        Err(e) => {
            Err(anyhow::Error::new(e).context(format!("opening database {}", shown_db(global))))
        }
    }
}

/// The variable that lets `serve` and `work` run on an in-memory database (tests only).
pub(crate) const ALLOW_MEMORY_DB: &str = "REDRIVE_ALLOW_MEMORY_DB";

/// Opens the store for `serve` and `work`, which acknowledge jobs and run them: an in-memory
/// database (`sqlite::memory:`) or an `sqlite:` URL without a path (SQLite then opens a
/// private temporary file) loses every job at exit, so both are refused with a usage error
/// unless [`ALLOW_MEMORY_DB`] is set to `1`.
pub(crate) async fn open_durable(global: &Global, command: &str) -> anyhow::Result<Store> {
    if let Some(why) = not_durable(&global.db)
        && std::env::var(ALLOW_MEMORY_DB).as_deref() != Ok("1")
    {
        return Err(usage(format!(
            "--db: {:?} {why}: `{command}` would lose every job it accepts when it exits; give a file (sqlite:redrive.db) or a postgres:// URL",
            shown_db(global)
        )));
    }
    open(global).await
}

/// Why an SQLite URL keeps nothing (`None`: a file, or not SQLite).
fn not_durable(url: &str) -> Option<&'static str> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path == ":memory:"
        || path.starts_with("file::memory:")
        || query.split('&').any(|p| p == "mode=memory")
    {
        Some("is an in-memory database")
    } else if path.is_empty() {
        Some("names no file")
    } else {
        None
    }
}

/// Opens the store for a command that only reads or changes existing jobs: an SQLite file
/// that does not exist is an error naming it (a typo in `--db` must not create a new, empty
/// database and report "no jobs").
pub(crate) async fn open_existing(global: &Global) -> anyhow::Result<Store> {
    if let Some(path) = sqlite_path(&global.db)
        && !std::path::Path::new(&path).exists()
    {
        anyhow::bail!(
            "no database at {path}: --db names an SQLite file that does not exist (check the path, or create it with `redrive migrate`)"
        );
    }
    open(global).await
}

/// The file of an `sqlite:` URL (`None` for other URLs and in-memory databases).
pub(crate) fn sqlite_path(url: &str) -> Option<String> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or("");
    (!path.is_empty() && path != ":memory:" && !path.starts_with("file::memory:"))
        .then(|| path.to_owned())
}

/// `--db` as it may be shown (a password masked).
pub(crate) fn shown_db(global: &Global) -> String {
    redrive_http::redact::redact_url(&global.db)
}

pub(crate) fn migrate(global: &Global) -> anyhow::Result<ExitCode> {
    block_on(async {
        let store = open(global).await?;
        store.migrate().await?;
        outln!("migrated {} ({})", shown_db(global), store.backend());
        Ok(ExitCode::SUCCESS)
    })
}

/// What a `--payload @FILE` is when it is neither a regular file nor a pipe.
fn not_a_payload_file(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return None;
        }
        if t.is_char_device() {
            return Some("a character device");
        }
        if t.is_block_device() {
            return Some("a block device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a file")
}

/// Reads `--payload` (inline JSON or `@FILE`), at most [`MAX_PAYLOAD_BYTES`] of it.
pub(crate) fn payload(arg: Option<&str>) -> anyhow::Result<serde_json::Value> {
    let Some(raw) = arg else {
        return Ok(json!({}));
    };
    let too_big = |from: &str, n: String| {
        usage(format!(
            "--payload: {from} is {n} bytes; a payload is at most {MAX_PAYLOAD_BYTES} bytes"
        ))
    };
    let (text, from) = match raw.strip_prefix('@') {
        Some(path) => {
            let cannot = |e: std::io::Error| usage(format!("--payload: cannot read {path}: {e}"));
            let file = std::fs::File::open(path).map_err(cannot)?;
            // A device (`/dev/urandom`), a directory or a socket is no payload; a regular
            // file or a pipe (`@/dev/stdin`, `@<(cmd)`) is read.
            let meta = file.metadata().map_err(cannot)?;
            if let Some(what) = not_a_payload_file(&meta) {
                return Err(usage(format!(
                    "--payload: {path} is not a regular file ({what}); give a file, a pipe or \
                     the JSON inline"
                )));
            }
            // Read one byte past the limit, never the whole of a huge file.
            let mut buf = Vec::new();
            file.take(MAX_PAYLOAD_BYTES as u64 + 1)
                .read_to_end(&mut buf)
                .map_err(cannot)?;
            if buf.len() > MAX_PAYLOAD_BYTES {
                // A device or a pipe has no size: say only that it is over.
                let n = std::fs::metadata(path)
                    .ok()
                    .filter(std::fs::Metadata::is_file)
                    .map_or_else(
                        || format!("over {MAX_PAYLOAD_BYTES}"),
                        |m| m.len().to_string(),
                    );
                return Err(too_big(path, n));
            }
            let text = String::from_utf8(buf)
                .map_err(|_| usage(format!("--payload: {path} is not UTF-8 text")))?;
            (text, path.to_owned())
        }
        None => {
            if raw.len() > MAX_PAYLOAD_BYTES {
                return Err(too_big("the value", raw.len().to_string()));
            }
            (raw.to_owned(), "the value".to_owned())
        }
    };
    serde_json::from_str(&text)
        .map_err(|e| usage(format!("--payload: {from} is not valid JSON: {e}")))
}

/// The job `enqueue` asks for, checked before a database is opened: with `--policies FILE`,
/// wholly; without, every flag but those the named policy bounds (`--policy` itself and
/// `--max-attempts`), which [`new_job_with`] checks against the stored policies.
fn new_job(
    global: &Global,
    a: &EnqueueArgs,
    payload: serde_json::Value,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<NewJob> {
    if global.policies.is_some() {
        return new_job_with(&policies::load(global)?, a, payload, now);
    }
    JobRequest {
        max_attempts: None,
        ..request(a, payload)
    }
    .build(&redrive_policy::RetryPolicy::payment(), now)
    .map_err(flag_error)
}

/// The job `enqueue` asks for under the policies in force (`set`).
fn new_job_with(
    set: &redrive_policy::PolicySet,
    a: &EnqueueArgs,
    payload: serde_json::Value,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<NewJob> {
    let policy_name = a.policy.as_deref().unwrap_or("payment");
    let policy = set
        .get(policy_name)
        .map_err(|e| usage(format!("--policy: {e}")))?;
    request(a, payload).build(policy, now).map_err(flag_error)
}

/// The flags of `enqueue` as the shared enqueue request.
fn request(a: &EnqueueArgs, payload: serde_json::Value) -> JobRequest {
    JobRequest {
        key: a.key.clone(),
        quota_key: a.quota_key.clone(),
        priority: a.priority,
        max_attempts: a.max_attempts,
        // `http` jobs default to the URL's host.
        dependency: a.dependency.clone(),
        run_at: match (a.delay, a.run_at) {
            (Some(d), _) => RunAt::After(d),
            (None, Some(t)) => RunAt::At(t),
            (None, None) => RunAt::Now,
        },
        // Both present without `--file` (clap requires them).
        ..JobRequest::new(
            a.queue.clone().unwrap_or_default(),
            a.kind.clone().unwrap_or_default(),
            payload,
        )
    }
}

/// A refusal of the shared enqueue validation, naming the flag: a usage error (exit 2).
pub(crate) fn flag_error(e: EnqueueError) -> anyhow::Error {
    let EnqueueError::Invalid {
        field,
        value,
        reason,
    } = &e
    else {
        return anyhow::Error::new(e);
    };
    let flag = match field.split('.').next().unwrap_or("") {
        "payload" => "payload",
        "run_at" => "run-at",
        "delay" => "delay",
        "priority" => "priority",
        "key" => "key",
        "quota_key" => "quota-key",
        "dependency" => "dependency",
        "kind" => "kind",
        "policy" => "policy",
        "max_attempts" => "max-attempts",
        "ttl" => "policy",
        _ => "queue",
    };
    if value.is_empty() {
        usage(format!("--{flag}: {field}: {reason}"))
    } else {
        usage(format!("--{flag}: {field} {value:?}: {reason}"))
    }
}

pub(crate) fn enqueue(global: &Global, a: EnqueueArgs) -> anyhow::Result<ExitCode> {
    if let Some(file) = &a.file {
        return crate::cmd::enqueue_file::run(global, file, a.json);
    }
    // Checked before connecting (bad input needs no database), built again on its clock (the
    // payload read once: it may come from a pipe).
    let body = payload(a.payload.as_deref())?;
    new_job(global, &a, body.clone(), chrono::Utc::now())?;
    block_on(async move {
        let store = open(global).await?;
        let now = db_now(&store).await;
        // The policies: `--policies FILE`, else the stored version, else built-in.
        let source = policies::source(global, &store).await?;
        let set = source.set()?;
        let job = new_job_with(&set, &a, body, now)?;
        // `[payload] refuse_card_data` holds for the CLI as for the API.
        if source.payload()?.refuse_card_data
            && let Some(path) = redrive_http::redact::find_card_data(&job.payload)
        {
            return Err(usage(format!(
                "--payload: {path}: the payload carries card data (a card number or a card \
                 field such as cvc), refused by [payload] refuse_card_data: send a token from \
                 your PSP instead"
            )));
        }
        let e = store.enqueue(&job, now).await?;
        if !e.created {
            // The same key for another request is an error, as in the API (exit 1).
            check_same_request(&job, &e.job)?;
        }
        if a.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({"created": e.created, "job": shown(e.job)}))?
            );
        } else if e.created {
            outln!(
                "enqueued job {} on {} ({})",
                e.job.id,
                e.job.queue,
                e.job.state
            );
        } else {
            outln!(
                "job {} already exists for key {:?} ({})",
                e.job.id,
                e.job.key.as_deref().unwrap_or(""),
                e.job.state
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// A job as it may be shown: payload, result and last error redacted.
pub(crate) fn shown(mut job: Job) -> Job {
    job.payload = redact_value(&job.payload);
    job.result = job.result.as_ref().map(redact_value);
    job.last_error = job.last_error.as_deref().map(redact_text);
    job
}

/// An attempt as it may be shown: its error redacted.
fn shown_attempt(mut a: Attempt) -> Attempt {
    a.error = a.error.as_deref().map(redact_text);
    a.response = a.response.as_deref().map(redact_text);
    a
}

/// A response excerpt on one line: whitespace runs (newlines of a pretty body) as one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A page of jobs as it may be shown.
fn shown_page(page: redrive_store::Page) -> redrive_store::Page {
    redrive_store::Page {
        jobs: page.jobs.into_iter().map(shown).collect(),
        next: page.next,
    }
}

fn state_arg(s: Option<&str>) -> anyhow::Result<Option<JobState>> {
    s.map(|s| {
        s.parse::<JobState>()
            .map_err(|e| usage(format!("--state: {e}")))
    })
    .transpose()
}

pub(crate) fn jobs(global: &Global, a: JobsArgs) -> anyhow::Result<ExitCode> {
    let state = state_arg(a.state.as_deref())?;
    block_on(async move {
        let store = open_existing(global).await?;
        let page = store
            .list(&ListParams {
                state,
                queue: a.queue.clone(),
                key: a.key.clone(),
                after: a.after,
                limit: Some(a.limit.min(1000)),
                ..Default::default()
            })
            .await?;
        let page = shown_page(page);
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&page)?);
        } else {
            print_jobs(&page.jobs)?;
            if let Some(n) = page.next {
                outln!("more: --after {n}");
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn print_jobs(jobs: &[Job]) -> anyhow::Result<()> {
    outln!(
        "{:>8}  {:<12} {:<10} {:<10} {:>8}  {:<20} REASON / ERROR",
        "ID",
        "QUEUE",
        "KIND",
        "STATE",
        "ATTEMPTS",
        "RUN AT"
    );
    for j in jobs {
        let why = j
            .dead_reason
            .map(|r| r.as_str())
            .or(j.defer_reason.map(|r| r.as_str()))
            .unwrap_or("");
        let err = j
            .last_error
            .as_deref()
            .map(|e| truncate(e, 60))
            .unwrap_or_default();
        outln!(
            "{:>8}  {:<12} {:<10} {:<10} {:>4}/{:<3}  {:<20} {why} {err}",
            j.id,
            truncate(&j.queue, 12),
            truncate(&j.kind, 10),
            j.state.as_str(),
            j.attempts,
            j.max_attempts,
            j.run_at.format("%Y-%m-%d %H:%M:%S"),
        );
    }
    if jobs.is_empty() {
        outln!("(no jobs)");
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

/// The job `show` is about: by id, or by key (and queue).
async fn find_job(store: &Store, a: &ShowArgs) -> anyhow::Result<Job> {
    let Some(key) = &a.key else {
        if a.queue.is_some() {
            return Err(usage(
                "--queue goes with --key (a job id names one job on its own)",
            ));
        }
        let id = a.id.ok_or_else(|| usage("give a job id or --key"))?;
        return Ok(store.get(id).await?.ok_or(StoreError::JobNotFound { id })?);
    };
    // A key is unique per queue: at most one job per queue holds it.
    let page = store
        .list(&ListParams {
            key: Some(key.clone()),
            queue: a.queue.clone(),
            limit: Some(1000),
            ..Default::default()
        })
        .await?;
    let mut jobs = page.jobs;
    match jobs.len() {
        0 => match &a.queue {
            Some(q) => anyhow::bail!("no job with key {key:?} on queue {q:?}"),
            None => anyhow::bail!("no job with key {key:?}"),
        },
        1 => Ok(jobs.remove(0)),
        _ => {
            let held: Vec<String> = jobs
                .iter()
                .map(|j| format!("{} (job {})", j.queue, j.id))
                .collect();
            Err(usage(format!(
                "--key: {key:?} is held by jobs on {} queues: {}; add --queue QUEUE to pick one",
                jobs.len(),
                held.join(", ")
            )))
        }
    }
}

pub(crate) fn show(global: &Global, a: ShowArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let job = find_job(&store, &a).await?;
        let id = job.id;
        // Secrets (headers, URL credentials, API keys) never reach the screen.
        let job = shown(job);
        let attempts: Vec<Attempt> = store
            .attempts(id)
            .await?
            .into_iter()
            .map(shown_attempt)
            .collect();
        let declines = store.declines(id).await?;
        let waiting = store.waiting_because(&job).await?;
        let quota = match &job.quota_key {
            Some(k) => Some(
                crate::cmd::quota::usage_of(
                    &store,
                    &policies::source(global, &store).await?.set()?,
                    k,
                    chrono::Utc::now(),
                )
                .await?,
            ),
            None => None,
        };
        if a.json {
            // The same shape as the API's `waiting_because`.
            let why: Vec<redrive_service::WaitingView> =
                waiting.iter().cloned().map(Into::into).collect();
            let mut v = json!({"job": job, "attempts": attempts, "waiting_because": why});
            if !declines.is_empty() || quota.is_some() {
                v["declines"] = serde_json::to_value(&declines)?;
                v["quota"] = serde_json::to_value(&quota)?;
            }
            outln!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(ExitCode::SUCCESS);
        }
        outln!(
            "job {} on {} ({}), policy {}",
            job.id,
            job.queue,
            job.kind,
            job.policy
        );
        outln!(
            "  state      {}{}",
            job.state,
            job.dead_reason
                .map(|r| r.as_str())
                .or(job.defer_reason.map(|r| r.as_str()))
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
        // What holds it back now (a paused queue, an open breaker, a rate limit, run_at).
        for w in &waiting {
            outln!("  waiting    {w}");
        }
        outln!("  key        {}", job.key.as_deref().unwrap_or("-"));
        outln!("  dependency {}", job.dependency.as_deref().unwrap_or("-"));
        if let Some(k) = &job.quota_key {
            outln!("  quota key  {k}");
        }
        outln!(
            "  attempts   {}/{} (exceptions {}, defers {}, replays {})",
            job.attempts,
            job.max_attempts,
            job.exceptions,
            job.defers,
            job.replays
        );
        outln!("  run at     {}", job.run_at.to_rfc3339());
        if let Some(d) = job.deadline {
            outln!("  deadline   {}", d.to_rfc3339());
        }
        if let Some(e) = &job.last_error {
            outln!("  last error {e}");
        }
        // What the dependency said, from the latest attempt that kept an answer.
        if let Some(r) = attempts.iter().rev().find_map(|a| a.response.as_deref()) {
            outln!("  answer     {}", truncate(&one_line(r), 300));
        }
        outln!("  payload    {}", job.payload);
        if let Some(r) = &job.result {
            outln!("  result     {r}");
        }
        print_attempts(&attempts)?;
        crate::cmd::quota::print_declines(&declines, quota.as_ref())?;
        Ok(ExitCode::SUCCESS)
    })
}

fn print_attempts(attempts: &[Attempt]) -> anyhow::Result<()> {
    outln!("attempts:");
    if attempts.is_empty() {
        outln!("  (none)");
    }
    for a in attempts {
        let delay = a
            .delay
            .map(|d| {
                format!(
                    "{} {}",
                    a.mode.map(|m| m.as_str()).unwrap_or(""),
                    redrive_policy::format_duration(d)
                )
            })
            .unwrap_or_default();
        outln!(
            "  #{}{} {} {:<14} {:>4} {:>6}ms token {} {}{}{}",
            a.number,
            if a.replay > 0 {
                format!(" (replay {})", a.replay)
            } else {
                String::new()
            },
            a.started_at.format("%H:%M:%S%.3f"),
            a.class.as_str(),
            a.http_status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            a.duration.as_millis(),
            a.lease_token,
            delay,
            if a.counted { "" } else { " (not counted)" },
            a.error
                .as_deref()
                .map(|e| format!(" — {}", truncate(e, 80)))
                .unwrap_or_default(),
        );
        if let Some(r) = &a.response {
            outln!("      answered: {}", truncate(&one_line(r), 160));
        }
    }
    Ok(())
}

pub(crate) fn dead(global: &Global, cmd: DeadCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DeadCommand::List(a) => dead_list(global, a),
        DeadCommand::Replay(s) => crate::cmd::operator::dead_bulk(global, s, true),
        DeadCommand::Purge(s) => crate::cmd::operator::dead_bulk(global, s, false),
    }
}

fn dead_list(global: &Global, a: DeadListArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let page = store
            .list(&ListParams {
                state: Some(JobState::Dead),
                queue: a.queue.clone(),
                limit: Some(a.limit.min(1000)),
                ..Default::default()
            })
            .await?;
        let page = shown_page(page);
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&page)?);
        } else {
            print_jobs(&page.jobs)?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub(crate) fn stats(global: &Global, a: StatsArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let limit = a.limit as usize;
        let (counts, more_queues) =
            redrive_store::labels::busiest_queues(store.counts().await?, limit);
        let mut deps = store.dependencies().await?;
        // Those that need attention first (not closed, or paused), then by name.
        deps.sort_by_key(|d| {
            (
                d.flow.state_label() == "closed" && d.flow.paused_until.is_none(),
                d.name.clone(),
            )
        });
        let more_breakers = deps.len().saturating_sub(limit);
        deps.truncate(limit);
        let mut unhandled = store.unhandled(store.db_time().await?).await?;
        unhandled.sort_by_key(|u| std::cmp::Reverse(u.jobs));
        let more_unhandled = unhandled.len().saturating_sub(limit);
        unhandled.truncate(limit);
        let paused = store.paused_queues().await?;
        let more =
            json!({"queues": more_queues, "breakers": more_breakers, "unhandled": more_unhandled});
        if a.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({"counts": counts, "breakers": deps,
                    "unhandled": unhandled, "paused_queues": paused, "more": more}))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        let mut queues: Vec<&str> = counts.iter().map(|c| c.queue.as_str()).collect();
        queues.dedup();
        // One row per queue, without a scan of every count for every cell.
        let mut cells: std::collections::HashMap<(&str, JobState), u64> =
            std::collections::HashMap::new();
        for c in &counts {
            cells.insert((c.queue.as_str(), c.state), c.count);
        }
        out!("{:<16}", "QUEUE");
        for s in JobState::ALL {
            out!("{:>11}", s.as_str());
        }
        outln!();
        for q in &queues {
            out!("{:<16}", truncate(q, 16));
            for s in JobState::ALL {
                let n = cells.get(&(*q, s)).copied().unwrap_or(0);
                out!("{n:>11}");
            }
            outln!();
        }
        if queues.is_empty() {
            outln!("(no jobs)");
        }
        if more_queues > 0 {
            outln!("… and {more_queues} more queues (the quietest; --limit shows more)");
        }
        // Their jobs wait however many the table shows available.
        for p in &paused {
            outln!(
                "queue {} is paused (since {}, by {}): its jobs wait until `redrive queue resume {}`",
                p.queue,
                p.paused_at.format("%Y-%m-%d %H:%M:%S"),
                p.paused_by,
                p.queue
            );
        }
        print_unhandled(&unhandled)?;
        if more_unhandled > 0 {
            outln!("… and {more_unhandled} more unhandled groups (--limit shows more)");
        }
        print_breakers(&deps)?;
        if more_breakers > 0 {
            outln!("… and {more_breakers} more breakers (--limit shows more)");
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Jobs waiting for a queue and kind that no live worker runs, if any.
fn print_unhandled(unhandled: &[redrive_store::Unhandled]) -> anyhow::Result<()> {
    if unhandled.is_empty() {
        return Ok(());
    }
    outln!("waiting for a kind no live worker runs (see `redrive workers`):");
    outln!(
        "  {:<16} {:<16} {:>8}  OLDEST RUN AT",
        "QUEUE",
        "KIND",
        "JOBS"
    );
    for u in unhandled {
        outln!(
            "  {:<16} {:<16} {:>8}  {}",
            truncate(&u.queue, 16),
            truncate(&u.kind, 16),
            u.jobs,
            u.oldest_run_at.format("%Y-%m-%d %H:%M:%S")
        );
    }
    Ok(())
}

/// How a worker's kinds are shown: `any`, or the list.
pub(crate) fn kinds_text(k: &redrive_store::Kinds) -> String {
    match k.as_list() {
        None => "any".into(),
        Some(list) => list.join(","),
    }
}

/// How a worker's host clock is shown against the database's: `3.000s ahead`, `0.250s
/// behind`, `in sync` (within a millisecond), or `unsynced` (not measured). The stored offset
/// is database − host: a host ahead has a negative one.
fn clock_text(offset_ms: Option<i64>) -> String {
    match offset_ms {
        None => "unsynced".into(),
        Some(0) => "in sync".into(),
        Some(ms) => format!(
            "{:.3}s {}",
            ms.unsigned_abs() as f64 / 1000.0,
            if ms < 0 { "ahead" } else { "behind" }
        ),
    }
}

pub(crate) fn workers(global: &Global, a: JsonArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        // Workers write `last_seen` in the database's clock: judge it in that clock too.
        let now = store.db_time().await?;
        let workers = store.workers(now).await?;
        let stale = redrive_store::WORKER_STALE_AFTER.as_secs();
        let conns = store.connections().await?;
        // A worker's connections, matched by host and pid (the host as far as PostgreSQL kept it).
        let conns_of = |w: &redrive_store::WorkerInfo| {
            conns.as_ref().map(|c| {
                c.processes
                    .iter()
                    .filter(|p| p.pid == w.pid && w.host.starts_with(&p.host))
                    .map(|p| p.connections)
                    .sum::<u32>()
            })
        };
        if a.json {
            let mut listed = serde_json::to_value(&workers)?;
            if let Some(items) = listed.as_array_mut() {
                for (item, w) in items.iter_mut().zip(&workers) {
                    item["db_connections"] = json!(conns_of(w));
                }
            }
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "workers": listed,
                    "stale_after_seconds": stale,
                    "database_connections": conns,
                }))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        outln!(
            "{:<28} {:<16} {:>8} {:<16} {:<16} {:>5} {:>4}  {:<20} {:<14} {:<24} LAST SEEN",
            "NAME",
            "HOST",
            "PID",
            "QUEUES",
            "KINDS",
            "CONC",
            "CONN",
            "STARTED",
            "CLOCK",
            "POLICIES"
        );
        for w in &workers {
            let queues = if w.queues.is_empty() {
                "all".to_owned()
            } else {
                w.queues.join(",")
            };
            outln!(
                "{:<28} {:<16} {:>8} {:<16} {:<16} {:>5} {:>4}  {:<20} {:<14} {:<24} {}s ago",
                truncate(&w.name, 28),
                truncate(&w.host, 16),
                w.pid,
                truncate(&queues, 16),
                truncate(&kinds_text(&w.kinds), 16),
                w.concurrency,
                conns_of(w).map_or_else(|| "-".to_owned(), |n| n.to_string()),
                w.started_at.format("%Y-%m-%d %H:%M:%S"),
                clock_text(w.clock_offset_ms),
                w.policy_version.as_deref().unwrap_or("-"),
                (now - w.last_seen).num_seconds().max(0)
            );
        }
        if workers.is_empty() {
            outln!("(no live workers; a worker not seen for {stale}s counts as gone)");
        }
        if let Some(c) = &conns {
            let ours: u32 = c.processes.iter().map(|p| p.connections).sum();
            outln!(
                "database connections: {} in use of max_connections {} ({} reserved for \
                 superusers); redrive processes hold {ours} in {} processes",
                c.total,
                c.max_connections,
                c.reserved,
                c.processes.len()
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub(crate) fn print_breakers(deps: &[redrive_store::Dependency]) -> anyhow::Result<()> {
    use redrive_policy::BreakerState;
    let now = chrono::Utc::now();
    outln!(
        "{:<24} {:<15} {:<24} {:<12} PAUSED",
        "DEPENDENCY",
        "BREAKER",
        "NEXT PROBE",
        "RATE LIMIT"
    );
    for d in deps {
        let f = &d.flow;
        let probe = match (f.state, f.open_until) {
            (BreakerState::Open, Some(t)) if t > now => format!("in {}s", (t - now).num_seconds()),
            (BreakerState::HalfOpen, _) => format!("{} probe(s) left", f.probe_permits),
            _ => "-".into(),
        };
        let paused = match f.paused_until {
            Some(_) if f.paused_until_resumed() => "until resumed (operator)".into(),
            Some(t) if t > now => format!(
                "{}s ({})",
                (t - now).num_seconds(),
                f.pause_reason.map_or("", |r| r.as_str())
            ),
            _ => "-".into(),
        };
        let rate = f.rate.map_or_else(|| "-".into(), |r| format!("{r:.1}/s"));
        // As the fleet sees it: `open (forced)` when an operator forced it.
        let state = f.state_label();
        outln!(
            "{:<24} {:<15} {:<24} {:<12} {paused}",
            truncate(&d.name, 24),
            state,
            probe,
            rate
        );
    }
    if deps.is_empty() {
        outln!("(no dependencies seen yet)");
    }
    Ok(())
}

pub(crate) fn breakers(global: &Global, json: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let deps = store.dependencies().await?;
        let events = store.dependency_events(None, 50).await?;
        if json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({"breakers": deps, "transitions": events}))?
            );
        } else {
            print_breakers(&deps)?;
            if !events.is_empty() {
                outln!("recent transitions:");
                for e in &events {
                    outln!(
                        "  {} {:<20} {} → {} ({})",
                        e.at.format("%Y-%m-%d %H:%M:%S"),
                        e.dependency,
                        e.from,
                        e.to,
                        e.reason
                    );
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
