//! The clock of a worker process (`redrive work`, `redrive serve`): the host's clock, synced
//! to the database's (R24: every time written to shared rows is in the database's clock).
//!
//! Two hidden environment variables exist for tests and drills only, not for production:
//! - `REDRIVE_CLOCK_OFFSET=3s` (or `-3s`, `+250ms`) moves this process's local clock, as if
//!   its host's clock were that far ahead (or behind), before the sync: a skewed fleet without
//!   `LD_PRELOAD` tricks.
//! - `REDRIVE_CLOCK_SYNC=off` turns the sync off: the process uses its (possibly skewed) local
//!   clock for shared rows, to show what the sync prevents.

use std::sync::Arc;

use redrive_store::{Clock, OffsetClock, SystemClock};

use crate::error::usage;

/// The variable that moves the local clock (tests and drills).
pub(crate) const OFFSET_ENV: &str = "REDRIVE_CLOCK_OFFSET";
/// The variable that turns the sync to the database's clock off (tests and drills).
pub(crate) const SYNC_ENV: &str = "REDRIVE_CLOCK_SYNC";

/// The process's clock settings, read from the environment.
pub(crate) struct ClockSetup {
    /// The local clock: the system's, moved by `REDRIVE_CLOCK_OFFSET` if set.
    pub(crate) local: Arc<dyn Clock>,
    /// Whether to sync it to the database's (`REDRIVE_CLOCK_SYNC`, default on).
    pub(crate) sync: bool,
}

impl ClockSetup {
    /// Reads `REDRIVE_CLOCK_OFFSET` and `REDRIVE_CLOCK_SYNC`; a bad value is a usage error
    /// naming the variable and the value.
    pub(crate) fn from_env() -> anyhow::Result<Self> {
        let offset = match std::env::var(OFFSET_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                Some(parse_offset(&v).map_err(|e| usage(format!("{OFFSET_ENV}: {e}")))?)
            }
            _ => None,
        };
        let sync = match std::env::var(SYNC_ENV) {
            Err(_) => true,
            Ok(v) => parse_switch(&v).map_err(|e| usage(format!("{SYNC_ENV}: {e}")))?,
        };
        let system: Arc<dyn Clock> = Arc::new(SystemClock);
        let local = match offset {
            Some(by) if !by.is_zero() => {
                tracing::warn!(
                    "{OFFSET_ENV}={}: this process's clock is moved on purpose (tests and drills only)",
                    std::env::var(OFFSET_ENV).unwrap_or_default()
                );
                Arc::new(OffsetClock::new(system, by))
            }
            _ => system,
        };
        if !sync {
            tracing::warn!(
                "{SYNC_ENV}=off: times written to shared rows come from this host's clock (tests and drills only)"
            );
        }
        Ok(Self { local, sync })
    }
}

/// A signed duration: `3s`, `+3s`, `-250ms` (the units of `parse_duration`).
fn parse_offset(s: &str) -> Result<chrono::Duration, String> {
    let t = s.trim();
    let (sign, rest) = match t.strip_prefix('-') {
        Some(r) => (-1, r),
        None => (1, t.strip_prefix('+').unwrap_or(t)),
    };
    let d = redrive_policy::parse_duration(rest).map_err(|e| format!("{s:?}: {e}"))?;
    let d = chrono::Duration::from_std(d).map_err(|_| format!("{s:?} is too long"))?;
    Ok(d * sign)
}

/// `on`/`off` (also `true`/`false`, `1`/`0`).
fn parse_switch(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_signed_durations() {
        assert_eq!(parse_offset("3s"), Ok(chrono::Duration::seconds(3)));
        assert_eq!(parse_offset("+3s"), Ok(chrono::Duration::seconds(3)));
        assert_eq!(
            parse_offset(" -250ms "),
            Ok(chrono::Duration::milliseconds(-250))
        );
        let e = parse_offset("soon").unwrap_err();
        assert!(e.contains("\"soon\""), "{e}");
        assert!(parse_offset("--3s").is_err());
    }

    #[test]
    fn the_sync_switch_reads_on_and_off() {
        assert_eq!(parse_switch("off"), Ok(false));
        assert_eq!(parse_switch("ON"), Ok(true));
        assert!(parse_switch("maybe").unwrap_err().contains("maybe"));
    }
}
