//! Card declines end to end: subscription renewals through the `http` kind, over real HTTP, to
//! the PSP simulator answering a mix of declines; the simulator's own judge checks every
//! reattempt against the card networks' rules. The judge's rows are its own
//! (`redrive_psp_sim::judge`), and its windows here are written apart from the worker's
//! (`judge()` against `quotas()`): two controls give the worker a wrong table (a quota off by
//! one, a category flipped) and see the judge report violations.
//!
//! The scenario: 2,000 subscription renewals over 300 card keys, 40% declined with a mix of
//! Visa categories and Mastercard advice codes (about 5 s in a debug build).
//! `cargo test -p redrive-http --test declines_e2e -- --nocapture` prints the figures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redrive_http::{DeclineMap, EgressPolicy, HttpJob};
use redrive_policy::{
    FailureClass, Jitter, Network, PolicySet, QuotaRules, QuotaWindow, RetryPolicy, StatusTable,
};
use redrive_psp_sim::{
    CardNetwork, Faults, JudgeRules, PspSim, ReattemptWindow, Stats, parse_decline_mix,
};
use redrive_runtime::Worker;
use redrive_store::{JobState, ListParams, NewJob, Store};
use serde_json::json;

const MIX: &str = "visa1:0.15,visa2:0.3,visa3:0.05,visa4:0.1,mc01:0.05,mc02:0.1,mc03:0.05,\
                   mc21:0.05,mc24:0.1,mc25:0.05";

/// Short configured windows would let a reattempt fall on a window's edge, where the worker's
/// clock and the simulator's differ by the network's latency; the windows here are longer than
/// the run, so the quotas bind by count and every job ends inside it.
fn quotas() -> QuotaRules {
    let w = |max, secs| QuotaWindow::new(max, Duration::from_secs(secs)).unwrap();
    QuotaRules::none()
        .with(Network::Visa, vec![w(3, 3600)])
        .with(Network::Mastercard, vec![w(2, 600), w(3, 3600)])
}

/// The judge's windows for the run: the same figures as `quotas()`, written again in the
/// judge's own terms (not read from the worker's configuration).
fn judge() -> JudgeRules {
    let w = |max, secs| ReattemptWindow {
        max,
        within: Duration::from_secs(secs),
    };
    JudgeRules::default()
        .with_windows(CardNetwork::Visa, vec![w(3, 3600)])
        .with_windows(CardNetwork::Mastercard, vec![w(2, 600), w(3, 3600)])
}

fn policies() -> PolicySet {
    policies_with(quotas())
}

fn policies_with(quotas: QuotaRules) -> PolicySet {
    let mut set = PolicySet::builtin();
    set.insert(
        RetryPolicy::builder("renewal")
            .with_jitter(Jitter::None)
            .with_max_attempts(12)
            .without_window()
            .with_decline_retry_later(Duration::from_millis(300))
            .with_deadline(Duration::from_secs(8))
            .build()
            .unwrap(),
    );
    set.set_quotas(quotas);
    set
}

struct Outcome {
    stats: Stats,
    by_state: BTreeMap<String, u64>,
    dead_reasons: BTreeMap<String, u64>,
    succeeded: u64,
    jobs: u64,
}

async fn run(jobs: u64, cards: u64, http: HttpJob, seed: u64) -> Outcome {
    run_with(jobs, cards, http, seed, policies()).await
}

async fn run_with(jobs: u64, cards: u64, http: HttpJob, seed: u64, set: PolicySet) -> Outcome {
    let sim = PspSim::builder()
        .faults(Faults {
            decline_rate: 0.4,
            decline_mix: parse_decline_mix(MIX).unwrap(),
            seed: Some(seed),
            ..Faults::none()
        })
        // Off: every charge that reaches the ledger is an effect, so a second charge for
        // one renewal would show in `charges` and `duplicate_effects`.
        .ledger_dedupe(false)
        .judge(judge())
        .start("127.0.0.1:0")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display()))
        .await
        .unwrap();
    let policy = set.get("renewal").unwrap().clone();
    let new: Vec<NewJob> = (0..jobs)
        .map(|i| {
            let card = format!("fp_{:04}", i % cards);
            NewJob::new(
                "renewals",
                "http",
                json!({"method": "POST", "url": format!("{}/v1/charges", sim.url()),
                       "body": {"amount": 999, "currency": "EUR",
                                "reference": format!("renewal-{i}"), "card": card},
                       "timeout_ms": 5000}),
            )
            .key(format!("renewal-{i}"))
            .quota_key(card)
            .dependency("psp")
            .with_policy(&policy)
        })
        .collect();
    for chunk in new.chunks(500) {
        store.enqueue_many(chunk, chrono::Utc::now()).await.unwrap();
    }
    let worker = Worker::builder(store.clone(), vec!["renewals".into()])
        .handler("http", Arc::new(http))
        .policies(set)
        .concurrency(16)
        .seed(seed)
        .build()
        .unwrap();
    let started = Instant::now();
    let mut succeeded = 0;
    let mut by_state = BTreeMap::new();
    while started.elapsed() < Duration::from_secs(120) {
        succeeded += worker.run_until_idle().await.unwrap().succeeded;
        by_state.clear();
        for c in store.counts().await.unwrap() {
            *by_state.entry(c.state.as_str().to_owned()).or_insert(0) += c.count;
        }
        let open: u64 = ["available", "scheduled", "deferred", "running"]
            .iter()
            .filter_map(|s| by_state.get(*s))
            .sum();
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut dead_reasons = BTreeMap::new();
    let mut after = None;
    loop {
        let page = store
            .list(&ListParams {
                state: Some(JobState::Dead),
                after,
                limit: Some(500),
                ..Default::default()
            })
            .await
            .unwrap();
        for j in &page.jobs {
            *dead_reasons
                .entry(
                    j.dead_reason
                        .map(|r| r.as_str().to_owned())
                        .unwrap_or_default(),
                )
                .or_insert(0) += 1;
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let stats = sim.stats();
    sim.shutdown().await;
    Outcome {
        stats,
        by_state,
        dead_reasons,
        succeeded,
        jobs,
    }
}

fn check(o: &Outcome) {
    let final_jobs = o.by_state.get("succeeded").copied().unwrap_or(0)
        + o.by_state.get("dead").copied().unwrap_or(0);
    assert_eq!(final_jobs, o.jobs, "every job final: {:?}", o.by_state);
    assert_eq!(
        o.stats.reattempt_violations, 0,
        "violations by card: {:?}",
        o.stats.reattempt_violations_by_card
    );
    assert!(
        o.stats.reattempts > 0,
        "the run made reattempts: {:?}",
        o.stats
    );
    // Card stops (issue 41 item 2): a call on a stopped card can only be one already on its
    // way when the stopping decline was answered (0 in the runs seen; without card stops,
    // hundreds: see the control below).
    assert!(
        o.stats.card_stop_attempts <= 5,
        "calls on stopped cards: {:?}",
        o.stats.card_stop_attempts_by_card
    );
    // Approved renewals charged exactly once: one effect per succeeded job, none twice.
    assert_eq!(o.stats.charges, o.succeeded, "{:?}", o.stats);
    assert_eq!(o.stats.duplicate_effects, 0);
    assert_eq!(
        o.by_state.get("succeeded").copied().unwrap_or(0),
        o.succeeded
    );
    for reason in [
        "do_not_retry",
        "recurring_stopped",
        "update_payment_method",
        "reattempt_quota",
    ] {
        assert!(
            o.dead_reasons.contains_key(reason),
            "some job died {reason}: {:?}",
            o.dead_reasons
        );
    }
    eprintln!(
        "{} jobs: {} succeeded, dead {:?}; simulator: {} requests, {} reattempts, \
         {} attempts on stopped cards, declines {:?}",
        o.jobs,
        o.succeeded,
        o.dead_reasons,
        o.stats.requests_total,
        o.stats.reattempts,
        o.stats.card_stop_attempts,
        o.stats.declines_by_code
    );
}

/// The same renewals through a client that treats a 402 as a generic retryable failure (what
/// a retry library without the networks' rules does): the simulator sees the violations, so
/// the check above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_blind_to_declines_breaks_the_rules() {
    let blind = StatusTable::default()
        .with_override(402, FailureClass::Infrastructure)
        .unwrap();
    let o = run(
        60,
        10,
        HttpJob::with_egress(blind, EgressPolicy::loopback_only()).unwrap(),
        7,
    )
    .await;
    assert!(o.stats.reattempt_violations > 0, "{:?}", o.stats);
}

/// Issue 41 item 1: the worker's table deliberately wrong, the judge's right. A Visa quota off
/// by one (4 an hour where the judge counts 3), then Visa category 1 read as category 2 (the
/// response mapping flips it): each run breaks the rules, and the judge says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_wrong_table_is_caught_by_the_independent_judge() {
    let http = || {
        HttpJob::with_egress(StatusTable::default(), EgressPolicy::loopback_only())
            .unwrap()
            .with_declines(DeclineMap::preset("redrive").unwrap())
    };
    let w = |max, secs| QuotaWindow::new(max, Duration::from_secs(secs)).unwrap();
    // Four cards: without card stops (item 2, which would end most of their jobs early), so
    // that the reattempts reach the quotas.
    let right_quotas = || quotas().without_card_stops();
    // The right table on the same renewals: no violation (so the two below are the tables').
    let right = run_with(150, 4, http(), 5, policies_with(right_quotas())).await;
    assert_eq!(right.stats.reattempt_violations, 0, "{:?}", right.stats);
    assert!(right.stats.reattempts > 0, "{:?}", right.stats);
    // Without card stops, the judge counts the calls on cards a category 1 / MAC 03 / MAC 21
    // stopped (item 2's check, on the judge's side).
    assert!(right.stats.card_stop_attempts > 0, "{:?}", right.stats);
    let off_by_one = right_quotas().with(Network::Visa, vec![w(4, 3600)]);
    let o = run_with(150, 4, http(), 5, policies_with(off_by_one)).await;
    assert!(
        o.stats.reattempt_violations > 0,
        "a Visa quota of 4 against the judge's 3: {:?}",
        o.stats
    );
    // Category 1 flipped to 2: the worker reads the category from the PSP's own code.
    let flipped = DeclineMap::from_payload(&json!({
        "statuses": [402], "network": "/network", "advice_code": "/advice_code",
        "psp_code": "/decline_code",
        "codes": {"visa1": 2, "visa2": 2, "visa3": 3, "visa4": 4}, "codes_default": 4
    }))
    .unwrap();
    let http = HttpJob::with_egress(StatusTable::default(), EgressPolicy::loopback_only())
        .unwrap()
        .with_declines(flipped);
    let o = run_with(150, 4, http, 5, policies_with(right_quotas())).await;
    assert!(
        o.stats.reattempt_violations > 0,
        "category 1 reattempted as 2: {:?}",
        o.stats
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_renewals_over_300_cards_keep_the_network_rules() {
    let http = HttpJob::with_egress(StatusTable::default(), EgressPolicy::loopback_only())
        .unwrap()
        .with_declines(DeclineMap::preset("redrive").unwrap());
    let t = Instant::now();
    let o = run(2000, 300, http, 11).await;
    check(&o);
    eprintln!("took {:?}", t.elapsed());
}
