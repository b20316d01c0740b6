//! Rows as the database returns them, and their conversion to the public model.

use std::time::Duration;

use redrive_policy::{
    BreakerMode, BreakerState, DeadReason, DeferReason, FailureClass, FlowRow, PauseReason,
    RetryMode,
};

use crate::model::{Attempt, Dependency, DependencyEvent, Job, JobState, from_millis};
use crate::{Result, StoreError};

/// The columns of `redrive_jobs`, in [`JobRow`]'s order.
pub(crate) const JOB_COLS: &str = "id, queue, kind, payload, idempotency_key, dependency, priority, \
    state, attempts, exceptions, defers, consecutive_auth, prev_delay_ms, max_attempts, policy, \
    run_at, first_attempt_at, ttl_ms, deadline, lease_owner, lease_token, lease_expires_at, \
    defer_reason, dead_reason, last_error, result, replays, created_at, updated_at, finished_at, \
    quota_key, traceparent";

/// A job's row, decoded by position: the statements that return it select [`JOB_COLS`] in
/// this order. (By name, each of its 32 columns was a hash lookup: a twentieth of a busy
/// worker's CPU.) Debug builds check the columns' names against [`JOB_COLS`]. SQLite's claim
/// returns it as one JSON array of the same columns ([`JobRow::from_json`]).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct JobRow {
    id: i64,
    queue: String,
    kind: String,
    payload: String,
    idempotency_key: Option<String>,
    dependency: Option<String>,
    priority: i64,
    state: String,
    attempts: i64,
    exceptions: i64,
    defers: i64,
    consecutive_auth: i64,
    prev_delay_ms: Option<i64>,
    max_attempts: i64,
    policy: String,
    run_at: i64,
    first_attempt_at: Option<i64>,
    ttl_ms: Option<i64>,
    deadline: Option<i64>,
    lease_owner: Option<String>,
    lease_token: i64,
    lease_expires_at: Option<i64>,
    defer_reason: Option<String>,
    dead_reason: Option<String>,
    last_error: Option<String>,
    result: Option<String>,
    replays: i64,
    created_at: i64,
    updated_at: i64,
    finished_at: Option<i64>,
    quota_key: Option<String>,
    traceparent: Option<String>,
}

/// The names of [`JOB_COLS`], in order (a test holds the two together).
const JOB_COL_NAMES: [&str; 32] = [
    "id",
    "queue",
    "kind",
    "payload",
    "idempotency_key",
    "dependency",
    "priority",
    "state",
    "attempts",
    "exceptions",
    "defers",
    "consecutive_auth",
    "prev_delay_ms",
    "max_attempts",
    "policy",
    "run_at",
    "first_attempt_at",
    "ttl_ms",
    "deadline",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
    "defer_reason",
    "dead_reason",
    "last_error",
    "result",
    "replays",
    "created_at",
    "updated_at",
    "finished_at",
    "quota_key",
    "traceparent",
];

/// Column `i` of a job's row (named in the error if it does not decode).
fn job_col<'r, R, T>(row: &'r R, i: usize) -> std::result::Result<T, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    T: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    row.try_get(i).map_err(|e| match e {
        sqlx::Error::ColumnDecode { source, .. } => sqlx::Error::ColumnDecode {
            index: format!("{:?}", JOB_COL_NAMES.get(i).copied().unwrap_or("?")),
            source,
        },
        e => e,
    })
}

impl<'r, R> sqlx::FromRow<'r, R> for JobRow
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> std::result::Result<Self, sqlx::Error> {
        #[cfg(debug_assertions)]
        {
            use sqlx::Column as _;
            let got: Vec<&str> = row.columns().iter().map(|c| c.name()).collect();
            assert_eq!(
                got, JOB_COL_NAMES,
                "a statement returning jobs must select JOB_COLS in order"
            );
        }
        let mut i = 0;
        macro_rules! next {
            () => {{
                i += 1;
                job_col(row, i - 1)?
            }};
        }
        // In JOB_COLS's order.
        Ok(JobRow {
            id: next!(),
            queue: next!(),
            kind: next!(),
            payload: next!(),
            idempotency_key: next!(),
            dependency: next!(),
            priority: next!(),
            state: next!(),
            attempts: next!(),
            exceptions: next!(),
            defers: next!(),
            consecutive_auth: next!(),
            prev_delay_ms: next!(),
            max_attempts: next!(),
            policy: next!(),
            run_at: next!(),
            first_attempt_at: next!(),
            ttl_ms: next!(),
            deadline: next!(),
            lease_owner: next!(),
            lease_token: next!(),
            lease_expires_at: next!(),
            defer_reason: next!(),
            dead_reason: next!(),
            last_error: next!(),
            result: next!(),
            replays: next!(),
            created_at: next!(),
            updated_at: next!(),
            finished_at: next!(),
            quota_key: next!(),
            traceparent: next!(),
        })
    }
}

fn u32_of(what: &'static str, v: i64) -> Result<u32> {
    u32::try_from(v).map_err(|_| StoreError::Corrupt {
        what,
        detail: format!("{v} is out of range"),
    })
}

/// A stored duration in milliseconds (`what`: its column, named if it is corrupt).
fn ms_of(what: &'static str, v: i64) -> Result<Duration> {
    u64::try_from(v)
        .map(Duration::from_millis)
        .map_err(|_| StoreError::Corrupt {
            what,
            detail: format!("{v} is negative"),
        })
}

impl JobRow {
    /// A row given as one JSON array of [`JOB_COLS`], in order (SQLite's claim).
    #[cfg(feature = "sqlite")]
    pub(crate) fn from_json(row: &str) -> Result<JobRow> {
        serde_json::from_str(row).map_err(|e| StoreError::Corrupt {
            what: "claimed job row",
            detail: e.to_string(),
        })
    }

    pub(crate) fn into_job(self) -> Result<Job> {
        let json = |what: &'static str, s: &str| {
            serde_json::from_str(s).map_err(|e| StoreError::Corrupt {
                what,
                detail: e.to_string(),
            })
        };
        Ok(Job {
            id: self.id,
            payload: json("payload", &self.payload)?,
            result: self
                .result
                .as_deref()
                .map(|r| json("result", r))
                .transpose()?,
            queue: self.queue,
            kind: self.kind,
            key: self.idempotency_key,
            dependency: self.dependency,
            priority: i32::try_from(self.priority).map_err(|_| StoreError::Corrupt {
                what: "priority",
                detail: self.priority.to_string(),
            })?,
            state: self.state.parse().map_err(|_| StoreError::Corrupt {
                what: "state",
                detail: self.state.clone(),
            })?,
            attempts: u32_of("attempts", self.attempts)?,
            exceptions: u32_of("exceptions", self.exceptions)?,
            defers: u32_of("defers", self.defers)?,
            consecutive_auth: u32_of("consecutive_auth", self.consecutive_auth)?,
            prev_delay: self
                .prev_delay_ms
                .map(|v| ms_of("prev_delay_ms", v))
                .transpose()?,
            max_attempts: u32_of("max_attempts", self.max_attempts)?,
            policy: self.policy,
            run_at: from_millis(self.run_at),
            first_attempt_at: self.first_attempt_at.map(from_millis),
            ttl: self.ttl_ms.map(|v| ms_of("ttl_ms", v)).transpose()?,
            deadline: self.deadline.map(from_millis),
            lease_owner: self.lease_owner,
            lease_token: self.lease_token,
            lease_expires_at: self.lease_expires_at.map(from_millis),
            defer_reason: self
                .defer_reason
                .map(|r| r.parse::<DeferReason>())
                .transpose()
                .map_err(|e| bad("defer_reason", e))?,
            dead_reason: self
                .dead_reason
                .map(|r| r.parse::<DeadReason>())
                .transpose()
                .map_err(|e| bad("dead_reason", e))?,
            last_error: self.last_error,
            replays: u32_of("replays", self.replays)?,
            created_at: from_millis(self.created_at),
            updated_at: from_millis(self.updated_at),
            finished_at: self.finished_at.map(from_millis),
            quota_key: self.quota_key,
            traceparent: self.traceparent,
        })
    }
}

pub(crate) const ATTEMPT_COLS: &str = "id, job_id, number, replay, lease_token, worker, started_at, \
    duration_ms, class, http_status, error, delay_ms, mode, counted, response";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct AttemptRow {
    id: i64,
    job_id: i64,
    number: i64,
    replay: i64,
    lease_token: i64,
    worker: Option<String>,
    started_at: i64,
    duration_ms: i64,
    class: String,
    http_status: Option<i64>,
    error: Option<String>,
    delay_ms: Option<i64>,
    mode: Option<String>,
    counted: bool,
    response: Option<String>,
}

impl AttemptRow {
    pub(crate) fn into_attempt(self) -> Result<Attempt> {
        Ok(Attempt {
            id: self.id,
            job_id: self.job_id,
            number: u32_of("attempt number", self.number)?,
            replay: u32_of("attempt replay", self.replay)?,
            lease_token: self.lease_token,
            worker: self.worker,
            started_at: from_millis(self.started_at),
            duration: ms_of("duration_ms", self.duration_ms)?,
            class: self
                .class
                .parse::<FailureClass>()
                .map_err(|e| bad("attempt class", e))?,
            http_status: self
                .http_status
                .map(|s| {
                    u16::try_from(s).map_err(|_| StoreError::Corrupt {
                        what: "http_status",
                        detail: s.to_string(),
                    })
                })
                .transpose()?,
            error: self.error,
            delay: self.delay_ms.map(|v| ms_of("delay_ms", v)).transpose()?,
            mode: self
                .mode
                .map(|m| m.parse::<RetryMode>())
                .transpose()
                .map_err(|e| bad("attempt mode", e))?,
            counted: self.counted,
            response: self.response,
        })
    }
}

pub(crate) const DEP_COLS: &str = "name, state, open_until, probe_permits, paused_until, \
    pause_reason, updated_at, version, mode, openings, probe_successes, probe_failures, \
    round_started, rate_rps, tat_us, rate_cut_at, rate_cap, rate_raised_at, rate_lifted, \
    meter_started, meter_slots, meter_rate, cycle_started, cycle_slots, rate_pause_ms";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DepRow {
    name: String,
    state: String,
    open_until: Option<i64>,
    probe_permits: i64,
    paused_until: Option<i64>,
    pause_reason: Option<String>,
    updated_at: i64,
    version: i64,
    mode: String,
    openings: i64,
    probe_successes: i64,
    probe_failures: i64,
    round_started: Option<i64>,
    rate_rps: Option<f64>,
    tat_us: Option<i64>,
    rate_cut_at: Option<i64>,
    rate_cap: Option<f64>,
    rate_raised_at: Option<i64>,
    rate_lifted: i64,
    meter_started: Option<i64>,
    meter_slots: i64,
    meter_rate: Option<f64>,
    cycle_started: Option<i64>,
    cycle_slots: i64,
    rate_pause_ms: Option<i64>,
}

fn bad(field: &'static str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        what: field,
        detail: e.to_string(),
    }
}

impl DepRow {
    pub(crate) fn into_dep(self) -> Result<Dependency> {
        let flow = FlowRow {
            mode: BreakerMode::parse(&self.mode).map_err(|e| bad("mode", e))?,
            state: BreakerState::parse(&self.state).map_err(|e| bad("state", e))?,
            open_until: self.open_until.map(from_millis),
            openings: u32_of("openings", self.openings.max(0))?,
            probe_permits: u32_of("probe_permits", self.probe_permits.max(0))?,
            probe_successes: u32_of("probe_successes", self.probe_successes.max(0))?,
            probe_failures: u32_of("probe_failures", self.probe_failures.max(0))?,
            round_started: self.round_started.map(from_millis),
            paused_until: self.paused_until.map(from_millis),
            pause_reason: self
                .pause_reason
                .map(|r| r.parse::<PauseReason>())
                .transpose()
                .map_err(|e| bad("pause_reason", e))?,
            rate: self.rate_rps,
            tat: self
                .tat_us
                .and_then(chrono::DateTime::from_timestamp_micros),
            rate_cut_at: self.rate_cut_at.map(from_millis),
            rate_cap: self.rate_cap,
            rate_raised_at: self.rate_raised_at.map(from_millis),
            rate_lifted: self.rate_lifted != 0,
            meter_started: self.meter_started.map(from_millis),
            meter_slots: u32_of("meter_slots", self.meter_slots.max(0))?,
            meter_rate: self.meter_rate,
            cycle_started: self.cycle_started.map(from_millis),
            cycle_slots: u32_of("cycle_slots", self.cycle_slots.max(0))?,
            rate_pause: self
                .rate_pause_ms
                .map(|ms| std::time::Duration::from_millis(ms.max(0).unsigned_abs())),
        };
        Ok(Dependency {
            name: self.name,
            flow,
            version: self.version,
            updated_at: from_millis(self.updated_at),
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventRow {
    id: i64,
    dependency: String,
    at: i64,
    from_state: String,
    to_state: String,
    reason: String,
}

impl EventRow {
    pub(crate) fn into_event(self) -> Result<DependencyEvent> {
        Ok(DependencyEvent {
            id: self.id,
            dependency: self.dependency,
            at: from_millis(self.at),
            from: BreakerState::parse(&self.from_state).map_err(|e| bad("from_state", e))?,
            to: BreakerState::parse(&self.to_state).map_err(|e| bad("to_state", e))?,
            reason: self.reason,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct CountRow {
    pub(crate) queue: String,
    pub(crate) state: String,
    pub(crate) n: i64,
}

pub(crate) fn state_of(s: &str) -> Result<JobState> {
    s.parse().map_err(|_| StoreError::Corrupt {
        what: "state",
        detail: s.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's claim hands each row back as a JSON array of JOB_COLS: NULLs, numbers and
    /// text with quotes and newlines come back as they were; anything else is a corrupt row.
    #[test]
    fn a_job_row_decodes_from_a_json_array_of_job_cols() {
        let mut cols: Vec<serde_json::Value> = vec![serde_json::Value::Null; 32];
        let at = |name: &str| JOB_COL_NAMES.iter().position(|c| *c == name).unwrap();
        for (name, v) in [
            ("id", serde_json::json!(7)),
            ("queue", serde_json::json!("q")),
            ("kind", serde_json::json!("charge")),
            ("payload", serde_json::json!("{\"a\":\"\\\"x\\n\"}")),
            ("priority", serde_json::json!(-3)),
            ("state", serde_json::json!("running")),
            ("max_attempts", serde_json::json!(5)),
            ("policy", serde_json::json!("payment")),
            ("run_at", serde_json::json!(1_700_000_000_000_i64)),
            ("lease_token", serde_json::json!(9_007_199_254_740_993_i64)),
            ("created_at", serde_json::json!(1)),
            ("updated_at", serde_json::json!(2)),
        ] {
            cols[at(name)] = v;
        }
        for name in [
            "attempts",
            "exceptions",
            "defers",
            "consecutive_auth",
            "replays",
        ] {
            cols[at(name)] = serde_json::json!(0);
        }
        let text = serde_json::Value::Array(cols).to_string();
        let job = JobRow::from_json(&text).unwrap().into_job().unwrap();
        assert_eq!(
            (job.id, job.priority, job.lease_token),
            (7, -3, 9_007_199_254_740_993)
        );
        assert_eq!(job.payload, serde_json::json!({"a": "\"x\n"}));
        assert_eq!(
            (job.key, job.last_error, job.finished_at),
            (None, None, None)
        );
        let e = JobRow::from_json("[7, \"q\"]").unwrap_err();
        assert!(e.to_string().contains("claimed job row"), "{e}");
    }

    #[test]
    fn the_job_columns_names_are_job_cols_in_order() {
        let cols: Vec<&str> = JOB_COLS.split(',').map(str::trim).collect();
        assert_eq!(cols, JOB_COL_NAMES);
    }

    /// A job's row decodes by position: a statement that selects its columns in another
    /// order is refused in debug builds instead of filling fields with each other's values.
    #[tokio::test]
    #[should_panic(expected = "must select JOB_COLS in order")]
    async fn a_job_row_in_another_order_is_refused() {
        use sqlx::Connection as _;
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        let swapped = JOB_COLS.replacen("queue, kind", "kind, queue", 1);
        let select: Vec<String> = swapped
            .split(',')
            .map(|c| match c.trim() {
                "id" | "priority" | "attempts" | "exceptions" | "defers" | "consecutive_auth"
                | "max_attempts" | "run_at" | "lease_token" | "replays" | "created_at"
                | "updated_at" => format!("0 AS {}", c.trim()),
                c => format!("'x' AS {c}"),
            })
            .collect();
        let sql = format!("SELECT {}", select.join(", "));
        let _: Result<JobRow, _> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut conn)
            .await;
    }

    fn attempt(class: &str, mode: Option<&str>) -> AttemptRow {
        AttemptRow {
            id: 1,
            job_id: 2,
            number: 1,
            replay: 0,
            lease_token: 1,
            worker: None,
            started_at: 0,
            duration_ms: 5,
            class: class.into(),
            http_status: None,
            error: None,
            delay_ms: None,
            mode: mode.map(Into::into),
            counted: true,
            response: None,
        }
    }

    #[test]
    fn an_unknown_class_or_mode_is_a_corrupt_row_naming_column_and_value() {
        let a = attempt("timeout", Some("defer")).into_attempt().unwrap();
        assert_eq!(
            (a.class, a.mode),
            (FailureClass::Timeout, Some(RetryMode::Defer))
        );
        let e = attempt("flaky", None).into_attempt().unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::Corrupt {
                    what: "attempt class",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("\"flaky\""), "{e}");
        let e = attempt("success", Some("later"))
            .into_attempt()
            .unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::Corrupt {
                    what: "attempt mode",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("\"later\""), "{e}");
    }

    #[test]
    fn an_unknown_breaker_state_in_the_history_is_an_error_not_closed() {
        let row = |from: &str| EventRow {
            id: 1,
            dependency: "psp".into(),
            at: 0,
            from_state: from.into(),
            to_state: "open".into(),
            reason: "failure rate 60% over 10 calls".into(),
        };
        assert_eq!(row("closed").into_event().unwrap().to, BreakerState::Open);
        let e = row("ajar").into_event().unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::Corrupt {
                    what: "from_state",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("ajar"), "{e}");
    }
}
