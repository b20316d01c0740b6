//! The simulator's shared state: faults, ledger and counters under one lock.
//!
//! Time is `tokio::time::Instant`, so tests on a paused runtime see exact
//! windows and latencies. No lock is ever held across an await.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::faults::{FaultEngine, Faults, FaultsError, Verdict};
use crate::ledger::{Begin, Charge, ChargeRequest, InFlight, Ledger};
use crate::stats::{Arrival, Note, Recorder, RequestPage, RequestRecord, Stats};

/// The simulator's state: cheap to clone (an `Arc`), shared by every handler.
///
/// Build one with [`crate::PspSim::builder`] or [`SimState::new`], then serve
/// [`crate::router`] with it, or let [`crate::PspSimBuilder::start`] do both.
#[derive(Debug, Clone)]
pub struct SimState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    core: Mutex<Core>,
    shutdown: watch::Sender<bool>,
}

#[derive(Debug)]
struct Core {
    start: Instant,
    engine: FaultEngine,
    ledger: Ledger,
    rec: Recorder,
    declines: crate::declines::DeclineBook,
}

impl Core {
    fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(self.start)
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl SimState {
    /// A fresh simulator whose clock starts now. `faults.seed` seeds the
    /// fault RNG (a random seed when `None`); `ledger_dedupe: false` makes
    /// the ledger charge every request (only a layer in front then keeps
    /// `duplicate_effects` at zero).
    ///
    /// # Errors
    /// [`FaultsError`] naming the first invalid fault field.
    pub fn new(faults: Faults, ledger_dedupe: bool) -> Result<SimState, FaultsError> {
        SimState::with_log_capacity(faults, ledger_dedupe, crate::REQUEST_LOG_CAPACITY)
    }

    /// [`SimState::new`] with a request log of `log_capacity` requests.
    ///
    /// # Errors
    /// [`FaultsError`] naming the first invalid fault field.
    pub fn with_log_capacity(
        faults: Faults,
        ledger_dedupe: bool,
        log_capacity: usize,
    ) -> Result<SimState, FaultsError> {
        faults.validate()?;
        let seed = faults.seed.unwrap_or_else(rand::random);
        let faults = faults.resolved(Duration::ZERO);
        let (shutdown, _) = watch::channel(false);
        Ok(SimState {
            inner: Arc::new(Inner {
                core: Mutex::new(Core {
                    start: Instant::now(),
                    engine: FaultEngine::new(faults, seed, Duration::ZERO),
                    ledger: Ledger::new(ledger_dedupe),
                    rec: Recorder::new(log_capacity),
                    declines: Default::default(),
                }),
                shutdown,
            }),
        })
    }

    fn core(&self) -> MutexGuard<'_, Core> {
        // A panic elsewhere cannot leave the counters half-written in a way
        // that matters more than stopping the simulator would.
        self.inner.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Time since the start (or the last reset).
    pub fn elapsed(&self) -> Duration {
        self.core().elapsed()
    }

    /// The current faults, with the effective seed and the outage counted
    /// from the start.
    pub fn faults(&self) -> Faults {
        self.core().engine.faults().clone()
    }

    /// Replaces every fault (fields left at their default are off). An
    /// outage [`crate::OutageAnchor::Now`] is resolved against this moment;
    /// the rate-limit bucket is refilled; the RNG is reseeded only when
    /// `faults.seed` is set. Returns the faults now in force.
    ///
    /// # Errors
    /// [`FaultsError`] naming the first invalid field; nothing changes then.
    pub fn set_faults(&self, faults: Faults) -> Result<Faults, FaultsError> {
        faults.validate()?;
        let mut core = self.core();
        let now = core.elapsed();
        core.engine.set(faults.resolved(now), now);
        Ok(core.engine.faults().clone())
    }

    /// Clears the ledger and the counters, restarts the clock (so outage
    /// windows and the timeline count from now) and reseeds the RNG with the
    /// current seed: after a reset the same requests meet the same faults.
    pub fn reset(&self) {
        let mut core = self.core();
        let faults = core.engine.faults().clone();
        let seed = core.engine.seed();
        core.start = Instant::now();
        core.engine = FaultEngine::new(faults, seed, Duration::ZERO);
        core.ledger.clear();
        core.rec = Recorder::new(core.rec.capacity());
        let rules = core.declines.rules().clone();
        core.declines = crate::declines::DeclineBook::new(rules);
    }

    /// Checks reattempts against the client's own quotas: the Visa and Mastercard windows of
    /// `quotas` replace the judge's (the rest of the judge's rows stay its own). A check that
    /// shares the client's figures cannot catch a wrong figure: prefer
    /// [`SimState::set_judge`] with figures written apart. Clears the book.
    pub fn set_reattempt_quotas(&self, quotas: redrive_policy::QuotaRules) {
        use crate::judge::{CardNetwork, ReattemptWindow};
        let mut rules = crate::judge::JudgeRules::default();
        for (n, net) in [
            (redrive_policy::Network::Visa, CardNetwork::Visa),
            (redrive_policy::Network::Mastercard, CardNetwork::Mastercard),
        ] {
            let ws = quotas
                .windows(n)
                .iter()
                .map(|w| ReattemptWindow {
                    max: w.max(),
                    within: w.window(),
                })
                .collect();
            rules = rules.with_windows(net, ws);
        }
        self.set_judge(rules);
    }

    /// The rules the simulator judges reattempts by (default: its own table of the networks'
    /// rules in force today, [`crate::JudgeRules::default`]). Clears the book.
    pub fn set_judge(&self, rules: crate::JudgeRules) {
        self.core().declines = crate::declines::DeclineBook::new(rules);
    }

    /// One authorisation of `key` for `card`: declined (and how) or not, by the faults'
    /// decline rate and mix; checked against the networks' rules if it is a reattempt.
    pub(crate) fn authorise(&self, key: &str, card: &str) -> Option<crate::DeclineKind> {
        let mut core = self.core();
        let now = core.elapsed();
        let declined = core.engine.decline();
        core.declines.authorise(key, card, now, declined);
        declined
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let core = self.core();
        Stats {
            elapsed_ms: millis(core.elapsed()),
            seed: core.engine.seed(),
            charges: core.ledger.charges(),
            duplicate_effects: core.ledger.duplicate_effects(),
            effects_max_per_key: core.ledger.effects_max_per_key(),
            ledger_dedupe: core.ledger.dedupe(),
            declines_by_code: core.declines.by_code.clone(),
            reattempts: core.declines.reattempts_total,
            reattempt_violations: core.declines.violations,
            reattempt_violations_by_card: core.declines.violations_by_card.clone(),
            card_stop_attempts: core.declines.card_stop_attempts,
            card_stop_attempts_by_card: core.declines.card_stop_attempts_by_card.clone(),
            ..core.rec.snapshot()
        }
    }

    /// One page of the request log: the requests with `seq > after` (all with `after` 0),
    /// at most `limit`, oldest first. The log holds the last
    /// [`crate::REQUEST_LOG_CAPACITY`] requests since the start (or the last reset).
    pub fn requests(&self, after: u64, limit: usize) -> RequestPage {
        self.core().rec.requests(after, limit)
    }

    /// The whole request log (see [`SimState::requests`]).
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.core().rec.requests(0, usize::MAX).requests
    }

    /// The charge made for an idempotency key, if any (the first one, when
    /// the ledger's dedupe is off).
    pub fn charge_for_key(&self, key: &str) -> Option<Charge> {
        self.core().ledger.by_key(key).ok().flatten()
    }

    /// A charge by id.
    pub fn charge(&self, id: &str) -> Option<Charge> {
        self.core().ledger.by_id(id)
    }

    /// Ends every hold-back and latency at once (used on shutdown).
    pub(crate) fn signal_shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// Resolves once shutdown was signalled.
    pub(crate) async fn shutdown_signal(&self) {
        let mut rx = self.inner.shutdown.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Sleeps `d`, or less if the simulator shuts down meanwhile.
    pub(crate) async fn sleep(&self, d: Duration) {
        if d.is_zero() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = self.shutdown_signal() => {}
        }
    }

    /// A `/v1` request arrives: the arrival (both clocks), the faults in
    /// force and what they decide.
    pub(crate) fn arrive(
        &self,
        method: &str,
        path: &str,
        charge_key: Option<String>,
    ) -> (Arrival, Faults, Verdict) {
        let mut core = self.core();
        let now = core.elapsed();
        // Read under the lock, so that the wall clock and the elapsed time agree in order.
        let at = chrono::Utc::now();
        if let Some(k) = &charge_key {
            core.rec.key(k);
        }
        let verdict = core.engine.decide(now);
        let arrival = Arrival {
            elapsed: now,
            at,
            method: method.to_owned(),
            path: path.to_owned(),
            key: charge_key,
            traceparent: None,
        };
        (arrival, core.engine.faults().clone(), verdict)
    }

    /// Counts an answered request and logs it.
    pub(crate) fn record(&self, arrival: Arrival, status: u16, note: Note) {
        self.core().rec.answered(arrival, status, note);
    }

    /// Counts one run of the charge handler for `key`.
    pub(crate) fn executed(&self, key: &str) {
        self.core().rec.executed(key);
    }

    /// Whether a charge just made gets its answer held back (counted if so).
    pub(crate) fn roll_timeout_after_commit(&self) -> bool {
        let mut core = self.core();
        let fire = core.engine.timeout_after_commit();
        if fire {
            core.rec.held_back();
        }
        fire
    }

    pub(crate) fn begin(&self, key: &str, request: &ChargeRequest) -> Begin {
        self.core().ledger.begin(key, request)
    }

    pub(crate) fn release(&self, key: &str, token: u64) {
        self.core().ledger.release(key, token);
    }

    pub(crate) fn commit(&self, key: &str, request: &ChargeRequest) -> Charge {
        let mut core = self.core();
        let at = millis(core.elapsed());
        core.ledger.commit(key, request, at)
    }

    pub(crate) fn by_key(&self, key: &str) -> Result<Option<Charge>, InFlight> {
        self.core().ledger.by_key(key)
    }
}

/// A key taken by a fresh request: committed, or given back when dropped
/// (the client went away before the effect), so a repeat can go ahead.
#[derive(Debug)]
pub(crate) struct Reservation {
    sim: SimState,
    key: String,
    token: u64,
    done: bool,
}

impl Reservation {
    pub(crate) fn new(sim: SimState, key: String, token: u64) -> Self {
        Reservation {
            sim,
            key,
            token,
            done: false,
        }
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    pub(crate) fn commit(mut self, request: &ChargeRequest) -> Charge {
        self.done = true;
        self.sim.commit(&self.key, request)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.done {
            self.sim.release(&self.key, self.token);
        }
    }
}
