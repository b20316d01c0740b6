//! The request fingerprint: what makes "the same request" under one key.
//!
//! `SHA-256(method ‖ 0 ‖ path ‖ 0 ‖ sorted query ‖ 0 ‖ content-type ‖ 0 ‖ body)`. Volatile
//! headers (request ids, dates, signatures, `User-Agent`) are never part of it, so a client's
//! honest retry matches; a different method or path under the same key is a mismatch, as is a
//! different body. [`Fingerprint::CanonicalJson`] sorts JSON object keys first, for clients
//! that re-serialise their payload between attempts.

use std::fmt;
use std::sync::Arc;

use axum::http::header;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};

/// A custom fingerprint function: the request head and the buffered body to 32 bytes.
pub type FingerprintFn = dyn Fn(&Parts, &[u8]) -> [u8; 32] + Send + Sync;

/// How the request fingerprint is computed.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Fingerprint {
    /// Method, path, sorted query, content type and the raw body bytes (the default).
    #[default]
    Raw,
    /// As `Raw`, but a body that parses as JSON is re-serialised with sorted object keys and
    /// no insignificant whitespace first; other bodies are taken raw.
    CanonicalJson,
    /// Your own function.
    Custom(Arc<FingerprintFn>),
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Raw => f.write_str("Raw"),
            Self::CanonicalJson => f.write_str("CanonicalJson"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl Fingerprint {
    /// The fingerprint of a request.
    #[must_use]
    pub fn compute(&self, parts: &Parts, body: &[u8]) -> [u8; 32] {
        match self {
            Self::Raw => digest(parts, body),
            Self::CanonicalJson => match serde_json::from_slice::<serde_json::Value>(body) {
                Ok(value) => {
                    let mut canonical = Vec::with_capacity(body.len());
                    write_canonical(&value, &mut canonical);
                    digest(parts, &canonical)
                }
                Err(_) => digest(parts, body),
            },
            Self::Custom(f) => f(parts, body),
        }
    }
}

fn digest(parts: &Parts, body: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(parts.method.as_str().as_bytes());
    hasher.update([0]);
    hasher.update(parts.uri.path().as_bytes());
    hasher.update([0]);
    if let Some(query) = parts.uri.query() {
        let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
        pairs.sort_unstable();
        hasher.update(pairs.join("&").as_bytes());
    }
    hasher.update([0]);
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        hasher.update(ct.as_bytes());
    }
    hasher.update([0]);
    hasher.update(body);
    let mut out = [0u8; 32];
    out.copy_from_slice(hasher.finalize().as_slice());
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String(k.clone()).to_string().as_bytes());
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn parts(method: &str, uri: &str) -> Parts {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn method_path_query_and_body_all_count() {
        let fp = Fingerprint::Raw;
        let base = fp.compute(&parts("POST", "/a?x=1&y=2"), b"{}");
        assert_eq!(base, fp.compute(&parts("POST", "/a?y=2&x=1"), b"{}"));
        assert_ne!(base, fp.compute(&parts("PATCH", "/a?x=1&y=2"), b"{}"));
        assert_ne!(base, fp.compute(&parts("POST", "/b?x=1&y=2"), b"{}"));
        assert_ne!(base, fp.compute(&parts("POST", "/a?x=1&y=3"), b"{}"));
        assert_ne!(base, fp.compute(&parts("POST", "/a?x=1&y=2"), b"{ }"));
    }

    #[test]
    fn canonical_json_ignores_key_order_and_whitespace() {
        let p = parts("POST", "/a");
        let a = br#"{"b":1,"a":{"d":[1,2],"c":"x"}}"#;
        let b = br#"{ "a": {"c":"x", "d":[1, 2]}, "b": 1 }"#;
        assert_eq!(
            Fingerprint::CanonicalJson.compute(&p, a),
            Fingerprint::CanonicalJson.compute(&p, b)
        );
        assert_ne!(
            Fingerprint::Raw.compute(&p, a),
            Fingerprint::Raw.compute(&p, b)
        );
        assert_ne!(
            Fingerprint::CanonicalJson.compute(&p, br#"[1,2]"#),
            Fingerprint::CanonicalJson.compute(&p, br#"[2,1]"#)
        );
    }
}
