//! The claim loop: housekeeping, free slots, claims (a few in flight at once), the claimed
//! jobs in tasks of a few jobs each, and the drain at the end of a run.
//!
//! Claims are pipelined: while one claim statement is in flight, the slots that free up
//! gather for the next, which starts beside it (at most [`claim_lanes`] in flight). Each claim
//! asks for no more jobs than the free slots it holds, so no job is claimed without a slot
//! to run in, and the claims in flight count against `max_jobs` before they return.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use redrive_store::{ClaimParams, Job, Kinds};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::health::ClaimBackoff;
use super::{Run, RuntimeError, Shared, Summary, Worker, absorb, panic_text};
use crate::completer::Completer;
use crate::metrics;

/// How a job task ends: its job's id, and its summary, error or panic.
pub(super) type TaskEnd = (i64, std::thread::Result<Result<Summary, RuntimeError>>);

/// How a claim in flight ends: the slots it held (one per job it asked for), the jobs, the
/// store's error or the claim's panic, and how long the claim took.
type ClaimEnd = (
    Vec<OwnedSemaphorePermit>,
    std::thread::Result<Result<Vec<Job>, redrive_store::StoreError>>,
    Duration,
);

/// Claims in flight at once on a backend: on PostgreSQL as many as the store runs at once
/// (its claim permits); SQLite has one writer, so a second claim only waits its turn, but
/// it is ready to go when the first commits (its jobs start while the next claim runs).
fn claim_lanes(backend: &str) -> usize {
    if backend == "sqlite" { 2 } else { 4 }
}

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
    tasks: JoinSet<Vec<TaskEnd>>,
    total: Summary,
    claimed: u64,
    wake: watch::Receiver<u64>,
    backoff: ClaimBackoff,
    last_rescue: Option<tokio::time::Instant>,
    last_maintain: Option<tokio::time::Instant>,
    /// Jobs claimed per store call at most.
    batch: usize,
    /// The queues claimed from; empty: every queue, in a claim that names none (so neither
    /// the claim's cost nor the loop depends on how many queues the store holds).
    queues: Vec<String>,
    /// Claims in flight, each a task holding the slots it claims into.
    flying: JoinSet<ClaimEnd>,
    /// The jobs each claim in flight asked for (counted against `max_jobs` until it returns).
    asked: HashMap<tokio::task::Id, u64>,
    /// Claims in flight at most.
    lanes: usize,
    /// Free slots taken for the next claim.
    gathered: Vec<OwnedSemaphorePermit>,
    /// A quiet pool's wait for more free slots before it claims (see `claim_linger`).
    linger_until: Option<Instant>,
    /// A claim came back empty: no new claim until the claims in flight are back, then the
    /// idle wait.
    dry: bool,
    /// A claim failed: no new claim before this.
    retry_at: Option<Instant>,
    /// Passes of the claim loop so far.
    passes: u64,
    /// The metric handles of the queues and kinds claimed so far.
    job_metrics: metrics::JobMetricsCache,
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
        Ok(pool.drive().await)
    }
}

impl Pool {
    /// The claim loop, then the claims in flight settled and the jobs drained.
    async fn drive(&mut self) -> Summary {
        // Housekeeping beside the claim loop, ended with the run.
        let housekeeping = CancellationToken::new();
        let _end_housekeeping = housekeeping.clone().drop_guard();
        self.spawn_housekeeping(&housekeeping);
        loop {
            self.passes += 1;
            while let Some(r) = self.tasks.try_join_next() {
                absorb(r, &mut self.total, &self.shared.health);
            }
            if self.stop.is_cancelled() {
                break;
            }
            // What `max_jobs` leaves, the claims in flight counted as if they were full.
            let left = (self.shared.config.max_jobs)
                .map(|m| m.saturating_sub(self.claimed + self.asking()));
            if left == Some(0) && self.flying.is_empty() {
                break;
            }
            self.housekeep().await;
            pass!(self.step(left).await);
        }
        self.settle().await;
        self.drain().await;
        self.total
    }

    /// The state at the start of a run.
    fn new(worker: &Worker, stop: CancellationToken, until_idle: bool) -> Self {
        let shared = worker.shared.clone();
        let config = &shared.config;
        let hard = CancellationToken::new();
        let batch = config.claim_batch.unwrap_or(super::DEFAULT_CLAIM_BATCH);
        let run = Arc::new(Run {
            shared: shared.clone(),
            // A claim's worth: what one claim takes at most.
            completer: Completer::spawn(
                shared.db.clone(),
                redrive_store::MAX_BATCH,
                batch.min(config.concurrency),
            ),
            stop: stop.clone(),
            hard: hard.clone(),
        });
        let queues = config.queues.clone();
        metrics::start_queues(&queues);
        Pool {
            kinds: worker.kinds(),
            slots: Arc::new(Semaphore::new(config.concurrency)),
            wake: config.store.subscribe(),
            batch,
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
            last_maintain: None,
            flying: JoinSet::new(),
            asked: HashMap::new(),
            lanes: claim_lanes(shared.db.backend()),
            gathered: Vec::new(),
            linger_until: None,
            dry: false,
            retry_at: None,
            passes: 0,
            job_metrics: metrics::JobMetricsCache::default(),
            shared,
        }
    }

    /// The pruner, the scheduler and the gauges, if configured, until `until` is cancelled.
    fn spawn_housekeeping(&self, until: &CancellationToken) {
        let config = &self.shared.config;
        if let Some(every) = config.gauges_every {
            tokio::spawn(gauges(
                self.shared.db.clone(),
                every,
                config.clock.clone(),
                until.clone(),
            ));
        }
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

    /// Housekeeping when due: expired leases rescued, the dependencies' rows maintained. (The
    /// gauges are published beside the loop: their counts are a pass over every job, and the
    /// claims never need them, since a worker of every queue claims without a list.)
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
    }

    /// One step of the claim loop: start a claim when slots and a lane are free, else wait
    /// for the first of a claim coming back, a slot freeing up, the end of a quiet pool's
    /// linger or of a failed claim's backoff, and shutdown. After an empty claim, once no
    /// claim is in flight: the idle wait.
    async fn step(&mut self, left: Option<u64>) -> Pass<()> {
        let config = &self.shared.config;
        if self.dry && self.flying.is_empty() {
            self.dry = false;
            return self.idle().await;
        }
        let want = (self.batch as u64).min(left.unwrap_or(u64::MAX)) as usize;
        let mut missing = 1;
        let open =
            self.flying.len() < self.lanes && !self.dry && self.retry_at.is_none() && want > 0;
        if open {
            self.gathered.truncate(want);
            while self.gathered.len() < want {
                match self.slots.clone().try_acquire_owned() {
                    Ok(p) => self.gathered.push(p),
                    Err(_) => break,
                }
            }
            let quiet = self.tasks.is_empty() || config.claim_linger.is_zero();
            let lingered = self.linger_until.is_some_and(|t| Instant::now() >= t);
            let full = want.min(config.concurrency);
            let n = self.gathered.len();
            let threshold = claim_threshold(full, self.flying.len(), quiet || lingered);
            if claim_now(n, full, self.flying.len(), quiet || lingered) {
                self.launch();
                return Pass::Go(());
            }
            if n > 0 && self.flying.is_empty() && self.linger_until.is_none() {
                self.linger_until = Some(Instant::now() + config.claim_linger);
            }
            // Wait for the slots still missing all at once: the semaphore wakes the loop
            // when they are all free, not once per job that ends (a pass of the loop per
            // job was a twentieth of a busy worker's CPU). The first free slot still wakes
            // it when no claim is in flight: it starts the linger, so that a pool of slow
            // jobs claims into one slot after `claim_linger` instead of waiting for more.
            if n > 0 || !self.flying.is_empty() {
                missing = threshold.saturating_sub(n).clamp(1, want - n);
            }
        }
        let linger = self.linger_until.filter(|_| open && self.flying.is_empty());
        let retry = self.retry_at;
        let slots = self.slots.clone();
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => Pass::Stop,
            Some(r) = self.flying.join_next_with_id(), if !self.flying.is_empty() => {
                self.landed(r);
                Pass::Go(())
            }
            _ = sleep_until(retry), if retry.is_some() => {
                self.retry_at = None;
                Pass::Go(())
            }
            p = slots.acquire_many_owned(missing as u32), if open && self.gathered.len() < want => {
                match p {
                    Ok(mut p) => {
                        // One permit per slot, as a claim hands them to its jobs.
                        while p.num_permits() > 1 {
                            match p.split(1) {
                                Some(one) => self.gathered.push(one),
                                None => break,
                            }
                        }
                        self.gathered.push(p);
                        Pass::Go(())
                    }
                    Err(_) => Pass::Stop,
                }
            }
            _ = sleep_until(linger), if linger.is_some() => Pass::Go(()),
        }
    }

    /// Jobs the claims in flight asked for.
    fn asking(&self) -> u64 {
        self.asked.values().sum()
    }

    /// Starts one claim statement for as many jobs as slots were gathered, beside the claims
    /// in flight.
    fn launch(&mut self) {
        let config = &self.shared.config;
        self.wake.borrow_and_update();
        self.linger_until = None;
        let permits = std::mem::take(&mut self.gathered);
        let p = ClaimParams {
            queues: self.queues.clone(),
            kinds: self.kinds.clone(),
            worker: config.name.clone(),
            limit: permits.len() as u32,
            lease: config.lease,
            now: config.clock.now(),
        };
        let n = permits.len() as u64;
        let db = self.shared.db.clone();
        let task = self.flying.spawn(async move {
            let t0 = Instant::now();
            let claim = db.run(move |s| async move { s.claim(&p).await });
            let got = AssertUnwindSafe(claim).catch_unwind().await;
            (permits, got, t0.elapsed())
        });
        self.asked.insert(task.id(), n);
    }

    /// A claim came back: its jobs start, each in one of its slots. A failed claim holds off
    /// the next (100 ms doubling to 5 s); an empty one makes the pool idle once the claims in
    /// flight are back.
    fn landed(&mut self, r: Result<(tokio::task::Id, ClaimEnd), tokio::task::JoinError>) {
        let id = match &r {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        self.asked.remove(&id);
        let shared = self.shared.clone();
        let failed = match r {
            Ok((_, (permits, Ok(Ok(jobs)), took))) => {
                // Each claim's size and time (its wait for a permit or the writer included):
                // RUST_LOG=redrive_runtime::worker::run_loop=debug.
                tracing::debug!(
                    asked = permits.len(),
                    claimed = jobs.len(),
                    took_us = took.as_micros() as u64,
                    in_flight = self.flying.len(),
                    "claim"
                );
                self.backoff.reset();
                shared.health.claim_worked();
                self.total.claims += 1;
                if jobs.is_empty() {
                    self.total.empty_claims += 1;
                    self.dry = true;
                    self.gathered.clear();
                } else {
                    self.spawn(jobs, permits);
                }
                return;
            }
            Ok((_, (_, Ok(Err(e)), _))) => e.to_string(),
            Ok((_, (_, Err(p), _))) => format!("the claim panicked: {}", panic_text(&p)),
            // Only when the runtime shuts down: the slots went with the task.
            Err(e) => format!("the claim task ended abnormally: {e}"),
        };
        // The store is unavailable: wait longer each time (the running jobs go on, and end
        // as their writes allow), and never give up.
        let wait = self.backoff.failed();
        let n = shared.health.claim_failed();
        tracing::warn!(failures = n, retry_in = ?wait, "claiming failed: {failed}");
        self.gathered.clear();
        self.retry_at = Some(Instant::now() + wait);
    }

    /// The end of a run: the claims still in flight come back, and their jobs start (the
    /// drain then lets them finish, or releases them after the grace period), so that no job
    /// claimed is left waiting for its lease to run out.
    async fn settle(&mut self) {
        self.gathered.clear();
        while let Some(r) = self.flying.join_next_with_id().await {
            self.landed(r);
        }
    }

    /// After an empty claim: end an idle run, or wait for a wake-up, a task's end, the next
    /// due job or a poll.
    async fn idle(&mut self) -> Pass<()> {
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

    /// The claimed jobs in tasks of up to [`JOBS_PER_TASK`], each job holding one of the
    /// slots taken for the claim.
    fn spawn(&mut self, jobs: Vec<Job>, permits: Vec<OwnedSemaphorePermit>) {
        self.claimed += jobs.len() as u64;
        let mut permits = permits.into_iter();
        let mut jobs = jobs.into_iter().peekable();
        while jobs.peek().is_some() {
            let group: Vec<_> = (jobs.by_ref().take(JOBS_PER_TASK))
                .map(|job| {
                    let m = self.job_metrics.get(&job.queue, &job.kind);
                    (job, m, permits.next())
                })
                .collect();
            self.tasks.spawn(jobs_task(self.run.clone(), group));
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
                    let running = self.shared.config.concurrency - self.slots.available_permits();
                    tracing::warn!(running, "shutdown grace period over: interrupting and releasing");
                    self.hard.cancel();
                }
            }
        }
    }
}

/// Claimed jobs that share a task: a task per job was a scheduler entry, a join-set entry
/// and a wake-up per job (the group commit answers a batch of jobs at once); a few jobs per
/// task keep a claim's jobs spread over the runtime's threads.
pub(super) const JOBS_PER_TASK: usize = 16;

/// The claim of one job executed, its slot freed at the end.
///
/// The executor's future (about 3 KB: the common path's state) is held inline: the group's
/// `FuturesUnordered` allocates each of its futures on its own already, and a box as well
/// was one more allocation and free of a few KB per job.
async fn job_end(
    run: &Run,
    job: Job,
    metrics: Arc<metrics::JobMetrics>,
    permit: Option<OwnedSemaphorePermit>,
) -> TaskEnd {
    let id = job.id;
    let r = AssertUnwindSafe(run.execute(job, metrics))
        .catch_unwind()
        .await;
    drop(permit);
    (id, r)
}

/// A task of claimed jobs, run side by side: each job's end, in the order they end.
async fn jobs_task(
    run: Arc<Run>,
    jobs: Vec<(Job, Arc<metrics::JobMetrics>, Option<OwnedSemaphorePermit>)>,
) -> Vec<TaskEnd> {
    let mut ends = Vec::with_capacity(jobs.len());
    let mut running: FuturesUnordered<_> = (jobs.into_iter())
        .map(|(job, m, permit)| job_end(&run, job, m, permit))
        .collect();
    while let Some(end) = running.next().await {
        ends.push(end);
    }
    ends
}

/// Whether a claim for the `n` slots gathered starts now, beside `flying` claims in flight:
/// one for a full batch (`full`: the batch, or all the slots if fewer) at any time; with
/// none in flight one for a quarter of it, or fewer once the pool is `quiet` (nothing
/// running, or it lingered long enough). A claim beside one in flight is always full: with
/// claims of a quarter, a busy PostgreSQL worker claimed ~130 jobs per statement against
/// the store-level loop's 200, and the server spent 25–40% more CPU per job.
fn claim_now(n: usize, full: usize, flying: usize, quiet: bool) -> bool {
    n > 0 && n >= claim_threshold(full, flying, quiet)
}

/// The slots a claim waits for (see [`claim_now`]): `full` beside a claim in flight, else a
/// quarter of it, or one once the pool is `quiet`.
fn claim_threshold(full: usize, flying: usize, quiet: bool) -> usize {
    if flying > 0 {
        full
    } else if quiet {
        1
    } else {
        (full / 4).max(1)
    }
}

/// Publishes the gauges from the store's counts every `every` until `until` is cancelled,
/// beside the claim loop: the counts grow with the jobs kept, and no claim waits for them.
async fn gauges(
    db: crate::db::Db,
    every: Duration,
    clock: Arc<dyn redrive_store::Clock>,
    until: CancellationToken,
) {
    loop {
        let now = clock.now();
        if let Err(e) = db
            .run(move |s| async move { metrics::publish_gauges(&s, now).await })
            .await
        {
            tracing::warn!("reading queue counts failed: {e}");
        }
        tokio::select! {
            _ = until.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Sleeps until `at` (for ever if `None`: a disabled branch of a `select!`).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in a fresh SQLite file (kept while the directory lives).
    async fn temp_store() -> (tempfile::TempDir, redrive_store::Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("q.db").display());
        (dir, redrive_store::Store::connect(&url).await.unwrap())
    }

    #[test]
    fn a_claim_beside_one_in_flight_is_for_a_full_batch() {
        // None in flight: a quarter of the batch, or anything once the pool is quiet.
        assert!(claim_now(50, 200, 0, false));
        assert!(!claim_now(49, 200, 0, false));
        assert!(claim_now(1, 200, 0, true));
        assert!(!claim_now(0, 200, 0, true));
        // Beside a claim in flight: only a full one, quiet or not.
        assert!(!claim_now(199, 200, 1, true));
        assert!(claim_now(200, 200, 1, false));
        assert!(
            claim_now(8, 8, 3, false),
            "full is the slots when fewer than the batch"
        );
        assert!(claim_now(1, 1, 0, false), "a batch of one");
    }

    /// A task of jobs holds their executors' futures behind pointers (its `FuturesUnordered`
    /// allocates each): tokio copies a task's future whole into its cell at the spawn and its
    /// stage at the end. And the executor's future holds only the common path.
    #[tokio::test]
    async fn a_job_task_is_small_to_spawn() {
        let (_dir, store) = temp_store().await;
        let now = chrono::Utc::now();
        let new = redrive_store::NewJob::new("q", "noop", serde_json::json!({}));
        store.enqueue(&new, now).await.unwrap();
        let worker = Worker::builder(store.clone(), vec!["q".into()])
            .handler("noop", Arc::new(crate::Noop))
            .gauge_interval(None)
            .build()
            .unwrap();
        let pool = Pool::new(&worker, CancellationToken::new(), true);
        let params = ClaimParams {
            queues: vec!["q".into()],
            kinds: Kinds::only(["noop"]),
            worker: "w".into(),
            limit: 1,
            lease: Duration::from_secs(30),
            now,
        };
        let job = store.claim(&params).await.unwrap().remove(0);
        let m = Arc::new(metrics::JobMetrics::new("q", "noop"));
        // The executor's future is moved whole onto the heap for every job: the rarely taken
        // branches (the fleet's gate and answers, card declines, releases, retries of a
        // failed write) are boxed where they are taken, so that only the common path sizes
        // it. 4,208 bytes before; 3,040 with rustc 1.95.
        let size = std::mem::size_of_val(&pool.run.execute(job.clone(), m.clone()));
        assert!(size <= 3328, "the executor's future is {size} bytes");
        let task = jobs_task(pool.run.clone(), vec![(job, m, None)]);
        let size = std::mem::size_of_val(&task);
        assert!(size < 1024, "a job's task is {size} bytes");
        let (_, end) = task.await.remove(0);
        assert_eq!(end.unwrap().unwrap().succeeded, 1);
    }

    /// The loop waits for a claim's worth of free slots at once: jobs ending one by one do
    /// not wake it each (a pass of the loop per job was a twentieth of a busy worker's CPU).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_ending_one_by_one_do_not_wake_the_loop_each() {
        let (_dir, store) = temp_store().await;
        let now = chrono::Utc::now();
        let jobs = 4000;
        let new: Vec<_> = (0..jobs)
            .map(|_| redrive_store::NewJob::new("q", "noop", serde_json::json!({})))
            .collect();
        for chunk in new.chunks(1000) {
            store.enqueue_many(chunk, now).await.unwrap();
        }
        let worker = Worker::builder(store.clone(), vec!["q".into()])
            .handler("noop", Arc::new(crate::Noop))
            .concurrency(400)
            .gauge_interval(None)
            .build()
            .unwrap();
        let mut pool = Pool::new(&worker, CancellationToken::new(), true);
        let total = pool.drive().await;
        assert_eq!(total.succeeded, jobs);
        // About three passes per claim (sent, landed, its slots free) and a few for the idle
        // end: 74 passes for 26 claims here; woken by each job's slot, 303 for 34.
        assert!(
            pool.passes <= 4 * total.claims + 20,
            "{} passes of the loop for {jobs} jobs in {} claims",
            pool.passes,
            total.claims
        );
    }

    /// A worker of every queue (no `--queue`) drains 600 queues on SQLite, which refuses a
    /// claim of more than 500 queues named one by one: the claim names none, and the loop
    /// never reads the store's counts to claim. A paused queue is left alone. (It once took
    /// its queues from the counts: every claim failed, and no job of any queue ran.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_of_every_queue_drains_600_queues() {
        let (_dir, store) = temp_store().await;
        let now = chrono::Utc::now();
        let jobs: Vec<_> = (0..1200)
            .map(|i| {
                let q = format!("q{:03}", i % 600);
                redrive_store::NewJob::new(q, "noop", serde_json::json!({}))
            })
            .collect();
        store.enqueue_many(&jobs, now).await.unwrap();
        let op = redrive_store::Actor::new("alice", "cli");
        assert!(store.pause_queue("q007", &op, now).await.unwrap());
        let worker = Worker::builder(store.clone(), vec![])
            .handler("noop", Arc::new(crate::Noop))
            .concurrency(50)
            .build()
            .unwrap();
        // A guard against a hang (the loop retrying failed claims for ever), not a measure.
        let total = tokio::time::timeout(Duration::from_secs(300), worker.run_until_idle())
            .await
            .expect("the worker never went idle")
            .unwrap();
        assert_eq!(total.succeeded, 1198);
        let left = store.counts().await.unwrap();
        let waiting: Vec<_> = left
            .iter()
            .filter(|c| c.state != redrive_store::JobState::Succeeded)
            .map(|c| (c.queue.as_str(), c.state, c.count))
            .collect();
        assert_eq!(
            waiting,
            [("q007", redrive_store::JobState::Available, 2)],
            "only the paused queue's jobs wait"
        );
    }

    /// Waits (10 s at most) for `n` to reach `want`; what it reached.
    async fn count_reaches(n: &std::sync::atomic::AtomicUsize, want: usize) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while n.load(std::sync::atomic::Ordering::SeqCst) < want
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        n.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits for `release` when the job's kind is `slow` (counting the slow calls started);
    /// counts the `fast` ones it ran.
    #[derive(Debug)]
    struct SlowOrFast {
        release: tokio::sync::watch::Receiver<bool>,
        fast_done: Arc<std::sync::atomic::AtomicUsize>,
        slow_started: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl crate::Handler for SlowOrFast {
        fn run(
            &self,
            ctx: crate::JobContext,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = crate::Attempted> + Send>> {
            let mut release = self.release.clone();
            let (fast_done, slow_started) = (self.fast_done.clone(), self.slow_started.clone());
            Box::pin(async move {
                if ctx.kind == "slow" {
                    slow_started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = release.wait_for(|r| *r).await;
                } else {
                    fast_done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                crate::Attempted::success(serde_json::Value::Null)
            })
        }
    }

    /// The jobs that share a task wait side by side: 40 calls, in three tasks, are all
    /// started before any ends (one at a time per task, no more than three would be).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_jobs_of_one_task_wait_side_by_side() {
        let (_dir, store) = temp_store().await;
        let now = chrono::Utc::now();
        let jobs: Vec<_> = (0..40)
            .map(|_| redrive_store::NewJob::new("q", "slow", serde_json::json!({})))
            .collect();
        store.enqueue_many(&jobs, now).await.unwrap();
        let (release, released) = tokio::sync::watch::channel(false);
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let handler = Arc::new(SlowOrFast {
            release: released,
            fast_done: Arc::default(),
            slow_started: started.clone(),
        });
        let worker = Worker::builder(store.clone(), vec!["q".into()])
            .handler("slow", handler)
            .concurrency(40)
            .gauge_interval(None)
            .build()
            .unwrap();
        let run = tokio::spawn(async move { worker.run_until_idle().await });
        let at_once = count_reaches(&started, 40).await;
        release.send(true).unwrap();
        let total = run.await.unwrap().unwrap();
        assert_eq!(
            at_once, 40,
            "calls waiting at once, {JOBS_PER_TASK} jobs per task"
        );
        assert_eq!(total.succeeded, 40);
    }

    /// Seven of eight slots held by slow calls: the one slot that frees up takes the next job
    /// after the linger, without waiting for a second slot (a quarter of the eight).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_free_slot_beside_slow_jobs_takes_the_next_job() {
        let (_dir, store) = temp_store().await;
        let now = chrono::Utc::now();
        let mut jobs: Vec<_> = (0..7)
            .map(|_| redrive_store::NewJob::new("q", "slow", serde_json::json!({})).priority(0))
            .collect();
        jobs.extend(
            (0..5).map(|_| {
                redrive_store::NewJob::new("q", "fast", serde_json::json!({})).priority(1)
            }),
        );
        store.enqueue_many(&jobs, now).await.unwrap();
        let (release, released) = tokio::sync::watch::channel(false);
        let fast_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let handler = Arc::new(SlowOrFast {
            release: released,
            fast_done: fast_done.clone(),
            slow_started: Arc::default(),
        });
        let worker = Worker::builder(store.clone(), vec!["q".into()])
            .handler("slow", handler.clone())
            .handler("fast", handler)
            .concurrency(8)
            .gauge_interval(None)
            .build()
            .unwrap();
        let stop = CancellationToken::new();
        let run = tokio::spawn({
            let stop = stop.clone();
            async move { worker.run(stop).await }
        });
        let fast = count_reaches(&fast_done, 5).await;
        release.send(true).unwrap();
        stop.cancel();
        let total = run.await.unwrap().unwrap();
        assert_eq!(fast, 5, "fast jobs run while seven slots stayed busy");
        assert_eq!(total.succeeded, 12);
    }
}
