//! Card declines: the mix of declines the simulator answers with, and the book that checks
//! every reattempt against the card networks' rules.
//!
//! A charge request names its card in the body's `card` field (a card fingerprint or
//! payment-method id, the same value a redrive job carries as `quota_key`) and its
//! transaction in `reference` (without one, the `Idempotency-Key` is the transaction; without
//! a card, the transaction stands for the card). An authorisation of a transaction that was
//! declined before is a **reattempt**, whatever its key (redrive's `http` kind sends
//! `KEY-rN` after N declines). The ledger keeps no decline under its key, but the
//! idempotency layer in front (`redrive psp-sim` runs one) stores the 402 like any 4xx, so a
//! same-key repeat is answered the stored decline and never reaches the issuer.
//!
//! A reattempt is a violation ([`Stats::reattempt_violations`](crate::Stats)) when it
//! follows a decline that must never be reattempted (Visa category 1, Mastercard MAC 03 or
//! 21), when it comes before a Mastercard MAC 24–30 wait is over, or when the card's
//! reattempts in a window of its network's quota exceed the quota's `max`. The rules are the
//! simulator's own ([`crate::judge`]: written apart from redrive's, the networks' figures by
//! default), so a wrong rule in the client shows as violations here.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use redrive_policy::{DeclineAdvice, Network};

use crate::judge::{After, JudgeRules};

use crate::faults::FaultsError;

/// One kind of decline the simulator can answer with, named as in `--decline-mix`:
/// `visa1`–`visa4` (Visa categories), `mc01`, `mc02`, `mc03`, `mc04`, `mc21`, `mc24`–`mc30`
/// (Mastercard Merchant Advice Codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeclineKind {
    /// A Visa decline of this category (1–4).
    Visa(u8),
    /// A Mastercard decline with this Merchant Advice Code.
    Mastercard(u8),
}

const MACS: &[u8] = &[1, 2, 3, 4, 21, 24, 25, 26, 27, 28, 29, 30];

impl DeclineKind {
    /// Reads `visa2`, `mc24`, `mc03`.
    ///
    /// # Errors
    /// [`FaultsError::Invalid`] for field `decline_mix`.
    pub fn parse(s: &str) -> Result<Self, FaultsError> {
        let bad = || FaultsError::Invalid {
            field: "decline_mix".into(),
            value: format!("{s:?}"),
            allowed: "visa1..visa4, mc01, mc02, mc03, mc04, mc21, mc24..mc30".into(),
        };
        let s = s.trim().to_ascii_lowercase();
        if let Some(c) = s.strip_prefix("visa") {
            let c: u8 = c.parse().map_err(|_| bad())?;
            return (1..=4)
                .contains(&c)
                .then_some(DeclineKind::Visa(c))
                .ok_or_else(bad);
        }
        if let Some(m) = s.strip_prefix("mc") {
            let m: u8 = m.parse().map_err(|_| bad())?;
            return MACS
                .contains(&m)
                .then_some(DeclineKind::Mastercard(m))
                .ok_or_else(bad);
        }
        Err(bad())
    }

    /// The network.
    pub fn network(self) -> Network {
        match self {
            DeclineKind::Visa(_) => Network::Visa,
            DeclineKind::Mastercard(_) => Network::Mastercard,
        }
    }

    /// The issuer response code sent with it: Visa 14 (cat 1), 51 (cat 2), 54 (cat 3), 05
    /// (cat 4); Mastercard 05 (51 for MAC 02 and 24–30).
    pub fn response_code(self) -> &'static str {
        match self {
            DeclineKind::Visa(1) => "14",
            DeclineKind::Visa(2) => "51",
            DeclineKind::Visa(3) => "54",
            DeclineKind::Visa(_) => "05",
            DeclineKind::Mastercard(2 | 24..=30) => "51",
            DeclineKind::Mastercard(_) => "05",
        }
    }

    /// The advice as redrive reads it.
    pub fn advice(self) -> DeclineAdvice {
        let (category, mac) = match self {
            DeclineKind::Visa(c) => (Some(c), None),
            DeclineKind::Mastercard(m) => (None, Some(m)),
        };
        DeclineAdvice::new(self.network(), Some(self.response_code()), category, mac)
            .expect("the simulator's kinds are valid advice")
    }
}

impl fmt::Display for DeclineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeclineKind::Visa(c) => write!(f, "visa{c}"),
            DeclineKind::Mastercard(m) => write!(f, "mc{m:02}"),
        }
    }
}

/// Reads `visa1:0.2,visa2:0.5,mc24:0.3` (weights, normalised; at least one above 0).
///
/// # Errors
/// [`FaultsError::Invalid`] for field `decline_mix`.
pub fn parse_decline_mix(s: &str) -> Result<Vec<(DeclineKind, f64)>, FaultsError> {
    let bad = |v: &str| FaultsError::Invalid {
        field: "decline_mix".into(),
        value: format!("{v:?}"),
        allowed: "KIND:WEIGHT,... e.g. visa1:0.2,visa2:0.5,mc24:0.3".into(),
    };
    let mut mix = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, w) = part.split_once(':').ok_or_else(|| bad(part))?;
        let w: f64 = w.trim().parse().map_err(|_| bad(part))?;
        if !w.is_finite() || w < 0.0 {
            return Err(bad(part));
        }
        mix.push((DeclineKind::parse(k)?, w));
    }
    check_mix(&mix)?;
    Ok(mix)
}

pub(crate) fn check_mix(mix: &[(DeclineKind, f64)]) -> Result<(), FaultsError> {
    if !mix.is_empty() && mix.iter().map(|(_, w)| w).sum::<f64>() <= 0.0 {
        return Err(FaultsError::Invalid {
            field: "decline_mix".into(),
            value: "all weights 0".into(),
            allowed: "at least one weight above 0".into(),
        });
    }
    Ok(())
}

/// The `decline_mix` written back as `visa1:0.2,...`.
pub fn mix_text(mix: &[(DeclineKind, f64)]) -> String {
    mix.iter()
        .map(|(k, w)| format!("{k}:{w}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Draws a kind from `mix` with `u` uniform in [0, 1); `visa2` for an empty mix.
pub(crate) fn pick(mix: &[(DeclineKind, f64)], u: f64) -> DeclineKind {
    let total: f64 = mix.iter().map(|(_, w)| w).sum();
    let mut x = u * total;
    for (k, w) in mix {
        if x < *w {
            return *k;
        }
        x -= w;
    }
    mix.iter()
        .rev()
        .find(|(_, w)| *w > 0.0)
        .map_or(DeclineKind::Visa(2), |(k, _)| *k)
}

/// What the book says about one authorisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Violation {
    /// A reattempt after a never-retry decline.
    NeverRetry,
    /// A reattempt before a MAC wait was over.
    Early,
    /// More reattempts of the card in a window than its quota.
    Quota,
}

/// Every authorisation by key and card: the last decline of each key, the reattempts of each
/// card, and the violations.
#[derive(Debug, Default)]
pub(crate) struct DeclineBook {
    rules: JudgeRules,
    last: HashMap<String, (DeclineKind, Duration)>,
    reattempts: HashMap<String, VecDeque<Duration>>,
    pub(crate) by_code: BTreeMap<String, u64>,
    pub(crate) violations: u64,
    pub(crate) violations_by_card: BTreeMap<String, u64>,
    pub(crate) reattempts_total: u64,
    /// Cards stopped by a never-retry decline: the transaction that stopped it, and until when.
    stopped: HashMap<String, (String, Duration)>,
    pub(crate) card_stop_attempts: u64,
    pub(crate) card_stop_attempts_by_card: BTreeMap<String, u64>,
}

impl DeclineBook {
    pub(crate) fn rules(&self) -> &JudgeRules {
        &self.rules
    }

    pub(crate) fn new(rules: JudgeRules) -> Self {
        DeclineBook {
            rules,
            ..DeclineBook::default()
        }
    }

    /// An authorisation of `key` for `card` at `now`: checked if it is a reattempt, then
    /// recorded with its answer (`declined`: the decline it got, `None`: approved).
    pub(crate) fn authorise(
        &mut self,
        key: &str,
        card: &str,
        now: Duration,
        declined: Option<DeclineKind>,
    ) -> Vec<Violation> {
        let mut found = Vec::new();
        if let Some((by, until)) = self.stopped.get(card)
            && by != key
            && now < *until
        {
            self.card_stop_attempts += 1;
            *self
                .card_stop_attempts_by_card
                .entry(card.to_owned())
                .or_default() += 1;
        }
        if let Some((prev, at)) = self.last.get(key).copied() {
            self.reattempts_total += 1;
            match self.rules.after(prev) {
                After::Never => found.push(Violation::NeverRetry),
                After::Wait(wait) if now < at + wait => found.push(Violation::Early),
                _ => {}
            }
            let windows = self.rules.windows(JudgeRules::network(prev)).to_vec();
            let longest = windows.iter().map(|w| w.within).max().unwrap_or_default();
            let times = self.reattempts.entry(card.to_owned()).or_default();
            times.push_back(now);
            while times
                .front()
                .is_some_and(|t| now.saturating_sub(*t) >= longest)
            {
                times.pop_front();
            }
            for w in &windows {
                let n = times
                    .iter()
                    .filter(|t| now.saturating_sub(**t) < w.within)
                    .count();
                if n > w.max as usize {
                    found.push(Violation::Quota);
                    break;
                }
            }
        }
        match declined {
            Some(k) => {
                *self.by_code.entry(k.to_string()).or_default() += 1;
                self.last.insert(key.to_owned(), (k, now));
                if self.rules.after(k) == After::Never
                    && let Some(w) = self.rules.card_stop(JudgeRules::network(k))
                {
                    self.stopped
                        .insert(card.to_owned(), (key.to_owned(), now + w));
                }
            }
            None => {
                self.last.remove(key);
            }
        }
        if !found.is_empty() {
            self.violations += found.len() as u64;
            *self.violations_by_card.entry(card.to_owned()).or_default() += found.len() as u64;
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::{CardNetwork, ReattemptWindow};

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_mix_parses_and_names_the_field() {
        let m = parse_decline_mix("visa1:0.2,visa2:0.5,mc24:0.3").unwrap();
        assert_eq!(
            m,
            vec![
                (DeclineKind::Visa(1), 0.2),
                (DeclineKind::Visa(2), 0.5),
                (DeclineKind::Mastercard(24), 0.3)
            ]
        );
        assert_eq!(mix_text(&m), "visa1:0.2,visa2:0.5,mc24:0.3");
        for bad in [
            "visa5:1", "mc22:1", "amex1:1", "visa1", "visa1:-1", "visa1:0",
        ] {
            let e = parse_decline_mix(bad).unwrap_err();
            assert_eq!(e.field(), "decline_mix", "{bad}");
        }
        assert_eq!(pick(&m, 0.0), DeclineKind::Visa(1));
        assert_eq!(pick(&m, 0.69), DeclineKind::Visa(2));
        assert_eq!(pick(&m, 0.99), DeclineKind::Mastercard(24));
    }

    #[test]
    fn every_violation_is_caught_and_a_fair_reattempt_is_not() {
        let q = JudgeRules::default().with_windows(
            CardNetwork::Visa,
            vec![ReattemptWindow {
                max: 2,
                within: s(100),
            }],
        );
        let mut b = DeclineBook::new(q);
        // A first attempt is not a reattempt.
        assert!(
            b.authorise("k1", "c", s(0), Some(DeclineKind::Visa(1)))
                .is_empty()
        );
        assert_eq!(
            b.authorise("k1", "c", s(1), Some(DeclineKind::Visa(1))),
            [Violation::NeverRetry]
        );
        assert!(
            b.authorise("k2", "c", s(0), Some(DeclineKind::Mastercard(24)))
                .is_empty()
        );
        assert_eq!(b.authorise("k2", "c", s(3599), None), [Violation::Early]);
        assert!(
            b.authorise("k3", "d", s(0), Some(DeclineKind::Mastercard(24)))
                .is_empty()
        );
        assert!(b.authorise("k3", "d", s(3600), None).is_empty());
        // Quota: 2 visa reattempts of card e per 100 s.
        b.authorise("k4", "e", s(0), Some(DeclineKind::Visa(2)));
        assert!(
            b.authorise("k4", "e", s(10), Some(DeclineKind::Visa(2)))
                .is_empty()
        );
        assert!(
            b.authorise("k4", "e", s(20), Some(DeclineKind::Visa(2)))
                .is_empty()
        );
        assert_eq!(
            b.authorise("k4", "e", s(30), Some(DeclineKind::Visa(2))),
            [Violation::Quota]
        );
        // Once 10 and 20 have left the window: room again (30 and 125 in it).
        assert!(b.authorise("k4", "e", s(125), None).is_empty());
        assert_eq!(b.violations, 3);
        assert_eq!(b.violations_by_card.get("e"), Some(&1));
        // Card c was stopped by k1's category 1: k2's two authorisations on it are counted
        // apart (not k1's own reattempt, a violation above), and so is another's.
        assert_eq!(b.card_stop_attempts, 2);
        assert!(b.authorise("k9", "c", s(2), None).is_empty());
        assert_eq!(b.card_stop_attempts_by_card.get("c"), Some(&3));
        // Card d (MAC 24, not a stop) is not; nor card c after its 30 days.
        assert!(b.authorise("k8", "d", s(2), None).is_empty());
        assert!(b.authorise("k7", "c", s(31 * 86_400), None).is_empty());
        assert_eq!(b.card_stop_attempts, 3);
        assert_eq!(b.by_code.get("visa2"), Some(&4));
    }
}
