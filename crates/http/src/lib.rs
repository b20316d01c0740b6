//! Outbound HTTP jobs and the server-side idempotency layer for redrive

pub mod idempotency;
