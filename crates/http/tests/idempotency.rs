//! The idempotency layer's edge-case suite (T01–T29 in `idempotency_support/cases.rs`), run on the
//! in-memory store, SQLite (a temp file) and PostgreSQL (a schema of its own per test).

mod idempotency_support;

use std::time::Duration;

use axum::body::Body;
use idempotency_support::{Backend, app, builder, cases};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

macro_rules! suite {
    ($backend:ident, $make:expr, [$($case:ident),* $(,)?]) => {
        mod $backend {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(backend) = $make.await else { return };
                    cases::$case(&backend).await;
                }
            )*
        }
    };
}

macro_rules! all_cases {
    ($backend:ident, $make:expr) => {
        suite!(
            $backend,
            $make,
            [
                t01_first_request,
                t02_replay_identical,
                t03_replay_201_location,
                t04_different_body_422,
                t05_different_path_or_method_422,
                t06_fifty_parallel,
                t07_in_flight_409_then_replay,
                t08_missing_key_400,
                t09_invalid_keys_400,
                t10_quoted_and_bare_same,
                t11_scopes_independent,
                t12_5xx_releases,
                t13_panic_releases,
                t14_crash_after_effect_needs_recovery,
                t14_resume_mode_takes_over_without_second_effect,
                t14_finalise_failure_no_second_effect,
                t15_live_lease_then_takeover,
                t16_stale_holder_is_fenced,
                t17_long_handler_keeps_lease,
                t17_lost_heartbeat_stops_handler,
                t18_handler_4xx_stored,
                t19_outer_401_not_stored,
                t20_expired_key_runs_again,
                t21_reaper,
                t23_store_unavailable_fails_closed,
                t24_request_too_large,
                t25_response_too_large,
                t26_client_disconnect,
                t27_replayed_headers,
                t28_canonical_json,
                t29_schema_is_idempotent,
                store_5xx_opt_in,
                t30_list_filters_pages_and_recovery,
                t31_release_stuck,
            ]
        );
    };
}

all_cases!(memory, Backend::memory());
all_cases!(sqlite, Backend::sqlite());
all_cases!(postgres, Backend::postgres());

async fn raw_post(addr: std::net::SocketAddr, key: &str, body: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /charges HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// End to end over a real socket, on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tcp_replays_on_sqlite() {
    let backend = Backend::sqlite().await.unwrap();
    let (router, counters) = app(builder(backend.store()).build().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let body = r#"{"amount":1000,"currency":"EUR"}"#;
    let first = raw_post(addr, "tcp-key-1", body).await;
    let second = raw_post(addr, "tcp-key-1", body).await;
    assert!(first.starts_with("HTTP/1.1 201"), "{first}");
    assert!(second.starts_with("HTTP/1.1 201"), "{second}");
    assert!(!first.to_ascii_lowercase().contains("idempotent-replayed"));
    assert!(
        second
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true")
    );
    let body_of = |r: &str| r.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    assert_eq!(body_of(&first), body_of(&second));
    assert_eq!(counters.effects(), 1);
    let missing = {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"POST /charges HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).await.unwrap();
        r
    };
    assert!(missing.starts_with("HTTP/1.1 400"), "{missing}");
    assert!(missing.contains("application/problem+json"));
    server.abort();
    let _ = Duration::ZERO;
    let _ = Body::empty();
}
