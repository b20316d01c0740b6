//! PostgreSQL URLs as redrive reads them: libpq's multi-host form and `target_session_attrs`,
//! plus redrive's own parameters (`schema`, `pool_size`), none of which the driver takes.
//!
//! ```
//! use redrive_store::{PgUrl, SessionAttrs};
//!
//! let u = PgUrl::parse(
//!     "postgres://app@db-a:5432,db-b:5433/pay?target_session_attrs=read-write&schema=q&pool_size=8",
//! ).unwrap();
//! assert_eq!(u.hosts().len(), 2);
//! assert_eq!(u.target(), SessionAttrs::ReadWrite);
//! assert_eq!(u.schema(), Some("q"));
//! assert_eq!(u.pool_size(), 8);
//! assert_eq!(u.host_url(1), "postgres://app@db-b:5433/pay");
//! ```

use std::fmt;

use crate::{Result, StoreError};

/// A process's PostgreSQL connections when the URL does not say (`pool_size`): the pool's
/// plus the one that LISTENs for wake-ups.
pub const DEFAULT_POOL_SIZE: u32 = 17;

/// Which server a connection may use, as libpq's `target_session_attrs` defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAttrs {
    /// Any server that answers (the default).
    Any,
    /// A server that accepts writes (`transaction_read_only` is off).
    ReadWrite,
    /// A server that does not (a standby, or `default_transaction_read_only`).
    ReadOnly,
    /// A server not in recovery.
    Primary,
    /// A server in recovery (a streaming standby).
    Standby,
    /// A standby if one answers, else any server.
    PreferStandby,
}

impl SessionAttrs {
    const NAMES: &'static str = "any, read-write, read-only, primary, standby or prefer-standby";

    fn parse(v: &str) -> Result<Self> {
        Ok(match v {
            "any" => Self::Any,
            "read-write" => Self::ReadWrite,
            "read-only" => Self::ReadOnly,
            "primary" => Self::Primary,
            "standby" => Self::Standby,
            "prefer-standby" => Self::PreferStandby,
            other => {
                return Err(StoreError::Invalid {
                    field: "target_session_attrs",
                    value: other.into(),
                    reason: format!("expected {}", Self::NAMES),
                });
            }
        })
    }

    /// Whether a server that is (or is not) in recovery and read-only suits these attributes
    /// (`PreferStandby` accepts any: the caller tries standbys first).
    pub fn accepts(self, in_recovery: bool, read_only: bool) -> bool {
        match self {
            Self::Any | Self::PreferStandby => true,
            Self::ReadWrite => !read_only,
            Self::ReadOnly => read_only,
            Self::Primary => !in_recovery,
            Self::Standby => in_recovery,
        }
    }

    /// Whether redrive can run on such a server: it writes on every connection.
    pub fn writable(self) -> bool {
        matches!(self, Self::Any | Self::ReadWrite | Self::Primary)
    }
}

impl fmt::Display for SessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
            Self::Primary => "primary",
            Self::Standby => "standby",
            Self::PreferStandby => "prefer-standby",
        })
    }
}

/// Where a store LISTENs for the fleet's wake-ups (NOTIFY on enqueue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// On a connection like the pool's (the default).
    Pool,
    /// Not at all: idle workers find new jobs by polling (`listen=off`; behind a pooler in
    /// transaction mode, where LISTEN does not work, when no direct URL is at hand).
    Off,
    /// On a connection to this URL (`listen=<percent-encoded URL>`, or `--listen-db`): the
    /// server directly, past a pooler in transaction mode.
    Url(String),
}

/// One host of a URL's host list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgHost {
    /// The name or address (an IPv6 address keeps its brackets).
    pub host: String,
    /// The port (5432 when the URL gives none).
    pub port: u16,
}

impl fmt::Display for PgHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A parsed `postgres://` URL: its hosts, the attributes a server must have, redrive's own
/// parameters, and the rest, which goes to the driver unchanged.
#[derive(Debug, Clone)]
pub struct PgUrl {
    scheme: String,
    userinfo: Option<String>,
    hosts: Vec<PgHost>,
    path: String,
    params: Vec<String>,
    target: SessionAttrs,
    schema: Option<String>,
    pool_size: u32,
    listen: Listen,
}

impl PgUrl {
    /// Parses `postgres://[user[:password]@]host[:port][,host[:port]…][/db][?params]`.
    ///
    /// # Errors
    /// [`StoreError::BadUrl`] naming the part that is wrong (an empty host, a bad port), or
    /// [`StoreError::Invalid`] for `target_session_attrs` or `pool_size`.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |reason: String| StoreError::BadUrl {
            url: url.into(),
            reason,
        };
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(s, _)| *s == "postgres" || *s == "postgresql")
            .ok_or_else(|| bad("expected postgres://…".into()))?;
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i..]),
            None => (before_query, ""),
        };
        let (userinfo, hostlist) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let mut hosts = Vec::new();
        for (i, part) in hostlist.split(',').enumerate() {
            hosts.push(parse_host(part).map_err(|reason| {
                bad(format!(
                    "host {} of the host list {hostlist:?}: {reason}",
                    i + 1
                ))
            })?);
        }
        let mut target = SessionAttrs::Any;
        let mut schema = None;
        let mut pool_size = DEFAULT_POOL_SIZE;
        let mut listen = Listen::Pool;
        let mut params = Vec::new();
        for p in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match k {
                "target_session_attrs" => target = SessionAttrs::parse(v)?,
                "schema" => schema = Some(v.to_owned()),
                "listen" => {
                    listen = match v {
                        "on" => Listen::Pool,
                        "off" => Listen::Off,
                        encoded => {
                            let direct = percent_decode(encoded);
                            if !(direct.starts_with("postgres://")
                                || direct.starts_with("postgresql://"))
                            {
                                return Err(StoreError::Invalid {
                                    field: "listen",
                                    value: v.into(),
                                    reason: "expected on, off or a percent-encoded postgres:// URL"
                                        .into(),
                                });
                            }
                            Listen::Url(direct)
                        }
                    };
                }
                "pool_size" => {
                    pool_size = v
                        .parse()
                        .ok()
                        .filter(|n| (2..=1000).contains(n))
                        .ok_or_else(|| StoreError::Invalid {
                            field: "pool_size",
                            value: v.into(),
                            reason: "a whole number of connections from 2 to 1000 (the pool's \
                                     and the one that LISTENs)"
                                .into(),
                        })?;
                }
                _ => params.push(p.to_owned()),
            }
        }
        if !target.writable() {
            return Err(StoreError::Invalid {
                field: "target_session_attrs",
                value: target.to_string(),
                reason: "redrive writes on every connection: use read-write, primary or any".into(),
            });
        }
        Ok(Self {
            scheme: scheme.to_owned(),
            userinfo: userinfo.map(str::to_owned),
            hosts,
            path: path.to_owned(),
            params,
            target,
            schema,
            pool_size,
            listen,
        })
    }

    /// Where the store LISTENs (`listen=`).
    pub fn listen(&self) -> &Listen {
        &self.listen
    }

    /// The hosts, in the order they are tried.
    pub fn hosts(&self) -> &[PgHost] {
        &self.hosts
    }

    /// What a server must be to be used.
    pub fn target(&self) -> SessionAttrs {
        self.target
    }

    /// redrive's `schema=NAME`, if given.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The process's connections: `pool_size=N`, or [`DEFAULT_POOL_SIZE`]; one of them
    /// LISTENs, the others are the pool.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// Whether the URL passes the driver parameter `name` (e.g. `application_name`).
    pub fn has_param(&self, name: &str) -> bool {
        self.params
            .iter()
            .any(|p| p.split_once('=').map_or(p.as_str(), |(k, _)| k) == name)
    }

    /// A one-host URL for host `i`, with only the parameters the driver takes.
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn host_url(&self, i: usize) -> String {
        let mut u = format!("{}://", self.scheme);
        if let Some(ui) = &self.userinfo {
            u.push_str(ui);
            u.push('@');
        }
        u.push_str(&self.hosts[i].to_string());
        u.push_str(&self.path);
        if !self.params.is_empty() {
            u.push('?');
            u.push_str(&self.params.join("&"));
        }
        u
    }
}

/// `%XX` sequences decoded (a URL given as a parameter of another); invalid ones kept as they are.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && s.is_char_boundary(i + 3)
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `s` with every byte but letters, digits and `-._~` percent-encoded: a URL made fit to be
/// the value of another URL's parameter (`listen=`).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|c| {
            if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

fn parse_host(part: &str) -> std::result::Result<PgHost, String> {
    if part.is_empty() {
        return Err("empty".into());
    }
    let (host, port) = if let Some(rest) = part.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or("an IPv6 address without its closing ]")?;
        let host = format!("[{}]", &rest[..end]);
        match &rest[end + 1..] {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or(format!("unexpected {p:?}"))?),
            ),
        }
    } else {
        match part.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (part.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(format!("no host name in {part:?}"));
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c == '/' || c == '@')
    {
        return Err(format!("{host:?} is not a host name"));
    }
    let port = match port {
        None => 5432,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or(format!("port {p:?} is not a number from 1 to 65535"))?,
    };
    Ok(PgHost { host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_keeps_the_driver_parameters_and_drops_redrives() {
        let u = PgUrl::parse("postgres://u:p@127.0.0.1/test?sslmode=disable&schema=s").unwrap();
        assert_eq!(
            u.hosts(),
            &[PgHost {
                host: "127.0.0.1".into(),
                port: 5432
            }]
        );
        assert_eq!(
            u.host_url(0),
            "postgres://u:p@127.0.0.1:5432/test?sslmode=disable"
        );
        assert_eq!(u.schema(), Some("s"));
        assert_eq!(u.pool_size(), DEFAULT_POOL_SIZE);
        assert_eq!(u.target(), SessionAttrs::Any);
    }

    #[test]
    fn a_host_list_with_ports_and_ipv6() {
        let u = PgUrl::parse("postgresql://u@a:5433,[::1]:6000,b/db?target_session_attrs=primary")
            .unwrap();
        let hs: Vec<String> = u.hosts().iter().map(ToString::to_string).collect();
        assert_eq!(hs, ["a:5433", "[::1]:6000", "b:5432"]);
        assert_eq!(u.host_url(1), "postgresql://u@[::1]:6000/db");
        assert_eq!(u.target(), SessionAttrs::Primary);
    }

    #[test]
    fn bad_parts_are_named() {
        let e = PgUrl::parse("postgres://u@a:5432,,b/db")
            .unwrap_err()
            .to_string();
        assert!(e.contains("host 2") && e.contains("empty"), "{e}");
        let e = PgUrl::parse("postgres://u@a:5432,b:x/db")
            .unwrap_err()
            .to_string();
        assert!(e.contains("host 2") && e.contains("\"x\""), "{e}");
        let e = PgUrl::parse("postgres://u@a:70000/db")
            .unwrap_err()
            .to_string();
        assert!(e.contains("70000"), "{e}");
        let e = PgUrl::parse("postgres://a/db?target_session_attrs=leader")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("target_session_attrs") && e.contains("leader"),
            "{e}"
        );
        let e = PgUrl::parse("postgres://a/db?target_session_attrs=standby")
            .unwrap_err()
            .to_string();
        assert!(e.contains("standby") && e.contains("writes"), "{e}");
        let e = PgUrl::parse("postgres://a/db?pool_size=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pool_size") && e.contains('1'), "{e}");
        let e = PgUrl::parse("mysql://a/db").unwrap_err().to_string();
        assert!(e.contains("postgres://"), "{e}");
    }

    #[test]
    fn listen_is_on_off_or_a_direct_url() {
        let direct = "postgres://u@10.0.0.5:5432/db?sslmode=disable";
        let u = PgUrl::parse(&format!(
            "postgres://u@pooler:6432/db?listen={}",
            percent_encode(direct)
        ))
        .unwrap();
        assert_eq!(u.listen(), &Listen::Url(direct.into()));
        assert_eq!(u.host_url(0), "postgres://u@pooler:6432/db");
        let off = PgUrl::parse("postgres://u@p/db?listen=off").unwrap();
        assert_eq!(off.listen(), &Listen::Off);
        let e = PgUrl::parse("postgres://u@p/db?listen=maybe")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listen") && e.contains("maybe"), "{e}");
    }

    #[test]
    fn attributes_accept_what_libpq_accepts() {
        use SessionAttrs::*;
        // (in recovery, read only)
        assert!(ReadWrite.accepts(false, false));
        assert!(!ReadWrite.accepts(true, true));
        assert!(!ReadWrite.accepts(false, true));
        assert!(Primary.accepts(false, true));
        assert!(!Primary.accepts(true, true));
        assert!(Any.accepts(true, true));
    }
}
