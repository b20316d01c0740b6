//! Jitter: spreading delays so a fleet that failed together does not retry together (R3).
//!
//! Why jitter is on by default: without it, every client that failed at the
//! same instant computes the same delay and comes back at the same instant,
//! in waves (`redrive simulate` shows it). Full jitter spreads them over the
//! whole interval.
//!
//! Every strategy here returns a value in a documented range and **never more
//! than the cap** (some libraries exceed their cap by up to 2×; we don't).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::{Rng, RngExt};

use crate::error::PolicyError;

/// The largest proportional factor accepted.
pub const MAX_PROPORTIONAL_FACTOR: f64 = 10.0;

/// How a nominal delay `d` (already ≤ `cap`) becomes the delay actually waited.
///
/// In the formulas, `d` is the nominal delay, `base` the backoff's first delay,
/// `cap` its cap, `prev` the previous (jittered) delay, and `U(a, b)` a uniform
/// draw from the closed interval `[a, b]`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Jitter {
    /// `d`. Range: exactly `d`.
    None,
    /// `U(0, d)`. Range `[0, d]`. The default: the least synchronised load.
    #[default]
    Full,
    /// `d/2 + U(0, d/2)`. Range `[d/2, d]`.
    Equal,
    /// `min(cap, U(base, max(base, 3·prev)))`, `prev = base` before the first delay.
    /// Range `[min(base, cap), min(cap, max(base, 3·prev))]`. Ignores `d`: it grows from its own
    /// previous value, which the caller stores.
    Decorrelated,
    /// `min(cap, d + U(0, f·d))`. Range `[d, min(cap, (1+f)·d)]`. `classic` uses `f = 0.5`.
    /// Its mean wait is about 2.5× full jitter's for the same nominal delay; at the cap it has no
    /// spread left, so prefer `full` for large fleets. Build it with [`Jitter::proportional`]:
    /// the factor is a [`ProportionalFactor`], always in `(0, 10]`.
    Proportional(ProportionalFactor),
}

/// The factor `f` of [`Jitter::Proportional`]: a finite number with `0 < f ≤ 10`
/// ([`MAX_PROPORTIONAL_FACTOR`]). Its field is private, so no other value exists.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct ProportionalFactor(f64);

impl ProportionalFactor {
    /// The factor `f`.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `jitter` when `f` is not in `(0, 10]` (NaN included).
    pub fn new(f: f64) -> Result<Self, PolicyError> {
        if f > 0.0 && f <= MAX_PROPORTIONAL_FACTOR {
            Ok(Self(f))
        } else {
            Err(PolicyError::invalid(
                "jitter",
                format!("proportional({f})"),
                "proportional(F) with 0 < F <= 10",
            ))
        }
    }

    /// The factor as a number.
    pub const fn get(self) -> f64 {
        self.0
    }
}

impl fmt::Display for ProportionalFactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Jitter {
    /// `proportional(f)`: `min(cap, d + U(0, f·d))`.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `jitter` when `f` is not in `(0, 10]`.
    pub fn proportional(f: f64) -> Result<Self, PolicyError> {
        ProportionalFactor::new(f).map(Jitter::Proportional)
    }

    /// Applies the jitter.
    ///
    /// `nominal` is clamped to `cap` first, so callers may pass any value.
    pub fn apply<R: Rng + ?Sized>(
        &self,
        nominal: Duration,
        base: Duration,
        cap: Duration,
        prev: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        let d = nanos(nominal.min(cap));
        let cap_n = nanos(cap);
        let out = match *self {
            Jitter::None => d,
            Jitter::Full => uniform(rng, 0, d),
            Jitter::Equal => {
                let half = d / 2;
                half + uniform(rng, 0, d - half)
            }
            Jitter::Decorrelated => {
                // min(cap, U(base, max(base, 3·prev))): the draw spans up to 3·prev even
                // past the cap, and what lands beyond it waits the cap.
                let b = nanos(base).min(cap_n);
                let p = prev.map_or(b, nanos);
                let hi = p.saturating_mul(3).max(b);
                uniform(rng, b, hi).min(cap_n)
            }
            Jitter::Proportional(f) => {
                let extra = (d as f64 * f.get()).min(u64::MAX as f64) as u64;
                d.saturating_add(uniform(rng, 0, extra)).min(cap_n)
            }
        };
        Duration::from_nanos(out.min(cap_n))
    }

    /// The closed range `apply` can return for these inputs: `(low, high)`.
    pub fn range(
        &self,
        nominal: Duration,
        base: Duration,
        cap: Duration,
        prev: Option<Duration>,
    ) -> (Duration, Duration) {
        let d = nominal.min(cap);
        match *self {
            Jitter::None => (d, d),
            Jitter::Full => (Duration::ZERO, d),
            Jitter::Equal => (d / 2, d),
            Jitter::Decorrelated => {
                let b = base.min(cap);
                let p = prev.unwrap_or(b);
                (b, p.saturating_mul(3).max(b).min(cap))
            }
            Jitter::Proportional(f) => (d, d.mul_f64(1.0 + f.get()).min(cap)),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn uniform<R: Rng + ?Sized>(rng: &mut R, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Jitter::None => f.write_str("none"),
            Jitter::Full => f.write_str("full"),
            Jitter::Equal => f.write_str("equal"),
            Jitter::Decorrelated => f.write_str("decorrelated"),
            Jitter::Proportional(x) => write!(f, "proportional({x})"),
        }
    }
}

impl FromStr for Jitter {
    type Err = PolicyError;

    /// Reads `none`, `full`, `equal`, `decorrelated` or `proportional(F)`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad = || {
            PolicyError::invalid(
                "jitter",
                format!("{s:?}"),
                "one of none, full, equal, decorrelated, proportional(F)",
            )
        };
        let j = match t {
            "none" => Jitter::None,
            "full" => Jitter::Full,
            "equal" => Jitter::Equal,
            "decorrelated" => Jitter::Decorrelated,
            _ => {
                let inner = t
                    .strip_prefix("proportional(")
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(bad)?;
                let f: f64 = inner.trim().parse().map_err(|_| bad())?;
                Jitter::proportional(f)?
            }
        };
        Ok(j)
    }
}

impl serde::Serialize for Jitter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Jitter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn all() -> [Jitter; 5] {
        [
            Jitter::None,
            Jitter::Full,
            Jitter::Equal,
            Jitter::Decorrelated,
            Jitter::proportional(0.5).unwrap(),
        ]
    }

    #[test]
    fn none_is_exact() {
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(
            Jitter::None.apply(ms(800), ms(100), ms(1000), None, &mut rng),
            ms(800)
        );
        assert_eq!(
            Jitter::None.apply(ms(8000), ms(100), ms(1000), None, &mut rng),
            ms(1000)
        );
    }

    #[test]
    fn parses_and_prints() {
        for j in all() {
            assert_eq!(j.to_string().parse::<Jitter>().unwrap(), j);
        }
        assert_eq!(
            "proportional(0.25)".parse::<Jitter>().unwrap(),
            Jitter::proportional(0.25).unwrap()
        );
        for bad in [
            "",
            "fulll",
            "proportional",
            "proportional(x)",
            "proportional(0)",
            "proportional(-1)",
            "proportional(11)",
        ] {
            let e = bad.parse::<Jitter>().unwrap_err();
            assert!(e.to_string().contains("jitter"), "{bad}: {e}");
        }
    }

    #[test]
    fn full_jitter_spreads_over_the_interval() {
        let mut rng = SmallRng::seed_from_u64(7);
        let xs: Vec<_> = (0..2000)
            .map(|_| Jitter::Full.apply(ms(1000), ms(100), ms(1000), None, &mut rng))
            .collect();
        let below_quarter = xs.iter().filter(|d| **d < ms(250)).count();
        let above_three_quarters = xs.iter().filter(|d| **d > ms(750)).count();
        // Uniform: about 500 each; far from 0 or 2000.
        assert!((350..650).contains(&below_quarter), "{below_quarter}");
        assert!(
            (350..650).contains(&above_three_quarters),
            "{above_three_quarters}"
        );
    }

    #[test]
    fn same_seed_same_delays() {
        let mut a = SmallRng::seed_from_u64(42);
        let mut b = SmallRng::seed_from_u64(42);
        for j in all() {
            for _ in 0..10 {
                assert_eq!(
                    j.apply(ms(900), ms(100), ms(1000), Some(ms(300)), &mut a),
                    j.apply(ms(900), ms(100), ms(1000), Some(ms(300)), &mut b)
                );
            }
        }
    }

    #[test]
    fn proportional_factor_is_checked_by_its_constructor() {
        for f in [
            0.0,
            -0.1,
            10.000_001,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            let e = Jitter::proportional(f).unwrap_err();
            assert!(
                e.to_string().starts_with("invalid jitter = proportional("),
                "{f}: {e}"
            );
            assert!(ProportionalFactor::new(f).is_err(), "{f}");
        }
        for f in [f64::MIN_POSITIVE, 0.2, 1.0, MAX_PROPORTIONAL_FACTOR] {
            let j = Jitter::proportional(f).unwrap();
            assert_eq!(j, Jitter::Proportional(ProportionalFactor::new(f).unwrap()));
            let Jitter::Proportional(x) = j else {
                unreachable!()
            };
            assert_eq!(x.get(), f);
        }
        assert_eq!(
            Jitter::proportional(0.2).unwrap().to_string(),
            "proportional(0.2)"
        );
    }

    proptest! {
        /// Any factor the constructor accepts gives delays within range; any it refuses is
        /// outside `(0, 10]`.
        #[test]
        fn proportional_never_exceeds_the_cap(
            seed in any::<u64>(),
            f in any::<f64>(),
            nominal_ms in 0u64..200_000,
            cap_ms in 1u64..100_000,
        ) {
            match Jitter::proportional(f) {
                Ok(j) => {
                    let mut rng = SmallRng::seed_from_u64(seed);
                    let d = j.apply(ms(nominal_ms), ms(1), ms(cap_ms), None, &mut rng);
                    prop_assert!(d <= ms(cap_ms));
                    prop_assert!(d >= ms(nominal_ms).min(ms(cap_ms)));
                }
                Err(_) => prop_assert!(!(f > 0.0 && f <= MAX_PROPORTIONAL_FACTOR)),
            }
        }

        #[test]
        fn every_strategy_stays_in_its_range_and_under_the_cap(
            seed in any::<u64>(),
            nominal_ms in 0u64..200_000,
            base_ms in 1u64..5_000,
            cap_ms in 1u64..100_000,
            prev_ms in proptest::option::of(0u64..300_000),
            f in 0.01f64..10.0,
        ) {
            let mut rng = SmallRng::seed_from_u64(seed);
            let (nominal, base, cap) = (ms(nominal_ms), ms(base_ms), ms(cap_ms));
            let prev = prev_ms.map(ms);
            for j in [Jitter::None, Jitter::Full, Jitter::Equal, Jitter::Decorrelated, Jitter::proportional(f).unwrap()] {
                let (lo, hi) = j.range(nominal, base, cap, prev);
                let d = j.apply(nominal, base, cap, prev, &mut rng);
                prop_assert!(d <= cap, "{j}: {d:?} > cap {cap:?}");
                // range() computes with Duration, apply() with nanoseconds: allow 1 ns rounding.
                prop_assert!(d + Duration::from_nanos(1) >= lo, "{j}: {d:?} < {lo:?}");
                prop_assert!(d <= hi + Duration::from_nanos(1), "{j}: {d:?} > {hi:?}");
            }
        }

        #[test]
        fn decorrelated_stays_between_base_and_three_times_prev(
            seed in any::<u64>(),
            base_ms in 1u64..1_000,
            cap_ms in 1_000u64..60_000,
            prev_ms in 1u64..60_000,
        ) {
            let mut rng = SmallRng::seed_from_u64(seed);
            let (base, cap, prev) = (ms(base_ms), ms(cap_ms), ms(prev_ms));
            let d = Jitter::Decorrelated.apply(Duration::ZERO, base, cap, Some(prev), &mut rng);
            prop_assert!(d >= base.min(cap));
            prop_assert!(d <= cap.min((prev * 3).max(base)));
        }
    }
}
