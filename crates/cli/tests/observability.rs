//! Observability as an on-call engineer sees it, through the built binary: the Prometheus
//! contract of a real run (histograms with buckets, `# HELP` on every metric), the Grafana board
//! and the alert rules against that scrape, JSON log lines, and (with `--features otel`) one
//! OpenTelemetry trace from the API request to the PSP.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redrive_store::{ClaimParams, Kinds, NewJob, Store};
use redrive_testkit::cli::{Running, http_request, spawn_listening, wait_for};
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `redrive serve` on 127.0.0.1:0 with `extra` flags and `env`, its workers allowed to call
/// the PSP simulator on loopback; returns the server and its address.
fn serve(db: &str, extra: &[&str], env: &[(&str, &str)]) -> (Running, String) {
    let mut serve = redrive_testkit::cli!().db_command(db, ["serve", "--addr", "127.0.0.1:0"]);
    serve
        .args(["--allow-host", "loopback"])
        .args(extra)
        .envs(env.iter().copied());
    spawn_listening(&mut serve, "listening on http://")
}

/// One HTTP/1.1 request with `Connection: close`; returns (status, body).
fn request(addr: &str, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let r = http_request(addr, method, path, headers, body, Duration::from_secs(10)).unwrap();
    (r.status, r.body)
}

fn post_job(addr: &str, body: &Value, extra_headers: &[&str]) -> i64 {
    let mut headers = vec!["Content-Type: application/json"];
    headers.extend_from_slice(extra_headers);
    let (status, res) = request(addr, "POST", "/v1/jobs", &headers, &body.to_string());
    assert_eq!(status, 201, "{res}");
    let v: Value = serde_json::from_str(&res).unwrap_or_else(|e| panic!("{e}: {res}"));
    v["job"]["id"].as_i64().unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A PSP simulator whose first `fail` charges are answered 503 (before the ledger: no
/// charge made), then charges normally.
fn psp(rt: &tokio::runtime::Runtime, fail: u32) -> redrive_psp_sim::RunningSim {
    let seen = Arc::new(AtomicU32::new(0));
    let layer = axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let seen = seen.clone();
            async move {
                if seen.fetch_add(1, Ordering::SeqCst) < fail {
                    return axum::response::IntoResponse::into_response((
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "try again",
                    ));
                }
                next.run(req).await
            }
        },
    );
    rt.block_on(
        redrive_psp_sim::PspSim::builder()
            .charges_layer(layer)
            .start("127.0.0.1:0"),
    )
    .unwrap()
}

/// A retry policy that retries in process after 50 ms (no jitter); with `quick_breaker`, a
/// breaker that opens after two failures for 300 ms (else the default one, which two failures
/// do not open).
fn policies(dir: &Path, quick_breaker: bool) -> PathBuf {
    let p = dir.join("policies.toml");
    let mut text = String::from(
        r#"
[policy.fast]
extends = "payment"

[policy.fast.retry]
base = "50ms"
cap = "50ms"
jitter = "none"
"#,
    );
    if quick_breaker {
        text.push_str(
            r#"
[breaker.default]
window_calls = 4
failure_rate = 0.5
minimum_calls = 2
open_cooldown = "300ms"
half_open_probes = 1
"#,
        );
    }
    std::fs::write(&p, text).unwrap();
    p
}

fn charge(psp: &str, n: u32) -> Value {
    json!({
        "queue": "pay",
        "kind": "http",
        "key": format!("order-{n}"),
        "policy": "fast",
        "payload": {
            "method": "POST",
            "url": format!("{psp}/v1/charges"),
            "body": {"amount": 100 + n, "currency": "EUR"},
        },
    })
}

/// Names of the series in a scrape (`name{labels} value` or `name value`).
fn series_names(scrape: &str) -> std::collections::BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The contract: every metric of the design (and the additions of this work) with its type.
const CONTRACT: &[(&str, &str)] = &[
    ("redrive_attempts_total", "counter"),
    ("redrive_jobs_finished_total", "counter"),
    ("redrive_retry_delay_seconds", "histogram"),
    ("redrive_breaker_state", "gauge"),
    ("redrive_breaker_transitions_total", "counter"),
    ("redrive_jobs", "gauge"),
    ("redrive_job_duration_seconds", "histogram"),
    ("redrive_lease_lost_total", "counter"),
    ("redrive_dependency_rate_limit", "gauge"),
    ("redrive_dependency_inflight", "gauge"),
    ("redrive_queue_latency_seconds", "histogram"),
    ("redrive_oldest_available_seconds", "gauge"),
    ("redrive_jobs_rescued_total", "counter"),
    ("redrive_enqueued_total", "counter"),
];

/// A real run of `serve --workers`: an expired lease rescued, a PSP failing its first calls
/// (so the breaker opens and closes again and retries are delayed), jobs enqueued through the
/// API; then the scrape must hold every contract name, with `# HELP`, the right `# TYPE`, and
/// `_bucket` series for the histograms (fleet-aggregatable, no summary quantiles); and every
/// metric the Grafana board and the alert rules name must be in it.
#[test]
fn a_real_run_exports_the_contract_and_everything_the_board_and_alerts_use() {
    let rt = runtime();
    let sim = psp(&rt, 4);
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    // A job whose worker "died": claimed with a lease that has already run out.
    rt.block_on(async {
        let s = Store::connect(&db).await.unwrap();
        s.migrate().await.unwrap();
        let now = chrono::Utc::now();
        s.enqueue(&NewJob::new("obs", "noop", json!({})), now)
            .await
            .unwrap();
        let claimed = s
            .claim(&ClaimParams {
                queues: vec!["obs".into()],
                kinds: Kinds::Any,
                worker: "gone".into(),
                limit: 1,
                lease: Duration::from_millis(1),
                now,
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
    });
    let policies = policies(dir.path(), true);
    let (_server, addr) = serve(
        &db,
        &[
            "--policies",
            policies.to_str().unwrap(),
            "--workers",
            "2",
            "--metrics-refresh",
            "100ms",
        ],
        &[],
    );
    for n in 0..3 {
        post_job(&addr, &charge(&sim.url(), n), &[]);
    }
    post_job(&addr, &json!({"queue": "obs", "kind": "noop"}), &[]);
    let scrape = || request(&addr, "GET", "/metrics", &[], "").1;
    let mut body = String::new();
    wait_for("every job done", Duration::from_secs(60), || {
        body = scrape();
        body.contains("redrive_jobs{queue=\"pay\",state=\"succeeded\"} 3")
            && body.contains("redrive_jobs{queue=\"obs\",state=\"succeeded\"} 2")
    });

    let mut missing = Vec::new();
    for (name, kind) in CONTRACT {
        if !body.contains(&format!("# HELP {name} ")) {
            missing.push(format!("{name}: no # HELP"));
        }
        if !body.contains(&format!("# TYPE {name} {kind}")) {
            missing.push(format!("{name}: not a {kind}"));
        }
        let series = match *kind {
            "histogram" => format!("{name}_bucket{{"),
            _ => name.to_string(),
        };
        if !body.lines().any(|l| l.starts_with(&series)) {
            missing.push(format!("{name}: no series {series}"));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}\n{body}");
    assert!(!body.contains("quantile=\""), "summaries left: {body}");
    // What the run did shows in the numbers.
    for expected in [
        "redrive_jobs_rescued_total{queue=\"obs\"} 1",
        "redrive_enqueued_total{queue=\"pay\",kind=\"http\"} 3",
        "redrive_enqueued_total{queue=\"obs\",kind=\"noop\"} 1",
        "redrive_breaker_transitions_total{",
        "redrive_retry_delay_seconds_bucket{mode=",
        "redrive_queue_latency_seconds_bucket{queue=\"pay\",le=\"0.005\"}",
        "redrive_oldest_available_seconds{queue=\"pay\"} 0",
    ] {
        assert!(body.contains(expected), "{expected} missing from\n{body}");
    }
    let dep = format!("dependency=\"{}\"", sim.addr());
    assert!(
        body.contains(&format!("redrive_dependency_inflight{{{dep}}} 0")),
        "{body}"
    );
    for line in body.lines() {
        if line.starts_with("redrive_attempts_total{") && line.contains("class=\"success\"") {
            assert!(line.contains("queue=\"pay\"") || line.contains("queue=\"obs\""));
        }
    }

    // The board and the alert rules name only metrics this scrape has.
    let names = series_names(&body);
    let root = repo_root();
    for file in [
        "deploy/grafana/redrive.json",
        "deploy/prometheus/alerts.yml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let used = used_metrics(&text);
        assert!(used.len() >= 5, "{file} names too few metrics: {used:?}");
        let unknown: Vec<&String> = used.iter().filter(|m| !names.contains(*m)).collect();
        assert!(
            unknown.is_empty(),
            "{file} names {unknown:?}, not in the scrape:\n{body}"
        );
    }
    rt.block_on(sim.shutdown());
}

/// Every `redrive_…` metric name in a file.
fn used_metrics(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("redrive_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// The board is a Grafana dashboard: every panel has a title and PromQL targets; it covers
/// what an on-call engineer looks at first.
#[test]
fn the_grafana_board_has_the_panels_on_call_needs() {
    let text = std::fs::read_to_string(repo_root().join("deploy/grafana/redrive.json")).unwrap();
    let board: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(board["uid"], "redrive");
    let panels = board["panels"].as_array().unwrap();
    let mut exprs = String::new();
    for p in panels {
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()), "{p}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{p}");
        for t in targets {
            exprs.push_str(t["expr"].as_str().unwrap());
            exprs.push('\n');
        }
    }
    for needed in [
        "redrive_attempts_total",
        "histogram_quantile(0.5, sum by (le, queue) (rate(redrive_queue_latency_seconds_bucket",
        "histogram_quantile(0.99, sum by (le, queue) (rate(redrive_queue_latency_seconds_bucket",
        "redrive_oldest_available_seconds",
        "redrive_jobs_finished_total{state=\"dead\"",
        "redrive_breaker_state",
        "redrive_breaker_transitions_total",
        "redrive_dependency_rate_limit",
        "redrive_lease_lost_total",
    ] {
        assert!(exprs.contains(needed), "no panel uses {needed}:\n{exprs}");
    }
}

/// The alert rules parse: with `promtool check rules` (Debian's `prometheus` package) when it
/// is installed, which CI does; and their structure is checked here in any case.
#[test]
fn the_alert_rules_parse() {
    let path = repo_root().join("deploy/prometheus/alerts.yml");
    let text = std::fs::read_to_string(&path).unwrap();
    for alert in [
        "RedriveDeadLettersRising",
        "RedriveBreakerOpen",
        "RedriveOldestAvailableTooOld",
        "RedriveLeaseLosses",
    ] {
        assert!(text.contains(&format!("- alert: {alert}\n")), "{alert}");
    }
    let rules = text.matches("- alert: ").count();
    assert_eq!(text.matches("\n        expr: ").count(), rules);
    assert_eq!(text.matches("\n        for: ").count(), rules);
    match Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&path)
        .output()
    {
        Ok(o) => assert!(
            o.status.success(),
            "promtool check rules failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        // `CI` read through the testkit (`true` or `1`), as everywhere else.
        Err(e) if redrive_testkit::ci() => {
            panic!("promtool is needed in CI (apt-get install prometheus): {e}")
        }
        Err(e) => eprintln!("promtool not run ({e}); install Debian's prometheus package"),
    }
}

/// `--log-format json`: every line on stderr is one JSON object; each attempt's line carries
/// the job id, queue, kind, key, dependency, attempt and class (and the decision); no secret
/// of the URL shows.
#[test]
fn json_logs_are_one_object_a_line_with_the_attempt_fields() {
    let rt = runtime();
    let sim = psp(&rt, 1);
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let policies = policies(dir.path(), false);
    let url = format!("{}/v1/charges?api_key=sk_live_hunter2", sim.url());
    let enqueue = redrive_testkit::cli!()
        .cmd()
        .args([
            "--db",
            &db,
            "--policies",
            policies.to_str().unwrap(),
            "enqueue",
        ])
        .args([
            "--queue", "pay", "--kind", "http", "--key", "order-7", "--policy", "fast",
        ])
        .arg("--payload")
        .arg(
            json!({"method": "POST", "url": url, "body": {"amount": 5, "currency": "EUR"}})
                .to_string(),
        )
        .output()
        .unwrap();
    assert!(
        enqueue.status.success(),
        "{}",
        String::from_utf8_lossy(&enqueue.stderr)
    );
    let out = redrive_testkit::cli!()
        .cmd()
        .args(["--db", &db, "--policies", policies.to_str().unwrap()])
        .args(["--log-format", "json", "work", "--until-idle"])
        .args(["--allow-host", "loopback"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("hunter2"),
        "a secret in the logs:\n{stderr}"
    );
    let mut attempts = Vec::new();
    for line in stderr.lines() {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if v["message"] == "attempt" {
            attempts.push(v);
        }
    }
    assert_eq!(attempts.len(), 2, "{stderr}");
    for (i, a) in attempts.iter().enumerate() {
        assert!(a["job"].as_i64().is_some(), "{a}");
        assert_eq!(a["queue"], "pay");
        assert_eq!(a["kind"], "http");
        assert_eq!(a["key"], "order-7");
        assert_eq!(a["dependency"], sim.addr().to_string());
        assert_eq!(a["attempt"], i as u64 + 1);
    }
    assert_eq!(attempts[0]["class"], "infrastructure", "{}", attempts[0]);
    assert_eq!(attempts[0]["decision"], "retry");
    assert_eq!(attempts[1]["class"], "success");
    assert_eq!(attempts[1]["decision"], "succeeded");

    // Text on a pipe: no colour codes.
    let out = redrive_testkit::cli!()
        .cmd()
        .args(["--db", &db, "--log-format", "text", "jobs"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains('\u{1b}'));
    // A bad value names the flag.
    let out = redrive_testkit::cli!()
        .cmd()
        .args(["--db", &db, "--log-format", "xml", "jobs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-format"));
    rt.block_on(sim.shutdown());
}

/// One trace from the API request to the PSP, exported over OTLP (HTTP/JSON) to a collector in
/// this test: a job enqueued with a `traceparent` fails twice (503) and succeeds; the trace
/// holds the enqueue, three attempt spans with their classes and decisions, and the three
/// outbound calls; the PSP simulator received the same trace id, each call's own span as the
/// parent.
#[cfg(feature = "otel")]
#[test]
fn one_trace_from_the_api_request_to_the_psp() {
    use std::sync::Mutex;

    let rt = runtime();
    let sim = psp(&rt, 2);
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let collector = {
        let received = received.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let received = received.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).expect("OTLP/JSON body");
                    received.lock().unwrap().push(v);
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        "{}",
                    )
                }
            }),
        );
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        rt.spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    };
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let policies = policies(dir.path(), false);
    let (server, addr) = serve(
        &db,
        &["--policies", policies.to_str().unwrap(), "--workers", "1"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let id = post_job(
        &addr,
        &charge(&sim.url(), 1),
        &[&format!("traceparent: 00-{trace_id}-{caller_span}-01")],
    );
    wait_for("the job to succeed", Duration::from_secs(30), || {
        let (_, body) = request(&addr, "GET", &format!("/v1/jobs/{id}"), &[], "");
        body.contains("\"state\":\"succeeded\"")
    });
    // A graceful stop flushes the spans still batched.
    let mut child = {
        let mut server = server;
        let pid = server.0.id();
        let ok = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        std::mem::replace(&mut server.0, Command::new("true").spawn().unwrap())
    };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");

    let spans: Vec<Value> = received
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b["resourceSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|r| r["scopeSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|s| s["spans"].as_array().cloned().unwrap_or_default())
        .collect();
    let ours: Vec<&Value> = spans.iter().filter(|s| s["traceId"] == trace_id).collect();
    let attr = |s: &Value, key: &str| -> Option<Value> {
        s["attributes"]
            .as_array()?
            .iter()
            .find(|a| a["key"] == key)
            .map(|a| {
                let v = &a["value"];
                v.get("stringValue")
                    .or(v.get("intValue"))
                    .or(v.get("boolValue"))
                    .cloned()
                    .unwrap_or(Value::Null)
            })
    };
    let named =
        |n: &str| -> Vec<&Value> { ours.iter().copied().filter(|s| s["name"] == n).collect() };
    let enqueue = named("enqueue");
    assert_eq!(
        enqueue.len(),
        1,
        "spans of the trace: {ours:#?}\nall: {spans:#?}"
    );
    assert_eq!(enqueue[0]["parentSpanId"], caller_span);
    let mut attempts = named("attempt");
    assert_eq!(attempts.len(), 3, "{ours:#?}");
    attempts.sort_by_key(|s| attr(s, "attempt").map(|v| v.to_string()));
    let classes: Vec<Option<Value>> = attempts.iter().map(|s| attr(s, "class")).collect();
    assert_eq!(
        classes,
        vec![
            Some(json!("infrastructure")),
            Some(json!("infrastructure")),
            Some(json!("success"))
        ]
    );
    let decisions: Vec<Option<Value>> = attempts.iter().map(|s| attr(s, "decision")).collect();
    assert_eq!(
        decisions,
        vec![
            Some(json!("retry")),
            Some(json!("retry")),
            Some(json!("succeeded"))
        ]
    );
    for a in &attempts {
        assert_eq!(a["parentSpanId"], enqueue[0]["spanId"], "{a}");
        assert_eq!(attr(a, "queue"), Some(json!("pay")));
        assert_eq!(attr(a, "kind"), Some(json!("http")));
        assert_eq!(attr(a, "dependency"), Some(json!(sim.addr().to_string())));
        let job = attr(a, "job").unwrap();
        assert!(job == json!(id) || job == json!(id.to_string()), "{job}");
    }
    let calls = named("http call");
    assert_eq!(calls.len(), 3, "{ours:#?}");
    let attempt_ids: Vec<&Value> = attempts.iter().map(|a| &a["spanId"]).collect();
    for c in &calls {
        assert!(attempt_ids.contains(&&c["parentSpanId"]), "{c}");
    }
    // The PSP got the same trace, each call with its own span as the parent.
    let log = sim.request_log();
    let charges: Vec<_> = log.iter().filter(|r| r.path == "/v1/charges").collect();
    assert_eq!(charges.len(), 3, "{log:#?}");
    let call_ids: Vec<&str> = calls.iter().filter_map(|c| c["spanId"].as_str()).collect();
    for r in charges {
        let tp = r.traceparent.as_deref().expect("traceparent sent");
        let parsed = redrive_store::TraceParent::parse(tp).unwrap();
        assert_eq!(parsed.trace_id_hex(), trace_id);
        let parent: String = parsed.span_id.iter().map(|b| format!("{b:02x}")).collect();
        assert!(
            call_ids.contains(&parent.as_str()),
            "{tp} not from {call_ids:?}"
        );
    }
    rt.block_on(sim.shutdown());
}
