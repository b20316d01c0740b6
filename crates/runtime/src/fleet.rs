//! Flow control shared by the fleet (R9, R10, R19, R21): the I/O around the policy crate's
//! pure machine.
//!
//! The store's `redrive_dependencies` row is the authority: one [`FlowRow`] per dependency,
//! changed only by [`FlowConfig::apply`] and written back with a compare-and-set on its version
//! (a conflict re-reads the row and applies the event again). Each process keeps one
//! [`FlowClient`] per dependency: its own failure window, the send slots it reserved, what got
//! through lately, its retry budget. Nothing about breakers, pauses or rates is decided here;
//! `redrive simulate` drives the same two types in simulated time.
//!
//! Store writes: none per call while a dependency is healthy and has no rate limit (a learned
//! one lifted at its ceiling, or none learned with slow start off); one per reserved batch of
//! send slots (about 100 ms of the rate, and the fleet's meter rides on the same write) while
//! a limit or slow start is in force; one per probe taken and answered; one per opening, 429
//! report and housekeeping step.
//!
//! Rows are read through a short cache (`refresh`, 20 ms by default) so that a busy worker
//! does not read the row before every call; this process's own writes update the cache at
//! once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use redrive_policy::{
    CallResult, DeferReason, FailureClass, FlowClient, FlowConfig, FlowEvent, Next, Step, Timestamp,
};
use redrive_store::{Dependency, DependencyWrite, StoreError};
use tokio::sync::Semaphore;

use crate::db::Db;

/// Compare-and-set attempts before an event gives up (another writer won every time).
const CAS_TRIES: u32 = 8;

/// Store errors a probe's report is tried through ([`Fleet::apply_reliably`]).
const PROBE_REPORT_TRIES: u32 = 4;

/// Whether a call to a dependency may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Call now; `probe` when it is one of the half-open probes.
    Go { probe: bool },
    /// Call at `at` (a send slot of the rate limit), waiting in process.
    At { at: Timestamp },
    /// Wait in process until `until`, then ask again (`admit` with `waited`): the next send
    /// slot is within the wait but beyond the reservation horizon.
    Wait { until: Timestamp },
    /// Don't call before `until`.
    Blocked {
        until: Timestamp,
        reason: DeferReason,
    },
}

#[derive(Debug)]
struct Entry {
    config: FlowConfig,
    client: FlowClient,
    row: Option<Dependency>,
    read_at: Option<tokio::time::Instant>,
    inflight: Option<Arc<Semaphore>>,
    rng: SmallRng,
    /// Held while this process applies an event to the row: its tasks take turns instead of
    /// racing each other's compare-and-set (a burst of them, say after a pause, would
    /// otherwise exhaust [`CAS_TRIES`] and lose reports such as a probe's answer).
    writer: Arc<tokio::sync::Mutex<()>>,
    /// The policies' generation `config` was read from ([`crate::LivePolicies`]).
    generation: u64,
}

/// The process's view of the fleet's dependencies.
#[derive(Debug)]
pub(crate) struct Fleet {
    db: Db,
    policies: crate::LivePolicies,
    refresh: Duration,
    seed: u64,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Fleet {
    pub(crate) fn new(db: Db, policies: crate::LivePolicies, refresh: Duration, seed: u64) -> Self {
        Self {
            db,
            policies,
            refresh,
            seed,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn with<T>(&self, dep: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let generation = self.policies.generation();
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.entry(dep.to_owned()).or_insert_with(|| {
            let config = self.policies.current().flow(dep);
            Entry {
                client: FlowClient::new(config.clone(), self.seed ^ hash(dep)),
                inflight: config
                    .max_inflight()
                    .map(|n| Arc::new(Semaphore::new(n as usize))),
                config,
                row: None,
                read_at: None,
                rng: SmallRng::seed_from_u64(self.seed ^ hash(dep).rotate_left(7)),
                writer: Arc::new(tokio::sync::Mutex::new(())),
                generation,
            }
        });
        if e.generation != generation {
            // New policies: a changed flow configuration starts a fresh client (its window
            // and reserved slots were counted under the old one) and cap on calls in flight
            // (calls holding a slot of the old cap finish under it). The shared row stays.
            let config = self.policies.current().flow(dep);
            if config != e.config {
                e.client = FlowClient::new(config.clone(), self.seed ^ hash(dep));
                e.inflight = config
                    .max_inflight()
                    .map(|n| Arc::new(Semaphore::new(n as usize)));
                e.config = config;
            }
            e.generation = generation;
        }
        f(e)
    }

    /// The dependency's row, from the cache if fresh enough.
    async fn row(&self, dep: &str, force: bool) -> Result<Option<Dependency>, StoreError> {
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
        self.adopt(dep, row.clone());
        Ok(row)
    }

    /// Takes a row (read or just written) into the cache.
    fn adopt(&self, dep: &str, row: Option<Dependency>) {
        let (state, rate) = self.with(dep, |e| {
            let flow = row.as_ref().map(|d| d.flow.clone()).unwrap_or_default();
            let rate = e.config.rate_in_force(&flow);
            e.row = row;
            e.read_at = Some(tokio::time::Instant::now());
            (flow.state, rate)
        });
        crate::metrics::breaker_state(dep, state);
        crate::metrics::rate_limit(dep, rate);
    }

    /// The per-process cap on calls in flight to `dep`, if one is configured.
    pub(crate) fn inflight(&self, dep: &str) -> Option<Arc<Semaphore>> {
        self.with(dep, |e| e.inflight.clone())
    }

    /// May this process call `dep` now? Takes a probe permit or reserves send slots from the
    /// store when the row says so. `retry`: the job has been attempted before; `max_wait`: the
    /// longest wait in process for a send slot (what is left of it after a [`Gate::Wait`]);
    /// `waited`: this asks again after a [`Gate::Wait`].
    pub(crate) async fn admit(
        &self,
        dep: &str,
        retry: bool,
        max_wait: Duration,
        waited: bool,
        now: Timestamp,
    ) -> Result<Gate, StoreError> {
        let row = self.row(dep, false).await?;
        let flow = row.map(|d| d.flow).unwrap_or_default();
        let mut next = self.with(dep, |e| {
            if waited {
                e.client.after_wait(&flow, max_wait, now)
            } else {
                e.client.before_call(&flow, retry, max_wait, now)
            }
        });
        let mut applied = false;
        // The grant of an applied event never asks for another event.
        for _ in 0..2 {
            let Next::Apply(ev) = next else { break };
            let step = self.apply(dep, ev, now).await?;
            next = self.with(dep, |e| e.client.granted(step.grant, max_wait, now));
            applied = true;
        }
        let gate = match next {
            Next::Call { probe } => Gate::Go { probe },
            Next::CallAt { at } => Gate::At { at },
            Next::Wait { until } => Gate::Wait { until },
            Next::Blocked { until, reason } => Gate::Blocked { until, reason },
            Next::Apply(_) => Gate::Blocked {
                until: now,
                reason: DeferReason::Throttled,
            },
        };
        // The store write (a reservation, a probe's permit) took time: another task may have
        // opened the breaker meanwhile. A call decided from the cached row alone needs no look.
        if applied && let Gate::Go { .. } | Gate::At { .. } = gate {
            let probe = matches!(gate, Gate::Go { probe: true });
            match self.at_slot(dep, probe, now).await {
                Ok(blocked @ Gate::Blocked { .. }) => {
                    if probe {
                        self.return_probe(dep, now).await;
                    }
                    return Ok(blocked);
                }
                Ok(_) => {}
                // The permit is taken: the call goes as the probe it is, and its answer will
                // be reported (failing open as a plain call would leave the round waiting).
                Err(e) if probe => {
                    tracing::warn!(dependency = dep, "reading the dependency failed: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(gate)
    }

    /// Just before a call let through after a wait (a send slot's, or the store write that
    /// reserved it or took a probe's permit): may it still go? The breaker may have opened
    /// (by this process or, as last read, by another) or the dependency been paused in the
    /// meantime. [`Gate::Go`] or [`Gate::Blocked`].
    pub(crate) async fn at_slot(
        &self,
        dep: &str,
        probe: bool,
        now: Timestamp,
    ) -> Result<Gate, StoreError> {
        let row = self.row(dep, false).await?;
        let flow = row.map(|d| d.flow).unwrap_or_default();
        if probe {
            return Ok(if self.with(dep, |e| e.client.at_probe(&flow, now)) {
                Gate::Go { probe: true }
            } else {
                Gate::Blocked {
                    until: flow.open_until.filter(|u| *u > now).unwrap_or(now),
                    reason: DeferReason::BreakerOpen,
                }
            });
        }
        Ok(match self.with(dep, |e| e.client.at_slot(&flow, now)) {
            None => Gate::Go { probe: false },
            Some(Next::Blocked { until, reason }) => Gate::Blocked { until, reason },
            Some(_) => Gate::Blocked {
                until: now,
                reason: DeferReason::BreakerOpen,
            },
        })
    }

    /// Until when `dep` is blocked (open, paused, forced open), as the fleet says now.
    pub(crate) async fn blocked_until(
        &self,
        dep: &str,
        now: Timestamp,
    ) -> Result<Option<(Timestamp, DeferReason)>, StoreError> {
        let row = self.row(dep, false).await?;
        let flow = row.map(|d| d.flow).unwrap_or_default();
        Ok(match self.with(dep, |e| e.config.check(&flow, now)) {
            redrive_policy::Check::Blocked { until, reason } => Some((until, reason)),
            _ => None,
        })
    }

    /// Reports one call's outcome: a probe's answer, an opening of this process's window, a
    /// 429 (the fleet-wide pause until `pause_until` and the rate learned from it).
    pub(crate) async fn record(
        &self,
        dep: &str,
        probe: bool,
        class: FailureClass,
        took: Duration,
        pause_until: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let row = self.row(dep, false).await?;
        let flow = row.map(|d| d.flow).unwrap_or_default();
        let report = self.with(dep, |e| {
            e.client
                .after_call(&flow, probe, class, took, pause_until, now)
        });
        if let Some(ev) = report {
            let step = self.apply_reliably(dep, ev, probe, now).await?;
            self.with(dep, |e| e.client.reported(&step.row, now));
            if let Some(until) = pause_until.filter(|_| class == FailureClass::RateLimited) {
                tracing::info!(dependency = dep, until = %until, rate = ?step.row.rate,
                    "dependency paused (Retry-After)");
            }
        }
        Ok(())
    }

    /// A probe's permit taken for a call that was not made, or abandoned before its answer
    /// (the lease was lost, the worker stopped, a card rule forbade it, the dependency was
    /// paused meanwhile): the permit goes back to the round, so that the round is not left
    /// waiting `half_open_timeout` for an answer that will never come.
    pub(crate) async fn return_probe(&self, dep: &str, now: Timestamp) {
        let ev = FlowEvent::ProbeAnswered {
            result: CallResult::Ignored,
        };
        if let Err(e) = self.apply_reliably(dep, ev, true, now).await {
            tracing::warn!(dependency = dep, "returning a probe's permit failed: {e}");
        }
    }

    /// [`Fleet::apply`], and for a probe's report (`probe`) again on a store error, a few
    /// times: a lost answer leaves its round waiting `half_open_timeout` for a verdict.
    async fn apply_reliably(
        &self,
        dep: &str,
        event: FlowEvent,
        probe: bool,
        now: Timestamp,
    ) -> Result<Step, StoreError> {
        let mut wait = Duration::from_millis(20);
        let mut tries = 1;
        loop {
            match self.apply(dep, event, now).await {
                Err(e) if probe && tries < PROBE_REPORT_TRIES => {
                    tracing::warn!(
                        dependency = dep,
                        ?event,
                        "reporting a probe failed, retrying: {e}"
                    );
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    /// Applies `event` to the shared row: read, apply, compare-and-set, again on a conflict.
    async fn apply(&self, dep: &str, event: FlowEvent, now: Timestamp) -> Result<Step, StoreError> {
        let writer = self.with(dep, |e| e.writer.clone());
        let _turn = writer.lock().await;
        let mut row = self.row(dep, false).await?;
        let mut fresh = false;
        for _ in 0..CAS_TRIES {
            let flow = row.as_ref().map(|d| d.flow.clone()).unwrap_or_default();
            let step = self.with(dep, |e| e.config.apply(&flow, event, now, &mut e.rng));
            if !step.changed {
                if fresh {
                    return Ok(step);
                }
                // Nothing to write by the cached row: make sure by the stored one (a probe's
                // answer judged against a stale row would be lost).
                row = self.row(dep, true).await?;
                fresh = true;
                continue;
            }
            let w = DependencyWrite {
                dependency: dep.to_owned(),
                expect_version: row.as_ref().map(|d| d.version),
                flow: step.row.clone(),
                transition: step
                    .transition
                    .map(|t| (t.from, t.to, t.reason.to_string())),
                now,
            };
            let written = self
                .db
                .run(move |s| async move { s.update_dependency(&w).await })
                .await?;
            match written {
                Some(version) => {
                    self.adopt(
                        dep,
                        Some(Dependency {
                            name: dep.to_owned(),
                            flow: step.row.clone(),
                            version,
                            updated_at: now,
                        }),
                    );
                    if let Some(t) = &step.transition {
                        announce(dep, t);
                    }
                    return Ok(step);
                }
                None => {
                    row = self.row(dep, true).await?;
                    fresh = true;
                }
            }
        }
        tracing::warn!(
            dependency = dep,
            ?event,
            "flow state kept changing under this write"
        );
        Ok(Step {
            row: row.map(|d| d.flow).unwrap_or_default(),
            changed: false,
            grant: redrive_policy::Grant::Blocked {
                until: now,
                reason: DeferReason::Throttled,
            },
            transition: None,
        })
    }

    /// Housekeeping for every dependency, run by each worker between claims: an open breaker
    /// whose cool-down ended goes half-open (so its jobs can be claimed as probes), and a
    /// half-open round whose probers vanished starts again after `half_open_timeout`.
    pub(crate) async fn maintain(&self, now: Timestamp) -> Result<(), StoreError> {
        let deps = self
            .db
            .run(|s| async move { s.dependencies().await })
            .await?;
        for d in deps {
            let name = d.name.clone();
            let due = self.with(&name, |e| {
                let probe = e.config.apply(&d.flow, FlowEvent::Tick, now, &mut e.rng);
                probe.changed
            });
            self.adopt(&name, Some(d));
            if due {
                self.apply(&name, FlowEvent::Tick, now).await?;
            }
        }
        Ok(())
    }
}

fn announce(dep: &str, t: &redrive_policy::Transition) {
    crate::metrics::breaker(dep, t.from, t.to);
    let reason = t.reason.to_string();
    if t.to == redrive_policy::BreakerState::Open {
        tracing::warn!(dependency = dep, from = %t.from, to = %t.to, reason, "breaker opened");
    } else {
        tracing::info!(dependency = dep, from = %t.from, to = %t.to, reason, "breaker transition");
    }
}

fn hash(s: &str) -> u64 {
    // FNV-1a: a stable per-dependency seed.
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use redrive_policy::{BreakerState, FlowEvent, PolicySet};
    use redrive_store::Store;

    use super::*;

    async fn fleet(dir: &tempfile::TempDir) -> (Arc<Fleet>, Store) {
        let url = format!("sqlite:{}", dir.path().join("q.db").display());
        let store = Store::connect(&url).await.unwrap();
        let db = Db::new(store.clone(), None);
        let fleet = Fleet::new(
            db,
            crate::LivePolicies::new(PolicySet::builtin()),
            Duration::from_millis(20),
            7,
        );
        (Arc::new(fleet), store)
    }

    /// A burst of reports from one process's tasks all land: they take turns on the row
    /// instead of racing each other's compare-and-set until one gives up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_events_from_one_process_lands_every_one() {
        let dir = tempfile::tempdir().unwrap();
        let (fleet, store) = fleet(&dir).await;
        let t0 = chrono::Utc::now();
        // Create the row.
        fleet
            .apply("psp", FlowEvent::Pause { until: t0 }, t0)
            .await
            .unwrap();
        let before = store.dependency("psp").await.unwrap().unwrap().version;
        let tasks: Vec<_> = (1..=48)
            .map(|i| {
                let fleet = fleet.clone();
                tokio::spawn(async move {
                    // Each pause ends at another instant, so every event changes the row.
                    let until = t0 + chrono::Duration::milliseconds(i);
                    let step = fleet
                        .apply("psp", FlowEvent::Pause { until }, t0)
                        .await
                        .unwrap();
                    step.changed
                })
            })
            .collect();
        let mut landed = 0;
        for t in tasks {
            landed += u64::from(t.await.unwrap());
        }
        let after = store.dependency("psp").await.unwrap().unwrap().version;
        assert_eq!(landed, 48);
        assert_eq!(after - before, 48, "one write per event");
    }

    /// A probe's permit taken for a call that was not made goes back to its round.
    #[tokio::test]
    async fn a_returned_probe_permit_goes_back_to_the_round() {
        let dir = tempfile::tempdir().unwrap();
        let (fleet, store) = fleet(&dir).await;
        let t0 = chrono::Utc::now();
        let step = fleet
            .apply(
                "psp",
                FlowEvent::Opened {
                    reason: redrive_policy::TransitionReason::ProbeFailed,
                },
                t0,
            )
            .await
            .unwrap();
        let later = step.row.open_until.unwrap() + chrono::Duration::milliseconds(1);
        let probe = fleet
            .apply("psp", FlowEvent::TakeProbe, later)
            .await
            .unwrap();
        assert_eq!(probe.row.state, BreakerState::HalfOpen);
        let permits = probe.row.probe_permits;
        fleet.return_probe("psp", later).await;
        let row = store.dependency("psp").await.unwrap().unwrap().flow;
        assert_eq!(row.probe_permits, permits + 1);
    }
}
