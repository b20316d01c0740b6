//! `redrive idempotency list|recover`: the `Idempotency-Key`s that `redrive serve` keeps for
//! `POST /v1/jobs` in the job store's database, and the release of stuck ones (keys whose
//! request vanished, killed or crashed, before it answered).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use redrive_idempotency::{
    IdempotencyKey, IdempotencyStore, ListFilter, ListRequest, RecordId, ReleaseOutcome,
    release_stuck,
};
use redrive_service::IdempotencyRecordView;
use redrive_store::Store;
use serde_json::json;

use crate::args::{Global, IdempotencyCommand, IdempotencyListArgs, IdempotencyRecoverArgs};
use crate::cmd::queue::{block_on, open_existing};
use crate::error::usage;
use crate::out::outln;

pub(crate) fn run(global: &Global, cmd: IdempotencyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        IdempotencyCommand::List(a) => list(global, a),
        IdempotencyCommand::Recover(a) => recover(global, a),
    }
}

/// The idempotency records in the store's own database, as `redrive serve` keeps them.
async fn records(global: &Global) -> anyhow::Result<Arc<dyn IdempotencyStore>> {
    let store = open_existing(global).await?;
    let idem: Arc<dyn IdempotencyStore> = match &store {
        Store::Sqlite(s) => Arc::new(redrive_idempotency::SqliteIdempotencyStore::from_pool(
            s.pool().clone(),
        )),
        Store::Postgres(p) => Arc::new(redrive_idempotency::PostgresIdempotencyStore::from_pool(
            p.pool().clone(),
        )),
    };
    idem.ensure_schema()
        .await
        .context("preparing the idempotency table")?;
    Ok(idem)
}

fn list(global: &Global, a: IdempotencyListArgs) -> anyhow::Result<ExitCode> {
    let filter = if a.stuck {
        ListFilter::Stuck
    } else {
        match a.state.as_deref() {
            None => ListFilter::All,
            Some(s) => s
                .parse::<ListFilter>()
                .map_err(|e| usage(format!("--state: {e}")))?,
        }
    };
    if let Some(n) = a.after
        && n < 0
    {
        return Err(usage(format!("--after: {n} is not a record id (>= 0)")));
    }
    block_on(async move {
        let idem = records(global).await?;
        let request = ListRequest {
            filter,
            scope: Some(a.scope.clone()),
            after: a.after.map(RecordId),
            limit: a.limit,
        };
        let found = idem.list(&request).await?;
        let next = (found.len() == request.effective_limit() as usize)
            .then(|| found.last().map(|r| r.info.id.0))
            .flatten();
        let views: Vec<IdempotencyRecordView> = found.into_iter().map(Into::into).collect();
        if a.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({ "records": views, "next": next }))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        outln!(
            "{:>8}  {:<11} {:<6} {:>8}  {:<20} KEY",
            "ID",
            "STATE",
            "STUCK",
            "ATTEMPTS",
            "LAST RUN"
        );
        for v in &views {
            let state = if v.running { "running" } else { &v.state };
            outln!(
                "{:>8}  {:<11} {:<6} {:>8}  {:<20} {}",
                v.id,
                state,
                if v.stuck { "yes" } else { "" },
                v.attempts,
                v.last_run_at
                    .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                    .unwrap_or_default(),
                v.key
            );
        }
        if views.is_empty() {
            outln!(
                "(no {}idempotency keys)",
                if filter == ListFilter::All {
                    String::new()
                } else {
                    format!("{} ", filter.as_str().replace('_', " "))
                }
            );
        }
        if let Some(n) = next {
            outln!("more: --after {n}");
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn recover(global: &Global, a: IdempotencyRecoverArgs) -> anyhow::Result<ExitCode> {
    let mut keys = Vec::with_capacity(a.keys.len());
    for k in &a.keys {
        let parsed = IdempotencyKey::parse(k.as_bytes()).map_err(|e| {
            usage(format!(
                "KEY {k:?}: {}",
                e.to_string().replace("header `Idempotency-Key`", "the key")
            ))
        })?;
        keys.push(parsed.as_str().to_owned());
    }
    block_on(async move {
        let idem = records(global).await?;
        if a.all_stuck {
            // Every stuck key, a page at a time (a released key is no longer stuck).
            let mut after = None;
            loop {
                let page = idem
                    .list(&ListRequest {
                        filter: ListFilter::Stuck,
                        scope: Some(a.scope.clone()),
                        after,
                        limit: redrive_idempotency::MAX_LIST,
                    })
                    .await?;
                let Some(last) = page.last() else { break };
                after = Some(last.info.id);
                keys.extend(page.into_iter().map(|r| r.key));
            }
        }
        let mut released = Vec::new();
        let mut skipped = Vec::new();
        for key in keys {
            let why = match release_stuck(&*idem, &a.scope, &key).await? {
                ReleaseOutcome::Released(_) => {
                    released.push(key);
                    continue;
                }
                ReleaseOutcome::NotFound => "no such key",
                ReleaseOutcome::Completed => "completed: a repeat gets its response",
                ReleaseOutcome::Running => "its request is still running",
                _ => "not recoverable",
            };
            skipped.push((key, why));
        }
        if a.json {
            let skipped: Vec<_> = skipped
                .iter()
                .map(|(k, why)| json!({ "key": k, "reason": why }))
                .collect();
            outln!("{}", json!({ "released": released, "skipped": skipped }));
        } else {
            for k in &released {
                outln!("released {k}: its next request enqueues again");
            }
            if released.is_empty() && skipped.is_empty() {
                outln!("no stuck idempotency keys");
            }
        }
        if skipped.is_empty() {
            return Ok(ExitCode::SUCCESS);
        }
        let list: Vec<String> = skipped
            .iter()
            .map(|(k, why)| format!("{k} ({why})"))
            .collect();
        eprintln!(
            "redrive: skipped {} key{}: {}",
            skipped.len(),
            if skipped.len() == 1 { "" } else { "s" },
            list.join(", ")
        );
        Ok(ExitCode::from(1))
    })
}
