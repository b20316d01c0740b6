//! The built-in `http` job kind: payload `{method, url, headers?, body?, timeout_ms?}`.
//!
//! The job's idempotency key is sent as `Idempotency-Key` on every attempt (a job without a
//! key uses `redrive-job-ID`, stable across attempts). The response is classified by the
//! policy's status table; `Retry-After` is honoured; a refused or reset connection is
//! `infrastructure`; a timeout once the request may have been sent is an ambiguous `timeout`,
//! repeated only with the same key. The status and the first 64 KiB of the body are the result.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use redrive_policy::{Outcome, StatusTable, retry_after_clamped};
use redrive_runtime::{Attempted, Handler, JobContext};
use serde::Deserialize;
use serde_json::{Value, json};

/// The most of a response body kept as the job's result.
pub const MAX_RESULT_BODY: usize = 64 * 1024;
/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `Retry-After` honoured.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(3600);

/// An `http` job's payload.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpPayload {
    /// `GET`, `POST`, …
    pub method: String,
    /// An `http://` or `https://` URL.
    pub url: String,
    /// Request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A JSON body (sent as `application/json`), or a string sent as it is.
    #[serde(default)]
    pub body: Option<Value>,
    /// Per-call timeout in milliseconds (default 10 s).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl HttpPayload {
    /// Reads and checks a payload; the error names the field.
    pub fn parse(v: &Value) -> Result<Self, String> {
        let p: HttpPayload =
            serde_json::from_value(v.clone()).map_err(|e| format!("payload: {e}"))?;
        reqwest::Method::from_bytes(p.method.as_bytes())
            .map_err(|_| format!("payload.method: {:?} is not an HTTP method", p.method))?;
        let url =
            reqwest::Url::parse(&p.url).map_err(|e| format!("payload.url: {:?}: {e}", p.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("payload.url: {:?}: only http and https", p.url));
        }
        if p.timeout_ms == Some(0) || p.timeout_ms.is_some_and(|t| t > 600_000) {
            return Err(format!(
                "payload.timeout_ms: {:?}: must be 1..=600000",
                p.timeout_ms
            ));
        }
        Ok(p)
    }
}

/// Header names whose values are secrets: never logged, stored or shown.
pub fn is_secret_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || n.contains("api-key")
        || n.contains("apikey")
        || n.contains("token")
        || n.contains("secret")
}

/// A copy of an `http` payload with secret header values replaced by `"[redacted]"`.
pub fn redact_payload(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(h) = v.get_mut("headers").and_then(Value::as_object_mut) {
        for (k, val) in h.iter_mut() {
            if is_secret_header(k) {
                *val = json!("[redacted]");
            }
        }
    }
    v
}

/// The `http` job kind's handler.
#[derive(Debug, Clone)]
pub struct HttpJob {
    client: reqwest::Client,
    status: StatusTable,
}

impl Default for HttpJob {
    fn default() -> Self {
        Self::new(StatusTable::default())
    }
}

impl HttpJob {
    /// A handler classifying with `status`.
    pub fn new(status: StatusTable) -> Self {
        Self {
            client: reqwest::Client::new(),
            status,
        }
    }

    async fn call(client: reqwest::Client, status: StatusTable, ctx: JobContext) -> Attempted {
        let p = match HttpPayload::parse(&ctx.payload) {
            Ok(p) => p,
            Err(e) => return Attempted::failure(Outcome::Permanent, e),
        };
        let key = ctx
            .key
            .clone()
            .unwrap_or_else(|| format!("redrive-job-{}", ctx.job_id));
        let method =
            reqwest::Method::from_bytes(p.method.as_bytes()).unwrap_or(reqwest::Method::POST);
        let mut req = client
            .request(method, &p.url)
            .timeout(p.timeout_ms.map_or(DEFAULT_TIMEOUT, Duration::from_millis))
            .header("Idempotency-Key", &key);
        for (k, v) in &p.headers {
            req = req.header(k, v);
        }
        req = match &p.body {
            None => req,
            Some(Value::String(s)) => req.body(s.clone()),
            Some(b) => req.json(b),
        };
        let resp = tokio::select! {
            r = req.send() => r,
            _ = ctx.cancel.cancelled() => return Attempted::failure(Outcome::Exception, "lease lost; call abandoned"),
        };
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                let text = format!("{} {}: {}", p.method, p.url, error_chain(&e));
                // Not connected: the PSP never saw it (refused, reset: infrastructure).
                // A timeout once connected: it may have, so it is ambiguous.
                let outcome = if e.is_timeout() && !e.is_connect() {
                    Outcome::Timeout { idempotent: true }
                } else {
                    Outcome::Infrastructure { retry_after: None }
                };
                return Attempted::failure(outcome, text);
            }
        };
        let code = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after_clamped(v, chrono::Utc::now(), RETRY_AFTER_MAX));
        let bytes = resp.bytes().await.unwrap_or_default();
        let body = &bytes[..bytes.len().min(MAX_RESULT_BODY)];
        let body_value = serde_json::from_slice::<Value>(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
        let outcome = status.outcome(code, retry_after);
        Attempted {
            error: (outcome != Outcome::Success)
                .then(|| format!("{} {} → {code}", p.method, p.url)),
            result: json!({"status": code, "body": body_value, "truncated": bytes.len() > MAX_RESULT_BODY}),
            http_status: Some(code),
            outcome,
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl Handler for HttpJob {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        Box::pin(Self::call(self.client.clone(), self.status.clone(), ctx))
    }
}
