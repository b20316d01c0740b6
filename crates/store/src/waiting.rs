//! Why a job that is due, or looks due, is not running: computed when it is read, from the
//! rows that hold it back (its queue's pause, its dependency's breaker, pause and rate
//! limiter, its own `run_at`), so the screens say what the claim will do instead of a plain
//! `available`.
//!
//! Nothing here is stored: a reason is true at the instant it is read and may be gone the
//! next, as the claim itself decides anew each time.

use std::fmt;

use redrive_policy::{BreakerMode, BreakerState};
use serde::Serialize;

use crate::{Dependency, Job, JobState, PausedQueue, Result, Store, Timestamp};

/// One reason a job waits.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Waiting {
    /// An operator paused the job's queue: workers claim nothing from it until it is resumed.
    QueuePaused {
        /// Since when.
        since: Timestamp,
        /// By whom.
        by: String,
    },
    /// The dependency's breaker is open (or an operator forced it open): no call is made.
    BreakerOpen {
        /// An operator forced it open (until `breakers force NAME auto`).
        forced: bool,
        /// When probes may start (`None` when forced).
        until: Option<Timestamp>,
    },
    /// The breaker is half-open and every probe of this round is out: the next calls wait
    /// for their verdict.
    BreakerProbing,
    /// The dependency is paused fleet-wide (a `Retry-After`, or an operator).
    DependencyPaused {
        /// Until then (an operator's pause until resumed: the year 9999).
        until: Timestamp,
        /// `retry_after` or `operator`.
        cause: Option<String>,
    },
    /// The job was held back by its dependency's rate limit (a 429, or the fleet's limiter
    /// had no send slot for it) until then.
    RateLimited {
        /// When it is due again.
        until: Timestamp,
    },
    /// The job's own `run_at` is in the future (scheduled, or deferred after a failure).
    RunAt {
        /// When it is due.
        at: Timestamp,
        /// Why it was deferred, if it was (`backoff`, `rate_limited`, `breaker_open`, …).
        deferred: Option<String>,
    },
}

impl Waiting {
    /// The reason's name: `queue_paused`, `breaker_open`, `breaker_probing`,
    /// `dependency_paused`, `rate_limited` or `run_at`.
    pub const fn code(&self) -> &'static str {
        match self {
            Waiting::QueuePaused { .. } => "queue_paused",
            Waiting::BreakerOpen { .. } => "breaker_open",
            Waiting::BreakerProbing => "breaker_probing",
            Waiting::DependencyPaused { .. } => "dependency_paused",
            Waiting::RateLimited { .. } => "rate_limited",
            Waiting::RunAt { .. } => "run_at",
        }
    }

    /// When this reason ends by itself, if it does (a pause until resumed, a forced breaker
    /// and a paused queue do not).
    pub fn until(&self) -> Option<Timestamp> {
        match self {
            Waiting::BreakerOpen { until, .. } => *until,
            Waiting::DependencyPaused { until, .. } => {
                Some(*until).filter(|u| *u < redrive_policy::until_resumed())
            }
            Waiting::RateLimited { until } => Some(*until),
            Waiting::RunAt { at, .. } => Some(*at),
            Waiting::QueuePaused { .. } | Waiting::BreakerProbing => None,
        }
    }
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |t: &Timestamp| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        match self {
            Waiting::QueuePaused { by, .. } => write!(f, "queue paused (by {by})"),
            Waiting::BreakerOpen { forced: true, .. } => {
                write!(f, "breaker open (forced by an operator)")
            }
            Waiting::BreakerOpen { until, .. } => match until {
                Some(u) => write!(f, "breaker open until {}", t(u)),
                None => write!(f, "breaker open"),
            },
            Waiting::BreakerProbing => write!(f, "breaker half-open: waiting for its probes"),
            Waiting::DependencyPaused { until, cause } => {
                let cause = cause.as_deref().unwrap_or("pause");
                if *until >= redrive_policy::until_resumed() {
                    write!(f, "dependency paused until resumed ({cause})")
                } else {
                    write!(f, "dependency paused until {} ({cause})", t(until))
                }
            }
            Waiting::RateLimited { until } => write!(f, "rate limited until {}", t(until)),
            Waiting::RunAt { at, deferred } => match deferred {
                Some(d) => write!(f, "deferred ({d}) until {}", t(at)),
                None => write!(f, "run_at {} is in the future", t(at)),
            },
        }
    }
}

/// Every reason `job` waits at `now`, given its queue's pause (if paused) and its
/// dependency's row (if any): empty for a job that is not waiting (running or finished) or
/// that the next claim may take.
///
pub fn waiting_because(
    job: &Job,
    queue_paused: Option<&PausedQueue>,
    dependency: Option<&Dependency>,
    now: Timestamp,
) -> Vec<Waiting> {
    let waits = matches!(
        job.state,
        JobState::Scheduled | JobState::Available | JobState::Deferred
    );
    if !waits {
        return Vec::new();
    }
    let mut out = Vec::new();
    if let Some(p) = queue_paused {
        out.push(Waiting::QueuePaused {
            since: p.paused_at,
            by: p.paused_by.clone(),
        });
    }
    if let Some(d) = dependency {
        let f = &d.flow;
        match (f.mode, f.effective_state()) {
            (BreakerMode::ForcedOpen, _) => out.push(Waiting::BreakerOpen {
                forced: true,
                until: None,
            }),
            (_, BreakerState::Open) => out.push(Waiting::BreakerOpen {
                forced: false,
                until: f.open_until.filter(|u| *u > now),
            }),
            (BreakerMode::Normal, BreakerState::HalfOpen) if f.probe_permits == 0 => {
                out.push(Waiting::BreakerProbing);
            }
            _ => {}
        }
        if let Some(until) = f.paused_until.filter(|u| *u > now) {
            out.push(Waiting::DependencyPaused {
                until,
                cause: f.pause_reason.map(|r| r.as_str().to_owned()),
            });
        }
    }
    if job.run_at > now {
        use redrive_policy::DeferReason;
        out.push(match job.defer_reason {
            Some(DeferReason::RateLimited | DeferReason::Throttled) => {
                Waiting::RateLimited { until: job.run_at }
            }
            r => Waiting::RunAt {
                at: job.run_at,
                deferred: r.map(|r| r.as_str().to_owned()),
            },
        });
    }
    out
}

impl Store {
    /// [`waiting_because`] for `job`, reading its queue's pause and its dependency's row now
    /// (the database's clock).
    ///
    /// # Errors
    /// Database errors.
    pub async fn waiting_because(&self, job: &Job) -> Result<Vec<Waiting>> {
        if !matches!(
            job.state,
            JobState::Scheduled | JobState::Available | JobState::Deferred
        ) {
            return Ok(Vec::new());
        }
        let now = self.db_time().await?;
        let paused = self.paused_queues().await?;
        let paused = paused.iter().find(|p| p.queue == job.queue);
        let dependency = match &job.dependency {
            Some(name) => self.dependency(name).await?,
            None => None,
        };
        Ok(waiting_because(job, paused, dependency.as_ref(), now))
    }
}
