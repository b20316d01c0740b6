//! Outbound HTTP jobs (the built-in `http` job kind) and the server-side idempotency layer
//! for redrive.

pub mod idempotency;
pub mod job;

pub use job::{HttpJob, HttpPayload, redact_payload};
