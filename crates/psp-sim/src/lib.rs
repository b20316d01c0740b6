//! A payment service provider (PSP) simulator with fault injection, for
//! redrive's demo, tests and benchmarks.
//!
//! It makes charges idempotently by `Idempotency-Key`, injects the faults a
//! real PSP shows (outages, rate limits, server errors, answers lost after
//! the charge was committed, latency), and counts every effect per key, so a
//! test can assert that retries never charged anyone twice.
//!
//! ```no_run
//! # async fn demo() -> Result<(), redrive_psp_sim::SimError> {
//! use std::time::Duration;
//! use redrive_psp_sim::{Faults, PspSim};
//!
//! let sim = PspSim::builder()
//!     .faults(Faults { error_rate: 0.2, latency: Duration::from_millis(5), ..Faults::none() })
//!     .seed(7)
//!     .start("127.0.0.1:0")
//!     .await?;
//! println!("PSP at {}", sim.url()); // POST {url}/v1/charges with an Idempotency-Key
//! // ... run the workers against it ...
//! let stats = sim.stats();
//! assert_eq!(stats.duplicate_effects, 0);
//! sim.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # HTTP API
//!
//! | route | answer |
//! |---|---|
//! | `POST /v1/charges` `{amount, currency, reference?}` + `Idempotency-Key` | 201 charge; a repeat with the same key and body: 201, the same charge, `Idempotent-Replayed: true`; same key, other body: 422; same key while the first is in flight: 409 + `Retry-After: 1`; no key: 400; bad JSON: 400; bad `amount` (positive integer, minor units) / `currency` (3 letters) / `reference` (string ≤ 255): 422 naming the `field` |
//! | `GET /v1/charges/{id}` | 200 charge or 404 |
//! | `GET /v1/charges?key=K` | the status query after a timeout: 200 with the charge made for K, 404 if none, 409 while K's first request is in flight |
//! | `GET /_sim/faults` | the faults in force (see [`Faults`] for the JSON) |
//! | `POST /_sim/faults` | replace every fault (left-out fields are off; `seed` reseeds); 200 with the faults now in force, 422 naming a bad field |
//! | `GET /_sim/stats` | [`Stats`] as JSON |
//! | `GET /_sim/requests?after=SEQ&limit=N` | the request log, oldest first: a [`RequestPage`] of [`RequestRecord`]s (`seq`, `at` wall-clock UTC, `t_us` since the start, `method`, `path`, `key`, `status`, `replayed_by`, `traceparent`) with `seq > after` (default 0), at most `limit` (default 1,000, at most 10,000); `next` is the cursor of the following page, `null` at the end; 400 naming an unknown or bad parameter |
//! | `POST /_sim/reset` | 204; clears ledger and counters, restarts the clock, reseeds with the current seed |
//!
//! Errors are `application/problem+json` with `type`, `title`, `status`,
//! `detail` and, where one field is at fault, `field`.
//!
//! # Fault semantics
//!
//! Faults apply to `/v1` routes only (the `/_sim` routes are never faulted
//! and never counted). For each request, in this order:
//!
//! 1. **Outage**: inside the window `start <= t < start + length` → 503,
//!    without `Retry-After` unless `outage_retry_after` is set. `t` and the
//!    window's start count from the simulator's start (its last reset); a
//!    window posted with `"relative_to": "now"` counts from the moment it is
//!    posted and is stored resolved to the start. `--outage 5s+5s` counts
//!    from the server's start.
//! 2. **Rate limit**: a token bucket holding `max(1, rate)` tokens, full at
//!    the start, refilled continuously at `rate` per second; a request finding
//!    less than one token → 429, with `Retry-After` when `retry_after` is set.
//!    Refused requests take no token; setting faults refills the bucket.
//! 3. **Error rate**: with the seeded RNG, that share of requests → 500, 502
//!    or 503 (uniformly), and no charge is made.
//! 4. Otherwise the request is handled: a charge stays in flight for
//!    `processing` (0 by default), then is committed.
//! 5. **Timeout after commit**: with its own seeded stream, that share of the
//!    charges just made (never replays) have their answer held back for
//!    `timeout_delay` (30 s by default): the charge is in the ledger, the
//!    client times out, a status query by key finds it.
//! 6. **Latency** is added to every answer, faulted or not.
//!
//! With a seed, the same sequence of requests meets the same faults.
//! A request is counted in [`Stats`] when its status is decided, before any
//! hold-back or latency, in the 100 ms timeline slice of its arrival, and
//! logged with its exact arrival time (the last [`REQUEST_LOG_CAPACITY`]
//! requests are kept).
//!
//! # The dedupe seam
//!
//! [`PspSimBuilder::charges_layer`] (or [`router_with`]) puts a tower layer
//! around `POST /v1/charges` alone: after the edge faults, before the
//! ledger, inside the hold-back and latency. That is where the generic
//! idempotency layer goes; the ledger's own check stays as a second line of
//! defence, and [`PspSimBuilder::ledger_dedupe`]`(false)` (`redrive psp-sim
//! --ledger-dedupe off`) turns it off to show what the layer alone achieves,
//! as at a real PSP. `duplicate_effects` and `effects_max_per_key` are counted
//! from the effects per key, whatever the dedupe did; `layer_replays` counts
//! the answers the layer replayed, `replays` the ledger's, and
//! `executions_max_per_key` how often the charge handler ran for one key.
//!
//! A test that claims "every charge exactly once" should run with the
//! ledger's dedupe off: with it on, `duplicate_effects` is 0 by construction.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use axum::routing::Route;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::{Layer, Service};

pub mod declines;
mod faults;
pub mod judge;
mod ledger;
mod routes;
mod state;
mod stats;

pub use declines::{DeclineKind, parse_decline_mix};
pub use faults::{
    DEFAULT_TIMEOUT_DELAY, Faults, FaultsError, MAX_RATE_LIMIT, Outage, OutageAnchor, parse_outage,
};
pub use judge::{After, CardNetwork, JudgeRules, ReattemptWindow};
pub use ledger::{Charge, ChargeRequest, ChargeRequestError, MAX_KEY_LEN, MAX_REFERENCE_LEN};
pub use routes::{ChargesRoute, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, router, router_with};
pub use state::SimState;
pub use stats::{
    BUCKET, Injected, REQUEST_LOG_CAPACITY, ReplayedBy, RequestPage, RequestRecord, Stats,
    TimelineBucket,
};

/// How long [`RunningSim::shutdown`] waits for open connections to finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The simulator could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A fault setting is invalid.
    #[error(transparent)]
    Faults(#[from] FaultsError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Entry point: [`PspSim::builder`].
#[derive(Debug, Clone, Copy)]
pub struct PspSim;

impl PspSim {
    /// A builder with no faults, a random seed and the ledger's dedupe on.
    pub const fn builder() -> PspSimBuilder {
        PspSimBuilder::new()
    }
}

/// Configures and starts a simulator.
///
/// # Default
/// [`Faults::none()`], a random seed (reported in [`Stats::seed`]), the
/// ledger's dedupe on, nothing in front of the ledger, a request log of
/// [`REQUEST_LOG_CAPACITY`] requests.
pub struct PspSimBuilder {
    quotas: Option<redrive_policy::QuotaRules>,
    judge: Option<JudgeRules>,
    faults: Faults,
    seed: Option<u64>,
    ledger_dedupe: bool,
    log_capacity: usize,
    wrap: Option<routes::Wrap>,
}

impl std::fmt::Debug for PspSimBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PspSimBuilder")
            .field("faults", &self.faults)
            .field("seed", &self.seed)
            .field("ledger_dedupe", &self.ledger_dedupe)
            .field("request_log_capacity", &self.log_capacity)
            .field("charges_layer", &self.wrap.is_some())
            .finish()
    }
}

impl Default for PspSimBuilder {
    fn default() -> Self {
        PspSimBuilder::new()
    }
}

impl PspSimBuilder {
    /// See the type's `# Default`.
    pub const fn new() -> Self {
        PspSimBuilder {
            quotas: None,
            judge: None,
            faults: Faults::none(),
            seed: None,
            ledger_dedupe: true,
            log_capacity: REQUEST_LOG_CAPACITY,
            wrap: None,
        }
    }

    /// The faults to start with (checked by [`PspSimBuilder::build`]).
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The per-card reattempt quotas reattempts are checked against, taken from the client's
    /// own rules (default: the judge's, [`JudgeRules::default`]). A check that shares the
    /// client's figures cannot catch a wrong one: prefer [`PspSimBuilder::judge`].
    pub fn reattempt_quotas(mut self, quotas: redrive_policy::QuotaRules) -> Self {
        self.quotas = Some(quotas);
        self
    }

    /// The rules reattempts are judged by ([`crate::judge`]: the simulator's own table of the
    /// networks' rules, default [`JudgeRules::default`]); wins over
    /// [`PspSimBuilder::reattempt_quotas`].
    pub fn judge(mut self, rules: JudgeRules) -> Self {
        self.judge = Some(rules);
        self
    }

    /// Seeds the fault RNG; wins over `Faults::seed`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Whether the ledger refuses a second effect for a key (default `true`).
    /// Off, every valid charge request makes a charge, and only a
    /// [`PspSimBuilder::charges_layer`] keeps `duplicate_effects` at zero.
    pub fn ledger_dedupe(mut self, on: bool) -> Self {
        self.ledger_dedupe = on;
        self
    }

    /// How many requests the request log keeps before it drops the oldest
    /// (default [`REQUEST_LOG_CAPACITY`]). A finite run that must check every
    /// request (the demo) sets it above the requests it can make.
    pub fn request_log_capacity(mut self, n: usize) -> Self {
        self.log_capacity = n;
        self
    }

    /// Wraps `POST /v1/charges` in `layer` (see the crate docs, "The dedupe seam").
    pub fn charges_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<Route> + Clone + Send + Sync + 'static,
        L::Service:
            Service<Request, Error = std::convert::Infallible> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        self.wrap = Some(routes::wrap_with(layer));
        self
    }

    /// Puts redrive's own idempotency layer (memory store, key required) in front of
    /// `POST /v1/charges`, as a real PSP would have: repeats are answered from the stored
    /// response before the ledger is reached.
    pub fn with_idempotency_layer(self) -> Self {
        let store: std::sync::Arc<dyn redrive_idempotency::IdempotencyStore> =
            std::sync::Arc::new(redrive_idempotency::MemoryIdempotencyStore::new());
        let layer = redrive_idempotency::IdempotencyLayer::builder(store)
            .with_required(true)
            .build()
            .expect("the default idempotency settings are valid");
        self.charges_layer(layer)
    }

    /// The state and its router, for serving yourself or for
    /// `router.oneshot(request)` in tests. The clock starts now.
    ///
    /// # Errors
    /// [`SimError::Faults`] naming the first invalid fault field.
    pub fn build(self) -> Result<(SimState, Router), SimError> {
        let mut faults = self.faults;
        if self.seed.is_some() {
            faults.seed = self.seed;
        }
        let state = SimState::with_log_capacity(faults, self.ledger_dedupe, self.log_capacity)?;
        if let Some(q) = self.quotas {
            state.set_reattempt_quotas(q);
        }
        if let Some(j) = self.judge {
            state.set_judge(j);
        }
        let wrap = self.wrap.unwrap_or_else(|| Box::new(|r| r));
        let router = routes::build(state.clone(), wrap);
        Ok((state, router))
    }

    /// Binds `addr` (port 0 picks one) and serves in a background task.
    ///
    /// # Errors
    /// [`SimError::Faults`] for invalid faults, [`SimError::Bind`] when the
    /// address cannot be bound.
    pub async fn start(self, addr: &str) -> Result<RunningSim, SimError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Bind {
                addr: addr.to_owned(),
                source,
            })?;
        self.serve(listener)
    }

    /// Serves on a listener already bound, in a background task.
    ///
    /// # Errors
    /// [`SimError::Faults`] for invalid faults, [`SimError::Bind`] when the
    /// listener's address cannot be read.
    pub fn serve(self, listener: TcpListener) -> Result<RunningSim, SimError> {
        let addr = listener.local_addr().map_err(|source| SimError::Bind {
            addr: "listener".into(),
            source,
        })?;
        let (state, router) = self.build()?;
        let signal = state.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { signal.shutdown_signal().await })
                .await
        });
        Ok(RunningSim {
            addr,
            state,
            task: Some(task),
        })
    }
}

/// A simulator serving in the background. Dropping it stops it abruptly;
/// [`RunningSim::shutdown`] stops it gracefully.
#[derive(Debug)]
pub struct RunningSim {
    addr: SocketAddr,
    state: SimState,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl RunningSim {
    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The shared state.
    pub fn state(&self) -> &SimState {
        &self.state
    }

    /// A snapshot of the counters (what `GET /_sim/stats` returns).
    pub fn stats(&self) -> Stats {
        self.state.stats()
    }

    /// The whole request log; see [`SimState::requests`].
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.state.request_log()
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        self.state.faults()
    }

    /// Replaces every fault; see [`SimState::set_faults`].
    ///
    /// # Errors
    /// [`FaultsError`] naming the first invalid field.
    pub fn set_faults(&self, faults: Faults) -> Result<Faults, FaultsError> {
        self.state.set_faults(faults)
    }

    /// Clears the ledger and the counters; see [`SimState::reset`].
    pub fn reset(&self) {
        self.state.reset();
    }

    /// Stops accepting, ends every hold-back and latency at once, and waits
    /// up to [`SHUTDOWN_GRACE`] for open connections before aborting them.
    pub async fn shutdown(mut self) {
        self.state.signal_shutdown();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for RunningSim {
    fn drop(&mut self) {
        self.state.signal_shutdown();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
