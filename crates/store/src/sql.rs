//! The SQL, written once with markers that each backend fills in:
//! `JSON_TEXTS_n` / `JSON_IDS_n` (parameter `$n`, a JSON array, as a set), `j.kind IN KINDS_n`
//! (the job's kind is in the JSON array `$n`) and `GREATEST(`.

use std::sync::Arc;

use crate::model::JobState;
use crate::rows::{ATTEMPT_COLS, DEP_COLS, JOB_COLS};

/// Which SQL dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(all(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// Every statement, prepared as text for one dialect.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    pub(crate) find_by_key: Arc<str>,
    pub(crate) get_job: Arc<str>,
    pub(crate) attempts_of: Arc<str>,
    /// The claim of one queue (`$2`); claims of several are built by [`Sql::claim_many`].
    pub(crate) claim_one: Arc<str>,
    /// `claim_one` that takes only the kinds in `$6` (a JSON array).
    pub(crate) claim_one_kinds: Arc<str>,
    dialect: Dialect,
    /// Rows per insert statement.
    pub(crate) enqueue_chunk: usize,
    pub(crate) heartbeat: Arc<str>,
    pub(crate) cancel: Arc<str>,
    pub(crate) replay_ids: Arc<str>,
    pub(crate) replay_all: Arc<str>,
    pub(crate) purge_ids: Arc<str>,
    pub(crate) purge_all: Arc<str>,
    pub(crate) rescue: Arc<str>,
    pub(crate) rescue_attempt: Arc<str>,
    pub(crate) list: Arc<str>,
    /// `list` with the state as a literal, one per [`JobState::ALL`] (in that order): an exact
    /// `state = 'dead'` is what lets either planner use the partial by-state indexes.
    pub(crate) list_state: Vec<Arc<str>>,
    pub(crate) counts: Arc<str>,
    pub(crate) next_due: Arc<str>,
    /// `next_due` of the kinds in `$2` (a JSON array) only.
    pub(crate) next_due_kinds: Arc<str>,
    /// `list` of one idempotency key (`$6`), walking the key's index.
    pub(crate) list_key: Arc<str>,
    pub(crate) get_dep: Arc<str>,
    pub(crate) list_deps: Arc<str>,
    pub(crate) upsert_breaker: Arc<str>,
    pub(crate) insert_event: Arc<str>,
    pub(crate) events: Arc<str>,
    pub(crate) insert_dep: Arc<str>,
    pub(crate) update_dep: Arc<str>,
    pub(crate) pause: Arc<str>,
    pub(crate) unpause: Arc<str>,
}

/// `QUEUES_2` is [`CLAIM_ONE_QUEUE`] (of `$2`, or of one element of it).
const CLAIMABLE: &str = "j.state IN ('scheduled', 'available', 'deferred') AND j.run_at <= $1 \
    AND QUEUES_2 \
    AND (j.dependency IS NULL OR NOT EXISTS (SELECT 1 FROM redrive_dependencies d \
         WHERE d.name = j.dependency AND ((d.paused_until IS NOT NULL AND d.paused_until > $1) \
           OR d.mode = 'forced_open' OR (d.mode = 'normal' AND \
           ((d.state = 'open' AND (d.open_until IS NULL OR d.open_until > $1)) \
           OR (d.state = 'half_open' AND d.probe_permits <= 0))))))";

/// The queue of a claim of one (`$2`): an equality the claim index walks in order, and
/// whether it is paused asked once (an uncorrelated `NOT EXISTS`, a one-time filter). A
/// per-row anti-join against the paused queues (`pq.queue = j.queue`) made PostgreSQL
/// estimate that one row of a deep backlog was left, so it fetched and sorted every pending
/// row of the queue instead of walking the claim index in order to the limit.
const CLAIM_ONE_QUEUE: &str = "j.queue = $2 \
    AND NOT EXISTS (SELECT 1 FROM redrive_paused_queues pq WHERE pq.queue = $2)";

/// How the PostgreSQL claim's update reaches the rows its `picked` CTE locked: by primary
/// key, from the array of their ids (an init plan). A join with the CTE (`FROM picked WHERE
/// t.id = picked.id`) let the planner hash-join it with a sequential scan of the whole jobs
/// table whenever that looked cheaper than 200 index probes (tens of thousands of rows, e.g.
/// 24 ms of a 26 ms claim at 20,000 jobs against 2 ms by key).
const PICKED_IDS: &str = "ANY(ARRAY(SELECT id FROM picked))";

/// Appended to [`CLAIMABLE`] by a claim of some kinds only (`$6`, a JSON array). The list is
/// read once per statement (on PostgreSQL an array built by an init plan, compared with
/// `= ANY`), so the claim index is still walked in order and other kinds are filtered out.
const KIND_FILTER: &str = " AND j.kind IN KINDS_6";

impl Sql {
    pub(crate) fn new(dialect: Dialect) -> Self {
        let fill = |s: String| fill(dialect, s);
        let claim_sql = |filter: &str| match dialect {
            Dialect::Sqlite => format!(
                "UPDATE redrive_jobs SET state = 'running', lease_owner = $4, \
                 lease_token = lease_token + 1, lease_expires_at = $5, updated_at = $1 \
                 WHERE id IN (SELECT j.id FROM redrive_jobs j WHERE {CLAIMABLE}{filter} \
                   ORDER BY j.priority, j.run_at, j.id LIMIT $3) \
                 RETURNING {JOB_COLS}"
            ),
            Dialect::Postgres => format!(
                "WITH picked AS (SELECT j.id FROM redrive_jobs j WHERE {CLAIMABLE}{filter} \
                   ORDER BY j.priority, j.run_at, j.id LIMIT $3 FOR UPDATE OF j SKIP LOCKED) \
                 UPDATE redrive_jobs t SET state = 'running', lease_owner = $4, \
                 lease_token = t.lease_token + 1, lease_expires_at = $5, updated_at = $1 \
                 WHERE t.id = {PICKED_IDS} RETURNING t.*"
            ),
        };
        let one = |filter: &str| claim_sql(filter).replace("QUEUES_2", CLAIM_ONE_QUEUE);
        let claim_one = one("");
        let claim_one_kinds = one(KIND_FILTER);
        Self {
            find_by_key: fill(format!(
                "SELECT {JOB_COLS} FROM redrive_jobs WHERE queue = $1 AND idempotency_key = $2"
            )),
            get_job: fill(format!("SELECT {JOB_COLS} FROM redrive_jobs WHERE id = $1")),
            attempts_of: fill(format!(
                "SELECT {ATTEMPT_COLS} FROM redrive_attempts WHERE job_id = $1 ORDER BY id"
            )),
            enqueue_chunk: 5_000,
            claim_one: fill(claim_one),
            claim_one_kinds: fill(claim_one_kinds),
            dialect,
            heartbeat: fill(
                "UPDATE redrive_jobs SET lease_expires_at = $3, updated_at = $4 \
                 WHERE id = $1 AND lease_token = $2 AND state = 'running'"
                    .into(),
            ),
            cancel: fill(format!(
                "UPDATE redrive_jobs SET state = 'cancelled', \
                 lease_token = CASE WHEN state = 'running' THEN lease_token + 1 ELSE lease_token END, \
                 lease_owner = NULL, lease_expires_at = NULL, finished_at = $2, updated_at = $2 \
                 WHERE id = $1 AND state IN ('scheduled', 'available', 'deferred', 'running') \
                 RETURNING {JOB_COLS}"
            )),
            replay_ids: fill(format!(
                "UPDATE redrive_jobs SET {REPLAY_SET} WHERE state = 'dead' AND id IN JSON_IDS_2"
            )),
            replay_all: fill(format!(
                "UPDATE redrive_jobs SET {REPLAY_SET} WHERE state = 'dead' AND ($2 IS NULL OR queue = $2)"
            )),
            purge_ids: fill(
                "DELETE FROM redrive_jobs WHERE state = 'dead' AND id IN JSON_IDS_1".into(),
            ),
            purge_all: fill(
                "DELETE FROM redrive_jobs WHERE state = 'dead' AND ($1 IS NULL OR queue = $1)".into(),
            ),
            rescue: fill(
                "UPDATE redrive_jobs SET attempts = attempts + 1, \
                 state = CASE WHEN attempts + 1 >= max_attempts THEN 'dead' ELSE 'available' END, \
                 dead_reason = CASE WHEN attempts + 1 >= max_attempts THEN 'lease_expired' ELSE NULL END, \
                 finished_at = CASE WHEN attempts + 1 >= max_attempts THEN $1 ELSE NULL END, \
                 first_attempt_at = COALESCE(first_attempt_at, $1), \
                 lease_token = lease_token + 1, lease_owner = NULL, lease_expires_at = NULL, \
                 run_at = $1, last_error = 'lease expired: the worker stopped heartbeating', updated_at = $1 \
                 WHERE state = 'running' AND lease_expires_at < $1 AND id IN \
                   (SELECT id FROM redrive_jobs WHERE state = 'running' AND lease_expires_at < $1 \
                    ORDER BY lease_expires_at LIMIT $2) \
                 RETURNING id, state, lease_token, replays, queue"
                    .into(),
            ),
            rescue_attempt: fill(
                "INSERT INTO redrive_attempts (job_id, number, replay, lease_token, worker, started_at, \
                 duration_ms, class, http_status, error, delay_ms, mode, counted) \
                 VALUES ($1, (SELECT COUNT(*) + 1 FROM redrive_attempts WHERE job_id = $1 AND replay = $2), \
                 $2, $3, NULL, $4, 0, 'timeout', NULL, 'lease expired: the worker stopped heartbeating', \
                 NULL, NULL, TRUE)"
                    .into(),
            ),
            list: fill(format!(
                "SELECT {JOB_COLS} FROM redrive_jobs WHERE ($1 IS NULL OR state = $1) \
                 AND ($2 IS NULL OR queue = $2) AND ($3 IS NULL OR dead_reason = $3) AND id > $4 \
                 ORDER BY id LIMIT $5"
            )),
            list_state: JobState::ALL
                .iter()
                .map(|st| {
                    fill(format!(
                        "SELECT {JOB_COLS} FROM redrive_jobs WHERE state = '{}' AND $1 IS NULL \
                         AND ($2 IS NULL OR queue = $2) AND ($3 IS NULL OR dead_reason = $3) \
                         AND id > $4 ORDER BY id LIMIT $5",
                        st.as_str()
                    ))
                })
                .collect(),
            counts: fill(
                "SELECT queue, state, COUNT(*) AS n FROM redrive_jobs GROUP BY queue, state \
                 ORDER BY queue, state"
                    .into(),
            ),
            next_due: fill(NEXT_DUE.into()),
            next_due_kinds: fill(format!("{NEXT_DUE} AND j.kind IN KINDS_2")),
            list_key: fill(format!(
                "SELECT {JOB_COLS} FROM redrive_jobs WHERE idempotency_key = $6 \
                 AND ($1 IS NULL OR state = $1) AND ($2 IS NULL OR queue = $2) \
                 AND ($3 IS NULL OR dead_reason = $3) AND id > $4 ORDER BY id LIMIT $5"
            )),
            get_dep: fill(format!("SELECT {DEP_COLS} FROM redrive_dependencies WHERE name = $1")),
            list_deps: fill(format!("SELECT {DEP_COLS} FROM redrive_dependencies ORDER BY name")),
            upsert_breaker: fill(
                "INSERT INTO redrive_dependencies (name, state, open_until, probe_permits, updated_at, \
                 version) VALUES ($1, $2, $3, $4, $5, 1) ON CONFLICT (name) DO UPDATE SET state = excluded.state, \
                 open_until = excluded.open_until, probe_permits = excluded.probe_permits, \
                 probe_successes = 0, probe_failures = 0, round_started = excluded.updated_at, \
                 updated_at = excluded.updated_at, version = redrive_dependencies.version + 1 \
                 WHERE $6 IS NULL OR redrive_dependencies.state = $6 RETURNING name"
                    .into(),
            ),
            insert_event: fill(
                "INSERT INTO redrive_dependency_events (dependency, at, from_state, to_state, reason) \
                 VALUES ($1, $2, $3, $4, $5)"
                    .into(),
            ),
            events: fill(
                "SELECT id, dependency, at, from_state, to_state, reason FROM redrive_dependency_events \
                 WHERE ($1 IS NULL OR dependency = $1) ORDER BY id DESC LIMIT $2"
                    .into(),
            ),
            insert_dep: fill(format!(
                "INSERT INTO redrive_dependencies ({DEP_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, \
                 1, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
                 ON CONFLICT (name) DO NOTHING RETURNING version"
            )),
            update_dep: fill(
                "UPDATE redrive_dependencies SET state = $2, open_until = $3, probe_permits = $4, \
                 paused_until = $5, pause_reason = $6, updated_at = $7, version = version + 1, \
                 mode = $8, openings = $9, probe_successes = $10, probe_failures = $11, \
                 round_started = $12, rate_rps = $13, tat_us = $14, rate_cut_at = $15, \
                 rate_cap = $16, rate_raised_at = $17 \
                 WHERE name = $1 AND version = $18 RETURNING version"
                    .into(),
            ),
            pause: fill(
                "INSERT INTO redrive_dependencies (name, paused_until, pause_reason, updated_at, version) \
                 VALUES ($1, $2, $3, $4, 1) ON CONFLICT (name) DO UPDATE SET \
                 paused_until = GREATEST(COALESCE(redrive_dependencies.paused_until, 0), excluded.paused_until), \
                 pause_reason = excluded.pause_reason, updated_at = excluded.updated_at, \
                 version = redrive_dependencies.version + 1"
                    .into(),
            ),
            unpause: fill(
                "UPDATE redrive_dependencies SET paused_until = NULL, pause_reason = NULL, updated_at = $2, \
                 version = version + 1 WHERE name = $1"
                    .into(),
            ),
        }
    }
}

/// Fills a statement's markers for one dialect (see the module's documentation).
fn fill(dialect: Dialect, mut s: String) -> Arc<str> {
    for n in ["2", "6"] {
        let kinds = match dialect {
            Dialect::Sqlite => format!("j.kind IN (SELECT value FROM json_each(${n}))"),
            Dialect::Postgres => format!(
                "j.kind = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(${n} AS JSONB))))"
            ),
        };
        s = s.replace(&format!("j.kind IN KINDS_{n}"), &kinds);
    }
    for n in ["1", "2"] {
        let (texts, ids) = match dialect {
            Dialect::Sqlite => (
                format!("(SELECT value FROM json_each(${n}))"),
                format!("(SELECT value FROM json_each(${n}))"),
            ),
            Dialect::Postgres => (
                format!("(SELECT jsonb_array_elements_text(CAST(${n} AS JSONB)))"),
                format!("(SELECT CAST(jsonb_array_elements_text(CAST(${n} AS JSONB)) AS BIGINT))"),
            ),
        };
        s = s
            .replace(&format!("JSON_TEXTS_{n}"), &texts)
            .replace(&format!("JSON_IDS_{n}"), &ids);
    }
    if dialect == Dialect::Sqlite {
        s = s.replace("GREATEST(", "MAX(");
    }
    Arc::from(s)
}

impl Sql {
    /// The claim of `queues` queues (`$2`, a JSON array of them), with the kinds' filter
    /// (`$6`) if `kinds`: the first `$3` jobs of each queue, each walked in the claim index's
    /// order, then the first `$3` of those. One `queue IN (…)` over the index would instead
    /// fetch and sort every pending job of those queues to find the first few.
    pub(crate) fn claim_many(&self, queues: usize, kinds: bool) -> Arc<str> {
        let filter = if kinds { KIND_FILTER } else { "" };
        let arm = |k: usize| {
            let q = match self.dialect {
                Dialect::Sqlite => format!("json_extract($2, '$[{k}]')"),
                Dialect::Postgres => format!("(CAST($2 AS JSONB) ->> {k})"),
            };
            let queue = CLAIM_ONE_QUEUE.replace("$2", &q);
            let lock = match self.dialect {
                Dialect::Sqlite => "",
                Dialect::Postgres => " FOR UPDATE OF j SKIP LOCKED",
            };
            format!(
                "SELECT * FROM (SELECT j.id, j.priority, j.run_at FROM redrive_jobs j \
                 WHERE {}{filter} ORDER BY j.priority, j.run_at, j.id LIMIT $3{lock}) a{k}",
                CLAIMABLE.replace("QUEUES_2", &queue)
            )
        };
        let arms = (0..queues).map(arm).collect::<Vec<_>>().join(" UNION ALL ");
        let s = match self.dialect {
            Dialect::Sqlite => format!(
                "UPDATE redrive_jobs SET state = 'running', lease_owner = $4, \
                 lease_token = lease_token + 1, lease_expires_at = $5, updated_at = $1 \
                 WHERE id IN (SELECT c.id FROM ({arms}) c \
                   ORDER BY c.priority, c.run_at, c.id LIMIT $3) \
                 RETURNING {JOB_COLS}"
            ),
            Dialect::Postgres => format!(
                "WITH picked AS (SELECT c.id FROM ({arms}) c \
                   ORDER BY c.priority, c.run_at, c.id LIMIT $3) \
                 UPDATE redrive_jobs t SET state = 'running', lease_owner = $4, \
                 lease_token = t.lease_token + 1, lease_expires_at = $5, updated_at = $1 \
                 WHERE t.id = {PICKED_IDS} RETURNING t.*"
            ),
        };
        fill(self.dialect, s)
    }
}

const NEXT_DUE: &str = "SELECT MIN(CASE WHEN d.name IS NULL THEN j.run_at ELSE GREATEST(j.run_at, \
    COALESCE(d.paused_until, 0), \
    CASE WHEN d.state = 'open' THEN COALESCE(d.open_until, 0) ELSE 0 END) END) \
    FROM redrive_jobs j LEFT JOIN redrive_dependencies d ON d.name = j.dependency \
    WHERE j.state IN ('scheduled', 'available', 'deferred') AND j.queue IN JSON_TEXTS_1 \
    AND NOT EXISTS (SELECT 1 FROM redrive_paused_queues pq WHERE pq.queue = j.queue) \
    AND (d.mode IS NULL OR d.mode <> 'forced_open')";

pub(crate) const REPLAY_SET: &str = "state = 'available', run_at = $1, attempts = 0, exceptions = 0, defers = 0, \
    consecutive_auth = 0, prev_delay_ms = NULL, first_attempt_at = NULL, \
    deadline = CASE WHEN ttl_ms IS NULL THEN NULL ELSE $1 + ttl_ms END, dead_reason = NULL, \
    defer_reason = NULL, replays = replays + 1, finished_at = NULL, updated_at = $1";
