//! Where the `http` job kind may connect: the egress policy.
//!
//! A job's URL comes from whoever can enqueue, so the worker must not become a way into the
//! machine's own network. Before any byte is sent the policy checks the URL's host name and
//! **every address it resolves to** (the check runs inside the client's DNS resolver, so a
//! name that resolves to `169.254.169.254` or `10.0.0.5` is refused like the address itself,
//! and the connection goes only to an address that passed; a host given as an IP literal is
//! checked before the call).
//!
//! # Rules
//! - **Denied, always:** link-local and cloud metadata addresses — `169.254.0.0/16`
//!   (AWS, GCP, Azure, OpenStack metadata at `169.254.169.254`), `fe80::/10`,
//!   `fd00:ec2::254` (AWS over IPv6), `100.100.100.200` (Alibaba Cloud), the unspecified
//!   addresses `0.0.0.0/8` and `::` (which reach the local machine), and the name
//!   `metadata.google.internal`. No allow entry lifts these.
//! - **Denied unless allowed:** the machine's own and private networks — loopback
//!   (`127.0.0.0/8`, `::1`), RFC 1918 (`10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`), the
//!   shared address space `100.64.0.0/10` (carrier-grade NAT, also used inside clouds and
//!   overlay networks) and unique-local IPv6 (`fc00::/7`). An address there is called only
//!   when an `allow_hosts` entry covers it: the address or a range holding it (`127.0.0.1`,
//!   `10.0.0.0/8`), the words `loopback` or `private`, or the URL's host name itself
//!   (`psp.internal`, `*.internal`) — a name allowed by name may resolve to a private address.
//! - **`deny_hosts`:** more names or ranges to refuse. Deny wins over allow.
//! - **`allow_hosts`:** when not empty, only these names or ranges may be called (a name
//!   allows every address it resolves to, except the ones denied always). The word `public`
//!   allows every address outside the ranges above, so `["public", "loopback"]` is "the
//!   internet and this machine".
//! - **`redirects`:** `none` (the default): a 3xx answer is not followed; the attempt is
//!   **permanent**, naming the `Location` (a payment API does not redirect; following one
//!   would re-send the body and headers somewhere the job did not name). `same-origin`:
//!   up to 10 redirects to the same scheme, host and port are followed; any other is not
//!   (and is permanent as above). Headers therefore never reach another origin.
//!
//! IPv4 addresses written as IPv6 (`::ffff:127.0.0.1`, the deprecated `::127.0.0.1`,
//! `64:ff9b::a9fe:a9fe`) are checked as the IPv4 address they carry; the URL parser reads
//! decimal, octal and hex IPv4 forms (`2130706433`, `0177.0.0.1`, `0x7f.1`) as the address.
//!
//! Entries are host names (`psp.example`, any case, a trailing dot ignored), suffix
//! wildcards (`*.psp.example`: any name below it, not the name itself), IP addresses
//! (`10.0.0.5`, `::1`, `[::1]`) and CIDR ranges (`10.0.0.0/8`, `fc00::/7`), or the words
//! `loopback`, `private` and `public`.
//!
//! A denied call never leaves the process: its attempt is `permanent` with the reason (which
//! rule refused it, and for a private address how to allow it), and it does not count for
//! the dependency's breaker.
//!
//! ```toml
//! [egress]
//! allow_hosts = ["*.psp.example", "10.20.0.0/16"]
//! deny_hosts = ["10.20.9.0/24"]
//! redirects = "same-origin"
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use serde::Deserialize;

/// The most redirects followed in `same-origin` mode.
pub const MAX_REDIRECTS: usize = 10;

/// What to do with a 3xx answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RedirectMode {
    /// Never follow: the 3xx is the answer (classified permanent).
    #[default]
    None,
    /// Follow up to [`MAX_REDIRECTS`] redirects to the same scheme, host and port.
    SameOrigin,
}

impl FromStr for RedirectMode {
    type Err = EgressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "same-origin" | "same_origin" => Ok(Self::SameOrigin),
            _ => Err(EgressError::Invalid {
                field: "redirects".into(),
                value: s.into(),
                reason: "expected none or same-origin".into(),
            }),
        }
    }
}

impl fmt::Display for RedirectMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::SameOrigin => "same-origin",
        })
    }
}

/// A bad egress setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EgressError {
    /// A value that cannot be used, with the field (`egress.allow_hosts`, `--allow-host`…).
    #[error("invalid {field} {value:?}: {reason}")]
    Invalid {
        /// The setting.
        field: String,
        /// The value given.
        value: String,
        /// What is allowed.
        reason: String,
    },
    /// The policies file is not valid TOML, or its `[egress]` section has an unknown field.
    #[error("{message}")]
    Toml {
        /// The parser's message.
        message: String,
    },
}

/// A call the egress policy refused (it never left the process).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("egress denied: {host}{} {reason}", addr.map(|a| format!(" ({a})")).unwrap_or_default())]
pub struct EgressDenied {
    /// The host name or address of the URL.
    pub host: String,
    /// The address refused, when the refusal is about one.
    pub addr: Option<IpAddr>,
    /// Which rule refused it.
    pub reason: String,
}

/// An IP range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// The range `addr/prefix`; `None` if the prefix is too long for the family.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Self { addr, prefix })
    }

    /// Whether `ip` is in the range (IPv4-in-IPv6 forms are compared as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The IPv4 address an IPv6 form carries (`::ffff:a.b.c.d`, `64:ff9b::a.b.c.d`, and the
/// deprecated IPv4-compatible `::a.b.c.d` other than `::` and `::1`), else `ip`.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            let compatible = s[..6] == [0; 6] && u128::from(v6) > 1;
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || compatible {
                let [a, b, c, d] = (u128::from(v6) as u32).to_be_bytes();
                return IpAddr::V4(Ipv4Addr::new(a, b, c, d));
            }
            ip
        }
        v4 => v4,
    }
}

/// One `allow_hosts` / `deny_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostRule {
    /// Exactly this name.
    Name(String),
    /// Any name below this one (`*.x` → `.x`).
    Below(String),
    /// An address range, with the entry as written (for messages).
    Net(IpNet, String),
    /// Every address outside the private ranges (the word `public`).
    Public,
}

fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8, label: &str) -> HostRule {
    HostRule::Net(
        IpNet {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        },
        label.into(),
    )
}

fn v6(addr: Ipv6Addr, prefix: u8, label: &str) -> HostRule {
    HostRule::Net(
        IpNet {
            addr: IpAddr::V6(addr),
            prefix,
        },
        label.into(),
    )
}

/// The ranges and names denied whatever the configuration says.
fn default_deny() -> Vec<HostRule> {
    vec![
        v4(
            169,
            254,
            0,
            0,
            16,
            "169.254.0.0/16 (link-local, cloud metadata)",
        ),
        v6(
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
            10,
            "fe80::/10 (link-local)",
        ),
        v6(
            Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
            128,
            "fd00:ec2::254 (cloud metadata)",
        ),
        v4(100, 100, 100, 200, 32, "100.100.100.200 (cloud metadata)"),
        v4(0, 0, 0, 0, 8, "0.0.0.0/8 (unspecified)"),
        v6(Ipv6Addr::UNSPECIFIED, 128, ":: (unspecified)"),
        HostRule::Name("metadata.google.internal".into()),
    ]
}

/// The ranges denied unless an `allow_hosts` entry covers the address or the host name:
/// `(range, its word)`, the word being the one that allows (or denies) the whole group.
fn private_ranges() -> [(IpNet, &'static str); 7] {
    let net4 = |a, b, c, d, prefix| IpNet {
        addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
        prefix,
    };
    [
        (net4(127, 0, 0, 0, 8), "loopback"),
        (
            IpNet {
                addr: IpAddr::V6(Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
            "loopback",
        ),
        (net4(10, 0, 0, 0, 8), "private"),
        (net4(172, 16, 0, 0, 12), "private"),
        (net4(192, 168, 0, 0, 16), "private"),
        (net4(100, 64, 0, 0, 10), "private"),
        (
            IpNet {
                addr: IpAddr::V6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0)),
                prefix: 7,
            },
            "private",
        ),
    ]
}

/// The private range `ip` is in, with its word.
fn private_range_of(ip: IpAddr) -> Option<(IpNet, &'static str)> {
    private_ranges().into_iter().find(|(n, _)| n.contains(ip))
}

fn words(word: &str) -> Option<Vec<HostRule>> {
    let group = |w: &str| {
        private_ranges()
            .into_iter()
            .filter(|(_, g)| *g == w)
            .map(|(n, g)| HostRule::Net(n, format!("{n} ({g})")))
            .collect::<Vec<_>>()
    };
    match word {
        "loopback" => {
            let mut rules = group("loopback");
            rules.push(HostRule::Name("localhost".into()));
            rules.push(HostRule::Below("localhost".into()));
            Some(rules)
        }
        "private" => Some(group("private")),
        "public" => Some(vec![HostRule::Public]),
        _ => None,
    }
}

fn normal_name(s: &str) -> String {
    s.trim().trim_end_matches('.').to_ascii_lowercase()
}

fn parse_rules(field: &str, entry: &str) -> Result<Vec<HostRule>, EgressError> {
    let bad = |reason: &str| EgressError::Invalid {
        field: field.into(),
        value: entry.into(),
        reason: reason.into(),
    };
    let e = entry.trim();
    if e.is_empty() {
        return Err(bad("must not be empty"));
    }
    if let Some(rules) = words(&e.to_ascii_lowercase()) {
        return Ok(rules);
    }
    if let Some((addr, prefix)) = e.split_once('/') {
        let addr = IpAddr::from_str(addr.trim_matches(['[', ']']))
            .map_err(|_| bad("expected an address range like 10.0.0.0/8"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| bad("the prefix length must be a number"))?;
        let net = IpNet::new(addr, prefix).ok_or_else(|| bad("the prefix length is too long"))?;
        return Ok(vec![HostRule::Net(net, e.into())]);
    }
    if let Ok(ip) = IpAddr::from_str(e.trim_start_matches('[').trim_end_matches(']')) {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        return Ok(vec![HostRule::Net(
            IpNet {
                addr: canonical(ip),
                prefix,
            },
            e.into(),
        )]);
    }
    let (below, name) = match e.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, e),
    };
    let name = normal_name(name);
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err(bad(
            "expected a host name, *.suffix, an address, a CIDR range, loopback, private or public",
        ));
    }
    Ok(vec![if below {
        HostRule::Below(name)
    } else {
        HostRule::Name(name)
    }])
}

impl HostRule {
    fn matches_name(&self, name: &str) -> bool {
        match self {
            HostRule::Name(n) => n == name,
            HostRule::Below(n) => {
                name.len() > n.len() + 1 && name.ends_with(n.as_str()) && {
                    name.as_bytes()[name.len() - n.len() - 1] == b'.'
                }
            }
            HostRule::Net(..) | HostRule::Public => false,
        }
    }

    fn matches_addr(&self, ip: IpAddr) -> bool {
        match self {
            HostRule::Net(net, _) => net.contains(ip),
            HostRule::Public => private_range_of(ip).is_none(),
            HostRule::Name(_) | HostRule::Below(_) => false,
        }
    }

    fn label(&self) -> String {
        match self {
            HostRule::Name(n) => n.clone(),
            HostRule::Below(n) => format!("*.{n}"),
            HostRule::Net(_, label) => label.clone(),
            HostRule::Public => "public".into(),
        }
    }
}

/// Where `http` jobs may connect, and whether they follow redirects. See the module docs.
///
/// # Default
/// No allow list: every public host may be called; loopback, RFC 1918, `100.64.0.0/10` and
/// unique-local addresses are refused until an allow entry covers them, link-local and
/// metadata addresses always. No extra deny entries, redirects not followed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow: Vec<HostRule>,
    deny: Vec<HostRule>,
    redirects: RedirectMode,
}

/// The `[egress]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEgress {
    #[serde(default)]
    allow_hosts: Vec<String>,
    #[serde(default)]
    deny_hosts: Vec<String>,
    redirects: Option<String>,
}

impl EgressPolicy {
    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// The default policy with loopback allowed (`allow_hosts = ["loopback"]`): only this
    /// machine may be called. For tests and local tools that call a simulator on
    /// `127.0.0.1`.
    pub fn loopback_only() -> Self {
        Self {
            allow: words("loopback").unwrap_or_default(),
            ..Self::default()
        }
    }

    /// Adds an `allow_hosts` entry; `field` names the setting in the error.
    ///
    /// # Errors
    /// [`EgressError::Invalid`] for an entry that is none of the documented forms.
    pub fn with_allow(mut self, field: &str, entry: &str) -> Result<Self, EgressError> {
        self.allow.extend(parse_rules(field, entry)?);
        Ok(self)
    }

    /// Adds a `deny_hosts` entry; `field` names the setting in the error.
    ///
    /// # Errors
    /// [`EgressError::Invalid`] for an entry that is none of the documented forms.
    pub fn with_deny(mut self, field: &str, entry: &str) -> Result<Self, EgressError> {
        self.deny.extend(parse_rules(field, entry)?);
        Ok(self)
    }

    /// Sets the redirect mode.
    pub fn with_redirects(mut self, mode: RedirectMode) -> Self {
        self.redirects = mode;
        self
    }

    /// The redirect mode.
    pub fn redirects(&self) -> RedirectMode {
        self.redirects
    }

    /// Whether an allow list is set.
    pub fn has_allow_list(&self) -> bool {
        !self.allow.is_empty()
    }

    /// The `[egress]` section of a policies file (the default when there is none).
    ///
    /// # Errors
    /// [`EgressError::Toml`] for invalid TOML or an unknown field, [`EgressError::Invalid`]
    /// for a bad entry (named `egress.allow_hosts[i]` etc.).
    pub fn from_toml(text: &str) -> Result<Self, EgressError> {
        Ok(split_policies_toml(text)?.0)
    }

    /// Whether a URL host given as a name may be called at all (before resolving it).
    ///
    /// # Errors
    /// [`EgressDenied`] when a deny entry names it.
    pub fn check_name(&self, host: &str) -> Result<(), EgressDenied> {
        let name = normal_name(host);
        if let Some(r) = default_deny()
            .iter()
            .chain(&self.deny)
            .find(|r| r.matches_name(&name))
        {
            return Err(EgressDenied {
                host: host.into(),
                addr: None,
                reason: format!("is denied by {}", r.label()),
            });
        }
        Ok(())
    }

    /// Whether the address `ip` may be called for the URL host `host` (a name, or the address
    /// itself).
    ///
    /// # Errors
    /// [`EgressDenied`] naming the rule (and, for a private address, how to allow it).
    pub fn check_addr(&self, host: &str, ip: IpAddr) -> Result<(), EgressDenied> {
        let denied = |reason: String| EgressDenied {
            host: host.into(),
            addr: Some(ip),
            reason,
        };
        if let Some(r) = default_deny().iter().find(|r| r.matches_addr(ip)) {
            return Err(denied(format!(
                "is in {}, always denied (no allow entry lifts it)",
                r.label()
            )));
        }
        if let Some(r) = self.deny.iter().find(|r| r.matches_addr(ip)) {
            return Err(denied(format!("is in {}, denied by deny_hosts", r.label())));
        }
        let name = normal_name(host);
        let allowed = self
            .allow
            .iter()
            .any(|r| r.matches_name(&name) || r.matches_addr(ip));
        if let Some((net, word)) = private_range_of(ip) {
            if allowed {
                return Ok(());
            }
            let literal =
                IpAddr::from_str(host.trim_start_matches('[').trim_end_matches(']')).is_ok();
            let entry = if literal {
                canonical(ip).to_string()
            } else {
                name.clone()
            };
            return Err(denied(format!(
                "is in {net} ({word}), denied by default; to call it, allow it with \
                 --allow-host {entry} (or {net}, or {word}) on work and serve, or in \
                 allow_hosts of the policies file's [egress] section"
            )));
        }
        if self.allow.is_empty() || allowed {
            return Ok(());
        }
        Err(denied(
            "is not in allow_hosts (add it with --allow-host, or to allow_hosts of [egress])"
                .into(),
        ))
    }

    /// Checks a URL's host before a call: a name against the name rules (its addresses are
    /// checked by the resolver), an IP literal against every rule.
    ///
    /// # Errors
    /// [`EgressDenied`] naming the rule, or for a URL without a host.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), EgressDenied> {
        let Some(host) = url.host_str() else {
            return Err(EgressDenied {
                host: String::new(),
                addr: None,
                reason: "the URL has no host".into(),
            });
        };
        // The URL parser has already normalised IPv4 forms (`0x7f.1` → `127.0.0.1`).
        match IpAddr::from_str(host.trim_start_matches('[').trim_end_matches(']')) {
            Ok(ip) => self.check_addr(host, ip),
            Err(_) => self.check_name(host),
        }
    }
}

/// Splits a policies file into its `[egress]` section and the rest (for
/// `redrive_policy::PolicySet::from_toml`, which does not know the section). The rest keeps
/// the lines of the original where it can, so the policy parser's line numbers still point
/// at the right place.
///
/// # Errors
/// As [`EgressPolicy::from_toml`].
pub fn split_policies_toml(text: &str) -> Result<(EgressPolicy, String), EgressError> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| EgressError::Toml {
        message: e.to_string().trim().replace('\n', " "),
    })?;
    let Some(section) = table.remove("egress") else {
        return Ok((EgressPolicy::default(), text.to_owned()));
    };
    let raw: RawEgress = section
        .try_into()
        .map_err(|e: toml::de::Error| EgressError::Toml {
            message: format!("egress: {}", e.to_string().trim().replace('\n', " ")),
        })?;
    let mut p = EgressPolicy::default();
    for (i, e) in raw.allow_hosts.iter().enumerate() {
        p = p.with_allow(&format!("egress.allow_hosts[{i}]"), e)?;
    }
    for (i, e) in raw.deny_hosts.iter().enumerate() {
        p = p.with_deny(&format!("egress.deny_hosts[{i}]"), e)?;
    }
    if let Some(r) = raw.redirects {
        p.redirects = r.parse().map_err(|_| EgressError::Invalid {
            field: "egress.redirects".into(),
            value: r.clone(),
            reason: "expected none or same-origin".into(),
        })?;
    }
    let blanked = blank_egress_lines(text);
    let rest = match toml::from_str::<toml::Table>(&blanked) {
        Ok(t) if t == table => blanked,
        _ => toml::to_string(&table).map_err(|e| EgressError::Toml {
            message: e.to_string(),
        })?,
    };
    Ok((p, rest))
}

/// The text with the lines of `[egress]` (and `[egress.*]`) sections emptied.
fn blank_egress_lines(text: &str) -> String {
    let mut inside = false;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if let Some(h) = t.strip_prefix('[') {
            let name = h.trim_start_matches('[').trim_start();
            let name = name.split(']').next().unwrap_or("").trim();
            inside = name == "egress" || name.starts_with("egress.");
        }
        if inside {
            if line.ends_with('\n') {
                out.push('\n');
            }
        } else {
            out.push_str(line);
        }
    }
    out
}

/// The DNS resolver of the `http` job's client: resolves with the system resolver, then keeps
/// only the addresses the policy allows; none left → the call fails with [`EgressDenied`].
#[derive(Debug, Clone)]
pub(crate) struct EgressResolver {
    pub(crate) policy: Arc<EgressPolicy>,
}

impl reqwest::dns::Resolve for EgressResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            policy.check_name(&host)?;
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_denial = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.check_addr(&host, a.ip()) {
                    Ok(()) => true,
                    Err(d) => {
                        first_denial.get_or_insert(d);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let d = first_denial.unwrap_or_else(|| EgressDenied {
                    host: host.clone(),
                    addr: None,
                    reason: "resolves to no address".into(),
                });
                return Err(Box::new(d) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The [`EgressDenied`] somewhere in an error's chain.
pub fn denial_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a EgressDenied> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(d) = c.downcast_ref::<EgressDenied>() {
            return Some(d);
        }
        cur = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn metadata_and_link_local_are_always_denied() {
        let open = EgressPolicy::default()
            .with_allow("allow", "0.0.0.0/0")
            .unwrap()
            .with_allow("allow", "::/0")
            .unwrap();
        for p in [EgressPolicy::default(), open] {
            for a in [
                "169.254.169.254",
                "169.254.0.1",
                "fe80::1",
                "fd00:ec2::254",
                "100.100.100.200",
                "0.0.0.0",
                "::",
                "::ffff:169.254.169.254",
                "64:ff9b::a9fe:a9fe",
                "::169.254.169.254",
            ] {
                let e = p.check_addr("h", ip(a)).unwrap_err();
                assert!(e.reason.contains("always denied"), "{a}: {e}");
            }
        }
        assert!(
            EgressPolicy::default()
                .check_name("Metadata.Google.Internal.")
                .is_err()
        );
        EgressPolicy::default().check_name("psp.example").unwrap();
    }

    /// Every private range, in every spelling, is refused by the default policy, with a
    /// message naming the range and how to allow it; public addresses are not.
    #[test]
    fn private_ranges_are_denied_by_default() {
        let p = EgressPolicy::default();
        for (a, range, word) in [
            ("127.0.0.1", "127.0.0.0/8", "loopback"),
            ("127.255.1.2", "127.0.0.0/8", "loopback"),
            ("::1", "::1/128", "loopback"),
            ("::ffff:127.0.0.1", "127.0.0.0/8", "loopback"),
            ("::127.0.0.1", "127.0.0.0/8", "loopback"),
            ("64:ff9b::7f00:1", "127.0.0.0/8", "loopback"),
            ("10.0.0.1", "10.0.0.0/8", "private"),
            ("10.255.255.255", "10.0.0.0/8", "private"),
            ("172.16.0.1", "172.16.0.0/12", "private"),
            ("172.31.255.254", "172.16.0.0/12", "private"),
            ("192.168.1.1", "192.168.0.0/16", "private"),
            ("::ffff:192.168.1.1", "192.168.0.0/16", "private"),
            ("100.64.0.1", "100.64.0.0/10", "private"),
            ("100.127.255.254", "100.64.0.0/10", "private"),
            ("fc00::1", "fc00::/7", "private"),
            ("fd12:3456::1", "fc00::/7", "private"),
        ] {
            let e = p.check_addr(a, ip(a)).unwrap_err();
            let m = e.to_string();
            assert!(
                m.contains(&format!("is in {range} ({word}), denied by default")),
                "{a}: {m}"
            );
            assert!(m.contains("--allow-host") && m.contains("[egress]"), "{m}");
            assert!(m.contains("allow_hosts"), "{m}");
        }
        // A name is suggested by name.
        let e = p.check_addr("psp.internal", ip("10.1.2.3")).unwrap_err();
        assert!(
            e.to_string()
                .contains("--allow-host psp.internal (or 10.0.0.0/8, or private)"),
            "{e}"
        );
        for a in [
            "93.184.216.34",
            "169.255.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.169.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "11.0.0.1",
            "2001:db8::1",
            "fe00::1",
            "::2.3.4.5",
        ] {
            p.check_addr("h", ip(a))
                .unwrap_or_else(|e| panic!("{a}: {e}"));
        }
    }

    #[test]
    fn an_allow_entry_lifts_the_private_default() {
        let by_addr = EgressPolicy::default()
            .with_allow("allow", "127.0.0.1")
            .unwrap();
        by_addr.check_addr("127.0.0.1", ip("127.0.0.1")).unwrap();
        by_addr
            .check_addr("127.0.0.1", ip("::ffff:127.0.0.1"))
            .unwrap();
        assert!(by_addr.check_addr("h", ip("127.0.0.2")).is_err());
        let by_range = EgressPolicy::default()
            .with_allow("allow", "10.0.0.0/8")
            .unwrap();
        by_range.check_addr("h", ip("10.9.8.7")).unwrap();
        assert!(by_range.check_addr("h", ip("192.168.0.1")).is_err());
        let words = EgressPolicy::default()
            .with_allow("allow", "LOOPBACK")
            .unwrap()
            .with_allow("allow", "private")
            .unwrap();
        for a in [
            "127.0.0.1",
            "::1",
            "10.0.0.1",
            "172.20.0.1",
            "100.64.1.1",
            "fd00::1",
        ] {
            words.check_addr("h", ip(a)).unwrap();
        }
        assert_eq!(EgressPolicy::loopback_only(), {
            EgressPolicy::default().with_allow("x", "loopback").unwrap()
        });
        // A name allowed by name may resolve to a private address; another name may not.
        let by_name = EgressPolicy::default()
            .with_allow("allow", "psp.internal")
            .unwrap()
            .with_allow("allow", "public")
            .unwrap();
        by_name.check_addr("psp.internal", ip("10.1.2.3")).unwrap();
        by_name
            .check_addr("psp.example", ip("93.184.216.34"))
            .unwrap();
        let e = by_name
            .check_addr("rebound.example", ip("10.1.2.3"))
            .unwrap_err();
        assert!(e.reason.contains("denied by default"), "{e}");
        // `public` alone never reaches this machine.
        let public = EgressPolicy::default().with_allow("a", "public").unwrap();
        assert!(public.check_addr("localhost", ip("127.0.0.1")).is_err());
        public.check_addr("x", ip("8.8.8.8")).unwrap();
    }

    #[test]
    fn loopback_can_be_denied_and_allow_lists_restrict() {
        let p = EgressPolicy::loopback_only()
            .with_deny("deny", "loopback")
            .unwrap();
        let e = p.check_addr("localhost", ip("127.0.0.1")).unwrap_err();
        assert!(e.reason.contains("denied by deny_hosts"), "{e}");
        assert!(p.check_addr("x", ip("::1")).is_err());
        assert!(p.check_name("localhost").is_err());
        let p = EgressPolicy::default()
            .with_allow("allow", "*.psp.example")
            .unwrap()
            .with_allow("allow", "10.20.0.0/16")
            .unwrap()
            .with_deny("deny", "10.20.9.0/24")
            .unwrap();
        p.check_addr("api.psp.example", ip("93.184.216.34"))
            .unwrap();
        assert!(p.check_addr("psp.example", ip("93.184.216.34")).is_err());
        p.check_addr("internal", ip("10.20.1.1")).unwrap();
        let e = p.check_addr("internal", ip("10.20.9.1")).unwrap_err();
        assert!(e.reason.contains("deny_hosts"), "{e}");
        // Allowed by name, but the name resolves to metadata: still denied.
        assert!(
            p.check_addr("api.psp.example", ip("169.254.169.254"))
                .is_err()
        );
        let e = p.check_addr("other.example", ip("8.8.8.8")).unwrap_err();
        assert!(e.reason.contains("is not in allow_hosts"), "{e}");
        assert!(e.reason.contains("--allow-host"), "{e}");
    }

    #[test]
    fn bad_entries_are_refused_naming_the_field() {
        for e in [
            "",
            "10.0.0.0/40",
            "a b",
            "http://x",
            "1.2.3.4/x",
            "*.",
            "-/-",
        ] {
            let err = EgressPolicy::default()
                .with_allow("--allow-host", e)
                .unwrap_err();
            assert!(err.to_string().contains("--allow-host"), "{err}");
        }
    }

    #[test]
    fn the_egress_section_is_split_from_a_policies_file() {
        let text = "[policy.x]\nextends = \"payment\"\n\n[egress]\nallow_hosts = [\n  \"*.psp.example\",\n]\nredirects = \"same-origin\"\n\n[breaker.default]\nfailure_rate = 0.5\n";
        let (p, rest) = split_policies_toml(text).unwrap();
        assert_eq!(p.redirects(), RedirectMode::SameOrigin);
        assert!(p.has_allow_list());
        assert!(!rest.contains("egress"));
        assert_eq!(rest.lines().count(), text.lines().count(), "{rest}");
        assert_eq!(rest.lines().nth(9), Some("[breaker.default]"));
        // Without a section: the text as it is.
        let (p, rest) = split_policies_toml("[policy.y]\n").unwrap();
        assert_eq!(
            (p, rest.as_str()),
            (EgressPolicy::default(), "[policy.y]\n")
        );
        // Inline tables are handled too.
        let (p, rest) = split_policies_toml("egress = { allow_hosts = [\"loopback\"] }\n").unwrap();
        p.check_addr("h", ip("127.0.0.1")).unwrap();
        assert!(!rest.contains("egress"));
        let e = split_policies_toml("[egress]\nallow = []\n").unwrap_err();
        assert!(e.to_string().contains("allow"), "{e}");
        let e = split_policies_toml("[egress]\nredirects = \"all\"\n").unwrap_err();
        assert!(e.to_string().contains("egress.redirects"), "{e}");
        let e = split_policies_toml("[egress]\ndeny_hosts = [\"a b\"]\n").unwrap_err();
        assert!(e.to_string().contains("egress.deny_hosts[0]"), "{e}");
    }

    #[test]
    fn url_literals_are_checked_in_every_spelling() {
        let p = EgressPolicy::default();
        for u in [
            "http://169.254.169.254/latest/meta-data/",
            "http://[::ffff:169.254.169.254]/",
            "http://0xa9fea9fe/",
            "http://2852039166/",
            "http://169.254.169.254.:80/",
            "http://[fe80::1]/",
            "http://0.0.0.0:8080/",
            "http://metadata.google.internal/computeMetadata/v1/",
            // Loopback and private ranges in every spelling the URL parser reads.
            "http://127.0.0.1:8081/",
            "http://[::1]/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://[::ffff:7f00:1]/",
            "http://[::127.0.0.1]/",
            "http://0xa.0x1.2.3/",
            "http://167772161/",
            "http://012.0.0.1/",
            "http://0xc0a80101/",
            "http://[fd00::1]/",
        ] {
            let url = reqwest::Url::parse(u).unwrap();
            assert!(p.check_url(&url).is_err(), "{u} ({:?})", url.host_str());
        }
        p.check_url(&reqwest::Url::parse("https://psp.example/v1").unwrap())
            .unwrap();
        let lo = EgressPolicy::loopback_only();
        for u in [
            "http://127.0.0.1:8081/",
            "http://[::1]/",
            "http://2130706433/",
            "http://0x7f.1/",
        ] {
            lo.check_url(&reqwest::Url::parse(u).unwrap()).unwrap();
        }
    }

    #[test]
    fn ranges_contain_what_they_should() {
        let n = IpNet::new(ip("10.0.0.0"), 8).unwrap();
        assert!(n.contains(ip("10.255.0.1")));
        assert!(!n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.0.0.1")));
        assert!(
            IpNet::new(ip("0.0.0.0"), 0)
                .unwrap()
                .contains(ip("1.2.3.4"))
        );
        assert!(IpNet::new(ip("::"), 0).unwrap().contains(ip("fe80::1")));
        assert!(IpNet::new(ip("1.2.3.4"), 33).is_none());
    }
}
