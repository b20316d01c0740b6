//! The `http` kind against hostile or careless targets (issue 16): a huge body, a body that
//! stalls after a 2xx, redirects to another origin, internal addresses, a header with CRLF
//! stored before enqueue validation. Every server here is a raw TCP listener on 127.0.0.1
//! that counts what it receives and sends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redrive_http::{EgressPolicy, HttpJob, RedirectMode};
use redrive_policy::{BreakerState, StatusTable};
use redrive_runtime::Worker;
use redrive_store::{Job, JobState, NewJob, Store};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The `http` kind allowed to call this machine (the servers here listen on 127.0.0.1; the
/// default policy refuses loopback).
fn local_http() -> HttpJob {
    HttpJob::with_egress(StatusTable::default(), EgressPolicy::loopback_only()).unwrap()
}

async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::connect(&format!("sqlite:{}", dir.path().join("q.db").display()))
        .await
        .unwrap();
    (s, dir)
}

/// Reads one request head (up to the blank line) and returns it.
async fn read_head(sock: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut b).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
        if buf.len() > 64 * 1024 {
            break;
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// What a test server saw.
#[derive(Debug, Default)]
struct Seen {
    requests: AtomicU64,
    bytes_sent: AtomicU64,
    closed_early: AtomicBool,
    heads: std::sync::Mutex<Vec<String>>,
}

/// A server answering every connection with `respond(head, socket, seen)`.
async fn server<F, Fut>(respond: F) -> (String, Arc<Seen>)
where
    F: Fn(String, TcpStream, Arc<Seen>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let respond = Arc::new(respond);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = l.accept().await {
            let s = s.clone();
            let respond = respond.clone();
            tokio::spawn(async move {
                let head = read_head(&mut sock).await;
                s.requests.fetch_add(1, Ordering::SeqCst);
                s.heads.lock().unwrap().push(head.clone());
                respond(head, sock, s).await;
            });
        }
    });
    (url, seen)
}

async fn run(store: &Store, job: HttpJob) {
    Worker::builder(store.clone(), vec!["q".into()])
        .handler("http", Arc::new(job))
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
}

async fn enqueue(store: &Store, payload: Value) -> i64 {
    store
        .enqueue(
            &NewJob::new("q", "http", payload)
                .key("k1")
                .policy("background")
                .max_attempts(1),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id
}

async fn finished(store: &Store, id: i64) -> (Job, Vec<redrive_store::Attempt>) {
    (
        store.get(id).await.unwrap().unwrap(),
        store.attempts(id).await.unwrap(),
    )
}

const TOTAL: u64 = 200 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_body_is_read_only_up_to_the_stored_limit() {
    let (url, seen) = server(|_, mut sock, seen| async move {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {TOTAL}\r\n\r\n"
        );
        if sock.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0u64;
        while sent < TOTAL {
            match tokio::time::timeout(Duration::from_secs(10), sock.write_all(&chunk)).await {
                Ok(Ok(())) => sent += chunk.len() as u64,
                _ => {
                    seen.closed_early.store(true, Ordering::SeqCst);
                    break;
                }
            }
            seen.bytes_sent.store(sent, Ordering::SeqCst);
        }
    })
    .await;
    let (s, _d) = store().await;
    let id = enqueue(
        &s,
        json!({"method": "GET", "url": format!("{url}/big"), "timeout_ms": 60000}),
    )
    .await;
    run(&s, local_http()).await;
    let (job, _) = finished(&s, id).await;
    assert_eq!(job.state, JobState::Succeeded, "{:?}", job.last_error);
    let result = job.result.unwrap();
    assert_eq!(result["truncated"], true);
    assert_eq!(
        result["body"].as_str().unwrap().len(),
        redrive_http::job::MAX_RESULT_BODY
    );
    // The server sees the connection close long before the end.
    for _ in 0..100 {
        if seen.closed_early.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = seen.bytes_sent.load(Ordering::SeqCst);
    assert!(seen.closed_early.load(Ordering::SeqCst), "sent {sent}");
    assert!(
        sent < 32 * 1024 * 1024,
        "the reader stopped early: {sent} of {TOTAL} bytes sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_whose_body_stalls_is_an_ambiguous_timeout_not_a_success() {
    let (url, _seen) = server(|_, mut sock, _| async move {
        let _ = sock
            .write_all(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\": \"ch_")
            .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    let (s, _d) = store().await;
    let id = enqueue(
        &s,
        json!({"method": "POST", "url": format!("{url}/v1/charges"), "body": {"amount": 5}, "timeout_ms": 500}),
    )
    .await;
    run(&s, local_http()).await;
    let (job, attempts) = finished(&s, id).await;
    assert_ne!(job.state, JobState::Succeeded);
    assert!(!attempts.is_empty());
    assert!(
        attempts.iter().all(|a| a.class.as_str() == "timeout"),
        "{attempts:?}"
    );
    assert_eq!(attempts[0].http_status, Some(201));
    let e = attempts[0].error.as_deref().unwrap();
    assert!(e.contains("201") && e.contains("timed out"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_followed_and_secret_headers_never_reach_another_origin() {
    let (other, other_seen) = server(|_, mut sock, _| async move {
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await;
    })
    .await;
    let target = format!("{other}/steal");
    let (url, seen) = server(move |head, mut sock, _| {
        let target = target.clone();
        async move {
            // Same-origin hop first, then a 307 to the other origin.
            let location = if head.starts_with("POST /first ") {
                "/second".to_owned()
            } else {
                target
            };
            let _ = sock
                .write_all(
                    format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n")
                        .as_bytes(),
                )
                .await;
        }
    })
    .await;
    let payload = json!({"method": "POST", "url": format!("{url}/first"),
        "headers": {"X-Api-Key": "sk_secret_value"}, "body": {"amount": 5}});

    // Default: not followed at all; the 3xx is permanent and named.
    let (s, _d) = store().await;
    let id = enqueue(&s, payload.clone()).await;
    run(&s, local_http()).await;
    let (job, attempts) = finished(&s, id).await;
    assert_eq!(
        (job.state, job.dead_reason.map(|r| r.as_str())),
        (JobState::Dead, Some("permanent"))
    );
    assert_eq!(attempts[0].http_status, Some(307));
    assert!(
        attempts[0]
            .error
            .as_deref()
            .unwrap()
            .contains("redirect to /second not followed"),
        "{attempts:?}"
    );
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
    assert_eq!(other_seen.requests.load(Ordering::SeqCst), 0);

    // Same-origin mode: the first hop is followed, the cross-origin one is not.
    let (s, _d2) = store().await;
    let id = enqueue(&s, payload).await;
    let job = HttpJob::with_egress(
        StatusTable::default(),
        EgressPolicy::loopback_only().with_redirects(RedirectMode::SameOrigin),
    )
    .unwrap();
    run(&s, job).await;
    let (job, attempts) = finished(&s, id).await;
    assert_eq!(job.state, JobState::Dead);
    assert!(
        attempts[0]
            .error
            .as_deref()
            .unwrap()
            .contains("/steal not followed"),
        "{attempts:?}"
    );
    assert_eq!(
        seen.requests.load(Ordering::SeqCst),
        3,
        "first, then /second"
    );
    assert!(seen.heads.lock().unwrap()[2].starts_with("POST /second "));
    assert_eq!(
        other_seen.requests.load(Ordering::SeqCst),
        0,
        "the secret header never reached the other origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_a_denied_address_is_refused_before_any_byte_is_sent() {
    let (url, seen) = server(|_, mut sock, _| async move {
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await;
    })
    .await;
    let port = url.rsplit(':').next().unwrap().to_owned();
    // `localhost` is a name: it passes the name rules and is refused by the addresses it
    // resolves to (the rules below name addresses, not the name; loopback is allowed, the
    // deny entries win).
    let policy = || {
        EgressPolicy::loopback_only()
            .with_deny("deny_hosts", "127.0.0.0/8")
            .unwrap()
            .with_deny("deny_hosts", "::1")
            .unwrap()
    };
    let (s, _d) = store().await;
    let by_name = enqueue(
        &s,
        json!({"method": "GET", "url": format!("http://localhost:{port}/")}),
    )
    .await;
    let by_addr = s
        .enqueue(
            &NewJob::new(
                "q",
                "http",
                json!({"method": "GET", "url": format!("{url}/")}),
            )
            .max_attempts(1),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id;
    run(
        &s,
        HttpJob::with_egress(StatusTable::default(), policy()).unwrap(),
    )
    .await;
    for id in [by_name, by_addr] {
        let (job, attempts) = finished(&s, id).await;
        assert_eq!(
            (job.state, job.dead_reason.map(|r| r.as_str())),
            (JobState::Dead, Some("permanent")),
            "{attempts:?}"
        );
        let e = attempts[0].error.as_deref().unwrap();
        assert!(
            e.contains("egress denied") && e.contains("deny_hosts"),
            "{e}"
        );
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 0);
    // The same server is reachable once loopback is allowed.
    let (s, _d2) = store().await;
    let id = enqueue(
        &s,
        json!({"method": "GET", "url": format!("http://localhost:{port}/")}),
    )
    .await;
    run(&s, local_http()).await;
    assert_eq!(finished(&s, id).await.0.state, JobState::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_header_with_crlf_is_permanent_at_once_and_never_feeds_the_breaker() {
    let (url, seen) = server(|_, mut sock, _| async move {
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await;
    })
    .await;
    let (s, _d) = store().await;
    // Stored directly, as a job enqueued before validation existed would be.
    let id = s
        .enqueue(
            &NewJob::new(
                "q",
                "http",
                json!({"method": "POST", "url": format!("{url}/x"),
                       "headers": {"X-Trace": "a\r\nX-Injected: 1"}}),
            )
            .key("crlf"),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id;
    run(&s, local_http()).await;
    let (job, attempts) = finished(&s, id).await;
    assert_eq!(
        (
            job.state,
            job.dead_reason.map(|r| r.as_str()),
            attempts.len()
        ),
        (JobState::Dead, Some("permanent"), 1),
        "{attempts:?}"
    );
    assert_eq!(attempts[0].class.as_str(), "permanent");
    assert!(
        attempts[0]
            .error
            .as_deref()
            .unwrap()
            .contains("payload.headers.X-Trace"),
        "{attempts:?}"
    );
    assert_eq!(seen.requests.load(Ordering::SeqCst), 0);
    for d in s.dependencies().await.unwrap() {
        assert_eq!(d.flow.state, BreakerState::Closed, "{d:?}");
    }
}

/// The default policy refuses this machine (issue 36): by address and by a name resolving to
/// it, nothing is sent, and the attempt says which rule refused and how to allow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_refuses_loopback_and_says_how_to_allow_it() {
    let (url, seen) = server(|_, mut sock, _| async move {
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await;
    })
    .await;
    let port = url.rsplit(':').next().unwrap().to_owned();
    let (s, _d) = store().await;
    let by_addr = enqueue(&s, json!({"method": "GET", "url": format!("{url}/")})).await;
    let by_name = s
        .enqueue(
            &NewJob::new(
                "q",
                "http",
                json!({"method": "GET", "url": format!("http://localhost:{port}/")}),
            )
            .max_attempts(1),
            chrono::Utc::now(),
        )
        .await
        .unwrap()
        .job
        .id;
    run(&s, HttpJob::default()).await;
    for (id, entry) in [(by_addr, "127.0.0.1"), (by_name, "localhost")] {
        let (job, attempts) = finished(&s, id).await;
        assert_eq!(
            (job.state, job.dead_reason.map(|r| r.as_str())),
            (JobState::Dead, Some("permanent")),
            "{attempts:?}"
        );
        let e = attempts[0].error.as_deref().unwrap();
        assert!(e.contains("egress denied"), "{e}");
        assert!(e.contains("(loopback), denied by default"), "{e}");
        assert!(e.contains(&format!("--allow-host {entry}")), "{e}");
        assert!(e.contains("[egress]"), "{e}");
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 0, "nothing was sent");
}
