//! What one attempt's outcome was (R4, R5), and how HTTP statuses map to it.
//!
//! Outcomes are data, never downcasts: a handler returns an [`Outcome`] and
//! the decision function reads it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::PolicyError;
use crate::{DeclineAdvice, FailureClass};

/// The outcome of one attempt, as the decision function sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The call succeeded.
    Success,
    /// The request itself was refused (400, 422, a decline): never retried.
    Permanent,
    /// 401: refresh the credentials and call again once; a second 401 in a row is final.
    Auth,
    /// 429 (or 503 with `Retry-After`). `retry_after` is the server's wait, if it sent a valid one.
    RateLimited {
        /// The parsed (not yet clamped) `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// 5xx or a network failure. A `Retry-After` sent with it still wins over the formula.
    Infrastructure {
        /// The parsed (not yet clamped) `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The call timed out and may have reached the dependency.
    ///
    /// `idempotent` says whether repeating it is safe: the same idempotency key was sent and
    /// the dependency honours it, or a status query established that nothing happened. When
    /// it is `false` the job dies with reason `ambiguous` (the runtime runs the status query
    /// hook, if any, before asking).
    Timeout {
        /// Repeating the call cannot charge twice.
        idempotent: bool,
    },
    /// An unclassified error or a panic: retried like infrastructure while `max_exceptions` lasts.
    Exception,
    /// The card was declined; what may follow is the network's advice (see
    /// [`crate::DeclineRule`]). Never a breaker failure: the PSP answered.
    Declined(DeclineAdvice),
}

impl Outcome {
    /// The stored class of this outcome.
    pub const fn class(&self) -> FailureClass {
        match self {
            Outcome::Success => FailureClass::Success,
            Outcome::Permanent => FailureClass::Permanent,
            Outcome::Auth => FailureClass::Auth,
            Outcome::RateLimited { .. } => FailureClass::RateLimited,
            Outcome::Infrastructure { .. } => FailureClass::Infrastructure,
            Outcome::Timeout { .. } => FailureClass::Timeout,
            Outcome::Exception => FailureClass::Exception,
            Outcome::Declined(_) => FailureClass::Declined,
        }
    }

    /// The decline advice, for a decline.
    pub const fn decline(&self) -> Option<&DeclineAdvice> {
        match self {
            Outcome::Declined(a) => Some(a),
            _ => None,
        }
    }

    /// The server's `Retry-After`, if the outcome carries one.
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::RateLimited { retry_after } | Outcome::Infrastructure { retry_after } => {
                *retry_after
            }
            _ => None,
        }
    }
}

/// HTTP status → failure class, with the defaults below and per-status overrides.
///
/// # Default
/// - 2xx → success
/// - 429 → rate limited; 503 **with** `Retry-After` → rate limited
/// - 408, 500, 502, 503, 504 and every other 5xx → infrastructure
/// - 401 → auth
/// - every other 4xx (400, 402, 404, 409, 422, …) → permanent
/// - anything else (1xx, 3xx, out of range) → exception
///
/// ```
/// use redrive_policy::{FailureClass, StatusTable};
/// let t = StatusTable::default();
/// assert_eq!(t.classify(429, false), FailureClass::RateLimited);
/// assert_eq!(t.classify(503, true), FailureClass::RateLimited);
/// assert_eq!(t.classify(503, false), FailureClass::Infrastructure);
/// assert_eq!(t.classify(422, false), FailureClass::Permanent);
/// let t = t.with_override(409, FailureClass::Infrastructure).unwrap();
/// assert_eq!(t.classify(409, false), FailureClass::Infrastructure);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusTable {
    overrides: BTreeMap<u16, FailureClass>,
}

impl StatusTable {
    /// The default table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `status` to `class`, whatever the default says.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] for a status outside 100..=599.
    pub fn with_override(mut self, status: u16, class: FailureClass) -> Result<Self, PolicyError> {
        if !(100..=599).contains(&status) {
            return Err(PolicyError::invalid(
                "status",
                status.to_string(),
                "an HTTP status from 100 to 599",
            ));
        }
        self.overrides.insert(status, class);
        Ok(self)
    }

    /// The overrides, by status.
    pub fn overrides(&self) -> &BTreeMap<u16, FailureClass> {
        &self.overrides
    }

    /// The class of a response with this status. `has_retry_after` says whether it carried a
    /// valid `Retry-After`.
    pub fn classify(&self, status: u16, has_retry_after: bool) -> FailureClass {
        if let Some(c) = self.overrides.get(&status) {
            return *c;
        }
        match status {
            200..=299 => FailureClass::Success,
            429 => FailureClass::RateLimited,
            503 if has_retry_after => FailureClass::RateLimited,
            401 => FailureClass::Auth,
            408 => FailureClass::Infrastructure,
            400..=499 => FailureClass::Permanent,
            500..=599 => FailureClass::Infrastructure,
            _ => FailureClass::Exception,
        }
    }

    /// The outcome of a response: its class, with the `Retry-After` attached where it matters.
    ///
    /// A 408 or 504 is a plain infrastructure failure: the *server* says it did not process the
    /// request. An ambiguous client-side timeout is [`Outcome::Timeout`], built by the caller.
    pub fn outcome(&self, status: u16, retry_after: Option<Duration>) -> Outcome {
        match self.classify(status, retry_after.is_some()) {
            FailureClass::Success => Outcome::Success,
            FailureClass::Permanent => Outcome::Permanent,
            FailureClass::Auth => Outcome::Auth,
            FailureClass::RateLimited => Outcome::RateLimited { retry_after },
            FailureClass::Infrastructure => Outcome::Infrastructure { retry_after },
            FailureClass::Timeout => Outcome::Timeout { idempotent: true },
            FailureClass::Exception => Outcome::Exception,
            // A status alone carries no network advice: a decline without advice is retried
            // later, within the card's quota.
            FailureClass::Declined => {
                Outcome::Declined(DeclineAdvice::unknown(crate::Network::Other))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_design() {
        let t = StatusTable::new();
        use FailureClass::*;
        let cases = [
            (200, false, Success),
            (201, false, Success),
            (204, false, Success),
            (400, false, Permanent),
            (402, false, Permanent),
            (404, false, Permanent),
            (409, false, Permanent),
            (422, false, Permanent),
            (401, false, Auth),
            (408, false, Infrastructure),
            (429, false, RateLimited),
            (429, true, RateLimited),
            (500, false, Infrastructure),
            (502, false, Infrastructure),
            (503, false, Infrastructure),
            (503, true, RateLimited),
            (504, false, Infrastructure),
            (599, false, Infrastructure),
            (302, false, Exception),
            (100, false, Exception),
            (0, false, Exception),
            (999, false, Exception),
        ];
        for (status, ra, want) in cases {
            assert_eq!(t.classify(status, ra), want, "{status} retry-after={ra}");
        }
    }

    #[test]
    fn outcome_carries_retry_after() {
        let t = StatusTable::new();
        let ra = Some(Duration::from_secs(2));
        assert_eq!(t.outcome(429, ra), Outcome::RateLimited { retry_after: ra });
        assert_eq!(t.outcome(503, ra), Outcome::RateLimited { retry_after: ra });
        assert_eq!(
            t.outcome(500, None),
            Outcome::Infrastructure { retry_after: None }
        );
        assert_eq!(t.outcome(201, None), Outcome::Success);
        assert_eq!(t.outcome(429, ra).retry_after(), ra);
        assert_eq!(t.outcome(429, ra).class(), FailureClass::RateLimited);
    }

    #[test]
    fn bad_override_is_refused() {
        let e = StatusTable::new()
            .with_override(700, FailureClass::Permanent)
            .unwrap_err();
        assert!(e.to_string().contains("700"), "{e}");
    }
}
