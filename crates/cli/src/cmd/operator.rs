//! The operator commands: `queue pause|resume|list`, `dependency pause|resume`,
//! `breakers [force]`, `run-now`, the bulk actions by filter (`dead replay|purge`, `cancel`)
//! and `audit`. Every change is written to the audit trail by the store, in the same
//! transaction, with the operating-system user as the actor.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use redrive_policy::BreakerMode;
use redrive_store::{
    Actor, BulkAction, BulkOutcome, DependencyOp, JobFilter, JobState, MAX_BATCH, Store,
};
use serde_json::json;

use crate::args::{
    AuditArgs, BreakersArgs, BreakersCommand, BulkArgs, CancelArgs, DeadSelection,
    DependencyCommand, Global, QueueCommand, RunNowArgs, Until,
};
use crate::cmd::queue::{block_on, open_existing, print_breakers};
use crate::error::usage;
use crate::out::outln;

/// The CLI's actor: the operating-system user.
pub(crate) fn cli_actor() -> Actor {
    let user = ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
        .or_else(passwd_user)
        .unwrap_or_else(|| "unknown".into());
    Actor::new(user, "cli")
}

/// The name of this process's user in `/etc/passwd` (when no environment variable names it),
/// else `uid N`.
#[cfg(unix)]
fn passwd_user() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let name = passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)? == uid.to_string()).then(|| name.to_owned())
    });
    Some(name.unwrap_or_else(|| format!("uid {uid}")))
}

#[cfg(not(unix))]
fn passwd_user() -> Option<String> {
    None
}

/// The filter of a bulk command: ids (if any) and every filter flag given.
fn filter_of(ids: &[i64], b: &BulkArgs) -> anyhow::Result<JobFilter> {
    if b.all && !ids.is_empty() {
        return Err(usage("give job ids or --all, not both"));
    }
    let f = JobFilter {
        ids: (!ids.is_empty()).then(|| ids.to_vec()),
        queue: b.queue.clone(),
        kind: b.kind.clone(),
        dependency: b.dependency.clone(),
        dead_reason: b.dead_reason.clone(),
        signature: b.signature.clone(),
    };
    if f.is_empty() && !b.all {
        return Err(usage("give job ids, --all or a filter"));
    }
    if let Err(e) = f.validate() {
        return Err(usage(format!("{e}")));
    }
    Ok(f)
}

/// One id a bulk command could not act on, and why.
#[derive(Debug, serde::Serialize)]
struct Skipped {
    id: i64,
    reason: String,
}

/// Why the action did not take `id`.
async fn why_not(store: &Store, action: BulkAction, id: i64) -> anyhow::Result<String> {
    let Some(j) = store.get(id).await? else {
        return Ok("no such job".into());
    };
    let now = chrono::Utc::now();
    Ok(match action {
        BulkAction::Replay | BulkAction::Purge if j.state != JobState::Dead => {
            format!("{}, not dead", j.state)
        }
        BulkAction::Cancel if !action.states().contains(&j.state) => {
            format!("already {}", j.state)
        }
        BulkAction::RunNow if !action.states().contains(&j.state) => {
            format!("{}, not waiting", j.state)
        }
        BulkAction::RunNow if j.run_at <= now => "already due".into(),
        _ => "does not match the filter".into(),
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Asks on the terminal before a purge; refuses without `--yes` when stdin is not one.
fn confirm_purge(n: usize, what: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Err(usage(
            "dead purge deletes jobs and their history for good: add --yes to confirm (or --dry-run to see what it would delete)",
        ));
    }
    eprint!(
        "purge {n} dead job{} ({what}) and their history for good? [y/N] ",
        plural(n)
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

/// Runs one bulk action and prints it: `dead replay`, `dead purge`, `cancel`, `run-now`.
async fn bulk(
    global: &Global,
    action: BulkAction,
    ids: &[i64],
    b: &BulkArgs,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    let mut filter = filter_of(ids, b)?;
    let (verb, would, noun) = match action {
        BulkAction::Replay => ("replayed", "would replay", "dead job"),
        BulkAction::Purge => ("purged", "would purge", "dead job"),
        BulkAction::Cancel => ("cancelled", "would cancel", "job"),
        BulkAction::RunNow => ("brought_forward", "would bring forward", "job"),
    };
    let store = open_existing(global).await?;
    let actor = cli_actor();
    let now = crate::cmd::queue::db_now(&store).await;
    if action == BulkAction::Purge && !b.dry_run && !yes {
        let targets = store.bulk(action, &filter, &actor, true, now).await?.ids;
        if !targets.is_empty() {
            let what = if filter.ids.is_some() {
                format!(
                    "ids {}",
                    targets
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            } else if filter == JobFilter::default() {
                "all".to_owned()
            } else {
                format!("filter {}", serde_json::to_string(&filter)?)
            };
            if !confirm_purge(targets.len(), &what)? {
                eprintln!("nothing purged");
                return Ok(ExitCode::from(1));
            }
            // Exactly what was confirmed (when it can be named by ids).
            if targets.len() <= MAX_BATCH {
                filter.ids = Some(targets);
            }
        }
    }
    let out: BulkOutcome = store.bulk(action, &filter, &actor, b.dry_run, now).await?;
    let mut skipped = Vec::new();
    for &id in ids {
        if !out.ids.contains(&id) && !skipped.iter().any(|s: &Skipped| s.id == id) {
            skipped.push(Skipped {
                id,
                reason: why_not(&store, action, id).await?,
            });
        }
    }
    if b.json {
        outln!(
            "{}",
            json!({ verb: out.count, "ids": out.ids, "skipped": skipped, "dry_run": out.dry_run })
        );
    } else if out.dry_run {
        for id in &out.ids {
            outln!("{would} job {id}");
        }
        outln!(
            "{would} {} {noun}{} (dry run: nothing changed)",
            out.count,
            plural(out.count as usize)
        );
    } else {
        if action == BulkAction::Cancel {
            for id in &out.ids {
                outln!("cancelled job {id}");
            }
        }
        outln!(
            "{} {} {noun}{}",
            verb.replace('_', " "),
            out.count,
            plural(out.count as usize)
        );
    }
    Ok(skipped_exit(&skipped))
}

/// Exit 1, with one line naming every skipped id, when any was skipped.
fn skipped_exit(skipped: &[Skipped]) -> ExitCode {
    if skipped.is_empty() {
        return ExitCode::SUCCESS;
    }
    let list: Vec<String> = skipped
        .iter()
        .map(|k| format!("{} ({})", k.id, k.reason))
        .collect();
    eprintln!(
        "redrive: skipped {} job{}: {}",
        skipped.len(),
        plural(skipped.len()),
        list.join(", ")
    );
    ExitCode::from(1)
}

/// `dead replay` and `dead purge`.
pub(crate) fn dead_bulk(
    global: &Global,
    s: DeadSelection,
    replay: bool,
) -> anyhow::Result<ExitCode> {
    let action = if replay {
        BulkAction::Replay
    } else {
        BulkAction::Purge
    };
    block_on(async move { bulk(global, action, &s.ids, &s.bulk, s.yes).await })
}

/// `cancel`.
pub(crate) fn cancel(global: &Global, a: CancelArgs) -> anyhow::Result<ExitCode> {
    block_on(async move { bulk(global, BulkAction::Cancel, &a.ids, &a.bulk, true).await })
}

/// `run-now`.
pub(crate) fn run_now(global: &Global, a: RunNowArgs) -> anyhow::Result<ExitCode> {
    block_on(async move { bulk(global, BulkAction::RunNow, &a.ids, &a.bulk, true).await })
}

/// `queue pause|resume|list`.
pub(crate) fn queue(global: &Global, c: QueueCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let now = crate::cmd::queue::db_now(&store).await;
        let (a, pause) = match c {
            QueueCommand::Pause(a) => (a, true),
            QueueCommand::Resume(a) => (a, false),
            QueueCommand::List(a) => {
                let paused = store.paused_queues().await?;
                if a.json {
                    outln!(
                        "{}",
                        serde_json::to_string_pretty(&json!({ "paused": paused }))?
                    );
                } else if paused.is_empty() {
                    outln!("(no paused queue)");
                } else {
                    outln!("{:<24} {:<26} BY", "QUEUE", "PAUSED AT");
                    for p in paused {
                        outln!(
                            "{:<24} {:<26} {}",
                            p.queue,
                            p.paused_at.format("%Y-%m-%d %H:%M:%S UTC"),
                            p.paused_by
                        );
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
        };
        let actor = cli_actor();
        let res = if pause {
            store.pause_queue(&a.queue, &actor, now).await
        } else {
            store.resume_queue(&a.queue, &actor, now).await
        };
        let changed = res.map_err(|e| match e {
            e @ redrive_store::StoreError::Invalid { .. } => usage(format!("QUEUE: {e}")),
            e => e.into(),
        })?;
        if a.json {
            outln!(
                "{}",
                json!({"queue": a.queue, "paused": pause, "changed": changed})
            );
        } else {
            match (pause, changed) {
                (true, true) => outln!(
                    "paused queue {}: workers claim nothing from it (running jobs finish)",
                    a.queue
                ),
                (true, false) => outln!("queue {} was already paused", a.queue),
                (false, true) => outln!("resumed queue {}", a.queue),
                (false, false) => outln!("queue {} was not paused", a.queue),
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

async fn operate(
    global: &Global,
    name: &str,
    op: DependencyOp,
    json: bool,
) -> anyhow::Result<redrive_store::Dependency> {
    let store = open_existing(global).await?;
    let now = crate::cmd::queue::db_now(&store).await;
    let d = store
        .operate_dependency(name, op, &cli_actor(), now)
        .await
        .map_err(|e| match e {
            e @ redrive_store::StoreError::Invalid { .. } => usage(format!("{e}")),
            e => e.into(),
        })?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&d)?);
    }
    Ok(d)
}

/// `dependency pause|resume`.
pub(crate) fn dependency(global: &Global, c: DependencyCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        match c {
            DependencyCommand::Pause(a) => {
                // A pause `--for D` ends D after now in the database's clock, as the fleet
                // reads it (R24); an `--until` time is the operator's own.
                let now = match a.until {
                    Some(Until::In(_)) => {
                        crate::cmd::queue::db_now(&open_existing(global).await?).await
                    }
                    _ => chrono::Utc::now(),
                };
                let until = a.until.map(|u| match u {
                    Until::At(t) => t,
                    Until::In(d) => now + chrono::Duration::from_std(d).unwrap_or_default(),
                });
                if let Some(t) = until
                    && t <= now
                {
                    return Err(usage(format!(
                        "--until: {} is not in the future",
                        t.to_rfc3339()
                    )));
                }
                let d = operate(global, &a.name, DependencyOp::Pause { until }, a.json).await?;
                if !a.json {
                    match until {
                        None => outln!("paused dependency {} until resumed", d.name),
                        Some(_) => outln!(
                            "paused dependency {} until {}",
                            d.name,
                            d.flow
                                .paused_until
                                .map(|t| t.to_rfc3339())
                                .unwrap_or_default()
                        ),
                    }
                }
            }
            DependencyCommand::Resume(a) => {
                let d = operate(global, &a.name, DependencyOp::Resume, a.json).await?;
                if !a.json {
                    outln!("resumed dependency {}", d.name);
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `breakers` (list) and `breakers force`.
pub(crate) fn breakers(global: &Global, a: BreakersArgs) -> anyhow::Result<ExitCode> {
    let Some(BreakersCommand::Force(f)) = a.command else {
        return crate::cmd::queue::breakers(global, a.json);
    };
    let mode = match f.mode.as_str() {
        "open" => BreakerMode::ForcedOpen,
        "closed" => BreakerMode::ForcedClosed,
        _ => BreakerMode::Normal,
    };
    block_on(async move {
        let d = operate(global, &f.name, DependencyOp::Force(mode), f.json).await?;
        if !f.json {
            match mode {
                BreakerMode::Normal => outln!(
                    "breaker of {} back to automatic (closed, from a clean start)",
                    d.name
                ),
                _ => outln!(
                    "breaker of {} forced {} for the whole fleet (until `breakers force {} auto`)",
                    d.name,
                    f.mode,
                    d.name
                ),
            }
            print_breakers(std::slice::from_ref(&d))?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `audit`.
pub(crate) fn audit(global: &Global, a: AuditArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let rows = store.audit(a.before, a.limit).await?;
        if a.json {
            let next = (rows.len() == a.limit as usize)
                .then(|| rows.last().map(|r| r.id))
                .flatten();
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({"audit": rows, "next": next}))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        outln!(
            "{:>6}  {:<20} {:<16} {:<10} {:<18} {:>6}  TARGET",
            "ID",
            "AT",
            "ACTOR",
            "VIA",
            "ACTION",
            "ROWS"
        );
        for r in &rows {
            outln!(
                "{:>6}  {:<20} {:<16} {:<10} {:<18} {:>6}  {}",
                r.id,
                r.at.format("%Y-%m-%d %H:%M:%S"),
                r.actor,
                r.via,
                r.action,
                r.rows,
                r.target
            );
        }
        if rows.is_empty() {
            outln!("(no operator action yet)");
        }
        Ok(ExitCode::SUCCESS)
    })
}
