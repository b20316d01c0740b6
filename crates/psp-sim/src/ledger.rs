//! The ledger: charges made, by id and by idempotency key, and the effects
//! counted per key.
//!
//! Why count effects per key rather than trust the dedupe: the point of the
//! simulator is to show whether clients (and the idempotency layer in front
//! of the ledger) keep a payment from being made twice. So the ledger counts
//! every effect it makes for a key; `duplicate_effects` is the sum over keys
//! of `effects - 1`, whatever the dedupe did. With the ledger's own dedupe on
//! (the default) that sum cannot grow; with it off
//! ([`crate::PspSimBuilder::ledger_dedupe`]), only a layer in front keeps it
//! at zero.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest idempotency key accepted.
pub const MAX_KEY_LEN: usize = 255;

/// Longest `reference` accepted.
pub const MAX_REFERENCE_LEN: usize = 255;

/// The body of `POST /v1/charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeRequest {
    /// Amount in minor units (cents), more than zero.
    pub amount: u64,
    /// ISO 4217 code, three letters (stored upper-case).
    pub currency: String,
    /// The caller's own reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The card being charged: a card fingerprint or payment-method id (never a card
    /// number), for the networks' per-card reattempt rules (see [`crate::declines`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
}

/// A charge the simulator made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// `ch_` and a sequence number, e.g. `ch_000001`.
    pub id: String,
    /// The `Idempotency-Key` it was made for.
    pub idempotency_key: String,
    /// Amount in minor units.
    pub amount: u64,
    /// Currency, upper-case.
    pub currency: String,
    /// The caller's reference, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Always `succeeded`: the simulator declines nothing.
    pub status: String,
    /// When it was made, in milliseconds since the simulator's start.
    pub created_ms: u64,
}

/// A field of a charge request that was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChargeRequestError {
    /// The body is not JSON, or not a JSON object.
    #[error("malformed JSON body: {reason}")]
    Malformed {
        /// What the parser said.
        reason: String,
    },
    /// A field is missing or has a bad value.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field's name.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl ChargeRequest {
    /// Reads and checks a charge request body. Unknown fields are ignored
    /// (and are not part of the fingerprint).
    ///
    /// # Errors
    /// [`ChargeRequestError::Malformed`] for a body that is not a JSON object,
    /// [`ChargeRequestError::Invalid`] naming `amount`, `currency` or `reference`.
    pub fn parse(body: &[u8]) -> Result<ChargeRequest, ChargeRequestError> {
        let v: Value = serde_json::from_slice(body).map_err(|e| ChargeRequestError::Malformed {
            reason: e.to_string(),
        })?;
        let obj = v.as_object().ok_or_else(|| ChargeRequestError::Malformed {
            reason: "expected a JSON object".into(),
        })?;
        let invalid = |field, reason: &str| ChargeRequestError::Invalid {
            field,
            reason: reason.to_owned(),
        };
        let amount = match obj.get("amount") {
            None | Some(Value::Null) => return Err(invalid("amount", "missing")),
            Some(v) => v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                invalid(
                    "amount",
                    &format!("{v} is not a positive integer number of minor units"),
                )
            })?,
        };
        let currency = match obj.get("currency") {
            None | Some(Value::Null) => return Err(invalid("currency", "missing")),
            Some(Value::String(s))
                if s.len() == 3 && s.bytes().all(|b| b.is_ascii_alphabetic()) =>
            {
                s.to_ascii_uppercase()
            }
            Some(v) => {
                return Err(invalid(
                    "currency",
                    &format!("{v} is not a three-letter currency code"),
                ));
            }
        };
        let reference = match obj.get("reference") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.chars().count() <= MAX_REFERENCE_LEN => Some(s.clone()),
            Some(Value::String(_)) => {
                return Err(invalid(
                    "reference",
                    &format!("longer than {MAX_REFERENCE_LEN} characters"),
                ));
            }
            Some(v) => return Err(invalid("reference", &format!("{v} is not a string"))),
        };
        let card = match obj.get("card") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= MAX_REFERENCE_LEN => {
                Some(s.clone())
            }
            Some(v) => {
                return Err(invalid(
                    "card",
                    &format!("{v} is not a card key of 1 to {MAX_REFERENCE_LEN} characters"),
                ));
            }
        };
        Ok(ChargeRequest {
            amount,
            currency,
            reference,
            card,
        })
    }
}

#[derive(Debug)]
enum KeyEntry {
    InFlight {
        request: ChargeRequest,
        token: u64,
    },
    Done {
        request: ChargeRequest,
        charge_id: String,
    },
}

/// What the ledger says to a charge request with a key.
#[derive(Debug)]
pub(crate) enum Begin {
    /// A charge exists for this key and the same request: replay it.
    Replay(Charge),
    /// The key was used for a different request.
    Mismatch,
    /// The first request with this key is still being processed.
    InFlight,
    /// Go ahead; commit with this token (or release it).
    Fresh(u64),
}

/// Charges and keys. Not thread-safe on its own: the state holds it under a
/// mutex, and no lock is held across an await.
#[derive(Debug)]
pub(crate) struct Ledger {
    dedupe: bool,
    keys: HashMap<String, KeyEntry>,
    charges: HashMap<String, Charge>,
    effects: HashMap<String, u64>,
    next: u64,
}

impl Ledger {
    pub(crate) fn new(dedupe: bool) -> Self {
        Ledger {
            dedupe,
            keys: HashMap::new(),
            charges: HashMap::new(),
            effects: HashMap::new(),
            next: 1,
        }
    }

    /// Clears everything (keeps the dedupe setting).
    pub(crate) fn clear(&mut self) {
        *self = Ledger::new(self.dedupe);
    }

    /// The ledger's own check, before an effect.
    pub(crate) fn begin(&mut self, key: &str, request: &ChargeRequest) -> Begin {
        let token = self.next_token();
        if !self.dedupe {
            return Begin::Fresh(token);
        }
        match self.keys.get(key) {
            Some(KeyEntry::Done { request: r, .. } | KeyEntry::InFlight { request: r, .. })
                if r != request =>
            {
                Begin::Mismatch
            }
            Some(KeyEntry::Done { charge_id, .. }) => match self.charges.get(charge_id) {
                Some(c) => Begin::Replay(c.clone()),
                None => Begin::Mismatch,
            },
            Some(KeyEntry::InFlight { .. }) => Begin::InFlight,
            None => {
                self.keys.insert(
                    key.to_owned(),
                    KeyEntry::InFlight {
                        request: request.clone(),
                        token,
                    },
                );
                Begin::Fresh(token)
            }
        }
    }

    fn next_token(&mut self) -> u64 {
        let t = self.next;
        self.next += 1;
        t
    }

    /// Gives the key back after a fresh request ended without its effect
    /// (e.g. the client went away during processing).
    pub(crate) fn release(&mut self, key: &str, token: u64) {
        if let Some(KeyEntry::InFlight { token: t, .. }) = self.keys.get(key)
            && *t == token
        {
            self.keys.remove(key);
        }
    }

    /// Makes the effect: a new charge for `key`, counted per key.
    pub(crate) fn commit(&mut self, key: &str, request: &ChargeRequest, created_ms: u64) -> Charge {
        let seq = self.charges.len() + 1;
        let charge = Charge {
            id: format!("ch_{seq:06}"),
            idempotency_key: key.to_owned(),
            amount: request.amount,
            currency: request.currency.clone(),
            reference: request.reference.clone(),
            status: "succeeded".into(),
            created_ms,
        };
        *self.effects.entry(key.to_owned()).or_insert(0) += 1;
        self.charges.insert(charge.id.clone(), charge.clone());
        // The first charge for a key is the one a status query finds.
        match self.keys.get(key) {
            Some(KeyEntry::Done { .. }) => {}
            _ => {
                self.keys.insert(
                    key.to_owned(),
                    KeyEntry::Done {
                        request: request.clone(),
                        charge_id: charge.id.clone(),
                    },
                );
            }
        }
        charge
    }

    /// A charge by id.
    pub(crate) fn by_id(&self, id: &str) -> Option<Charge> {
        self.charges.get(id).cloned()
    }

    /// The charge made for a key; `Err(InFlight)` while the first request with it
    /// is still in flight.
    pub(crate) fn by_key(&self, key: &str) -> Result<Option<Charge>, InFlight> {
        match self.keys.get(key) {
            Some(KeyEntry::Done { charge_id, .. }) => Ok(self.charges.get(charge_id).cloned()),
            Some(KeyEntry::InFlight { .. }) => Err(InFlight),
            None => Ok(None),
        }
    }

    /// Effects made.
    pub(crate) fn charges(&self) -> u64 {
        self.charges.len() as u64
    }

    /// The most effects made for one key.
    pub(crate) fn effects_max_per_key(&self) -> u64 {
        self.effects.values().copied().max().unwrap_or(0)
    }

    /// Whether the ledger refuses a second effect for a key itself.
    pub(crate) fn dedupe(&self) -> bool {
        self.dedupe
    }

    /// Effects beyond the first, summed over keys.
    pub(crate) fn duplicate_effects(&self) -> u64 {
        self.effects.values().map(|n| n.saturating_sub(1)).sum()
    }
}

/// The key's first request is still being processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight;

#[cfg(test)]
mod tests {
    use super::*;

    fn req(amount: u64) -> ChargeRequest {
        ChargeRequest {
            amount,
            currency: "EUR".into(),
            reference: None,
            card: None,
        }
    }

    #[test]
    fn parse_names_the_field() {
        let field = |body: &str| match ChargeRequest::parse(body.as_bytes()) {
            Err(ChargeRequestError::Invalid { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        };
        assert_eq!(field(r#"{"currency":"EUR"}"#), "amount");
        assert_eq!(field(r#"{"amount":0,"currency":"EUR"}"#), "amount");
        assert_eq!(field(r#"{"amount":-5,"currency":"EUR"}"#), "amount");
        assert_eq!(field(r#"{"amount":1.5,"currency":"EUR"}"#), "amount");
        assert_eq!(field(r#"{"amount":"10","currency":"EUR"}"#), "amount");
        assert_eq!(field(r#"{"amount":10}"#), "currency");
        assert_eq!(field(r#"{"amount":10,"currency":"EURO"}"#), "currency");
        assert_eq!(field(r#"{"amount":10,"currency":"E1R"}"#), "currency");
        assert_eq!(
            field(r#"{"amount":10,"currency":"EUR","reference":5}"#),
            "reference"
        );
        assert!(matches!(
            ChargeRequest::parse(b"{nope"),
            Err(ChargeRequestError::Malformed { .. })
        ));
        assert!(matches!(
            ChargeRequest::parse(b"[1]"),
            Err(ChargeRequestError::Malformed { .. })
        ));
        let ok =
            ChargeRequest::parse(br#"{"amount":10,"currency":"eur","reference":"o-1"}"#).unwrap();
        assert_eq!(ok.currency, "EUR");
        assert_eq!(ok.reference.as_deref(), Some("o-1"));
    }

    #[test]
    fn one_charge_per_key() {
        let mut l = Ledger::new(true);
        let Begin::Fresh(t) = l.begin("k", &req(10)) else {
            panic!()
        };
        assert!(matches!(l.begin("k", &req(10)), Begin::InFlight));
        assert!(matches!(l.begin("k", &req(11)), Begin::Mismatch));
        assert_eq!(l.by_key("k"), Err(InFlight));
        let c = l.commit("k", &req(10), 5);
        let _ = t;
        match l.begin("k", &req(10)) {
            Begin::Replay(r) => assert_eq!(r, c),
            other => panic!("{other:?}"),
        }
        assert!(matches!(l.begin("k", &req(11)), Begin::Mismatch));
        assert_eq!(l.by_key("k").unwrap(), Some(c.clone()));
        assert_eq!(l.by_id(&c.id), Some(c));
        assert_eq!(l.charges(), 1);
        assert_eq!(l.duplicate_effects(), 0);
    }

    #[test]
    fn release_frees_only_its_own_reservation() {
        let mut l = Ledger::new(true);
        let Begin::Fresh(t) = l.begin("k", &req(10)) else {
            panic!()
        };
        l.release("k", t + 100);
        assert!(matches!(l.begin("k", &req(10)), Begin::InFlight));
        l.release("k", t);
        assert!(matches!(l.begin("k", &req(10)), Begin::Fresh(_)));
    }

    #[test]
    fn without_dedupe_duplicates_are_counted() {
        let mut l = Ledger::new(false);
        for _ in 0..3 {
            assert!(matches!(l.begin("k", &req(10)), Begin::Fresh(_)));
            l.commit("k", &req(10), 0);
        }
        l.commit("j", &req(10), 0);
        assert_eq!(l.charges(), 4);
        assert_eq!(l.duplicate_effects(), 2);
        assert_eq!(l.effects_max_per_key(), 3);
        assert_eq!(l.by_key("k").unwrap().unwrap().id, "ch_000001");
    }
}
