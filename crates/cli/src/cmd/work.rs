//! `redrive work`: run workers over the queues (built-in kinds: `noop`; `http` comes with
//! the HTTP job kind).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use redrive_runtime::{Noop, Summary, Worker};

use crate::args::{Global, WorkArgs};
use crate::cmd::queue::{block_on, open};
use crate::policies;

pub(crate) fn run(global: &Global, a: WorkArgs) -> anyhow::Result<ExitCode> {
    let set = policies::load(global)?;
    block_on(async move {
        let store = open(global).await?;
        let mut total = Summary::default();
        let mut rx = store.subscribe();
        loop {
            let queues = if a.queues.is_empty() {
                let mut q: Vec<String> =
                    store.counts().await?.into_iter().map(|c| c.queue).collect();
                q.dedup();
                q
            } else {
                a.queues.clone()
            };
            rx.borrow_and_update();
            let left = a.max_jobs.map(|m| m.saturating_sub(total.finished()));
            if left == Some(0) {
                break;
            }
            let s = Worker::builder(store.clone(), queues.clone())
                .handler("noop", Arc::new(Noop))
                .policies(set.clone())
                .concurrency(a.concurrency as usize)
                .max_jobs(left)
                .build()
                .run_until_idle()
                .await?;
            total.add(s);
            if a.until_idle {
                break;
            }
            // Idle: sleep until woken, until the next job is due, or a second at most.
            let wait = match store.next_due(&queues).await? {
                Some(t) => (t - chrono::Utc::now())
                    .to_std()
                    .unwrap_or(Duration::from_millis(20)),
                None => Duration::from_secs(1),
            }
            .clamp(Duration::from_millis(5), Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = rx.changed() => {}
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        println!(
            "succeeded {}, dead {}, deferred {}, lease lost {}, attempts {}",
            total.succeeded, total.dead, total.deferred, total.lease_lost, total.attempts
        );
        Ok(ExitCode::SUCCESS)
    })
}
