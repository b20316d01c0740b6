//! The `occ` model: the AWS Architecture Blog's "Exponential Backoff And Jitter" (2015).
//!
//! N clients start at once and each updates one row with optimistic concurrency: read the
//! version, then write conditionally on it. A write with a stale version fails; the client
//! backs off and starts again with a read. A client stops once its write succeeds. Every
//! message takes `|Normal(10 ms, 2 ms)|`. This is the model of the post's public simulator
//! (awslabs/aws-arch-backoff-simulator), rebuilt on the policy crate's backoff and jitter:
//! base 5 ms, cap 2 s, and, like that simulator, the first delay after the first conflict is
//! `expo(1) = 2 · base` (see [`OccConfig::exponent_offset`]).

use std::time::Duration;

use rand::Rng;

use crate::error::SimError;
use crate::net::{Net, Queue, RunResult, ns};
use crate::strategy::{Retrier, Strategy};

/// Parameters of the `occ` model.
///
/// # Default
/// base 5 ms, cap 2 s, network `|Normal(10 ms, 2 ms)|`, exponent offset 1, at most 100,000
/// attempts per client (a guard; no default strategy comes near it).
#[derive(Debug, Clone, PartialEq)]
pub struct OccConfig {
    /// Backoff base.
    pub base: Duration,
    /// Backoff cap.
    pub cap: Duration,
    /// The network.
    pub net: Net,
    /// Added to the failure count before `Backoff::nominal` (1: the AWS simulator's `expo(n)`
    /// with `n` counted from 1).
    pub exponent_offset: u32,
    /// A client gives up after this many failed writes.
    pub max_attempts: u32,
}

impl Default for OccConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            cap: Duration::from_secs(2),
            net: Net::default(),
            exponent_offset: 1,
            max_attempts: 100_000,
        }
    }
}

impl OccConfig {
    /// The strategy's delay calculator for this model.
    ///
    /// # Errors
    /// [`SimError::InvalidConfig`] for `+ra`, `+breaker`, `+limit` or `+adaptive` (the OCC
    /// server sends no `Retry-After`, has no rate limit, and a conflict is not an outage), and
    /// the strategy's own errors.
    pub fn retrier(&self, strategy: &Strategy) -> Result<Retrier, SimError> {
        if strategy.has_flow_control() {
            return Err(SimError::config(
                "strategy",
                strategy,
                "+ra, +breaker, +limit and +adaptive apply to the capacity model only",
            ));
        }
        strategy.retrier(self.base, self.cap, self.exponent_offset)
    }
}

const READ_AT_SERVER: u8 = 0;
const READ_REPLY: u8 = 1;
const WRITE_AT_SERVER: u8 = 2;
const WRITE_REPLY: u8 = 3;

/// One run of the `occ` model with `clients` clients.
pub(crate) fn run<R: Rng + ?Sized>(
    cfg: &OccConfig,
    retrier: &Retrier,
    clients: u32,
    rng: &mut R,
) -> RunResult {
    let n = clients as usize;
    let mut out = RunResult::default();
    let mut q = Queue::with_capacity(n);
    let mut failures = vec![0u32; n];
    let mut prev: Vec<Option<Duration>> = vec![None; n];
    let mut version: u64 = 0;
    let mut last = 0u64;
    for c in 0..clients {
        let d = cfg.net.delay_ns(rng);
        q.push(d, c, READ_AT_SERVER, 0);
    }
    while let Some((t, c, kind, payload)) = q.pop() {
        last = t;
        let ci = c as usize;
        match kind {
            READ_AT_SERVER => q.push(t + cfg.net.delay_ns(rng), c, READ_REPLY, version),
            READ_REPLY => q.push(t + cfg.net.delay_ns(rng), c, WRITE_AT_SERVER, payload),
            WRITE_AT_SERVER => {
                out.count_call(t);
                let ok = payload == version;
                if ok {
                    version += 1;
                } else {
                    out.wasted += 1;
                }
                q.push(t + cfg.net.delay_ns(rng), c, WRITE_REPLY, u64::from(ok));
            }
            _ => {
                debug_assert_eq!(kind, WRITE_REPLY);
                if payload == 1 {
                    continue;
                }
                failures[ci] += 1;
                if failures[ci] >= cfg.max_attempts {
                    out.failed += 1;
                    continue;
                }
                let d = retrier.delay(failures[ci], prev[ci], rng);
                prev[ci] = Some(d);
                q.push(t + cfg.net.delay_ns(rng) + ns(d), c, READ_AT_SERVER, 0);
            }
        }
    }
    out.completion = Duration::from_nanos(last);
    out
}
