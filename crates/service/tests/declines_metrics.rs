//! The decline metrics, as `/metrics` exposes them: `redrive_declines_total` and
//! `redrive_reattempts_blocked_total`.

mod support;

use std::sync::Arc;

use futures::future::BoxFuture;
use redrive_policy::{DeclineAdvice, Outcome};
use redrive_runtime::{Attempted, Handler, JobContext};
use redrive_service::AppConfig;
use redrive_store::{NewJob, Selection};
use serde_json::json;
use support::*;

#[derive(Debug)]
struct DeclinesCat1;

impl Handler for DeclinesCat1 {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        let advice = DeclineAdvice::visa("14", None).unwrap();
        Box::pin(async move { Attempted::failure(Outcome::Declined(advice), "declined") })
    }
}

#[tokio::test]
async fn declines_and_blocked_reattempts_are_counted() {
    let handle = prometheus();
    let h = sqlite(AppConfig {
        prometheus: Some(handle),
        ..Default::default()
    })
    .await;
    let now = chrono::Utc::now();
    let id = h
        .store
        .enqueue(
            &NewJob::new("card-q", "charge", json!({}))
                .quota_key("fp_metrics")
                .dependency("psp-metrics"),
            now,
        )
        .await
        .unwrap()
        .job
        .id;
    work(&h.store, "card-q", "charge", Arc::new(DeclinesCat1)).await;
    // The operator replays the dead job: the card's rule still forbids the call.
    h.store
        .replay(&Selection::Ids(vec![id]), now)
        .await
        .unwrap();
    work(&h.store, "card-q", "charge", Arc::new(DeclinesCat1)).await;
    let body = send(&h.app(), get("/metrics")).await.body;
    assert!(
        body.contains(
            "redrive_declines_total{dependency=\"psp-metrics\",network=\"visa\",category=\"1\"} 1"
        ),
        "{body}"
    );
    assert!(
        body.contains("redrive_reattempts_blocked_total{reason=\"do_not_retry\"} 1"),
        "{body}"
    );
    h.cleanup().await;
}
