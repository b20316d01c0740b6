//! Outbound HTTP jobs (the built-in `http` job kind) for redrive, with what the CLI and the
//! service share: enqueue validation and assembly ([`validate`]), redaction of what is shown
//! ([`redact`]) and the egress policy of outbound calls ([`egress`]).
//!
//! The server-side idempotency layer is the crate `redrive-idempotency`.

pub mod alerts;
pub mod declines;
pub mod egress;
pub mod job;
pub mod redact;
pub mod validate;

pub use declines::DeclineMap;
pub use egress::{EgressPolicy, RedirectMode};
pub use job::{HttpJob, HttpPayload, redact_payload};
pub use validate::{EnqueueError, JobRequest, RunAt, check_same_request, validate_new_job};
