//! Retry strategies as the simulator's clients use them, parsed from `--strategy`.
//!
//! A strategy is a delay shape (which backoff and which jitter) and the fleet's flow control
//! toward the PSP: whether the client honours the server's `Retry-After` (R6, with the
//! fleet-wide pause of R19), whether a circuit breaker (R9, shared by the fleet) stands in
//! front of the PSP, and which rate limit the fleet keeps (R21: none, a configured one, or one
//! learned from 429s). The delays themselves come from `redrive_policy`'s
//! [`Backoff::nominal`] and [`Jitter::apply`], and the flow control from its
//! [`FlowConfig`](redrive_policy::FlowConfig): the simulator has no retry maths of its own.
//!
//! Grammar: `SHAPE[+ra][+breaker][+limit|+adaptive]`, where `SHAPE` is one of
//! `none` (call again at once), `constant` or `constant(D)`, `exponential` (no jitter),
//! `full`, `equal`, `decorrelated`, `proportional(F)`, or `schedule(D,D,...)`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;
use redrive_policy::{Backoff, ExponentialBuilder, Jitter, format_duration, parse_duration};

use crate::error::SimError;

/// The accepted forms, for error messages.
pub const STRATEGY_FORMS: &str = "none, constant[(D)], exponential, full, equal, decorrelated, \
     proportional(F), schedule(D,D,...), optionally followed by +ra, +breaker, and +limit or \
     +adaptive";

/// How the delay before the next call is chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// No backoff at all: call again as soon as the answer arrives.
    Immediate,
    /// The same delay every time: the model's base, or the given one.
    Constant(Option<Duration>),
    /// `min(cap, base · 2^n)` spread by this jitter (`Jitter::None`: plain exponential).
    Exponential(Jitter),
    /// An explicit schedule (R1), capped at its largest entry, without jitter.
    Schedule(Vec<Duration>),
}

/// The fleet's own rate limit toward the PSP (R21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateMode {
    /// No limiter (`RateConfig::off()`): the workers call as their delays say.
    #[default]
    Off,
    /// `+limit`: a configured limit equal to the PSP's capacity (`RateConfig::fixed`).
    Limit,
    /// `+adaptive`: no configured limit; learned from 429s (`RateConfig::adaptive()`).
    Adaptive,
}

/// One strategy to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct Strategy {
    /// The delay shape.
    pub shape: Shape,
    /// Honour `Retry-After` (R6) and pause the whole fleet until it ends (R19).
    pub retry_after: bool,
    /// Put one circuit breaker, shared by the fleet, in front of the PSP (R9, R10, R19).
    pub breaker: bool,
    /// The fleet's rate limit (R21).
    pub rate: RateMode,
}

impl Strategy {
    /// A strategy of this shape, without `Retry-After`, breaker or rate limit.
    pub const fn new(shape: Shape) -> Self {
        Self {
            shape,
            retry_after: false,
            breaker: false,
            rate: RateMode::Off,
        }
    }

    /// The same strategy with this rate limit.
    pub fn with_rate(mut self, rate: RateMode) -> Self {
        self.rate = rate;
        self
    }

    /// Whether the strategy uses any of the capacity model's flow control (`+ra`, `+breaker`,
    /// `+limit`, `+adaptive`).
    pub fn has_flow_control(&self) -> bool {
        self.retry_after || self.breaker || self.rate != RateMode::Off
    }

    /// The same strategy honouring `Retry-After`.
    pub fn with_retry_after(mut self) -> Self {
        self.retry_after = true;
        self
    }

    /// The same strategy behind a circuit breaker.
    pub fn with_breaker(mut self) -> Self {
        self.breaker = true;
        self
    }

    /// The seven shapes the `occ` sweep compares by default (the AWS post's five, plus
    /// `constant` and the `classic` preset's `proportional(0.5)`).
    pub fn occ_defaults() -> Vec<Strategy> {
        [
            Shape::Immediate,
            Shape::Constant(None),
            Shape::Exponential(Jitter::None),
            Shape::Exponential(Jitter::Full),
            Shape::Exponential(Jitter::Equal),
            Shape::Exponential(Jitter::Decorrelated),
            Shape::Exponential(Jitter::proportional(0.5).expect("0.5 is in (0, 10]")),
        ]
        .into_iter()
        .map(Strategy::new)
        .collect()
    }

    /// What the `capacity` model compares by default: no jitter against full jitter, each
    /// with and without `Retry-After`, and full jitter behind a breaker.
    pub fn capacity_defaults() -> Vec<Strategy> {
        let expo = Strategy::new(Shape::Exponential(Jitter::None));
        let full = Strategy::new(Shape::Exponential(Jitter::Full));
        vec![
            Strategy::new(Shape::Immediate),
            expo.clone(),
            full.clone(),
            Strategy::new(Shape::Exponential(Jitter::Decorrelated)),
            expo.with_retry_after(),
            full.clone().with_retry_after(),
            full.with_breaker(),
        ]
    }

    /// The delay calculator for this strategy, with the model's base and cap.
    ///
    /// `exponent_offset` is added to the attempt number before [`Backoff::nominal`]: 0 keeps
    /// R1 (`n` from 0, the first delay is `base`); the `occ` model uses 1, like the AWS
    /// simulator, whose first delay is `expo(1) = 2 · base`.
    ///
    /// # Errors
    /// [`SimError::InvalidStrategy`] when the policy crate refuses the backoff (a zero base,
    /// a cap below the base, a zero entry in a schedule…).
    pub fn retrier(
        &self,
        base: Duration,
        cap: Duration,
        exponent_offset: u32,
    ) -> Result<Retrier, SimError> {
        let bad = |e: redrive_policy::PolicyError| SimError::InvalidStrategy {
            value: self.to_string(),
            reason: e.to_string(),
        };
        let (backoff, jitter) = match &self.shape {
            Shape::Immediate => (None, Jitter::None),
            Shape::Constant(d) => (
                Some(Backoff::constant(d.unwrap_or(base)).map_err(bad)?),
                Jitter::None,
            ),
            Shape::Exponential(j) => (
                Some(
                    ExponentialBuilder::new()
                        .with_base(base)
                        .with_multiplier(2.0)
                        .with_cap(cap)
                        .build()
                        .map_err(bad)?,
                ),
                *j,
            ),
            Shape::Schedule(v) => {
                let top = v.iter().copied().max().unwrap_or(base);
                (
                    Some(Backoff::schedule(v.clone(), top).map_err(bad)?),
                    Jitter::None,
                )
            }
        };
        Ok(Retrier {
            backoff,
            jitter,
            exponent_offset,
        })
    }
}

/// Computes a client's next delay with the policy crate's backoff and jitter.
#[derive(Debug, Clone)]
pub struct Retrier {
    backoff: Option<Backoff>,
    jitter: Jitter,
    exponent_offset: u32,
}

impl Retrier {
    /// The delay after the client's `failures`-th failed call (from 1); `prev` is its previous
    /// delay (decorrelated jitter grows from it).
    pub fn delay<R: Rng + ?Sized>(
        &self,
        failures: u32,
        prev: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        match &self.backoff {
            None => Duration::ZERO,
            Some(b) => {
                let n = failures
                    .saturating_sub(1)
                    .saturating_add(self.exponent_offset);
                self.jitter
                    .apply(b.nominal(n), b.base(), b.cap(), prev, rng)
            }
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Immediate => f.write_str("none"),
            Shape::Constant(None) => f.write_str("constant"),
            Shape::Constant(Some(d)) => write!(f, "constant({})", format_duration(*d)),
            Shape::Exponential(Jitter::None) => f.write_str("exponential"),
            Shape::Exponential(j) => write!(f, "{j}"),
            Shape::Schedule(v) => {
                let parts: Vec<_> = v.iter().map(|d| format_duration(*d)).collect();
                write!(f, "schedule({})", parts.join(","))
            }
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.shape)?;
        if self.retry_after {
            f.write_str("+ra")?;
        }
        if self.breaker {
            f.write_str("+breaker")?;
        }
        match self.rate {
            RateMode::Off => {}
            RateMode::Limit => f.write_str("+limit")?,
            RateMode::Adaptive => f.write_str("+adaptive")?,
        }
        Ok(())
    }
}

fn args_of<'a>(s: &'a str, name: &str) -> Option<&'a str> {
    s.strip_prefix(name)?
        .trim_start()
        .strip_prefix('(')?
        .strip_suffix(')')
}

impl FromStr for Shape {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        Ok(match t {
            "none" | "immediate" => Shape::Immediate,
            "constant" => Shape::Constant(None),
            "exponential" | "expo" => Shape::Exponential(Jitter::None),
            "full" => Shape::Exponential(Jitter::Full),
            "equal" => Shape::Exponential(Jitter::Equal),
            "decorrelated" | "decorr" => Shape::Exponential(Jitter::Decorrelated),
            "proportional" => {
                Shape::Exponential(Jitter::proportional(0.5).expect("0.5 is in (0, 10]"))
            }
            _ => {
                if let Some(a) = args_of(t, "constant") {
                    let d = parse_duration(a).map_err(|e| e.to_string())?;
                    if d.is_zero() {
                        return Err("constant(D) needs a delay above 0s; use none".into());
                    }
                    Shape::Constant(Some(d))
                } else if let Some(a) = args_of(t, "schedule") {
                    let v = a
                        .split(',')
                        .map(|p| parse_duration(p).map_err(|e| e.to_string()))
                        .collect::<Result<Vec<_>, _>>()?;
                    Shape::Schedule(v)
                } else if t.starts_with("proportional") {
                    let j: Jitter = t
                        .parse()
                        .map_err(|e: redrive_policy::PolicyError| e.to_string())?;
                    Shape::Exponential(j)
                } else {
                    return Err(format!(
                        "unknown strategy; expected one of {STRATEGY_FORMS}"
                    ));
                }
            }
        })
    }
}

impl FromStr for Strategy {
    type Err = SimError;

    /// Reads `SHAPE[+ra][+breaker][+limit|+adaptive]` (see the module docs).
    fn from_str(s: &str) -> Result<Self, SimError> {
        let err = |reason: String| SimError::InvalidStrategy {
            value: s.to_owned(),
            reason,
        };
        let mut parts = s.split('+');
        let shape: Shape = parts.next().unwrap_or_default().parse().map_err(err)?;
        let mut st = Strategy::new(shape);
        for m in parts {
            match m.trim() {
                "ra" | "retry-after" | "retry_after" => st.retry_after = true,
                "breaker" => st.breaker = true,
                m @ ("limit" | "adaptive") => {
                    let mode = if m == "limit" {
                        RateMode::Limit
                    } else {
                        RateMode::Adaptive
                    };
                    if st.rate != RateMode::Off && st.rate != mode {
                        return Err(err(
                            "+limit and +adaptive exclude each other: a configured limit, or one \
                             learned from 429s"
                                .into(),
                        ));
                    }
                    st.rate = mode;
                }
                other => {
                    return Err(err(format!(
                        "unknown modifier +{other}; expected +ra, +breaker, +limit or +adaptive"
                    )));
                }
            }
        }
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn names_round_trip() {
        for s in [
            "none",
            "constant",
            "constant(50ms)",
            "exponential",
            "full",
            "equal",
            "decorrelated",
            "proportional(0.5)",
            "schedule(1s,2s,4s)",
            "full+ra",
            "exponential+ra+breaker",
            "full+breaker",
            "full+limit",
            "full+ra+adaptive",
            "decorrelated+ra+breaker+limit",
        ] {
            let st: Strategy = s.parse().unwrap();
            assert_eq!(st.to_string(), s);
        }
        assert_eq!(
            "proportional".parse::<Strategy>().unwrap().to_string(),
            "proportional(0.5)"
        );
    }

    #[test]
    fn bad_names_are_named_in_the_error() {
        for bad in [
            "",
            "fulll",
            "proportional(0)",
            "proportional(x)",
            "schedule()",
            "schedule(1s,0s)",
            "schedule(1,2)",
            "constant(0s)",
            "full+turbo",
            "full+limit+adaptive",
            "full+adaptive+limit",
        ] {
            let e = bad.parse::<Strategy>().and_then(|s| {
                s.retrier(ms(5), ms(2000), 0)?;
                Ok(s)
            });
            let e = e.unwrap_err().to_string();
            assert!(e.contains("invalid strategy"), "{bad}: {e}");
        }
        let e = "fulll".parse::<Strategy>().unwrap_err().to_string();
        assert!(e.contains("\"fulll\""), "{e}");
        assert!(e.contains("decorrelated"), "{e}");
    }

    #[test]
    fn delays_come_from_the_policy_crate() {
        let mut rng = SmallRng::seed_from_u64(1);
        let expo = Strategy::new(Shape::Exponential(Jitter::None));
        // R1: n from 0.
        let r = expo.retrier(ms(200), ms(30_000), 0).unwrap();
        assert_eq!(r.delay(1, None, &mut rng), ms(200));
        assert_eq!(r.delay(3, None, &mut rng), ms(800));
        assert_eq!(r.delay(30, None, &mut rng), ms(30_000));
        // The AWS simulator's convention: the first delay is 2 · base.
        let r = expo.retrier(ms(5), ms(2000), 1).unwrap();
        assert_eq!(r.delay(1, None, &mut rng), ms(10));
        let none = Strategy::new(Shape::Immediate)
            .retrier(ms(5), ms(2000), 1)
            .unwrap();
        assert_eq!(none.delay(7, None, &mut rng), Duration::ZERO);
        let sched: Strategy = "schedule(1s,2s,4s)".parse().unwrap();
        let r = sched.retrier(ms(5), ms(2000), 0).unwrap();
        assert_eq!(r.delay(3, None, &mut rng), ms(4000));
        assert_eq!(r.delay(9, None, &mut rng), ms(4000));
        let full = Strategy::new(Shape::Exponential(Jitter::Full))
            .retrier(ms(100), ms(1000), 0)
            .unwrap();
        for f in 1..20 {
            let d = full.delay(f, None, &mut rng);
            assert!(d <= ms(1000).min(ms(100) * 2u32.pow((f - 1).min(10))));
        }
    }
}
