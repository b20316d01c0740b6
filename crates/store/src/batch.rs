//! The batched operations' rows: what a multi-row insert sends and how its results are put
//! back in input order, and the columns a batch of completions writes.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::model::{
    Completion, Enqueued, Job, JobState, NewJob, Transition, dur_ms, from_millis, millis,
};

/// The computed columns of a job to insert.
pub(crate) struct InsertRow {
    pub(crate) state: &'static str,
    pub(crate) run_at: i64,
    pub(crate) ttl: Option<i64>,
    pub(crate) deadline: Option<i64>,
    pub(crate) now: i64,
}

impl InsertRow {
    pub(crate) fn of(job: &NewJob, now: crate::Timestamp) -> Self {
        let run_at = job.run_at.unwrap_or(now);
        let ttl = job.ttl.map(crate::model::dur_ms);
        Self {
            state: if run_at > now {
                "scheduled"
            } else {
                "available"
            },
            run_at: millis(run_at),
            ttl,
            deadline: ttl.map(|t| millis(now).saturating_add(t)),
            now: millis(now),
        }
    }
}

/// A row the insert created, as its `RETURNING id, queue, idempotency_key` gave it.
pub(crate) type InsertedKey = (i64, String, Option<String>);

impl InsertRow {
    /// The job exactly as the insert stored it: what was sent plus the column defaults
    /// (times at the database's millisecond precision), so the insert need not return and
    /// re-parse every column.
    pub(crate) fn job(&self, id: i64, n: &NewJob) -> Job {
        Job {
            id,
            queue: n.queue.clone(),
            kind: n.kind.clone(),
            payload: n.payload.clone(),
            key: n.key.clone(),
            dependency: n.dependency.clone(),
            priority: n.priority,
            state: if self.state == "scheduled" {
                JobState::Scheduled
            } else {
                JobState::Available
            },
            attempts: 0,
            exceptions: 0,
            defers: 0,
            consecutive_auth: 0,
            prev_delay: None,
            max_attempts: n.max_attempts,
            policy: n.policy.clone(),
            run_at: from_millis(self.run_at),
            first_attempt_at: None,
            ttl: self
                .ttl
                .and_then(|t| u64::try_from(t).ok())
                .map(Duration::from_millis),
            deadline: self.deadline.map(from_millis),
            lease_owner: None,
            lease_token: 0,
            lease_expires_at: None,
            defer_reason: None,
            dead_reason: None,
            last_error: None,
            result: None,
            replays: 0,
            created_at: from_millis(self.now),
            updated_at: from_millis(self.now),
            finished_at: None,
            quota_key: n.quota_key.clone(),
            traceparent: n.traceparent.clone(),
        }
    }
}

/// Puts the inserted rows back in input order: keyed jobs by key (a key repeated within the
/// batch gets the first one's job, `created: false`), unkeyed ones by id order (the insert
/// assigns ids in input order). `None`: the key was taken before this batch.
pub(crate) fn match_inserted(
    chunk: &[NewJob],
    rows: &[InsertRow],
    mut created: Vec<InsertedKey>,
) -> Vec<Option<Enqueued>> {
    created.sort_by_key(|r| r.0);
    let mut by_key: HashMap<(&str, &str), i64> = HashMap::new();
    let mut unkeyed = Vec::new();
    for (id, queue, key) in &created {
        match key {
            Some(k) => {
                by_key.insert((queue.as_str(), k.as_str()), *id);
            }
            None => unkeyed.push(*id),
        }
    }
    let mut unkeyed = unkeyed.into_iter();
    let mut seen: HashMap<(&str, &str), Job> = HashMap::new();
    chunk
        .iter()
        .zip(rows)
        .map(|(n, r)| match &n.key {
            None => unkeyed.next().map(|id| Enqueued {
                job: r.job(id, n),
                created: true,
            }),
            Some(k) => {
                let at = (n.queue.as_str(), k.as_str());
                if let Some(job) = seen.get(&at) {
                    return Some(Enqueued {
                        job: job.clone(),
                        created: false,
                    });
                }
                let id = by_key.remove(&at)?;
                let job = r.job(id, n);
                seen.insert(at, job.clone());
                Some(Enqueued { job, created: true })
            }
        })
        .collect()
}

/// Why [`Store::enqueue_many_exact`](crate::Store::enqueue_many_exact) wrote nothing: the job
/// at `index` names a queue and key already taken by `existing`, a job of another kind or
/// payload (a new request under an old key, not a repeat).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyTaken {
    /// The position of the refused job in the input.
    pub index: usize,
    /// The job that holds the queue and key (stored before, or earlier in the same input).
    pub existing: Job,
}

/// The first job of `jobs` whose key was already taken by a job of another kind or payload:
/// a repeat must be the same request.
pub(crate) fn first_key_taken(jobs: &[NewJob], out: &[Enqueued]) -> Option<usize> {
    jobs.iter()
        .zip(out)
        .position(|(n, e)| !e.created && (n.kind != e.job.kind || n.payload != e.job.payload))
}

/// The per-transition columns of a completion.
pub(crate) struct CompletionFields {
    pub(crate) state: JobState,
    pub(crate) run_at: Option<i64>,
    pub(crate) defer_reason: Option<&'static str>,
    pub(crate) dead_reason: Option<&'static str>,
    pub(crate) result: Option<String>,
}

impl CompletionFields {
    pub(crate) fn of(c: &Completion) -> Self {
        let (run_at, defer_reason, dead_reason, result) = match &c.transition {
            Transition::Deferred { until, reason, .. } => {
                (Some(millis(*until)), Some(reason.as_str()), None, None)
            }
            Transition::Dead { reason } => (None, None, Some(reason.as_str()), None),
            Transition::Succeeded { result } => (None, None, None, Some(result.to_string())),
            Transition::Released => (Some(millis(c.now)), None, None, None),
            Transition::RetryInProcess { .. } => (None, None, None, None),
        };
        Self {
            state: c.transition.state(),
            run_at,
            defer_reason,
            dead_reason,
            result,
        }
    }
}

/// Every column one completion writes (the job's update and its attempt), computed once so
/// that each backend can send a whole batch as a few parameters.
#[derive(Debug, Serialize)]
pub(crate) struct CompletionRow {
    pub(crate) id: i64,
    pub(crate) token: i64,
    pub(crate) state: &'static str,
    pub(crate) attempts: i64,
    pub(crate) exceptions: i64,
    pub(crate) defers: i64,
    pub(crate) consecutive_auth: i64,
    pub(crate) prev_delay_ms: Option<i64>,
    pub(crate) first_attempt_at: Option<i64>,
    pub(crate) run_at: Option<i64>,
    pub(crate) defer_reason: Option<&'static str>,
    pub(crate) dead_reason: Option<&'static str>,
    pub(crate) last_error: Option<String>,
    pub(crate) result: Option<String>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) updated_at: i64,
    pub(crate) has_attempt: bool,
    pub(crate) worker: Option<String>,
    pub(crate) started_at: i64,
    pub(crate) duration_ms: i64,
    pub(crate) class: &'static str,
    pub(crate) http_status: Option<i64>,
    pub(crate) error: Option<String>,
    pub(crate) delay_ms: Option<i64>,
    pub(crate) mode: Option<&'static str>,
    pub(crate) counted: bool,
    pub(crate) response: Option<String>,
}

impl CompletionRow {
    pub(crate) fn of(c: &Completion) -> Self {
        let f = CompletionFields::of(c);
        let k = &c.counters;
        let a = c.attempt.as_ref();
        Self {
            id: c.lease.job_id,
            token: c.lease.token,
            state: f.state.as_str(),
            attempts: i64::from(k.attempts),
            exceptions: i64::from(k.exceptions),
            defers: i64::from(k.defers),
            consecutive_auth: i64::from(k.consecutive_auth),
            prev_delay_ms: k.prev_delay.map(dur_ms),
            first_attempt_at: k.first_attempt_at.map(millis),
            run_at: f.run_at,
            defer_reason: f.defer_reason,
            dead_reason: f.dead_reason,
            last_error: c.error.clone(),
            result: f.result,
            finished_at: f.state.is_final().then(|| millis(c.now)),
            updated_at: millis(c.now),
            has_attempt: a.is_some(),
            worker: a.and_then(|a| a.worker.clone()),
            started_at: a.map_or(0, |a| millis(a.started_at)),
            duration_ms: a.map_or(0, |a| dur_ms(a.duration)),
            class: a.map_or("", |a| a.class.as_str()),
            http_status: a.and_then(|a| a.http_status.map(i64::from)),
            error: a.and_then(|a| a.error.clone()),
            delay_ms: c.transition.delay().map(dur_ms),
            mode: c.transition.mode().map(|m| m.as_str()),
            counted: a.is_some_and(|a| a.counted),
            response: a
                .and_then(|a| a.response.as_deref())
                .map(|r| crate::model::excerpt(r, crate::model::MAX_RESPONSE_EXCERPT).to_owned()),
        }
    }
}
