//! Parsing and validating the `Idempotency-Key` header.
//!
//! Both forms are accepted: the IETF draft's structured-field string (`"abc"`, the quotes are
//! stripped, escapes are refused) and a bare token (`abc`, Stripe style); both name the same
//! key. A key is 1 to [`MAX_KEY_BYTES`] bytes of visible ASCII (`0x21..=0x7E`).

use std::fmt;

use axum::http::{HeaderMap, HeaderName};

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The marker header on every replayed response (`true`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The longest key accepted, in bytes (Stripe's limit).
pub const MAX_KEY_BYTES: usize = 255;

/// A validated idempotency key (without sf-string quotes).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Validates `raw` (a header value, quoted or bare).
    ///
    /// # Errors
    /// [`KeyError`] naming what is wrong.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let inner = match raw.first() {
            Some(b'"') => {
                if raw.len() < 2 || raw[raw.len() - 1] != b'"' {
                    return Err(KeyError::UnterminatedQuote);
                }
                &raw[1..raw.len() - 1]
            }
            _ => raw,
        };
        if inner.is_empty() {
            return Err(KeyError::Empty);
        }
        if inner.len() > MAX_KEY_BYTES {
            return Err(KeyError::TooLong {
                len: inner.len(),
                max: MAX_KEY_BYTES,
            });
        }
        for (position, &byte) in inner.iter().enumerate() {
            if byte == b'\\' {
                return Err(KeyError::Escape { position });
            }
            if byte == b'"' || !(0x21..=0x7e).contains(&byte) {
                return Err(KeyError::InvalidByte { position, byte });
            }
        }
        // Only visible ASCII is left, so this cannot fail.
        Ok(Self(String::from_utf8_lossy(inner).into_owned()))
    }

    /// The key as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    // The key belongs to the caller: keep it out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({} bytes)", self.0.len())
    }
}

/// Why an `Idempotency-Key` header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// More than one `Idempotency-Key` field.
    #[error("header `Idempotency-Key` appears {count} times; send exactly one")]
    Multiple {
        /// How many fields.
        count: usize,
    },
    /// The value is empty (or `""`).
    #[error("header `Idempotency-Key` is empty; send 1 to 255 bytes")]
    Empty,
    /// The value is longer than the limit.
    #[error("header `Idempotency-Key` is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A byte outside visible ASCII (or a `"` inside the value).
    #[error(
        "header `Idempotency-Key` contains byte 0x{byte:02x} at position {position}; only visible ASCII 0x21-0x7e is allowed"
    )]
    InvalidByte {
        /// Zero-based position in the key.
        position: usize,
        /// The byte.
        byte: u8,
    },
    /// A backslash escape inside the value.
    #[error(
        "header `Idempotency-Key` contains a backslash at position {position}; escapes are not accepted"
    )]
    Escape {
        /// Zero-based position in the key.
        position: usize,
    },
    /// A value that opens a quote and does not close it.
    #[error("header `Idempotency-Key` opens a quoted string and does not close it")]
    UnterminatedQuote,
    /// The route requires UUID keys and this one is not a UUID.
    #[error("header `Idempotency-Key` must be a UUID on this route")]
    NotUuid,
}

/// Reads the key from `headers`: `Ok(None)` when the header is absent.
///
/// # Errors
/// [`KeyError`] when the header is present but unusable.
pub fn parse_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let more = values.count();
    if more > 0 {
        return Err(KeyError::Multiple { count: more + 1 });
    }
    IdempotencyKey::parse(first.as_bytes()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_and_bare_are_the_same_key() {
        assert_eq!(
            IdempotencyKey::parse(b"\"abc\"").unwrap(),
            IdempotencyKey::parse(b"abc").unwrap()
        );
    }

    #[test]
    fn bounds_are_enforced() {
        assert_eq!(
            IdempotencyKey::parse(&[b'a'; 255]).unwrap().as_str().len(),
            255
        );
        assert_eq!(
            IdempotencyKey::parse(&[b'a'; 256]),
            Err(KeyError::TooLong { len: 256, max: 255 })
        );
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::parse(b"\""),
            Err(KeyError::UnterminatedQuote)
        );
        assert_eq!(
            IdempotencyKey::parse(b"a b"),
            Err(KeyError::InvalidByte {
                position: 1,
                byte: b' '
            })
        );
        assert_eq!(
            IdempotencyKey::parse(b"a\tb"),
            Err(KeyError::InvalidByte {
                position: 1,
                byte: b'\t'
            })
        );
        assert_eq!(
            IdempotencyKey::parse(b"\"a\\b\""),
            Err(KeyError::Escape { position: 1 })
        );
        assert_eq!(
            IdempotencyKey::parse(&[b'a', 0xc3, 0xa9]),
            Err(KeyError::InvalidByte {
                position: 1,
                byte: 0xc3
            })
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let key = IdempotencyKey::parse(b"secret-key").unwrap();
        assert!(!format!("{key:?}").contains("secret"));
    }
}
