//! Card declines and the fleet-wide per-card reattempt quotas (`redrive_declines`,
//! `redrive_reattempts`).
//!
//! # Why the quota is counted in the store
//! The networks count reattempts per card across every job and every worker of a merchant:
//! fifteen jobs for one card on eight workers are one card's reattempts. So a worker, before
//! an authorisation that follows a decline, *takes* a reattempt from the store
//! ([`Store::take_reattempt`]): the count over each window and the insert of the new
//! reattempt happen under one lock per card key (SQLite's single writer, `BEGIN IMMEDIATE`;
//! a PostgreSQL transaction-scoped advisory lock on the key), so no two workers can both take
//! the fifteenth. A reattempt is taken *before* the call: a crash after the take and before
//! the call counts one reattempt too many, never one too few.

use std::time::Duration;

use redrive_policy::{DeclineAdvice, Network, QuotaExhausted, QuotaRules, QuotaWindow, Timestamp};
use serde::Serialize;

use crate::model::{from_millis, millis};
use crate::ops::Backend as _;
use crate::{JobId, Result, Store, StoreError};

/// A decline to record with its advice.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDecline {
    /// The job.
    pub job_id: JobId,
    /// The attempt's number (1-based, counted attempts after it).
    pub attempt: u32,
    /// The job's card key, if any.
    pub quota_key: Option<String>,
    /// What the network said.
    pub advice: DeclineAdvice,
    /// When.
    pub at: Timestamp,
    /// When the decline stops the card ([`DeclineAdvice::stops_card`]) and the job has a
    /// `quota_key`: how long every other job of the key is blocked (the network's
    /// [`QuotaRules::card_stop`]). Recorded with the decline, in the same transaction, as the
    /// key's [`CardStop`] (the later end wins when the key is stopped already).
    pub stop_for: Option<Duration>,
}

/// A card key stopped by a decline (Visa category 1, Mastercard MAC 03/21): no job of the key
/// is called until `until`, or until an operator lifts it ([`Store::lift_card_stop`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CardStop {
    /// The card key.
    pub quota_key: String,
    /// The job whose decline stopped it.
    pub job_id: JobId,
    /// That job's attempt.
    pub attempt: u32,
    /// When the decline came.
    pub at: Timestamp,
    /// When the stop ends.
    pub until: Timestamp,
    /// The decline's network.
    pub network: Network,
    /// The issuer's response code.
    pub code: Option<String>,
    /// Visa's decline category.
    pub category: Option<u8>,
    /// Mastercard's Merchant Advice Code.
    pub advice_code: Option<u8>,
    /// The decline's rule (`never_retry`, `recurring_stopped`).
    pub rule: String,
}

impl CardStop {
    /// One line naming the blocking decline: `card key fp_1 stopped until 2027-01-06T…: job 12
    /// declined visa 14 cat 1 (never_retry) at 2026-12-07T…`; the text a blocked job keeps as
    /// its last error.
    pub fn describe(&self) -> String {
        let mut advice = self.network.as_str().to_owned();
        if let Some(c) = &self.code {
            advice.push_str(&format!(" {c}"));
        }
        if let Some(c) = self.category {
            advice.push_str(&format!(" cat {c}"));
        }
        if let Some(m) = self.advice_code {
            advice.push_str(&format!(" mac {m:02}"));
        }
        format!(
            "card key {} stopped until {}: job {} declined {} ({}) at {}",
            self.quota_key,
            self.until
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            self.job_id,
            advice,
            self.rule,
            self.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        )
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct CardStopRow {
    quota_key: String,
    job_id: i64,
    attempt: i64,
    at: i64,
    until: i64,
    network: String,
    code: Option<String>,
    category: Option<i64>,
    advice_code: Option<i64>,
    rule: String,
}

impl CardStopRow {
    fn into_stop(self) -> Result<CardStop> {
        let corrupt = |what: &'static str, detail: String| StoreError::Corrupt { what, detail };
        let small = |what: &'static str, v: Option<i64>| {
            v.map(|v| u8::try_from(v).map_err(|_| corrupt(what, v.to_string())))
                .transpose()
        };
        Ok(CardStop {
            quota_key: self.quota_key,
            job_id: self.job_id,
            attempt: u32::try_from(self.attempt)
                .map_err(|_| corrupt("card stop attempt", self.attempt.to_string()))?,
            at: from_millis(self.at),
            until: from_millis(self.until),
            network: self
                .network
                .parse()
                .map_err(|_| corrupt("card stop network", self.network.clone()))?,
            code: self.code,
            category: small("card stop category", self.category)?,
            advice_code: small("card stop advice code", self.advice_code)?,
            rule: self.rule,
        })
    }
}

/// A recorded decline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decline {
    /// Row id.
    pub id: i64,
    /// The job.
    pub job_id: JobId,
    /// The attempt's number.
    pub attempt: u32,
    /// The card key, if the job had one.
    pub quota_key: Option<String>,
    /// When.
    pub at: Timestamp,
    /// The card network.
    pub network: Network,
    /// The issuer's response code.
    pub code: Option<String>,
    /// Visa's decline category.
    pub category: Option<u8>,
    /// Mastercard's Merchant Advice Code.
    pub advice_code: Option<u8>,
    /// The rule the advice came to (`never_retry`, `retry_after 1d`, `retry_later`, ...).
    pub rule: String,
}

/// A reattempt counted against a card key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reattempt {
    /// The job that made it.
    pub job_id: JobId,
    /// The network whose rules counted it.
    pub network: Network,
    /// When it was taken.
    pub at: Timestamp,
}

/// One window of a network's quota and what a card key used of it ([`Store::quota_use`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowUse {
    /// The network whose rule this is.
    pub network: Network,
    /// The rule: at most `max` reattempts within `window`.
    pub window: QuotaWindow,
    /// Reattempts taken inside the window now.
    pub used: u64,
    /// When the oldest reattempt in the window leaves it (the next room when full).
    pub frees_at: Option<Timestamp>,
}

/// What [`Store::take_reattempt`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaTake {
    /// The reattempt was counted: make the call.
    Taken,
    /// A window is full: no reattempt before `until` (the latest of the full windows' edges).
    Full(QuotaExhausted),
}

/// A reattempt to take against a card key's quota.
#[derive(Debug, Clone, PartialEq)]
pub struct ReattemptParams<'a> {
    /// The card key.
    pub quota_key: &'a str,
    /// The network whose windows apply.
    pub network: Network,
    /// The windows (empty: no quota, always taken).
    pub windows: &'a [QuotaWindow],
    /// The job taking it.
    pub job_id: JobId,
    /// Now.
    pub now: Timestamp,
}

#[derive(sqlx::FromRow)]
struct DeclineRow {
    id: i64,
    job_id: i64,
    attempt: i64,
    quota_key: Option<String>,
    at: i64,
    network: String,
    code: Option<String>,
    category: Option<i64>,
    advice_code: Option<i64>,
    rule: String,
}

impl DeclineRow {
    fn into_decline(self) -> Result<Decline> {
        let corrupt = |what: &'static str, detail: String| StoreError::Corrupt { what, detail };
        let small = |what: &'static str, v: Option<i64>| {
            v.map(|v| u8::try_from(v).map_err(|_| corrupt(what, v.to_string())))
                .transpose()
        };
        Ok(Decline {
            id: self.id,
            job_id: self.job_id,
            attempt: u32::try_from(self.attempt)
                .map_err(|_| corrupt("decline attempt", self.attempt.to_string()))?,
            quota_key: self.quota_key,
            at: from_millis(self.at),
            network: self
                .network
                .parse()
                .map_err(|_| corrupt("decline network", self.network.clone()))?,
            code: self.code,
            category: small("decline category", self.category)?,
            advice_code: small("decline advice code", self.advice_code)?,
            rule: self.rule,
        })
    }
}

pub(crate) const INSERT_DECLINE: &str = "INSERT INTO redrive_declines \
    (job_id, attempt, quota_key, at, network, code, category, advice_code, rule) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
const DECLINES_OF: &str = "SELECT id, job_id, attempt, quota_key, at, network, code, category, \
    advice_code, rule FROM redrive_declines WHERE job_id = $1 ORDER BY id";
pub(crate) const COUNT_IN_WINDOW: &str =
    "SELECT COUNT(*) FROM redrive_reattempts WHERE quota_key = $1 AND at > $2";
pub(crate) const NTH_IN_WINDOW: &str = "SELECT at FROM redrive_reattempts WHERE quota_key = $1 AND at > $2 \
    ORDER BY at, id LIMIT 1 OFFSET $3";
pub(crate) const INSERT_REATTEMPT: &str =
    "INSERT INTO redrive_reattempts (quota_key, network, job_id, at) VALUES ($1, $2, $3, $4)";
const REATTEMPTS_OF: &str = "SELECT job_id, network, at FROM redrive_reattempts \
    WHERE quota_key = $1 AND at > $2 ORDER BY at, id";
/// A card stop, or a later end of the key's stop (a shorter one does not shorten it).
pub(crate) const UPSERT_CARD_STOP: &str = "INSERT INTO redrive_card_stops \
    (quota_key, job_id, attempt, at, until, network, code, category, advice_code, rule) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
    ON CONFLICT (quota_key) DO UPDATE SET job_id = excluded.job_id, attempt = excluded.attempt, \
    at = excluded.at, until = excluded.until, network = excluded.network, code = excluded.code, \
    category = excluded.category, advice_code = excluded.advice_code, rule = excluded.rule \
    WHERE excluded.until > redrive_card_stops.until";
const CARD_STOP_OF: &str = "SELECT quota_key, job_id, attempt, at, until, network, code, \
    category, advice_code, rule FROM redrive_card_stops WHERE quota_key = $1 AND until > $2";
const CARD_STOPS_ACTIVE: &str = "SELECT quota_key, job_id, attempt, at, until, network, code, \
    category, advice_code, rule FROM redrive_card_stops WHERE until > $1 ORDER BY at DESC LIMIT $2";
const DELETE_CARD_STOP: &str = "DELETE FROM redrive_card_stops WHERE quota_key = $1";
/// The key's jobs waiting for its stop to end (`declines.card_stop = "wait"`): due now.
const WAKE_CARD_STOPPED: &str = "UPDATE redrive_jobs SET run_at = $2, updated_at = $2 \
    WHERE quota_key = $1 AND state = 'deferred' AND defer_reason = 'card_stopped' AND run_at > $2";
#[cfg(feature = "postgres")]
const PG_LOCK_KEY: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

pub(crate) fn window_ms(w: Duration) -> i64 {
    i64::try_from(w.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// Records a decline with its advice (shown by `redrive show`).
    ///
    /// # Errors
    /// A database error.
    pub async fn record_decline(&self, d: &NewDecline) -> Result<()> {
        dispatch!(self, s => s.record_decline_impl(d).await)
    }

    /// A job's declines, oldest first.
    ///
    /// # Errors
    /// A database error, or a corrupt row.
    pub async fn declines(&self, job_id: JobId) -> Result<Vec<Decline>> {
        let rows: Vec<DeclineRow> = dispatch!(self, s => {
            sqlx::query_as(DECLINES_OF)
                .bind(job_id)
                .fetch_all(&s.read)
                .await?
        });
        rows.into_iter().map(DeclineRow::into_decline).collect()
    }

    /// Takes one reattempt from a card key's quota, atomically across the fleet: counts the
    /// key's reattempts in each window and, if every window has room, records this one; all
    /// under one lock per key, so concurrent workers can never both take the last one.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a bad `quota_key`; a database error.
    pub async fn take_reattempt(&self, p: &ReattemptParams<'_>) -> Result<QuotaTake> {
        crate::model::check_quota_key(p.quota_key)?;
        if p.windows.is_empty() {
            return Ok(QuotaTake::Taken);
        }
        let now = millis(p.now);
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                // BEGIN IMMEDIATE: the one writer of the file, from the count to the insert.
                let mut tx = s.tx().await?;
                let out = s.take_reattempt_in(&mut tx, p, now).await?;
                tx.commit().await?;
                Ok(out)
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let mut tx = s.tx().await?;
                sqlx::query(PG_LOCK_KEY)
                    .bind(p.quota_key)
                    .execute(&mut *tx)
                    .await?;
                let out = s.take_reattempt_in(&mut tx, p, now).await?;
                tx.commit().await?;
                Ok(out)
            }
        }
    }

    /// The stop of a card key in force at `now`, if any: the decline that stopped it and when
    /// it ends. Read before every call of a job with a `quota_key`.
    ///
    /// # Errors
    /// A database error, or a corrupt row.
    pub async fn card_stop(&self, quota_key: &str, now: Timestamp) -> Result<Option<CardStop>> {
        let row: Option<CardStopRow> = dispatch!(self, s => {
            sqlx::query_as(CARD_STOP_OF)
                .bind(quota_key)
                .bind(millis(now))
                .fetch_optional(&s.read)
                .await?
        });
        row.map(CardStopRow::into_stop).transpose()
    }

    /// The card stops in force at `now`, newest first (at most `limit`, 1 to 1,000).
    ///
    /// # Errors
    /// A database error, or a corrupt row.
    pub async fn card_stops(&self, now: Timestamp, limit: u32) -> Result<Vec<CardStop>> {
        let rows: Vec<CardStopRow> = dispatch!(self, s => {
            sqlx::query_as(CARD_STOPS_ACTIVE)
                .bind(millis(now))
                .bind(i64::from(limit.clamp(1, 1000)))
                .fetch_all(&s.read)
                .await?
        });
        rows.into_iter().map(CardStopRow::into_stop).collect()
    }

    /// Lifts a card key's stop (an operator's decision: the cardholder updated the card, the
    /// decline was a mistake), audited as `card_stop_lift` in the same transaction. Returns
    /// the stop that was in force at `now`, if any; jobs of the key are called again from
    /// their next claim: those deferred `card_stopped` are due at once, those already dead
    /// `card_stopped` stay dead until replayed.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a bad key or actor; a database error.
    pub async fn lift_card_stop(
        &self,
        quota_key: &str,
        actor: &crate::Actor,
        now: Timestamp,
    ) -> Result<Option<CardStop>> {
        crate::model::check_quota_key(quota_key)?;
        crate::operator::check_actor(actor)?;
        dispatch!(self, s => {
            let mut tx = s.tx().await?;
            let row: Option<CardStopRow> = sqlx::query_as(CARD_STOP_OF)
                .bind(quota_key)
                .bind(millis(now))
                .fetch_optional(&mut *tx)
                .await?;
            let stop = row.map(CardStopRow::into_stop).transpose()?;
            sqlx::query(DELETE_CARD_STOP)
                .bind(quota_key)
                .execute(&mut *tx)
                .await?;
            sqlx::query(WAKE_CARD_STOPPED)
                .bind(quota_key)
                .bind(millis(now))
                .execute(&mut *tx)
                .await?;
            let target = serde_json::json!({
                "quota_key": quota_key,
                "job_id": stop.as_ref().map(|s| s.job_id),
                "until": stop.as_ref().map(|s| s.until),
            });
            s.audit_in(&mut *tx, actor, "card_stop_lift", &target, u64::from(stop.is_some()), now)
                .await?;
            tx.commit().await?;
            s.wake();
            Ok(stop)
        })
    }

    /// A card key's use of every window of `quotas` at `now`, with the reattempts inside the
    /// longest window (oldest first): what `redrive quota show` and the dashboard show.
    ///
    /// # Errors
    /// A database error, or a corrupt row.
    pub async fn quota_use(
        &self,
        quota_key: &str,
        quotas: &QuotaRules,
        now: Timestamp,
    ) -> Result<(Vec<WindowUse>, Vec<Reattempt>)> {
        let span = |d: Duration| chrono::Duration::from_std(d).unwrap_or_default();
        let longest = quotas
            .iter()
            .flat_map(|(_, w)| w.iter().map(|w| w.window()))
            .max()
            .unwrap_or_default();
        let reattempts = self.reattempts(quota_key, now - span(longest)).await?;
        let mut windows = Vec::new();
        for (network, ws) in quotas.iter() {
            for w in ws {
                let from = now - span(w.window());
                let mut inside = reattempts
                    .iter()
                    .filter(|r| r.network == network && r.at > from);
                let oldest = inside.next();
                windows.push(WindowUse {
                    network,
                    window: *w,
                    used: u64::from(oldest.is_some()) + inside.count() as u64,
                    frees_at: oldest.map(|r| r.at + span(w.window())),
                });
            }
        }
        Ok((windows, reattempts))
    }

    /// A card key's reattempts after `since`, oldest first (`redrive quota show`).
    ///
    /// # Errors
    /// A database error, or a corrupt row.
    pub async fn reattempts(&self, quota_key: &str, since: Timestamp) -> Result<Vec<Reattempt>> {
        let rows: Vec<(i64, String, i64)> = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                sqlx::query_as(REATTEMPTS_OF)
                    .bind(quota_key)
                    .bind(millis(since))
                    .fetch_all(&s.read)
                    .await?
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                sqlx::query_as(REATTEMPTS_OF)
                    .bind(quota_key)
                    .bind(millis(since))
                    .fetch_all(&s.read)
                    .await?
            }
        };
        rows.into_iter()
            .map(|(job_id, network, at)| {
                Ok(Reattempt {
                    job_id,
                    network: network.parse().map_err(|_| StoreError::Corrupt {
                        what: "reattempt network",
                        detail: network.clone(),
                    })?,
                    at: from_millis(at),
                })
            })
            .collect()
    }
}
