//! Group commit for completions: the fenced writes of many concurrent jobs go to the store in
//! one `complete_many` transaction. A job's task still waits for its own write to commit
//! before it sleeps or ends, so "the attempt is recorded before any wait" holds; batching only
//! shares the commit.
//!
//! Batches are sized by load: with nothing in flight, what is queued goes at once (one
//! completion alone when the worker is quiet); while a batch is in flight the next ones
//! gather, and another batch starts beside it only once a claim's worth is waiting, up to
//! [`in_flight`] batches at a time (PostgreSQL: several server processes share the commits;
//! SQLite has one writer, so one). Completions of different jobs are independent, and a
//! job's task has at most one completion in flight, so concurrent batches change no order
//! that matters; each stays fenced by its lease token.

use std::sync::Arc;

use redrive_store::{Completion, MAX_BATCH, StoreError};

use crate::db::Db;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

/// A completion's answer: committed, or the store's error with the completion handed back
/// (for its task to retry without keeping a copy of every completion it sends).
type Reply = oneshot::Sender<Result<(), (Arc<StoreError>, Completion)>>;

/// Whether a batch of the `waiting` completions starts now, beside `flying` batches in
/// flight (at most `lanes`): at once when none is in flight, else only a claim's worth
/// (`claim`: the jobs one claim of the worker takes at most). Fewer wait for the batch in
/// flight to commit: with batches beside it at 32, a busy PostgreSQL worker committed ~120
/// jobs per statement on average against the store-level loop's 200, and the server spent
/// 25–40% more CPU per job on the extra statements (`redrive bench`, c=8 and c=64).
fn start_batch(waiting: usize, flying: usize, lanes: usize, claim: usize) -> bool {
    waiting > 0 && flying < lanes && (flying == 0 || waiting >= claim.max(1))
}

/// Batches in flight at once on a backend: one writer on SQLite; on PostgreSQL a few, as
/// many as the store lets claims run at once.
fn in_flight(backend: &str) -> usize {
    if backend == "sqlite" { 1 } else { 4 }
}

/// A handle to the batching task (cheap to clone).
#[derive(Debug, Clone)]
pub(crate) struct Completer {
    tx: mpsc::UnboundedSender<(Completion, Reply)>,
}

impl Completer {
    /// Starts the batching task for a worker whose claims take at most `claim` jobs; it ends
    /// when every handle is dropped and the last batch has committed.
    pub(crate) fn spawn(db: Db, max_batch: usize, claim: usize) -> Self {
        let lanes = in_flight(db.backend());
        Self::spawn_with(db, max_batch, lanes, claim)
    }

    /// [`Completer::spawn`] with at most `lanes` batches in flight.
    pub(crate) fn spawn_with(db: Db, max_batch: usize, lanes: usize, claim: usize) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Completion, Reply)>();
        let max = max_batch.clamp(1, MAX_BATCH);
        let lanes = lanes.max(1);
        tokio::spawn(async move {
            let mut waiting: Vec<(Completion, Reply)> = Vec::new();
            let mut flying = JoinSet::new();
            let mut open = true;
            loop {
                while let Ok(item) = rx.try_recv() {
                    waiting.push(item);
                }
                while start_batch(waiting.len(), flying.len(), lanes, claim) {
                    let n = waiting.len().min(max);
                    let batch: Vec<_> = waiting.drain(..n).collect();
                    flying.spawn(flush(db.clone(), batch));
                }
                if !open && waiting.is_empty() && flying.is_empty() {
                    return;
                }
                tokio::select! {
                    item = rx.recv(), if open => match item {
                        Some(item) => waiting.push(item),
                        None => open = false,
                    },
                    Some(_) = flying.join_next(), if !flying.is_empty() => {}
                }
            }
        });
        Self { tx }
    }

    /// Writes one completion (with others waiting at the same time) and waits for its commit.
    #[cfg(test)]
    pub(crate) async fn complete(&self, c: Completion) -> Result<(), WriteError> {
        self.complete_or_return(c).await.map_err(|(e, _)| e)
    }

    /// [`Completer::complete`], handing the completion back when the store did not write it
    /// (none when the batching task is gone: nothing will write it).
    pub(crate) async fn complete_or_return(
        &self,
        c: Completion,
    ) -> Result<(), (WriteError, Option<Completion>)> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((c, tx)).is_err() {
            return Err((WriteError::Stopped, None));
        }
        match rx.await {
            Ok(r) => r.map_err(|(e, c)| (WriteError::Store(e), Some(c))),
            Err(_) => Err((WriteError::Stopped, None)),
        }
    }
}

/// One batch: one store call, each completion's result to its task.
async fn flush(db: Db, batch: Vec<(Completion, Reply)>) {
    let (cs, replies): (Vec<Completion>, Vec<Reply>) = batch.into_iter().unzip();
    let (jobs, t0) = (cs.len(), std::time::Instant::now());
    let (cs, out) = db
        .run(move |s| async move {
            let out = if cs.len() == 1 {
                Ok(vec![s.complete(&cs[0]).await])
            } else {
                s.complete_many(&cs).await
            };
            (cs, out)
        })
        .await;
    // The commit's size and time (its wait for a connection included), for a look at how
    // the group commits keep up: RUST_LOG=redrive_runtime::completer=debug.
    tracing::debug!(
        jobs,
        took_us = t0.elapsed().as_micros() as u64,
        ok = out.is_ok(),
        "group commit"
    );
    match out {
        Ok(results) => {
            for ((r, reply), c) in results.into_iter().zip(replies).zip(cs) {
                let _ = reply.send(r.map_err(|e| (Arc::new(e), c)));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for (reply, c) in replies.into_iter().zip(cs) {
                let _ = reply.send(Err((e.clone(), c)));
            }
        }
    }
}

/// A completion that was not written.
#[derive(Debug, Clone)]
pub(crate) enum WriteError {
    /// The store refused or failed.
    Store(Arc<StoreError>),
    /// The batching task is gone (the runtime is shutting down).
    Stopped,
}

impl WriteError {
    pub(crate) fn is_lease_lost(&self) -> bool {
        matches!(self, WriteError::Store(e) if e.is_lease_lost())
    }
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Store(e) => e.fmt(f),
            WriteError::Stopped => f.write_str("the completion writer stopped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_policy::{FailureClass, JobCounters};
    use redrive_store::{ClaimParams, Kinds, Lease, NewAttempt, NewJob, Store, Transition};
    use std::time::Duration;

    #[test]
    fn a_batch_starts_beside_one_in_flight_only_when_a_claims_worth_waits() {
        assert!(start_batch(1, 0, 4, 200), "nothing in flight: at once");
        assert!(!start_batch(0, 0, 4, 200));
        assert!(!start_batch(199, 1, 4, 200));
        assert!(start_batch(200, 1, 4, 200));
        assert!(start_batch(200, 3, 4, 200));
        assert!(!start_batch(2000, 4, 4, 200), "every lane busy");
        // A worker claiming 20 at a time: 20 waiting are a claim's worth (not 200).
        assert!(start_batch(20, 1, 4, 20));
        assert!(!start_batch(19, 1, 4, 20));
        assert!(start_batch(1, 1, 4, 0), "a claim of at least one");
    }

    fn success(lease: Lease, attempts: u32, now: redrive_store::Timestamp) -> Completion {
        Completion {
            lease,
            attempt: Some(NewAttempt {
                worker: Some("t".into()),
                started_at: now,
                duration: Duration::ZERO,
                class: FailureClass::Success,
                http_status: None,
                error: None,
                counted: true,
                response: None,
            }),
            counters: JobCounters {
                attempts,
                first_attempt_at: Some(now),
                ..JobCounters::default()
            },
            transition: Transition::Succeeded {
                result: serde_json::Value::Null,
            },
            decline: None,
            error: None,
            now,
        }
    }

    /// Many completions at once through several batches in flight: each job completes
    /// once, with one attempt row; a completion of a job no claim holds is refused as a lost
    /// lease, alone.
    #[tokio::test]
    async fn concurrent_batches_complete_each_job_once_and_keep_the_fence() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("q.db").display());
        let store = Store::connect(&url).await.unwrap();
        let now = chrono::Utc::now();
        let jobs: Vec<NewJob> = (0..300)
            .map(|_| NewJob::new("q", "noop", serde_json::json!({})))
            .collect();
        store.enqueue_many(&jobs, now).await.unwrap();
        let claimed = store
            .claim(&ClaimParams {
                queues: vec!["q".into()],
                kinds: Kinds::Any,
                worker: "t".into(),
                limit: 300,
                lease: Duration::from_secs(60),
                now,
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 300);
        let completer = Completer::spawn_with(Db::new(store.clone(), None), MAX_BATCH, 3, 200);
        // A job that no claim holds: its completion fails the fence.
        let waiting = store
            .enqueue(&NewJob::new("q", "noop", serde_json::json!({})), now)
            .await
            .unwrap();
        let stale = Lease {
            job_id: waiting.job.id,
            token: waiting.job.lease_token,
        };
        let mut calls: Vec<_> = claimed
            .iter()
            .map(|j| {
                let c = completer.clone();
                let done = success(j.lease(), 1, now);
                tokio::spawn(async move { c.complete(done).await })
            })
            .collect();
        let c = completer.clone();
        let late = success(stale, 1, now);
        calls.push(tokio::spawn(async move { c.complete(late).await }));
        let mut results = Vec::new();
        for call in calls {
            results.push(call.await.unwrap());
        }
        let (last, rest) = results.split_last().unwrap();
        assert!(rest.iter().all(Result::is_ok), "{rest:?}");
        assert!(
            last.as_ref().is_err_and(WriteError::is_lease_lost),
            "{last:?}"
        );
        for j in &claimed {
            let got = store.get(j.id).await.unwrap().unwrap();
            assert_eq!(got.state, redrive_store::JobState::Succeeded);
            assert_eq!(store.attempts(j.id).await.unwrap().len(), 1, "job {}", j.id);
        }
    }
}
