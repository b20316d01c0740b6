//! The simulator's errors: each names the field or value it refuses.

use std::path::PathBuf;

/// Why a simulation could not be set up or its output written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A strategy name that does not parse.
    #[error("invalid strategy {value:?}: {reason}")]
    InvalidStrategy {
        /// The refused text.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A model parameter out of its range.
    #[error("invalid {field} {value}: {reason}")]
    InvalidConfig {
        /// The parameter (`clients`, `capacity`, `runs`…).
        field: &'static str,
        /// The refused value.
        value: String,
        /// The allowed range.
        reason: String,
    },
    /// A chart could not be drawn or written.
    #[error("cannot plot to {}: {reason}", path.display())]
    Plot {
        /// The chart's file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl SimError {
    pub(crate) fn config(
        field: &'static str,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> Self {
        SimError::InvalidConfig {
            field,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
