//! An independent oracle for the jitter strategies: each strategy's formula is written here
//! again from its documentation (`crates/policy/src/jitter.rs`, rule R3 of docs/design.md), as
//! the distribution it promises — bounds, mean, the share that lands on the cap, the spread
//! inside the range — and checked against many seeded draws of `Jitter::apply`. Nothing here
//! calls `Jitter::range` or shares code with the implementation, so a formula implemented
//! differently from its documentation fails.
//!
//! In the documentation, `U(a, b)` is a uniform draw from `[a, b]`, `d` the nominal delay
//! (clamped to the cap), `base` the backoff's first delay, `prev` the previous delay
//! (`base` before the first one).

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use redrive_policy::Jitter;

/// Draws per case: the tolerances below are a few standard errors at this size.
const N: usize = 40_000;

/// The documented distribution of one case: `min(cap, U(lo, hi))`, or a constant when
/// `lo == hi`.
#[derive(Debug, Clone, Copy)]
struct Doc {
    /// The uniform draw's bounds, in seconds.
    lo: f64,
    hi: f64,
    /// The cap, in seconds.
    cap: f64,
}

impl Doc {
    /// What the oracle expects of `min(cap, U(lo, hi))`: bounds, mean, the share exactly at
    /// the cap (when `cap < hi`), and the median of the part below the cap.
    fn bounds(&self) -> (f64, f64) {
        (self.lo.min(self.cap), self.hi.min(self.cap))
    }

    fn mean(&self) -> f64 {
        let (lo, hi, cap) = (self.lo, self.hi, self.cap);
        if hi <= lo || cap <= lo {
            return lo.min(cap);
        }
        if cap >= hi {
            return (lo + hi) / 2.0;
        }
        let below = (cap - lo) / (hi - lo);
        below * (lo + cap) / 2.0 + (1.0 - below) * cap
    }

    fn share_at_cap(&self) -> f64 {
        let (lo, hi, cap) = (self.lo, self.hi, self.cap);
        if cap >= hi {
            0.0
        } else if cap <= lo || hi <= lo {
            1.0
        } else {
            (hi - cap) / (hi - lo)
        }
    }

    /// The largest standard deviation the distribution can have (that of `U(lo, hi)` is
    /// `(hi − lo)/√12`; clamping at the cap only narrows it): for tolerances.
    fn sd_bound(&self) -> f64 {
        (self.hi - self.lo).abs() / 12f64.sqrt() + 1e-9
    }
}

fn s(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Checks `draw` (N seeded draws) against `doc`.
fn check(name: &str, doc: Doc, mut draw: impl FnMut(&mut SmallRng) -> Duration) {
    let mut rng = SmallRng::seed_from_u64(0x5eed ^ name.len() as u64);
    let xs: Vec<f64> = (0..N).map(|_| s(draw(&mut rng))).collect();
    let (lo, hi) = doc.bounds();
    // Bounds, to the nanosecond.
    for x in &xs {
        assert!(
            *x >= lo - 1e-9 && *x <= hi + 1e-9,
            "{name}: {x} outside [{lo}, {hi}]"
        );
    }
    // Mean, within 5 standard errors.
    let mean = xs.iter().sum::<f64>() / N as f64;
    let tol = 5.0 * doc.sd_bound() / (N as f64).sqrt() + 1e-9;
    assert!(
        (mean - doc.mean()).abs() <= tol,
        "{name}: mean {mean} but the documented formula gives {} (± {tol})",
        doc.mean()
    );
    // The share of draws exactly at the cap (a `min(cap, …)` piles them there).
    let at_cap = xs.iter().filter(|x| (**x - doc.cap).abs() < 1e-9).count() as f64 / N as f64;
    let p = doc.share_at_cap();
    if doc.hi > doc.lo {
        let tol = 5.0 * (p * (1.0 - p) / N as f64).sqrt() + 2.0 / N as f64;
        assert!(
            (at_cap - p).abs() <= tol,
            "{name}: {at_cap} of the draws at the cap {}, the documented formula gives {p}",
            doc.cap
        );
        // Below the cap the draw is uniform: half of those fall below the middle of
        // [lo, min(cap, hi)].
        let top = doc.hi.min(doc.cap);
        let below: Vec<&f64> = xs.iter().filter(|x| **x < top - 1e-9).collect();
        if below.len() > 1000 {
            let mid = (doc.lo + top) / 2.0;
            let share = below.iter().filter(|x| ***x < mid).count() as f64 / below.len() as f64;
            let tol = 5.0 * (0.25 / below.len() as f64).sqrt();
            assert!(
                (share - 0.5).abs() <= tol,
                "{name}: {share} of the draws below the cap are in the lower half"
            );
        }
    }
}

#[test]
fn none_is_the_nominal_delay_clamped_to_the_cap() {
    let mut rng = SmallRng::seed_from_u64(1);
    for (d, cap, want) in [(800, 1000, 800), (1000, 1000, 1000), (5000, 1000, 1000)] {
        assert_eq!(
            Jitter::None.apply(ms(d), ms(100), ms(cap), None, &mut rng),
            ms(want)
        );
    }
}

/// Full: `U(0, d)`.
#[test]
fn full_is_uniform_from_zero_to_the_delay() {
    for (d, cap) in [(1000, 30_000), (5000, 2000)] {
        let dd = s(ms(d).min(ms(cap)));
        check(
            &format!("full d={d} cap={cap}"),
            Doc {
                lo: 0.0,
                hi: dd,
                cap: s(ms(cap)),
            },
            |r| Jitter::Full.apply(ms(d), ms(100), ms(cap), None, r),
        );
    }
}

/// Equal: `d/2 + U(0, d/2)`.
#[test]
fn equal_is_half_the_delay_plus_uniform_up_to_the_other_half() {
    for (d, cap) in [(1000, 30_000), (5000, 2000)] {
        let dd = s(ms(d).min(ms(cap)));
        check(
            &format!("equal d={d} cap={cap}"),
            Doc {
                lo: dd / 2.0,
                hi: dd,
                cap: s(ms(cap)),
            },
            |r| Jitter::Equal.apply(ms(d), ms(100), ms(cap), None, r),
        );
    }
}

/// Decorrelated: `min(cap, U(base, max(base, 3·prev)))`, `prev = base` before the first.
#[test]
fn decorrelated_is_uniform_from_base_to_three_times_prev_then_capped() {
    // (base, prev, cap): the cap far away, the cap inside the range, prev below base, no prev.
    for (base, prev, cap) in [
        (100, Some(1000), 30_000),
        (100, Some(1000), 1000),
        (100, Some(20), 30_000),
        (100, None, 30_000),
        (500, Some(400), 600),
    ] {
        let p = prev.unwrap_or(base);
        check(
            &format!("decorrelated base={base} prev={prev:?} cap={cap}"),
            Doc {
                lo: s(ms(base)),
                hi: s(ms(base).max(ms(3 * p))),
                cap: s(ms(cap)),
            },
            |r| Jitter::Decorrelated.apply(ms(0), ms(base), ms(cap), prev.map(ms), r),
        );
    }
}

/// Proportional(f): `min(cap, d + U(0, f·d))`.
#[test]
fn proportional_adds_up_to_f_times_the_delay_then_caps() {
    for (f, d, cap) in [(0.5, 1000, 30_000), (0.5, 1000, 1200), (2.0, 800, 30_000)] {
        let dd = s(ms(d).min(ms(cap)));
        check(
            &format!("proportional({f}) d={d} cap={cap}"),
            Doc {
                lo: dd,
                hi: dd * (1.0 + f),
                cap: s(ms(cap)),
            },
            |r| {
                Jitter::proportional(f)
                    .unwrap()
                    .apply(ms(d), ms(100), ms(cap), None, r)
            },
        );
    }
}

/// The oracle itself can fail: a distribution that is not the documented one, inside the
/// documented bounds (here, equal jitter's draws checked against full jitter's formula), is
/// caught by its mean.
#[test]
#[should_panic(expected = "the documented formula gives")]
fn the_oracle_catches_a_formula_that_is_not_the_documented_one() {
    check(
        "equal checked as full",
        Doc {
            lo: 0.0,
            hi: 1.0,
            cap: 30.0,
        },
        |r| Jitter::Equal.apply(ms(1000), ms(100), ms(30_000), None, r),
    );
}

/// The decorrelated strategy once drew `U(base, min(cap, 3·prev))`: within the documented
/// range, but with its mean far below the documented `min(cap, U(base, 3·prev))` when the cap
/// falls inside the range. The oracle catches that formula.
#[test]
#[should_panic(expected = "the documented formula gives")]
fn the_oracle_catches_the_old_decorrelated_formula() {
    let (base, prev, cap) = (0.1, 1.0, 1.0);
    check(
        "U(base, min(cap, 3·prev))",
        Doc {
            lo: base,
            hi: 3.0 * prev,
            cap,
        },
        |r| {
            use rand::RngExt;
            Duration::from_secs_f64(r.random_range(base..=cap.min(3.0 * prev)))
        },
    );
}
