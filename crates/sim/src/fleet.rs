//! The simulated fleet's flow control: one shared [`FlowRow`] (what the store keeps for the
//! dependency), one [`FlowClient`] per simulated worker process, and every call through the
//! client's protocol exactly as the runtime's worker makes it (R23):
//!
//! ```text
//! before_call ─▶ Call / CallAt(slot) ─────────────────────────────▶ call ─▶ after_call
//!      │      └▶ Apply(event) ─▶ FlowConfig::apply ─▶ granted ─▶ …            │
//!      └▶ Blocked ─▶ RetryPolicy::decide_blocked (deferred, not an attempt)   ▼
//!                                              report ─▶ FlowConfig::apply ─▶ reported
//! ```
//!
//! Why a module of its own: both models (`capacity` and `queue`) call through here, so
//! neither has a breaker, a pause or a limiter of its own; they only move simulated time.
//! The row is read and written with no delay (a single process's writes update its cached
//! row at once in the runtime too).
//!
//! Clock skew ([`Fleet::with_clock_skew`]): process `i` of `N` reads its clock `offset_i` off
//! the true time, the offsets spread evenly over `-D..=+D`. Every event a process applies
//! carries its own clock's `now`, a `Retry-After` becomes an instant on its clock, and the
//! instants it is handed (send slots, block ends) are waited for on its clock, so what skew
//! does to the shared row shows in the run. The store's claim and the housekeeping tick use
//! the true time (the database's clock).

use std::time::Duration;

use chrono::DateTime;
use rand::Rng;
use redrive_policy::{
    BreakerMode, Check, DeferReason, FailureClass, FlowClient, FlowConfig, FlowEvent, FlowRow,
    Next, Timestamp, Transition,
};

/// 2026-01-01T00:00:00Z in microseconds: the simulated clock's origin.
const ORIGIN_US: i64 = 1_767_225_600_000_000;

/// Simulated time (nanoseconds from the start) as a wall-clock instant (microsecond
/// precision, as the flow core keeps its slots).
pub(crate) fn ts(t_ns: u64) -> Timestamp {
    DateTime::from_timestamp_micros(ORIGIN_US + (t_ns / 1_000) as i64)
        .unwrap_or(DateTime::<chrono::Utc>::MAX_UTC)
}

/// Simulated time shifted by `offset_us` (a process's clock), as a wall-clock instant.
fn ts_off(t_ns: u64, offset_us: i64) -> Timestamp {
    DateTime::from_timestamp_micros(ORIGIN_US + (t_ns / 1_000) as i64 + offset_us)
        .unwrap_or(DateTime::<chrono::Utc>::MAX_UTC)
}

/// A wall-clock instant as simulated time (0 for anything before the start).
pub(crate) fn ns_of(t: Timestamp) -> u64 {
    u64::try_from(t.timestamp_micros() - ORIGIN_US)
        .unwrap_or(0)
        .saturating_mul(1_000)
}

/// What a worker does about its next call, once the protocol has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Call at `at_ns` (now, or a send slot of the rate limit waited for in process);
    /// `probe` when the call is one of the half-open probes.
    Call { at_ns: u64, probe: bool },
    /// Wait in process until `at_ns`, then ask again (`before_call` with `waited_since`): the
    /// next send slot is within the wait but beyond the reservation horizon.
    Wait { at_ns: u64 },
    /// Don't call before `until`: the job is deferred (not an attempt).
    Blocked {
        until: Timestamp,
        reason: DeferReason,
    },
}

/// The fleet's side of one dependency: its shared row and each process's client.
#[derive(Debug)]
pub(crate) struct Fleet {
    cfg: FlowConfig,
    row: FlowRow,
    clients: Vec<FlowClient>,
    /// Each process's clock offset from the true time, in microseconds.
    offsets: Vec<i64>,
    transitions: Vec<Transition>,
    writes: u64,
}

impl Fleet {
    /// A fleet of `processes` worker processes (at least one) calling one dependency with
    /// `cfg`. `forced_closed`: the row is forced closed (the operator's override), so there is
    /// no breaker at all.
    pub(crate) fn new(cfg: FlowConfig, processes: u32, seed: u64, forced_closed: bool) -> Self {
        let clients = (0..processes.max(1))
            .map(|p| FlowClient::new(cfg.clone(), seed ^ u64::from(p).rotate_left(32)))
            .collect();
        let row = FlowRow {
            mode: if forced_closed {
                BreakerMode::ForcedClosed
            } else {
                BreakerMode::Normal
            },
            ..FlowRow::default()
        };
        Self {
            cfg,
            row,
            offsets: vec![0; processes.max(1) as usize],
            clients,
            transitions: Vec::new(),
            writes: 0,
        }
    }

    /// Spreads the processes' clocks evenly over `-skew..=+skew` around the true time (one
    /// process: no offset).
    pub(crate) fn with_clock_skew(mut self, skew: Duration) -> Self {
        let n = self.offsets.len();
        let d = i64::try_from(skew.as_micros()).unwrap_or(i64::MAX / 4);
        if n > 1 {
            for (i, o) in self.offsets.iter_mut().enumerate() {
                *o = -d + 2 * d * i as i64 / (n as i64 - 1);
            }
        }
        self
    }

    /// Process `p`'s clock at true time `now_ns`.
    fn local(&self, p: usize, now_ns: u64) -> Timestamp {
        ts_off(now_ns, self.offsets[p])
    }

    /// An instant on process `p`'s clock as true simulated time.
    fn real_ns(&self, p: usize, t: Timestamp) -> u64 {
        u64::try_from(t.timestamp_micros() - self.offsets[p] - ORIGIN_US)
            .unwrap_or(0)
            .saturating_mul(1_000)
    }

    /// An instant on process `p`'s clock as an instant on the true clock.
    fn real(&self, p: usize, t: Timestamp) -> Timestamp {
        t - chrono::Duration::microseconds(self.offsets[p])
    }

    /// The shared row.
    pub(crate) fn row(&self) -> &FlowRow {
        &self.row
    }

    /// Every change of the breaker's state, in order.
    pub(crate) fn transitions(&self) -> &[Transition] {
        &self.transitions
    }

    /// Events applied that changed the row (store writes).
    #[cfg(test)]
    pub(crate) fn writes(&self) -> u64 {
        self.writes
    }

    fn apply<R: Rng + ?Sized>(
        &mut self,
        ev: FlowEvent,
        now: Timestamp,
        rng: &mut R,
    ) -> redrive_policy::Grant {
        let step = self.cfg.apply(&self.row, ev, now, rng);
        if step.changed {
            self.writes += 1;
        }
        self.row = step.row;
        if let Some(t) = step.transition {
            self.transitions.push(t);
        }
        step.grant
    }

    /// Before a call of process `p`: `retry` when the job has been attempted before, `max_wait`
    /// the policy's `in_process_max_wait`, `waited_since` when the job has been waiting in
    /// process since then (after a [`Gate::Wait`]).
    #[allow(clippy::too_many_arguments)] // the protocol's own arguments, plus the process
    pub(crate) fn before_call<R: Rng + ?Sized>(
        &mut self,
        p: usize,
        retry: bool,
        max_wait: Duration,
        waited_since: Option<u64>,
        now_ns: u64,
        rng: &mut R,
    ) -> Gate {
        let now = self.local(p, now_ns);
        let mut next = match waited_since {
            None => self.clients[p].before_call(&self.row, retry, max_wait, now),
            Some(since) => {
                let left = max_wait.saturating_sub(Duration::from_nanos(now_ns - since));
                self.clients[p].after_wait(&self.row, left, now)
            }
        };
        if let Next::Apply(ev) = next {
            let grant = self.apply(ev, now, rng);
            next = self.clients[p].granted(grant, max_wait, now);
        }
        match next {
            Next::Call { probe } => Gate::Call {
                at_ns: now_ns,
                probe,
            },
            Next::CallAt { at } => Gate::Call {
                at_ns: self.real_ns(p, at).max(now_ns),
                probe: false,
            },
            Next::Wait { until } => Gate::Wait {
                at_ns: self.real_ns(p, until).max(now_ns),
            },
            Next::Blocked { until, reason } => Gate::Blocked {
                until: self.real(p, until),
                reason,
            },
            // `granted` never asks for a second event; were it to, look again shortly.
            Next::Apply(_) => Gate::Blocked {
                until: ts(now_ns + 1_000_000),
                reason: DeferReason::Throttled,
            },
        }
    }

    /// After a call of process `p`: its report, if any, applied to the row. `pause_until` is
    /// the server's `Retry-After` as an instant (for a rate-limited answer).
    #[allow(clippy::too_many_arguments)] // the protocol's own arguments, plus the process
    pub(crate) fn after_call<R: Rng + ?Sized>(
        &mut self,
        p: usize,
        probe: bool,
        class: FailureClass,
        took: Duration,
        pause_until: Option<Timestamp>,
        now_ns: u64,
        rng: &mut R,
    ) {
        let now = self.local(p, now_ns);
        // The server's wait, as an instant on this process's clock.
        let off = chrono::Duration::microseconds(self.offsets[p]);
        let pause_until = pause_until.map(|u| u + off);
        if let Some(ev) =
            self.clients[p].after_call(&self.row, probe, class, took, pause_until, now)
        {
            self.apply(ev, now, rng);
            self.clients[p].reported(&self.row, now);
        }
    }

    /// Just before process `p` sends a call at its send slot, as the runtime's worker looks
    /// again ([`FlowClient::at_slot`]): `None` to send it, else until when the row blocks it
    /// (the breaker opened or the dependency was paused while the slot was waited for).
    pub(crate) fn at_slot(&mut self, p: usize, now_ns: u64) -> Option<(Timestamp, DeferReason)> {
        let now = self.local(p, now_ns);
        match self.clients[p].at_slot(&self.row, now)? {
            Next::Blocked { until, reason } => Some((self.real(p, until), reason)),
            _ => Some((ts(now_ns), DeferReason::BreakerOpen)),
        }
    }

    /// Housekeeping ([`FlowEvent::Tick`]): an open breaker whose cool-down ended goes
    /// half-open; a half-open round that timed out starts again.
    pub(crate) fn tick<R: Rng + ?Sized>(&mut self, now_ns: u64, rng: &mut R) {
        self.apply(FlowEvent::Tick, ts(now_ns), rng);
    }

    /// When a wait in process would be pointless: the row blocks calls until then.
    pub(crate) fn blocked_until(&self, now_ns: u64) -> Option<(Timestamp, DeferReason)> {
        match self.cfg.check(&self.row, ts(now_ns)) {
            Check::Blocked { until, reason } => Some((until, reason)),
            _ => None,
        }
    }

    /// Whether the store's claim query hands out jobs of this dependency now: not while it is
    /// paused, open (cool-down running) or half-open with no probe permit left.
    pub(crate) fn claimable(&self, now_ns: u64) -> bool {
        use redrive_policy::BreakerState::*;
        let now = ts(now_ns);
        let r = &self.row;
        let paused = r.paused_until.is_some_and(|p| p > now);
        let open = r.state == Open && r.open_until.is_none_or(|u| u > now);
        let no_probe = r.state == HalfOpen && r.probe_permits == 0;
        !(paused || open || no_probe)
    }

    /// The earliest time the claim query could hand out a job due at `run_at_ns` (the store's
    /// `next_due`): not before a pause or an open breaker's cool-down ends.
    pub(crate) fn next_due(&self, run_at_ns: u64) -> u64 {
        let r = &self.row;
        let mut t = run_at_ns;
        if let Some(p) = r.paused_until {
            t = t.max(ns_of(p));
        }
        if r.state == redrive_policy::BreakerState::Open
            && let Some(u) = r.open_until
        {
            t = t.max(ns_of(u));
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use redrive_policy::{BreakerConfig, BreakerState, RateConfig, Window};

    const MS: u64 = 1_000_000;

    #[test]
    fn times_round_trip_to_the_microsecond() {
        for t in [0, 1_000, 12_500_000, 3_600_000_000_000] {
            assert_eq!(ns_of(ts(t)), t);
        }
        assert_eq!(ns_of(ts(1_999)), 1_000);
    }

    #[test]
    fn a_fixed_limit_hands_out_spaced_slots() {
        let cfg = FlowConfig::default()
            .with_rate(RateConfig::fixed(100.0).unwrap().with_burst(0))
            .unwrap();
        let mut f = Fleet::new(cfg, 1, 1, true);
        let mut rng = SmallRng::seed_from_u64(1);
        let wait = Duration::from_secs(1);
        let at: Vec<u64> = (0..12)
            .map(|_| match f.before_call(0, false, wait, None, 0, &mut rng) {
                Gate::Call { at_ns, probe } => {
                    assert!(!probe);
                    at_ns
                }
                other => panic!("{other:?}"),
            })
            .collect();
        let want: Vec<u64> = (0..12).map(|i| i * 10 * MS).collect();
        assert_eq!(at, want);
        // Two reservations (10 slots each) for twelve calls.
        assert_eq!(f.writes(), 2);
    }

    #[test]
    fn forced_closed_never_opens_and_open_blocks_the_claim() {
        let b = BreakerConfig::builder()
            .with_window(Window::Count { size: 10 })
            .with_minimum_calls(5)
            .with_open_cooldown(Duration::from_secs(1))
            .with_cooldown_jitter(0.0)
            .build()
            .unwrap();
        let cfg = FlowConfig::default()
            .with_breaker(b)
            .with_rate(RateConfig::off())
            .unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let d = Duration::from_millis(10);
        let mut closed = Fleet::new(cfg.clone(), 1, 1, true);
        let mut normal = Fleet::new(cfg, 1, 1, false);
        for f in [&mut closed, &mut normal] {
            for i in 0..5 {
                f.after_call(
                    0,
                    false,
                    FailureClass::Infrastructure,
                    d,
                    None,
                    i * MS,
                    &mut rng,
                );
            }
        }
        assert_eq!(closed.row().state, BreakerState::Closed);
        assert!(closed.claimable(5 * MS));
        assert_eq!(normal.row().state, BreakerState::Open);
        assert!(!normal.claimable(5 * MS));
        assert_eq!(normal.next_due(0), 1004 * MS);
        assert!(matches!(
            normal.before_call(0, true, d, None, 5 * MS, &mut rng),
            Gate::Blocked {
                reason: DeferReason::BreakerOpen,
                ..
            }
        ));
        // After the cool-down: probes, and the claim hands jobs out again.
        assert!(normal.claimable(1004 * MS));
        assert_eq!(
            normal.before_call(0, true, d, None, 1004 * MS, &mut rng),
            Gate::Call {
                at_ns: 1004 * MS,
                probe: true
            }
        );
        assert_eq!(normal.row().state, BreakerState::HalfOpen);
        assert_eq!(normal.transitions().len(), 2);
    }
}
