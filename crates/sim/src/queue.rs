//! The `queue` model: a queue of J jobs drained by P worker processes (one by default) with W
//! job slots each, each job one payment call to a PSP that has a bad day. Each process has its
//! own claim loop and its own [`FlowClient`](redrive_policy::FlowClient), on the one shared
//! row, and its clock may be off the true time (`clock_skew`). It predicts a whole run of `redrive demo`
//! (`redrive simulate --model capacity --scenario demo`).
//!
//! Why a queue, not the `capacity` model's herd: what a fleet does to a PSP over a run depends
//! on how jobs reach the workers. Jobs are claimed in batches up to the free slots, an idle
//! claim loop polls (no sooner than the next job is due, no later than `poll`), the claim skips
//! the jobs of a dependency that is paused, open, or half-open with no probe left (as the
//! store's claim query does), and deferred jobs come back at their `run_at`.
//!
//! Each job runs as the runtime's executor runs it, through the same code (R23): the flow
//! protocol of the `fleet` module ([`FlowClient`](redrive_policy::FlowClient) and the shared
//! [`FlowRow`](redrive_policy::FlowRow): breaker, pause, rate limit), the answer classified by
//! the policy's [`StatusTable`](redrive_policy::StatusTable), [`RetryPolicy::decide`] for what
//! follows, and [`RetryPolicy::decide_blocked`] for a job the row holds back.
//!
//! The PSP ([`PspModel`]) mirrors the PSP simulator's fault engine, in its order: an outage
//! answers 503; a token bucket holding `max(1, rate)` tokens, full at the start, answers 429
//! beyond it (with `Retry-After`); a share of the rest is answered 500, 502 or 503; the rest
//! is charged, or replayed from the idempotency layer when the key was charged before; a share
//! of the new charges have their answer held back past the client's timeout. Every request is
//! counted when it arrives, by the status decided then.
//!
//! Assumptions the model makes (fields of [`QueueConfig`]): a fixed one-way delay between the
//! worker and the PSP (`net`), a fixed time per store call (`store`: a claim, or an attempt's
//! write before any wait), and a row read and written with no delay.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use redrive_policy::{
    Action, BreakerState, FlowConfig, JobCounters, Outcome, RetryPolicy, retry_after_clamped,
};

use crate::error::SimError;
use crate::fleet::{Fleet, Gate, ns_of, ts};
use crate::net::{Queue, ns};
use crate::plot::LoadChart;

/// The most jobs one run may simulate.
pub const MAX_JOBS: u32 = 1_000_000;
/// The most worker slots.
pub const MAX_WORKERS: u32 = 10_000;
/// The `http` job kind's clamp on a `Retry-After` it reads.
const HTTP_RETRY_AFTER_MAX: Duration = Duration::from_secs(3600);
/// Width of a timeline bucket.
const BUCKET_NS: u64 = 100_000_000;
/// The PSP simulator's timeout stream is its seed's own (turning lost answers on does not
/// change which requests get errors).
const TIMEOUT_STREAM: u64 = 0x9E37_79B9_7F4A_7C15;

/// A window during which the PSP answers 503 to everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PspOutage {
    /// When it starts, from the start of the run.
    pub start: Duration,
    /// How long it lasts.
    pub length: Duration,
}

impl PspOutage {
    fn contains(&self, t_ns: u64) -> bool {
        let s = ns(self.start);
        t_ns >= s && t_ns < s.saturating_add(ns(self.length))
    }
}

/// The PSP of the `queue` model: the PSP simulator's faults.
///
/// # Default
/// A healthy PSP: no rate limit, no errors, no outage, no latency, no lost answers (held back
/// 30 s when one is lost).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PspModel {
    /// Requests per second allowed (a token bucket holding `max(1, rate)` tokens, full at the
    /// start); beyond it, 429. `None`: no limit.
    pub rate_limit: Option<f64>,
    /// `Retry-After` sent with every 429 (whole seconds). `None`: no header.
    pub retry_after: Option<Duration>,
    /// Share of the requests past the rate limit answered 500, 502 or 503 (no charge made).
    pub error_rate: f64,
    /// Every request in this window gets 503.
    pub outage: Option<PspOutage>,
    /// `Retry-After` sent with the outage's 503s. `None`: no header.
    pub outage_retry_after: Option<Duration>,
    /// Added to every answer.
    pub latency: Duration,
    /// Share of the charges made whose answer is held back for `hold_back`.
    pub lost_answers: f64,
    /// How long a lost answer is held back.
    pub hold_back: Duration,
}

impl Default for PspModel {
    fn default() -> Self {
        Self {
            rate_limit: None,
            retry_after: None,
            error_rate: 0.0,
            outage: None,
            outage_retry_after: None,
            latency: Duration::ZERO,
            lost_answers: 0.0,
            hold_back: Duration::from_secs(30),
        }
    }
}

/// Parameters of the `queue` model.
///
/// # Default (of [`QueueConfig::new`])
/// 2,000 jobs, one process with 16 slots and a true clock, the `http` kind's 10 s call timeout, the runtime's defaults (poll
/// 250 ms, claims of up to 200 jobs, a 2 ms linger, housekeeping every 100 ms), 0.5 ms each
/// way between worker and PSP, 1 ms per store call, and a 1 h horizon.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// Jobs in the queue at the start, all due.
    pub jobs: u32,
    /// Jobs run at once by each worker process (its concurrency).
    pub workers: u32,
    /// Worker processes draining the queue, each with its own claim loop and flow client.
    pub processes: u32,
    /// The processes' clocks are off the true time by offsets spread evenly over
    /// `-clock_skew..=+clock_skew`.
    pub clock_skew: Duration,
    /// The jobs' retry policy.
    pub policy: RetryPolicy,
    /// The dependency's flow control.
    pub flow: FlowConfig,
    /// The PSP.
    pub psp: PspModel,
    /// The client's timeout per call.
    pub call_timeout: Duration,
    /// How often an idle claim loop looks for work.
    pub poll: Duration,
    /// Jobs claimed per store call at most.
    pub claim_batch: u32,
    /// How long a busy claim loop waits for a quarter of its slots to free up.
    pub claim_linger: Duration,
    /// How often the housekeeping event ([`redrive_policy::FlowEvent::Tick`]) runs.
    pub tick: Duration,
    /// One-way delay between the worker and the PSP (the HTTP client's and server's own time
    /// included).
    pub net: Duration,
    /// Time per store call: a claim, or an attempt's write.
    pub store: Duration,
    /// Simulated time after which the run stops.
    pub horizon: Duration,
}

impl QueueConfig {
    /// The defaults, with this policy, flow control and PSP.
    pub fn new(policy: RetryPolicy, flow: FlowConfig, psp: PspModel) -> Self {
        Self {
            jobs: 2000,
            workers: 16,
            processes: 1,
            clock_skew: Duration::ZERO,
            policy,
            flow,
            psp,
            call_timeout: Duration::from_secs(10),
            poll: Duration::from_millis(250),
            claim_batch: 200,
            claim_linger: Duration::from_millis(2),
            tick: Duration::from_millis(100),
            net: Duration::from_micros(500),
            store: Duration::from_millis(1),
            horizon: Duration::from_secs(3600),
        }
    }

    /// Checks the parameters.
    ///
    /// # Errors
    /// [`SimError::InvalidConfig`] naming the parameter.
    pub fn validate(&self) -> Result<(), SimError> {
        if !(1..=MAX_JOBS).contains(&self.jobs) {
            return Err(SimError::config(
                "jobs",
                self.jobs,
                format!("from 1 to {MAX_JOBS}"),
            ));
        }
        if !(1..=MAX_WORKERS).contains(&self.workers) {
            return Err(SimError::config(
                "workers",
                self.workers,
                format!("from 1 to {MAX_WORKERS}"),
            ));
        }
        if !(1..=1000).contains(&self.processes) {
            return Err(SimError::config(
                "processes",
                self.processes,
                "from 1 to 1000",
            ));
        }
        crate::capacity::check_skew(self.clock_skew)?;
        if self.claim_batch == 0 {
            return Err(SimError::config("claim batch", 0, "at least 1"));
        }
        let share = |x: f64| x.is_finite() && (0.0..=1.0).contains(&x);
        if !share(self.psp.error_rate) {
            return Err(SimError::config(
                "error rate",
                self.psp.error_rate,
                "a share between 0 and 1",
            ));
        }
        if !share(self.psp.lost_answers) {
            return Err(SimError::config(
                "lost answers",
                self.psp.lost_answers,
                "a share between 0 and 1",
            ));
        }
        if let Some(r) = self.psp.rate_limit
            && !(r.is_finite() && r > 0.0 && r <= 1e7)
        {
            return Err(SimError::config(
                "rate limit",
                r,
                "requests per second above 0 and at most 10000000",
            ));
        }
        let ms = |d: Duration| redrive_policy::format_duration(d);
        if self.call_timeout.is_zero() {
            return Err(SimError::config(
                "call timeout",
                ms(self.call_timeout),
                "above 0s",
            ));
        }
        if self.poll.is_zero() || self.tick.is_zero() {
            return Err(SimError::config(
                "poll",
                ms(self.poll.min(self.tick)),
                "above 0s",
            ));
        }
        if self.horizon.is_zero() || self.horizon > Duration::from_secs(7 * 24 * 3600) {
            return Err(SimError::config(
                "horizon",
                ms(self.horizon),
                "above 0s and at most 7 days",
            ));
        }
        // `self.policy` and `self.flow` are valid by construction (neither can hold an
        // invalid value).
        Ok(())
    }
}

/// The PSP's load over a run, as `redrive demo --json` reports it (`psp_load`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct PspLoad {
    /// The PSP's rate limit, requests per second.
    pub limit_rps: f64,
    /// The most requests in one 100 ms after the first 10 s, over what the limit allows in
    /// 100 ms (`limit / 10`).
    pub peak_ratio: f64,
    /// Requests answered 429, over all requests.
    pub share_429: f64,
    /// The shortest run the PSP allows: the outage, plus the requests that neither got a 429
    /// nor fell in the outage at the limit's rate.
    pub minimum_seconds: f64,
    /// The run's time over that minimum.
    pub vs_minimum: f64,
    /// From the outage's end to the first request answered 2xx (`None`: no outage, or none
    /// answered 2xx after it).
    pub back_after_outage_s: Option<f64>,
    /// The most requests in any one second (a sliding window of ten 100 ms slices) after the
    /// first 5 s, over the limit: the fleet benchmark's `peak_1s`.
    pub peak_1s: f64,
    /// From the outage's end to the end of the first whole second (ten 100 ms slices) in
    /// which the PSP admitted (answered other than 429) at least 80% of its limit: the fleet
    /// benchmark's `back_80` (`None`: no outage, or never).
    pub back_80_s: Option<f64>,
}

/// A change of the breaker's state during a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BreakerChange {
    /// Seconds from the start.
    pub t_s: f64,
    /// The state before.
    pub from: String,
    /// The state after.
    pub to: String,
    /// Why.
    pub reason: String,
}

/// What one seeded run of the `queue` model did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct QueueRun {
    /// The run's seed.
    pub seed: u64,
    /// When the last job ended (succeeded or dead), in seconds; the horizon when some never did.
    pub seconds: f64,
    /// Whether every job ended before the horizon.
    pub finished: bool,
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Dead jobs by reason.
    pub dead_by_reason: BTreeMap<String, u64>,
    /// Attempts by failure class.
    pub attempts_by_class: BTreeMap<String, u64>,
    /// Retries slept in process.
    pub retries_in_process: u64,
    /// Attempts followed by a defer (back to the queue).
    pub defers: u64,
    /// Calls not made because the row held them back (deferred, not attempts).
    pub blocked: u64,
    /// Calls made as half-open probes.
    pub probes: u64,
    /// Calls that left a worker while the row said open (a send slot waited for in process
    /// across an opening).
    pub calls_while_open: u64,
    /// Requests that reached the PSP.
    pub requests_total: u64,
    /// Requests by the status the PSP decided.
    pub requests_by_status: BTreeMap<u16, u64>,
    /// Charges made (one per key).
    pub charges: u64,
    /// Repeats answered by the idempotency layer's replay.
    pub replays: u64,
    /// The most requests in one 100 ms.
    pub peak_per_100ms: u32,
    /// Every change of the breaker's state.
    pub breaker_transitions: Vec<BreakerChange>,
    /// Requests per 100 ms answered 2xx.
    pub ok: Vec<u32>,
    /// Requests per 100 ms answered 429.
    pub limited: Vec<u32>,
    /// Requests per 100 ms answered 5xx.
    pub failed: Vec<u32>,
    /// The PSP's load, when it has a rate limit.
    pub psp_load: Option<PspLoad>,
}

impl QueueRun {
    /// Requests per 100 ms.
    pub fn requests_per_bucket(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.ok.len()).map(|i| self.ok[i] + self.limited[i] + self.failed[i])
    }

    /// Share of the requests answered 429.
    pub fn share_429(&self) -> f64 {
        let n429 = self.requests_by_status.get(&429).copied().unwrap_or(0);
        n429 as f64 / self.requests_total.max(1) as f64
    }

    /// The chart of the PSP's load (as `redrive demo` draws it), with the open-breaker windows
    /// and the PSP's rate limit (requests per second), if any, as a line.
    pub fn load_chart(
        &self,
        title: String,
        outage: Option<PspOutage>,
        limit_rps: Option<f64>,
    ) -> LoadChart {
        let mut open = Vec::new();
        for (i, t) in self.breaker_transitions.iter().enumerate() {
            if t.to == "open" {
                let end = self
                    .breaker_transitions
                    .get(i + 1)
                    .map_or(self.seconds, |n| n.t_s);
                open.push((t.t_s, end));
            }
        }
        LoadChart {
            title,
            ok: self.ok.iter().map(|&n| u64::from(n)).collect(),
            limited: self.limited.iter().map(|&n| u64::from(n)).collect(),
            failed: self.failed.iter().map(|&n| u64::from(n)).collect(),
            outage: outage.map(|o| (o.start.as_secs_f64(), (o.start + o.length).as_secs_f64())),
            open,
            limit: limit_rps.map(|r| r / 10.0),
        }
    }
}

// ===== the PSP =====

/// What the PSP answered one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    status: u16,
    retry_after: Option<Duration>,
    held_back: bool,
}

#[derive(Debug)]
struct Psp {
    m: PspModel,
    tokens: f64,
    refilled_at: u64,
    errors: SmallRng,
    timeouts: SmallRng,
}

impl Psp {
    fn new(m: PspModel, seed: u64) -> Self {
        let tokens = m.rate_limit.map_or(0.0, |r| r.max(1.0));
        Self {
            m,
            tokens,
            refilled_at: 0,
            errors: SmallRng::seed_from_u64(seed),
            timeouts: SmallRng::seed_from_u64(seed ^ TIMEOUT_STREAM),
        }
    }

    /// Outage, rate limit, error rate, then the charge (or its replay) for a request arriving
    /// at `t`; `charged` is the key's entry in the ledger.
    fn answer(&mut self, t: u64, charged: &mut bool) -> (Answer, bool) {
        let fault = |status, retry_after| Answer {
            status,
            retry_after,
            held_back: false,
        };
        if self.m.outage.is_some_and(|o| o.contains(t)) {
            return (fault(503, self.m.outage_retry_after), false);
        }
        if let Some(rate) = self.m.rate_limit {
            let dt = t.saturating_sub(self.refilled_at) as f64 / 1e9;
            self.tokens = (self.tokens + dt * rate).min(rate.max(1.0));
            self.refilled_at = self.refilled_at.max(t);
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
            } else {
                return (fault(429, self.m.retry_after), false);
            }
        }
        if self.m.error_rate > 0.0 && self.errors.random::<f64>() < self.m.error_rate {
            let status = [500, 502, 503][self.errors.random_range(0..3usize)];
            return (fault(status, None), false);
        }
        if *charged {
            return (fault(201, None), true); // the idempotency layer's replay
        }
        *charged = true;
        let lost = self.m.lost_answers > 0.0 && self.timeouts.random::<f64>() < self.m.lost_answers;
        (
            Answer {
                status: 201,
                retry_after: None,
                held_back: lost,
            },
            false,
        )
    }
}

// ===== the run =====

const LOOP: u8 = 0;
const START: u8 = 1;
const ARRIVE: u8 = 2;
const ANSWER: u8 = 3;
const RETRY: u8 = 4;
const END: u8 = 5;
const TICK: u8 = 6;
const SEND: u8 = 7;
/// `ANSWER`'s payload for a call the client gave up on (its timeout).
const TIMED_OUT: u64 = 0;

/// How a claim ended, applied when its write is done.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fin {
    Succeeded,
    Dead(redrive_policy::DeadReason),
    Deferred(u64),
}

#[derive(Debug, Clone, Default)]
struct Job {
    counters: JobCounters,
    charged: bool,
    probe: bool,
    /// The process that claimed it.
    proc: u32,
    sent_ns: u64,
    /// Waiting in process for the reservation horizon since then.
    waited_since: Option<u64>,
    fin: Option<Fin>,
}

/// Where the claim loop is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoopState {
    /// A `LOOP` event is on its way.
    Scheduled,
    /// Every slot is taken: the next job to end resumes it.
    WaitPermit,
    /// Busy, waiting briefly for a quarter of the slots.
    Linger,
    /// Nothing claimable: until the next poll, a job ending, or a wake-up.
    Idle,
}

struct Sim<'a> {
    cfg: &'a QueueConfig,
    rng: SmallRng,
    q: Queue,
    fleet: Fleet,
    psp: Psp,
    jobs: Vec<Job>,
    /// Jobs waiting in the queue: `(run_at, id)`.
    pending: BTreeSet<(u64, u32)>,
    /// Per process: jobs running, where its claim loop is, and its loop's generation.
    running: Vec<u32>,
    loop_state: Vec<LoopState>,
    loop_gen: Vec<u64>,
    ended: u32,
    seen_transitions: usize,
    out: QueueRun,
    /// Requests that arrived during the outage.
    in_outage: u64,
    /// The first request answered 2xx after the outage.
    back_at: Option<u64>,
}

/// One seeded run of the `queue` model.
///
/// # Errors
/// [`SimError::InvalidConfig`] for a parameter out of range.
pub fn run_queue(cfg: &QueueConfig, seed: u64) -> Result<QueueRun, SimError> {
    cfg.validate()?;
    let mut sim = Sim {
        cfg,
        rng: SmallRng::seed_from_u64(seed),
        q: Queue::with_capacity((cfg.workers * cfg.processes) as usize * 4),
        fleet: Fleet::new(cfg.flow.clone(), cfg.processes, seed, false)
            .with_clock_skew(cfg.clock_skew),
        psp: Psp::new(cfg.psp.clone(), seed),
        jobs: vec![Job::default(); cfg.jobs as usize],
        pending: (0..cfg.jobs).map(|i| (0, i)).collect(),
        running: vec![0; cfg.processes as usize],
        loop_state: vec![LoopState::Scheduled; cfg.processes as usize],
        loop_gen: vec![0; cfg.processes as usize],
        ended: 0,
        seen_transitions: 0,
        out: QueueRun {
            seed,
            ..QueueRun::default()
        },
        in_outage: 0,
        back_at: None,
    };
    for p in 0..cfg.processes {
        sim.q.push(0, p, LOOP, 0);
    }
    sim.q.push(ns(cfg.tick), 0, TICK, 0);
    let horizon = ns(cfg.horizon);
    let mut last = 0;
    while let Some((t, id, kind, payload)) = sim.q.pop() {
        if t > horizon {
            break;
        }
        last = t;
        match kind {
            LOOP if payload == sim.loop_gen[id as usize] => sim.claim_loop(id, t, false),
            // A linger that ran out claims what it has.
            LOOP if payload == sim.loop_gen[id as usize] + (1 << 63) => {
                sim.claim_loop(id, t, true);
            }
            LOOP => {}
            START | RETRY => sim.attempt(id, t),
            SEND => sim.send(id, t),
            ARRIVE => sim.arrive(id, t),
            ANSWER => sim.answered(id, t, payload),
            END => sim.end(id, t),
            _ => {
                sim.fleet.tick(t, &mut sim.rng);
                sim.woken(t);
                sim.q.push(t + ns(cfg.tick), 0, TICK, 0);
            }
        }
        if sim.ended == cfg.jobs {
            break;
        }
    }
    sim.out.finished = sim.ended == cfg.jobs;
    sim.out.seconds = if sim.out.finished {
        last as f64 / 1e9
    } else {
        cfg.horizon.as_secs_f64()
    };
    sim.finish();
    Ok(sim.out)
}

impl Sim<'_> {
    fn push_loop(&mut self, p: u32, t: u64, linger_over: bool) {
        let pi = p as usize;
        self.loop_gen[pi] += 1;
        self.loop_state[pi] = if linger_over {
            LoopState::Linger
        } else {
            LoopState::Scheduled
        };
        let tag = if linger_over {
            self.loop_gen[pi] + (1 << 63)
        } else {
            self.loop_gen[pi]
        };
        self.q.push(t, p, LOOP, tag);
    }

    /// One pass of the worker's claim loop (`run_inner`): take the free slots, linger briefly
    /// when few are free and others are busy, claim, or wait for the next due job.
    fn claim_loop(&mut self, p: u32, t: u64, lingered: bool) {
        let cfg = self.cfg;
        let pi = p as usize;
        let free = cfg.workers - self.running[pi];
        if free == 0 {
            self.loop_state[pi] = LoopState::WaitPermit;
            return;
        }
        let enough = (cfg.claim_batch.min(cfg.workers) / 4).max(1);
        if !lingered && free < enough && self.running[pi] > 0 && !cfg.claim_linger.is_zero() {
            self.push_loop(p, t + ns(cfg.claim_linger), true);
            return;
        }
        let want = free.min(cfg.claim_batch);
        let claimed = self.claim(want, t);
        let done = t + ns(cfg.store);
        if claimed.is_empty() {
            let due = self
                .pending
                .first()
                .map_or(u64::MAX, |&(run_at, _)| self.fleet.next_due(run_at));
            let wait = due.saturating_sub(done).clamp(1_000_000, ns(cfg.poll));
            self.push_loop(p, done + wait, false);
            self.loop_state[pi] = LoopState::Idle;
            return;
        }
        for id in claimed {
            self.running[pi] += 1;
            self.jobs[id as usize].proc = p;
            self.q.push(done, id, START, 0);
        }
        self.push_loop(p, done, false);
    }

    /// The store's claim: due jobs in `run_at` order, none while the dependency is blocked.
    fn claim(&mut self, n: u32, t: u64) -> Vec<u32> {
        if !self.fleet.claimable(t) {
            return Vec::new();
        }
        let mut out = Vec::new();
        while out.len() < n as usize {
            match self.pending.first().copied() {
                Some((run_at, id)) if run_at <= t => {
                    self.pending.remove(&(run_at, id));
                    out.push(id);
                }
                _ => break,
            }
        }
        out
    }

    /// The row's breaker went half-open or closed: the store wakes idle claim loops.
    fn woken(&mut self, t: u64) {
        let ts_all = self.fleet.transitions();
        let new = &ts_all[self.seen_transitions..];
        let wake = new.iter().any(|tr| tr.to != BreakerState::Open);
        self.seen_transitions = ts_all.len();
        if wake {
            for p in 0..self.cfg.processes {
                if self.loop_state[p as usize] == LoopState::Idle {
                    self.push_loop(p, t, false);
                }
            }
        }
    }

    /// Before a call: the flow protocol; a call now or at a send slot, or a deferral.
    fn attempt(&mut self, id: u32, t: u64) {
        let policy = &self.cfg.policy;
        let job = &self.jobs[id as usize];
        let retry = job.counters.attempts > 0;
        let waited_since = job.waited_since;
        let gate = self.fleet.before_call(
            job.proc as usize,
            retry,
            policy.retry().in_process_max_wait(),
            waited_since,
            t,
            &mut self.rng,
        );
        self.woken(t);
        let job = &mut self.jobs[id as usize];
        job.waited_since = match gate {
            Gate::Wait { .. } => Some(waited_since.unwrap_or(t)),
            _ => None,
        };
        match gate {
            Gate::Wait { at_ns } => self.q.push(at_ns, id, RETRY, 0),
            Gate::Blocked { until, reason } => {
                self.out.blocked += 1;
                let counters = self.jobs[id as usize].counters;
                let action = policy.decide_blocked(&counters, until, reason, ts(t), &mut self.rng);
                self.conclude(id, t, action);
            }
            Gate::Call { at_ns, probe } => {
                let job = &mut self.jobs[id as usize];
                job.probe = probe;
                job.sent_ns = at_ns;
                // A send slot later than now is waited for in process.
                self.q.push(at_ns, id, SEND, 0);
            }
        }
    }

    /// The call leaves the worker.
    fn send(&mut self, id: u32, t: u64) {
        let job = &self.jobs[id as usize];
        if !job.probe
            && let Some((until, reason)) = self.fleet.at_slot(job.proc as usize, t)
        {
            // The runtime looks at the row again before a call at a send slot.
            self.out.blocked += 1;
            let counters = job.counters;
            let now = ts(t);
            let action =
                (self.cfg.policy).decide_blocked(&counters, until, reason, now, &mut self.rng);
            self.conclude(id, t, action);
            return;
        }
        if self.jobs[id as usize].probe {
            self.out.probes += 1;
        } else if self.fleet.row().state == BreakerState::Open {
            self.out.calls_while_open += 1;
        }
        self.q.push(t + ns(self.cfg.net), id, ARRIVE, 0);
    }

    /// The request reaches the PSP.
    fn arrive(&mut self, id: u32, t: u64) {
        let job = &mut self.jobs[id as usize];
        let (a, replay) = self.psp.answer(t, &mut job.charged);
        let sent = job.sent_ns;
        if a.status == 201 {
            if replay {
                self.out.replays += 1;
            } else {
                self.out.charges += 1;
            }
        }
        self.count(t, a.status);
        if let Some(o) = self.cfg.psp.outage {
            if o.contains(t) {
                self.in_outage += 1;
            } else if t >= ns(o.start + o.length)
                && self.back_at.is_none()
                && (200..300).contains(&a.status)
            {
                self.back_at = Some(t);
            }
        }
        let mut back = t + ns(self.cfg.psp.latency) + ns(self.cfg.net);
        if a.held_back {
            back += ns(self.cfg.psp.hold_back);
        }
        let deadline = sent + ns(self.cfg.call_timeout);
        if back > deadline {
            self.q.push(deadline, id, ANSWER, TIMED_OUT);
        } else {
            let ra = a
                .retry_after
                .map_or(0, |d| d.as_secs().min(u32::MAX.into()) + 1);
            self.q
                .push(back, id, ANSWER, u64::from(a.status) | (ra << 16));
        }
    }

    fn count(&mut self, t: u64, status: u16) {
        self.out.requests_total += 1;
        *self.out.requests_by_status.entry(status).or_insert(0) += 1;
        let b = (t / BUCKET_NS) as usize;
        if b >= self.out.ok.len() {
            self.out.ok.resize(b + 1, 0);
            self.out.limited.resize(b + 1, 0);
            self.out.failed.resize(b + 1, 0);
        }
        match status {
            200..=299 => self.out.ok[b] += 1,
            429 => self.out.limited[b] += 1,
            _ => self.out.failed[b] += 1,
        }
    }

    /// The answer (or the client's timeout): report to the row, then the decision table.
    fn answered(&mut self, id: u32, t: u64, payload: u64) {
        let policy = &self.cfg.policy;
        let now = ts(t);
        let outcome = if payload == TIMED_OUT {
            Outcome::Timeout { idempotent: true }
        } else {
            let status = (payload & 0xffff) as u16;
            let ra = (payload >> 16)
                .checked_sub(1)
                .and_then(|s| retry_after_clamped(&s.to_string(), now, HTTP_RETRY_AFTER_MAX));
            policy.status().outcome(status, ra)
        };
        let class = outcome.class();
        *self
            .out
            .attempts_by_class
            .entry(class.as_str().to_owned())
            .or_insert(0) += 1;
        let job = &self.jobs[id as usize];
        let took = Duration::from_nanos(t.saturating_sub(job.sent_ns));
        // R19: the server's wait, as an instant, pauses the fleet (through the report).
        let pause_until = match outcome {
            Outcome::RateLimited { retry_after } => {
                retry_after.map(|d| ts(t + ns(d.min(policy.retry().retry_after_max()))))
            }
            _ => None,
        };
        let (probe, p) = (job.probe, job.proc as usize);
        self.fleet
            .after_call(p, probe, class, took, pause_until, t, &mut self.rng);
        self.woken(t);
        let counters = self.jobs[id as usize].counters;
        let verdict = policy.decide(&counters, &outcome, now, &mut self.rng);
        let mut action = verdict.action;
        // A wait in process that would end while the row still blocks calls: defer instead.
        if let Action::RetryInProcess { delay, .. } = action
            && let Some((until, reason)) = self.fleet.blocked_until(t)
            && ns_of(until) > t + ns(delay)
        {
            action = policy.decide_blocked(&verdict.counters, until, reason, now, &mut self.rng);
        }
        self.jobs[id as usize].counters = verdict.counters;
        match action {
            Action::RetryInProcess { delay, .. } => {
                self.out.retries_in_process += 1;
                self.q
                    .push(t + ns(self.cfg.store) + ns(delay), id, RETRY, 0);
            }
            Action::RefreshCredentials => self.q.push(t + ns(self.cfg.store), id, RETRY, 0),
            Action::Defer { .. } => {
                self.out.defers += 1;
                self.conclude(id, t, action);
            }
            _ => self.conclude(id, t, action),
        }
    }

    /// The claim ends with this action once its write is done.
    fn conclude(&mut self, id: u32, t: u64, action: Action) {
        let fin = match action {
            Action::Done => Fin::Succeeded,
            Action::Dead { reason } => Fin::Dead(reason),
            Action::Defer { until, .. } => Fin::Deferred(ns_of(until)),
            // Not an end: `answered` handles these.
            Action::RetryInProcess { .. } | Action::RefreshCredentials => return,
        };
        self.jobs[id as usize].fin = Some(fin);
        self.q.push(t + ns(self.cfg.store), id, END, 0);
    }

    /// The write is done: the job's new state is visible, and its slot is free.
    fn end(&mut self, id: u32, t: u64) {
        match self.jobs[id as usize].fin.take() {
            Some(Fin::Succeeded) => {
                self.out.succeeded += 1;
                self.ended += 1;
            }
            Some(Fin::Dead(reason)) => {
                *self
                    .out
                    .dead_by_reason
                    .entry(reason.as_str().to_owned())
                    .or_insert(0) += 1;
                self.ended += 1;
            }
            Some(Fin::Deferred(run_at)) => {
                self.pending.insert((run_at, id));
            }
            None => {}
        }
        let p = self.jobs[id as usize].proc;
        let pi = p as usize;
        self.running[pi] -= 1;
        match self.loop_state[pi] {
            LoopState::WaitPermit | LoopState::Idle => self.push_loop(p, t, false),
            LoopState::Linger => {
                let enough = (self.cfg.claim_batch.min(self.cfg.workers) / 4).max(1);
                if self.cfg.workers - self.running[pi] >= enough {
                    self.push_loop(p, t, true);
                }
            }
            LoopState::Scheduled => {}
        }
    }

    /// The breaker's history and the PSP's load figures.
    fn finish(&mut self) {
        for tr in self.fleet.transitions() {
            self.out.breaker_transitions.push(BreakerChange {
                t_s: ns_of(tr.at) as f64 / 1e9,
                from: tr.from.as_str().to_owned(),
                to: tr.to.as_str().to_owned(),
                reason: tr.reason.to_string(),
            });
        }
        self.out.peak_per_100ms = self.out.requests_per_bucket().max().unwrap_or(0);
        let psp = &self.cfg.psp;
        let Some(limit) = psp.rate_limit else {
            return;
        };
        let first_buckets = 100; // the first 10 s
        let peak_late = self
            .out
            .requests_per_bucket()
            .skip(first_buckets)
            .max()
            .unwrap_or(0);
        let n429 = self.out.requests_by_status.get(&429).copied().unwrap_or(0);
        let (outage_s, back) = match psp.outage {
            None => (0.0, None),
            Some(o) => {
                let end = ns(o.start + o.length);
                let back = self.back_at.map(|t| (t - end) as f64 / 1e9);
                (o.length.as_secs_f64(), back)
            }
        };
        // Requests, and those the PSP admitted (not 429), per 100 ms slice.
        let all: Vec<u32> = self.out.requests_per_bucket().collect();
        let admitted: Vec<u32> = (0..self.out.ok.len())
            .map(|i| self.out.ok[i] + self.out.failed[i])
            .collect();
        let second = |v: &[u32], i: usize| -> f64 {
            f64::from(v[i..(i + 10).min(v.len())].iter().sum::<u32>())
        };
        let peak_1s = (50..all.len()).map(|i| second(&all, i)).fold(0.0, f64::max) / limit;
        let back_80_s = psp.outage.and_then(|o| {
            let end = (o.start + o.length).as_secs_f64();
            let first = (end * 10.0) as usize;
            (first..admitted.len())
                .find(|&i| second(&admitted, i) >= 0.8 * limit)
                .map(|i| (i + 10) as f64 / 10.0 - end)
        });
        let useful = self
            .out
            .requests_total
            .saturating_sub(n429 + self.in_outage);
        let minimum = outage_s + useful as f64 / limit;
        self.out.psp_load = Some(PspLoad {
            limit_rps: limit,
            peak_ratio: f64::from(peak_late) / (limit / 10.0),
            share_429: self.out.share_429(),
            minimum_seconds: minimum,
            vs_minimum: self.out.seconds / minimum.max(1e-9),
            back_after_outage_s: back,
            peak_1s,
            back_80_s,
        });
    }
}

/// `runs` seeded runs (seeds `seed`, `seed + 1`, …) on every core, in seed order.
/// `progress` is called with the number of runs just finished.
///
/// # Errors
/// [`SimError::InvalidConfig`] for a parameter out of range, or zero runs.
pub fn run_queue_many(
    cfg: &QueueConfig,
    runs: u32,
    seed: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<QueueRun>, SimError> {
    if runs == 0 {
        return Err(SimError::config("runs", 0, "at least 1"));
    }
    cfg.validate()?;
    let slots: Vec<Mutex<Option<QueueRun>>> = (0..runs).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<SimError>> = Mutex::new(None);
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(runs as usize);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let r = next.fetch_add(1, Ordering::Relaxed);
                    if r >= runs as usize {
                        break;
                    }
                    match run_queue(cfg, seed.wrapping_add(r as u64)) {
                        Ok(run) => {
                            *slots[r].lock().unwrap_or_else(|p| p.into_inner()) = Some(run);
                            progress(1);
                        }
                        Err(e) => {
                            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            next.store(runs as usize, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(slots
        .into_iter()
        .filter_map(|s| s.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect())
}

/// Status classes of a run, for the table: 2xx, 429, 5xx, others.
fn by_class(r: &QueueRun) -> [u64; 4] {
    let mut out = [0; 4];
    for (&s, &n) in &r.requests_by_status {
        let i = match s {
            200..=299 => 0,
            429 => 1,
            500..=599 => 2,
            _ => 3,
        };
        out[i] += n;
    }
    out
}

/// The runs as a table: one row per seed, then the mean.
pub fn render_queue(title: &str, runs: &[QueueRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{title}");
    let header = [
        "seed",
        "time",
        "requests",
        "2xx",
        "429",
        "5xx",
        "peak/100ms",
        "share 429",
        "peak ratio",
        "minimum",
        "vs minimum",
        "back after outage",
        "succeeded",
        "dead",
        "breaker changes",
    ];
    let f2 = |x: f64| format!("{x:.2}");
    let row = |label: String, r: &QueueRun| -> Vec<String> {
        let c = by_class(r);
        let load = r.psp_load.unwrap_or_default();
        vec![
            label,
            format!("{:.1}s", r.seconds),
            r.requests_total.to_string(),
            c[0].to_string(),
            c[1].to_string(),
            c[2].to_string(),
            r.peak_per_100ms.to_string(),
            format!("{:.1}%", r.share_429() * 100.0),
            f2(load.peak_ratio),
            format!("{:.1}s", load.minimum_seconds),
            f2(load.vs_minimum),
            load.back_after_outage_s
                .map_or("-".into(), |b| format!("{b:.2}s")),
            r.succeeded.to_string(),
            r.dead_by_reason.values().sum::<u64>().to_string(),
            r.breaker_transitions.len().to_string(),
        ]
    };
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for r in runs {
        rows.push(row(r.seed.to_string(), r));
    }
    if runs.len() > 1 {
        rows.push(mean_row(runs));
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{s:>w$}", w = widths[i]))
            .collect();
        let _ = writeln!(out, "  {}", line.join("  "));
    }
    out
}

fn mean_row(runs: &[QueueRun]) -> Vec<String> {
    let m = QueueSummary::of(runs);
    let load = m.psp_load.unwrap_or_default();
    let status = |f: &dyn Fn(u16) -> bool| -> f64 {
        m.requests_by_status
            .iter()
            .filter(|(s, _)| f(**s))
            .map(|(_, n)| n)
            .sum()
    };
    vec![
        "mean".into(),
        format!("{:.1}s", m.seconds),
        format!("{:.0}", m.requests_total),
        format!("{:.0}", status(&|s| (200..300).contains(&s))),
        format!("{:.0}", status(&|s| s == 429)),
        format!("{:.0}", status(&|s| (500..600).contains(&s))),
        format!("{:.1}", m.peak_per_100ms),
        format!("{:.1}%", m.share_429 * 100.0),
        format!("{:.2}", load.peak_ratio),
        format!("{:.1}s", load.minimum_seconds),
        format!("{:.2}", load.vs_minimum),
        load.back_after_outage_s
            .map_or("-".into(), |b| format!("{b:.2}s")),
        format!("{:.0}", m.succeeded),
        format!("{:.1}", m.dead),
        format!("{:.1}", m.breaker_transitions),
    ]
}

/// The mean of several runs of the `queue` model.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct QueueSummary {
    /// Runs averaged.
    pub runs: u32,
    /// Completion time, seconds.
    pub seconds: f64,
    /// Requests that reached the PSP.
    pub requests_total: f64,
    /// Requests by status.
    pub requests_by_status: BTreeMap<u16, f64>,
    /// The most requests in one 100 ms.
    pub peak_per_100ms: f64,
    /// Share of the requests answered 429.
    pub share_429: f64,
    /// Jobs that succeeded.
    pub succeeded: f64,
    /// Jobs that died.
    pub dead: f64,
    /// Changes of the breaker's state.
    pub breaker_transitions: f64,
    /// Each `psp_load` figure's mean (`back_after_outage_s` over the runs that have one).
    pub psp_load: Option<PspLoad>,
}

impl QueueSummary {
    /// The mean of `runs`.
    pub fn of(runs: &[QueueRun]) -> Self {
        let k = runs.len().max(1) as f64;
        let mean = |f: &dyn Fn(&QueueRun) -> f64| runs.iter().map(f).sum::<f64>() / k;
        let mut by_status = BTreeMap::new();
        for r in runs {
            for (&s, &n) in &r.requests_by_status {
                *by_status.entry(s).or_insert(0.0) += n as f64 / k;
            }
        }
        let loads: Vec<PspLoad> = runs.iter().filter_map(|r| r.psp_load).collect();
        let psp_load = (!loads.is_empty()).then(|| {
            let n = loads.len() as f64;
            let avg = |f: &dyn Fn(&PspLoad) -> f64| loads.iter().map(f).sum::<f64>() / n;
            let backs: Vec<f64> = loads.iter().filter_map(|l| l.back_after_outage_s).collect();
            PspLoad {
                limit_rps: avg(&|l| l.limit_rps),
                peak_ratio: avg(&|l| l.peak_ratio),
                share_429: avg(&|l| l.share_429),
                minimum_seconds: avg(&|l| l.minimum_seconds),
                vs_minimum: avg(&|l| l.vs_minimum),
                back_after_outage_s: (!backs.is_empty())
                    .then(|| backs.iter().sum::<f64>() / backs.len() as f64),
                peak_1s: avg(&|l| l.peak_1s),
                back_80_s: {
                    let b80: Vec<f64> = loads.iter().filter_map(|l| l.back_80_s).collect();
                    (!b80.is_empty()).then(|| b80.iter().sum::<f64>() / b80.len() as f64)
                },
            }
        });
        Self {
            runs: runs.len() as u32,
            seconds: mean(&|r| r.seconds),
            requests_total: mean(&|r| r.requests_total as f64),
            requests_by_status: by_status,
            peak_per_100ms: mean(&|r| f64::from(r.peak_per_100ms)),
            share_429: mean(&QueueRun::share_429),
            succeeded: mean(&|r| r.succeeded as f64),
            dead: mean(&|r| r.dead_by_reason.values().sum::<u64>() as f64),
            breaker_transitions: mean(&|r| r.breaker_transitions.len() as f64),
            psp_load,
        }
    }
}

/// The runs as CSV with a header line (one line per seed).
pub fn queue_csv(runs: &[QueueRun]) -> String {
    let mut out = String::from(
        "seed,seconds,requests,ok,limited,failed,peak_per_100ms,share_429,limit_rps,peak_ratio,\
         minimum_seconds,vs_minimum,back_after_outage_s,succeeded,dead,retries_in_process,defers,\
         blocked,breaker_transitions\n",
    );
    for r in runs {
        let c = by_class(r);
        let l = r.psp_load.unwrap_or_default();
        let _ = writeln!(
            out,
            "{},{:.3},{},{},{},{},{},{:.4},{},{:.3},{:.3},{:.3},{},{},{},{},{},{},{}",
            r.seed,
            r.seconds,
            r.requests_total,
            c[0],
            c[1],
            c[2],
            r.peak_per_100ms,
            r.share_429(),
            l.limit_rps,
            l.peak_ratio,
            l.minimum_seconds,
            l.vs_minimum,
            l.back_after_outage_s
                .map_or(String::new(), |b| format!("{b:.3}")),
            r.succeeded,
            r.dead_by_reason.values().sum::<u64>(),
            r.retries_in_process,
            r.defers,
            r.blocked,
            r.breaker_transitions.len()
        );
    }
    out
}

#[cfg(test)]
mod tests;
