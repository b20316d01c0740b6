//! Errors of the binary's edge.

/// A usage error found after parsing (a bad value, a missing choice): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// Shorthand for returning a usage error.
pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}
