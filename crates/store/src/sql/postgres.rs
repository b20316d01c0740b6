//! The statements and fragments that PostgreSQL spells its own way.

/// The set of texts in the JSON array parameter `$n`.
pub(super) fn texts(n: u8) -> String {
    format!("(SELECT jsonb_array_elements_text(CAST(${n} AS JSONB)))")
}

/// The set of ids (`BIGINT`) in the JSON array parameter `$n`.
pub(super) fn ids(n: u8) -> String {
    format!("(SELECT CAST(jsonb_array_elements_text(CAST(${n} AS JSONB)) AS BIGINT))")
}

/// The job's kind is in the JSON array parameter `$n`: an array built once per statement
/// (an init plan) compared with `= ANY`, so the claim index is still walked in order.
pub(super) fn kind_in(n: u8) -> String {
    format!("j.kind = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(${n} AS JSONB))))")
}

/// The job's queue is in the JSON array parameter `$n`: an array built once per statement (an
/// init plan), looked up in by `array_position` rather than `j.queue = ANY(…)`, which the
/// planner took as a lookup of each listed queue in the per-queue claim index and then sorted
/// every pending job of those queues (60,000 rows for 600 queues of 100 jobs), guessing 36.
pub(super) fn queue_in(n: u8) -> String {
    format!(
        "array_position(ARRAY(SELECT jsonb_array_elements_text(CAST(${n} AS JSONB))), j.queue) \
         IS NOT NULL"
    )
}

/// The job's queue is not paused: the paused queues read once per statement into an array
/// (an init plan), so the claim index is walked in order and each row compared with it.
pub(super) const NOT_PAUSED: &str =
    "j.queue <> ALL(ARRAY(SELECT pq.queue FROM redrive_paused_queues pq))";

/// Element `k` of the JSON array parameter `$2` (a claim's queues), as text.
pub(super) fn queue_at(k: usize) -> String {
    format!("(CAST($2 AS JSONB) ->> {k})")
}

/// The row lock each arm of a claim takes: concurrent claims skip each other's rows.
pub(super) const ARM_LOCK: &str = " FOR UPDATE OF j SKIP LOCKED";

/// How the claim's update reaches the rows its `picked` CTE locked: by primary key, from the
/// array of their ids (an init plan). A join with the CTE (`FROM picked WHERE t.id =
/// picked.id`) let the planner hash-join it with a sequential scan of the whole jobs table
/// whenever that looked cheaper than 200 index probes (e.g. 24 ms of a 26 ms claim at 20,000
/// jobs against 2 ms by key).
const PICKED_IDS: &str = "ANY(ARRAY(SELECT id FROM picked))";

/// The claim of the jobs that `claimable` selects (the queue and kinds' filters included).
pub(super) fn claim(claimable: &str) -> String {
    format!(
        "WITH picked AS (SELECT j.id FROM redrive_jobs j WHERE {claimable} \
           ORDER BY j.priority, j.run_at, j.id LIMIT $3 FOR UPDATE OF j SKIP LOCKED) \
         UPDATE redrive_jobs t SET state = 'running', lease_owner = $4, \
         lease_token = t.lease_token + 1, lease_expires_at = $5, updated_at = $1 \
         WHERE t.id = {PICKED_IDS} RETURNING {}",
        crate::rows::JOB_COLS
    )
}

/// The claim of the first `$3` rows of `arms` (a `UNION ALL` of per-queue selections, each
/// already locked).
pub(super) fn claim_union(arms: &str) -> String {
    format!(
        "WITH picked AS (SELECT c.id FROM ({arms}) c \
           ORDER BY c.priority, c.run_at, c.id LIMIT $3) \
         UPDATE redrive_jobs t SET state = 'running', lease_owner = $4, \
         lease_token = t.lease_token + 1, lease_expires_at = $5, updated_at = $1 \
         WHERE t.id = {PICKED_IDS} RETURNING {}",
        crate::rows::JOB_COLS
    )
}
