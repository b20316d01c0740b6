//! The front door, checked before any route: the size of the request head (414, 431), the
//! `Host` against DNS rebinding (421), the `Origin` of writes against cross-site requests
//! (403) and, without a token, JSON-only API writes (415). Every refusal is problem+json
//! naming the header (`field`) and what was sent (`value`).
//!
//! - **Head limits**: a request target over [`MAX_URI_BYTES`] is 414; a header section over
//!   [`MAX_HEADER_BYTES`] or with more than [`MAX_HEADER_COUNT`] fields is 431. hyper's own
//!   limits lie far beyond (a 64 KiB target, a 400 KiB head): only there does a client get
//!   hyper's bare status without a body. hyper answers those while parsing the request line,
//!   before any middleware runs, with a fixed limit and no hook for the answer, so no layer
//!   of ours can give that 414 a body.
//! - **Host**: without a token, and with a token when public hosts are configured, the
//!   request's host (its `Host` header, or the authority of an absolute-form or HTTP/2
//!   request) must be a loopback name — `localhost`, `127.0.0.1`, `[::1]`, any port — or one
//!   of the public hosts (`--public-host`). A request with no host at all (HTTP/1.0) is let
//!   through: browsers always send one, and the check is against browsers tricked by DNS.
//! - **Origin**: without a token, a write (any method but GET, HEAD, OPTIONS and TRACE) whose
//!   `Origin` is not the request's own scheme-less host and port is 403. Dashboard form posts
//!   also need a same-host `Origin` or `Referer` in every mode (see the dashboard).
//! - **JSON only**: without a token, a write under `/v1` with a `Content-Type` other than
//!   `application/json`, or `POST /v1/jobs` or `POST /v1/jobs/batch` without one, is 415. A
//!   browser can send `text/plain` across sites without asking; it cannot send
//!   `application/json`.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ServiceError};
use crate::state::AppState;

/// The longest request target (path and query) accepted: 8 KiB; longer is 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// The largest header section accepted (names, values and line framing): 32 KiB; larger is
/// 431.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// The most header fields accepted: 100; more is 431.
pub const MAX_HEADER_COUNT: usize = 100;

/// The names that are this host on any port.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

fn cut(v: &str) -> String {
    v.chars().take(200).collect()
}

fn problem(
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    field: &str,
    value: &str,
    detail: String,
) -> Response {
    ApiError {
        field: Some(field.to_owned()),
        value: Some(cut(value)),
        ..ApiError::new(status, slug, title, detail)
    }
    .into_response()
}

/// A host as `name` (lowercase; an IPv6 address keeps its brackets) and optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostName {
    name: String,
    port: Option<u16>,
}

impl HostName {
    /// Parses `name[:port]` as sent in `Host` (no scheme, path or user).
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let (name, port) = if let Some(rest) = s.strip_prefix('[') {
            let end = rest.find(']')?;
            let name = &s[..end + 2];
            let after = &rest[end + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return None,
            };
            (name, port)
        } else {
            match s.split_once(':') {
                Some((n, p)) => (n, Some(p)),
                None => (s, None),
            }
        };
        let port = match port {
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|_| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))?,
            ),
            None => None,
        };
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
        let valid = if name.starts_with('[') {
            name.len() > 2
                && name[1..name.len() - 1]
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.'))
        } else {
            !name.is_empty() && name.chars().all(ok_char)
        };
        valid.then(|| Self {
            name: name.to_ascii_lowercase(),
            port,
        })
    }

    fn is_loopback(&self) -> bool {
        LOOPBACK_NAMES.contains(&self.name.as_str())
    }
}

/// Checks one `--public-host` value: a host name or address, with an optional port
/// (`redrive.example.com`, `redrive.example.com:8443`, `[2001:db8::1]`).
///
/// # Errors
/// [`ServiceError::InvalidPublicHost`] naming the value.
pub fn validate_public_host(value: &str) -> Result<(), ServiceError> {
    parse_public_host(value).map(|_| ())
}

pub(crate) fn parse_public_host(value: &str) -> Result<HostName, ServiceError> {
    if value.contains("://") || value.contains(['/', '@', '?', '#']) {
        return Err(ServiceError::InvalidPublicHost {
            value: cut(value),
            reason: "give a host name with an optional port, without scheme or path",
        });
    }
    HostName::parse(value).ok_or_else(|| ServiceError::InvalidPublicHost {
        value: cut(value),
        reason: "not a host name, IPv4 address or [IPv6] address with an optional port",
    })
}

/// What the front door lets in, from the configuration.
#[derive(Debug, Clone, Default)]
pub(crate) struct FrontDoor {
    /// The hosts beyond loopback the service answers as (`--public-host`).
    pub(crate) public_hosts: Vec<HostName>,
}

impl FrontDoor {
    fn host_allowed(&self, host: &HostName) -> bool {
        host.is_loopback()
            || self
                .public_hosts
                .iter()
                .any(|p| p.name == host.name && (p.port.is_none() || p.port == host.port))
    }
}

fn is_write(m: &Method) -> bool {
    !matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// The size of the header section as sent on HTTP/1.1: `name: value\r\n` per field.
fn header_bytes(h: &HeaderMap) -> usize {
    h.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum()
}

/// The hosts a request names: its URI's authority (absolute form, HTTP/2) and its `Host`.
fn request_hosts(req: &Request) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(a) = req.uri().authority() {
        out.push(a.as_str().to_owned());
    }
    for v in req.headers().get_all(header::HOST) {
        out.push(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    out
}

/// The `(scheme, host)` of an `Origin` value, or `None` for `null` and anything unparsable.
fn origin_host(origin: &str) -> Option<(&str, HostName)> {
    let (scheme, rest) = origin.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return None;
    }
    Some((scheme, HostName::parse(authority)?))
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme.to_ascii_lowercase().as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// Whether `origin` names the same host and port as the request's `host`.
fn same_origin(origin: &str, host: &str) -> bool {
    let (Some((scheme, o)), Some(h)) = (origin_host(origin), HostName::parse(host)) else {
        return false;
    };
    let d = default_port(scheme);
    o.name == h.name && o.port.or(d) == h.port.or(d)
}

/// The middleware of the whole application (see the module documentation).
pub(crate) async fn front_door(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let target = req.uri().path_and_query().map_or("", |p| p.as_str());
    if target.len() > MAX_URI_BYTES {
        return problem(
            StatusCode::URI_TOO_LONG,
            "uri-too-long",
            "The request target is too long",
            "uri",
            target,
            format!(
                "the path and query are {} bytes; at most {MAX_URI_BYTES} are accepted",
                target.len()
            ),
        );
    }
    let (count, bytes) = (req.headers().len(), header_bytes(req.headers()));
    if count > MAX_HEADER_COUNT || bytes > MAX_HEADER_BYTES {
        return problem(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            "The request headers are too large",
            "headers",
            &format!("{count} fields, {bytes} bytes"),
            format!(
                "the header section has {count} fields and {bytes} bytes; at most \
                 {MAX_HEADER_COUNT} fields and {MAX_HEADER_BYTES} bytes are accepted"
            ),
        );
    }
    let open = state.inner.token.is_none();
    let door = &state.inner.front_door;
    let hosts = request_hosts(&req);
    if open || !door.public_hosts.is_empty() {
        for h in &hosts {
            if !HostName::parse(h).is_some_and(|n| door.host_allowed(&n)) {
                return problem(
                    StatusCode::MISDIRECTED_REQUEST,
                    "misdirected-host",
                    "This service does not answer for that host",
                    "Host",
                    h,
                    format!(
                        "the host {h:?} is neither a loopback name (localhost, 127.0.0.1, \
                         [::1]) nor one of the --public-host values"
                    ),
                );
            }
        }
    }
    if open
        && is_write(req.method())
        && let Some(origin) = req.headers().get(header::ORIGIN)
    {
        let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        let ok = !hosts.is_empty() && hosts.iter().all(|h| same_origin(&origin, h));
        if !ok {
            return problem(
                StatusCode::FORBIDDEN,
                "cross-origin",
                "Cross-origin writes are refused",
                "Origin",
                &origin,
                format!(
                    "a write from origin {origin:?} is refused: it is not this host{}",
                    hosts.first().map(|h| format!(" ({h})")).unwrap_or_default()
                ),
            );
        }
    }
    next.run(req).await
}

fn is_json(ct: &HeaderValue) -> bool {
    ct.to_str().ok().is_some_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

fn has_body(h: &HeaderMap) -> bool {
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// Route layer of `/v1`: without a token, writes carry JSON or nothing (415 otherwise).
pub(crate) async fn json_writes(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if state.inner.token.is_some() || !is_write(req.method()) {
        return next.run(req).await;
    }
    let ct = req.headers().get(header::CONTENT_TYPE);
    let refuse = match ct {
        Some(v) => !is_json(v),
        None => {
            has_body(req.headers())
                || (req.method() == Method::POST
                    && matches!(req.uri().path(), "/v1/jobs" | "/v1/jobs/batch"))
        }
    };
    if refuse {
        let shown = ct.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "Content-Type",
            shown.as_deref().unwrap_or(""),
            match &shown {
                Some(v) => format!("send Content-Type: application/json, not {v:?}"),
                None => "send Content-Type: application/json with the body".to_owned(),
            },
        );
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_parse() {
        let p = |s: &str| HostName::parse(s).map(|h| (h.name, h.port));
        assert_eq!(p("LocalHost:8080"), Some(("localhost".into(), Some(8080))));
        assert_eq!(p("[::1]"), Some(("[::1]".into(), None)));
        assert_eq!(p("[::1]:9"), Some(("[::1]".into(), Some(9))));
        assert_eq!(p("127.0.0.1"), Some(("127.0.0.1".into(), None)));
        for bad in [
            "", ":80", "a:b", "a:", "a:99999", "::1", "[::1", "[x]", "a b", "a/b", "[::1]x",
        ] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn origins_match_host_and_port() {
        assert!(same_origin("http://localhost:8080", "localhost:8080"));
        assert!(same_origin("http://LOCALHOST:8080", "localhost:8080"));
        assert!(same_origin("http://localhost", "localhost:80"));
        assert!(same_origin("https://r.example", "r.example"));
        assert!(!same_origin("https://r.example", "r.example:80"));
        assert!(!same_origin("http://localhost:9999", "localhost:8080"));
        assert!(!same_origin("null", "localhost:8080"));
        assert!(!same_origin("http://evil.example", "localhost"));
        assert!(!same_origin("http://u@localhost", "localhost"));
    }

    #[test]
    fn public_hosts_are_checked() {
        assert!(validate_public_host("redrive.example.com").is_ok());
        assert!(validate_public_host("redrive.example.com:8443").is_ok());
        assert!(validate_public_host("[2001:db8::1]:443").is_ok());
        for bad in [
            "https://r.example",
            "r.example/x",
            "",
            "r example",
            "u@r.example",
        ] {
            let e = validate_public_host(bad).unwrap_err().to_string();
            assert!(e.contains("--public-host"), "{e}");
        }
        let door = FrontDoor {
            public_hosts: vec![
                parse_public_host("r.example").unwrap(),
                parse_public_host("p.example:8443").unwrap(),
            ],
        };
        let ok = |h: &str| door.host_allowed(&HostName::parse(h).unwrap());
        assert!(ok("r.example:1234") && ok("R.EXAMPLE") && ok("p.example:8443"));
        assert!(ok("localhost:1") && ok("[::1]"));
        assert!(!ok("p.example") && !ok("p.example:443") && !ok("evil.example"));
    }
}
