//! The policy crate's errors.

/// A policy, backoff, jitter, breaker or budget that cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A field has a value outside its allowed range.
    #[error("invalid {field} = {value}: must be {allowed}")]
    InvalidField {
        /// The field, as a dotted path when it comes from a file (`policy.payment.retry.base`).
        field: String,
        /// The refused value, as written.
        value: String,
        /// The allowed range or forms.
        allowed: String,
    },
    /// A policy file could not be read as TOML, or has unknown fields.
    #[error("invalid policy file: {message}")]
    Toml {
        /// The TOML parser's message (it names the line, column and field).
        message: String,
    },
    /// No policy of that name.
    #[error("unknown policy {name:?}; known: {known}")]
    UnknownPolicy {
        /// The name asked for.
        name: String,
        /// The names that exist, comma separated.
        known: String,
    },
}

impl PolicyError {
    /// Shorthand for [`PolicyError::InvalidField`].
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<String>,
        allowed: impl Into<String>,
    ) -> Self {
        PolicyError::InvalidField {
            field: field.into(),
            value: value.into(),
            allowed: allowed.into(),
        }
    }

    /// The same error with its field prefixed (`retry.` + `base`).
    pub fn within(self, prefix: &str) -> Self {
        match self {
            PolicyError::InvalidField {
                field,
                value,
                allowed,
            } => PolicyError::InvalidField {
                field: format!("{prefix}.{field}"),
                value,
                allowed,
            },
            other => other,
        }
    }
}
