//! Bounded metric labels: why a queue or dependency name is not always its own label.
//!
//! Every distinct label value is a series that the process keeps for its lifetime and that
//! every scrape renders. Queue and dependency names come from callers, so they are unbounded:
//! 20,000 queue names made `serve` grow from 52 MB to 596 MB and `/metrics` 9.2 MB (180,000
//! series). The first [`max_labels`] names of each kind seen by the process (at every gauge
//! refresh the busiest queues first) keep their own label; every later name shares the label
//! [`OTHER`]. Metric names and label names are unchanged.
//!
//! ```
//! use redrive_store::labels::{OTHER, queue_label};
//! assert_eq!(queue_label("payments"), "payments");
//! ```

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many queue (and, separately, dependency) names keep their own label by default.
pub const DEFAULT_MAX_LABELS: usize = 100;

/// The label shared by every name beyond the cap.
pub const OTHER: &str = "other";

static MAX: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_LABELS);
static QUEUES: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
static DEPENDENCIES: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Sets how many names of each kind keep their own label in this process (call it once at
/// start, before any metric is recorded; names already admitted keep their label).
///
/// # Default
/// [`DEFAULT_MAX_LABELS`].
pub fn set_max_labels(n: usize) {
    MAX.store(n, Ordering::Relaxed);
}

/// How many names of each kind keep their own label.
pub fn max_labels() -> usize {
    MAX.load(Ordering::Relaxed)
}

fn label(set: &Mutex<BTreeSet<String>>, name: &str) -> String {
    let mut admitted = set.lock().unwrap_or_else(|p| p.into_inner());
    if admitted.contains(name) {
        return name.to_owned();
    }
    if admitted.len() < max_labels() && name != OTHER {
        admitted.insert(name.to_owned());
        return name.to_owned();
    }
    OTHER.to_owned()
}

/// The `queue` label of `queue`: itself while fewer than [`max_labels`] queues have been
/// admitted (or it was one of them), else [`OTHER`].
pub fn queue_label(queue: &str) -> String {
    label(&QUEUES, queue)
}

/// The `dependency` label of `dependency`, as [`queue_label`].
pub fn dependency_label(dependency: &str) -> String {
    label(&DEPENDENCIES, dependency)
}

/// The counts of the `limit` busiest queues (most jobs first, ties by name; each queue's rows
/// kept in their order), and how many queues were left out. For listings that must stay small
/// with thousands of queues (`redrive stats`, `GET /v1/stats`).
pub fn busiest_queues(
    counts: Vec<crate::QueueCount>,
    limit: usize,
) -> (Vec<crate::QueueCount>, usize) {
    let mut totals: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for c in &counts {
        *totals.entry(c.queue.as_str()).or_default() += c.count;
    }
    let mut ranked: Vec<(&str, u64)> = totals.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let more = ranked.len().saturating_sub(limit);
    let kept: BTreeSet<String> = ranked
        .into_iter()
        .take(limit)
        .map(|(q, _)| q.to_owned())
        .collect();
    let counts = counts
        .into_iter()
        .filter(|c| kept.contains(&c.queue))
        .collect();
    (counts, more)
}
