//! The executor: one claim through the decision table, in phases (start, admit, card rules,
//! call, classify, decide, record, wait), each ending the claim or handing on to the next.
//!
//! A future holds the state of its largest wait, and the executor's is moved whole onto the
//! heap for every job: what only some claims wait for (the fleet's gate and answers, card
//! declines, releases, a write's retry) is awaited boxed, where it is taken, so that the
//! common path alone sizes the executor (4.2 KB → 3.0 KB).

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use redrive_policy::{
    Action, DeferReason, FailureClass, JobCounters, Outcome, PolicySet, RetryPolicy, Timestamp,
    Verdict,
};
use redrive_store::{Completion, Job, Lease, NewAttempt, NewDecline, Transition};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::heartbeat::AbortOnDrop;
use super::{AuthGate, Run, RuntimeError, Summary, lost_lease, panic_text};
use crate::completer::WriteError;
use crate::declines;
use crate::fleet::Gate;
use crate::handler::{Attempted, Handler, JobContext, StatusAnswer};
use crate::metrics::{self, JobMetrics};

/// How one pass of the executor's loop ended.
enum Step {
    /// Call again after this wait (holding the lease).
    Again(Duration),
    /// Call again at once (after a credentials refresh).
    Refresh,
    /// The claim ended.
    Ended,
}

/// What a phase hands on: the next phase's input, another pass of the loop, or the claim's end.
enum Phase<T> {
    /// Go on to the next phase with this.
    Next(T),
    /// Start the loop's pass again (after a wait for the reservation horizon).
    Again,
    /// The claim ended.
    End(Result<Summary, RuntimeError>),
}

/// Unwraps a phase's result in the executor's loop: `continue` or `return` otherwise.
macro_rules! phase {
    ($e:expr) => {
        match $e {
            Phase::Next(v) => v,
            Phase::Again => continue,
            Phase::End(r) => return r,
        }
    };
}

/// One claim's state across its attempts.
struct Claim<'a> {
    job: &'a Job,
    /// Cancelled when the lease is lost.
    lost: &'a CancellationToken,
    /// The job's policy, borrowed from the worker's configuration (a clone per claim, with
    /// its status table, was a visible share of a busy worker's CPU).
    policy: Cow<'a, RetryPolicy>,
    /// The policies in force when the claim started ([`crate::LivePolicies::current`]).
    policies: &'a PolicySet,
    rng: SmallRng,
    lease: Lease,
    counters: JobCounters,
    handler: Option<Arc<dyn Handler>>,
    auth: Option<Arc<AuthGate>>,
    /// Handed to the handler: cancelled with `lost`.
    cancel: &'a CancellationToken,
    /// Card declines the job got so far, and the last one (declines.rs).
    declines_seen: u32,
    last_decline: Option<declines::LastDecline>,
    /// Since when this claim waits for the dependency's reservation horizon.
    waited_since: Option<Timestamp>,
    summary: Summary,
    /// The metric handles of the job's queue and kind.
    metrics: &'a JobMetrics,
}

/// The dependency's answer before a call.
struct Admitted {
    /// The call is the breaker's probe.
    probe: bool,
    /// A slot of the dependency's per-process cap on calls in flight.
    inflight: Option<OwnedSemaphorePermit>,
}

/// One call and its answer.
struct Called {
    attempted: Attempted,
    /// The attempt's number (1 for the first).
    attempt: u32,
    span: tracing::Span,
    started: Timestamp,
    took: Duration,
    /// The credentials generation the call started with.
    generation: Option<u64>,
    probe: bool,
}

/// What was decided after a call.
struct Decided {
    verdict: Verdict,
    transition: Transition,
    step: Step,
    class: FailureClass,
    now: Timestamp,
    /// The attempt's decline, written with its completion (boxed: rare, and the executor's
    /// future holds it).
    decline: Option<Box<NewDecline>>,
}

impl Run {
    /// The policy of a job: its kind's, else its queue's, else the one it names; its attempt
    /// budget lowered to the job's own `max_attempts` when that is smaller
    /// ([`RetryPolicy::limited_to`]).
    fn policy<'a>(&'a self, job: &Job, set: &'a PolicySet) -> Cow<'a, RetryPolicy> {
        match self.named_policy(job, set) {
            Cow::Borrowed(p) => p.limited_to(job.max_attempts),
            Cow::Owned(p) => Cow::Owned(p.limited_to(job.max_attempts).into_owned()),
        }
    }

    /// The policy of a job before its own limit: its kind's, else its queue's, else the one
    /// it names.
    fn named_policy<'a>(&'a self, job: &Job, set: &'a PolicySet) -> Cow<'a, RetryPolicy> {
        let config = &self.shared.config;
        if let Some(p) = config.kind_policies.get(&job.kind) {
            return Cow::Borrowed(p);
        }
        if let Some(p) = config.queue_policies.get(&job.queue) {
            return Cow::Borrowed(p);
        }
        match set.get(&job.policy) {
            Ok(p) => Cow::Borrowed(p),
            Err(_) => {
                tracing::warn!(job = job.id, policy = %job.policy, "unknown policy; using payment");
                Cow::Owned(RetryPolicy::payment())
            }
        }
    }

    /// Writes a fenced completion, retrying a failing store while the lease holds (the
    /// heartbeat gives up on it shortly before it runs out) and the run is not interrupted:
    /// an outcome recorded late beats one lost, whose job would run again.
    async fn write(&self, mut c: Completion, lost: &CancellationToken) -> Result<(), WriteError> {
        let mut wait = Duration::from_millis(50);
        let job = c.lease.job_id;
        loop {
            // The completion comes back when it was not written (no copy kept per write).
            match self.completer.complete_or_return(c).await {
                Ok(()) => return Ok(()),
                Err((e, Some(back)))
                    if !e.is_lease_lost() && !lost.is_cancelled() && !self.hard.is_cancelled() =>
                {
                    c = back;
                    tracing::warn!(job, "recording the attempt failed, retrying: {e}");
                    Box::pin(self.pause(wait, lost)).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                // The lease is lost, the writer stopped, or the run is interrupted.
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Waits `wait` before writing again, or less if the lease is lost or the run interrupted.
    async fn pause(&self, wait: Duration, lost: &CancellationToken) {
        tokio::select! {
            _ = lost.cancelled() => {}
            _ = self.hard.cancelled() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }

    /// One claim: attempts until the job is done, dead, deferred, released or its lease is lost.
    pub(super) async fn execute(
        &self,
        job: Job,
        metrics: Arc<JobMetrics>,
    ) -> Result<Summary, RuntimeError> {
        let lost = CancellationToken::new();
        // The handler's token, cancelled with `lost` by the heartbeat; a handler that cancels
        // it itself does not end its claim as a lost lease. Two tokens rather than a child of
        // `lost`: a child links into its parent (a lock and an allocation each way) on every
        // job, for a cancellation only the heartbeat ever makes.
        let cancel = CancellationToken::new();
        let run = self.execute_claim(&job, &lost, &cancel, &metrics);
        tokio::pin!(run);
        // Most claims end before their first heartbeat is due: they need no heartbeat task
        // (a task per job was a tenth of a worker's own CPU time when draining noop jobs).
        tokio::select! {
            biased;
            end = &mut run => return end,
            () = tokio::time::sleep(self.heartbeat_every()) => {}
        }
        // Stopped however the claim ends, a panic included: a heartbeat that outlived its
        // task would hold the lease for ever, and the job would never be rescued.
        let _heartbeat = AbortOnDrop(self.spawn_heartbeat(&job, [lost.clone(), cancel.clone()]));
        run.await
    }

    /// The executor's loop: one pass per attempt.
    async fn execute_claim(
        &self,
        job: &Job,
        lost: &CancellationToken,
        cancel: &CancellationToken,
        metrics: &JobMetrics,
    ) -> Result<Summary, RuntimeError> {
        // The policies in force when the claim starts: it runs under them to its end.
        let policies = self.shared.config.policies.current();
        let mut claim = match self.start(job, &policies, lost, cancel, metrics).await {
            Ok(claim) => claim,
            Err(end) => return end,
        };
        loop {
            let admitted = phase!(self.admit(&mut claim).await);
            let inflight = phase!(
                self.card_rules(&mut claim, admitted.probe, admitted.inflight)
                    .await
            );
            let called = phase!(self.call(&mut claim, admitted.probe, inflight).await);
            let (called, class) = phase!(self.classify(&mut claim, called).await);
            let decided = self.decide(&mut claim, &called, class).await;
            phase!(self.record(&mut claim, &called, &decided).await);
            phase!(self.wait(&mut claim, &called, decided).await);
        }
    }

    /// Start: the claim's state, the card networks' rules before a call that follows a
    /// decline, and the queue latency.
    async fn start<'a>(
        &'a self,
        job: &'a Job,
        policies: &'a PolicySet,
        lost: &'a CancellationToken,
        cancel: &'a CancellationToken,
        metrics: &'a JobMetrics,
    ) -> Result<Claim<'a>, Result<Summary, RuntimeError>> {
        let config = &self.shared.config;
        let mut claim = Claim {
            job,
            lost,
            policy: self.policy(job, policies),
            policies,
            rng: SmallRng::seed_from_u64(
                config.seed ^ (job.id as u64).rotate_left(17) ^ u64::from(job.attempts),
            ),
            lease: job.lease(),
            counters: job.counters(),
            handler: config.handlers.get(&job.kind).cloned(),
            auth: self.shared.auth.get(&job.kind).cloned(),
            cancel,
            declines_seen: 0,
            last_decline: None,
            waited_since: None,
            summary: Summary::default(),
            metrics,
        };
        // A card key stopped by another job's decline: no call (declines.rs).
        if job.quota_key.is_some()
            && let Some(end) = Box::pin(self.card_stopped(&claim)).await
        {
            return Err(end);
        }
        // The card networks' rules before a call that follows a decline (declines.rs).
        if declines::may_follow_decline(job) {
            match Box::pin(declines::last_decline(&self.shared.db, job.id)).await {
                Ok((n, d)) => (claim.declines_seen, claim.last_decline) = (n, d),
                Err(e) => {
                    // Unknown whether this call would break a network rule: do not make it.
                    tracing::warn!(job = job.id, "reading the job's declines failed: {e}");
                    return Err(Box::pin(self.release(&claim)).await);
                }
            }
        }
        // Queue latency: from the job's due time to this start.
        claim.metrics.queue_latency(
            (config.clock.now() - job.run_at)
                .to_std()
                .unwrap_or_default(),
        );
        Ok(claim)
    }

    /// The claim's end when its card key is stopped by another job's decline (dead
    /// `card_stopped` or deferred, by the policy), or handed back when the stop cannot be
    /// read; `None` to go on.
    async fn card_stopped(&self, claim: &Claim<'_>) -> Option<Result<Summary, RuntimeError>> {
        let job = claim.job;
        let now = self.shared.config.clock.now();
        let (t, why) = match declines::card_stop(&self.shared.db, job, now).await {
            Ok(None) => return None,
            Ok(Some(stop)) => {
                metrics::reattempt_blocked("card_stop");
                let action = claim
                    .policy
                    .decide_card_stop(&claim.counters, stop.until, now);
                let why = stop.describe();
                tracing::info!(job = job.id, "{why}");
                (plan(action, &serde_json::Value::Null).0, Some(why))
            }
            Err(e) => {
                // Unknown whether the card is stopped: do not call.
                tracing::warn!(job = job.id, "reading the card key's stop failed: {e}");
                (Transition::Released, None)
            }
        };
        Some(self.end_unattempted_why(claim, t, why).await)
    }

    /// Admit: is the dependency open or paused (fleet-wide)? Then defer: not an attempt.
    /// Else wait for a send slot of its rate limit, and take a slot of its cap on calls in
    /// flight (bulkhead), if any.
    async fn admit(&self, claim: &mut Claim<'_>) -> Phase<Admitted> {
        let job = claim.job;
        let mut probe = false;
        if let (Some(dep), Some(_)) = (&job.dependency, &claim.handler) {
            probe = match Box::pin(self.gate(claim, dep)).await {
                Phase::Next(p) => p,
                Phase::Again => return Phase::Again,
                Phase::End(end) => return Phase::End(end),
            };
        }
        // The per-process cap on calls in flight to the dependency (bulkhead), if any.
        let mut inflight = None;
        if let Some(sem) = job
            .dependency
            .as_deref()
            .and_then(|d| self.shared.fleet.inflight(d))
        {
            inflight = sem.acquire_owned().await.ok();
        }
        Phase::Next(Admitted { probe, inflight })
    }

    /// The fleet's gate for one dependency: wait for a send slot (holding the lease, at most
    /// `in_process_max_wait`), look again after the wait, and end the claim unattempted when the
    /// dependency is open or paused. Goes on with whether the call is the breaker's probe.
    async fn gate(&self, claim: &mut Claim<'_>, dep: &str) -> Phase<bool> {
        let clock = &self.shared.config.clock;
        let now = clock.now();
        let retry = claim.counters.attempts > 0;
        // What is left of the wait in process, after a wait for the reservation horizon.
        let full = claim.policy.retry().in_process_max_wait();
        let max_wait = claim.waited_since.map_or(full, |t: Timestamp| {
            full.saturating_sub((now - t).to_std().unwrap_or_default())
        });
        let waited = claim.waited_since.is_some();
        let gate = (self.shared.fleet)
            .admit(dep, retry, max_wait, waited, now)
            .await;
        if let Ok(Gate::At { at } | Gate::Wait { until: at }) = gate {
            // A send slot of the dependency's rate limit, or the time to reserve one:
            // wait for it, holding the lease (at most in_process_max_wait).
            let wait = (at - now).to_std().unwrap_or_default();
            tokio::select! {
                biased;
                _ = claim.lost.cancelled() => {
                    lost_lease(&mut claim.summary);
                    return Phase::End(Ok(claim.summary));
                }
                _ = self.stop.cancelled() => return Phase::End(self.release(claim).await),
                _ = tokio::time::sleep(wait) => {}
            }
            if matches!(gate, Ok(Gate::Wait { .. })) {
                claim.waited_since.get_or_insert(now);
                return Phase::Again;
            }
        }
        claim.waited_since = None;
        // After the wait for a send slot the breaker may have opened, or the dependency been
        // paused: look again before calling (after a store write, `admit` has looked already).
        let (gate, now) = match gate {
            Ok(Gate::At { at }) if at > now => {
                let now = clock.now();
                (self.shared.fleet.at_slot(dep, false, now).await, now)
            }
            gate => (gate, now),
        };
        match gate {
            Ok(Gate::Go { probe }) => Phase::Next(probe),
            Ok(Gate::At { .. } | Gate::Wait { .. }) => Phase::Next(false),
            Ok(Gate::Blocked { until, reason }) => {
                let action = (claim.policy).decide_blocked(
                    &claim.counters,
                    until,
                    reason,
                    now,
                    &mut claim.rng,
                );
                let (transition, _) = plan(action, &serde_json::Value::Null);
                Phase::End(self.end_unattempted(claim, transition).await)
            }
            Err(e) => {
                // The breaker cannot be consulted (the store is unreachable or the row
                // corrupt). Fail closed, when configured: defer, no call.
                if let Some(delay) = self.shared.config.fail_closed {
                    tracing::warn!(dependency = %dep,
                        "reading the dependency failed; deferring (fail closed): {e}");
                    let until = now + chrono::Duration::from_std(delay).unwrap_or_default();
                    let t = Transition::Deferred {
                        until,
                        reason: DeferReason::BreakerUnreadable,
                        delay,
                    };
                    let why = Some(format!("breaker of {dep} unreadable: {e}"));
                    return Phase::End(Box::pin(self.end_unattempted_why(claim, t, why)).await);
                }
                // Fail open (the default): call, and let the write below retry.
                tracing::warn!(dependency = %dep, "reading the dependency failed: {e}");
                Phase::Next(false)
            }
        }
    }

    /// Card rules: after a decline, the networks' reattempt rules and the card's quotas may
    /// forbid the call (declines.rs).
    async fn card_rules(
        &self,
        claim: &mut Claim<'_>,
        probe: bool,
        inflight: Option<OwnedSemaphorePermit>,
    ) -> Phase<Option<OwnedSemaphorePermit>> {
        let Some(last) = &claim.last_decline else {
            return Phase::Next(inflight);
        };
        let config = &self.shared.config;
        let quotas = claim.policies.quotas();
        let gate = Box::pin(declines::gate(
            &self.shared.db,
            claim.job,
            last,
            &claim.counters,
            &claim.policy,
            quotas,
            config.clock.now(),
        ))
        .await;
        let transition = match gate {
            Ok(None) => None,
            Ok(Some(action)) => Some(plan(action, &serde_json::Value::Null).0),
            Err(e) => {
                tracing::warn!(job = claim.job.id, "taking a card reattempt failed: {e}");
                Some(Transition::Released)
            }
        };
        match transition {
            Some(t) => {
                drop(inflight);
                Box::pin(self.return_probe(claim.job, probe)).await;
                Phase::End(Box::pin(self.end_unattempted(claim, t)).await)
            }
            None => Phase::Next(inflight),
        }
    }

    /// Call: the handler, in the attempt's span; a panic is an exception; an ambiguous
    /// timeout with no safe repeat asks the dependency for the call's status.
    async fn call(
        &self,
        claim: &mut Claim<'_>,
        probe: bool,
        inflight: Option<OwnedSemaphorePermit>,
    ) -> Phase<Called> {
        let job = claim.job;
        let clock = &self.shared.config.clock;
        let generation = (claim.auth.as_ref()).map(|a| a.generation.load(Ordering::SeqCst));
        let started = clock.now();
        let t0 = tokio::time::Instant::now();
        let (ctx, span) = attempt_context(claim);
        let attempt = ctx.attempt;
        let calling = job.dependency.as_deref().map(metrics::Inflight::start);
        let mut attempted = match &claim.handler {
            None => Attempted::failure(
                Outcome::Permanent,
                format!("no handler for job kind {:?}", job.kind),
            ),
            Some(h) => {
                let call = AssertUnwindSafe(h.run(ctx).instrument(span.clone())).catch_unwind();
                tokio::select! {
                    biased;
                    _ = claim.lost.cancelled() => {
                        lost_lease(&mut claim.summary);
                        tracing::warn!(job = job.id, "lease lost: attempt abandoned");
                        Box::pin(self.return_probe(job, probe)).await;
                        return Phase::End(Ok(claim.summary));
                    }
                    _ = self.hard.cancelled() => {
                        Box::pin(self.return_probe(job, probe)).await;
                        return Phase::End(Box::pin(self.release(claim)).await);
                    }
                    r = call => match r {
                        Ok(a) => a,
                        Err(p) => Attempted::failure(
                            Outcome::Exception,
                            format!("handler panicked: {}", panic_text(&p)),
                        ),
                    },
                }
            }
        };
        // An ambiguous timeout with no safe repeat: ask the dependency first.
        if let (Outcome::Timeout { idempotent: false }, Some(h)) =
            (&attempted.outcome, &claim.handler)
            && let Some(q) = h.query_status(job_context(claim))
        {
            settle_by_status(&mut attempted, q.await);
        }
        let took = t0.elapsed();
        drop(calling);
        drop(inflight);
        Phase::Next(Called {
            attempted,
            attempt,
            span,
            started,
            took,
            generation,
            probe,
        })
    }

    /// Classify: the attempt's failure class on its span and in the metrics; a lease lost
    /// meanwhile ends the claim with the attempt unrecorded, its answer still published to
    /// the fleet.
    async fn classify(
        &self,
        claim: &mut Claim<'_>,
        called: Called,
    ) -> Phase<(Called, FailureClass)> {
        let class = called.attempted.outcome.class();
        called.span.record("class", class.as_str());
        claim.summary.attempts += 1;
        claim.metrics.attempt(class, called.took);
        if claim.lost.is_cancelled() {
            // The call was made and answered: what it says of the dependency (a probe's
            // verdict above all) still goes to the fleet.
            let now = self.shared.config.clock.now();
            if let Some(dep) = &claim.job.dependency {
                Box::pin(self.publish(dep, &called, class, None, now)).await;
            }
            // A decline is a fact about the card, whoever holds the job now.
            if let Outcome::Declined(advice) = called.attempted.outcome {
                let quotas = claim.policies.quotas();
                let d = declines::decline_of(claim.job, called.attempt, advice, quotas, now);
                if let Err(e) = Box::pin(declines::record_alone(&self.shared.db, d)).await {
                    tracing::warn!(job = claim.job.id, "recording the decline failed: {e}");
                }
            }
            lost_lease(&mut claim.summary);
            return Phase::End(Ok(claim.summary));
        }
        Phase::Next((called, class))
    }

    /// Decide: the policy's verdict, the decline and the breaker/pause published fleet-wide,
    /// and a wait in process turned into a deferral when the dependency stays blocked longer.
    async fn decide(&self, claim: &mut Claim<'_>, called: &Called, class: FailureClass) -> Decided {
        let job = claim.job;
        let now = self.shared.config.clock.now();
        let outcome = &called.attempted.outcome;
        let verdict = claim
            .policy
            .decide(&claim.counters, outcome, now, &mut claim.rng);
        let mut decline = None;
        if let Outcome::Declined(advice) = *outcome {
            // Written with the attempt's completion (record), in its transaction.
            let n = claim.counters.attempts + 1;
            let quotas = claim.policies.quotas();
            decline = Some(Box::new(declines::decline_of(job, n, advice, quotas, now)));
            claim.last_decline = Some(declines::LastDecline::of(&advice, now));
            claim.declines_seen += 1;
        }
        if let Some(dep) = &job.dependency {
            Box::pin(self.publish(dep, called, class, verdict.pause_until, now)).await;
        }
        let mut action = verdict.action;
        // A wait in process that would end while the dependency is still open or paused
        // (this failure may just have opened it) holds a slot for nothing: defer instead.
        if let (Action::RetryInProcess { delay, .. }, Some(dep)) = (&action, &job.dependency)
            && let Ok(Some((until, reason))) =
                Box::pin(self.shared.fleet.blocked_until(dep, now)).await
            && until > now + chrono::Duration::from_std(*delay).unwrap_or_default()
        {
            let counters = &verdict.counters;
            action = (claim.policy).decide_blocked(counters, until, reason, now, &mut claim.rng);
        }
        let (transition, step) = plan(action, &called.attempted.result);
        Decided {
            verdict,
            transition,
            step,
            class,
            now,
            decline,
        }
    }

    /// A call's answer to the fleet about its dependency `dep`: a probe's verdict, this
    /// process's failure window (an opening), a `Retry-After` pause until `pause_until`.
    async fn publish(
        &self,
        dep: &str,
        called: &Called,
        class: FailureClass,
        pause_until: Option<Timestamp>,
        now: Timestamp,
    ) {
        let fleet = &self.shared.fleet;
        if let Err(e) =
            (fleet.record(dep, called.probe, class, called.took, pause_until, now)).await
        {
            tracing::warn!(dependency = %dep, "publishing the breaker/pause failed: {e}");
        }
    }

    /// A probe's permit back to its round, for a call not made or abandoned unanswered.
    async fn return_probe(&self, job: &Job, probe: bool) {
        if let (true, Some(dep)) = (probe, &job.dependency) {
            let now = self.shared.config.clock.now();
            self.shared.fleet.return_probe(dep, now).await;
        }
    }

    /// Record: the attempt's log line, and its fenced completion written before any wait.
    async fn record(&self, claim: &mut Claim<'_>, called: &Called, decided: &Decided) -> Phase<()> {
        let job = claim.job;
        let (attempted, class) = (&called.attempted, decided.class);
        let (decision, why) = decision(&decided.transition, &decided.step);
        called.span.record("decision", decision);
        called.span.record("why", why.as_str());
        tracing::info!(parent: &called.span, job = job.id, queue = %job.queue, kind = %job.kind,
            key = job.key.as_deref().unwrap_or(""),
            dependency = job.dependency.as_deref().unwrap_or(""), attempt = called.attempt,
            class = class.as_str(), duration_ms = called.took.as_millis() as u64,
            http_status = attempted.http_status, decision, why = %why,
            error = attempted.error.as_deref().unwrap_or(""), "attempt");
        let attempt = NewAttempt {
            worker: Some(self.shared.config.name.clone()),
            started_at: called.started,
            duration: called.took,
            class,
            http_status: attempted.http_status,
            error: attempted.error.clone(),
            counted: decided.verdict.counted,
            // A success's answer is its result; only a failure keeps the excerpt.
            response: (class != FailureClass::Success)
                .then(|| attempted.response.clone())
                .flatten(),
        };
        // The decline commits with its attempt: no later claim decides without it.
        let c = Completion {
            decline: decided.decline.clone(),
            ..Completion::new(
                claim.lease,
                Some(attempt),
                decided.verdict.counters,
                decided.transition.clone(),
                decided.now,
            )
        };
        // The attempt is recorded before any wait.
        match self.write(c, claim.lost).await {
            Err(e) if e.is_lease_lost() => {
                if let Some(d) = decided.decline.clone()
                    && let Err(e) = Box::pin(declines::record_alone(&self.shared.db, *d)).await
                {
                    tracing::warn!(job = job.id, "recording the decline failed: {e}");
                }
                lost_lease(&mut claim.summary);
                Phase::End(Ok(claim.summary))
            }
            Err(e) => Phase::End(Err(RuntimeError::Write {
                job: job.id,
                detail: e.to_string(),
            })),
            Ok(()) => Phase::Next(()),
        }
    }

    /// Wait: refresh the credentials, or wait for the retry in process holding the lease, or
    /// count how the claim ended.
    async fn wait(&self, claim: &mut Claim<'_>, called: &Called, decided: Decided) -> Phase<()> {
        let job = claim.job;
        let s = &mut claim.summary;
        claim.counters = decided.verdict.counters;
        match (&decided.transition, decided.step) {
            (_, Step::Refresh) => {
                let handler = claim.handler.as_deref();
                if let (Some(a), Some(h), Some(g)) = (&claim.auth, handler, called.generation) {
                    Box::pin(refresh_credentials(a, h, g, &job.kind)).await;
                }
                Phase::Next(())
            }
            (_, Step::Again(delay)) => {
                metrics::delay("retry", delay);
                tokio::select! {
                    biased;
                    _ = claim.lost.cancelled() => {
                        lost_lease(s);
                        Phase::End(Ok(*s))
                    }
                    _ = self.stop.cancelled() => {
                        // Shutting down: hand the job back for its planned time.
                        let now = decided.now;
                        let until = now + chrono::Duration::from_std(delay).unwrap_or_default();
                        let t = Transition::Deferred { until, reason: DeferReason::Released, delay };
                        Phase::End(Box::pin(self.end_unattempted(claim, t)).await)
                    }
                    _ = tokio::time::sleep(delay) => Phase::Next(()),
                }
            }
            (Transition::Succeeded { .. }, Step::Ended) => {
                s.succeeded += 1;
                claim.metrics.succeeded();
                Phase::End(Ok(*s))
            }
            (Transition::Dead { reason }, Step::Ended) => {
                s.dead += 1;
                claim.metrics.dead(reason.as_str());
                tracing::warn!(job = job.id, reason = reason.as_str(), "job dead");
                Phase::End(Ok(*s))
            }
            (Transition::Deferred { delay, .. }, Step::Ended) => {
                s.deferred += 1;
                metrics::delay("defer", *delay);
                Phase::End(Ok(*s))
            }
            (_, Step::Ended) => Phase::End(Ok(*s)),
        }
    }

    /// Hands the job back unattempted (shutdown, or a rule that could not be read).
    async fn release(&self, claim: &Claim<'_>) -> Result<Summary, RuntimeError> {
        self.end_unattempted(claim, Transition::Released).await
    }

    /// Ends a claim without recording an attempt: a job deferred because its dependency is
    /// blocked, or handed back at shutdown (an interrupted attempt is not counted).
    async fn end_unattempted(
        &self,
        claim: &Claim<'_>,
        transition: Transition,
    ) -> Result<Summary, RuntimeError> {
        self.end_unattempted_why(claim, transition, None).await
    }

    /// [`Run::end_unattempted`], keeping `why` as the job's last error (a card stop names the
    /// decline that set it).
    async fn end_unattempted_why(
        &self,
        claim: &Claim<'_>,
        transition: Transition,
        why: Option<String>,
    ) -> Result<Summary, RuntimeError> {
        let (job, mut s) = (claim.job, claim.summary);
        let mut c = Completion::new(
            job.lease(),
            None,
            claim.counters,
            transition.clone(),
            self.shared.config.clock.now(),
        );
        c.error = why;
        match self.write(c, claim.lost).await {
            Err(e) if e.is_lease_lost() => lost_lease(&mut s),
            Err(e) => {
                return Err(RuntimeError::Write {
                    job: job.id,
                    detail: e.to_string(),
                });
            }
            Ok(()) => match transition {
                Transition::Dead { reason } => {
                    s.dead += 1;
                    claim.metrics.dead(reason.as_str());
                }
                Transition::Released
                | Transition::Deferred {
                    reason: DeferReason::Released,
                    ..
                } => s.released += 1,
                _ => s.deferred += 1,
            },
        }
        Ok(s)
    }
}

/// One refresh of a kind's credentials for the calls that hit a 401 at the same time: a call
/// that started before someone else's refresh uses theirs.
async fn refresh_credentials(auth: &AuthGate, handler: &dyn Handler, generation: u64, kind: &str) {
    let _one = auth.lock.lock().await;
    // Someone refreshed since this call started: use theirs.
    if auth.generation.load(Ordering::SeqCst) == generation {
        if let Err(e) = handler.refresh_credentials().await {
            tracing::warn!(kind = %kind, "refreshing credentials failed: {e}");
        }
        auth.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// What was decided after an attempt, for its span and log line: `succeeded`, `retry` (in
/// process, after the delay), `refresh` (credentials), `defer` or `dead`, and why.
fn decision(t: &Transition, step: &Step) -> (&'static str, String) {
    match (t, step) {
        (_, Step::Refresh) => ("refresh", "401: refreshing credentials".into()),
        (Transition::RetryInProcess { delay }, _) => ("retry", format!("in {delay:?}")),
        (Transition::Succeeded { .. }, _) => ("succeeded", String::new()),
        (Transition::Deferred { reason, delay, .. }, _) => {
            ("defer", format!("{} for {delay:?}", reason.as_str()))
        }
        (Transition::Dead { reason }, _) => ("dead", reason.as_str().to_owned()),
        (Transition::Released, _) => ("released", String::new()),
    }
}

/// The stored transition and what the executor does next, for a decided action.
fn plan(action: Action, result: &serde_json::Value) -> (Transition, Step) {
    match action {
        Action::Done => (
            Transition::Succeeded {
                result: result.clone(),
            },
            Step::Ended,
        ),
        Action::RefreshCredentials => (
            Transition::RetryInProcess {
                delay: Duration::ZERO,
            },
            Step::Refresh,
        ),
        Action::RetryInProcess { delay, .. } => {
            (Transition::RetryInProcess { delay }, Step::Again(delay))
        }
        Action::Defer {
            until,
            delay,
            reason,
            ..
        } => (
            Transition::Deferred {
                until,
                reason,
                delay,
            },
            Step::Ended,
        ),
        Action::Dead { reason } => (Transition::Dead { reason }, Step::Ended),
    }
}

/// The handler's context for the claim's next attempt, and the attempt's span: in the trace of
/// the job's `traceparent` (with the `otel` feature), so the handler's outbound call joins it.
fn attempt_context(claim: &Claim<'_>) -> (JobContext, tracing::Span) {
    let job = claim.job;
    let ctx = job_context(claim);
    let span = tracing::info_span!("attempt", job = job.id, queue = %job.queue,
        kind = %job.kind, key = job.key.as_deref().unwrap_or(""),
        dependency = job.dependency.as_deref().unwrap_or(""), attempt = ctx.attempt,
        class = tracing::field::Empty, decision = tracing::field::Empty,
        why = tracing::field::Empty);
    crate::trace::set_parent(&span, job.traceparent.as_deref());
    (ctx, span)
}

/// The handler's context for the claim's next attempt (built again for a status query rather
/// than cloned for every call that will not need one).
fn job_context(claim: &Claim<'_>) -> JobContext {
    let job = claim.job;
    JobContext {
        job_id: job.id,
        queue: job.queue.clone(),
        kind: job.kind.clone(),
        attempt: claim.counters.attempts + 1,
        key: job.key.clone(),
        dependency: job.dependency.clone(),
        lease_token: claim.lease.token,
        payload: job.payload.clone(),
        cancel: claim.cancel.clone(),
        declines: claim.declines_seen,
        traceparent: job.traceparent.clone(),
    }
}

/// An ambiguous timeout settled by the dependency's answer to a status query: it succeeded
/// (a success with its result), it never arrived (safe to repeat), or unknown (the answer
/// joins the error).
fn settle_by_status(attempted: &mut Attempted, answer: StatusAnswer) {
    match answer {
        StatusAnswer::Succeeded(v) => {
            attempted.outcome = Outcome::Success;
            attempted.result = v;
        }
        StatusAnswer::NotFound => attempted.outcome = Outcome::Timeout { idempotent: true },
        StatusAnswer::Unknown(why) => {
            let e = attempted.error.take().unwrap_or_default();
            attempted.error = Some(format!("{e}; status query: {why}"));
        }
    }
}
