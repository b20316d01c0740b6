//! The queue commands: `migrate`, `enqueue`, `jobs`, `show`, `dead`, `cancel`, `stats`, `breakers`.

use std::process::ExitCode;

use anyhow::Context;
use redrive_store::{Attempt, Job, JobState, ListParams, NewJob, Selection, Store, StoreError};
use serde_json::json;

use crate::args::{
    CancelArgs, DeadCommand, DeadListArgs, DeadSelection, EnqueueArgs, Global, JobsArgs, JsonArgs,
    ShowArgs,
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

/// Opens the store named by `--db`; a malformed URL is a usage error.
pub(crate) async fn open(global: &Global) -> anyhow::Result<Store> {
    match Store::connect(&global.db).await {
        Ok(s) => Ok(s),
        Err(e @ StoreError::BadUrl { .. }) => Err(usage(format!("--db: {e}"))),
        Err(e) => Err(anyhow::Error::new(e).context(format!("opening database {}", global.db))),
    }
}

pub(crate) fn migrate(global: &Global) -> anyhow::Result<ExitCode> {
    block_on(async {
        let store = open(global).await?;
        store.migrate().await?;
        println!("migrated {} ({})", global.db, store.backend());
        Ok(ExitCode::SUCCESS)
    })
}

fn payload(arg: Option<&str>) -> anyhow::Result<serde_json::Value> {
    let Some(raw) = arg else {
        return Ok(json!({}));
    };
    let (text, from) = match raw.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(|e| usage(format!("--payload: cannot read {path}: {e}")))?,
            path.to_owned(),
        ),
        None => (raw.to_owned(), "the value".to_owned()),
    };
    serde_json::from_str(&text)
        .map_err(|e| usage(format!("--payload: {from} is not valid JSON: {e}")))
}

fn new_job(
    global: &Global,
    a: &EnqueueArgs,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<NewJob> {
    let payload = payload(a.payload.as_deref())?;
    let set = policies::load(global)?;
    let policy_name = a.policy.as_deref().unwrap_or("payment");
    let policy = set
        .get(policy_name)
        .map_err(|e| usage(format!("--policy: {e}")))?;
    let mut job = NewJob::new(a.queue.clone(), a.kind.clone(), payload.clone()).with_policy(policy);
    job.key = a.key.clone();
    job.priority = a.priority.unwrap_or(0);
    job.dependency = a.dependency.clone().or_else(|| {
        // `http` jobs default to the URL's host.
        (a.kind == "http")
            .then(|| {
                payload
                    .get("url")
                    .and_then(|u| u.as_str())
                    .and_then(host_of)
            })
            .flatten()
    });
    job.run_at = match (a.delay, a.run_at) {
        (Some(d), _) => {
            Some(now + chrono::Duration::from_std(d).map_err(|_| usage("--delay: too long"))?)
        }
        (None, Some(t)) => Some(t),
        (None, None) => None,
    };
    job.validate()
        .map_err(|e| usage(format!("--{}", flag_of(&e, e.to_string()))))?;
    Ok(job)
}

fn flag_of(e: &StoreError, text: String) -> String {
    match e {
        StoreError::Invalid { field, .. } => {
            let flag = match *field {
                "key" => "key",
                "dependency" => "dependency",
                "kind" => "kind",
                "policy" => "policy",
                _ => "queue",
            };
            if text.contains(field) {
                format!("{flag}: {text}")
            } else {
                text
            }
        }
        _ => text,
    }
}

/// The host of an `http(s)://host[:port]/…` URL.
pub(crate) fn host_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let host = rest.split(['/', '?', '#']).next()?;
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    (!host.is_empty()).then(|| host.to_owned())
}

pub(crate) fn enqueue(global: &Global, a: EnqueueArgs) -> anyhow::Result<ExitCode> {
    let now = chrono::Utc::now();
    let job = new_job(global, &a, now)?;
    block_on(async move {
        let store = open(global).await?;
        let e = store.enqueue(&job, now).await?;
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"created": e.created, "job": e.job}))?
            );
        } else if e.created {
            println!(
                "enqueued job {} on {} ({})",
                e.job.id, e.job.queue, e.job.state
            );
        } else {
            println!(
                "job {} already exists for key {:?} ({})",
                e.job.id,
                e.job.key.as_deref().unwrap_or(""),
                e.job.state
            );
        }
        Ok(ExitCode::SUCCESS)
    })
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
        let store = open(global).await?;
        let page = store
            .list(&ListParams {
                state,
                queue: a.queue.clone(),
                after: a.after,
                limit: Some(a.limit.min(1000)),
                ..Default::default()
            })
            .await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&page)?);
        } else {
            print_jobs(&page.jobs);
            if let Some(n) = page.next {
                println!("more: --after {n}");
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn print_jobs(jobs: &[Job]) {
    println!(
        "{:>8}  {:<12} {:<10} {:<10} {:>8}  {:<20} REASON / ERROR",
        "ID", "QUEUE", "KIND", "STATE", "ATTEMPTS", "RUN AT"
    );
    for j in jobs {
        let why = j
            .dead_reason
            .as_deref()
            .or(j.defer_reason.as_deref())
            .unwrap_or("");
        let err = j
            .last_error
            .as_deref()
            .map(|e| truncate(e, 60))
            .unwrap_or_default();
        println!(
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
        println!("(no jobs)");
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

pub(crate) fn show(global: &Global, a: ShowArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open(global).await?;
        let mut job = store.get(a.id).await?.ok_or(StoreError::NotFound(a.id))?;
        // Secret headers (Authorization, cookies, API keys) never reach the screen.
        job.payload = redrive_http::redact_payload(&job.payload);
        let attempts = store.attempts(a.id).await?;
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"job": job, "attempts": attempts}))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "job {} on {} ({}), policy {}",
            job.id, job.queue, job.kind, job.policy
        );
        println!(
            "  state      {}{}",
            job.state,
            job.dead_reason
                .as_deref()
                .or(job.defer_reason.as_deref())
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
        println!("  key        {}", job.key.as_deref().unwrap_or("-"));
        println!("  dependency {}", job.dependency.as_deref().unwrap_or("-"));
        println!(
            "  attempts   {}/{} (exceptions {}, defers {}, replays {})",
            job.attempts, job.max_attempts, job.exceptions, job.defers, job.replays
        );
        println!("  run at     {}", job.run_at.to_rfc3339());
        if let Some(d) = job.deadline {
            println!("  deadline   {}", d.to_rfc3339());
        }
        if let Some(e) = &job.last_error {
            println!("  last error {e}");
        }
        println!("  payload    {}", job.payload);
        if let Some(r) = &job.result {
            println!("  result     {r}");
        }
        print_attempts(&attempts);
        Ok(ExitCode::SUCCESS)
    })
}

fn print_attempts(attempts: &[Attempt]) {
    println!("attempts:");
    if attempts.is_empty() {
        println!("  (none)");
    }
    for a in attempts {
        let delay = a
            .delay_ms
            .map(|d| {
                format!(
                    "{} {}",
                    a.mode.as_deref().unwrap_or(""),
                    redrive_policy::format_duration(std::time::Duration::from_millis(d))
                )
            })
            .unwrap_or_default();
        println!(
            "  #{}{} {} {:<14} {:>4} {:>6}ms token {} {}{}{}",
            a.number,
            if a.replay > 0 {
                format!(" (replay {})", a.replay)
            } else {
                String::new()
            },
            a.started_at.format("%H:%M:%S%.3f"),
            a.class,
            a.http_status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            a.duration_ms,
            a.lease_token,
            delay,
            if a.counted { "" } else { " (not counted)" },
            a.error
                .as_deref()
                .map(|e| format!(" — {}", truncate(e, 80)))
                .unwrap_or_default(),
        );
    }
}

pub(crate) fn dead(global: &Global, cmd: DeadCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DeadCommand::List(a) => dead_list(global, a),
        DeadCommand::Replay(s) => dead_bulk(global, s, true),
        DeadCommand::Purge(s) => dead_bulk(global, s, false),
    }
}

fn dead_list(global: &Global, a: DeadListArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open(global).await?;
        let page = store
            .list(&ListParams {
                state: Some(JobState::Dead),
                queue: a.queue.clone(),
                limit: Some(a.limit.min(1000)),
                ..Default::default()
            })
            .await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&page)?);
        } else {
            print_jobs(&page.jobs);
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn selection(s: &DeadSelection) -> anyhow::Result<Selection> {
    match (s.all, s.ids.is_empty()) {
        (true, true) => Ok(Selection::All {
            queue: s.queue.clone(),
        }),
        (false, false) => Ok(Selection::Ids(s.ids.clone())),
        (true, false) => Err(usage("give job ids or --all, not both")),
        (false, true) => Err(usage("give job ids or --all")),
    }
}

fn dead_bulk(global: &Global, s: DeadSelection, replay: bool) -> anyhow::Result<ExitCode> {
    let sel = selection(&s)?;
    block_on(async move {
        let store = open(global).await?;
        let n = if replay {
            store.replay(&sel, chrono::Utc::now()).await?
        } else {
            store.purge(&sel).await?
        };
        let verb = if replay { "replayed" } else { "purged" };
        if s.json {
            println!("{}", json!({ verb: n }));
        } else {
            println!("{verb} {n} dead job{}", if n == 1 { "" } else { "s" });
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub(crate) fn cancel(global: &Global, a: CancelArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open(global).await?;
        let job = store.cancel(a.id, chrono::Utc::now()).await?;
        println!("cancelled job {} on {}", job.id, job.queue);
        Ok(ExitCode::SUCCESS)
    })
}

pub(crate) fn stats(global: &Global, a: JsonArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open(global).await?;
        let counts = store.counts().await?;
        let deps = store.dependencies().await?;
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"counts": counts, "breakers": deps}))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        let mut queues: Vec<&str> = counts.iter().map(|c| c.queue.as_str()).collect();
        queues.dedup();
        print!("{:<16}", "QUEUE");
        for s in JobState::ALL {
            print!("{:>11}", s.as_str());
        }
        println!();
        for q in &queues {
            print!("{:<16}", truncate(q, 16));
            for s in JobState::ALL {
                let n = counts
                    .iter()
                    .find(|c| c.queue == *q && c.state == s)
                    .map_or(0, |c| c.count);
                print!("{n:>11}");
            }
            println!();
        }
        if queues.is_empty() {
            println!("(no jobs)");
        }
        print_breakers(&deps);
        Ok(ExitCode::SUCCESS)
    })
}

fn print_breakers(deps: &[redrive_store::Dependency]) {
    use redrive_policy::{BreakerMode, BreakerState};
    let now = chrono::Utc::now();
    println!(
        "{:<24} {:<10} {:<24} {:<12} PAUSED",
        "DEPENDENCY", "BREAKER", "NEXT PROBE", "RATE LIMIT"
    );
    for d in deps {
        let f = &d.flow;
        let probe = match (f.state, f.open_until) {
            (BreakerState::Open, Some(t)) if t > now => format!("in {}s", (t - now).num_seconds()),
            (BreakerState::HalfOpen, _) => format!("{} probe(s) left", f.probe_permits),
            _ => "-".into(),
        };
        let paused = match f.paused_until {
            Some(t) if t > now => format!(
                "{}s ({})",
                (t - now).num_seconds(),
                f.pause_reason.map_or("", |r| r.as_str())
            ),
            _ => "-".into(),
        };
        let rate = f.rate.map_or_else(|| "-".into(), |r| format!("{r:.1}/s"));
        let state = match f.mode {
            BreakerMode::Normal => f.state.as_str(),
            m => m.as_str(),
        };
        println!(
            "{:<24} {:<10} {:<24} {:<12} {paused}",
            truncate(&d.name, 24),
            state,
            probe,
            rate
        );
    }
    if deps.is_empty() {
        println!("(no dependencies seen yet)");
    }
}

pub(crate) fn breakers(global: &Global, a: JsonArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open(global).await?;
        let deps = store.dependencies().await?;
        let events = store.dependency_events(None, 50).await?;
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"breakers": deps, "transitions": events}))?
            );
        } else {
            print_breakers(&deps);
            if !events.is_empty() {
                println!("recent transitions:");
                for e in &events {
                    println!(
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
