//! Read-only queries for the dashboard: attempts per second by class, dead jobs by reason and
//! by error signature.
//!
//! Why here and not in the service: the SQL touches the store's tables, and both backends must
//! answer the same way; these queries only read (through the read pool), so they never wait
//! behind the workers on SQLite.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::model::{JobId, dur_ms, millis};
use crate::{Result, Store, StoreError, Timestamp, from_millis};

/// The most dead jobs read to build the groups of [`Store::dead_groups`].
pub const MAX_DEAD_SCAN: u32 = 100_000;

/// Attempts of one class started within one time bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptBucket {
    /// Start of the bucket.
    pub start: Timestamp,
    /// Failure class (`success`, `permanent`, `infrastructure`, …).
    pub class: String,
    /// Attempts started in the bucket.
    pub count: u64,
}

/// Dead jobs of one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadReasonCount {
    /// The dead reason (`permanent`, `attempts_exhausted`, …; `unknown` when none was stored).
    pub reason: String,
    /// Dead jobs.
    pub count: u64,
}

/// How much of a dead job's last answer (the response excerpt of its last attempt) decides its
/// group: two 422s that say "invalid amount" and "card expired" are different problems, two
/// that differ only in a long tail (a request id, a timestamp) are one.
pub const ANSWER_PREFIX_CHARS: usize = 120;

/// Dead jobs that died for the same reason with the same error signature and the same start
/// of the dependency's last answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadGroup {
    /// The dead reason.
    pub reason: String,
    /// The last error with digits and ids normalised (see [`error_signature`]).
    pub signature: String,
    /// One original error text of the group.
    pub example: Option<String>,
    /// The start of the last attempt's answer (its first [`ANSWER_PREFIX_CHARS`] characters,
    /// normalised like the signature); `None` when the last attempt kept none.
    pub answer: Option<String>,
    /// Jobs in the group.
    pub count: u64,
    /// Their ids (oldest first; at most `ids_per_group`).
    pub ids: Vec<JobId>,
    /// Queues they belong to, sorted.
    pub queues: Vec<String>,
}

/// The error text with volatile parts replaced, so that errors differing only in an id, an
/// amount or a timestamp group together: every word that contains a digit and is at least 8
/// characters long becomes `<id>`; shorter runs of digits become `N`.
///
/// ```
/// use redrive_store::error_signature;
/// assert_eq!(error_signature("charge ch_8f3a9b2c1d declined (code 51)"),
///            "charge <id> declined (code N)");
/// assert_eq!(error_signature("HTTP 503 after 1200ms"), "HTTP N after Nms");
/// ```
pub fn error_signature(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.chars().any(|c| c.is_ascii_digit()) {
            if word.len() >= 8 {
                out.push_str("<id>");
            } else {
                let mut in_digits = false;
                for c in word.chars() {
                    if c.is_ascii_digit() {
                        if !in_digits {
                            out.push('N');
                        }
                        in_digits = true;
                    } else {
                        in_digits = false;
                        out.push(c);
                    }
                }
            }
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' || c == '-' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

const RATE_SQL: &str = "SELECT (started_at / $2) * $2 AS bucket, class, COUNT(*) AS n \
    FROM redrive_attempts WHERE started_at >= $1 AND started_at < $3 \
    GROUP BY 1, 2 ORDER BY 1, 2";

const DEAD_REASONS_SQL: &str = "SELECT COALESCE(dead_reason, 'unknown') AS reason, COUNT(*) AS n \
    FROM redrive_jobs WHERE state = 'dead' GROUP BY 1 ORDER BY 2 DESC, 1";

const DEAD_SCAN_SQL: &str = "SELECT id, queue, COALESCE(dead_reason, 'unknown'), last_error, \
    (SELECT a.response FROM redrive_attempts a WHERE a.job_id = j.id ORDER BY a.id DESC LIMIT 1) \
    FROM redrive_jobs j WHERE state = 'dead' AND ($1 IS NULL OR queue = $1) ORDER BY id LIMIT $2";

macro_rules! on_read_pool {
    ($self:ident, $pool:ident => $e:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                let $pool = &s.read;
                $e
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let $pool = &s.read;
                $e
            }
        }
    };
}

impl Store {
    /// Attempts started in `[from, to)`, counted per `bucket` (e.g. one second) and class,
    /// oldest bucket first. Buckets with no attempt are absent.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a zero bucket or `to` before `from`; database errors.
    pub async fn attempt_rate(
        &self,
        from: Timestamp,
        to: Timestamp,
        bucket: Duration,
    ) -> Result<Vec<AttemptBucket>> {
        let step = dur_ms(bucket);
        if step <= 0 {
            return Err(StoreError::Invalid {
                field: "bucket",
                value: format!("{}ms", bucket.as_millis()),
                reason: "must be at least 1ms".into(),
            });
        }
        if to < from {
            return Err(StoreError::Invalid {
                field: "to",
                value: to.to_rfc3339(),
                reason: "must not be before from".into(),
            });
        }
        let rows: Vec<(i64, String, i64)> = on_read_pool!(self, pool => {
            sqlx::query_as(RATE_SQL)
                .bind(millis(from))
                .bind(step)
                .bind(millis(to))
                .fetch_all(pool)
                .await?
        });
        Ok(rows
            .into_iter()
            .map(|(b, class, n)| AttemptBucket {
                start: from_millis(b),
                class,
                count: u64::try_from(n).unwrap_or(0),
            })
            .collect())
    }

    /// Dead jobs per dead reason, most first.
    ///
    /// # Errors
    /// Database errors.
    pub async fn dead_reasons(&self) -> Result<Vec<DeadReasonCount>> {
        let rows: Vec<(String, i64)> = on_read_pool!(self, pool => {
            sqlx::query_as(DEAD_REASONS_SQL).fetch_all(pool).await?
        });
        Ok(rows
            .into_iter()
            .map(|(reason, n)| DeadReasonCount {
                reason,
                count: u64::try_from(n).unwrap_or(0),
            })
            .collect())
    }

    /// Dead jobs (of `queue`, if given) grouped by reason, [`error_signature`] of their last
    /// error and the start of their last answer ([`DeadGroup::answer`]), largest group first; each group lists at most `ids_per_group` ids. At most
    /// [`MAX_DEAD_SCAN`] dead jobs are read.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] when `ids_per_group` is 0 or above 10,000; database errors.
    pub async fn dead_groups(
        &self,
        queue: Option<&str>,
        ids_per_group: u32,
    ) -> Result<Vec<DeadGroup>> {
        if ids_per_group == 0 || ids_per_group > 10_000 {
            return Err(StoreError::Invalid {
                field: "ids_per_group",
                value: ids_per_group.to_string(),
                reason: "must be 1..=10000".into(),
            });
        }
        type Row = (i64, String, String, Option<String>, Option<String>);
        let rows: Vec<Row> = on_read_pool!(self, pool => {
            sqlx::query_as(DEAD_SCAN_SQL)
                .bind(queue)
                .bind(i64::from(MAX_DEAD_SCAN))
                .fetch_all(pool)
                .await?
        });
        type Key = (String, String, Option<String>);
        let mut groups: BTreeMap<Key, DeadGroup> = BTreeMap::new();
        for (id, q, reason, error, response) in rows {
            let signature = error.as_deref().map(error_signature).unwrap_or_default();
            let answer = response.as_deref().map(|r| {
                let start: String = r.chars().take(ANSWER_PREFIX_CHARS).collect();
                error_signature(&start)
            });
            let g = groups
                .entry((reason.clone(), signature.clone(), answer.clone()))
                .or_insert_with(|| DeadGroup {
                    reason,
                    signature,
                    answer,
                    example: error.clone(),
                    count: 0,
                    ids: Vec::new(),
                    queues: Vec::new(),
                });
            g.count += 1;
            if g.ids.len() < ids_per_group as usize {
                g.ids.push(id);
            }
            if let Err(at) = g.queues.binary_search(&q) {
                g.queues.insert(at, q);
            }
        }
        let mut out: Vec<DeadGroup> = groups.into_values().collect();
        out.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.reason.cmp(&b.reason))
                .then_with(|| a.signature.cmp(&b.signature))
                .then_with(|| a.answer.cmp(&b.answer))
        });
        Ok(out)
    }
}
