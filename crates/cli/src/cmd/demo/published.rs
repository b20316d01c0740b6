//! When the demo's workers published each breaker transition.
//!
//! Why: the store keeps each transition with the time the worker *decided* it, read before
//! the write; the rest of the fleet can only see it once the write is done (the workers read
//! the breaker from the store). Under load that write takes milliseconds, and a worker that
//! asked in between was rightly let through. The runtime counts every transition it has
//! written in `redrive_breaker_transitions_total{dependency,from,to}` (a metric every
//! deployment scrapes), right after the write, so a recorder of that one counter tells the
//! demo when each transition came into force.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use redrive_policy::BreakerState;

/// The counter the runtime increments after it wrote a transition.
const TRANSITIONS: &str = "redrive_breaker_transitions_total";

/// A transition as it was published: when, for which dependency, from and to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    /// Just after the write (the counter is incremented once the store has it).
    pub(crate) at: DateTime<Utc>,
    /// The dependency's name.
    pub(crate) dependency: String,
    /// The state it left.
    pub(crate) from: BreakerState,
    /// The state it went to.
    pub(crate) to: BreakerState,
}

/// The transitions published so far, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log(Arc<Mutex<Vec<Published>>>);

impl Log {
    /// Installs a process-wide metrics recorder that keeps [`TRANSITIONS`] increments (every
    /// other metric is dropped). `None` when a recorder was installed already.
    pub(crate) fn install() -> Option<Log> {
        let log = Log::default();
        metrics::set_global_recorder(Recorder(log.clone())).ok()?;
        Some(log)
    }

    /// A copy of what was published so far.
    pub(crate) fn snapshot(&self) -> Vec<Published> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[derive(Debug)]
struct Recorder(Log);

#[derive(Debug)]
struct Stamp {
    log: Log,
    dependency: String,
    from: Option<BreakerState>,
    to: Option<BreakerState>,
}

impl CounterFn for Stamp {
    fn increment(&self, n: u64) {
        let (Some(from), Some(to)) = (self.from, self.to) else {
            return;
        };
        let at = Utc::now();
        let mut v = self.log.0.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..n {
            v.push(Published {
                at,
                dependency: self.dependency.clone(),
                from,
                to,
            });
        }
    }

    fn absolute(&self, _: u64) {}
}

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        if key.name() != TRANSITIONS {
            return Counter::noop();
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        let state = |name: &str| label(name).and_then(|v| BreakerState::parse(&v).ok());
        Counter::from_arc(Arc::new(Stamp {
            log: self.0.clone(),
            dependency: label("dependency").unwrap_or_default(),
            from: state("from"),
            to: state("to"),
        }))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
