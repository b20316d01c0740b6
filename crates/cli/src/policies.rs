//! The policies a command works with: the built-in presets plus `--policies FILE`, the
//! `http` kind's egress policy (the file's `[egress]` section plus `--allow-host`,
//! `--deny-host`, `--redirects`), the file's periodic jobs (`[[schedules]]`) and its
//! `[payload]` settings.

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
    parse_payload(path, &text)?;
    let rest = without_section(&without_schedules(&rest), "payload");
    let set = PolicySet::from_toml(&rest).map_err(|e| usage(format!("{}: {e}", path.display())))?;
    warn_redefined_presets(path, &rest);
    redrive_http::alerts::check_alert_rules(&alerts, &set)
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    Ok((set, egress))
}

/// A `[policy.payment]` (or another preset's name) in the file replaces the built-in preset
/// for every job that names it, and `payment` is every job's default: legal, and easy to do
/// by mistake (a copied example), so it is said once per load.
fn warn_redefined_presets(path: &Path, text: &str) {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return;
    };
    let Some(policies) = doc.get("policy").and_then(toml::Value::as_table) else {
        return;
    };
    for name in redrive_policy::RetryPolicy::PRESETS {
        if policies.contains_key(*name) {
            tracing::warn!(
                "{}: [policy.{name}] redefines the built-in preset {name:?}: every job that names it{} gets this file's version (use another name, with extends = {name:?}, to keep the preset)",
                path.display(),
                if *name == redrive_policy::PolicySet::DEFAULT_POLICY {
                    " (and every job that names no policy)"
                } else {
                    ""
                }
            );
        }
    }
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

// ===== [[schedules]] (periodic jobs) =====

/// One `[[schedules]]` entry of the policies file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule {
    name: String,
    cron: String,
    queue: String,
    kind: String,
    #[serde(default)]
    payload: Option<toml::Value>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    dependency: Option<String>,
    #[serde(default)]
    priority: Option<i32>,
    #[serde(default)]
    missed: Option<String>,
}

/// Whether a TOML header line opens a section of `[[schedules]]`.
fn is_schedules_header(line: &str) -> bool {
    is_header_of(line, "schedules")
}

/// Whether a TOML header line opens the section `name` (or a table below it).
fn is_header_of(line: &str, name: &str) -> bool {
    let t = line.trim_start();
    let rest = t.trim_start_matches('[').trim_start();
    t.starts_with('[')
        && rest.strip_prefix(name).is_some_and(|after| {
            after.starts_with(']') || after.starts_with('.') || after.starts_with(' ')
        })
}

/// The text with the lines of the section `name` blanked (line numbers kept).
fn without_section(text: &str, name: &str) -> String {
    let mut inside = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with('[') {
                inside = is_header_of(line, name);
            }
            if inside { "" } else { line }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `[payload]` section of the policies file: what `serve` accepts in a job's payload.
///
/// ```toml
/// [payload]
/// refuse_card_data = true   # as serve --refuse-card-data
/// ```
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PayloadSettings {
    /// Refuse (422) a job whose payload carries card data.
    #[serde(default)]
    pub(crate) refuse_card_data: bool,
}

/// The `[payload]` settings of the global `--policies` file (the default without a file or
/// a section); an unknown key or a wrong type is a usage error naming it.
pub(crate) fn payload_settings(global: &Global) -> anyhow::Result<PayloadSettings> {
    let Some(path) = &global.policies else {
        return Ok(PayloadSettings::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    parse_payload(path, &text)
}

/// The `[payload]` section of the file at `path` whose text is `text`.
fn parse_payload(path: &Path, text: &str) -> anyhow::Result<PayloadSettings> {
    let table: toml::Table = toml::from_str(text)
        .map_err(|e| usage(format!("{}: {}", path.display(), e.to_string().trim())))?;
    let Some(raw) = table.get("payload") else {
        return Ok(PayloadSettings::default());
    };
    raw.clone().try_into().map_err(|e: toml::de::Error| {
        usage(format!(
            "{}: payload: {}",
            path.display(),
            e.to_string().trim().replace('\n', " ")
        ))
    })
}

/// The file's text with the lines of its `[[schedules]]` sections blanked (line numbers of
/// the rest kept for error messages), for the policy parser.
fn without_schedules(text: &str) -> String {
    let mut inside = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with('[') {
                inside = is_schedules_header(line);
            }
            if inside { "" } else { line }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `[[schedules]]` of the global `--policies` file (none without one), each checked as a
/// schedule added with `redrive schedule add` would be; a bad entry is a usage error naming
/// `schedules[i].FIELD`.
pub(crate) fn schedules(global: &Global) -> anyhow::Result<Vec<redrive_store::ScheduleSpec>> {
    let Some(path) = &global.policies else {
        return Ok(Vec::new());
    };
    let set = load(global)?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        schedules: Vec<RawSchedule>,
    }
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| usage(format!("{}: {}", path.display(), e.to_string().trim())))?;
    let Some(raw) = table.get("schedules") else {
        return Ok(Vec::new());
    };
    let file: File = toml::Table::from_iter([("schedules".to_owned(), raw.clone())])
        .try_into()
        .map_err(|e: toml::de::Error| {
            usage(format!(
                "{}: schedules: {}",
                path.display(),
                e.to_string().trim().replace('\n', " ")
            ))
        })?;
    let now = chrono::Utc::now();
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, r) in file.schedules.into_iter().enumerate() {
        let at = |field: &str, msg: String| {
            usage(format!("{}: schedules[{i}].{field}: {msg}", path.display()))
        };
        if !names.insert(r.name.clone()) {
            return Err(at("name", format!("{:?} is given twice", r.name)));
        }
        let payload = match r.payload {
            None => serde_json::json!({}),
            Some(v) => serde_json::to_value(v).map_err(|e| at("payload", e.to_string()))?,
        };
        let req = redrive_service::ScheduleRequest {
            name: r.name,
            cron: r.cron,
            queue: r.queue,
            kind: r.kind,
            payload: Some(payload),
            policy: r.policy,
            dependency: r.dependency,
            priority: r.priority,
            missed: r.missed,
        };
        let spec = redrive_service::schedule_spec(&set, &req, now).map_err(|e| match e {
            redrive_http::EnqueueError::Invalid { field, reason, .. } => at(&field, reason),
            other => at("job", other.to_string()),
        })?;
        out.push(spec);
    }
    Ok(out)
}
