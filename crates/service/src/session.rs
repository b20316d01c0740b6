//! Dashboard sessions and the limit on failed logins.
//!
//! A session id is 32 bytes from the operating system's CSPRNG (through `rand`'s thread
//! generator, reseeded from it), sent as 64 hex digits in the cookie and kept on the server
//! only as its SHA-256, with an expiry: a leaked memory dump does not yield a usable cookie, a
//! session ends after its time to live, and logout deletes it. Sessions live in memory: a
//! restart signs everyone out.
//!
//! Failed logins are counted per client address (an IPv6 client by its /64) over a sliding
//! minute; beyond [`LOGIN_FAILURES_PER_MINUTE`] every login from that address is refused with
//! 429 and `Retry-After` until the oldest failure leaves the window. Wrong bearer tokens (the
//! API, `/metrics`, the dashboard) are counted the same way in a table of their own, beyond
//! [`BEARER_FAILURES_PER_MINUTE`]. Both use the injected clock, so tests move time exactly.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use redrive_store::{Clock, Timestamp};
use sha2::{Digest, Sha256};

/// How long a dashboard session lasts by default: 12 hours.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Failed logins allowed per client address per minute; the next is 429.
pub const LOGIN_FAILURES_PER_MINUTE: usize = 5;

/// Wrong bearer tokens allowed per client address per minute; the next request with a bearer
/// token from that address is 429, without comparing its token.
pub const BEARER_FAILURES_PER_MINUTE: usize = 20;

/// The window failed logins are counted in.
const LOGIN_WINDOW: Duration = Duration::from_secs(60);

/// Sessions kept at most; beyond, the one closest to expiry is dropped.
const MAX_SESSIONS: usize = 10_000;

/// Client addresses tracked at most; beyond, the ones without a recent failure are forgotten,
/// and if all are recent, unknown addresses share one budget.
const MAX_TRACKED: usize = 10_000;

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// The server side of dashboard sessions.
pub(crate) struct Sessions {
    ttl: Duration,
    clock: Arc<dyn Clock>,
    live: Mutex<HashMap<[u8; 32], (Timestamp, crate::auth::Identity)>>,
}

impl Sessions {
    pub(crate) fn new(ttl: Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            ttl,
            clock,
            live: Mutex::default(),
        }
    }

    /// How long a new session lasts.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Starts a session for `identity` (the token signed in with); returns its id (the
    /// cookie value).
    pub(crate) fn create(&self, identity: crate::auth::Identity) -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let now = self.clock.now();
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if live.len() >= MAX_SESSIONS {
            live.retain(|_, (exp, _)| *exp > now);
        }
        if live.len() >= MAX_SESSIONS
            && let Some(oldest) = live.iter().min_by_key(|(_, e)| e.0).map(|(k, _)| *k)
        {
            live.remove(&oldest);
        }
        live.insert(digest(&id), (plus(now, self.ttl), identity));
        id
    }

    /// Whether `id` is a live session (an expired one is forgotten).
    #[cfg(test)]
    pub(crate) fn valid(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// The identity of the live session `id` (an expired one is forgotten).
    pub(crate) fn get(&self, id: &str) -> Option<crate::auth::Identity> {
        let key = digest(id);
        let now = self.clock.now();
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.get(&key) {
            Some((exp, who)) if *exp > now => Some(who.clone()),
            Some(_) => {
                live.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends a session (logout).
    pub(crate) fn revoke(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&digest(id));
    }
}

/// The address failed logins are counted under: an IPv4 address, or an IPv6 address's /64.
fn client_key(ip: Option<IpAddr>) -> Option<IpAddr> {
    ip.map(|ip| match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    })
}

/// Counts failures (failed logins, wrong bearer tokens) per client and refuses beyond the
/// limit. Its memory is bounded: at most [`MAX_TRACKED`] addresses, each with at most
/// `limit` timestamps.
pub(crate) struct FailureLimiter {
    clock: Arc<dyn Clock>,
    limit: usize,
    failures: Mutex<HashMap<Option<IpAddr>, VecDeque<Timestamp>>>,
}

impl FailureLimiter {
    /// The limiter of dashboard logins ([`LOGIN_FAILURES_PER_MINUTE`]).
    pub(crate) fn logins(clock: Arc<dyn Clock>) -> Self {
        Self::new(clock, LOGIN_FAILURES_PER_MINUTE)
    }

    /// The limiter of bearer tokens ([`BEARER_FAILURES_PER_MINUTE`]).
    pub(crate) fn bearers(clock: Arc<dyn Clock>) -> Self {
        Self::new(clock, BEARER_FAILURES_PER_MINUTE)
    }

    fn new(clock: Arc<dyn Clock>, limit: usize) -> Self {
        Self {
            clock,
            limit: limit.max(1),
            failures: Mutex::default(),
        }
    }

    /// The failures allowed per minute.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// `Err(retry_after)` while `ip` has used up its failures of the last minute.
    pub(crate) fn check(&self, ip: Option<IpAddr>) -> Result<(), Duration> {
        let now = self.clock.now();
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let key = Self::key(&map, client_key(ip));
        let Some(q) = map.get_mut(&key) else {
            return Ok(());
        };
        let from = now - chrono::Duration::from_std(LOGIN_WINDOW).unwrap_or_default();
        while q.front().is_some_and(|t| *t <= from) {
            q.pop_front();
        }
        if q.len() < self.limit {
            return Ok(());
        }
        let free_at = plus(q[q.len() - self.limit], LOGIN_WINDOW);
        let wait = (free_at - now).to_std().unwrap_or_default();
        // Whole seconds, rounded up, at least one: what Retry-After can say.
        let secs = wait.as_millis().div_ceil(1000).max(1) as u64;
        Err(Duration::from_secs(secs))
    }

    /// Records a failure from `ip`.
    pub(crate) fn failed(&self, ip: Option<IpAddr>) {
        let now = self.clock.now();
        let from = now - chrono::Duration::from_std(LOGIN_WINDOW).unwrap_or_default();
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = client_key(ip);
        if !map.contains_key(&key) && map.len() >= MAX_TRACKED {
            map.retain(|_, q| q.back().is_some_and(|t| *t > from));
            key = Self::key(&map, key);
        }
        let q = map.entry(key).or_default();
        q.push_back(now);
        while q.len() > self.limit {
            q.pop_front();
        }
    }

    /// `key`, or the shared budget when the table is full and `key` is not in it.
    fn key(
        map: &HashMap<Option<IpAddr>, VecDeque<Timestamp>>,
        key: Option<IpAddr>,
    ) -> Option<IpAddr> {
        if map.contains_key(&key) || map.len() < MAX_TRACKED {
            key
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_store::ManualClock;

    #[test]
    fn sessions_are_random_expire_and_are_revoked() {
        let clock = Arc::new(ManualClock::at_millis(0));
        let s = Sessions::new(Duration::from_secs(60), clock.clone());
        let (a, b) = (
            s.create(crate::auth::Identity::anonymous()),
            s.create(crate::auth::Identity::anonymous()),
        );
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert!(s.valid(&a) && s.valid(&b));
        assert!(!s.valid("00"));
        s.revoke(&a);
        assert!(!s.valid(&a) && s.valid(&b));
        clock.advance(Duration::from_secs(59));
        assert!(s.valid(&b));
        clock.advance(Duration::from_secs(1));
        assert!(!s.valid(&b), "expired at its time to live");
    }

    #[test]
    fn five_failures_a_minute_then_429_until_the_oldest_leaves() {
        let clock = Arc::new(ManualClock::at_millis(0));
        let l = FailureLimiter::logins(clock.clone());
        let ip: Option<IpAddr> = Some("192.0.2.7".parse().unwrap());
        let other: Option<IpAddr> = Some("192.0.2.8".parse().unwrap());
        for i in 0..5 {
            assert_eq!(l.check(ip), Ok(()), "failure {i}");
            l.failed(ip);
            clock.advance(Duration::from_secs(10));
        }
        // Failures at 0, 10, 20, 30, 40; now 50: the one at 0 leaves at 60.
        assert_eq!(l.check(ip), Err(Duration::from_secs(10)));
        assert_eq!(l.check(other), Ok(()), "per client");
        clock.advance(Duration::from_millis(9_500));
        assert_eq!(l.check(ip), Err(Duration::from_secs(1)));
        clock.advance(Duration::from_millis(500));
        assert_eq!(l.check(ip), Ok(()));
        // IPv6 clients count by /64.
        let a: Option<IpAddr> = Some("2001:db8:1:2::1".parse().unwrap());
        let b: Option<IpAddr> = Some("2001:db8:1:2::ffff".parse().unwrap());
        for _ in 0..5 {
            l.failed(a);
        }
        assert!(l.check(b).is_err());
    }

    #[test]
    fn the_bearer_table_has_its_own_limit_and_bounded_memory() {
        let clock = Arc::new(ManualClock::at_millis(0));
        let l = FailureLimiter::bearers(clock.clone());
        let ip: Option<IpAddr> = Some("198.51.100.1".parse().unwrap());
        for _ in 0..BEARER_FAILURES_PER_MINUTE {
            assert_eq!(l.check(ip), Ok(()));
            l.failed(ip);
        }
        assert_eq!(l.check(ip), Err(Duration::from_secs(60)));
        // A flood of addresses: the table stays at its cap, each queue at the limit.
        for i in 0..(MAX_TRACKED as u32 + 500) {
            l.failed(Some(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i))));
        }
        let map = l.failures.lock().unwrap();
        assert!(map.len() <= MAX_TRACKED + 1, "{}", map.len());
        assert!(map.values().all(|q| q.len() <= BEARER_FAILURES_PER_MINUTE));
    }
}
