//! `redrive quota show KEY`, `redrive quota lift KEY`, and the declines and quota use
//! `redrive show` prints.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use redrive_policy::{Network, PolicySet, format_duration};
use redrive_store::{CardStop, Decline, Reattempt, Store};
use serde::Serialize;

use crate::args::{Global, QuotaCommand, QuotaShowArgs};
use crate::cmd::queue::{block_on, open_existing};
use crate::out::outln;
use crate::policies;

/// One window of a network's quota and what a card key used of it.
#[derive(Debug, Serialize)]
pub(crate) struct WindowUse {
    network: Network,
    window: String,
    max: u32,
    used: u64,
    /// When the oldest reattempt in the window leaves it (the next room when full).
    frees_at: Option<DateTime<Utc>>,
}

/// A card key's quota use.
#[derive(Debug, Serialize)]
pub(crate) struct QuotaUse {
    key: String,
    windows: Vec<WindowUse>,
    reattempts: Vec<Reattempt>,
    /// The key's card stop in force, if a decline stopped it (`null` otherwise).
    card_stop: Option<CardStop>,
}

/// The key's reattempts in each window of every network's quota (from the policies file).
pub(crate) async fn usage_of(
    store: &Store,
    set: &PolicySet,
    key: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<QuotaUse> {
    let (windows, reattempts) = store.quota_use(key, set.quotas(), now).await?;
    let card_stop = store.card_stop(key, now).await?;
    Ok(QuotaUse {
        card_stop,
        key: key.to_owned(),
        windows: windows
            .into_iter()
            .map(|w| WindowUse {
                network: w.network,
                window: format_duration(w.window.window()),
                max: w.window.max(),
                used: w.used,
                frees_at: w.frees_at,
            })
            .collect(),
        reattempts,
    })
}

pub(crate) fn run(global: &Global, cmd: QuotaCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        QuotaCommand::Show(a) => show(global, a),
        QuotaCommand::Lift(a) => lift(global, a),
    }
}

fn lift(global: &Global, a: QuotaShowArgs) -> anyhow::Result<ExitCode> {
    redrive_store::check_quota_key(&a.key).map_err(|e| crate::error::usage(format!("KEY: {e}")))?;
    block_on(async move {
        let store = open_existing(global).await?;
        let actor = crate::cmd::operator::cli_actor();
        let lifted = store.lift_card_stop(&a.key, &actor, Utc::now()).await?;
        if a.json {
            let v = serde_json::json!({"key": a.key, "lifted": lifted});
            outln!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            match &lifted {
                Some(stop) => outln!("lifted: {}", stop.describe()),
                None => outln!("card key {} was not stopped", a.key),
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn show(global: &Global, a: QuotaShowArgs) -> anyhow::Result<ExitCode> {
    redrive_store::check_quota_key(&a.key).map_err(|e| crate::error::usage(format!("KEY: {e}")))?;
    policies::load(global)?;
    block_on(async move {
        let store = open_existing(global).await?;
        let set = policies::source(global, &store).await?.set()?;
        let u = usage_of(&store, &set, &a.key, Utc::now()).await?;
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&u)?);
        } else {
            print_use(&u)?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn print_use(u: &QuotaUse) -> anyhow::Result<()> {
    outln!("quota of card key {}:", u.key);
    if u.windows.is_empty() {
        outln!("  (no quota configured)");
    }
    for w in &u.windows {
        outln!(
            "  {:<10} {:>5}/{:<5} in {:<6}{}",
            w.network.as_str(),
            w.used,
            w.max,
            w.window,
            match (w.used >= u64::from(w.max), w.frees_at) {
                (true, Some(t)) => format!("  full until {}", t.to_rfc3339()),
                _ => String::new(),
            }
        );
    }
    outln!("  reattempts counted: {}", u.reattempts.len());
    if let Some(stop) = &u.card_stop {
        outln!("  STOPPED: {}", stop.describe());
        outln!(
            "  (no job of this key is called; `redrive quota lift {}` ends it)",
            u.key
        );
    }
    Ok(())
}

/// The declines part of `redrive show`.
pub(crate) fn print_declines(declines: &[Decline], quota: Option<&QuotaUse>) -> anyhow::Result<()> {
    if declines.is_empty() && quota.is_none() {
        return Ok(());
    }
    outln!("declines:");
    if declines.is_empty() {
        outln!("  (none)");
    }
    for d in declines {
        outln!(
            "  #{} {} {:<10} code {:<4} category {:<2} advice {:<3} → {}",
            d.attempt,
            d.at.format("%H:%M:%S%.3f"),
            d.network.as_str(),
            d.code.as_deref().unwrap_or("-"),
            d.category.map_or("-".into(), |c| c.to_string()),
            d.advice_code.map_or("-".into(), |m| format!("{m:02}")),
            d.rule
        );
    }
    if let Some(u) = quota {
        print_use(u)?;
    }
    Ok(())
}
