//! Group commit for completions: the fenced writes of many concurrent jobs go to the store in
//! one `complete_many` transaction. A job's task still waits for its own write to commit
//! before it sleeps or ends, so "the attempt is recorded before any wait" holds; batching only
//! shares the commit.

use std::sync::Arc;

use redrive_store::{Completion, MAX_BATCH, StoreError};

use crate::db::Db;
use tokio::sync::{mpsc, oneshot};

type Reply = oneshot::Sender<Result<(), Arc<StoreError>>>;

/// A handle to the batching task (cheap to clone).
#[derive(Debug, Clone)]
pub(crate) struct Completer {
    tx: mpsc::UnboundedSender<(Completion, Reply)>,
}

impl Completer {
    /// Starts the batching task; it ends when every handle is dropped.
    pub(crate) fn spawn(db: Db, max_batch: usize) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Completion, Reply)>();
        let max = max_batch.clamp(1, MAX_BATCH);
        tokio::spawn(async move {
            let mut batch = Vec::new();
            while let Some(first) = rx.recv().await {
                batch.push(first);
                while batch.len() < max {
                    match rx.try_recv() {
                        Ok(item) => batch.push(item),
                        Err(_) => break,
                    }
                }
                let (cs, replies): (Vec<Completion>, Vec<Reply>) = batch.drain(..).unzip();
                let out = db
                    .run(move |s| async move {
                        if cs.len() == 1 {
                            Ok(vec![s.complete(&cs[0]).await])
                        } else {
                            s.complete_many(&cs).await
                        }
                    })
                    .await;
                match out {
                    Ok(results) => {
                        for (r, reply) in results.into_iter().zip(replies) {
                            let _ = reply.send(r.map_err(Arc::new));
                        }
                    }
                    Err(e) => {
                        let e = Arc::new(e);
                        for reply in replies {
                            let _ = reply.send(Err(e.clone()));
                        }
                    }
                }
            }
        });
        Self { tx }
    }

    /// Writes one completion (with others waiting at the same time) and waits for its commit.
    pub(crate) async fn complete(&self, c: Completion) -> Result<(), WriteError> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((c, tx)).is_err() {
            return Err(WriteError::Stopped);
        }
        match rx.await {
            Ok(r) => r.map_err(WriteError::Store),
            Err(_) => Err(WriteError::Stopped),
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
