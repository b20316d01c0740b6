//! The application state shared by every handler, and the settings it is built from.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use redrive_idempotency::{Fingerprint, IdempotencyLayer, IdempotencyStore, RecoveryMode, Scope};
use redrive_policy::PolicySet;
use redrive_store::{Clock, Store, SystemClock};
use tokio::sync::Semaphore;

use crate::auth::{Token, Tokens};
use crate::conn::ConnLimits;
use crate::error::ServiceError;
use crate::guard::{FrontDoor, parse_public_host};
use crate::session::{DEFAULT_SESSION_TTL, FailureLimiter, Sessions};

/// The largest request body accepted (1 MiB); larger ones get 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The default listen address of `redrive serve`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";

/// How long an `Idempotency-Key` of `POST /v1/jobs` stays claimed by a request whose process
/// vanished (killed, crashed) before a repeat may take it over and enqueue again: 30 s.
pub const DEFAULT_IDEMPOTENCY_RECOVERY_WINDOW: Duration = Duration::from_secs(30);

/// The shortest recovery window accepted (the idempotency layer's shortest lease).
pub const MIN_IDEMPOTENCY_RECOVERY_WINDOW: Duration = redrive_idempotency::MIN_LEASE;

/// The scope of every `Idempotency-Key` of the API (one tenant per service).
pub const IDEMPOTENCY_SCOPE: &str = "default";

/// The label of a token given without one (`--token SECRET`), as the audit trail names it.
pub const PLAIN_TOKEN_LABEL: &str = "token";

/// A token of [`AppConfig::tokens`]: a secret with a label (named by the audit trail) and a
/// role.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// The label (letters, digits, `_`, `-`, `.`; at most 64).
    pub label: String,
    /// The secret a request carries as `Authorization: Bearer <secret>`.
    pub secret: String,
    /// Only reads (`GET`): writes get 403 problem+json.
    pub read_only: bool,
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiToken")
            .field("label", &self.label)
            .field("secret", &"[redacted]")
            .field("read_only", &self.read_only)
            .finish()
    }
}

fn is_label(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl ApiToken {
    /// Reads `label:secret`, or a plain secret (labelled [`PLAIN_TOKEN_LABEL`]) when the part
    /// before the first `:` is not a label (or there is none).
    pub fn parse(s: &str, read_only: bool) -> Self {
        let (label, secret) = match s.split_once(':') {
            Some((l, rest)) if is_label(l) && !rest.is_empty() => (l, rest),
            _ => (PLAIN_TOKEN_LABEL, s),
        };
        Self {
            label: label.to_owned(),
            secret: secret.to_owned(),
            read_only,
        }
    }
}

/// One more thing `/readyz` checks besides the store, e.g. that the in-process worker pool of
/// `redrive serve --workers N` runs: `Err` says what is wrong (the 503's detail).
#[derive(Clone)]
pub struct ReadyCheck {
    name: &'static str,
    check: Arc<dyn Fn() -> Result<(), String> + Send + Sync>,
}

impl ReadyCheck {
    /// A check called `name` (the slug of its problem, e.g. `workers-stopped`).
    pub fn new(
        name: &'static str,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            check: Arc::new(check),
        }
    }

    /// The check's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the check.
    ///
    /// # Errors
    /// What is wrong.
    pub fn check(&self) -> Result<(), String> {
        (self.check)()
    }
}

impl fmt::Debug for ReadyCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReadyCheck").field(&self.name).finish()
    }
}

/// What the application needs besides the store.
///
/// # Default
/// No token, the built-in policy presets, no Prometheus handle (`/metrics` answers 404), no
/// public host (only loopback names), no `Secure` cookie, `/metrics` behind the token when
/// there is one, 12-hour sessions, the default [`ConnLimits`], the system clock, the
/// idempotency recovery window [`DEFAULT_IDEMPOTENCY_RECOVERY_WINDOW`], no readiness checks
/// besides the store's.
#[derive(Clone)]
pub struct AppConfig {
    /// The bearer token every `/v1` call (and the dashboard) must carry; `None`: open (unless
    /// [`AppConfig::tokens`] has some). Labelled [`PLAIN_TOKEN_LABEL`], may write.
    pub token: Option<String>,
    /// More tokens, each with a label and a role; any of them (or `token`) is accepted.
    pub tokens: Vec<ApiToken>,
    /// The retry policies jobs may name.
    pub policies: PolicySet,
    /// Policies replaced while the service runs (`redrive serve` reloads a new stored
    /// version): when set, the API reads them and `policies` is not used.
    pub live_policies: Option<redrive_runtime::LivePolicies>,
    /// The installed Prometheus recorder's handle, rendered at `/metrics`.
    pub prometheus: Option<PrometheusHandle>,
    /// Host names (with an optional port) the service answers as besides loopback names
    /// (`--public-host`); with a token, setting any turns the `Host` check on.
    pub public_hosts: Vec<String>,
    /// Mark the session cookie `Secure` (served behind TLS; `--cookie-secure`).
    pub cookie_secure: bool,
    /// Serve `/metrics` without the token (`--metrics-public`).
    pub metrics_public: bool,
    /// How long a dashboard session lasts.
    pub session_ttl: Duration,
    /// Connection limits of [`serve_listener`](crate::serve_listener).
    pub connections: ConnLimits,
    /// The clock of sessions, the login limit and every time the API writes to shared rows
    /// (`None`: the system clock; `redrive serve` passes one synced to the database's).
    pub clock: Option<Arc<dyn Clock>>,
    /// How long a `POST /v1/jobs` whose process vanished holds its `Idempotency-Key` before a
    /// repeat takes it over and enqueues again (the layer's lease; a live request extends it
    /// every third of it). Safe because the enqueue is idempotent by job key: the repeat finds
    /// the job if the first run made it. `None`: [`DEFAULT_IDEMPOTENCY_RECOVERY_WINDOW`].
    pub idempotency_recovery_window: Option<Duration>,
    /// More checks of `/readyz` (e.g. the in-process worker pool).
    pub ready_checks: Vec<ReadyCheck>,
    /// Refuse (422, naming the member) an enqueue whose payload carries card data: a member
    /// named like a card field or a card number ([`redrive_http::redact::find_card_data`])
    /// (`--refuse-card-data`). Card data is masked on every surface either way.
    pub refuse_card_data: bool,
}

impl Default for AppConfig {
    fn default() -> Self {
        Self {
            token: None,
            tokens: Vec::new(),
            policies: PolicySet::default(),
            live_policies: None,
            prometheus: None,
            public_hosts: Vec::new(),
            cookie_secure: false,
            metrics_public: false,
            session_ttl: DEFAULT_SESSION_TTL,
            connections: ConnLimits::default(),
            clock: None,
            idempotency_recovery_window: None,
            ready_checks: Vec::new(),
            refuse_card_data: false,
        }
    }
}

impl fmt::Debug for AppConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppConfig")
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("tokens", &self.tokens)
            .field("policies", &self.policies.names().collect::<Vec<_>>())
            .field("prometheus", &self.prometheus.is_some())
            .field("public_hosts", &self.public_hosts)
            .field("cookie_secure", &self.cookie_secure)
            .field("metrics_public", &self.metrics_public)
            .field("session_ttl", &self.session_ttl)
            .field("connections", &self.connections)
            .field(
                "idempotency_recovery_window",
                &self.idempotency_recovery_window,
            )
            .field("ready_checks", &self.ready_checks)
            .field("refuse_card_data", &self.refuse_card_data)
            .finish_non_exhaustive()
    }
}

/// Everything [`serve`](crate::serve) needs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Where to listen (port 0 picks one).
    pub addr: SocketAddr,
    /// The job store.
    pub store: Store,
    /// The application settings.
    pub app: AppConfig,
}

/// The state behind every handler (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) store: Store,
    /// The clock of every time written to shared rows (enqueues, pauses, run-now, bulk
    /// actions, schedules), the sessions and the login limit: `redrive serve` passes one
    /// synced to the database's (R24).
    pub(crate) clock: Arc<dyn Clock>,
    /// The policies jobs may name, as now in force ([`AppConfig::live_policies`]).
    pub(crate) policies: redrive_runtime::LivePolicies,
    /// The accepted tokens; `None`: the service is open.
    pub(crate) token: Option<Tokens>,
    pub(crate) prometheus: Option<PrometheusHandle>,
    pub(crate) idempotency: IdempotencyLayer,
    pub(crate) ready_checks: Vec<ReadyCheck>,
    /// The last write probe of `/readyz` (when, and why it failed), reused for a second so
    /// that a flood of probes makes at most one write a second.
    pub(crate) write_probe: tokio::sync::Mutex<Option<(std::time::Instant, Result<(), String>)>>,
    pub(crate) front_door: FrontDoor,
    pub(crate) sessions: Sessions,
    pub(crate) logins: FailureLimiter,
    /// Wrong bearer tokens per client address.
    pub(crate) bearers: FailureLimiter,
    pub(crate) cookie_secure: bool,
    pub(crate) metrics_public: bool,
    /// [`AppConfig::refuse_card_data`].
    pub(crate) refuse_card_data: bool,
    pub(crate) connections: ConnLimits,
    /// One permit per connection being served.
    pub(crate) connection_slots: Arc<Semaphore>,
}

impl fmt::Debug for AppState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppState")
            .field("store", &self.inner.store.backend())
            .field("token", &self.inner.token.is_some())
            .field("prometheus", &self.inner.prometheus.is_some())
            .finish()
    }
}

impl AppState {
    /// Now, by the service's clock ([`AppConfig::clock`]).
    pub(crate) fn now(&self) -> redrive_store::Timestamp {
        self.inner.clock.now()
    }

    /// Builds the state: prepares the idempotency table in the store's own database (the
    /// SQLite writer pool, or the PostgreSQL pool with its schema), so one database holds both.
    ///
    /// # Errors
    /// [`ServiceError::InvalidToken`] for an empty or non-ASCII token;
    /// [`ServiceError::InvalidPublicHost`] for a public host that is not `host[:port]`;
    /// [`ServiceError::InvalidLimit`] for a zero connection limit or timeout;
    /// [`ServiceError::Idempotency`] when the idempotency table cannot be created;
    /// [`ServiceError::IdempotencyConfig`] for a recovery window below
    /// [`MIN_IDEMPOTENCY_RECOVERY_WINDOW`].
    pub async fn new(store: Store, config: AppConfig) -> Result<Self, ServiceError> {
        let mut all = Vec::new();
        if let Some(t) = config.token.as_deref() {
            all.push(Token::new(t)?);
        }
        for t in &config.tokens {
            if !is_label(&t.label) {
                return Err(ServiceError::InvalidToken {
                    reason: "its label must be 1 to 64 letters, digits, `_`, `-` or `.`",
                });
            }
            all.push(Token::labelled(&t.label, &t.secret, t.read_only)?);
        }
        let token = Tokens::new(all);
        let public_hosts = config
            .public_hosts
            .iter()
            .map(|h| parse_public_host(h))
            .collect::<Result<Vec<_>, _>>()?;
        let limits = config.connections;
        for (name, zero) in [
            ("header_timeout", limits.header_timeout.is_zero()),
            ("idle_timeout", limits.idle_timeout.is_zero()),
            ("max_connections", limits.max_connections == 0),
            ("session_ttl", config.session_ttl.is_zero()),
        ] {
            if zero {
                return Err(ServiceError::InvalidLimit { name });
            }
        }
        let clock: Arc<dyn Clock> = config.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let idem: Arc<dyn IdempotencyStore> = match &store {
            Store::Sqlite(s) => Arc::new(redrive_idempotency::SqliteIdempotencyStore::from_pool(
                s.pool().clone(),
            )),
            Store::Postgres(p) => Arc::new(
                redrive_idempotency::PostgresIdempotencyStore::from_pool(p.pool().clone()),
            ),
        };
        idem.ensure_schema()
            .await
            .map_err(ServiceError::Idempotency)?;
        // A request whose process vanished leaves its key claimed; after the recovery window
        // a repeat takes it over and runs the enqueue again, which finds the job by its key if
        // the first run made it (`RecoveryMode::Resume`; only this route has the layer).
        let window = config
            .idempotency_recovery_window
            .unwrap_or(DEFAULT_IDEMPOTENCY_RECOVERY_WINDOW);
        let layer = IdempotencyLayer::builder(idem)
            .with_required(false)
            .with_scope(Scope::Constant(Arc::from(IDEMPOTENCY_SCOPE)))
            .with_recovery(RecoveryMode::Resume)
            .with_lease(window)
            .with_heartbeat_interval(window / 3)
            .with_max_request_bytes(MAX_BODY_BYTES)
            // The same JSON with other whitespace or member order is the same request; a 400
            // (a malformed request, no job made) leaves the key free for the corrected one.
            .with_fingerprint(Fingerprint::CanonicalJson)
            .with_store_400(false)
            .with_problem_base(format!("{}idempotency/", crate::error::PROBLEM_BASE))
            .build()
            .map_err(ServiceError::IdempotencyConfig)?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                policies: config
                    .live_policies
                    .unwrap_or_else(|| redrive_runtime::LivePolicies::new(config.policies)),
                token,
                prometheus: config.prometheus,
                idempotency: layer,
                ready_checks: config.ready_checks,
                write_probe: tokio::sync::Mutex::new(None),
                front_door: FrontDoor { public_hosts },
                sessions: Sessions::new(config.session_ttl, clock.clone()),
                logins: FailureLimiter::logins(clock.clone()),
                bearers: FailureLimiter::bearers(clock.clone()),
                clock,
                cookie_secure: config.cookie_secure,
                metrics_public: config.metrics_public,
                refuse_card_data: config.refuse_card_data,
                connections: limits,
                connection_slots: Arc::new(Semaphore::new(
                    limits.max_connections.min(Semaphore::MAX_PERMITS),
                )),
            }),
        })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Connections being served now by [`serve_listener`](crate::serve_listener) (at most
    /// [`ConnLimits::max_connections`]).
    pub fn open_connections(&self) -> usize {
        self.inner
            .connections
            .max_connections
            .min(Semaphore::MAX_PERMITS)
            .saturating_sub(self.inner.connection_slots.available_permits())
    }
}
