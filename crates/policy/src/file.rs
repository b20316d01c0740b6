//! Policies and breakers from a TOML file.
//!
//! ```toml
//! # Start from a preset and change what differs.
//! [policy.checkout]
//! extends = "payment"
//! max_exceptions = 3
//! deadline = "2h"
//!
//! [policy.checkout.retry]
//! base = "100ms"
//! cap = "10s"
//! jitter = "decorrelated"
//! max_attempts = 8
//! window = "2m"
//! in_process_max_wait = "5s"
//!
//! [policy.checkout.defer]
//! schedule = ["1m", "10m", "1h"]
//! jitter = "proportional(0.2)"
//!
//! [policy.checkout.status]
//! 409 = "infrastructure"
//!
//! [policy.reports.retry]
//! backoff = "schedule"
//! schedule = ["1s", "5s", "30s"]
//! max_attempts = 4
//!
//! [policy.checkout.declines]
//! retry_later = "6h"       # wait after a Visa category 2/4 or MAC 02 decline
//! card_stop = "dead"       # a job of a stopped card: "dead" (default) or "wait"
//!
//! # Per-card reattempt quotas after a decline, fleet-wide (defaults: the networks' rules).
//! [quotas]
//! visa = [{ max = 15, window = "30d" }]
//! mastercard = [{ max = 10, window = "24h" }, { max = 35, window = "30d" }]
//! # How long a Visa category 1 / MAC 03 / MAC 21 decline stops every job of the card key.
//! card_stop = { visa = "30d", mastercard = "30d" }   # the default; "off" for none
//!
//! [breaker.default]
//! window_calls = 50
//! failure_rate = 0.5
//! minimum_calls = 20
//! open_cooldown = "10s"
//! half_open_probes = 3
//!
//! [breaker."api.psp.example"]
//! window_time = "30s"
//! open_cooldown = "30s"
//! # Flow control toward this dependency (R21), for the whole fleet:
//! rate_limit = "80/s"      # a known limit (omit it: learned from 429s)
//! rate_burst = 5           # slots that may go at once beyond the steady rate
//! max_inflight = 32        # calls in flight per worker process
//! retry_budget_ratio = 0.2 # retries beyond 20% of first attempts (+10/s) are deferred
//! ```
//!
//! The rate settings of a `[breaker.NAME]` section: `rate_limit` (`"80/s"`, `"600/m"`,
//! `"3600/h"` or a number per second), `rate_adaptive` (learn from 429s; default true),
//! `rate_burst`, `rate_floor` and `rate_ceiling` (bounds of the learned rate, per second),
//! `rate_decrease` (share kept after a 429, default 0.9), `rate_increase` (CUBIC's `C` of the
//! climb after a cut, requests/s per second³ of use, default 0.4), `rate_slow_start` (the first
//! rate on first contact without `rate_limit`, default `"20/s"`; `"off"`: unthrottled until
//! the first 429), `rate_psp_burst` (how long the PSP's own limiter lets a fleet run above its
//! rate after a pause: its bucket as time at its rate, default `"1s"`; `"0s"`: learn from the
//! last second alone); `max_inflight`; `retry_budget_ratio` and `retry_budget_min_per_sec`.
//!
//! Every invalid field is refused with its dotted path, its value and the
//! allowed range (`invalid policy.checkout.retry.base = 0s: must be above 0s
//! ...`); unknown fields are refused by name.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::backoff::{Backoff, BackoffKind, ExponentialBuilder};
use crate::breaker::{BreakerConfig, BreakerConfigBuilder, Window};
use crate::error::PolicyError;
use crate::flow::{FlowConfig, RateConfig};
use crate::jitter::Jitter;
use crate::outcome::StatusTable;
use crate::policy::{DeferPhase, RetryPolicy, RetryPolicyBuilder};
use crate::{FailureClass, Network, QuotaRules, parse_duration};

/// The policies and breaker settings a deployment knows: the built-in presets plus those of an
/// optional TOML file (a file's policy of the same name replaces the preset).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySet {
    policies: BTreeMap<String, RetryPolicy>,
    flows: BTreeMap<String, FlowConfig>,
    quotas: QuotaRules,
}

impl Default for PolicySet {
    fn default() -> Self {
        Self::builtin()
    }
}

impl PolicySet {
    /// The name of the policy used when a job names none.
    pub const DEFAULT_POLICY: &'static str = "payment";

    /// The presets `payment`, `background` and `classic`, and the default breaker.
    pub fn builtin() -> Self {
        let policies = RetryPolicy::PRESETS
            .iter()
            .filter_map(|n| RetryPolicy::preset(n))
            .map(|p| (p.name().to_owned(), p))
            .collect();
        Self {
            policies,
            flows: BTreeMap::new(),
            quotas: QuotaRules::default(),
        }
    }

    /// The presets plus the policies and breakers of a TOML document.
    ///
    /// # Errors
    /// [`PolicyError::Toml`] for a syntax error or an unknown field, [`PolicyError::InvalidField`]
    /// for a value out of range (with the dotted path of the field).
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| PolicyError::Toml {
            message: e.to_string().trim().replace('\n', " "),
        })?;
        let mut set = Self::builtin();
        for (name, rp) in raw.policy {
            let prefix = format!("policy.{name}");
            let p = rp.into_policy(&name, &set).map_err(|e| e.within(&prefix))?;
            set.policies.insert(name, p);
        }
        for (name, rb) in raw.breaker {
            let prefix = format!("breaker.{name}");
            let c = rb.into_flow().map_err(|e| e.within(&prefix))?;
            set.flows.insert(name, c);
        }
        for (network, window) in raw.quotas.card_stop {
            let n: Network = network.parse().map_err(|e: crate::ParseNameError| {
                PolicyError::invalid(
                    "quotas.card_stop",
                    format!("{network:?}"),
                    format!("a network: {}", e.expected),
                )
            })?;
            let w = if window == "off" {
                None
            } else {
                Some(parse_duration(&window).map_err(|e| {
                    PolicyError::invalid(
                        format!("quotas.card_stop.{n}"),
                        format!("{window:?}"),
                        format!("{} or \"off\"", e.expected()),
                    )
                })?)
            };
            set.quotas = set
                .quotas
                .clone()
                .with_card_stop(n, w)
                .map_err(|e| e.within("quotas"))?;
        }
        for (network, windows) in raw.quotas.windows {
            let n: Network = network.parse().map_err(|e: crate::ParseNameError| {
                PolicyError::invalid(
                    "quotas",
                    format!("{network:?}"),
                    format!("a network: {}", e.expected),
                )
            })?;
            let raw: Vec<(i64, String)> = windows.into_iter().map(|w| (w.max, w.window)).collect();
            let parsed =
                QuotaRules::parse_windows(n.as_str(), &raw).map_err(|e| e.within("quotas"))?;
            set.quotas = set.quotas.with(n, parsed);
        }
        Ok(set)
    }

    /// The per-card reattempt quotas after a decline (`[quotas]`; defaults in
    /// [`QuotaRules`]).
    pub fn quotas(&self) -> &QuotaRules {
        &self.quotas
    }

    /// Replaces the reattempt quotas.
    pub fn set_quotas(&mut self, quotas: QuotaRules) {
        self.quotas = quotas;
    }

    /// Adds or replaces a policy.
    pub fn insert(&mut self, policy: RetryPolicy) {
        self.policies.insert(policy.name().to_owned(), policy);
    }

    /// Sets the breaker configuration of a dependency (`default` for all others).
    pub fn insert_breaker(&mut self, dependency: impl Into<String>, config: BreakerConfig) {
        let dep = dependency.into();
        let flow = self.flow(&dep).with_breaker(config);
        self.flows.insert(dep, flow);
    }

    /// Sets the whole flow control of a dependency (`default` for all others).
    pub fn insert_flow(&mut self, dependency: impl Into<String>, config: FlowConfig) {
        self.flows.insert(dependency.into(), config);
    }

    /// The policy of that name.
    ///
    /// # Errors
    /// [`PolicyError::UnknownPolicy`] listing the known names.
    pub fn get(&self, name: &str) -> Result<&RetryPolicy, PolicyError> {
        self.policies
            .get(name)
            .ok_or_else(|| PolicyError::UnknownPolicy {
                name: name.to_owned(),
                known: self.names().collect::<Vec<_>>().join(", "),
            })
    }

    /// The known policy names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.policies.keys().map(String::as_str)
    }

    /// Every policy.
    pub fn policies(&self) -> impl Iterator<Item = &RetryPolicy> {
        self.policies.values()
    }

    /// The breaker configuration of a dependency: its own section, else `[breaker.default]`,
    /// else the built-in default.
    pub fn breaker(&self, dependency: &str) -> BreakerConfig {
        self.flow(dependency).breaker().clone()
    }

    /// The flow control of a dependency (breaker, rate limit, concurrency cap, retry budget):
    /// its own section, else `[breaker.default]`, else the built-in default.
    pub fn flow(&self, dependency: &str) -> FlowConfig {
        self.flows
            .get(dependency)
            .or_else(|| self.flows.get("default"))
            .cloned()
            .unwrap_or_default()
    }
}

// ===== raw TOML =====

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    policy: BTreeMap<String, RawPolicy>,
    #[serde(default)]
    breaker: BTreeMap<String, RawBreaker>,
    #[serde(default)]
    quotas: RawQuotas,
}

/// `[quotas]`: the networks' windows, and `card_stop`.
#[derive(Debug, Default, Deserialize)]
struct RawQuotas {
    #[serde(default)]
    card_stop: BTreeMap<String, String>,
    #[serde(flatten)]
    windows: BTreeMap<String, Vec<RawQuota>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuota {
    max: i64,
    window: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeclines {
    retry_later: Option<String>,
    card_stop: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    extends: Option<String>,
    retry: Option<RawRetry>,
    defer: Option<RawDefer>,
    max_exceptions: Option<i64>,
    deadline: Option<String>,
    blocked_jitter: Option<String>,
    declines: Option<RawDeclines>,
    status: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    backoff: Option<String>,
    base: Option<String>,
    multiplier: Option<f64>,
    cap: Option<String>,
    delay: Option<String>,
    schedule: Option<Vec<String>>,
    jitter: Option<String>,
    max_attempts: Option<i64>,
    window: Option<String>,
    in_process_max_wait: Option<String>,
    retry_after_max: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefer {
    schedule: Vec<String>,
    jitter: Option<String>,
    max_defers: Option<i64>,
    cap: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    window_calls: Option<i64>,
    window_time: Option<String>,
    failure_rate: Option<f64>,
    minimum_calls: Option<i64>,
    slow_call_duration: Option<String>,
    slow_call_rate: Option<f64>,
    open_cooldown: Option<String>,
    cooldown_multiplier: Option<f64>,
    cooldown_max: Option<String>,
    cooldown_jitter: Option<f64>,
    half_open_probes: Option<i64>,
    half_open_timeout: Option<String>,
    failure_classes: Option<Vec<String>>,
    ignored_classes: Option<Vec<String>>,
    rate_limit: Option<toml::Value>,
    rate_adaptive: Option<bool>,
    rate_burst: Option<i64>,
    rate_floor: Option<f64>,
    rate_ceiling: Option<f64>,
    rate_decrease: Option<f64>,
    rate_increase: Option<f64>,
    rate_slow_start: Option<toml::Value>,
    rate_psp_burst: Option<String>,
    max_inflight: Option<i64>,
    retry_budget_ratio: Option<f64>,
    retry_budget_min_per_sec: Option<i64>,
}

/// Reads a rate: `"80/s"`, `"600/m"`, `"3600/h"`, or a number per second.
fn rate(field: &str, v: &toml::Value) -> Result<f64, PolicyError> {
    let bad = |shown: String| {
        PolicyError::invalid(
            field,
            shown,
            "a rate like \"80/s\", \"600/m\", \"3600/h\" or a number per second",
        )
    };
    match v {
        toml::Value::Integer(n) => Ok(*n as f64),
        toml::Value::Float(f) => Ok(*f),
        toml::Value::String(s) => {
            let (n, per) = s.trim().split_once('/').unwrap_or((s.trim(), "s"));
            let n: f64 = n.trim().parse().map_err(|_| bad(format!("{s:?}")))?;
            let secs = match per.trim() {
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(bad(format!("{s:?}"))),
            };
            Ok(n / secs)
        }
        other => Err(bad(other.to_string())),
    }
}

fn dur(field: &str, s: &str) -> Result<Duration, PolicyError> {
    parse_duration(s).map_err(|e| PolicyError::invalid(field, format!("{s:?}"), e.expected()))
}

fn count(field: &str, v: i64, lo: i64, hi: i64) -> Result<u32, PolicyError> {
    if v < lo || v > hi {
        return Err(PolicyError::invalid(
            field,
            v.to_string(),
            format!("from {lo} to {hi}"),
        ));
    }
    Ok(v as u32)
}

fn jitter(field: &str, s: &str) -> Result<Jitter, PolicyError> {
    s.parse::<Jitter>().map_err(|e| match e {
        PolicyError::InvalidField { value, allowed, .. } => {
            PolicyError::invalid(field, value, allowed)
        }
        other => other,
    })
}

fn classes(field: &str, names: &[String]) -> Result<Vec<FailureClass>, PolicyError> {
    names
        .iter()
        .map(|n| {
            n.parse::<FailureClass>().map_err(|e| {
                PolicyError::invalid(
                    field,
                    format!("{n:?}"),
                    format!("one of {}", e.expected.trim_end_matches(", ")),
                )
            })
        })
        .collect()
}

impl RawPolicy {
    fn into_policy(self, name: &str, known: &PolicySet) -> Result<RetryPolicy, PolicyError> {
        let mut p = match &self.extends {
            Some(base) => known
                .get(base)
                .map_err(|_| {
                    PolicyError::invalid(
                        "extends",
                        format!("{base:?}"),
                        format!(
                            "a preset or an earlier policy: {}",
                            known.names().collect::<Vec<_>>().join(", ")
                        ),
                    )
                })?
                .clone()
                .into_builder()
                .with_name(name),
            None => RetryPolicy::builder(name),
        };
        if let Some(r) = self.retry {
            p = r.apply(p)?;
        }
        if let Some(d) = self.defer {
            let mut delays = Vec::with_capacity(d.schedule.len());
            for (i, s) in d.schedule.iter().enumerate() {
                delays.push(dur(&format!("defer.schedule[{i}]"), s)?);
            }
            if delays.is_empty() {
                return Err(PolicyError::invalid(
                    "defer.schedule",
                    "[]",
                    "at least one delay",
                ));
            }
            let longest = delays.iter().copied().max().unwrap_or_default();
            let cap = match &d.cap {
                Some(c) => dur("defer.cap", c)?,
                None => longest
                    .mul_f64(1.5)
                    .min(crate::MAX_CAP)
                    .max(longest.min(crate::MAX_CAP)),
            };
            let n = delays.len() as i64;
            let schedule = Backoff::schedule(delays, cap).map_err(|e| e.within("defer"))?;
            let jitter = match &d.jitter {
                Some(j) => jitter("defer.jitter", j)?,
                None => Jitter::proportional(0.2)?,
            };
            let max_defers = count("defer.max_defers", d.max_defers.unwrap_or(n), 1, 1000)?;
            p = p.with_defer_phase(DeferPhase::new(schedule, jitter, max_defers)?);
        }
        if let Some(m) = self.max_exceptions {
            p = p.with_max_exceptions(count("max_exceptions", m, 1, 1000)?);
        }
        if let Some(d) = &self.deadline {
            p = if d == "none" {
                p.without_deadline()
            } else {
                p.with_deadline(dur("deadline", d)?)
            };
        }
        if let Some(d) = self.declines.as_ref().and_then(|d| d.retry_later.as_ref()) {
            p = p.with_decline_retry_later(dur("declines.retry_later", d)?);
        }
        if let Some(a) = self.declines.as_ref().and_then(|d| d.card_stop.as_ref()) {
            p = p.with_card_stop(a.parse()?);
        }
        if let Some(d) = &self.blocked_jitter {
            p = p.with_blocked_jitter(dur("blocked_jitter", d)?);
        }
        if let Some(table) = self.status {
            let mut st = StatusTable::new();
            for (k, v) in table {
                let field = format!("status.{k}");
                let code: u16 = k.parse().map_err(|_| {
                    PolicyError::invalid(&field, format!("{k:?}"), "an HTTP status from 100 to 599")
                })?;
                let class = v.parse::<FailureClass>().map_err(|e| {
                    PolicyError::invalid(
                        &field,
                        format!("{v:?}"),
                        format!("one of {}", e.expected.trim_end_matches(", ")),
                    )
                })?;
                st = st.with_override(code, class).map_err(|_| {
                    PolicyError::invalid(&field, k.clone(), "an HTTP status from 100 to 599")
                })?;
            }
            p = p.with_status(st);
        }
        p.build()
    }
}

impl RawRetry {
    fn apply(self, mut p: RetryPolicyBuilder) -> Result<RetryPolicyBuilder, PolicyError> {
        let old = p.policy().retry().backoff().clone();
        let kind = match (&self.backoff, &self.schedule, &self.delay) {
            (Some(k), _, _) => k.clone(),
            (None, Some(_), _) => "schedule".into(),
            (None, None, Some(_)) => "constant".into(),
            (None, None, None) => match old.kind() {
                BackoffKind::Exponential => "exponential".into(),
                BackoffKind::Schedule => "schedule".into(),
                BackoffKind::Constant => "constant".into(),
            },
        };
        let old_cap = old.cap();
        let cap = match &self.cap {
            Some(c) => Some(dur("retry.cap", c)?),
            None => None,
        };
        let backoff = match kind.as_str() {
            "exponential" => {
                let (b0, m0) = match old.multiplier() {
                    Some(multiplier) => (old.base(), multiplier),
                    None => (crate::DEFAULT_BASE, crate::DEFAULT_MULTIPLIER),
                };
                let base = match &self.base {
                    Some(b) => dur("retry.base", b)?,
                    None => b0,
                };
                ExponentialBuilder::new()
                    .with_base(base)
                    .with_multiplier(self.multiplier.unwrap_or(m0))
                    .with_cap(cap.unwrap_or(old_cap))
                    .build()
                    .map_err(|e| e.within("retry"))?
            }
            "schedule" => {
                let list = self.schedule.as_ref().ok_or_else(|| {
                    PolicyError::invalid(
                        "retry.schedule",
                        "missing",
                        "a list of delays with backoff = \"schedule\"",
                    )
                })?;
                let mut delays = Vec::with_capacity(list.len());
                for (i, s) in list.iter().enumerate() {
                    delays.push(dur(&format!("retry.schedule[{i}]"), s)?);
                }
                let cap = cap.unwrap_or_else(|| {
                    delays
                        .iter()
                        .copied()
                        .max()
                        .unwrap_or(old_cap)
                        .min(crate::MAX_CAP)
                });
                Backoff::schedule(delays, cap).map_err(|e| e.within("retry"))?
            }
            "constant" => {
                let d = self.delay.as_ref().ok_or_else(|| {
                    PolicyError::invalid(
                        "retry.delay",
                        "missing",
                        "a delay with backoff = \"constant\"",
                    )
                })?;
                Backoff::constant(dur("retry.delay", d)?).map_err(|e| e.within("retry"))?
            }
            other => {
                return Err(PolicyError::invalid(
                    "retry.backoff",
                    format!("{other:?}"),
                    "one of exponential, schedule, constant",
                ));
            }
        };
        p = p.with_backoff(backoff);
        if let Some(j) = &self.jitter {
            p = p.with_jitter(jitter("retry.jitter", j)?);
        }
        if let Some(n) = self.max_attempts {
            p = p.with_max_attempts(count(
                "retry.max_attempts",
                n,
                1,
                i64::from(crate::MAX_ATTEMPTS_LIMIT),
            )?);
        }
        if let Some(w) = &self.window {
            p = if w == "none" {
                p.without_window()
            } else {
                p.with_window(dur("retry.window", w)?)
            };
        }
        if let Some(d) = &self.in_process_max_wait {
            p = p.with_in_process_max_wait(dur("retry.in_process_max_wait", d)?);
        }
        if let Some(d) = &self.retry_after_max {
            p = p.with_retry_after_max(dur("retry.retry_after_max", d)?);
        }
        Ok(p)
    }
}

impl RawBreaker {
    fn into_flow(self) -> Result<FlowConfig, PolicyError> {
        let mut r = match &self.rate_limit {
            Some(v) => RateConfig::fixed(rate("rate_limit", v)?)?,
            None => RateConfig::adaptive(),
        };
        if let Some(a) = self.rate_adaptive {
            r = r.with_adaptive(a);
        }
        if let Some(n) = self.rate_burst {
            r = r.with_burst(count("rate_burst", n, 0, 10_000)?);
        }
        if self.rate_floor.is_some() || self.rate_ceiling.is_some() {
            r = r.with_bounds(
                self.rate_floor.unwrap_or(r.floor()),
                self.rate_ceiling.unwrap_or(r.ceiling()),
            );
        }
        if let Some(d) = self.rate_decrease {
            r = r.with_decrease(d);
        }
        if let Some(i) = self.rate_increase {
            r = r.with_increase(i);
        }
        match &self.rate_slow_start {
            None => {}
            Some(toml::Value::String(s)) if s.trim() == "off" => r = r.with_slow_start(None),
            Some(v) => r = r.with_slow_start(Some(rate("rate_slow_start", v)?)),
        }
        if let Some(b) = &self.rate_psp_burst {
            r = r.with_psp_burst(dur("rate_psp_burst", b)?);
        }
        let mut flow = FlowConfig::default().with_rate(r)?;
        let max_inflight = self
            .max_inflight
            .map(|n| count("max_inflight", n, 1, 100_000))
            .transpose()?;
        let retry_budget = match (self.retry_budget_ratio, self.retry_budget_min_per_sec) {
            (None, None) => None,
            (ratio, min) => {
                let mut b = crate::RetryBudgetBuilder::new();
                if let Some(x) = ratio {
                    if !(x.is_finite() && (0.0..=1000.0).contains(&x)) {
                        return Err(PolicyError::invalid(
                            "retry_budget_ratio",
                            x.to_string(),
                            "from 0 to 1000",
                        ));
                    }
                    b = b.with_retry_ratio(x);
                }
                if let Some(m) = min {
                    b = b.with_min_per_sec(count("retry_budget_min_per_sec", m, 0, 1_000_000)?);
                }
                Some(b)
            }
        };
        if let Some(n) = max_inflight {
            flow = flow.with_max_inflight(n)?;
        }
        if let Some(b) = retry_budget {
            flow = flow.with_retry_budget(b)?;
        }
        Ok(flow.with_breaker(self.into_config()?))
    }

    fn into_config(self) -> Result<BreakerConfig, PolicyError> {
        let mut b = BreakerConfigBuilder::new();
        match (self.window_calls, &self.window_time) {
            (Some(_), Some(_)) => {
                return Err(PolicyError::invalid(
                    "window_time",
                    "set together with window_calls",
                    "only one of window_calls and window_time",
                ));
            }
            (Some(n), None) => {
                b = b.with_window(Window::Count {
                    size: count("window_calls", n, 1, 10_000)?,
                })
            }
            (None, Some(t)) => {
                b = b.with_window(Window::Time {
                    length: dur("window_time", t)?,
                })
            }
            (None, None) => {}
        }
        if let Some(r) = self.failure_rate {
            b = b.with_failure_rate(r);
        }
        if let Some(n) = self.minimum_calls {
            b = b.with_minimum_calls(count("minimum_calls", n, 1, 100_000)?);
        }
        if let Some(d) = &self.slow_call_duration {
            b = b.with_slow_calls(
                dur("slow_call_duration", d)?,
                self.slow_call_rate.unwrap_or(1.0),
            );
        } else if self.slow_call_rate.is_some() {
            return Err(PolicyError::invalid(
                "slow_call_rate",
                "set without slow_call_duration",
                "set together with slow_call_duration",
            ));
        }
        let cooldown = self
            .open_cooldown
            .as_deref()
            .map(|d| dur("open_cooldown", d))
            .transpose()?;
        let max = self
            .cooldown_max
            .as_deref()
            .map(|d| dur("cooldown_max", d))
            .transpose()?;
        if let Some(c) = cooldown {
            b = b.with_open_cooldown(c);
            if max.is_none() {
                // Keep the default growth room above a longer first cool-down.
                b = b.with_cooldown_max(c.max(Duration::from_secs(300)));
            }
        }
        if let Some(m) = max {
            b = b.with_cooldown_max(m);
        }
        if let Some(m) = self.cooldown_multiplier {
            b = b.with_cooldown_multiplier(m);
        }
        if let Some(j) = self.cooldown_jitter {
            b = b.with_cooldown_jitter(j);
        }
        if let Some(n) = self.half_open_probes {
            b = b.with_half_open_probes(count("half_open_probes", n, 1, 1000)?);
        }
        if let Some(d) = &self.half_open_timeout {
            b = b.with_half_open_timeout(dur("half_open_timeout", d)?);
        }
        if let Some(c) = &self.failure_classes {
            b = b.with_failure_classes(&classes("failure_classes", c)?);
        }
        if let Some(c) = &self.ignored_classes {
            b = b.with_ignored_classes(&classes("ignored_classes", c)?);
        }
        b.build()
    }
}

#[cfg(test)]
mod tests {
    /// A negative duration in a file said "must be it is negative" (issue 36).
    #[test]
    fn a_bad_duration_reads_as_a_sentence() {
        for text in [
            "[policy.x]\nextends = \"payment\"\ndeadline = \"-5s\"\n",
            "[quotas]\nvisa = [{ max = 1, window = \"-5s\" }]\n",
        ] {
            let e = PolicySet::from_toml(text).unwrap_err().to_string();
            assert!(
                e.contains("\"-5s\": must be a duration like 250ms, 30s, 5m or 1h; it is negative"),
                "{e}"
            );
            assert!(!e.contains("must be it"), "{e}");
        }
    }

    #[test]
    fn quotas_default_and_override() {
        let set = PolicySet::from_toml("").unwrap();
        assert_eq!(set.quotas(), &QuotaRules::default());
        let set = PolicySet::from_toml(
            r#"
            [quotas]
            visa = [{ max = 12, window = "30d" }]
            mc = [{ max = 3, window = "1m" }, { max = 5, window = "1h" }]
            [policy.subs]
            extends = "payment"
            [policy.subs.declines]
            retry_later = "6h"
            "#,
        )
        .unwrap();
        let v = set.quotas().windows(Network::Visa);
        assert_eq!(
            (v[0].max(), v[0].window()),
            (12, Duration::from_secs(30 * 86_400))
        );
        let m = set.quotas().windows(Network::Mastercard);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].max(), m[0].window()), (3, Duration::from_secs(60)));
        assert_eq!(
            set.get("subs").unwrap().decline_retry_later(),
            Duration::from_secs(6 * 3600)
        );
        let e =
            PolicySet::from_toml("[quotas]\nvisa = [{ max = 0, window = \"1d\" }]").unwrap_err();
        assert!(e.to_string().contains("quotas.visa[0].max = 0"), "{e}");
        let e =
            PolicySet::from_toml("[quotas]\ndiners = [{ max = 1, window = \"1d\" }]").unwrap_err();
        assert!(e.to_string().contains("\"diners\""), "{e}");
        let e =
            PolicySet::from_toml("[quotas]\nvisa = [{ max = 1, window = \"soon\" }]").unwrap_err();
        assert!(e.to_string().contains("quotas.visa[0].window"), "{e}");
    }

    #[test]
    fn card_stops_and_their_action_are_read_and_checked() {
        use crate::{CardStopAction, DEFAULT_CARD_STOP};
        let set = PolicySet::from_toml("").unwrap();
        assert_eq!(
            set.quotas().card_stop(Network::Visa),
            Some(DEFAULT_CARD_STOP)
        );
        assert_eq!(
            set.get("payment").unwrap().card_stop(),
            CardStopAction::Dead
        );
        let set = PolicySet::from_toml(
            r#"
            [quotas]
            visa = [{ max = 20, window = "30d" }]
            card_stop = { visa = "7d", mastercard = "off", amex = "1d" }
            [policy.subs]
            extends = "payment"
            [policy.subs.declines]
            card_stop = "wait"
            "#,
        )
        .unwrap();
        let q = set.quotas();
        assert_eq!(
            q.card_stop(Network::Visa),
            Some(Duration::from_secs(7 * 86_400))
        );
        assert_eq!(q.card_stop(Network::Mastercard), None);
        assert_eq!(
            q.card_stop(Network::Amex),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(q.windows(Network::Visa)[0].max(), 20);
        assert_eq!(set.get("subs").unwrap().card_stop(), CardStopAction::Wait);
        for (toml, field) in [
            (
                "[quotas]\ncard_stop = { visa = \"soon\" }",
                "quotas.card_stop.visa",
            ),
            (
                "[quotas]\ncard_stop = { visa = \"0s\" }",
                "quotas.card_stop.visa = 0ms",
            ),
            (
                "[quotas]\ncard_stop = { diners = \"1d\" }",
                "quotas.card_stop",
            ),
            (
                "[policy.p.declines]\ncard_stop = \"later\"",
                "policy.p.declines.card_stop = \"later\"",
            ),
        ] {
            let e = PolicySet::from_toml(toml).unwrap_err().to_string();
            assert!(e.contains(field), "{toml}: {e}");
        }
    }

    use super::*;

    const EXAMPLE: &str = r#"
[policy.checkout]
extends = "payment"
max_exceptions = 3
deadline = "2h"

[policy.checkout.retry]
base = "100ms"
cap = "10s"
jitter = "decorrelated"
max_attempts = 8
window = "2m"
in_process_max_wait = "5s"

[policy.checkout.defer]
schedule = ["1m", "10m", "1h"]
jitter = "proportional(0.2)"

[policy.checkout.status]
409 = "infrastructure"

[policy.reports.retry]
backoff = "schedule"
schedule = ["1s", "5s", "30s"]
max_attempts = 4

[breaker.default]
window_calls = 50
failure_rate = 0.5
minimum_calls = 20
open_cooldown = "10s"
half_open_probes = 3

[breaker."api.psp.example"]
window_time = "30s"
open_cooldown = "30s"
"#;

    #[test]
    fn the_documented_example_loads() {
        let set = PolicySet::from_toml(EXAMPLE).unwrap();
        let c = set.get("checkout").unwrap();
        assert_eq!(c.retry().max_attempts(), 8);
        assert_eq!(c.retry().jitter(), Jitter::Decorrelated);
        assert_eq!(c.retry().backoff().nominal(0), Duration::from_millis(100));
        assert_eq!(c.retry().backoff().cap(), Duration::from_secs(10));
        assert_eq!(c.retry().window(), Some(Duration::from_secs(120)));
        assert_eq!(c.max_exceptions(), Some(3));
        assert_eq!(c.deadline(), Some(Duration::from_secs(7200)));
        assert_eq!(c.defer().unwrap().max_defers(), 3);
        assert_eq!(
            c.status().classify(409, false),
            FailureClass::Infrastructure
        );
        let r = set.get("reports").unwrap();
        assert_eq!(r.retry().backoff().nominal(2), Duration::from_secs(30));
        assert_eq!(r.retry().max_attempts(), 4);
        // presets are still there
        assert!(set.get("payment").is_ok());
        assert_eq!(
            set.breaker("api.psp.example").window(),
            Window::Time {
                length: Duration::from_secs(30)
            }
        );
        assert_eq!(set.breaker("other").window(), Window::Count { size: 50 });
    }

    fn err(toml: &str) -> String {
        PolicySet::from_toml(toml).unwrap_err().to_string()
    }

    #[test]
    fn every_bad_field_is_named_with_its_value_and_range() {
        let cases = [
            ("[policy.x.retry]\nbase = \"0s\"", "policy.x.retry.base"),
            (
                "[policy.x.retry]\nbase = \"fast\"",
                "policy.x.retry.base = \"fast\"",
            ),
            (
                "[policy.x.retry]\nmultiplier = 0.5",
                "policy.x.retry.multiplier = 0.5",
            ),
            (
                "[policy.x.retry]\nmax_attempts = 0",
                "policy.x.retry.max_attempts = 0: must be from 1 to 1000",
            ),
            (
                "[policy.x.retry]\nmax_attempts = -3",
                "policy.x.retry.max_attempts = -3",
            ),
            (
                "[policy.x.retry]\njitter = \"loud\"",
                "policy.x.retry.jitter = \"loud\"",
            ),
            (
                "[policy.x.retry]\nbackoff = \"linear\"",
                "policy.x.retry.backoff = \"linear\"",
            ),
            (
                "[policy.x.retry]\nin_process_max_wait = \"1h\"",
                "policy.x.retry.in_process_max_wait = 1h",
            ),
            (
                "[policy.x.retry]\nschedule = [\"1s\", \"0s\"]",
                "policy.x.retry.schedule[1]",
            ),
            (
                "[policy.x.retry]\nschedule = [\"1s\", \"soon\"]",
                "policy.x.retry.schedule[1] = \"soon\"",
            ),
            ("[policy.x.defer]\nschedule = []", "policy.x.defer.schedule"),
            (
                "[policy.x.defer]\nschedule = [\"1m\"]\nmax_defers = 0",
                "policy.x.defer.max_defers = 0",
            ),
            (
                "[policy.x]\nmax_exceptions = 0",
                "policy.x.max_exceptions = 0",
            ),
            (
                "[policy.x]\nextends = \"nope\"",
                "policy.x.extends = \"nope\"",
            ),
            (
                "[policy.x.status]\n700 = \"permanent\"",
                "policy.x.status.700",
            ),
            (
                "[policy.x.status]\n409 = \"maybe\"",
                "policy.x.status.409 = \"maybe\"",
            ),
            (
                "[breaker.default]\nfailure_rate = 2.0",
                "breaker.default.failure_rate = 2",
            ),
            (
                "[breaker.default]\nwindow_calls = 0",
                "breaker.default.window_calls = 0",
            ),
            (
                "[breaker.default]\nfailure_classes = [\"oops\"]",
                "breaker.default.failure_classes = \"oops\"",
            ),
        ];
        for (toml, want) in cases {
            let e = err(toml);
            assert!(e.contains(want), "{toml:?}: {e}");
        }
    }

    #[test]
    fn flow_settings_load_and_bad_ones_are_named() {
        let set = PolicySet::from_toml(
            r#"
[breaker.default]
rate_burst = 3

[breaker.psp]
rate_limit = "4800/m"
rate_adaptive = false
max_inflight = 8
retry_budget_ratio = 0.5
"#,
        )
        .unwrap();
        let psp = set.flow("psp");
        assert_eq!(psp.rate().limit(), Some(80.0));
        assert!(!psp.rate().is_adaptive());
        assert_eq!(psp.max_inflight(), Some(8));
        assert!(psp.retry_budget().is_some());
        let other = set.flow("other");
        assert_eq!(other.rate().limit(), None);
        assert!(other.rate().is_adaptive());
        assert_eq!(other.rate().burst(), 3);
        assert_eq!(PolicySet::builtin().flow("x"), FlowConfig::default());
        let slow = |v: &str| {
            PolicySet::from_toml(&format!("[breaker.p]\nrate_slow_start = {v}"))
                .unwrap()
                .flow("p")
                .rate()
                .slow_start()
        };
        assert_eq!(slow("\"off\""), None);
        assert_eq!(slow("\"40/s\""), Some(40.0));
        assert_eq!(FlowConfig::default().rate().slow_start(), Some(20.0));
        assert_eq!(
            FlowConfig::default().rate().psp_burst(),
            Duration::from_secs(1)
        );
        let burst = PolicySet::from_toml("[breaker.p]\nrate_psp_burst = \"100ms\"")
            .unwrap()
            .flow("p")
            .rate()
            .psp_burst();
        assert_eq!(burst, Duration::from_millis(100));
        for (text, want) in [
            ("rate_psp_burst = \"soon\"", "rate_psp_burst = \"soon\""),
            ("rate_psp_burst = \"2m\"", "from 0s to 60s"),
        ] {
            let err = PolicySet::from_toml(&format!("[breaker.p]\n{text}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        for (toml, want) in [
            (
                "[breaker.p]\nrate_limit = \"fast\"",
                "breaker.p.rate_limit = \"fast\"",
            ),
            (
                "[breaker.p]\nrate_limit = \"10/d\"",
                "breaker.p.rate_limit = \"10/d\"",
            ),
            ("[breaker.p]\nrate_limit = 0", "breaker.p.rate_limit = 0/s"),
            (
                "[breaker.p]\nrate_decrease = 1.5",
                "breaker.p.rate_decrease = 1.5",
            ),
            (
                "[breaker.p]\nmax_inflight = 0",
                "breaker.p.max_inflight = 0",
            ),
            (
                "[breaker.p]\nrate_slow_start = 0",
                "breaker.p.rate_slow_start = 0/s",
            ),
            (
                "[breaker.p]\nrate_slow_start = \"soon\"",
                "breaker.p.rate_slow_start = \"soon\"",
            ),
            (
                "[breaker.p]\nretry_budget_ratio = -1.0",
                "breaker.p.retry_budget_ratio = -1",
            ),
        ] {
            let e = err(toml);
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    #[test]
    fn unknown_fields_and_syntax_errors_are_refused() {
        let e = err("[policy.x.retry]\nbsae = \"1s\"");
        assert!(e.contains("bsae"), "{e}");
        let e = err("[policy.x\n");
        assert!(e.contains("invalid policy file"), "{e}");
        let e = err("[polcy.x]");
        assert!(e.contains("polcy"), "{e}");
    }

    #[test]
    fn unknown_policy_lists_the_known() {
        let e = PolicySet::builtin().get("premium").unwrap_err().to_string();
        assert!(
            e.contains("premium") && e.contains("payment") && e.contains("classic"),
            "{e}"
        );
    }
}
