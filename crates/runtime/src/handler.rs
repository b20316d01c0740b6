//! What a job kind's code looks like to the runtime: [`Handler`], the [`JobContext`] it gets
//! for each attempt, the [`Attempted`] it returns, and the two hooks (`refresh_credentials`,
//! `query_status`).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use futures::future::BoxFuture;
use redrive_policy::Outcome;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// What a handler gets for one attempt.
#[derive(Debug, Clone)]
pub struct JobContext {
    /// The job's id.
    pub job_id: i64,
    /// The job's queue.
    pub queue: String,
    /// The job's kind.
    pub kind: String,
    /// This attempt's number (1-based, counted attempts so far + 1).
    pub attempt: u32,
    /// The job's idempotency key (send it with every call).
    pub key: Option<String>,
    /// The dependency the job calls, if it names one.
    pub dependency: Option<String>,
    /// The lease's fencing token.
    pub lease_token: i64,
    /// The payload.
    pub payload: serde_json::Value,
    /// Cancelled when the lease is lost or the worker must stop: return soon. (The runtime also
    /// drops the attempt's future then; the token lets long handlers clean up first.)
    pub cancel: CancellationToken,
    /// Card declines this job got before this attempt. A reattempt after a decline is a new
    /// authorisation: a PSP that stores its answers by idempotency key would replay the
    /// decline, so send a key of its own, e.g. `KEY-rN` (the `http` kind does). A decline
    /// made no charge, so the new key cannot charge twice.
    pub declines: u32,
    /// The W3C `traceparent` stored with the job (the request that enqueued it), if any. Send
    /// [`crate::trace::outbound`]'s answer on outbound calls so the dependency's traces join.
    pub traceparent: Option<String>,
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempted {
    /// The classified outcome.
    pub outcome: Outcome,
    /// The result to store on success.
    pub result: serde_json::Value,
    /// The HTTP status, if the handler made an HTTP call.
    pub http_status: Option<u16>,
    /// Error text (redact secrets before returning it).
    pub error: Option<String>,
    /// For a failure: what the dependency answered, an excerpt of its response body (redact
    /// secrets and card numbers before returning it). Stored with the attempt, cut to
    /// `redrive_store::MAX_RESPONSE_EXCERPT` bytes, and shown to the operator beside the error.
    pub response: Option<String>,
}

impl Attempted {
    /// Success with a result.
    pub fn success(result: serde_json::Value) -> Self {
        Self {
            outcome: Outcome::Success,
            result,
            http_status: None,
            error: None,
            response: None,
        }
    }
    /// A failure of the given outcome with an error text.
    pub fn failure(outcome: Outcome, error: impl Into<String>) -> Self {
        Self {
            outcome,
            result: serde_json::Value::Null,
            http_status: None,
            error: Some(error.into()),
            response: None,
        }
    }
    /// A card decline with the network's advice: the card networks' reattempt rules decide what
    /// follows (see `redrive_policy::DeclineRule`), never the generic retry schedule.
    ///
    /// ```
    /// use redrive_policy::{DeclineAdvice, Outcome};
    /// use redrive_runtime::Attempted;
    /// // What a PSP's decline said: Mastercard, response code 51, Merchant Advice Code 24.
    /// let advice = DeclineAdvice::mastercard("51", Some(24)).unwrap();
    /// let a = Attempted::declined(advice, "insufficient funds").with_status(402);
    /// assert_eq!(a.outcome, Outcome::Declined(advice));
    /// ```
    pub fn declined(advice: redrive_policy::DeclineAdvice, error: impl Into<String>) -> Self {
        Self::failure(Outcome::Declined(advice), error)
    }
    /// The same, with the HTTP status that caused it.
    pub fn with_status(mut self, status: u16) -> Self {
        self.http_status = Some(status);
        self
    }
    /// The same, with what the dependency answered (an excerpt of its response body, already
    /// redacted): kept with a failed attempt so the operator sees why it failed.
    ///
    /// ```
    /// use redrive_policy::Outcome;
    /// use redrive_runtime::Attempted;
    /// let a = Attempted::failure(Outcome::Permanent, "POST /v1/charges → 422")
    ///     .with_status(422)
    ///     .with_response(r#"{"error":"invalid amount: -5"}"#);
    /// assert!(a.response.unwrap().contains("invalid amount"));
    /// ```
    pub fn with_response(mut self, excerpt: impl Into<String>) -> Self {
        self.response = Some(excerpt.into());
        self
    }
}

/// The answer of a status query after an ambiguous timeout.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusAnswer {
    /// The call did take effect: the job succeeded with this result (no second call).
    Succeeded(serde_json::Value),
    /// The dependency has no trace of the call: calling again cannot do it twice.
    NotFound,
    /// The dependency could not tell: the job dies with reason `ambiguous`.
    Unknown(String),
}

/// A job kind's code.
///
/// Only [`Handler::run`] is required. The hooks have defaults: no credentials to refresh, and
/// no status query (an ambiguous timeout without an idempotency key is then final).
///
/// The future `run` returns should wait, not compute: a few jobs of a claim (up to 16) share
/// one task, so a call that holds its thread for long holds theirs too. Put CPU-heavy or
/// blocking work in `tokio::task::spawn_blocking` (or a task of its own) and await it.
pub trait Handler: Send + Sync + fmt::Debug {
    /// Runs one attempt.
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted>;

    /// Called after a first 401: refresh the credentials the next call uses. The runtime runs
    /// one refresh for every job of this process that hit a 401 at the same time, and the 401
    /// does not use up an attempt. An `Err` is logged; the call is made again anyway (a
    /// second 401 in a row is final).
    fn refresh_credentials(&self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    /// Called after a timeout that may have reached the dependency when repeating the call is
    /// not known to be safe (`Outcome::Timeout { idempotent: false }`): ask the dependency
    /// what happened. `None` (the default): there is no way to ask.
    fn query_status(&self, _ctx: JobContext) -> Option<BoxFuture<'static, StatusAnswer>> {
        None
    }
}

/// The built-in `noop` kind: succeeds at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

impl Handler for Noop {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, Attempted> {
        Box::pin(async { Attempted::success(serde_json::Value::Null) })
    }
}

/// A handler from an async function over a typed payload (deserialized with serde). A payload
/// that does not deserialize is a permanent failure naming the error.
///
/// ```
/// use redrive_runtime::{Attempted, JobContext, typed};
/// #[derive(serde::Deserialize)]
/// struct Charge { amount: u64 }
/// let h = typed(|c: Charge, _ctx: JobContext| async move {
///     Attempted::success(serde_json::json!({ "charged": c.amount }))
/// });
/// # let _ = h;
/// ```
pub fn typed<P, F, Fut>(f: F) -> Arc<dyn Handler>
where
    P: DeserializeOwned + Send + 'static,
    F: Fn(P, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Attempted> + Send + 'static,
{
    Arc::new(Typed {
        f,
        _p: PhantomData::<fn() -> P>,
    })
}

struct Typed<P, F> {
    f: F,
    _p: PhantomData<fn() -> P>,
}

impl<P, F> fmt::Debug for Typed<P, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::any::type_name::<Self>())
    }
}

impl<P, F, Fut> Handler for Typed<P, F>
where
    P: DeserializeOwned + Send + 'static,
    F: Fn(P, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Attempted> + Send + 'static,
{
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, Attempted> {
        match serde_json::from_value::<P>(ctx.payload.clone()) {
            Ok(p) => Box::pin((self.f)(p, ctx)),
            Err(e) => {
                Box::pin(
                    async move { Attempted::failure(Outcome::Permanent, format!("payload: {e}")) },
                )
            }
        }
    }
}
