//! The policies a command works with: the built-in presets plus `--policies FILE`, and the
//! `http` kind's egress policy (the file's `[egress]` section plus `--allow-host`,
//! `--deny-host`, `--redirects`).

use std::path::Path;

use anyhow::Context;
use redrive_http::EgressPolicy;
use redrive_http::alerts::{AlertRule, Alerter};
use redrive_policy::PolicySet;

use crate::args::{EgressArgs, Global};
use crate::error::usage;

/// Loads the presets and, if given, the global `--policies` file.
pub(crate) fn load(global: &Global) -> anyhow::Result<PolicySet> {
    Ok(load_with_egress(global)?.0)
}

/// Loads the policies and the file's `[egress]` section (the default without a file).
pub(crate) fn load_with_egress(global: &Global) -> anyhow::Result<(PolicySet, EgressPolicy)> {
    match &global.policies {
        Some(path) => load_file_with_egress(path),
        None => Ok((PolicySet::builtin(), EgressPolicy::default())),
    }
}

/// Loads the presets plus one TOML file. A file that cannot be read is a runtime error; one that
/// is invalid is a usage error naming the field.
pub(crate) fn load_file(path: &Path) -> anyhow::Result<PolicySet> {
    Ok(load_file_with_egress(path)?.0)
}

fn load_file_with_egress(path: &Path) -> anyhow::Result<(PolicySet, EgressPolicy)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    let (egress, rest) = redrive_http::egress::split_policies_toml(&text)
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    let (alerts, rest) = redrive_http::alerts::split_alerts_toml(&rest)
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    let set = PolicySet::from_toml(&rest).map_err(|e| usage(format!("{}: {e}", path.display())))?;
    redrive_http::alerts::check_alert_rules(&alerts, &set)
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    Ok((set, egress))
}

/// The `[[alerts]]` rules of the global `--policies` file (none without a file), checked.
pub(crate) fn load_alerts(global: &Global) -> anyhow::Result<Vec<AlertRule>> {
    let Some(path) = &global.policies else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    let (_, rest) = redrive_http::egress::split_policies_toml(&text)
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    let (alerts, _) = redrive_http::alerts::split_alerts_toml(&rest)
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    Ok(alerts)
}

/// How often a worker process looks for alert events.
pub(crate) const ALERT_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs the alerts of `rules` in the background until `stop` (nothing without rules).
pub(crate) fn spawn_alerts(
    store: redrive_store::Store,
    rules: Vec<AlertRule>,
    set: PolicySet,
    stop: tokio_util::sync::CancellationToken,
) {
    if rules.is_empty() {
        return;
    }
    tokio::spawn(async move {
        let mut alerter = Alerter::new(rules, set, chrono::Utc::now());
        loop {
            if let Err(e) = alerter.tick(&store, chrono::Utc::now()).await {
                eprintln!("redrive: alerts: the store failed ({e}); trying again");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(ALERT_POLL) => {}
            }
        }
    });
}

/// The policies and the egress policy of `work` and `serve`: the file's, then the flags'
/// entries added (a `--redirects` flag replaces the file's mode).
pub(crate) fn load_for_workers(
    global: &Global,
    flags: &EgressArgs,
) -> anyhow::Result<(PolicySet, EgressPolicy)> {
    let (set, mut egress) = load_with_egress(global)?;
    for h in &flags.allow_hosts {
        egress = egress
            .with_allow("--allow-host", h)
            .map_err(|e| usage(e.to_string()))?;
    }
    for h in &flags.deny_hosts {
        egress = egress
            .with_deny("--deny-host", h)
            .map_err(|e| usage(e.to_string()))?;
    }
    if let Some(r) = &flags.redirects {
        let mode = r.parse().map_err(|_| {
            usage(format!(
                "invalid --redirects {r:?}: expected none or same-origin"
            ))
        })?;
        egress = egress.with_redirects(mode);
    }
    Ok((set, egress))
}
