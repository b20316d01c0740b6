//! Overhead of the idempotency layer per request, against the same router without it.
//!
//! `cargo bench -p redrive-idempotency --bench idempotency`
//!
//! Groups: `baseline` (no layer), `memory` and `sqlite` (first request with a fresh key:
//! claim + handler + finalise), `*_replay` (a repeat served from the store). SQLite runs in
//! WAL mode with `synchronous=FULL` on a temp file.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use criterion::{Criterion, criterion_group, criterion_main};
use redrive_idempotency::{
    IdempotencyLayer, IdempotencyStore, MemoryIdempotencyStore, SqliteIdempotencyStore,
};
use tower::ServiceExt;

const BODY: &str = r#"{"amount":1000,"currency":"EUR"}"#;

fn router() -> Router {
    Router::new().route(
        "/charges",
        post(|body: String| async move { (StatusCode::CREATED, body) }),
    )
}

fn request(key: &str) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri("/charges")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(BODY))
        .unwrap()
}

async fn call(app: &Router, key: &str) {
    let response = app.clone().oneshot(request(key)).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let _ = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
}

fn bench_layer(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: Arc<dyn IdempotencyStore>,
) {
    let app = router().layer(IdempotencyLayer::new(store));
    let counter = AtomicU64::new(0);
    c.bench_function(name, |b| {
        b.iter(|| {
            let key = format!("bench-{}", counter.fetch_add(1, Ordering::Relaxed));
            rt.block_on(call(&app, &key));
        });
    });
    rt.block_on(call(&app, "bench-replay"));
    c.bench_function(&format!("{name}_replay"), |b| {
        b.iter(|| rt.block_on(call(&app, "bench-replay")))
    });
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let baseline = router();
    c.bench_function("baseline", |b| b.iter(|| rt.block_on(call(&baseline, "k"))));

    bench_layer(c, &rt, "memory", Arc::new(MemoryIdempotencyStore::new()));

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let sqlite = rt.block_on(async {
        let store = SqliteIdempotencyStore::connect(&url).await.unwrap();
        store.ensure_schema().await.unwrap();
        store
    });
    bench_layer(c, &rt, "sqlite", Arc::new(sqlite));
}

criterion_group!(idempotency, benches);
criterion_main!(idempotency);
