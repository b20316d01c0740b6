//! The faults the simulator injects, and the pure engine that decides them.
//!
//! Why a pure engine: every fault decision is a function of the time since
//! the simulator started, the fault settings and a seeded RNG. Keeping that
//! out of the HTTP code means the windows and the rate limit can be tested to
//! the millisecond, and a seed gives the same sequence of faults for the same
//! sequence of requests.

use std::fmt;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How long a timed-out-after-commit answer is held back by default.
pub const DEFAULT_TIMEOUT_DELAY: Duration = Duration::from_secs(30);

/// The highest rate limit accepted, in requests per second.
pub const MAX_RATE_LIMIT: f64 = 1_000_000.0;

/// A fault setting that is out of range or malformed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultsError {
    /// One field has a bad value.
    #[error("invalid {field} = {value}: must be {allowed}")]
    Invalid {
        /// The field's name, as in the JSON of `POST /_sim/faults`.
        field: String,
        /// The refused value, as written.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// A field the simulator does not know.
    #[error("unknown field {field}: known fields are {known}")]
    Unknown {
        /// The unknown field's name.
        field: String,
        /// The known fields.
        known: String,
    },
}

impl FaultsError {
    fn invalid(field: &str, value: impl fmt::Display, allowed: impl Into<String>) -> Self {
        FaultsError::Invalid {
            field: field.to_owned(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }

    /// The name of the field at fault.
    pub fn field(&self) -> &str {
        match self {
            FaultsError::Invalid { field, .. } | FaultsError::Unknown { field, .. } => field,
        }
    }
}

/// What [`Outage::start`] is counted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutageAnchor {
    /// From the simulator's start (or its last reset). The default, and what
    /// `--outage` uses.
    #[default]
    Start,
    /// From the moment the faults are set (`POST /_sim/faults` or
    /// `set_faults`). Stored faults are always resolved to [`OutageAnchor::Start`].
    Now,
}

/// A window during which every request is answered 503.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outage {
    /// When the window opens.
    pub start: Duration,
    /// How long it stays open (more than zero).
    pub length: Duration,
    /// What `start` is counted from.
    pub relative_to: OutageAnchor,
}

impl Outage {
    /// A window from `start` for `length`, counted from the simulator's start.
    pub const fn new(start: Duration, length: Duration) -> Self {
        Outage {
            start,
            length,
            relative_to: OutageAnchor::Start,
        }
    }

    /// Whether `elapsed` (since the simulator's start) falls in the window:
    /// `start <= elapsed < start + length`.
    pub fn contains(&self, elapsed: Duration) -> bool {
        elapsed >= self.start && elapsed < self.start.saturating_add(self.length)
    }
}

/// Reads `START+LENGTH`, e.g. `5s+5s` (open 5 s after the start, for 5 s).
///
/// # Errors
/// [`FaultsError::Invalid`] for field `outage` when the `+` or either
/// duration is missing or malformed, or the length is zero.
pub fn parse_outage(s: &str) -> Result<Outage, FaultsError> {
    let allowed = "START+LENGTH, e.g. 5s+5s (LENGTH more than zero)";
    let bad = || FaultsError::invalid("outage", format!("{s:?}"), allowed);
    let (a, b) = s.split_once('+').ok_or_else(bad)?;
    let start = redrive_policy::parse_duration(a).map_err(|_| bad())?;
    let length = redrive_policy::parse_duration(b).map_err(|_| bad())?;
    if length.is_zero() {
        return Err(bad());
    }
    Ok(Outage::new(start, length))
}

/// Every fault the simulator can inject. `Faults::default()` injects none.
///
/// In JSON (`POST /_sim/faults`, `GET /_sim/faults`) the fields are named as
/// the CLI flags with `_` for `-`, durations in milliseconds with an `_ms`
/// suffix, and `retry_after` / `outage_retry_after` in whole seconds:
///
/// ```json
/// {"error_rate": 0.1, "rate_limit": 50, "retry_after": 2,
///  "outage": {"start_ms": 5000, "length_ms": 5000, "relative_to": "start"},
///  "outage_retry_after": null, "latency_ms": 20, "timeout_after_commit": 0.05,
///  "timeout_delay_ms": 30000, "processing_ms": 0, "seed": 7}
/// ```
///
/// Every field may be left out (it takes its default); `outage` may also be
/// written `"5s+5s"` and `latency_ms` as `"latency": "250ms"`. Unknown fields
/// are refused.
///
/// # Default
/// No errors, no rate limit, no `Retry-After`, no outage, no latency, no
/// timeouts after commit, [`DEFAULT_TIMEOUT_DELAY`] (30 s) as the hold-back
/// when one fires, no processing time, and a random seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Share of requests answered 500, 502 or 503 (uniformly) without any
    /// effect, 0..=1.
    pub error_rate: f64,
    /// Requests per second allowed (a token bucket holding `max(1, rate)`
    /// tokens, refilled continuously); beyond it, 429. `None`: no limit.
    pub rate_limit: Option<f64>,
    /// `Retry-After` sent with every 429, in whole seconds. `None`: no header.
    pub retry_after: Option<Duration>,
    /// A window during which every request gets 503.
    pub outage: Option<Outage>,
    /// `Retry-After` sent with outage 503s, in whole seconds. `None` (the
    /// default): no header.
    pub outage_retry_after: Option<Duration>,
    /// Added to every answer, faulted or not.
    pub latency: Duration,
    /// Share of charges made whose answer is then held back for
    /// `timeout_delay`, 0..=1: the charge is committed, the client times out.
    pub timeout_after_commit: f64,
    /// How long such an answer is held back.
    pub timeout_delay: Duration,
    /// How long a charge stays in flight between taking its key and being
    /// committed (a repeat meanwhile gets 409).
    pub processing: Duration,
    /// Seed of the fault RNG. `None` when set: keep the current RNG; at start:
    /// a random seed (reported by `GET /_sim/faults`).
    pub seed: Option<u64>,
    /// Share of authorisations (charges that reach the ledger fresh) declined with a 402,
    /// 0..=1 (see [`crate::declines`]).
    pub decline_rate: f64,
    /// The kinds of decline and their weights (empty: all `visa2`).
    pub decline_mix: Vec<(crate::DeclineKind, f64)>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults::none()
    }
}

const KNOWN: &[&str] = &[
    "error_rate",
    "rate_limit",
    "retry_after",
    "outage",
    "outage_retry_after",
    "latency_ms",
    "latency",
    "timeout_after_commit",
    "timeout_delay_ms",
    "processing_ms",
    "seed",
    "decline_rate",
    "decline_mix",
];

impl Faults {
    /// No faults at all (the same as `Default`).
    pub const fn none() -> Self {
        Faults {
            error_rate: 0.0,
            rate_limit: None,
            retry_after: None,
            outage: None,
            outage_retry_after: None,
            latency: Duration::ZERO,
            timeout_after_commit: 0.0,
            timeout_delay: DEFAULT_TIMEOUT_DELAY,
            processing: Duration::ZERO,
            seed: None,
            decline_rate: 0.0,
            decline_mix: Vec::new(),
        }
    }

    /// Checks every field's range.
    ///
    /// # Errors
    /// [`FaultsError::Invalid`] naming the first bad field.
    pub fn validate(&self) -> Result<(), FaultsError> {
        share("error_rate", self.error_rate)?;
        share("timeout_after_commit", self.timeout_after_commit)?;
        share("decline_rate", self.decline_rate)?;
        crate::declines::check_mix(&self.decline_mix)?;
        if let Some(r) = self.rate_limit
            && !(r.is_finite() && r > 0.0 && r <= MAX_RATE_LIMIT)
        {
            return Err(FaultsError::invalid(
                "rate_limit",
                r,
                format!("a number of requests per second above 0 and at most {MAX_RATE_LIMIT}"),
            ));
        }
        whole_seconds("retry_after", self.retry_after)?;
        whole_seconds("outage_retry_after", self.outage_retry_after)?;
        if let Some(o) = &self.outage
            && o.length.is_zero()
        {
            return Err(FaultsError::invalid(
                "outage.length_ms",
                0,
                "more than zero",
            ));
        }
        Ok(())
    }

    /// Reads the JSON of `POST /_sim/faults` (see the type's docs).
    ///
    /// # Errors
    /// [`FaultsError`] naming the field: unknown, of the wrong type, or out of range.
    pub fn from_json(v: &Value) -> Result<Faults, FaultsError> {
        let obj = v.as_object().ok_or_else(|| {
            FaultsError::invalid("faults", short(v), "a JSON object of fault fields")
        })?;
        for k in obj.keys() {
            if !KNOWN.contains(&k.as_str()) {
                return Err(FaultsError::Unknown {
                    field: k.clone(),
                    known: KNOWN.join(", "),
                });
            }
        }
        if obj.contains_key("latency") && obj.contains_key("latency_ms") {
            return Err(FaultsError::invalid(
                "latency",
                short(&obj["latency"]),
                "given once: either latency (\"250ms\") or latency_ms (250)",
            ));
        }
        let mut f = Faults::none();
        if let Some(x) = opt_f64(obj, "error_rate")? {
            f.error_rate = x;
        }
        f.rate_limit = opt_f64(obj, "rate_limit")?;
        f.retry_after = opt_u64(obj, "retry_after")?.map(Duration::from_secs);
        f.outage_retry_after = opt_u64(obj, "outage_retry_after")?.map(Duration::from_secs);
        f.outage = outage_json(obj.get("outage"))?;
        if let Some(ms) = opt_u64(obj, "latency_ms")? {
            f.latency = Duration::from_millis(ms);
        }
        if let Some(v) = obj.get("latency").filter(|v| !v.is_null()) {
            let s = v.as_str().ok_or_else(|| {
                FaultsError::invalid("latency", short(v), "a duration like \"250ms\"")
            })?;
            f.latency = redrive_policy::parse_duration(s)
                .map_err(|e| FaultsError::invalid("latency", format!("{s:?}"), e.reason))?;
        }
        if let Some(x) = opt_f64(obj, "timeout_after_commit")? {
            f.timeout_after_commit = x;
        }
        if let Some(ms) = opt_u64(obj, "timeout_delay_ms")? {
            f.timeout_delay = Duration::from_millis(ms);
        }
        if let Some(ms) = opt_u64(obj, "processing_ms")? {
            f.processing = Duration::from_millis(ms);
        }
        f.seed = opt_u64(obj, "seed")?;
        if let Some(x) = opt_f64(obj, "decline_rate")? {
            f.decline_rate = x;
        }
        match obj.get("decline_mix") {
            None | Some(Value::Null) => {}
            Some(Value::String(m)) => f.decline_mix = crate::declines::parse_decline_mix(m)?,
            Some(v) => {
                return Err(FaultsError::invalid(
                    "decline_mix",
                    short(v),
                    "a string like \"visa1:0.2,visa2:0.5,mc24:0.3\"",
                ));
            }
        }
        f.validate()?;
        Ok(f)
    }

    /// The JSON form (what `GET /_sim/faults` returns).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(FaultsView::from(self)).unwrap_or(Value::Null)
    }

    /// The outage resolved against `now` (time since the start): an
    /// [`OutageAnchor::Now`] window becomes an [`OutageAnchor::Start`] one.
    pub(crate) fn resolved(mut self, now: Duration) -> Self {
        if let Some(o) = &mut self.outage
            && o.relative_to == OutageAnchor::Now
        {
            o.start = o.start.saturating_add(now);
            o.relative_to = OutageAnchor::Start;
        }
        self
    }
}

fn share(field: &str, x: f64) -> Result<(), FaultsError> {
    if x.is_finite() && (0.0..=1.0).contains(&x) {
        Ok(())
    } else {
        Err(FaultsError::invalid(field, x, "a share between 0 and 1"))
    }
}

fn whole_seconds(field: &str, d: Option<Duration>) -> Result<(), FaultsError> {
    match d {
        Some(d) if d.subsec_nanos() != 0 => Err(FaultsError::invalid(
            field,
            format!("{d:?}"),
            "whole seconds",
        )),
        _ => Ok(()),
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}...", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

fn opt_f64(obj: &Map<String, Value>, field: &str) -> Result<Option<f64>, FaultsError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| FaultsError::invalid(field, short(v), "a number")),
    }
}

fn opt_u64(obj: &Map<String, Value>, field: &str) -> Result<Option<u64>, FaultsError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| FaultsError::invalid(field, short(v), "a whole number of at least 0")),
    }
}

fn outage_json(v: Option<&Value>) -> Result<Option<Outage>, FaultsError> {
    let v = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    if let Some(s) = v.as_str() {
        return parse_outage(s).map(Some);
    }
    let allowed =
        "{\"start_ms\": N, \"length_ms\": N, \"relative_to\": \"start\"|\"now\"} or \"5s+5s\"";
    let obj = v
        .as_object()
        .ok_or_else(|| FaultsError::invalid("outage", short(v), allowed))?;
    for k in obj.keys() {
        if !["start_ms", "length_ms", "relative_to"].contains(&k.as_str()) {
            return Err(FaultsError::Unknown {
                field: format!("outage.{k}"),
                known: "outage.start_ms, outage.length_ms, outage.relative_to".into(),
            });
        }
    }
    let start = opt_u64(obj, "start_ms")
        .map_err(|_| {
            FaultsError::invalid(
                "outage.start_ms",
                short(&obj["start_ms"]),
                "a whole number of milliseconds",
            )
        })?
        .unwrap_or(0);
    let length = match obj.get("length_ms") {
        None | Some(Value::Null) => {
            return Err(FaultsError::invalid(
                "outage.length_ms",
                "missing",
                "a whole number of milliseconds above 0",
            ));
        }
        Some(v) => v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
            FaultsError::invalid(
                "outage.length_ms",
                short(v),
                "a whole number of milliseconds above 0",
            )
        })?,
    };
    let relative_to = match obj.get("relative_to") {
        None | Some(Value::Null) => OutageAnchor::Start,
        Some(Value::String(s)) if s == "start" => OutageAnchor::Start,
        Some(Value::String(s)) if s == "now" => OutageAnchor::Now,
        Some(v) => {
            return Err(FaultsError::invalid(
                "outage.relative_to",
                short(v),
                "\"start\" or \"now\"",
            ));
        }
    };
    Ok(Some(Outage {
        start: Duration::from_millis(start),
        length: Duration::from_millis(length),
        relative_to,
    }))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Serialize)]
struct OutageView {
    start_ms: u64,
    length_ms: u64,
    relative_to: OutageAnchor,
}

#[derive(Serialize)]
struct FaultsView {
    error_rate: f64,
    rate_limit: Option<f64>,
    retry_after: Option<u64>,
    outage: Option<OutageView>,
    outage_retry_after: Option<u64>,
    latency_ms: u64,
    timeout_after_commit: f64,
    timeout_delay_ms: u64,
    processing_ms: u64,
    seed: Option<u64>,
    decline_rate: f64,
    decline_mix: String,
}

impl From<&Faults> for FaultsView {
    fn from(f: &Faults) -> Self {
        FaultsView {
            error_rate: f.error_rate,
            rate_limit: f.rate_limit,
            retry_after: f.retry_after.map(|d| d.as_secs()),
            outage: f.outage.map(|o| OutageView {
                start_ms: ms(o.start),
                length_ms: ms(o.length),
                relative_to: o.relative_to,
            }),
            outage_retry_after: f.outage_retry_after.map(|d| d.as_secs()),
            latency_ms: ms(f.latency),
            timeout_after_commit: f.timeout_after_commit,
            timeout_delay_ms: ms(f.timeout_delay),
            processing_ms: ms(f.processing),
            seed: f.seed,
            decline_rate: f.decline_rate,
            decline_mix: crate::declines::mix_text(&f.decline_mix),
        }
    }
}

impl Serialize for Faults {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        FaultsView::from(self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Faults {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Faults::from_json(&v).map_err(serde::de::Error::custom)
    }
}

/// What the engine decided for one request before it reaches the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go on to the handler.
    Pass,
    /// In the outage window: 503.
    Outage,
    /// Over the rate limit: 429.
    RateLimited,
    /// A simulated server error with this status (500, 502 or 503).
    Error(u16),
}

/// The stateful part of the faults: the token bucket and the RNGs.
#[derive(Debug)]
pub(crate) struct FaultEngine {
    faults: Faults,
    seed: u64,
    tokens: f64,
    refilled_at: Duration,
    errors: SmallRng,
    timeouts: SmallRng,
    declines: SmallRng,
}

/// The timeout stream is the seed's own, so that turning timeouts on does
/// not change which requests get errors.
const TIMEOUT_STREAM: u64 = 0x9E37_79B9_7F4A_7C15;
/// The decline stream, likewise its own.
const DECLINE_STREAM: u64 = 0xD1B5_4A32_D192_ED03;

impl FaultEngine {
    /// An engine for `faults` (already validated), seeded with `seed`.
    pub(crate) fn new(faults: Faults, seed: u64, now: Duration) -> Self {
        let mut e = FaultEngine {
            tokens: 0.0,
            refilled_at: now,
            errors: SmallRng::seed_from_u64(seed),
            timeouts: SmallRng::seed_from_u64(seed ^ TIMEOUT_STREAM),
            declines: SmallRng::seed_from_u64(seed ^ DECLINE_STREAM),
            seed,
            faults: Faults {
                seed: Some(seed),
                ..faults
            },
        };
        e.tokens = e.capacity();
        e
    }

    /// The current faults, with the effective seed.
    pub(crate) fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The effective seed.
    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }

    /// Replaces the faults: the bucket is refilled; the RNGs are reseeded
    /// only when `faults.seed` is set.
    pub(crate) fn set(&mut self, faults: Faults, now: Duration) {
        let seed = faults.seed.unwrap_or(self.seed);
        if faults.seed.is_some() {
            *self = FaultEngine::new(faults, seed, now);
        } else {
            self.faults = Faults {
                seed: Some(seed),
                ..faults
            };
            self.tokens = self.capacity();
            self.refilled_at = now;
        }
    }

    fn capacity(&self) -> f64 {
        self.faults.rate_limit.map_or(0.0, |r| r.max(1.0))
    }

    /// Outage, then rate limit, then error rate, for a request arriving at
    /// `now` (time since the start).
    pub(crate) fn decide(&mut self, now: Duration) -> Verdict {
        if self.faults.outage.is_some_and(|o| o.contains(now)) {
            return Verdict::Outage;
        }
        if let Some(rate) = self.faults.rate_limit {
            let dt = now.saturating_sub(self.refilled_at).as_secs_f64();
            self.tokens = (self.tokens + dt * rate).min(self.capacity());
            self.refilled_at = self.refilled_at.max(now);
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
            } else {
                return Verdict::RateLimited;
            }
        }
        if self.faults.error_rate > 0.0 && self.errors.random::<f64>() < self.faults.error_rate {
            let status = [500, 502, 503][self.errors.random_range(0..3usize)];
            return Verdict::Error(status);
        }
        Verdict::Pass
    }

    /// Whether this authorisation is declined, and how.
    pub(crate) fn decline(&mut self) -> Option<crate::DeclineKind> {
        if self.faults.decline_rate > 0.0
            && self.declines.random::<f64>() < self.faults.decline_rate
        {
            let u = self.declines.random::<f64>();
            return Some(crate::declines::pick(&self.faults.decline_mix, u));
        }
        None
    }

    /// Whether the answer to a charge just made is held back.
    pub(crate) fn timeout_after_commit(&mut self) -> bool {
        self.faults.timeout_after_commit > 0.0
            && self.timeouts.random::<f64>() < self.faults.timeout_after_commit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn outage_parses_and_names_the_field() {
        assert_eq!(
            parse_outage("5s+5s").unwrap(),
            Outage::new(ms(5000), ms(5000))
        );
        assert_eq!(
            parse_outage("0s+250ms").unwrap(),
            Outage::new(ms(0), ms(250))
        );
        for bad in ["5s", "5s+", "+5s", "5+5", "5s+0s", "x+y", ""] {
            let e = parse_outage(bad).unwrap_err();
            assert_eq!(e.field(), "outage", "{bad}");
        }
    }

    #[test]
    fn outage_window_is_half_open() {
        let o = Outage::new(ms(5000), ms(5000));
        assert!(!o.contains(ms(4999)));
        assert!(o.contains(ms(5000)));
        assert!(o.contains(ms(9999)));
        assert!(!o.contains(ms(10_000)));
    }

    #[test]
    fn validate_names_each_field() {
        let cases = [
            (
                Faults {
                    error_rate: 2.0,
                    ..Faults::none()
                },
                "error_rate",
            ),
            (
                Faults {
                    error_rate: f64::NAN,
                    ..Faults::none()
                },
                "error_rate",
            ),
            (
                Faults {
                    timeout_after_commit: -0.1,
                    ..Faults::none()
                },
                "timeout_after_commit",
            ),
            (
                Faults {
                    rate_limit: Some(0.0),
                    ..Faults::none()
                },
                "rate_limit",
            ),
            (
                Faults {
                    retry_after: Some(ms(1500)),
                    ..Faults::none()
                },
                "retry_after",
            ),
        ];
        for (f, field) in cases {
            assert_eq!(f.validate().unwrap_err().field(), field);
        }
        assert!(Faults::none().validate().is_ok());
    }

    #[test]
    fn json_round_trips_and_refuses_unknown_fields() {
        let v = serde_json::json!({
            "error_rate": 0.25, "rate_limit": 10, "retry_after": 2,
            "outage": {"start_ms": 1000, "length_ms": 500},
            "latency": "20ms", "timeout_after_commit": 0.5, "timeout_delay_ms": 100,
            "processing_ms": 7, "seed": 9
        });
        let f = Faults::from_json(&v).unwrap();
        assert_eq!(f.rate_limit, Some(10.0));
        assert_eq!(f.retry_after, Some(ms(2000)));
        assert_eq!(f.outage, Some(Outage::new(ms(1000), ms(500))));
        assert_eq!(f.latency, ms(20));
        assert_eq!(f.processing, ms(7));
        let back: Faults = serde_json::from_value(f.to_json()).unwrap();
        assert_eq!(back, f);

        let e = Faults::from_json(&serde_json::json!({"error_rat": 0.1})).unwrap_err();
        assert_eq!(e.field(), "error_rat");
        let e = Faults::from_json(&serde_json::json!({"latency_ms": "x"})).unwrap_err();
        assert_eq!(e.field(), "latency_ms");
        let e = Faults::from_json(&serde_json::json!({"outage": {"start_ms": 1}})).unwrap_err();
        assert_eq!(e.field(), "outage.length_ms");
        let e = Faults::from_json(&serde_json::json!({"outage": "5s"})).unwrap_err();
        assert_eq!(e.field(), "outage");
        let f = Faults::from_json(&serde_json::json!({"outage": "1s+2s"})).unwrap();
        assert_eq!(f.outage, Some(Outage::new(ms(1000), ms(2000))));
    }

    #[test]
    fn outage_relative_to_now_is_resolved() {
        let v =
            serde_json::json!({"outage": {"start_ms": 100, "length_ms": 50, "relative_to": "now"}});
        let f = Faults::from_json(&v).unwrap().resolved(ms(2000));
        assert_eq!(f.outage, Some(Outage::new(ms(2100), ms(50))));
    }

    #[test]
    fn engine_checks_outage_before_rate_limit() {
        let f = Faults {
            outage: Some(Outage::new(ms(0), ms(100))),
            rate_limit: Some(1.0),
            ..Faults::none()
        };
        let mut e = FaultEngine::new(f, 1, ms(0));
        // Outage answers do not take tokens.
        assert_eq!(e.decide(ms(10)), Verdict::Outage);
        assert_eq!(e.decide(ms(99)), Verdict::Outage);
        assert_eq!(e.decide(ms(100)), Verdict::Pass);
        assert_eq!(e.decide(ms(101)), Verdict::RateLimited);
    }

    #[test]
    fn token_bucket_refills_at_the_rate() {
        let f = Faults {
            rate_limit: Some(2.0),
            ..Faults::none()
        };
        let mut e = FaultEngine::new(f, 1, ms(0));
        assert_eq!(e.decide(ms(0)), Verdict::Pass);
        assert_eq!(e.decide(ms(0)), Verdict::Pass);
        assert_eq!(e.decide(ms(0)), Verdict::RateLimited);
        assert_eq!(e.decide(ms(499)), Verdict::RateLimited);
        assert_eq!(e.decide(ms(500)), Verdict::Pass);
        assert_eq!(e.decide(ms(500)), Verdict::RateLimited);
        // Never more than the capacity after a long pause.
        assert_eq!(e.decide(ms(60_000)), Verdict::Pass);
        assert_eq!(e.decide(ms(60_000)), Verdict::Pass);
        assert_eq!(e.decide(ms(60_000)), Verdict::RateLimited);
    }

    #[test]
    fn fractional_rate_holds_one_token() {
        let f = Faults {
            rate_limit: Some(0.5),
            ..Faults::none()
        };
        let mut e = FaultEngine::new(f, 1, ms(0));
        assert_eq!(e.decide(ms(0)), Verdict::Pass);
        assert_eq!(e.decide(ms(1999)), Verdict::RateLimited);
        assert_eq!(e.decide(ms(2000)), Verdict::Pass);
    }

    #[test]
    fn error_rate_is_seeded_and_roughly_right() {
        let f = Faults {
            error_rate: 0.3,
            ..Faults::none()
        };
        let run = |seed| {
            let mut e = FaultEngine::new(f.clone(), seed, ms(0));
            (0..10_000).map(|_| e.decide(ms(0))).collect::<Vec<_>>()
        };
        let a = run(42);
        assert_eq!(a, run(42));
        assert_ne!(a, run(43));
        let errors = a.iter().filter(|v| matches!(v, Verdict::Error(_))).count();
        assert!((2700..3300).contains(&errors), "{errors}");
        for s in [500, 502, 503] {
            let n = a.iter().filter(|v| **v == Verdict::Error(s)).count();
            assert!((800..1200).contains(&n), "{s}: {n}");
        }
    }

    #[test]
    fn set_without_seed_keeps_the_stream() {
        let f = Faults {
            error_rate: 0.5,
            ..Faults::none()
        };
        let mut a = FaultEngine::new(f.clone(), 5, ms(0));
        let mut b = FaultEngine::new(f.clone(), 5, ms(0));
        let _ = a.decide(ms(0));
        let _ = b.decide(ms(0));
        b.set(f.clone(), ms(0));
        assert_eq!(b.seed(), 5);
        let xs: Vec<_> = (0..50).map(|_| a.decide(ms(0))).collect();
        let ys: Vec<_> = (0..50).map(|_| b.decide(ms(0))).collect();
        assert_eq!(xs, ys);
        b.set(Faults { seed: Some(5), ..f }, ms(0));
        assert_eq!(b.faults().seed, Some(5));
    }
}
