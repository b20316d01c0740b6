//! Durations as people write them: `250ms`, `30s`, `5m`, `1h`, `1h 30m`.

use std::time::Duration;

/// A duration string that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {reason} (write it like 250ms, 30s, 5m or 1h)")]
pub struct ParseDurationError {
    /// The refused text.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ParseDurationError {
    /// What a field holding a duration must be, and what is wrong, for a "must be …" message:
    /// `a duration like 250ms, 30s, 5m or 1h; it is negative`.
    pub fn expected(&self) -> String {
        format!("a duration like 250ms, 30s, 5m or 1h; {}", self.reason)
    }
}

/// Parses a human duration (`250ms`, `30s`, `5m`, `1h`, `2h 30m`).
///
/// A bare number without a unit is refused, so that `30` is never silently
/// read as 30 seconds or 30 milliseconds.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(redrive_policy::parse_duration("250ms").unwrap(), Duration::from_millis(250));
/// assert_eq!(redrive_policy::parse_duration("5m").unwrap(), Duration::from_secs(300));
/// assert!(redrive_policy::parse_duration("30").is_err());
/// ```
///
/// # Errors
/// [`ParseDurationError`] naming the value, for empty, unit-less, negative or garbage input.
pub fn parse_duration(s: &str) -> Result<Duration, ParseDurationError> {
    let t = s.trim();
    let err = |reason: &str| ParseDurationError {
        value: s.to_owned(),
        reason: reason.to_owned(),
    };
    if t.is_empty() {
        return Err(err("it is empty"));
    }
    if t.starts_with('-') {
        return Err(err("it is negative"));
    }
    if t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(err("it has no unit"));
    }
    humantime::parse_duration(t).map_err(|e| err(&e.to_string()))
}

/// Formats a duration compactly for tables: `0ms`, `250ms`, `1.5s`, `5m`, `1h30m`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        let s = d.as_secs_f64();
        return if ms.is_multiple_of(1_000) {
            format!("{}s", ms / 1_000)
        } else {
            format!("{s:.1}s")
        };
    }
    let total_s = d.as_secs();
    let (h, m, s) = (total_s / 3600, (total_s % 3600) / 60, total_s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_documented_forms() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(
            parse_duration(" 1h 30m ").unwrap(),
            Duration::from_secs(5400)
        );
    }

    #[test]
    fn refuses_bad_forms_naming_the_value() {
        for bad in ["", "30", "-5s", "abc", "5 parsecs", "1.5"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    /// A policy file's field said "must be it is negative".
    #[test]
    fn a_field_message_reads_as_a_sentence() {
        let e = parse_duration("-5s").unwrap_err();
        let m =
            crate::PolicyError::invalid("policy.x.retry.base", "\"-5s\"", e.expected()).to_string();
        assert_eq!(
            m,
            "invalid policy.x.retry.base = \"-5s\": must be a duration like 250ms, 30s, 5m or 1h; it is negative"
        );
        assert!(!m.contains("must be it"), "{m}");
    }

    #[test]
    fn formats_compactly() {
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m");
    }
}
