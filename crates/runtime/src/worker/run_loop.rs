//! The claim loop: housekeeping, free slots, one claim per pass, a task per claimed job, and
//! the drain at the end of a run.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use redrive_store::{ClaimParams, Job, Kinds};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::health::ClaimBackoff;
use super::{Run, RuntimeError, Shared, Summary, Worker, absorb};
use crate::completer::Completer;
use crate::metrics;

/// How a job task ends: its job's id, and its summary, error or panic.
pub(super) type TaskEnd = (i64, std::thread::Result<Result<Summary, RuntimeError>>);

/// What a phase of the claim loop hands on: go on with this, start the next pass, or end.
enum Pass<T> {
    /// Go on with this.
    Go(T),
    /// Start the next pass of the loop.
    Next,
    /// Leave the loop (shutdown, idle, or `max_jobs` reached).
    Stop,
}

/// Unwraps a phase's result in the claim loop: `continue` or `break` otherwise.
macro_rules! pass {
    ($e:expr) => {
        match $e {
            Pass::Go(v) => v,
            Pass::Next => continue,
            Pass::Stop => break,
        }
    };
}

/// One run's claim loop state.
struct Pool {
    shared: Arc<Shared>,
    run: Arc<Run>,
    kinds: Kinds,
    stop: CancellationToken,
    hard: CancellationToken,
    until_idle: bool,
    slots: Arc<Semaphore>,
    tasks: JoinSet<TaskEnd>,
    total: Summary,
    claimed: u64,
    wake: watch::Receiver<u64>,
    backoff: ClaimBackoff,
    last_rescue: Option<tokio::time::Instant>,
    last_gauges: Option<tokio::time::Instant>,
    last_maintain: Option<tokio::time::Instant>,
    /// Jobs claimed per store call at most.
    batch: usize,
    /// No queue list given: every queue in the store, looked up with the gauges.
    all_queues: bool,
    queues: Vec<String>,
}

impl Worker {
    /// The claim loop of one run, until `stop` (or idle, with `until_idle`).
    pub(super) async fn run_loop(
        &self,
        stop: CancellationToken,
        until_idle: bool,
    ) -> Result<Summary, RuntimeError> {
        let _running = self.shared.health.running();
        let mut pool = Pool::new(self, stop, until_idle);
        // Housekeeping beside the claim loop, ended with the run.
        let housekeeping = CancellationToken::new();
        let _end_housekeeping = housekeeping.clone().drop_guard();
        pool.spawn_housekeeping(&housekeeping);
        loop {
            while let Some(r) = pool.tasks.try_join_next() {
                absorb(r, &mut pool.total, &pool.shared.health);
            }
            if pool.stop.is_cancelled() {
                break;
            }
            let left = (pool.shared.config.max_jobs).map(|m| m.saturating_sub(pool.claimed));
            if left == Some(0) {
                break;
            }
            pool.housekeep().await;
            pass!(pool.wait_for_a_queue().await);
            let permits = pass!(pool.take_slots(left).await);
            let (jobs, permits) = pass!(pool.claim(permits).await);
            pool.spawn(jobs, permits);
        }
        pool.drain().await;
        Ok(pool.total)
    }
}

impl Pool {
    /// The state at the start of a run.
    fn new(worker: &Worker, stop: CancellationToken, until_idle: bool) -> Self {
        let shared = worker.shared.clone();
        let config = &shared.config;
        let hard = CancellationToken::new();
        let run = Arc::new(Run {
            shared: shared.clone(),
            completer: Completer::spawn(shared.db.clone(), redrive_store::MAX_BATCH),
            stop: stop.clone(),
            hard: hard.clone(),
        });
        let queues = config.queues.clone();
        metrics::start_queues(&queues);
        Pool {
            kinds: worker.kinds(),
            slots: Arc::new(Semaphore::new(config.concurrency)),
            wake: config.store.subscribe(),
            batch: config.claim_batch.unwrap_or(super::DEFAULT_CLAIM_BATCH),
            all_queues: config.queues.is_empty(),
            queues,
            run,
            stop,
            hard,
            until_idle,
            tasks: JoinSet::new(),
            total: Summary::default(),
            claimed: 0,
            backoff: ClaimBackoff::new(),
            last_rescue: None,
            last_gauges: None,
            last_maintain: None,
            shared,
        }
    }

    /// The pruner and the scheduler, if configured, until `until` is cancelled.
    fn spawn_housekeeping(&self, until: &CancellationToken) {
        let config = &self.shared.config;
        if let Some(r) = config.retention.clone() {
            tokio::spawn(crate::maintenance::pruner(
                self.shared.db.clone(),
                r,
                config.name.clone(),
                config.clock.clone(),
                until.clone(),
            ));
        }
        if let Some(check) = config.scheduler {
            tokio::spawn(crate::maintenance::scheduler(
                self.shared.db.clone(),
                check,
                config.clock.clone(),
                until.clone(),
            ));
        }
    }

    /// Housekeeping when due: expired leases rescued, the dependencies' rows maintained, the
    /// gauges (and in all-queues mode the list of queues) read from the store's counts.
    async fn housekeep(&mut self) {
        let (shared, config) = (&self.shared, &self.shared.config);
        let now = config.clock.now();
        if due(&mut self.last_rescue, config.rescue_every) {
            match (shared.db)
                .run(move |s| async move { s.rescue(now, 1000).await })
                .await
            {
                Ok(rescued) => {
                    for r in &rescued {
                        metrics::rescued(&r.queue);
                    }
                }
                Err(e) => tracing::warn!("rescuing expired leases failed: {e}"),
            }
        }
        if due(&mut self.last_maintain, config.poll)
            && let Err(e) = shared.fleet.maintain(now).await
        {
            tracing::warn!("dependency housekeeping failed: {e}");
        }
        // The gauges, and in all-queues mode the list of queues, from the store's counts.
        let every = config.gauges_every.unwrap_or(super::DEFAULT_GAUGE_INTERVAL);
        if (config.gauges_every.is_some() || self.all_queues) && due(&mut self.last_gauges, every) {
            let publish = config.gauges_every.is_some();
            let counts = (shared.db)
                .run(move |s| async move {
                    if publish {
                        metrics::publish_gauges(&s, now).await
                    } else {
                        s.counts().await
                    }
                })
                .await;
            match counts {
                Ok(c) if self.all_queues => {
                    self.queues = c.into_iter().map(|c| c.queue).collect();
                    self.queues.sort();
                    self.queues.dedup();
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("reading queue counts failed: {e}"),
            }
        }
    }

    /// In all-queues mode before any queue exists: wait for a wake-up or a poll.
    async fn wait_for_a_queue(&mut self) -> Pass<()> {
        if !self.queues.is_empty() {
            return Pass::Go(());
        }
        let poll = self.shared.config.poll;
        tokio::select! {
            _ = self.stop.cancelled() => Pass::Stop,
            _ = self.wake.changed() => { self.last_gauges = None; Pass::Next }
            _ = tokio::time::sleep(poll) => if self.until_idle { Pass::Stop } else { Pass::Next },
        }
    }

    /// Free slots to claim into: at least one, up to the batch (and what `max_jobs` leaves);
    /// a busy worker lingers briefly so that one claim fills several.
    async fn take_slots(&mut self, left: Option<u64>) -> Pass<Vec<OwnedSemaphorePermit>> {
        let config = &self.shared.config;
        let first = tokio::select! {
            biased;
            _ = self.stop.cancelled() => return Pass::Stop,
            p = self.slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return Pass::Stop },
        };
        let want = (self.batch as u64).min(left.unwrap_or(u64::MAX)) as usize;
        let mut permits = vec![first];
        while permits.len() < want {
            match self.slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        // Busy: let a few more slots free up (briefly) so that one claim fills them.
        let enough = (want.min(config.concurrency) / 4).max(1);
        if permits.len() < enough && !self.tasks.is_empty() && !config.claim_linger.is_zero() {
            let until = tokio::time::Instant::now() + config.claim_linger;
            while permits.len() < enough {
                tokio::select! {
                    biased;
                    _ = self.stop.cancelled() => break,
                    p = self.slots.clone().acquire_owned() => match p {
                        Ok(p) => permits.push(p),
                        Err(_) => break,
                    },
                    _ = tokio::time::sleep_until(until) => break,
                }
            }
            if self.stop.is_cancelled() {
                // Shutdown arrived while lingering: claim nothing more.
                return Pass::Stop;
            }
        }
        Pass::Go(permits)
    }

    /// One claim statement for as many jobs as slots were taken. A failed claim waits (100 ms
    /// doubling to 5 s); an empty one waits for a wake-up, the next due job or a poll.
    async fn claim(
        &mut self,
        permits: Vec<OwnedSemaphorePermit>,
    ) -> Pass<(Vec<Job>, Vec<OwnedSemaphorePermit>)> {
        let (shared, config) = (&self.shared, &self.shared.config);
        self.wake.borrow_and_update();
        let p = ClaimParams {
            queues: self.queues.clone(),
            kinds: self.kinds.clone(),
            worker: config.name.clone(),
            limit: permits.len() as u32,
            lease: config.lease,
            now: config.clock.now(),
        };
        let jobs = match shared
            .db
            .run(move |s| async move { s.claim(&p).await })
            .await
        {
            Ok(j) => {
                self.backoff.reset();
                shared.health.claim_worked();
                j
            }
            Err(e) => {
                // The store is unavailable: wait longer each time (the running jobs go
                // on, and end as their writes allow), and never give up.
                let wait = self.backoff.failed();
                let n = shared.health.claim_failed();
                tracing::warn!(failures = n, retry_in = ?wait, "claiming failed: {e}");
                drop(permits);
                return tokio::select! {
                    _ = self.stop.cancelled() => Pass::Stop,
                    _ = tokio::time::sleep(wait) => Pass::Next,
                };
            }
        };
        self.total.claims += 1;
        if jobs.is_empty() {
            self.total.empty_claims += 1;
            drop(permits);
            return self.idle().await;
        }
        Pass::Go((jobs, permits))
    }

    /// After an empty claim: end an idle run, or wait for a wake-up, a task's end, the next
    /// due job or a poll.
    async fn idle(&mut self) -> Pass<(Vec<Job>, Vec<OwnedSemaphorePermit>)> {
        let (shared, config) = (&self.shared, &self.shared.config);
        if self.until_idle && self.tasks.is_empty() {
            return Pass::Stop;
        }
        let (q, k) = (self.queues.clone(), self.kinds.clone());
        let wait = match (shared.db)
            .run(move |s| async move { s.next_due_for(&q, &k).await })
            .await
        {
            Ok(Some(t)) => (t - config.clock.now()).to_std().unwrap_or(Duration::ZERO),
            _ => config.poll,
        }
        .clamp(Duration::from_millis(1), config.poll);
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => return Pass::Stop,
            Some(r) = self.tasks.join_next(), if !self.tasks.is_empty() => absorb(r, &mut self.total, &shared.health),
            r = self.wake.changed() => if r.is_err() { tokio::time::sleep(wait).await },
            _ = tokio::time::sleep(wait) => {}
        }
        Pass::Next
    }

    /// A task per claimed job, each holding one of the slots taken for the claim.
    fn spawn(&mut self, jobs: Vec<Job>, permits: Vec<OwnedSemaphorePermit>) {
        tracing::trace!(asked = permits.len(), claimed = jobs.len(), "claim");
        self.claimed += jobs.len() as u64;
        let mut permits = permits.into_iter();
        for job in jobs {
            let permit = permits.next();
            let run = self.run.clone();
            let id = job.id;
            self.tasks.spawn(async move {
                let r = AssertUnwindSafe(run.execute(job)).catch_unwind().await;
                drop(permit);
                (id, r)
            });
        }
    }

    /// Shutdown or idle: lets the running claims end (after the grace period, interrupts).
    async fn drain(&mut self) {
        let grace = tokio::time::sleep(self.shared.config.grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                r = self.tasks.join_next() => match r {
                    None => break,
                    Some(r) => absorb(r, &mut self.total, &self.shared.health),
                },
                _ = &mut grace, if self.stop.is_cancelled() && !self.hard.is_cancelled() => {
                    tracing::warn!(running = self.tasks.len(), "shutdown grace period over: interrupting and releasing");
                    self.hard.cancel();
                }
            }
        }
    }
}

/// Whether `every` has passed since `last` (then `last` becomes now).
fn due(last: &mut Option<tokio::time::Instant>, every: Duration) -> bool {
    let now = tokio::time::Instant::now();
    if last.is_none_or(|t| now - t >= every) {
        *last = Some(now);
        return true;
    }
    false
}
