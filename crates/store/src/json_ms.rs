//! Durations in JSON as whole milliseconds: the model's `Duration` fields keep the keys and
//! values they had as integer `*_ms` fields (`#[serde(rename = "ttl_ms", serialize_with =
//! "json_ms::option")]`). A duration beyond `u64::MAX` milliseconds is written as `u64::MAX`.

use std::time::Duration;

use serde::Serializer;

/// Whole milliseconds of `d`.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A `Duration` as its whole milliseconds.
pub(crate) fn duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(millis(*d))
}

/// An `Option<Duration>` as its whole milliseconds, or `null`.
pub(crate) fn option<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&millis(*d)),
        None => s.serialize_none(),
    }
}
