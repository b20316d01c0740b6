//! The drain rate of a worker pool with OpenTelemetry export on against off, in the same run.
//!
//! ```text
//! cargo run --release -p redrive-cli --features otel --example otel_overhead -- [JOBS] [ROUNDS]
//! ```
//!
//! Each round enqueues JOBS (default 2,000) `noop` jobs, each with a W3C `traceparent`, in a
//! fresh SQLite file and drains them with 8 workers (`run_until_idle`); rounds alternate off
//! and on (ROUNDS of each, default 5), so both see the same machine. "On": every span of the
//! runtime (one per attempt, a child of the job's stored trace) goes through
//! `tracing-opentelemetry` and a batch processor to an OTLP/HTTP (protobuf) collector on
//! 127.0.0.1 in this process, which counts what it receives. "Off": the same binary with the
//! OpenTelemetry layer filtered out. Prints the median drain rate of each and their ratio.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use redrive_runtime::{Noop, Worker};
use redrive_store::{NewJob, Store};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

static ON: AtomicBool = AtomicBool::new(false);

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let jobs: usize = args.next().map_or(Ok(2000), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |s| s.parse())?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // The collector: accepts OTLP/HTTP exports and counts their bytes.
    let received = Arc::new(AtomicU64::new(0));
    let exports = Arc::new(AtomicU64::new(0));
    let endpoint = {
        let (received, exports) = (received.clone(), exports.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                received.fetch_add(body.len() as u64, Ordering::Relaxed);
                exports.fetch_add(1, Ordering::Relaxed);
                async { "" }
            }),
        );
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        rt.spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/v1/traces")
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .build()?;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(65_536)
                .with_max_export_batch_size(512)
                .with_scheduled_delay(Duration::from_millis(200))
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("redrive"))
        .with_filter(
            tracing_subscriber::filter::DynFilterFn::new(|m, _| {
                ON.load(Ordering::Relaxed)
                    && m.target().starts_with("redrive")
                    && *m.level() <= tracing::Level::INFO
            })
            // Asked at every span, not once per call site: the switch changes between rounds.
            .with_callsite_filter(|_| tracing::subscriber::Interest::sometimes()),
        );
    tracing_subscriber::registry().with(otel).init();

    let mut off = Vec::new();
    let mut on = Vec::new();
    for round in 0..rounds * 2 {
        let export = round % 2 == 1;
        ON.store(export, Ordering::Relaxed);
        let rate = rt.block_on(drain(jobs))?;
        if export {
            provider.force_flush()?;
            on.push(rate);
        } else {
            off.push(rate);
        }
        println!(
            "round {:>2} otel {:<3} {rate:>8.0} jobs/s",
            round + 1,
            if export { "on" } else { "off" }
        );
    }
    provider.shutdown()?;
    let (m_off, m_on) = (median(&mut off), median(&mut on));
    println!(
        "median drain rate: off {m_off:.0} jobs/s, on {m_on:.0} jobs/s, on/off {:.3} \
         ({:+.1}%); {} OTLP exports, {} KiB received",
        m_on / m_off,
        (m_on / m_off - 1.0) * 100.0,
        exports.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed) / 1024
    );
    Ok(())
}

/// Enqueues `n` noop jobs with a traceparent in a fresh SQLite file and drains them; jobs/s.
async fn drain(n: usize) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let store = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display())).await?;
    store.migrate().await?;
    let now = chrono::Utc::now();
    let batch: Vec<NewJob> = (0..n)
        .map(|i| {
            NewJob::new("bench", "noop", serde_json::json!({})).traceparent(format!(
                "00-{:032x}-{:016x}-01",
                0x4bf9_2f35_77b3_4da6_u128 << 64 | (i as u128 + 1),
                i as u64 + 1
            ))
        })
        .collect();
    for chunk in batch.chunks(500) {
        store.enqueue_many(chunk, now).await?;
    }
    let worker = Worker::builder(store, vec!["bench".into()])
        .handler("noop", Arc::new(Noop))
        .concurrency(8)
        .build()?;
    let t0 = Instant::now();
    let s = worker.run_until_idle().await?;
    let took = t0.elapsed().as_secs_f64();
    anyhow::ensure!(s.succeeded as usize == n, "drained {} of {n}", s.succeeded);
    Ok(n as f64 / took)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
