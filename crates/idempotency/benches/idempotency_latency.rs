//! Latency of one request through the idempotency layer over real HTTP, p50 and p99, against
//! the same router without it.
//!
//! ```text
//! cargo bench -p redrive-idempotency --bench idempotency_latency
//! cargo bench -p redrive-idempotency --bench idempotency_latency -- --requests 5000
//! ```
//!
//! Each variant is its own axum server on `127.0.0.1:0`; one reqwest client (keep-alive)
//! sends `POST /charges` one at a time. The variants take turns in rounds of 100 requests,
//! so a burst of load from elsewhere on the machine hits all of them alike. Variants: no
//! layer; the layer on the memory, SQLite (temp file, WAL, `synchronous=FULL`) and
//! PostgreSQL stores, each with a fresh key per request (`new`: claim, handler, finalise)
//! and with one key repeated (`replay`: served from the store). PostgreSQL uses
//! `REDRIVE_BENCH_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`) in a
//! schema of its own, dropped at the end; it is left out, with a note, when unreachable.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use redrive_idempotency::{
    IdempotencyLayer, IdempotencyStore, MemoryIdempotencyStore, PostgresIdempotencyStore,
    SqliteIdempotencyStore,
};

const BODY: &str = r#"{"amount":1000,"currency":"EUR"}"#;
const ROUND: usize = 100;

fn router() -> Router {
    Router::new().route(
        "/charges",
        post(|body: String| async move { (StatusCode::CREATED, body) }),
    )
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

/// How a variant picks the key of each request.
#[derive(Clone, Copy)]
enum Keys {
    None,
    Fresh,
    Replay,
}

struct Variant {
    name: String,
    url: String,
    keys: Keys,
    samples: Vec<Duration>,
    sent: u64,
}

impl Variant {
    fn new(name: impl Into<String>, addr: SocketAddr, keys: Keys) -> Self {
        Self {
            name: name.into(),
            url: format!("http://{addr}/charges"),
            keys,
            samples: Vec::new(),
            sent: 0,
        }
    }

    async fn send(&mut self, client: &reqwest::Client, record: bool) {
        let mut request = client
            .post(&self.url)
            .header("content-type", "application/json")
            .body(BODY);
        match self.keys {
            Keys::None => {}
            Keys::Fresh => {
                request = request.header(
                    "idempotency-key",
                    format!("{}-{}", self.name.replace(' ', "-"), self.sent),
                )
            }
            Keys::Replay => request = request.header("idempotency-key", "replayed-key"),
        }
        self.sent += 1;
        let start = Instant::now();
        let response = request.send().await.expect("request");
        let status = response.status();
        let body = response.bytes().await.expect("body");
        let took = start.elapsed();
        assert_eq!(
            status,
            reqwest::StatusCode::CREATED,
            "{}: {body:?}",
            self.name
        );
        assert_eq!(&body[..], BODY.as_bytes(), "{}", self.name);
        if record {
            self.samples.push(took);
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    // Nearest rank: the smallest sample with at least p of the samples at or below it.
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn requests_from_args() -> usize {
    let mut args = std::env::args().skip(1);
    let mut requests = 3000;
    while let Some(arg) = args.next() {
        if arg == "--requests" {
            let value = args.next().unwrap_or_default();
            requests = value.parse().unwrap_or_else(|_| {
                eprintln!("--requests: expected a positive whole number, got {value:?}");
                std::process::exit(2);
            });
        }
        // Anything else (cargo passes `--bench`) is ignored.
    }
    requests.max(ROUND)
}

struct PgSchema {
    admin: sqlx::PgPool,
    schema: String,
}

async fn postgres(url: &str) -> Result<(PostgresIdempotencyStore, PgSchema), String> {
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(3))
        .connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let schema = format!("idem_bench_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .map_err(|e| e.to_string())?;
    let store = PostgresIdempotencyStore::connect_in_schema(url, &schema, 8)
        .await
        .map_err(|e| e.to_string())?;
    store.ensure_schema().await.map_err(|e| e.to_string())?;
    Ok((store, PgSchema { admin, schema }))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let requests = requests_from_args();
    let rounds = requests.div_ceil(ROUND);

    let mut variants = vec![Variant::new("no layer", serve(router()).await, Keys::None)];
    let add = |variants: &mut Vec<Variant>, name: &str, addr: SocketAddr| {
        variants.push(Variant::new(format!("{name} new"), addr, Keys::Fresh));
        variants.push(Variant::new(format!("{name} replay"), addr, Keys::Replay));
    };

    let memory: Arc<dyn IdempotencyStore> = Arc::new(MemoryIdempotencyStore::new());
    let addr = serve(router().layer(IdempotencyLayer::new(memory))).await;
    add(&mut variants, "memory", addr);

    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite_url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let sqlite = SqliteIdempotencyStore::connect(&sqlite_url)
        .await
        .expect("open sqlite");
    sqlite.ensure_schema().await.expect("sqlite schema");
    let sqlite: Arc<dyn IdempotencyStore> = Arc::new(sqlite);
    let addr = serve(router().layer(IdempotencyLayer::new(sqlite))).await;
    add(&mut variants, "sqlite", addr);

    let pg_url = std::env::var("REDRIVE_BENCH_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pg = match postgres(&pg_url).await {
        Ok((store, schema)) => {
            let store: Arc<dyn IdempotencyStore> = Arc::new(store);
            let addr = serve(router().layer(IdempotencyLayer::new(store))).await;
            add(&mut variants, "postgres", addr);
            Some(schema)
        }
        Err(e) => {
            eprintln!("note: PostgreSQL at {pg_url} left out: {e}");
            None
        }
    };

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(4)
        .build()
        .expect("client");
    // Warm-up: open the connections, fill the caches, store the replayed key.
    for variant in &mut variants {
        for _ in 0..ROUND {
            variant.send(&client, false).await;
        }
    }
    for round in 0..rounds {
        for variant in &mut variants {
            for _ in 0..ROUND {
                variant.send(&client, true).await;
            }
        }
        if (round + 1) % 10 == 0 {
            eprintln!("round {}/{rounds}", round + 1);
        }
    }

    println!(
        "{} requests per variant, sequential, over loopback HTTP (rounds of {ROUND}, interleaved)",
        rounds * ROUND
    );
    println!(
        "{:<18} {:>10} {:>10} {:>10} {:>14} {:>14}",
        "variant", "p50 µs", "p99 µs", "mean µs", "p50 overhead", "p99 overhead"
    );
    let mut base: Option<(Duration, Duration)> = None;
    for variant in &mut variants {
        variant.samples.sort_unstable();
        let p50 = percentile(&variant.samples, 0.50);
        let p99 = percentile(&variant.samples, 0.99);
        let mean = variant.samples.iter().sum::<Duration>() / variant.samples.len() as u32;
        let (b50, b99) = *base.get_or_insert((p50, p99));
        println!(
            "{:<18} {:>10.1} {:>10.1} {:>10.1} {:>14.1} {:>14.1}",
            variant.name,
            micros(p50),
            micros(p99),
            micros(mean),
            micros(p50) - micros(b50),
            micros(p99) - micros(b99),
        );
    }

    if let Some(PgSchema { admin, schema }) = pg {
        let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&admin).await {
            eprintln!("note: could not drop schema {schema}: {e}");
        }
    }
}
