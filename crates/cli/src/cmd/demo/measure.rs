//! The demo's measurements, as pure functions of what the PSP simulator logged and what the
//! store recorded, so that each claim of the report can be checked by a test that makes it
//! fail:
//!
//! - [`exactly_once`]: every charge made once, read from the simulator's ledger *with its own
//!   dedupe off* (with it on, a double charge could not show);
//! - [`breaker_counts`]: PSP requests let through while the breaker was open, and the probes
//!   sent while it was half-open, from each request's exact arrival at the PSP and the
//!   attempt that sent it, against the stored transitions and the moment each came into
//!   force ([`in_force`]);
//! - [`psp_load`]: how hard the PSP was pushed against its rate limit.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redrive_policy::BreakerState;
use redrive_psp_sim::{Faults, RequestRecord, Stats};
use serde::Serialize;

/// `peak_ratio` looks at the run after this much time (the start, when every worker calls at
/// once into a full token bucket, is not the steady state the ratio is about).
pub(crate) const PEAK_AFTER: Duration = Duration::from_secs(10);

/// Width of the slices `peak_ratio` counts requests in.
pub(crate) const SLICE: Duration = Duration::from_millis(100);

/// Whether every charge was made exactly once, and if not, why not.
///
/// Exactly once means: the ledger's own dedupe was off (so a second charge for a key would
/// have been made and counted), every enqueued job succeeded, the PSP made as many charges as
/// jobs, no key was charged twice (`duplicate_effects` 0, `effects_max_per_key` ≤ 1) and the
/// PSP saw exactly one key per job.
///
/// # Errors
/// Every condition that does not hold, in words.
pub(crate) fn exactly_once(enqueued: u64, succeeded: u64, psp: &Stats) -> Result<(), Vec<String>> {
    let mut why = Vec::new();
    if psp.ledger_dedupe {
        why.push("the ledger's own dedupe was on, so a double charge could not show".to_owned());
    }
    if succeeded != enqueued {
        why.push(format!("{succeeded} of {enqueued} jobs succeeded"));
    }
    if psp.charges != enqueued {
        why.push(format!("{} charges made for {enqueued} jobs", psp.charges));
    }
    if psp.duplicate_effects != 0 || psp.effects_max_per_key > 1 {
        why.push(format!(
            "{} duplicate charges (up to {} for one key)",
            psp.duplicate_effects, psp.effects_max_per_key
        ));
    }
    if psp.distinct_keys != enqueued {
        why.push(format!(
            "{} distinct keys for {enqueued} jobs",
            psp.distinct_keys
        ));
    }
    if why.is_empty() { Ok(()) } else { Err(why) }
}

/// A breaker transition as the store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    /// When the worker decided it (read before the write; whole milliseconds).
    pub(crate) at: DateTime<Utc>,
    /// The state it left.
    pub(crate) from: BreakerState,
    /// The state it went to.
    pub(crate) to: BreakerState,
}

/// A breaker transition and the moment it came into force for the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    /// From when the fleet saw the new state.
    pub(crate) at: DateTime<Utc>,
    /// The state it went to.
    pub(crate) to: BreakerState,
}

/// When each stored transition came into force: the moment the worker that made it had
/// written it (`published`, in order, as the demo saw them: the k-th stored transition from A
/// to B is the k-th published one from A to B), or, for a transition not seen published, its
/// stored time. Never before the stored time.
pub(crate) fn in_force(
    stored: &[Stored],
    published: &[(DateTime<Utc>, BreakerState, BreakerState)],
) -> Vec<Transition> {
    let mut next = 0;
    stored
        .iter()
        .map(|s| {
            let seen = published[next..]
                .iter()
                .position(|(_, from, to)| *from == s.from && *to == s.to)
                .map(|i| {
                    next += i + 1;
                    published[next - 1].0
                });
            Transition {
                at: seen.map_or(s.at, |p| p.max(s.at)),
                to: s.to,
            }
        })
        .collect()
}

/// The starts of every attempt, per idempotency key, in order. A worker reads the clock
/// right after the breaker let its call through, so an attempt's start is the call's
/// admission (stored in whole milliseconds; the demo's handler also stamps it exactly).
pub(crate) type Starts = HashMap<String, Vec<DateTime<Utc>>>;

/// How late a start stored in whole milliseconds may be: 999 µs.
pub(crate) const STORED_MS: chrono::Duration = chrono::Duration::microseconds(999);

/// PSP requests counted against the breaker's state when they were let through.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub(crate) struct BreakerCounts {
    /// Requests let through while the breaker was open (must be 0).
    pub(crate) requests_while_open: u64,
    /// Requests let through while it was half-open: the probes.
    pub(crate) probes_sent: u64,
    /// Of the probes, those the PSP answered 429: a rate-limited probe says nothing of the
    /// PSP's health, so its permit goes back to the round and another probe may be sent.
    /// `probes_sent - probes_rate_limited` is at most the half-open group's size per round.
    pub(crate) probes_rate_limited: u64,
    /// The probes not answered 429, per half-open round (the n-th entry counts the requests
    /// let through after the n-th transition to half-open and before the next transition):
    /// each is at most the half-open group's size.
    pub(crate) probes_judged_per_round: Vec<u64>,
}

/// Counts the requests of `log` let through while the breaker was open, and while it was
/// half-open (the probes), against the transitions in force (see [`in_force`]; the breaker
/// is closed before the first).
///
/// When a request was let through: the start of the attempt that sent it (the latest start
/// of its key's attempts at or before its arrival at the PSP), taken at the *end* of its
/// `resolution` (a start stored in whole milliseconds may be up to 999 µs late; a start
/// stamped when the handler began is exact: zero) but never after the arrival: of the
/// instants the call may have been admitted, the latest, so that the count errs against the
/// breaker. A request without a matching attempt counts at its arrival. A call admitted
/// before an opening came into force and arriving after it (it was on its way) belongs
/// before the opening.
pub(crate) fn breaker_counts(
    log: &[RequestRecord],
    starts: &Starts,
    resolution: chrono::Duration,
    transitions: &[Transition],
) -> BreakerCounts {
    let end_of_ms = resolution;
    // The round each transition to half-open starts (by its index among them).
    let mut round = Vec::with_capacity(transitions.len());
    let mut rounds = 0;
    for t in transitions {
        round.push(rounds);
        rounds += usize::from(t.to == BreakerState::HalfOpen);
    }
    let mut c = BreakerCounts {
        probes_judged_per_round: vec![0; rounds],
        ..BreakerCounts::default()
    };
    for r in log {
        let start = r
            .key
            .as_ref()
            .and_then(|k| starts.get(k))
            .and_then(|s| s.iter().rev().find(|s| **s <= r.at));
        let admitted = start.map_or(r.at, |s| (*s + end_of_ms).min(r.at));
        // The transition in force (none: closed, as before the first).
        let Some(i) = transitions.iter().rposition(|t| t.at <= admitted) else {
            continue;
        };
        match transitions[i].to {
            BreakerState::Open => c.requests_while_open += 1,
            BreakerState::HalfOpen if r.status == 429 => {
                c.probes_sent += 1;
                c.probes_rate_limited += 1;
            }
            BreakerState::HalfOpen => {
                c.probes_sent += 1;
                c.probes_judged_per_round[round[i]] += 1;
            }
            BreakerState::Closed => {}
        }
    }
    c
}

/// How hard the PSP was pushed against its rate limit: the demo report's `psp_load`.
///
/// Every field is `null` where it has no meaning: without a rate limit (`--no-faults`) the
/// ratios to the limit, without an outage `back_after_outage_s`, without requests the share.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PspLoad {
    /// The simulator's rate limit, requests per second.
    pub(crate) limit_rps: Option<f64>,
    /// The most requests in one 100 ms slice after the first 10 s of the run, divided by the
    /// limit's share of 100 ms (`limit_rps / 10`): 1 is exactly at the limit.
    pub(crate) peak_ratio: Option<f64>,
    /// The share of all PSP requests answered 429 (0..1).
    pub(crate) share_429: Option<f64>,
    /// The shortest the run could have taken at the PSP's limit: the outage's length, plus
    /// the requests that had to be made (all requests except those answered 429 and those
    /// that arrived during the outage) sent at `limit_rps`:
    /// `outage_s + (requests − answered_429 − arrived_in_outage) / limit_rps`.
    pub(crate) minimum_seconds: Option<f64>,
    /// The run's finish time divided by `minimum_seconds`.
    pub(crate) vs_minimum: Option<f64>,
    /// From the outage's end to the arrival of the first request answered 2xx after it, in
    /// seconds.
    pub(crate) back_after_outage_s: Option<f64>,
}

/// Computes [`PspLoad`] from the simulator's request log (`t_us` counts from the simulator's
/// start, as its outage window does), the faults it ran with and the run's finish time in
/// seconds from that start.
pub(crate) fn psp_load(log: &[RequestRecord], faults: &Faults, finish_s: f64) -> PspLoad {
    let at = |r: &RequestRecord| Duration::from_micros(r.t_us);
    let total = log.len() as u64;
    let limited = log.iter().filter(|r| r.status == 429).count() as u64;
    let limit = faults.rate_limit;
    let share_429 = (total > 0).then(|| limited as f64 / total as f64);

    let peak_ratio = limit.and_then(|l| {
        if finish_s <= PEAK_AFTER.as_secs_f64() {
            return None;
        }
        let mut slices = std::collections::HashMap::<u128, u64>::new();
        for r in log.iter().filter(|r| at(r) >= PEAK_AFTER) {
            *slices
                .entry(at(r).as_micros() / SLICE.as_micros())
                .or_default() += 1;
        }
        let peak = slices.values().copied().max().unwrap_or(0);
        Some(peak as f64 / (l * SLICE.as_secs_f64()))
    });

    let outage_s = faults.outage.map_or(0.0, |o| o.length.as_secs_f64());
    let in_outage = faults.outage.map_or(0, |o| {
        log.iter()
            .filter(|r| o.contains(at(r)) && r.status != 429)
            .count() as u64
    });
    let minimum_seconds =
        limit.map(|l| outage_s + total.saturating_sub(limited + in_outage) as f64 / l);
    let vs_minimum = minimum_seconds.filter(|m| *m > 0.0).map(|m| finish_s / m);

    let back_after_outage_s = faults.outage.and_then(|o| {
        let end = o.start + o.length;
        log.iter()
            .filter(|r| (200..300).contains(&r.status) && at(r) >= end)
            .map(at)
            .min()
            .map(|t| (t - end).as_secs_f64())
    });

    PspLoad {
        limit_rps: limit,
        peak_ratio,
        share_429,
        minimum_seconds,
        vs_minimum,
        back_after_outage_s,
    }
}

#[cfg(test)]
mod tests {
    use redrive_psp_sim::Outage;

    use super::*;

    const T0_MS: i64 = 1_800_000_000_000;

    fn req(seq: u64, t_ms: u64, status: u16) -> RequestRecord {
        RequestRecord {
            seq,
            at: DateTime::from_timestamp_millis(T0_MS + t_ms as i64).unwrap(),
            t_us: t_ms * 1000,
            method: "POST".into(),
            path: "/v1/charges".into(),
            key: Some(format!("k{seq}")),
            status,
            replayed_by: None,
            traceparent: None,
        }
    }

    fn at_us(seq: u64, t_us: u64, status: u16) -> RequestRecord {
        RequestRecord {
            at: DateTime::from_timestamp_micros(T0_MS * 1000 + t_us as i64).unwrap(),
            t_us,
            ..req(seq, 0, status)
        }
    }

    fn stats(charges: u64, keys: u64, duplicate: u64, max: u64, dedupe: bool) -> Stats {
        Stats {
            charges,
            distinct_keys: keys,
            duplicate_effects: duplicate,
            effects_max_per_key: max,
            ledger_dedupe: dedupe,
            ..Stats::default()
        }
    }

    #[test]
    fn exactly_once_holds_for_one_charge_per_job() {
        assert_eq!(exactly_once(3, 3, &stats(3, 3, 0, 1, false)), Ok(()));
    }

    /// The negative control of the demo's claim: a double charge, which the ledger makes
    /// when its dedupe is off and nothing in front stops a repeat, fails the check.
    #[test]
    fn exactly_once_check_catches_a_double_charge() {
        let why = exactly_once(3, 3, &stats(4, 3, 1, 2, false)).unwrap_err();
        assert_eq!(
            why,
            [
                "4 charges made for 3 jobs",
                "1 duplicate charges (up to 2 for one key)"
            ]
        );
    }

    /// With the ledger's dedupe on, a double charge cannot show, so the claim is not made.
    #[test]
    fn exactly_once_is_not_claimed_with_the_ledgers_dedupe_on() {
        let why = exactly_once(3, 3, &stats(3, 3, 0, 1, true)).unwrap_err();
        assert!(why[0].contains("dedupe was on"), "{why:?}");
    }

    #[test]
    fn exactly_once_check_catches_a_missing_or_unstable_key() {
        // A job that failed, and a job whose retry used a new key: 3 charges, 4 keys.
        let why = exactly_once(3, 2, &stats(3, 4, 0, 1, false)).unwrap_err();
        assert_eq!(why, ["2 of 3 jobs succeeded", "4 distinct keys for 3 jobs"]);
    }

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(T0_MS + ms).unwrap()
    }

    fn us(ms: i64, us: i64) -> DateTime<Utc> {
        t(ms) + chrono::Duration::microseconds(us)
    }

    fn tr(at: DateTime<Utc>, to: BreakerState) -> Transition {
        Transition { at, to }
    }

    #[test]
    fn a_transition_is_in_force_from_its_publication() {
        use BreakerState::*;
        let st = |ms, from, to| Stored {
            at: t(ms),
            from,
            to,
        };
        let stored = [
            st(1000, Closed, Open),
            st(2000, Open, HalfOpen),
            st(2050, HalfOpen, Open),
            st(3000, Open, HalfOpen),
        ];
        // Written 3.5 ms, 0.2 ms and 40 ms after they were decided; the last one not seen.
        let published = [
            (us(1003, 500), Closed, Open),
            (us(2000, 200), Open, HalfOpen),
            (t(2090), HalfOpen, Open),
        ];
        assert_eq!(
            in_force(&stored, &published),
            [
                tr(us(1003, 500), Open),
                tr(us(2000, 200), HalfOpen),
                tr(t(2090), Open),
                tr(t(3000), HalfOpen),
            ]
        );
    }

    fn starts(v: &[(&str, &[i64])]) -> Starts {
        v.iter()
            .map(|(k, ms)| (k.to_string(), ms.iter().map(|m| t(*m)).collect()))
            .collect()
    }

    fn keyed(key: &str, t_us: u64, status: u16) -> RequestRecord {
        RequestRecord {
            key: Some(key.into()),
            ..at_us(0, t_us, status)
        }
    }

    #[test]
    fn requests_are_counted_against_the_state_when_they_were_let_through() {
        use BreakerState::*;
        // Open from 1,000.5 ms (published), half-open at 2,000, open again at 2,050,
        // half-open at 3,000, closed at 3,010.
        let transitions = [
            tr(us(1000, 500), Open),
            tr(t(2000), HalfOpen),
            tr(t(2050), Open),
            tr(t(3000), HalfOpen),
            tr(t(3010), Closed),
        ];
        let s = starts(&[
            ("a", &[998]),        // let through while closed, arrived after the opening
            ("b", &[1000]),       // in the opening's millisecond: it may have been after it
            ("c", &[0, 1500]),    // an earlier attempt, then one while open
            ("d", &[2000]),       // a probe
            ("e", &[2049]),       // a probe arriving after the reopening
            ("f", &[3009, 3020]), // a probe; its retry once closed
        ]);
        let log = [
            keyed("a", 1_001_000, 503),
            keyed("b", 1_000_900, 503),
            keyed("c", 1_500_300, 503),
            keyed("d", 2_000_400, 201),
            keyed("e", 2_050_100, 429),
            keyed("f", 3_009_500, 503),
            keyed("f", 3_020_500, 201),
            keyed("g", 1_999_999, 503), // no attempt: counted at its arrival, while open
            RequestRecord {
                key: None, // a request without a key, while open
                ..at_us(9, 2_600_000, 200)
            },
        ];
        assert_eq!(
            breaker_counts(&log, &s, STORED_MS, &transitions),
            BreakerCounts {
                requests_while_open: 4,              // b, c, g and the one without a key
                probes_sent: 3,                      // d, e, and f's first
                probes_rate_limited: 1,              // e
                probes_judged_per_round: vec![1, 1], // d; f's first
            }
        );
        assert_eq!(
            breaker_counts(&log, &s, STORED_MS, &[]),
            BreakerCounts::default()
        );
        // With exact starts (the handler's stamps), b's start at 1,000.2 ms, before the
        // opening came into force at 1,000.5 ms, is no longer in doubt; one at 1,000.7 ms is.
        let mut exact = s.clone();
        exact.insert("b".into(), vec![us(1000, 200)]);
        assert_eq!(
            breaker_counts(&log, &exact, chrono::Duration::zero(), &transitions),
            BreakerCounts {
                requests_while_open: 3,
                probes_sent: 3,
                probes_rate_limited: 1,
                probes_judged_per_round: vec![1, 1],
            }
        );
        exact.insert("b".into(), vec![us(1000, 700)]);
        assert_eq!(
            breaker_counts(&log, &exact, chrono::Duration::zero(), &transitions)
                .requests_while_open,
            4
        );
    }

    /// A small run worked out by hand: limit 10/s (1 request per 100 ms), an outage from
    /// 1 s to 2 s, finished at 12.5 s.
    #[test]
    fn psp_load_of_a_small_hand_made_run() {
        let faults = Faults {
            rate_limit: Some(10.0),
            outage: Some(Outage::new(Duration::from_secs(1), Duration::from_secs(1))),
            ..Faults::none()
        };
        let log = [
            req(1, 0, 201),
            req(2, 10, 429),
            req(3, 500, 201),
            req(4, 1_000, 503),  // outage
            req(5, 1_999, 503),  // outage
            req(6, 2_000, 503),  // after the outage: a 5xx of the error rate
            req(7, 2_300, 201),  // the first 2xx after the outage: 0.3 s
            req(8, 10_000, 201), // after 10 s: slice 100 has 3
            req(9, 10_050, 429),
            req(10, 10_099, 201),
            req(11, 10_100, 201), // slice 101 has 1
            req(12, 12_000, 201),
        ];
        let p = psp_load(&log, &faults, 12.5);
        assert_eq!(p.limit_rps, Some(10.0));
        // 3 requests in one 100 ms slice, the limit's share of 100 ms is 1.
        assert_eq!(p.peak_ratio, Some(3.0));
        // 2 of 12 answered 429.
        assert_eq!(p.share_429, Some(2.0 / 12.0));
        // 1 s of outage + (12 − 2 answered 429 − 2 in the outage) / 10 per second = 1.8 s.
        assert_eq!(p.minimum_seconds, Some(1.0 + 8.0 / 10.0));
        assert_eq!(p.vs_minimum, Some(12.5 / 1.8));
        assert_eq!(p.back_after_outage_s, Some(0.3));
    }

    #[test]
    fn psp_load_without_a_limit_or_an_outage_has_no_ratios() {
        let log = [req(1, 0, 201), req(2, 11_000, 201)];
        let p = psp_load(&log, &Faults::none(), 12.0);
        assert_eq!(
            p,
            PspLoad {
                limit_rps: None,
                peak_ratio: None,
                share_429: Some(0.0),
                minimum_seconds: None,
                vs_minimum: None,
                back_after_outage_s: None,
            }
        );
        let json = serde_json::to_value(&p).unwrap();
        for f in ["limit_rps", "peak_ratio", "minimum_seconds", "vs_minimum"] {
            assert!(json[f].is_null(), "{f}: {json}");
        }
        // A run that ended within the first 10 s has no peak after them.
        let limited = Faults {
            rate_limit: Some(80.0),
            ..Faults::none()
        };
        assert_eq!(psp_load(&log, &limited, 9.0).peak_ratio, None);
        assert_eq!(psp_load(&[], &limited, 1.0).share_429, None);
    }
}
