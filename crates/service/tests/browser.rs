//! The dashboard in a real browser (headless Chromium through chromedriver, driven by
//! fantoccini): a dead job is replayed from `/dead`, a worker then succeeds, and the job page
//! shows "succeeded"; a job is found by its idempotency key through the search box, and the
//! workers page opens from the nav; then the operator controls: the queue is paused from the
//! overview, a breaker forced open from `/breakers` (which then reads "open (forced)" there
//! and on the overview), the paused queue's job says why it waits, and `/audit` names all
//! three actions.
//! Screenshots go to `target/browser-artifacts/` (`dashboard.png`, `overview.png`,
//! `audit.png`).
//!
//! Without `chromium`/`chromedriver` on PATH the test prints why and passes, unless `CI=true`,
//! where it fails: `crates/service/tests/browser-setup.sh` installs them.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use redrive_service::{AppConfig, serve_listener};
use redrive_store::JobState;
use serde_json::json;
use support::*;

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_a_dead_job_from_the_dashboard() {
    let ci = redrive_testkit::ci();
    let chromium = on_path(&["chromium", "chromium-browser"]);
    let driver_bin = on_path(&["chromedriver"]);
    let (Some(chromium), Some(driver_bin)) = (chromium, driver_bin) else {
        let msg = "chromium and/or chromedriver are not on PATH \
                   (run crates/service/tests/browser-setup.sh)";
        if ci {
            panic!("{msg}; CI=true, so this is a failure");
        }
        eprintln!("skipping the browser test: {msg}");
        return;
    };

    let h = sqlite(AppConfig::default()).await;
    let id = dead_job(
        &h.store,
        "pay",
        json!({"method": "POST", "url": "https://psp.test/c", "headers": {"Authorization": "Bearer sk_live_browser"}}),
        "card declined (code 51)",
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_listener(listener, h.state.clone(), async {
        let _ = stopped.await;
    }));

    let port = free_port();
    let _driver = Driver(
        Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let caps: serde_json::Map<String, serde_json::Value> = serde_json::from_value(json!({
        "goog:chromeOptions": {
            "binary": chromium.display().to_string(),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,1000"]
        }
    }))
    .unwrap();
    let webdriver = format!("http://127.0.0.1:{port}");
    let mut client = None;
    for _ in 0..100 {
        match ClientBuilder::rustls()
            .expect("tls")
            .capabilities(caps.clone())
            .connect(&webdriver)
            .await
        {
            Ok(c) => {
                client = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let c = client.expect("chromedriver did not accept a session within 10 s");

    c.goto(&format!("{base}/dead")).await.unwrap();
    let total = c
        .find(Locator::Css("#dead-total"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(total, "1");
    let source = c.source().await.unwrap();
    assert!(source.contains("card declined (code N)"), "{source}");
    c.find(Locator::Css(&format!(
        "button[formaction='/jobs/{id}/replay']"
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    // The form post redirects to the job page.
    for _ in 0..50 {
        if c.current_url().await.unwrap().path() == format!("/jobs/{id}") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(c.current_url().await.unwrap().path(), format!("/jobs/{id}"));
    assert_eq!(
        h.store.get(id).await.unwrap().unwrap().state,
        JobState::Available
    );

    work(&h.store, "pay", "charge", Arc::new(Succeeds)).await;
    c.refresh().await.unwrap();
    let state = c
        .find(Locator::Css("#job-state"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(state, "succeeded");
    let page = c.source().await.unwrap();
    assert!(!page.contains("sk_live_browser"), "secret shown: {page}");
    assert!(
        page.contains("replay 1"),
        "the replayed attempt is on the timeline"
    );

    c.goto(&format!("{base}/jobs/{id}")).await.unwrap();
    let png = c.screenshot().await.unwrap();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/browser-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dashboard.png"), &png).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    c.goto(&format!("{base}/")).await.unwrap();
    std::fs::write(dir.join("overview.png"), c.screenshot().await.unwrap()).unwrap();

    // The search box of every page finds a job by its idempotency key.
    let keyed = h
        .store
        .enqueue(
            &redrive_store::NewJob::new("pay", "charge", json!({})).key("order-4711"),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id;
    c.goto(&format!("{base}/dead")).await.unwrap();
    c.find(Locator::Css("#search-q"))
        .await
        .unwrap()
        .send_keys("order-4711\n")
        .await
        .unwrap();
    for _ in 0..50 {
        if c.current_url().await.unwrap().path() == format!("/jobs/{keyed}") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        c.current_url().await.unwrap().path(),
        format!("/jobs/{keyed}")
    );
    let fields = c
        .find(Locator::Css("#fields"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(fields.contains("order-4711"), "{fields}");
    // The workers page, from the nav: no live worker, and the keyed charge flagged.
    c.find(Locator::Css("header a[href='/workers']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#no-workers"))
        .await
        .unwrap();
    let flagged = c
        .find(Locator::Css("#unhandled"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(flagged.contains("charge"), "{flagged}");
    // Operator controls: pause the queue from the overview.
    c.goto(&format!("{base}/")).await.unwrap();
    c.find(Locator::Css("form[action='/queues/pay/pause'] button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_until(|| async { !h.store.paused_queues().await.unwrap().is_empty() }).await;
    c.goto(&format!("{base}/")).await.unwrap();
    let paused = c
        .find(Locator::Css("tr[data-queue='pay'] .paused"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(paused, "paused");
    // Force a breaker open from the breakers page.
    h.store
        .set_breaker(&redrive_store::BreakerUpdate {
            dependency: "psp".into(),
            expect: None,
            state: redrive_policy::BreakerState::Closed,
            open_until: None,
            probe_permits: 0,
            reason: "seen".into(),
            now: chrono::Utc::now(),
        })
        .await
        .unwrap();
    c.goto(&format!("{base}/breakers")).await.unwrap();
    c.find(Locator::Css(
        "form[action='/breakers/psp/force'] button.force-open",
    ))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    wait_until(|| async {
        h.store.dependency("psp").await.unwrap().unwrap().flow.mode
            == redrive_policy::BreakerMode::ForcedOpen
    })
    .await;
    c.goto(&format!("{base}/breakers")).await.unwrap();
    let shown = c
        .find(Locator::Css("tr[data-name='psp'] td.override"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(shown.contains("forced open"), "{shown}");
    // Issue 37: the state column and the overview read it as the fleet sees it (they said
    // "closed"), and a job held by the paused queue says so (it read plain "available").
    let state = c
        .find(Locator::Css("tr[data-name='psp'] td.state"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(state, "open (forced)");
    c.goto(&format!("{base}/")).await.unwrap();
    let counts = c
        .find(Locator::Css("#breaker-counts"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(counts.contains("0 closed"), "{counts}");
    assert!(counts.contains("1 open (forced)"), "{counts}");
    c.goto(&format!("{base}/jobs/{keyed}")).await.unwrap();
    let waiting = c
        .find(Locator::Css("#waiting"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(waiting.contains("queue paused"), "{waiting}");
    // The audit page names every action.
    c.goto(&format!("{base}/audit")).await.unwrap();
    let mut actions = Vec::new();
    for row in c.find_all(Locator::Css("#audit td.action")).await.unwrap() {
        actions.push(row.text().await.unwrap());
    }
    assert_eq!(actions, vec!["breaker_force", "queue_pause", "replay"]);
    std::fs::write(dir.join("audit.png"), c.screenshot().await.unwrap()).unwrap();

    c.close().await.unwrap();
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    h.cleanup().await;
}

/// Waits (at most 5 s) until `f` holds.
async fn wait_until<F, Fut>(f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..50 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within 5 s");
}
