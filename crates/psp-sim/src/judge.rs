//! The simulator's own judge of the card networks' reattempt rules.
//!
//! Written apart from the code it judges: nothing here comes from `redrive-policy` (no type,
//! function or constant), so a wrong row or a wrong quota in the worker's table cannot pass
//! by being the judge's table too. The rows read the simulator's own [`DeclineKind`]s; every
//! row names its source and the date it took effect, and a rule that changed keeps its old
//! row: [`JudgeRules::as_of`] picks the rows in force on a date.
//!
//! Dates: where the source gives one it is copied; "not given" says the source gives none. The
//! rows were written from the sources named, not re-read at the networks (their bulletins are
//! not public): check them against your acquirer's notice before relying on a figure.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::NaiveDate;

use crate::declines::DeclineKind;

/// The card networks the judge knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CardNetwork {
    /// Visa.
    Visa,
    /// Mastercard.
    Mastercard,
}

/// What the networks allow after one decline of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Never reattempt the transaction.
    Never,
    /// Not before this wait from the decline.
    Wait(Duration),
    /// Later, within the card's reattempt windows.
    Later,
}

/// At most `max` reattempts on one card within a rolling `within`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReattemptWindow {
    /// Reattempts allowed.
    pub max: u32,
    /// The rolling window.
    pub within: Duration,
}

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

const fn window(max: u32, secs: u64) -> ReattemptWindow {
    ReattemptWindow {
        max,
        within: Duration::from_secs(secs),
    }
}

const fn date(y: i32, m: u32, d: u32) -> NaiveDate {
    match NaiveDate::from_ymd_opt(y, m, d) {
        Some(d) => d,
        None => panic!("a valid date"),
    }
}

/// Before any dated row: the rows whose source gives no date apply from here.
const ALWAYS: NaiveDate = date(2000, 1, 1);

/// Visa decline categories: (category, what follows, in force from). One row per category.
const VISA_CATEGORIES: &[(u8, After, NaiveDate)] = &[
    // Source: Visa Core Rules, "Excessive reattempts": decline response code category 1,
    // "issuer will never approve" (card closed, lost, stolen). Date: not given; the
    // categories were announced for 2020 and widely reported as in force from April 2021.
    (1, After::Never, ALWAYS),
    // Source: the same rule, category 2, "issuer cannot approve at this time" (insufficient
    // funds, velocity): reattempts allowed within the card's window. Date: not given.
    (2, After::Later, ALWAYS),
    // Source: the same rule, category 3, "data quality" (expired card, wrong CVV): a
    // reattempt with corrected data counts within the window. Date: not given.
    (3, After::Later, ALWAYS),
    // Source: the same rule, category 4, generic responses. Date: not given.
    (4, After::Later, ALWAYS),
];

/// Mastercard Merchant Advice Codes: (code, what follows, in force from).
const MASTERCARD_ADVICE: &[(u8, After, NaiveDate)] = &[
    // Source: Mastercard Merchant Advice Codes, 01 "new account information available".
    // Date: not given.
    (1, After::Later, ALWAYS),
    // Source: MAC 02 "cannot approve at this time, try again later". Date: not given.
    (2, After::Later, ALWAYS),
    // Source: MAC 03 "do not try again". Date: not given.
    (3, After::Never, ALWAYS),
    // Source: MAC 04 "token requirements not fulfilled for this token type". Date: not given.
    (4, After::Later, ALWAYS),
    // Source: MAC 21 "payment cancellation" (the cardholder stopped the recurring payment).
    // Date: not given.
    (21, After::Never, ALWAYS),
    // Source: MAC 24 "retry after 1 hour". Date: not given.
    (24, After::Wait(Duration::from_secs(HOUR)), ALWAYS),
    // Source: MAC 25 "retry after 24 hours". Date: not given.
    (25, After::Wait(Duration::from_secs(DAY)), ALWAYS),
    // Source: MAC 26 "retry after 2 days". Date: not given.
    (26, After::Wait(Duration::from_secs(2 * DAY)), ALWAYS),
    // Source: MAC 27 "retry after 4 days". Date: not given.
    (27, After::Wait(Duration::from_secs(4 * DAY)), ALWAYS),
    // Source: MAC 28 "retry after 6 days". Date: not given.
    (28, After::Wait(Duration::from_secs(6 * DAY)), ALWAYS),
    // Source: MAC 29 "retry after 8 days". Date: not given.
    (29, After::Wait(Duration::from_secs(8 * DAY)), ALWAYS),
    // Source: MAC 30 "retry after 10 days". Date: not given.
    (30, After::Wait(Duration::from_secs(10 * DAY)), ALWAYS),
];

/// The networks' reattempt windows per card: (network, windows, in force from). The latest
/// row of a network in force on a date applies.
const WINDOWS: &[(CardNetwork, &[ReattemptWindow], NaiveDate)] = &[
    // Source: Visa Core Rules, "Excessive reattempts": at most 15 reattempts of one card in
    // 30 days (categories 2 to 4). Date: not given (see category 1).
    (CardNetwork::Visa, &[window(15, 30 * DAY)], ALWAYS),
    // Source: an acquirer's notice "Changes to Visa system integrity fees", March 2026, as
    // quoted in redrive's issue 41: 20 reattempts in 30 days, CIT and MIT counted apart (the
    // simulator cannot tell them apart: one counter). Date: the notice's month.
    (CardNetwork::Visa, &[window(20, 30 * DAY)], date(2026, 3, 1)),
    // Source: Mastercard Transaction Processing Excellence, excessive attempts: 10 declined
    // attempts on one card in a rolling 24 hours, 35 in 30 days. Date: not given (the fee
    // rose in January 2025, issue 41; the thresholds did not change).
    (
        CardNetwork::Mastercard,
        &[window(10, DAY), window(35, 30 * DAY)],
        ALWAYS,
    ),
];

/// How long a never-retry decline (Visa category 1, MAC 03, MAC 21) stops the card: every
/// later attempt on it, of any transaction, is charged: (network, window, in force from).
const CARD_STOPS: &[(CardNetwork, Duration, NaiveDate)] = &[
    // Source: issue 41 ("the networks charge for every later attempt on that card at that
    // merchant for 30 days"), from Visa's excessive-reattempt rule counted over 30 days.
    // Date: not given.
    (CardNetwork::Visa, Duration::from_secs(30 * DAY), ALWAYS),
    // Source: the same, for Mastercard MAC 03 and 21. Date: not given.
    (
        CardNetwork::Mastercard,
        Duration::from_secs(30 * DAY),
        ALWAYS,
    ),
];

/// The rows the judge applies: what follows each decline, and each network's windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgeRules {
    windows: BTreeMap<CardNetwork, Vec<ReattemptWindow>>,
    as_of: NaiveDate,
}

impl Default for JudgeRules {
    /// The rows in force today (UTC).
    fn default() -> Self {
        Self::as_of(chrono::Utc::now().date_naive())
    }
}

impl JudgeRules {
    /// The rows in force on `day`.
    pub fn as_of(day: NaiveDate) -> Self {
        let mut windows = BTreeMap::new();
        for (network, ws, from) in WINDOWS {
            if *from <= day {
                windows.insert(*network, ws.to_vec());
            }
        }
        JudgeRules {
            windows,
            as_of: day,
        }
    }

    /// The same rules with `network`'s windows replaced (a test's own figures, written where
    /// the test is, not read from the client's configuration).
    pub fn with_windows(mut self, network: CardNetwork, windows: Vec<ReattemptWindow>) -> Self {
        self.windows.insert(network, windows);
        self
    }

    /// The date the rows are taken at.
    pub fn date(&self) -> NaiveDate {
        self.as_of
    }

    /// The windows of a network.
    pub fn windows(&self, network: CardNetwork) -> &[ReattemptWindow] {
        self.windows.get(&network).map_or(&[], Vec::as_slice)
    }

    /// What may follow a decline of this kind (the latest row in force; none: later).
    pub fn after(&self, kind: DeclineKind) -> After {
        let (table, code) = match kind {
            DeclineKind::Visa(c) => (VISA_CATEGORIES, c),
            DeclineKind::Mastercard(m) => (MASTERCARD_ADVICE, m),
        };
        table
            .iter()
            .filter(|(c, _, from)| *c == code && *from <= self.as_of)
            .max_by_key(|(_, _, from)| *from)
            .map_or(After::Later, |(_, a, _)| *a)
    }

    /// How long a never-retry decline of `network` stops the card.
    pub fn card_stop(&self, network: CardNetwork) -> Option<Duration> {
        CARD_STOPS
            .iter()
            .filter(|(n, _, from)| *n == network && *from <= self.as_of)
            .max_by_key(|(_, _, from)| *from)
            .map(|(_, d, _)| *d)
    }

    /// The network of a decline kind, as the judge counts it.
    pub fn network(kind: DeclineKind) -> CardNetwork {
        match kind {
            DeclineKind::Visa(_) => CardNetwork::Visa,
            DeclineKind::Mastercard(_) => CardNetwork::Mastercard,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_decline_tables() {
        let j = JudgeRules::as_of(date(2026, 12, 7));
        assert_eq!(j.after(DeclineKind::Visa(1)), After::Never);
        for c in 2..=4 {
            assert_eq!(j.after(DeclineKind::Visa(c)), After::Later, "visa {c}");
        }
        assert_eq!(j.after(DeclineKind::Mastercard(3)), After::Never);
        assert_eq!(j.after(DeclineKind::Mastercard(21)), After::Never);
        for m in [1, 2, 4] {
            assert_eq!(j.after(DeclineKind::Mastercard(m)), After::Later, "mac {m}");
        }
        let hours = [1, 24, 48, 96, 144, 192, 240];
        for (m, h) in (24..=30).zip(hours) {
            assert_eq!(
                j.after(DeclineKind::Mastercard(m)),
                After::Wait(Duration::from_secs(h * HOUR)),
                "mac {m}"
            );
        }
    }

    #[test]
    fn the_windows_in_force_follow_the_date() {
        let before = JudgeRules::as_of(date(2025, 6, 1));
        assert_eq!(before.windows(CardNetwork::Visa), &[window(15, 30 * DAY)]);
        let after = JudgeRules::as_of(date(2026, 3, 1));
        assert_eq!(after.windows(CardNetwork::Visa), &[window(20, 30 * DAY)]);
        assert_eq!(
            after.windows(CardNetwork::Mastercard),
            &[window(10, DAY), window(35, 30 * DAY)]
        );
        let own = after.with_windows(CardNetwork::Visa, vec![window(3, HOUR)]);
        assert_eq!(own.windows(CardNetwork::Visa), &[window(3, HOUR)]);
        assert_eq!(own.date(), date(2026, 3, 1));
    }
}
