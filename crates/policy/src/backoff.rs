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
/// Build one with [`Backoff::exponential`] (an [`ExponentialBuilder`]), [`Backoff::schedule`]
/// or [`Backoff::constant`]; each validates its fields, and the fields are private, so no
/// invalid backoff exists (no empty schedule, no zero cap, no multiplier below 1): every
/// method below is total.
///
/// ```
/// use std::time::Duration;
/// use redrive_policy::{Backoff, BackoffKind};
///
/// let b = Backoff::exponential()
///     .with_base(Duration::from_millis(100))
///     .with_multiplier(2.0)
///     .with_cap(Duration::from_secs(1))
///     .build()
///     .unwrap();
/// assert_eq!(b.kind(), BackoffKind::Exponential);
/// assert_eq!(b.nominal(0), Duration::from_millis(100));
/// assert_eq!(b.nominal(3), Duration::from_millis(800));
/// assert_eq!(b.nominal(4), Duration::from_secs(1)); // capped
/// assert!(Backoff::schedule(vec![], Duration::from_secs(1)).is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    kind: Kind,
}

/// The private shape of a [`Backoff`]; each variant's invariants hold by construction.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// `min(cap, base · multiplier^n)` (R1): `0 < base ≤ cap ≤ MAX_CAP`, `1 ≤ multiplier ≤ 100`.
    Exponential {
        base: Duration,
        multiplier: f64,
        cap: Duration,
    },
    /// `delays[n]` capped, the last repeating: 1 to `MAX_SCHEDULE_LEN` entries, none zero,
    /// `0 < cap ≤ MAX_CAP`.
    Schedule {
        delays: Vec<Duration>,
        cap: Duration,
    },
    /// The same delay every time (also the cap): `0 < delay ≤ MAX_CAP`.
    Constant { delay: Duration },
}

/// Which formula a [`Backoff`] follows (the `backoff` field of a policy file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffKind {
    /// `min(cap, base · multiplier^n)`.
    Exponential,
    /// An explicit list of delays; past the end the last one repeats.
    Schedule,
    /// The same delay every time.
    Constant,
}

impl Backoff {
    /// A builder of an exponential backoff, with the defaults of [`ExponentialBuilder::new`].
    pub const fn exponential() -> ExponentialBuilder {
        ExponentialBuilder::new()
    }

    /// An explicit schedule with a cap: `delays[n]` after attempt `n`, the last one repeating
    /// past the end, each capped.
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
        Ok(Backoff {
            kind: Kind::Schedule { delays, cap },
        })
    }

    /// A constant delay.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] when the delay is zero or above [`MAX_CAP`].
    pub fn constant(delay: Duration) -> Result<Self, PolicyError> {
        check_cap("delay", delay)?;
        Ok(Backoff {
            kind: Kind::Constant { delay },
        })
    }

    /// The nominal (jitter-free) delay after attempt `n` (from 0), never above the cap.
    pub fn nominal(&self, n: u32) -> Duration {
        match &self.kind {
            Kind::Exponential {
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
            Kind::Schedule { delays, cap } => {
                // Never empty (checked by `schedule`), so `last` is `Some`.
                let d = delays
                    .get(n as usize)
                    .or_else(|| delays.last())
                    .copied()
                    .unwrap_or(*cap);
                d.min(*cap)
            }
            Kind::Constant { delay } => *delay,
        }
    }

    /// The cap: no delay, jittered or not, exceeds it.
    pub const fn cap(&self) -> Duration {
        match &self.kind {
            Kind::Exponential { cap, .. } | Kind::Schedule { cap, .. } => *cap,
            Kind::Constant { delay } => *delay,
        }
    }

    /// The smallest nominal delay (`nominal(0)`), the floor of decorrelated jitter.
    pub fn base(&self) -> Duration {
        self.nominal(0)
    }

    /// Which formula this backoff follows.
    pub const fn kind(&self) -> BackoffKind {
        match &self.kind {
            Kind::Exponential { .. } => BackoffKind::Exponential,
            Kind::Schedule { .. } => BackoffKind::Schedule,
            Kind::Constant { .. } => BackoffKind::Constant,
        }
    }

    /// The growth factor of an exponential backoff; `None` for the other kinds.
    pub const fn multiplier(&self) -> Option<f64> {
        match &self.kind {
            Kind::Exponential { multiplier, .. } => Some(*multiplier),
            _ => None,
        }
    }

    /// The delays of a schedule (never empty); `None` for the other kinds.
    pub fn delays(&self) -> Option<&[Duration]> {
        match &self.kind {
            Kind::Schedule { delays, .. } => Some(delays),
            _ => None,
        }
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
        Ok(Backoff {
            kind: Kind::Exponential {
                base: self.base,
                multiplier: self.multiplier,
                cap: self.cap,
            },
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

    #[test]
    fn accessors_name_the_kind_and_its_fields() {
        let e = Backoff::exponential().with_multiplier(3.0).build().unwrap();
        assert_eq!(e.kind(), BackoffKind::Exponential);
        assert_eq!(e.multiplier(), Some(3.0));
        assert_eq!(e.delays(), None);
        let s = Backoff::schedule(vec![ms(5), ms(7)], ms(6)).unwrap();
        assert_eq!(s.kind(), BackoffKind::Schedule);
        assert_eq!(s.delays(), Some(&[ms(5), ms(7)][..]));
        assert_eq!(s.multiplier(), None);
        assert_eq!(s.cap(), ms(6));
        let c = Backoff::constant(ms(9)).unwrap();
        assert_eq!(c.kind(), BackoffKind::Constant);
        assert_eq!((c.base(), c.cap(), c.multiplier()), (ms(9), ms(9), None));
    }

    #[test]
    fn every_constructor_refuses_its_invalid_values() {
        let too_long = vec![ms(1); MAX_SCHEDULE_LEN + 1];
        let e = Backoff::schedule(too_long, ms(1000)).unwrap_err();
        assert!(e.to_string().contains("1001 entries"), "{e}");
        assert!(Backoff::schedule(vec![ms(1); MAX_SCHEDULE_LEN], ms(1000)).is_ok());
        for cap in [Duration::ZERO, MAX_CAP + Duration::from_nanos(1)] {
            let e = Backoff::schedule(vec![ms(1)], cap).unwrap_err();
            assert!(e.to_string().starts_with("invalid cap = "), "{e}");
            let e = Backoff::constant(cap).unwrap_err();
            assert!(e.to_string().starts_with("invalid delay = "), "{e}");
            let e = Backoff::exponential()
                .with_base(ms(1))
                .with_cap(cap)
                .build()
                .unwrap_err();
            assert!(e.to_string().starts_with("invalid cap = "), "{e}");
        }
        for m in [f64::NAN, f64::INFINITY, -1.0, 0.0, 0.999, 100.001] {
            let e = Backoff::exponential()
                .with_multiplier(m)
                .build()
                .unwrap_err();
            assert!(
                e.to_string().starts_with("invalid multiplier = "),
                "{m}: {e}"
            );
        }
        assert!(Backoff::exponential().with_multiplier(1.0).build().is_ok());
        assert!(
            Backoff::exponential()
                .with_multiplier(MAX_MULTIPLIER)
                .build()
                .is_ok()
        );
        let e = Backoff::schedule(vec![], ms(1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid schedule = []: must be at least one delay"
        );
    }

    proptest! {
        /// Whatever the inputs, a constructor either refuses them or builds a backoff whose
        /// every method answers without panicking, under its cap.
        #[test]
        fn built_backoffs_never_panic(
            base_ns in prop_oneof![Just(0u64), 1u64..u64::MAX],
            cap_ns in prop_oneof![Just(0u64), 1u64..=MAX_CAP.as_nanos() as u64, any::<u64>()],
            mult in prop_oneof![any::<f64>(), 0.0f64..200.0],
            delays in proptest::collection::vec(0u64..u64::MAX, 0..8),
            n in any::<u32>(),
        ) {
            let (base, cap) = (Duration::from_nanos(base_ns), Duration::from_nanos(cap_ns));
            let built = [
                Backoff::exponential().with_base(base).with_multiplier(mult).with_cap(cap).build(),
                Backoff::schedule(delays.iter().map(|d| Duration::from_nanos(*d)).collect(), cap),
                Backoff::constant(base),
            ];
            for b in built.into_iter().flatten() {
                prop_assert!(b.nominal(n) <= b.cap());
                prop_assert!(b.base() <= b.cap());
                prop_assert!(!b.cap().is_zero() && b.cap() <= MAX_CAP);
                if let Some(d) = b.delays() {
                    prop_assert!(!d.is_empty());
                }
                if let Some(m) = b.multiplier() {
                    prop_assert!((1.0..=MAX_MULTIPLIER).contains(&m));
                }
            }
        }

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
