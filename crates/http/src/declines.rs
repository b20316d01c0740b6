//! Reading a card decline out of a PSP's response: which JSON fields carry the network, the
//! issuer's response code, Visa's decline category and Mastercard's Merchant Advice Code.
//!
//! An `http` job's response whose status is one of the map's `statuses` (default: 402) and
//! whose body is JSON becomes [`Outcome::Declined`](redrive_policy::Outcome::Declined) with
//! the advice read through JSON pointers (RFC 6901). A PSP's own decline codes can be mapped
//! to a Visa-style category by a code table (used when the body carries no category).
//!
//! Choose a map per job with the payload's `declines` field (a preset name or a map object),
//! or for every job with [`crate::HttpJob::with_declines`].
//!
//! # Presets (documented shapes, not guarantees about any PSP's API)
//!
//! | preset | code | network | category | advice code | code table |
//! |---|---|---|---|---|---|
//! | `redrive` (the PSP simulator) | `/response_code` | `/network` | `/category` | `/advice_code` | – |
//! | `stripe` (Stripe-like) | `/error/network_decline_code` | `/error/network` | – | `/error/advice_code` | `/error/decline_code`: `stolen_card`, `lost_card`, `pickup_card`, `restricted_card`, `fraudulent`, `do_not_try_again`, `previously_declined_do_not_retry` → 1; `insufficient_funds`, `card_velocity_exceeded`, `try_again_later`, `processing_error` → 2; `incorrect_cvc`, `incorrect_number`, `expired_card`, `invalid_expiry_year`, `invalid_cvc` → 3; anything else → 4 |
//! | `adyen` (Adyen-like) | `/additionalData/refusalReasonRaw` | `/additionalData/paymentMethod` | – | `/additionalData/merchantAdviceCode` | `/refusalReasonCode`: `5` (blocked), `11` (3-D secure), `14` (fraud), `15` (cancelled) → 1; `12` (not enough balance), `25`, `28` (withdrawal limit) → 2; `6` (expired), `7` (invalid card), `24` (CVC declined) → 3; anything else → 4 |
//!
//! Values are read leniently: a number or a string; an advice code or category as its
//! leading digits (`"01: New account information"` → 1); a response code as its leading
//! token (`"05 : Do not honor"` → `05`); a network by its usual spellings (`mc`,
//! `mastercard`, `visa`, ...; anything else is `other`).

use std::collections::BTreeMap;

use redrive_policy::{DeclineAdvice, Network};
use serde::Deserialize;
use serde_json::Value;

use crate::validate::EnqueueError;

/// Where a PSP's decline response keeps the network's advice.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclineMap {
    /// The statuses that may be declines (default: 402).
    #[serde(default = "default_statuses")]
    pub statuses: Vec<u16>,
    /// JSON pointer to the issuer's response code.
    #[serde(default)]
    pub code: Option<String>,
    /// JSON pointer to the card network.
    #[serde(default)]
    pub network: Option<String>,
    /// JSON pointer to Visa's decline category (1–4).
    #[serde(default)]
    pub category: Option<String>,
    /// JSON pointer to Mastercard's Merchant Advice Code.
    #[serde(default)]
    pub advice_code: Option<String>,
    /// JSON pointer to the PSP's own decline code, looked up in `codes`.
    #[serde(default)]
    pub psp_code: Option<String>,
    /// The PSP's decline codes → a Visa-style category (1–4), used when the body has none.
    #[serde(default)]
    pub codes: BTreeMap<String, u8>,
    /// The category of a PSP code missing from `codes` (default: none, then "retry later").
    #[serde(default)]
    pub codes_default: Option<u8>,
}

fn default_statuses() -> Vec<u16> {
    vec![402]
}

/// The preset names.
pub const PRESETS: &[&str] = &["redrive", "stripe", "adyen"];

impl DeclineMap {
    /// A preset by name (see the module docs).
    pub fn preset(name: &str) -> Option<Self> {
        let p = |s: &str| Some(s.to_owned());
        let table = |rows: &[(&[&str], u8)]| {
            rows.iter()
                .flat_map(|(codes, cat)| codes.iter().map(move |c| ((*c).to_owned(), *cat)))
                .collect::<BTreeMap<_, _>>()
        };
        match name {
            "redrive" => Some(Self {
                statuses: default_statuses(),
                code: p("/response_code"),
                network: p("/network"),
                category: p("/category"),
                advice_code: p("/advice_code"),
                psp_code: None,
                codes: BTreeMap::new(),
                codes_default: None,
            }),
            "stripe" => Some(Self {
                statuses: default_statuses(),
                code: p("/error/network_decline_code"),
                network: p("/error/network"),
                category: None,
                advice_code: p("/error/advice_code"),
                psp_code: p("/error/decline_code"),
                codes: table(&[
                    (
                        &[
                            "stolen_card",
                            "lost_card",
                            "pickup_card",
                            "restricted_card",
                            "fraudulent",
                            "do_not_try_again",
                            "previously_declined_do_not_retry",
                        ],
                        1,
                    ),
                    (
                        &[
                            "insufficient_funds",
                            "card_velocity_exceeded",
                            "try_again_later",
                            "processing_error",
                        ],
                        2,
                    ),
                    (
                        &[
                            "incorrect_cvc",
                            "incorrect_number",
                            "expired_card",
                            "invalid_expiry_year",
                            "invalid_cvc",
                        ],
                        3,
                    ),
                ]),
                codes_default: Some(4),
            }),
            "adyen" => Some(Self {
                statuses: vec![200, 402, 422],
                code: p("/additionalData/refusalReasonRaw"),
                network: p("/additionalData/paymentMethod"),
                category: None,
                advice_code: p("/additionalData/merchantAdviceCode"),
                psp_code: p("/refusalReasonCode"),
                codes: table(&[
                    (&["5", "11", "14", "15"], 1),
                    (&["12", "25", "28"], 2),
                    (&["6", "7", "24"], 3),
                ]),
                codes_default: Some(4),
            }),
            _ => None,
        }
    }

    /// Reads a payload's `declines` field: a preset name or a map object.
    ///
    /// # Errors
    /// [`EnqueueError::Invalid`] naming `payload.declines` (or the bad field inside it).
    pub fn from_payload(v: &Value) -> Result<Self, EnqueueError> {
        let m = match v {
            Value::String(name) => Self::preset(name).ok_or_else(|| {
                EnqueueError::invalid(
                    "payload.declines",
                    name,
                    format!("a preset ({}) or a map object", PRESETS.join(", ")),
                )
            })?,
            Value::Object(_) => serde_json::from_value::<Self>(v.clone())
                .map_err(|e| EnqueueError::invalid("payload.declines", "", e.to_string()))?,
            _ => {
                return Err(EnqueueError::invalid(
                    "payload.declines",
                    "",
                    "a preset name or a map object",
                ));
            }
        };
        m.validate()?;
        Ok(m)
    }

    /// Checks the pointers and the code table.
    ///
    /// # Errors
    /// [`EnqueueError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), EnqueueError> {
        for (field, p) in [
            ("code", &self.code),
            ("network", &self.network),
            ("category", &self.category),
            ("advice_code", &self.advice_code),
            ("psp_code", &self.psp_code),
        ] {
            if let Some(p) = p
                && !p.is_empty()
                && !p.starts_with('/')
            {
                return Err(EnqueueError::invalid(
                    format!("payload.declines.{field}"),
                    p,
                    "a JSON pointer starts with '/' (RFC 6901), e.g. \"/error/decline_code\"",
                ));
            }
        }
        for (code, cat) in &self.codes {
            if !(1..=4).contains(cat) {
                return Err(EnqueueError::invalid(
                    format!("payload.declines.codes.{code}"),
                    &cat.to_string(),
                    "a Visa decline category, 1 to 4",
                ));
            }
        }
        if let Some(c) = self.codes_default
            && !(1..=4).contains(&c)
        {
            return Err(EnqueueError::invalid(
                "payload.declines.codes_default",
                &c.to_string(),
                "a Visa decline category, 1 to 4",
            ));
        }
        if self.statuses.iter().any(|s| !(100..=599).contains(s)) {
            return Err(EnqueueError::invalid(
                "payload.declines.statuses",
                "",
                "HTTP statuses from 100 to 599",
            ));
        }
        Ok(())
    }

    /// The decline a response comes to, if it is one: its status is one of `statuses` and
    /// the body is JSON with a response code, category, advice code or PSP code present (the
    /// network alone is not enough: approvals name it too).
    pub fn advice(&self, status: u16, body: &Value) -> Option<DeclineAdvice> {
        if !self.statuses.contains(&status) || !body.is_object() {
            return None;
        }
        let at = |p: &Option<String>| p.as_deref().and_then(|p| body.pointer(p));
        let network = at(&self.network);
        let code = at(&self.code);
        let category = at(&self.category).and_then(leading_number);
        let advice = at(&self.advice_code).and_then(leading_number);
        let psp = at(&self.psp_code).and_then(text);
        // The network alone is no decline (approvals name it too).
        if code.is_none() && category.is_none() && advice.is_none() && psp.is_none() {
            return None;
        }
        let network = network
            .and_then(text)
            .and_then(|n| n.parse::<Network>().ok())
            .unwrap_or(Network::Other);
        let code = code.and_then(text).and_then(|c| leading_token(&c));
        let category = category.filter(|c| (1..=4).contains(c)).or_else(|| {
            psp.as_ref()
                .and_then(|p| self.codes.get(p).copied().or(self.codes_default))
        });
        let advice = advice.filter(|m| (1..=99).contains(m));
        let category = match (network, category, &code) {
            // Visa's category follows from its response code when nothing else gave it.
            (Network::Visa, None, Some(c)) => Some(redrive_policy::visa_category_of(c)),
            (_, c, _) => c,
        };
        DeclineAdvice::new(network, code.as_deref(), category, advice).ok()
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn leading_number(v: &Value) -> Option<u8> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u8::try_from(n).ok()),
        Value::String(s) => {
            let d: String = s.trim().chars().take_while(char::is_ascii_digit).collect();
            d.parse().ok()
        }
        _ => None,
    }
}

fn leading_token(s: &str) -> Option<String> {
    let t: String = s
        .trim()
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    (!t.is_empty() && t.len() <= 4).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_policy::DeclineRule;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn the_simulator_shape() {
        let m = DeclineMap::preset("redrive").unwrap();
        let a = m
            .advice(
                402,
                &json!({"network": "mastercard", "response_code": "51", "advice_code": "25"}),
            )
            .unwrap();
        assert_eq!(a.network(), Network::Mastercard);
        assert_eq!(a.advice_code(), Some(25));
        assert_eq!(
            a.rule(),
            DeclineRule::RetryAfter(Duration::from_secs(86_400))
        );
        let a = m
            .advice(402, &json!({"network": "visa", "response_code": "14"}))
            .unwrap();
        assert_eq!((a.category(), a.rule()), (Some(1), DeclineRule::NeverRetry));
        // Not a decline status, or no mapped field: not a decline.
        assert_eq!(m.advice(400, &json!({"network": "visa"})), None);
        assert_eq!(m.advice(402, &json!({"error": "nope"})), None);
    }

    #[test]
    fn stripe_like_shape_uses_its_code_table() {
        let m = DeclineMap::preset("stripe").unwrap();
        let body = json!({"error": {"type": "card_error", "decline_code": "insufficient_funds",
            "network_decline_code": "51", "network": "mastercard", "advice_code": "02"}});
        let a = m.advice(402, &body).unwrap();
        assert_eq!((a.category(), a.advice_code()), (Some(2), Some(2)));
        assert_eq!(a.rule(), DeclineRule::RetryLater);
        let body = json!({"error": {"decline_code": "previously_declined_do_not_retry"}});
        assert_eq!(
            m.advice(402, &body).unwrap().rule(),
            DeclineRule::NeverRetry
        );
        let body = json!({"error": {"decline_code": "generic_decline", "network": "visa"}});
        assert_eq!(m.advice(402, &body).unwrap().category(), Some(4));
    }

    #[test]
    fn adyen_like_shape_reads_leading_digits() {
        let m = DeclineMap::preset("adyen").unwrap();
        let body = json!({"resultCode": "Refused", "refusalReasonCode": "2",
            "additionalData": {"paymentMethod": "mc", "refusalReasonRaw": "05 : Do not honor",
            "merchantAdviceCode": "21: Payment Cancellation"}});
        let a = m.advice(200, &body).unwrap();
        assert_eq!(a.network(), Network::Mastercard);
        assert_eq!(a.code().unwrap().as_str(), "05");
        assert_eq!(a.rule(), DeclineRule::RecurringStopped);
        // An authorised answer carries none of the fields: not a decline.
        let ok = json!({"resultCode": "Authorised", "additionalData": {"paymentMethod": "visa"}});
        assert_eq!(m.advice(200, &ok), None);
    }

    #[test]
    fn a_bad_map_names_the_field() {
        let e = DeclineMap::from_payload(&json!("paypal")).unwrap_err();
        assert!(e.to_string().contains("payload.declines"), "{e}");
        let e = DeclineMap::from_payload(&json!({"code": "error.code"})).unwrap_err();
        assert!(e.to_string().contains("payload.declines.code"), "{e}");
        let e = DeclineMap::from_payload(&json!({"codes": {"x": 9}})).unwrap_err();
        assert!(e.to_string().contains("payload.declines.codes.x"), "{e}");
        let e = DeclineMap::from_payload(&json!({"bogus": 1})).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }
}
