//! Operator controls: paused queues, bulk actions by filter (replay, purge, cancel, run now),
//! operator overrides of a dependency (pause, resume, forced breaker), and the audit trail
//! every one of them writes in the same transaction as its change.
//!
//! Here are the types and the statements; the operations themselves are provided methods of
//! [`crate::ops::Backend`], written once for both backends.

use std::sync::{Arc, OnceLock};

use redrive_policy::{BreakerMode, Timestamp};
use serde::{Deserialize, Serialize};

use crate::JobId;
use crate::rows::DEP_COLS;
use crate::sql::{Dialect, REPLAY_SET};

/// Who does an operator action, and through what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The API token's label, or the operating-system user for the CLI.
    pub name: String,
    /// Through what: `cli`, `api` or `dashboard`.
    pub via: String,
}

impl Actor {
    /// An actor.
    pub fn new(name: impl Into<String>, via: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            via: via.into(),
        }
    }
}

/// One row of the audit trail.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// Id (grows with time).
    pub id: i64,
    /// When.
    pub at: Timestamp,
    /// Who: the API token's label, or the operating-system user for the CLI.
    pub actor: String,
    /// Through what: `cli`, `api` or `dashboard`.
    pub via: String,
    /// What: `replay`, `purge`, `cancel`, `run_now`, `queue_pause`, `queue_resume`,
    /// `dependency_pause`, `dependency_resume`, `breaker_force`, `prune`, `schedule_add`,
    /// `schedule_remove`, `policy_apply`.
    pub action: String,
    /// On what: the filter or ids of a bulk action, the queue, or the dependency and the
    /// override (a JSON object).
    pub target: serde_json::Value,
    /// How many rows it changed.
    pub rows: u64,
}

/// A paused queue: workers claim nothing from it until it is resumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PausedQueue {
    /// The queue.
    pub queue: String,
    /// Since when.
    pub paused_at: Timestamp,
    /// By whom (the audit's actor).
    pub paused_by: String,
}

/// An operator action on many jobs at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    /// Dead jobs back to the queue with fresh budgets (history kept).
    Replay,
    /// Dead jobs deleted with their attempts.
    Purge,
    /// Unfinished jobs cancelled (a running job's lease is revoked).
    Cancel,
    /// Scheduled or deferred jobs (any waiting job due later) made due now; attempt counts,
    /// retry budget and deadline untouched.
    RunNow,
}

impl BulkAction {
    /// Every action.
    pub const ALL: [BulkAction; 4] = [
        BulkAction::Replay,
        BulkAction::Purge,
        BulkAction::Cancel,
        BulkAction::RunNow,
    ];

    /// The name in the audit trail and the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            BulkAction::Replay => "replay",
            BulkAction::Purge => "purge",
            BulkAction::Cancel => "cancel",
            BulkAction::RunNow => "run_now",
        }
    }

    /// The states a job must be in for this action.
    pub const fn states(self) -> &'static [crate::JobState] {
        use crate::JobState::*;
        match self {
            BulkAction::Replay | BulkAction::Purge => &[Dead],
            BulkAction::Cancel => &[Scheduled, Available, Deferred, Running],
            BulkAction::RunNow => &[Scheduled, Available, Deferred],
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Which jobs a bulk action takes: every condition given must hold (none given: every job
/// the action applies to).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFilter {
    /// Only these jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<JobId>>,
    /// Only this queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Only this kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Only this dependency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
    /// Only this dead reason (`permanent`, `attempts_exhausted`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_reason: Option<String>,
    /// Only jobs whose last error has this signature ([`crate::error_signature`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl JobFilter {
    /// Only these jobs.
    pub fn ids(ids: Vec<JobId>) -> Self {
        Self {
            ids: Some(ids),
            ..Self::default()
        }
    }

    /// Whether no condition is given (the action takes every job it applies to).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the names and the number of ids.
    ///
    /// # Errors
    /// [`crate::StoreError::Invalid`] naming the field.
    pub fn validate(&self) -> crate::Result<()> {
        if let Some(ids) = &self.ids {
            crate::check_batch("ids", ids.len())?;
        }
        for (field, v) in [
            ("queue", &self.queue),
            ("kind", &self.kind),
            ("dependency", &self.dependency),
            ("dead_reason", &self.dead_reason),
        ] {
            if let Some(v) = v {
                crate::model::name(field, v)?;
            }
        }
        if let Some(s) = &self.signature
            && s.is_empty()
        {
            return Err(crate::StoreError::Invalid {
                field: "signature",
                value: String::new(),
                reason: "must not be empty".into(),
            });
        }
        Ok(())
    }
}

/// What a bulk action did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BulkOutcome {
    /// The action.
    pub action: BulkAction,
    /// The jobs changed (or that would change), by id.
    pub ids: Vec<JobId>,
    /// How many.
    pub count: u64,
    /// Nothing was changed (and nothing audited).
    pub dry_run: bool,
}

/// An operator's override of a dependency, shared by the fleet through its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DependencyOp {
    /// Hold every call until `until` (`None`: until resumed).
    Pause {
        /// Until when.
        until: Option<Timestamp>,
    },
    /// Lift a pause.
    Resume,
    /// Force the breaker open or closed, or hand it back to the machine (`Normal`).
    Force(BreakerMode),
}

impl DependencyOp {
    fn audit(&self) -> (&'static str, serde_json::Value) {
        match self {
            DependencyOp::Pause { until } => (
                "dependency_pause",
                serde_json::json!({ "until": until.map(|u| u.to_rfc3339()) }),
            ),
            DependencyOp::Resume => ("dependency_resume", serde_json::json!({})),
            DependencyOp::Force(m) => (
                "breaker_force",
                serde_json::json!({ "mode": match m {
                    BreakerMode::Normal => "auto",
                    BreakerMode::ForcedOpen => "open",
                    BreakerMode::ForcedClosed => "closed",
                } }),
            ),
        }
    }

    pub(crate) fn event(&self) -> redrive_policy::FlowEvent {
        use redrive_policy::FlowEvent;
        match *self {
            DependencyOp::Pause { until } => FlowEvent::Pause {
                until: until.unwrap_or_else(redrive_policy::until_resumed),
            },
            DependencyOp::Resume => FlowEvent::Resume,
            DependencyOp::Force(m) => FlowEvent::Force(m),
        }
    }

    pub(crate) fn audit_parts(&self, dependency: &str) -> (&'static str, serde_json::Value) {
        let (action, mut target) = self.audit();
        target["dependency"] = serde_json::Value::String(dependency.to_owned());
        (action, target)
    }
}

/// Most audit rows one call returns.
pub const MAX_AUDIT_PAGE: u32 = 1000;

/// The operator statements of one dialect.
#[derive(Debug)]
pub(crate) struct OpSql {
    pub(crate) select: Vec<Arc<str>>,
    pub(crate) apply: Vec<Arc<str>>,
    pub(crate) get_dep: Arc<str>,
    pub(crate) pause_queue: Arc<str>,
    pub(crate) resume_queue: Arc<str>,
    pub(crate) paused_queues: Arc<str>,
    pub(crate) insert_audit: Arc<str>,
    pub(crate) audit: Arc<str>,
    pub(crate) dead_since: Arc<str>,
    pub(crate) oldest_due: Arc<str>,
}

fn in_states(states: &[crate::JobState]) -> String {
    let list: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!("state IN ({})", list.join(", "))
}

impl OpSql {
    fn new(dialect: Dialect) -> Self {
        let select = BulkAction::ALL
            .iter()
            .map(|a| {
                Arc::from(format!(
                    "SELECT id, last_error FROM redrive_jobs WHERE {} \
                     AND ($1 IS NULL OR queue = $1) AND ($2 IS NULL OR kind = $2) \
                     AND ($3 IS NULL OR dependency = $3) AND ($4 IS NULL OR dead_reason = $4) \
                     AND ($5 IS NULL OR id IN {}) AND ($6 IS NULL OR run_at > $6) \
                     ORDER BY id",
                    in_states(a.states()),
                    dialect.ids(5)
                ))
            })
            .collect();
        let apply = BulkAction::ALL
            .iter()
            .map(|a| {
                let states = in_states(a.states());
                let ids = dialect.ids(2);
                let sql = match a {
                    BulkAction::Replay => format!(
                        "UPDATE redrive_jobs SET {REPLAY_SET} WHERE {states} AND id IN {ids} \
                         RETURNING id"
                    ),
                    BulkAction::Purge => format!(
                        "DELETE FROM redrive_jobs WHERE {states} AND id IN {ids} \
                         AND $1 IS NOT NULL RETURNING id"
                    ),
                    BulkAction::Cancel => format!(
                        "UPDATE redrive_jobs SET state = 'cancelled', \
                         lease_token = CASE WHEN state = 'running' THEN lease_token + 1 ELSE lease_token END, \
                         lease_owner = NULL, lease_expires_at = NULL, finished_at = $1, updated_at = $1 \
                         WHERE {states} AND id IN {ids} RETURNING id"
                    ),
                    BulkAction::RunNow => format!(
                        "UPDATE redrive_jobs SET run_at = $1, updated_at = $1 \
                         WHERE {states} AND run_at > $1 AND id IN {ids} RETURNING id"
                    ),
                };
                Arc::from(sql)
            })
            .collect();
        Self {
            select,
            apply,
            get_dep: Arc::<str>::from(format!(
                "SELECT {DEP_COLS} FROM redrive_dependencies WHERE name = $1"
            )),
            pause_queue: Arc::<str>::from(
                "INSERT INTO redrive_paused_queues (queue, paused_at, paused_by) VALUES ($1, $2, $3) \
                 ON CONFLICT (queue) DO NOTHING",
            ),
            resume_queue: Arc::<str>::from("DELETE FROM redrive_paused_queues WHERE queue = $1"),
            paused_queues: Arc::<str>::from(
                "SELECT queue, paused_at, paused_by FROM redrive_paused_queues ORDER BY queue",
            ),
            insert_audit: Arc::<str>::from(
                "INSERT INTO redrive_audit (at, actor, via, action, target, row_count) \
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
            ),
            audit: Arc::<str>::from(
                "SELECT id, at, actor, via, action, target, row_count FROM redrive_audit \
                 WHERE ($1 IS NULL OR id < $1) ORDER BY id DESC LIMIT $2",
            ),
            dead_since: Arc::<str>::from(format!(
                "SELECT {} FROM redrive_jobs WHERE state = 'dead' AND finished_at >= $1 \
                     ORDER BY finished_at, id LIMIT $2",
                crate::rows::JOB_COLS
            )),
            oldest_due: Arc::<str>::from(
                "SELECT j.queue, MIN(j.run_at) FROM redrive_jobs j \
                 WHERE j.state IN ('scheduled', 'available', 'deferred') AND j.run_at <= $1 \
                 AND NOT EXISTS (SELECT 1 FROM redrive_paused_queues pq WHERE pq.queue = j.queue) \
                 GROUP BY j.queue ORDER BY j.queue",
            ),
        }
    }

    /// The statements of `dialect`, built once per process.
    pub(crate) fn get(dialect: Dialect) -> &'static OpSql {
        static SQLITE: OnceLock<OpSql> = OnceLock::new();
        static POSTGRES: OnceLock<OpSql> = OnceLock::new();
        match dialect {
            Dialect::Sqlite => SQLITE.get_or_init(|| OpSql::new(dialect)),
            Dialect::Postgres => POSTGRES.get_or_init(|| OpSql::new(dialect)),
        }
    }

    pub(crate) fn select(&self, a: BulkAction) -> Arc<str> {
        self.select[a.index()].clone()
    }

    pub(crate) fn apply(&self, a: BulkAction) -> Arc<str> {
        self.apply[a.index()].clone()
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct AuditRow {
    id: i64,
    at: i64,
    actor: String,
    via: String,
    action: String,
    target: String,
    row_count: i64,
}

impl AuditRow {
    pub(crate) fn into_entry(self) -> AuditEntry {
        AuditEntry {
            id: self.id,
            at: crate::from_millis(self.at),
            actor: self.actor,
            via: self.via,
            action: self.action,
            target: serde_json::from_str(&self.target)
                .unwrap_or(serde_json::Value::String(self.target)),
            rows: u64::try_from(self.row_count).unwrap_or(0),
        }
    }
}

pub(crate) fn check_actor(a: &Actor) -> crate::Result<()> {
    crate::model::name("actor", &a.name)?;
    crate::model::name("via", &a.via)
}
