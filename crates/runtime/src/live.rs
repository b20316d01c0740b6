//! The policies a worker runs, replaceable while it runs.
//!
//! Why: the database holds the fleet's one policies document (`redrive policy apply`), and a
//! new version must reach running workers without a restart. The worker reads the current
//! [`PolicySet`] once per claim (an `Arc` clone under a read lock, no copy of the policies),
//! so a claim runs start to end under the version it started with, and the next claim runs
//! under the new one. Breakers and rate limits per dependency take a new flow configuration
//! at their next use; their shared rows in the store are untouched.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use redrive_policy::PolicySet;

/// A [`PolicySet`] shared by a worker's tasks (and the HTTP API of `redrive serve`), replaced
/// as a whole by [`LivePolicies::replace`]; cheap to clone (all clones see one set).
///
/// ```
/// use redrive_policy::PolicySet;
/// use redrive_runtime::LivePolicies;
///
/// let live = LivePolicies::new(PolicySet::builtin()).with_label("built-in");
/// let before = live.current();
/// let mut next = PolicySet::builtin();
/// next.insert(redrive_policy::RetryPolicy::builder("checkout").build().unwrap());
/// live.replace(next, Some("v2".into()));
/// assert!(before.get("checkout").is_err());
/// assert!(live.current().get("checkout").is_ok());
/// assert_eq!((live.generation(), live.label().as_deref()), (1, Some("v2")));
/// ```
#[derive(Clone)]
pub struct LivePolicies {
    inner: Arc<Inner>,
}

struct Inner {
    current: RwLock<(Arc<PolicySet>, Option<String>)>,
    generation: AtomicU64,
    changed: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for LivePolicies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LivePolicies")
            .field("label", &self.label())
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl Default for LivePolicies {
    fn default() -> Self {
        Self::new(PolicySet::builtin())
    }
}

impl LivePolicies {
    /// Policies that start as `set` (generation 0, no label).
    pub fn new(set: PolicySet) -> Self {
        Self {
            inner: Arc::new(Inner {
                current: RwLock::new((Arc::new(set), None)),
                generation: AtomicU64::new(0),
                changed: tokio::sync::watch::channel(0).0,
            }),
        }
    }

    /// The same, labelled: what the worker's registry row shows (`redrive workers`), e.g.
    /// `v3` or `file (differs from v3)`.
    pub fn with_label(self, label: impl Into<String>) -> Self {
        self.write().1 = Some(label.into());
        self
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, (Arc<PolicySet>, Option<String>)> {
        self.inner
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, (Arc<PolicySet>, Option<String>)> {
        self.inner.current.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The policies now in force (claims that started before a replacement keep theirs).
    pub fn current(&self) -> Arc<PolicySet> {
        self.read().0.clone()
    }

    /// The label of the policies now in force.
    pub fn label(&self) -> Option<String> {
        self.read().1.clone()
    }

    /// How many times the policies were replaced.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Replaces the policies (and their label) for every claim that starts from now on, and
    /// tells the subscribers ([`LivePolicies::subscribe`]).
    pub fn replace(&self, set: PolicySet, label: Option<String>) {
        {
            let mut w = self.write();
            *w = (Arc::new(set), label);
            // Bumped under the lock: a reader that sees the new generation sees the new set.
            self.inner.generation.fetch_add(1, Ordering::AcqRel);
        }
        let g = self.generation();
        self.inner.changed.send_replace(g);
    }

    /// Changes the label only (the same policies), telling the subscribers: a process run
    /// with `--policies FILE` whose file now differs from a newly stored version says so.
    pub fn relabel(&self, label: Option<String>) {
        self.write().1 = label;
        let g = self.generation();
        self.inner.changed.send_replace(g);
    }

    /// A receiver that changes at each replacement (the worker's registry row is refreshed at
    /// once, so `redrive workers` shows the new label within a moment).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }
}
