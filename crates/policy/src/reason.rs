//! The small vocabularies every layer shares: failure classes, dead reasons,
//! defer reasons and retry modes. Their `as_str` names are what the store
//! writes, the API returns and the metrics label with; they never change.

use std::fmt;
use std::str::FromStr;

/// A name that is not one of an enum's known values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}; expected one of: {expected}")]
pub struct ParseNameError {
    /// What was being parsed ("failure class", "dead reason", ...).
    pub what: &'static str,
    /// The value that was refused.
    pub value: String,
    /// The accepted values, comma separated.
    pub expected: &'static str,
}

macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $s:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
                 serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[ $( $name::$variant ),+ ];

            /// The stable snake_case name (stored, labelled, returned by the API).
            pub const fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $s ),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParseNameError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $s => Ok($name::$variant), )+
                    _ => Err(ParseNameError {
                        what: $what,
                        value: s.to_owned(),
                        expected: concat!($( $s, ", " ),+),
                    }),
                }
            }
        }
    };
}

named_enum! {
    /// The class of one attempt's outcome (R4, R5).
    ///
    /// `Success` is included so that every stored attempt has a class.
    pub enum FailureClass: "failure class" {
        /// The call succeeded.
        Success => "success",
        /// The request itself is wrong or was declined (400, 422, decline): never retried.
        Permanent => "permanent",
        /// 401: refresh the credentials and call again once.
        Auth => "auth",
        /// 429 (or 503 with `Retry-After`): retried after the server's wait.
        RateLimited => "rate_limited",
        /// 5xx, connection failures: retried with backoff; counts for the breaker.
        Infrastructure => "infrastructure",
        /// The call may have reached the PSP (ambiguous): same key, or a status query, first.
        Timeout => "timeout",
        /// Unclassified error or panic: retried, but counted against `max_exceptions`.
        Exception => "exception",
        /// The card was declined; the network's advice decides (never a breaker failure).
        Declined => "declined",
    }
}

named_enum! {
    /// Why a job went to the dead-letter table. Whatever ends a job names itself.
    pub enum DeadReason: "dead reason" {
        /// The dependency refused the request itself (400, 422, decline).
        Permanent => "permanent",
        /// A second 401 in a row, after a credentials refresh.
        Auth => "auth",
        /// A timeout without an idempotency key and without a status query.
        Ambiguous => "ambiguous",
        /// `retry.max_attempts` attempts were made (and no defer phase is left).
        AttemptsExhausted => "attempts_exhausted",
        /// The retry window since the first attempt has passed (and no defer phase).
        WindowExhausted => "window_exhausted",
        /// The defer phase's `max_defers` runs are used up.
        DefersExhausted => "defers_exhausted",
        /// `max_exceptions` unclassified errors or panics.
        ExceptionsExhausted => "exceptions_exhausted",
        /// The job's total deadline has passed.
        Deadline => "deadline",
        /// The job's lease expired while it ran, and it had no attempts left.
        LeaseExpired => "lease_expired",
        /// A decline that must never be reattempted (Visa category 1, Mastercard MAC 03).
        DoNotRetry => "do_not_retry",
        /// A decline that needs corrected payment data (Visa category 3, MAC 01, MAC 04).
        UpdatePaymentMethod => "update_payment_method",
        /// The cardholder stopped the recurring payment (Mastercard MAC 21).
        RecurringStopped => "recurring_stopped",
        /// The card's reattempt quota is used up until after the job's deadline.
        ReattemptQuota => "reattempt_quota",
        /// Another job's decline on the same card key (Visa category 1, Mastercard MAC 03 or
        /// 21) stopped the card: no call is made while the stop lasts.
        CardStopped => "card_stopped",
    }
}

named_enum! {
    /// Why a job is waiting in the `deferred` state.
    pub enum DeferReason: "defer reason" {
        /// The retry delay was longer than `in_process_max_wait`.
        Backoff => "backoff",
        /// The dependency answered 429 / Retry-After longer than `in_process_max_wait`.
        RateLimited => "rate_limited",
        /// The retry phase is spent; this is one run of the defer phase's schedule.
        DeferPhase => "defer_phase",
        /// The dependency's circuit breaker is open (not an attempt).
        BreakerOpen => "breaker_open",
        /// The dependency is paused fleet-wide (a Retry-After seen by some worker).
        Paused => "paused",
        /// A worker shut down and released the job (not an attempt).
        Released => "released",
        /// The fleet's own rate limit for the dependency had no send slot soon enough
        /// (not an attempt).
        Throttled => "throttled",
        /// Retries to the dependency exceed the retry budget's share of first attempts
        /// (not an attempt).
        RetryBudget => "retry_budget",
        /// A decline's network advice: a Mastercard MAC 24–30 wait, or "retry later".
        DeclineAdvice => "decline_advice",
        /// The card's reattempt quota is used up until the oldest reattempt leaves its window
        /// (not an attempt).
        ReattemptQuota => "reattempt_quota",
        /// The card key is stopped by another job's decline (Visa category 1, MAC 03/21)
        /// until the stop ends (not an attempt; policy `declines.card_stop = "wait"`).
        CardStopped => "card_stopped",
        /// The dependency's breaker row could not be read and the worker fails closed
        /// (`WorkerBuilder::fail_closed`): deferred instead of called (not an attempt).
        BreakerUnreadable => "breaker_unreadable",
    }
}

named_enum! {
    /// Why a dependency is paused fleet-wide.
    pub enum PauseReason: "pause reason" {
        /// A `Retry-After` seen by some worker of the fleet (R6, R19).
        RetryAfter => "retry_after",
        /// An operator paused it.
        Operator => "operator",
    }
}

named_enum! {
    /// How a delay after a failure was spent.
    pub enum RetryMode: "retry mode" {
        /// The same worker slept the delay holding its lease, then called again.
        Retry => "retry",
        /// The job went back to the queue with a later `run_at`.
        Defer => "defer",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in FailureClass::ALL {
            assert_eq!(c.as_str().parse::<FailureClass>().unwrap(), *c);
        }
        for r in DeadReason::ALL {
            assert_eq!(r.as_str().parse::<DeadReason>().unwrap(), *r);
        }
        for r in DeferReason::ALL {
            assert_eq!(r.as_str().parse::<DeferReason>().unwrap(), *r);
        }
    }

    #[test]
    fn unknown_name_is_refused_with_the_value() {
        let err = "bogus".parse::<DeadReason>().unwrap_err();
        assert!(err.to_string().contains("\"bogus\""), "{err}");
        assert!(err.to_string().contains("lease_expired"), "{err}");
    }

    #[test]
    fn serde_uses_the_same_names() {
        assert_eq!(
            serde_json::to_string(&FailureClass::RateLimited).unwrap(),
            "\"rate_limited\""
        );
    }
}
