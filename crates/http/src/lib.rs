//! Outbound HTTP jobs and the server-side idempotency layer for redrive
