//! The JSON shapes of the API (and their OpenAPI schemas). Jobs leave the service only through
//! [`JobView`], whose payload, result and error have gone through [`redrive_http::redact`]
//! (attempts' errors likewise, in [`AttemptView`]).

use chrono::{DateTime, Utc};
use redrive_store::{Attempt, Dependency, DependencyEvent, Job, JobState, QueueCount, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// A job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    /// Waiting for its first run, in the future.
    Scheduled,
    /// Ready to be claimed.
    Available,
    /// Leased to a worker.
    Running,
    /// Waiting after a failure, a rate limit or an open breaker.
    Deferred,
    /// Done.
    Succeeded,
    /// In the dead-letter table.
    Dead,
    /// Cancelled.
    Cancelled,
}

impl From<JobState> for StateName {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Scheduled => Self::Scheduled,
            JobState::Available => Self::Available,
            JobState::Running => Self::Running,
            JobState::Deferred => Self::Deferred,
            JobState::Succeeded => Self::Succeeded,
            JobState::Dead => Self::Dead,
            JobState::Cancelled => Self::Cancelled,
        }
    }
}

/// A job as the API shows it (payload redacted).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct JobView {
    /// Id (increasing in enqueue order).
    pub id: i64,
    /// Queue.
    pub queue: String,
    /// Kind (which handler runs it).
    pub kind: String,
    /// Payload, with secret values replaced by `[redacted]` (secret headers and members, URL
    /// credentials and secret query parameters).
    pub payload: Value,
    /// Idempotency key.
    pub key: Option<String>,
    /// Dependency (breaker) name.
    pub dependency: Option<String>,
    /// Priority (lower first).
    pub priority: i32,
    /// State.
    pub state: StateName,
    /// Attempts counted in this run.
    pub attempts: u32,
    /// Unclassified errors in this run.
    pub exceptions: u32,
    /// Defer-phase runs in this run.
    pub defers: u32,
    /// 401s in a row.
    pub consecutive_auth: u32,
    /// Previous jittered delay, milliseconds.
    pub prev_delay_ms: Option<u64>,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Retry policy name.
    pub policy: String,
    /// Next run.
    pub run_at: DateTime<Utc>,
    /// First attempt of this run.
    pub first_attempt_at: Option<DateTime<Utc>>,
    /// Total time allowed, milliseconds.
    pub ttl_ms: Option<u64>,
    /// Absolute deadline.
    pub deadline: Option<DateTime<Utc>>,
    /// Worker holding the lease.
    pub lease_owner: Option<String>,
    /// Fencing token of the latest claim.
    pub lease_token: i64,
    /// When the lease ends.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Why it is deferred.
    pub defer_reason: Option<String>,
    /// Why it died.
    pub dead_reason: Option<String>,
    /// The last error.
    pub last_error: Option<String>,
    /// The result stored on success.
    pub result: Option<Value>,
    /// Times replayed.
    pub replays: u32,
    /// Enqueued.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// Finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// The card key the reattempt quotas count against, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_key: Option<String>,
}

/// A duration as the views' `*_ms` fields carry it: whole milliseconds.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<Job> for JobView {
    fn from(j: Job) -> Self {
        Self {
            payload: redrive_http::redact::redact_value(&j.payload),
            id: j.id,
            queue: j.queue,
            kind: j.kind,
            key: j.key,
            dependency: j.dependency,
            priority: j.priority,
            state: j.state.into(),
            attempts: j.attempts,
            exceptions: j.exceptions,
            defers: j.defers,
            consecutive_auth: j.consecutive_auth,
            prev_delay_ms: j.prev_delay.map(millis),
            max_attempts: j.max_attempts,
            policy: j.policy,
            run_at: j.run_at,
            first_attempt_at: j.first_attempt_at,
            ttl_ms: j.ttl.map(millis),
            deadline: j.deadline,
            lease_owner: j.lease_owner,
            lease_token: j.lease_token,
            lease_expires_at: j.lease_expires_at,
            defer_reason: j.defer_reason.map(|r| r.as_str().to_owned()),
            dead_reason: j.dead_reason.map(|r| r.as_str().to_owned()),
            last_error: j
                .last_error
                .as_deref()
                .map(redrive_http::redact::redact_text),
            result: j.result.as_ref().map(redrive_http::redact::redact_value),
            replays: j.replays,
            created_at: j.created_at,
            updated_at: j.updated_at,
            finished_at: j.finished_at,
            quota_key: j.quota_key,
        }
    }
}

/// One attempt of a job.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct AttemptView {
    /// Id.
    pub id: i64,
    /// The job.
    pub job_id: i64,
    /// Attempt number within its run (1-based).
    pub number: u32,
    /// Which run (0: the first; each replay adds one).
    pub replay: u32,
    /// Fencing token of the claim that made it.
    pub lease_token: i64,
    /// Worker.
    pub worker: Option<String>,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// How long the call took, milliseconds.
    pub duration_ms: u64,
    /// Failure class (`success`, `permanent`, …).
    pub class: String,
    /// HTTP status, if any.
    pub http_status: Option<u16>,
    /// Error text.
    pub error: Option<String>,
    /// Delay chosen after it, milliseconds.
    pub delay_ms: Option<u64>,
    /// `retry` (slept in process) or `defer` (back to the queue).
    pub mode: Option<String>,
    /// Whether it counted against `max_attempts`.
    pub counted: bool,
    /// What the dependency answered to a failed attempt: an excerpt of its response body
    /// (redacted, at most 2 KiB). Absent when there was no answer or it succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
}

impl From<Attempt> for AttemptView {
    fn from(a: Attempt) -> Self {
        Self {
            id: a.id,
            job_id: a.job_id,
            number: a.number,
            replay: a.replay,
            lease_token: a.lease_token,
            worker: a.worker,
            started_at: a.started_at,
            duration_ms: millis(a.duration),
            class: a.class.as_str().to_owned(),
            http_status: a.http_status,
            error: a.error.as_deref().map(redrive_http::redact::redact_text),
            delay_ms: a.delay.map(millis),
            mode: a.mode.map(|m| m.as_str().to_owned()),
            counted: a.counted,
            response: a.response.as_deref().map(redrive_http::redact::redact_text),
        }
    }
}

/// The body of `POST /v1/jobs`: the fields of `redrive enqueue`.
///
/// The names' pattern is the store's rule: no control character, no bidi-override or
/// zero-width character (the tag characters U+E0000..U+E007F, refused too, are left out: a
/// pattern without the `u` flag cannot name them).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRequest {
    /// Queue name.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD\\u061C\\u115F\\u1160\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB]+$"
    )]
    pub queue: String,
    /// Job kind (`http`, `noop`, or one of your own).
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD\\u061C\\u115F\\u1160\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB]+$"
    )]
    pub kind: String,
    /// JSON payload (default `{}`); for `http`: `{method, url, headers?, body?, timeout_ms?}`.
    #[serde(default)]
    pub payload: Option<Value>,
    /// Idempotency key, unique per queue (default: the `Idempotency-Key` header).
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD\\u061C\\u115F\\u1160\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB]+$"
    )]
    pub key: Option<String>,
    /// Run after this delay (`250ms`, `30s`, `5m`, `1h`; at most 365 days); not with `run_at`.
    #[schema(pattern = "^[0-9]{1,6}(ms|s|m|h)$")]
    pub delay: Option<String>,
    /// Run at this RFC 3339 time; not with `delay`.
    pub run_at: Option<DateTime<Utc>>,
    /// Retry policy name (default `payment`).
    #[schema(min_length = 1, max_length = 255)]
    pub policy: Option<String>,
    /// Dependency (breaker) name; `http` jobs default to the URL's host.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00AD\\u061C\\u115F\\u1160\\u180E\\u200B-\\u200F\\u202A-\\u202E\\u2060-\\u2064\\u2066-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB]+$"
    )]
    pub dependency: Option<String>,
    /// Priority: lower runs first (default 0), -1000000..=1000000.
    #[schema(minimum = -1_000_000, maximum = 1_000_000)]
    pub priority: Option<i32>,
    /// Attempts allowed (default: the policy's total, both phases). It may lower the policy's
    /// budget, never raise it: a value above the policy's total (`payment`: 15) is refused
    /// with 422, and the workers stop the job after this many attempts.
    #[schema(minimum = 1, maximum = 10000)]
    pub max_attempts: Option<u32>,
    /// The card key the networks' reattempt quotas count against: a card fingerprint or a
    /// payment-method id. A card number (13–19 digits passing the Luhn check) is refused.
    #[schema(min_length = 1, max_length = 255)]
    pub quota_key: Option<String>,
}

/// What `POST /v1/jobs` did.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct EnqueueResponse {
    /// False when a job with the same queue and key already existed and is returned instead.
    pub created: bool,
    /// The job.
    pub job: JobView,
}

/// Query of `GET /v1/jobs`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only jobs in this state.
    pub state: Option<StateName>,
    /// Only jobs of this queue.
    pub queue: Option<String>,
    /// Only the jobs with this idempotency key (at most one per queue).
    #[param(min_length = 1, max_length = 255)]
    pub key: Option<String>,
    /// At most this many (1..=1000, default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Only jobs with a greater id: the `next` of the previous page.
    #[param(minimum = 0)]
    pub after: Option<i64>,
}

/// A page of jobs.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct JobPage {
    /// Jobs, by id.
    pub jobs: Vec<JobView>,
    /// Pass as `after` for the next page; `null` on the last page.
    pub next: Option<i64>,
}

/// One job with every attempt.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct JobDetail {
    /// The job.
    pub job: JobView,
    /// Its attempts, oldest first (across replays).
    pub attempts: Vec<AttemptView>,
    /// Why the job, waiting to run (scheduled, available, deferred), is not being run: its
    /// queue paused, its dependency's breaker open or paused, a rate limit, its `run_at` in
    /// the future. Read from those rows when asked; empty when nothing holds it back, or
    /// when it is running or finished.
    pub waiting_because: Vec<WaitingView>,
}

/// One reason a job waits.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct WaitingView {
    /// `queue_paused`, `breaker_open`, `breaker_probing`, `dependency_paused`,
    /// `rate_limited` or `run_at`.
    pub reason: String,
    /// The reason in words (`breaker open (forced by an operator)`).
    pub text: String,
    /// When it ends by itself, if it does.
    pub until: Option<DateTime<Utc>>,
}

impl From<redrive_store::Waiting> for WaitingView {
    fn from(w: redrive_store::Waiting) -> Self {
        Self {
            reason: w.code().to_owned(),
            text: w.to_string(),
            until: w.until(),
        }
    }
}

/// Jobs of one queue in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CountView {
    /// Queue.
    pub queue: String,
    /// State.
    pub state: StateName,
    /// Jobs.
    pub count: u64,
}

impl From<QueueCount> for CountView {
    fn from(c: QueueCount) -> Self {
        Self {
            queue: c.queue,
            state: c.state.into(),
            count: c.count,
        }
    }
}

/// A breaker transition.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TransitionView {
    /// When.
    pub at: DateTime<Utc>,
    /// From state.
    pub from: String,
    /// To state.
    pub to: String,
    /// Why.
    pub reason: String,
}

impl From<DependencyEvent> for TransitionView {
    fn from(e: DependencyEvent) -> Self {
        Self {
            at: e.at,
            from: e.from.as_str().to_owned(),
            to: e.to.as_str().to_owned(),
            reason: e.reason,
        }
    }
}

/// A dependency's breaker and pause, as the fleet shares them.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct BreakerView {
    /// Dependency name.
    pub name: String,
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// While open: when probes may start.
    pub open_until: Option<DateTime<Utc>>,
    /// When the next probe may run (open: `open_until`; half-open with permits: now).
    pub next_probe_at: Option<DateTime<Utc>>,
    /// Probe calls left in half-open.
    pub probe_permits: u32,
    /// Paused (after a `Retry-After`) until then.
    pub paused_until: Option<DateTime<Utc>>,
    /// Why it is paused (`retry_after`, `operator`).
    pub pause_reason: Option<String>,
    /// The rate limit in force toward the dependency, requests per second (configured, or
    /// learned from its 429s); none when absent.
    pub rate_limit: Option<f64>,
    /// An operator's override: `normal`, `forced_open` or `forced_closed`.
    pub mode: String,
    /// The state calls see: the forced one, else `state`.
    pub effective_state: String,
    /// The state as the screens show it: `effective_state`, marked ` (forced)` when an
    /// operator forced it (`open (forced)`, `closed (forced)`), else `state`.
    pub state_label: String,
    /// An operator paused the dependency until resumed (`paused_until` is then the year
    /// 9999).
    pub paused_until_resumed: bool,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// Recent transitions, newest first.
    pub recent_transitions: Vec<TransitionView>,
}

impl BreakerView {
    /// The view of `d` at `now` with its recent transitions.
    pub fn new(d: Dependency, now: Timestamp, transitions: Vec<TransitionView>) -> Self {
        use redrive_policy::BreakerState;
        let f = d.flow;
        let next_probe_at = match f.state {
            BreakerState::Open => Some(f.open_until.unwrap_or(now)),
            BreakerState::HalfOpen if f.probe_permits > 0 => Some(now),
            _ => None,
        };
        let paused = f.paused_until.filter(|t| *t > now);
        Self {
            name: d.name,
            state: f.state.as_str().to_owned(),
            open_until: f.open_until,
            next_probe_at,
            probe_permits: f.probe_permits,
            paused_until: paused,
            pause_reason: f
                .pause_reason
                .filter(|_| paused.is_some())
                .map(|r| r.as_str().to_owned()),
            rate_limit: f.rate,
            mode: f.mode.as_str().to_owned(),
            effective_state: f.effective_state().as_str().to_owned(),
            state_label: f.state_label().to_owned(),
            paused_until_resumed: f.paused_until_resumed(),
            updated_at: d.updated_at,
            recent_transitions: transitions,
        }
    }
}

/// `GET /v1/breakers`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct BreakersResponse {
    /// Every known dependency, by name.
    pub breakers: Vec<BreakerView>,
}

/// `GET /v1/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct StatsResponse {
    /// Jobs per queue and state (only non-zero counts).
    pub counts: Vec<CountView>,
    /// Breakers.
    pub breakers: Vec<BreakerView>,
    /// Jobs waiting (scheduled, available, deferred) for a queue and kind that no live worker
    /// runs: they will not run until such a worker starts (empty when every waiting job has
    /// one).
    pub unhandled: Vec<UnhandledView>,
    /// Queues an operator paused (`redrive queue pause`): their jobs wait, however many the
    /// counts show available, until resumed. Every paused queue, by name.
    pub paused_queues: Vec<crate::operator::PausedQueueView>,
    /// What was left out by the `limit` (default 100): the quietest queues, the closed
    /// breakers, the smallest unhandled groups.
    pub more: MoreView,
}

/// How many rows a bounded listing left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct MoreView {
    /// Queues not in `counts`.
    pub queues: usize,
    /// Breakers not in `breakers`.
    pub breakers: usize,
    /// Rows not in `unhandled`.
    pub unhandled: usize,
}

/// Jobs waiting for a queue and kind no live worker runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct UnhandledView {
    /// Queue.
    pub queue: String,
    /// Kind.
    pub kind: String,
    /// Jobs waiting.
    pub jobs: u64,
    /// The earliest `run_at` among them.
    pub oldest_run_at: DateTime<Utc>,
}

impl From<redrive_store::Unhandled> for UnhandledView {
    fn from(u: redrive_store::Unhandled) -> Self {
        Self {
            queue: u.queue,
            kind: u.kind,
            jobs: u.jobs,
            oldest_run_at: u.oldest_run_at,
        }
    }
}

/// A live worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct WorkerView {
    /// Name, unique in the fleet (the `lease_owner` of the jobs it runs).
    pub name: String,
    /// Host.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Queues it claims from (empty: every queue).
    pub queues: Vec<String>,
    /// Kinds it runs (`null`: every kind).
    pub kinds: Option<Vec<String>>,
    /// Jobs it runs at once.
    pub concurrency: u32,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub last_seen: DateTime<Utc>,
    /// The offset of its host's clock to the database's (database − host) in milliseconds,
    /// as it last measured it (`null`: its clock is not synced to the database's).
    pub clock_offset_ms: Option<i64>,
    /// The policies it runs: `v3` (the stored version 3), `file (differs from v3)`,
    /// `built-in`… (`null`: it does not say).
    pub policy_version: Option<String>,
}

impl From<redrive_store::WorkerInfo> for WorkerView {
    fn from(w: redrive_store::WorkerInfo) -> Self {
        Self {
            kinds: w.kinds.as_list().map(<[String]>::to_vec),
            name: w.name,
            host: w.host,
            pid: w.pid,
            queues: w.queues,
            concurrency: w.concurrency,
            started_at: w.started_at,
            last_seen: w.last_seen,
            clock_offset_ms: w.clock_offset_ms,
            policy_version: w.policy_version,
        }
    }
}

/// `GET /v1/workers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct WorkersResponse {
    /// The live workers, by name.
    pub workers: Vec<WorkerView>,
    /// A worker not seen for this long counts as gone.
    pub stale_after_seconds: u64,
}

/// `GET /healthz` and `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `unavailable`.
    pub status: String,
    /// The store backend (`sqlite` or `postgres`), for `/readyz`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}
