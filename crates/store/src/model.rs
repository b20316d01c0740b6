//! What the store keeps and the parameters of its operations.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use redrive_policy::{
    BreakerState, DeadReason, DeferReason, FailureClass, FlowRow, JobCounters, PauseReason,
    RetryMode, Timestamp,
};
use serde::{Deserialize, Serialize};

/// A job's id: increasing in enqueue order, used for keyset pagination.
pub type JobId = i64;

/// The most attempts a job may be given.
pub const MAX_MAX_ATTEMPTS: u32 = 10_000;
/// The longest queue, kind, key or dependency name accepted.
pub const MAX_NAME_LEN: usize = 255;
/// The lowest priority a job may have (lower runs first).
pub const MIN_PRIORITY: i32 = -1_000_000;
/// The highest priority a job may have.
pub const MAX_PRIORITY: i32 = 1_000_000;
/// The most jobs one call may claim, enqueue or complete.
pub const MAX_BATCH: usize = 10_000;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for its first run, in the future.
    Scheduled,
    /// Ready to be claimed.
    Available,
    /// Leased to a worker.
    Running,
    /// Waiting after a failure, a rate limit or an open breaker (see its defer reason).
    Deferred,
    /// Done; its result is stored.
    Succeeded,
    /// In the dead-letter table, with the reason it died.
    Dead,
    /// Cancelled by an operator.
    Cancelled,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 7] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Running,
        JobState::Deferred,
        JobState::Succeeded,
        JobState::Dead,
        JobState::Cancelled,
    ];

    /// The state's name, as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Available => "available",
            JobState::Running => "running",
            JobState::Deferred => "deferred",
            JobState::Succeeded => "succeeded",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Whether the job is finished (succeeded, dead or cancelled).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Dead | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = crate::StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| crate::StoreError::Invalid {
                field: "state",
                value: s.to_owned(),
                reason: "expected one of scheduled, available, running, deferred, succeeded, dead, cancelled".into(),
            })
    }
}

/// A job to enqueue.
///
/// ```
/// use redrive_store::NewJob;
/// let job = NewJob::new("payments", "http", serde_json::json!({"url": "https://psp.example/charges"}))
///     .key("order-42")
///     .dependency("psp.example")
///     .max_attempts(15);
/// assert_eq!(job.key.as_deref(), Some("order-42"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// Queue name.
    pub queue: String,
    /// Job kind (which handler runs it).
    pub kind: String,
    /// JSON payload given to the handler.
    pub payload: serde_json::Value,
    /// Idempotency key, unique per queue; a repeat enqueue returns the existing job.
    pub key: Option<String>,
    /// The dependency (PSP) the job calls, for breakers and pauses.
    pub dependency: Option<String>,
    /// Lower runs first (default 0), within [`MIN_PRIORITY`]`..=`[`MAX_PRIORITY`].
    pub priority: i32,
    /// First run (default: now).
    pub run_at: Option<Timestamp>,
    /// Name of the retry policy.
    pub policy: String,
    /// Attempts allowed in all (the policy's retry attempts plus defers).
    pub max_attempts: u32,
    /// Total time allowed from enqueue (or replay); the deadline is computed from it.
    pub ttl: Option<Duration>,
    /// The card key the networks' reattempt quotas count against: a card fingerprint or a
    /// payment-method id, never a card number (see [`check_quota_key`]).
    pub quota_key: Option<String>,
    /// The W3C `traceparent` of the request that enqueued the job (its attempts join that
    /// trace); `00-<32 hex>-<16 hex>-<2 hex>`.
    pub traceparent: Option<String>,
}

impl NewJob {
    /// A job on `queue` of `kind` with `payload`, policy `payment`'s budget (15 attempts).
    pub fn new(
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            queue: queue.into(),
            kind: kind.into(),
            payload,
            key: None,
            dependency: None,
            priority: 0,
            run_at: None,
            policy: "payment".into(),
            max_attempts: 15,
            ttl: None,
            quota_key: None,
            traceparent: None,
        }
    }
    /// Sets the card key for the reattempt quotas (a fingerprint or payment-method id).
    pub fn quota_key(mut self, key: impl Into<String>) -> Self {
        self.quota_key = Some(key.into());
        self
    }
    /// Sets the idempotency key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
    /// Sets the W3C `traceparent` the job's attempts join ([`NewJob::validate`] checks it).
    pub fn traceparent(mut self, tp: impl Into<String>) -> Self {
        self.traceparent = Some(tp.into());
        self
    }
    /// Sets the dependency.
    pub fn dependency(mut self, dep: impl Into<String>) -> Self {
        self.dependency = Some(dep.into());
        self
    }
    /// Sets the priority (lower runs first).
    pub fn priority(mut self, p: i32) -> Self {
        self.priority = p;
        self
    }
    /// Sets the first run time.
    pub fn run_at(mut self, t: Timestamp) -> Self {
        self.run_at = Some(t);
        self
    }
    /// Sets the policy name.
    pub fn policy(mut self, name: impl Into<String>) -> Self {
        self.policy = name.into();
        self
    }
    /// Sets the attempts allowed.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
    /// Sets the total time allowed.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// Takes budget and deadline from a retry policy.
    pub fn with_policy(mut self, policy: &redrive_policy::RetryPolicy) -> Self {
        self.policy = policy.name().to_owned();
        self.max_attempts = policy.total_max_attempts();
        self.ttl = policy.deadline();
        self
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> crate::Result<()> {
        name("queue", &self.queue)?;
        name("kind", &self.kind)?;
        if let Some(k) = &self.key {
            name("key", k)?;
        }
        if let Some(d) = &self.dependency {
            name("dependency", d)?;
        }
        if let Some(q) = &self.quota_key {
            check_quota_key(q)?;
        }
        name("policy", &self.policy)?;
        if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            return Err(crate::StoreError::Invalid {
                field: "priority",
                value: self.priority.to_string(),
                reason: format!("must be {MIN_PRIORITY}..={MAX_PRIORITY}"),
            });
        }
        if self.max_attempts == 0 || self.max_attempts > MAX_MAX_ATTEMPTS {
            return Err(crate::StoreError::Invalid {
                field: "max_attempts",
                value: self.max_attempts.to_string(),
                reason: format!("must be 1..={MAX_MAX_ATTEMPTS}"),
            });
        }
        if let Some(tp) = &self.traceparent
            && let Err(e) = crate::TraceParent::parse(tp)
        {
            return Err(crate::StoreError::Invalid {
                field: "traceparent",
                value: e.value,
                reason: format!(
                    "not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>): {}",
                    e.reason
                ),
            });
        }
        if let Some(ttl) = self.ttl
            && (ttl.is_zero() || ttl > Duration::from_secs(365 * 86_400))
        {
            {
                return Err(crate::StoreError::Invalid {
                    field: "ttl",
                    value: redrive_policy::format_duration(ttl),
                    reason: "must be more than 0 and at most 365 days".into(),
                });
            }
        }
        Ok(())
    }
}

/// Checks a `quota_key`: a valid name, and not a card number. A run of 13 to 19 digits
/// (spaces and dashes between them allowed) that passes the Luhn check is refused as a PAN;
/// the error shows only its last four digits.
///
/// # Errors
/// [`crate::StoreError::Invalid`] naming `quota_key`.
///
/// ```
/// use redrive_store::check_quota_key;
/// assert!(check_quota_key("pm_1Nv0aX2eZvKYlo2C").is_ok());
/// assert!(check_quota_key("fp:8f14e45fceea167a").is_ok());
/// let e = check_quota_key("4242 4242 4242 4242").unwrap_err();
/// assert!(e.to_string().contains("quota_key"));
/// assert!(!e.to_string().contains("4242 4242"));
/// ```
pub fn check_quota_key(v: &str) -> crate::Result<()> {
    name("quota_key", v)?;
    if let Some(pan) = find_pan(v) {
        return Err(crate::StoreError::Invalid {
            field: "quota_key",
            value: format!("…{}", &pan[pan.len() - 4..]),
            reason: "looks like a card number (13 to 19 digits passing the Luhn check); use a \
                     card fingerprint or payment-method id"
                .into(),
        });
    }
    Ok(())
}

/// The first Luhn-valid run of 13–19 digits in `v` (digits may be separated by single spaces
/// or dashes), as its digits. Longer runs of digits (order numbers) are not card numbers.
fn find_pan(v: &str) -> Option<String> {
    let mut runs: Vec<String> = vec![String::new()];
    let mut prev_sep = false;
    for c in v.chars() {
        if c.is_ascii_digit() {
            runs.last_mut()?.push(c);
            prev_sep = false;
        } else if (c == ' ' || c == '-') && !prev_sep && !runs.last()?.is_empty() {
            prev_sep = true;
        } else {
            runs.push(String::new());
            prev_sep = false;
        }
    }
    runs.into_iter()
        .find(|r| (13..=19).contains(&r.len()) && luhn(r))
}

fn luhn(digits: &str) -> bool {
    let mut sum = 0u32;
    for (i, b) in digits.bytes().rev().enumerate() {
        let mut d = u32::from(b - b'0');
        if i % 2 == 1 {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
    }
    sum.is_multiple_of(10)
}

pub(crate) fn name(field: &'static str, v: &str) -> crate::Result<()> {
    let bad = |reason: &str| crate::StoreError::Invalid {
        field,
        value: v.chars().take(80).collect(),
        reason: reason.into(),
    };
    if v.is_empty() {
        return Err(bad("must not be empty"));
    }
    if v.len() > MAX_NAME_LEN {
        return Err(bad("longer than 255 bytes"));
    }
    if v.chars().any(|c| c.is_control()) {
        return Err(bad("contains a control character"));
    }
    if let Some(c) = v.chars().find(|c| is_invisible_format(*c)) {
        return Err(bad(&format!(
            "contains U+{:04X}, a bidi-override or zero-width character",
            u32::from(c)
        )));
    }
    Ok(())
}

/// Characters that change how a name reads without being seen: bidi embeddings, overrides and
/// isolates, zero-width spaces and joiners, the byte-order mark, and other invisible formats.
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}'                 // soft hyphen
        | '\u{061C}'               // Arabic letter mark
        | '\u{115F}' | '\u{1160}'   // Hangul fillers
        | '\u{180E}'               // Mongolian vowel separator
        | '\u{200B}'..='\u{200F}'  // zero-width space, (non-)joiner, LRM, RLM
        | '\u{202A}'..='\u{202E}'  // bidi embeddings and overrides
        | '\u{2060}'..='\u{2064}'  // word joiner, invisible operators
        | '\u{2066}'..='\u{206F}'  // bidi isolates, deprecated formats
        | '\u{3164}'               // Hangul filler
        | '\u{FEFF}'               // byte-order mark, zero-width no-break space
        | '\u{FFA0}'               // halfwidth Hangul filler
        | '\u{FFF9}'..='\u{FFFB}'  // interlinear annotations
        | '\u{E0000}'..='\u{E007F}' // tags
    )
}

/// What an enqueue did.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueued {
    /// The job (new, or the existing one with the same key).
    pub job: Job,
    /// False when a job with the same queue and key already existed and was returned instead.
    pub created: bool,
}

/// A stored job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Job {
    /// Id.
    pub id: JobId,
    /// Queue.
    pub queue: String,
    /// Kind.
    pub kind: String,
    /// Payload.
    pub payload: serde_json::Value,
    /// Idempotency key.
    pub key: Option<String>,
    /// Dependency.
    pub dependency: Option<String>,
    /// Priority (lower first).
    pub priority: i32,
    /// State.
    pub state: JobState,
    /// Attempts counted in this run (reset by replay).
    pub attempts: u32,
    /// Unclassified errors in this run.
    pub exceptions: u32,
    /// Defer-phase runs in this run.
    pub defers: u32,
    /// 401s in a row.
    pub consecutive_auth: u32,
    /// Previous jittered delay (JSON: `prev_delay_ms`, whole milliseconds).
    #[serde(rename = "prev_delay_ms", serialize_with = "crate::json_ms::option")]
    pub prev_delay: Option<Duration>,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Policy name.
    pub policy: String,
    /// Next run.
    pub run_at: Timestamp,
    /// First attempt of this run.
    pub first_attempt_at: Option<Timestamp>,
    /// Total time allowed (JSON: `ttl_ms`, whole milliseconds).
    #[serde(rename = "ttl_ms", serialize_with = "crate::json_ms::option")]
    pub ttl: Option<Duration>,
    /// Absolute deadline.
    pub deadline: Option<Timestamp>,
    /// Worker holding the lease.
    pub lease_owner: Option<String>,
    /// Fencing token of the latest claim (0: never claimed).
    pub lease_token: i64,
    /// When the lease ends.
    pub lease_expires_at: Option<Timestamp>,
    /// Why it is deferred.
    pub defer_reason: Option<DeferReason>,
    /// Why it died.
    pub dead_reason: Option<DeadReason>,
    /// The last error.
    pub last_error: Option<String>,
    /// The result stored on success.
    pub result: Option<serde_json::Value>,
    /// Times replayed.
    pub replays: u32,
    /// Enqueued.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
    /// Finished.
    pub finished_at: Option<Timestamp>,
    /// The card key the reattempt quotas count against, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_key: Option<String>,
    /// The W3C `traceparent` the job was enqueued with, if any.
    pub traceparent: Option<String>,
}

impl Job {
    /// The counters the policy's decision reads.
    pub fn counters(&self) -> JobCounters {
        JobCounters {
            attempts: self.attempts,
            exceptions: self.exceptions,
            defers: self.defers,
            first_attempt_at: self.first_attempt_at,
            deadline: self.deadline,
            prev_delay: self.prev_delay,
            consecutive_auth: self.consecutive_auth,
        }
    }

    /// The lease of this claim (valid for a job returned by `claim`).
    pub fn lease(&self) -> Lease {
        Lease {
            job_id: self.id,
            token: self.lease_token,
        }
    }
}

/// A claim's fencing guard: every write by the worker carries it and is refused once it is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Lease {
    /// The job.
    pub job_id: JobId,
    /// The fencing token handed out by the claim.
    pub token: i64,
}

/// A stored attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// Id.
    pub id: i64,
    /// The job.
    pub job_id: JobId,
    /// Attempt number within its run (1-based).
    pub number: u32,
    /// Which run (0: the first; each replay adds one).
    pub replay: u32,
    /// Fencing token of the claim that made it.
    pub lease_token: i64,
    /// Worker.
    pub worker: Option<String>,
    /// Start.
    pub started_at: Timestamp,
    /// How long the call took (JSON: `duration_ms`, whole milliseconds).
    #[serde(rename = "duration_ms", serialize_with = "crate::json_ms::duration")]
    pub duration: Duration,
    /// Failure class (`success`, `permanent`, …).
    pub class: FailureClass,
    /// HTTP status, if any.
    pub http_status: Option<u16>,
    /// Error text (secrets redacted by the caller).
    pub error: Option<String>,
    /// Delay chosen after it (JSON: `delay_ms`, whole milliseconds).
    #[serde(rename = "delay_ms", serialize_with = "crate::json_ms::option")]
    pub delay: Option<Duration>,
    /// Whether the delay was slept in process (`retry`) or deferred (`defer`).
    pub mode: Option<RetryMode>,
    /// Whether it counted against `max_attempts`.
    pub counted: bool,
    /// What the dependency answered to a failed attempt: an excerpt of the response body,
    /// redacted by the handler and at most [`MAX_RESPONSE_EXCERPT`] bytes. `None`: no answer
    /// (a refused connection, a success) or a handler that keeps none.
    pub response: Option<String>,
}

/// The most bytes of a response excerpt kept with an attempt.
pub const MAX_RESPONSE_EXCERPT: usize = 2048;

/// `text` cut to at most `max` bytes on a character boundary (never inside a UTF-8 sequence).
///
/// ```
/// use redrive_store::excerpt;
/// assert_eq!(excerpt("invalid amount", 7), "invalid");
/// assert_eq!(excerpt("né", 2), "n"); // `é` is two bytes: it is left out, not split
/// ```
pub fn excerpt(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// One attempt to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAttempt {
    /// Worker.
    pub worker: Option<String>,
    /// Start.
    pub started_at: Timestamp,
    /// How long the call took.
    pub duration: Duration,
    /// Class of its outcome.
    pub class: FailureClass,
    /// HTTP status, if any.
    pub http_status: Option<u16>,
    /// Error text.
    pub error: Option<String>,
    /// Whether it counts against `max_attempts` (a first 401 does not).
    pub counted: bool,
    /// An excerpt of the dependency's answer to a failed attempt, already redacted by the
    /// handler; the store keeps its first [`MAX_RESPONSE_EXCERPT`] bytes ([`excerpt`]).
    pub response: Option<String>,
}

/// Which job kinds a claim (or a worker) takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kinds {
    /// Every kind. Only for a caller that truly runs any kind (a drain of no-op jobs, a test):
    /// a worker with a registry of handlers passes [`Kinds::Only`], so that jobs of kinds it
    /// cannot run stay in the queue for a worker that can.
    Any,
    /// Only these kinds (the kinds the worker has handlers for). Empty: nothing is claimed.
    Only(Vec<String>),
}

impl Kinds {
    /// Only these kinds.
    pub fn only<I, S>(kinds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut v: Vec<String> = kinds.into_iter().map(Into::into).collect();
        v.sort();
        v.dedup();
        Kinds::Only(v)
    }

    /// Whether a job of `kind` is taken.
    pub fn contains(&self, kind: &str) -> bool {
        match self {
            Kinds::Any => true,
            Kinds::Only(v) => v.iter().any(|k| k == kind),
        }
    }

    /// The list, or `None` for every kind.
    pub fn as_list(&self) -> Option<&[String]> {
        match self {
            Kinds::Any => None,
            Kinds::Only(v) => Some(v),
        }
    }
}

/// Claim a batch of due jobs.
#[derive(Debug, Clone)]
pub struct ClaimParams {
    /// Queues to take from; empty: every queue (but the paused ones), in one walk of the
    /// pending jobs whose cost does not depend on how many queues there are. Either way the
    /// claim takes the first jobs by (priority, run_at, id) among them.
    pub queues: Vec<String>,
    /// Kinds to take: jobs of other kinds are skipped, untouched (not leased, no attempt).
    pub kinds: Kinds,
    /// The claiming worker.
    pub worker: String,
    /// At most this many.
    pub limit: u32,
    /// Lease length.
    pub lease: Duration,
    /// Now.
    pub now: Timestamp,
}

/// How a claim ends (or continues).
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// The job stays leased; the worker sleeps `delay` and calls again.
    RetryInProcess {
        /// The delay chosen.
        delay: Duration,
    },
    /// Success, with a result.
    Succeeded {
        /// The result.
        result: serde_json::Value,
    },
    /// Back to the queue until `until`.
    Deferred {
        /// Next run.
        until: Timestamp,
        /// Why.
        reason: DeferReason,
        /// The delay chosen (recorded on the attempt).
        delay: Duration,
    },
    /// To the dead-letter table.
    Dead {
        /// Why.
        reason: DeadReason,
    },
    /// Back to the queue at once, not counted (graceful shutdown or a lost probe permit).
    Released,
}

/// A fenced write that ends or continues a claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The lease (job id and fencing token).
    pub lease: Lease,
    /// The attempt just made, if one was (none for a breaker deferral or a release).
    pub attempt: Option<NewAttempt>,
    /// The job's counters after it (from the policy's verdict).
    pub counters: JobCounters,
    /// What happens next.
    pub transition: Transition,
    /// The last error, kept on the job.
    pub error: Option<String>,
    /// Now.
    pub now: Timestamp,
    /// The decline the attempt got, if any: recorded in the completion's transaction (with
    /// the card stop it sets), so that no later claim decides a reattempt without it. Only
    /// when the completion applies (its lease still held).
    /// Boxed: a completion is held across the write's awaits, and declines are rare.
    pub decline: Option<Box<crate::NewDecline>>,
}

impl Completion {
    /// A completion of `transition`, after `attempt` if one was made. The job's last error is
    /// the attempt's error (none without an attempt).
    pub fn new(
        lease: Lease,
        attempt: Option<NewAttempt>,
        counters: JobCounters,
        transition: Transition,
        now: Timestamp,
    ) -> Self {
        let error = attempt.as_ref().and_then(|a| a.error.clone());
        Self {
            lease,
            attempt,
            counters,
            transition,
            error,
            now,
            decline: None,
        }
    }

    /// The same completion recording `decline` with it (see [`Completion::decline`]).
    pub fn with_decline(mut self, decline: crate::NewDecline) -> Self {
        self.decline = Some(Box::new(decline));
        self
    }

    /// The job succeeded with `result` after `attempt`.
    pub fn succeeded(
        lease: Lease,
        attempt: NewAttempt,
        counters: JobCounters,
        result: serde_json::Value,
        now: Timestamp,
    ) -> Self {
        Self::new(
            lease,
            Some(attempt),
            counters,
            Transition::Succeeded { result },
            now,
        )
    }

    /// `attempt` failed and the worker keeps the lease, sleeps `delay` and calls again.
    pub fn retry(
        lease: Lease,
        attempt: NewAttempt,
        counters: JobCounters,
        delay: Duration,
        now: Timestamp,
    ) -> Self {
        Self::new(
            lease,
            Some(attempt),
            counters,
            Transition::RetryInProcess { delay },
            now,
        )
    }

    /// The job goes back to the queue until `until` (after `attempt`, or without one when
    /// its dependency is blocked); `delay` is recorded on the attempt.
    pub fn deferred(
        lease: Lease,
        attempt: Option<NewAttempt>,
        counters: JobCounters,
        until: Timestamp,
        reason: DeferReason,
        delay: Duration,
        now: Timestamp,
    ) -> Self {
        Self::new(
            lease,
            attempt,
            counters,
            Transition::Deferred {
                until,
                reason,
                delay,
            },
            now,
        )
    }

    /// The job goes to the dead-letter table for `reason` (after `attempt`, if one was made).
    pub fn dead(
        lease: Lease,
        attempt: Option<NewAttempt>,
        counters: JobCounters,
        reason: DeadReason,
        now: Timestamp,
    ) -> Self {
        Self::new(lease, attempt, counters, Transition::Dead { reason }, now)
    }

    /// The job goes back to the queue at once without an attempt (graceful shutdown or a
    /// lost probe permit); `counters` are kept as they are.
    pub fn released(lease: Lease, counters: JobCounters, now: Timestamp) -> Self {
        Self::new(lease, None, counters, Transition::Released, now)
    }
}

impl Transition {
    pub(crate) fn state(&self) -> JobState {
        match self {
            Transition::RetryInProcess { .. } => JobState::Running,
            Transition::Succeeded { .. } => JobState::Succeeded,
            Transition::Deferred { .. } => JobState::Deferred,
            Transition::Dead { .. } => JobState::Dead,
            Transition::Released => JobState::Available,
        }
    }
    pub(crate) fn mode(&self) -> Option<RetryMode> {
        match self {
            Transition::RetryInProcess { .. } => Some(RetryMode::Retry),
            Transition::Deferred { .. } => Some(RetryMode::Defer),
            _ => None,
        }
    }
    pub(crate) fn delay(&self) -> Option<Duration> {
        match self {
            Transition::RetryInProcess { delay } | Transition::Deferred { delay, .. } => {
                Some(*delay)
            }
            _ => None,
        }
    }
}

/// Which jobs to list.
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    /// Only this state.
    pub state: Option<JobState>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this dead reason.
    pub dead_reason: Option<String>,
    /// Only jobs with this idempotency key (one per queue at most).
    pub key: Option<String>,
    /// Ids greater than this (keyset pagination).
    pub after: Option<JobId>,
    /// At most this many (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// A page of jobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page {
    /// Jobs, by id.
    pub jobs: Vec<Job>,
    /// The cursor for the next page (`after`), if there may be more.
    pub next: Option<JobId>,
}

/// Which jobs a bulk operation (replay, purge) takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// These jobs.
    Ids(Vec<JobId>),
    /// Every eligible job, optionally of one queue.
    All {
        /// Only this queue.
        queue: Option<String>,
    },
}

/// Jobs per queue and state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueCount {
    /// Queue.
    pub queue: String,
    /// State.
    pub state: JobState,
    /// Jobs.
    pub count: u64,
}

/// A job found with an expired lease and put back (or killed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rescued {
    /// The job.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Whether it died (`lease_expired`) because it had no attempts left.
    pub dead: bool,
}

/// A dependency's shared flow-control state (breaker, pause, rate limit), seen by the whole
/// fleet. Every write bumps `version`; writers compare-and-set on it
/// ([`Store::update_dependency`](crate::Store::update_dependency)).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dependency {
    /// Name (usually the PSP's host).
    pub name: String,
    /// The state machine's row (`state`, `open_until`, `probe_permits`, `paused_until`,
    /// `pause_reason`, `rate_limit`, …), flattened into the JSON.
    #[serde(flatten)]
    pub flow: FlowRow,
    /// Bumped by every write.
    pub version: i64,
    /// Last change.
    pub updated_at: Timestamp,
}

/// A breaker transition, as kept in the dependency's history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DependencyEvent {
    /// Id.
    pub id: i64,
    /// Dependency.
    pub dependency: String,
    /// When.
    pub at: Timestamp,
    /// From state.
    pub from: BreakerState,
    /// To state.
    pub to: BreakerState,
    /// Why.
    pub reason: String,
}

/// A new row for a dependency, written only if the stored one is still the one read.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyWrite {
    /// Dependency.
    pub dependency: String,
    /// The version read (`None`: there was no row; the write then inserts it).
    pub expect_version: Option<i64>,
    /// The new row.
    pub flow: FlowRow,
    /// The breaker's transition to record in the history, if the write makes one: (from, to,
    /// reason).
    pub transition: Option<(BreakerState, BreakerState, String)>,
    /// Now.
    pub now: Timestamp,
}

/// A breaker state to publish to the fleet (an operator's or a test's write; workers use
/// [`DependencyWrite`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerUpdate {
    /// Dependency.
    pub dependency: String,
    /// State before (the write applies only if the stored state still is this; `None`: any).
    pub expect: Option<BreakerState>,
    /// New state.
    pub state: BreakerState,
    /// While open: when probes may start.
    pub open_until: Option<Timestamp>,
    /// Probe permits for half-open.
    pub probe_permits: u32,
    /// Why (stored in the transition history).
    pub reason: String,
    /// Now.
    pub now: Timestamp,
}

/// Why a pause was set, as stored.
pub(crate) fn pause_reason_str(r: Option<PauseReason>) -> Option<&'static str> {
    r.map(PauseReason::as_str)
}

/// A list of names as the JSON array the SQL reads as a set.
pub(crate) fn json_list(v: &[String]) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "[]".into())
}

pub(crate) fn millis(t: Timestamp) -> i64 {
    t.timestamp_millis()
}

/// Milliseconds since the epoch to a timestamp (clamped to chrono's range).
pub fn from_millis(ms: i64) -> Timestamp {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
}

pub(crate) fn dur_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_refuse_invisible_and_bidi_characters() {
        for bad in [
            "pay\u{202E}ments",
            "pay\u{200B}",
            "\u{FEFF}q",
            "a\u{2066}b",
            "q\u{7}",
        ] {
            let j = NewJob::new(bad, "noop", serde_json::json!({}));
            let e = j.validate().unwrap_err();
            assert!(e.to_string().contains("queue"), "{bad:?}: {e}");
            let j = NewJob::new("q", "noop", serde_json::json!({})).key(bad);
            assert!(j.validate().unwrap_err().to_string().contains("key"));
            let j = NewJob::new("q", bad, serde_json::json!({}));
            assert!(j.validate().unwrap_err().to_string().contains("kind"));
        }
        NewJob::new("zahlungen-ü-日本", "http", serde_json::json!({}))
            .validate()
            .unwrap();
    }

    #[test]
    fn priority_is_bounded() {
        for (p, ok) in [
            (0, true),
            (MIN_PRIORITY, true),
            (MAX_PRIORITY, true),
            (MAX_PRIORITY + 1, false),
            (i32::MIN, false),
        ] {
            let j = NewJob::new("q", "noop", serde_json::json!({})).priority(p);
            assert_eq!(j.validate().is_ok(), ok, "{p}");
        }
    }
}
