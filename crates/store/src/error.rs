//! The store's errors.

use crate::model::{JobId, JobState};

/// What can go wrong in the store.
///
/// Each variant's message states its cause once: a report that walks
/// [`source`](std::error::Error::source) prints every cause a single time. The driver's
/// errors ([`StoreError::Database`], [`StoreError::Migrate`]) are shown in the message and are
/// not returned again as a source, because `sqlx`'s own messages already embed their causes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL is not one redrive understands.
    #[error("database URL {url:?} is not supported: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A field of a request is out of range or malformed.
    #[error("invalid {field}: {value:?}: {reason}")]
    Invalid {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The job does not exist.
    #[error("job {id} not found")]
    JobNotFound {
        /// The job asked for.
        id: JobId,
    },
    /// The job is not in a state that allows the operation.
    #[error("job {id} is {state}; cannot {operation}")]
    WrongState {
        /// The job.
        id: JobId,
        /// Its current state.
        state: JobState,
        /// What was asked.
        operation: &'static str,
    },
    /// The caller's lease on the job is gone (expired and rescued, cancelled, or claimed again):
    /// its fencing token no longer matches, and nothing was written.
    #[error("lease on job {id} with fencing token {token} is no longer held")]
    LeaseLost {
        /// The job.
        id: JobId,
        /// The stale fencing token.
        token: i64,
    },
    /// A stored row could not be read back (a corrupt or foreign row).
    #[error("stored {what} is unreadable: {detail}")]
    Corrupt {
        /// Which value.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The SQLite file is no longer the one the store opened (deleted, or replaced by another
    /// file): writes go to a file that the next start will not see, so nothing written now is
    /// durable. Restart redrive (after restoring the file, if it was removed by mistake).
    #[error(
        "the database file {path} is no longer the one opened ({reason}): writes are not durable; restart redrive"
    )]
    FileChanged {
        /// The file's path.
        path: String,
        /// What happened to it.
        reason: String,
    },
    /// Other writers changed a row every time it was read and written back
    /// (compare-and-set); the operation changed nothing. Try again.
    #[error("{what} was changed by other writers at every try; nothing changed, try again")]
    Contended {
        /// What was contended (e.g. `dependency "psp"`).
        what: String,
    },
    /// None of a PostgreSQL URL's hosts is a server redrive can use (none answered, or none
    /// has the `target_session_attrs` asked for).
    #[error("no PostgreSQL server of the URL's hosts is usable ({target}): {tried}")]
    NoServer {
        /// The attributes asked for (`target_session_attrs`).
        target: String,
        /// Each host and what it was.
        tried: String,
    },
    /// The database failed (the driver's error, with its own causes, is in the message; a
    /// server error is shown by its message and SQLSTATE, without the server's source line).
    #[error("database: {}", database_text(.0))]
    Database(sqlx::Error),
    /// Migrations failed (the migrator's error, with its own causes, is in the message).
    #[error("migration: {}", migrate_text(.0))]
    Migrate(sqlx::migrate::MigrateError),
}

/// The text of a driver error. A PostgreSQL server error's `Display` ends with the line of
/// the server's C source that raised it (`… at line 948`), which means nothing to a user: the
/// message and its SQLSTATE code are shown instead.
pub(crate) fn database_text(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => match d.code() {
            Some(code) => format!(
                "error returned from database: {} (SQLSTATE {code})",
                d.message()
            ),
            None => format!("error returned from database: {}", d.message()),
        },
        other => other.to_string(),
    }
}

fn migrate_text(e: &sqlx::migrate::MigrateError) -> String {
    use sqlx::migrate::MigrateError as M;
    match e {
        M::Execute(inner) => format!("while executing migrations: {}", database_text(inner)),
        M::ExecuteMigration(inner, v) => {
            format!("while executing migration {v}: {}", database_text(inner))
        }
        other => other.to_string(),
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Database(e)
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError::Migrate(e)
    }
}

impl StoreError {
    /// Whether this is a lost lease (the worker must stop and write nothing).
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, StoreError::LeaseLost { .. })
    }
}

/// The store's result type.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// The text a report gets by walking the source chain (as `anyhow`'s `{:#}` does).
    fn chain(e: &StoreError) -> Vec<String> {
        let mut out = vec![e.to_string()];
        let mut cur = e.source();
        while let Some(c) = cur {
            out.push(c.to_string());
            cur = c.source();
        }
        out
    }

    #[test]
    fn a_database_cause_is_printed_once() {
        let io = std::io::Error::other("connection reset by peer");
        let e = StoreError::from(sqlx::Error::Io(io));
        let parts = chain(&e);
        let text = parts.join(": ");
        assert_eq!(
            text.matches("connection reset by peer").count(),
            1,
            "{text}"
        );
        assert!(text.starts_with("database: "), "{text}");
    }

    #[test]
    fn job_not_found_keeps_its_text() {
        let e = StoreError::JobNotFound { id: 42 };
        assert_eq!(e.to_string(), "job 42 not found");
        assert_eq!(chain(&e).len(), 1);
    }
}
