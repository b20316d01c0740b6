//! Running workers follow the stored policies (issue 37): `work` and `serve` look for a new
//! version every [`POLICY_POLL`] (one `SELECT MAX(version)`), and on one parse it with the
//! same checks as `--policies FILE` and swap it into the policies their workers and API read
//! ([`LivePolicies`]). The next claim runs under it; a claim under way finishes under the
//! version it started with.
//!
//! What changes live: retry policies, breakers, rate limits, quotas, and the schedules
//! (upserted again). What needs a restart: `[egress]` (the `http` kind's client is built at
//! start), `[[alerts]]` and `[payload]`; a version that changes them says so in a log line.
//!
//! A process started with `--policies FILE` runs its file, whatever is stored: it says at
//! start, and at each new stored version, when the two differ, and `redrive workers` shows
//! it (`file (differs from v3)`).

use std::time::Duration;

use redrive_runtime::LivePolicies;
use redrive_store::{PolicyVersion, Store};
use tokio_util::sync::CancellationToken;

use crate::args::Global;
use crate::policies::Source;

/// How often `work` and `serve` look for a new stored version of the policies.
pub(crate) const POLICY_POLL: Duration = Duration::from_secs(2);

/// The source a worker process starts with, its label for `redrive workers`, and the latest
/// stored version (a warning when a `--policies` file differs from it).
pub(crate) async fn start(
    global: &Global,
    store: &Store,
) -> anyhow::Result<(Source, String, Option<PolicyVersion>)> {
    let source = crate::policies::source(global, store).await?;
    let latest = match &source {
        Source::Stored(v) => Some(v.clone()),
        _ => store.latest_policy_version().await?,
    };
    let label = source.label(latest.as_ref());
    if let (Source::File { .. }, Some(v)) = (&source, &latest)
        && source.text() != Some(v.body.as_str())
    {
        tracing::warn!(
            "{} differs from the stored policies v{} (applied by {} at {}): this process runs the file's; other processes may run v{} (`redrive policy apply {}` stores the file for the fleet)",
            source.name(),
            v.version,
            v.applied_by,
            v.applied_at.format("%Y-%m-%d %H:%M:%S UTC"),
            v.version,
            source.name()
        );
    }
    Ok((source, label, latest))
}

/// Follows the stored versions until `stop`: a new one replaces `live`'s policies (a
/// `--policies` file is kept, and only its label changes).
pub(crate) fn spawn(
    store: Store,
    live: LivePolicies,
    source: Source,
    latest: Option<i64>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut watcher = Watcher {
            store,
            live,
            source,
            seen: latest,
            failing: false,
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(POLICY_POLL) => {}
            }
            watcher.look().await;
        }
    })
}

struct Watcher {
    store: Store,
    live: LivePolicies,
    /// What this process runs.
    source: Source,
    /// The latest stored version seen (applied, or refused and logged once).
    seen: Option<i64>,
    /// The last look failed (logged once until one succeeds).
    failing: bool,
}

impl Watcher {
    async fn look(&mut self) {
        let latest = match self.store.policy_version_number().await {
            Ok(n) => {
                self.failing = false;
                n
            }
            Err(e) => {
                if !self.failing {
                    tracing::warn!("looking for a new version of the policies failed: {e}");
                }
                self.failing = true;
                return;
            }
        };
        if latest <= self.seen {
            return;
        }
        let Some(number) = latest else { return };
        let version = match self.store.policy_version(number).await {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("reading the policies v{number} failed: {e}; trying again");
                return;
            }
        };
        self.seen = Some(number);
        if let Source::File { .. } = &self.source {
            let label = self.source.label(Some(&version));
            if self.source.text() != Some(version.body.as_str()) {
                tracing::warn!(
                    "policies v{number} were applied by {}: this process still runs {} (started with --policies), which differs",
                    version.applied_by,
                    self.source.name()
                );
            }
            self.live.relabel(Some(label));
            return;
        }
        let next = Source::Stored(version);
        let set = match next.set() {
            Ok(set) => set,
            Err(e) => {
                tracing::error!(
                    "policies v{number} cannot be used by this process ({e:#}); it keeps running {}",
                    self.live.label().unwrap_or_default()
                );
                return;
            }
        };
        let restart = restart_sections(self.source.text(), next.text());
        self.live.replace(set, Some(format!("v{number}")));
        tracing::warn!(
            "policies v{number} in force (was {}): retry policies, breakers, rate limits and quotas apply from the next claim",
            self.source.name()
        );
        if !restart.is_empty() {
            tracing::warn!(
                "policies v{number} change {}: this process keeps the old settings until it restarts",
                restart.join(", ")
            );
        }
        match next.schedules() {
            Ok(specs) => {
                let now = crate::cmd::queue::db_now(&self.store).await;
                for spec in &specs {
                    if let Err(e) = self.store.upsert_schedule(spec, "policies", now).await {
                        tracing::warn!("upserting schedule {:?} failed: {e}", spec.name);
                    }
                }
            }
            Err(e) => tracing::warn!("the schedules of policies v{number}: {e:#}"),
        }
        self.source = next;
    }
}

/// The sections of the document that a running process does not reload and that differ
/// between `old` and `new` (`[egress]`, `[[alerts]]`, `[payload]`).
fn restart_sections(old: Option<&str>, new: Option<&str>) -> Vec<&'static str> {
    let table = |t: Option<&str>| -> toml::Table {
        t.and_then(|t| t.parse::<toml::Table>().ok())
            .unwrap_or_default()
    };
    let (old, new) = (table(old), table(new));
    [
        ("egress", "[egress]"),
        ("alerts", "[[alerts]]"),
        ("payload", "[payload]"),
    ]
    .into_iter()
    .filter(|(key, _)| old.get(*key) != new.get(*key))
    .map(|(_, shown)| shown)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sections_that_need_a_restart_and_changed_are_named() {
        let a = "[policy.x]\n[egress]\nallow_hosts = [\"a.example\"]\n";
        let b = "[policy.y]\n[egress]\nallow_hosts = [\"a.example\"]\n";
        assert!(restart_sections(Some(a), Some(b)).is_empty());
        let c = "[egress]\nallow_hosts = [\"b.example\"]\n[payload]\nrefuse_card_data = true\n";
        assert_eq!(
            restart_sections(Some(a), Some(c)),
            ["[egress]", "[payload]"]
        );
        assert_eq!(restart_sections(None, Some(a)), ["[egress]"]);
    }
}
