//! Versions of the policies document (`redrive policy apply FILE`): the database is the one
//! source of truth for the policies every process of a fleet runs.
//!
//! Why the whole document and not parsed policies: the file has sections read by different
//! layers (retry policies and breakers by the policy crate, `[egress]` and `[[alerts]]` by the
//! HTTP crate, `[payload]` and `[[schedules]]` by the binary). One version is one document,
//! parsed by each process with the parser of its own build, exactly as a `--policies FILE`
//! would be.
//!
//! A version is stored only when its text differs from the latest's (compared by SHA-256), in
//! one transaction with its audit row (`policy_apply`). Numbers go 1, 2, 3… with no gaps: two
//! processes applying at once both read the latest number, one insert wins the primary key
//! and the other reads again (and stores nothing if its text is now the latest).

use redrive_policy::Timestamp;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::model::{from_millis, millis};
use crate::ops::Backend as _;
use crate::{Actor, Result, Store, StoreError};

/// The largest policies document [`Store::put_policy_version`] accepts (1 MiB).
pub const MAX_POLICY_BODY: usize = 1 << 20;

/// The longest comment of a version, in bytes.
pub const MAX_POLICY_COMMENT: usize = 1000;

/// Times a version's insert is tried when other processes take its number meanwhile.
const PUT_TRIES: u32 = 20;

/// One stored version of the policies document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyVersion {
    /// Its number: 1 for the first, then each new version the next.
    pub version: i64,
    /// The document, as applied.
    pub body: String,
    /// SHA-256 of `body`, lowercase hex ([`policy_digest`]).
    pub digest: String,
    /// When it was stored (the `now` of the call: pass the database's time).
    pub applied_at: Timestamp,
    /// Who applied it (the audit trail's actor name).
    pub applied_by: String,
    /// Through what (`cli`, `api`…).
    pub via: String,
    /// What the applier said about it.
    pub comment: Option<String>,
}

/// What [`Store::put_policy_version`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyApplied {
    /// The version now the latest: the new one, or the unchanged latest.
    pub version: PolicyVersion,
    /// Whether a new version was stored (`false`: the text was the latest's already).
    pub created: bool,
}

/// The SHA-256 of a policies document, lowercase hex: what tells two versions apart.
pub fn policy_digest(body: &str) -> String {
    Sha256::digest(body.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(sqlx::FromRow)]
struct Row {
    version: i64,
    body: String,
    digest: String,
    applied_at: i64,
    applied_by: String,
    via: String,
    comment: Option<String>,
}

impl From<Row> for PolicyVersion {
    fn from(r: Row) -> Self {
        Self {
            version: r.version,
            body: r.body,
            digest: r.digest,
            applied_at: from_millis(r.applied_at),
            applied_by: r.applied_by,
            via: r.via,
            comment: r.comment,
        }
    }
}

const COLS: &str = "version, body, digest, applied_at, applied_by, via, comment";
const LATEST_HEAD: &str =
    "SELECT version, digest FROM redrive_policy_versions ORDER BY version DESC LIMIT 1";
const INSERT: &str = "INSERT INTO redrive_policy_versions \
    (version, body, digest, applied_at, applied_by, via, comment) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";
const MAX_VERSION: &str = "SELECT MAX(version) FROM redrive_policy_versions";

fn is_unique_violation(e: &StoreError) -> bool {
    matches!(e, StoreError::Database(sqlx::Error::Database(d)) if d.is_unique_violation())
}

fn check_put(body: &str, comment: Option<&str>) -> Result<()> {
    let bad = |field: &'static str, value: &str, reason: String| StoreError::Invalid {
        field,
        value: value.chars().take(80).collect(),
        reason,
    };
    if body.trim().is_empty() {
        return Err(bad("body", body, "the policies document is empty".into()));
    }
    if body.len() > MAX_POLICY_BODY {
        return Err(bad(
            "body",
            "",
            format!("{} bytes; at most {MAX_POLICY_BODY}", body.len()),
        ));
    }
    if let Some(c) = comment {
        if c.len() > MAX_POLICY_COMMENT {
            return Err(bad(
                "comment",
                c,
                format!("{} bytes; at most {MAX_POLICY_COMMENT}", c.len()),
            ));
        }
        if c.chars().any(|ch| ch.is_control() && ch != '\n') {
            return Err(bad("comment", c, "contains a control character".into()));
        }
    }
    Ok(())
}

impl Store {
    /// Stores `body` as the next version of the policies document, unless it is the latest
    /// version's text already (then nothing is written, `created: false`). The new version
    /// and its audit row (`policy_apply`, target `{"version", "digest", "comment"}`) commit
    /// together. The caller validates the document first: the store keeps text.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for an empty or oversized body, a bad comment or actor;
    /// [`StoreError::Contended`] when other processes stored a version at each of
    /// 20 tries.
    pub async fn put_policy_version(
        &self,
        body: &str,
        actor: &Actor,
        comment: Option<&str>,
        now: Timestamp,
    ) -> Result<PolicyApplied> {
        check_put(body, comment)?;
        crate::operator::check_actor(actor)?;
        let digest = policy_digest(body);
        for _ in 0..PUT_TRIES {
            match self.put_once(body, &digest, actor, comment, now).await {
                Ok(Some(version)) => {
                    let v =
                        self.policy_version(version)
                            .await?
                            .ok_or_else(|| StoreError::Corrupt {
                                what: "policy version",
                                detail: format!("v{version} vanished after its insert"),
                            })?;
                    return Ok(PolicyApplied {
                        version: v,
                        created: true,
                    });
                }
                Ok(None) => {
                    let v =
                        self.latest_policy_version()
                            .await?
                            .ok_or_else(|| StoreError::Corrupt {
                                what: "policy version",
                                detail: "the latest version vanished".into(),
                            })?;
                    if v.digest == digest {
                        return Ok(PolicyApplied {
                            version: v,
                            created: false,
                        });
                    }
                    // A newer version landed between the two reads: try again.
                }
                // Another process took the number: read the latest again.
                Err(e) if is_unique_violation(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Contended {
            what: "the policies' latest version".into(),
        })
    }

    /// One try: `Some(version)` stored, `None` when the latest has this digest.
    async fn put_once(
        &self,
        body: &str,
        digest: &str,
        actor: &Actor,
        comment: Option<&str>,
        now: Timestamp,
    ) -> Result<Option<i64>> {
        let target = serde_json::json!({"digest": digest, "comment": comment});
        dispatch!(self, s => {
            let mut tx = s.tx().await?;
            let head: Option<(i64, String)> =
                sqlx::query_as(LATEST_HEAD).fetch_optional(&mut *tx).await?;
            if head.as_ref().is_some_and(|(_, d)| d == digest) {
                return Ok(None);
            }
            let version = head.map_or(1, |(v, _)| v + 1);
            sqlx::query(INSERT)
                .bind(version)
                .bind(body)
                .bind(digest)
                .bind(millis(now))
                .bind(&actor.name)
                .bind(&actor.via)
                .bind(comment)
                .execute(&mut *tx)
                .await?;
            let mut target = target;
            target["version"] = version.into();
            s.audit_in(&mut tx, actor, "policy_apply", &target, 1, now).await?;
            tx.commit().await?;
            Ok(Some(version))
        })
    }

    /// The latest version of the policies document (`None`: none was ever applied).
    pub async fn latest_policy_version(&self) -> Result<Option<PolicyVersion>> {
        let q = format!("SELECT {COLS} FROM redrive_policy_versions ORDER BY version DESC LIMIT 1");
        let row: Option<Row> = dispatch!(self, s => {
            sqlx::query_as(sqlx::AssertSqlSafe(q)).fetch_optional(&s.read).await?
        });
        Ok(row.map(Into::into))
    }

    /// Version `version` of the policies document, if stored.
    pub async fn policy_version(&self, version: i64) -> Result<Option<PolicyVersion>> {
        let q = format!("SELECT {COLS} FROM redrive_policy_versions WHERE version = $1");
        let row: Option<Row> = dispatch!(self, s => {
            sqlx::query_as(sqlx::AssertSqlSafe(q)).bind(version).fetch_optional(&s.read).await?
        });
        Ok(row.map(Into::into))
    }

    /// The stored versions, newest first: at most `limit` (1..=1000).
    pub async fn policy_versions(&self, limit: u32) -> Result<Vec<PolicyVersion>> {
        let q =
            format!("SELECT {COLS} FROM redrive_policy_versions ORDER BY version DESC LIMIT $1");
        let rows: Vec<Row> = dispatch!(self, s => {
            sqlx::query_as(sqlx::AssertSqlSafe(q))
                .bind(i64::from(limit.clamp(1, 1000)))
                .fetch_all(&s.read)
                .await?
        });
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// The latest version's number (`None`: none stored): what a running worker polls, one
    /// index lookup.
    pub async fn policy_version_number(&self) -> Result<Option<i64>> {
        let n: Option<i64> = dispatch!(self, s => {
            sqlx::query_scalar(MAX_VERSION).fetch_one(&s.read).await?
        });
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_sha256_hex() {
        assert_eq!(
            policy_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn an_empty_body_or_a_long_comment_is_refused_naming_the_field() {
        let e = check_put("  \n", None).unwrap_err();
        assert!(e.to_string().starts_with("invalid body"), "{e}");
        let long = "x".repeat(MAX_POLICY_COMMENT + 1);
        let e = check_put("[policy.a]", Some(&long)).unwrap_err();
        assert!(e.to_string().starts_with("invalid comment"), "{e}");
        assert!(check_put("[policy.a]", Some("raise checkout's attempts")).is_ok());
    }
}
