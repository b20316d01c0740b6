//! The served `/openapi.json` describes the service as it runs: its security requirement
//! follows whether a token is configured (schemathesis, run by `.ci/schemathesis.sh`, checks
//! the answers against this document).

mod support;

use axum::http::StatusCode;
use redrive_service::AppConfig;
use serde_json::{Value, json};
use support::*;

const TOKEN: &str = "openapi-test-token-0123456789abcdef";

/// The security requirements that apply to an operation: its own, else the document's.
fn security_of<'a>(doc: &'a Value, path: &str, method: &str) -> Option<&'a Value> {
    doc["paths"][path][method]
        .get("security")
        .or_else(|| doc.get("security"))
}

#[tokio::test]
async fn without_a_token_no_operation_requires_one() {
    let h = sqlite(AppConfig::default()).await;
    let r = send(&h.app(), get("/openapi.json")).await;
    assert_eq!(r.status, StatusCode::OK);
    let doc = r.json();
    for (path, method) in [
        ("/v1/jobs", "post"),
        ("/v1/jobs", "get"),
        ("/v1/jobs/{id}", "get"),
        ("/v1/jobs/{id}/replay", "post"),
        ("/v1/jobs/{id}/cancel", "post"),
        ("/v1/stats", "get"),
        ("/v1/breakers", "get"),
        ("/v1/workers", "get"),
    ] {
        let sec = security_of(&doc, path, method);
        let needs_bearer = sec
            .and_then(Value::as_array)
            .is_some_and(|alts| !alts.is_empty() && alts.iter().all(|a| a.get("bearer").is_some()));
        assert!(!needs_bearer, "{method} {path} requires a token: {sec:?}");
    }
    // The scheme stays described, for the same service started with a token.
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    // And a call without a token is indeed accepted.
    let r = send(&h.app(), get("/v1/stats")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    h.cleanup().await;
}

#[tokio::test]
async fn with_a_token_the_v1_operations_require_it_and_health_does_not() {
    let h = sqlite(AppConfig {
        token: Some(TOKEN.into()),
        ..Default::default()
    })
    .await;
    let doc = send(&h.app(), get("/openapi.json")).await.json();
    for (path, method) in [
        ("/v1/jobs", "post"),
        ("/v1/jobs", "get"),
        ("/v1/jobs/{id}", "get"),
        ("/v1/stats", "get"),
    ] {
        assert_eq!(
            security_of(&doc, path, method),
            Some(&json!([{"bearer": []}])),
            "{method} {path}"
        );
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(security_of(&doc, path, "get"), Some(&json!([{}])), "{path}");
    }
    // And a call without the token is indeed refused, as the document says.
    let r = send(&h.app(), get("/v1/stats")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.body);
    h.cleanup().await;
}

/// The document's constraints on the names and the priority are the store's: a schema-valid
/// value is accepted, a refused one is schema-invalid (schemathesis generates from them).
#[tokio::test]
async fn enqueue_schema_constraints_match_the_stores_validation() {
    let h = sqlite(AppConfig::default()).await;
    let doc = send(&h.app(), get("/openapi.json")).await.json();
    let props = &doc["components"]["schemas"]["EnqueueRequest"]["properties"];
    assert_eq!(
        props["priority"]["minimum"],
        json!(redrive_store::MIN_PRIORITY)
    );
    assert_eq!(
        props["priority"]["maximum"],
        json!(redrive_store::MAX_PRIORITY)
    );
    for field in ["queue", "kind", "key", "dependency"] {
        let p = props[field]["pattern"]
            .as_str()
            .unwrap_or_else(|| panic!("{field} has no pattern: {}", props[field]));
        let re = regex::Regex::new(p).unwrap_or_else(|e| panic!("{field}: {p}: {e}"));
        // Every character of the Basic Multilingual Plane (the tag characters beyond it are
        // documented as left out).
        for c in (0u32..=0xFFFF).filter_map(char::from_u32) {
            let s = format!("a{c}b");
            let job = match field {
                "queue" => redrive_store::NewJob::new(s.clone(), "noop", json!({})),
                "kind" => redrive_store::NewJob::new("q", s.clone(), json!({})),
                "key" => redrive_store::NewJob::new("q", "noop", json!({})).key(s.clone()),
                _ => redrive_store::NewJob::new("q", "noop", json!({})).dependency(s.clone()),
            };
            let stored = job.validate().is_ok();
            assert_eq!(
                re.is_match(&s),
                stored,
                "{field} with U+{:04X}: the pattern says {}, the store says {}",
                c as u32,
                re.is_match(&s),
                stored
            );
        }
    }
    h.cleanup().await;
}
