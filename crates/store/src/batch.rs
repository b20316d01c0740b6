//! Multi-row statements for the batched operations (one round trip per chunk), in SQL both
//! backends accept: `VALUES` lists whose columns are `column1`, `column2`, ….

use std::collections::HashMap;
use std::fmt::Write;

use crate::model::{Completion, Enqueued, Job, JobState, NewJob, Transition, millis};
use crate::rows::JOB_COLS;

fn values(rows: usize, per_row: usize, out: &mut String, row: impl Fn(&mut String, usize)) {
    for r in 0..rows {
        if r > 0 {
            out.push_str(", ");
        }
        out.push('(');
        row(out, r * per_row);
        out.push(')');
    }
}

fn params(out: &mut String, base: usize, n: usize) {
    for i in 1..=n {
        if i > 1 {
            out.push_str(", ");
        }
        let _ = write!(out, "${}", base + i);
    }
}

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

pub(crate) fn insert_sql(rows: usize) -> String {
    let mut s = String::from(
        "INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, \
         state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at) VALUES ",
    );
    values(rows, 13, &mut s, |s, b| {
        params(s, b, 13);
        let _ = write!(s, ", ${}", b + 13);
    });
    let _ = write!(
        s,
        " ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
         RETURNING {JOB_COLS}"
    );
    s
}

/// Puts the inserted rows back in input order: keyed jobs by key (a key repeated within the
/// batch gets the first one's job, `created: false`), unkeyed ones by id order. `None`: the key
/// was taken before this batch.
pub(crate) fn match_inserted(chunk: &[NewJob], mut created: Vec<Job>) -> Vec<Option<Enqueued>> {
    created.sort_by_key(|j| j.id);
    let mut by_key: HashMap<(String, String), Job> = HashMap::new();
    let mut unkeyed = Vec::new();
    for j in created {
        match &j.key {
            Some(k) => {
                by_key.insert((j.queue.clone(), k.clone()), j);
            }
            None => unkeyed.push(j),
        }
    }
    let mut unkeyed = unkeyed.into_iter();
    let mut seen: HashMap<(String, String), Job> = HashMap::new();
    chunk
        .iter()
        .map(|n| match &n.key {
            None => unkeyed.next().map(|job| Enqueued { job, created: true }),
            Some(k) => {
                let id = (n.queue.clone(), k.clone());
                if let Some(job) = seen.get(&id) {
                    return Some(Enqueued {
                        job: job.clone(),
                        created: false,
                    });
                }
                let job = by_key.remove(&id)?;
                seen.insert(id, job.clone());
                Some(Enqueued { job, created: true })
            }
        })
        .collect()
}

pub(crate) fn complete_sql(rows: usize) -> String {
    let mut s = String::from(
        "UPDATE redrive_jobs SET state = v.column3, attempts = v.column4, exceptions = v.column5, \
         defers = v.column6, consecutive_auth = v.column7, prev_delay_ms = v.column8, \
         first_attempt_at = v.column9, run_at = COALESCE(v.column10, redrive_jobs.run_at), \
         defer_reason = v.column11, dead_reason = v.column12, \
         last_error = COALESCE(v.column13, redrive_jobs.last_error), \
         result = COALESCE(v.column14, redrive_jobs.result), \
         lease_owner = CASE WHEN v.column3 = 'running' THEN redrive_jobs.lease_owner ELSE NULL END, \
         lease_expires_at = CASE WHEN v.column3 = 'running' THEN redrive_jobs.lease_expires_at ELSE NULL END, \
         finished_at = v.column15, updated_at = v.column16 FROM (VALUES ",
    );
    values(rows, 16, &mut s, |s, b| params(s, b, 16));
    s.push_str(
        ") AS v WHERE redrive_jobs.id = v.column1 AND redrive_jobs.lease_token = v.column2 \
         AND redrive_jobs.state = 'running' RETURNING redrive_jobs.id, redrive_jobs.replays",
    );
    s
}

pub(crate) fn attempts_sql(rows: usize) -> String {
    let mut s = String::from(
        "INSERT INTO redrive_attempts (job_id, number, replay, lease_token, worker, started_at, \
         duration_ms, class, http_status, error, delay_ms, mode, counted) \
         SELECT v.column1, (SELECT COUNT(*) + 1 FROM redrive_attempts a \
           WHERE a.job_id = v.column1 AND a.replay = v.column2), \
         v.column2, v.column3, v.column4, v.column5, v.column6, v.column7, v.column8, v.column9, \
         v.column10, v.column11, v.column12 FROM (VALUES ",
    );
    values(rows, 12, &mut s, |s, b| params(s, b, 12));
    s.push_str(") AS v");
    s
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
