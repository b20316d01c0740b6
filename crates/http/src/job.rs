//! The built-in `http` job kind: payload `{method, url, headers?, body?, timeout_ms?}`.
//!
//! The job's idempotency key is sent as `Idempotency-Key` on every attempt (a job without a
//! key uses `redrive-job-ID`, stable across attempts); after N card declines, `KEY-rN` (a
//! reattempt is a new authorisation, see [`crate::declines`]). The response is classified by the
//! policy's status table; `Retry-After` is honoured; a refused or reset connection is
//! `infrastructure`; a timeout once the request may have been sent is an ambiguous `timeout`,
//! repeated only with the same key. The status and the first 64 KiB of the body are the result.
//!
//! # What an attempt comes to
//!
//! | what happened | class | why |
//! |---|---|---|
//! | the payload is invalid, or the request cannot be built (a job stored before enqueue validation) | `permanent` | nothing was sent; the breaker is not fed |
//! | the egress policy refuses the host or every address it resolves to | `permanent` | nothing was sent (see [`crate::egress`]) |
//! | connection refused or reset before the request was sent, DNS failure | `infrastructure` | |
//! | timeout once connected | `timeout` (same key: repeat is safe) | the PSP may have acted |
//! | a 3xx (redirects are not followed by default) | `permanent`, naming the `Location` | unless the status table maps that status |
//! | other statuses | the status table (2xx success, 429, 5xx, 4xx…) | |
//! | a 2xx whose body **stalls or breaks** before its end | `timeout` (same key: repeat is safe) | the PSP acted but its answer was lost: the same-key repeat returns it |
//! | a non-2xx whose body stalls | the status's class | the status is enough to decide |
//! | a status of the decline map (default 402) whose JSON body carries decline advice | `declined` | see [`crate::declines`]; the network's rules decide what follows |
//!
//! # Bounded memory
//! The body is streamed and read only up to [`MAX_RESULT_BODY`] plus one chunk; then the
//! connection is dropped. Whatever the target sends, an attempt holds at most that much.
//! Nothing is decompressed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redrive_policy::{Outcome, StatusTable, retry_after_clamped};
use redrive_runtime::{Attempted, Handler, JobContext};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::declines::DeclineMap;
use crate::egress::{EgressPolicy, EgressResolver, MAX_REDIRECTS, RedirectMode, denial_in};
use crate::redact::{redact_text, redact_url};
use crate::validate::{
    EnqueueError, MAX_HEADERS, MAX_URL_OR_VALUE, METHODS, RESERVED_HEADERS, TIMEOUT_MS_RANGE,
    header_value_problem, is_token,
};

pub use crate::redact::redact_payload;

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
    /// One of [`METHODS`].
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
    /// How to read a card decline from the response: a preset name (`redrive`, `stripe`,
    /// `adyen`) or a [`DeclineMap`] object (see [`crate::declines`]); default: the handler's.
    #[serde(default)]
    pub declines: Option<Value>,
}

impl HttpPayload {
    /// Reads and checks a payload by the rules of [`crate::validate`].
    ///
    /// # Errors
    /// [`EnqueueError::Invalid`] naming the field (`payload.method`, `payload.headers.NAME`…);
    /// a header's value is never echoed.
    pub fn parse(v: &Value) -> Result<Self, EnqueueError> {
        let p: HttpPayload = serde_json::from_value(v.clone()).map_err(|e| {
            EnqueueError::invalid(
                "payload",
                "",
                format!(
                    "{} (an http payload is {{method, url, headers?, body?, timeout_ms?, declines?}})",
                    redact_text(&e.to_string())
                ),
            )
        })?;
        if !METHODS.contains(&p.method.as_str()) {
            let hint = if METHODS.contains(&p.method.to_ascii_uppercase().as_str()) {
                format!("methods are upper case: {}", p.method.to_ascii_uppercase())
            } else {
                format!("expected one of {}", METHODS.join(", "))
            };
            return Err(EnqueueError::invalid("payload.method", &p.method, hint));
        }
        check_url(&p.url)?;
        if p.headers.len() > MAX_HEADERS {
            return Err(EnqueueError::invalid(
                "payload.headers",
                "",
                format!("{} headers; at most {MAX_HEADERS}", p.headers.len()),
            ));
        }
        for (name, value) in &p.headers {
            let field = format!(
                "payload.headers.{}",
                name.chars().take(64).collect::<String>()
            );
            if !is_token(name) || name.len() > 256 {
                return Err(EnqueueError::invalid(
                    field,
                    "",
                    "a header name is 1..=256 token characters (letters, digits, !#$%&'*+-.^_`|~)",
                ));
            }
            let lower = name.to_ascii_lowercase();
            if RESERVED_HEADERS.contains(&lower.as_str()) {
                return Err(EnqueueError::invalid(field, "", reserved_reason(&lower)));
            }
            if let Some(problem) = header_value_problem(value) {
                return Err(EnqueueError::invalid(
                    field,
                    "",
                    format!("the value {problem}; allowed: visible ASCII, space and tab"),
                ));
            }
        }
        if let Some(t) = p.timeout_ms
            && !TIMEOUT_MS_RANGE.contains(&t)
        {
            return Err(EnqueueError::invalid(
                "payload.timeout_ms",
                &t.to_string(),
                "must be 1..=600000",
            ));
        }
        if let Some(d) = &p.declines {
            DeclineMap::from_payload(d)?;
        }
        Ok(p)
    }

    /// The decline map the payload names, if any (already validated by [`HttpPayload::parse`]).
    pub fn decline_map(&self) -> Option<DeclineMap> {
        self.declines
            .as_ref()
            .and_then(|d| DeclineMap::from_payload(d).ok())
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout_ms
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
    }
}

fn check_url(raw: &str) -> Result<reqwest::Url, EnqueueError> {
    let bad = |reason: String| EnqueueError::invalid("payload.url", raw, reason);
    if raw.len() > MAX_URL_OR_VALUE {
        return Err(bad("longer than 8 KiB".into()));
    }
    // The URL parser silently drops tabs and newlines: refuse them rather than send
    // something other than what was written.
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("contains whitespace or a control character".into()));
    }
    let url = reqwest::Url::parse(raw).map_err(|e| bad(format!("not an absolute URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("only http and https URLs".into()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("the URL has no host".into()));
    }
    Ok(url)
}

/// Why a job may not set the reserved header `lower` (a lowercase name of
/// [`RESERVED_HEADERS`]).
fn reserved_reason(lower: &str) -> &'static str {
    match lower {
        "idempotency-key" => {
            "redrive sends the job's key as Idempotency-Key itself; set the job's key instead"
        }
        "host" => "the Host is taken from payload.url; a job cannot set it",
        "content-length" | "transfer-encoding" | "trailer" => {
            "the HTTP client frames the body itself; a job cannot set this header"
        }
        _ => "a hop-by-hop header is the HTTP client's to set; a job cannot set it",
    }
}

/// The `http` job kind's handler.
#[derive(Debug, Clone)]
pub struct HttpJob {
    client: reqwest::Client,
    status: StatusTable,
    egress: Arc<EgressPolicy>,
    declines: Option<Arc<DeclineMap>>,
}

impl Default for HttpJob {
    fn default() -> Self {
        Self::new(StatusTable::default())
    }
}

/// Why an [`HttpJob`] could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the HTTP client")]
pub struct HttpJobError(#[source] reqwest::Error);

impl HttpJob {
    /// A handler classifying with `status`, under the default egress policy: public hosts
    /// only — loopback and private networks are refused until allowed (see
    /// [`crate::egress`]; a test calling a server on `127.0.0.1` uses
    /// [`HttpJob::with_egress`] with [`EgressPolicy::loopback_only`]).
    ///
    /// # Panics
    /// When the TLS backend cannot be initialised (as `reqwest::Client::new` does); use
    /// [`HttpJob::with_egress`] to get the error instead.
    pub fn new(status: StatusTable) -> Self {
        match Self::with_egress(status, EgressPolicy::default()) {
            Ok(j) => j,
            Err(e) => panic!("{e}: {:?}", e.0),
        }
    }

    /// A handler classifying with `status`, connecting only where `egress` allows and
    /// following redirects as it says. No proxy from the environment is used: the egress
    /// policy checks the addresses the worker itself connects to.
    ///
    /// # Errors
    /// [`HttpJobError`] when the HTTP client cannot be built.
    pub fn with_egress(status: StatusTable, egress: EgressPolicy) -> Result<Self, HttpJobError> {
        let egress = Arc::new(egress);
        let redirect = match egress.redirects() {
            RedirectMode::None => reqwest::redirect::Policy::none(),
            RedirectMode::SameOrigin => reqwest::redirect::Policy::custom(|a| {
                let same = a.previous().first().is_some_and(|first| {
                    first.scheme() == a.url().scheme()
                        && first.host_str() == a.url().host_str()
                        && first.port_or_known_default() == a.url().port_or_known_default()
                });
                if same && a.previous().len() <= MAX_REDIRECTS {
                    a.follow()
                } else {
                    a.stop()
                }
            }),
        };
        let client = reqwest::Client::builder()
            .redirect(redirect)
            .no_proxy()
            .dns_resolver(Arc::new(EgressResolver {
                policy: egress.clone(),
            }))
            .build()
            .map_err(HttpJobError)?;
        Ok(Self {
            client,
            status,
            egress,
            declines: None,
        })
    }

    /// Reads card declines out of responses with `map` for jobs whose payload names none.
    pub fn with_declines(mut self, map: DeclineMap) -> Self {
        self.declines = Some(Arc::new(map));
        self
    }

    async fn call(self, ctx: JobContext) -> Attempted {
        // The outbound call is a span of its own (a child of the attempt's), and its context
        // goes out as `traceparent` so the dependency's traces join the job's.
        let span = tracing::info_span!(
            "http call",
            otel.kind = "client",
            http.request.method = tracing::field::Empty,
            url.full = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty
        );
        let traceparent =
            span.in_scope(|| redrive_runtime::trace::outbound(ctx.traceparent.as_deref()));
        let (p, req) = match self.prepare(&ctx, traceparent.as_deref()) {
            Ok(x) => x,
            Err(a) => return a,
        };
        let shown = format!("{} {}", p.method, redact_url(&p.url));
        span.record("http.request.method", p.method.as_str());
        span.record("url.full", redact_url(&p.url).as_str());
        let resp = tokio::select! {
            r = self.client.execute(req).instrument(span.clone()) => r,
            _ = ctx.cancel.cancelled() => return Attempted::failure(Outcome::Exception, "lease lost; call abandoned"),
        };
        let resp = match resp {
            Ok(r) => r,
            Err(e) => return send_failure(&shown, &e),
        };
        let code = resp.status().as_u16();
        span.record("http.response.status_code", code);
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after_clamped(v, chrono::Utc::now(), RETRY_AFTER_MAX));
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|v| redact_url(&String::from_utf8_lossy(v.as_bytes())));
        let body = tokio::select! {
            b = read_bounded(resp, MAX_RESULT_BODY) => b,
            _ = ctx.cancel.cancelled() => return Attempted::failure(Outcome::Exception, "lease lost; call abandoned"),
        };
        let map = p
            .decline_map()
            .map(Arc::new)
            .or_else(|| self.declines.clone());
        let mut a = self.classify(&shown, code, retry_after, location, body);
        if let Some(m) = map
            && !matches!(a.outcome, Outcome::Timeout { .. })
            && let Some(advice) = m.advice(code, a.result.get("body").unwrap_or(&Value::Null))
        {
            a.outcome = Outcome::Declined(advice);
            a.error = Some(format!(
                "{shown} → {code}: declined ({})",
                advice.describe()
            ));
            if a.response.is_none()
                && let Some(body) = a.result.get("body").filter(|b| !b.is_null())
            {
                // A decline in a 2xx: its body is still what the PSP said.
                let text = crate::redact::redact_value(body).to_string();
                let cut = redrive_store::excerpt(&text, redrive_store::MAX_RESPONSE_EXCERPT);
                a.response = Some(cut.to_owned());
            }
        }
        a
    }

    /// Parses the payload and builds the request; what fails here never left the process.
    #[allow(clippy::result_large_err)]
    fn prepare(
        &self,
        ctx: &JobContext,
        traceparent: Option<&str>,
    ) -> Result<(HttpPayload, reqwest::Request), Attempted> {
        let p = HttpPayload::parse(&ctx.payload)
            .map_err(|e| Attempted::failure(Outcome::Permanent, e.to_string()))?;
        let mut key = ctx
            .key
            .clone()
            .unwrap_or_else(|| format!("redrive-job-{}", ctx.job_id));
        // A reattempt after a decline is a new authorisation (a PSP replays a stored decline
        // for the same key); the decline charged nothing, so a new key cannot charge twice.
        if ctx.declines > 0 {
            key = format!("{key}-r{}", ctx.declines);
        }
        let method = reqwest::Method::from_bytes(p.method.as_bytes()).map_err(|_| {
            Attempted::failure(Outcome::Permanent, "payload.method: not an HTTP method")
        })?;
        let url =
            check_url(&p.url).map_err(|e| Attempted::failure(Outcome::Permanent, e.to_string()))?;
        self.egress
            .check_url(&url)
            .map_err(|d| Attempted::failure(Outcome::Permanent, redact_text(&d.to_string())))?;
        let mut req = self
            .client
            .request(method, url)
            .timeout(p.timeout())
            .header("Idempotency-Key", &key);
        for (k, v) in &p.headers {
            req = req.header(k, v);
        }
        // W3C trace context, unless the payload sets its own.
        if let Some(tp) = traceparent
            && !p
                .headers
                .keys()
                .any(|k| k.eq_ignore_ascii_case("traceparent"))
        {
            req = req.header("traceparent", tp);
        }
        req = match &p.body {
            None => req,
            Some(Value::String(s)) => req.body(s.clone()),
            Some(b) => req.json(b),
        };
        let req = req.build().map_err(|e| {
            Attempted::failure(
                Outcome::Permanent,
                format!(
                    "the request cannot be built (nothing was sent): {}",
                    redact_text(&error_chain(&e))
                ),
            )
        })?;
        Ok((p, req))
    }

    fn classify(
        &self,
        shown: &str,
        code: u16,
        retry_after: Option<Duration>,
        location: Option<String>,
        body: Body,
    ) -> Attempted {
        let kept = &body.bytes[..body.bytes.len().min(MAX_RESULT_BODY)];
        let body_value = serde_json::from_slice::<Value>(kept)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(kept).into_owned()));
        let result = json!({"status": code, "body": body_value, "truncated": body.truncated});
        let success = self.status.outcome(code, retry_after) == Outcome::Success;
        if let Some(err) = &body.error
            && success
        {
            // The PSP acted and answered 2xx, but its answer was lost: ambiguous. The same key
            // makes the repeat safe and returns the stored answer.
            return Attempted {
                outcome: Outcome::Timeout { idempotent: true },
                result: Value::Null,
                http_status: Some(code),
                error: Some(format!(
                    "{shown} → {code}, but the body {err} after {} bytes",
                    body.bytes.len()
                )),
                response: None,
            };
        }
        let redirect = (300..400).contains(&code) && !self.status.overrides().contains_key(&code);
        let outcome = if redirect {
            Outcome::Permanent
        } else {
            self.status.outcome(code, retry_after)
        };
        let error = (outcome != Outcome::Success).then(|| {
            let mut e = format!("{shown} → {code}");
            if redirect {
                e.push_str(&format!(
                    ": redirect to {} not followed (egress redirects = {})",
                    location.as_deref().unwrap_or("(no Location)"),
                    self.egress.redirects()
                ));
            }
            if let Some(err) = &body.error {
                e.push_str(&format!("; the body {err}"));
            }
            e
        });
        // What the PSP said about a failure ("invalid amount: -5"), redacted and cut: kept with
        // the attempt for the operator.
        let response = (outcome != Outcome::Success)
            .then(|| crate::redact::response_excerpt(kept, redrive_store::MAX_RESPONSE_EXCERPT))
            .flatten();
        Attempted {
            error,
            result,
            http_status: Some(code),
            outcome,
            response,
        }
    }
}

/// What a failed `send` comes to.
fn send_failure(shown: &str, e: &reqwest::Error) -> Attempted {
    let text = format!("{shown}: {}", redact_text(&error_chain(e)));
    if let Some(d) = denial_in(e) {
        return Attempted::failure(
            Outcome::Permanent,
            format!("{shown}: {}", redact_text(&d.to_string())),
        );
    }
    if e.is_builder() {
        return Attempted::failure(
            Outcome::Permanent,
            format!("the request cannot be built (nothing was sent): {text}"),
        );
    }
    // Not connected: the PSP never saw it (refused, reset: infrastructure).
    // A timeout once connected: it may have, so it is ambiguous.
    let outcome = if e.is_timeout() && !e.is_connect() {
        Outcome::Timeout { idempotent: true }
    } else {
        Outcome::Infrastructure { retry_after: None }
    };
    Attempted::failure(outcome, text)
}

/// A response body read up to a limit.
#[derive(Debug, Default)]
struct Body {
    /// What was read (at most the limit plus one chunk).
    bytes: Vec<u8>,
    /// More was sent than the limit (the rest was not read).
    truncated: bool,
    /// The body ended early: `"timed out"`, `"broke: …"`.
    error: Option<String>,
}

/// Reads at most `limit` bytes (plus the rest of the chunk that crosses it), then drops the
/// response, which closes the connection.
async fn read_bounded(mut resp: reqwest::Response, limit: usize) -> Body {
    let mut body = Body::default();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = (limit + 1).saturating_sub(body.bytes.len());
                body.bytes
                    .extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.bytes.len() > limit {
                    body.truncated = true;
                    body.bytes.truncate(limit);
                    return body;
                }
            }
            Ok(None) => return body,
            Err(e) => {
                body.error = Some(if e.is_timeout() {
                    "timed out".into()
                } else {
                    format!("broke: {}", redact_text(&error_chain(&e)))
                });
                return body;
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

impl Handler for HttpJob {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        Box::pin(self.clone().call(ctx))
    }
}
