//! `redrive enqueue --file FILE`: the jobs of an NDJSON file (one job object per line, the
//! fields of `POST /v1/jobs`), enqueued in transactions of
//! [`MAX_BATCH_JOBS`] straight into the database.
//!
//! Every line is parsed and validated first, by the API's own parser
//! ([`redrive_service::parse_job_object`]) with the policies `enqueue` uses: a bad line is a
//! usage error (exit 2) naming its number and field, and nothing is enqueued. Only then are the
//! jobs written, a transaction per 1,000 ([`Store::enqueue_many_exact`]): a job whose queue
//! and key exist already is not enqueued again (counted as `existing`), so running the same
//! file twice creates nothing twice; a key already used by another request (another kind or
//! payload) stops the run there (exit 1, naming the line; the transactions before it stay).

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use redrive_service::MAX_BATCH_JOBS;
use redrive_store::{NewJob, Store};
use serde::Serialize;
use serde_json::Value;

use crate::args::Global;
use crate::cmd::queue::{block_on, db_now, open};
use crate::error::usage;
use crate::out::outln;
use crate::policies;

/// Bad lines named in one error (the count says how many more).
const SHOWN_BAD_LINES: usize = 10;

/// One job of the file: its line number (from 1) and its object.
struct Line {
    number: usize,
    object: serde_json::Map<String, Value>,
}

/// One enqueued line, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Outcome {
    line: usize,
    id: i64,
    created: bool,
    state: String,
}

/// Reads the whole input: the file, or standard input for `-`.
fn read_input(path: &str) -> anyhow::Result<String> {
    let mut text = String::new();
    if path == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the jobs from standard input")?;
    } else {
        let mut f = std::fs::File::open(path)
            .map_err(|e| usage(format!("--file: cannot read {path}: {e}")))?;
        if f.metadata().is_ok_and(|m| m.is_dir()) {
            return Err(usage(format!("--file: {path} is a directory")));
        }
        f.read_to_string(&mut text)
            .map_err(|e| usage(format!("--file: cannot read {path} as UTF-8 text: {e}")))?;
    }
    Ok(text)
}

/// The job objects of the input, blank lines skipped; every malformed line is named.
fn split_lines(text: &str, from: &str) -> anyhow::Result<Vec<Line>> {
    let mut lines = Vec::new();
    let mut bad = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let number = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(object)) => lines.push(Line { number, object }),
            Ok(_) => bad.push(format!("line {number}: a job must be a JSON object")),
            Err(e) => bad.push(format!("line {number}: not valid JSON: {e}")),
        }
    }
    refuse(bad, from)?;
    Ok(lines)
}

/// A usage error listing the bad lines (at most [`SHOWN_BAD_LINES`]), or `Ok` for none.
fn refuse(bad: Vec<String>, from: &str) -> anyhow::Result<()> {
    if bad.is_empty() {
        return Ok(());
    }
    let more = bad.len().saturating_sub(SHOWN_BAD_LINES);
    let mut msg = format!(
        "--file {from}: {} bad line(s), nothing enqueued:\n  {}",
        bad.len(),
        bad[..bad.len().min(SHOWN_BAD_LINES)].join("\n  ")
    );
    if more > 0 {
        msg.push_str(&format!("\n  … and {more} more"));
    }
    Err(usage(msg))
}

/// Every line as a validated job, as `POST /v1/jobs` validates its body.
fn parse_jobs(
    set: &redrive_policy::PolicySet,
    refuse_card_data: bool,
    lines: &[Line],
    from: &str,
    now: redrive_store::Timestamp,
) -> anyhow::Result<Vec<NewJob>> {
    let mut jobs = Vec::with_capacity(lines.len());
    let mut bad = Vec::new();
    for l in lines {
        match redrive_service::parse_job_object(set, refuse_card_data, l.object.clone(), None, now)
        {
            Ok(job) => jobs.push(job),
            Err(e) => {
                let field = e.field.as_deref().unwrap_or("job");
                // The detail names the field already for most refusals; say it once.
                if e.detail.starts_with(field) {
                    bad.push(format!("line {}: {}", l.number, e.detail));
                } else {
                    bad.push(format!("line {}: {field}: {}", l.number, e.detail));
                }
            }
        }
    }
    refuse(bad, from)?;
    Ok(jobs)
}

/// `redrive enqueue --file PATH` (`-`: standard input).
pub(crate) fn run(global: &Global, path: &str, json: bool) -> anyhow::Result<ExitCode> {
    let from = if path == "-" { "standard input" } else { path };
    let text = read_input(path)?;
    let lines = split_lines(&text, from)?;
    drop(text);
    // With `--policies FILE`, checked before connecting (bad input needs no database); built
    // (again) on the database's clock with the policies in force: the file, else the stored
    // version (a policy only the database knows is checked there), else built-in.
    if let Some(file) = policies::Source::file(global)? {
        let refuse = file.payload()?.refuse_card_data;
        parse_jobs(&file.set()?, refuse, &lines, from, chrono::Utc::now())?;
    }
    block_on(async move {
        let store = open(global).await?;
        let now = db_now(&store).await;
        // `[payload] refuse_card_data` holds here as in the API: a line with card data is
        // refused like any other bad line.
        let source = policies::source(global, &store).await?;
        let refuse = source.payload()?.refuse_card_data;
        let jobs = parse_jobs(&source.set()?, refuse, &lines, from, now)?;
        let outcomes = enqueue_all(&store, &jobs, &lines, now).await?;
        let created = outcomes.iter().filter(|o| o.created).count();
        let existing = outcomes.len() - created;
        if json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "enqueued": created,
                    "existing": existing,
                    "jobs": outcomes,
                }))?
            );
        } else {
            outln!("enqueued {created}, existing {existing}");
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Writes the jobs in transactions of [`MAX_BATCH_JOBS`], in file order.
async fn enqueue_all(
    store: &Store,
    jobs: &[NewJob],
    lines: &[Line],
    now: redrive_store::Timestamp,
) -> anyhow::Result<Vec<Outcome>> {
    let mut outcomes = Vec::with_capacity(jobs.len());
    for (chunk, chunk_lines) in jobs
        .chunks(MAX_BATCH_JOBS)
        .zip(lines.chunks(MAX_BATCH_JOBS))
    {
        match store.enqueue_many_exact(chunk, now).await? {
            Ok(out) => {
                outcomes.extend(out.into_iter().zip(chunk_lines).map(|(e, l)| Outcome {
                    line: l.number,
                    id: e.job.id,
                    created: e.created,
                    state: e.job.state.to_string(),
                }));
            }
            Err(taken) => {
                let line = chunk_lines[taken.index].number;
                let why = redrive_http::check_same_request(&chunk[taken.index], &taken.existing)
                    .err()
                    .map_or_else(
                        || "its key is used by another job".into(),
                        |e| e.to_string(),
                    );
                let done = outcomes.iter().filter(|o| o.created).count();
                anyhow::bail!(
                    "line {line}: {why}; the transaction of lines {}..={} was rolled back \
                     ({done} job(s) of the lines before it were enqueued: a rerun skips those \
                     with a key)",
                    chunk_lines[0].number,
                    chunk_lines[chunk_lines.len() - 1].number,
                );
            }
        }
    }
    Ok(outcomes)
}
