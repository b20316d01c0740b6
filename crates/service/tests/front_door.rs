//! Issue 16, the service's front door, over real HTTP on 127.0.0.1:0 with a raw HTTP/1.1
//! client (so `Host`, `Origin` and malformed requests are sent exactly as written):
//! finding 3 (cross-site writes and DNS rebinding), finding 11 (login `next`, sessions),
//! `/metrics` behind the token, 414/431 as problem+json and the dashboard's redaction.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use redrive_service::{AppConfig, AppState, ConnLimits, serve_listener};
use redrive_store::ManualClock;
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "front-door-token-0123456789";

/// A served app; stops (and waits) on [`Served::stop`].
struct Served {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), redrive_service::ServiceError>>,
}

impl Served {
    async fn start(state: &AppState) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_listener(listener, state.clone(), async {
            let _ = stopped.await;
        }));
        Self { addr, stop, task }
    }

    /// `127.0.0.1:PORT`, the Host a local client sends.
    fn host(&self) -> String {
        self.addr.to_string()
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// A response as read off the wire.
#[derive(Debug)]
struct Wire {
    status: u16,
    head: String,
    body: String,
}

impl Wire {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    fn headers(&self, name: &str) -> Vec<String> {
        self.head
            .lines()
            .skip(1)
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
            .collect()
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.head, self.body))
    }

    /// Asserts an `application/problem+json` answer with this status.
    fn assert_problem(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}\n{}", self.head, self.body);
        assert_eq!(
            self.header("content-type").as_deref(),
            Some("application/problem+json"),
            "{}",
            self.head
        );
        let p = self.json();
        assert_eq!(p["status"], status, "{}", self.body);
        for k in ["type", "title", "detail"] {
            assert!(p[k].is_string(), "{k} missing: {}", self.body);
        }
        p
    }
}

/// Sends `head` (request line and headers, without the final blank line; `Connection: close`
/// and `Content-Length` are added) and `body`, and reads the whole answer.
async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> Wire {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw_on(s, head, body).await
}

/// As [`raw`], from the local address `from` (another loopback address, e.g. `127.0.0.2`,
/// is another client to the server).
async fn raw_from(from: &str, addr: SocketAddr, head: &str, body: &[u8]) -> Wire {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let s = sock.connect(addr).await.unwrap();
    raw_on(s, head, body).await
}

async fn raw_on(mut s: tokio::net::TcpStream, head: &str, body: &[u8]) -> Wire {
    let mut req = head
        .trim_end()
        .replace('\n', "\r\n")
        .replace("\r\r\n", "\r\n");
    req.push_str(&format!(
        "\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    ));
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Wire {
        status,
        head: head.replace("\r\n", "\n"),
        body: body.to_owned(),
    }
}

fn with_token() -> AppConfig {
    AppConfig {
        token: Some(TOKEN.into()),
        ..Default::default()
    }
}

/// Finding 3: without a token, a page on any site could POST `text/plain` JSON to
/// `/v1/jobs` and cancel jobs, and a DNS-rebound `Host: evil.example` reached `/v1` and the
/// dashboard's purge.
#[tokio::test]
async fn finding_3_cross_site_writes_and_foreign_hosts_are_refused_without_a_token() {
    let h = sqlite(AppConfig::default()).await;
    let dead = dead_job(&h.store, "pay", json!({}), "declined").await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    let job = br#"{"queue": "q", "kind": "noop"}"#;

    // A browser's "simple" cross-site POST: text/plain (or no type at all) is refused.
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let head = match ct {
            Some(ct) => format!("POST /v1/jobs HTTP/1.1\nHost: {host}\nContent-Type: {ct}"),
            None => format!("POST /v1/jobs HTTP/1.1\nHost: {host}"),
        };
        let r = raw(s.addr, &head, job).await;
        let p = r.assert_problem(415);
        assert_eq!(p["field"], "Content-Type", "{}", r.body);
    }
    assert_eq!(
        h.store.counts().await.unwrap().len(),
        1,
        "only the dead job"
    );
    let ok = raw(
        s.addr,
        &format!(
            "POST /v1/jobs HTTP/1.1\nHost: {host}\nContent-Type: application/json; charset=utf-8"
        ),
        job,
    )
    .await;
    assert_eq!(ok.status, 201, "{}", ok.body);
    let id = ok.json()["job"]["id"].as_i64().unwrap();

    // A cross-origin Origin on a write is refused, even with the right content type.
    for origin in ["http://evil.example", "null", "http://localhost:1"] {
        let r = raw(
            s.addr,
            &format!("POST /v1/jobs/{id}/cancel HTTP/1.1\nHost: {host}\nOrigin: {origin}"),
            b"",
        )
        .await;
        let p = r.assert_problem(403);
        assert_eq!(p["field"], "Origin", "{}", r.body);
    }
    let r = raw(
        s.addr,
        &format!("POST /v1/jobs HTTP/1.1\nHost: {host}\nOrigin: https://evil.example\nContent-Type: application/json"),
        job,
    )
    .await;
    r.assert_problem(403);
    let j = h.store.get(id).await.unwrap().unwrap();
    assert_eq!(j.state, redrive_store::JobState::Available, "not cancelled");
    // The same origin may write.
    let r = raw(
        s.addr,
        &format!("POST /v1/jobs/{id}/cancel HTTP/1.1\nHost: {host}\nOrigin: http://{host}"),
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);

    // DNS rebinding: a foreign Host gets 421 on the API, the dashboard and its purge.
    for (method, path, extra) in [
        ("GET", "/v1/jobs", ""),
        ("GET", "/", ""),
        ("GET", "/healthz", ""),
        (
            "POST",
            "/dead/purge",
            "\nOrigin: http://evil.example\nContent-Type: application/x-www-form-urlencoded",
        ),
    ] {
        let body: &[u8] = if method == "POST" {
            b"all=1&confirm=yes"
        } else {
            b""
        };
        let r = raw(
            s.addr,
            &format!("{method} {path} HTTP/1.1\nHost: evil.example{extra}"),
            body,
        )
        .await;
        let p = r.assert_problem(421);
        assert_eq!(p["field"], "Host", "{path}: {}", r.body);
        assert_eq!(p["value"], "evil.example", "{}", r.body);
    }
    assert!(h.store.get(dead).await.unwrap().is_some(), "not purged");
    // Loopback names, with any port, are this host.
    for name in [
        "localhost",
        "LOCALHOST:80",
        "127.0.0.1",
        "[::1]:8080",
        &host,
    ] {
        let r = raw(s.addr, &format!("GET /v1/jobs HTTP/1.1\nHost: {name}"), b"").await;
        assert_eq!(r.status, 200, "{name}: {}", r.body);
    }
    s.stop().await;
    h.cleanup().await;
}

/// Finding 11: `next=/\t/evil.com` came back as `Location: /\t/evil.com`, CRLF in `next` was
/// a 500, and the session cookie was a fixed hash of the token, still valid after logout.
#[tokio::test]
async fn finding_11_login_next_is_a_local_path_and_sessions_are_random_and_revoked() {
    let h = sqlite(with_token()).await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    let login = |next: &str| {
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("token", TOKEN)
            .append_pair("next", next)
            .finish();
        let head = format!(
            "POST /login HTTP/1.1\nHost: {host}\nOrigin: http://{host}\nContent-Type: application/x-www-form-urlencoded"
        );
        async move { raw(s.addr, &head, body.as_bytes()).await }
    };
    for (next, want) in [
        ("/\t/evil.com", "/"),
        ("/\\evil.com", "/"),
        ("//evil.com", "/"),
        ("/dead\r\nSet-Cookie: x=1", "/"),
        ("/dead\u{7f}", "/"),
        ("https://evil.com/", "/"),
        ("/jobs?state=dead", "/jobs?state=dead"),
    ] {
        let r = login(next).await;
        assert_eq!(r.status, 303, "{next:?}: {}", r.body);
        assert_eq!(r.header("location").as_deref(), Some(want), "{next:?}");
    }
    // The form echoes only a safe `next`.
    let r = raw(
        s.addr,
        &format!("GET /login?next=%2F%0D%0A%2Fevil.com HTTP/1.1\nHost: {host}"),
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains(r#"name="next" value="/""#), "{}", r.body);

    // Each login is a new random session; logout revokes it on the server.
    let cookie = |r: &Wire| {
        r.header("set-cookie")
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned()
    };
    let first = cookie(&login("/").await);
    let second = cookie(&login("/").await);
    assert_ne!(first, second, "a session id is not derived from the token");
    let page = |c: String| {
        let head = format!("GET /dead HTTP/1.1\nHost: {host}\nCookie: {c}");
        async move { raw(s.addr, &head, b"").await.status }
    };
    assert_eq!(page(first.clone()).await, 200);
    assert_eq!(page(second.clone()).await, 200);
    let out = raw(
        s.addr,
        &format!("POST /logout HTTP/1.1\nHost: {host}\nOrigin: http://{host}\nCookie: {first}"),
        b"",
    )
    .await;
    assert_eq!(out.status, 303, "{}", out.body);
    assert!(
        out.header("set-cookie").unwrap().contains("Max-Age=0"),
        "{}",
        out.head
    );
    assert_eq!(page(first).await, 303, "a revoked session is signed out");
    assert_eq!(page(second).await, 200, "other sessions stay");
    s.stop().await;
    h.cleanup().await;
}

/// `/metrics` was open to anyone even with a token configured.
#[tokio::test]
async fn metrics_need_the_token_when_one_is_set() {
    let h = sqlite(AppConfig {
        prometheus: Some(prometheus()),
        ..with_token()
    })
    .await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    let r = raw(s.addr, &format!("GET /metrics HTTP/1.1\nHost: {host}"), b"").await;
    r.assert_problem(401);
    assert!(r.header("www-authenticate").is_some(), "{}", r.head);
    let r = raw(
        s.addr,
        &format!("GET /metrics HTTP/1.1\nHost: {host}\nAuthorization: Bearer wrong-token"),
        b"",
    )
    .await;
    r.assert_problem(401);
    let r = raw(
        s.addr,
        &format!("GET /metrics HTTP/1.1\nHost: {host}\nAuthorization: Bearer {TOKEN}"),
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.header("content-type").unwrap().starts_with("text/plain"),
        "{}",
        r.head
    );
    s.stop().await;
    h.cleanup().await;
}

/// A URI over 8 KiB and a header section over 32 KiB (or over 100 fields) are answered
/// with problem+json, not hyper's bare status (or a 200).
#[tokio::test]
async fn long_uris_and_large_headers_are_problem_json() {
    let h = sqlite(AppConfig::default()).await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    let long = "a".repeat(9 * 1024);
    let r = raw(
        s.addr,
        &format!("GET /v1/jobs?queue={long} HTTP/1.1\nHost: {host}"),
        b"",
    )
    .await;
    let p = r.assert_problem(414);
    assert_eq!(p["field"], "uri", "{}", r.body);
    let big = "b".repeat(40 * 1024);
    let r = raw(
        s.addr,
        &format!("GET /healthz HTTP/1.1\nHost: {host}\nX-Big: {big}"),
        b"",
    )
    .await;
    let p = r.assert_problem(431);
    assert_eq!(p["field"], "headers", "{}", r.body);
    let many: String = (0..120).map(|i| format!("\nX-H{i}: v")).collect();
    let r = raw(
        s.addr,
        &format!("GET /healthz HTTP/1.1\nHost: {host}{many}"),
        b"",
    )
    .await;
    r.assert_problem(431);
    // Under the limits all is well.
    let r = raw(
        s.addr,
        &format!(
            "GET /v1/jobs?queue={} HTTP/1.1\nHost: {host}\nX-Big: {}",
            "a".repeat(4096),
            "b".repeat(16 * 1024)
        ),
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.stop().await;
    h.cleanup().await;
}

/// The dashboard showed a job's `last_error`, `result` and each attempt's error as stored.
#[tokio::test]
async fn the_dashboard_redacts_errors_and_results() {
    let h = sqlite(AppConfig::default()).await;
    let secret_error = "POST https://merchant:sv-pass@psp.example/x?api_key=sv-query \
                        failed; sent Authorization: Bearer sv-bearer";
    let dead = dead_job(&h.store, "pay", json!({}), secret_error).await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    for path in [
        format!("/jobs/{dead}"),
        "/jobs".to_owned(),
        "/dead".to_owned(),
    ] {
        let r = raw(s.addr, &format!("GET {path} HTTP/1.1\nHost: {host}"), b"").await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert!(r.body.contains("psp.example"), "{path}: the error is shown");
        for secret in ["sv-pass", "sv-query", "sv-bearer"] {
            assert!(
                !r.body.contains(secret),
                "{path} shows {secret}: {}",
                r.body
            );
        }
    }
    s.stop().await;
    h.cleanup().await;
}

/// The session cookie is HttpOnly, SameSite=Strict, expires with the session, and is `Secure`
/// with `cookie_secure` (`--cookie-secure`).
#[tokio::test]
async fn the_session_cookie_attributes() {
    for secure in [false, true] {
        let h = sqlite(AppConfig {
            cookie_secure: secure,
            ..with_token()
        })
        .await;
        let s = Served::start(&h.state).await;
        let host = s.host();
        let r = raw(
            s.addr,
            &format!("POST /login HTTP/1.1\nHost: {host}\nOrigin: http://{host}\nContent-Type: application/x-www-form-urlencoded"),
            format!("token={TOKEN}").as_bytes(),
        )
        .await;
        let c = r.headers("set-cookie").join("; ");
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict"),
            "{c}"
        );
        assert!(c.contains("Max-Age=43200"), "12 hours: {c}");
        assert_eq!(c.contains("Secure"), secure, "{c}");
        let cookie = c.split(';').next().unwrap().to_owned();
        let out = raw(
            s.addr,
            &format!(
                "POST /logout HTTP/1.1\nHost: {host}\nOrigin: http://{host}\nCookie: {cookie}"
            ),
            b"",
        )
        .await;
        assert_eq!(
            out.header("set-cookie").unwrap().contains("Secure"),
            secure,
            "{}",
            out.head
        );
        s.stop().await;
        h.cleanup().await;
    }
}

/// Sessions expire after their time to live (on the injected clock).
#[tokio::test]
async fn sessions_expire() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let h = sqlite(AppConfig {
        session_ttl: Duration::from_secs(600),
        clock: Some(clock.clone()),
        ..with_token()
    })
    .await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    let r = raw(
        s.addr,
        &format!("POST /login HTTP/1.1\nHost: {host}\nOrigin: http://{host}\nContent-Type: application/x-www-form-urlencoded"),
        format!("token={TOKEN}").as_bytes(),
    )
    .await;
    let c = r.header("set-cookie").unwrap();
    assert!(c.contains("Max-Age=600"), "{c}");
    let cookie = c.split(';').next().unwrap().to_owned();
    let head = format!("GET / HTTP/1.1\nHost: {host}\nCookie: {cookie}");
    let page = || raw(s.addr, &head, b"");
    assert_eq!(page().await.status, 200);
    clock.advance(Duration::from_secs(599));
    assert_eq!(page().await.status, 200);
    clock.advance(Duration::from_secs(1));
    assert_eq!(page().await.status, 303, "expired");
    s.stop().await;
    h.cleanup().await;
}

/// Failed logins: 5 a minute per client address, then 429 problem+json with `Retry-After`,
/// even for the right token, until the oldest failure is a minute old.
#[tokio::test]
async fn failed_logins_are_rate_limited() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let h = sqlite(AppConfig {
        clock: Some(clock.clone()),
        ..with_token()
    })
    .await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    let login = |token: &str| {
        let head = format!(
            "POST /login HTTP/1.1\nHost: {host}\nOrigin: http://{host}\nContent-Type: application/x-www-form-urlencoded"
        );
        let body = format!("token={token}");
        async move { raw(s.addr, &head, body.as_bytes()).await }
    };
    for i in 0..5 {
        assert_eq!(login("wrong-guess").await.status, 401, "failure {i}");
        clock.advance(Duration::from_secs(5));
    }
    // Failures at 0, 5, 10, 15, 20 s; now 25 s: the first leaves the window at 60 s.
    let r = login("wrong-guess").await;
    r.assert_problem(429);
    assert_eq!(r.header("retry-after").as_deref(), Some("35"), "{}", r.head);
    let r = login(TOKEN).await;
    r.assert_problem(429);
    assert!(r.header("set-cookie").is_none(), "no session while limited");
    clock.advance(Duration::from_secs(34));
    assert_eq!(
        login(TOKEN).await.header("retry-after").as_deref(),
        Some("1")
    );
    clock.advance(Duration::from_secs(1));
    let r = login(TOKEN).await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(r.header("set-cookie").is_some());
    s.stop().await;
    h.cleanup().await;
}

/// Wrong bearer tokens (issue 36: 10.7k guesses a second were answered): 20 a minute per
/// client address, then 429 problem+json with `Retry-After` on `/v1` and `/metrics`, without
/// comparing the token — the right one too, from that address. Another address is not
/// affected, and a minute later the address is heard again.
#[tokio::test]
async fn wrong_bearer_tokens_are_throttled_per_client() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let h = sqlite(AppConfig {
        clock: Some(clock.clone()),
        prometheus: Some(prometheus()),
        ..with_token()
    })
    .await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    let get = |from: &'static str, path: &'static str, token: &str| {
        let head = format!("GET {path} HTTP/1.1\nHost: {host}\nAuthorization: Bearer {token}");
        async move { raw_from(from, s.addr, &head, b"").await }
    };
    for i in 0..redrive_service::BEARER_FAILURES_PER_MINUTE {
        let r = get("127.0.0.1", "/v1/jobs", "wrong-guess").await;
        assert_eq!(r.status, 401, "failure {i}: {}", r.body);
    }
    let r = get("127.0.0.1", "/v1/jobs", "wrong-guess").await;
    let p = r.assert_problem(429);
    assert_eq!(r.header("retry-after").as_deref(), Some("60"), "{}", r.head);
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("wrong bearer tokens"),
        "{p}"
    );
    let r = get("127.0.0.1", "/v1/jobs", TOKEN).await;
    r.assert_problem(429);
    get("127.0.0.1", "/metrics", "wrong-guess")
        .await
        .assert_problem(429);
    // Another client: the right token works, a wrong one is a plain 401.
    let r = get("127.0.0.2", "/v1/jobs", TOKEN).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = get("127.0.0.2", "/v1/jobs", "wrong-guess").await;
    assert_eq!(r.status, 401, "{}", r.body);
    // A request without a token is not a wrong token.
    let r = raw_from(
        "127.0.0.3",
        s.addr,
        &format!("GET /v1/jobs HTTP/1.1\nHost: {host}"),
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    clock.advance(Duration::from_secs(60));
    let r = get("127.0.0.1", "/v1/jobs", TOKEN).await;
    assert_eq!(r.status, 200, "a minute later: {}", r.body);
    s.stop().await;
    h.cleanup().await;
}

/// With a token the `Host` check is on only once a public host is configured; the public
/// hosts (and loopback names) pass, others get 421 before the token is even looked at.
#[tokio::test]
async fn with_a_token_public_hosts_turn_the_host_check_on() {
    let h = sqlite(with_token()).await;
    let s = Served::start(&h.state).await;
    let r = raw(s.addr, "GET /healthz HTTP/1.1\nHost: anything.example", b"").await;
    assert_eq!(r.status, 200, "no public host configured: no check");
    s.stop().await;
    h.cleanup().await;

    let h = sqlite(AppConfig {
        public_hosts: vec!["redrive.example.com".into(), "ops.example:8443".into()],
        ..with_token()
    })
    .await;
    let s = Served::start(&h.state).await;
    let auth = format!("Authorization: Bearer {TOKEN}");
    for host in [
        "redrive.example.com",
        "REDRIVE.example.com:443",
        "ops.example:8443",
        "localhost:1",
    ] {
        let r = raw(
            s.addr,
            &format!("GET /v1/jobs HTTP/1.1\nHost: {host}\n{auth}"),
            b"",
        )
        .await;
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }
    for host in [
        "evil.example",
        "ops.example",
        "ops.example:443",
        "redrive.example.com.evil.example",
    ] {
        let r = raw(
            s.addr,
            &format!("GET /v1/jobs HTTP/1.1\nHost: {host}\n{auth}"),
            b"",
        )
        .await;
        r.assert_problem(421);
        let r = raw(s.addr, &format!("GET /login HTTP/1.1\nHost: {host}"), b"").await;
        r.assert_problem(421);
    }
    // With a token, API writes from other origins are the token's business (no CORS).
    let r = raw(
        s.addr,
        &format!("POST /v1/jobs HTTP/1.1\nHost: redrive.example.com\n{auth}\nContent-Type: application/json"),
        br#"{"queue": "q", "kind": "noop"}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    s.stop().await;
    h.cleanup().await;
}

/// `--metrics-public` opens `/metrics` again; a dashboard session is enough too.
#[tokio::test]
async fn metrics_public_and_by_session() {
    let h = sqlite(AppConfig {
        prometheus: Some(prometheus()),
        metrics_public: true,
        ..with_token()
    })
    .await;
    let s = Served::start(&h.state).await;
    let r = raw(
        s.addr,
        &format!("GET /metrics HTTP/1.1\nHost: {}", s.host()),
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.stop().await;
    h.cleanup().await;

    let h = sqlite(AppConfig {
        prometheus: Some(prometheus()),
        ..with_token()
    })
    .await;
    let s = Served::start(&h.state).await;
    let host = s.host();
    let r = raw(
        s.addr,
        &format!("POST /login HTTP/1.1\nHost: {host}\nOrigin: http://{host}\nContent-Type: application/x-www-form-urlencoded"),
        format!("token={TOKEN}").as_bytes(),
    )
    .await;
    let cookie = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let r = raw(
        s.addr,
        &format!("GET /metrics HTTP/1.1\nHost: {host}\nCookie: {cookie}"),
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.stop().await;
    h.cleanup().await;
}

/// Whether the server closed `s` (EOF or reset) within `within`.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {} // a response (or a part of one): keep reading
        }
    }
}

/// Finding 7: idle connections were never closed, so enough of them exhausted the
/// descriptors and `/healthz` timed out. Now: at most `max_connections` are served, a
/// connection that sends no complete header within the header timeout is dropped, and
/// `/healthz` answers once the idle ones have timed out.
#[tokio::test]
async fn finding_7_idle_and_half_sent_connections_are_closed_and_capped() {
    let h = sqlite(AppConfig {
        connections: ConnLimits {
            header_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(600),
            max_connections: 20,
        },
        ..Default::default()
    })
    .await;
    let s = Served::start(&h.state).await;
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(tokio::net::TcpStream::connect(s.addr).await.unwrap());
    }
    let mut half = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    // The cap holds while the waves of idle connections are accepted and dropped.
    let mut peak = 0;
    for _ in 0..50 {
        peak = peak.max(h.state.open_connections());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(peak <= 20, "{peak} connections served at once");
    assert!(peak > 0);
    // /healthz answers: its connection is accepted once idle ones time out.
    let r = raw(
        s.addr,
        &format!("GET /healthz HTTP/1.1\nHost: {}", s.host()),
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    for (i, c) in idle.iter_mut().enumerate() {
        assert!(
            closed_within(c, Duration::from_secs(30)).await,
            "idle connection {i} open"
        );
    }
    // Half a header is dropped by the header timeout (the idle timeout is 10 minutes).
    assert!(closed_within(&mut half, Duration::from_secs(30)).await);
    // Between requests the idle timeout applies, not the header timeout.
    let mut keep = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    keep.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(30), keep.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        !closed_within(&mut keep, Duration::from_secs(3)).await,
        "a keep-alive connection is not cut by the 1 s header timeout"
    );
    s.stop().await;
    assert_eq!(h.state.open_connections(), 0);
    h.cleanup().await;
}

/// A keep-alive connection that stays silent after its response is closed after the idle
/// timeout, while a fresh connection waits for the (longer) header timeout.
#[tokio::test]
async fn finding_7_keep_alive_connections_close_after_the_idle_timeout() {
    let h = sqlite(AppConfig {
        connections: ConnLimits {
            header_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(1),
            max_connections: 20,
        },
        ..Default::default()
    })
    .await;
    let s = Served::start(&h.state).await;
    let mut fresh = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut keep = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    keep.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut keep, Duration::from_secs(30)).await);
    assert!(
        !closed_within(&mut fresh, Duration::from_millis(200)).await,
        "the first request's header timeout is 10 minutes"
    );
    drop(fresh);
    s.stop().await;
    h.cleanup().await;
}

/// `/openapi.json` lists the front door's answers: 414, 421 and 431 on every operation, 403
/// on writes, 415 on the API's writes.
#[test]
fn the_openapi_document_lists_the_front_door_answers() {
    let doc = redrive_service::openapi_document(&redrive_policy::PolicySet::default());
    let paths = doc["paths"].as_object().unwrap();
    let mut writes = 0;
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let Some(responses) = op.get("responses").and_then(Value::as_object) else {
                continue;
            };
            for code in ["414", "421", "431"] {
                assert!(responses.contains_key(code), "{method} {path}: {code}");
            }
            let problem = &responses["421"]["content"]["application/problem+json"];
            assert!(problem["schema"].is_object(), "{method} {path}");
            if method == "post" || method == "delete" {
                writes += 1;
                assert!(responses.contains_key("403"), "{method} {path}: 403");
                assert!(responses.contains_key("415"), "{method} {path}: 415");
            } else {
                assert!(!responses.contains_key("415"), "{method} {path}: 415");
            }
        }
    }
    assert_eq!(
        writes, 15,
        "POST /v1/jobs, POST /v1/jobs/batch, replay, cancel, idempotency recover, the operator's \
         (queue pause and resume, dependency pause and resume, breaker force, run-now, bulk, card \
         stop lift), POST and DELETE /v1/schedules"
    );
}
