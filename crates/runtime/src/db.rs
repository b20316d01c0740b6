//! Where store calls run: on the caller's runtime (always, in production), or on another
//! runtime from a blocking thread — for tests under tokio's paused clock, where a blocking task
//! stops the paused clock from jumping ahead while the database answers.

use std::future::Future;

use redrive_store::Store;

#[derive(Debug, Clone)]
pub(crate) struct Db {
    store: Store,
    on: Option<tokio::runtime::Handle>,
}

impl Db {
    pub(crate) fn new(store: Store, on: Option<tokio::runtime::Handle>) -> Self {
        Self { store, on }
    }

    /// The store's backend (`sqlite` or `postgres`).
    pub(crate) fn backend(&self) -> &'static str {
        self.store.backend()
    }

    /// Runs one store call.
    ///
    /// The call's future is boxed: a store operation's state machine is ~13 KB (sqlx's
    /// futures inside), and every async fn of the runtime that might make one would otherwise
    /// carry that much in its own, so that each job's task (18 KB) was copied whole at every
    /// spawn, a tenth of a worker's CPU time when draining noop jobs. The box costs one
    /// allocation per store call, beside its round trip.
    pub(crate) async fn run<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce(Store) -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        match &self.on {
            None => Box::pin(f(self.store.clone())).await,
            Some(h) => {
                let (h, s) = (h.clone(), self.store.clone());
                match tokio::task::spawn_blocking(move || h.block_on(f(s))).await {
                    Ok(t) => t,
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store call is a pointer in its caller's future, not the call's whole state machine
    /// (a dependency write's is ~13 KB): the job tasks that may make one stay small to spawn.
    #[tokio::test]
    async fn a_store_call_adds_a_pointer_to_its_callers_future() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("q.db").display());
        let db = Db::new(Store::connect(&url).await.unwrap(), None);
        let w = redrive_store::DependencyWrite {
            dependency: "psp".into(),
            expect_version: None,
            flow: Default::default(),
            transition: None,
            now: chrono::Utc::now(),
        };
        let call = db.run(move |s| async move { s.update_dependency(&w).await });
        let size = std::mem::size_of_val(&call);
        assert!(
            size < 1024,
            "a store call adds {size} bytes to its caller's future"
        );
        assert!(call.await.unwrap().is_some());
    }
}
