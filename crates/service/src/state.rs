//! The application state shared by every handler, and the settings it is built from.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use redrive_http::idempotency::{self, IdempotencyLayer, IdempotencyStore};
use redrive_policy::PolicySet;
use redrive_store::Store;

use crate::auth::Token;
use crate::error::ServiceError;

/// The largest request body accepted (1 MiB); larger ones get 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The default listen address of `redrive serve`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";

/// What the application needs besides the store.
///
/// # Default
/// No token, the built-in policy presets, no Prometheus handle (`/metrics` answers 404).
#[derive(Clone, Default)]
pub struct AppConfig {
    /// The bearer token every `/v1` call (and the dashboard) must carry; `None`: open.
    pub token: Option<String>,
    /// The retry policies jobs may name.
    pub policies: PolicySet,
    /// The installed Prometheus recorder's handle, rendered at `/metrics`.
    pub prometheus: Option<PrometheusHandle>,
}

impl fmt::Debug for AppConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppConfig")
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("policies", &self.policies.names().collect::<Vec<_>>())
            .field("prometheus", &self.prometheus.is_some())
            .finish()
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
    pub(crate) policies: PolicySet,
    pub(crate) token: Option<Token>,
    pub(crate) prometheus: Option<PrometheusHandle>,
    pub(crate) idempotency: IdempotencyLayer,
    /// Queues seen by `/metrics`, so a queue that empties reports zeros, not stale counts.
    pub(crate) seen_queues: std::sync::Mutex<std::collections::BTreeSet<String>>,
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
    /// Builds the state: prepares the idempotency table in the store's own database (the
    /// SQLite writer pool, or the PostgreSQL pool with its schema), so one database holds both.
    ///
    /// # Errors
    /// [`ServiceError::InvalidToken`] for an empty or non-ASCII token;
    /// [`ServiceError::Idempotency`] when the idempotency table cannot be created.
    pub async fn new(store: Store, config: AppConfig) -> Result<Self, ServiceError> {
        let token = config.token.as_deref().map(Token::new).transpose()?;
        let idem: Arc<dyn IdempotencyStore> = match &store {
            Store::Sqlite(s) => Arc::new(idempotency::SqliteStore::from_pool(s.pool().clone())),
            Store::Postgres(p) => Arc::new(idempotency::PostgresStore::from_pool(p.pool().clone())),
        };
        idem.ensure_schema()
            .await
            .map_err(ServiceError::Idempotency)?;
        let layer = IdempotencyLayer::builder(idem)
            .with_required(false)
            .with_max_request_bytes(MAX_BODY_BYTES)
            .with_problem_base(format!("{}idempotency/", crate::error::PROBLEM_BASE))
            .build()
            .map_err(ServiceError::IdempotencyConfig)?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                policies: config.policies,
                token,
                prometheus: config.prometheus,
                idempotency: layer,
                seen_queues: Default::default(),
            }),
        })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }
}
