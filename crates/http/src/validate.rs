//! Enqueue validation, shared by `redrive enqueue` and `POST /v1/jobs`: what is refused at the
//! door never reaches a worker.
//!
//! [`validate_new_job`] checks a job before it is stored; [`check_same_request`] compares a
//! job with the one already stored under its queue and key. The rules:
//!
//! | what | rule |
//! |---|---|
//! | payload | at most [`MAX_PAYLOAD_BYTES`] (1 MiB) as JSON |
//! | queue, kind, key, dependency, policy | 1..=255 bytes; no control, bidi-override or zero-width characters |
//! | priority | [`redrive_store::MIN_PRIORITY`]`..=`[`redrive_store::MAX_PRIORITY`] |
//! | `delay` / `run_at` | at most [`MAX_DELAY`] (365 days) ahead; `run_at` at most 365 days back |
//! | same queue and key | the same kind and payload, else [`EnqueueError::KeyConflict`] |
//!
//! and, for the `http` kind, the payload `{method, url, headers?, body?, timeout_ms?}`:
//!
//! | field | rule |
//! |---|---|
//! | `method` | one of [`METHODS`] (upper case) |
//! | `url` | an absolute `http://` or `https://` URL with a host, at most 8 KiB, no whitespace or control characters |
//! | `headers` | at most 100; names are RFC 9110 tokens (`!#$%&'*+-.^_\`\|~`, digits, letters); values are visible ASCII, space and tab — no CR, LF, NUL or other controls — at most 8 KiB; framing and hop-by-hop headers (`Host`, `Content-Length`, `Transfer-Encoding`, `Connection`, …) and `Idempotency-Key` (the job's key is sent) are refused |
//! | `body` | any JSON (a string is sent as it is) |
//! | `timeout_ms` | 1..=600000 |
//!
//! Errors name the field (`payload.headers.X-Trace`) and never echo a header value.

use std::time::Duration;

use redrive_store::{Job, NewJob, StoreError, Timestamp};
use serde_json::Value;

use crate::job::HttpPayload;
use crate::redact::redact_text;

/// The largest payload accepted, as serialised JSON (the API's body limit).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The furthest ahead a job may be scheduled (`delay`, `run_at`), and the furthest back a
/// `run_at` may lie.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 86_400);

/// The methods an `http` job may use.
pub const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// The most headers an `http` job may set.
pub const MAX_HEADERS: usize = 100;

/// The longest URL or header value.
pub const MAX_URL_OR_VALUE: usize = 8 * 1024;

/// The per-call timeout range, in milliseconds.
pub const TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 1..=600_000;

/// Headers an `http` job may not set: framing and hop-by-hop ones, and the key header.
pub const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "idempotency-key",
];

/// Why a job was refused at enqueue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// A field is invalid.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field, dotted (`payload.url`, `payload.headers.X-Trace`, `priority`).
        field: String,
        /// The value given, redacted and cut to 200 characters (empty for header values).
        value: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// The queue already has a job with this key, for another request.
    #[error(
        "key {key:?} is already used in queue {queue:?} by job {id} with a different {what}; \
         use a new key for a new request"
    )]
    KeyConflict {
        /// The queue.
        queue: String,
        /// The key.
        key: String,
        /// The existing job.
        id: i64,
        /// What differs: `kind` or `payload`.
        what: &'static str,
    },
}

impl EnqueueError {
    /// A field error; the value is redacted and cut.
    pub fn invalid(field: impl Into<String>, value: &str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            value: redact_text(value).chars().take(200).collect(),
            reason: reason.into(),
        }
    }

    /// The field, for a field error.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::KeyConflict { .. } => Some("key"),
        }
    }
}

impl From<StoreError> for EnqueueError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid {
                field,
                value,
                reason,
            } => Self::invalid(field, &value, reason),
            other => Self::invalid("job", "", other.to_string()),
        }
    }
}

/// Checks a job before it is stored: the store's field rules, the payload size, the schedule
/// bounds relative to `now`, and the payload of the kinds redrive knows (`http`).
///
/// # Errors
/// [`EnqueueError::Invalid`] naming the first bad field.
pub fn validate_new_job(job: &NewJob, now: Timestamp) -> Result<(), EnqueueError> {
    job.validate()?;
    check_confusable("queue", &job.queue)?;
    if let Some(key) = &job.key {
        check_confusable("key", key)?;
    }
    if let Some(dependency) = &job.dependency {
        check_confusable("dependency", dependency)?;
    }
    let size = serde_json::to_vec(&job.payload).map_or(usize::MAX, |b| b.len());
    if size > MAX_PAYLOAD_BYTES {
        return Err(EnqueueError::invalid(
            "payload",
            "",
            format!("{size} bytes of JSON; at most {MAX_PAYLOAD_BYTES}"),
        ));
    }
    if let Some(t) = job.run_at {
        check_run_at(t, now)?;
    }
    if job.kind == "http" {
        HttpPayload::parse(&job.payload)?;
    }
    Ok(())
}

/// The script of a letter that looks like a Latin one (`None`: Latin or another script).
fn confusable_script(c: char) -> Option<&'static str> {
    match c {
        '\u{0370}'..='\u{03FF}' | '\u{1F00}'..='\u{1FFF}' => Some("Greek"),
        '\u{0400}'..='\u{052F}'
        | '\u{1C80}'..='\u{1C8F}'
        | '\u{2DE0}'..='\u{2DFF}'
        | '\u{A640}'..='\u{A69F}' => Some("Cyrillic"),
        '\u{0530}'..='\u{058F}' => Some("Armenian"),
        '\u{FF01}'..='\u{FF5E}' => Some("fullwidth"),
        _ => None,
    }
}

/// Refuses a name that mixes Latin letters with letters of a script whose letters look like
/// Latin ones (Cyrillic `а` for `a`): `pаyments` and `payments` would be two queues, or two
/// keys, that no one can tell apart on a screen. A name wholly in one script is fine.
///
/// # Errors
/// [`EnqueueError::Invalid`] naming the field and the first such character as `U+XXXX`.
pub fn check_confusable(field: &'static str, value: &str) -> Result<(), EnqueueError> {
    if !value.chars().any(|c| c.is_ascii_alphabetic()) {
        return Ok(());
    }
    if let Some((c, script)) = value
        .chars()
        .find_map(|c| confusable_script(c).map(|s| (c, s)))
    {
        return Err(EnqueueError::invalid(
            field,
            &value.escape_unicode().to_string(),
            format!(
                "mixes Latin letters with U+{:04X} ({script}), which looks like a Latin letter; \
                 use one script",
                c as u32
            ),
        ));
    }
    Ok(())
}

/// Checks a `run_at` against [`MAX_DELAY`] either way from `now`.
///
/// # Errors
/// [`EnqueueError::Invalid`] for field `run_at`.
pub fn check_run_at(t: Timestamp, now: Timestamp) -> Result<(), EnqueueError> {
    let max = chrono::Duration::from_std(MAX_DELAY).unwrap_or(chrono::Duration::MAX);
    if t > now + max || t < now - max {
        return Err(EnqueueError::invalid(
            "run_at",
            &t.to_rfc3339(),
            "must be within 365 days of now",
        ));
    }
    Ok(())
}

/// Checks a delay against [`MAX_DELAY`] and turns it into the run time.
///
/// # Errors
/// [`EnqueueError::Invalid`] for field `delay`.
pub fn run_at_after(delay: Duration, now: Timestamp) -> Result<Timestamp, EnqueueError> {
    if delay > MAX_DELAY {
        return Err(EnqueueError::invalid(
            "delay",
            &redrive_policy::format_duration(delay),
            "must be at most 365 days",
        ));
    }
    chrono::Duration::from_std(delay)
        .map(|d| now + d)
        .map_err(|_| EnqueueError::invalid("delay", "", "too long"))
}

/// When a new job first runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAt {
    /// As soon as a worker is free.
    #[default]
    Now,
    /// After a delay from the time of the enqueue (at most [`MAX_DELAY`]).
    After(Duration),
    /// At this time.
    At(Timestamp),
}

/// A job as `redrive enqueue`, `POST /v1/jobs` and the schedules ask for it, before its
/// defaults are filled in: the one assembly of a [`NewJob`] every front door shares.
///
/// # Defaults
/// `priority` 0; `max_attempts` and `ttl` from the policy; `dependency`, for the `http`
/// kind, the URL's host ([`default_dependency`]); `run_at` now.
///
/// # Example
/// ```
/// use redrive_http::validate::{JobRequest, RunAt};
/// let policies = redrive_policy::PolicySet::builtin();
/// let policy = policies.get("payment").unwrap();
/// let now = chrono::Utc::now();
/// let job = JobRequest::new("payments", "http", serde_json::json!({
///     "method": "POST", "url": "https://psp.example:8443/charges",
/// }))
/// .build(policy, now)
/// .unwrap();
/// assert_eq!(job.dependency.as_deref(), Some("psp.example:8443"));
/// assert!(JobRequest { run_at: RunAt::After(std::time::Duration::from_secs(400 * 86_400)),
///     ..JobRequest::new("q", "noop", serde_json::json!({})) }
///     .build(policy, now).is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct JobRequest {
    /// The queue.
    pub queue: String,
    /// The kind (the handler that runs it).
    pub kind: String,
    /// The payload.
    pub payload: Value,
    /// The dedupe key in the queue.
    pub key: Option<String>,
    /// The priority; 0 when not given.
    pub priority: Option<i32>,
    /// The attempt budget; the policy's when not given. It may lower the policy's budget
    /// (both phases, [`redrive_policy::RetryPolicy::total_max_attempts`]), never raise it: a
    /// larger value is refused, and the runtime runs the smaller of the two
    /// ([`redrive_policy::RetryPolicy::limited_to`]).
    pub max_attempts: Option<u32>,
    /// The dependency (breaker) name; for `http` jobs the URL's host when not given.
    pub dependency: Option<String>,
    /// When it first runs.
    pub run_at: RunAt,
    /// The card key the networks' reattempt quotas count against (never a card number).
    pub quota_key: Option<String>,
}

impl JobRequest {
    /// A request for `kind` on `queue` with every optional field at its default.
    #[must_use]
    pub fn new(queue: impl Into<String>, kind: impl Into<String>, payload: Value) -> Self {
        Self {
            queue: queue.into(),
            kind: kind.into(),
            payload,
            key: None,
            priority: None,
            max_attempts: None,
            dependency: None,
            run_at: RunAt::Now,
            quota_key: None,
        }
    }

    /// The job with its defaults filled in, not yet validated (a schedule validates its
    /// own fields first).
    ///
    /// # Errors
    /// [`EnqueueError::Invalid`] for a `delay` over [`MAX_DELAY`].
    pub fn assemble(
        self,
        policy: &redrive_policy::RetryPolicy,
        now: Timestamp,
    ) -> Result<NewJob, EnqueueError> {
        let dependency = self
            .dependency
            .or_else(|| default_dependency(&self.kind, &self.payload));
        let mut job = NewJob::new(self.queue, self.kind, self.payload).with_policy(policy);
        job.key = self.key;
        job.quota_key = self.quota_key;
        job.priority = self.priority.unwrap_or(0);
        if let Some(n) = self.max_attempts {
            job.max_attempts = check_max_attempts(n, policy)?;
        }
        job.dependency = dependency;
        job.run_at = match self.run_at {
            RunAt::Now => None,
            RunAt::After(delay) => Some(run_at_after(delay, now)?),
            RunAt::At(t) => Some(t),
        };
        Ok(job)
    }

    /// [`assemble`](Self::assemble), then [`validate_new_job`].
    ///
    /// # Errors
    /// [`EnqueueError::Invalid`] naming the first bad field.
    pub fn build(
        self,
        policy: &redrive_policy::RetryPolicy,
        now: Timestamp,
    ) -> Result<NewJob, EnqueueError> {
        let job = self.assemble(policy, now)?;
        validate_new_job(&job, now)?;
        Ok(job)
    }
}

/// A job's own attempt budget: from 1 to its policy's total
/// ([`redrive_policy::RetryPolicy::total_max_attempts`]). A larger one would be stored and
/// never reached (the policy's hard limit wins), so it is refused rather than kept silently.
///
/// # Errors
/// [`EnqueueError::Invalid`] for field `max_attempts`, naming the policy and its limit.
pub fn check_max_attempts(
    n: u32,
    policy: &redrive_policy::RetryPolicy,
) -> Result<u32, EnqueueError> {
    let limit = policy.total_max_attempts();
    if n == 0 || n > limit {
        return Err(EnqueueError::invalid(
            "max_attempts",
            &n.to_string(),
            format!(
                "must be from 1 to {limit}, the most policy {:?} allows (a job may lower its \
                 policy's budget, not raise it)",
                policy.name()
            ),
        ));
    }
    Ok(n)
}

/// Compares a job with the one the store returned for its queue and key: the same kind and
/// payload is a repeat (fine); anything else is [`EnqueueError::KeyConflict`].
///
/// # Errors
/// [`EnqueueError::KeyConflict`] naming the key and what differs.
pub fn check_same_request(job: &NewJob, existing: &Job) -> Result<(), EnqueueError> {
    let what = if job.kind != existing.kind {
        "kind"
    } else if job.payload != existing.payload {
        "payload"
    } else {
        return Ok(());
    };
    Err(EnqueueError::KeyConflict {
        queue: existing.queue.clone(),
        key: existing.key.clone().unwrap_or_default(),
        id: existing.id,
        what,
    })
}

/// The dependency an `http` job defaults to: its URL's host (with the port, if any).
pub fn default_dependency(kind: &str, payload: &Value) -> Option<String> {
    if kind != "http" {
        return None;
    }
    let url = reqwest::Url::parse(payload.get("url")?.as_str()?).ok()?;
    let host = url.host_str()?;
    Some(match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    })
}

/// Whether a header name is an RFC 9110 token.
pub fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

/// What is wrong with a header value, if anything: visible ASCII, space and tab only.
pub fn header_value_problem(v: &str) -> Option<&'static str> {
    if v.len() > MAX_URL_OR_VALUE {
        return Some("is longer than 8 KiB");
    }
    for b in v.bytes() {
        match b {
            b'\r' | b'\n' => return Some("contains CR or LF (header injection)"),
            0 => return Some("contains NUL"),
            b'\t' | b' '..=b'~' => {}
            0x80.. => return Some("contains a non-ASCII character"),
            _ => return Some("contains a control character"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(payload: Value) -> EnqueueError {
        let job = NewJob::new("q", "http", payload);
        validate_new_job(&job, chrono::Utc::now()).unwrap_err()
    }

    fn field(payload: Value) -> String {
        err(payload).field().unwrap().to_owned()
    }

    #[test]
    fn http_payloads_are_refused_naming_the_field() {
        let ok = json!({"method": "POST", "url": "https://psp.example/v1/charges",
                        "headers": {"Authorization": "Bearer x", "X-Trace": "a\tb"},
                        "body": {"amount": 5}, "timeout_ms": 2000});
        validate_new_job(&NewJob::new("q", "http", ok), chrono::Utc::now()).unwrap();
        assert_eq!(field(json!({})), "payload");
        assert_eq!(
            field(json!({"method": "FETCH", "url": "http://h/"})),
            "payload.method"
        );
        assert_eq!(
            field(json!({"method": "post", "url": "http://h/"})),
            "payload.method"
        );
        assert_eq!(
            field(json!({"method": "GET", "url": "ftp://h/"})),
            "payload.url"
        );
        assert_eq!(
            field(json!({"method": "GET", "url": "/relative"})),
            "payload.url"
        );
        assert_eq!(
            field(json!({"method": "GET", "url": "http://h/a\r\nb"})),
            "payload.url"
        );
        assert_eq!(
            field(json!({"method": "GET", "url": "http://h/", "timeout_ms": 0})),
            "payload.timeout_ms"
        );
        assert_eq!(
            field(json!({"method": "GET", "url": "http://h/", "timeout_ms": 600001})),
            "payload.timeout_ms"
        );
        let e = err(json!({"method": "GET", "url": "http://h/",
                           "headers": {"X-Api-Key": "k\r\nX-Evil: 1"}}));
        assert_eq!(e.field(), Some("payload.headers.X-Api-Key"));
        assert!(
            !e.to_string().contains("Evil"),
            "the value is not echoed: {e}"
        );
        assert!(e.to_string().contains("CR or LF"), "{e}");
        for (name, value) in [
            ("Bad Name", "v"),
            ("X-A", "nul\0"),
            ("Host", "x"),
            ("Content-Length", "3"),
            ("idempotency-key", "k"),
            ("X-U", "é"),
        ] {
            let e = err(json!({"method": "GET", "url": "http://h/", "headers": {name: value}}));
            assert_eq!(
                e.field(),
                Some(format!("payload.headers.{name}").as_str()),
                "{e}"
            );
        }
        // Each reserved header says why it is reserved: a Host refusal talked about
        // Idempotency-Key (issue 36).
        for (name, says, not) in [
            ("Host", "payload.url", "Idempotency-Key"),
            ("Content-Length", "frames the body", "Idempotency-Key"),
            ("Connection", "hop-by-hop", "Idempotency-Key"),
            ("Idempotency-Key", "the job's key", "Host"),
        ] {
            let e = err(json!({"method": "GET", "url": "http://h/", "headers": {name: "x"}}))
                .to_string();
            assert!(e.contains(says) && !e.contains(not), "{name}: {e}");
        }
    }

    #[test]
    fn size_and_schedule_are_bounded() {
        let big = NewJob::new("q", "noop", json!({"x": "a".repeat(MAX_PAYLOAD_BYTES)}));
        let e = validate_new_job(&big, chrono::Utc::now()).unwrap_err();
        assert_eq!(e.field(), Some("payload"));
        let now = chrono::Utc::now();
        let mut j = NewJob::new("q", "noop", json!({}));
        j.run_at = Some(now + chrono::Duration::days(366));
        assert_eq!(
            validate_new_job(&j, now).unwrap_err().field(),
            Some("run_at")
        );
        j.run_at = Some(now - chrono::Duration::days(366));
        assert_eq!(
            validate_new_job(&j, now).unwrap_err().field(),
            Some("run_at")
        );
        j.run_at = Some(now + chrono::Duration::days(364));
        validate_new_job(&j, now).unwrap();
        assert!(run_at_after(Duration::from_secs(366 * 86_400), now).is_err());
        assert_eq!(
            run_at_after(Duration::from_secs(5), now).unwrap(),
            now + chrono::Duration::seconds(5)
        );
    }

    #[test]
    fn dependency_defaults_to_the_host_without_credentials() {
        assert_eq!(
            default_dependency("http", &json!({"url": "https://u:pw@psp.example:8443/x"})),
            Some("psp.example:8443".into())
        );
        assert_eq!(
            default_dependency("http", &json!({"url": "https://psp.example/x"})),
            Some("psp.example".into())
        );
        assert_eq!(
            default_dependency("noop", &json!({"url": "https://h/"})),
            None
        );
    }
}
