//! An idempotent payment worker built on redrive: copy it to start your own.
//!
//! - `ChargeHandler` has its own PSP client. Every attempt sends the job's idempotency key.
//! - A timeout is *ambiguous*: the charge may have been made. This handler does not claim
//!   that a repeat is safe. It answers `Timeout { idempotent: false }`, and its
//!   `query_status` hook asks the PSP (`GET /v1/charges?key=…`) what happened before anything
//!   is repeated.
//! - The policy and the PSP's breaker are set in code. A file given with `--policies` works
//!   too.
//!
//! `cargo run -p payment-worker` runs it against an in-process PSP simulator that loses 30% of
//! its answers after charging, and whose ledger does not refuse a second charge by itself. It
//! prints the charges made: one per payment. Its tests also run it without the PSP's
//! idempotency layer (the status query alone keeps one charge per payment) and, as the
//! negative control, with blind repeats as well (then payments are charged twice).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redrive_policy::{BreakerConfig, Jitter, Outcome, PolicySet, RetryPolicy, StatusTable, Window};
use redrive_psp_sim::{Faults, PspSim};
use redrive_runtime::{Attempted, Handler, JobContext, StatusAnswer, Worker};
use redrive_store::{NewJob, Store};
use serde::Deserialize;
use serde_json::json;

/// What a charge job carries.
#[derive(Debug, Deserialize)]
struct Charge {
    amount: u64,
    currency: String,
}

/// Charges through the PSP's HTTP API.
#[derive(Debug, Clone)]
struct ChargeHandler {
    client: reqwest::Client,
    base: String,
    status: StatusTable,
    /// Ask the PSP after a timeout (the safe way). Off only in the test that shows what
    /// repeating blindly does.
    query_after_timeout: bool,
}

impl ChargeHandler {
    fn new(base: String) -> Self {
        Self {
            client: reqwest::Client::builder()
                .timeout(Duration::from_millis(500))
                .build()
                .expect("a TLS-free client builds"),
            base,
            status: StatusTable::default(),
            query_after_timeout: true,
        }
    }

    async fn charge(self, ctx: JobContext) -> Attempted {
        let c: Charge = match serde_json::from_value(ctx.payload.clone()) {
            Ok(c) => c,
            Err(e) => return Attempted::failure(Outcome::Permanent, format!("payload: {e}")),
        };
        let Some(key) = ctx.key.clone() else {
            return Attempted::failure(Outcome::Permanent, "a charge needs an idempotency key");
        };
        let sent = self
            .client
            .post(format!("{}/v1/charges", self.base))
            .header("Idempotency-Key", &key)
            .json(&json!({"amount": c.amount, "currency": c.currency, "reference": key}))
            .send()
            .await;
        match sent {
            Ok(r) => {
                let code = r.status().as_u16();
                let retry_after = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(Duration::from_secs);
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                match self.status.outcome(code, retry_after) {
                    Outcome::Success => Attempted::success(body).with_status(code),
                    o => Attempted::failure(o, format!("PSP answered {code}")).with_status(code),
                }
            }
            // Sent, no answer: it may have charged. Not safe to repeat blindly.
            Err(e) if e.is_timeout() => Attempted::failure(
                Outcome::Timeout {
                    idempotent: !self.query_after_timeout,
                },
                "PSP did not answer in 500 ms",
            ),
            Err(e) => Attempted::failure(
                Outcome::Infrastructure { retry_after: None },
                format!("PSP unreachable: {e}"),
            ),
        }
    }

    async fn status_of(self, key: String) -> StatusAnswer {
        let url = format!(
            "{}/v1/charges?key={}",
            self.base,
            form_urlencoded::byte_serialize(key.as_bytes()).collect::<String>()
        );
        // 409 (still processing that charge) or a 5xx: ask again a few times.
        for _ in 0..10 {
            match self.client.get(&url).send().await {
                Ok(r) if r.status().as_u16() == 200 => {
                    return StatusAnswer::Succeeded(r.json().await.unwrap_or_default());
                }
                Ok(r) if r.status().as_u16() == 404 => return StatusAnswer::NotFound,
                Ok(r) if r.status().as_u16() == 409 || r.status().is_server_error() => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Ok(r) => {
                    return StatusAnswer::Unknown(format!("status query answered {}", r.status()));
                }
                Err(e) => return StatusAnswer::Unknown(format!("status query failed: {e}")),
            }
        }
        StatusAnswer::Unknown("the PSP kept processing the charge".into())
    }
}

impl Handler for ChargeHandler {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        Box::pin(self.clone().charge(ctx))
    }

    fn query_status(&self, ctx: JobContext) -> Option<BoxFuture<'static, StatusAnswer>> {
        if !self.query_after_timeout {
            return None;
        }
        let key = ctx.key?;
        Some(Box::pin(self.clone().status_of(key)))
    }
}

/// The charge policy and the PSP's breaker. `in_process_max_wait`: how long a retry may be
/// slept in process (`None`: the policy's default); the tests on a test clock set zero, so
/// that every retry is deferred and the clock jumps to it.
fn policies(in_process_max_wait: Option<Duration>) -> anyhow::Result<(PolicySet, RetryPolicy)> {
    let mut policy = RetryPolicy::builder("charge")
        .with_max_attempts(8)
        .with_jitter(Jitter::Full)
        .with_window(Duration::from_secs(120));
    if let Some(wait) = in_process_max_wait {
        policy = policy.with_in_process_max_wait(wait);
    }
    let policy = policy.build()?;
    let mut set = PolicySet::builtin();
    set.insert(policy.clone());
    set.insert_breaker(
        "psp",
        BreakerConfig::builder()
            .with_window(Window::Count { size: 50 })
            .with_minimum_calls(20)
            .with_failure_rate(0.5)
            .with_open_cooldown(Duration::from_secs(2))
            .with_half_open_probes(2)
            .build()?,
    );
    Ok((set, policy))
}

/// Enqueues `n` charges in one transaction: payment `i` is `500 + i` EUR with key `order-i`,
/// on the dependency `psp`, with `policy`'s budget.
async fn enqueue_charges(
    store: &Store,
    n: u64,
    policy: &RetryPolicy,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            NewJob::new(
                "payments",
                "charge",
                json!({"amount": 500 + i, "currency": "EUR"}),
            )
            .key(format!("order-{i}"))
            .dependency("psp")
            .with_policy(policy)
        })
        .collect();
    store.enqueue_many(&jobs, now).await?;
    Ok(())
}

/// What [`run`] saw: payments that succeeded, and the PSP's charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    succeeded: u64,
    charges: u64,
    /// Charges made more than once for one key (the ledger's effects per key).
    duplicates: u64,
}

/// How [`run`] sets the scene. The simulator's ledger never refuses a second charge itself
/// (as a real PSP's ledger would not): what keeps a payment from being charged twice is the
/// PSP's idempotency layer and this handler's status query.
#[derive(Debug, Clone, Copy)]
struct Scene {
    /// The simulator's idempotency layer in front of its charges.
    psp_layer: bool,
    /// The handler asks the PSP after a timeout instead of repeating.
    query_after_timeout: bool,
}

const SAFE: Scene = Scene {
    psp_layer: true,
    query_after_timeout: true,
};

/// Runs `n` charges against an in-process simulator.
async fn run(n: u64, scene: Scene) -> anyhow::Result<Seen> {
    let mut sim = PspSim::builder()
        .faults(Faults {
            error_rate: 0.1,
            timeout_after_commit: 0.3,
            timeout_delay: Duration::from_secs(2),
            seed: Some(7),
            ..Faults::none()
        })
        .ledger_dedupe(false);
    if scene.psp_layer {
        sim = sim.with_idempotency_layer();
    }
    let sim = sim.start("127.0.0.1:0").await?;
    let dir = tempfile::tempdir()?;
    let store = Store::connect(&format!("sqlite:{}", dir.path().join("pay.db").display())).await?;
    let (set, policy) = policies(None)?;
    enqueue_charges(&store, n, &policy, chrono::Utc::now()).await?;
    let worker = Worker::builder(store.clone(), vec!["payments".into()])
        .handler(
            "charge",
            Arc::new(ChargeHandler {
                query_after_timeout: scene.query_after_timeout,
                ..ChargeHandler::new(sim.url())
            }),
        )
        .policies(set)
        .concurrency(8)
        .build()?;
    // Jobs deferred by the breaker come back when due: run until every job is finished.
    let mut succeeded = 0;
    for _ in 0..60 {
        succeeded += worker.run_until_idle().await?.succeeded;
        if succeeded == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let stats = sim.stats();
    sim.shutdown().await;
    for j in store
        .list(&redrive_store::ListParams {
            state: Some(redrive_store::JobState::Dead),
            ..Default::default()
        })
        .await?
        .jobs
    {
        eprintln!(
            "dead: job {} ({}): {}",
            j.id,
            j.dead_reason.map_or("", |r| r.as_str()),
            j.last_error.unwrap_or_default()
        );
    }
    Ok(Seen {
        succeeded,
        charges: stats.charges,
        duplicates: stats.duplicate_effects,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seen = run(50, SAFE).await?;
    println!(
        "{} payments succeeded; the PSP made {} charges ({} twice for one key)",
        seen.succeeded, seen.charges, seen.duplicates
    );
    anyhow::ensure!(
        seen.succeeded == 50 && seen.charges == 50 && seen.duplicates == 0,
        "not one charge per payment"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_runtime::testing::{JobMatch, TestStore};
    use redrive_store::JobState;

    /// What the worker is given to run: checked by queue, kind, key and payload with the
    /// runtime's test helpers.
    #[tokio::test]
    async fn each_payment_is_enqueued_once_with_its_key_and_amount() {
        let t = TestStore::new().await.unwrap();
        let (_, policy) = policies(None).unwrap();
        enqueue_charges(t.store(), 3, &policy, t.clock().now())
            .await
            .unwrap();
        // Enqueued again (a retried request): the keys keep one job per payment.
        enqueue_charges(t.store(), 3, &policy, t.clock().now())
            .await
            .unwrap();
        let second = t
            .assert_enqueued(
                &JobMatch::new()
                    .queue("payments")
                    .kind("charge")
                    .key("order-1")
                    .state(JobState::Available),
            )
            .await;
        assert_eq!(second.payload, json!({"amount": 501, "currency": "EUR"}));
        assert_eq!(second.dependency.as_deref(), Some("psp"));
        assert_eq!((second.policy.as_str(), second.max_attempts), ("charge", 8));
        assert_eq!(
            t.jobs(&JobMatch::new().kind("charge")).await.unwrap().len(),
            3
        );
        t.assert_not_enqueued(&JobMatch::new().key("order-3")).await;
    }

    /// A PSP that answers 5xx to a third of the charges: every payment still succeeds once,
    /// its retries deferred with backoff and the test clock moved to each (no waiting), and
    /// a PSP that only fails dead-letters each payment after its 8 attempts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn retries_run_on_the_test_clock_until_success_or_the_budget_ends() {
        for (error_rate, n) in [(0.3, 10), (1.0, 2)] {
            let sim = PspSim::builder()
                .faults(Faults {
                    error_rate,
                    seed: Some(11),
                    ..Faults::none()
                })
                .ledger_dedupe(false)
                .with_idempotency_layer()
                .start("127.0.0.1:0")
                .await
                .unwrap();
            let t = TestStore::new().await.unwrap();
            let (set, policy) = policies(Some(Duration::ZERO)).unwrap();
            enqueue_charges(t.store(), n, &policy, t.clock().now())
                .await
                .unwrap();
            let worker = t
                .worker(vec!["payments".into()])
                .handler("charge", Arc::new(ChargeHandler::new(sim.url())))
                .policies(set)
                .build()
                .unwrap();
            let start = t.clock().now();
            let summary = t.drain(&worker).await.unwrap();
            let stats = sim.stats();
            sim.shutdown().await;
            let jobs = t.jobs(&JobMatch::new().kind("charge")).await.unwrap();
            let attempts: u64 = jobs.iter().map(|j| u64::from(j.attempts)).sum();
            assert_eq!(
                stats.requests_total, attempts,
                "one PSP request per attempt"
            );
            assert!(t.clock().now() > start, "the backoffs moved the test clock");
            if error_rate < 1.0 {
                assert_eq!(summary.succeeded, n);
                assert!(attempts > n, "some charges were retried: {attempts}");
                assert_eq!((stats.charges, stats.duplicate_effects), (n, 0));
                assert!(jobs.iter().all(|j| j.state == JobState::Succeeded));
            } else {
                assert_eq!((summary.dead, stats.charges), (n, 0));
                assert!(
                    jobs.iter()
                        .all(|j| j.state == JobState::Dead && j.attempts == 8),
                    "{jobs:?}"
                );
            }
        }
    }

    const ONCE_EACH: Seen = Seen {
        succeeded: 30,
        charges: 30,
        duplicates: 0,
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_payment_is_charged_once_even_when_answers_are_lost() {
        assert_eq!(run(30, SAFE).await.unwrap(), ONCE_EACH);
    }

    /// The status query alone (no idempotency layer at the PSP) still charges each payment
    /// once: after a lost answer the handler asks instead of repeating.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_status_query_alone_keeps_one_charge_per_payment() {
        let scene = Scene {
            psp_layer: false,
            query_after_timeout: true,
        };
        assert_eq!(run(30, scene).await.unwrap(), ONCE_EACH);
    }

    /// The negative control: without the PSP's layer and with blind repeats after a lost
    /// answer, payments are charged twice, and the check above sees it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exactly_once_check_catches_a_double_charge_without_layer_or_status_query() {
        let scene = Scene {
            psp_layer: false,
            query_after_timeout: false,
        };
        let seen = run(30, scene).await.unwrap();
        assert_ne!(seen, ONCE_EACH);
        assert!(seen.duplicates > 0 && seen.charges > 30, "{seen:?}");
    }
}
