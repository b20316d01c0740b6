//! The rows of the SQL stores and how they become the store's types (shared by both
//! dialects).

use std::time::{Duration, SystemTime};

use super::{
    ClaimOutcome, ClaimRequest, ListFilter, ListedRecord, RecordId, RecordInfo, RecordState,
    StoredResponse,
};
use crate::error::IdempotencyStoreError;

/// A time stored as unix milliseconds.
pub(crate) fn from_unix_ms(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// One row of a listing.
pub(crate) type ListRow = (
    i64,         // id
    String,      // scope
    String,      // key
    String,      // state
    String,      // method
    String,      // path
    String,      // recovery_point
    i32,         // attempts
    bool,        // live lease
    bool,        // token set
    Option<i32>, // response_status
    i64,         // created_at, unix ms
    i64,         // last_run_at, unix ms
);

pub(crate) fn listed_from_row(row: ListRow) -> Result<ListedRecord, IdempotencyStoreError> {
    let (id, scope, key, state, method, path, rp, attempts, locked, held, status, created, run) =
        row;
    Ok(ListedRecord {
        scope,
        key,
        info: info_from_row((id, state, method, path, rp, attempts, locked, held, status))?,
        created_at: from_unix_ms(created),
        last_run_at: from_unix_ms(run),
    })
}

/// The `WHERE` condition of a filter, given the SQL of "the lease is live".
pub(crate) fn filter_sql(filter: ListFilter, live: &str) -> String {
    match filter {
        ListFilter::All => "TRUE".to_owned(),
        ListFilter::InProgress => "state = 'in_progress'".to_owned(),
        ListFilter::Completed => "state = 'completed'".to_owned(),
        ListFilter::Stuck => {
            format!("state = 'in_progress' AND lock_token IS NOT NULL AND NOT ({live})")
        }
    }
}

/// Milliseconds of a duration, saturating, for SQL parameters.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Headers as JSON text: `[[name, hex-value], ...]`.
pub(crate) fn headers_to_json(headers: &[(String, Vec<u8>)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(n, v)| serde_json::json!([n, hex_encode(v)]))
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// The inverse of [`headers_to_json`].
pub(crate) fn headers_from_json(
    id: i64,
    text: &str,
) -> Result<Vec<(String, Vec<u8>)>, IdempotencyStoreError> {
    let corrupt = |reason: String| IdempotencyStoreError::Corrupt {
        id,
        field: "response_headers",
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    let list = value
        .as_array()
        .ok_or_else(|| corrupt("not a JSON array".into()))?;
    list.iter()
        .map(|pair| {
            let name = pair.get(0).and_then(|n| n.as_str());
            let hex = pair.get(1).and_then(|v| v.as_str());
            match (name, hex) {
                (Some(name), Some(hex)) => Ok((
                    name.to_owned(),
                    hex_decode(hex).ok_or_else(|| corrupt(format!("bad hex for header {name}")))?,
                )),
                _ => Err(corrupt("entry is not [name, value]".into())),
            }
        })
        .collect()
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One decoded row of the "classify the existing record" select.
pub(crate) type ExistingRow = (
    i64,             // id
    Vec<u8>,         // fingerprint
    String,          // state
    String,          // recovery_point
    Option<String>,  // lock_token
    bool,            // live lease
    Option<i32>,     // response_status
    Option<String>,  // response_headers
    Option<Vec<u8>>, // response_body
    bool,            // replay_unavailable
);

/// What to do with an existing record, from its row.
pub(crate) enum Existing {
    Outcome(ClaimOutcome),
    TakeOver(i64),
}

pub(crate) fn classify(
    row: ExistingRow,
    request: &ClaimRequest,
) -> Result<Existing, IdempotencyStoreError> {
    let (id, fingerprint, state, _rp, token, live, status, headers, body, unavailable) = row;
    if fingerprint.as_slice() != request.fingerprint.as_slice() {
        return Ok(Existing::Outcome(ClaimOutcome::Mismatch));
    }
    match state.as_str() {
        "completed" => {
            let status = status.and_then(|s| u16::try_from(s).ok()).ok_or_else(|| {
                IdempotencyStoreError::Corrupt {
                    id,
                    field: "response_status",
                    reason: format!("{status:?} is not a status code"),
                }
            })?;
            let headers = match headers {
                Some(text) => headers_from_json(id, &text)?,
                None => Vec::new(),
            };
            Ok(Existing::Outcome(ClaimOutcome::Completed(StoredResponse {
                status,
                headers,
                body: body.unwrap_or_default(),
                replay_unavailable: unavailable,
            })))
        }
        "in_progress" if live => Ok(Existing::Outcome(ClaimOutcome::InProgress)),
        "in_progress" if token.is_some() && !request.take_over_abandoned => {
            Ok(Existing::Outcome(ClaimOutcome::Abandoned))
        }
        "in_progress" => Ok(Existing::TakeOver(id)),
        other => Err(IdempotencyStoreError::Corrupt {
            id,
            field: "state",
            reason: format!("unknown state {other:?}"),
        }),
    }
}

pub(crate) fn parse_state(id: i64, state: &str) -> Result<RecordState, IdempotencyStoreError> {
    match state {
        "in_progress" => Ok(RecordState::InProgress),
        "completed" => Ok(RecordState::Completed),
        other => Err(IdempotencyStoreError::Corrupt {
            id,
            field: "state",
            reason: format!("unknown state {other:?}"),
        }),
    }
}

/// One row of the operator's `get`.
pub(crate) type InfoRow = (
    i64,
    String,
    String,
    String,
    String,
    i32,
    bool,
    bool,
    Option<i32>,
);

pub(crate) fn info_from_row(row: InfoRow) -> Result<RecordInfo, IdempotencyStoreError> {
    let (id, state, method, path, recovery_point, attempts, locked, held, status) = row;
    Ok(RecordInfo {
        id: RecordId(id),
        state: parse_state(id, &state)?,
        method,
        path,
        recovery_point,
        attempts: attempts_u32(attempts),
        locked,
        held,
        response_status: status.and_then(|s| u16::try_from(s).ok()),
    })
}

pub(crate) fn attempts_u32(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_json() {
        let headers = vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            ("x-bin".to_owned(), vec![0xff, 0x00]),
        ];
        assert_eq!(
            headers_from_json(1, &headers_to_json(&headers)).unwrap(),
            headers
        );
        assert!(headers_from_json(1, "[[\"a\", \"zz\"]]").is_err());
    }
}
