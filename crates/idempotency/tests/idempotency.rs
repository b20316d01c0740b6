//! The idempotency layer's edge-case suite (the cases in `idempotency_support/cases.rs`), run on the
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
                a_first_request_runs_once_and_is_stored,
                an_identical_repeat_gets_the_stored_response,
                a_201_replays_with_its_location,
                the_key_with_another_body_is_422,
                the_key_on_another_path_or_method_is_422,
                fifty_parallel_first_requests_run_once,
                a_repeat_in_flight_is_409_then_replayed,
                a_missing_key_on_a_required_route_is_400,
                malformed_keys_are_400,
                quoted_and_bare_keys_are_one_key,
                scopes_do_not_share_keys,
                a_5xx_releases_the_key,
                a_panic_releases_the_key,
                a_crash_after_the_effect_needs_explicit_recovery,
                resume_mode_takes_over_without_a_second_effect,
                a_failed_finalise_makes_no_second_effect,
                a_live_lease_blocks_until_it_ends_then_is_taken_over,
                a_stale_holder_is_fenced,
                a_long_handler_keeps_its_lease_by_heartbeat,
                a_lost_heartbeat_stops_the_handler,
                a_handler_4xx_is_stored_and_replayed,
                an_outer_401_never_reaches_the_store,
                an_expired_key_runs_again,
                the_reaper_deletes_expired_completed_records,
                an_unavailable_store_fails_closed,
                a_request_over_the_cap_is_413,
                a_response_over_the_cap_is_not_replayed,
                a_client_disconnect_still_finalises,
                only_allowlisted_headers_are_replayed,
                canonical_json_routes_ignore_key_order,
                ensure_schema_is_idempotent,
                a_5xx_is_stored_when_opted_in,
                the_listing_filters_pages_and_sees_recovery,
                release_stuck_lets_the_next_request_run,
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
