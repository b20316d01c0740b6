//! Card declines and the card networks' reattempt rules.
//!
//! # Why declines are not "permanent"
//! A decline is the PSP working as designed: the issuer said no. What may follow is set by
//! the card networks, and reattempting against their advice is charged per attempt:
//!
//! - **Visa** (excessive reattempts): every decline carries a *category*. Category 1
//!   ("issuer will never approve") must never be reattempted; categories 2–4 (cannot
//!   approve now; data quality; generic) may be reattempted at most 15 times in 30 days for
//!   the same card and merchant.
//! - **Mastercard** (Merchant Advice Codes, excessive-attempt programme): 01 new account
//!   information, 02 try again later, 03 do not try again, 04 token requirements not met,
//!   21 payment cancellation (recurring stopped), 24–30 retry after 1 h, 24 h, 2, 4, 6, 8,
//!   10 days; and per-card thresholds (10 declined attempts in a rolling 24 h, 35 in 30 days).
//!
//! A handler (or the `http` kind's response mapping) returns
//! [`Outcome::Declined`](crate::Outcome::Declined) with the [`DeclineAdvice`] the PSP passed
//! through; [`DeclineAdvice::rule`] reads it as one [`DeclineRule`], and
//! [`RetryPolicy::decide`](crate::RetryPolicy::decide) turns the rule into an action (see the
//! rows of the decision table there). The per-card quotas ([`QuotaRules`]) are counted
//! fleet-wide by the store; [`RetryPolicy::decide_quota`](crate::RetryPolicy::decide_quota)
//! decides what a job whose card's quota is used up does.
//!
//! ```
//! use std::time::Duration;
//! use redrive_policy::{DeclineAdvice, DeclineRule, Network};
//!
//! let never = DeclineAdvice::visa("05", Some(1)).unwrap();
//! assert_eq!(never.rule(), DeclineRule::NeverRetry);
//! let wait = DeclineAdvice::mastercard("51", Some(25)).unwrap();
//! assert_eq!(wait.rule(), DeclineRule::RetryAfter(Duration::from_secs(24 * 3600)));
//! // Visa's category follows from the response code when the PSP does not send it.
//! assert_eq!(DeclineAdvice::visa("14", None).unwrap().rule(), DeclineRule::NeverRetry);
//! assert_eq!(never.network(), Network::Visa);
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::PolicyError;
use crate::reason::ParseNameError;
use crate::{Timestamp, format_duration, parse_duration};

/// The card network of a decline.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// Visa.
    Visa,
    /// Mastercard.
    Mastercard,
    /// American Express.
    Amex,
    /// Discover.
    Discover,
    /// Any other network, or one the PSP did not name.
    Other,
}

impl Network {
    /// Every network, in declaration order.
    pub const ALL: &'static [Network] = &[
        Network::Visa,
        Network::Mastercard,
        Network::Amex,
        Network::Discover,
        Network::Other,
    ];

    /// The stable snake_case name (stored, labelled, returned by the API).
    pub const fn as_str(self) -> &'static str {
        match self {
            Network::Visa => "visa",
            Network::Mastercard => "mastercard",
            Network::Amex => "amex",
            Network::Discover => "discover",
            Network::Other => "other",
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Network {
    type Err = ParseNameError;
    /// Also accepts the spellings PSPs use: `mc`, `master`, `american_express`, any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s
            .trim()
            .to_ascii_lowercase()
            .replace([' ', '-'], "_")
            .as_str()
        {
            "visa" => Ok(Network::Visa),
            "mastercard" | "mc" | "master" | "master_card" => Ok(Network::Mastercard),
            "amex" | "american_express" | "americanexpress" => Ok(Network::Amex),
            "discover" => Ok(Network::Discover),
            "other" | "unknown" => Ok(Network::Other),
            _ => Err(ParseNameError {
                what: "network",
                value: s.to_owned(),
                expected: "visa, mastercard, amex, discover, other",
            }),
        }
    }
}

/// An issuer response code: 1 to 4 ASCII letters or digits (`05`, `R0`, `N7`), upper-cased.
///
/// Kept inline so that [`DeclineAdvice`] (and [`crate::Outcome`]) stay `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResponseCode {
    bytes: [u8; 4],
    len: u8,
}

impl ResponseCode {
    /// The code.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] (`response_code`) for an empty code, more than 4
    /// characters, or anything but ASCII letters and digits.
    pub fn new(code: &str) -> Result<Self, PolicyError> {
        let code = code.trim();
        if code.is_empty() || code.len() > 4 || !code.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(PolicyError::invalid(
                "response_code",
                format!("{code:?}"),
                "1 to 4 ASCII letters or digits",
            ));
        }
        let mut bytes = [0u8; 4];
        for (i, b) in code.bytes().enumerate() {
            bytes[i] = b.to_ascii_uppercase();
        }
        Ok(Self {
            bytes,
            len: code.len() as u8,
        })
    }

    /// The code as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII alphanumerics are ever stored.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Debug for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl fmt::Display for ResponseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the network said about a decline, as the PSP passed it through.
///
/// Built by [`DeclineAdvice::new`] (or [`DeclineAdvice::visa`], [`DeclineAdvice::mastercard`],
/// [`DeclineAdvice::unknown`]), which check the category and the advice code; the fields are
/// private, so a category of 5 or an advice code of 0 cannot exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeclineAdvice {
    /// The card network.
    network: Network,
    /// The issuer's response code, if the PSP gave one.
    code: Option<ResponseCode>,
    /// Visa's decline category (1–4), given or derived from the response code.
    category: Option<u8>,
    /// Mastercard's Merchant Advice Code (1–99), if any.
    advice_code: Option<u8>,
}

/// Visa category 1 response codes ("issuer will never approve"): 04, 07, 12, 14, 15, 41, 43,
/// 46, 57, R0, R1, R3.
pub const VISA_CATEGORY_1: &[&str] = &[
    "04", "07", "12", "14", "15", "41", "43", "46", "57", "R0", "R1", "R3",
];
/// Visa category 2 response codes ("issuer cannot approve at this time"): 03, 19, 39, 51,
/// 52, 53, 59, 61, 62, 65, 75, 78, 86, 91, 93, 96, N3, N4.
pub const VISA_CATEGORY_2: &[&str] = &[
    "03", "19", "39", "51", "52", "53", "59", "61", "62", "65", "75", "78", "86", "91", "93", "96",
    "N3", "N4",
];
/// Visa category 3 response codes ("data quality": correct the data before reattempting):
/// 54, 55, 6P, 70, 82, 1A, N7.
pub const VISA_CATEGORY_3: &[&str] = &["54", "55", "6P", "70", "82", "1A", "N7"];

/// Visa's decline category of a response code: 1, 2 or 3 from the tables above, 4 (generic)
/// for every other decline code.
pub fn visa_category_of(code: &str) -> u8 {
    let code = code.trim().to_ascii_uppercase();
    let code = code.as_str();
    if VISA_CATEGORY_1.contains(&code) {
        1
    } else if VISA_CATEGORY_2.contains(&code) {
        2
    } else if VISA_CATEGORY_3.contains(&code) {
        3
    } else {
        4
    }
}

/// The wait a Mastercard Merchant Advice Code 24–30 asks for: 1 h, 24 h, 2, 4, 6, 8, 10 days.
pub fn mac_wait(advice_code: u8) -> Option<Duration> {
    let h = |n: u64| Duration::from_secs(n * 3600);
    match advice_code {
        24 => Some(h(1)),
        25 => Some(h(24)),
        26 => Some(h(48)),
        27 => Some(h(96)),
        28 => Some(h(144)),
        29 => Some(h(192)),
        30 => Some(h(240)),
        _ => None,
    }
}

impl DeclineAdvice {
    /// A decline of `network` with whatever the PSP passed through.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `response_code`, `category` (1–4) or
    /// `advice_code` (1–99).
    pub fn new(
        network: Network,
        code: Option<&str>,
        category: Option<u8>,
        advice_code: Option<u8>,
    ) -> Result<Self, PolicyError> {
        let code = code.map(ResponseCode::new).transpose()?;
        if let Some(c) = category
            && !(1..=4).contains(&c)
        {
            return Err(PolicyError::invalid("category", c.to_string(), "1 to 4"));
        }
        if let Some(m) = advice_code
            && !(1..=99).contains(&m)
        {
            return Err(PolicyError::invalid(
                "advice_code",
                m.to_string(),
                "1 to 99",
            ));
        }
        Ok(Self {
            network,
            code,
            category,
            advice_code,
        })
    }

    /// A decline of `network` with no advice at all (no code, category or advice code): the
    /// networks' default, "retry later".
    pub const fn unknown(network: Network) -> Self {
        Self {
            network,
            code: None,
            category: None,
            advice_code: None,
        }
    }

    /// The card network.
    pub const fn network(&self) -> Network {
        self.network
    }

    /// The issuer's response code, if the PSP gave one.
    pub const fn code(&self) -> Option<ResponseCode> {
        self.code
    }

    /// Visa's decline category (1–4) as given (see [`DeclineAdvice::effective_category`]).
    pub const fn category(&self) -> Option<u8> {
        self.category
    }

    /// Mastercard's Merchant Advice Code (1–99), if any.
    pub const fn advice_code(&self) -> Option<u8> {
        self.advice_code
    }

    /// A Visa decline; without a category it is derived from the code ([`visa_category_of`]).
    ///
    /// # Errors
    /// As [`DeclineAdvice::new`].
    pub fn visa(code: &str, category: Option<u8>) -> Result<Self, PolicyError> {
        let category = category.or_else(|| Some(visa_category_of(code)));
        Self::new(Network::Visa, Some(code), category, None)
    }

    /// A Mastercard decline with its Merchant Advice Code, if any.
    ///
    /// # Errors
    /// As [`DeclineAdvice::new`].
    pub fn mastercard(code: &str, advice_code: Option<u8>) -> Result<Self, PolicyError> {
        Self::new(Network::Mastercard, Some(code), None, advice_code)
    }

    /// The Visa category that applies: the one given, else (for Visa) the code's.
    pub fn effective_category(&self) -> Option<u8> {
        self.category.or_else(|| match (self.network, &self.code) {
            (Network::Visa, Some(c)) => Some(visa_category_of(c.as_str())),
            _ => None,
        })
    }

    /// What the network allows after this decline. When the advice carries both a category
    /// and a Merchant Advice Code, the stricter rule wins.
    pub fn rule(&self) -> DeclineRule {
        let by_mac = self.advice_code.and_then(|m| match m {
            1 | 4 => Some(DeclineRule::UpdatePaymentMethod),
            2 => Some(DeclineRule::RetryLater),
            3 => Some(DeclineRule::NeverRetry),
            21 => Some(DeclineRule::RecurringStopped),
            m => mac_wait(m).map(DeclineRule::RetryAfter),
        });
        let by_category = self.effective_category().map(|c| match c {
            1 => DeclineRule::NeverRetry,
            3 => DeclineRule::UpdatePaymentMethod,
            _ => DeclineRule::RetryLater,
        });
        match (by_mac, by_category) {
            (Some(a), Some(b)) => a.stricter(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => DeclineRule::RetryLater,
        }
    }

    /// Whether this decline stops the card, not only the job: Visa category 1 and Mastercard
    /// MAC 03 (never reattempt) and MAC 21 (recurring stopped) apply to every later attempt
    /// on the card at this merchant, which the networks charge for
    /// ([`QuotaRules::card_stop`] says for how long).
    pub fn stops_card(&self) -> bool {
        matches!(
            self.rule(),
            DeclineRule::NeverRetry | DeclineRule::RecurringStopped
        )
    }

    /// A short text for logs, attempts and `redrive show`: `visa 05 cat 1`, `mastercard 51 mac 25`.
    pub fn describe(&self) -> String {
        let mut s = self.network.as_str().to_owned();
        if let Some(c) = &self.code {
            s.push(' ');
            s.push_str(c.as_str());
        }
        if let Some(c) = self.category {
            s.push_str(&format!(" cat {c}"));
        }
        if let Some(m) = self.advice_code {
            s.push_str(&format!(" mac {m:02}"));
        }
        s
    }
}

/// What the networks allow after a decline (a row of the decision table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeclineRule {
    /// Visa category 1, Mastercard MAC 03: never reattempt (dead `do_not_retry`).
    NeverRetry,
    /// Mastercard MAC 24–30: reattempt not before this wait (deferred exactly that long).
    RetryAfter(Duration),
    /// Visa categories 2 and 4, Mastercard MAC 02, and a decline without advice: reattempt
    /// later (deferred by the policy's `decline_retry_later`), within the card's quota.
    RetryLater,
    /// Visa category 3, Mastercard MAC 01 and 04: only with corrected payment data (dead
    /// `update_payment_method` unless a handler supplies new data and enqueues again).
    UpdatePaymentMethod,
    /// Mastercard MAC 21: the cardholder stopped the recurring payment (dead
    /// `recurring_stopped`).
    RecurringStopped,
}

impl DeclineRule {
    fn strictness(self) -> u8 {
        match self {
            DeclineRule::RetryLater => 0,
            DeclineRule::RetryAfter(_) => 1,
            DeclineRule::UpdatePaymentMethod => 2,
            DeclineRule::NeverRetry => 3,
            DeclineRule::RecurringStopped => 4,
        }
    }

    /// The stricter of two rules (the longer wait of two `RetryAfter`).
    pub fn stricter(self, other: DeclineRule) -> DeclineRule {
        match (self, other) {
            (DeclineRule::RetryAfter(a), DeclineRule::RetryAfter(b)) => {
                DeclineRule::RetryAfter(a.max(b))
            }
            (a, b) if b.strictness() > a.strictness() => b,
            (a, _) => a,
        }
    }

    /// The stable name of the rule (`never_retry`, `retry_after`, `retry_later`,
    /// `update_payment_method`, `recurring_stopped`).
    pub const fn as_str(self) -> &'static str {
        match self {
            DeclineRule::NeverRetry => "never_retry",
            DeclineRule::RetryAfter(_) => "retry_after",
            DeclineRule::RetryLater => "retry_later",
            DeclineRule::UpdatePaymentMethod => "update_payment_method",
            DeclineRule::RecurringStopped => "recurring_stopped",
        }
    }
}

impl fmt::Display for DeclineRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeclineRule::RetryAfter(d) => write!(f, "retry_after {}", format_duration(*d)),
            other => f.write_str(other.as_str()),
        }
    }
}

/// The rows of the decline part of the decision table, for `redrive policy show` and the
/// docs: (advice, rule, what happens, the network rule it implements).
pub const DECLINE_ROWS: &[(&str, &str, &str, &str)] = &[
    (
        "visa category 1",
        "never_retry",
        "dead do_not_retry after one attempt",
        "Visa excessive reattempts: category 1, issuer will never approve",
    ),
    (
        "mastercard MAC 03",
        "never_retry",
        "dead do_not_retry after one attempt",
        "Mastercard MAC 03: do not try again",
    ),
    (
        "mastercard MAC 24-30",
        "retry_after",
        "deferred exactly 1h/24h/2d/4d/6d/8d/10d (reason decline_advice), then one attempt",
        "Mastercard MAC 24-30: retry after the advised wait",
    ),
    (
        "visa category 2, 4; MAC 02; no advice",
        "retry_later",
        "deferred decline_retry_later (reason decline_advice), within the card's quota",
        "Visa categories 2/4: at most 15 reattempts in 30 days; MAC 02: try again later",
    ),
    (
        "visa category 3; MAC 01, 04",
        "update_payment_method",
        "dead update_payment_method",
        "Visa category 3: data quality; MAC 01: new account information; MAC 04: token requirements",
    ),
    (
        "mastercard MAC 21",
        "recurring_stopped",
        "dead recurring_stopped",
        "Mastercard MAC 21: payment cancellation, recurring stopped",
    ),
    (
        "card stopped (another job's visa category 1, MAC 03, MAC 21)",
        "card_stop",
        "dead card_stopped, no call (declines.card_stop = \"wait\": deferred until the stop ends); redrive quota lift KEY ends it",
        "Visa category 1, MAC 03/21: further attempts on the card are charged for 30 days",
    ),
    (
        "quota used up",
        "reattempt_quota",
        "deferred until the oldest reattempt leaves the window (reason reattempt_quota), or dead reattempt_quota past the deadline",
        "Visa 15 in 30 days; Mastercard 10 in 24h and 35 in 30 days (per card)",
    ),
];

// ===== quotas =====

/// One reattempt window of a network: at most `max` reattempts for one card within `window`.
///
/// Built by [`QuotaWindow::new`], which checks both fields; they are private.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaWindow {
    /// Reattempts allowed within the window (1 to [`MAX_QUOTA`]).
    max: u32,
    /// The rolling window (above 0 s, at most 365 days).
    window: Duration,
}

impl QuotaWindow {
    /// At most `max` reattempts per card within a rolling `window`.
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `max` (1 to [`MAX_QUOTA`]) or `window` (above 0 s,
    /// at most 365 days).
    pub fn new(max: u32, window: Duration) -> Result<Self, PolicyError> {
        if max == 0 || max > MAX_QUOTA {
            return Err(PolicyError::invalid(
                "max",
                max.to_string(),
                format!("from 1 to {MAX_QUOTA}"),
            ));
        }
        if window.is_zero() || window > crate::MAX_DEADLINE {
            return Err(PolicyError::invalid(
                "window",
                format_duration(window),
                "above 0s and at most 365 days",
            ));
        }
        Ok(Self { max, window })
    }

    /// Reattempts allowed within the window.
    pub const fn max(&self) -> u32 {
        self.max
    }

    /// The rolling window.
    pub const fn window(&self) -> Duration {
        self.window
    }
}

/// The most reattempts a quota window may allow.
pub const MAX_QUOTA: u32 = 100_000;

/// Per-network reattempt quotas for one card key, counted fleet-wide by the store.
///
/// # Default
/// - `visa`: 15 in 30 days (Visa's excessive reattempt rule for categories 2–4);
/// - `mastercard`: 10 in 24 h and 35 in 30 days (Mastercard's excessive-attempt programme);
/// - `amex`, `discover`, `other`: no quota.
///
/// # Card stops
/// A decline that stops the card ([`DeclineAdvice::stops_card`]: Visa category 1, Mastercard
/// MAC 03 and 21) blocks every other job of the same card key for its network's stop window
/// ([`QuotaRules::card_stop`]): by default 30 days for Visa and Mastercard (the window in
/// which both networks count further attempts on the card), none for the others. The
/// policies file sets them in `[quotas] card_stop = { visa = "30d", mastercard = "off" }`.
///
/// Every figure can be overridden in the policies file (`[quotas]`), because the networks
/// change them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaRules {
    rules: std::collections::BTreeMap<Network, Vec<QuotaWindow>>,
    stops: std::collections::BTreeMap<Network, Duration>,
}

/// The default card stop window after a Visa category 1 or Mastercard MAC 03/21 decline:
/// 30 days (Visa's excessive-reattempt rule and Mastercard's excessive-attempt programme both
/// count attempts on the card over 30 days).
pub const DEFAULT_CARD_STOP: Duration = Duration::from_secs(30 * 86_400);

impl Default for QuotaRules {
    fn default() -> Self {
        let d = |n: u64| Duration::from_secs(n * 86_400);
        let mut rules = std::collections::BTreeMap::new();
        rules.insert(
            Network::Visa,
            vec![QuotaWindow {
                max: 15,
                window: d(30),
            }],
        );
        rules.insert(
            Network::Mastercard,
            vec![
                QuotaWindow {
                    max: 10,
                    window: d(1),
                },
                QuotaWindow {
                    max: 35,
                    window: d(30),
                },
            ],
        );
        Self {
            rules,
            stops: Self::default_stops(),
        }
    }
}

impl QuotaRules {
    /// No quota for any network. The card stops keep their defaults (they are not a quota:
    /// [`QuotaRules::without_card_stops`] removes them).
    pub fn none() -> Self {
        Self {
            rules: Default::default(),
            stops: Self::default_stops(),
        }
    }

    fn default_stops() -> std::collections::BTreeMap<Network, Duration> {
        [
            (Network::Visa, DEFAULT_CARD_STOP),
            (Network::Mastercard, DEFAULT_CARD_STOP),
        ]
        .into_iter()
        .collect()
    }

    /// How long a decline that stops the card ([`DeclineAdvice::stops_card`]) blocks every
    /// other job of the card key, for a decline of `network`; `None`: no card stop.
    pub fn card_stop(&self, network: Network) -> Option<Duration> {
        self.stops.get(&network).copied()
    }

    /// Sets a network's card stop window (`None`: no card stop for it).
    ///
    /// # Errors
    /// [`PolicyError::InvalidField`] naming `card_stop` for a window of 0 s or above 365 days.
    pub fn with_card_stop(
        mut self,
        network: Network,
        window: Option<Duration>,
    ) -> Result<Self, PolicyError> {
        match window {
            Some(w) if w.is_zero() || w > crate::MAX_DEADLINE => Err(PolicyError::invalid(
                format!("card_stop.{network}"),
                format_duration(w),
                "above 0s and at most 365 days, or \"off\"",
            )),
            Some(w) => {
                self.stops.insert(network, w);
                Ok(self)
            }
            None => {
                self.stops.remove(&network);
                Ok(self)
            }
        }
    }

    /// No card stop for any network.
    pub fn without_card_stops(mut self) -> Self {
        self.stops.clear();
        self
    }

    /// Every network with a card stop, and its window.
    pub fn card_stops(&self) -> impl Iterator<Item = (Network, Duration)> + '_ {
        self.stops.iter().map(|(n, d)| (*n, *d))
    }

    /// Sets a network's windows (an empty list: no quota). Each window was checked by
    /// [`QuotaWindow::new`].
    pub fn with(mut self, network: Network, windows: Vec<QuotaWindow>) -> Self {
        self.rules.insert(network, windows);
        self
    }

    /// The windows of a network (empty: no quota).
    pub fn windows(&self, network: Network) -> &[QuotaWindow] {
        self.rules.get(&network).map_or(&[], Vec::as_slice)
    }

    /// Every network with its windows.
    pub fn iter(&self) -> impl Iterator<Item = (Network, &[QuotaWindow])> {
        self.rules.iter().map(|(n, w)| (*n, w.as_slice()))
    }

    /// Reads one `[{ max = 15, window = "30d" }]` list of the policies file.
    pub(crate) fn parse_windows(
        network: &str,
        raw: &[(i64, String)],
    ) -> Result<Vec<QuotaWindow>, PolicyError> {
        raw.iter()
            .enumerate()
            .map(|(i, (max, window))| {
                if *max < 1 || *max > i64::from(MAX_QUOTA) {
                    return Err(PolicyError::invalid(
                        format!("{network}[{i}].max"),
                        max.to_string(),
                        format!("from 1 to {MAX_QUOTA}"),
                    ));
                }
                let w = parse_duration(window).map_err(|e| {
                    PolicyError::invalid(
                        format!("{network}[{i}].window"),
                        format!("{window:?}"),
                        e.expected(),
                    )
                })?;
                QuotaWindow::new(*max as u32, w).map_err(|e| e.within(&format!("{network}[{i}]")))
            })
            .collect()
    }
}

/// A quota check's answer when the card's reattempts are used up: the earliest instant a
/// reattempt fits again (when the oldest counted reattempt leaves its window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExhausted {
    /// When the next reattempt fits.
    pub until: Timestamp,
    /// The window that is full.
    pub window: QuotaWindow,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visa_codes_have_their_categories() {
        for c in VISA_CATEGORY_1 {
            assert_eq!(visa_category_of(c), 1, "{c}");
        }
        for c in VISA_CATEGORY_2 {
            assert_eq!(visa_category_of(c), 2, "{c}");
        }
        for c in VISA_CATEGORY_3 {
            assert_eq!(visa_category_of(c), 3, "{c}");
        }
        assert_eq!(visa_category_of("05"), 4);
        assert_eq!(visa_category_of("r0"), 1);
    }

    #[test]
    fn every_rule_row_exactly() {
        use DeclineRule::*;
        let h = |n: u64| Duration::from_secs(n * 3600);
        let v = |cat| DeclineAdvice::new(Network::Visa, Some("05"), Some(cat), None).unwrap();
        let mc = |m| DeclineAdvice::mastercard("05", Some(m)).unwrap();
        assert_eq!(v(1).rule(), NeverRetry);
        assert_eq!(v(2).rule(), RetryLater);
        assert_eq!(v(3).rule(), UpdatePaymentMethod);
        assert_eq!(v(4).rule(), RetryLater);
        assert_eq!(mc(1).rule(), UpdatePaymentMethod);
        assert_eq!(mc(2).rule(), RetryLater);
        assert_eq!(mc(3).rule(), NeverRetry);
        assert_eq!(mc(4).rule(), UpdatePaymentMethod);
        assert_eq!(mc(21).rule(), RecurringStopped);
        let waits = [1, 24, 48, 96, 144, 192, 240];
        for (m, hours) in (24..=30).zip(waits) {
            assert_eq!(mc(m).rule(), RetryAfter(h(hours)), "MAC {m}");
        }
        // An unknown MAC and no category: retry later.
        assert_eq!(mc(40).rule(), RetryLater);
        assert_eq!(
            DeclineAdvice::new(Network::Other, None, None, None)
                .unwrap()
                .rule(),
            RetryLater
        );
        // Both given: the stricter wins.
        let both = DeclineAdvice::new(Network::Visa, Some("51"), Some(1), Some(24)).unwrap();
        assert_eq!(both.rule(), NeverRetry);
        let both = DeclineAdvice::new(Network::Visa, Some("51"), Some(2), Some(25)).unwrap();
        assert_eq!(both.rule(), RetryAfter(h(24)));
    }

    #[test]
    fn bad_advice_names_the_field() {
        let e = DeclineAdvice::new(Network::Visa, None, Some(5), None).unwrap_err();
        assert!(e.to_string().contains("category = 5"), "{e}");
        let e = DeclineAdvice::new(Network::Visa, None, None, Some(0)).unwrap_err();
        assert!(e.to_string().contains("advice_code = 0"), "{e}");
        let e = DeclineAdvice::visa("05!", None).unwrap_err();
        assert!(e.to_string().contains("response_code"), "{e}");
        let e = QuotaWindow::new(0, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.to_string(), "invalid max = 0: must be from 1 to 100000");
        let e = QuotaWindow::new(MAX_QUOTA + 1, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().starts_with("invalid max = 100001"), "{e}");
        for w in [Duration::ZERO, crate::MAX_DEADLINE + Duration::from_secs(1)] {
            let e = QuotaWindow::new(1, w).unwrap_err();
            assert!(e.to_string().starts_with("invalid window = "), "{e}");
        }
        let ok = QuotaWindow::new(MAX_QUOTA, crate::MAX_DEADLINE).unwrap();
        assert_eq!((ok.max(), ok.window()), (MAX_QUOTA, crate::MAX_DEADLINE));
        let e = QuotaRules::parse_windows("visa", &[(0, "1s".into())]).unwrap_err();
        assert!(e.to_string().contains("visa[0].max = 0"), "{e}");
        let e = QuotaRules::parse_windows("visa", &[(2, "0s".into())]).unwrap_err();
        assert!(e.to_string().contains("visa[0].window = "), "{e}");
    }

    #[test]
    fn default_quotas_are_the_published_figures() {
        let q = QuotaRules::default();
        assert_eq!(
            q.windows(Network::Visa),
            &[QuotaWindow::new(15, Duration::from_secs(30 * 86_400)).unwrap()]
        );
        assert_eq!(q.windows(Network::Mastercard).len(), 2);
        assert_eq!(q.windows(Network::Mastercard)[0].max(), 10);
        assert_eq!(q.windows(Network::Mastercard)[1].max(), 35);
        assert!(q.windows(Network::Amex).is_empty());
        assert_eq!(q.card_stop(Network::Visa), Some(DEFAULT_CARD_STOP));
        assert_eq!(q.card_stop(Network::Mastercard), Some(DEFAULT_CARD_STOP));
        assert_eq!(q.card_stop(Network::Amex), None);
    }

    #[test]
    fn only_category_1_mac_03_and_21_stop_the_card() {
        let v = |cat| DeclineAdvice::new(Network::Visa, Some("05"), Some(cat), None).unwrap();
        let mc = |m| DeclineAdvice::mastercard("05", Some(m)).unwrap();
        assert!(v(1).stops_card());
        assert!(mc(3).stops_card() && mc(21).stops_card());
        for a in [v(2), v(3), v(4), mc(1), mc(2), mc(4), mc(24), mc(30)] {
            assert!(!a.stops_card(), "{}", a.describe());
        }
        // Derived from the response code (14: category 1).
        assert!(DeclineAdvice::visa("14", None).unwrap().stops_card());
        let q = QuotaRules::default()
            .with_card_stop(Network::Visa, None)
            .unwrap()
            .with_card_stop(Network::Amex, Some(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(q.card_stop(Network::Visa), None);
        assert_eq!(q.card_stop(Network::Amex), Some(Duration::from_secs(60)));
        let e = QuotaRules::default()
            .with_card_stop(Network::Visa, Some(Duration::ZERO))
            .unwrap_err();
        assert!(e.to_string().contains("card_stop.visa = 0ms"), "{e}");
    }

    #[test]
    fn networks_parse_psp_spellings() {
        assert_eq!("MC".parse::<Network>().unwrap(), Network::Mastercard);
        assert_eq!(
            "American Express".parse::<Network>().unwrap(),
            Network::Amex
        );
        assert!("diners".parse::<Network>().is_err());
        assert_eq!(
            DeclineAdvice::mastercard("51", Some(25))
                .unwrap()
                .describe(),
            "mastercard 51 mac 25"
        );
    }
}
