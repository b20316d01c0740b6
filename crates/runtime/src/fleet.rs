//! Breakers and pauses shared by the fleet (R10, R19).
//!
//! The store's `redrive_dependencies` row is the authority: each process keeps a local
//! [`CircuitBreaker`] per dependency only to measure its own window and to draw cool-downs.
//! - An opening seen locally is published with a compare-and-set (`closed → open`), so every
//!   process stops calling at once; the claim query skips jobs of an open or paused dependency.
//! - When the cool-down has ended, one process moves the row to `half_open` with the configured
//!   number of probe permits; every probe takes a permit from the store atomically, so the
//!   whole fleet sends at most that many.
//! - A probe that fails reopens the breaker (with a longer cool-down); a probe that succeeds
//!   closes it for everyone.
//! - A `Retry-After` seen by one worker pauses the dependency for all until then.
//!
//! Rows are read through a short cache (`refresh`, 20 ms by default) so that a busy worker
//! does not read the row before every call; writes by this process update the cache at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use redrive_policy::{
    BreakerConfig, BreakerState, CallResult, CircuitBreaker, DeferReason, FailureClass, Jitter,
    PolicySet, Timestamp,
};
use redrive_store::{BreakerUpdate, Dependency, StoreError};

use crate::db::Db;

/// Whether a call to a dependency may go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Call; `probe` when it is one of the half-open probes.
    Go { probe: bool },
    /// Don't call before `until`.
    Blocked {
        until: Timestamp,
        reason: DeferReason,
    },
}

#[derive(Debug)]
struct Entry {
    breaker: CircuitBreaker,
    row: Option<Dependency>,
    read_at: Option<tokio::time::Instant>,
    /// Openings in a row without a close, fleet-wide (each distinct opening counted once:
    /// by its `open_until`), for the growing cool-down.
    openings: u32,
    last_open_until: Option<Timestamp>,
    rng: SmallRng,
}

/// The process's view of the fleet's dependencies.
#[derive(Debug)]
pub(crate) struct Fleet {
    db: Db,
    policies: PolicySet,
    refresh: Duration,
    seed: u64,
    entries: Mutex<HashMap<String, Entry>>,
}

fn state_of(row: Option<&Dependency>) -> BreakerState {
    row.and_then(|r| BreakerState::parse(&r.state).ok())
        .unwrap_or(BreakerState::Closed)
}

impl Fleet {
    pub(crate) fn new(db: Db, policies: PolicySet, refresh: Duration, seed: u64) -> Self {
        Self {
            db,
            policies,
            refresh,
            seed,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn config(&self, dep: &str) -> BreakerConfig {
        self.policies.breaker(dep)
    }

    fn with<T>(&self, dep: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.entry(dep.to_owned()).or_insert_with(|| Entry {
            breaker: CircuitBreaker::new(self.config(dep), self.seed ^ hash(dep)),
            row: None,
            read_at: None,
            openings: 0,
            last_open_until: None,
            rng: SmallRng::seed_from_u64(self.seed ^ hash(dep).rotate_left(7)),
        });
        f(e)
    }

    /// The dependency's row, from the cache if fresh enough.
    async fn row(
        &self,
        dep: &str,
        force: bool,
        now: Timestamp,
    ) -> Result<Option<Dependency>, StoreError> {
        let cached = self.with(dep, |e| {
            let fresh = e.read_at.is_some_and(|t| t.elapsed() < self.refresh);
            (fresh && !force).then(|| e.row.clone())
        });
        if let Some(row) = cached {
            return Ok(row);
        }
        let d = dep.to_owned();
        let row = self
            .db
            .run(move |s| async move { s.dependency(&d).await })
            .await?;
        self.adopt(dep, row.clone(), now);
        Ok(row)
    }

    /// Takes a freshly read row into the cache and the local breaker.
    fn adopt(&self, dep: &str, row: Option<Dependency>, now: Timestamp) {
        let t = self.with(dep, |e| {
            let state = state_of(row.as_ref());
            let until = row.as_ref().and_then(|r| r.open_until);
            match state {
                BreakerState::Open if until != e.last_open_until => {
                    e.openings = e.openings.saturating_add(1);
                    e.last_open_until = until;
                }
                BreakerState::Closed => e.openings = 0,
                _ => {}
            }
            e.row = row;
            e.read_at = Some(tokio::time::Instant::now());
            e.breaker.observe(state, until, now)
        });
        if let Some(t) = t {
            crate::metrics::breaker_state(dep, t.to);
        }
    }

    fn forget(&self, dep: &str) {
        self.with(dep, |e| e.read_at = None);
    }

    /// May this process call `dep` now? Takes a probe permit from the store when half-open.
    pub(crate) async fn admit(&self, dep: &str, now: Timestamp) -> Result<Gate, StoreError> {
        let row = self.row(dep, false, now).await?;
        let Some(row) = row else {
            return Ok(Gate::Go { probe: false });
        };
        if let Some(p) = row.paused_until.filter(|p| *p > now) {
            return Ok(Gate::Blocked {
                until: p,
                reason: DeferReason::Paused,
            });
        }
        match state_of(Some(&row)) {
            BreakerState::Closed => Ok(Gate::Go { probe: false }),
            BreakerState::Open => {
                if let Some(until) = row.open_until.filter(|u| *u > now) {
                    return Ok(Gate::Blocked {
                        until,
                        reason: DeferReason::BreakerOpen,
                    });
                }
                self.half_open(dep, "open", "cool-down elapsed", now)
                    .await?;
                self.probe(dep, now).await
            }
            BreakerState::HalfOpen => self.probe(dep, now).await,
        }
    }

    /// Until when `dep` is blocked (open, or paused), as the fleet says now; takes no probe.
    pub(crate) async fn blocked_until(
        &self,
        dep: &str,
        now: Timestamp,
    ) -> Result<Option<(Timestamp, DeferReason)>, StoreError> {
        let Some(row) = self.row(dep, false, now).await? else {
            return Ok(None);
        };
        if row.state == "open"
            && let Some(u) = row.open_until.filter(|u| *u > now)
        {
            return Ok(Some((u, DeferReason::BreakerOpen)));
        }
        Ok(row
            .paused_until
            .filter(|p| *p > now)
            .map(|p| (p, DeferReason::Paused)))
    }

    async fn probe(&self, dep: &str, now: Timestamp) -> Result<Gate, StoreError> {
        let d = dep.to_owned();
        let got = self
            .db
            .run(move |s| async move { s.take_probe(&d, now).await })
            .await?;
        self.forget(dep);
        if got {
            return Ok(Gate::Go { probe: true });
        }
        // Every permit of this round is out: look again after a short while (the round's
        // answer closes or reopens the breaker and wakes the workers).
        let wait = self
            .config(dep)
            .half_open_timeout
            .min(Duration::from_secs(1));
        Ok(Gate::Blocked {
            until: now + chrono::Duration::from_std(wait).unwrap_or_default(),
            reason: DeferReason::BreakerOpen,
        })
    }

    /// Moves `dep` from `expect` to half-open with a fresh round of probe permits.
    async fn half_open(
        &self,
        dep: &str,
        expect: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let permits = self.config(dep).half_open_probes;
        let applied = self
            .set(
                dep,
                expect,
                BreakerState::HalfOpen,
                None,
                permits,
                reason,
                now,
            )
            .await?;
        if applied && expect != "half_open" {
            self.announce(dep, BreakerState::Open, BreakerState::HalfOpen, reason);
        }
        Ok(applied)
    }

    fn announce(&self, dep: &str, from: BreakerState, to: BreakerState, reason: &str) {
        crate::metrics::breaker(dep, from, to);
        if to == BreakerState::Open {
            tracing::warn!(dependency = dep, %from, %to, reason, "breaker opened");
        } else {
            tracing::info!(dependency = dep, %from, %to, reason, "breaker transition");
        }
    }

    /// Feeds one call's outcome to the breaker (publishing an opening or a probe's verdict)
    /// and pauses the dependency fleet-wide after a `Retry-After`.
    pub(crate) async fn record(
        &self,
        dep: &str,
        probe: bool,
        class: FailureClass,
        took: Duration,
        pause_until: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        if let Some(until) = pause_until {
            let d = dep.to_owned();
            self.db
                .run(move |s| async move { s.pause(&d, until, "retry_after", now).await })
                .await?;
            self.with(dep, |e| {
                if let Some(r) = e.row.as_mut() {
                    r.paused_until = Some(r.paused_until.map_or(until, |p| p.max(until)));
                } else {
                    e.read_at = None;
                }
            });
            tracing::info!(dependency = dep, until = %until, "dependency paused (Retry-After)");
        }
        let result = self.config(dep).result_of(class);
        if probe {
            match result {
                CallResult::Success => {
                    let applied = self
                        .publish(
                            dep,
                            "half_open",
                            BreakerState::Closed,
                            None,
                            "probe succeeded",
                            now,
                        )
                        .await?;
                    if applied {
                        self.announce(
                            dep,
                            BreakerState::HalfOpen,
                            BreakerState::Closed,
                            "probe succeeded",
                        );
                    }
                }
                CallResult::Failure => {
                    // Reopen with the next, longer cool-down; of several failed probes of one
                    // round only the first compare-and-set applies.
                    let (until, n) = self.with(dep, |e| {
                        let n = e.openings.max(1).saturating_add(1);
                        let cfg = e.breaker.config().clone();
                        let nominal = cfg.cooldown(n);
                        let cooldown = if cfg.cooldown_jitter > 0.0 {
                            Jitter::Proportional(cfg.cooldown_jitter).apply(
                                nominal,
                                nominal,
                                cfg.cooldown_max,
                                None,
                                &mut e.rng,
                            )
                        } else {
                            nominal
                        };
                        // Whole milliseconds, as stored, so the re-read row is recognised.
                        let until = now + chrono::Duration::from_std(cooldown).unwrap_or_default();
                        (redrive_store::from_millis(until.timestamp_millis()), n)
                    });
                    let applied = self
                        .publish(
                            dep,
                            "half_open",
                            BreakerState::Open,
                            Some(until),
                            "probe failed",
                            now,
                        )
                        .await?;
                    if applied {
                        self.with(dep, |e| {
                            e.openings = n;
                            e.last_open_until = Some(until);
                            e.breaker.observe(BreakerState::Open, Some(until), now);
                        });
                        self.announce(
                            dep,
                            BreakerState::HalfOpen,
                            BreakerState::Open,
                            "probe failed",
                        );
                    }
                }
                CallResult::Ignored => {}
            }
            return Ok(());
        }
        let t = self.with(dep, |e| {
            if e.breaker.state() == BreakerState::Closed {
                e.breaker.record(class, took, now)
            } else {
                None
            }
        });
        if let Some(t) = t.filter(|t| t.to == BreakerState::Open) {
            let reason = t.reason.to_string();
            let applied = self
                .publish(
                    dep,
                    "closed",
                    BreakerState::Open,
                    t.open_until,
                    &reason,
                    now,
                )
                .await?;
            if applied {
                self.with(dep, |e| {
                    e.openings = 1;
                    e.last_open_until = t.open_until;
                });
                self.announce(dep, BreakerState::Closed, BreakerState::Open, &reason);
            } else {
                // Someone else changed it first: take the fleet's word.
                self.row(dep, true, now).await?;
            }
        }
        Ok(())
    }

    async fn publish(
        &self,
        dep: &str,
        expect: &str,
        state: BreakerState,
        open_until: Option<Timestamp>,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.set(dep, expect, state, open_until, 0, reason, now)
            .await
    }

    /// Compare-and-set of the shared breaker row (applies only if it still is `expect`).
    #[allow(clippy::too_many_arguments)]
    async fn set(
        &self,
        dep: &str,
        expect: &str,
        state: BreakerState,
        open_until: Option<Timestamp>,
        probe_permits: u32,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let u = BreakerUpdate {
            dependency: dep.to_owned(),
            expect: Some(expect.to_owned()),
            state: state.as_str().to_owned(),
            open_until,
            probe_permits,
            reason: reason.to_owned(),
            now,
        };
        let applied = self
            .db
            .run(move |s| async move { s.set_breaker(&u).await })
            .await?;
        self.forget(dep);
        Ok(applied)
    }

    /// Housekeeping for every dependency, run by each worker between claims: an open breaker
    /// whose cool-down ended goes half-open (so its jobs can be claimed as probes), and a
    /// half-open round whose permits were all taken but never answered (its prober died) gets
    /// a new round after `half_open_timeout`.
    pub(crate) async fn maintain(&self, now: Timestamp) -> Result<(), StoreError> {
        for d in self
            .db
            .run(|s| async move { s.dependencies().await })
            .await?
        {
            match state_of(Some(&d)) {
                BreakerState::Open if d.open_until.is_some_and(|u| u <= now) => {
                    self.half_open(&d.name, "open", "cool-down elapsed", now)
                        .await?;
                }
                BreakerState::HalfOpen if d.probe_permits == 0 => {
                    let timeout = self.config(&d.name).half_open_timeout;
                    if d.updated_at + chrono::Duration::from_std(timeout).unwrap_or_default() <= now
                    {
                        self.half_open(&d.name, "half_open", "probe round timed out", now)
                            .await?;
                    }
                }
                _ => {}
            }
            crate::metrics::breaker_state(&d.name, state_of(Some(&d)));
        }
        Ok(())
    }
}

fn hash(s: &str) -> u64 {
    // FNV-1a: a stable per-dependency seed.
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
