//! Nominal delays: what the backoff formula says before jitter.
//!
//! A [`Backoff`] is a pure function of the attempt number `n` (from 0: the
//! delay after the first failed attempt is `nominal(0)`). Every variant is
//! capped (R2): no nominal delay is ever above [`Backoff::cap`].

use std::time::Duration;

use crate::error::PolicyError;

/// Default base delay of [`ExponentialBuilder`]: 200 ms.
pub const DEFAULT_BASE: Duration = Duration::from_millis(200);
/// Default multiplier of [`ExponentialBuilder`]: 2.
pub const DEFAULT_MULTIPLIER: f64 = 2.0;
/// Default cap of [`ExponentialBuilder`]: 30 s.
pub const DEFAULT_CAP: Duration = Duration::from_secs(30);
/// The largest cap accepted anywhere: 24 h.
pub const MAX_CAP: Duration = Duration::from_secs(24 * 3600);
/// The largest multiplier accepted: 100.
pub const MAX_MULTIPLIER: f64 = 100.0;
/// The most entries an explicit schedule may have.
pub const MAX_SCHEDULE_LEN: usize = 1000;

/// How nominal delays grow with the attempt number.
///
/// Build one with [`ExponentialBuilder`], [`Backoff::schedule`] or
/// [`Backoff::constant`]; each validates its fields.
///
/// ```
/// use std::time::Duration;
/// use redrive_policy::ExponentialBuilder;
///
/// let b = ExponentialBuilder::new()
///     .with_base(Duration::from_millis(100))
///     .with_multiplier(2.0)
///     .with_cap(Duration::from_secs(1))
///     .build()
///     .unwrap();
/// assert_eq!(b.nominal(0), Duration::from_millis(100));
/// assert_eq!(b.nominal(3), Duration::from_millis(800));
/// assert_eq!(b.nominal(4), Duration::from_secs(1)); // capped
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Backoff {
    /// `min(cap, base · multiplier^n)` (R1).
    Exponential {
        /// The first delay.
        base: Duration,
        /// Growth factor per attempt (≥ 1).
        multiplier: f64,
        /// No delay exceeds this.
        cap: Duration,
    },
    /// An explicit list of delays (`[1s, 2s, 4s, 8s, 16s]`); past the end the last one repeats.
    /// Each entry is capped.
    Schedule {
        /// The delays in order, `delays[n]` after attempt `n`.
        delays: Vec<Duration>,
        /// No delay exceeds this.
        cap: Duration,
    },
    /// The same delay every time.
    Constant {
        /// The delay (also the cap).
        delay: Duration,
    },
}

impl Backoff {
    /// An explicit schedule with a cap.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] when the schedule is empty, too long, has a zero entry,
    /// or the cap is zero or above [`MAX_CAP`].
    pub fn schedule(delays: Vec<Duration>, cap: Duration) -> Result<Self, PolicyError> {
        check_cap("cap", cap)?;
        if delays.is_empty() {
            return Err(PolicyError::invalid("schedule", "[]", "at least one delay"));
        }
        if delays.len() > MAX_SCHEDULE_LEN {
            return Err(PolicyError::invalid(
                "schedule",
                format!("{} entries", delays.len()),
                format!("at most {MAX_SCHEDULE_LEN} entries"),
            ));
        }
        if let Some(i) = delays.iter().position(|d| d.is_zero()) {
            return Err(PolicyError::invalid(
                format!("schedule[{i}]"),
                "0s",
                "a delay above 0",
            ));
        }
        Ok(Backoff::Schedule { delays, cap })
    }

    /// A constant delay.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] when the delay is zero or above [`MAX_CAP`].
    pub fn constant(delay: Duration) -> Result<Self, PolicyError> {
        check_cap("delay", delay)?;
        Ok(Backoff::Constant { delay })
    }

    /// The nominal (jitter-free) delay after attempt `n` (from 0), never above the cap.
    pub fn nominal(&self, n: u32) -> Duration {
        match self {
            Backoff::Exponential {
                base,
                multiplier,
                cap,
            } => {
                // base · m^n in f64 nanoseconds; saturates to the cap on overflow.
                let exp = i32::try_from(n).unwrap_or(i32::MAX);
                let nanos = base.as_nanos() as f64 * multiplier.powi(exp);
                let cap_nanos = cap.as_nanos() as f64;
                if nanos.is_nan() || nanos >= cap_nanos {
                    *cap
                } else {
                    // In range of u64: the cap is at most 24 h.
                    Duration::from_nanos(nanos as u64).min(*cap)
                }
            }
            Backoff::Schedule { delays, cap } => {
                let i = (n as usize).min(delays.len() - 1);
                delays[i].min(*cap)
            }
            Backoff::Constant { delay } => *delay,
        }
    }

    /// The cap: no delay, jittered or not, exceeds it.
    pub fn cap(&self) -> Duration {
        match self {
            Backoff::Exponential { cap, .. } | Backoff::Schedule { cap, .. } => *cap,
            Backoff::Constant { delay } => *delay,
        }
    }

    /// The smallest nominal delay (`nominal(0)`), the floor of decorrelated jitter.
    pub fn base(&self) -> Duration {
        self.nominal(0)
    }
}

fn check_cap(field: &str, cap: Duration) -> Result<(), PolicyError> {
    if cap.is_zero() || cap > MAX_CAP {
        return Err(PolicyError::invalid(
            field,
            crate::format_duration(cap),
            "above 0s and at most 24h",
        ));
    }
    Ok(())
}

// ===== impl ExponentialBuilder =====

/// Builds an exponential [`Backoff`]: `min(cap, base · multiplier^n)`.
///
/// # Default
/// - base: 200 ms ([`DEFAULT_BASE`])
/// - multiplier: 2 ([`DEFAULT_MULTIPLIER`])
/// - cap: 30 s ([`DEFAULT_CAP`])
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialBuilder {
    base: Duration,
    multiplier: f64,
    cap: Duration,
}

impl Default for ExponentialBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ExponentialBuilder {
    /// The defaults listed above.
    pub const fn new() -> Self {
        Self {
            base: DEFAULT_BASE,
            multiplier: DEFAULT_MULTIPLIER,
            cap: DEFAULT_CAP,
        }
    }

    /// The first delay.
    pub const fn with_base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The growth factor (1 ≤ multiplier ≤ 100).
    pub const fn with_multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The cap (0 < cap ≤ 24 h, and ≥ base).
    pub const fn with_cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `base`, `multiplier` or `cap` and its allowed range.
    pub fn build(self) -> Result<Backoff, PolicyError> {
        check_cap("cap", self.cap)?;
        if self.base.is_zero() || self.base > self.cap {
            return Err(PolicyError::invalid(
                "base",
                crate::format_duration(self.base),
                format!(
                    "above 0s and at most the cap ({})",
                    crate::format_duration(self.cap)
                ),
            ));
        }
        if !(1.0..=MAX_MULTIPLIER).contains(&self.multiplier) {
            return Err(PolicyError::invalid(
                "multiplier",
                self.multiplier.to_string(),
                "from 1 to 100",
            ));
        }
        Ok(Backoff::Exponential {
            base: self.base,
            multiplier: self.multiplier,
            cap: self.cap,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn exponential_is_exact_and_capped() {
        let b = ExponentialBuilder::new().build().unwrap();
        let got: Vec<_> = (0..10).map(|n| b.nominal(n)).collect();
        let want = [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000].map(ms);
        assert_eq!(got, want);
        assert_eq!(b.nominal(u32::MAX), ms(30_000));
    }

    #[test]
    fn schedule_repeats_its_last_entry_and_is_capped() {
        let b = Backoff::schedule(vec![ms(1000), ms(2000), ms(90_000)], ms(60_000)).unwrap();
        assert_eq!(b.nominal(0), ms(1000));
        assert_eq!(b.nominal(1), ms(2000));
        assert_eq!(b.nominal(2), ms(60_000));
        assert_eq!(b.nominal(100), ms(60_000));
    }

    #[test]
    fn constant_is_constant() {
        let b = Backoff::constant(ms(500)).unwrap();
        assert_eq!(b.nominal(0), ms(500));
        assert_eq!(b.nominal(77), ms(500));
        assert_eq!(b.cap(), ms(500));
    }

    #[test]
    fn invalid_fields_are_named() {
        let e = ExponentialBuilder::new()
            .with_multiplier(0.5)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("multiplier"), "{e}");
        assert!(e.to_string().contains("0.5"), "{e}");
        let e = ExponentialBuilder::new()
            .with_base(ms(0))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("base"), "{e}");
        let e = ExponentialBuilder::new()
            .with_base(ms(5000))
            .with_cap(ms(1000))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("base"), "{e}");
        let e = ExponentialBuilder::new()
            .with_cap(Duration::from_secs(90_000))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("cap"), "{e}");
        let e = Backoff::schedule(vec![], ms(1000)).unwrap_err();
        assert!(e.to_string().contains("schedule"), "{e}");
        let e = Backoff::schedule(vec![ms(1), ms(0)], ms(1000)).unwrap_err();
        assert!(e.to_string().contains("schedule[1]"), "{e}");
    }

    proptest! {
        #[test]
        fn nominal_is_monotone_and_capped(
            base_ms in 1u64..10_000,
            mult in 1.0f64..10.0,
            extra_ms in 0u64..100_000,
            n in 0u32..200,
        ) {
            let cap = ms(base_ms + extra_ms);
            let b = ExponentialBuilder::new()
                .with_base(ms(base_ms)).with_multiplier(mult).with_cap(cap)
                .build().unwrap();
            prop_assert!(b.nominal(n) <= cap);
            prop_assert!(b.nominal(n) <= b.nominal(n + 1));
            prop_assert!(b.nominal(0) >= ms(base_ms).min(cap) - Duration::from_nanos(1));
        }

        #[test]
        fn schedule_is_capped(
            delays in proptest::collection::vec(1u64..100_000, 1..20),
            cap_ms in 1u64..200_000,
            n in 0u32..50,
        ) {
            let b = Backoff::schedule(delays.iter().map(|d| ms(*d)).collect(), ms(cap_ms)).unwrap();
            prop_assert!(b.nominal(n) <= ms(cap_ms));
        }
    }
}
