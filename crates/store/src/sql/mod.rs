//! The SQL of each dialect. Statements that both dialects spell alike are written here once;
//! what differs (JSON arrays as sets, the claim's locking, `GREATEST` against SQLite's scalar
//! `MAX`) is written out in [`postgres`] and [`sqlite`] and put together with plain
//! `format!`: no statement is rewritten by text substitution.

mod postgres;
mod sqlite;

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

impl Dialect {
    /// The set of job ids in the JSON array parameter `$n`, e.g. `id IN {ids}`.
    pub(crate) fn ids(self, n: u8) -> String {
        match self {
            Dialect::Sqlite => sqlite::ids(n),
            Dialect::Postgres => postgres::ids(n),
        }
    }

    /// The set of texts in the JSON array parameter `$n`.
    fn texts(self, n: u8) -> String {
        match self {
            Dialect::Sqlite => sqlite::texts(n),
            Dialect::Postgres => postgres::texts(n),
        }
    }

    /// The larger of several values: PostgreSQL's `GREATEST`, SQLite's scalar `MAX`.
    fn greatest(self) -> &'static str {
        match self {
            Dialect::Sqlite => "MAX",
            Dialect::Postgres => "GREATEST",
        }
    }

    /// When the next job of the queues in `$1` (a JSON array) may run, given its
    /// dependency's pause and breaker (the greatest of the three times).
    fn next_due(self) -> String {
        format!("{} AND j.queue IN {}", self.next_due_all(), self.texts(1))
    }

    /// [`Dialect::next_due`] of every queue (no parameter): no list of queues to read, so
    /// the statement is the same whatever their number.
    fn next_due_all(self) -> String {
        format!(
            "SELECT MIN(CASE WHEN d.name IS NULL THEN j.run_at ELSE {}(j.run_at, \
    COALESCE(d.paused_until, 0), \
    CASE WHEN d.state = 'open' THEN COALESCE(d.open_until, 0) ELSE 0 END) END) \
    FROM redrive_jobs j LEFT JOIN redrive_dependencies d ON d.name = j.dependency \
    WHERE j.state IN ('scheduled', 'available', 'deferred') \
    AND NOT EXISTS (SELECT 1 FROM redrive_paused_queues pq WHERE pq.queue = j.queue) \
    AND (d.mode IS NULL OR d.mode <> 'forced_open')",
            self.greatest(),
        )
    }

    /// The queue condition of a claim of every queue: any queue but the paused ones, whose
    /// list is read once per statement (see [`one_queue`] for why not per row).
    fn every_queue(self) -> &'static str {
        match self {
            Dialect::Sqlite => sqlite::NOT_PAUSED,
            Dialect::Postgres => postgres::NOT_PAUSED,
        }
    }

    /// The queue condition of a claim of the queues in the JSON array `$2` walked in claim
    /// order over every queue (a list too long for an arm per queue), paused ones left out.
    fn queue_set(self) -> String {
        let listed = match self {
            Dialect::Sqlite => sqlite::queue_in(2),
            Dialect::Postgres => postgres::queue_in(2),
        };
        format!("{listed} AND {}", self.every_queue())
    }

    /// A fleet-wide pause of a dependency: the later of the stored and the new end wins.
    fn pause(self) -> String {
        format!(
            "INSERT INTO redrive_dependencies (name, paused_until, pause_reason, updated_at, version) \
                 VALUES ($1, $2, $3, $4, 1) ON CONFLICT (name) DO UPDATE SET \
                 paused_until = {}(COALESCE(redrive_dependencies.paused_until, 0), excluded.paused_until), \
                 pause_reason = excluded.pause_reason, updated_at = excluded.updated_at, \
                 version = redrive_dependencies.version + 1",
            self.greatest()
        )
    }

    /// The condition "the job's (`j`) kind is in the JSON array parameter `$n`".
    fn kind_in(self, n: u8) -> String {
        match self {
            Dialect::Sqlite => sqlite::kind_in(n),
            Dialect::Postgres => postgres::kind_in(n),
        }
    }

    /// Appended to [`claimable`] by a claim of some kinds only (`$6`, a JSON array). The list
    /// is read once per statement, so the claim index is still walked in order and other
    /// kinds are filtered out.
    fn kind_filter(self, kinds: bool) -> String {
        if kinds {
            format!(" AND {}", self.kind_in(6))
        } else {
            String::new()
        }
    }
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
    /// The claim of every queue but the paused ones: one walk of the pending jobs in claim
    /// order (`$2` is bound but not read). Its text is the same whatever the number of queues.
    pub(crate) claim_all: Arc<str>,
    /// `claim_all` that takes only the kinds in `$6` (a JSON array).
    pub(crate) claim_all_kinds: Arc<str>,
    /// The claim of the queues in `$2` (a JSON array) as one walk of every queue's pending
    /// jobs in claim order, filtered by the set: for lists longer than [`MAX_ARMS`].
    pub(crate) claim_set: Arc<str>,
    /// `claim_set` that takes only the kinds in `$6` (a JSON array).
    pub(crate) claim_set_kinds: Arc<str>,
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
    /// `next_due` of every queue (no parameter).
    pub(crate) next_due_all: Arc<str>,
    /// `next_due_all` of the kinds in `$1` (a JSON array) only.
    pub(crate) next_due_all_kinds: Arc<str>,
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

/// The jobs a claim may take, of the queue condition `queue` (see [`one_queue`]).
fn claimable(queue: &str) -> String {
    format!(
        "j.state IN ('scheduled', 'available', 'deferred') AND j.run_at <= $1 \
    AND {queue} \
    AND (j.dependency IS NULL OR NOT EXISTS (SELECT 1 FROM redrive_dependencies d \
         WHERE d.name = j.dependency AND ((d.paused_until IS NOT NULL AND d.paused_until > $1) \
           OR d.mode = 'forced_open' OR (d.mode = 'normal' AND \
           ((d.state = 'open' AND (d.open_until IS NULL OR d.open_until > $1)) \
           OR (d.state = 'half_open' AND d.probe_permits <= 0))))))"
    )
}

/// The queue of a claim of one (`q`, e.g. `$2`): an equality the claim index walks in order,
/// and whether it is paused asked once (an uncorrelated `NOT EXISTS`, a one-time filter). A
/// per-row anti-join against the paused queues (`pq.queue = j.queue`) made PostgreSQL
/// estimate that one row of a deep backlog was left, so it fetched and sorted every pending
/// row of the queue instead of walking the claim index in order to the limit.
fn one_queue(q: &str) -> String {
    format!(
        "j.queue = {q} AND NOT EXISTS (SELECT 1 FROM redrive_paused_queues pq WHERE pq.queue = {q})"
    )
}

/// The most queues a claim of a list of queues gives an arm each (see [`Sql::claim_many`]);
/// a longer list is claimed by [`Sql::claim_set`]. SQLite refuses a compound select of more
/// than 500 arms, and PostgreSQL plans every arm on every claim (2.8 s for 50 jobs over 500
/// queues against 0.1 s in one).
pub(crate) const MAX_ARMS: usize = 16;

impl Sql {
    pub(crate) fn new(dialect: Dialect) -> Self {
        let claim_of = |queue: &str, kinds: bool| {
            let claimable = format!("{}{}", claimable(queue), dialect.kind_filter(kinds));
            Arc::<str>::from(match dialect {
                Dialect::Sqlite => sqlite::claim(&claimable),
                Dialect::Postgres => postgres::claim(&claimable),
            })
        };
        let claim_one = |kinds: bool| claim_of(&one_queue("$2"), kinds);
        let claim_all = |kinds: bool| claim_of(dialect.every_queue(), kinds);
        let claim_set = |kinds: bool| claim_of(&dialect.queue_set(), kinds);
        let next_due = dialect.next_due();
        let next_due_all = dialect.next_due_all();
        let s = |text: String| Arc::<str>::from(text);
        Self {
            find_by_key: s(format!(
                "SELECT {JOB_COLS} FROM redrive_jobs WHERE queue = $1 AND idempotency_key = $2"
            )),
            get_job: s(format!("SELECT {JOB_COLS} FROM redrive_jobs WHERE id = $1")),
            attempts_of: s(format!(
                "SELECT {ATTEMPT_COLS} FROM redrive_attempts WHERE job_id = $1 ORDER BY id"
            )),
            enqueue_chunk: 5_000,
            claim_one: claim_one(false),
            claim_one_kinds: claim_one(true),
            claim_all: claim_all(false),
            claim_all_kinds: claim_all(true),
            claim_set: claim_set(false),
            claim_set_kinds: claim_set(true),
            dialect,
            heartbeat: Arc::from(HEARTBEAT),
            cancel: s(format!(
                "UPDATE redrive_jobs SET state = 'cancelled', \
                 lease_token = CASE WHEN state = 'running' THEN lease_token + 1 ELSE lease_token END, \
                 lease_owner = NULL, lease_expires_at = NULL, finished_at = $2, updated_at = $2 \
                 WHERE id = $1 AND state IN ('scheduled', 'available', 'deferred', 'running') \
                 RETURNING {JOB_COLS}"
            )),
            replay_ids: s(format!(
                "UPDATE redrive_jobs SET {REPLAY_SET} WHERE state = 'dead' AND id IN {}",
                dialect.ids(2)
            )),
            replay_all: s(format!(
                "UPDATE redrive_jobs SET {REPLAY_SET} WHERE state = 'dead' AND ($2 IS NULL OR queue = $2)"
            )),
            purge_ids: s(format!(
                "DELETE FROM redrive_jobs WHERE state = 'dead' AND id IN {}",
                dialect.ids(1)
            )),
            purge_all: Arc::from(PURGE_ALL),
            rescue: Arc::from(RESCUE),
            rescue_attempt: Arc::from(RESCUE_ATTEMPT),
            list: s(format!(
                "SELECT {JOB_COLS} FROM redrive_jobs WHERE ($1 IS NULL OR state = $1) \
                 AND ($2 IS NULL OR queue = $2) AND ($3 IS NULL OR dead_reason = $3) AND id > $4 \
                 ORDER BY id LIMIT $5"
            )),
            list_state: JobState::ALL
                .iter()
                .map(|st| {
                    s(format!(
                        "SELECT {JOB_COLS} FROM redrive_jobs WHERE state = '{}' AND $1 IS NULL \
                         AND ($2 IS NULL OR queue = $2) AND ($3 IS NULL OR dead_reason = $3) \
                         AND id > $4 ORDER BY id LIMIT $5",
                        st.as_str()
                    ))
                })
                .collect(),
            counts: Arc::from(COUNTS),
            next_due_kinds: s(format!("{next_due} AND {}", dialect.kind_in(2))),
            next_due: s(next_due),
            next_due_all_kinds: s(format!("{next_due_all} AND {}", dialect.kind_in(1))),
            next_due_all: s(next_due_all),
            list_key: s(format!(
                "SELECT {JOB_COLS} FROM redrive_jobs WHERE idempotency_key = $6 \
                 AND ($1 IS NULL OR state = $1) AND ($2 IS NULL OR queue = $2) \
                 AND ($3 IS NULL OR dead_reason = $3) AND id > $4 ORDER BY id LIMIT $5"
            )),
            get_dep: s(format!(
                "SELECT {DEP_COLS} FROM redrive_dependencies WHERE name = $1"
            )),
            list_deps: s(format!(
                "SELECT {DEP_COLS} FROM redrive_dependencies ORDER BY name"
            )),
            upsert_breaker: Arc::from(UPSERT_BREAKER),
            insert_event: Arc::from(INSERT_EVENT),
            events: Arc::from(EVENTS),
            insert_dep: s(format!(
                "INSERT INTO redrive_dependencies ({DEP_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, \
                 1, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24) \
                 ON CONFLICT (name) DO NOTHING RETURNING version"
            )),
            update_dep: Arc::from(UPDATE_DEP),
            pause: Arc::from(dialect.pause()),
            unpause: Arc::from(UNPAUSE),
        }
    }

    /// The dialect the statements are written in.
    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The claim of `queues` queues (`$2`, a JSON array of them), with the kinds' filter
    /// (`$6`) if `kinds`: the first `$3` jobs of each queue, each walked in the claim index's
    /// order, then the first `$3` of those. One `queue IN (…)` over the index would instead
    /// fetch and sort every pending job of those queues to find the first few.
    pub(crate) fn claim_many(&self, queues: usize, kinds: bool) -> Arc<str> {
        let d = self.dialect;
        let filter = d.kind_filter(kinds);
        let (lock, queue_at): (&str, fn(usize) -> String) = match d {
            Dialect::Sqlite => (sqlite::ARM_LOCK, sqlite::queue_at),
            Dialect::Postgres => (postgres::ARM_LOCK, postgres::queue_at),
        };
        let arm = |k: usize| {
            format!(
                "SELECT * FROM (SELECT j.id, j.priority, j.run_at FROM redrive_jobs j \
                 WHERE {}{filter} ORDER BY j.priority, j.run_at, j.id LIMIT $3{lock}) a{k}",
                claimable(&one_queue(&queue_at(k)))
            )
        };
        let arms = (0..queues).map(arm).collect::<Vec<_>>().join(" UNION ALL ");
        Arc::from(match d {
            Dialect::Sqlite => sqlite::claim_union(&arms),
            Dialect::Postgres => postgres::claim_union(&arms),
        })
    }
}

const HEARTBEAT: &str = "UPDATE redrive_jobs SET lease_expires_at = $3, updated_at = $4 \
                 WHERE id = $1 AND lease_token = $2 AND state = 'running'";

const PURGE_ALL: &str =
    "DELETE FROM redrive_jobs WHERE state = 'dead' AND ($1 IS NULL OR queue = $1)";

const RESCUE: &str = "UPDATE redrive_jobs SET attempts = attempts + 1, \
                 state = CASE WHEN attempts + 1 >= max_attempts THEN 'dead' ELSE 'available' END, \
                 dead_reason = CASE WHEN attempts + 1 >= max_attempts THEN 'lease_expired' ELSE NULL END, \
                 finished_at = CASE WHEN attempts + 1 >= max_attempts THEN $1 ELSE NULL END, \
                 first_attempt_at = COALESCE(first_attempt_at, $1), \
                 lease_token = lease_token + 1, lease_owner = NULL, lease_expires_at = NULL, \
                 run_at = $1, last_error = 'lease expired: the worker stopped heartbeating', updated_at = $1 \
                 WHERE state = 'running' AND lease_expires_at < $1 AND id IN \
                   (SELECT id FROM redrive_jobs WHERE state = 'running' AND lease_expires_at < $1 \
                    ORDER BY lease_expires_at LIMIT $2) \
                 RETURNING id, state, lease_token, replays, queue";

const RESCUE_ATTEMPT: &str = "INSERT INTO redrive_attempts (job_id, number, replay, lease_token, worker, started_at, \
                 duration_ms, class, http_status, error, delay_ms, mode, counted) \
                 VALUES ($1, (SELECT COUNT(*) + 1 FROM redrive_attempts WHERE job_id = $1 AND replay = $2), \
                 $2, $3, NULL, $4, 0, 'timeout', NULL, 'lease expired: the worker stopped heartbeating', \
                 NULL, NULL, TRUE)";

const COUNTS: &str = "SELECT queue, state, COUNT(*) AS n FROM redrive_jobs GROUP BY queue, state \
                 ORDER BY queue, state";

const UPSERT_BREAKER: &str = "INSERT INTO redrive_dependencies (name, state, open_until, probe_permits, updated_at, \
                 version) VALUES ($1, $2, $3, $4, $5, 1) ON CONFLICT (name) DO UPDATE SET state = excluded.state, \
                 open_until = excluded.open_until, probe_permits = excluded.probe_permits, \
                 probe_successes = 0, probe_failures = 0, round_started = excluded.updated_at, \
                 updated_at = excluded.updated_at, version = redrive_dependencies.version + 1 \
                 WHERE $6 IS NULL OR redrive_dependencies.state = $6 RETURNING name";

const INSERT_EVENT: &str = "INSERT INTO redrive_dependency_events (dependency, at, from_state, to_state, reason) \
                 VALUES ($1, $2, $3, $4, $5)";

const EVENTS: &str = "SELECT id, dependency, at, from_state, to_state, reason FROM redrive_dependency_events \
                 WHERE ($1 IS NULL OR dependency = $1) ORDER BY id DESC LIMIT $2";

const UPDATE_DEP: &str = "UPDATE redrive_dependencies SET state = $2, open_until = $3, probe_permits = $4, \
                 paused_until = $5, pause_reason = $6, updated_at = $7, version = version + 1, \
                 mode = $8, openings = $9, probe_successes = $10, probe_failures = $11, \
                 round_started = $12, rate_rps = $13, tat_us = $14, rate_cut_at = $15, \
                 rate_cap = $16, rate_raised_at = $17, rate_lifted = $18, meter_started = $19, \
                 meter_slots = $20, meter_rate = $21, cycle_started = $22, cycle_slots = $23, \
                 rate_pause_ms = $24 \
                 WHERE name = $1 AND version = $25 RETURNING version";

const UNPAUSE: &str = "UPDATE redrive_dependencies SET paused_until = NULL, pause_reason = NULL, updated_at = $2, \
                 version = version + 1 WHERE name = $1";

/// The columns a replay resets (`$1`: now).
pub(crate) const REPLAY_SET: &str = "state = 'available', run_at = $1, attempts = 0, exceptions = 0, defers = 0, \
    consecutive_auth = 0, prev_delay_ms = NULL, first_attempt_at = NULL, \
    deadline = CASE WHEN ttl_ms IS NULL THEN NULL ELSE $1 + ttl_ms END, dead_reason = NULL, \
    defer_reason = NULL, replays = replays + 1, finished_at = NULL, updated_at = $1";

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement of `s`, named.
    fn all(s: &Sql) -> Vec<(String, Arc<str>)> {
        let mut out: Vec<(String, Arc<str>)> = vec![
            ("find_by_key".into(), s.find_by_key.clone()),
            ("get_job".into(), s.get_job.clone()),
            ("attempts_of".into(), s.attempts_of.clone()),
            ("claim_one".into(), s.claim_one.clone()),
            ("claim_one_kinds".into(), s.claim_one_kinds.clone()),
            ("claim_all".into(), s.claim_all.clone()),
            ("claim_all_kinds".into(), s.claim_all_kinds.clone()),
            ("claim_set".into(), s.claim_set.clone()),
            ("claim_set_kinds".into(), s.claim_set_kinds.clone()),
            ("next_due_all".into(), s.next_due_all.clone()),
            ("next_due_all_kinds".into(), s.next_due_all_kinds.clone()),
            ("heartbeat".into(), s.heartbeat.clone()),
            ("cancel".into(), s.cancel.clone()),
            ("replay_ids".into(), s.replay_ids.clone()),
            ("replay_all".into(), s.replay_all.clone()),
            ("purge_ids".into(), s.purge_ids.clone()),
            ("purge_all".into(), s.purge_all.clone()),
            ("rescue".into(), s.rescue.clone()),
            ("rescue_attempt".into(), s.rescue_attempt.clone()),
            ("list".into(), s.list.clone()),
            ("counts".into(), s.counts.clone()),
            ("next_due".into(), s.next_due.clone()),
            ("next_due_kinds".into(), s.next_due_kinds.clone()),
            ("list_key".into(), s.list_key.clone()),
            ("get_dep".into(), s.get_dep.clone()),
            ("list_deps".into(), s.list_deps.clone()),
            ("upsert_breaker".into(), s.upsert_breaker.clone()),
            ("insert_event".into(), s.insert_event.clone()),
            ("events".into(), s.events.clone()),
            ("insert_dep".into(), s.insert_dep.clone()),
            ("update_dep".into(), s.update_dep.clone()),
            ("pause".into(), s.pause.clone()),
            ("unpause".into(), s.unpause.clone()),
        ];
        for (i, st) in s.list_state.iter().enumerate() {
            out.push((format!("list_state[{i}]"), st.clone()));
        }
        for queues in 1..=4 {
            for kinds in [false, true] {
                out.push((
                    format!("claim_many({queues}, {kinds})"),
                    s.claim_many(queues, kinds),
                ));
            }
        }
        out
    }

    #[test]
    fn no_dialect_gets_the_others_spelling_or_a_marker() {
        for (dialect, foreign) in [
            (Dialect::Sqlite, ["GREATEST(", "jsonb", "FOR UPDATE", "->>"]),
            (
                Dialect::Postgres,
                ["MAX(", "json_each", "json_extract", "$[0]"],
            ),
        ] {
            for (name, text) in all(&Sql::new(dialect)) {
                for bad in foreign {
                    assert!(
                        !text.contains(bad),
                        "{dialect:?} {name} has {bad:?}: {text}"
                    );
                }
                for marker in ["KINDS_", "JSON_TEXTS_", "JSON_IDS_", "QUEUES_"] {
                    assert!(
                        !text.contains(marker),
                        "{dialect:?} {name} has {marker}: {text}"
                    );
                }
            }
        }
    }

    #[test]
    fn each_dialect_keeps_its_own_spelling() {
        let (lite, pg) = (Sql::new(Dialect::Sqlite), Sql::new(Dialect::Postgres));
        assert!(lite.next_due.contains("ELSE MAX(j.run_at, "));
        assert!(lite.pause.contains("paused_until = MAX(COALESCE("));
        assert!(pg.next_due.contains("ELSE GREATEST(j.run_at, "));
        assert!(pg.pause.contains("paused_until = GREATEST(COALESCE("));
        assert!(pg.claim_one.contains("FOR UPDATE OF j SKIP LOCKED"));
        assert!(
            pg.claim_many(2, true)
                .contains("LIMIT $3 FOR UPDATE OF j SKIP LOCKED) a1")
        );
        assert!(
            lite.claim_many(2, false)
                .contains("json_extract($2, '$[1]')")
        );
        assert!(pg.purge_ids.ends_with("AS BIGINT))"));
        // Every queue: the paused queues read once, rows locked and skipped on PostgreSQL,
        // and no list of queues to read.
        assert!(pg.claim_all.contains("FOR UPDATE OF j SKIP LOCKED"));
        assert!(pg.claim_set_kinds.contains("FOR UPDATE OF j SKIP LOCKED"));
        assert!(pg.claim_all.contains(postgres::NOT_PAUSED));
        assert!(lite.claim_all_kinds.contains(sqlite::NOT_PAUSED));
        for st in [&pg.claim_all, &lite.claim_all, &pg.next_due_all] {
            assert!(!st.contains("$2"), "{st}");
        }
        assert!(
            lite.claim_set
                .contains("+j.queue IN (SELECT value FROM json_each($2))")
        );
        assert!(
            lite.claim_one_kinds
                .contains("j.kind IN (SELECT value FROM json_each($6))")
        );
    }
}
