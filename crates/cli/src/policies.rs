//! The policies a command works with: the built-in presets plus one policies document
//! ([`Source`]: `--policies FILE`, else the latest version stored by `redrive policy apply`),
//! the `http` kind's egress policy (the document's `[egress]` section plus `--allow-host`,
//! `--deny-host`, `--redirects`), its periodic jobs (`[[schedules]]`) and its `[payload]`
//! settings. A stored version is parsed with exactly the checks a file gets.

use std::path::{Path, PathBuf};

use anyhow::Context;
use redrive_http::EgressPolicy;
use redrive_http::alerts::{AlertRule, Alerter};
use redrive_policy::PolicySet;
use redrive_store::{PolicyVersion, Store};

use crate::args::{EgressArgs, Global};
use crate::error::usage;

/// Where a command's policies document comes from: `--policies FILE` if given, else the
/// latest version stored in the database (`redrive policy apply`), else none (the built-in
/// presets, the default breaker, no egress entries, alerts or schedules).
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// `--policies FILE` / `REDRIVE_POLICIES`, read once.
    File {
        /// The file.
        path: PathBuf,
        /// Its text.
        text: String,
    },
    /// A stored version.
    Stored(PolicyVersion),
    /// Neither.
    Builtin,
}

impl Source {
    /// The `--policies` file, read (`None`: no file given).
    pub(crate) fn file(global: &Global) -> anyhow::Result<Option<Source>> {
        let Some(path) = &global.policies else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read policy file {}", path.display()))?;
        Ok(Some(Source::File {
            path: path.clone(),
            text,
        }))
    }

    /// The document's text (`None`: built-in).
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Source::File { text, .. } => Some(text),
            Source::Stored(v) => Some(&v.body),
            Source::Builtin => None,
        }
    }

    /// How messages name it: the file's path, or `policies v3`.
    pub(crate) fn name(&self) -> String {
        match self {
            Source::File { path, .. } => path.display().to_string(),
            Source::Stored(v) => format!("policies v{}", v.version),
            Source::Builtin => "the built-in policies".into(),
        }
    }

    /// What `redrive workers` shows for a process running this source, given the latest
    /// stored version: `v3`, `file (same as v3)`, `file (differs from v3)`, `file (none
    /// stored)`, `built-in`.
    pub(crate) fn label(&self, latest: Option<&PolicyVersion>) -> String {
        match (self, latest) {
            (Source::Stored(v), _) => format!("v{}", v.version),
            (Source::File { text, .. }, Some(l)) if *text == l.body => {
                format!("file (same as v{})", l.version)
            }
            (Source::File { .. }, Some(l)) => format!("file (differs from v{})", l.version),
            (Source::File { .. }, None) => "file (none stored)".into(),
            (Source::Builtin, _) => "built-in".into(),
        }
    }

    /// The policies: the presets plus the document's (a usage error naming the field).
    pub(crate) fn set(&self) -> anyhow::Result<PolicySet> {
        Ok(self.set_with_egress()?.0)
    }

    /// The policies and the document's `[egress]` section (the default without one).
    pub(crate) fn set_with_egress(&self) -> anyhow::Result<(PolicySet, EgressPolicy)> {
        match self.text() {
            Some(text) => parse_document(&self.name(), text),
            None => Ok((PolicySet::builtin(), EgressPolicy::default())),
        }
    }

    /// The document's `[[alerts]]` rules (none without a document).
    pub(crate) fn alerts(&self) -> anyhow::Result<Vec<AlertRule>> {
        let Some(text) = self.text() else {
            return Ok(Vec::new());
        };
        let name = self.name();
        let (_, rest) = redrive_http::egress::split_policies_toml(text)
            .map_err(|e| usage(format!("{name}: {e}")))?;
        let (alerts, _) = redrive_http::alerts::split_alerts_toml(&rest)
            .map_err(|e| usage(format!("{name}: {e}")))?;
        Ok(alerts)
    }

    /// The document's `[payload]` settings (the default without a document or a section).
    pub(crate) fn payload(&self) -> anyhow::Result<PayloadSettings> {
        match self.text() {
            Some(text) => parse_payload(&self.name(), text),
            None => Ok(PayloadSettings::default()),
        }
    }

    /// The document's `[[schedules]]`, checked ([`schedules_of`]).
    pub(crate) fn schedules(&self) -> anyhow::Result<Vec<redrive_store::ScheduleSpec>> {
        match self.text() {
            Some(text) => schedules_of(&self.name(), text, &self.set()?),
            None => Ok(Vec::new()),
        }
    }

    /// The policies and egress of `work` and `serve`: the document's, then the flags'
    /// entries added (a `--redirects` flag replaces the document's mode).
    pub(crate) fn for_workers(
        &self,
        flags: &EgressArgs,
    ) -> anyhow::Result<(PolicySet, EgressPolicy)> {
        let (set, egress) = self.set_with_egress()?;
        Ok((set, with_egress_flags(egress, flags)?))
    }
}

/// The policies source of a command that has a store: `--policies FILE` if given, else the
/// latest stored version, else built-in.
pub(crate) async fn source(global: &Global, store: &Store) -> anyhow::Result<Source> {
    if let Some(file) = Source::file(global)? {
        return Ok(file);
    }
    Ok(
        match store
            .latest_policy_version()
            .await
            .context("reading the stored policies")?
        {
            Some(v) => Source::Stored(v),
            None => Source::Builtin,
        },
    )
}

/// [`source`] for a command that needs no database otherwise (`policy show`, `simulate`):
/// an SQLite file that does not exist has no stored version (and is not created); any other
/// database is opened to look.
pub(crate) fn source_without_store(global: &Global) -> anyhow::Result<Source> {
    if let Some(file) = Source::file(global)? {
        return Ok(file);
    }
    if let Some(path) = crate::cmd::queue::sqlite_path(&global.db)
        && !Path::new(&path).exists()
    {
        return Ok(Source::Builtin);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let store = crate::cmd::queue::open(global).await.with_context(
            || "reading the stored policies (give --policies FILE to use a file instead)",
        )?;
        source(global, &store).await
    })
}

/// Loads the presets and, if given, the global `--policies` file (not the stored version:
/// for what is checked before a database is opened).
pub(crate) fn load(global: &Global) -> anyhow::Result<PolicySet> {
    Source::file(global)?.unwrap_or(Source::Builtin).set()
}

/// Loads the presets plus one TOML file. A file that cannot be read is a runtime error; one that
/// is invalid is a usage error naming the field.
pub(crate) fn load_file(path: &Path) -> anyhow::Result<PolicySet> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy file {}", path.display()))?;
    Ok(parse_document(&path.display().to_string(), &text)?.0)
}

/// Every check `--policies FILE` gets, on a document named `name` (a path, or `policies
/// v3`): egress, alerts, payload, schedules and the policies themselves; the policies and the
/// egress. An invalid document is a usage error naming `name` and the field.
pub(crate) fn parse_document(name: &str, text: &str) -> anyhow::Result<(PolicySet, EgressPolicy)> {
    let (egress, rest) = redrive_http::egress::split_policies_toml(text)
        .map_err(|e| usage(format!("{name}: {e}")))?;
    let (alerts, rest) = redrive_http::alerts::split_alerts_toml(&rest)
        .map_err(|e| usage(format!("{name}: {e}")))?;
    parse_payload(name, text)?;
    let rest = without_section(&without_schedules(&rest), "payload");
    let set = PolicySet::from_toml(&rest).map_err(|e| usage(format!("{name}: {e}")))?;
    warn_redefined_presets(name, &rest);
    redrive_http::alerts::check_alert_rules(&alerts, &set)
        .map_err(|e| usage(format!("{name}: {e}")))?;
    Ok((set, egress))
}

/// The whole check of `redrive policy apply`: [`parse_document`] and the schedules.
pub(crate) fn check_document(name: &str, text: &str) -> anyhow::Result<PolicySet> {
    let (set, _) = parse_document(name, text)?;
    schedules_of(name, text, &set)?;
    Ok(set)
}

/// A `[policy.payment]` (or another preset's name) in the file replaces the built-in preset
/// for every job that names it, and `payment` is every job's default: legal, and easy to do
/// by mistake (a copied example), so it is said once per load.
fn warn_redefined_presets(name: &str, text: &str) {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return;
    };
    let Some(policies) = doc.get("policy").and_then(toml::Value::as_table) else {
        return;
    };
    for preset in redrive_policy::RetryPolicy::PRESETS {
        if policies.contains_key(*preset) {
            tracing::warn!(
                "{name}: [policy.{preset}] redefines the built-in preset {preset:?}: every job that names it{} gets this file's version (use another name, with extends = {preset:?}, to keep the preset)",
                if *preset == redrive_policy::PolicySet::DEFAULT_POLICY {
                    " (and every job that names no policy)"
                } else {
                    ""
                }
            );
        }
    }
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

/// The policies and the egress policy of `work` and `serve` from the `--policies` file only
/// (checked before a database is opened; [`Source::for_workers`] is what they run).
pub(crate) fn load_for_workers(
    global: &Global,
    flags: &EgressArgs,
) -> anyhow::Result<(PolicySet, EgressPolicy)> {
    Source::file(global)?
        .unwrap_or(Source::Builtin)
        .for_workers(flags)
}

/// The `--allow-host`, `--deny-host` and `--redirects` flags added to an egress policy.
fn with_egress_flags(mut egress: EgressPolicy, flags: &EgressArgs) -> anyhow::Result<EgressPolicy> {
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
    Ok(egress)
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

/// The `[payload]` section of the document `name` whose text is `text`.
fn parse_payload(name: &str, text: &str) -> anyhow::Result<PayloadSettings> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| usage(format!("{name}: {}", e.to_string().trim())))?;
    let Some(raw) = table.get("payload") else {
        return Ok(PayloadSettings::default());
    };
    raw.clone().try_into().map_err(|e: toml::de::Error| {
        usage(format!(
            "{name}: payload: {}",
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

/// The `[[schedules]]` of the document `name` (none without the section), each checked as
/// a schedule added with `redrive schedule add` would be; a bad entry is a usage error naming
/// `schedules[i].FIELD`.
pub(crate) fn schedules_of(
    name: &str,
    text: &str,
    set: &PolicySet,
) -> anyhow::Result<Vec<redrive_store::ScheduleSpec>> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        schedules: Vec<RawSchedule>,
    }
    let table: toml::Table =
        toml::from_str(text).map_err(|e| usage(format!("{name}: {}", e.to_string().trim())))?;
    let Some(raw) = table.get("schedules") else {
        return Ok(Vec::new());
    };
    let file: File = toml::Table::from_iter([("schedules".to_owned(), raw.clone())])
        .try_into()
        .map_err(|e: toml::de::Error| {
            usage(format!(
                "{name}: schedules: {}",
                e.to_string().trim().replace('\n', " ")
            ))
        })?;
    let now = chrono::Utc::now();
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, r) in file.schedules.into_iter().enumerate() {
        let at = |field: &str, msg: String| usage(format!("{name}: schedules[{i}].{field}: {msg}"));
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
        let spec = redrive_service::schedule_spec(set, &req, now).map_err(|e| match e {
            redrive_http::EnqueueError::Invalid { field, reason, .. } => at(&field, reason),
            other => at("job", other.to_string()),
        })?;
        out.push(spec);
    }
    Ok(out)
}
