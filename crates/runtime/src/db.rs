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
    pub(crate) async fn run<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce(Store) -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        match &self.on {
            None => f(self.store.clone()).await,
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
