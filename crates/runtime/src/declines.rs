//! The card networks' reattempt rules, at the moment of a call.
//!
//! The decision after a decline is the policy's (a pure function); this module does what
//! needs the store: before an authorisation that follows a decline it checks what the last
//! decline allows *now* and takes a reattempt from the card's fleet-wide quota
//! ([`redrive_store::Store::take_reattempt`]); after a decline it records the advice.
//!
//! | last decline | at the next call | metric `reason` |
//! |---|---|---|
//! | never retry (Visa cat 1, MAC 03) / MAC 21 | dead `do_not_retry` / `recurring_stopped`, no call | `do_not_retry` |
//! | MAC 24–30, wait not over (an operator's run-now) | deferred to the end of the wait, no call | `advice_wait` |
//! | any other, card's quota used up | deferred to the window's edge, or dead `reattempt_quota` | `quota` |
//! | any other, quota has room | one reattempt counted, then the call | |
//!
//! And for every job with a card key, before its first call of a claim: another job's decline
//! that stopped the card (Visa category 1, MAC 03/21; [`redrive_store::CardStop`]) ends the
//! claim with no call, dead `card_stopped` or deferred to the stop's end (the policy's
//! `declines.card_stop`), metric reason `card_stop`.

use redrive_policy::{
    Action, DeadReason, DeclineAdvice, DeclineRule, DeferReason, DelaySource, JobCounters, Network,
    QuotaRules, RetryPolicy, Timestamp,
};
use redrive_store::{CardStop, Decline, Job, NewDecline, QuotaTake, ReattemptParams, StoreError};

use crate::db::Db;
use crate::metrics;

/// The last decline of a job, as far as the next call is concerned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LastDecline {
    pub(crate) network: Network,
    pub(crate) rule: DeclineRule,
    pub(crate) at: Timestamp,
}

impl LastDecline {
    pub(crate) fn of(advice: &DeclineAdvice, at: Timestamp) -> Self {
        Self {
            network: advice.network(),
            rule: advice.rule(),
            at,
        }
    }

    fn from_row(d: &Decline) -> Self {
        let advice = DeclineAdvice::new(d.network, d.code.as_deref(), d.category, d.advice_code)
            // A row written by this code always parses; an unreadable one counts as "retry later".
            .unwrap_or(DeclineAdvice::unknown(d.network));
        Self::of(&advice, d.at)
    }
}

/// Whether a claimed job may have been declined before: it carries a card key and has made
/// attempts (or was replayed), or it waits on a decline's advice or a quota. Only then is the
/// store asked.
pub(crate) fn may_follow_decline(job: &Job) -> bool {
    (job.quota_key.is_some() && (job.attempts > 0 || job.replays > 0))
        || matches!(
            job.defer_reason,
            Some(DeferReason::DeclineAdvice | DeferReason::ReattemptQuota)
        )
}

/// The job's declines so far and the last one, if any.
pub(crate) async fn last_decline(
    db: &Db,
    job_id: i64,
) -> Result<(u32, Option<LastDecline>), StoreError> {
    let rows = db
        .run(move |s| async move { s.declines(job_id).await })
        .await?;
    Ok((
        u32::try_from(rows.len()).unwrap_or(u32::MAX),
        rows.last().map(LastDecline::from_row),
    ))
}

/// Before a call that follows a decline: `None` to call (a reattempt was counted, when the job
/// has a card key), or the action that replaces the call.
pub(crate) async fn gate(
    db: &Db,
    job: &Job,
    last: &LastDecline,
    counters: &JobCounters,
    policy: &RetryPolicy,
    quotas: &QuotaRules,
    now: Timestamp,
) -> Result<Option<Action>, StoreError> {
    match last.rule {
        DeclineRule::NeverRetry | DeclineRule::RecurringStopped => {
            metrics::reattempt_blocked("do_not_retry");
            let reason = if last.rule == DeclineRule::NeverRetry {
                DeadReason::DoNotRetry
            } else {
                DeadReason::RecurringStopped
            };
            return Ok(Some(Action::Dead { reason }));
        }
        DeclineRule::RetryAfter(wait) => {
            let not_before = last.at + chrono::Duration::from_std(wait).unwrap_or_default();
            if now < not_before {
                metrics::reattempt_blocked("advice_wait");
                if counters.deadline.is_some_and(|d| not_before > d) {
                    return Ok(Some(Action::Dead {
                        reason: DeadReason::Deadline,
                    }));
                }
                return Ok(Some(Action::Defer {
                    until: not_before,
                    delay: (not_before - now).to_std().unwrap_or_default(),
                    reason: DeferReason::DeclineAdvice,
                    source: DelaySource::DeclineAdvice,
                }));
            }
        }
        DeclineRule::RetryLater | DeclineRule::UpdatePaymentMethod => {}
    }
    let Some(key) = job.quota_key.clone() else {
        return Ok(None);
    };
    let windows = quotas.windows(last.network).to_vec();
    let (network, job_id) = (last.network, job.id);
    let took = db
        .run(move |s| async move {
            s.take_reattempt(&ReattemptParams {
                quota_key: &key,
                network,
                windows: &windows,
                job_id,
                now,
            })
            .await
        })
        .await?;
    match took {
        QuotaTake::Taken => Ok(None),
        QuotaTake::Full(full) => {
            metrics::reattempt_blocked("quota");
            tracing::info!(job = job.id, until = %full.until, max = full.window.max(),
                "card reattempt quota used up");
            Ok(Some(policy.decide_quota(counters, full.until, now)))
        }
    }
}

/// The stop of the job's card key in force at `now` that another job's decline set, if any
/// (a job's own stopping decline is its own rules' business: `do_not_retry`,
/// `recurring_stopped`).
pub(crate) async fn card_stop(
    db: &Db,
    job: &Job,
    now: Timestamp,
) -> Result<Option<CardStop>, StoreError> {
    let Some(key) = job.quota_key.clone() else {
        return Ok(None);
    };
    let stop = db
        .run(move |s| async move { s.card_stop(&key, now).await })
        .await?;
    Ok(stop.filter(|s| s.job_id != job.id))
}

/// After a decline: count it, and the record to write with the attempt's completion (with the
/// card stop it sets, when it stops the card and the job has a card key).
pub(crate) fn decline_of(
    job: &Job,
    attempt: u32,
    advice: DeclineAdvice,
    quotas: &QuotaRules,
    now: Timestamp,
) -> NewDecline {
    let category = match (advice.effective_category(), advice.advice_code()) {
        (Some(c), _) => c.to_string(),
        (None, Some(m)) => format!("mac_{m:02}"),
        (None, None) => "none".to_owned(),
    };
    metrics::declined(
        job.dependency.as_deref().unwrap_or(""),
        advice.network().as_str(),
        category,
    );
    let stop_for = (job.quota_key.is_some() && advice.stops_card())
        .then(|| quotas.card_stop(advice.network()))
        .flatten();
    NewDecline {
        job_id: job.id,
        attempt,
        quota_key: job.quota_key.clone(),
        advice,
        at: now,
        stop_for,
    }
}

/// A decline whose attempt's completion could not be written (the lease was lost): recorded
/// on its own, unfenced, because it is a fact about the card whoever holds the job now.
pub(crate) async fn record_alone(db: &Db, d: NewDecline) -> Result<(), StoreError> {
    db.run(move |s| async move { s.record_decline(&d).await })
        .await
}
