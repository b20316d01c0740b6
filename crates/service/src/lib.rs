//! redrive serve: the HTTP API, dashboard and metrics
