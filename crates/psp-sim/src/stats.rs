//! What the simulator saw: requests by status, over time, and the effects.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Width of one [`TimelineBucket`].
pub const BUCKET: Duration = Duration::from_millis(100);

/// Requests in one 100 ms slice of time, by arrival.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineBucket {
    /// Start of the slice, in milliseconds since the simulator's start (a multiple of 100).
    pub t_ms: u64,
    /// Requests that arrived in the slice.
    pub requests: u64,
    /// Those requests by the status they were answered with.
    pub by_status: BTreeMap<u16, u64>,
}

/// Faults injected, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injected {
    /// 503s from the outage window.
    pub outage: u64,
    /// 429s from the rate limit.
    pub rate_limited: u64,
    /// 500/502/503 from the error rate.
    pub errors: u64,
    /// Charges committed whose answer was held back.
    pub timeouts_after_commit: u64,
}

/// The simulator's counters: what `GET /_sim/stats` returns.
///
/// Only `/v1` requests are counted; the `/_sim` control routes are not.
/// A request is counted once its status is decided (before any latency or
/// hold-back), in the [`TimelineBucket`] of its arrival.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Milliseconds since the simulator's start (or its last reset).
    pub elapsed_ms: u64,
    /// The fault RNG's seed.
    pub seed: u64,
    /// `/v1` requests answered (or being held back).
    pub requests_total: u64,
    /// Those requests by status (JSON keys are the status as a string).
    pub requests_by_status: BTreeMap<u16, u64>,
    /// Effects made: charges in the ledger.
    pub charges: u64,
    /// Distinct `Idempotency-Key` values seen on `POST /v1/charges`,
    /// including requests that were faulted before the ledger saw them.
    pub distinct_keys: u64,
    /// Effects made more than once for one key (summed over keys); stays 0
    /// while the dedupe holds.
    pub duplicate_effects: u64,
    /// Repeats answered from the ledger (`Idempotent-Replayed: true`).
    pub replays: u64,
    /// 409s: a key's first request was still in flight.
    pub conflicts: u64,
    /// 422s: a key reused for a different request.
    pub key_mismatches: u64,
    /// Faults injected, by kind.
    pub injected: Injected,
    /// Requests per 100 ms since the start, from 0 to the last slice with a
    /// request, empty slices included.
    pub timeline: Vec<TimelineBucket>,
}

/// What the recorder was told about one answered request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Note {
    /// Nothing special.
    #[default]
    Plain,
    /// Outage 503.
    Outage,
    /// Rate-limit 429.
    RateLimited,
    /// Error-rate 5xx.
    Error,
    /// Replayed from the ledger.
    Replay,
    /// 409 in flight.
    Conflict,
    /// 422 key mismatch.
    Mismatch,
}

/// The mutable counters behind [`Stats`] (charges come from the ledger).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    total: u64,
    by_status: BTreeMap<u16, u64>,
    keys: HashSet<String>,
    replays: u64,
    conflicts: u64,
    mismatches: u64,
    injected: Injected,
    timeline: Vec<TimelineBucket>,
}

impl Recorder {
    /// Counts a key seen on `POST /v1/charges`.
    pub(crate) fn key(&mut self, key: &str) {
        if !self.keys.contains(key) {
            self.keys.insert(key.to_owned());
        }
    }

    /// Counts one answered request that arrived at `arrived`.
    pub(crate) fn request(&mut self, arrived: Duration, status: u16, note: Note) {
        self.total += 1;
        *self.by_status.entry(status).or_insert(0) += 1;
        match note {
            Note::Plain => {}
            Note::Outage => self.injected.outage += 1,
            Note::RateLimited => self.injected.rate_limited += 1,
            Note::Error => self.injected.errors += 1,
            Note::Replay => self.replays += 1,
            Note::Conflict => self.conflicts += 1,
            Note::Mismatch => self.mismatches += 1,
        }
        let i = usize::try_from(arrived.as_millis() / BUCKET.as_millis()).unwrap_or(usize::MAX);
        // A bound on memory: about 28 hours of slices.
        let i = i.min(1_000_000);
        while self.timeline.len() <= i {
            let t_ms = self.timeline.len() as u64 * BUCKET.as_millis() as u64;
            self.timeline.push(TimelineBucket {
                t_ms,
                ..TimelineBucket::default()
            });
        }
        let b = &mut self.timeline[i];
        b.requests += 1;
        *b.by_status.entry(status).or_insert(0) += 1;
    }

    /// Counts an answer held back after its charge was committed.
    pub(crate) fn held_back(&mut self) {
        self.injected.timeouts_after_commit += 1;
    }

    /// The snapshot, with the ledger's figures filled in by the caller.
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            requests_total: self.total,
            requests_by_status: self.by_status.clone(),
            distinct_keys: self.keys.len() as u64,
            replays: self.replays,
            conflicts: self.conflicts,
            key_mismatches: self.mismatches,
            injected: self.injected.clone(),
            timeline: self.timeline.clone(),
            ..Stats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_is_dense_by_arrival() {
        let mut r = Recorder::default();
        r.request(Duration::from_millis(0), 201, Note::Plain);
        r.request(Duration::from_millis(99), 429, Note::RateLimited);
        r.request(Duration::from_millis(250), 201, Note::Plain);
        let s = r.snapshot();
        assert_eq!(s.requests_total, 3);
        assert_eq!(s.injected.rate_limited, 1);
        let t: Vec<_> = s.timeline.iter().map(|b| (b.t_ms, b.requests)).collect();
        assert_eq!(t, vec![(0, 2), (100, 0), (200, 1)]);
        assert_eq!(s.timeline[0].by_status[&429], 1);
        assert_eq!(s.requests_by_status[&201], 2);
    }

    #[test]
    fn json_keys_are_statuses() {
        let mut r = Recorder::default();
        r.request(Duration::ZERO, 503, Note::Outage);
        let v = serde_json::to_value(r.snapshot()).unwrap();
        assert_eq!(v["requests_by_status"]["503"], 1);
        assert_eq!(v["timeline"][0]["by_status"]["503"], 1);
        let back: Stats = serde_json::from_value(v).unwrap();
        assert_eq!(back.requests_by_status[&503], 1);
    }
}
