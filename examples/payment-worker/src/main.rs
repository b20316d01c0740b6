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
//! its answers after charging. It prints the charges made: one per payment.

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
                Outcome::Timeout { idempotent: false },
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
        let key = ctx.key?;
        Some(Box::pin(self.clone().status_of(key)))
    }
}

fn policies() -> anyhow::Result<(PolicySet, RetryPolicy)> {
    let policy = RetryPolicy::builder("charge")
        .with_max_attempts(8)
        .with_jitter(Jitter::Full)
        .with_window(Duration::from_secs(120))
        .build()?;
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

/// Runs `n` charges against an in-process simulator; returns (succeeded, charges made).
async fn run(n: u64) -> anyhow::Result<(u64, u64)> {
    let sim = PspSim::builder()
        .faults(Faults {
            error_rate: 0.1,
            timeout_after_commit: 0.3,
            timeout_delay: Duration::from_secs(2),
            seed: Some(7),
            ..Faults::none()
        })
        .with_idempotency_layer()
        .start("127.0.0.1:0")
        .await?;
    let dir = tempfile::tempdir()?;
    let store = Store::connect(&format!("sqlite:{}", dir.path().join("pay.db").display())).await?;
    let (set, policy) = policies()?;
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            NewJob::new(
                "payments",
                "charge",
                json!({"amount": 500 + i, "currency": "EUR"}),
            )
            .key(format!("order-{i}"))
            .dependency("psp")
            .with_policy(&policy)
        })
        .collect();
    store.enqueue_many(&jobs, chrono::Utc::now()).await?;
    let worker = Worker::builder(store.clone(), vec!["payments".into()])
        .handler("charge", Arc::new(ChargeHandler::new(sim.url())))
        .policies(set)
        .concurrency(8)
        .build();
    // Jobs deferred by the breaker come back when due: run until every job is finished.
    let mut succeeded = 0;
    for _ in 0..60 {
        succeeded += worker.run_until_idle().await?.succeeded;
        if succeeded == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let charges = sim.stats().charges;
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
            j.dead_reason.unwrap_or_default(),
            j.last_error.unwrap_or_default()
        );
    }
    Ok((succeeded, charges))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (succeeded, charges) = run(50).await?;
    println!("{succeeded} payments succeeded; the PSP made {charges} charges");
    anyhow::ensure!(
        succeeded == 50 && charges == 50,
        "not one charge per payment"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_payment_is_charged_once_even_when_answers_are_lost() {
        let (succeeded, charges) = super::run(30).await.unwrap();
        assert_eq!((succeeded, charges), (30, 30));
    }
}
