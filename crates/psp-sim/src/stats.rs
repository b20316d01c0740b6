//! What the simulator saw: requests by status, over time, one by one, and the effects.
//!
//! Why a request log next to the 100 ms timeline: a claim such as "no request reached the
//! PSP while the breaker was open" has to be checked against the breaker's transitions,
//! which are stored with millisecond timestamps. Slices of 100 ms cannot say on which side
//! of a transition a request fell; the log keeps each request's arrival as wall-clock UTC
//! (read from the system clock when the request arrived, nanosecond resolution), so a
//! checker can compare it with the store's timestamps directly.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Width of one [`TimelineBucket`].
pub const BUCKET: Duration = Duration::from_millis(100);

/// How many requests the log keeps; beyond it the oldest are dropped (and counted in
/// [`Stats::request_log_dropped`]).
pub const REQUEST_LOG_CAPACITY: usize = 200_000;

/// Who answered a request from a stored response instead of running the charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayedBy {
    /// The idempotency layer in front of the ledger (see "The dedupe seam").
    Layer,
    /// The ledger's own dedupe.
    Ledger,
}

/// One `/v1` request, as the simulator saw it: what [`crate::SimState::requests`] and
/// `GET /_sim/requests` return.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Position in the log since the start (or the last reset), from 1, in the order the
    /// answers were decided: a charge that stays in processing is logged when it is
    /// answered, after requests that arrived later. Sort by `at` or `t_us` for arrival order.
    pub seq: u64,
    /// Arrival, wall-clock UTC (the system clock read when the request arrived, before any
    /// fault was decided).
    pub at: DateTime<Utc>,
    /// Arrival in microseconds since the simulator's start (or its last reset), on the same
    /// clock as the outage window and the timeline.
    pub t_us: u64,
    /// `GET` or `POST`.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The `Idempotency-Key` of a `POST /v1/charges`, if it had a usable one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The status answered.
    pub status: u16,
    /// Set when the answer was a stored response (no charge was run for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_by: Option<ReplayedBy>,
    /// The W3C `traceparent` header the request carried (at most 128 bytes), if any: which
    /// trace the caller's call belonged to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// One page of the request log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestPage {
    /// The requests after the cursor, oldest first.
    pub requests: Vec<RequestRecord>,
    /// The `after` cursor of the next page; `None` when this page reached the end.
    pub next: Option<u64>,
    /// Requests dropped from the log because it was full (the oldest go first).
    pub dropped: u64,
}

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
    /// Repeats answered from the ledger (`Idempotent-Replayed: true`): only with the ledger's
    /// dedupe on.
    pub replays: u64,
    /// Repeats answered by the idempotency layer in front of the ledger from its stored
    /// response (`Idempotent-Replayed: true`, the charge handler not run).
    #[serde(default)]
    pub layer_replays: u64,
    /// How many times the charge handler ran for the key it ran most often for (0 before
    /// any charge request reached it). With a working idempotency layer in front, 1.
    #[serde(default)]
    pub executions_max_per_key: u64,
    /// The most effects (charges) made for one key; more than 1 is a double charge.
    #[serde(default)]
    pub effects_max_per_key: u64,
    /// Whether the ledger refuses a second charge for a key itself. Off, as at a real PSP
    /// that relies on its idempotency layer, `duplicate_effects` shows what the layer (and
    /// the clients) achieved alone.
    #[serde(default)]
    pub ledger_dedupe: bool,
    /// Requests dropped from the request log because it was full
    /// ([`REQUEST_LOG_CAPACITY`]).
    #[serde(default)]
    pub request_log_dropped: u64,
    /// 409s: a key's first request was still in flight.
    pub conflicts: u64,
    /// 422s: a key reused for a different request.
    pub key_mismatches: u64,
    /// Faults injected, by kind.
    pub injected: Injected,
    /// 402 declines answered, by kind (`visa1`, `mc24`, ...: the `--decline-mix` names).
    #[serde(default)]
    pub declines_by_code: BTreeMap<String, u64>,
    /// Authorisations that were reattempts of a declined one (same key after a decline).
    #[serde(default)]
    pub reattempts: u64,
    /// Reattempts against the card networks' rules, summed over cards: after a never-retry
    /// decline (Visa category 1, MAC 03, MAC 21), before a MAC 24–30 wait was over, or beyond
    /// the card's quota in a window (see [`crate::declines`]). A client that keeps the rules: 0.
    #[serde(default)]
    pub reattempt_violations: u64,
    /// The same, per card (only cards with a violation).
    #[serde(default)]
    pub reattempt_violations_by_card: BTreeMap<String, u64>,
    /// Authorisations of other transactions on a card its network stopped (a Visa category 1,
    /// MAC 03 or MAC 21 decline of another transaction on the card, within the judge's card
    /// stop window): the networks charge for each. Counted apart from the violations: a call
    /// already on its way when the stopping decline is answered counts here too.
    #[serde(default)]
    pub card_stop_attempts: u64,
    /// The same, per card.
    #[serde(default)]
    pub card_stop_attempts_by_card: BTreeMap<String, u64>,
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
    /// Replayed by the idempotency layer.
    LayerReplay,
    /// A 402 decline.
    Declined,
    /// 409 in flight.
    Conflict,
    /// 422 key mismatch.
    Mismatch,
}

/// A request as it arrived, before its answer (the parts of a [`RequestRecord`] known then).
#[derive(Debug, Clone)]
pub(crate) struct Arrival {
    /// Since the start.
    pub(crate) elapsed: Duration,
    /// Wall clock.
    pub(crate) at: DateTime<Utc>,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) key: Option<String>,
    pub(crate) traceparent: Option<String>,
}

/// The mutable counters behind [`Stats`] (charges come from the ledger).
#[derive(Debug)]
pub(crate) struct Recorder {
    capacity: usize,
    total: u64,
    by_status: BTreeMap<u16, u64>,
    keys: HashSet<String>,
    replays: u64,
    layer_replays: u64,
    conflicts: u64,
    mismatches: u64,
    injected: Injected,
    timeline: Vec<TimelineBucket>,
    executions: HashMap<String, u64>,
    log: VecDeque<RequestRecord>,
    dropped: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new(REQUEST_LOG_CAPACITY)
    }
}

impl Recorder {
    /// Empty, with a request log of `capacity` requests.
    pub(crate) fn new(capacity: usize) -> Self {
        Recorder {
            capacity,
            total: 0,
            by_status: BTreeMap::new(),
            keys: HashSet::new(),
            replays: 0,
            layer_replays: 0,
            conflicts: 0,
            mismatches: 0,
            injected: Injected::default(),
            timeline: Vec::new(),
            executions: HashMap::new(),
            log: VecDeque::new(),
            dropped: 0,
        }
    }

    /// The request log's capacity.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counts a key seen on `POST /v1/charges`.
    pub(crate) fn key(&mut self, key: &str) {
        if !self.keys.contains(key) {
            self.keys.insert(key.to_owned());
        }
    }

    /// Counts one run of the charge handler for `key`.
    pub(crate) fn executed(&mut self, key: &str) {
        match self.executions.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                self.executions.insert(key.to_owned(), 1);
            }
        }
    }

    /// Counts one answered request and logs it.
    pub(crate) fn answered(&mut self, a: Arrival, status: u16, note: Note) {
        self.request(a.elapsed, status, note);
        let replayed_by = match note {
            Note::Replay => Some(ReplayedBy::Ledger),
            Note::LayerReplay => Some(ReplayedBy::Layer),
            _ => None,
        };
        if self.log.len() >= self.capacity {
            self.log.pop_front();
            self.dropped += 1;
        }
        self.log.push_back(RequestRecord {
            seq: self.total,
            at: a.at,
            t_us: u64::try_from(a.elapsed.as_micros()).unwrap_or(u64::MAX),
            method: a.method,
            path: a.path,
            key: a.key,
            status,
            replayed_by,
            traceparent: a.traceparent,
        });
    }

    /// The logged requests with `seq > after`, at most `limit` of them.
    pub(crate) fn requests(&self, after: u64, limit: usize) -> RequestPage {
        // The log is in `seq` order with no gaps: find the first one after the cursor.
        let first = self.log.front().map_or(0, |r| r.seq);
        let skip = usize::try_from((after + 1).saturating_sub(first)).unwrap_or(usize::MAX);
        let requests: Vec<RequestRecord> =
            self.log.iter().skip(skip).take(limit).cloned().collect();
        let next = match requests.last() {
            Some(r) if r.seq < self.total => Some(r.seq),
            _ => None,
        };
        RequestPage {
            requests,
            next,
            dropped: self.dropped,
        }
    }

    /// Counts one answered request that arrived at `arrived` (counters and timeline only).
    pub(crate) fn request(&mut self, arrived: Duration, status: u16, note: Note) {
        self.total += 1;
        *self.by_status.entry(status).or_insert(0) += 1;
        match note {
            Note::Plain | Note::Declined => {}
            Note::Outage => self.injected.outage += 1,
            Note::RateLimited => self.injected.rate_limited += 1,
            Note::Error => self.injected.errors += 1,
            Note::Replay => self.replays += 1,
            Note::LayerReplay => self.layer_replays += 1,
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
            layer_replays: self.layer_replays,
            executions_max_per_key: self.executions.values().copied().max().unwrap_or(0),
            request_log_dropped: self.dropped,
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

    fn arrival(ms: u64, key: &str) -> Arrival {
        Arrival {
            elapsed: Duration::from_millis(ms),
            at: DateTime::from_timestamp_millis(1_800_000_000_000 + ms as i64).unwrap(),
            method: "POST".into(),
            path: "/v1/charges".into(),
            key: Some(key.into()),
            traceparent: None,
        }
    }

    #[test]
    fn the_log_keeps_each_request_with_its_arrival_and_pages_by_seq() {
        let mut r = Recorder::default();
        r.answered(arrival(5, "a"), 201, Note::Plain);
        r.answered(arrival(7, "a"), 201, Note::LayerReplay);
        r.answered(arrival(9, "a"), 201, Note::Replay);
        r.answered(arrival(12, "b"), 503, Note::Outage);
        let all = r.requests(0, usize::MAX);
        assert_eq!(all.requests.len(), 4);
        assert_eq!(all.next, None);
        let r1 = &all.requests[1];
        assert_eq!(
            (r1.seq, r1.t_us, r1.status, r1.replayed_by),
            (2, 7_000, 201, Some(ReplayedBy::Layer))
        );
        assert_eq!(r1.at.timestamp_millis(), 1_800_000_000_007);
        assert_eq!(all.requests[2].replayed_by, Some(ReplayedBy::Ledger));
        assert_eq!(all.requests[0].replayed_by, None);
        let p = r.requests(0, 3);
        assert_eq!(
            p.requests.iter().map(|x| x.seq).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(p.next, Some(3));
        let p = r.requests(3, 3);
        assert_eq!(p.requests.iter().map(|x| x.seq).collect::<Vec<_>>(), [4]);
        assert_eq!(p.next, None);
        assert!(r.requests(4, 3).requests.is_empty());
        let s = r.snapshot();
        assert_eq!((s.replays, s.layer_replays), (1, 1));
    }

    #[test]
    fn the_log_is_bounded_and_counts_what_it_dropped() {
        assert_eq!(Recorder::default().capacity(), REQUEST_LOG_CAPACITY);
        let mut r = Recorder::new(100);
        for i in 0..103 {
            r.answered(arrival(i, "k"), 201, Note::Plain);
        }
        let all = r.requests(0, usize::MAX);
        assert_eq!(all.requests.len(), 100);
        assert_eq!(all.dropped, 3);
        assert_eq!(all.requests[0].seq, 4, "the oldest go first");
        // A cursor inside the dropped part starts at the oldest kept.
        assert_eq!(r.requests(1, 1).requests[0].seq, 4);
        assert_eq!(r.requests(10, 1).requests[0].seq, 11);
        assert_eq!(r.snapshot().request_log_dropped, 3);
        assert_eq!(r.snapshot().requests_total, 103);
    }

    #[test]
    fn executions_are_counted_per_key() {
        let mut r = Recorder::default();
        assert_eq!(r.snapshot().executions_max_per_key, 0);
        r.executed("a");
        r.executed("b");
        r.executed("a");
        assert_eq!(r.snapshot().executions_max_per_key, 2);
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
