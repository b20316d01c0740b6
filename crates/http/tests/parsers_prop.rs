//! Property tests of the `http` crate's parsers of outside input: enqueue payloads (the shared
//! validation), `Idempotency-Key` values, and redaction (no secret survives what is shown).
//!
//! The long run (`REDRIVE_PROPTEST_SECS`, default 600 s) is ignored by default:
//! `cargo test -p redrive-http --test parsers_prop -- --ignored`.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redrive_http::redact::{redact_text, redact_value};
use redrive_http::{HttpPayload, validate_new_job};
use redrive_idempotency::IdempotencyKey;
use redrive_store::NewJob;
use serde_json::{Value, json};

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z][A-Za-z0-9-]{0,20}",
        "[!-~]{1,10}",
        "\\PC{0,10}",
        Just("Host".to_owned()),
        Just("Idempotency-Key".to_owned()),
    ]
}

fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,30}",
        "[a-z]{0,5}[\r\n\0\t\u{7f}][a-z]{0,5}",
        "\\PC{0,20}",
        ".{0,20}",
    ]
}

fn url() -> impl Strategy<Value = String> {
    prop_oneof![
        "(http|https|ftp|file)://[a-z0-9.:@\\[\\]-]{0,20}(/[a-z0-9?=&%#.-]{0,20})?",
        "https://psp\\.example/v1/[a-z]{0,8}",
        "[ -~]{0,30}",
        "\\PC{0,30}",
    ]
}

fn payload() -> impl Strategy<Value = Value> {
    let method = prop_oneof![
        prop::sample::select(vec![
            "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"
        ])
        .prop_map(str::to_owned),
        "[A-Za-z]{0,8}",
        "\\PC{0,6}",
    ];
    let timeout = prop_oneof![
        Just(Value::Null),
        (0u64..700_000).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!("5s")),
    ];
    let body = prop_oneof![
        Just(Value::Null),
        "\\PC{0,20}".prop_map(Value::from),
        any::<i32>().prop_map(|n| json!({"amount": n})),
    ];
    let structured = (
        method,
        url(),
        prop::collection::btree_map(header_name(), header_value(), 0..4),
        body,
        timeout,
    )
        .prop_map(|(m, u, h, b, t)| {
            let mut p = json!({"method": m, "url": u, "headers": h});
            if !b.is_null() {
                p["body"] = b;
            }
            if !t.is_null() {
                p["timeout_ms"] = t;
            }
            p
        });
    prop_oneof![
        4 => structured,
        1 => Just(json!({})),
        1 => "\\PC{0,20}".prop_map(Value::from),
        1 => (any::<i64>(), "[a-z]{1,6}").prop_map(|(n, k)| json!({k: n})),
    ]
}

/// Accepted at enqueue ⇒ buildable at run time: the worker never meets a request it cannot
/// build (which would have to be classified without a call).
fn check_payload(p: &Value) -> Result<(), TestCaseError> {
    let job = NewJob::new("q", "http", p.clone());
    match validate_new_job(&job, chrono::Utc::now()) {
        Ok(()) => {
            let hp = HttpPayload::parse(p).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let method = reqwest::Method::from_bytes(hp.method.as_bytes())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut req = reqwest::Client::new()
                .request(method, &hp.url)
                .header("Idempotency-Key", "k");
            for (k, v) in &hp.headers {
                req = req.header(k, v);
            }
            let built = req.build();
            prop_assert!(built.is_ok(), "accepted but not buildable: {p} {built:?}");
        }
        Err(e) => {
            let field = e.field().unwrap_or("");
            prop_assert!(field.starts_with("payload"), "{field}: {e}");
            prop_assert!(!e.to_string().contains('\n') && !e.to_string().contains('\r'));
        }
    }
    Ok(())
}

fn check_key(raw: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(k) = IdempotencyKey::parse(raw) {
        // The parsed key reads back the same, bare or quoted.
        let again = IdempotencyKey::parse(k.as_str().as_bytes());
        prop_assert_eq!(again.as_ref().ok(), Some(&k));
        let quoted = format!("\"{}\"", k.as_str());
        prop_assert_eq!(IdempotencyKey::parse(quoted.as_bytes()).ok(), Some(k));
    }
    Ok(())
}

fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        "[!-~]{0,260}".prop_map(String::into_bytes),
        "\"[!-~]{0,20}\"?".prop_map(String::into_bytes),
    ]
}

/// A secret value: distinctive, so finding it in the output is never a coincidence.
fn secret() -> impl Strategy<Value = String> {
    "[A-Za-z0-9]{6,16}".prop_map(|s| format!("Zq{s}"))
}

/// A secret header name, spelt as clients do.
fn secret_header() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec![
            "Authorization",
            "Proxy-Authorization",
            "Cookie",
            "X-Api-Key",
            "Api_Key",
            "X-Apikey",
            "X-Auth-Token",
            "X-Access-Token",
            "Ocp-Apim-Subscription-Key",
            "X-Signature",
            "Stripe-Signature",
            "X-Client-Secret",
            "X-Db-Password",
            "X-Partner-Key",
            "X-Auth",
        ]),
        any::<bool>(),
    )
        .prop_map(|(n, upper)| {
            if upper {
                n.to_ascii_uppercase()
            } else {
                n.to_ascii_lowercase()
            }
        })
}

fn secret_param() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "api_key",
        "apikey",
        "key",
        "token",
        "access_token",
        "secret",
        "client_secret",
        "signature",
        "sig",
        "password",
        "X-Amz-Signature",
    ])
}

#[derive(Debug, Clone)]
struct Secrets {
    headers: Vec<(String, String)>,
    user: String,
    password: String,
    params: Vec<(&'static str, String)>,
    bearer: String,
}

fn secrets() -> impl Strategy<Value = Secrets> {
    (
        prop::collection::vec((secret_header(), secret()), 1..4),
        "[a-z]{1,8}",
        secret(),
        prop::collection::vec((secret_param(), secret()), 1..3),
        secret(),
    )
        .prop_map(|(headers, user, password, params, bearer)| Secrets {
            headers,
            user,
            password,
            params,
            bearer,
        })
}

fn check_redaction(s: &Secrets) -> Result<(), TestCaseError> {
    let query: Vec<String> = s
        .params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .chain(["page=2".to_owned()])
        .collect();
    let url = format!(
        "https://{}:{}@psp.example/v1/charges?{}",
        s.user,
        s.password,
        query.join("&")
    );
    let headers: serde_json::Map<String, Value> = s
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.clone())))
        .collect();
    let payload = json!({"method": "POST", "url": url, "headers": headers,
                         "body": {"amount": 5, "note": format!("see {url}")}});
    let shown = redact_value(&payload).to_string();
    let text = redact_text(&format!(
        "POST {url} failed; Authorization: Bearer {} ; retry",
        s.bearer
    ));
    let all: Vec<&String> = s
        .headers
        .iter()
        .map(|(_, v)| v)
        .chain([&s.password, &s.bearer])
        .chain(s.params.iter().map(|(_, v)| v))
        .collect();
    for v in all {
        prop_assert!(!shown.contains(v.as_str()), "{v} survives in {shown}");
        prop_assert!(
            !text.contains(v.as_str()) || s.headers.iter().any(|(_, h)| h == v),
            "{v} survives in {text}"
        );
    }
    // What is not secret is kept.
    prop_assert!(shown.contains("psp.example/v1/charges") && shown.contains("page=2"));
    Ok(())
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        // Runners made by hand know no source file to persist failures to.
        failure_persistence: None,
        ..Config::default()
    })
}

fn run_all(cases: u32) {
    runner(cases)
        .run(&payload(), |p| check_payload(&p))
        .unwrap();
    runner(cases).run(&key_bytes(), |k| check_key(&k)).unwrap();
    runner(cases)
        .run(&secrets(), |s| check_redaction(&s))
        .unwrap();
}

#[test]
fn parsers_never_panic_and_no_secret_survives_redaction() {
    // PROPTEST_CASES from the environment raises it; 256 by default.
    run_all(Config::default().cases);
}

/// The long run: every property, over and over, for `REDRIVE_PROPTEST_SECS` (default 600).
#[test]
#[ignore = "long run: cargo test -p redrive-http --test parsers_prop -- --ignored"]
fn parsers_long_run() {
    let secs: u64 = std::env::var("REDRIVE_PROPTEST_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut rounds = 0u64;
    while Instant::now() < end {
        run_all(2000);
        rounds += 1;
    }
    eprintln!(
        "http parsers: {} cases per property, 0 failures",
        rounds * 2000
    );
}
