//! Helpers shared by redrive's test suites (a dev-dependency of the crates, never a
//! dependency of the product): when a PostgreSQL test may skip, a fresh schema per test
//! ([`PgSchema`]), a disk that stops taking writes ([`DiskFault`]) and the runner of the
//! `redrive` binary ([`mod@cli`]).
//!
//! Why one place: a test that skips when PostgreSQL "is not there" passes silently whenever
//! it cannot connect for any reason (a bad password, a missing database, a failing
//! migration). So the rule lives here, once:
//!
//! - a PostgreSQL test skips **only** when the server is unreachable: the connection was
//!   refused or timed out ([`is_unreachable`]);
//! - any other failure to connect fails the test;
//! - with `CI` set to `true` or `1` ([`ci`]) an unreachable server fails the test too.
//!
//! ```no_run
//! # async fn harness() -> Option<()> {
//! let url = redrive_testkit::postgres_url();
//! if !redrive_testkit::postgres_available(&url).await {
//!     return None; // skipped: unreachable, and not on CI
//! }
//! // connect for real; any error from here on is a failure (`expect`)
//! # Some(())
//! # }
//! ```

use std::error::Error;
use std::io::ErrorKind;
use std::time::Duration;

pub mod cli;
mod schema;

pub use schema::PgSchema;

/// The PostgreSQL the tests use when `REDRIVE_TEST_POSTGRES_URL` is not set.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// How long [`postgres_available`] waits for a connection before calling the server
/// unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the tests run under CI: the environment variable `CI` is `true` or `1`. The only
/// place the test suites read `CI`.
pub fn ci() -> bool {
    ci_value(std::env::var("CI").ok().as_deref())
}

fn ci_value(v: Option<&str>) -> bool {
    matches!(v, Some("true" | "1"))
}

/// `REDRIVE_TEST_POSTGRES_URL`, or [`DEFAULT_POSTGRES_URL`].
pub fn postgres_url() -> String {
    std::env::var("REDRIVE_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned())
}

/// Whether `e` (or any error in its source chain) says the server could not be reached at
/// all: the connection was refused or timed out. Anything else (a refused login, a missing
/// database, a failing migration, an unknown host) is not "unreachable".
pub fn is_unreachable(e: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ErrorKind::ConnectionRefused | ErrorKind::TimedOut
            )
        {
            return true;
        }
        if let Some(sqlx::Error::Io(io)) = err.downcast_ref::<sqlx::Error>()
            && matches!(
                io.kind(),
                ErrorKind::ConnectionRefused | ErrorKind::TimedOut
            )
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// What a test does after failing to connect to PostgreSQL at `url` with `e`: returns (the
/// caller skips) only when the server is unreachable and CI is not set, printing why;
/// panics otherwise.
///
/// # Panics
/// When the error is not "unreachable", or when it is and [`ci`] is true.
pub fn skip_or_fail(url: &str, e: &(dyn Error + 'static)) {
    let unreachable = is_unreachable(e);
    match decide(unreachable, ci()) {
        Decision::Skip => eprintln!("skipping: PostgreSQL at {url} is unreachable: {e}"),
        Decision::FailOnCi => panic!("PostgreSQL at {url} is unreachable and CI is set: {e}"),
        Decision::Fail => panic!(
            "PostgreSQL at {url} answered but the connection failed (only an unreachable \
             server may skip a test): {e}"
        ),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Skip,
    FailOnCi,
    Fail,
}

fn decide(unreachable: bool, ci: bool) -> Decision {
    match (unreachable, ci) {
        (true, false) => Decision::Skip,
        (true, true) => Decision::FailOnCi,
        (false, _) => Decision::Fail,
    }
}

/// Connects once to PostgreSQL at `url` (at most [`CONNECT_TIMEOUT`]) to see whether the
/// tests can run there: `true` when they can, `false` when the caller should skip (the server
/// is unreachable and CI is not set).
///
/// # Panics
/// As [`skip_or_fail`]: any other connection error, or an unreachable server under CI.
pub async fn postgres_available(url: &str) -> bool {
    use sqlx::Connection;
    let r = tokio::time::timeout(CONNECT_TIMEOUT, sqlx::PgConnection::connect(url)).await;
    let e = match r {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            return true;
        }
        Ok(Err(e)) => e,
        Err(_) => sqlx::Error::Io(std::io::Error::new(
            ErrorKind::TimedOut,
            format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
        )),
    };
    skip_or_fail(url, &e);
    false
}

/// A disk that stops taking writes, for the tests of store faults: while engaged, every write
/// of this process to a regular file fails (`EFBIG`: the soft `RLIMIT_FSIZE` is lowered to one
/// byte; `SIGXFSZ`, which would kill the process, is caught), as writes fail on a full or
/// failing disk. Pipes and sockets (stderr, PostgreSQL) are not affected. Lifted on
/// [`DiskFault::lift`] or drop.
///
/// The limit is process-wide: a test that engages it must be the only test of its test binary
/// that writes files meanwhile (give it a file of its own, or serialise with a lock).
#[cfg(unix)]
#[derive(Debug)]
pub struct DiskFault {
    before: rustix::process::Rlimit,
}

#[cfg(unix)]
impl DiskFault {
    /// Engages the fault. Call inside a tokio runtime (the `SIGXFSZ` handler is tokio's).
    ///
    /// # Panics
    /// When the limit cannot be set or the signal cannot be caught.
    pub fn engage() -> Self {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        // Registering a tokio handler replaces the default action (terminate) for good.
        let sigxfsz =
            tokio::signal::unix::SignalKind::from_raw(rustix::process::Signal::XFSZ.as_raw());
        drop(tokio::signal::unix::signal(sigxfsz).expect("catch SIGXFSZ"));
        let before = getrlimit(Resource::Fsize);
        setrlimit(
            Resource::Fsize,
            Rlimit {
                current: Some(1),
                maximum: before.maximum,
            },
        )
        .expect("lower RLIMIT_FSIZE");
        Self { before }
    }

    /// Lifts the fault: writes succeed again.
    pub fn lift(self) {}
}

#[cfg(unix)]
impl Drop for DiskFault {
    fn drop(&mut self) {
        let _ = rustix::process::setrlimit(rustix::process::Resource::Fsize, self.before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_is_true_or_1_and_nothing_else() {
        assert!(ci_value(Some("true")));
        assert!(ci_value(Some("1")));
        for v in [
            None,
            Some(""),
            Some("0"),
            Some("false"),
            Some("yes"),
            Some("TRUE"),
        ] {
            assert!(!ci_value(v), "{v:?}");
        }
    }

    #[test]
    fn only_an_unreachable_server_outside_ci_skips() {
        assert_eq!(decide(true, false), Decision::Skip);
        assert_eq!(decide(true, true), Decision::FailOnCi);
        assert_eq!(decide(false, false), Decision::Fail);
        assert_eq!(decide(false, true), Decision::Fail);
    }

    /// An error that wraps another, as the stores' error enums do.
    #[derive(Debug)]
    struct Wrapper(Box<dyn Error + 'static>);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("database")
        }
    }
    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn refused_and_timed_out_are_unreachable_anywhere_in_the_chain() {
        for kind in [ErrorKind::ConnectionRefused, ErrorKind::TimedOut] {
            let io = std::io::Error::new(kind, "x");
            assert!(is_unreachable(&std::io::Error::new(kind, "x")));
            let wrapped = Wrapper(Box::new(sqlx::Error::Io(io)));
            assert!(is_unreachable(&wrapped), "{kind:?}");
        }
        for e in [
            sqlx::Error::Io(std::io::Error::new(ErrorKind::PermissionDenied, "x")),
            sqlx::Error::Configuration("bad url".into()),
            sqlx::Error::PoolTimedOut,
            sqlx::Error::Protocol("password authentication failed".into()),
        ] {
            assert!(!is_unreachable(&Wrapper(Box::new(e))));
        }
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        // Bind and drop: nothing listens there now, so the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("postgres://postgres@127.0.0.1:{port}/test");
        use sqlx::Connection;
        let e = sqlx::PgConnection::connect(&url).await.unwrap_err();
        assert!(is_unreachable(&e), "{e:?}");
    }

    /// The skip path a missing database used to take: it must fail, not skip.
    #[tokio::test]
    async fn a_missing_database_fails_rather_than_skips() {
        let url = postgres_url();
        if !postgres_available(&url).await {
            return;
        }
        let base = url.rsplit_once('/').map_or(url.as_str(), |(b, _)| b);
        let missing = format!("{base}/redrive_no_such_database_{}", std::process::id());
        let r = tokio::spawn(async move { postgres_available(&missing).await }).await;
        let panic = r.expect_err("a missing database must fail the test");
        assert!(panic.is_panic());
    }
}
