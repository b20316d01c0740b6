//! Alerts: `[[alerts]]` in the policies file. On a job reaching dead, a breaker opening or
//! closing, or a queue's oldest due job waiting longer than a threshold, an `http` job is
//! enqueued to the rule's URL with a JSON body (below). Alerts are ordinary jobs: they get
//! redrive's retries, and their idempotency key (`alert:RULE:EVENT`, also sent as the
//! `Idempotency-Key` header) is derived from the event, so an event seen twice — by two worker
//! processes, or by one after a restart — makes one alert.
//!
//! ```toml
//! [[alerts]]
//! name = "ops"                            # unique; part of the key
//! url = "https://hooks.example/redrive"   # POSTed to
//! on = ["job_dead", "breaker_open", "breaker_closed", "queue_age"]
//! queues = ["payments"]                   # job_dead and queue_age: only these (default all)
//! dependencies = ["psp.example"]          # breaker_*: only these (default all)
//! oldest_available = "5m"                 # queue_age: the threshold (required with it)
//! queue = "alerts"                        # where the alert jobs go (default "alerts")
//! policy = "background"                   # their retry policy (default "background")
//! headers = { Authorization = "Bearer …" }
//! ```
//!
//! The body (`Content-Type: application/json`):
//!
//! ```json
//! {"alert": "ops", "event": "job_dead", "key": "job_dead:42:0", "at": "2026-12-05T10:00:00Z",
//!  "job": {"id": 42, "queue": "payments", "kind": "http", "dependency": "psp.example",
//!          "dead_reason": "permanent", "last_error": "HTTP 402 …", "attempts": 1,
//!          "replays": 0, "finished_at": "2026-12-05T09:59:59Z"}}
//! {"alert": "ops", "event": "breaker_open", "key": "breaker:17", "at": "…",
//!  "breaker": {"dependency": "psp.example", "from": "closed", "to": "open",
//!              "reason": "failure rate 60% over 20 calls", "at": "…"}}
//! {"alert": "ops", "event": "queue_age", "key": "queue_age:payments:1764928800000", "at": "…",
//!  "queue": {"name": "payments", "oldest_run_at": "…", "age_seconds": 412,
//!            "threshold_seconds": 300}}
//! ```
//!
//! Events are found by polling the store ([`Alerter::tick`]): dead jobs by the time they died,
//! breaker transitions by their id, queue ages per queue. A process starting looks back
//! [`LOOKBACK`] for events it may have missed; alerts are never sent for jobs of an alert
//! (their key starts with `alert:`), so a dead webhook does not alert about itself.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use redrive_policy::{BreakerState, PolicySet, Timestamp};
use redrive_store::{NewJob, Store, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::redact::redact_text;

/// How far back a starting process looks for events it may have missed.
pub const LOOKBACK: Duration = Duration::from_secs(300);
/// The default queue of alert jobs.
pub const DEFAULT_ALERT_QUEUE: &str = "alerts";
/// The default retry policy of alert jobs.
pub const DEFAULT_ALERT_POLICY: &str = "background";
/// The prefix of every alert job's key.
pub const KEY_PREFIX: &str = "alert:";
/// Dead jobs are read again this far back before the latest death handled.
pub const GRACE: Duration = Duration::from_secs(10);
const GRACE_MS: i64 = 10_000;

/// What an alert fires on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlertOn {
    /// A job reached dead.
    JobDead,
    /// A breaker opened (by the machine or an operator).
    BreakerOpen,
    /// A breaker closed.
    BreakerClosed,
    /// A queue's oldest due job has waited longer than the threshold.
    QueueAge,
}

impl AlertOn {
    /// The name in the policies file and the body's `event`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AlertOn::JobDead => "job_dead",
            AlertOn::BreakerOpen => "breaker_open",
            AlertOn::BreakerClosed => "breaker_closed",
            AlertOn::QueueAge => "queue_age",
        }
    }
}

/// One `[[alerts]]` rule.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertRule {
    /// Unique name (part of the alert's key).
    pub name: String,
    /// Where the alert is POSTed.
    pub url: String,
    /// The events.
    pub on: Vec<AlertOn>,
    /// `job_dead` and `queue_age`: only these queues (empty: all).
    pub queues: Vec<String>,
    /// `breaker_*`: only these dependencies (empty: all).
    pub dependencies: Vec<String>,
    /// `queue_age`: the threshold.
    pub oldest_available: Option<Duration>,
    /// The queue of the alert jobs.
    pub queue: String,
    /// The retry policy of the alert jobs.
    pub policy: String,
    /// Headers sent with the alert (e.g. a webhook's token).
    pub headers: BTreeMap<String, String>,
}

/// A bad `[[alerts]]` section: the field (`alerts[0].url`), the value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {value:?}: {reason}")]
pub struct AlertConfigError {
    /// The field.
    pub field: String,
    /// The value given.
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

fn bad(field: String, value: impl Into<String>, reason: impl Into<String>) -> AlertConfigError {
    AlertConfigError {
        field,
        value: value.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlert {
    name: Option<String>,
    url: String,
    on: Vec<String>,
    #[serde(default)]
    queues: Vec<String>,
    #[serde(default)]
    dependencies: Vec<String>,
    oldest_available: Option<String>,
    queue: Option<String>,
    policy: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// Takes the `[[alerts]]` array out of a policies file: the rules and the text without them
/// (for the other sections' parsers). Check the rules against the file's policies with
/// [`check_alert_rules`].
///
/// # Errors
/// [`AlertConfigError`] naming the field (`alerts[1].on[0]`), the value and why.
pub fn split_alerts_toml(text: &str) -> Result<(Vec<AlertRule>, String), AlertConfigError> {
    let mut table: toml::Table = toml::from_str(text)
        .map_err(|e| bad("alerts".into(), "", e.to_string().trim().replace('\n', " ")))?;
    let Some(section) = table.remove("alerts") else {
        return Ok((Vec::new(), text.to_owned()));
    };
    let raw: Vec<RawAlert> = section.try_into().map_err(|e: toml::de::Error| {
        bad(
            "alerts".into(),
            "",
            format!(
                "expected [[alerts]] tables: {}",
                e.to_string().trim().replace('\n', " ")
            ),
        )
    })?;
    let mut rules: Vec<AlertRule> = Vec::new();
    for (i, r) in raw.into_iter().enumerate() {
        let f = |name: &str| format!("alerts[{i}].{name}");
        let name = r.name.unwrap_or_else(|| format!("alert-{i}"));
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(bad(
                f("name"),
                name,
                "1 to 64 letters, digits, `_`, `-` or `.`",
            ));
        }
        if rules.iter().any(|x| x.name == name) {
            return Err(bad(f("name"), name, "another alert has this name"));
        }
        if r.on.is_empty() {
            return Err(bad(
                f("on"),
                "[]",
                "name at least one of job_dead, breaker_open, breaker_closed, queue_age",
            ));
        }
        let mut on = Vec::new();
        for (j, e) in r.on.iter().enumerate() {
            let ev = match e.as_str() {
                "job_dead" => AlertOn::JobDead,
                "breaker_open" => AlertOn::BreakerOpen,
                "breaker_closed" => AlertOn::BreakerClosed,
                "queue_age" => AlertOn::QueueAge,
                _ => {
                    return Err(bad(
                        format!("alerts[{i}].on[{j}]"),
                        e.clone(),
                        "one of job_dead, breaker_open, breaker_closed, queue_age",
                    ));
                }
            };
            if !on.contains(&ev) {
                on.push(ev);
            }
        }
        let oldest_available = r
            .oldest_available
            .as_deref()
            .map(|s| {
                redrive_policy::parse_duration(s)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| bad(f("oldest_available"), s, "a duration above zero, like 5m"))
            })
            .transpose()?;
        match (on.contains(&AlertOn::QueueAge), oldest_available) {
            (true, None) => {
                return Err(bad(
                    f("oldest_available"),
                    "",
                    "queue_age needs the threshold oldest_available (like \"5m\")",
                ));
            }
            (false, Some(_)) => {
                return Err(bad(
                    f("oldest_available"),
                    r.oldest_available.unwrap_or_default(),
                    "only with queue_age in `on`",
                ));
            }
            _ => {}
        }
        let policy = r.policy.unwrap_or_else(|| DEFAULT_ALERT_POLICY.into());
        let rule = AlertRule {
            name,
            url: r.url,
            on,
            queues: r.queues,
            dependencies: r.dependencies,
            oldest_available,
            queue: r.queue.unwrap_or_else(|| DEFAULT_ALERT_QUEUE.into()),
            policy,
            headers: r.headers,
        };
        rules.push(rule);
    }
    let rest = toml::to_string(&table).map_err(|e| bad("alerts".into(), "", e.to_string()))?;
    Ok((rules, rest))
}

/// Checks rules against the policies they will use: the retry policy exists, and the alert
/// job (URL, headers, queue) is one the queue accepts.
///
/// # Errors
/// [`AlertConfigError`] naming the field (`alerts[0].url`).
pub fn check_alert_rules(
    rules: &[AlertRule],
    policies: &PolicySet,
) -> Result<(), AlertConfigError> {
    for (i, rule) in rules.iter().enumerate() {
        let f = |name: &str| format!("alerts[{i}].{name}");
        if let Err(e) = policies.get(&rule.policy) {
            return Err(bad(f("policy"), rule.policy.clone(), e.to_string()));
        }
        // The alert job must be one the queue accepts: check a sample now, naming the field.
        let sample = alert_job(rule, policies, "check", json!({}))
            .map_err(|e| bad(f("url"), rule.url.clone(), e))?;
        crate::validate::validate_new_job(&sample, chrono::Utc::now()).map_err(|e| {
            let field = match &e {
                crate::EnqueueError::Invalid { field, .. }
                    if field.starts_with("payload.headers") =>
                {
                    f("headers")
                }
                crate::EnqueueError::Invalid { field, .. } if field.starts_with("payload") => {
                    f("url")
                }
                crate::EnqueueError::Invalid { field, .. } if field == "queue" => f("queue"),
                _ => f("url"),
            };
            bad(field, "", e.to_string())
        })?;
    }
    Ok(())
}

/// The alert job of `rule` for the event `key` with `body`.
fn alert_job(
    rule: &AlertRule,
    policies: &PolicySet,
    key: &str,
    body: Value,
) -> Result<NewJob, String> {
    let policy = policies.get(&rule.policy).map_err(|e| e.to_string())?;
    let mut payload =
        json!({"method": "POST", "url": rule.url, "body": body, "timeout_ms": 10_000});
    let mut headers = serde_json::Map::new();
    headers.insert("Content-Type".into(), "application/json".into());
    for (k, v) in &rule.headers {
        headers.insert(k.clone(), Value::String(v.clone()));
    }
    payload["headers"] = Value::Object(headers);
    let mut job = NewJob::new(rule.queue.clone(), "http", payload.clone()).with_policy(policy);
    job = job.key(format!("{KEY_PREFIX}{}:{key}", rule.name));
    job.dependency = crate::validate::default_dependency("http", &payload);
    Ok(job)
}

fn ms(t: Timestamp) -> i64 {
    t.timestamp_millis()
}

/// Finds alert events in the store and enqueues their alert jobs. One per worker process;
/// several in a fleet make each alert once (the keys).
#[derive(Debug)]
pub struct Alerter {
    rules: Vec<AlertRule>,
    policies: PolicySet,
    /// The latest death handled (ms); each read goes back [`GRACE`] before it, for deaths
    /// committed late or stamped by a clock a little behind.
    dead_cursor: i64,
    /// Deaths handled within the grace: (job, replays) → when it died (ms).
    dead_seen: HashMap<(i64, u32), i64>,
    /// The last breaker transition looked at (`None`: not read yet).
    event_cursor: Option<i64>,
    /// Queues whose backlog was found too old, by rule: the oldest `run_at` (ms) at the
    /// start of the episode; cleared once the backlog is young again.
    episodes: HashMap<(String, String), i64>,
    started: Timestamp,
}

impl Alerter {
    /// An alerter over `rules`, looking back [`LOOKBACK`] from `now` for missed events.
    pub fn new(rules: Vec<AlertRule>, policies: PolicySet, now: Timestamp) -> Self {
        let from = now - chrono::Duration::from_std(LOOKBACK).unwrap_or_default();
        Self {
            rules,
            policies,
            dead_cursor: ms(from),
            dead_seen: HashMap::new(),
            event_cursor: None,
            episodes: HashMap::new(),
            started: from,
        }
    }

    /// Whether there is any rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    fn wants(&self, on: AlertOn) -> bool {
        self.rules.iter().any(|r| r.on.contains(&on))
    }

    async fn send(
        &self,
        store: &Store,
        rule: &AlertRule,
        on: AlertOn,
        key: &str,
        detail: (&str, Value),
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut body = json!({
            "alert": rule.name, "event": on.as_str(), "key": key, "at": now.to_rfc3339(),
        });
        body[detail.0] = detail.1;
        let job = match alert_job(rule, &self.policies, key, body) {
            Ok(j) => j,
            Err(e) => {
                tracing::error!(alert = %rule.name, error = %e, "alert job not built");
                return Ok(false);
            }
        };
        let out = store.enqueue(&job, now).await?;
        if out.created {
            tracing::info!(alert = %rule.name, event = on.as_str(), key, job = out.job.id, "alert enqueued");
        }
        Ok(out.created)
    }

    /// Looks for new events once and enqueues their alerts; returns how many alert jobs were
    /// created (an alert another process made already is not counted).
    ///
    /// # Errors
    /// The store's; the cursors only move past what was handled.
    pub async fn tick(&mut self, store: &Store, now: Timestamp) -> Result<u64, StoreError> {
        let mut made = 0;
        if self.wants(AlertOn::JobDead) {
            made += self.dead(store, now).await?;
        }
        if self.wants(AlertOn::BreakerOpen) || self.wants(AlertOn::BreakerClosed) {
            made += self.breakers(store, now).await?;
        }
        if self.wants(AlertOn::QueueAge) {
            made += self.ages(store, now).await?;
        }
        Ok(made)
    }

    async fn dead(&mut self, store: &Store, now: Timestamp) -> Result<u64, StoreError> {
        let mut made = 0;
        loop {
            let since = redrive_store::from_millis(self.dead_cursor - GRACE_MS);
            let jobs = store.dead_since(since, 500).await?;
            let mut progressed = false;
            for j in &jobs {
                let t = j.finished_at.map_or(0, ms);
                if self.dead_seen.contains_key(&(j.id, j.replays)) {
                    continue;
                }
                let is_alert = j.key.as_deref().is_some_and(|k| k.starts_with(KEY_PREFIX));
                if !is_alert {
                    let key = format!("job_dead:{}:{}", j.id, j.replays);
                    let detail = json!({
                        "id": j.id, "queue": j.queue, "kind": j.kind, "dependency": j.dependency,
                        "dead_reason": j.dead_reason,
                        "last_error": j.last_error.as_deref().map(redact_text),
                        "attempts": j.attempts, "replays": j.replays,
                        "finished_at": j.finished_at.map(|t| t.to_rfc3339()),
                    });
                    for rule in self.rules.iter().filter(|r| {
                        r.on.contains(&AlertOn::JobDead)
                            && (r.queues.is_empty() || r.queues.contains(&j.queue))
                    }) {
                        let d = ("job", detail.clone());
                        made += u64::from(
                            self.send(store, rule, AlertOn::JobDead, &key, d, now)
                                .await?,
                        );
                    }
                }
                self.dead_seen.insert((j.id, j.replays), t);
                self.dead_cursor = self.dead_cursor.max(t);
                progressed = true;
            }
            let floor = self.dead_cursor - GRACE_MS;
            self.dead_seen.retain(|_, t| *t >= floor);
            if jobs.len() < 500 || !progressed {
                return Ok(made);
            }
        }
    }

    async fn breakers(&mut self, store: &Store, now: Timestamp) -> Result<u64, StoreError> {
        let mut events = store.dependency_events(None, 500).await?;
        events.reverse(); // oldest first
        let mut made = 0;
        for e in events {
            let seen = match self.event_cursor {
                Some(c) => e.id <= c,
                None => e.at < self.started,
            };
            if seen {
                continue;
            }
            let on = match e.to {
                BreakerState::Open => Some(AlertOn::BreakerOpen),
                BreakerState::Closed => Some(AlertOn::BreakerClosed),
                BreakerState::HalfOpen => None,
            };
            if let Some(on) = on {
                let key = format!("breaker:{}", e.id);
                let detail = json!({
                    "dependency": e.dependency, "from": e.from.as_str(), "to": e.to.as_str(),
                    "reason": redact_text(&e.reason), "at": e.at.to_rfc3339(),
                });
                for rule in self.rules.iter().filter(|r| {
                    r.on.contains(&on)
                        && (r.dependencies.is_empty() || r.dependencies.contains(&e.dependency))
                }) {
                    made += u64::from(
                        self.send(store, rule, on, &key, ("breaker", detail.clone()), now)
                            .await?,
                    );
                }
            }
            self.event_cursor = Some(e.id);
        }
        if self.event_cursor.is_none() {
            self.event_cursor = Some(0);
        }
        Ok(made)
    }

    async fn ages(&mut self, store: &Store, now: Timestamp) -> Result<u64, StoreError> {
        let oldest = store.oldest_due(now).await?;
        let mut made = 0;
        let rules: Vec<AlertRule> = self
            .rules
            .iter()
            .filter(|r| r.on.contains(&AlertOn::QueueAge))
            .cloned()
            .collect();
        for rule in &rules {
            let threshold = rule.oldest_available.unwrap_or(Duration::MAX);
            for (queue, t) in &oldest {
                if queue == &rule.queue || !(rule.queues.is_empty() || rule.queues.contains(queue))
                {
                    continue;
                }
                let slot = (rule.name.clone(), queue.clone());
                let age = (now - *t).to_std().unwrap_or_default();
                if age <= threshold {
                    self.episodes.remove(&slot);
                    continue;
                }
                if self.episodes.contains_key(&slot) {
                    continue; // this episode was alerted already
                }
                let key = format!("queue_age:{queue}:{}", ms(*t));
                let detail = json!({
                    "name": queue, "oldest_run_at": t.to_rfc3339(),
                    "age_seconds": age.as_secs(), "threshold_seconds": threshold.as_secs(),
                });
                made += u64::from(
                    self.send(store, rule, AlertOn::QueueAge, &key, ("queue", detail), now)
                        .await?,
                );
                self.episodes.insert(slot, ms(*t));
            }
            // A queue no longer backlogged ends its episode.
            self.episodes
                .retain(|(r, q), _| r != &rule.name || oldest.iter().any(|(x, _)| x == q));
        }
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> Result<Vec<AlertRule>, AlertConfigError> {
        let (rules, rest) = split_alerts_toml(text)?;
        let set = PolicySet::from_toml(&rest).unwrap();
        check_alert_rules(&rules, &set)?;
        Ok(rules)
    }

    #[test]
    fn a_rule_is_read_with_its_defaults_and_the_rest_is_left() {
        let text = r#"
[policy.fast]
extends = "background"

[[alerts]]
name = "ops"
url = "https://hooks.example/redrive"
on = ["job_dead", "queue_age", "job_dead"]
oldest_available = "5m"
policy = "fast"
headers = { Authorization = "Bearer abc" }
"#;
        let (r, rest) = split_alerts_toml(text).unwrap();
        assert!(!rest.contains("alerts"));
        assert!(rest.contains("fast"));
        let set = PolicySet::from_toml(&rest).unwrap();
        check_alert_rules(&r, &set).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].on, vec![AlertOn::JobDead, AlertOn::QueueAge]);
        assert_eq!(r[0].queue, DEFAULT_ALERT_QUEUE);
        assert_eq!(r[0].oldest_available, Some(Duration::from_secs(300)));
        let job = alert_job(&r[0], &set, "job_dead:1:0", json!({"x": 1})).unwrap();
        assert_eq!(job.key.as_deref(), Some("alert:ops:job_dead:1:0"));
        assert_eq!(job.payload["headers"]["Authorization"], "Bearer abc");
        assert_eq!(job.payload["body"], json!({"x": 1}));
        assert_eq!(job.dependency.as_deref(), Some("hooks.example"));
        // No section: nothing, the text untouched.
        assert_eq!(split_alerts_toml("[policy.a]\n").unwrap().0, vec![]);
    }

    #[test]
    fn bad_rules_are_named() {
        let base = |extra: &str| format!("[[alerts]]\nurl = \"https://h.example/x\"\n{extra}\n");
        let field = |t: String| rules(&t).unwrap_err().field;
        assert_eq!(field(base("on = []")), "alerts[0].on");
        assert_eq!(
            field(base("on = [\"job_dead\", \"boom\"]")),
            "alerts[0].on[1]"
        );
        assert_eq!(
            field(base("on = [\"queue_age\"]")),
            "alerts[0].oldest_available"
        );
        assert_eq!(
            field(base("on = [\"job_dead\"]\noldest_available = \"5m\"")),
            "alerts[0].oldest_available"
        );
        assert_eq!(
            field(base("on = [\"job_dead\"]\npolicy = \"nope\"")),
            "alerts[0].policy"
        );
        assert_eq!(
            field(base("on = [\"job_dead\"]\nname = \"a b\"")),
            "alerts[0].name"
        );
        assert_eq!(
            field("[[alerts]]\nurl = \"ftp://h/x\"\non = [\"job_dead\"]\n".into()),
            "alerts[0].url"
        );
        assert_eq!(
            field(base("on = [\"job_dead\"]\nheaders = { Host = \"x\" }")),
            "alerts[0].headers"
        );
        let two = format!(
            "{}{}",
            base("on = [\"job_dead\"]"),
            base("on = [\"job_dead\"]")
        );
        assert!(rules(&two).is_ok(), "default names differ");
        let dup = format!(
            "{}{}",
            base("on = [\"job_dead\"]\nname = \"x\""),
            base("on = [\"job_dead\"]\nname = \"x\"")
        );
        assert_eq!(field(dup), "alerts[1].name");
        assert!(
            split_alerts_toml(
                "[[alerts]]\nurl = \"https://h/x\"\non = [\"job_dead\"]\ncolour = 1\n"
            )
            .is_err()
        );
    }
}
