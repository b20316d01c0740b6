//! Periodic jobs: schedules with a cron expression, stored so that every process of the fleet
//! sees the same ones, and fired so that each tick enqueues exactly one job fleet-wide.
//!
//! **Exactly one job per tick.** A schedule's row keeps `next_tick`, the first tick not
//! handled yet. A scheduler ([`Store::fire_schedules`]) moves it past `now` with a
//! compare-and-set, in the same transaction that enqueues the jobs of the ticks it passed: of
//! any number of schedulers that see the same ticks, one moves the row and the others' change
//! nothing. Each job's idempotency key is derived from the schedule's name and the tick's
//! time ([`tick_key`]), so even a scheduler working from a stale read can only find the job
//! that exists, never make a second one.
//!
//! **Missed ticks** (the fleet was down, or no worker ran): a tick handled within
//! [`MISFIRE_GRACE`] of its time is on time and always enqueued; older ones follow the
//! schedule's [`Missed`] rule: `skip` drops them, `last` enqueues the latest of them, `all`
//! enqueues them all, at most the latest [`MAX_CATCH_UP`] (older ones are dropped).
//!
//! Cron expressions are read in UTC, with a seconds field: `sec min hour day-of-month month
//! day-of-week [year]` (`*/10 * * * * *` every ten seconds; `0 0 2 * * *` daily at 02:00). A
//! five-field crontab line (`min hour dom month dow`) is read with second 0.

use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::model::{JobId, NewJob, dur_ms, from_millis, millis};
use crate::ops::Backend as _;
use crate::{Result, Store, StoreError, Timestamp};

/// A tick handled within this long after its time is on time; later it is missed and follows
/// the schedule's [`Missed`] rule.
pub const MISFIRE_GRACE: Duration = Duration::from_secs(10);

/// The most missed ticks a schedule with [`Missed::All`] enqueues at once (the latest ones).
pub const MAX_CATCH_UP: usize = 100;

/// The longest schedule name: the tick's key (`schedule:NAME:TIME`) must fit in a key.
pub const MAX_SCHEDULE_NAME: usize = 200;

/// What to do with ticks missed while no scheduler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Drop them; run the next tick on time.
    Skip,
    /// Run the latest missed tick once (the default).
    #[default]
    Last,
    /// Run every missed tick, at most the latest [`MAX_CATCH_UP`].
    All,
}

impl Missed {
    /// Every rule, in the order documented.
    pub const ALL: [Missed; 3] = [Missed::Skip, Missed::Last, Missed::All];

    /// Its stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::Last => "last",
            Missed::All => "all",
        }
    }
}

impl std::fmt::Display for Missed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Missed {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        Missed::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| StoreError::Invalid {
                field: "missed",
                value: s.chars().take(80).collect(),
                reason: "expected skip, last or all".into(),
            })
    }
}

/// A parsed cron expression (UTC, with seconds; see the module docs).
#[derive(Debug, Clone)]
pub struct Cron(cron::Schedule);

impl Cron {
    /// Parses an expression: six or seven fields (with seconds, optionally a year), five
    /// (a crontab line; second 0), or a shorthand such as `@hourly` or `@daily`.
    ///
    /// ```
    /// use redrive_store::Cron;
    /// let c = Cron::parse("*/15 * * * * *").unwrap();
    /// let t = redrive_store::from_millis(1_800_000_001_000);
    /// assert_eq!(c.next_after(t).unwrap().timestamp() % 15, 0);
    /// assert!(Cron::parse("every minute").is_err());
    /// ```
    ///
    /// # Errors
    /// [`StoreError::Invalid`] naming the field `cron`, the expression and what is wrong.
    pub fn parse(expr: &str) -> Result<Self> {
        let bad = |reason: String| StoreError::Invalid {
            field: "cron",
            value: expr.chars().take(120).collect(),
            reason,
        };
        let t = expr.trim();
        let fields = t.split_whitespace().count();
        let full = match fields {
            _ if t.starts_with('@') => t.to_owned(),
            5 => format!("0 {t}"),
            6 | 7 => t.split_whitespace().collect::<Vec<_>>().join(" "),
            n => {
                return Err(bad(format!(
                    "has {n} fields; expected 6 (sec min hour day-of-month month day-of-week), \
                     7 (with a year) or 5 (a crontab line)"
                )));
            }
        };
        let s = cron::Schedule::from_str(&full).map_err(|e| bad(e.to_string()))?;
        Ok(Self(s))
    }

    /// The first tick strictly after `t` (`None`: there is none).
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.0.after(&t).next()
    }

    /// Up to `n` ticks strictly after `t`.
    pub fn upcoming(&self, t: Timestamp, n: usize) -> Vec<Timestamp> {
        self.0.after(&t).take(n).collect()
    }

    /// Ticks at or before `t`, latest first.
    fn back_from(&self, t: Timestamp) -> impl Iterator<Item = Timestamp> + '_ {
        // The iterator steps back from its start, exclusive: start just after `t`, so that
        // a tick at `t` itself comes first.
        self.0
            .after(&(t + chrono::Duration::milliseconds(1)))
            .rev()
            .filter(move |x| *x <= t)
    }
}

/// The ticks a scheduler enqueues at `now` for a schedule whose first unhandled tick is
/// `next_tick`, ascending: every tick in `[next_tick, now]` within `grace` of `now` (on
/// time), and of the older (missed) ones what `missed` says. At most [`MAX_CATCH_UP`] missed
/// ones, and at most [`MAX_CATCH_UP`] on time.
pub fn due_ticks(
    cron: &Cron,
    next_tick: Timestamp,
    now: Timestamp,
    missed: Missed,
    grace: Duration,
) -> Vec<Timestamp> {
    if next_tick > now {
        return Vec::new();
    }
    let grace = chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX);
    let (mut on_time, mut late) = (0usize, 0usize);
    let mut out = Vec::new();
    for t in cron.back_from(now) {
        if t < next_tick {
            break;
        }
        if now - t <= grace {
            if on_time == MAX_CATCH_UP {
                continue;
            }
            on_time += 1;
            out.push(t);
            continue;
        }
        match missed {
            Missed::Skip => break,
            Missed::Last => {
                out.push(t);
                break;
            }
            Missed::All => {
                if late == MAX_CATCH_UP {
                    break;
                }
                late += 1;
                out.push(t);
            }
        }
    }
    out.reverse();
    out
}

/// The idempotency key of a schedule's job for one tick: `schedule:NAME:TIME` with the tick
/// in RFC 3339 (UTC, milliseconds).
///
/// ```
/// let t = redrive_store::from_millis(1_800_000_000_000);
/// assert_eq!(redrive_store::tick_key("settle", t), "schedule:settle:2027-01-15T08:00:00.000Z");
/// ```
pub fn tick_key(name: &str, tick: Timestamp) -> String {
    format!(
        "schedule:{name}:{}",
        tick.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )
}

/// A schedule to create or replace: its name, when, what to do with missed ticks, and the
/// job each tick enqueues (its `key` and `run_at` are set per tick).
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleSpec {
    /// Unique name (at most [`MAX_SCHEDULE_NAME`] bytes).
    pub name: String,
    /// The cron expression ([`Cron::parse`]).
    pub cron: String,
    /// The rule for missed ticks.
    pub missed: Missed,
    /// The job of each tick.
    pub job: NewJob,
}

impl ScheduleSpec {
    /// Checks every field; the error names the first bad one.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] naming `name`, `cron` or the job's field.
    pub fn validate(&self) -> Result<Cron> {
        if self.name.len() > MAX_SCHEDULE_NAME {
            return Err(StoreError::Invalid {
                field: "name",
                value: self.name.chars().take(80).collect(),
                reason: format!("longer than {MAX_SCHEDULE_NAME} bytes"),
            });
        }
        let mut probe = self.job.clone().key(tick_key(&self.name, from_millis(0)));
        probe.run_at = None;
        // The name is checked as a queue name is (not empty, no control characters).
        NewJob {
            queue: self.name.clone(),
            ..probe.clone()
        }
        .validate()
        .map_err(|e| match e {
            StoreError::Invalid {
                field: "queue",
                value,
                reason,
            } => StoreError::Invalid {
                field: "name",
                value,
                reason,
            },
            other => other,
        })?;
        probe.validate()?;
        Cron::parse(&self.cron)
    }
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    /// Unique name.
    pub name: String,
    /// The cron expression as given.
    pub cron: String,
    /// The rule for missed ticks.
    pub missed: Missed,
    /// The queue of each tick's job.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// Its dependency.
    pub dependency: Option<String>,
    /// Its priority.
    pub priority: i32,
    /// Its retry policy's name.
    pub policy: String,
    /// Its attempts allowed.
    pub max_attempts: u32,
    /// Its total time allowed (JSON: `ttl_ms`, whole milliseconds).
    #[serde(rename = "ttl_ms", serialize_with = "crate::json_ms::option")]
    pub ttl: Option<Duration>,
    /// Where it came from: `policies` (the policies file, upserted at start) or `api` (the
    /// CLI or the HTTP API).
    pub origin: String,
    /// The first tick not handled yet (`None`: the expression has no more ticks).
    pub next_tick: Option<Timestamp>,
    /// The latest tick a job was enqueued for.
    pub last_tick: Option<Timestamp>,
    /// That job.
    pub last_job_id: Option<JobId>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was last changed (by an upsert or a tick).
    pub updated_at: Timestamp,
}

impl Schedule {
    /// The job of one tick (key and run time set).
    pub fn job_for(&self, tick: Timestamp) -> NewJob {
        let mut j = NewJob::new(self.queue.clone(), self.kind.clone(), self.payload.clone())
            .key(tick_key(&self.name, tick))
            .run_at(tick)
            .policy(self.policy.clone())
            .max_attempts(self.max_attempts)
            .priority(self.priority);
        j.dependency = self.dependency.clone();
        j.ttl = self.ttl;
        j
    }
}

/// One tick's job, as [`Store::fire_schedules`] enqueued it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fired {
    /// The schedule.
    pub schedule: String,
    /// The tick.
    pub tick: Timestamp,
    /// The job.
    pub job_id: JobId,
    /// `false`: the job already existed (another scheduler made it).
    pub created: bool,
}

const COLS: &str = "name, cron, missed, queue, kind, payload, dependency, priority, policy, \
    max_attempts, ttl_ms, origin, next_tick, last_tick, last_job_id, created_at, updated_at";

#[derive(Debug, sqlx::FromRow)]
struct Row {
    name: String,
    cron: String,
    missed: String,
    queue: String,
    kind: String,
    payload: String,
    dependency: Option<String>,
    priority: i64,
    policy: String,
    max_attempts: i64,
    ttl_ms: Option<i64>,
    origin: String,
    next_tick: Option<i64>,
    last_tick: Option<i64>,
    last_job_id: Option<i64>,
    created_at: i64,
    updated_at: i64,
}

impl Row {
    fn into_schedule(self) -> Result<Schedule> {
        let corrupt = |what: &'static str, detail: String| StoreError::Corrupt { what, detail };
        Ok(Schedule {
            missed: self
                .missed
                .parse()
                .map_err(|e: StoreError| corrupt("schedule missed", e.to_string()))?,
            payload: serde_json::from_str(&self.payload)
                .map_err(|e| corrupt("schedule payload", e.to_string()))?,
            priority: i32::try_from(self.priority)
                .map_err(|_| corrupt("schedule priority", self.priority.to_string()))?,
            max_attempts: u32::try_from(self.max_attempts)
                .map_err(|_| corrupt("schedule max_attempts", self.max_attempts.to_string()))?,
            ttl: self
                .ttl_ms
                .and_then(|t| u64::try_from(t).ok())
                .map(Duration::from_millis),
            next_tick: self.next_tick.map(from_millis),
            last_tick: self.last_tick.map(from_millis),
            created_at: from_millis(self.created_at),
            updated_at: from_millis(self.updated_at),
            name: self.name,
            cron: self.cron,
            queue: self.queue,
            kind: self.kind,
            dependency: self.dependency,
            policy: self.policy,
            origin: self.origin,
            last_job_id: self.last_job_id,
        })
    }
}

const UPSERT: &str = "INSERT INTO redrive_schedules (name, cron, missed, queue, kind, payload, \
    dependency, priority, policy, max_attempts, ttl_ms, origin, next_tick, created_at, updated_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14) \
    ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, missed = excluded.missed, \
    queue = excluded.queue, kind = excluded.kind, payload = excluded.payload, \
    dependency = excluded.dependency, priority = excluded.priority, policy = excluded.policy, \
    max_attempts = excluded.max_attempts, ttl_ms = excluded.ttl_ms, origin = excluded.origin, \
    next_tick = CASE WHEN redrive_schedules.cron = excluded.cron \
      THEN redrive_schedules.next_tick ELSE excluded.next_tick END, \
    updated_at = excluded.updated_at";
const EXISTS: &str = "SELECT COUNT(*) FROM redrive_schedules WHERE name = $1";
const MOVE: &str = "UPDATE redrive_schedules SET next_tick = $3, updated_at = $4 \
    WHERE name = $1 AND next_tick = $2";
const MOVE_NONE: &str = "UPDATE redrive_schedules SET next_tick = NULL, updated_at = $3 \
    WHERE name = $1 AND next_tick = $2";
const LAST: &str = "UPDATE redrive_schedules SET last_tick = $2, last_job_id = $3 WHERE name = $1";
const DELETE: &str = "DELETE FROM redrive_schedules WHERE name = $1";
const NEXT: &str = "SELECT MIN(next_tick) FROM redrive_schedules";

impl Store {
    /// Creates the schedule, or replaces the one of that name. A replacement with the same
    /// cron expression keeps its place (`next_tick`), so ticks missed while the fleet was down
    /// are still caught up after a restart that upserts the policies file's schedules; a new
    /// expression starts at its first tick after `now`. `origin` says where it came from
    /// (`policies` or `api`). Returns the schedule and whether it was created.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] naming the bad field ([`ScheduleSpec::validate`]).
    pub async fn upsert_schedule(
        &self,
        spec: &ScheduleSpec,
        origin: &str,
        now: Timestamp,
    ) -> Result<(Schedule, bool)> {
        let cron = spec.validate()?;
        let j = &spec.job;
        let Some(next) = cron.next_after(now).map(millis) else {
            return Err(StoreError::Invalid {
                field: "cron",
                value: spec.cron.chars().take(120).collect(),
                reason: "has no tick after now".into(),
            });
        };
        let existed: i64 = dispatch!(self, s => {
            let mut tx = s.tx().await?;
            let n: i64 = sqlx::query_scalar(EXISTS).bind(&spec.name).fetch_one(&mut *tx).await?;
            sqlx::query(UPSERT)
                .bind(&spec.name)
                .bind(spec.cron.trim())
                .bind(spec.missed.as_str())
                .bind(&j.queue)
                .bind(&j.kind)
                .bind(j.payload.to_string())
                .bind(&j.dependency)
                .bind(i64::from(j.priority))
                .bind(&j.policy)
                .bind(i64::from(j.max_attempts))
                .bind(j.ttl.map(dur_ms))
                .bind(origin)
                .bind(next)
                .bind(millis(now))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            n
        });
        let sched = self
            .schedule(&spec.name)
            .await?
            .ok_or_else(|| StoreError::Corrupt {
                what: "schedule",
                detail: format!("{} vanished after its upsert", spec.name),
            })?;
        Ok((sched, existed == 0))
    }

    /// Every schedule, by name.
    pub async fn schedules(&self) -> Result<Vec<Schedule>> {
        let sql = format!("SELECT {COLS} FROM redrive_schedules ORDER BY name");
        let rows: Vec<Row> = dispatch!(self, s => {
            sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&s.read).await?
        });
        rows.into_iter().map(Row::into_schedule).collect()
    }

    /// One schedule.
    pub async fn schedule(&self, name: &str) -> Result<Option<Schedule>> {
        let sql = format!("SELECT {COLS} FROM redrive_schedules WHERE name = $1");
        let row: Option<Row> = dispatch!(self, s => {
            sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(name).fetch_optional(&s.read).await?
        });
        row.map(Row::into_schedule).transpose()
    }

    /// Deletes a schedule (its jobs stay). Returns whether it existed.
    pub async fn remove_schedule(&self, name: &str) -> Result<bool> {
        let n = dispatch!(self, s => sqlx::query(DELETE).bind(name).execute(&s.pool).await?.rows_affected());
        Ok(n > 0)
    }

    /// The earliest `next_tick` of all schedules (`None`: no schedule will tick).
    pub async fn next_schedule_tick(&self) -> Result<Option<Timestamp>> {
        let t: Option<i64> =
            dispatch!(self, s => sqlx::query_scalar(NEXT).fetch_one(&s.read).await?);
        Ok(t.map(from_millis))
    }

    /// Enqueues the jobs of every schedule's ticks due at `now` ([`due_ticks`] with
    /// [`MISFIRE_GRACE`]) and moves each schedule past `now`, each schedule in one
    /// transaction that does nothing when another scheduler moved it first. Safe to run from
    /// any number of processes at once: each tick gets exactly one job. Returns the jobs of
    /// the ticks this call handled (those of a tick another scheduler made show `created:
    /// false`).
    ///
    /// A schedule whose stored expression no longer parses is skipped with a warning.
    pub async fn fire_schedules(&self, now: Timestamp) -> Result<Vec<Fired>> {
        let sql = format!(
            "SELECT {COLS} FROM redrive_schedules WHERE next_tick IS NOT NULL \
             AND next_tick <= $1 ORDER BY name"
        );
        let rows: Vec<Row> = dispatch!(self, s => {
            sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(millis(now)).fetch_all(&s.read).await?
        });
        let mut out = Vec::new();
        for row in rows {
            let sched = match row.into_schedule() {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("skipping an unreadable schedule: {e}");
                    continue;
                }
            };
            let Some(from) = sched.next_tick else {
                continue;
            };
            let cron = match Cron::parse(&sched.cron) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(schedule = %sched.name, "skipping a schedule: {e}");
                    continue;
                }
            };
            let ticks = due_ticks(&cron, from, now, sched.missed, MISFIRE_GRACE);
            let next = cron.next_after(now);
            let fired = dispatch!(self, s => {
                let mut tx = s.tx().await?;
                let moved = match next {
                    Some(n) => sqlx::query(MOVE)
                        .bind(&sched.name)
                        .bind(millis(from))
                        .bind(millis(n))
                        .bind(millis(now))
                        .execute(&mut *tx)
                        .await?
                        .rows_affected(),
                    None => sqlx::query(MOVE_NONE)
                        .bind(&sched.name)
                        .bind(millis(from))
                        .bind(millis(now))
                        .execute(&mut *tx)
                        .await?
                        .rows_affected(),
                };
                if moved == 0 {
                    // Another scheduler handled these ticks first.
                    continue;
                }
                let mut fired = Vec::with_capacity(ticks.len());
                for &tick in &ticks {
                    let e = s.enqueue_in(&mut tx, &sched.job_for(tick), now).await?;
                    fired.push(Fired {
                        schedule: sched.name.clone(),
                        tick,
                        job_id: e.job.id,
                        created: e.created,
                    });
                }
                if let Some(f) = fired.last() {
                    sqlx::query(LAST)
                        .bind(&sched.name)
                        .bind(millis(f.tick))
                        .bind(f.job_id)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                if fired.iter().any(|f| f.created) {
                    s.wake();
                }
                fired
            });
            out.extend(fired);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000_000; // a whole minute (2027-01-15T08:00:00Z)

    fn t(ms: i64) -> Timestamp {
        from_millis(T0 + ms)
    }

    fn secs(v: &[Timestamp]) -> Vec<i64> {
        v.iter().map(|x| (millis(*x) - T0) / 1000).collect()
    }

    #[test]
    fn cron_parses_with_seconds_crontab_lines_and_refuses_garbage_naming_the_field() {
        let every = Cron::parse("* * * * * *").unwrap();
        assert_eq!(every.next_after(t(0)), Some(t(1000)));
        assert_eq!(every.next_after(t(400)), Some(t(1000)));
        let minutely = Cron::parse("* * * * *").unwrap();
        assert_eq!(minutely.next_after(t(0)), Some(t(60_000)));
        assert_eq!(
            secs(&Cron::parse("*/20 * * * * *").unwrap().upcoming(t(0), 3)),
            [20, 40, 60]
        );
        for bad in [
            "",
            "* * *",
            "61 * * * * *",
            "a b c d e f",
            "* * * * * * * *",
        ] {
            let e = Cron::parse(bad).unwrap_err();
            assert!(
                matches!(e, StoreError::Invalid { field: "cron", .. }),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn back_from_includes_a_tick_at_the_instant() {
        let every = Cron::parse("* * * * * *").unwrap();
        let back: Vec<_> = every.back_from(t(3000)).take(3).collect();
        assert_eq!(secs(&back), [3, 2, 1]);
        let back: Vec<_> = every.back_from(t(3500)).take(2).collect();
        assert_eq!(secs(&back), [3, 2]);
    }

    #[test]
    fn on_time_ticks_are_always_enqueued_whatever_the_rule() {
        let every = Cron::parse("* * * * * *").unwrap();
        for m in Missed::ALL {
            // A scheduler that looks every 2.5 s sees two or three ticks, all on time.
            assert_eq!(
                secs(&due_ticks(&every, t(1000), t(3500), m, MISFIRE_GRACE)),
                [1, 2, 3]
            );
            // Nothing due yet.
            assert!(due_ticks(&every, t(4000), t(3500), m, MISFIRE_GRACE).is_empty());
            // The tick at the instant itself is due.
            assert_eq!(
                secs(&due_ticks(&every, t(4000), t(4000), m, MISFIRE_GRACE)),
                [4]
            );
        }
    }

    #[test]
    fn missed_ticks_follow_the_rule() {
        let minutely = Cron::parse("0 * * * * *").unwrap();
        let g = Duration::from_secs(2);
        // Down from 00:30 to 10:05 (ticks at 1m..10m missed, none within 2 s).
        let (from, now) = (t(60_000), t(605_000));
        assert!(due_ticks(&minutely, from, now, Missed::Skip, g).is_empty());
        assert_eq!(
            secs(&due_ticks(&minutely, from, now, Missed::Last, g)),
            [600]
        );
        assert_eq!(
            secs(&due_ticks(&minutely, from, now, Missed::All, g)),
            [60, 120, 180, 240, 300, 360, 420, 480, 540, 600]
        );
        // With 6 s of grace the 10m tick, 5 s ago, is on time; the others follow the rule.
        let g = Duration::from_secs(6);
        assert_eq!(
            secs(&due_ticks(&minutely, from, now, Missed::Skip, g)),
            [600]
        );
        assert_eq!(
            secs(&due_ticks(&minutely, from, now, Missed::Last, g)),
            [540, 600]
        );
        assert_eq!(due_ticks(&minutely, from, now, Missed::All, g).len(), 10);
    }

    #[test]
    fn all_is_bounded_to_the_latest_ticks() {
        let every = Cron::parse("* * * * * *").unwrap();
        // A day down: 86,400 ticks missed; `all` enqueues the latest MAX_CATCH_UP of the
        // missed ones plus the on-time ones.
        let now = t(86_400_000);
        let v = due_ticks(&every, t(1000), now, Missed::All, Duration::from_secs(10));
        assert_eq!(v.len(), MAX_CATCH_UP + 11);
        assert_eq!(*v.last().unwrap(), now);
        assert!(
            v.windows(2)
                .all(|w| w[1] - w[0] == chrono::Duration::seconds(1))
        );
        // With no grace the tick at the instant is on time, and `last` adds the latest missed.
        let v = due_ticks(&every, t(1000), now, Missed::Last, Duration::ZERO);
        assert_eq!(v, [now - chrono::Duration::seconds(1), now]);
        let v = due_ticks(
            &every,
            t(1000),
            now + chrono::Duration::milliseconds(1),
            Missed::Last,
            Duration::ZERO,
        );
        assert_eq!(v, [now], "the latest missed tick");
    }

    #[test]
    fn tick_keys_and_missed_names_round_trip() {
        assert_eq!(
            tick_key("a", t(1500)),
            "schedule:a:2027-01-15T08:00:01.500Z"
        );
        for m in Missed::ALL {
            assert_eq!(m.as_str().parse::<Missed>().unwrap(), m);
        }
        let e = "sometimes".parse::<Missed>().unwrap_err();
        assert!(e.to_string().contains("missed") && e.to_string().contains("sometimes"));
    }
}
