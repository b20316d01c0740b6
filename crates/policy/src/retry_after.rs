//! `Retry-After` (RFC 9110 §10.2.3): the server's wait wins over the formula (R6).
//!
//! `Retry-After = HTTP-date / delay-seconds`, where `delay-seconds = 1*DIGIT`.
//! HTTP-date is the IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), and
//! recipients must also accept the obsolete RFC 850
//! (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime (`Sun Nov  6 08:49:37 1994`)
//! forms. A date in the past means "now" (0). Anything else — negative,
//! fractional, overflowing, empty or garbage — is refused by [`parse_retry_after`];
//! [`retry_after_clamped`], what callers use, reads an overflowing number as the longest
//! wait it allows and falls back to the backoff formula for the rest; nothing here panics.

use std::time::{Duration, SystemTime};

use crate::Timestamp;

/// Why a `Retry-After` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryAfterError {
    /// The header is empty.
    #[error("retry-after is empty")]
    Empty,
    /// A negative number of seconds.
    #[error("retry-after {value:?} is negative")]
    Negative {
        /// The refused value.
        value: String,
    },
    /// A fractional number of seconds (`1.5`): the grammar allows digits only.
    #[error("retry-after {value:?} is fractional; only whole seconds are allowed")]
    Fractional {
        /// The refused value.
        value: String,
    },
    /// More seconds than fit in 64 bits.
    #[error("retry-after {value:?} overflows")]
    Overflow {
        /// The refused value (truncated to 64 characters).
        value: String,
    },
    /// Neither delay-seconds nor an HTTP-date.
    #[error("retry-after {value:?} is neither delay-seconds nor an http-date")]
    Invalid {
        /// The refused value (truncated to 64 characters).
        value: String,
    },
}

/// Parses a `Retry-After` value into the wait from `now`.
///
/// ```
/// use std::time::Duration;
/// use chrono::{TimeZone, Utc};
/// use redrive_policy::parse_retry_after;
///
/// let now = Utc.with_ymd_and_hms(1994, 11, 6, 8, 49, 0).unwrap();
/// assert_eq!(parse_retry_after("120", now), Ok(Duration::from_secs(120)));
/// assert_eq!(
///     parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
///     Ok(Duration::from_secs(37))
/// );
/// assert!(parse_retry_after("1.5", now).is_err());
/// ```
///
/// # Errors
/// [`RetryAfterError`] saying why the value was refused.
pub fn parse_retry_after(value: &str, now: Timestamp) -> Result<Duration, RetryAfterError> {
    let v = value.trim_matches(|c| c == ' ' || c == '\t');
    if v.is_empty() {
        return Err(RetryAfterError::Empty);
    }
    let shown = || v.chars().take(64).collect::<String>();
    let bytes = v.as_bytes();
    if bytes.iter().all(u8::is_ascii_digit) {
        return v
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| RetryAfterError::Overflow { value: shown() });
    }
    if bytes[0] == b'-'
        && bytes.len() > 1
        && bytes[1..].iter().all(|b| b.is_ascii_digit() || *b == b'.')
    {
        return Err(RetryAfterError::Negative { value: shown() });
    }
    if bytes.iter().all(|b| b.is_ascii_digit() || *b == b'.') && bytes.contains(&b'.') {
        return Err(RetryAfterError::Fractional { value: shown() });
    }
    let at =
        httpdate::parse_http_date(v).map_err(|_| RetryAfterError::Invalid { value: shown() })?;
    let now: SystemTime = now.into();
    Ok(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses `value` and clamps it to `max`; `None` when the value is refused
/// (the caller then uses its formula).
///
/// Delay-seconds too large for any integer (`99999999999999999999`) are a very long wait,
/// not garbage: they clamp to `max` like any other long wait.
///
/// ```
/// use std::time::Duration;
/// use chrono::Utc;
/// let max = Duration::from_secs(60);
/// assert_eq!(redrive_policy::retry_after_clamped("3600", Utc::now(), max), Some(max));
/// assert_eq!(redrive_policy::retry_after_clamped("99999999999999999999", Utc::now(), max), Some(max));
/// assert_eq!(redrive_policy::retry_after_clamped("soon", Utc::now(), max), None);
/// ```
pub fn retry_after_clamped(value: &str, now: Timestamp, max: Duration) -> Option<Duration> {
    match parse_retry_after(value, now) {
        Ok(d) => Some(d.min(max)),
        Err(RetryAfterError::Overflow { .. }) => Some(max),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use proptest::prelude::*;

    fn now() -> Timestamp {
        Utc.with_ymd_and_hms(1994, 11, 6, 8, 49, 0).unwrap()
    }

    #[test]
    fn delay_seconds() {
        assert_eq!(parse_retry_after("0", now()), Ok(Duration::ZERO));
        assert_eq!(parse_retry_after("45", now()), Ok(Duration::from_secs(45)));
        assert_eq!(parse_retry_after(" 7 ", now()), Ok(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("007", now()), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn the_three_date_forms() {
        let want = Ok(Duration::from_secs(37));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now()),
            want
        );
        assert_eq!(
            parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now()),
            want
        );
        assert_eq!(parse_retry_after("Sun Nov  6 08:49:37 1994", now()), want);
    }

    #[test]
    fn a_past_date_means_zero() {
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now()),
            Ok(Duration::ZERO)
        );
    }

    #[test]
    fn refused_values() {
        assert_eq!(parse_retry_after("", now()), Err(RetryAfterError::Empty));
        assert_eq!(parse_retry_after("   ", now()), Err(RetryAfterError::Empty));
        assert!(matches!(
            parse_retry_after("-5", now()),
            Err(RetryAfterError::Negative { .. })
        ));
        assert!(matches!(
            parse_retry_after("-1.5", now()),
            Err(RetryAfterError::Negative { .. })
        ));
        assert!(matches!(
            parse_retry_after("1.5", now()),
            Err(RetryAfterError::Fractional { .. })
        ));
        assert!(matches!(
            parse_retry_after("99999999999999999999999", now()),
            Err(RetryAfterError::Overflow { .. })
        ));
        // …which the clamped reading takes as the longest wait, not as garbage (R6).
        let max = Duration::from_secs(600);
        assert_eq!(
            retry_after_clamped("99999999999999999999", now(), max),
            Some(max)
        );
        assert_eq!(retry_after_clamped("1.5", now(), max), None);
        for garbage in [
            "soon",
            "5s",
            "+5",
            "1e3",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "0x10",
            "١٢",
        ] {
            assert!(
                matches!(
                    parse_retry_after(garbage, now()),
                    Err(RetryAfterError::Invalid { .. })
                ),
                "{garbage}"
            );
        }
    }

    #[test]
    fn clamped_to_the_maximum() {
        let max = Duration::from_secs(300);
        assert_eq!(retry_after_clamped("100000", now(), max), Some(max));
        assert_eq!(
            retry_after_clamped("20", now(), max),
            Some(Duration::from_secs(20))
        );
        assert_eq!(retry_after_clamped("-20", now(), max), None);
        assert_eq!(
            retry_after_clamped("Fri, 31 Dec 9999 23:59:59 GMT", now(), max),
            Some(max)
        );
    }

    proptest! {
        #[test]
        fn never_panics_never_above_clamp(s in "\\PC{0,40}", max_s in 0u64..100_000) {
            let max = Duration::from_secs(max_s);
            if let Some(d) = retry_after_clamped(&s, now(), max) {
                prop_assert!(d <= max);
            }
        }

        #[test]
        fn any_u64_of_seconds_round_trips(n in any::<u64>()) {
            prop_assert_eq!(parse_retry_after(&n.to_string(), now()), Ok(Duration::from_secs(n)));
        }
    }
}
