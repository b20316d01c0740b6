//! The W3C trace context header (`traceparent`) stored with a job.

use std::fmt;

/// A parsed W3C `traceparent` (version `00`): `00-<trace id>-<parent id>-<flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id (16 bytes, not all zero).
    pub trace_id: [u8; 16],
    /// The parent span's id (8 bytes, not all zero).
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

/// Why a `traceparent` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("traceparent {value:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>): {reason}")]
pub struct TraceParentError {
    /// The value given (cut to 80 characters).
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl TraceParent {
    /// Parses `00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>`; all-zero ids are invalid
    /// (W3C Trace Context, level 1). A receiver should ignore an invalid header, not fail.
    pub fn parse(s: &str) -> Result<Self, TraceParentError> {
        let err = |reason| TraceParentError {
            value: s.chars().take(80).collect(),
            reason,
        };
        let parts: Vec<&str> = s.trim().split('-').collect();
        let [version, trace, span, flags] = parts[..] else {
            return Err(err("it needs four fields separated by '-'"));
        };
        if version != "00" {
            return Err(err("only version 00 is known"));
        }
        let mut trace_id = [0u8; 16];
        hex(trace, &mut trace_id)
            .ok_or_else(|| err("the trace id is not 32 lowercase hex digits"))?;
        let mut span_id = [0u8; 8];
        hex(span, &mut span_id)
            .ok_or_else(|| err("the parent id is not 16 lowercase hex digits"))?;
        let mut f = [0u8; 1];
        hex(flags, &mut f).ok_or_else(|| err("the flags are not 2 lowercase hex digits"))?;
        if trace_id == [0; 16] {
            return Err(err("the trace id is all zeros"));
        }
        if span_id == [0; 8] {
            return Err(err("the parent id is all zeros"));
        }
        Ok(Self {
            trace_id,
            span_id,
            flags: f[0],
        })
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-", self.trace_id_hex())?;
        for b in self.span_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

fn hex(s: &str, out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2
        || !s
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_w3c_example() {
        let s = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let tp = TraceParent::parse(s).unwrap();
        assert_eq!(tp.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(tp.flags, 1);
        assert_eq!(tp.to_string(), s);
    }

    #[test]
    fn refuses_what_the_spec_refuses() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1g",
        ] {
            let e = TraceParent::parse(bad).unwrap_err();
            assert!(e.to_string().contains("traceparent"), "{bad}: {e}");
        }
    }
}
