//! Outbound HTTP jobs (the built-in `http` job kind) and the server-side idempotency layer
//! for redrive, with what both sides of the service share: enqueue validation
//! ([`validate`]), redaction of what is shown ([`redact`]) and the egress policy of outbound
//! calls ([`egress`]).

pub mod alerts;
pub mod declines;
pub mod egress;
pub mod idempotency;
pub mod job;
pub mod redact;
pub mod validate;

pub use declines::DeclineMap;
pub use egress::{EgressPolicy, RedirectMode};
pub use job::{HttpJob, HttpPayload, redact_payload};
pub use validate::{EnqueueError, check_same_request, validate_new_job};
