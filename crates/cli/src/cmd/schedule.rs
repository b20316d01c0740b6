//! Retention and periodic jobs: `redrive prune`, `redrive schedule add|list|remove`, and the
//! workers' housekeeping flags (`work`, `serve --workers`).

use std::process::ExitCode;

use crate::out::outln;
use redrive_runtime::{Retention, WorkerBuilder};
use redrive_store::{FINISHED_STATES, JobState, Pruned, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::args::{
    Global, HousekeepingArgs, JsonArgs, PruneArgs, ScheduleAddArgs, ScheduleCommand,
    ScheduleRemoveArgs,
};
use crate::cmd::queue::{block_on, open, open_existing};
use crate::error::usage;
use crate::policies;

/// The worker's pruner and scheduler as the flags say.
pub(crate) fn housekeeping(b: WorkerBuilder, a: &HousekeepingArgs) -> WorkerBuilder {
    let retention = (!a.no_prune).then(|| Retention {
        succeeded: a.retention_succeeded.0,
        cancelled: a.retention_cancelled.0,
        dead: a.retention_dead.0,
        every: a.prune_every,
        ..Retention::default()
    });
    let scheduler = (!a.no_scheduler).then_some(redrive_runtime::SCHEDULER_CHECK);
    b.retention(retention).scheduler(scheduler)
}

/// Upserts the policies document's `[[schedules]]` (origin `policies`); returns how many.
pub(crate) async fn upsert_file_schedules(
    source: &policies::Source,
    store: &Store,
) -> anyhow::Result<usize> {
    let specs = source.schedules()?;
    let now = crate::cmd::queue::db_now(store).await;
    for spec in &specs {
        store.upsert_schedule(spec, "policies", now).await?;
    }
    Ok(specs.len())
}

fn states(a: &PruneArgs) -> anyhow::Result<Vec<JobState>> {
    if a.states.is_empty() {
        return Ok(FINISHED_STATES.to_vec());
    }
    let mut out = Vec::new();
    for s in &a.states {
        let st = s
            .parse::<JobState>()
            .ok()
            .filter(|st| FINISHED_STATES.contains(st))
            .ok_or_else(|| {
                usage(format!(
                    "--state: {s:?} is not a finished state; expected succeeded, cancelled or dead"
                ))
            })?;
        if !out.contains(&st) {
            out.push(st);
        }
    }
    Ok(out)
}

/// `redrive prune`.
pub(crate) fn prune(global: &Global, a: PruneArgs) -> anyhow::Result<ExitCode> {
    let states = states(&a)?;
    let now = chrono::Utc::now();
    let defaults = Retention::default();
    let mut cutoffs = Vec::new();
    for st in states {
        let Some(age) = a.older_than.or(defaults.age(st)) else {
            continue;
        };
        let age = chrono::Duration::from_std(age)
            .map_err(|_| usage(format!("--older-than: {age:?} is too long")))?;
        let before = now
            .checked_sub_signed(age)
            .ok_or_else(|| usage("--older-than: too long".to_owned()))?;
        cutoffs.push((st, before));
    }
    block_on(async move {
        let store = open_existing(global).await?;
        let results: Vec<(JobState, Pruned)> = if a.dry_run {
            let mut v = Vec::new();
            for &(st, before) in &cutoffs {
                v.push((st, store.prune_preview(st, before).await?));
            }
            v
        } else {
            let r = Retention {
                batch: a.batch,
                ..Retention::default()
            };
            redrive_runtime::prune(&store, &r, &cutoffs, None, &CancellationToken::new()).await?
        };
        let total: u64 = results.iter().map(|(_, p)| p.jobs).sum();
        if !a.dry_run {
            // An operator change: audited like a bulk purge (a dry run changes nothing).
            let per: Vec<_> = results
                .iter()
                .zip(&cutoffs)
                .map(|((st, p), (_, before))| {
                    json!({"state": st.as_str(), "finished_before": before, "jobs": p.jobs})
                })
                .collect();
            let target = json!({ "states": per });
            let who = crate::cmd::operator::cli_actor();
            store
                .record_audit(&who, "prune", &target, total, now)
                .await?;
        }
        if a.json {
            let per: Vec<_> = results
                .iter()
                .zip(&cutoffs)
                .map(|((st, p), (_, before))| {
                    json!({"state": st.as_str(), "finished_before": before,
                           "jobs": p.jobs, "attempts": p.attempts})
                })
                .collect();
            outln!(
                "{}",
                serde_json::to_string_pretty(
                    &json!({"dry_run": a.dry_run, "states": per, "jobs": total})
                )?
            );
        } else {
            let verb = if a.dry_run { "would delete" } else { "deleted" };
            for ((st, p), (_, before)) in results.iter().zip(&cutoffs) {
                outln!(
                    "{st:<10} {verb} {} jobs and {} attempts finished before {}",
                    p.jobs,
                    p.attempts,
                    before.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `redrive schedule ...`.
pub(crate) fn run(global: &Global, cmd: ScheduleCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ScheduleCommand::Add(a) => add(global, a),
        ScheduleCommand::List(a) => list(global, a),
        ScheduleCommand::Remove(a) => remove(global, a),
    }
}

fn add(global: &Global, a: ScheduleAddArgs) -> anyhow::Result<ExitCode> {
    let payload = crate::cmd::queue::payload(a.payload.as_deref())?;
    let req = redrive_service::ScheduleRequest {
        name: a.name.clone(),
        cron: a.cron.clone(),
        queue: a.queue.clone(),
        kind: a.kind.clone(),
        payload: Some(payload),
        policy: a.policy.clone(),
        dependency: a.dependency.clone(),
        priority: a.priority,
        missed: Some(a.missed.clone()),
    };
    let spec_of = move |set: &redrive_policy::PolicySet| {
        redrive_service::schedule_spec(set, &req, chrono::Utc::now()).map_err(|e| match &e {
            redrive_http::EnqueueError::Invalid {
                field,
                value,
                reason,
            } if ["cron", "missed", "name"].contains(&field.as_str()) => {
                let flag = if field == "name" {
                    "NAME".to_owned()
                } else {
                    format!("--{field}")
                };
                usage(format!("{flag}: {field} {value:?}: {reason}"))
            }
            _ => crate::cmd::queue::flag_error(e),
        })
    };
    // Checked before a database is opened, unless the policy named is one only the stored
    // policies may know.
    let early = policies::load(global)?;
    if global.policies.is_some() || a.policy.as_deref().is_none_or(|p| early.get(p).is_ok()) {
        spec_of(&early)?;
    }
    block_on(async move {
        let store = open(global).await?;
        let spec = spec_of(&policies::source(global, &store).await?.set()?)?;
        // The schedule's next tick is computed in the database's clock (R24).
        let now = crate::cmd::queue::db_now(&store).await;
        let (s, created) = store.upsert_schedule(&spec, "api", now).await?;
        let target = redrive_service::schedule_audit_target(&s, created);
        let who = crate::cmd::operator::cli_actor();
        store
            .record_audit(&who, "schedule_add", &target, 1, now)
            .await?;
        if a.json {
            let view = redrive_service::ScheduleView::from(s);
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({"created": created, "schedule": view}))?
            );
        } else {
            outln!(
                "{} schedule {} ({}, missed: {}): next tick {}",
                if created { "added" } else { "replaced" },
                s.name,
                s.cron,
                s.missed,
                s.next_tick
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_else(|| "none".into())
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn list(global: &Global, a: JsonArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let all = store.schedules().await?;
        if a.json {
            let views: Vec<redrive_service::ScheduleView> =
                all.into_iter().map(Into::into).collect();
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({"schedules": views}))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        if all.is_empty() {
            outln!("no schedules");
            return Ok(ExitCode::SUCCESS);
        }
        let t = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| "-".into())
        };
        outln!(
            "{:<20} {:<18} {:<6} {:<14} {:<10} {:<21} {:<21} origin",
            "name",
            "cron",
            "missed",
            "queue",
            "kind",
            "next tick",
            "last tick"
        );
        for s in all {
            outln!(
                "{:<20} {:<18} {:<6} {:<14} {:<10} {:<21} {:<21} {}",
                s.name,
                s.cron,
                s.missed,
                s.queue,
                s.kind,
                t(s.next_tick),
                t(s.last_tick),
                s.origin
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn remove(global: &Global, a: ScheduleRemoveArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = open_existing(global).await?;
        let mut missing = Vec::new();
        for name in &a.names {
            if store.remove_schedule(name).await? {
                let who = crate::cmd::operator::cli_actor();
                let target = json!({ "name": name });
                let now = chrono::Utc::now();
                store
                    .record_audit(&who, "schedule_remove", &target, 1, now)
                    .await?;
                outln!("removed schedule {name}");
            } else {
                missing.push(name.as_str());
            }
        }
        if missing.is_empty() {
            Ok(ExitCode::SUCCESS)
        } else {
            eprintln!("redrive: no schedule named {}", missing.join(", "));
            Ok(ExitCode::from(1))
        }
    })
}
