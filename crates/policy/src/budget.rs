//! A retry budget: retries as a share of first attempts (gRPC retry throttling,
//! Finagle's `RetryBudget`, tower's `TpsBudget`).
//!
//! # Why budgets, not only max attempts
//! `max_attempts = 10` means that during an outage every job makes ten calls:
//! a fleet turns one failing PSP into ten times its normal load, exactly when
//! it can least take it. A budget caps retries fleet-wide at a share of the
//! first attempts (default 20%) plus a small floor (default 10 per second), so
//! retries help with transient blips but cannot become a storm. When the
//! budget is spent, the caller defers the job instead of retrying at once.
//!
//! Time is passed in, so the budget is exact under test.
//!
//! ```
//! use std::time::Duration;
//! use chrono::Utc;
//! use redrive_policy::RetryBudget;
//!
//! let mut b = RetryBudget::builder()
//!     .with_ttl(Duration::from_secs(10))
//!     .with_min_per_sec(0)
//!     .with_retry_ratio(0.5)
//!     .build()
//!     .unwrap();
//! let now = Utc::now();
//! for _ in 0..4 {
//!     b.deposit(now); // four first attempts
//! }
//! assert!(b.withdraw(now) && b.withdraw(now)); // 50%: two retries
//! assert!(!b.withdraw(now));
//! ```

use std::time::Duration;

use crate::error::PolicyError;
use crate::{Timestamp, format_duration};

const BUCKETS: usize = 10;
const UNIT: i64 = 1000;

/// A token bucket of retries, refilled by first attempts.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    bucket_ms: i64,
    reserve: i64,
    deposit_units: i64,
    slots: [(i64, i64, i64); BUCKETS], // (epoch, deposited, withdrawn)
}

/// Builds a [`RetryBudget`].
///
/// # Default
/// - ttl: 10 s (deposits expire after it)
/// - min_per_sec: 10 retries per second always allowed
/// - retry_ratio: 0.2 (one retry per five first attempts)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudgetBuilder {
    ttl: Duration,
    min_per_sec: u32,
    ratio: f64,
}

impl Default for RetryBudgetBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryBudgetBuilder {
    /// The defaults listed above.
    pub const fn new() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            min_per_sec: 10,
            ratio: 0.2,
        }
    }
    /// How long a deposit lasts (1 s..=60 s).
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// Retries per second allowed without any deposit.
    pub const fn with_min_per_sec(mut self, n: u32) -> Self {
        self.min_per_sec = n;
        self
    }
    /// Retries allowed per first attempt (0..=1000).
    pub const fn with_retry_ratio(mut self, r: f64) -> Self {
        self.ratio = r;
        self
    }
    /// Validates and builds.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `ttl` or `retry_ratio`.
    pub fn build(self) -> Result<RetryBudget, PolicyError> {
        if self.ttl < Duration::from_secs(1) || self.ttl > Duration::from_secs(60) {
            return Err(PolicyError::invalid(
                "ttl",
                format_duration(self.ttl),
                "from 1s to 60s",
            ));
        }
        if !(0.0..=1000.0).contains(&self.ratio) {
            return Err(PolicyError::invalid(
                "retry_ratio",
                self.ratio.to_string(),
                "from 0 to 1000",
            ));
        }
        let ttl_ms = self.ttl.as_millis() as i64;
        Ok(RetryBudget {
            bucket_ms: (ttl_ms / BUCKETS as i64).max(1),
            reserve: i64::from(self.min_per_sec) * ttl_ms * UNIT / 1000,
            deposit_units: (self.ratio * UNIT as f64).round() as i64,
            slots: [(i64::MIN, 0, 0); BUCKETS],
        })
    }
}

impl RetryBudget {
    /// A builder with the defaults.
    pub const fn builder() -> RetryBudgetBuilder {
        RetryBudgetBuilder::new()
    }

    fn slot(&mut self, now: Timestamp) -> &mut (i64, i64, i64) {
        let epoch = now.timestamp_millis().div_euclid(self.bucket_ms);
        let s = &mut self.slots[epoch.rem_euclid(BUCKETS as i64) as usize];
        if s.0 != epoch {
            *s = (epoch, 0, 0);
        }
        s
    }

    /// Records a first attempt (it earns `retry_ratio` of a retry).
    pub fn deposit(&mut self, now: Timestamp) {
        let units = self.deposit_units;
        self.slot(now).1 += units;
    }

    /// Takes one retry from the budget; `false` when it is spent (the caller should defer).
    pub fn withdraw(&mut self, now: Timestamp) -> bool {
        if self.balance(now) < UNIT {
            return false;
        }
        self.slot(now).2 += UNIT;
        true
    }

    /// Retries available now (fractional).
    pub fn available(&self, now: Timestamp) -> f64 {
        self.balance(now) as f64 / UNIT as f64
    }

    fn balance(&self, now: Timestamp) -> i64 {
        let epoch = now.timestamp_millis().div_euclid(self.bucket_ms);
        let oldest = epoch - (BUCKETS as i64 - 1);
        let (dep, wd) = self
            .slots
            .iter()
            .filter(|s| s.0 >= oldest && s.0 <= epoch)
            .fold((0, 0), |(d, w), s| (d + s.1, w + s.2));
        self.reserve + dep - wd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, TimeZone, Utc};
    use proptest::prelude::*;

    fn at(ms: i64) -> Timestamp {
        Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap() + TimeDelta::milliseconds(ms)
    }

    #[test]
    fn the_floor_allows_min_per_sec_times_ttl() {
        let mut b = RetryBudget::builder()
            .with_min_per_sec(2)
            .with_ttl(Duration::from_secs(5))
            .build()
            .unwrap();
        let n = (0..100).take_while(|_| b.withdraw(at(0))).count();
        assert_eq!(n, 10);
    }

    #[test]
    fn deposits_earn_the_ratio_and_expire() {
        let mut b = RetryBudget::builder()
            .with_min_per_sec(0)
            .with_retry_ratio(0.2)
            .with_ttl(Duration::from_secs(10))
            .build()
            .unwrap();
        for _ in 0..50 {
            b.deposit(at(0));
        }
        let n = (0..100).take_while(|_| b.withdraw(at(100))).count();
        assert_eq!(n, 10, "20% of 50 first attempts");
        // A new deposit 11 s later: the old ones (and the withdrawals) have expired.
        for _ in 0..5 {
            b.deposit(at(11_000));
        }
        assert!(b.withdraw(at(11_000)));
        assert!(!b.withdraw(at(11_000)));
    }

    #[test]
    fn invalid_fields_are_named() {
        let e = RetryBudget::builder()
            .with_ttl(Duration::ZERO)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("ttl"), "{e}");
        let e = RetryBudget::builder()
            .with_retry_ratio(-1.0)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("retry_ratio"), "{e}");
    }

    proptest! {
        /// Within one ttl, retries never exceed floor + ratio × first attempts.
        #[test]
        fn retries_never_exceed_the_budget(
            ops in proptest::collection::vec(any::<bool>(), 0..500),
            min in 0u32..5,
            ratio in 0.0f64..2.0,
        ) {
            let mut b = RetryBudget::builder()
                .with_min_per_sec(min)
                .with_retry_ratio(ratio)
                .with_ttl(Duration::from_secs(10))
                .build()
                .unwrap();
            let (mut deposits, mut retries) = (0u32, 0u32);
            for deposit in ops {
                if deposit { b.deposit(at(0)); deposits += 1; }
                else if b.withdraw(at(0)) { retries += 1; }
            }
            let allowed = f64::from(min) * 10.0 + (ratio * 1000.0).round() / 1000.0 * f64::from(deposits);
            prop_assert!(f64::from(retries) <= allowed + 1e-9, "{retries} > {allowed}");
        }
    }
}
