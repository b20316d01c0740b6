//! Redaction: what redrive *shows* never carries a secret; what it *stores* keeps the real
//! values (the worker needs them to make the call).
//!
//! Every surface — the CLI's text and `--json`, the API, the dashboard, logs, error messages
//! and problem details — goes through the functions of this module:
//!
//! - [`redact_value`] for a JSON document (a payload, a result): the value of every object
//!   member whose name is a secret name (see below) becomes `"[redacted]"`, at any depth, and
//!   every string is passed through [`redact_text`].
//! - [`redact_text`] for free text (an error, a log line, a URL, a database URL): URL
//!   credentials (`https://user:pw@host` → `https://user:***@host`; a user alone, as in
//!   `https://sk_live_x@host`, → `https://***@host`), secret query or `key=value` parameters
//!   (`?api_key=x` → `?api_key=***`), and `Bearer x` / `Basic x` credentials.
//! - [`redact_url`] for one URL, e.g. `postgres://u:pw@h/db` → `postgres://u:***@h/db`.
//!
//! # Secret names
//! Names are compared without case, with `_` and `-` alike. A name is secret when it matches
//! one of [`SECRET_NAME_PATTERNS`] (a `*` matches any run of characters), or a pattern added
//! with [`add_secret_names`] (the CLI's global `--redact NAME` flag, or `REDRIVE_REDACT`):
//!
//! `authorization`, `proxy-authorization`, `cookie`, `set-cookie`, `*api-key*`, `*apikey*`,
//! `*token*`, `*secret*`, `*signature*`, `*password*`, `*passwd*`, `*credential*`,
//! `*private-key*`, `*session*`, `ocp-apim-subscription-key`, `x-auth*`, `x-*-key`.
//!
//! # Card data
//! A payment fleet should store tokens, not card numbers; when a payload carries them anyway
//! they are masked on every surface too (what is stored, and sent, is unchanged):
//!
//! - members named like a card field ([`CARD_NAME_PATTERNS`]: `pan`, `card-number`,
//!   `cardnumber`, `cvc`, `cvc2`, `cvv`, `cvv2`, compared as secret names are) show
//!   `"[redacted]"`;
//! - anything that looks like a card number ([`find_pan`]: 13 to 19 digits, single spaces or
//!   dashes between them allowed, passing the Luhn check, first digit 2 to 6) in a string or a
//!   JSON number shows only its last four digits: `4111 1111 1111 1111` → `**** **** **** 1111`.
//!
//! [`find_card_data`] names the first such member, for a service that refuses them at enqueue
//! (`redrive serve --refuse-card-data`).
//!
//! Query and `key=value` parameters are secret when their name is a secret name, or one of
//! [`SECRET_PARAM_NAMES`] (`key`, `sig`, `pass`, `pwd`, `auth`, `code`, `access_token`, …).
//!
//! ```
//! use redrive_http::redact::{redact_text, redact_value};
//! use serde_json::json;
//! let p = json!({"url": "https://u:pw@psp.example/v1?api_key=k1&page=2",
//!                "headers": {"X-Api-Key": "k2", "Accept": "application/json"}});
//! let shown = redact_value(&p);
//! assert_eq!(shown["url"], "https://u:***@psp.example/v1?api_key=***&page=2");
//! assert_eq!(shown["headers"]["X-Api-Key"], "[redacted]");
//! assert_eq!(shown["headers"]["Accept"], "application/json");
//! assert_eq!(redact_text("opening postgres://app:hunter2@db/q failed"),
//!            "opening postgres://app:***@db/q failed");
//! ```

use std::sync::RwLock;

use serde_json::Value;

/// What a secret JSON value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// What a secret inside a URL or a text is replaced with.
pub const MASK: &str = "***";

/// The built-in secret-name patterns (`*` matches any run of characters; compared without
/// case, `_` and `-` alike).
pub const SECRET_NAME_PATTERNS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "*api-key*",
    "*apikey*",
    "*token*",
    "*secret*",
    "*signature*",
    "*password*",
    "*passwd*",
    "*credential*",
    "*private-key*",
    "*session*",
    "ocp-apim-subscription-key",
    "x-auth*",
    "x-*-key",
];

/// Member names of card data (same syntax and comparison as [`SECRET_NAME_PATTERNS`]): their
/// values are never shown.
pub const CARD_NAME_PATTERNS: &[&str] = &[
    "pan",
    "card-number",
    "cardnumber",
    "cvc",
    "cvc2",
    "cvv",
    "cvv2",
];

/// Query and `key=value` parameter names that are secret besides the secret names.
pub const SECRET_PARAM_NAMES: &[&str] = &[
    "key",
    "sig",
    "pass",
    "pwd",
    "auth",
    "code",
    "access-token",
    "refresh-token",
    "id-token",
    "client-secret",
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    // redrive's own `listen=` database parameter: a percent-encoded URL, credentials and all.
    "listen",
];

static EXTRA: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Adds secret-name patterns for this process (same syntax as [`SECRET_NAME_PATTERNS`]);
/// empty patterns are ignored. The CLI calls it once at start with its `--redact` values.
pub fn add_secret_names<I, S>(patterns: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut extra = EXTRA.write().unwrap_or_else(|p| p.into_inner());
    for p in patterns {
        let p = normalise(p.as_ref().trim());
        if !p.is_empty() && !extra.contains(&p) {
            extra.push(p);
        }
    }
}

fn normalise(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', "-")
}

/// Glob match with `*` only.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    if !name.ends_with(last) {
        return false;
    }
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Whether a header name or JSON member name is secret (its value is never shown).
pub fn is_secret_name(name: &str) -> bool {
    let n = normalise(name.trim());
    if SECRET_NAME_PATTERNS.iter().any(|p| glob(p, &n)) || is_card_name_normalised(&n) {
        return true;
    }
    let extra = EXTRA.read().unwrap_or_else(|p| p.into_inner());
    extra.iter().any(|p| glob(p, &n))
}

/// Whether a JSON member name is one of card data ([`CARD_NAME_PATTERNS`]).
pub fn is_card_name(name: &str) -> bool {
    is_card_name_normalised(&normalise(name.trim()))
}

fn is_card_name_normalised(n: &str) -> bool {
    CARD_NAME_PATTERNS.iter().any(|p| glob(p, n))
}

/// Where a card number is in `text`: the byte range of the first run of 13 to 19 digits (single
/// spaces or dashes between digits allowed) that passes the Luhn check and starts with 2 to 6
/// (the card networks' major industry identifiers: Mastercard 2 and 5, American Express and
/// Diners 3, Visa 4, Discover and UnionPay 6). Longer runs (order numbers) are not card
/// numbers, nor runs that start with 1, as every epoch-millisecond time until 2033 does.
///
/// ```
/// use redrive_http::redact::find_pan;
/// assert_eq!(find_pan("pay 4111-1111-1111-1111 now"), Some(4..23));
/// assert_eq!(find_pan("4111111111111112"), None); // not Luhn-valid
/// assert_eq!(find_pan("at 1764000000005"), None); // a time in milliseconds
/// ```
pub fn find_pan(text: &str) -> Option<std::ops::Range<usize>> {
    pan_runs(text)
        .into_iter()
        .find(|r| is_pan(&text[r.clone()]))
}

/// Every run of digits with single spaces or dashes between them, as byte ranges.
fn pan_runs(text: &str) -> Vec<std::ops::Range<usize>> {
    let b = text.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        let mut end = i;
        while i < b.len() {
            if b[i].is_ascii_digit() {
                i += 1;
                end = i;
            } else if matches!(b[i], b' ' | b'-') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                i += 1;
            } else {
                break;
            }
        }
        runs.push(start..end);
        i = end.max(i);
    }
    runs
}

fn is_pan(run: &str) -> bool {
    let digits: Vec<u8> = run
        .bytes()
        .filter(u8::is_ascii_digit)
        .map(|d| d - b'0')
        .collect();
    (13..=19).contains(&digits.len()) && (2..=6).contains(&digits[0]) && luhn(&digits)
}

fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d);
            if i % 2 == 1 {
                if d * 2 > 9 { d * 2 - 9 } else { d * 2 }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// `text` with every card number's digits but the last four replaced by `*` (separators kept).
pub fn mask_pans(text: &str) -> String {
    let runs: Vec<_> = pan_runs(text)
        .into_iter()
        .filter(|r| is_pan(&text[r.clone()]))
        .collect();
    if runs.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for r in runs {
        out.push_str(&text[last..r.start]);
        let run = &text[r.clone()];
        let total = run.bytes().filter(u8::is_ascii_digit).count();
        let mut seen = 0;
        for c in run.chars() {
            if c.is_ascii_digit() {
                seen += 1;
                out.push(if seen > total - 4 { c } else { '*' });
            } else {
                out.push(c);
            }
        }
        last = r.end;
    }
    out.push_str(&text[last..]);
    out
}

/// The path of the first card data in a payload (`payload.card.number`, `payload.items[2]`):
/// a member named like a card field with a value, or a string or number that is a card number
/// ([`find_pan`]). `None` when there is none.
///
/// ```
/// use redrive_http::redact::find_card_data;
/// use serde_json::json;
/// let p = json!({"amount": 5, "source": {"cardNumber": "tok_1"}});
/// assert_eq!(find_card_data(&p).as_deref(), Some("payload.source.cardNumber"));
/// assert_eq!(find_card_data(&json!({"note": "4242 4242 4242 4242"})).as_deref(),
///            Some("payload.note"));
/// assert_eq!(find_card_data(&json!({"token": "pm_1", "at": 1764000000005u64})), None);
/// ```
pub fn find_card_data(payload: &Value) -> Option<String> {
    fn walk(v: &Value, path: &mut String) -> bool {
        match v {
            Value::Object(m) => m.iter().any(|(k, v)| {
                let len = path.len();
                path.push('.');
                path.push_str(k);
                let found = (is_card_name(k) && !v.is_null()) || walk(v, path);
                if !found {
                    path.truncate(len);
                }
                found
            }),
            Value::Array(a) => a.iter().enumerate().any(|(i, v)| {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                let found = walk(v, path);
                if !found {
                    path.truncate(len);
                }
                found
            }),
            Value::String(s) => find_pan(s).is_some(),
            Value::Number(n) => find_pan(&n.to_string()).is_some(),
            _ => false,
        }
    }
    let mut path = String::from("payload");
    walk(payload, &mut path).then_some(path)
}

/// Whether a query or `key=value` parameter name is secret.
pub fn is_secret_param(name: &str) -> bool {
    let n = normalise(&percent_decode(name.trim()));
    SECRET_PARAM_NAMES.contains(&n.as_str()) || is_secret_name(&n)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// A JSON document as it may be shown: secret members' values replaced by `"[redacted]"` at
/// any depth, and every string passed through [`redact_text`].
pub fn redact_value(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let shown = if is_secret_name(k) && !v.is_null() {
                        Value::String(REDACTED.into())
                    } else {
                        redact_value(v)
                    };
                    (redact_text(k), shown)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redact_value).collect()),
        Value::String(s) => Value::String(redact_text(s)),
        Value::Number(n) => {
            let text = n.to_string();
            if find_pan(&text).is_some() {
                Value::String(mask_pans(&text))
            } else {
                v.clone()
            }
        }
        other => other.clone(),
    }
}

/// A copy of a payload as it may be shown (the same as [`redact_value`]).
pub fn redact_payload(v: &Value) -> Value {
    redact_value(v)
}

/// One URL with its credentials and secret query parameters masked
/// (`postgres://u:pw@h/db` → `postgres://u:***@h/db`). Text that is not a URL is passed
/// through [`redact_text`].
pub fn redact_url(url: &str) -> String {
    redact_text(url)
}

/// Free text with every secret masked: URL credentials, secret query and `key=value`
/// parameters, `Bearer`/`Basic` credentials, and card numbers ([`mask_pans`]).
pub fn redact_text(text: &str) -> String {
    let with_urls = redact_urls_in(text);
    let with_params = redact_params_in(&with_urls);
    mask_pans(&redact_schemes_in(&with_params))
}

/// What a dependency answered, as it may be kept with a failed attempt and shown: the body
/// redacted, then cut to `max` bytes on a character boundary. A JSON body goes through
/// [`redact_value`] and is written compactly; any other body (text, or JSON cut short by the
/// 64 KiB read limit) through [`redact_text`], with the string values of secret or card
/// members (`"token": "…"`) replaced too. Redaction comes first, so that the cut cannot leave
/// a partial card number that no longer looks like one. `None` for an empty body.
///
/// ```
/// use redrive_http::redact::response_excerpt;
/// let e = response_excerpt(br#"{"error": "card 4111111111111111: invalid amount -5"}"#, 2048);
/// assert_eq!(e.as_deref(), Some(r#"{"error":"card ************1111: invalid amount -5"}"#));
/// let e = response_excerpt(br#"{"client_secret": "pi_1_secret_2", "msg": "bad"#, 2048);
/// assert_eq!(e.as_deref(), Some(r#"{"client_secret": "[redacted]", "msg": "bad"#));
/// assert_eq!(response_excerpt("é".repeat(10).as_bytes(), 5).as_deref(), Some("éé"));
/// assert_eq!(response_excerpt(b"  ", 2048), None);
/// ```
pub fn response_excerpt(body: &[u8], max: usize) -> Option<String> {
    let shown = match serde_json::from_slice::<Value>(body) {
        Ok(v) => redact_value(&v).to_string(),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            redact_text(&redact_json_members_in(text.trim()))
        }
    };
    let cut = redrive_store::excerpt(shown.trim(), max);
    (!cut.is_empty()).then(|| cut.to_owned())
}

/// JSON-looking text (not parseable as a whole) with the string value of every secret or card
/// member (`"name": "value"`) replaced by [`REDACTED`].
fn redact_json_members_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('"') {
        // A quoted name…
        let Some(close) = rest[open + 1..].find('"').map(|i| open + 1 + i) else {
            break;
        };
        let name = &rest[open + 1..close];
        let after = &rest[close + 1..];
        let colon = after.trim_start();
        // …followed by `:` and a quoted value.
        if let Some(value) = colon.strip_prefix(':').map(str::trim_start)
            && value.starts_with('"')
            && is_secret_name(name)
        {
            let value_at = rest.len() - value.len();
            out.push_str(&rest[..value_at]);
            out.push('"');
            out.push_str(REDACTED);
            out.push('"');
            // The value's end: the next unescaped quote, or the end of the text (cut short).
            let body = &value[1..];
            let mut end = body.len();
            let mut escaped = false;
            for (i, c) in body.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => {
                        end = i + 1;
                        break;
                    }
                    _ => escaped = false,
                }
            }
            rest = &body[end..];
            continue;
        }
        out.push_str(&rest[..=close]);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Characters that end a URL inside free text.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`' | '\\')
}

fn is_scheme_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')
}

fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        // The scheme: letters etc. just before `://`.
        let scheme_start = rest[..i]
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_scheme_char(*c))
            .last()
            .map_or(i, |(j, _)| j);
        out.push_str(&rest[..scheme_start]);
        let after = &rest[i + 3..];
        let end = after.find(ends_url).unwrap_or(after.len());
        out.push_str(&rest[scheme_start..i + 3]);
        out.push_str(&redact_url_tail(&after[..end]));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The part of a URL after `scheme://`.
fn redact_url_tail(tail: &str) -> String {
    let auth_end = tail.find(['/', '?', '#']).unwrap_or(tail.len());
    let (authority, path) = tail.split_at(auth_end);
    let mut out = String::with_capacity(tail.len());
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.split_once(':') {
                Some((user, _)) if !user.is_empty() => {
                    out.push_str(user);
                    out.push(':');
                    out.push_str(MASK);
                }
                _ => out.push_str(MASK),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    out.push_str(path);
    out
}

/// Masks the value of every `name=value` whose name is a secret parameter. A name starts
/// after a character that cannot be part of it and ends at `=`; a value ends at a separator.
fn redact_params_in(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            // Walk back over the name.
            let mut s = i;
            while s > 0 && is_param_name_byte(bytes[s - 1]) {
                s -= 1;
            }
            let name = &text[s..i];
            if !name.is_empty() && is_secret_param(name) {
                let mut e = i + 1;
                // A quoted value (`password='x y'`) runs to its closing quote.
                let quote = bytes.get(e).copied().filter(|q| *q == b'\'' || *q == b'"');
                if let Some(q) = quote {
                    e += 1;
                    while e < bytes.len() && bytes[e] != q {
                        e += 1;
                    }
                    e = (e + 1).min(bytes.len());
                } else {
                    while e < bytes.len() && !is_param_value_end(bytes[e]) {
                        e += 1;
                    }
                }
                if e > i + 1 {
                    out.push_str(&text[last..=i]);
                    out.push_str(MASK);
                    last = e;
                }
                i = e.max(i + 1);
                continue;
            }
        }
        i += 1;
    }
    out.push_str(&text[last..]);
    out
}

fn is_credential_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '+' | '/' | '=' | ':')
}

fn is_param_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'%' | b'[' | b']')
}

fn is_param_value_end(b: u8) -> bool {
    b.is_ascii_whitespace() || matches!(b, b'&' | b';' | b',' | b'"' | b'\'' | b'#' | b')' | b'>')
}

/// Masks the credential after `Bearer ` / `Basic ` (any case).
fn redact_schemes_in(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut search = 0;
    loop {
        let next = ["bearer ", "basic "]
            .iter()
            .filter_map(|w| lower[search..].find(w).map(|i| (search + i, w.len())))
            .min();
        let Some((i, len)) = next else { break };
        let boundary = i == 0 || !lower.as_bytes()[i - 1].is_ascii_alphanumeric();
        let start = i + len;
        let end = text[start..]
            .find(|c: char| !is_credential_char(c))
            .map_or(text.len(), |e| start + e);
        // A credential is at least 8 characters of a token68 (RFC 9110): prose is left alone.
        if boundary && end >= start + 8 {
            out.push_str(&text[last..start]);
            out.push_str(MASK);
            last = end;
        }
        search = end.max(i + 1);
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secret_names_follow_the_documented_patterns() {
        for n in [
            "Authorization",
            "proxy-authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "x_api_key",
            "ApiKey",
            "X-Auth-Token",
            "X-Client-Secret",
            "X-Signature",
            "Stripe-Signature",
            "Ocp-Apim-Subscription-Key",
            "X-Authorization",
            "password",
            "db_passwd",
            "X-Amz-Security-Token",
            "X-Partner-Key",
            "session_id",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
        for n in [
            "Accept",
            "Content-Type",
            "Idempotency-Key",
            "User-Agent",
            "amount",
            "key",
        ] {
            assert!(!is_secret_name(n), "{n}");
        }
        for n in [
            "key",
            "api_key",
            "access_token",
            "sig",
            "Password",
            "api%5Fkey",
        ] {
            assert!(is_secret_param(n), "{n}");
        }
        assert!(!is_secret_param("page"));
    }

    #[test]
    fn extra_names_can_be_added() {
        assert!(!is_secret_name("X-Merchant-Pin"));
        add_secret_names(["x-merchant-pin", ""]);
        assert!(is_secret_name("X-Merchant-Pin"));
        assert!(is_secret_name("x_merchant_pin"));
    }

    #[test]
    fn urls_lose_credentials_and_secret_parameters() {
        let cases = [
            ("postgres://u:pw@h/db", "postgres://u:***@h/db"),
            (
                "postgresql://u:p%40ss@h:5432/db?sslmode=require&password=x",
                "postgresql://u:***@h:5432/db?sslmode=require&password=***",
            ),
            ("https://sk_live_1@api.x/v1", "https://***@api.x/v1"),
            (
                "https://psp.example/v1?api_key=abc&page=2#frag",
                "https://psp.example/v1?api_key=***&page=2#frag",
            ),
            (
                "https://psp.example/v1/charges",
                "https://psp.example/v1/charges",
            ),
            ("sqlite:redrive.db", "sqlite:redrive.db"),
            ("https://h/?token=", "https://h/?token="),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn text_loses_urls_parameters_and_bearer_tokens() {
        assert_eq!(
            redact_text("POST https://u:p@h/x?key=k1 → 500; retry"),
            "POST https://u:***@h/x?key=*** → 500; retry"
        );
        assert_eq!(
            redact_text("host=db user=app password=hunter2 dbname=q"),
            "host=db user=app password=*** dbname=q"
        );
        assert_eq!(redact_text("password='a b' x"), "password=*** x");
        assert_eq!(
            redact_text("header Authorization: Bearer abc.def.ghi, then"),
            "header Authorization: Bearer ***, then"
        );
        assert_eq!(redact_text("Basic dXNlcjpwYXNz"), "Basic ***");
        assert_eq!(redact_text("basic idea"), "basic idea");
        assert_eq!(redact_text("nothing here"), "nothing here");
        assert_eq!(redact_text("a=b c==d =e"), "a=b c==d =e");
    }

    #[test]
    fn json_is_redacted_at_any_depth() {
        let v = json!({
            "method": "POST",
            "url": "https://psp/v1?access_token=t1",
            "headers": {"Authorization": "Bearer t2", "X-Signature": "t3", "Accept": "x"},
            "body": {"card": {"token": "t4", "amount": 5}, "list": ["https://a:t5@h"],
                     "password": null}
        });
        let r = redact_value(&v);
        let s = r.to_string();
        for t in ["t1", "t2", "t3", "t4", "t5"] {
            assert!(!s.contains(t), "{t} survived in {s}");
        }
        assert_eq!(r["headers"]["Accept"], "x");
        assert_eq!(r["body"]["card"]["amount"], 5);
        assert_eq!(r["body"]["password"], Value::Null);
        assert_eq!(r["method"], "POST");
    }

    /// A payload with `card_number`, `pan` and `cvc` showed the full number and CVC.
    #[test]
    fn card_data_is_masked_by_name_and_by_value() {
        let v = json!({
            "card_number": "4111111111111111", "PAN": "5500005555555559", "cvc": "8642",
            "cardNumber": 4_012_888_888_881_881_u64, "CVV2": 123,
            "note": "card 4242-4242-4242-4242 declined", "big": 4_242_424_242_424_242_u64,
            "order": "12345678901234567890123", "at": 1_764_000_000_005_u64,
            "nothing": null
        });
        let r = redact_value(&v);
        let s = r.to_string();
        for t in [
            "4111111111111111",
            "5500005555555559",
            "8642",
            "4012888888881881",
            "123,",
            "4242-4242-4242-4242",
            "4242424242424242",
        ] {
            assert!(!s.contains(t), "{t} survived in {s}");
        }
        assert_eq!(r["card_number"], REDACTED);
        assert_eq!(r["cvc"], REDACTED);
        assert_eq!(r["CVV2"], REDACTED);
        assert_eq!(r["note"], "card ****-****-****-4242 declined");
        assert_eq!(r["big"], "************4242");
        assert_eq!(r["order"], "12345678901234567890123");
        assert_eq!(r["at"], 1_764_000_000_005_u64);
        assert_eq!(r["nothing"], Value::Null);
        assert_eq!(redact_text("pan=4111111111111111"), "pan=***");
        assert_eq!(redact_text("4111 1111 1111 1111"), "**** **** **** 1111");
    }

    #[test]
    fn card_data_is_found_with_its_path() {
        assert_eq!(
            find_card_data(&json!({"items": [{"ok": 1}, {"card": {"cvv": "1"}}]})).as_deref(),
            Some("payload.items[1].card.cvv")
        );
        assert_eq!(
            find_card_data(&json!({"list": ["x", 4111111111111111_u64]})).as_deref(),
            Some("payload.list[1]")
        );
        assert_eq!(find_card_data(&json!({"pan": null, "token": "pm_1"})), None);
        assert_eq!(find_pan("4111111111111112"), None);
        assert_eq!(find_pan("4111  1111 1111 1111"), None);
    }

    #[test]
    fn glob_matches_only_what_it_says() {
        assert!(glob("x-*-key", "x-partner-key"));
        assert!(!glob("x-*-key", "x-key"));
        assert!(glob("*token*", "token"));
        assert!(glob("x-auth*", "x-auth"));
        assert!(!glob("cookie", "cookies"));
    }
}

#[cfg(test)]
mod response_excerpt_tests {
    use super::*;

    #[test]
    fn a_body_cut_short_is_redacted_before_it_is_cut_and_stays_within_the_limit() {
        // JSON cut by the 64 KiB read: not parseable, so the text path must still hide the
        // secret member and the card number.
        let mut body = String::from(
            r#"{"error": "declined", "client_secret": "pi_3_secret_x", "note": "card 4111 1111 1111 1111", "pad": ""#,
        );
        body.push_str(&"x".repeat(5000));
        let e = response_excerpt(body.as_bytes(), 2048).unwrap();
        assert!(e.len() <= 2048, "{}", e.len());
        assert!(!e.contains("pi_3_secret_x"), "{e}");
        assert!(!e.contains("4111 1111 1111 1111"), "{e}");
        assert!(e.contains("**** **** **** 1111"), "{e}");
        assert!(e.starts_with(r#"{"error": "declined""#), "{e}");
        // A parseable body: secret members by name, at any depth.
        let e = response_excerpt(br#"{"a": {"Authorization": "Bearer x"}}"#, 2048).unwrap();
        assert_eq!(e, r#"{"a":{"Authorization":"[redacted]"}}"#);
    }

    #[test]
    fn a_card_number_across_the_cut_is_masked_not_left_partly_visible() {
        // A card number across the 2 KiB mark: cut first, its first seven digits would be
        // kept, too short to be recognised as a card number and masked.
        let body = format!("{} 4111111111111111", "y".repeat(2040));
        let e = response_excerpt(body.as_bytes(), 2048).unwrap();
        assert_eq!(e.len(), 2048);
        assert!(!e.contains("4111111"), "{e}");
        assert!(e.ends_with(" *******"), "{e}");
    }
}
